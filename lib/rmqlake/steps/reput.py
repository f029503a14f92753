"""The reput job: commitlog rows after the dispatch position → ``consumequeue``, ``indexfile``, ``indexfile_header``."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

import pyarrow as pa
from pyspark.sql import Observation
from pyspark.sql import functions as F

from rmqlake.config import Settings
from rmqlake.formats.segment import segment_file_name, segment_start
from rmqlake.lake import Lake, LakeRun
from rmqlake.lake.spark_io import read_table, stage_dataframe
from rmqlake.lake.state import ReputState
from rmqlake.lake.tables import CONSUMEQUEUE, INDEXFILE_HEADER
from rmqlake.progress import Stages
from rmqlake.steps.runner import StepRun, run_step
from rmqlake.transforms import index_bands as B
from rmqlake.transforms import queue_bands as QB
from rmqlake.transforms import reput as T

log = logging.getLogger(__name__)
DISPATCHED_APP_ID = "rmqlake.reput.dispatched"
# Row groups of the Spark-staged entries, ~10,000 of them (``index_bands.INDEX_ROW_GROUP_ROWS`` for the band
# tasks): a key lookup decodes one row group of each index file for its slot (4 MiB ones cost ~4 ms a lookup,
# these ~1 ms), for ~0.5 MB of footers on a 5 M-message lake.
INDEX_ROW_GROUP_BYTES = 512 * 1024
# Rows (CQ units, index keys) a band task of the CQ or index stage holds at most: ~100 bytes each in memory.
BAND_ROWS = 2_000_000


def reput(spark, settings: Settings) -> dict:
    """Dispatch every commitlog message after the last dispatched physical offset, and only those.

    The new dispatch position is committed with the rows it produced (ledger
    state and the app transaction ``rmqlake.reput.dispatched`` on each table),
    so a re-run dispatches nothing twice.

    Returns:
        Metrics: the stable ones (``rows_in`` messages dispatched, ``rows_out``
        CQ units written, ...), ``from_offset``, ``to_offset``, ``cq_units``,
        ``index_entries``, ``index_files_created``, ``stage_seconds``.
    """

    def work(step: StepRun) -> dict:
        return _reput(spark, settings, step)

    return run_step("reput", settings, work)


def _reput(spark, settings: Settings, step: StepRun) -> dict:
    lake, run, started = step.lake, step.run, step.started
    store = settings.store
    end = run.state.next_offset
    reput_state = run.state.reput or ReputState()
    dispatched = reput_state.dispatched_offset
    minimum = lake.min_physical_offset()
    if dispatched < minimum:  # dispatch fell behind deleted segments and jumps to the min offset
        log.warning("dispatch position %d is below the commitlog min offset %d; skipping to it", dispatched, minimum)
        dispatched = minimum
    metrics = {
        "from_offset": dispatched,
        "to_offset": end,
        "rows_in": 0,
        "rows_out": 0,
        "cq_units": 0,
        "index_entries": 0,
        "index_files_created": 0,
    }
    if dispatched >= end:
        log.info("nothing to dispatch: dispatch position %d is the commitlog end", dispatched)
        return {
            **metrics,
            "status": "up_to_date",
            "table_versions": {},
            "seconds": round(time.monotonic() - started, 3),
        }

    stages = Stages(log)
    partitions = max(settings.spark.shuffle_partitions, 1)
    # One pass over the commitlog for both outputs: its tasks save the CQ units and the index keys as scratch
    # Parquet, which the two stages then read (no cache of every unit and key). The scratch sits in the run's
    # commitlog staging folder, which reput never writes (the stages overwrite their own tables' folders);
    # a killed run's leftovers go with the rest of its staging folders.
    scratch = T.DispatchScratch(
        lake_root=lake.root,
        storage_options=dict(settings.lake.storage_options),
        folder=f"{run.staging_dir('commitlog')}/_dispatch",
    )
    try:
        with stages("dispatch") as note:
            files = _files_to_dispatch(lake, dispatched, segment_size=store.commitlog_segment_size)
            # A CQ band per BAND_ROWS of the records read (the units are fewer: not every record takes a queue
            # offset), and no fewer than the shuffle partitions.
            cq_bands = max(partitions, math.ceil(sum(f.rows for f in files) / BAND_ROWS))
            summary = _dispatch(spark, settings, lake, files, dispatched, scratch=scratch, cq_bands=cq_bands)
            note.update(rows=summary.messages, units=summary.units, key_runs=len(summary.runs), files=len(files))
        with stages("consume queue") as note:
            cq_files = _stage_queue_bands(spark, lake, run, scratch=scratch, units=summary.units, bands=cq_bands)
            note.update(units=summary.units, files=len(cq_files))
        metrics.update(rows_in=summary.messages, rows_out=summary.units, cq_units=summary.units)
        if summary.last_unit_timestamp is not None:
            reput_state = replace(reput_state, logics_msg_timestamp=summary.last_unit_timestamp)
        run.op("consumequeue").app_transactions[DISPATCHED_APP_ID] = end

        if store.message_index_enable:
            with stages("index") as note:
                keys = _scratch_frame(
                    spark, lake, scratch.keys_dir, T.DISPATCHED_KEYS.ddl, sum(r.count for r in summary.runs)
                )
                created, entries, index_ts = _build_index(
                    spark, settings, lake, run, keys, summary, scratch=scratch, partitions=partitions
                )
                note.update(rows=entries, files_created=created)
            metrics.update(index_entries=entries, index_files_created=created)
            if index_ts is not None:
                reput_state = replace(reput_state, index_msg_timestamp=index_ts)
    finally:
        lake.storage.delete_dir(scratch.folder)
    reput_state = replace(reput_state, dispatched_offset=end)
    with stages("commit"):
        versions = step.commit(replace(run.state, reput=reput_state), record=metrics)
    seconds = time.monotonic() - started
    metrics.update(
        status="dispatched",
        table_versions=versions,
        seq=run.seq,
        run_id=run.run_id,
        seconds=round(seconds, 3),
        stage_seconds=stages.seconds,
        rows_per_second=round(metrics["rows_in"] / seconds, 1) if seconds else None,
    )
    log.info(
        "dispatched offsets %d..%d: %d messages, %d CQ units, %d index entries (%d new index files) in %.1fs",
        dispatched,
        end,
        metrics["rows_in"],
        metrics["cq_units"],
        metrics["index_entries"],
        metrics["index_files_created"],
        seconds,
    )
    return metrics


def _files_to_dispatch(lake: Lake, dispatched: int, *, segment_size: int) -> list[T.CommitlogFile]:
    """The commitlog's data files that may hold records at or after ``dispatched``: those of its segment and
    later ones, but files whose statistics end before it (the Delta log's, no data read)."""
    first_segment = segment_file_name(segment_start(dispatched, segment_size))
    files = []
    for stats in lake.file_stats("commitlog", ["physical_offset"]):
        segment = stats["partition"].get("segment")
        last = stats["max"]["physical_offset"]
        if segment is None or str(segment) < first_segment or (last is not None and last < dispatched):
            continue
        files.append(
            T.CommitlogFile(f"commitlog/{stats['path']}", stats["num_records"] or 0, stats["min"]["physical_offset"])
        )
    return files


def _dispatch_options(settings: Settings, *, scratch: T.DispatchScratch, cq_bands: int) -> dict:
    """What both dispatch routes are given."""
    store = settings.store
    return {
        "units_per_file": store.cq_units_per_file,
        "slots": store.index_slots,
        "index": store.message_index_enable,
        "delay_levels": settings.schedule_rules().delay_levels,
        "scratch": scratch,
        "cq_bands": cq_bands,
    }


def _dispatch(
    spark,
    settings: Settings,
    lake: Lake,
    files: list[T.CommitlogFile],
    dispatched: int,
    *,
    scratch: T.DispatchScratch,
    cq_bands: int,
) -> T.DispatchSummary:
    """The dispatch of the commitlog's records at or after ``dispatched`` in ``files`` (``_files_to_dispatch``),
    its tasks reading the data files themselves (``dispatch_files``)."""
    return T.summarize(
        T.dispatch_files(
            spark.sparkContext,
            T.dispatch_tasks(files),
            from_offset=dispatched,
            **_dispatch_options(settings, scratch=scratch, cq_bands=cq_bands),
        )
    )  # a few rows a task


def _dispatch_by_spark(
    spark,
    settings: Settings,
    lake: Lake,
    files: list[T.CommitlogFile],
    dispatched: int,
    *,
    scratch: T.DispatchScratch,
    cq_bands: int,
) -> T.DispatchSummary:
    """``_dispatch`` over a Spark scan of the commitlog's segments from the one holding ``dispatched`` (``files``
    unused: Spark lists and prunes them itself), the reference of the file route."""
    store = settings.store
    first_segment = segment_file_name(segment_start(dispatched, store.commitlog_segment_size))
    commitlog = read_table(spark, lake, "commitlog", partition_filters=[("segment", ">=", first_segment)])
    messages = T.dispatch_requests(commitlog.filter(F.col("physical_offset") >= dispatched))
    dispatched_rows = T.dispatch(
        messages,
        **_dispatch_options(settings, scratch=scratch, cq_bands=cq_bands),
    ).collect()
    return T.summarize(row.asDict() for row in dispatched_rows)


def _stage_queue_bands(spark, lake: Lake, run: LakeRun, *, scratch: T.DispatchScratch, units: int, bands: int):
    """Stage the dispatch's CQ units by band tasks (``queue_bands``): one data file per CQ file (cq_file is a
    partition column: expiry removes whole CQ files); the staged files."""
    target = QB.QueueBandTarget(
        lake_root=lake.root,
        storage_options=dict(scratch.storage_options),
        units_dir=scratch.units_dir,
        staging_dir=run.staging_dir("consumequeue"),
        run_id=run.run_id,
    )
    if units:
        context = spark.sparkContext
        context.parallelize(range(bands), bands).flatMap(lambda band: QB.build_band(band, target=target)).count()
    return run.collect_staged("consumequeue")


def _stage_queue_by_spark(spark, lake: Lake, run: LakeRun, *, scratch: T.DispatchScratch, units: int, bands: int):
    """Stage the dispatch's CQ units by Spark, the reference of ``_stage_queue_bands``: a hash repartition on the
    CQ file, one task per CQ file's units (bounded by cq_units_per_file), no sampling pass."""
    frame = _scratch_frame(spark, lake, scratch.units_dir, CONSUMEQUEUE.spark_schema, units)
    return stage_dataframe(
        run,
        frame.repartition(bands, "topic", "queue_id", "cq_file").sortWithinPartitions(
            "topic", "queue_id", "queue_offset"
        ),
        "consumequeue",
    )


def _scratch_frame(spark, lake: Lake, folder: str, schema, expected: int):
    """The scratch Parquet files the dispatch tasks saved under ``folder`` (none when ``expected`` is 0)."""
    if not expected:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(lake.storage.uri(folder))


def _build_index(
    spark, settings: Settings, lake: Lake, run: LakeRun, keys, summary, *, scratch: T.DispatchScratch, partitions: int
):
    """Stage this run's index entries and the updated headers; returns (files created, entries, indexMsgTimestamp).

    ``keys``: the index keys the dispatch saved in ``scratch`` (``DISPATCHED_KEYS``); ``summary``: its
    ``DispatchSummary``.
    """
    store = settings.store
    headers = lake.read_arrow("indexfile_header").to_pylist()
    last = max(headers, key=lambda h: h["index_file"]) if headers else None
    open_file = (
        T.OpenIndexFile(
            name=last["index_file"],
            entries=last["index_count"] - 1,
            begin_timestamp=last["begin_timestamp"],
            end_timestamp=last["end_timestamp"],
            begin_phy_offset=last["begin_phy_offset"],
            end_phy_offset=last["end_phy_offset"],
            hash_slot_count=last["hash_slot_count"],
        )
        if last
        else None
    )
    ordered = None
    if T.runs_are_disjoint(summary.runs):
        # The usual case: each run is a stretch of the dispatch order, numbered from its run's count prefix sum.
        plan = T.plan_index(
            {r.start: r.count for r in summary.runs}, open_file=open_file, max_entries=store.index_max_entries
        )
        with_ordinals = T.add_run_ordinals(spark, keys, run_starts=plan.partition_starts)
        known_times = T.run_timestamps(summary.runs, plan)
    else:
        # Runs that interleave (a commitlog not in physical order within its files): a global range sort.
        log.info("index key runs overlap: numbering the keys by a global sort")
        ordered = T.order_keys(keys.select(*T.INDEX_KEYS.names), partitions=partitions).persist()
        counts = {row["partition"]: row["count"] for row in ordered.groupBy("partition").count().collect()}
        plan = T.plan_index(counts, open_file=open_file, max_entries=store.index_max_entries)
        with_ordinals = T.add_ordinals(ordered, partition_starts=plan.partition_starts)
        known_times = {}
    firsts = plan.first_ordinals()
    if firsts:
        wanted = sorted({o for o in firsts} | {o - 1 for o in firsts if o > 0})
        times = {o: known_times[o] for o in wanted if o in known_times}
        missing = [o for o in wanted if o not in times]
        if missing:  # a file boundary inside a run
            times.update(
                (r["ordinal"], r["store_timestamp"])
                for r in with_ordinals.filter(F.col("ordinal").isin(missing))
                .select("ordinal", "store_timestamp")
                .collect()
            )
        plan = T.name_new_files(
            plan,
            {o: times[o] for o in firsts},
            {o: times[o] for o in wanted if o + 1 in firsts},
            zone=settings.broker.timezone,
            last_name=open_file.name if open_file else None,
        )
    index_partitions = max(partitions, math.ceil(plan.total / BAND_ROWS))
    if ordered is None:
        aggregates = _stage_index_bands(
            spark, lake, run, plan, scratch=scratch, slots=store.index_slots, bands=index_partitions
        )
    else:
        aggregates = _stage_index_by_spark(spark, lake, run, with_ordinals, plan, partitions=index_partitions)
        ordered.unpersist()
    merged = T.merge_headers(headers, aggregates)
    run.stage_arrow(
        "indexfile_header", pa.Table.from_pylist(merged, schema=INDEXFILE_HEADER.arrow_schema), mode="overwrite"
    )
    end = run.state.next_offset
    run.op("indexfile").app_transactions[DISPATCHED_APP_ID] = end
    run.op("indexfile_header", mode="overwrite").app_transactions[DISPATCHED_APP_ID] = end
    # checkpoint.indexMsgTimestamp: end time of the last full file, written when the next file is created
    index_ts = merged[-2]["end_timestamp"] if plan.new_files and len(merged) > 1 else None
    return len(plan.new_files), plan.total, index_ts


def _stage_index_bands(
    spark, lake: Lake, run: LakeRun, plan: T.IndexPlan, *, scratch: T.DispatchScratch, slots: int, bands: int
):
    """Stage the entries by band tasks (``index_bands``); the header aggregates of the files written."""
    if not plan.total:
        return []
    open_parts = ()
    if plan.open_file is not None and plan.room > 0:
        open_parts = tuple(
            B.OpenFilePart(f"indexfile/{f['path']}", f["min"]["slot"], f["max"]["slot"])
            for f in lake.file_stats("indexfile", ["slot"])
            if f["partition"].get("index_file") == plan.open_file.name
        )
    target = B.IndexBandTarget(
        lake_root=lake.root,
        storage_options=dict(scratch.storage_options),
        keys_dir=scratch.keys_dir,
        staging_dir=run.staging_dir("indexfile"),
        run_id=run.run_id,
        slots=slots,
        bands=bands,
        open_file_parts=open_parts,
    )
    context = spark.sparkContext
    parts = (
        context.parallelize(range(bands), bands)
        .flatMap(lambda band: B.build_band(band, target=target, plan=plan))
        .collect()
    )  # a few rows a task
    run.collect_staged("indexfile")
    return B.combine_header_parts(parts)


def _stage_index_by_spark(spark, lake: Lake, run: LakeRun, with_ordinals, plan: T.IndexPlan, *, partitions: int):
    """Stage the entries by Spark (keys numbered by a global sort); the header aggregates of the files written."""
    numbered = T.number_entries(with_ordinals, plan=plan)
    seeds = None
    open_file = plan.open_file
    files = [*([open_file.name] if open_file and plan.room > 0 else []), *plan.new_files] if plan.total else []
    if open_file and plan.room > 0 and plan.total > 0:
        existing = read_table(spark, lake, "indexfile", partition_filters=[("index_file", "=", open_file.name)])
        seeds = (
            existing.groupBy("slot")
            .agg(F.max("index_no").alias("seed_index"))
            .withColumn("index_file", F.lit(open_file.name))
        )
    # Range-partitioned by slot before the chain: the chain's window then needs no shuffle of its own, and the
    # files cover slot ranges (a lookup's slot prunes them).
    by_slot = numbered.repartitionByRange(partitions, "index_file", "slot")
    rows = T.index_rows(T.chain_entries(by_slot, seeds=seeds))
    # The header fields are aggregated while the entries are written (a few files a run), not read back.
    # (No entries, no files: an observation of an empty frame may never be reported.)
    observation = Observation("index headers") if 0 < len(files) <= T.OBSERVED_FILES_MAX else None
    if observation is not None:
        rows = rows.observe(observation, *T.header_observations(files))
    sorted_rows = rows.sortWithinPartitions("index_file", "slot", "index_no")
    stage_dataframe(run, sorted_rows, "indexfile", options={"parquet.block.size": str(INDEX_ROW_GROUP_BYTES)})
    if observation is not None:
        return T.observed_aggregates(files, observation.get)
    if files:
        staged = spark.read.parquet(run.staging_uri("indexfile"))
        return [r.asDict() for r in T.header_aggregates(staged).collect()]
    return []
