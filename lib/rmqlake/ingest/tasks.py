"""What runs on executors: producer log lines → CommitLog files, placed exactly as a broker appends them.

The broker appends one message at a time; here the same sequential rules are
computed in parallel (DESIGN "Algorithms that must scale"). Message bodies
never cross a shuffle, nor go from Python to the JVM: only a narrow row per
line (its position, order key, topic, queue, sysFlag and size) does.

1. ``parse_split`` (a task per input split): each line → record fields or a
   reject reason (``parse_lines``: column-wise where the block allows, the
   per-line parser for the rest). The split's messages go to a scratch
   Arrow IPC file in the run's staging folder, its narrow rows (sorted, with
   where each message sits in the scratch file) to a small Parquet file, its
   rejected lines to the ``rejected`` table's staging folder.
2. ``append_order_bounds`` (driver, from the narrow files' row-group
   statistics) and ``order_partition`` (a task per range): each range's
   narrow rows are gathered from the splits' files (sorted, so only the row
   groups reaching into the range are read), sorted by the append order
   (storeTimestamp, source file, line) and saved, so partition i precedes
   i+1; the same task counts them (``stats_of_partition``): message count
   and bytes, round-robin counts per topic and offset-consuming counts per
   queue. A few numbers per partition and queue, collected by the caller.
   (Spark's own range shuffle of the narrow rows did the same in ~4x the
   time: a sampling job, a shuffle and a pass through Python to count.)
3. ``plan_append`` (driver): prefix sums give each partition its starting
   queue offsets, round-robin counters and physical offset. Only a partition
   that crosses a segment end is replayed (by a one-partition job the caller
   supplies) to learn where it ends.
4. ``write_partition`` (a task per partition): replays the partition's own
   rolls and queue offsets from its start, fetches its messages from the
   scratch files (the batches holding them), and writes them in offset
   order as the commitlog's Parquet files, one per segment touched.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rmqlake.formats.segment import segment_file_name
from rmqlake.ingest.files import (
    DamagedInput,
    Fingerprint,
    InputFile,
    Split,
    count_split_lines,
    fingerprint,
    iter_split_line_blocks,
    plan_splits,
)
from rmqlake.ingest.lines import ParseOptions
from rmqlake.ingest.parse import PARSED_SCHEMA, gc_paused, parse_lines
from rmqlake.ingest.plan import (
    APPEND_ORDER,
    COMMITLOG_FILE_SCHEMA,
    PLACEMENT_SCHEMA,
    AppendPlan,
    PartitionPlacer,
    PartitionStart,
    StatsRow,
    append_order_bounds,
    commitlog_rows,
    plan_append,
    replay_end_offset,
    stats_of_partition,
    stats_rows,
)
from rmqlake.ingest.scratch import (
    NARROW_ROW_GROUP_ROWS,
    NARROW_SCHEMA,
    SCRATCH_BATCH_ROWS,
    SCRATCH_COLUMNS,
    AtomicArrowFile,
    AtomicParquet,
    IngestTarget,
    fetch_messages,
    read_ordered,
)
from rmqlake.lake.storage import Storage
from rmqlake.lake.tables import REJECTED, columns

log = logging.getLogger(__name__)


def use_task_memory_pool() -> None:
    """Use jemalloc for Arrow buffers in this (worker) process, where the build has it.

    Each write task allocates a few hundred MB of Arrow buffers and frees
    them at the end; pyarrow's default mimalloc pool hands the pages back
    and pays the page faults again in the next task (2-3x slower on the
    first pass in measurements here), jemalloc keeps them.
    """
    global _POOL_SET
    if _POOL_SET:
        return
    _POOL_SET = True
    with suppress(NotImplementedError):
        pa.set_memory_pool(pa.jemalloc_memory_pool())


_POOL_SET = False


# What a parse task returns: one row per split.
PARSED_COUNTS = columns(
    ("split", "int", "the split parsed"),
    ("lines", "bigint", "lines read"),
    ("rejected", "bigint", "lines rejected"),
)


@dataclass(frozen=True)
class SplitTask:
    """One split to parse, with what its task writes: its scratch file and its rejected lines' file."""

    index: int
    file_rank: int
    path: str
    start: int
    end: int
    compressed: bool
    sha256: str
    first_line: int
    hash32: int

    @property
    def split(self) -> Split:
        return Split(self.path, self.start, self.end, self.compressed, self.sha256)


