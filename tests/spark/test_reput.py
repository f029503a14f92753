"""Reput against the sequential reference dispatcher (tests/reference.py, checked against RocketMQ's vectors)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table
from rmqlake.lake.storage import Storage
from rmqlake.steps import reput as reput_step
from rmqlake.steps.ingest import ingest
from rmqlake.steps.reput import reput
from rmqlake.transforms import reput as reput_transforms
from tests.conftest import make_settings
from tests.reference import RefBroker, RefConfig, RefDispatcher

pytestmark = pytest.mark.spark

TOPICS = {"OrderEvents": 8, "UserProfile": 4, "Clickstream": 4}
SEGMENT = 8192
SLOTS, ENTRIES, UNITS = 16, 40, 50  # tiny: slot collisions everywhere, many index files and CQ files


def settings_for(tmp_path: Path, *overrides: str):
    return make_settings(
        tmp_path / "lake",
        f"store.commitlog_segment_size={SEGMENT}",
        f"store.index_slots={SLOTS}",
        f"store.index_max_entries={ENTRIES}",
        f"store.cq_units_per_file={UNITS}",
        "ingest.sort_partitions=3",
        *overrides,
    )


def reference(java_oracle, files_per_batch: list[list[str]], **dispatcher) -> tuple[RefBroker, RefDispatcher]:
    broker = RefBroker(
        RefConfig(segment_size=SEGMENT, queue_counts=dict(TOPICS), compaction_topics=frozenset({"UserProfile"})),
        java_oracle,
    )
    for files in files_per_batch:
        broker.ingest_files(files)
    ref = RefDispatcher(SLOTS, ENTRIES, UNITS, **dispatcher)
    for message in broker.messages:
        ref.dispatch(message)
    return broker, ref


def table(spark, settings, name, order):
    return [r.asDict() for r in read_table(spark, Lake.from_settings(settings), name).orderBy(*order).collect()]


def assert_tables_match(spark, settings, ref: RefDispatcher) -> None:
    cq = table(spark, settings, "consumequeue", ["commitlog_offset"])
    assert cq == sorted(ref.units, key=lambda u: u["commitlog_offset"])
    index = table(spark, settings, "indexfile", ["index_file", "index_no"])
    expected = ref.index_rows()
    assert len(index) == len(expected)
    for got, want in zip(index, expected, strict=True):
        assert {k: got[k] for k in want} == want, (got, want)
    headers = sorted(
        Lake.from_settings(settings).read_arrow("indexfile_header").to_pylist(), key=lambda h: h["index_file"]
    )
    assert headers == ref.header_rows()


def _generated(tmp_path: Path, *, hours: int = 2, messages: int = 700, seed: int = 4) -> Path:
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=messages, topics=topics, hours=hours, bad_rate=0.0, seed=seed)
    return tmp_path / "in" / "landing"


def _hour_files(landing: Path, hour: int) -> list[str]:
    return [str(p) for p in sorted(landing.glob(f"dt=*/hour={hour:02d}/*.jsonl"))]


def test_reput_matches_the_reference_dispatcher(spark, tmp_path, java_oracle):
    landing = _generated(tmp_path)
    settings = settings_for(tmp_path)
    ingest(spark, settings, input_path=str(landing))
    metrics = reput(spark, settings)
    broker, ref = reference(java_oracle, [_hour_files(landing, 0) + _hour_files(landing, 1)])
    assert metrics["rows_in"] == len(broker.messages)
    assert metrics["index_entries"] == len(ref.index_rows())
    assert len(ref.files) > 10 and metrics["index_files_created"] == len(ref.files)
    assert_tables_match(spark, settings, ref)
    state = Lake.from_settings(settings).state()
    assert state.dispatched_offset == broker.next_offset
    assert state.reput.index_msg_timestamp == ref.index_msg_timestamp
    assert reput(spark, settings)["status"] == "up_to_date"


def test_interleaved_ingest_and_reput_equal_one_reput_over_everything(spark, tmp_path, java_oracle):
    landing = _generated(tmp_path, hours=3, messages=600, seed=9)
    settings = settings_for(tmp_path)
    for hour in range(3):
        ingest(spark, settings, input_path=str(landing / "dt=2026-11-21" / f"hour={hour:02d}"))
        if hour != 1:  # two ingests between the second and third reput
            reput(spark, settings)
    _, ref = reference(java_oracle, [_hour_files(landing, h) for h in range(3)])
    assert_tables_match(spark, settings, ref)


def test_keys_numbered_by_a_global_sort_give_the_same_tables(spark, tmp_path, java_oracle, monkeypatch):
    # Key runs that overlap (a commitlog out of physical order within its files) are numbered by a global sort
    # and staged by Spark instead of the band tasks: the same entries, chains and headers across runs.
    monkeypatch.setattr(reput_transforms, "runs_are_disjoint", lambda runs: False)
    landing = _generated(tmp_path, hours=2, messages=300, seed=13)
    settings = settings_for(tmp_path)
    for hour in range(2):
        ingest(spark, settings, input_path=str(landing / "dt=2026-11-21" / f"hour={hour:02d}"))
        reput(spark, settings)
    _, ref = reference(java_oracle, [_hour_files(landing, h) for h in range(2)])
    assert_tables_match(spark, settings, ref)


def test_index_switch_and_transaction_types(spark, tmp_path, java_oracle):
    lines = [
        {"topic": "OrderEvents", "body": "a", "bornTimestamp": 1000, "keys": "k1  k2", "uniqKey": "U1"},
        {"topic": "OrderEvents", "body": "b", "bornTimestamp": 2000, "keys": "k1", "transaction": "PREPARED"},
        {"topic": "OrderEvents", "body": "c", "bornTimestamp": 3000, "keys": "k1", "transaction": "ROLLBACK"},
        {
            "topic": "OrderEvents",
            "body": "d",
            "bornTimestamp": 4000,
            "keys": "k1",
            "transaction": "COMMIT",
            "tags": "TagPay",
        },
        {
            "topic": "SCHEDULE_TOPIC_XXXX",
            "body": "e",
            "bornTimestamp": 5000,
            "queueId": 2,
            "tags": "TagD",
            "properties": {"DELAY": "3", "REAL_TOPIC": "OrderEvents", "REAL_QID": "0"},
        },
    ]
    path = tmp_path / "in" / "tx.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    settings = settings_for(tmp_path)
    ingest(spark, settings, input_path=str(path))
    reput(spark, settings)
    _, ref = reference(java_oracle, [[str(path)]])
    assert_tables_match(spark, settings, ref)
    cq = table(spark, settings, "consumequeue", ["commitlog_offset"])
    assert [(u["topic"], u["tags_code"]) for u in cq] == [
        ("OrderEvents", 0),
        ("OrderEvents", -1797388594),  # COMMIT: TagPay, negative hash stays negative
        ("SCHEDULE_TOPIC_XXXX", 5000 + 10_000),  # delay level 3: delivery time
    ]
    index = table(spark, settings, "indexfile", ["index_no"])
    assert len(index) == 3 + 2 + 0 + 2 + 1  # U1 k1 k2 | uniq k1 (PREPARED) | none (ROLLBACK) | uniq k1 | uniq

    off = settings_for(tmp_path / "off", "store.message_index_enable=false")
    ingest(spark, off, input_path=str(path))
    metrics = reput(spark, off)
    assert metrics["index_entries"] == 0 and metrics["cq_units"] == 3
    assert not Lake.from_settings(off).exists("indexfile")


def test_delay_topic_tags_code_reads_the_configured_delay_levels(spark, tmp_path):
    """With messageDelayLevel "1s 2s 3s" a unit on the delay topic carries store time + its level's delay,
    a level above 3 (clamped at the send) the 3rd level's; the broker's default table would give 5 s and 10 s."""
    lines = [
        {"topic": "OrderEvents", "body": body, "bornTimestamp": 7000, "delayLevel": level}
        for body, level in (("two", 2), ("four", 4))
    ]
    path = tmp_path / "in" / "delay.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    settings = settings_for(tmp_path, "broker.message_delay_level=1s 2s 3s")
    ingest(spark, settings, input_path=str(path))
    reput(spark, settings)
    cq = table(spark, settings, "consumequeue", ["commitlog_offset"])
    assert [u["tags_code"] for u in cq if u["topic"] == "SCHEDULE_TOPIC_XXXX"] == [7000 + 2000, 7000 + 3000]


def _cq_layout(settings) -> list[tuple[str, int]]:
    """(partition folders, data files in them) of the consumequeue table's files."""
    files = Lake.from_settings(settings).engine.active_files("consumequeue")
    folders = Counter(data_file.path.rsplit("/", 1)[0] for data_file in files)
    return sorted(folders.items())


