"""Delay-level and timer deliveries: the records a broker appends when a re-routed message comes due.

An origin is a record on ``SCHEDULE_TOPIC_XXXX`` or the timer topic with ``REAL_TOPIC`` and ``REAL_QID``
(``formats.schedule.due_ms`` says when it is due). Its delivery is the record
``formats.schedule.delivery`` describes, stored at the due time on the real topic and queue; it enters the
run's append like any message: a scratch row (the record's fields) and a narrow row (``kind`` 1) that sorts
it after the messages stored at its due time.

Origins come from two places: the run's own lines (found by ``Origins`` in each parse task), and the lake, for
origins of earlier runs that come due now (``ingest.tasks.earlier_deliveries``, a task per slice of the
commitlog). ``schedule_after`` turns what a run delivered and left pending into the lake's ``ScheduleState``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.msgid import offset_msg_id_prefix
from rmqlake.formats.properties import serialize_properties
from rmqlake.formats.record import BORNHOST_V6_FLAG, STOREHOST_V6_FLAG, magic_for_topic, record_size
from rmqlake.formats.schedule import (
    DELAY,
    REAL_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    ScheduleRules,
    delivery,
    due_ms,
    java_long,
)
from rmqlake.ingest.message import MESSAGE_TYPES
from rmqlake.ingest.scratch import SCRATCH_COLUMNS, appended_narrow_rows
from rmqlake.lake.state import PendingGroup, PendingKey, ScheduleState

SCHEDULED_TOPICS = (SCHEDULE_TOPIC, TIMER_TOPIC)
# An origin of an earlier run sorts before the run's own origins among deliveries due together.
EARLIER_RUN_TIMESTAMP = -(1 << 63)
EARLIER_RUN_RANK = -1


class Origins:
    """The origins among some records (scratch columns), with what their deliveries need."""

    def __init__(self, records: pa.Table, *, rules: ScheduleRules):
        self.rows: list[int] = []
        self.due: list[int] = []
        self.level: list[int] = []
        on_topics = pc.is_in(records.column("topic"), pa.array(SCHEDULED_TOPICS))
        candidates = np.flatnonzero(pc.fill_null(on_topics, False).to_numpy(zero_copy_only=False))
        if not len(candidates):
            return
        picked = records.take(pa.array(candidates))
        topics = picked.column("topic").to_pylist()
        properties = picked.column("properties").to_pylist()
        stored = picked.column("store_timestamp").to_pylist()
        for row, topic, pairs, stamp in zip(candidates.tolist(), topics, properties, stored, strict=True):
            named = dict(pairs)
            due = due_ms(topic, named, stamp, rules)
            if due is None:
                continue
            self.rows.append(row)
            self.due.append(due)
            self.level.append(
                min(java_long(named[DELAY], bits=32), rules.max_delay_level) if topic == SCHEDULE_TOPIC else 0
            )


def delivery_records(origins: pa.Table, due: Iterable[int], *, rules: ScheduleRules) -> pa.Table:
    """The delivery record (scratch columns) of each origin record, stored at its ``due`` time.

    ``queue_id`` is null where the origin's REAL_QID is still a placeholder (``real_queue_round_robin``): the
    append resolves it.
    """
    out = {name: origins.column(name).to_pylist() for name in SCRATCH_COLUMNS}
    due = list(due)
    for row in range(origins.num_rows):
        routed = delivery(
            out["topic"][row],
            out["properties"][row],
            store_timestamp=out["store_timestamp"][row],
            due_ms=due[row],
            rules=rules,
        )
        serialised = serialize_properties(routed.properties)
        flag = out["sys_flag"][row]
        magic = magic_for_topic(routed.topic)
        out["total_size"][row] = record_size(
            body_length=len(out["body"][row]),
            topic_length=len(routed.topic.encode("utf-8")),
            properties_length=len(serialised),
            born_v6=bool(flag & BORNHOST_V6_FLAG),
            store_v6=bool(flag & STOREHOST_V6_FLAG),
            magic=magic,
        )
        out["topic"][row] = routed.topic
        out["queue_id"][row] = None if out["real_queue_round_robin"][row] else routed.queue_id
        out["magic"][row] = magic
        out["store_timestamp"][row] = due[row]
        out["properties"][row] = routed.properties
        out["properties_bytes"][row] = serialised
    return pa.table({name: pa.array(out[name], origins.schema.field(name).type) for name in SCRATCH_COLUMNS})


def narrow_rows(
    deliveries: pa.Table,
    *,
    split: int,
    first_batch: int,
    file_rank: int,
    origin_timestamps: Iterable[int],
    levels: Iterable[int],
) -> pa.RecordBatch:
    """The narrow rows (``kind`` 1) of delivery records written to ``split``'s scratch file from ``first_batch``."""
    count = deliveries.num_rows
    origin_timestamps = pa.array(list(origin_timestamps), pa.int64())
    return appended_narrow_rows(
        deliveries,
        split=split,
        file_rank=file_rank,
        first_batch=first_batch,
        kinds=pa.array(np.ones(count, np.int8)),
        origin_timestamps=origin_timestamps,
        levels=pa.array(list(levels), pa.int32()),
        parents=None if file_rank == EARLIER_RUN_RANK else (
            origin_timestamps, pa.array(np.full(count, file_rank, np.int32)),
            deliveries.column("source_line").combine_chunks(),
        ),
    )  # fmt: skip