def parse_split(task: SplitTask, *, options: ParseOptions, target: IngestTarget) -> pa.RecordBatch:
    """Parse one split into its three files; return its counts (one ``PARSED_COUNTS`` row).

    * scratch: the messages (``SCRATCH_COLUMNS``), for the write step;
    * narrow: one ``NARROW_SCHEMA`` row per message, for ordering and placing;
    * ``rejected`` staging: the lines that are not messages, with their reasons.

    Spark reads only the narrow files: message bodies never enter the JVM.
    Files appear under their final names when complete, so a retried task
    replaces them and a killed one leaves only hidden temporary files.
    """
    use_task_memory_pool()
    storage = target.storage()
    scratch = AtomicArrowFile(storage, target.scratch_file(task.index))
    narrow: list[pa.RecordBatch] = []
    rejected: list[pa.RecordBatch] = []
    first_line = task.first_line
    try:
        for lines in iter_split_line_blocks(task.split):
            parsed = parse_lines(
                lines,
                source_file=task.path,
                first_line=first_line,
                file_hash32=task.hash32,
                options=options,
            )
            first_line += len(lines)
            is_rejected = pc.is_valid(parsed.column("reject_reason"))
            # Filtering copies every column, bodies included: only when the block has rejected lines.
            valid = (
                parsed.filter(pc.invert(is_rejected))
                if parsed.column("reject_reason").null_count < len(parsed)
                else parsed
            )
            if valid.num_rows:
                first_batch = scratch.batches
                scratch.write(valid.select(SCRATCH_COLUMNS), max_rows=SCRATCH_BATCH_ROWS)
                narrow.append(_narrow_rows(valid, task, first_batch=first_batch))
            if parsed.num_rows != valid.num_rows:
                rejected.append(parsed.filter(is_rejected).select(REJECTED_LINE_COLUMNS))
    except DamagedInput as damage:
        # the lines before the damage are read; the damage itself is one rejected line, where reading stopped
        rejected.append(damaged_input_row(damage, source_line=first_line))
        first_line += 1
    scratch.close()
    if narrow:
        _write_narrow(storage, target.narrow_file(task.index), narrow)
    if rejected:
        _write_rejected(storage, target, task.index, rejected)
    return pa.RecordBatch.from_pydict(
        {
            "split": [task.index],
            "lines": [first_line - task.first_line],
            "rejected": [sum(piece.num_rows for piece in rejected)],
        },
        schema=PARSED_COUNTS.arrow_schema,
    )


REJECTED_LINE_COLUMNS = ["source_file", "source_line", "raw", "reject_reason"]
_RAW_TAIL_CHARS = 4096


def damaged_input_row(damage: DamagedInput, *, source_line: int) -> pa.RecordBatch:
    """The rejected row that stands for the damaged end of a compressed file (its incomplete last line as raw)."""
    reason = (
        f"the gzip data ends early or is damaged ({damage.detail}); the lines before this one were read, "
        "this line and anything after it are lost"
    )
    raw = damage.tail.decode("utf-8", "replace")[:_RAW_TAIL_CHARS]
    return pa.RecordBatch.from_pylist(
        [{"source_file": damage.path, "source_line": source_line, "raw": raw, "reject_reason": reason}],
        schema=pa.schema([PARSED_SCHEMA.field(name) for name in REJECTED_LINE_COLUMNS]),
    )


def _narrow_rows(parsed: pa.RecordBatch, task: SplitTask, *, first_batch: int) -> pa.RecordBatch:
    count = parsed.num_rows
    row = np.arange(count, dtype=np.int32)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(count, task.index, np.int32)),
            pa.array(np.full(count, task.file_rank, np.int32)),
            parsed.column("source_line"),
            parsed.column("store_timestamp"),
            parsed.column("topic"),
            parsed.column("queue_id"),
            parsed.column("sys_flag"),
            parsed.column("total_size"),
            pa.array(first_batch + row // SCRATCH_BATCH_ROWS),
            pa.array(row % SCRATCH_BATCH_ROWS),
        ],
        schema=NARROW_SCHEMA,
    )


