"""Ingest against the sequential reference broker (tests/reference.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table
from rmqlake.steps.ingest import ingest
from tests.conftest import make_settings
from tests.reference import RefBroker, RefConfig, encode

pytestmark = pytest.mark.spark

TOPICS = {"OrderEvents": 8, "UserProfile": 4, "Clickstream": 4}
SEGMENT = 4096


def ref_config(*, segment_size: int = SEGMENT) -> RefConfig:
    return RefConfig(segment_size=segment_size, queue_counts=dict(TOPICS), compaction_topics=frozenset({"UserProfile"}))


def settings_for(tmp_path: Path, *overrides: str):
    return make_settings(
        tmp_path / "lake", f"store.commitlog_segment_size={SEGMENT}", "ingest.sort_partitions=5", *overrides
    )


def write_jsonl(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    encoded = [line if isinstance(line, bytes) else json.dumps(line, ensure_ascii=False).encode() for line in lines]
    path.write_bytes(b"\n".join(encoded) + b"\n")
    return path


def commitlog_rows(spark, settings) -> list[dict]:
    frame = read_table(spark, Lake.from_settings(settings), "commitlog").orderBy("physical_offset")
    rows = []
    for row in frame.collect():
        data = row.asDict()
        data["body"] = bytes(data["body"])
        data["properties_bytes"] = bytes(data["properties_bytes"])
        rows.append(data)
    return rows


def assert_matches_reference(spark, settings, broker: RefBroker) -> None:
    actual = commitlog_rows(spark, settings)
    expected = broker.commitlog_rows()
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        mismatched = {k: (got[k], v) for k, v in want.items() if got[k] != v}
        assert not mismatched, f"message {want['source_file']}:{want['source_line']} differs: {mismatched}"
    lake = Lake.from_settings(settings)
    segments = sorted(lake.read_arrow("segments").to_pylist(), key=lambda r: r["start_offset"])
    assert [{k: r[k] for k in s} for r, s in zip(segments, broker.segment_rows(), strict=True)] == broker.segment_rows()
    rejected = sorted((r["source_file"], r["source_line"]) for r in lake.read_arrow("rejected").to_pylist())
    assert rejected == sorted(broker.rejected)
    assert lake.state().next_offset == broker.next_offset


@pytest.mark.parametrize("parser", ["jvm", "python"])
def test_ingest_of_generated_hours_matches_the_reference_broker(spark, tmp_path, java_oracle, parser):
    """Both parse routes (the JVM parser with the per-line parser for what it leaves, and Python alone) give the
    reference broker's store; the JVM route takes most lines."""
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=1500, topics=topics, hours=2, bad_rate=0.02, seed=11)
    settings = settings_for(tmp_path, f"ingest.parser={parser}")
    metrics = ingest(spark, settings, input_path=str(tmp_path / "in" / "landing"))
    broker = RefBroker(ref_config(), java_oracle)
    broker.ingest_files([str(p) for p in sorted((tmp_path / "in" / "landing").rglob("*.jsonl"))])
    assert metrics["rows_out"] == len(broker.messages)
    assert metrics["rejected"] == len(broker.rejected)
    assert len(broker.blanks) > 50  # small segments: many rolls
    if parser == "jvm":
        assert metrics["lines_parsed_in_jvm"] > 0.9 * metrics["rows_out"]
    else:
        assert metrics["lines_parsed_in_jvm"] == 0
    assert_matches_reference(spark, settings, broker)


def _sized_line(size: int, *, ts: int, queue: int = 0, topic: str = "OrderEvents", **fields) -> dict:
    """A line whose record is exactly ``size`` bytes (body length solved with the reference encoder)."""
    line = {
        "topic": topic,
        "queueId": queue,
        "bornTimestamp": ts,
        "uniqKey": "C0A8010A0D3118B4AAC2000000000000",
        **fields,
    }
    probe = RefBroker(ref_config(), _NoOracle())._validate(json.dumps({**line, "body": ""}).encode(), "f", 1, "0" * 64)
    line["body"] = "b" * (size - len(probe["bytes"]))
    return line


class _NoOracle:
    """Property bytes with the right length (order does not change a record's size)."""

    def broker_properties(self, pairs):
        return b"".join(f"{k}\x01{v}\x02".encode() for k, v in pairs)