def scratch_rows_of_commitlog(rows: pa.Table) -> pa.Table:
    """Commitlog rows as scratch rows: ``source_line`` is the physical offset (the origins' order), the store
    host's offsetMsgId prefix is worked out again, and REAL_QID is the record's own."""
    prefixes = {host: offset_msg_id_prefix(parse_host(host)) for host in set(rows.column("store_host").to_pylist())}
    computed = {
        "source_line": rows.column("physical_offset"),
        "store_host_prefix": pa.array([prefixes[h] for h in rows.column("store_host").to_pylist()], pa.string()),
        "real_queue_round_robin": pa.array(np.zeros(rows.num_rows, bool)),
    }
    types = {"source_line": pa.int64(), **MESSAGE_TYPES}
    return pa.table(
        {
            name: (computed[name] if name in computed else rows.column(name)).cast(types[name])
            for name in SCRATCH_COLUMNS
        }
    )


def pending_rows(topics: list[str], levels: list[int], due: list[int], offsets: list[int | None]) -> Iterator[dict]:
    """Group deliveries not yet due per (level, real topic): count, first due time, lowest origin offset (``None``
    for origins of this run, whose offsets are not known yet)."""
    groups: dict[tuple[int, str], dict] = {}
    for topic, level, when, offset in zip(topics, levels, due, offsets, strict=True):
        group = groups.get((level, topic))
        if group is None:
            groups[(level, topic)] = {"level": level, "topic": topic, "count": 1, "next_due": when,
                                      "min_offset": offset}  # fmt: skip
            continue
        group["count"] += 1
        group["next_due"] = min(group["next_due"], when)
        if offset is not None:
            group["min_offset"] = offset if group["min_offset"] is None else min(group["min_offset"], offset)
    yield from groups.values()


def real_topics(records: pa.Table) -> list[str]:
    """The REAL_TOPIC of each record."""
    return [dict(pairs)[REAL_TOPIC] for pairs in records.column("properties").to_pylist()]


def pending_as_rows(schedule: ScheduleState) -> list[dict]:
    """The state's pending groups as the rows a scan of the origins gives (nothing of them is due yet)."""
    return [
        {"level": key.level, "topic": key.topic, "count": group.count, "next_due": group.next_due,
         "min_offset": schedule.pending_from, "min_queue_offset": schedule.delay_offsets.get(key.level)}
        for key, group in schedule.pending.items()
    ]  # fmt: skip


def schedule_after(
    before: ScheduleState | None,
    *,
    clock: int | None,
    earlier_pending: list[dict],
    this_run_pending: list,
    pending_delays: list[dict],
    start_offset: int,
    queue_heads,
    rules,
) -> ScheduleState | None:
    """The schedule state after the run: its clock, what is pending and where each delay level's next delivery is.

    A lake that never held a delay-level or timer record keeps no section.
    """
    on_schedule = {queue: head for (topic, queue), head in queue_heads.items() if topic == SCHEDULE_TOPIC}
    if before is None and not on_schedule and not any(topic == TIMER_TOPIC for topic, _ in queue_heads):
        return None
    pending: dict[PendingKey, PendingGroup] = {}

    def add(key: PendingKey, count: int, due: int) -> None:
        known = pending.get(key)
        pending[key] = (
            PendingGroup(count, due) if known is None else PendingGroup(known.count + count, min(known.next_due, due))
        )

    offsets = [row["min_offset"] for row in earlier_pending if row["min_offset"] is not None]
    for row in earlier_pending:
        add(PendingKey(row["level"], row["topic"]), row["count"], row["next_due"])
    dues = {}  # the earliest due of each group over the partitions that counted it
    for row in this_run_pending:
        if row.kind == "pending_due":
            dues[(row.topic, row.queue_id)] = min(dues.get((row.topic, row.queue_id), row.value), row.value)
    for row in this_run_pending:
        if row.kind == "pending":
            add(PendingKey(row.queue_id, row.topic), row.value, dues[(row.topic, row.queue_id)])
    if this_run_pending:
        offsets.append(start_offset)  # this run's origins are all at or after where it started
    next_delivery: dict[int, int] = {}
    for row in [*earlier_pending, *pending_delays]:
        offset = row.get("min_queue_offset", row.get("queue_offset"))
        if row["level"] > 0 and offset is not None:
            next_delivery[row["level"]] = min(next_delivery.get(row["level"], offset), offset)
    delay_offsets = {}
    for level in rules.delay_levels:
        if level in next_delivery:
            delay_offsets[level] = next_delivery[level]
        elif level - 1 in on_schedule:
            delay_offsets[level] = on_schedule[level - 1]
    return ScheduleState(
        delivered_until=clock,
        pending_from=min(offsets) if pending else None,
        pending=pending,
        delay_offsets=delay_offsets,
    )
