"""How far a store's scheduled messages are delivered, read from its records alone (driver side, Spark).

A schedule record (on ``SCHEDULE_TOPIC_XXXX`` or the timer topic) is delivered when the store holds
its delivery: a record on the schedule record's ``REAL_TOPIC``/``REAL_QID`` carrying those same two
properties (a broker keeps them on the delivery) and the same ``UNIQ_KEY``. Several schedule records
of one key and queue pair with as many deliveries, the earliest due first. What this gives is what
``import-store`` (a broker's store) and ``export-store`` (a lake without a schedule state) need: the
lake's :class:`ScheduleState` and the broker's per-level delay offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import Window
from pyspark.sql import functions as F

from rmqlake.formats.consumequeue import SCHEDULE_TOPIC
from rmqlake.formats.properties import DELAY
from rmqlake.formats.schedule import REAL_QID, REAL_TOPIC, TIMER_OUT_MS, TIMER_TOPIC, ScheduleRules
from rmqlake.lake.state import PendingGroup, PendingKey, QueueId, ScheduleState
from rmqlake.transforms.columns import dispatchable

UNKNOWN_LEVEL_DELAY_MS = 1000  # ScheduleMessageService.computeDeliverTimestamp for a level it has no delay for


@dataclass(frozen=True)
class ScheduleProgress:
    """What the records say about the store's scheduled messages.

    Attributes:
        state: the lake state that makes the next ingest deliver exactly the undelivered ones (see
            :func:`schedule_progress` for the one case where it cannot).
        delivered: schedule records with their delivery in the store.
        undelivered: schedule records without one.
        redelivered: delivered records due after an undelivered one: no single clock separates them,
            so they count as pending and the next ingest delivers them again.
        unreadable: schedule records no broker can deliver (no ``REAL_TOPIC``/``REAL_QID``, a
            ``TIMER_OUT_MS`` that is not a number): neither delivered nor pending.
        timer_queue_offset: the timer queue's offset a broker must take records into its wheel from:
            its first pending record's, else its head; ``None`` without a timer queue.
        timer_redelivered: timer records not pending at or after that offset: a broker started
            there delivers them once more (its wheel takes the queue in order, from one offset).
    """

    state: ScheduleState
    delivered: int
    undelivered: int
    redelivered: int
    unreadable: int
    timer_queue_offset: int | None = None
    timer_redelivered: int = 0


def _origins(records, rules: ScheduleRules):
    """Schedule records: level (0: the timer wheel), real topic and queue, due time (null: never delivered).

    The due time is ``formats.schedule.due_ms`` as Spark expressions.
    """
    props = F.col("properties")
    delays = F.create_map(*(F.lit(x) for level, ms in sorted(rules.delay_levels.items()) for x in (level, ms)))
    level = props[DELAY].try_cast("int")
    capped = F.least(level, F.lit(rules.max_delay_level))
    delay_due = F.when(level > 0, F.col("store_timestamp") + F.coalesce(delays[capped], F.lit(UNKNOWN_LEVEL_DELAY_MS)))
    timer_due = props[TIMER_OUT_MS].try_cast("bigint") + F.lit(rules.timer_precision_ms)
    on_schedule = F.col("topic") == SCHEDULE_TOPIC
    return records.where(F.col("topic").isin(SCHEDULE_TOPIC, TIMER_TOPIC) & dispatchable()).select(
        "physical_offset",
        "queue_offset",
        "uniq_key",
        F.when(on_schedule, F.col("queue_id") + 1).otherwise(F.lit(0)).alias("level"),
        props[REAL_TOPIC].alias("real_topic"),
        props[REAL_QID].try_cast("int").alias("real_qid"),
        F.when(on_schedule, delay_due).otherwise(timer_due).alias("due"),
    )


def _deliveries(records):
    """Per (UNIQ_KEY, topic, queue): how many records there are a broker's deliveries."""
    props = F.col("properties")
    delivered = (
        ~F.col("topic").isin(SCHEDULE_TOPIC, TIMER_TOPIC)
        & (props[REAL_TOPIC] == F.col("topic"))
        & (props[REAL_QID].try_cast("int") == F.col("queue_id"))
    )
    return (
        records.where(delivered)
        .groupBy(F.col("uniq_key").alias("d_key"), F.col("topic").alias("d_topic"), F.col("queue_id").alias("d_qid"))
        .agg(F.count(F.lit(1)).alias("deliveries"))
    )


