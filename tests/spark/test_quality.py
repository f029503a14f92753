"""Quality suites: pass on generated data, and each critical expectation fails on a table corrupted in exactly
its way (proof the checks can fail). Real Spark DataFrames through GX's Spark datasource."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from rmqlake.cli import main
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.quality import report
from rmqlake.quality.suites import SUITES, Suite
from rmqlake.steps.compact import compact
from rmqlake.steps.expire import expire
from rmqlake.steps.ingest import ingest
from rmqlake.steps.offsets import lag, load_offsets
from rmqlake.steps.quality import (
    _context,
    _frames_ahead,
    _validate,
    project_dir,
    quality,
    spark_source,
    suite_inputs,
)
from rmqlake.steps.reput import reput
from rmqlake.timeutil import parse_timestamp
from tests.conftest import CONF, make_settings

pytestmark = pytest.mark.spark
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]
SEGMENT = 16384


@pytest.fixture(scope="module")
def lake_settings(spark, tmp_path_factory):
    """Two generated hours, ingested, dispatched and compacted; then expiry deletes the 10 oldest segments,
    so CQ files keep dead units (the queue min offsets are corrected) and the oldest index files go."""
    root = tmp_path_factory.mktemp("quality")
    generate(root / "in", messages=500, topics=TOPICS, hours=2, bad_rate=0.02, seed=5)
    settings = make_settings(
        root / "lake",
        f"store.commitlog_segment_size={SEGMENT}",
        "store.index_max_entries=200",
        "retention.max_segments_per_run=10",
    )
    ingest(spark, settings, input_path=str(root / "in" / "landing"))
    reput(spark, settings)
    assert compact(spark, settings)["messages_kept"] > 10
    expired = expire(spark, settings, now=datetime(2026, 11, 24, 4, tzinfo=UTC))
    assert expired["segments_deleted"] == 10 and expired["index_files_deleted"] >= 1
    assert Lake.from_settings(settings).state().queue_min_offsets
    # the generator's hourly snapshots, and a group that never consumed: below the queues expiry corrected
    stuck = root / "in" / "offsets" / "consumerOffset-20261121T030000Z.json"
    stuck.write_text('{"offsetTable":{"OrderEvents@cg_stuck":{' + ",".join(f"{q}:0" for q in range(8)) + "}}}")
    assert load_offsets(settings, input_path=str(root / "in" / "offsets"))["rows"] > 8
    return settings


@pytest.fixture(scope="module")
def tables(spark, lake_settings):
    lake = Lake.from_settings(lake_settings)
    names = ["commitlog", "segments", "rejected", "consumequeue", "indexfile", "indexfile_header", "compaction_log"]
    names += ["ingest_files", "consumer_offsets"]
    inputs = suite_inputs(spark, lake, lake.state(), names)
    return {name: value.cache() if name in names else value for name, value in inputs.items()}


def failures(spark, settings, suite_name: str, tables: dict, tmp_path, *, only: str | None = None) -> dict[str, dict]:
    """The failed expectations of one suite on ``tables``: description -> observed result.

    ``only``: validate just the expectation of that description, on the suite's whole frame. A corruption test
    asks whether its own expectation fails; GX spends Spark jobs on each expectation it validates."""
    suite = SUITES[suite_name]
    expectations = suite.expectations(settings)
    if only is not None:
        expectations = [e for e in expectations if e.description == only]
        assert len(expectations) == 1, f"{suite_name} has no expectation {only!r}"
    frame = suite.frame(tables, settings).persist()
    result = _validate(gx_context(tmp_path), gx_source(tmp_path), suite, expectations, frame, settings)
    frame.unpersist()
    assert len(result.results) == len(expectations)
    return {r.expectation_config.description: r.result for r in result.results if not r.success}


@functools.cache
def gx_context(tmp_path: Path):
    """One GX project per test (opening one reads its files)."""
    return _context(tmp_path / "gx")


@functools.cache
def gx_source(tmp_path: Path):
    """Its Spark datasource, registered once (a registration rewrites the project's configuration)."""
    return spark_source(gx_context(tmp_path))


def expected_warnings(settings) -> dict[str, int]:
    """What the warning suites must find, computed without Spark or GX: batches rejecting more than
    quality.max_reject_ratio of their lines, and latest group offsets below their queue's min (from `rmqlake lag`)."""
    lake = Lake.from_settings(settings)
    lines, rejects = defaultdict(int), defaultdict(int)
    for row in lake.read_arrow("ingest_files").to_pylist():
        lines[row["batch_id"]] += row["lines"]
    for row in lake.read_arrow("rejected").to_pylist():
        rejects[row["batch_id"]] += 1
    ratio = settings.quality.max_reject_ratio
    return {
        "rejected.warning": sum(rejects[b] / n > ratio for b, n in lines.items()),
        "consumer_offsets.warning": sum(row["expired_unconsumed"] > 0 for row in lag(settings)["latest"]),
    }


def test_quality_passes_on_good_data_keeps_results_and_builds_data_docs(spark, lake_settings, capsys):
    metrics = quality(spark, lake_settings)
    assert metrics["status"] == "checked" and metrics["critical_failures"] == 0
    assert {s["suite"] for s in metrics["suites"]} == set(SUITES)
    rows = Lake.from_settings(lake_settings).read_arrow("dq_results").to_pylist()
    assert len(rows) == sum(s["expectations"] for s in metrics["suites"])
    assert all(r["success"] for r in rows if r["severity"] == "critical")
    # the fixture's input is 2 % bad lines and cg_audit lags behind expiry: warnings, reported, not fatal
    warned = {r["suite"]: json.loads(r["observed"])["unexpected_count"] for r in rows if not r["success"]}
    assert warned == expected_warnings(lake_settings) and all(warned.values())
    assert metrics["warnings"] == len(warned)
    commitlog_version = Lake.from_settings(lake_settings).version("commitlog")
    assert {r["table_version"] for r in rows if r["table_name"] == "commitlog"} == {commitlog_version}
    observed = json.loads(next(r["observed"] for r in rows if "CRC" in r["expectation"]))
    assert observed["element_count"] > 200 and observed["unexpected_count"] == 0
    index = metrics["data_docs"].removeprefix("file://")
    assert index.endswith("index.html") and "commitlog.critical" in Path(index).read_text()
    page = Path(metrics["report"])  # this run's page: a plot per view, the suites, links to the Data Docs
    assert page == project_dir(lake_settings) / "reports" / metrics["run_id"] / "index.html"
    text = page.read_text()
    for name in report.PLOTS:
        image = page.parent / f"{name}.png"
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f'src="{name}.png"' in text
    assert "rejected.warning" in text and metrics["data_docs"] in text
    assert (page.parent.parent / "latest.html").read_text().count(f"{metrics['run_id']}/index.html") == 2

    again = quality(spark, lake_settings)  # same table versions: nothing to check again
    assert again["status"] == "already_checked" and again["suites"] == [
        {**s, "seconds": 0.0, "run_id": metrics["run_id"]} for s in metrics["suites"]
    ]
    assert len(Lake.from_settings(lake_settings).read_arrow("dq_results")) == len(rows)

    code = main(["quality", "--suite", "nope", "--conf", str(CONF), "--lake", lake_settings.lake.root])
    assert code == 2 and "allowed: commitlog, commitlog.critical" in capsys.readouterr().err
    code = main(["quality", "--suite", "rejected", "--conf", str(CONF), "--lake", lake_settings.lake.root])
    assert code == 0 and "warning expectation(s) failed (reported, not fatal)" in capsys.readouterr().err


def test_the_run_report_draws_what_the_tables_hold(spark, lake_settings):
    """The per-run page and its plots; its figures agree with the tables and with `rmqlake lag` (pyarrow scans)."""
    lake = Lake.from_settings(lake_settings)
    data = report.gather(spark, lake, lake_settings)
    batches = data["rejects_per_batch"]
    assert sum(b["rejected"] for b in batches) == len(lake.read_arrow("rejected"))
    assert sum(b["lines"] for b in batches) == sum(lake.read_arrow("ingest_files").column("lines").to_pylist())
    (ratio,) = data["compaction_ratio"]
    assert ratio["topic"] == "UserProfile" and ratio["kept"] == len(lake.read_arrow("compaction_log"))
    assert 0 < ratio["ratio"] < 1
    live_bytes = sum(lake.read_arrow("commitlog", columns=["total_size"]).column("total_size").to_pylist())
    assert sum(points[-1][1] for points in data["disk_by_topic"].values()) == live_bytes
    history = [{**row, "as_of": parse_timestamp(row["as_of"])} for row in lag(lake_settings)["history"]]
    assert data["consumer_lag"] == history and any(row["lag"] for row in history)


def test_each_commitlog_invariant_fails_on_its_corruption(spark, lake_settings, tables, tmp_path):
    commitlog = tables["commitlog"]
    victim = commitlog.agg(F.max("physical_offset")).first()[0]  # the active segment's last message
    second = commitlog.orderBy("physical_offset").select("physical_offset").limit(2).collect()[1][0]
    assert second >= 10 * SEGMENT  # the oldest segments were expired
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
        "store_time and born_time are store_timestamp and born_timestamp as timestamps": commitlog.withColumn(
            "born_time", F.when(F.col("physical_offset") == second, F.current_timestamp()).otherwise(F.col("born_time"))
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
        inputs = {**tables, "commitlog": corrupted}
        failed = failures(spark, lake_settings, "commitlog.critical", inputs, tmp_path, only=expected)
        assert expected in failed, f"{expected!r} did not fail; failed: {list(failed)}"
        assert failed[expected]["unexpected_count"] >= 1 or failed[expected].get("observed_value") is not None


def test_segments_and_rejected_invariants_fail_on_their_corruption(spark, lake_settings, tables, tmp_path):
    segments, rejected = tables["segments"], tables["rejected"]
    assert failures(spark, lake_settings, "segments.critical", tables, tmp_path) == {}
    assert failures(spark, lake_settings, "rejected.critical", tables, tmp_path) == {}
    cases = {
        "each segment starts where the previous one ends": segments.withColumn(
            "start_offset",
            F.when(F.col("start_offset") == 12 * SEGMENT, F.lit(12 * SEGMENT + 6)).otherwise(F.col("start_offset")),
        ),
        "segment sizes are at most store.commitlog_segment_size": segments.withColumn(
            "size_bytes", F.col("size_bytes") + SEGMENT
        ),
        "at most one active segment": segments.withColumn("status", F.lit("active")),
        "an active segment exists": segments.withColumn("status", F.lit("sealed")),
    }
    for expected, corrupted in cases.items():
        inputs = {**tables, "segments": corrupted}
        failed = failures(spark, lake_settings, "segments.critical", inputs, tmp_path, only=expected)
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
    commitlog = pa.table(Lake.from_settings(make_settings(copy)).read_arrow("commitlog"))
    crcs = commitlog.column("body_crc").to_pylist()
    crcs[0] ^= 1
    broken = commitlog.set_column(commitlog.schema.get_field_index("body_crc"), "body_crc", pa.array(crcs, pa.int32()))
    write_deltalake(str(copy / "commitlog"), broken, mode="overwrite", partition_by=["segment"])
    code = main(["quality", "--suite", "commitlog", "--conf", str(CONF), "--env", "test", "--lake", str(copy)])
    out = capsys.readouterr()
    assert code == 1
    assert "commitlog.critical" in out.out and "FAILED" in out.err
    rows = Lake.from_settings(make_settings(copy)).read_arrow("dq_results").to_pylist()
    (crc,) = [r for r in rows if not r["success"] and r["severity"] == "critical"]  # + the good run's rows
    assert "CRC" in crc["expectation"] and json.loads(crc["observed"])["unexpected_count"] == 1
    # a retry of the failed task checks nothing new and fails again: the failure stands until the data changes
    again = main(["quality", "--suite", "commitlog", "--conf", str(CONF), "--env", "test", "--lake", str(copy)])
    assert again == 1 and len(Lake.from_settings(make_settings(copy)).read_arrow("dq_results")) == len(rows)


def test_consumequeue_and_indexfile_invariants_fail_on_their_corruption(spark, lake_settings, tables, tmp_path):
    cq, index, headers = tables["consumequeue"], tables["indexfile"], tables["indexfile_header"]
    minimum = tables["min_physical_offset"]
    assert failures(spark, lake_settings, "consumequeue.critical", tables, tmp_path) == {}
    assert failures(spark, lake_settings, "indexfile.critical", tables, tmp_path) == {}

    # a live unit with a unit before and after it in its queue
    live = cq.where(F.col("commitlog_offset") >= minimum).where("topic = 'OrderEvents' AND queue_id = 1")
    unit = live.orderBy("queue_offset").limit(2).collect()[1]
    this = (F.col("topic") == unit["topic"]) & (F.col("queue_id") == unit["queue_id"])
    this = this & (F.col("queue_offset") == unit["queue_offset"])

    def changed(column: str, value):
        return cq.withColumn(column, F.when(this, value).otherwise(F.col(column)))

    cases = {
        "every unit at or above its queue's min offset points to a live message of its size": changed(
            "size", F.col("size") + 1
        ),
        "tags_code is the dispatcher's tagsCode of the message (TAGS hash, delay rule)": changed(
            "tags_code", F.col("tags_code") + 1
        ),
        "queue offsets are contiguous per queue from the queue's min offset": cq.where(~this),
        "one unit per queue offset": cq.unionByName(cq.where(this)),
    }
    for expected, corrupted in cases.items():
        inputs = {**tables, "consumequeue": corrupted}
        failed = failures(spark, lake_settings, "consumequeue.critical", inputs, tmp_path, only=expected)
        assert expected in failed, f"{expected!r} did not fail; failed: {list(failed)}"

    chained = index.where((F.col("prev_index") > 0) & (F.col("phy_offset") >= minimum)).orderBy("index_no").first()
    entry = (F.col("index_file") == chained["index_file"]) & (F.col("index_no") == chained["index_no"])
    slots = lake_settings.store.index_slots
    index_cases = {
        "slot within store.index_slots": index.withColumn("slot", F.when(entry, F.lit(slots)).otherwise(F.col("slot"))),
        # a chain turned into a cycle: the entry points to itself
        "hash chains point back to an earlier entry of the same slot and file (no cycle)": index.withColumn(
            "prev_index", F.when(entry, F.col("index_no")).otherwise(F.col("prev_index"))
        ),
        "every entry at or above the min physical offset points to a live message with that key": index.withColumn(
            "key_hash", F.when(entry, F.col("key_hash") + 1).otherwise(F.col("key_hash"))
        ),
    }
    for expected, corrupted in index_cases.items():
        inputs = {**tables, "indexfile": corrupted}
        failed = failures(spark, lake_settings, "indexfile.critical", inputs, tmp_path, only=expected)
        assert expected in failed, f"{expected!r} did not fail; failed: {list(failed)}"
    miscounted = headers.withColumn(
        "index_count",
        F.when(F.col("index_file") == chained["index_file"], F.col("index_count") + 1).otherwise(F.col("index_count")),
    )
    failed = failures(spark, lake_settings, "indexfile.critical", {**tables, "indexfile_header": miscounted}, tmp_path)
    assert "header index_count = entries + 1 and hash_slot_count = slots in use" in failed


def test_compaction_invariants_fail_on_their_corruption(spark, lake_settings, tables, tmp_path):
    compacted, minimum = tables["compaction_log"], tables["min_physical_offset"]
    assert failures(spark, lake_settings, "compaction_log.critical", tables, tmp_path) == {}
    row = compacted.where(F.col("physical_offset") >= minimum).orderBy("physical_offset").first()
    this = F.col("physical_offset") == row["physical_offset"]
    older = (
        tables["commitlog"]
        .where((F.col("topic") == row["topic"]) & (F.col("physical_offset") >= minimum) & ~this)
        .orderBy("physical_offset")
        .first()
    )
    cases = {
        "one compacted message per key and queue": compacted.unionByName(compacted.where(this)),
        # the kept row is another (live) message than its key's latest
        "each kept message is its key's latest (none after a tombstone, no key missing)": compacted.withColumn(
            "physical_offset", F.when(this, F.lit(older["physical_offset"])).otherwise(F.col("physical_offset"))
        ),
    }
    for expected, corrupted in cases.items():
        inputs = {**tables, "compaction_log": corrupted}
        failed = failures(spark, lake_settings, "compaction_log.critical", inputs, tmp_path, only=expected)
        assert expected in failed, f"{expected!r} did not fail; failed: {list(failed)}"
    missing = failures(
        spark, lake_settings, "compaction_log.critical", {**tables, "compaction_log": compacted.where(~this)}, tmp_path
    )
    assert list(missing) == ["each kept message is its key's latest (none after a tombstone, no key missing)"]


def test_expiry_and_producer_expectations_fail_on_their_corruption(spark, lake_settings, tables, tmp_path):
    segments, commitlog = tables["segments"], tables["commitlog"]
    assert failures(spark, lake_settings, "expiry.critical", tables, tmp_path) == {}
    assert failures(spark, lake_settings, "commitlog.warning", tables, tmp_path) == {}
    # the fixture's expiry left expired segments behind max_segments_per_run, each saying so
    kept = segments.where(F.col("retained_reason").isNotNull()).orderBy("start_offset").first()
    assert kept is not None and "max_segments_per_run" in kept["retained_reason"]
    deleted = segments.where(F.col("status") == "deleted").orderBy("start_offset").first()
    cases = {
        "no live segment older than retention (as of the last expiry run) unless its row explains why it is kept": (
            segments.withColumn(
                "retained_reason",
                F.when(F.col("segment") == kept["segment"], F.lit(None)).otherwise(F.col("retained_reason")),
            )
        ),
        "every deleted segment has a known reason and a deletion time": segments.withColumn(
            "deleted_reason",
            F.when(F.col("segment") == deleted["segment"], F.lit("tidy")).otherwise(F.col("deleted_reason")),
        ),
    }
    for expected, corrupted in cases.items():
        failed = failures(spark, lake_settings, "expiry.critical", {**tables, "segments": corrupted}, tmp_path)
        assert list(failed) == [expected]
        assert failed[expected]["unexpected_count"] == 1

    first = commitlog.orderBy("physical_offset").first()
    this = F.col("physical_offset") == first["physical_offset"]
    other = commitlog.where((F.col("topic") == first["topic"]) & ~this).first()
    cases = {
        "no UNIQ_KEY stored twice in a topic (a producer resent a message it thought lost)": commitlog.withColumn(
            "uniq_key", F.when(this, F.lit(other["uniq_key"])).otherwise(F.col("uniq_key"))
        ),
        "producer clocks are not ahead of the broker's (born <= store timestamp)": commitlog.withColumn(
            "born_timestamp", F.when(this, F.col("store_timestamp") + 1).otherwise(F.col("born_timestamp"))
        ),
    }
    for expected, corrupted in cases.items():
        failed = failures(spark, lake_settings, "commitlog.warning", {**tables, "commitlog": corrupted}, tmp_path)
        assert list(failed) == [expected]


def test_suite_frames_are_computed_one_ahead_and_every_one_is_released(spark, tmp_path):
    """The job validates a suite while the next suite's frame is computed: at most two are kept, each is
    released after its suite, and a failed validation releases its frame and the one computed ahead."""
    built: dict[str, object] = {}

    def suite(name: str) -> Suite:
        def frame(tables, settings):
            built[name] = spark.range(50).withColumn("suite", F.lit(name))
            return built[name]

        return Suite(name, ("commitlog",), frame, lambda settings: [])

    def kept(name: str) -> bool:
        return built[name].storageLevel.useMemory  # the cache manager's level: NONE once released

    todo = [suite(f"s{n}.critical") for n in range(4)]
    seen = []
    with contextlib.closing(_frames_ahead(todo, {}, None)) as frames:
        for each, frame in frames:
            assert frame is built[each.name] and kept(each.name) and frame.count() == 50
            assert [kept(name) for name in seen] == [False] * len(seen)  # the earlier suites' frames went
            time.sleep(0.3)  # time for more than the next frame to be computed, were more asked for
            assert sum(kept(name) for name in built) <= 2
            seen.append(each.name)
    assert seen == [s.name for s in todo] and not any(kept(name) for name in built)

    def failing(tables, settings):  # a runtime error, as a corrupt file gives: GX reports it, as it always did
        built["broken.critical"] = spark.range(5).withColumn("boom", F.raise_error(F.lit("a corrupt file")))
        return built["broken.critical"]

    import great_expectations.expectations as gxe  # as the job does: when the first suite is validated

    broken = Suite("broken.critical", ("commitlog",), failing, lambda settings: [])
    settings = make_settings(tmp_path / "lake")
    expectation = gxe.ExpectColumnValuesToNotBeNull(column="boom", description="computed")
    with contextlib.closing(_frames_ahead([broken, todo[0]], {}, settings)) as frames:
        names = []
        for each, frame in frames:
            names.append(each.name)
            if each is broken:  # GX reports the error as the expectation's failure; the run goes on
                result = _validate(gx_context(tmp_path), gx_source(tmp_path), each, [expectation], frame, settings)
                (outcome,) = result.results
                assert not outcome.success and "a corrupt file" in str(outcome.exception_info)
    assert names == ["broken.critical", "s0.critical"] and not any(kept(name) for name in built)

    built.clear()
    frames = _frames_ahead(todo, {}, None)
    with pytest.raises(RuntimeError), contextlib.closing(frames):
        for _ in frames:
            time.sleep(0.3)  # the next frame is computed meanwhile
            raise RuntimeError("a validation failed")
    # this one, and the next unless its computing had not started yet (then it is cancelled); none later
    assert "s0.critical" in built and set(built) <= {"s0.critical", "s1.critical"}
    assert not any(kept(name) for name in built)
