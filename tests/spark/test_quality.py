"""Quality suites: pass on generated data, and each critical expectation fails on a table corrupted in exactly
its way (proof the checks can fail). Real Spark DataFrames through GX's Spark datasource."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from rmqlake.cli import main
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake.spark_io import read_table
from rmqlake.quality.suites import SUITES
from rmqlake.steps.ingest import ingest, open_lake
from rmqlake.steps.quality import _context, _validate, quality
from tests.conftest import CONF, make_settings

pytestmark = pytest.mark.spark
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]


@pytest.fixture(scope="module")
def lake_settings(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    generate(root / "in", messages=500, topics=TOPICS, hours=2, bad_rate=0.02, seed=5)
    settings = make_settings(root / "lake", "store.commitlog_segment_size=16384")
    ingest(spark, settings, input_path=str(root / "in" / "landing"))
    return settings


@pytest.fixture(scope="module")
def tables(spark, lake_settings):
    lake = open_lake(lake_settings)
    return {name: read_table(spark, lake, name).cache() for name in ("commitlog", "segments", "rejected")}


def failures(spark, settings, suite_name: str, tables: dict, tmp_path) -> dict[str, dict]:
    """The failed expectations of one suite on ``tables``: description -> observed result."""
    suite = SUITES[suite_name]
    frame = suite.frame(tables, settings)
    result = _validate(_context(tmp_path / "gx"), suite, suite.expectations(settings), frame, settings)
    assert len(result.results) == len(suite.expectations(settings))
    return {r.expectation_config.description: r.result for r in result.results if not r.success}


def test_quality_passes_on_good_data_keeps_results_and_builds_data_docs(spark, lake_settings, capsys):
    metrics = quality(spark, lake_settings)
    assert metrics["status"] == "checked" and metrics["critical_failures"] == 0
    assert {s["suite"] for s in metrics["suites"]} == set(SUITES)
    rows = open_lake(lake_settings).read_arrow("dq_results").to_pylist()
    assert len(rows) == sum(s["expectations"] for s in metrics["suites"]) and all(r["success"] for r in rows)
    commitlog_version = open_lake(lake_settings).version("commitlog")
    assert {r["table_version"] for r in rows if r["table_name"] == "commitlog"} == {commitlog_version}
    observed = json.loads(next(r["observed"] for r in rows if "CRC" in r["expectation"]))
    assert observed["element_count"] > 400 and observed["unexpected_count"] == 0
    index = metrics["data_docs"].removeprefix("file://")
    assert index.endswith("index.html") and "commitlog.critical" in Path(index).read_text()

    again = quality(spark, lake_settings)  # same table versions: nothing to check again
    assert again["status"] == "already_checked"
    assert len(open_lake(lake_settings).read_arrow("dq_results")) == len(rows)

    code = main(["quality", "--suite", "nope", "--conf", str(CONF), "--lake", lake_settings.lake.root])
    assert code == 2 and "allowed: commitlog, commitlog.critical" in capsys.readouterr().err


def test_each_commitlog_invariant_fails_on_its_corruption(spark, lake_settings, tables, tmp_path):
    commitlog = tables["commitlog"]
    victim = commitlog.agg(F.max("physical_offset")).first()[0]  # the active segment's last message
    second = commitlog.orderBy("physical_offset").select("physical_offset").limit(2).collect()[1][0]
    cases = {
        "magic code is V1 or V2": commitlog.withColumn(
            "magic", F.when(F.col("physical_offset") == second, F.lit(-875286124)).otherwise(F.col("magic"))
        ),
        "body CRC equals CRC32 of the body recomputed": commitlog.withColumn(
            "body_crc", F.when(F.col("physical_offset") == second, F.col("body_crc") + 1).otherwise(F.col("body_crc"))
        ),
        "TOTALSIZE equals the size formula of the record's fields": commitlog.withColumn(
            "properties_bytes",
            F.when(F.col("physical_offset") == second, F.concat("properties_bytes", F.lit(b"x"))).otherwise(
                F.col("properties_bytes")
            ),
        ),
        "msg_id is the offsetMsgId of store host + physical offset": commitlog.withColumn(
            "msg_id", F.when(F.col("physical_offset") == second, F.lit("0A0000050000")).otherwise(F.col("msg_id"))
        ),
        # a record moved by 4 bytes: it no longer starts where its predecessor ends
        "each record starts where the previous record of its segment ends": commitlog.withColumn(
            "physical_offset",
            F.when(F.col("physical_offset") == second, F.col("physical_offset") + 4).otherwise(
                F.col("physical_offset")
            ),
        ),
        # the last record dropped: the active segment's end no longer matches
        "last record's end + recorded padding = the segment's end offset": commitlog.where(
            F.col("physical_offset") != victim
        ),
    }
    dispatchable = F.col("sys_flag").bitwiseAND(0xC).isin(0, 8)  # not a prepared or rollback half message
    queue = commitlog.where(dispatchable & (F.col("topic") == "OrderEvents") & (F.col("queue_id") == 0))
    skipped = queue.orderBy("queue_offset").limit(2).collect()[1]["physical_offset"]
    cases["queue offsets of dispatchable messages are contiguous per queue"] = commitlog.withColumn(
        "queue_offset",
        F.when(F.col("physical_offset") == skipped, F.col("queue_offset") + 1).otherwise(F.col("queue_offset")),
    )
    cases["no two dispatchable messages share (topic, queue, queue offset)"] = commitlog.withColumn(
        "queue_offset",
        F.when(F.col("physical_offset") == skipped, F.col("queue_offset") - 1).otherwise(F.col("queue_offset")),
    )
    for expected, corrupted in cases.items():
        failed = failures(spark, lake_settings, "commitlog.critical", {**tables, "commitlog": corrupted}, tmp_path)
        assert expected in failed, f"{expected!r} did not fail; failed: {list(failed)}"
        assert failed[expected]["unexpected_count"] >= 1 or failed[expected].get("observed_value") is not None


def test_segments_and_rejected_invariants_fail_on_their_corruption(spark, lake_settings, tables, tmp_path):
    segments, rejected = tables["segments"], tables["rejected"]
    assert failures(spark, lake_settings, "segments.critical", tables, tmp_path) == {}
    assert failures(spark, lake_settings, "rejected.critical", tables, tmp_path) == {}
    cases = {
        "each segment starts where the previous one ends": segments.withColumn(
            "start_offset",
            F.when(F.col("start_offset") == 16384, F.lit(16390)).otherwise(F.col("start_offset")),
        ),
        "segment sizes are at most store.commitlog_segment_size": segments.withColumn(
            "size_bytes", F.col("size_bytes") + 16384
        ),
        "at most one active segment": segments.withColumn("status", F.lit("active")),
        "an active segment exists": segments.withColumn("status", F.lit("sealed")),
    }
    for expected, corrupted in cases.items():
        failed = failures(spark, lake_settings, "segments.critical", {**tables, "segments": corrupted}, tmp_path)
        assert expected in failed, f"{expected!r} did not fail; failed: {list(failed)}"
    no_reason = rejected.withColumn(
        "reason", F.when(F.col("source_line") == rejected.first()["source_line"], F.lit(None)).otherwise("reason")
    )
    failed = failures(spark, lake_settings, "rejected.critical", {**tables, "rejected": no_reason}, tmp_path)
    assert "every rejected line has a reason" in failed


def test_a_critical_failure_exits_non_zero_and_is_kept(spark, lake_settings, tmp_path, capsys):
    """Corrupt the stored table itself (a CRC flipped in a copy of the lake), then run the command."""
    from deltalake import write_deltalake

    copy = tmp_path / "lake"
    shutil.copytree(lake_settings.lake.root, copy)
    commitlog = pa.table(open_lake(make_settings(copy)).read_arrow("commitlog"))
    crcs = commitlog.column("body_crc").to_pylist()
    crcs[0] ^= 1
    broken = commitlog.set_column(commitlog.schema.get_field_index("body_crc"), "body_crc", pa.array(crcs, pa.int32()))
    write_deltalake(str(copy / "commitlog"), broken, mode="overwrite", partition_by=["segment"])
    code = main(["quality", "--suite", "commitlog", "--conf", str(CONF), "--env", "test", "--lake", str(copy)])
    out = capsys.readouterr()
    assert code == 1
    assert "commitlog.critical" in out.out and "FAILED" in out.err
    rows = open_lake(make_settings(copy)).read_arrow("dq_results").to_pylist()
    (crc,) = [r for r in rows if not r["success"]]  # the copy also holds the good run's rows
    assert "CRC" in crc["expectation"] and json.loads(crc["observed"])["unexpected_count"] == 1