def schedule_progress(
    records, *, rules: ScheduleRules, clock: int | None, queue_heads: Mapping[QueueId, int]
) -> ScheduleProgress:
    """The schedule state of a store whose records are ``records`` (commitlog rows, a DataFrame).

    ``clock``: the store's last store time (the broker's clock when it last wrote): the delivered
    clock when the records allow it. The state's ``delivered_until`` is a time every delivered
    record is due at or before and every undelivered one after, the clock if it is such a time,
    else the nearest one. When a delivered record is due after an undelivered one (a broker
    delivers each level and the timer wheel on its own thread, so a stop can leave an earlier due
    undelivered) it is the last ms before the earliest undelivered due: nothing undelivered is lost,
    and the delivered records due after it are delivered once more (``redelivered``), the
    at-least-once a broker gives too after an unclean stop. ``delay_offsets``: per level with a
    ``SCHEDULE_TOPIC_XXXX`` queue, the queue offset of its first pending record, else the head.
    Two small aggregates reach the driver, never a row.
    """
    origins = _origins(records, rules)
    readable = F.col("due").isNotNull() & F.col("real_topic").isNotNull() & F.col("real_qid").isNotNull()
    pairing = Window.partitionBy("uniq_key", "real_topic", "real_qid").orderBy("due", "physical_offset")
    deliveries = _deliveries(records)
    linked = (
        origins.where(readable)
        .withColumn("rank", F.row_number().over(pairing))
        .join(
            deliveries,
            F.col("uniq_key").eqNullSafe(F.col("d_key"))
            & (F.col("real_topic") == F.col("d_topic"))
            & (F.col("real_qid") == F.col("d_qid")),
            "left",
        )
        .select(
            "physical_offset",
            "queue_offset",
            "level",
            "real_topic",
            "due",
            (F.col("rank") <= F.coalesce("deliveries", F.lit(0))).alias("delivered"),
        )
        .persist()
    )
    try:
        totals = linked.agg(
            F.count(F.when(F.col("delivered"), 1)).alias("delivered"),
            F.count(F.when(~F.col("delivered"), 1)).alias("undelivered"),
            F.max(F.when(F.col("delivered"), F.col("due"))).alias("last_delivered_due"),
            F.min(F.when(~F.col("delivered"), F.col("due"))).alias("first_undelivered_due"),
        ).first()
        unreadable = origins.where(~readable).count()
        until = _delivered_until(clock, totals["last_delivered_due"], totals["first_undelivered_due"])
        pending_now = F.col("due") > until if until is not None else F.lit(True)
        pending_rows = (
            linked.where(pending_now)
            .groupBy("level", "real_topic")
            .agg(
                F.count(F.lit(1)).alias("count"),
                F.min("due").alias("next_due"),
                F.min("physical_offset").alias("first_offset"),
                F.min("queue_offset").alias("first_queue_offset"),
                F.count(F.when(F.col("delivered"), 1)).alias("redelivered"),
            )
            .collect()
        )  # one row per (level, real topic)
        timer_head = queue_heads.get(QueueId(TIMER_TOPIC, 0))
        timer_offset = min((r["first_queue_offset"] for r in pending_rows if r["level"] == 0), default=timer_head)
        timer_redelivered = 0
        if timer_offset is not None and timer_offset != timer_head:
            timer_redelivered = linked.where(
                (F.col("level") == 0) & ~pending_now & (F.col("queue_offset") >= timer_offset)
            ).count()
    finally:
        linked.unpersist()
    pending = {PendingKey(r["level"], r["real_topic"]): PendingGroup(r["count"], r["next_due"]) for r in pending_rows}
    first_pending: dict[int, int] = {}
    for row in pending_rows:
        if row["level"] > 0:
            first_pending[row["level"]] = min(first_pending.get(row["level"], row["first_queue_offset"]),
                                              row["first_queue_offset"])  # fmt: skip
    offsets = {
        queue.queue_id + 1: first_pending.get(queue.queue_id + 1, head)
        for queue, head in queue_heads.items()
        if queue.topic == SCHEDULE_TOPIC
    }
    state = ScheduleState(
        delivered_until=until,
        pending_from=min((r["first_offset"] for r in pending_rows), default=None),
        pending=pending,
        delay_offsets=offsets,
    )
    return ScheduleProgress(
        state=state,
        delivered=totals["delivered"],
        undelivered=totals["undelivered"],
        redelivered=sum(r["redelivered"] for r in pending_rows),
        unreadable=unreadable,
        timer_queue_offset=timer_offset,
        timer_redelivered=timer_redelivered,
    )


def _delivered_until(clock: int | None, last_delivered_due: int | None, first_undelivered_due: int | None):
    """The clock moved into [last delivered due, first undelivered due - 1]; that upper end when it is empty."""
    until = clock
    if last_delivered_due is not None:
        until = last_delivered_due if until is None else max(until, last_delivered_due)
    if first_undelivered_due is not None and (until is None or until >= first_undelivered_due):
        until = first_undelivered_due - 1
    return until