def test_the_spark_routes_give_the_tables_and_files_of_the_file_and_band_routes(spark, tmp_path, java_oracle):
    """The dispatch over a Spark scan and the CQ files staged by a Spark write (the reference routes) against the
    dispatch reading the files and the CQ band tasks: the same tables, and one data file per CQ file a run in
    the same partition folders, over runs that start inside a segment."""
    landing = _generated(tmp_path, hours=3, messages=500, seed=21)
    lakes = {}
    for route in ("files", "spark"):
        settings = settings_for(tmp_path / route)
        with pytest.MonkeyPatch.context() as patch:
            if route == "spark":
                patch.setattr(reput_step, "_dispatch", reput_step._dispatch_by_spark)
                patch.setattr(reput_step, "_stage_queue_bands", reput_step._stage_queue_by_spark)
            for hour in range(3):
                ingest(spark, settings, input_path=str(landing / "dt=2026-11-21" / f"hour={hour:02d}"))
                reput(spark, settings)
        lakes[route] = settings
    _, ref = reference(java_oracle, [_hour_files(landing, h) for h in range(3)])
    for settings in lakes.values():
        assert_tables_match(spark, settings, ref)
    layout = _cq_layout(lakes["files"])
    assert layout == _cq_layout(lakes["spark"])
    assert {count for _, count in layout} <= {1, 2, 3}, layout  # one file a run
    if any(unit["topic"].startswith("%RETRY%") for unit in ref.units):  # Spark's %XX escapes in the folders
        assert any(folder.startswith("topic=%25RETRY%25") for folder, _ in layout), layout


