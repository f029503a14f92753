"""The ingest job: producer log files → ``commitlog``, ``segments``, ``rejected``, ``ingest_files``."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from rmqlake.config import Settings
from rmqlake.errors import ConfigError, RefusedError, UsageError
from rmqlake.formats.transaction import DEFAULT_TRANSACTION_TIMEOUT_MS, HALF_QUEUE_ID, HALF_TOPIC
from rmqlake.ingest.deliveries import pending_as_rows, schedule_after
from rmqlake.ingest.files import Fingerprint, InputFile, resolve_inputs
from rmqlake.ingest.jvm import JOB_CLASS, options_text
from rmqlake.ingest.lines import ParseOptions
from rmqlake.ingest.plan import merge_segment_aggregates
from rmqlake.ingest.scratch import IngestTarget
from rmqlake.ingest.tasks import (
    AppendOrder,
    earlier_deliveries,
    fingerprint_files,
    order_partitions,
    parse_splits,
    place_and_write,
    plan_partitions,
    resolve_ends,
    split_tasks,
)
from rmqlake.lake import Lake, LakeRun
from rmqlake.lake.state import (
    CommitlogState,
    LakeState,
    QueueId,
    TopicTotals,
)
from rmqlake.progress import Stages, spark_description, spark_progress
from rmqlake.session import require_jvm_jar, use_jvm_job
from rmqlake.steps.runner import StepRun, run_step
from rmqlake.timeutil import epoch_ms
from rmqlake.transforms.segments import segment_size_problem, update_segments

log = logging.getLogger(__name__)


def parse_options(settings: Settings) -> ParseOptions:
    """The values line validation depends on, from the configuration."""
    return ParseOptions(
        queue_counts={name: topic.queues for name, topic in settings.topics.items()},
        default_queue_count=settings.broker.default_topic_queue_nums
        if settings.broker.auto_create_topic_enable
        else None,
        compaction_topics=frozenset(settings.compaction_topics()),
        max_message_size=settings.store.max_message_size,
        segment_size=settings.store.commitlog_segment_size,
        cluster_name=settings.broker.cluster_name,
        default_store_host=settings.hosts.store_host,
        default_born_host=settings.hosts.born_host,
        timezone=settings.broker.timezone,
        schedule=settings.schedule_rules(),
    )


def check_ingest(settings: Settings, *, input_path: str) -> list[InputFile]:
    """What ingest can check without Spark: its input files, and that the lake takes the configured segment size.

    Returns:
        The input files.

    Raises:
        InputError: no input files, or one that cannot be read.
        ConfigError: ``store.commitlog_segment_size`` differs from the lake's.
    """
    files = resolve_inputs(input_path)
    if settings.ingest.parser == "jvm":
        require_jvm_jar(settings.spark)
    check_segment_size(Lake.from_settings(settings), segment_size=settings.store.commitlog_segment_size)
    return files


def use_jvm_parser(spark, settings: Settings, options: ParseOptions) -> bool:
    """Whether the JVM parse job runs (``ingest.parser``): "auto" uses it where its class is loaded and the
    options can be passed to it.

    Raises:
        ConfigError: ``ingest.parser`` is "jvm" but the session lacks the class (spark-submit without the jar),
            or an option cannot be passed to the JVM.
    """
    if settings.ingest.parser == "python":
        return False
    try:
        options_text(options)
    except ValueError as exc:
        if settings.ingest.parser == "jvm":
            raise ConfigError(f"ingest.parser is jvm, but {exc}") from exc
        log.warning("%s: lines are parsed in Python", exc)
        return False
    return use_jvm_job(spark, settings.spark, setting="ingest.parser", choice=settings.ingest.parser,
                       job_class=JOB_CLASS, otherwise="lines are parsed in Python")  # fmt: skip


def default_sort_partitions(*, input_bytes: int, shuffle_partitions: int, cores: int) -> int:
    """Partitions of the append-order sort and the write: one per 128 MiB of input, at least
    ``spark.shuffle_partitions``; more than the cores round up to whole waves of them.

    Each write task takes about the same time (~1 s a partition of 1 KiB messages here), so 9 partitions on 2 cores
    leave one core idle through the last task; 10 do not.
    """
    partitions = max(shuffle_partitions, math.ceil(input_bytes / (128 * 1024 * 1024)))
    if cores > 1 and partitions > cores:
        partitions = math.ceil(partitions / cores) * cores
    return partitions


def check_segment_size(lake: Lake, *, segment_size: int) -> None:
    """Refuse a segment size other than the one the lake's commitlog was written with.

    Raises:
        ConfigError: naming both sizes.
    """
    commitlog = lake.state().commitlog or CommitlogState()
    rows = lake.read_arrow("segments", columns=["segment", "start_offset", "end_offset", "status"]).to_pylist()
    problem = segment_size_problem(
        rows,
        segment_size=segment_size,
        next_offset=commitlog.next_offset,
        recorded=commitlog.segment_size,
    )
    if problem:
        raise ConfigError(problem)


def ingest(
    spark, settings: Settings, *, input_path: str, batch_id: str | None = None, now: datetime | None = None
) -> dict:
    """Ingest the producer logs at ``input_path`` (file, folder or glob).

    Files already ingested (same path, size and content hash) are skipped,
    so re-running a batch changes nothing.

    Returns:
        Metrics: the stable ones (``rows_in`` lines, ``rows_out`` lines accepted: messages and the ends of
        transactions, ``rejected`` lines, ``files_added`` commitlog files, ...), ``files``,
        ``files_skipped``, ``commitlog_bytes``, ``segments_opened``, ``start_offset``/``end_offset``,
        ``deliveries``, ``transaction_halves``/``_commits``/``_rollbacks``, ...
    """
    started = time.monotonic()
    clock_ms = epoch_ms(now) if now is not None else None  # only a time given counts towards the delivery clock
    now = now or datetime.now(UTC)
    files = check_ingest(settings, input_path=input_path)
    total = sum(f.size for f in files)
    log.info("found %d input files (%.1f MB) at %s", len(files), total / 1e6, input_path)
    with spark_progress("ingest", interval=settings.spark.progress_seconds), spark_description("hash input files"):
        # reads every input byte: before run_step, with its own progress
        prints = fingerprint_files(spark, files, progress_seconds=settings.spark.progress_seconds)

    def work(step: StepRun) -> dict:
        return _ingest_batch(spark, settings, step, prints, batch_id=batch_id, clock_ms=clock_ms)

    return run_step("ingest", settings, work, now=now, started=started, batch_id=batch_id)


def _refuse_when_disk_full(state: LakeState, settings: Settings) -> None:
    """The broker rejects puts while its DISK_FULL flag is set (RunningFlags.isWriteable); so does ingest."""
    if state.expire is None or not state.expire.disk_full:
        return
    usage = state.expire.disk_usage
    if settings.ingest.write_when_disk_full:
        log.warning(
            "the disk-full flag is set (usage %.2f%%); writing anyway: ingest.write_when_disk_full=true", usage * 100
        )
        return
    raise RefusedError(
        f"the lake's disk-full flag is set: the last expire run measured disk usage {usage:.2%}, above "
        f"retention.disk_warning_ratio ({settings.retention.disk_warning_ratio:.0%}), so a broker would reject writes "
        "(SERVICE_NOT_AVAILABLE). Nothing was written. Run `rmqlake expire` to free space (the flag clears once "
        "usage is at or below retention.disk_clean_forcibly_ratio), or --set ingest.write_when_disk_full=true"
    )


def _ingest_batch(spark, settings: Settings, step: StepRun, prints, *, batch_id, clock_ms: int | None) -> dict:
    lake, run, now, started = step.lake, step.run, step.now, step.started
    seen = lake.read_arrow("ingest_files", columns=["path", "size_bytes", "sha256", "batch_id"]).to_pylist()
    known = {(r["path"], r["size_bytes"], r["sha256"]): r["batch_id"] for r in seen}
    new = [f for f in prints if (f.path, f.size, f.sha256) not in known]
    skipped = len(prints) - len(new)
    known_paths = {r["path"]: r for r in seen}
    for f in new:
        if f.path in known_paths:
            log.warning(
                "%s was ingested before with other content (batch %s); its lines are ingested again as a new file",
                f.path,
                known_paths[f.path]["batch_id"],
            )
    if not new:
        batches = sorted({known[(f.path, f.size, f.sha256)] for f in prints})
        log.info("nothing to do: all %d input files were already ingested (batch %s)", len(prints), ", ".join(batches))
        return {
            "status": "already_ingested",
            "batch_id": batches[0] if len(batches) == 1 else ",".join(batches),
            "rows_in": 0,
            "rows_out": 0,
            "rejected": 0,
            "files": 0,
            "files_skipped": skipped,
            "table_versions": {},
            "seconds": round(time.monotonic() - started, 3),
        }
    _refuse_when_disk_full(run.state, settings)
    batch_id = (
        batch_id
        or "b-" + hashlib.sha256("\n".join(f"{f.path}\t{f.size}\t{f.sha256}" for f in new).encode()).hexdigest()[:16]
    )
    if batch_id in set(known.values()):
        raise UsageError(f"--batch-id {batch_id} was already used for other input files; choose a new batch id")
    run.batch_id = batch_id
    options = parse_options(settings)
    store = settings.store
    commitlog = run.state.commitlog or CommitlogState()
    start_offset = commitlog.next_offset
    heads = {(topic, queue): head for (topic, queue), head in commitlog.queue_heads.items()}
    rr_counters = dict(commitlog.rr_counters)

    target = IngestTarget(
        lake_root=lake.root,
        storage_options=dict(settings.lake.storage_options),
        scratch_dir=f"{run.staging_dir('commitlog')}/_scratch",
        commitlog_dir=run.staging_dir("commitlog"),
        rejected_dir=run.staging_dir("rejected"),
        run_id=run.run_id,
        batch_id=batch_id,
        rejected_at_us=epoch_ms(now) * 1000,
    )

    stages = Stages(log)
    rules = settings.schedule_rules()
    # 1. read and parse: messages and their narrow rows to scratch files, rejected lines to staging
    with stages("read and parse") as note:
        tasks = split_tasks(spark, new, split_bytes=settings.ingest.split_bytes)
        in_jvm = use_jvm_parser(spark, settings, options)
        parsed = parse_splits(spark, tasks, options=options, target=target, jvm=in_jvm)
        per_file, ordered_splits, last_stored = parsed.per_file, parsed.with_messages, parsed.last_stored
        rows_in = sum(r["lines"] for r in per_file.values())
        rejected_count = sum(r["rejected"] for r in per_file.values())
        note.update(rows=rows_in, messages=rows_in - rejected_count - parsed.ends, rejected=rejected_count,
                    files=len(new), jvm_accepted=parsed.jvm_accepted, jvm_undecided=parsed.jvm_undecided)  # fmt: skip
    messages = rows_in - rejected_count - parsed.ends
    halves = sum(r["halves"] for r in per_file.values())
    half_head = heads.get((HALF_TOPIC, HALF_QUEUE_ID), 0)
    files = {task.index: task.path for task in tasks} | {task.remainder: task.path for task in tasks}

    # 1a. the ends of transactions: each finds its half (in this batch or the lake) and writes what it stores
    ends = None
    if parsed.with_ends:
        with stages("end transactions") as note:
            ends = resolve_ends(
                spark,
                lake,
                target,
                end_splits=parsed.with_ends,
                half_splits=parsed.with_halves,
                half_head=half_head,
                first_split=parsed.split_ids,
                files=files,
                file_ranks={split: task.file_rank for task in tasks for split in (task.index, task.remainder)},
                transaction_timeout_ms=DEFAULT_TRANSACTION_TIMEOUT_MS,
                partitions=settings.spark.shuffle_partitions,
            )
            ordered_splits = ordered_splits + ends.written_splits
            files.update({parsed.split_ids + row["split"]: files[row["split"]] for row in ends.per_split})
            for row in ends.per_split:
                per_file[files[row["split"]]]["rejected"] += row["refused"]
            rejected_count += ends.refused
            if ends.commits + ends.rollbacks + ends.refused != parsed.ends:
                raise AssertionError(f"{parsed.ends} end lines were read, but not every one was decided: {ends}")
            note.update(rows=parsed.ends, commits=ends.commits, rollbacks=ends.rollbacks, refused=ends.refused)
    commits = ends.commits if ends else 0
    op_records = commits + ends.rollbacks if ends else 0
    if rejected_count:
        rejected_files = run.collect_staged("rejected", mode="append")
        _log_rejects(lake, run, rejected_files, limit=settings.ingest.log_rejects)

    # 1b. the delivery clock, and the origins of earlier runs that come due by it
    schedule = run.state.schedule
    clock = max(
        (t for t in (schedule.delivered_until if schedule else None, last_stored, clock_ms) if t is not None),
        default=None,
    )
    earlier_pending: list[dict] = [] if schedule is None else pending_as_rows(schedule)
    earlier_delivered = 0
    if (
        clock is not None
        and schedule is not None
        and schedule.pending_from is not None
        and any(group.next_due <= clock for group in schedule.pending.values())
    ):
        with stages("deliver earlier messages") as note:
            delivery_splits, earlier_delivered, earlier_pending = earlier_deliveries(
                spark,
                lake,
                target,
                first_split=2 * parsed.split_ids,
                pending_from=schedule.pending_from,
                delivered_until=schedule.delivered_until,
                clock=clock,
                rules=rules,
                segment_size=store.commitlog_segment_size,
            )
            ordered_splits = ordered_splits + delivery_splits
            note.update(rows=earlier_delivered)

    # 2-4. order, count, plan (narrow rows only)
    partitions = settings.ingest.sort_partitions or default_sort_partitions(
        input_bytes=sum(f.size for f in new),
        shuffle_partitions=settings.spark.shuffle_partitions,
        cores=spark.sparkContext.defaultParallelism,
    )
    order = AppendOrder(splits=(), stats=[], bounds=[], reads={})  # a batch of rejected lines only places nothing
    if ordered_splits:
        with stages("sort into append order") as note:
            order = order_partitions(
                spark,
                target,
                ordered_splits,
                partitions=partitions,
                options=options,
                clock=clock if clock is not None else -(1 << 63),
            )
            note.update(rows=messages, partitions=partitions)
    with stages("plan offsets") as note:
        plan = plan_partitions(
            spark,
            target,
            order.stats,
            partitions=partitions,
            start_offset=start_offset,
            queue_heads=heads,
            rr_counters=rr_counters,
            options=options,
        )
        note.update(partitions_replayed=plan.partitions_replayed)
    this_run_pending = [row for row in order.stats if row.kind in ("pending", "pending_due")]
    origins = sum(r["origins"] for r in per_file.values())
    deliveries = origins - sum(r.value for r in this_run_pending if r.kind == "pending") + earlier_delivered
    if plan.messages != messages + deliveries + commits + op_records:
        raise AssertionError(
            f"the placement plan counts {plan.messages} records; parsing found {messages} messages, "
            f"{deliveries} deliveries are due ({earlier_delivered} of earlier runs' messages), and the ends of "
            f"transactions store {commits} commits and {op_records} op records"
        )
    if plan.queue_heads.get((HALF_TOPIC, HALF_QUEUE_ID), 0) - half_head != halves:
        raise AssertionError("the half topic's queue offsets do not count exactly the batch's half messages")

    # 5. place and write
    segment_rows = lake.read_arrow("segments").to_pylist()
    commitlog_files = []
    batch_segments: list[dict] = []
    pending_delays: list[dict] = []
    if plan.messages:
        with stages("place and write commitlog") as note:
            files.update({split: DELIVERY_SOURCE for split in ordered_splits if split >= 2 * parsed.split_ids})
            written, pending_delays = place_and_write(
                spark,
                partitions=partitions,
                plan=plan,
                options=options,
                segment_size=store.commitlog_segment_size,
                files=files,
                target=target,
                clock=clock,
                order=order,
            )
            commitlog_files = run.collect_staged("commitlog", mode="append")
            if sum(f.num_records for f in commitlog_files) != plan.messages:
                raise AssertionError("the staged commitlog files do not hold every record of the batch")
            batch_segments = merge_segment_aggregates(written)
            note.update(
                rows=plan.messages,
                deliveries=deliveries,
                offsets=f"{start_offset}..{plan.end_offset}",
                segments=len(batch_segments),
                files=len(commitlog_files),
            )
    lake.storage.delete_dir(target.scratch_dir)
    new_segments = update_segments(
        segment_rows, batch_segments, segment_size=store.commitlog_segment_size, end_offset=plan.end_offset
    )
    if batch_segments or not lake.exists("segments"):
        run.stage_arrow("segments", pa.Table.from_pylist(new_segments, schema=_segments_schema()), mode="overwrite")
    run.stage_arrow("ingest_files", _ingest_file_rows(new, per_file, batch_id, now), mode="append")
    schedule = schedule_after(
        schedule,
        clock=clock,
        earlier_pending=earlier_pending,
        this_run_pending=this_run_pending,
        pending_delays=pending_delays,
        start_offset=start_offset,
        queue_heads=plan.queue_heads,
        rules=rules,
    )

    topics = dict(commitlog.topics)
    for topic, (count, size) in plan.topic_totals.items():
        totals = topics.get(topic, TopicTotals())
        topics[topic] = TopicTotals(messages=totals.messages + count, bytes=totals.bytes + size)
    commitlog = replace(
        commitlog,
        next_offset=plan.end_offset,
        segment_size=store.commitlog_segment_size,
        queue_heads={QueueId(topic, queue): head for (topic, queue), head in plan.queue_heads.items()},
        rr_counters=dict(plan.rr_counters),
        topics=topics,
    )
    if batch_segments:
        last = max(batch_segments, key=lambda s: s["data_end"])
        commitlog = replace(commitlog, physic_msg_timestamp=last["last_store_timestamp"])
    metrics = {
        "status": "ingested",
        "batch_id": batch_id,
        "rows_in": rows_in,
        "rows_out": rows_in - rejected_count,
        "rejected": rejected_count,
        "deliveries": deliveries,
        "transaction_halves": halves,
        "transaction_commits": commits,
        "transaction_rollbacks": op_records - commits,
        "pending_deliveries": schedule.pending_count if schedule else 0,
        "files": len(new),
        "files_skipped": skipped,
        "input_bytes": sum(f.size for f in new),
        "lines_parsed_in_jvm": parsed.jvm_accepted,  # the others went through the per-line parser
        "start_offset": start_offset,
        "end_offset": plan.end_offset,
        "commitlog_bytes": plan.end_offset - start_offset,
        "message_bytes": plan.message_bytes,
        "segments_written": len(batch_segments),
        "segments_opened": sum(1 for s in batch_segments if s["segment"] not in {r["segment"] for r in segment_rows}),
        "files_added": len(commitlog_files),
    }
    with stages("commit"):
        versions = step.commit(replace(run.state, commitlog=commitlog, schedule=schedule), record=metrics)
    seconds = time.monotonic() - started
    metrics.update(
        table_versions=versions,
        seq=run.seq,
        run_id=run.run_id,
        seconds=round(seconds, 3),
        rows_per_second=round(messages / seconds, 1) if seconds else None,
        mb_per_second=round(plan.message_bytes / 1e6 / seconds, 2) if seconds else None,
        stage_seconds=stages.seconds,
    )
    log.info(
        "committed batch %s as seq %d: %d messages, %d rejected, %.1f MB in %.1fs (%.0f messages/s)",
        batch_id,
        run.seq,
        messages,
        rejected_count,
        plan.message_bytes / 1e6,
        seconds,
        messages / seconds if seconds else 0,
    )
    return metrics


# The commitlog's source_file of a delivery whose origin an earlier run stored.
DELIVERY_SOURCE = "(scheduled delivery)"


def _log_rejects(lake: Lake, run: LakeRun, files, *, limit: int) -> None:
    """Quote the first ``limit`` rejected lines in the log (all of them are in the ``rejected`` table)."""
    quoted = 0
    for data_file in files:
        if quoted >= limit:
            return
        path = lake.storage.file_path(f"{run.staging_dir('rejected')}/{data_file.path}")
        table = pq.read_table(path, filesystem=lake.storage.fs, columns=["source_file", "source_line", "reason"])
        for row in table.slice(0, limit - quoted).to_pylist():
            log.warning("rejected %s:%d: %s", row["source_file"], row["source_line"], row["reason"])
            quoted += 1


def _segments_schema() -> pa.Schema:
    from rmqlake.lake.tables import SEGMENTS

    return SEGMENTS.arrow_schema


def _ingest_file_rows(files: list[Fingerprint], per_file: dict, batch_id: str, now: datetime) -> pa.Table:
    from rmqlake.lake.tables import INGEST_FILES

    rows = []
    for f in files:
        counts = per_file.get(f.path)
        lines = counts["lines"] if counts else 0
        rejected = counts["rejected"] if counts else 0
        rows.append(
            {
                "path": f.path,
                "size_bytes": f.size,
                "sha256": f.sha256,
                "batch_id": batch_id,
                "lines": lines,
                "messages": lines - rejected,
                "rejected": rejected,
                "ingested_at": now,
            }
        )
    return pa.Table.from_pylist(rows, schema=INGEST_FILES.arrow_schema)