def test_segment_rolls_exact_fit_and_eight_bytes_left(spark, tmp_path, java_oracle):
    lines = [
        _sized_line(4088, ts=1000),  # leaves exactly 8 bytes: fits
        _sized_line(300, ts=1001),  # 8 bytes left: 8-byte blank, then offset 4096
        _sized_line(3796, ts=1002),  # exactly fills the 3796 bytes left: does not fit (needs 8 spare)
        _sized_line(292, ts=1003),  # after 3796 at 8192, leaves exactly 8 again
        _sized_line(300, ts=1004),  # rolls to 12288
        _sized_line(SEGMENT - 7, ts=1005, queue=1),  # too big for any segment: rejected
    ]
    path = write_jsonl(tmp_path / "in" / "edge.jsonl", lines)
    settings = settings_for(tmp_path)
    ingest(spark, settings, input_path=str(path))
    rows = commitlog_rows(spark, settings)
    assert [(r["physical_offset"], r["total_size"]) for r in rows] == [
        (0, 4088),
        (4096, 300),
        (8192, 3796),
        (11988, 292),
        (12288, 300),
    ]
    segments = Lake.from_settings(settings).read_arrow("segments").to_pylist()
    assert [(s["segment"], s["message_count"], s["padding_bytes"], s["end_offset"], s["status"]) for s in segments] == [
        ("00000000000000000000", 1, 8, 4096, "sealed"),
        ("00000000000000004096", 1, 3796, 8192, "sealed"),
        ("00000000000000008192", 2, 8, 12288, "sealed"),
        ("00000000000000012288", 1, 0, 12588, "active"),
    ]
    broker = RefBroker(ref_config(), java_oracle)
    broker.ingest_files([str(path)])
    assert broker.blanks == [(4088, 8), (4396, 3796), (12280, 8)]
    assert_matches_reference(spark, settings, broker)
    reasons = [r["reason"] for r in Lake.from_settings(settings).read_arrow("rejected").to_pylist()]
    assert reasons == [
        "record of 4089 bytes cannot fit a commitlog segment of 4096 bytes (store.commitlog_segment_size)"
    ]


def test_edge_messages_ipv6_retry_topic_unicode_transactions(spark, tmp_path, java_oracle):
    retry_topic = "%RETRY%" + "g" * 130
    lines = [
        {"topic": "OrderEvents", "body": "ipv6", "bornTimestamp": 10, "bornHost": "[2001:db8::1]:40000"},
        {
            "topic": "OrderEvents",
            "body": "both v6",
            "bornTimestamp": 11,
            "bornHost": "[2001:db8::1]:40000",
            "storeHost": "[fe80::1:2:3:4]:10911",
            "transaction": "COMMIT",
            "keys": ["订单123", "k2"],
        },
        {"topic": retry_topic, "body": "retry", "bornTimestamp": 12, "reconsumeTimes": 3},
        {"topic": "Clickstream", "body": "", "bornTimestamp": 13, "tags": "TagA"},
        {"topic": "Clickstream", "body": "Ünïcödé 😀", "bornTimestamp": 14, "properties": {"région": "été"}},
        {"topic": "OrderEvents", "body": "half", "bornTimestamp": 15, "transaction": "PREPARED", "keys": "k3"},
        {"topic": "OrderEvents", "body": "rollback", "bornTimestamp": 16, "transaction": "ROLLBACK", "keys": "k3"},
        {"topic": "OrderEvents", "body": "not", "bornTimestamp": 17, "transaction": "NOT_TYPE", "keys": "k3"},
        {"topic": "UserProfile", "body": "v1", "bornTimestamp": 18, "keys": "user-1 alias-1"},
        {"topic": "UserProfile", "body": "no keys", "bornTimestamp": 19},
        {
            "topic": "OrderEvents",
            "body": "AAEC/w==",
            "bodyEncoding": "base64",
            "bornTimestamp": 20,
            "storeTimestamp": 5,
        },
        {"topic": "OrderEvents", "body": "mapped", "bornTimestamp": 21, "bornHost": "[::ffff:10.0.0.9]:7"},
    ]
    path = write_jsonl(tmp_path / "in" / "edge.jsonl", lines)
    settings = settings_for(tmp_path, "store.commitlog_segment_size=65536")
    ingest(spark, settings, input_path=str(path))
    broker = RefBroker(ref_config(segment_size=65536), java_oracle)
    broker.ingest_files([str(path)])
    assert_matches_reference(spark, settings, broker)
    rows = {r["source_line"]: r for r in commitlog_rows(spark, settings)}
    assert rows[1]["sys_flag"] == 0x10
    assert rows[2]["sys_flag"] == 0x38 and len(rows[2]["msg_id"]) == 56
    assert rows[3]["magic"] == -626843477  # V2: topic longer than 127 chars
    assert rows[4]["body_crc"] == 0 and rows[4]["body"] == b""
    assert rows[6]["queue_offset"] == 0 and rows[7]["queue_offset"] == 0  # PREPARED, ROLLBACK take no offset
    assert rows[12]["born_host"] == "10.0.0.9:7" and rows[12]["sys_flag"] == 0  # IPv4-mapped is IPv4, as in Java
    assert rows[11]["physical_offset"] == 0  # storeTimestamp 5 appends first
    assert rows[9]["keys"] == ["user-1", "alias-1"] and rows[9]["properties"]["KEYS"] == "user-1 alias-1"
    assert 10 not in rows
    reasons = [r["reason"] for r in Lake.from_settings(settings).read_arrow("rejected").to_pylist()]
    assert reasons == ["topic 'UserProfile' has cleanup.policy COMPACTION and the message has no keys"]