def _write_narrow(storage: Storage, relative: str, batches: list[pa.RecordBatch]) -> None:
    """A split's narrow rows sorted by the append order (one file: one ``file_rank``), in row groups whose
    ``store_timestamp`` statistics let each range of the ordering step read only its part."""
    rows = pa.Table.from_batches(batches).sort_by([(name, "ascending") for name in APPEND_ORDER])
    writer = AtomicParquet(
        storage,
        relative,
        row_group_size=NARROW_ROW_GROUP_ROWS,
        compression="none",
        write_statistics=["store_timestamp"],
    )
    writer.write(rows)
    writer.close()


def _write_rejected(storage: Storage, target: IngestTarget, split: int, pieces: list[pa.RecordBatch]) -> None:
    lines = pa.Table.from_batches(pieces)
    count = lines.num_rows
    table = pa.Table.from_arrays(
        [
            pa.array([target.batch_id] * count, pa.string()),
            lines.column("source_file"),
            lines.column("source_line"),
            lines.column("raw"),
            lines.column("reject_reason"),
            pa.array(np.full(count, target.rejected_at_us, np.int64)).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=REJECTED.arrow_schema,
    )
    writer = AtomicParquet(
        storage,
        f"{target.rejected_dir}/part-{split:06d}-{target.run_id}.parquet",
        row_group_size=max(count, 1),
        compression="snappy",
    )
    writer.write(table)
    writer.close()


def order_partition(
    partition: int,
    *,
    bounds: list[int],
    narrow_files: list[str],
    target: IngestTarget,
    queue_counts: Mapping[str, int],
    default_queue_count: int | None,
) -> pa.RecordBatch:
    """Gather one range's narrow rows from every split's file, sort them by the append order, save them as the
    partition's ordered file and return its counts (``stats_of_partition``).

    Each split's file is sorted, so only the row groups whose timestamps
    reach into the range are read.
    """
    low = bounds[partition - 1] if partition > 0 else None
    high = bounds[partition] if partition < len(bounds) else None
    storage = target.storage()
    pieces = []
    for relative in narrow_files:
        narrow = pq.ParquetFile(storage.file_path(relative), filesystem=storage.fs)
        column = narrow.schema_arrow.names.index("store_timestamp")
        groups = []
        for index in range(narrow.metadata.num_row_groups):
            stats = narrow.metadata.row_group(index).column(column).statistics
            if (low is None or stats.max >= low) and (high is None or stats.min < high):
                groups.append(index)
        if not groups:
            continue
        rows = narrow.read_row_groups(groups)
        stamps = rows.column("store_timestamp")
        inside = None
        if low is not None:
            inside = pc.greater_equal(stamps, low)
        if high is not None:
            below = pc.less(stamps, high)
            inside = below if inside is None else pc.and_(inside, below)
        pieces.append(rows if inside is None else rows.filter(inside))
    ordered = (
        pa.concat_tables(pieces).sort_by([(name, "ascending") for name in APPEND_ORDER])
        if pieces
        else NARROW_SCHEMA.empty_table()
    )
    saved = AtomicParquet(
        storage, target.ordered_file(partition), row_group_size=1 << 20, compression="none", write_statistics=False
    )
    saved.write(ordered)
    saved.close()
    return stats_of_partition(
        partition, ordered.to_batches(), queue_counts=queue_counts, default_queue_count=default_queue_count
    )


# What a write task returns: one row per commitlog file written, for the segment aggregates.
WRITTEN = columns(
    ("segment", "string", "the CommitLog file the rows belong to"),
    ("message_count", "bigint", "records in the file written"),
    ("first_offset", "bigint", "physical offset of its first record"),
    ("data_end", "bigint", "end of its last record"),
    ("first_store_timestamp", "bigint", "storeTimestamp of its first record"),
    ("last_store_timestamp", "bigint", "storeTimestamp of its last record"),
    ("file", "string", "the Parquet file written, relative to the commitlog's staging folder"),
)


# Columns worth dictionary pages (few distinct values); trying it on bodies and ids only costs time.
_DICTIONARY_COLUMNS = [
    name
    for name in COMMITLOG_FILE_SCHEMA.names
    if name not in ("body", "properties_bytes", "properties", "msg_id", "uniq_key", "physical_offset", "body_crc")
]


def write_partition(
    batches: Iterable[pa.RecordBatch],
    *,
    partition: int,
    start: PartitionStart,
    queue_counts,
    default_queue_count,
    segment_size: int,
    files: Mapping[int, str],
    target: IngestTarget,
    row_group_bytes: int,
) -> Iterator[pa.RecordBatch]:
    """Place one partition's narrow rows, fetch their messages and write them as commitlog files.

    One file per segment the partition touches, rows in offset order, row
    groups of about ``row_group_bytes``. Yields one ``WRITTEN`` row per
    file for the segment aggregates.
    """
    use_task_memory_pool()
    placer = PartitionPlacer(
        start, queue_counts=queue_counts, default_queue_count=default_queue_count, segment_size=segment_size
    )
    placed = [placer.place(batch) for batch in batches if batch.num_rows]
    if not placed:
        return
    placement = pa.Table.from_batches(placed, schema=PLACEMENT_SCHEMA)
    storage = target.storage()

    def open_scratch(split: int) -> pa.ipc.RecordBatchFileReader:
        return pa.ipc.open_file(storage.open_mapped(target.scratch_file(split)))

    with gc_paused():
        messages = fetch_messages(placement, open_scratch)
        starts, table = commitlog_rows(
            messages, placement, segment_size=segment_size, source_file=files.__getitem__, batch_id=target.batch_id
        )
    del messages
    rows_per_group = max(1, int(row_group_bytes * table.num_rows / max(table.nbytes, 1)))
    cuts = [0, *(np.flatnonzero(np.diff(starts)) + 1).tolist(), table.num_rows]
    offsets = table.column("physical_offset").to_numpy()
    sizes = table.column("total_size").to_numpy()
    stored = table.column("store_timestamp").to_numpy()
    for first, end in itertools.pairwise(cuts):
        segment = segment_file_name(int(starts[first]))
        relative = f"segment={segment}/part-{partition:05d}-{target.run_id}.parquet"
        writer = AtomicParquet(
            storage,
            f"{target.commitlog_dir}/{relative}",
            row_group_size=rows_per_group,
            compression="snappy",
            use_dictionary=_DICTIONARY_COLUMNS,
        )
        writer.write(table.slice(first, end - first))
        writer.close()
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "segment": segment,
                    "message_count": end - first,
                    "first_offset": int(offsets[first]),
                    "data_end": int(offsets[end - 1] + sizes[end - 1]),
                    "first_store_timestamp": int(stored[first]),
                    "last_store_timestamp": int(stored[end - 1]),
                    "file": relative,
                }
            ],
            schema=WRITTEN.arrow_schema,
        )


