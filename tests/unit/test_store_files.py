"""Store files byte for byte against the spec's vectors (records, the blank record, CQ units, index entries):
a broker's bytes are read by the import walk and written back by the export writers unchanged."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqlake import store
from rmqlake.formats.indexfile import index_file_size
from rmqlake.formats.store import Checkpoint
from tests.vectors import section

BLANK = section("commitlog_blank_record")


@pytest.mark.parametrize("case", section("commitlog_records"), ids=lambda c: c["name"])
def test_a_broker_segment_read_and_written_back_is_the_same_bytes(case, tmp_path):
    record = bytes.fromhex(case["expected"]["record_hex"])
    start = case["inputs"]["physicalOffset"]
    segment = f"{start:020d}"
    original = record + bytes.fromhex(BLANK["hex"]) + bytes(BLANK["maxBlank"] - 8)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / segment).write_bytes(original)

    (row,) = [
        r
        for batch in store.read_segment_file(str(tmp_path / "in" / segment), start_offset=start)
        for r in batch.to_pylist()
        if not r["blank_end"]
    ]
    assert row["corrupt_reason"] is None and row["msg_id"] == case["expected"]["offsetMsgId"]
    assert row["properties_bytes"].hex() == case["expected"]["propertiesString_hex"]
    assert row["queue_offset"] == case["expected"]["storedQueueOffset"]
    pq.write_table(pa.Table.from_pylist([row], schema=store.IMPORTED_SCHEMA), tmp_path / "rows.parquet")
    result = store.write_segment(
        {
            "segment": segment,
            "start_offset": start,
            "data_end": start + len(record),
            "sealed": True,
            "file_size": len(original),
            "mtime_ms": 1_795_219_200_123,  # when the next segment was opened
            "files": [str(tmp_path / "rows.parquet")],
            "out": str(tmp_path / "out"),
        }
    )
    assert result == {"file": f"commitlog/{segment}", "records": 1, "bytes": len(record), "last_offset": start}
    assert (tmp_path / "out" / "commitlog" / segment).read_bytes() == original
    assert (tmp_path / "out" / "commitlog" / segment).stat().st_mtime_ns == 1_795_219_200_123_000_000


def test_corrupt_records_are_reported_with_file_and_offset_and_the_walk_goes_on(tmp_path):
    first, second = (bytes.fromhex(c["expected"]["record_hex"]) for c in section("commitlog_records")[:2])
    # the vectors sit at their own offsets; re-placed one after the other, their PHYSICALOFFSET fields disagree
    path = tmp_path / "00000000000000000000"
    broken = bytearray(first)
    broken[8] ^= 0x01  # BODYCRC
    path.write_bytes(bytes(broken) + second + bytes(64))
    rows = [r for b in store.read_segment_file(str(path), start_offset=0) for r in b.to_pylist()]
    end = len(first) + len(second)
    assert [r["corrupt_reason"] for r in rows] == [
        f"{path} at offset 0 (bytes 0-{len(first)}, {len(first)} bytes): body CRC mismatch: "
        f"stored {int.from_bytes(broken[8:12], 'big', signed=True)}, "
        f"computed {int.from_bytes(first[8:12], 'big', signed=True)}",
        f"{path} at offset {len(first)} (bytes {len(first)}-{end}, {len(second)} bytes): PHYSICALOFFSET field is 226",
    ]
    garbage = tmp_path / "00000000000000001024"
    garbage.write_bytes(b"\x00\x00\x00\x30\x12\x34\x56\x78" + bytes(100))  # unknown magic: the size is not trusted
    (only,) = [r for b in store.read_segment_file(str(garbage), start_offset=1024) for r in b.to_pylist()]
    assert "unknown magic code 0x12345678" in only["corrupt_reason"]


def test_consume_queue_and_index_files_hold_the_vector_bytes(tmp_path):
    units = [u for u in section("consumequeue_units") if u["topic"] == "TopicTest" and u["queueId"] == 0]
    pq.write_table(
        pa.table(
            {
                "queue_offset": [u["queueOffset"] for u in units],
                "commitlog_offset": [u["commitLogOffset"] for u in units],
                "size": pa.array([u["size"] for u in units], pa.int32()),
                "tags_code": [u["tagsCode"] for u in units],
                "store_timestamp": [1_795_219_200_000 + 1000 * u["queueOffset"] for u in units],
            }
        ),
        tmp_path / "cq.parquet",
    )
    store.write_cq_file(
        {
            "topic": "TopicTest",
            "queue_id": 0,
            "cq_file": units[0]["file"],
            "file_size": 300_000 * 20,
            "first_in_queue": True,
            "files": [str(tmp_path / "cq.parquet")],
            "out": str(tmp_path),
        }
    )
    cq_path = tmp_path / "consumequeue" / "TopicTest" / "0" / units[0]["file"]
    last_unit = max(u["queueOffset"] for u in units)
    assert cq_path.stat().st_mtime_ns == (1_795_219_200_000 + 1000 * last_unit) * 1_000_000  # its last unit's
    data = cq_path.read_bytes()
    for unit in units:
        assert data[unit["positionInFile"] : unit["positionInFile"] + 20].hex() == unit["unit_hex"]

    scenario = section("index_scenario")
    entries = scenario["entries"]
    header = scenario["header"]
    pq.write_table(
        pa.table(
            {
                "index_no": pa.array([e["index"] for e in entries], pa.int32()),
                "key_hash": pa.array([e["keyHash"] for e in entries], pa.int32()),
                "slot": pa.array([e["keyHash"] % scenario["hashSlotNum"] for e in entries], pa.int32()),
                "phy_offset": pa.array([e["phyOffset"] for e in entries], pa.int64()),
                "time_diff": pa.array([e["timeDiffSec"] for e in entries], pa.int32()),
                "prev_index": pa.array([e["prevIndex"] for e in entries], pa.int32()),
            }
        ),
        tmp_path / "index.parquet",
    )
    store.write_index_file(
        {
            "index_file": "20231114221320000",
            "header": {
                "begin_timestamp": header["beginTimestamp"],
                "end_timestamp": header["endTimestamp"],
                "begin_phy_offset": header["beginPhyOffset"],
                "end_phy_offset": header["endPhyOffset"],
                "hash_slot_count": header["hashSlotCount"],
                "index_count": header["indexCount"],
            },
            "slots": scenario["hashSlotNum"],
            "file_size": index_file_size(scenario["hashSlotNum"], scenario["indexNum"]),
            "files": [str(tmp_path / "index.parquet")],
            "out": str(tmp_path),
        }
    )
    path = tmp_path / "index" / "20231114221320000"
    assert path.stat().st_size == scenario["fileSize"]
    assert path.stat().st_mtime_ns == header["endTimestamp"] * 1_000_000  # the last entry's store time
    with open(path, "rb") as data:  # 420 MB, mostly a hole: read only what the vectors name

        def at(offset: int, length: int) -> str:
            data.seek(offset)
            return data.read(length).hex()

        assert at(0, 40) == header["hex"]
        for slot in scenario["slots"]:
            assert at(slot["byteOffset"], 4) == slot["hex"]
        for entry in entries:
            assert at(entry["byteOffset"], 20) == entry["hex"]


def test_checkpoint_is_one_page_with_five_big_endian_longs():
    data = Checkpoint(1, 2, 3, 4, 5).encode()
    assert len(data) == 4096 and data[:40] == b"".join(n.to_bytes(8, "big") for n in (1, 2, 3, 4, 5))
    assert not any(data[40:]) and Checkpoint.decode(data) == Checkpoint(1, 2, 3, 4, 5)


@pytest.mark.parametrize(
    ("topic", "queue", "cq_file"),
    [
        ("../../../pw", 0, "00000000000000000000"),
        ("..", 0, "00000000000000000000"),
        ("a/../../../../b", 0, "00000000000000000000"),
    ],
)
def test_store_files_are_never_written_outside_the_store(topic, queue, cq_file, tmp_path):
    pq.write_table(
        pa.table(
            {
                "queue_offset": [0],
                "commitlog_offset": [0],
                "size": pa.array([100], pa.int32()),
                "tags_code": [0],
                "store_timestamp": [0],
            }
        ),
        tmp_path / "cq.parquet",
    )
    out = tmp_path / "deep" / "er" / "out"
    task = {"topic": topic, "queue_id": queue, "cq_file": cq_file, "file_size": 16 * 20, "first_in_queue": True,
            "files": [str(tmp_path / "cq.parquet")], "out": str(out)}  # fmt: skip
    with pytest.raises(ValueError, match="refusing to write outside"):
        store.write_cq_file(task)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["cq.parquet"]
    with pytest.raises(ValueError, match="refusing to write outside"):
        store.write_segment({"segment": "..", "start_offset": 0, "data_end": 0, "sealed": False,
                                   "file_size": 64, "files": [], "out": str(out)})  # fmt: skip


def _vector_rows(tmp_path, names: list[str]) -> list[dict]:
    """The commitlog rows of vector records, read by the import walk."""
    rows = []
    for case in (c for c in section("commitlog_records") if c["name"] in names):
        start = case["inputs"]["physicalOffset"]
        path = tmp_path / "walk" / f"{start:020d}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(bytes.fromhex(case["expected"]["record_hex"]) + bytes(64))
        (row,) = [r for b in store.read_segment_file(str(path), start_offset=start) for r in b.to_pylist()]
        rows.append({**row, "hex": case["expected"]["record_hex"]})
    return rows


@pytest.mark.parametrize("rollover", ["cq_full", "log_full"])
def test_a_compacted_queue_is_written_as_the_broker_compaction_store_holds_it(rollover, tmp_path):
    names = ["v1_ipv4_basic", "v1_ipv6_born_host", "v1_empty_properties"]  # TopicTest, queues 0, 1 and 3
    rows = _vector_rows(tmp_path, names)
    offsets = [12, 3, 7]  # queue offsets with gaps, rows out of order
    stored = [{**r, "queue_offset": q} for r, q in zip(rows, offsets, strict=True)]
    pq.write_table(
        pa.Table.from_pylist([{k: v for k, v in r.items() if k != "hex"} for r in stored],
                             schema=store.IMPORTED_SCHEMA),
        tmp_path / "log.parquet",
    )  # fmt: skip
    tags = {12: -5, 3: 0, 7: 2_000_000_000}
    times = {q: 1_795_219_200_000 + q for q in offsets}
    pq.write_table(
        pa.table({"queue_offset": offsets, "tags_code": [tags[q] for q in offsets],
                  "store_timestamp": [times[q] for q in offsets]}),
        tmp_path / "cq.parquet",
    )  # fmt: skip
    ordered = sorted(stored, key=lambda r: r["queue_offset"])  # 3, 7, 12: the order they are appended
    sizes = [len(r["hex"]) // 2 for r in ordered]
    # cq_full: a CQ file of 3 unit slots takes 2 units (the broker never fills its last slot but with the end
    # unit); log_full: the third record would leave fewer than 8 bytes in the log file
    cq_size, log_size = (46 * 3, 4096) if rollover == "cq_full" else (46 * 100, sizes[0] + sizes[1] + sizes[2] + 7)
    result = store.write_compaction_queue(
        {"topic": "TopicTest", "queue_id": 1, "log_files": [str(tmp_path / "log.parquet")],
         "cq_files": [str(tmp_path / "cq.parquet")], "log_file_size": log_size, "cq_file_size": cq_size,
         "out": str(tmp_path / "out")}
    )  # fmt: skip
    assert result == {"queue": "TopicTest/1", "files": 2, "records": 3}

    def record(row, position: int) -> bytes:  # the vector's bytes, QUEUEID (the partition's), QUEUEOFFSET and
        data = bytearray.fromhex(row["hex"])  # PHYSICALOFFSET set
        data[12:16] = (1).to_bytes(4, "big")
        data[20:36] = row["queue_offset"].to_bytes(8, "big") + position.to_bytes(8, "big")
        return bytes(data)

    def unit(position: int, row) -> bytes:
        q = row["queue_offset"]
        return b"".join([position.to_bytes(8, "big"), len(record(row, 0)).to_bytes(4, "big"),
                         tags[q].to_bytes(8, "big", signed=True), times[q].to_bytes(8, "big"), q.to_bytes(8, "big"),
                         (1).to_bytes(2, "big"), (-1).to_bytes(4, "big", signed=True), bytes(4)])  # fmt: skip

    end_unit = (-1).to_bytes(8, "big", signed=True) + bytes(30) + (-1).to_bytes(4, "big", signed=True) + bytes(4)
    used = sizes[0] + sizes[1]
    blank = (log_size - used).to_bytes(4, "big") + bytes.fromhex("cbd43194")
    first_log = record(ordered[0], 0) + record(ordered[1], sizes[0]) + blank
    first_cq = unit(0, ordered[0]) + unit(sizes[0], ordered[1]) + end_unit
    second = f"{log_size:020d}"
    folder = tmp_path / "out" / "compaction"
    assert sorted(p.name for p in (folder / "compactionLog" / "TopicTest" / "1").iterdir()) == [f"{0:020d}", second]
    assert sorted(p.name for p in (folder / "compactionCq" / "TopicTest" / "1").iterdir()) == [f"{0:020d}", second]
    log0 = (folder / "compactionLog" / "TopicTest" / "1" / f"{0:020d}").read_bytes()
    assert log0 == first_log + bytes(log_size - len(first_log))
    cq0 = (folder / "compactionCq" / "TopicTest" / "1" / f"{0:020d}").read_bytes()
    assert cq0 == first_cq + bytes(cq_size - len(first_cq))
    log1 = (folder / "compactionLog" / "TopicTest" / "1" / second).read_bytes()
    assert log1 == record(ordered[2], log_size) + bytes(log_size - sizes[2])
    cq1 = (folder / "compactionCq" / "TopicTest" / "1" / second).read_bytes()
    assert cq1 == unit(log_size, ordered[2]) + bytes(cq_size - 46)
    assert (folder / "compactionLog" / "TopicTest" / "1" / second).stat().st_mtime_ns == times[12] * 1_000_000


def test_a_compacted_queue_whose_log_and_cq_rows_disagree_is_refused(tmp_path):
    rows = _vector_rows(tmp_path, ["v1_ipv4_basic"])
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "hex"} for r in rows],
                                        schema=store.IMPORTED_SCHEMA), tmp_path / "log.parquet")  # fmt: skip
    pq.write_table(pa.table({"queue_offset": [5], "tags_code": [0], "store_timestamp": [1]}), tmp_path / "cq.parquet")
    with pytest.raises(ValueError, match="not of the same queue offsets"):
        store.write_compaction_queue(
            {"topic": "T", "queue_id": 0, "log_files": [str(tmp_path / "log.parquet")],
             "cq_files": [str(tmp_path / "cq.parquet")], "log_file_size": 4096, "cq_file_size": 460,
             "out": str(tmp_path / "out")}
        )  # fmt: skip
