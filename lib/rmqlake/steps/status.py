"""``rmqlake status``: what the store holds, read from the ledger and the small tables."""

from __future__ import annotations

from rmqlake.config import Settings
from rmqlake.steps.ingest import open_lake


def status(settings: Settings) -> dict:
    """Store state: write position, segments, queues, pending work. No Spark needed."""
    lake = open_lake(settings)
    ledger = lake.ledger()
    commitlog = ledger.state.get("commitlog", {})
    segments = lake.read_arrow("segments").to_pylist()
    live = [s for s in segments if s["status"] != "deleted"]
    heads = commitlog.get("queue_heads", {})
    return {
        "lake": lake.root,
        "ledger_seq": ledger.seq,
        "last_run": f"{ledger.job} {ledger.run_id}" if ledger.job else None,
        "pending_tables": lake.pending_tables(),
        "min_physical_offset": min((s["start_offset"] for s in live), default=0),
        "max_physical_offset": int(commitlog.get("next_offset", 0)),
        "segments_live": len(live),
        "segments_deleted": len(segments) - len(live),
        "active_segment": next((s["segment"] for s in live if s["status"] == "active"), None),
        "queues": sum(len(q) for q in heads.values()),
        "messages_in_queues": sum(n for q in heads.values() for n in q.values()),
    }