def test_record_bytes_from_table_rows_equal_the_reference_encoding(spark, tmp_path, java_oracle):
    """Re-encode each stored row with formats and compare to the reference's independent bytes."""
    from rmqlake.formats.hosts import parse_host
    from rmqlake.formats.record import Record, encode_record

    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=300, topics=topics, hours=1, seed=5)
    settings = settings_for(tmp_path, "store.commitlog_segment_size=65536")
    ingest(spark, settings, input_path=str(tmp_path / "in" / "landing"))
    broker = RefBroker(ref_config(segment_size=65536), java_oracle)
    broker.ingest_files([str(p) for p in sorted((tmp_path / "in" / "landing").rglob("*.jsonl"))])
    for row, want in zip(commitlog_rows(spark, settings), broker.messages, strict=True):
        record = Record(
            topic=row["topic"],
            queue_id=row["queue_id"],
            flag=row["flag"],
            queue_offset=row["queue_offset"],
            physical_offset=row["physical_offset"],
            sys_flag=row["sys_flag"],
            born_timestamp=row["born_timestamp"],
            born_host=parse_host(row["born_host"]),
            store_timestamp=row["store_timestamp"],
            store_host=parse_host(row["store_host"]),
            reconsume_times=row["reconsume_times"],
            prepared_transaction_offset=row["prepared_transaction_offset"],
            body=row["body"],
            properties=row["properties_bytes"],
            magic=row["magic"],
            body_crc=row["body_crc"],
        )
        assert (
            encode_record(record)
            == want["bytes"]
            == encode(want, queue_offset=row["queue_offset"], physical_offset=row["physical_offset"])
        )


def _hour_files(root: Path, hour: int) -> list[str]:
    return [str(p) for p in sorted(root.glob(f"landing/dt=*/hour={hour:02d}/*.jsonl"))]


def test_batches_continue_offsets_and_rerunning_a_batch_changes_nothing(spark, tmp_path, java_oracle):
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=800, topics=topics, hours=2, bad_rate=0.01, seed=21)
    settings = settings_for(tmp_path, "ingest.sort_partitions=3")
    hour0 = tmp_path / "in" / "landing" / "dt=2026-11-21" / "hour=00"
    hour1 = tmp_path / "in" / "landing" / "dt=2026-11-21" / "hour=01"
    first = ingest(spark, settings, input_path=str(hour0))
    second = ingest(spark, settings, input_path=str(hour1))
    assert second["start_offset"] == first["end_offset"]
    lake = Lake.from_settings(settings)
    versions = {name: lake.version(name) for name in ("commitlog", "segments", "rejected", "ingest_files")}
    ledger_seq = lake.ledger().seq

    again = ingest(spark, settings, input_path=str(hour0))
    assert again["status"] == "already_ingested" and again["rows_out"] == 0
    both = ingest(spark, settings, input_path=str(tmp_path / "in" / "landing"))
    assert both["status"] == "already_ingested" and both["files_skipped"] == len(_hour_files(tmp_path / "in", 0)) * 2
    assert {name: lake.version(name) for name in versions} == versions
    assert lake.ledger().seq == ledger_seq

    broker = RefBroker(ref_config(), java_oracle)
    broker.ingest_files(_hour_files(tmp_path / "in", 0))
    broker.ingest_files(_hour_files(tmp_path / "in", 1))
    assert_matches_reference(spark, settings, broker)


