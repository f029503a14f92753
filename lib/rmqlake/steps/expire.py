"""The expiry job: the broker's file-deletion rules as of ``now`` (rules in formats/retention.py).

Everything is decided from metadata — the ``segments`` rows, the Delta add
actions of ``consumequeue`` (partitioned by CQ file, so a data file never
spans two, whoever wrote it: reput, or a user's OPTIMIZE; its statistics
give the commitlog offset of the CQ file's last unit) and the index
headers — so the cost follows the number of files deleted, not the bytes
stored. Deletion removes whole partitions in one run: commitlog segments,
CQ files, index files; nothing is rewritten. The ledger commit makes the
whole cascade visible or none of it.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from rmqlake.config import Settings
from rmqlake.errors import CheckFailedError
from rmqlake.formats import retention as R
from rmqlake.formats.consumequeue import CQ_UNIT_SIZE
from rmqlake.formats.indexfile import index_file_size
from rmqlake.formats.transaction import HALF_TOPIC
from rmqlake.ingest.deliveries import schedule_after
from rmqlake.ingest.tasks import earlier_deliveries
from rmqlake.lake import Lake
from rmqlake.lake.actions import DataFile, parquet_stats
from rmqlake.lake.spark_io import read_table
from rmqlake.lake.state import ExpireState, LakeState, QueueId
from rmqlake.lake.tables import INDEXFILE_HEADER, SEGMENTS
from rmqlake.progress import Stages
from rmqlake.steps.runner import StepRun, run_step
from rmqlake.steps.status import open_transactions
from rmqlake.timeutil import iso

log = logging.getLogger(__name__)
EXPIRE_APP_ID = "rmqlake.expire.now"


@dataclass
class QueueFiles:
    """The CQ files of one queue, from the consumequeue table's add actions."""

    files: dict[str, list[DataFile]] = field(default_factory=dict)  # CQ file name -> its data files
    last_unit_offset: dict[str, int] = field(default_factory=dict)  # CQ file -> commitlog offset of its last unit
    first_unit_offset: dict[str, int] = field(default_factory=dict)  # CQ file -> commitlog offset of its first unit
    min_queue_offset: dict[str, int] = field(default_factory=dict)
    max_queue_offset: int = -1


def expire(spark, settings: Settings, *, now: datetime, dry_run: bool = False, manual: bool = False) -> dict:
    """Apply the broker's deletion rules as of ``now``.

    ``manual`` is the broker's ``executeDeleteFilesManually``: the next 20
    runs delete expired files whatever the hour. A run with the same ``now``,
    the same retention settings and the same store (no new messages or
    dispatch since) as the last applied run changes nothing (re-runs and
    retries of one scheduled run are idempotent); a changed setting or new
    data makes it a new check. A backlog over ``max_segments_per_run``
    drains over the following runs.

    Returns:
        Metrics and the plan: ``trigger``, ``disk``, ``segments`` (deleted or,
        with ``dry_run``, to delete: name, bytes, reason, messages per topic),
        ``segments_retained`` (expired segments kept, each with why; also
        recorded in their ``segments`` row), ``cq_files_deleted``, ``index_files_deleted``, ``min_physical_offset``,
        ``data_loss`` (unconsumed messages per group and topic), ``open_transactions_deleted``
        (half messages not yet committed or rolled back in the deleted segments), ``status``;
        and the stable ones (``rows_in`` and ``rows_out`` are 0: expiry
        removes whole files).
    """

    def work(step: StepRun) -> dict:
        return _expire(spark, settings, step, dry_run=dry_run, manual=manual)

    return run_step("expire", settings, work, now=now)


