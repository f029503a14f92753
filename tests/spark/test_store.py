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
from rmqlake.errors import LakeStateError
from rmqlake.formats.indexfile import index_file_size
from rmqlake.formats.store import Checkpoint
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.query import query_key
from rmqlake.steps.expire import expire
from rmqlake.steps.ingest import ingest
from rmqlake.steps.offsets import load_offsets
from rmqlake.steps.reput import reput
from rmqlake.steps.store import _run_writers, _Writers, export_store, import_store
from tests import store_reader
from tests.conftest import CONF, make_settings
from tests.view_checks import assert_records_decode_to_their_stored_columns

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
    data = Lake.from_settings(settings).read_arrow(table, columns=columns).to_pylist()
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
    first_seq = Lake.from_settings(settings).ledger().seq
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
    assert units == len(Lake.from_settings(settings).read_arrow("consumequeue", columns=["queue_offset"]))
    files = store_reader.index_files(store)
    assert len(files) >= 2 and all(f.stat().st_size == index_file_size(SLOTS, ENTRIES) for f in files)
    entries = sum(store_reader.check_index_file(f, walk, slots=SLOTS, min_offset=0) for f in files)
    assert entries == len(Lake.from_settings(settings).read_arrow("indexfile", columns=["index_no"]))

    state = Lake.from_settings(settings).state()
    checkpoint = Checkpoint.decode((store / "checkpoint").read_bytes())
    assert (store / "checkpoint").stat().st_size == 4096
    assert checkpoint.physic_msg_timestamp == state.commitlog.physic_msg_timestamp
    assert checkpoint.logics_msg_timestamp == state.reput.logics_msg_timestamp
    assert state.next_offset == max(o + r["size"] for o, r in walk.records.items())
    assert checkpoint.confirm_phy_offset == max(walk.records)  # recovery's lastValidMsgPhyOffset: the last start
    assert checkpoint.master_flushed_offset == 0
    topics = json.loads((store / "config" / "topics.json").read_text())["topicConfigTable"]
    assert topics["OrderEvents"]["writeQueueNums"] == 8
    assert topics["UserProfile"]["attributes"] == {"cleanup.policy": "COMPACTION"}
    offsets = json.loads((store / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert set(offsets) == {f"{t.name}@{g}" for t in TOPICS for g in ("cg_billing", "cg_audit")}
    groups = json.loads((store / "config" / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]
    assert {g: (c["groupName"], c["consumeEnable"]) for g, c in groups.items()} == {
        "cg_billing": ("cg_billing", True),  # the groups the lake holds offsets of
        "cg_audit": ("cg_audit", True),
    }

    lake = Lake.from_settings(settings, read_only=True)
    keyed = [r for r in walk.records.values() if r["properties"].get("KEYS") and r["topic"] == "OrderEvents"]
    for record in keyed[:: max(1, len(keyed) // 5)][:5]:  # a key query done on the index file bytes
        key = record["properties"]["KEYS"].split(" ")[0]
        found = store_reader.query_key(store, "OrderEvents", key, slots=SLOTS)
        expected = [o for o in found if key in walk.records[o]["properties"].get("KEYS", "").split(" ")]
        answer = query_key(lake, topic="OrderEvents", key=key, slots=SLOTS, segment_size=SEGMENT)
        assert sorted(expected) == sorted(r["physical_offset"] for r in answer["rows"]) and expected


def test_the_file_writers_run_in_one_spark_job_and_give_each_kind_its_results_in_order(spark):
    kinds = [
        _Writers(dict, [{"segment": n} for n in range(3)], one_per_task=True),
        _Writers(dict, [], one_per_task=True),
        _Writers(dict, [{"cq_file": n} for n in range(30)]),
    ]
    context = spark.sparkContext
    context.setJobGroup("export-writers-test", "the export's writers")
    try:
        results = _run_writers(spark, kinds)
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            context.setLocalProperty(key, None)
    assert results == [kinds[0].tasks, [], kinds[2].tasks]
    assert len(context.statusTracker().getJobIdsForGroup("export-writers-test")) == 1


def test_exported_files_carry_the_time_the_broker_last_wrote_them(built):
    settings, store = built["settings"], Path(built["export"]["out"])
    segments = sorted(rows(settings, "segments", SEGMENT_COLUMNS), key=lambda s: s["start_offset"])

    def mtime_ms(path: Path) -> int:
        return path.stat().st_mtime_ns // 1_000_000

    for segment, after in zip(segments, [*segments[1:], None], strict=True):
        # a sealed segment: when the message opening the next one arrived; the active one: its last message
        expected = after["first_store_timestamp"] if after else segment["last_store_timestamp"]
        assert mtime_ms(store / "commitlog" / segment["segment"]) == expected, segment["segment"]
    assert segments[0]["last_store_timestamp"] <= segments[1]["first_store_timestamp"]
    units = Lake.from_settings(settings).read_arrow("consumequeue").to_pylist()
    last_unit: dict[tuple, dict] = {}
    for unit in units:
        key = (unit["topic"], unit["queue_id"], unit["cq_file"])
        if key not in last_unit or unit["queue_offset"] > last_unit[key]["queue_offset"]:
            last_unit[key] = unit
    for (topic, queue, name), unit in last_unit.items():
        assert mtime_ms(store / "consumequeue" / topic / str(queue) / name) == unit["store_timestamp"]
    for header in Lake.from_settings(settings).read_arrow("indexfile_header").to_pylist():
        assert mtime_ms(store / "index" / header["index_file"]) == header["end_timestamp"]


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

    lake = Lake.from_settings(settings, read_only=True)
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
    assert assert_records_decode_to_their_stored_columns(Lake.from_settings(copy)) > 0  # rows the import decoded
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
    (reject,) = [
        r for r in Lake.from_settings(settings).read_arrow("rejected").to_pylist() if str(victim) in r["reason"]
    ]
    assert str(first) in reject["reason"] and f"offset {victim}" in reject["reason"]
    imported = {r["physical_offset"] for r in Lake.from_settings(settings).read_arrow("commitlog").to_pylist()}
    assert victim not in imported and imported >= {o for o in walk.records if o >= SEGMENT}  # the rest goes on


def test_import_rejects_what_the_lake_could_not_write_back_and_loses_no_byte_range(spark, built):
    root, store = built["root"], Path(built["export"]["out"])
    hostile = root / "hostile"
    shutil.copytree(store, hostile)
    walk = store_reader.walk_commitlog(store, SEGMENT)
    last_segment = max(int(name) for name in walk.ends)
    plain = [o for o, r in sorted(walk.records.items()) if o < last_segment and r["topic"] == "OrderEvents"
             and not r["sys_flag"] & 0x30]  # fmt: skip
    topic_at, port_at, properties_at, zeroed_at = plain[1], plain[5], plain[9], plain[13]

    def damage(offset: int, at: int, replacement: bytes, expected: bytes | None = None) -> None:
        path = hostile / "commitlog" / f"{offset - offset % SEGMENT:020d}"
        data = bytearray(path.read_bytes())
        position = offset % SEGMENT + at
        assert expected is None or data[position : position + len(replacement)] == expected
        data[position : position + len(replacement)] = replacement
        path.write_bytes(bytes(data))

    topic = 88 + len(walk.records[topic_at]["body"]) + 1
    damage(topic_at, topic, b"../../../pw", b"OrderEvents")  # same length; the body CRC does not cover the topic
    damage(port_at, 52, (70000).to_bytes(4, "big"))  # the born host's port
    damage(properties_at, walk.records[properties_at]["size"] - 2, b"\xff")  # a properties byte: not UTF-8
    damage(zeroed_at, 0, bytes(4))  # a TOTALSIZE zeroed inside a sealed segment
    settings = make_settings(root / "lake4", *SMALL)
    result = import_store(spark, settings, store_dir=str(hostile))
    assert result["status"] == "imported" and result["corrupt_records"] == 4
    lake = Lake.from_settings(settings)
    rejected = sorted(lake.read_arrow("rejected").to_pylist(), key=lambda r: r["raw"])
    bad = sorted((topic_at, port_at, properties_at, zeroed_at))
    sizes = {o: walk.records[o]["size"] for o in bad}
    assert sorted(r["raw"] for r in rejected) == sorted(f"bytes {o}-{o + sizes[o]}" for o in bad)
    reasons = {int(r["raw"].split()[1].split("-")[0]): r["reason"] for r in rejected}
    folder = hostile / "commitlog"
    assert all(r.startswith(f"{folder / f'{o - o % SEGMENT:020d}'} at offset {o} ") for o, r in reasons.items())
    assert "topic '../../../pw' has characters outside" in reasons[topic_at]
    assert "born host port 70000 is outside 0..65535" in reasons[port_at]
    assert "properties are not valid UTF-8" in reasons[properties_at]
    assert "TOTALSIZE 0" in reasons[zeroed_at] and "the broker's recovery stops here" in reasons[zeroed_at]
    imported = {r["physical_offset"] for r in lake.read_arrow("commitlog", columns=["physical_offset"]).to_pylist()}
    assert imported == set(walk.records) - set(bad)  # every other record, those after the zeros included
    zeroed = zeroed_at - zeroed_at % SEGMENT
    (segment,) = [s for s in lake.read_arrow("segments").to_pylist() if s["start_offset"] == zeroed]
    damaged = sum(1 for o in bad if zeroed <= o < zeroed + SEGMENT)
    assert segment["message_count"] == sum(1 for o in walk.records if zeroed <= o < zeroed + SEGMENT) - damaged
    with pytest.raises(LakeStateError, match=r"segment \d{20} has a hole: import-store rejected \d byte range"):
        export_store(spark, settings, out=str(root / "hostile-out" / "x"))
    assert not (root / "hostile-out").exists() or not any((root / "hostile-out").rglob("*"))
    assert not (root / "pw").exists()


def test_the_jvm_decoder_and_the_python_reader_import_a_damaged_store_alike(spark, built):
    root, store = built["root"], Path(built["export"]["out"])
    damaged = root / "damaged"
    shutil.copytree(store, damaged)
    walk = store_reader.walk_commitlog(store, SEGMENT)
    offsets = sorted(walk.records)
    for victim, at, patch in ((offsets[3], 8, b"\x00\x00\x00\x01"), (offsets[40], 0, bytes(4))):  # CRC, TOTALSIZE
        path = damaged / "commitlog" / f"{victim - victim % SEGMENT:020d}"
        data = bytearray(path.read_bytes())
        data[victim % SEGMENT + at : victim % SEGMENT + at + 4] = patch
        path.write_bytes(bytes(data))
    lakes = {}
    for reader in ("jvm", "python"):
        settings = make_settings(root / f"lake-{reader}", *SMALL, f"import_store.reader={reader}")
        result = import_store(spark, settings, store_dir=str(damaged))
        assert result["corrupt_records"] == 2
        lakes[reader] = (settings, result)
    assert lakes["jvm"][1]["records_decoded_in_jvm"] > len(walk.records) // 2  # the JVM read the clean runs
    assert lakes["python"][1]["records_decoded_in_jvm"] == 0
    columns = [*STORE_COLUMNS, "source_file", "source_line"]
    assert rows(lakes["jvm"][0], "commitlog", columns) == rows(lakes["python"][0], "commitlog", columns)
    rejected = ["source_file", "source_line", "raw", "reason"]
    assert rows(lakes["jvm"][0], "rejected", rejected) == rows(lakes["python"][0], "rejected", rejected)
    assert rows(lakes["jvm"][0], "segments", SEGMENT_COLUMNS) == rows(lakes["python"][0], "segments", SEGMENT_COLUMNS)


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
    min_offsets = Lake.from_settings(settings).state().queue_min_offsets
    store_reader.check_consume_queues(store, walk, units_per_file=UNITS, min_offsets=min_offsets)
    for index in store_reader.index_files(store):
        store_reader.check_index_file(index, walk, slots=SLOTS, min_offset=minimum)
    before = checksums(Path(built["export"]["out"]), "consumequeue")
    kept = checksums(store, "consumequeue")
    assert set(kept) < set(before) and all(before[f] == kept[f] for f in kept)  # whole CQ files kept or gone