def test_big_files_read_in_splits_and_gzip_give_the_same_tables(spark, tmp_path, java_oracle):
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "plain", messages=600, topics=topics, hours=1, bad_rate=0.01, seed=8)
    generate(tmp_path / "gz", messages=600, topics=topics, hours=1, bad_rate=0.01, seed=8, gzip_files=True)
    split = settings_for(tmp_path / "a", "ingest.split_bytes=4096")
    ingest(spark, split, input_path=str(tmp_path / "plain" / "landing"))
    zipped = settings_for(tmp_path / "b")
    ingest(spark, zipped, input_path=str(tmp_path / "gz" / "landing"))
    plain_rows = commitlog_rows(spark, split)
    gz_rows = commitlog_rows(spark, zipped)
    assert len(plain_rows) == len(gz_rows) > 0
    ignore = {
        "source_file",
        "uniq_key",
        "properties",
        "properties_bytes",
        "total_size",
        "physical_offset",
        "segment",
        "msg_id",
        "batch_id",
    }  # generated UNIQ_KEYs derive from the file hash, which differs
    for plain, zipped_row in zip(plain_rows, gz_rows, strict=True):
        assert {k: v for k, v in plain.items() if k not in ignore} == {
            k: v for k, v in zipped_row.items() if k not in ignore
        }
    broker = RefBroker(ref_config(), java_oracle)
    broker.ingest_files([str(p) for p in sorted((tmp_path / "plain" / "landing").rglob("*.jsonl"))])
    assert_matches_reference(spark, split, broker)


def test_tables_open_in_delta_rs_duckdb_and_spark(spark, tmp_path):
    import duckdb
    from deltalake import DeltaTable

    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=200, topics=topics, hours=1, seed=3)
    settings = settings_for(tmp_path, "store.commitlog_segment_size=65536")
    assert ingest(spark, settings, input_path=str(tmp_path / "in" / "landing"))["rows_out"] == 200
    uri = str(tmp_path / "lake" / "commitlog")
    table = DeltaTable(uri)
    assert table.metadata().partition_columns == ["segment"]
    arrow = table.to_pyarrow_table(columns=["segment", "physical_offset", "total_size"])
    assert arrow.num_rows == 200
    dataset = table.to_pyarrow_dataset()  # noqa: F841 - read by DuckDB through the local name
    counted = duckdb.sql("select count(*), sum(total_size) from dataset").fetchall()[0]
    assert counted[0] == 200
    by_spark = spark.read.parquet(*table.file_uris())
    assert by_spark.count() == 200
    # integer columns are stored as deltas: each engine decodes them to the values delta-rs gives
    totals = [pc.sum(arrow.column(name)).as_py() for name in ("physical_offset", "total_size")]
    assert list(by_spark.agg(F.sum("physical_offset"), F.sum("total_size")).first()) == totals
    assert counted[1] == totals[1]
    chunk = pq.read_metadata(table.file_uris()[0]).row_group(0)
    encodings = {chunk.column(i).path_in_schema: chunk.column(i).encodings for i in range(chunk.num_columns)}
    assert "DELTA_BINARY_PACKED" in encodings["physical_offset"] and "DELTA_BINARY_PACKED" in encodings["store_time"]
    assert "PLAIN" in encodings["body_crc"] and "DELTA_BINARY_PACKED" not in encodings["body_crc"]
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert all(a["num_records"] > 0 and a["min.physical_offset"] is not None for a in actions)
    assert table.transaction_version("rmqlake.ledger") == 1