# -- the Spark jobs that run these tasks (called by the driver) ----------------------------

# Small row groups: a lookup by physical offset reads one row group per message, not a whole file.
COMMITLOG_ROW_GROUP_BYTES = 1024 * 1024


def fingerprint_files(spark, files: list[InputFile]) -> list[Fingerprint]:
    """Every input file's fingerprint, hashed on executors when the files are big."""
    if len(files) == 1 or sum(f.size for f in files) < 64 * 1024 * 1024:
        return [fingerprint(f) for f in files]
    # Hash in parallel, one small result per file; a few files per task, as a Python task costs ~50 ms however
    # little it does.
    context = spark.sparkContext
    rdd = context.parallelize(files, min(len(files), 4 * context.defaultParallelism))
    return sorted(rdd.map(fingerprint).collect(), key=lambda f: f.path)


def plan_partitions(
    spark,
    target: IngestTarget,
    stats: list[StatsRow],
    *,
    partitions: int,
    start_offset: int,
    queue_heads: Mapping[tuple[str, int], int],
    rr_counters: Mapping[str, int],
    options: ParseOptions,
) -> AppendPlan:
    """Per-partition starting values; partitions crossing a segment end are replayed, one task each."""
    segment_size = options.segment_size

    def replay(partition: int, start: int) -> int:
        def end_offset(index: int) -> int:
            batches = read_ordered(target, index)
            sizes = (size for batch in batches for size in batch.column("total_size").to_numpy())
            return replay_end_offset(sizes, start_offset=start, segment_size=segment_size)

        return spark.sparkContext.parallelize([partition], 1).map(end_offset).collect()[0]

    return plan_append(
        stats,
        partitions=partitions,
        start_offset=start_offset,
        queue_heads=queue_heads,
        rr_counters=rr_counters,
        queue_counts=options.queue_counts,
        default_queue_count=options.default_queue_count,
        segment_size=segment_size,
        replay=replay,
    )


