"""The compaction job: dispatched messages of COMPACTION topics → ``compaction_log``, ``compaction_cq``.

Each run merges the messages dispatched since the topic's compaction
position into the compacted rows of the queues they belong to, and
rewrites only those queues' partitions (their old files are removed in the
same Delta commit that adds the new ones). Positions are per topic, kept in
the ledger state and as the app transaction ``rmqlake.compact.position`` on
both tables, so a re-run compacts nothing twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime

from pyspark.sql import functions as F

from rmqlake.config import Settings
from rmqlake.errors import UsageError
from rmqlake.formats.segment import segment_file_name, segment_start
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table, stage_dataframe
from rmqlake.lake.state import CompactionState, LakeState
from rmqlake.lake.tables import COMMITLOG
from rmqlake.progress import Stages
from rmqlake.steps.runner import StepRun, run_step
from rmqlake.transforms import compaction as T

log = logging.getLogger(__name__)
POSITION_APP_ID = "rmqlake.compact.position"
COMPACTED_TABLES = ("compaction_log", "compaction_cq")


def compact(spark, settings: Settings, *, topic: str | None = None, now: datetime | None = None) -> dict:
    """Compact every COMPACTION topic (or only ``topic``) up to the reput's dispatch position.

    Returns:
        Metrics: the stable ones (``rows_in`` messages read, ``rows_out``
        messages kept, ...), ``topics``, ``queues_rewritten``,
        ``messages_read``, ``keys``, ``messages_kept``, ``tombstones_applied``,
        ``bytes_before`` and ``bytes_after`` (of the rewritten queues),
        ``ratio`` (after/before), ``status``.
    """
    topics = _selected_topics(settings, topic)

    def work(step: StepRun) -> dict:
        return _compact(spark, settings, step, topics=topics)

    return run_step("compact", settings, work, now=now)


def _selected_topics(settings: Settings, topic: str | None) -> list[str]:
    compaction_topics = settings.compaction_topics()
    if topic is None:
        return compaction_topics
    if topic not in compaction_topics:
        raise UsageError(
            f"--topic {topic}: not a COMPACTION topic; topics with cleanup_policy COMPACTION in topics.yaml: "
            f"{', '.join(compaction_topics) or '(none)'}"
        )
    return [topic]


def _compact(spark, settings: Settings, step: StepRun, *, topics: list[str]) -> dict:
    lake, run, started = step.lake, step.run, step.started
    dispatched = run.state.dispatched_offset
    compaction = run.state.compaction or CompactionState()
    positions = {t: compaction.positions.get(t, 0) for t in topics}
    minimum = lake.min_physical_offset()
    for name, position in positions.items():
        if position < minimum:  # expired before it was compacted: the broker cannot copy it either
            log.warning("%s: compaction position %d is below the commitlog min offset %d", name, position, minimum)
            positions[name] = minimum
    pending = {t: p for t, p in positions.items() if p < dispatched}
    metrics = {
        "topics": topics,
        "from_offsets": positions,
        "to_offset": dispatched,
        "queues_rewritten": 0,
        "messages_read": 0,
        "bytes_read": 0,
        "messages_without_key": 0,
        "keys": 0,
        "messages_kept": 0,
        "tombstones_applied": 0,
        "bytes_before": 0,
        "bytes_after": 0,
        "ratio": None,
    }
    if not topics or not pending:
        log.info("nothing to compact: %s at the dispatch position %d", ", ".join(topics) or "no topics", dispatched)
        return {**metrics, "status": "up_to_date", "table_versions": {}, "seconds": _since(started)}

    stages = Stages(log)
    first_segment = segment_file_name(segment_start(min(pending.values()), settings.store.commitlog_segment_size))
    commitlog = read_table(spark, lake, "commitlog", partition_filters=[("segment", ">=", first_segment)])
    new = T.dispatched_messages(commitlog, positions=pending, end=dispatched)
    with stages("read") as note:
        queues = sorted(
            (r["topic"], r["queue_id"]) for r in new.select("topic", "queue_id").distinct().collect()
        )  # one row per queue: driver memory follows queues, not messages
        note.update(queues=len(queues))
    compaction = CompactionState(positions={**compaction.positions, **{name: dispatched for name in pending}})
    state = replace(run.state, compaction=compaction)
    if not queues:
        return _commit(step, state, metrics, stages, dispatched=dispatched)

    removed_log = _partition_files(lake, "compaction_log", queues)
    removed_cq = _partition_files(lake, "compaction_cq", queues)
    old = _compacted_rows(spark, lake, queues)
    combined = new.withColumn("is_new", F.lit(True)).unionByName(old.withColumn("is_new", F.lit(False)))
    partitions = max(settings.spark.shuffle_partitions, 1)
    with stages("compact") as note:
        # one shuffle of whole rows (by queue: the window and the write reuse it), then a cheap pass over
        # the keys alone for the stats
        by_queue = combined.repartition(partitions, "topic", "queue_id")
        kept = T.latest_per_key(by_queue).filter("keep").select(*COMMITLOG.columns)
        stage_dataframe(run, kept.sortWithinPartitions("topic", "queue_id", "queue_offset"), "compaction_log")
        stats = T.compaction_stats(T.latest_per_key(T.key_columns(combined))).collect()[0].asDict()
        note.update(rows=stats["messages_read"], kept=stats["messages_kept"])
    if stats["messages_kept"]:  # else every key of these queues was removed: nothing staged to index
        with stages("queue index") as note:
            compacted = spark.read.parquet(run.staging_uri("compaction_log"))
            units = T.compacted_units(compacted, cq_file_size=settings.store.compaction_cq_file_size)
            stage_dataframe(
                run,
                units.repartition(partitions, "topic", "queue_id").sortWithinPartitions(
                    "topic", "queue_id", "queue_offset"
                ),
                "compaction_cq",
            )
            note.update(units=stats["messages_kept"])
    run.remove("compaction_log", removed_log)
    run.remove("compaction_cq", removed_cq)
    metrics.update(stats, queues_rewritten=len(queues), rows_in=stats["messages_read"], rows_out=stats["messages_kept"])
    metrics["ratio"] = round(stats["bytes_after"] / stats["bytes_before"], 4) if stats["bytes_before"] else None
    return _commit(step, state, metrics, stages, dispatched=dispatched)


def _commit(step: StepRun, state: LakeState, metrics: dict, stages: Stages, *, dispatched: int) -> dict:
    run, started = step.run, step.started
    for table in COMPACTED_TABLES:
        run.op(table).app_transactions[POSITION_APP_ID] = dispatched
    with stages("commit"):
        versions = step.commit(state, record={k: v for k, v in metrics.items() if k != "from_offsets"})
    metrics.update(
        status="compacted",
        table_versions=versions,
        seq=run.seq,
        run_id=run.run_id,
        seconds=_since(started),
        stage_seconds=stages.seconds,
        mb_per_second=round(metrics["bytes_read"] / 1e6 / _since(started), 2) if metrics["bytes_read"] else None,
    )
    log.info(
        "compacted %s up to offset %d: %d messages read into %d queues; %d keys, %d kept, %d tombstones applied; "
        "%d -> %d bytes (ratio %s) in %.1fs",
        ", ".join(metrics["topics"]),
        dispatched,
        metrics["messages_read"],
        metrics["queues_rewritten"],
        metrics["keys"],
        metrics["messages_kept"],
        metrics["tombstones_applied"],
        metrics["bytes_before"],
        metrics["bytes_after"],
        metrics["ratio"],
        metrics["seconds"],
    )
    return metrics


def _partition_files(lake: Lake, table: str, queues: list[tuple[str, int]]):
    """Active files of ``table`` in the given (topic, queue) partitions: they are replaced by this run."""
    wanted = {(topic, str(queue)) for topic, queue in queues}
    return [
        f
        for f in lake.engine.active_files(table)
        if (str(f.partition_values.get("topic")), str(f.partition_values.get("queue_id"))) in wanted
    ]


def _compacted_rows(spark, lake: Lake, queues: list[tuple[str, int]]):
    """Current compacted rows of the given queues, with their compaction key."""
    topics = sorted({t for t, _ in queues})
    frame = read_table(spark, lake, "compaction_log", partition_filters=[("topic", "in", topics)])
    wanted = F.lit(False)
    for topic, queue in queues:
        wanted = wanted | ((F.col("topic") == topic) & (F.col("queue_id") == queue))
    frame = frame.select(*COMMITLOG.columns).filter(wanted)
    return frame.withColumn(T.KEY, T.compaction_key())


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)
