"""export-store and import-store: the files a broker keeps, checked by an independent reader (tests/store_reader.py),
time travel, a byte-identical round trip, corrupt records, and the store after expiry."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rmqlake.cli import main
from rmqlake.formats.indexfile import index_file_size
from rmqlake.formats.store import Checkpoint
from rmqlake.generate import TopicPlan, generate
from rmqlake.query import query_key
from rmqlake.steps.expire import expire
from rmqlake.steps.ingest import ingest, open_lake
from rmqlake.steps.offsets import load_offsets
from rmqlake.steps.reput import reput
from rmqlake.steps.store import export_store, import_store
from tests import store_reader
from tests.conftest import CONF, make_settings

pytestmark = pytest.mark.spark
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]
SEGMENT, UNITS, SLOTS, ENTRIES = 16384, 16, 512, 200
SMALL = [
    f"store.commitlog_segment_size={SEGMENT}",
    f"store.cq_units_per_file={UNITS}",
    f"store.index_slots={SLOTS}",
    f"store.index_max_entries={ENTRIES}",
]
STORE_COLUMNS = [
    "segment", "physical_offset", "total_size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "sys_flag",
    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times", "prepared_transaction_offset",
    "body", "topic", "properties", "keys", "tags", "uniq_key", "msg_id", "properties_bytes",
]  # fmt: skip
SEGMENT_COLUMNS = ["segment", "start_offset", "end_offset", "size_bytes", "message_count", "padding_bytes", "status"]
SEGMENT_COLUMNS += ["first_store_timestamp", "last_store_timestamp"]


def checksums(store: Path, *parts: str) -> dict[str, str]:
    return {
        str(path.relative_to(store)): hashlib.sha256(path.read_bytes()).hexdigest()
        for part in parts
        for path in sorted((store / part).rglob("*") if (store / part).is_dir() else [store / part])
        if path.is_file()
    }


def rows(settings, table: str, columns: list[str]) -> list[dict]:
    data = open_lake(settings).read_arrow(table, columns=columns).to_pylist()
    for row in data:
        if isinstance(row.get("properties"), list):
            row["properties"] = sorted(row["properties"])
    return sorted(data, key=lambda r: tuple(r[c] for c in columns[:2]))


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """Two generated hours ingested and dispatched one by one, with consumer offsets, then exported."""
    root = tmp_path_factory.mktemp("store")
    generate(root / "in", messages=700, topics=TOPICS, hours=2, seed=11)
    settings = make_settings(root / "lake", *SMALL)
    hours = sorted((root / "in" / "landing").glob("dt=*/hour=*"))
    retry = {  # a V2 record: a %RETRY% topic longer than 127 bytes, from an IPv6 producer
        "topic": "%RETRY%cg_" + "settlement_reconciliation_" * 5,
        "body": "retried",
        "keys": "order-retry-1",
        "bornTimestamp": 1795219200000 + 1_800_000,
        "bornHost": "[2001:db8::7]:50200",
        "reconsumeTimes": 2,
    }
    (hours[0] / "retry.jsonl").write_text(json.dumps(retry) + "\n")
    first = ingest(spark, settings, input_path=str(hours[0]))
    reput(spark, settings)
    first_seq = open_lake(settings).ledger().seq
    ingest(spark, settings, input_path=str(hours[1]))
    reput(spark, settings)
    load_offsets(settings, input_path=str(root / "in" / "offsets"))
    exported = export_store(spark, settings, out=str(root / "a"))
    return {"root": root, "settings": settings, "first": first, "first_seq": first_seq, "export": exported}


def test_the_exported_store_is_what_the_spec_reader_expects(built):
    settings, store = built["settings"], Path(built["export"]["out"])
    commitlog = rows(settings, "commitlog", ["physical_offset", "total_size", "topic", "queue_id", "queue_offset"])
    walk = store_reader.walk_commitlog(store, SEGMENT)
    assert [(o, r["size"], r["topic"], r["queue_id"], r["queue_offset"]) for o, r in sorted(walk.records.items())] == [
        tuple(r.values()) for r in commitlog
    ]
    assert any(r["topic"].startswith("%RETRY%") and len(r["topic"]) > 127 for r in walk.records.values())  # V2
    assert len(walk.blanks) == len(walk.ends) - 1 >= 3  # every sealed segment ends with its blank record
    assert {p.name for p in store.iterdir()} == {"commitlog", "consumequeue", "index", "checkpoint", "config"}

    units = store_reader.check_consume_queues(store, walk, units_per_file=UNITS, min_offsets={})
    assert units == len(open_lake(settings).read_arrow("consumequeue", columns=["queue_offset"]))
    files = store_reader.index_files(store)
    assert len(files) >= 2 and all(f.stat().st_size == index_file_size(SLOTS, ENTRIES) for f in files)
    entries = sum(store_reader.check_index_file(f, walk, slots=SLOTS, min_offset=0) for f in files)
    assert entries == len(open_lake(settings).read_arrow("indexfile", columns=["index_no"]))

    state = open_lake(settings).state()
    checkpoint = Checkpoint.decode((store / "checkpoint").read_bytes())
    assert (store / "checkpoint").stat().st_size == 4096
    assert checkpoint.physic_msg_timestamp == state["commitlog"]["physic_msg_timestamp"]
    assert checkpoint.logics_msg_timestamp == state["reput"]["logics_msg_timestamp"]
    assert state["commitlog"]["next_offset"] == max(o + r["size"] for o, r in walk.records.items())
    assert checkpoint.confirm_phy_offset == max(walk.records)  # recovery's lastValidMsgPhyOffset: the last start
    assert checkpoint.master_flushed_offset == 0
    topics = json.loads((store / "config" / "topics.json").read_text())["topicConfigTable"]
    assert topics["OrderEvents"]["writeQueueNums"] == 8
    assert topics["UserProfile"]["attributes"] == {"cleanup.policy": "COMPACTION"}
    offsets = json.loads((store / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert set(offsets) == {f"{t.name}@{g}" for t in TOPICS for g in ("cg_billing", "cg_audit")}

    lake = open_lake(settings, read_only=True)
    keyed = [r for r in walk.records.values() if r["properties"].get("KEYS") and r["topic"] == "OrderEvents"]
    for record in keyed[:: max(1, len(keyed) // 5)][:5]:  # a key query done on the index file bytes
        key = record["properties"]["KEYS"].split(" ")[0]
        found = store_reader.query_key(store, "OrderEvents", key, slots=SLOTS)
        expected = [o for o in found if key in walk.records[o]["properties"].get("KEYS", "").split(" ")]
        answer = query_key(lake, topic="OrderEvents", key=key, slots=SLOTS, segment_size=SEGMENT)
        assert sorted(expected) == sorted(r["physical_offset"] for r in answer["rows"]) and expected


def test_time_travel_exports_the_store_as_it_was_after_a_run(spark, built):
    root, settings = built["root"], built["settings"]
    then = export_store(spark, settings, out=str(root / "then"), as_of=str(built["first_seq"]))
    walk = store_reader.walk_commitlog(root / "then", SEGMENT)
    assert then["as_of_seq"] == built["first_seq"] and len(walk.records) == built["first"]["rows_out"]
    assert max(o + r["size"] for o, r in walk.records.items()) == built["first"]["end_offset"]
    now_walk = store_reader.walk_commitlog(Path(built["export"]["out"]), SEGMENT)
    active_then = max(walk.ends)
    assert active_then not in walk.blanks and active_then in now_walk.blanks  # sealed later
    assert all(now_walk.records[o] == r for o, r in walk.records.items())  # the same bytes, as far as they go

    lake = open_lake(settings, read_only=True)
    lake.travel_to(seq=built["first_seq"])
    stamp = lake.ledger().committed_at.isoformat()
    again = export_store(spark, settings, out=str(root / "then-by-time"), as_of=stamp)
    assert again["as_of_seq"] == built["first_seq"]
    assert checksums(root / "then", "commitlog", "consumequeue", "index") == checksums(
        root / "then-by-time", "commitlog", "consumequeue", "index"
    )
    with pytest.raises(Exception, match="no run 999"):
        export_store(spark, settings, out=str(root / "never"), as_of="999")
    assert not (root / "never").exists()


def test_import_of_an_export_gives_back_the_tables_and_the_same_files(spark, built, capsys):
    root, settings, store = built["root"], built["settings"], Path(built["export"]["out"])
    copy = make_settings(root / "lake2", *SMALL)
    code = main(["import-store", str(store), "--conf", str(CONF), "--env", "test", "--lake", str(root / "lake2")]
                + [arg for pair in (("--set", s) for s in SMALL) for arg in pair])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert import_store(spark, copy, store_dir=str(store))["status"] == "already_imported"
    assert rows(copy, "commitlog", STORE_COLUMNS) == rows(settings, "commitlog", STORE_COLUMNS)
    assert rows(copy, "segments", SEGMENT_COLUMNS) == rows(settings, "segments", SEGMENT_COLUMNS)
    reput(spark, copy)  # the consume queues and index files, rebuilt from the imported commitlog
    again = export_store(spark, copy, out=str(root / "b"))
    parts = ("commitlog", "consumequeue", "index", "checkpoint")
    assert checksums(Path(again["out"]), *parts) == checksums(store, *parts)


def test_import_reports_corrupt_records_with_file_and_offset_and_goes_on(spark, built):
    root, store = built["root"], Path(built["export"]["out"])
    broken = root / "broken"
    shutil.copytree(store, broken)
    first = broken / "commitlog" / sorted((broken / "commitlog").iterdir())[0].name
    walk = store_reader.walk_commitlog(store, SEGMENT)
    victim = sorted(o for o in walk.records if o < SEGMENT)[1]
    data = bytearray(first.read_bytes())
    data[victim - int(first.name) + 8] ^= 0x01  # the stored BODYCRC: it no longer matches the body
    first.write_bytes(bytes(data))
    settings = make_settings(root / "lake3", *SMALL)
    result = import_store(spark, settings, store_dir=str(broken))
    assert result["corrupt_records"] >= 1 and result["messages"] <= len(walk.records) - 1
    (reject,) = [r for r in open_lake(settings).read_arrow("rejected").to_pylist() if str(victim) in r["reason"]]
    assert str(first) in reject["reason"] and f"offset {victim}" in reject["reason"]
    imported = {r["physical_offset"] for r in open_lake(settings).read_arrow("commitlog").to_pylist()}
    assert victim not in imported and imported >= {o for o in walk.records if o >= SEGMENT}  # the rest goes on


def test_after_expiry_the_export_is_what_the_broker_disk_holds(spark, built):
    root, settings = built["root"], built["settings"]
    result = expire(spark, make_settings(root / "lake", *SMALL, "retention.max_segments_per_run=25"),
                    now=datetime(2026, 11, 25, 4, tzinfo=UTC))  # fmt: skip
    assert result["segments_deleted"] == 25 and result["cq_files_deleted"] > 0
    exported = export_store(spark, settings, out=str(root / "c"))
    store = Path(exported["out"])
    walk = store_reader.walk_commitlog(store, SEGMENT)
    minimum = result["min_physical_offset"]
    assert min(walk.records) == minimum and sorted(p.name for p in (store / "commitlog").iterdir())[0] == (
        f"{minimum:020d}"
    )
    state = open_lake(settings).state()["expire"]
    min_offsets = {(k.split("\t")[0], int(k.split("\t")[1])): v for k, v in state["queue_min_offsets"].items()}
    store_reader.check_consume_queues(store, walk, units_per_file=UNITS, min_offsets=min_offsets)
    for index in store_reader.index_files(store):
        store_reader.check_index_file(index, walk, slots=SLOTS, min_offset=minimum)
    before = checksums(Path(built["export"]["out"]), "consumequeue")
    kept = checksums(store, "consumequeue")
    assert set(kept) < set(before) and all(before[f] == kept[f] for f in kept)  # whole CQ files kept or gone
