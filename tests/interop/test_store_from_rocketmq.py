"""RocketMQ → rmqlake: a store written by RocketMQ's own DefaultMessageStore.putMessage (5.3.3) is what rmqlake reads.

The harness (tests/interop/java/StoreHarness.java ``write``) puts the messages of
tests/interop/data.py — the same variety the lake fixture holds — into an empty store with the
small file sizes (several segment rollovers, CQ files and index files), prints every stored message
and shuts the store down cleanly. Then:

* ``import-store`` of that directory gives a ``commitlog`` equal to what the broker stored, field by
  field; ``reput`` gives ``consumequeue``, ``indexfile`` and ``indexfile_header`` equal to the broker's
  own CQ and index files, decoded here;
* the same messages as a producer log (with the store times the broker chose) → ingest → reput →
  export-store gives commitlog, consumequeue and index files byte-identical to the broker's.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from rmqlake.lake import Lake
from rmqlake.steps.ingest import ingest
from rmqlake.steps.reput import reput
from rmqlake.steps.store import export_store, import_store
from tests.interop import data
from tests.interop.conftest import lake_settings
from tests.interop.harness import message_fields
from tests.interop.store_checks import (
    assert_store_answers_equal_the_lake,
    commitlog_rows,
    lookups,
    read_store,
    store_request,
)
from tests.view_checks import assert_records_decode_to_their_stored_columns

pytestmark = [pytest.mark.interop, pytest.mark.spark]
HEADER, UNIT, ENTRY = 40, 20, 20


@pytest.fixture(scope="module")
def written(harness_runs):
    """The broker's store after putMessage of every message and a clean shutdown, and what it printed."""
    written = harness_runs["store-write"].result(timeout=600)
    assert len(written["answer"]["stored"]) == len(written["messages"])
    assert not (written["store"] / "abort").exists()  # a clean shutdown
    return written


def broker_consume_queues(store: Path) -> list[dict]:
    """Every unit of the broker's CQ files: (topic, queue, queue offset, commitlog offset, size, tagsCode, file)."""
    units = []
    for topic in sorted(os.listdir(store / "consumequeue")):
        for queue in sorted(os.listdir(store / "consumequeue" / topic), key=int):
            for name in sorted(os.listdir(store / "consumequeue" / topic / queue)):
                raw = (store / "consumequeue" / topic / queue / name).read_bytes()
                assert len(raw) == data.UNITS * UNIT, name  # preallocated at the configured size
                for position in range(0, len(raw), UNIT):
                    offset, size, tags = struct.unpack_from(">qiq", raw, position)
                    if size == 0:
                        assert not any(raw[position:]), f"{topic}/{queue}/{name}: bytes after the last unit"
                        break
                    units.append(
                        {
                            "topic": topic,
                            "queue_id": int(queue),
                            "queue_offset": (int(name) + position) // UNIT,
                            "commitlog_offset": offset,
                            "size": size,
                            "tags_code": tags,
                            "cq_file": name,
                        }
                    )
    return units


def decode_index_file(path: Path) -> dict:
    """Header, slot table and entries of one index file (entry 0 is never used)."""
    raw = path.read_bytes()
    assert len(raw) == HEADER + 4 * data.SLOTS + ENTRY * data.ENTRIES, path.name
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = struct.unpack_from(">qqqqii", raw, 0)
    slots = list(struct.unpack_from(f">{data.SLOTS}i", raw, HEADER))
    entries = []
    for number in range(1, index_count):
        key_hash, phy, diff, prev = struct.unpack_from(">iqii", raw, HEADER + 4 * data.SLOTS + ENTRY * number)
        entries.append(
            {"index_no": number, "key_hash": key_hash, "phy_offset": phy, "time_diff": diff, "prev_index": prev}
        )
    header = {
        "begin_timestamp": begin_ts,
        "end_timestamp": end_ts,
        "begin_phy_offset": begin_phy,
        "end_phy_offset": end_phy,
        "hash_slot_count": slot_count,
        "index_count": index_count,
    }
    return {"header": header, "slots": slots, "entries": entries}


