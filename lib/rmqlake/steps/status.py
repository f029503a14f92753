"""``rmqlake status``: what the store holds, from the ledger and table metadata (no Spark).

The one data read is the open transactions' aggregate (DuckDB over the half and op topics' records), and
only on a lake that ever stored a half message.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from rmqlake.config import Settings
from rmqlake.formats.transaction import HALF_TOPIC, OFFSET_SEPARATOR, OP_TOPIC, REAL_TOPIC
from rmqlake.lake import Lake
from rmqlake.lake.state import CommitlogState, ExpireState, ReputState, RunRecord, ScheduleState
from rmqlake.timeutil import iso


def status(settings: Settings, *, lake: Lake | None = None) -> dict:
    """Store state, as ``{"store": {...}, "topics": [...], "queues": [...], "runs": [...], "pending": [...],
    "transactions": [...]}``.

    ``pending``: the delay-level and timer deliveries not yet due, one row per
    (level or timer, real topic) with their count and the first one's due
    time; ``store`` has their total and the clock they were delivered up to.
    ``transactions``: the open transactions per real topic
    (:func:`open_transactions`); ``store`` has their total and the oldest.

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
    transactions = open_transactions(lake) if HALF_TOPIC in commitlog.topics else []
    oldest = min(transactions, key=lambda row: (row["oldest_store_timestamp"], row["topic"]), default=None)
    store.update(
        open_transactions=sum(row["open"] for row in transactions),
        oldest_open_transaction=oldest["oldest_store_time"] if oldest else None,
        oldest_open_transaction_uniq_key=oldest["oldest_uniq_key"] if oldest else None,
    )
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
        "transactions": transactions,
    }


# The halves no op entry names, per real topic. An op record's body is "<half queue offset>," per ended
# half, and it goes to the op topic's queue of the half's queue id; parts that are not integers are
# skipped, as the broker's check service skips them (formats.transaction.op_offsets).
_OPEN_TRANSACTIONS = f"""
    WITH halves AS (
        SELECT queue_id, queue_offset, store_timestamp, uniq_key, physical_offset,
               properties['{REAL_TOPIC}'] AS real_topic
        FROM commitlog WHERE topic = '{HALF_TOPIC}' AND physical_offset < $below
    ),
    entries AS (
        SELECT queue_id, unnest(string_split(try(decode(body)), '{OFFSET_SEPARATOR}')) AS entry
        FROM commitlog WHERE topic = '{OP_TOPIC}'
    ),
    ended AS (
        SELECT DISTINCT queue_id, CAST(entry AS BIGINT) AS queue_offset
        FROM entries WHERE regexp_full_match(entry, '[+-]?[0-9]+')
    )
    SELECT coalesce(real_topic, '') AS topic, count(*) AS open,
           min(store_timestamp) AS oldest_store_timestamp,
           arg_min(uniq_key, (store_timestamp, physical_offset)) AS oldest_uniq_key,
           min(physical_offset) AS first_physical_offset
    FROM halves ANTI JOIN ended USING (queue_id, queue_offset)
    GROUP BY ALL ORDER BY topic
"""


def open_transactions(lake: Lake, *, below: int = 2**63 - 1) -> list[dict]:
    """The open transactions, one row per real topic: ``topic`` (the halves' ``REAL_TOPIC``; empty when a
    half names none), ``open`` (how many), ``oldest_store_time`` (ISO-8601 UTC) and
    ``oldest_store_timestamp`` (epoch ms) and ``oldest_uniq_key`` of the oldest, ``first_physical_offset``.

    A half message (a record on the half topic) is open while no op entry names its queue offset: a
    commit and a rollback both write one. DuckDB aggregates the records of the two topics where they
    lie (column choices and the topic filter pushed down to the Parquet files); only the aggregate rows
    come back. Halves in expired segments are gone, as on a broker: they are not listed. ``below``: only
    the halves stored below that physical offset (what an expiry up to it deletes).
    """
    import duckdb

    if not lake.exists("commitlog"):
        return []
    connection = duckdb.connect()
    try:
        connection.register("commitlog", lake.engine.dataset("commitlog"))
        cursor = connection.execute(_OPEN_TRANSACTIONS, {"below": below})
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
    finally:
        connection.close()
    for row in rows:
        row["oldest_store_time"] = iso(row["oldest_store_timestamp"])
    keys = ("topic", "open", "oldest_store_time", "oldest_uniq_key", "oldest_store_timestamp", "first_physical_offset")
    return [{key: row[key] for key in keys} for row in rows]


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
    "expire": (
        "segments_deleted",
        "cq_files_deleted",
        "index_files_deleted",
        "unconsumed_messages_deleted",
        "open_transactions_deleted",
    ),
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
