"""``rmqlake status``: what the store holds, from the ledger and table metadata (no Spark, no data scans)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from rmqlake.config import Settings
from rmqlake.lake import Lake
from rmqlake.lake.state import CommitlogState, ExpireState, ReputState, RunRecord, ScheduleState
from rmqlake.timeutil import iso


def status(settings: Settings, *, lake: Lake | None = None) -> dict:
    """Store state, as ``{"store": {...}, "topics": [...], "queues": [...], "runs": [...], "pending": [...]}``.

    ``pending``: the delay-level and timer deliveries not yet due, one row per
    (level or timer, real topic) with their count and the first one's due
    time; ``store`` has their total and the clock they were delivered up to.

    Per-queue offsets come from the consumequeue files' statistics (min and
    max queue offset per file), so nothing is scanned. ``lake``: a lake
    already open (a reader's pinned one); default: the latest versions.
    """
    lake = lake if lake is not None else Lake.from_settings(settings)
    ledger = lake.ledger()
    commitlog = ledger.state.commitlog or CommitlogState()
    reput = ledger.state.reput or ReputState()
    expire = ledger.state.expire or ExpireState()
    schedule = ledger.state.schedule or ScheduleState()
    segments = lake.read_arrow("segments").to_pylist()
    live = [s for s in segments if s["status"] != "deleted"]
    max_offset = commitlog.next_offset
    dispatched = reput.dispatched_offset
    store = {
        "lake": lake.root,
        "ledger_seq": ledger.seq,
        "last_run": f"{ledger.job} {ledger.run_id}" if ledger.job else None,
        "pending_tables": lake.pending_tables(),
        "foreign_commits": {  # commits rmqlake did not make (another writer's DELETE, UPDATE, ...)
            table: [f"v{c['version']} {c['operation']} {iso(c['timestamp'])}" for c in commits]
            for table, commits in lake.foreign_commits().items()
        },
        "min_physical_offset": min((s["start_offset"] for s in live), default=0),
        "max_physical_offset": max_offset,
        "dispatched_offset": dispatched,
        "dispatch_lag_bytes": max_offset - dispatched,
        "segments_live": len(live),
        "segments_deleted": len(segments) - len(live),
        "active_segment": next((s["segment"] for s in live if s["status"] == "active"), None),
        "checkpoint_physic": iso(commitlog.physic_msg_timestamp),
        "checkpoint_logics": iso(reput.logics_msg_timestamp),
        "checkpoint_index": iso(reput.index_msg_timestamp),
        "index_files": len(lake.read_arrow("indexfile_header", columns=["index_file"])),
        "disk_full": expire.disk_full,
        "disk_usage_percent": round(expire.disk_usage * 100, 4) if expire.disk_usage is not None else None,
        "last_expire_now": iso(expire.last_now),
        "delivered_until": iso(schedule.delivered_until),
        "pending_deliveries": schedule.pending_count,
        "next_delivery": iso(min((group.next_due for group in schedule.pending.values()), default=None)),
    }
    positions = ledger.state.compaction.positions if ledger.state.compaction else {}
    topics = [
        {
            "topic": topic,
            "messages": totals.messages,
            "bytes": totals.bytes,
            "cleanup_policy": settings.topics[topic].cleanup_policy if topic in settings.topics else "DELETE",
            "compacted_up_to": positions.get(topic),
        }
        for topic, totals in sorted(commitlog.topics.items())
    ]
    return {
        "store": store,
        "topics": topics,
        "queues": _queues(lake, commitlog, expire),
        "runs": _last_runs(ledger.state.runs),
        "pending": pending_deliveries(schedule),
    }


def pending_deliveries(schedule: ScheduleState) -> list[dict]:
    """One row per group of pending deliveries: ``schedule`` (``delay`` or ``timer``), ``level`` (the delay
    level; null for the timer wheel), ``topic`` (the real topic), ``count``, ``next_due`` (ISO-8601 UTC).
    Delay levels in order, then the timer wheel."""
    rows = []
    for key, group in sorted(schedule.pending.items(), key=lambda item: (item[0].level == 0, item[0])):
        timer = key.level == 0
        rows.append(
            {
                "schedule": "timer" if timer else "delay",
                "level": None if timer else key.level,
                "topic": key.topic,
                "count": group.count,
                "next_due": iso(group.next_due),
            }
        )
    return rows


RUN_SUMMARY_KEYS = {
    "ingest": ("rows_in", "rows_out", "rejected", "commitlog_bytes", "seconds"),
    "expire": ("segments_deleted", "cq_files_deleted", "index_files_deleted", "unconsumed_messages_deleted"),
    "compact": (
        "topics",
        "messages_read",
        "keys",
        "messages_kept",
        "tombstones_applied",
        "bytes_before",
        "bytes_after",
        "ratio",
        "seconds",
    ),
}


def _last_runs(runs: Mapping[str, RunRecord]) -> list[dict]:
    """The latest run of each job that records one, with its headline metrics."""
    rows = []
    for job, record in sorted(runs.items()):
        keys = RUN_SUMMARY_KEYS.get(job, ())
        summary = {k: record.metrics.get(k) for k in keys}
        rows.append({"job": job, "seq": record.seq, "at": record.at, **summary})
    return rows


def _queues(lake, commitlog: CommitlogState, expire: ExpireState) -> list[dict]:
    bounds: dict[tuple[str, int], list[int]] = defaultdict(lambda: [2**63 - 1, -1])
    for stats in lake.file_stats("consumequeue", ["queue_offset"]):
        key = (stats["partition"]["topic"], int(stats["partition"]["queue_id"]))
        low, high = stats["min"]["queue_offset"], stats["max"]["queue_offset"]
        if low is not None:
            bounds[key][0] = min(bounds[key][0], low)
            bounds[key][1] = max(bounds[key][1], high)
    corrected = expire.queue_min_offsets
    rows = []
    heads = commitlog.queue_heads
    for key in sorted(set(heads) | set(bounds)):
        topic, queue = key
        low, high = bounds.get(key, [None, None])
        max_offset = high + 1 if high is not None and high >= 0 else 0
        rows.append(
            {
                "topic": topic,
                "queue_id": queue,
                "min_offset": corrected.get(key, low if low is not None and high >= 0 else 0),
                "max_offset": max_offset,
                "written_offset": heads.get(key, 0),
            }
        )
    return rows