def _expire(spark, settings: Settings, step: StepRun, *, dry_run: bool, manual: bool) -> dict:
    lake, run, now, started = step.lake, step.run, step.now, step.started
    retention, store = settings.retention, settings.store
    now_ms = int(now.timestamp() * 1000)
    state = run.state.expire or ExpireState()
    check = _check_inputs(settings, run.state, now_ms=now_ms)
    applied = state.applied
    same = applied == check if applied is not None else state.last_now == now_ms  # lakes before "applied"
    if same and not manual and not dry_run:
        log.info(
            "expire as of %s with these retention settings on this store was already applied (ledger seq %s); "
            "nothing to do",
            iso(now_ms),
            run.base.seq,
        )
        return {"status": "already_applied", "now": iso(now_ms), "segments": [], "table_versions": {}}
    stages = Stages(log)
    segments = lake.read_arrow("segments").to_pylist()
    live = sorted((s for s in segments if s["status"] != "deleted"), key=lambda s: s["start_offset"])
    with stages("inventory") as note:
        queues = _queue_files(lake)
        headers = sorted(lake.read_arrow("indexfile_header").to_pylist(), key=lambda h: h["index_file"])
        cq_file_count = sum(len(q.files) for q in queues.values())
        note.update(segments=len(live), cq_files=cq_file_count, index_files=len(headers))
    used = R.disk_usage_bytes(
        live_segments=len(live),
        segment_size=store.commitlog_segment_size,
        cq_files=cq_file_count,
        cq_units_per_file=store.cq_units_per_file,
        index_files=len(headers),
        index_slots=store.index_slots,
        index_max_entries=store.index_max_entries,
        other_used_bytes=retention.disk_other_used_bytes,
    )
    disk = R.check_disk(
        used / retention.disk_capacity_bytes,
        was_full=state.disk_full,
        max_used_ratio=retention.disk_max_used_ratio,
        clean_forcibly=retention.disk_clean_forcibly_ratio,
        warning=retention.disk_warning_ratio,
    )
    manual_left = R.MAX_MANUAL_DELETE_RUNS if manual else state.manual_runs_left
    trigger = R.decide(
        now_ms=now_ms,
        delete_when=retention.delete_when,
        zone=settings.broker.timezone,
        disk=disk,
        manual_runs_left=manual_left,
        clean_forcibly_enable=retention.clean_file_forcibly_enable,
    )
    files = R.segment_files(live)
    doomed = R.segments_to_delete(
        files,
        trigger=trigger,
        now_ms=now_ms,
        reserved_hours=retention.file_reserved_hours,
        batch_max=retention.max_segments_per_run,
    )
    kept = R.retained_reasons(
        files,
        doomed,
        trigger=trigger,
        now_ms=now_ms,
        reserved_hours=retention.file_reserved_hours,
        batch_max=retention.max_segments_per_run,
    )
    old_min = live[0]["start_offset"] if live else 0
    new_min = live[len(doomed)]["start_offset"] if doomed else old_min
    with stages("cascade") as note:
        cq_doomed = _cq_cascade(queues, min_physical_offset=new_min) if doomed else {}
        index_doomed = (
            R.index_files_to_delete(
                [(h["index_file"], h["end_phy_offset"]) for h in headers], min_physical_offset=new_min
            )
            if doomed
            else []
        )
        min_offsets = dict(state.queue_min_offsets)
        corrected = _corrected_min_offsets(lake, queues, cq_doomed, new_min, store) if doomed else {}
        note.update(cq_files=sum(len(v) for v in cq_doomed.values()), index_files=len(index_doomed))
    plan_segments = _segment_plan(spark, lake, doomed, segment_size=store.commitlog_segment_size)
    loss = _data_loss(lake, queues, min_offsets, corrected)
    metrics = {
        "now": iso(now_ms),
        "dry_run": dry_run,
        "trigger": {
            "deletes": trigger.deletes,
            "time_up": trigger.time_up,
            "space_to_delete": disk.space_to_delete,
            "manual": trigger.manual,
            "manual_runs_left": trigger.manual_runs_left,
            "clean_at_once": trigger.clean_at_once,
        },
        "disk": {
            "used_bytes": used,
            "capacity_bytes": retention.disk_capacity_bytes,
            "usage": round(disk.usage, 6),
            "disk_full": disk.disk_full,
            "freed_bytes": len(doomed) * store.commitlog_segment_size
            + sum(len(v) for v in cq_doomed.values()) * store.cq_units_per_file * CQ_UNIT_SIZE
            + len(index_doomed) * _index_file_bytes(settings),
        },
        "segments": plan_segments,
        "segments_deleted": len(doomed),
        "segments_retained": [{"segment": name, "reason": reason} for name, reason in sorted(kept.items())],
        "cq_files_deleted": sum(len(v) for v in cq_doomed.values()),
        "index_files_deleted": len(index_doomed),
        "min_physical_offset_before": old_min,
        "min_physical_offset": new_min,
        "queues_corrected": len(corrected),
        "data_loss": loss,
        "unconsumed_messages_deleted": sum(row["messages"] for row in loss),
        "open_transactions_deleted": _open_halves_deleted(lake, run.state, new_min) if doomed else 0,
    }
    _log_plan(metrics)
    if loss and retention.refuse_on_data_loss and not dry_run:
        raise CheckFailedError(
            f"expire as of {iso(now_ms)} would delete {metrics['unconsumed_messages_deleted']} messages that "
            f"consumer groups have not consumed ({_loss_text(loss)}); retention.refuse_on_data_loss is true, "
            "so nothing was deleted"
        )
    if dry_run:
        return {**metrics, "status": "dry_run", "table_versions": {}, "seconds": _since(started)}

    reasons = {segment.segment: reason for segment, reason in doomed}
    rows = [_segment_row(s, now, deleted=reasons.get(s["segment"]), kept=kept.get(s["segment"])) for s in segments]
    explained = rows != segments  # a segment deleted, or an explanation of a kept one that changed
    unchanged = state.disk_full == disk.disk_full and trigger.manual_runs_left == state.manual_runs_left
    if not explained and unchanged:  # nothing to delete or explain and no flag moved: no commit at all
        return {**metrics, "status": "nothing_to_delete", "table_versions": {}, "seconds": _since(started)}
    if explained:
        run.stage_arrow("segments", pa.Table.from_pylist(rows, schema=SEGMENTS.arrow_schema), mode="overwrite")
    if doomed:
        run.remove("commitlog", _files_in(lake, "commitlog", "segment", set(reasons)))
        run.remove("consumequeue", [f for q, names in cq_doomed.items() for n in names for f in queues[q].files[n]])
    if index_doomed:
        run.remove("indexfile", _files_in(lake, "indexfile", "index_file", set(index_doomed)))
        kept_headers = [h for h in headers if h["index_file"] not in set(index_doomed)]
        run.stage_arrow(
            "indexfile_header",
            pa.Table.from_pylist(kept_headers, schema=INDEXFILE_HEADER.arrow_schema),
            mode="overwrite",
        )
    for table in run.ops:
        run.op(table, mode=run.ops[table].mode).app_transactions[EXPIRE_APP_ID] = now_ms
    min_offsets.update({QueueId(t, q): v for (t, q), v in corrected.items()})
    state = ExpireState(
        applied=check,
        last_now=now_ms,
        disk_full=disk.disk_full,
        disk_usage=round(disk.usage, 6),
        manual_runs_left=trigger.manual_runs_left,
        queue_min_offsets=min_offsets,
    )
    schedule = run.state.schedule
    if doomed and schedule is not None and schedule.pending_from is not None and schedule.pending_from < new_min:
        with stages("pending deliveries"):
            schedule, lost = _pending_after_expiry(spark, lake, settings, run.state, min_physical_offset=new_min)
        metrics["scheduled_deliveries_lost"] = lost
        if lost:
            log.warning(
                "%d delay-level or timer messages not yet due were in the deleted segments: a broker loses them "
                "too (their deliveries will never be appended)",
                lost,
            )
    summary = {k: v for k, v in metrics.items() if k not in ("segments", "data_loss", "segments_retained")}
    summary["segments_retained"] = len(kept)
    with stages("commit"):
        versions = step.commit(replace(run.state, expire=state, schedule=schedule), record=summary)
    return {
        **metrics,
        "status": "deleted" if doomed else "nothing_to_delete",
        "table_versions": versions,
        "seq": run.seq,
        "seconds": _since(started),
        "stage_seconds": stages.seconds,
    }


