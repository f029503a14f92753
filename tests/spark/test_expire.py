"""Expiry on a real lake: the cascade against the reference rules, disk pressure, data loss, offsets, lag, vacuum."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from rmqlake.errors import CheckFailedError, ConfigError, RefusedError
from rmqlake.formats import retention as R
from rmqlake.formats.consumequeue import CQ_UNIT_SIZE
from rmqlake.formats.indexfile import index_file_size
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table
from rmqlake.lake.state import QueueId
from rmqlake.query import query_offset, store_times
from rmqlake.steps.expire import expire
from rmqlake.steps.ingest import ingest
from rmqlake.steps.offsets import lag, load_offsets
from rmqlake.steps.reput import reput
from rmqlake.steps.status import status
from rmqlake.steps.vacuum import vacuum
from rmqlake.timeutil import iso, parse_timestamp, to_datetime
from tests.conftest import make_settings
from tests.reference_expiry import ref_cq_cleanup, ref_index_cleanup, ref_min_offset

pytestmark = pytest.mark.spark

START = parse_timestamp("2026-11-17T00:00:00Z")
MINUTE = 60_000
SEGMENT, UNITS, SLOTS, ENTRIES = 8192, 8, 16, 60
SMALL = [
    f"store.commitlog_segment_size={SEGMENT}",
    f"store.cq_units_per_file={UNITS}",
    f"store.index_slots={SLOTS}",
    f"store.index_max_entries={ENTRIES}",
]


def write_days(path: Path, *, messages: int = 600, start: int = START, step: int = 10 * MINUTE) -> Path:
    """Traffic over ~100 h: three busy queues and one slow queue (its min offset must be corrected, not deleted)."""
    lines = []
    for i in range(messages):
        line = {"topic": "OrderEvents", "queueId": i % 3, "body": f"m{i:05d}" + "x" * 300, "keys": f"order-{i % 50}"}
        if i % 20 == 0:
            line = {**line, "topic": "Clickstream", "queueId": 0}
        lines.append({**line, "bornTimestamp": start + i * step})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def built_lake(spark, tmp_path: Path, *overrides: str):
    settings = make_settings(tmp_path / "lake", *SMALL, *overrides)
    ingest(spark, settings, input_path=str(write_days(tmp_path / "in" / "days.jsonl")))
    reput(spark, settings)
    return settings


def snapshot(spark, settings) -> dict:
    lake = Lake.from_settings(settings)
    return {
        "segments": sorted(lake.read_arrow("segments").to_pylist(), key=lambda s: s["start_offset"]),
        "units": [r.asDict() for r in read_table(spark, lake, "consumequeue").collect()],
        "headers": sorted(lake.read_arrow("indexfile_header").to_pylist(), key=lambda h: h["index_file"]),
        "live_offsets": {r["physical_offset"]: r["total_size"] for r in read_table(spark, lake, "commitlog").collect()},
        "files": {t: {f.path for f in lake.engine.active_files(t)} for t in ("commitlog", "consumequeue", "indexfile")},
        "versions": {t: lake.version(t) for t in ("commitlog", "consumequeue", "indexfile", "segments")},
    }


def last_written(segments: list[dict]) -> dict[str, int]:
    """When the broker last wrote each segment: a sealed one when the next one's first message arrived (it wrote
    the blank record), the active one at its last message."""
    return {
        s["segment"]: after["first_store_timestamp"] if after else s["last_store_timestamp"]
        for s, after in zip(segments, [*segments[1:], None], strict=True)
    }


def queues_of(units: list[dict]) -> dict:
    queues = defaultdict(list)
    for u in sorted(units, key=lambda u: u["queue_offset"]):
        queues[(u["topic"], u["queue_id"])].append(u)
    return queues


def expected_after(before: dict, new_min: int) -> tuple[dict, dict, list[str]]:
    """Reference cascade: kept units per queue, min offset per queue, kept index files."""
    kept_units, min_offsets = {}, {}
    for queue, units in queues_of(before["units"]).items():
        by_file = defaultdict(list)
        for u in units:
            by_file[u["cq_file"]].append(u)
        files = [(name, [u["commitlog_offset"] for u in by_file[name]]) for name in sorted(by_file)]
        kept = [u for name in ref_cq_cleanup(files, new_min) for u in by_file[name]]
        kept_units[queue] = kept
        min_offsets[queue] = ref_min_offset([(u["queue_offset"], u["commitlog_offset"]) for u in kept], new_min)
    index = ref_index_cleanup([(h["index_file"], h["end_phy_offset"]) for h in before["headers"]], new_min)
    return kept_units, min_offsets, index


def test_expiry_cascade_equals_the_broker_rules(spark, tmp_path):
    settings = built_lake(spark, tmp_path)
    before = snapshot(spark, settings)
    segments = before["segments"]
    assert len(segments) > 20
    # 04:00 four days after the start: segments last written before 04:00 + 72 h ago are expired
    now = parse_timestamp("2026-11-22T04:00:00Z")
    cutoff = now - 72 * 60 * MINUTE
    written = last_written(segments)
    expired = [s for s in segments[:-1] if written[s["segment"]] <= cutoff]
    assert 10 < len(expired) < len(segments) - 1

    # an hour earlier, outside the deletion hour, disk fine: nothing goes, but every expired segment kept
    # says why in its row (only `segments` moves); the same explanations a minute later commit nothing
    early = now - 60 * MINUTE
    quiet = expire(spark, settings, now=to_datetime(early))
    assert quiet["status"] == "nothing_to_delete" and not quiet["trigger"]["deletes"]
    overdue = [s["segment"] for s in segments if written[s["segment"]] <= early - 72 * 60 * MINUTE]
    assert overdue and [r["segment"] for r in quiet["segments_retained"]] == overdue
    assert {r["reason"] for r in quiet["segments_retained"]} == {R.KEPT_NOT_TRIGGERED}
    explained = snapshot(spark, settings)
    assert {t for t, v in explained["versions"].items() if v != before["versions"][t]} == {"segments"}
    assert {s["segment"]: s["retained_reason"] for s in explained["segments"] if s["retained_reason"]} == {
        name: R.KEPT_NOT_TRIGGERED for name in overdue
    }
    later = expire(spark, settings, now=to_datetime(early + MINUTE))
    if [r["segment"] for r in later["segments_retained"]] == overdue:
        assert snapshot(spark, settings)["versions"] == explained["versions"]
    plan = expire(spark, settings, now=to_datetime(now), dry_run=True)
    assert plan["status"] == "dry_run" and [s["segment"] for s in plan["segments"]] == [
        s["segment"] for s in expired[:10]
    ]
    assert all(p["reason"] == "expired" and p["messages"] > 0 for p in plan["segments"])
    assert sum(t["messages"] for t in plan["segments"][0]["topics"].values()) == plan["segments"][0]["messages"]
    assert snapshot(spark, settings)["versions"] == explained["versions"]  # a dry run changes nothing

    result = expire(spark, settings, now=to_datetime(now))
    assert result["segments_deleted"] == 10  # retention.max_segments_per_run
    new_min = segments[10]["start_offset"]
    assert result["min_physical_offset"] == new_min
    after = snapshot(spark, settings)
    deleted = [s for s in after["segments"] if s["status"] == "deleted"]
    assert [s["segment"] for s in deleted] == [s["segment"] for s in segments[:10]]
    assert {s["deleted_reason"] for s in deleted} == {"expired"}
    assert {s["deleted_at"].timestamp() * 1000 for s in deleted} == {now}
    assert all(s["retained_reason"] is None for s in deleted)
    capped = {s["segment"]: s for s in after["segments"] if s["retained_reason"]}
    assert sorted(capped) == [s["segment"] for s in expired[10:]]  # the rest of the backlog says why it waits
    assert {(s["retained_reason"], s["retained_at"].timestamp() * 1000) for s in capped.values()} == {
        (R.KEPT_BATCH_CAP, now)
    }
    assert min(after["live_offsets"]) == new_min

    kept_units, min_offsets, index = expected_after(before, new_min)
    got = queues_of(after["units"])
    for queue, units in kept_units.items():
        assert got.get(queue, []) == units, queue  # whole CQ files go; kept files keep their dead units
    corrected = Lake.from_settings(settings).state().queue_min_offsets
    for queue, expected_min in min_offsets.items():
        assert corrected.get(QueueId(*queue), got[queue][0]["queue_offset"]) == expected_min
        for unit in got[queue]:
            if unit["queue_offset"] >= expected_min:  # every visible unit points to a live message of its size
                assert after["live_offsets"].get(unit["commitlog_offset"]) == unit["size"]
    assert any(m > kept_units[q][0]["queue_offset"] for q, m in min_offsets.items())  # dead units hidden by the min
    assert [h["index_file"] for h in after["headers"]] == index and len(index) < len(before["headers"])
    for table, paths in after["files"].items():  # deletion removes whole files; nothing is rewritten
        assert paths <= before["files"][table], table
    lake = Lake.from_settings(settings, read_only=True)
    slow_min = min_offsets[("Clickstream", 0)]
    page = query_offset(
        lake,
        topic="Clickstream",
        queue=0,
        offset=0,
        segment_size=SEGMENT,
        min_offsets=corrected,
    )
    assert page["status"] == "OFFSET_TOO_SMALL" and page["next_begin_offset"] == slow_min

    again = expire(spark, settings, now=to_datetime(now))  # the same run again: nothing changes
    assert again["status"] == "already_applied" and snapshot(spark, settings)["versions"] == after["versions"]
    drained = expire(spark, settings, now=to_datetime(now + MINUTE))  # the backlog drains, then stops
    assert drained["segments_deleted"] == len(expired) - 10
    final = expire(spark, settings, now=to_datetime(now + 2 * MINUTE))
    assert final["status"] == "nothing_to_delete"
    live = [s for s in snapshot(spark, settings)["segments"] if s["status"] != "deleted"]
    assert written[live[0]["segment"]] > cutoff and live[-1]["status"] == "active"


def test_a_rerun_is_a_new_check_when_a_setting_or_the_data_changed_and_the_run_record_counts_kept_segments(
    spark, tmp_path
):
    settings = built_lake(spark, tmp_path)
    segments = snapshot(spark, settings)["segments"]
    now = parse_timestamp("2026-11-22T04:00:00Z")
    written = last_written(segments)
    expired = [s["segment"] for s in segments[:-1] if written[s["segment"]] <= now - 72 * 60 * MINUTE]
    first = expire(spark, settings, now=to_datetime(now))
    assert first["segments_deleted"] == 10 and len(first["segments_retained"]) == len(expired) - 10 > 0
    assert first["index_files_deleted"] > 0  # the index headers are rewritten in this run too
    record = Lake.from_settings(settings).state().runs["expire"].metrics
    assert record["segments_retained"] == len(expired) - 10  # segments kept, not index files kept
    assert record["segments_deleted"] == 10

    versions = snapshot(spark, settings)["versions"]
    assert expire(spark, settings, now=to_datetime(now))["status"] == "already_applied"
    # the same --now with a smaller disk: above the warning ratio, so files go at once
    used = first["disk"]["used_bytes"] - first["disk"]["freed_bytes"]
    pressed = make_settings(tmp_path / "lake", *SMALL, f"retention.disk_capacity_bytes={int(used / 0.95)}")
    second = expire(spark, pressed, now=to_datetime(now))
    assert second["status"] == "deleted" and second["segments_deleted"] == 10 and second["disk"]["disk_full"]
    assert snapshot(spark, settings)["versions"] != versions
    assert expire(spark, pressed, now=to_datetime(now))["status"] == "already_applied"
    # new data, the same --now and settings: a new check (the disk-full flag set above is overridden to write)
    more = make_settings(tmp_path / "lake", *SMALL, "ingest.write_when_disk_full=true")
    ingest(spark, more, input_path=str(write_days(tmp_path / "in2" / "more.jsonl", messages=40, start=now)))
    third = expire(spark, pressed, now=to_datetime(now))
    assert third["status"] == "nothing_to_delete" and not third["disk"]["disk_full"]  # checked again: flag cleared
    assert Lake.from_settings(settings).state().expire.disk_full is False


def test_disk_pressure_forces_deletion_sets_disk_full_and_ingest_refuses(spark, tmp_path):
    settings = built_lake(spark, tmp_path)
    before = snapshot(spark, settings)
    live = len(before["segments"])
    cq_files = len({(u["topic"], u["queue_id"], u["cq_file"]) for u in before["units"]})
    used = live * SEGMENT + cq_files * UNITS * CQ_UNIT_SIZE + len(before["headers"]) * index_file_size(SLOTS, ENTRIES)
    # just above the warning ratio, at an hour that is not a deletion hour, before anything expired
    capacity = int(used / 0.9001)
    pressed = make_settings(tmp_path / "lake", *SMALL, f"retention.disk_capacity_bytes={capacity}")
    now = to_datetime(START + 71 * 60 * MINUTE)
    result = expire(spark, pressed, now=now)
    assert result["disk"]["used_bytes"] == used and result["disk"]["disk_full"]
    assert result["segments_deleted"] == 10 and {s["reason"] for s in result["segments"]} == {"forced"}
    assert status(pressed)["store"]["disk_full"] is True
    more = write_days(tmp_path / "in2" / "more.jsonl", messages=5, start=START + 200 * 60 * MINUTE)
    with pytest.raises(RefusedError, match="disk-full flag is set"):
        ingest(spark, pressed, input_path=str(more))
    forced = make_settings(tmp_path / "lake", *SMALL, "ingest.write_when_disk_full=true")
    assert ingest(spark, forced, input_path=str(more))["rows_out"] == 5
    # usage back at or below the clean-forcibly ratio clears the flag (at the next run)
    relaxed = expire(spark, settings, now=to_datetime(START + 72 * 60 * MINUTE))
    assert not relaxed["disk"]["disk_full"] and status(settings)["store"]["disk_full"] is False


def test_data_loss_is_reported_and_can_refuse(spark, tmp_path):
    settings = built_lake(spark, tmp_path)
    offsets = tmp_path / "offsets" / "consumerOffset-20261121T060000Z.json"
    offsets.parent.mkdir()
    # the broker's fastjson: integer keys unquoted, plus other fields
    offsets.write_text(
        '{"offsetTable":{"OrderEvents@billing":{0:0,1:0,2:190},"Clickstream@audit":{0:1}},'
        '"dataVersion":{"counter":7,"timestamp":1763704800000}}'
    )
    loaded = load_offsets(settings, input_path=str(offsets.parent))
    assert loaded["rows"] == 4 and load_offsets(settings, input_path=str(offsets))["status"] == "already_loaded"
    now = to_datetime(parse_timestamp("2026-11-22T04:00:00Z"))
    strict = make_settings(tmp_path / "lake", *SMALL, "retention.refuse_on_data_loss=true")
    versions = snapshot(spark, settings)["versions"]
    with pytest.raises(CheckFailedError, match="billing on OrderEvents"):
        expire(spark, strict, now=now)
    assert snapshot(spark, settings)["versions"] == versions
    result = expire(spark, settings, now=now)
    loss = {(r["group"], r["topic"]): r["messages"] for r in result["data_loss"]}
    state = Lake.from_settings(settings).state().queue_min_offsets
    expected_billing = sum(
        max(0, state.get(QueueId("OrderEvents", q), 0) - consumer) for q, consumer in ((0, 0), (1, 0), (2, 190))
    )
    assert loss[("billing", "OrderEvents")] == expected_billing > 0
    assert loss[("audit", "Clickstream")] == state[QueueId("Clickstream", 0)] - 1
    report = lag(settings, group="billing")
    rows = {r["queue_id"]: r for r in report["latest"]}
    assert rows[0]["expired_unconsumed"] == state[QueueId("OrderEvents", 0)] and rows[0]["lag"] == rows[0]["max_offset"]
    # in time: nothing consumed (no LastTime); the oldest unconsumed message still stored is at the queue's min offset
    first_kept = store_times(Lake.from_settings(settings), {("OrderEvents", 0): [rows[0]["min_offset"]]})
    assert rows[0]["last_time"] is None
    assert rows[0]["next_time"] == iso(first_kept[("OrderEvents", 0, rows[0]["min_offset"])])
    assert [h["as_of"] for h in report["history"]] == ["2026-11-21T06:00:00.000Z"]


def test_vacuum_removes_expired_files_only_when_retention_allows(spark, tmp_path):
    settings = built_lake(spark, tmp_path)
    expire(spark, settings, now=to_datetime(parse_timestamp("2026-11-22T04:00:00Z")))
    lake_root = tmp_path / "lake"
    deleted = [
        s["segment"]
        for s in Lake.from_settings(settings).read_arrow("segments").to_pylist()
        if s["status"] == "deleted"
    ]
    assert (lake_root / "commitlog" / f"segment={deleted[0]}").exists()  # removed from the log, still on disk
    kept = vacuum(settings)  # default 168 h: too recent to go
    assert kept["files_total"] == 0
    with pytest.raises(ConfigError, match="vacuum_below_delta_retention"):
        make_settings(lake_root, *SMALL, "lake.vacuum_retention_hours=0")
    now_settings = make_settings(
        lake_root, *SMALL, "lake.vacuum_retention_hours=0", "lake.vacuum_below_delta_retention=true"
    )
    assert vacuum(now_settings, dry_run=True)["files"]["commitlog"] > 0
    done = vacuum(now_settings)
    assert done["files"]["commitlog"] > 0 and done["files"]["consumequeue"] > 0
    assert not list((lake_root / "commitlog" / f"segment={deleted[0]}").glob("*.parquet"))
    assert read_table(spark, Lake.from_settings(settings), "commitlog").count() > 0
