"""The Delta engines: delta-rs everywhere; delta-spark where the Delta Lake jars are on the classpath.

This machine has no Maven access, so no Delta jars: the delta-spark run is
skipped here with that reason; its start-up check (a clear error before
anything is written) and the log actions it commits are tested everywhere.
"""

from __future__ import annotations

import json

import pytest

from rmqlake.cli import main
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake.actions import DataFile
from rmqlake.lake.deltaspark import EXTENSION, add_action, log_path, remove_action, txn_action
from rmqlake.steps.ingest import ingest, open_lake
from rmqlake.steps.reput import reput
from tests.conftest import CONF, make_settings

pytestmark = pytest.mark.spark


def delta_jars(spark) -> bool:
    try:
        spark._jvm.java.lang.Class.forName("org.apache.spark.sql.delta.DeltaLog")
        return EXTENSION in (spark.conf.get("spark.sql.extensions", "") or "")
    except Exception:
        return False


def test_choosing_delta_spark_without_the_extension_stops_before_any_write(spark, tmp_path, capsys):
    if delta_jars(spark):
        pytest.skip("this session has the Delta extension")
    generate(tmp_path / "in", messages=20, topics=[TopicPlan("OrderEvents", 4, False)], hours=1, seed=1)
    lake = tmp_path / "lake"
    args = ["--input", str(tmp_path / "in" / "landing"), "--conf", str(CONF), "--env", "test", "--lake", str(lake)]
    code = main(["ingest", *args, "--set", "lake.engine=delta-spark"])
    err = capsys.readouterr().err
    assert code == 2 and "lake.engine is delta-spark but spark.sql.extensions" in err and EXTENSION in err
    assert "--jars delta-spark" in err and not lake.exists()  # nothing written
    code = main(["status", "--conf", str(CONF), "--lake", str(lake), "--set", "lake.engine=nope"])
    assert code == 2 and "lake.engine" in capsys.readouterr().err


def test_log_actions_follow_the_delta_protocol():
    data_file = DataFile(
        path="topic=%25RETRY%25cg/queue_id=0/part-0.parquet",
        size=123,
        partition_values={"topic": "%RETRY%cg", "queue_id": "0"},
        modification_time=1700000000000,
        stats='{"numRecords":2}',
    )
    assert json.loads(json.dumps(add_action(data_file))) == {
        "add": {
            "path": "topic=%2525RETRY%2525cg/queue_id=0/part-0.parquet",  # the log's URI-encoded form
            "partitionValues": {"topic": "%RETRY%cg", "queue_id": "0"},
            "size": 123,
            "modificationTime": 1700000000000,
            "dataChange": True,
            "stats": '{"numRecords":2}',
        }
    }
    removed = remove_action(data_file, deletion_timestamp=5)["remove"]
    assert removed["path"] == log_path(data_file.path) and removed["deletionTimestamp"] == 5
    assert removed["extendedFileMetadata"] and removed["size"] == 123
    assert txn_action("rmqlake.ledger", 7, now_ms=9) == {
        "txn": {"appId": "rmqlake.ledger", "version": 7, "lastUpdated": 9}
    }


def test_delta_spark_engine_writes_the_same_tables(spark, tmp_path):
    if not delta_jars(spark):
        pytest.skip(
            "no Delta Lake jars on this machine's classpath (Maven is unreachable here): "
            "the delta-spark engine runs on clusters that have them"
        )
    generate(tmp_path / "in", messages=300, topics=[TopicPlan("OrderEvents", 4, False)], hours=1, seed=2)
    lakes = {}
    for engine in ("delta-rs", "delta-spark"):
        settings = make_settings(tmp_path / engine, f"lake.engine={engine}", "store.commitlog_segment_size=8192")
        ingest(spark, settings, input_path=str(tmp_path / "in" / "landing"))
        reput(spark, settings)
        lakes[engine] = open_lake(settings)
    for table in ("commitlog", "segments", "consumequeue", "indexfile"):
        rows = {e: sorted(map(str, lake.read_arrow(table).to_pylist())) for e, lake in lakes.items()}
        assert rows["delta-rs"] == rows["delta-spark"], table
    assert lakes["delta-spark"].engine.transaction_version("commitlog", "rmqlake.ledger") == 1


def test_python_workers_keep_their_zip_importers(spark):
    """In Spark's own Python workers (pyspark.zip and py4j's zip on their path) the importers are kept once
    rmqlake is imported, so the per-task invalidation does not re-read the archives."""

    def kept(_):
        import sys
        import zipimport

        import rmqlake  # noqa: F401  (what every rmqlake task imports first)

        importers = [f for f in sys.path_importer_cache.values() if isinstance(f, zipimport.zipimporter)]
        return [len(importers), all("invalidate_caches" in vars(f) for f in importers)]

    results = spark.sparkContext.parallelize(range(4), 4).map(kept).collect()
    assert all(count >= 1 and all_kept for count, all_kept in results)