def _pending_after_expiry(spark, lake: Lake, settings: Settings, state: LakeState, *, min_physical_offset: int):
    """The schedule state once the segments below ``min_physical_offset`` are gone, and how many pending
    deliveries went with them (their origins are read again from what is left)."""
    schedule = state.schedule
    _, _, pending = earlier_deliveries(
        spark,
        lake,
        None,
        first_split=0,
        pending_from=min_physical_offset,
        delivered_until=schedule.delivered_until,
        clock=schedule.delivered_until,  # nothing comes due: the scan only counts what is still pending
        rules=settings.schedule_rules(),
        segment_size=settings.store.commitlog_segment_size,
    )
    after = schedule_after(
        None,
        clock=schedule.delivered_until,
        earlier_pending=pending,
        this_run_pending=[],
        pending_delays=[],
        start_offset=min_physical_offset,
        queue_heads=state.commitlog.queue_heads if state.commitlog else {},
        rules=settings.schedule_rules(),
    )
    after = after or replace(schedule, pending={}, pending_from=None)
    return after, schedule.pending_count - after.pending_count


def _check_inputs(settings: Settings, state: LakeState, *, now_ms: int) -> dict:
    """What an expire run's decisions depend on: ``now``, the retention settings, the sizes the disk usage is
    counted in, and the store (commitlog end and dispatch position: new data or new CQ and index files).

    An applied run records it; a run with the same inputs changes nothing. Plain JSON values, so the copy
    read back from the ledger compares equal.
    """
    store = settings.store
    return {
        "now": now_ms,
        "retention": settings.retention.model_dump(mode="json"),
        "timezone": settings.broker.timezone,
        "sizes": [store.commitlog_segment_size, store.cq_units_per_file, store.index_slots, store.index_max_entries],
        "next_offset": state.next_offset,
        "dispatched_offset": state.dispatched_offset,
    }