def split_tasks(spark, files: list[Fingerprint], *, split_bytes: int) -> list[SplitTask]:
    """The splits to parse, each with its first line number (a counting pass only for files cut in several)."""
    splits = plan_splits(files, split_bytes=split_bytes)
    multi = [s for s in splits if sum(1 for o in splits if o.path == s.path) > 1]
    counts = {}
    if multi:
        counted = spark.sparkContext.parallelize(multi, len(multi)).map(lambda s: (s, count_split_lines(s))).collect()
        counts = dict(counted)
    ranks = {path: rank for rank, path in enumerate(sorted({f.path for f in files}))}
    hashes = {f.path: f.hash32 for f in files}
    running: dict[str, int] = {}
    tasks = []
    for index, split in enumerate(splits):
        first_line = running.get(split.path, 1)
        running[split.path] = first_line + counts.get(split, 0)
        tasks.append(
            SplitTask(
                index=index,
                file_rank=ranks[split.path],
                path=split.path,
                start=split.start,
                end=split.end,
                compressed=split.compressed,
                sha256=split.sha256,
                first_line=first_line,
                hash32=hashes[split.path],
            )
        )
    log.info("reading %d files in %d splits", len(files), len(splits))
    return tasks


def parse_splits(spark, tasks: list[SplitTask], *, options: ParseOptions, target: IngestTarget):
    """One task per split (``parse_split``).

    Returns lines and rejected lines per input file, and the splits that hold messages (they have narrow files).
    """
    # spark.range with as many partitions as splits: exactly one split per task (hashing would pile some up).
    frame = spark.range(0, len(tasks), 1, len(tasks))
    by_index = {task.index: task for task in tasks}

    def parse(batches):
        for batch in batches:
            for index in batch.column("id").to_pylist():
                yield parse_split(by_index[index], options=options, target=target)

    per_file: dict[str, dict] = {}
    with_messages = []
    for row in frame.mapInArrow(parse, PARSED_COUNTS.ddl).collect():
        totals = per_file.setdefault(by_index[row["split"]].path, {"lines": 0, "rejected": 0})
        totals["lines"] += row["lines"]
        totals["rejected"] += row["rejected"]
        if row["lines"] > row["rejected"]:
            with_messages.append(row["split"])
    return per_file, sorted(with_messages)


def order_partitions(spark, target: IngestTarget, splits: list[int], *, partitions: int, options: ParseOptions) -> list:
    """Range bounds from the narrow files' footers, then ``order_partition`` per range."""
    storage = target.storage()
    narrow_files = [target.narrow_file(split) for split in splits]
    footers = [pq.read_metadata(storage.file_path(path), filesystem=storage.fs) for path in narrow_files]
    bounds = append_order_bounds(footers, partitions)
    queue_counts, default_count = options.queue_counts, options.default_queue_count

    def order(partition: int) -> list[StatsRow]:
        counts = order_partition(
            partition,
            bounds=bounds,
            narrow_files=narrow_files,
            target=target,
            queue_counts=queue_counts,
            default_queue_count=default_count,
        )
        return stats_rows(counts)

    return spark.sparkContext.parallelize(range(partitions), partitions).flatMap(order).collect()


def place_and_write(spark, *, partitions: int, plan: AppendPlan, options, segment_size: int, tasks, target):
    """Run ``write_partition`` on every partition, one task each; one row per file written."""
    starts = plan.starts
    files = {task.index: task.path for task in tasks}
    queue_counts, default_count = options.queue_counts, options.default_queue_count

    def write(partition: int) -> list[dict]:
        batches = write_partition(
            read_ordered(target, partition),
            partition=partition,
            start=starts[partition],
            queue_counts=queue_counts,
            default_queue_count=default_count,
            segment_size=segment_size,
            files=files,
            target=target,
            row_group_bytes=COMMITLOG_ROW_GROUP_BYTES,
        )
        return [row for batch in batches for row in batch.to_pylist()]

    return spark.sparkContext.parallelize(range(partitions), partitions).flatMap(write).collect()