def test_request_batches_read_the_rows_of_spark_s_filtered_scan(spark, tmp_path):
    """A commitlog file rewritten in row groups of 7 rows, read from an offset inside it: the row groups before
    it are skipped by their statistics, and the rows are those of ``dispatch_requests`` over the filtered scan."""
    landing = _generated(tmp_path, hours=1, messages=120, seed=5)
    settings = settings_for(tmp_path)
    ingest(spark, settings, input_path=str(landing))
    lake = Lake.from_settings(settings)
    largest = max(lake.engine.active_files("commitlog"), key=lambda f: (f.num_records, f.path))
    source = pq.read_table(lake.storage.file_path(f"commitlog/{largest.path}"))
    small_groups = tmp_path / "small" / "part-0.parquet"
    small_groups.parent.mkdir()
    pq.write_table(source, small_groups, row_group_size=7)
    assert pq.ParquetFile(small_groups).metadata.num_row_groups >= 3
    offsets = sorted(source.column("physical_offset").to_pylist())
    storage = Storage(str(small_groups.parent))
    for from_offset in (0, offsets[len(offsets) // 2], offsets[-1], offsets[-1] + 1):
        got = pa.Table.from_batches(
            list(reput_transforms.request_batches(storage, "part-0.parquet", from_offset=from_offset)),
            schema=reput_transforms._REQUEST_SCHEMA,
        )
        frame = spark.read.parquet(str(small_groups)).filter(F.col("physical_offset") >= from_offset)
        want = [row.asDict() for row in reput_transforms.dispatch_requests(frame).collect()]
        assert got.to_pylist() == want
        if from_offset == 0:
            assert len(want) == source.num_rows and any(row["keys_property"] for row in want)


def test_many_bands_for_many_records_give_the_same_tables(spark, tmp_path, java_oracle, monkeypatch):
    # A band per 40 records read (a band task holds its rows in memory): many more CQ and index bands than
    # shuffle partitions, some of them empty.
    monkeypatch.setattr(reput_step, "BAND_ROWS", 40)
    landing = _generated(tmp_path, hours=1, messages=400, seed=17)
    settings = settings_for(tmp_path)
    ingest(spark, settings, input_path=str(landing))
    metrics = reput(spark, settings)
    assert metrics["rows_in"] > 8 * 40  # 9 bands or more: more than the shuffle partitions
    _, ref = reference(java_oracle, [_hour_files(landing, 0)])
    assert_tables_match(spark, settings, ref)