def _segment_row(row: dict, now: datetime, *, deleted: str | None, kept: str | None) -> dict:
    """A ``segments`` row after this run: deleted with its reason, or live with why it was kept past its reserved
    time (``retained_at``: when that explanation was first given; null while the segment is not expired)."""
    if deleted:
        return {**row, "status": "deleted", "deleted_at": now, "deleted_reason": deleted, "retained_reason": None}
    if row["status"] == "deleted" or row.get("retained_reason") == kept:
        return row
    return {**row, "retained_reason": kept, "retained_at": now if kept else None}


def _queue_files(lake: Lake) -> dict[tuple[str, int], QueueFiles]:
    """Per queue: its CQ files, their data files, and each CQ file's first/last unit from the statistics."""
    queues: dict[tuple[str, int], QueueFiles] = defaultdict(QueueFiles)
    for stats in lake.file_stats("consumequeue", ["commitlog_offset", "queue_offset"]):
        partition = {k: None if v is None else str(v) for k, v in stats["partition"].items()}  # the log's values
        name = partition.get("cq_file")
        if name is None:
            raise CheckFailedError(
                f"consumequeue data file {stats['path']} has no cq_file partition value: the table was written "
                "with another layout, so expiry cannot remove whole CQ files. Rebuild consumequeue with reput "
                "into a fresh lake."
            )
        queue = queues[(partition["topic"], int(partition["queue_id"]))]
        queue.files.setdefault(name, []).append(
            DataFile(path=stats["path"], size=stats.get("size") or 0, partition_values=partition)
        )
        low, high = _bounds(lake, stats)
        first, last = low["commitlog_offset"], high["commitlog_offset"]
        queue.last_unit_offset[name] = max(queue.last_unit_offset.get(name, last), last)
        queue.first_unit_offset[name] = min(queue.first_unit_offset.get(name, first), first)
        queue.min_queue_offset[name] = min(queue.min_queue_offset.get(name, low["queue_offset"]), low["queue_offset"])
        queue.max_queue_offset = max(queue.max_queue_offset, high["queue_offset"])
    return dict(queues)