def test_import_store_reads_what_the_broker_stored_and_reput_rebuilds_its_cq_and_index(spark, written):
    store, root = written["store"], written["root"]
    settings = lake_settings(root / "imported")
    result = import_store(spark, settings, store_dir=str(store))
    assert result["status"] == "imported" and result["corrupt_records"] == 0, result
    lake = Lake.from_settings(settings, read_only=True)
    rows = {r["physical_offset"]: r for r in lake.read_arrow("commitlog").to_pylist()}
    stored = written["answer"]["stored"]
    assert sorted(rows) == [s["wroteOffset"] for s in stored]
    assert assert_records_decode_to_their_stored_columns(lake) == len(rows)
    assert result["end_offset"] == written["answer"]["maxPhyOffset"]
    segments = {r["segment"] for r in rows.values()}
    assert len(segments) >= 5  # several rollovers, each with the broker's blank record
    for put, message in zip(stored, written["messages"], strict=True):
        row = rows[put["wroteOffset"]]
        assert message_fields(row) == put["message"], put["wroteOffset"]
        assert (row["total_size"], row["msg_id"], row["store_timestamp"]) == (
            put["wroteBytes"], put["msgId"], put["storeTimestamp"]
        )  # fmt: skip
        assert row["topic"] == message.topic and row["body"] == message.body
        if message.transaction in ("NOT_TYPE", "COMMIT"):
            assert row["queue_offset"] == put["logicsOffset"]

    reput(spark, settings)
    lake = Lake.from_settings(settings, read_only=True)
    columns = ["topic", "queue_id", "queue_offset", "commitlog_offset", "size", "tags_code", "cq_file"]
    ours = sorted(lake.read_arrow("consumequeue", columns=columns).to_pylist(), key=lambda u: tuple(u.values()))
    theirs = sorted(broker_consume_queues(store), key=lambda u: tuple(u.values()))
    assert len(theirs) > 10 * data.UNITS and len({u["cq_file"] for u in theirs}) > 3
    assert ours == theirs

    files = [decode_index_file(store / "index" / name) for name in sorted(os.listdir(store / "index"))]
    headers = sorted(lake.read_arrow("indexfile_header").to_pylist(), key=lambda h: h["index_file"])
    assert len(files) == len(headers) >= 3
    assert any(f["header"]["index_count"] == data.ENTRIES for f in files)  # full files rolled over
    entries = lake.read_arrow("indexfile", columns=["index_file", "index_no", "key_hash", "slot", "phy_offset",
                                                    "time_diff", "prev_index"]).to_pylist()  # fmt: skip
    for broker_file, header in zip(files, headers, strict=True):
        # index file names are the broker's wall clock at creation; rmqlake names a file after its first
        # message's store time: files are paired in order, every other field is compared
        assert broker_file["header"] == {k: v for k, v in header.items() if k != "index_file"}
        mine = sorted((e for e in entries if e["index_file"] == header["index_file"]), key=lambda e: e["index_no"])
        assert [{k: e[k] for k in ("index_no", "key_hash", "phy_offset", "time_diff", "prev_index")} for e in mine] == (
            broker_file["entries"]
        )
        slots = [0] * data.SLOTS
        for e in mine:
            slots[e["slot"]] = max(slots[e["slot"]], e["index_no"])
        assert slots == broker_file["slots"]


def test_the_same_messages_as_a_producer_log_give_byte_identical_files(spark, written):
    store, root = written["store"], written["root"]
    stamps = [put["storeTimestamp"] for put in written["answer"]["stored"]]
    log = data.write_producer_log(root / "in" / "producer.jsonl", written["messages"], store_timestamps=stamps)
    settings = lake_settings(root / "ingested")
    ingested = ingest(spark, settings, input_path=str(log))
    assert ingested["rejected"] == 0 and ingested["end_offset"] == written["answer"]["maxPhyOffset"], ingested
    reput(spark, settings)
    out = Path(export_store(spark, settings, out=str(root / "export"))["out"])

    def listing(base: Path, part: str) -> list[str]:
        return sorted(str(p.relative_to(base / part)) for p in (base / part).rglob("*") if p.is_file())

    for part in ("commitlog", "consumequeue"):
        names = listing(store, part)
        assert listing(out, part) == names and len(names) > 5, part
        for name in names:
            assert (out / part / name).read_bytes() == (store / part / name).read_bytes(), f"{part}/{name}"
    # Index files: the bytes are identical; only the names differ. The broker names a file after its
    # wall clock when it creates it (UtilAll.timeMillisToHumanString(System.currentTimeMillis())), which
    # no rebuild can know; rmqlake names it after the store time of its first indexed message.
    ours, theirs = listing(out, "index"), listing(store, "index")
    assert len(ours) == len(theirs) >= 3
    for mine, broker in zip(ours, theirs, strict=True):
        assert (out / "index" / mine).read_bytes() == (store / "index" / broker).read_bytes(), (mine, broker)


def test_a_broker_store_whose_first_segments_were_deleted_goes_round_and_back(spark, written):
    """Import of a store whose first two segments the broker deleted, reput, export: RocketMQ loads it and agrees.

    Its queues start in the middle of CQ files, so the export's first CQ file of a queue begins with
    the broker's pre-blank units.
    """
    root = written["root"]
    cut = root / "cut"
    shutil.copytree(written["store"] / "commitlog", cut / "commitlog")
    for name in sorted(os.listdir(cut / "commitlog"))[:2]:
        os.remove(cut / "commitlog" / name)
    settings = lake_settings(root / "cut-lake")
    assert import_store(spark, settings, store_dir=str(cut))["corrupt_records"] == 0
    reput(spark, settings)
    store = Path(export_store(spark, settings, out=str(root / "cut-export"))["out"])
    asked = lookups(settings, commitlog_rows(settings))
    answer = read_store(store, store_request(store, **asked["request"]))
    assert answer["minPhyOffset"] == 2 * data.SEGMENT
    assert any(q["minOffset"] % data.UNITS for q in answer["queues"])  # a queue starting inside a CQ file
    assert_store_answers_equal_the_lake(answer, settings, asked)
