"""The two Delta engines on the same jobs: delta-rs (embedded) and delta-spark (the Delta Lake extension,
jars from ``make jars``, loaded in the shared test session).

One pipeline per engine on small generated data (ingest x2, reput x2, compact, offsets, expire, quality,
export-store, import-store), plus a lake that switches engine at every job; the tests compare them and
read every table with the other readers.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from rmqlake.cli import main
from rmqlake.formats.store import parse_delay_offsets
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import TABLES, Lake
from rmqlake.lake.actions import DataFile
from rmqlake.lake.deltaspark import add_action, log_path, remove_action, txn_action
from rmqlake.lake.spark_io import read_table
from rmqlake.sql import delta_connection
from tests.conftest import CONF, REPO

pytestmark = [pytest.mark.spark, pytest.mark.delta_spark]

ENGINES = ("delta-rs", "delta-spark")
TOPICS = [TopicPlan("OrderEvents", 4, False), TopicPlan("UserProfile", 2, True)]
SMALL = [
    "store.commitlog_segment_size=16384",
    "store.cq_units_per_file=64",
    "store.index_slots=64",
    "store.index_max_entries=200",
    "retention.max_segments_per_run=5",
]
NOW = "2026-11-22T00:00:00Z"
EXPIRE_AT = "2026-11-25T04:00:00Z"
JOBS = [
    ("ingest", "--input", "{landing}/dt=2026-11-21/hour=00", "--now", NOW),
    ("reput",),
    ("ingest", "--input", "{landing}/dt=2026-11-21/hour=01", "--now", NOW),
    ("reput",),
    ("compact", "--now", NOW),
    ("offsets", "--input", "{offsets}"),
    ("expire", "--now", EXPIRE_AT),
]
VOLATILE = {"dq_results": {"run_id", "checked_at"}}  # who checked and when; what was checked is the same
SCALAR = ("int", "bigint", "string")
BIN = Path(sys.executable).parent


def options(lake: Path, engine: str) -> list[str]:
    overrides = [*SMALL, f"lake.engine={engine}"]
    return ["--conf", str(CONF), "--env", "test", "--lake", str(lake), *(a for s in overrides for a in ("--set", s))]


def run(job: tuple[str, ...], lake: Path, engine: str, **paths: Path) -> None:
    args = [a.format(**paths) for a in job]
    code = main([*args, *options(lake, engine)])
    assert code == 0, f"{' '.join(args)} with lake.engine={engine} exited {code}"


def rows(lake: Path, table: str, *, version: int | None = None) -> list[dict]:
    data = DeltaTable(str(lake / table), version=version).to_pyarrow_table().to_pylist()
    dropped = VOLATILE.get(table, set())
    return sorted(({k: v for k, v in r.items() if k not in dropped} for r in data), key=repr)


def checksums(store: Path) -> dict[str, str]:
    """SHA-256 of every file of a store; the config JSON files without their dataVersion (the export's clock)."""

    def content(path: Path) -> bytes:
        if path.name == "delayOffset.json":  # bare integer keys, as the broker writes them
            return json.dumps(parse_delay_offsets(path.read_text())).encode()
        if path.parent.name == "config" and path.suffix == ".json":
            document = json.loads(path.read_text())
            document.pop("dataVersion", None)
            return json.dumps(document, sort_keys=True).encode()
        return path.read_bytes()

    return {str(p.relative_to(store)): hashlib.sha256(content(p)).hexdigest() for p in store.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def lakes(spark, tmp_path_factory) -> dict:
    """Every job under each engine, and a lake that switches engine at every job after the second reput
    (copied from the delta-spark lake there): ``{engine: lake, "switching": lake, "root": folder}``."""
    root = tmp_path_factory.mktemp("engines")
    generate(root / "in", messages=500, topics=TOPICS, hours=2, bad_rate=0.01, seed=18)
    paths = {"landing": root / "in" / "landing", "offsets": root / "in" / "offsets"}
    built: dict = {"root": root, "switching": root / "switching"}
    for engine in ENGINES:
        lake = root / engine
        for number, job in enumerate(JOBS):
            run(job, lake, engine, **paths)
            if number == 3 and engine == "delta-spark":
                shutil.copytree(lake, built["switching"])
        assert main(["quality", *options(lake, engine)]) == 0
        run(("export-store", "--out", str(root / f"store-{engine}")), lake, engine)
        # both engines import the same store (the exports are compared byte for byte below)
        run(("import-store", str(root / "store-delta-rs")), root / f"imported-{engine}", engine)
        built[engine] = lake
    for number, job in enumerate(JOBS[4:]):
        run(job, built["switching"], ENGINES[number % 2], **paths)  # delta-rs, delta-spark, delta-rs
    return built


def test_every_job_gives_the_same_tables_and_store_files_under_both_engines(lakes):
    root = lakes["root"]
    for table in TABLES:
        assert rows(lakes["delta-spark"], table) == rows(lakes["delta-rs"], table), table
    assert rows(lakes["delta-rs"], "commitlog") and rows(lakes["delta-rs"], "compaction_log")
    assert {r["status"] for r in rows(lakes["delta-rs"], "segments")} >= {"deleted", "active"}  # expiry removed some
    assert checksums(root / "store-delta-spark") == checksums(root / "store-delta-rs")
    for table in ("commitlog", "segments"):
        imported = [
            [
                {k: v for k, v in r.items() if k not in ("batch_id", "source_file")}
                for r in rows(root / f"imported-{e}", table)
            ]
            for e in ENGINES
        ]  # batch ids name the run
        assert imported[0] == imported[1] and imported[0], table
    committed = DeltaTable(str(lakes["delta-spark"] / "commitlog")).history()
    assert {c["operation"] for c in committed} == {"Manual Update"}  # every commit went through the extension
    assert all("Delta-Lake/4.1.0" in c["engineInfo"] for c in committed)


def test_a_lake_can_switch_engines_between_runs(lakes):
    for table in ("commitlog", "segments", "consumequeue", "indexfile", "compaction_log", "consumer_offsets"):
        assert rows(lakes["switching"], table) == rows(lakes["delta-rs"], table), table


def test_tables_of_either_engine_open_in_spark_delta_rs_and_duckdb_at_the_plain_protocol(spark, lakes):
    for engine in (*ENGINES, "switching"):
        for table, spec in TABLES.items():
            uri = str(lakes[engine] / table)
            if not (lakes[engine] / table).exists():
                continue
            delta_rs = DeltaTable(uri)
            protocol = delta_rs.protocol()
            assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), (engine, table)
            assert not protocol.reader_features and not protocol.writer_features
            columns = [name for name, kind in spec.fields if kind in SCALAR]
            expected = sorted(
                tuple(r[c] for c in columns) for r in delta_rs.to_pyarrow_table(columns=columns).to_pylist()
            )
            by_spark = spark.read.format("delta").load(uri).select(*columns).collect()
            assert sorted(tuple(r) for r in by_spark) == expected, (engine, table)
            dataset = delta_rs.to_pyarrow_dataset()  # noqa: F841 - read by DuckDB through the local name
            assert duckdb.sql("select count(*) from dataset").fetchall()[0][0] == len(expected), (engine, table)
        # time travel by version: Spark and delta-rs see the same older snapshot
        uri = str(lakes[engine] / "commitlog")
        first = spark.read.format("delta").option("versionAsOf", 1).load(uri)
        assert first.count() == DeltaTable(uri, version=1).to_pyarrow_table().num_rows > 0


def test_delta_spark_jobs_read_through_the_extension_at_the_pinned_version(spark, lakes):
    lake = Lake(str(lakes["delta-spark"]), engine="delta-spark", read_only=True)
    frame = read_table(spark, lake, "consumequeue", partition_filters=[("topic", "=", "OrderEvents")])
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "PreparedDeltaFileIndex" in plan or "TahoeLogFileIndex" in plan, plan  # Delta's file index, not a list
    expected = [r for r in rows(lakes["delta-spark"], "consumequeue") if r["topic"] == "OrderEvents"]
    assert frame.count() == len(expected)
    older = read_table(spark, lake, "commitlog", version=1)  # time travel: the first ingest's rows only
    first = rows(lakes["delta-spark"], "commitlog", version=1)
    assert older.count() == len(first) > 0 and len(first) != lake.read_arrow("commitlog").num_rows


def test_time_travel_export_and_vacuum_under_delta_spark(lakes, tmp_path):
    outs = {}
    for engine in ENGINES:
        lake = tmp_path / engine
        shutil.copytree(lakes[engine], lake)
        outs[engine] = tmp_path / f"then-{engine}"
        run(("export-store", "--out", str(outs[engine]), "--as-of", "2"), lake, engine)
    assert checksums(outs["delta-spark"]) == checksums(outs["delta-rs"])  # the store right after run 2

    lake = tmp_path / "delta-spark"
    settings = [*options(lake, "delta-spark"), "--set", "lake.vacuum_retention_hours=0"]
    settings += ["--set", "lake.vacuum_below_delta_retention=true"]
    before = {t: rows(lake, t) for t in ("commitlog", "consumequeue", "indexfile")}
    removed_files = [f for f in (lake / "commitlog").rglob("*.parquet") if "_staging" not in str(f)]
    assert main(["vacuum", *settings]) == 0
    left = [f for f in (lake / "commitlog").rglob("*.parquet") if "_staging" not in str(f)]
    assert len(left) < len(removed_files)  # expiry's removed files are gone from disk
    for table, expected in before.items():
        assert rows(lake, table) == expected, table


def test_missing_delta_jars_is_a_configuration_error_naming_make_jars(tmp_path):
    empty = tmp_path / "no-jars"
    empty.mkdir()
    lake = tmp_path / "lake"
    result = subprocess.run(
        [BIN / "rmqlake", "reput", *options(lake, "delta-spark"), "--set", f"spark.delta_jars={empty}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "make jars" in result.stderr and str(empty) in result.stderr and "Traceback" not in result.stderr
    assert not lake.exists()  # nothing written


@pytest.mark.parametrize("engine", ENGINES)
def test_a_row_deleted_by_another_writer_fails_a_critical_expectation(spark, lakes, tmp_path, engine):
    lake = tmp_path / "lake"
    shutil.copytree(lakes[engine], lake)
    uri = str(lake / "consumequeue")
    offsets = sorted(
        r["queue_offset"] for r in rows(lake, "consumequeue") if r["topic"] == "OrderEvents" and not r["queue_id"]
    )
    victim = f"topic = 'OrderEvents' AND queue_id = 0 AND queue_offset = {offsets[len(offsets) // 2]}"  # mid-queue
    if engine == "delta-rs":
        assert DeltaTable(uri).delete(victim)["num_deleted_rows"] == 1
    else:
        assert spark.sql(f"DELETE FROM delta.`{uri}` WHERE {victim}").collect()[0][0] == 1
    # the rewritten file is another writer's: every reader still reads the table
    settings = options(lake, engine)
    lake_handle = Lake(str(lake), engine=engine)
    assert read_table(spark, lake_handle, "consumequeue").count() == len(rows(lakes[engine], "consumequeue")) - 1

    assert main(["quality", "--suite", "consumequeue.critical", *settings]) == 1  # a failed check, not an error
    results = [r for r in rows(lake, "dq_results") if r["table_name"] == "consumequeue"]
    latest = max(r["table_version"] for r in results)
    failed = [r for r in results if r["table_version"] == latest and not r["success"]]
    assert failed and all(r["severity"] == "critical" for r in failed)

    foreign = Lake(str(lake)).foreign_commits()
    assert list(foreign) == ["consumequeue"] and [c["operation"] for c in foreign["consumequeue"]] == ["DELETE"]
    assert not Lake(str(lakes[engine])).foreign_commits()


def readable_columns(table: str) -> list[str]:
    """The columns every reader compares: all but maps (Polars reads a map as a list of key/value structs)."""
    return [name for name, kind in TABLES[table].fields if not kind.startswith("map<")]


def comparable(data: pa.Table, columns: list[str]) -> tuple[int, str]:
    """(rows, SHA-256 of the sorted rows) of a reader's result; times as epoch microseconds, whatever zone the
    reader gives them in."""
    values = []
    for name in columns:
        column = data.column(name)
        if pa.types.is_timestamp(column.type):
            column = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        values.append(column.to_pylist())
    ordered = sorted(repr(row) for row in zip(*values, strict=True))
    return len(ordered), hashlib.sha256("\n".join(ordered).encode()).hexdigest()


def test_every_table_reads_the_same_in_polars_duckdb_delta_rs_and_spark(spark, lakes):
    """The layout is plain Delta: every partition folder is a partition column, so each reader sees each row."""
    connection = delta_connection()
    for engine in ENGINES:
        for table in TABLES:
            uri, columns = str(lakes[engine] / table), readable_columns(table)
            listed = ", ".join(f'"{c}"' for c in columns)
            reads = {
                "delta-rs": DeltaTable(uri).to_pyarrow_table(columns=columns),
                "polars read_delta": pl.read_delta(uri, columns=columns).to_arrow(),
                "polars scan_delta": pl.scan_delta(uri).select(columns).collect().to_arrow(),
                "duckdb delta_scan": connection.sql(f"select {listed} from delta_scan('{uri}')").to_arrow_table(),
                "spark": spark.read.format("delta").load(uri).select(*columns).toArrow(),
            }
            seen = {reader: comparable(data, columns) for reader, data in reads.items()}
            assert len(set(seen.values())) == 1, (engine, table, seen)
            assert seen["delta-rs"][0] > 0, (engine, table)  # every table holds rows: the comparison says something


# What OPTIMIZE Z-orders by, per table; the other tables are bin-packed (OPTIMIZE without ZORDER BY).
Z_ORDER = {"consumequeue": "queue_offset", "indexfile": "slot", "compaction_cq": "queue_offset"}


def optimize(spark, lake: Path, engine: str) -> None:
    """OPTIMIZE every table of ``lake`` as a user would with ``engine``: Spark SQL, or delta-rs's optimize."""
    for table in TABLES:
        uri = str(lake / table)
        if engine == "delta-rs":
            if table in Z_ORDER:
                DeltaTable(uri).optimize.z_order([Z_ORDER[table]])
            else:
                DeltaTable(uri).optimize.compact()
        else:
            spark.sql(f"OPTIMIZE delta.`{uri}`" + (f" ZORDER BY ({Z_ORDER[table]})" if table in Z_ORDER else ""))


def test_expire_reput_and_export_work_on_tables_optimized_by_either_engine(spark, lakes, tmp_path):
    """OPTIMIZE (bin-packing or Z-order) rewrites files within a partition; a partition is a commitlog segment,
    a CQ file or an index file, so expiry still removes whole files, and every later job gives what it gives
    on the files as rmqlake wrote them."""
    more = tmp_path / "more"
    generate(more, messages=60, topics=TOPICS, hours=1, seed=19, start_ms=1795305600000)  # 2026-11-22
    copies = {"plain": ("delta-rs", tmp_path / "plain")}
    copies.update({f"optimized-{e}": (e, tmp_path / f"optimized-{e}") for e in ENGINES})
    for name, (engine, lake) in copies.items():
        shutil.copytree(lakes[engine], lake)
        if name != "plain":
            before = len(DeltaTable(str(lake / "consumequeue")).file_uris())
            optimize(spark, lake, engine)
            assert len(DeltaTable(str(lake / "consumequeue")).file_uris()) < before, name  # files were merged
            assert not Lake(str(lake)).foreign_commits(), name  # no row changed
        run(("ingest", "--input", str(more / "landing"), "--now", "2026-11-25T05:00:00Z"), lake, engine)
        run(("reput",), lake, engine)  # appends to CQ and index files OPTIMIZE rewrote
        every_expired = ["--set", "retention.max_segments_per_run=100"]  # after SMALL's: this run drains them all
        assert main(["expire", "--now", "2026-11-30T04:00:00Z", *options(lake, engine), *every_expired]) == 0
        run(("export-store", "--out", str(tmp_path / f"store-{name}")), lake, engine)
    plain = copies["plain"][1]
    assert "sealed" not in {r["status"] for r in rows(plain, "segments")}  # every sealed segment went

    def cq_files(lake: Path) -> set:
        return {(r["topic"], r["queue_id"], r["cq_file"]) for r in rows(lake, "consumequeue")}

    assert cq_files(lakes["delta-rs"]) - cq_files(plain)  # and CQ files with them
    for name, (_, lake) in copies.items():
        for table in ("commitlog", "segments", "consumequeue", "indexfile", "indexfile_header", "compaction_cq"):
            assert rows(lake, table) == rows(plain, table), (name, table)
        assert checksums(tmp_path / f"store-{name}") == checksums(tmp_path / "store-plain"), name


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


def test_every_writer_derives_the_timestamps_and_every_table_keeps_its_comments(lakes):
    """Ingest (Arrow tasks), compaction and import-store (Spark), under each engine; and the tables say what
    their columns hold, whichever engine created them."""
    root, checked = lakes["root"], {}
    for lake in (*(lakes[e] for e in ENGINES), *(root / f"imported-{e}" for e in ENGINES)):
        for spec in TABLES.values():
            if not (lake / spec.name / "_delta_log").exists():
                continue
            table = DeltaTable(str(lake / spec.name))
            assert {f.name: f.metadata.get("comment") for f in table.schema().fields} == spec.comments, spec.name
            for column in spec.schema.derived:
                data = table.to_pyarrow_table(columns=[column.derived_from, column.name])
                millis = data.column(column.derived_from).to_numpy()
                assert (data.column(column.name).cast("int64").to_numpy() == millis * 1000).all(), spec.name
                checked[spec.name] = checked.get(spec.name, 0) + len(millis)
    assert checked["commitlog"] and checked["compaction_log"]