def _bounds(lake: Lake, stats: dict) -> tuple[dict, dict]:
    """Min and max of ``commitlog_offset`` and ``queue_offset`` in a consumequeue data file: from the Delta log,
    or from the file's Parquet footer when the writer logged no statistics for them (another engine's OPTIMIZE
    may be configured so)."""
    columns = ("commitlog_offset", "queue_offset")
    if all(stats["min"].get(c) is not None and stats["max"].get(c) is not None for c in columns):
        return stats["min"], stats["max"]
    metadata = pq.read_metadata(lake.storage.file_path(f"consumequeue/{stats['path']}"), filesystem=lake.storage.fs)
    logged = json.loads(parquet_stats(metadata)[1])
    if not all(c in logged["minValues"] and c in logged["maxValues"] for c in columns):
        raise CheckFailedError(
            f"consumequeue data file {stats['path']} has no min/max statistics for {' and '.join(columns)}, neither "
            "in the Delta log nor in its Parquet footer, so expiry cannot tell which CQ units it holds; rewrite the "
            "table's files with a writer that records them (OPTIMIZE with Spark or delta-rs does) and run expire again"
        )
    return logged["minValues"], logged["maxValues"]


def _cq_cascade(queues: dict, *, min_physical_offset: int) -> dict[tuple[str, int], list[str]]:
    doomed = {}
    for key, queue in queues.items():
        names = R.cq_files_to_delete(
            [(name, queue.last_unit_offset[name]) for name in queue.files], min_physical_offset=min_physical_offset
        )
        if names:
            doomed[key] = names
    return doomed


def _corrected_min_offsets(
    lake: Lake, queues: dict, cq_doomed: dict, min_physical_offset: int, store
) -> dict[tuple[str, int], int]:
    """``correctMinOffset`` for every queue whose first kept unit points below the new minimum.

    Only the queue's first kept CQ file is read (statistics prune the rest):
    the cascade guarantees that a kept file other than the last ends above
    the minimum, so the first live unit is in it unless the queue is dead.
    """
    corrected = {}
    for key, queue in queues.items():
        kept = sorted(set(queue.files) - set(cq_doomed.get(key, [])))
        if not kept:
            continue
        first = kept[0]
        max_offset = queue.max_queue_offset + 1
        if queue.first_unit_offset[first] >= min_physical_offset:
            if key in cq_doomed:  # whole files went; the queue now starts at its first kept unit
                corrected[key] = queue.min_queue_offset[first]
            continue
        start = int(first) // CQ_UNIT_SIZE
        units = lake.scan(
            "consumequeue",
            columns=["queue_offset"],
            partitions=[("topic", "=", key[0]), ("queue_id", "=", key[1]), ("cq_file", "=", first)],
            filter=(ds.field("commitlog_offset") >= min_physical_offset)
            & (ds.field("queue_offset") >= start)
            & (ds.field("queue_offset") < start + store.cq_units_per_file),
        ).column("queue_offset")
        first_live = min(units.to_pylist()) if len(units) else None
        corrected[key] = R.corrected_min_offset(first_live, max_offset=max_offset)
    return corrected


def _segment_plan(spark, lake: Lake, doomed, *, segment_size: int) -> list[dict]:
    """The deleted segments with their reason, and messages and bytes per topic (one Spark aggregate)."""
    if not doomed:
        return []
    names = [segment.segment for segment, _ in doomed]
    commitlog = read_table(spark, lake, "commitlog", partition_filters=[("segment", "in", names)])
    per_topic = (
        commitlog.groupBy("segment", "topic")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("total_size").alias("bytes"))
        .collect()
    )  # segments x topics rows
    topics: dict[str, dict] = defaultdict(dict)
    for row in per_topic:
        topics[row["segment"]][row["topic"]] = {"messages": row["messages"], "bytes": row["bytes"]}
    return [
        {
            "segment": segment.segment,
            "start_offset": segment.start_offset,
            "last_write": iso(segment.last_modified),
            "reason": reason,
            "file_bytes": segment_size,
            "messages": sum(t["messages"] for t in topics[segment.segment].values()),
            "topics": topics[segment.segment],
        }
        for segment, reason in doomed
    ]


def _data_loss(lake: Lake, queues: dict, min_offsets: dict, corrected: dict) -> list[dict]:
    """Messages a known consumer group has not consumed that this run makes unreachable, per group and topic."""
    if not corrected or not lake.exists("consumer_offsets"):
        return []
    snapshot = _latest_offsets(lake)
    lost: dict[tuple[str, str], int] = defaultdict(int)
    for (group, topic, queue), offset in snapshot.items():
        if (topic, queue) not in corrected or (topic, queue) not in queues:
            continue
        before = min_offsets.get(QueueId(topic, queue))
        if before is None:
            before = min(queues[(topic, queue)].min_queue_offset.values())
        gone = corrected[(topic, queue)] - max(offset, before)
        if gone > 0:
            lost[(group, topic)] += gone
    return [{"group": g, "topic": t, "messages": n} for (g, t), n in sorted(lost.items())]


def _latest_offsets(lake: Lake) -> dict[tuple[str, str, int], int]:
    """The latest snapshot's offset of each (group, topic, queue)."""
    rows = lake.read_arrow("consumer_offsets", columns=["group", "topic", "queue_id", "offset", "as_of"]).to_pylist()
    latest: dict[tuple[str, str, int], tuple] = {}
    for row in rows:
        key = (row["group"], row["topic"], row["queue_id"])
        if key not in latest or row["as_of"] > latest[key][0]:
            latest[key] = (row["as_of"], row["offset"])
    return {key: offset for key, (_, offset) in latest.items()}


def _files_in(lake: Lake, table: str, column: str, values: set[str]) -> list[DataFile]:
    return [f for f in lake.engine.active_files(table) if f.partition_values.get(column) in values]


def _index_file_bytes(settings: Settings) -> int:
    return index_file_size(settings.store.index_slots, settings.store.index_max_entries)


def _loss_text(loss: list[dict]) -> str:
    return ", ".join(f"{row['group']} on {row['topic']}: {row['messages']}" for row in loss)


def _log_plan(metrics: dict) -> None:
    trigger, disk = metrics["trigger"], metrics["disk"]
    log.info(
        "expire as of %s: disk usage %.2f%% (%d of %d bytes)%s; deletion hour: %s, disk pressure: %s, manual: %s, "
        "forced: %s",
        metrics["now"],
        disk["usage"] * 100,
        disk["used_bytes"],
        disk["capacity_bytes"],
        " - DISK FULL: the broker rejects writes" if disk["disk_full"] else "",
        trigger["time_up"],
        trigger["space_to_delete"],
        trigger["manual"],
        trigger["clean_at_once"],
    )
    for segment in metrics["segments"]:
        log.info(
            "%s segment %s (last write %s, %d messages): %s",
            "would delete" if metrics["dry_run"] else "deleting",
            segment["segment"],
            segment["last_write"],
            segment["messages"],
            segment["reason"],
        )
    retained = defaultdict(list)
    for row in metrics["segments_retained"]:
        retained[row["reason"]].append(row["segment"])
    for reason, names in retained.items():
        log.info("kept %d expired segments (%s .. %s): %s", len(names), names[0], names[-1], reason)
    if metrics["data_loss"]:
        log.warning(
            "%d messages not yet consumed go with these files: %s",
            metrics["unconsumed_messages_deleted"],
            _loss_text(metrics["data_loss"]),
        )
    if metrics["open_transactions_deleted"]:
        log.warning(
            "%d open transactions (half messages with no commit or rollback) go with these files",
            metrics["open_transactions_deleted"],
        )
    log.info(
        "min physical offset %d -> %d; %d CQ files and %d index files go with the segments; %d queues corrected",
        metrics["min_physical_offset_before"],
        metrics["min_physical_offset"],
        metrics["cq_files_deleted"],
        metrics["index_files_deleted"],
        metrics["queues_corrected"],
    )


def _open_halves_deleted(lake: Lake, state: LakeState, new_min: int) -> int:
    """Open half messages in the segments deleted (below ``new_min``): as on a broker, they are gone with
    their files and no end can find them afterwards."""
    if state.commitlog is None or HALF_TOPIC not in state.commitlog.topics:
        return 0
    return sum(row["open"] for row in open_transactions(lake, below=new_min))


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)
