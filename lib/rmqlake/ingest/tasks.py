"""What runs on executors: producer log lines → CommitLog files, placed exactly as a broker appends them.

The broker appends one message at a time; here the same sequential rules are
computed in parallel. Message bodies never cross a shuffle, nor go between
Python and the JVM: only a narrow row per line (its position, order key,
topic, queue, sysFlag and size) is shared.

1. ``parse_split`` (a task per input split): each line → record fields or a
   reject reason (``parse_lines``: column-wise where the block allows, the
   per-line parser for the rest). The split's messages go to a scratch
   Arrow IPC file in the run's staging folder, its narrow rows (sorted, with
   where each message sits in the scratch file) to a small Parquet file, its
   rejected lines to the ``rejected`` table's staging folder.
   With the JVM parser (``ingest.jvm``, ``ingest.parser``), a JVM task per
   plain split reads it and writes the same two files for the lines of the
   common shape, and the lines it leaves to a third; ``parse_remainder``
   parses those in Python into the files of the split's ``remainder`` id.
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

Delay-level and timer messages (``ingest.deliveries``) ride along: a parse
task also writes, after its messages, the delivery record of each one it
re-routed, with a narrow row of kind 1 at the due time; ordering drops the
ones due after the run's clock (they are counted as pending) and tells a
delivery whose message took a round-robin turn which turn that was (the
message's partition and ordinal), so its queue and REAL_QID are known before
that partition is written. Deliveries of earlier runs' messages come from
``earlier_deliveries`` as extra splits.

Transactions (``ingest.transactions``) ride along the same way: a parse task
saves its end lines and its halves; ``resolve_ends`` decides every end and
writes the commit re-puts and op records as extra splits; a commit of a half
of this run takes the half's round-robin turn like a delivery and gets the
half's physical offset when its partition is written.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.accumulators import AccumulatorParam

from rmqlake.formats.segment import segment_file_name
from rmqlake.ingest.deliveries import (
    EARLIER_RUN_RANK,
    EARLIER_RUN_TIMESTAMP,
    SCHEDULED_TOPICS,
    Origins,
    delivery_records,
    pending_rows,
    real_topics,
    scratch_rows_of_commitlog,
)
from rmqlake.ingest.deliveries import narrow_rows as delivery_narrow_rows
from rmqlake.ingest.files import (
    DamagedInput,
    Fingerprint,
    InputFile,
    Split,
    count_split_lines,
    fingerprint,
    is_local_path,
    iter_split_line_blocks,
    local_path,
    plan_splits,
)
from rmqlake.ingest.jvm import JvmSplit, parse_in_jvm, passable
from rmqlake.ingest.lines import ParseOptions
from rmqlake.ingest.parse import PARSED_SCHEMA, gc_paused, parse_lines, parse_numbered_lines
from rmqlake.ingest.plan import (
    APPEND_ORDER,
    DELIVERY_ROW,
    MESSAGE_ROW,
    PLACEMENT_SCHEMA,
    STATS,
    AppendPlan,
    PartitionPlacer,
    PartitionStart,
    StatsRow,
    append_order_bounds,
    commitlog_rows,
    partition_reads,
    plan_append,
    ranks_within,
    stats_of_partition,
    stats_rows,
)
from rmqlake.ingest.scratch import (
    NARROW_SCHEMA,
    SCRATCH_BATCH_ROWS,
    SCRATCH_COLUMNS,
    AtomicArrowFile,
    AtomicParquet,
    IngestTarget,
    ScratchReclaimer,
    fetch_messages,
    open_narrow_file,
    read_ordered,
    value_bytes,
    write_narrow_file,
    write_ordered,
)
from rmqlake.ingest.transactions import (
    DECIDED_END_COLUMNS,
    DECIDED_HALF_COLUMNS,
    END_LINES,
    EVENT_SOURCE_BATCH,
    EVENT_SOURCE_END,
    EVENT_SOURCE_LAKE,
    HALVES,
    decide_ends_columns,
    end_lines,
    end_records_columns,
    halves_of,
)
from rmqlake.lake import pages
from rmqlake.lake.storage import Storage, is_local
from rmqlake.lake.tables import COMMITLOG, REJECTED, columns

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
    ("last_store_timestamp", "bigint", "the latest store time of the split's messages (null: none)"),
    ("origins", "bigint", "delay-level and timer records among them (each has a delivery, due now or later)"),
    ("ends", "bigint", "end lines of transactions (neither messages nor rejected yet: their halves decide)"),
    ("halves", "bigint", "transactional half messages among the messages"),
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
    # The split id under which the lines the JVM parser leaves undecided are parsed (their own scratch, narrow,
    # rejected, ends and halves files); None: the split is parsed in Python only.
    remainder: int | None = None

    @property
    def split(self) -> Split:
        return Split(self.path, self.start, self.end, self.compressed, self.sha256)


def parse_split(task: SplitTask, *, options: ParseOptions, target: IngestTarget) -> pa.RecordBatch:
    """Parse one split into its files; return its counts (one ``PARSED_COUNTS`` row).

    * scratch: the messages (``SCRATCH_COLUMNS``), for the write step;
    * narrow: one ``NARROW_SCHEMA`` row per message, for ordering and placing;
    * ``rejected`` staging: the lines that are not messages, with their reasons;
    * ends and halves: the split's transaction end lines and half messages, when it has any.

    Files appear under their final names when complete, so a retried task
    replaces them and a killed one leaves only hidden temporary files.
    """

    def parsed_blocks() -> Iterator[pa.RecordBatch]:
        first_line = task.first_line
        for lines in iter_split_line_blocks(task.split):
            yield parse_lines(
                lines, source_file=task.path, first_line=first_line, file_hash32=task.hash32, options=options
            )
            first_line += len(lines)

    return _write_split_files(parsed_blocks(), task, split=task.index, options=options, target=target)


def parse_remainder(
    task: SplitTask, *, options: ParseOptions, target: IngestTarget, undecided: bool = True, jvm_halves: bool = False
) -> pa.RecordBatch:
    """Parse the lines of ``task``'s split that the JVM parser left undecided (``IngestParse`` wrote them with
    their line numbers) by the per-line parser, into the files of split ``task.remainder``, as ``parse_split``
    does; return their counts. With ``jvm_halves``, list the halves the JVM parser accepted too (its split's halves
    file); without ``undecided``, there is nothing else to do."""
    storage = target.storage()
    if jvm_halves:
        _write_jvm_halves(task, target)
    if not undecided:
        return pa.RecordBatch.from_pylist(
            [{"split": task.remainder, "lines": 0, "rejected": 0, "origins": 0, "ends": 0, "halves": 0}],
            schema=PARSED_COUNTS.arrow_schema,
        )

    def parsed_blocks() -> Iterator[pa.RecordBatch]:
        with storage.open_mapped(target.undecided_file(task.index)) as source:
            undecided = pa.ipc.open_file(source)
            for index in range(undecided.num_record_batches):
                lines = undecided.get_batch(index)
                yield parse_numbered_lines(
                    lines.column("raw").to_pylist(),
                    lines.column("source_line").to_pylist(),
                    source_file=task.path,
                    file_hash32=task.hash32,
                    options=options,
                )

    return _write_split_files(parsed_blocks(), task, split=task.remainder, options=options, target=target)


# what ``halves_of`` reads of a split's records: not their bodies
_HALF_SOURCE_COLUMNS = ["source_line", "topic", "store_timestamp", "uniq_key", "born_timestamp", "properties"]


def _write_jvm_halves(task: SplitTask, target: IngestTarget) -> None:
    """The halves file of the messages the JVM parser accepted in ``task``'s split: its scratch file's records on
    the half topic (the JVM writes batches of ``SCRATCH_BATCH_ROWS``, the positions ``halves_of`` gives)."""
    storage = target.storage()
    halves = []
    with storage.open_mapped(target.scratch_file(task.index)) as source:
        reader = pa.ipc.open_file(source)
        for index in range(reader.num_record_batches):
            batch = reader.get_batch(index)
            if batch.num_rows > SCRATCH_BATCH_ROWS:
                raise AssertionError(f"a JVM scratch batch of {batch.num_rows} rows; halves are found by position")
            records = pa.Table.from_batches([batch.select(_HALF_SOURCE_COLUMNS)])
            found = halves_of(records, split=task.index, file_rank=task.file_rank, first_batch=index)
            if found is not None:
                halves.append(found)
    _write_task_rows(storage, target.halves_file(task.index), halves)


def _write_task_rows(storage: Storage, relative: str, tables: list[pa.Table]) -> None:
    """Small rows a parse task leaves for the ends of transactions (``END_LINES``, ``HALVES``): Parquet, which
    Spark reads; none, no file."""
    if tables:
        writer = AtomicParquet(storage, relative, row_group_size=1 << 20, compression="none")
        writer.write(pa.concat_tables(tables))
        writer.close()


def _write_split_files(
    blocks: Iterator[pa.RecordBatch], task: SplitTask, *, split: int, options: ParseOptions, target: IngestTarget
) -> pa.RecordBatch:
    """The files of split id ``split`` from its parsed lines (``PARSED_SCHEMA`` batches in line order), and its
    counts. Every line is one parsed row, so the lines read are the rows seen."""
    use_task_memory_pool()
    storage = target.storage()
    scratch = AtomicArrowFile(storage, target.scratch_file(split))
    narrow: list[pa.RecordBatch] = []
    rejected: list[pa.RecordBatch] = []
    origins: list[tuple[pa.Table, list[int], list[int]]] = []  # re-routed records, their due times and levels
    ends: list[pa.Table] = []  # end lines
    halves: list[pa.Table] = []  # half messages
    last_stored = None
    lines_read = 0
    try:
        for parsed in blocks:
            lines_read += parsed.num_rows
            is_rejected = pc.is_valid(parsed.column("reject_reason"))
            is_end = pc.is_valid(parsed.column("end_transaction"))
            not_message = pc.or_(is_rejected, is_end)
            # Filtering copies every column, bodies included: only when the block has other lines than messages.
            valid = parsed.filter(pc.invert(not_message)) if pc.any(not_message).as_py() else parsed
            if parsed.column("end_transaction").null_count < len(parsed):
                ends.append(end_lines(parsed.filter(is_end), split=split, file_rank=task.file_rank))
                latest = pc.max(ends[-1].column("store_timestamp")).as_py()  # an end appends at its time
                last_stored = latest if last_stored is None else max(last_stored, latest)
            if valid.num_rows:
                first_batch = scratch.batches
                records = pa.Table.from_batches([valid.select(SCRATCH_COLUMNS)])
                found = Origins(records, rules=options.schedule)
                scratch.write(records, max_rows=SCRATCH_BATCH_ROWS)
                narrow.append(_narrow_rows(valid, split, task.file_rank, first_batch=first_batch, origins=found))
                if found.rows:
                    origins.append((records.take(pa.array(found.rows)), found.due, found.level))
                found_halves = halves_of(records, split=split, file_rank=task.file_rank, first_batch=first_batch)
                if found_halves is not None:
                    halves.append(found_halves)
                latest = pc.max(valid.column("store_timestamp")).as_py()
                last_stored = latest if last_stored is None else max(last_stored, latest)
            if parsed.column("reject_reason").null_count < len(parsed):
                rejected.append(parsed.filter(is_rejected).select(REJECTED_LINE_COLUMNS))
    except DamagedInput as damage:
        # the lines before the damage are read; the damage itself is one rejected line, where reading stopped
        rejected.append(damaged_input_row(damage, source_line=task.first_line + lines_read))
        lines_read += 1
    for records, due, levels in origins:
        # the deliveries they would have, after the split's messages: ordering drops those not due in this run
        deliveries = delivery_records(records, due, rules=options.schedule)
        first_batch = scratch.batches
        scratch.write(deliveries, max_rows=SCRATCH_BATCH_ROWS)
        narrow.append(
            delivery_narrow_rows(
                deliveries,
                split=split,
                first_batch=first_batch,
                file_rank=task.file_rank,
                origin_timestamps=records.column("store_timestamp").to_pylist(),
                levels=levels,
            )
        )
    scratch.close()
    if narrow:
        _write_narrow(storage, target.narrow_file(split), narrow)
    if rejected:
        _write_rejected(storage, target, split, rejected)
    _write_task_rows(storage, target.ends_file(split), ends)
    _write_task_rows(storage, target.halves_file(split), halves)
    return pa.RecordBatch.from_pydict(
        {
            "split": [split],
            "lines": [lines_read],
            "rejected": [sum(piece.num_rows for piece in rejected)],
            "last_store_timestamp": [last_stored],
            "origins": [sum(len(due) for _, due, _ in origins)],
            "ends": [sum(piece.num_rows for piece in ends)],
            "halves": [sum(piece.num_rows for piece in halves)],
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


def _narrow_rows(
    parsed: pa.RecordBatch, split: int, file_rank: int, *, first_batch: int, origins: Origins
) -> pa.RecordBatch:
    count = parsed.num_rows
    row = np.arange(count, dtype=np.int32)
    # the topic whose round-robin turn a message takes: its own without a queue, a re-routed one's real topic
    turn_topics = pc.if_else(parsed.column("queue_id").is_null(), parsed.column("topic"), pa.scalar(None, pa.string()))
    due = np.zeros(count, np.int64)
    levels = np.zeros(count, np.int32)
    is_origin = np.zeros(count, bool)
    if origins.rows:
        at = np.array(origins.rows)
        due[at], levels[at], is_origin[at] = origins.due, origins.level, True
    if parsed.column("real_queue_round_robin").null_count < count:
        # a re-routed message (delay level, timer, half) sent without a queue takes a turn of its real topic
        round_robin = pc.fill_null(parsed.column("real_queue_round_robin"), False).to_numpy(zero_copy_only=False)
        if round_robin.any():
            turns = turn_topics.to_pylist()
            picked = np.flatnonzero(round_robin)
            names = real_topics(pa.Table.from_batches([parsed]).take(pa.array(picked)))
            for position, name in zip(picked.tolist(), names, strict=True):
                turns[position] = name
            turn_topics = pa.array(turns, pa.string())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(count, split, np.int32)),
            pa.array(np.full(count, file_rank, np.int32)),
            parsed.column("source_line"),
            parsed.column("store_timestamp"),
            parsed.column("topic"),
            parsed.column("queue_id"),
            parsed.column("sys_flag"),
            parsed.column("total_size"),
            pa.array(first_batch + row // SCRATCH_BATCH_ROWS),
            pa.array(row % SCRATCH_BATCH_ROWS),
            pa.array(np.zeros(count, np.int8)),
            parsed.column("store_timestamp"),
            turn_topics,
            pa.array(due, pa.int64(), mask=~is_origin),
            pa.array(levels, pa.int32(), mask=~is_origin),
            pa.nulls(count, pa.int32()),
            pa.nulls(count, pa.int64()),
            pa.nulls(count, pa.int64()),  # an input message is made from nothing of the run (parent_*)
            pa.nulls(count, pa.int32()),
            pa.nulls(count, pa.int64()),
        ],
        schema=NARROW_SCHEMA,
    )


def _write_narrow(storage: Storage, relative: str, batches: list[pa.RecordBatch]) -> None:
    """A split's narrow rows sorted by the append order (one file: one ``file_rank``), in batches whose store-time
    spans, listed in the footer, let each range of the ordering step read only its part."""
    rows = pa.Table.from_batches(batches, schema=NARROW_SCHEMA).sort_by([(name, "ascending") for name in APPEND_ORDER])
    write_narrow_file(storage, relative, rows)


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
    clock: int,
) -> pa.RecordBatch:
    """Gather one range's narrow rows from every split's file, sort them by the append order, save them as the
    partition's ordered file and return its counts (``stats_of_partition``).

    Each split's file is sorted, so only the row groups whose timestamps
    reach into the range are read. Deliveries due after ``clock`` are not
    appended by this run: they are counted as pending instead. A delivery
    of a message sent without a queue learns which round-robin turn its
    origin took (the origin's partition and ordinal there).
    """
    gathered = _gather_range(partition, bounds=bounds, narrow_files=narrow_files, target=target)
    kind = gathered.column("kind").to_numpy(zero_copy_only=False)
    stamps = gathered.column("store_timestamp").to_numpy(zero_copy_only=False)
    later = (kind == DELIVERY_ROW) & (stamps > clock)
    pending = gathered.filter(pa.array(later)) if later.any() else None
    if pending is not None:
        gathered = gathered.filter(pa.array(~later))
    ordered = gathered.sort_by([(name, "ascending") for name in APPEND_ORDER])
    ordered = _resolve_origin_turns(
        ordered, partition=partition, bounds=bounds, narrow_files=narrow_files, target=target
    )
    write_ordered(target, partition, ordered)
    counts = stats_of_partition(
        partition, ordered.to_batches(), queue_counts=queue_counts, default_queue_count=default_queue_count
    )
    if pending is None:
        return counts
    groups = pending_rows(
        pending.column("topic").to_pylist(),
        pending.column("level").to_pylist(),
        pending.column("store_timestamp").to_pylist(),
        [None] * pending.num_rows,
    )
    rows = [(partition, kind, g["topic"], g["level"], None, g[key]) for g in groups
            for kind, key in (("pending", "count"), ("pending_due", "next_due"))]  # fmt: skip
    extra = pa.RecordBatch.from_arrays(
        [pa.array([row[i] for row in rows], field.type) for i, field in enumerate(STATS.arrow_schema)],
        schema=STATS.arrow_schema,
    )
    return pa.Table.from_batches([counts, extra]).combine_chunks().to_batches()[0]


def _gather_range(partition: int, *, bounds: list[int], narrow_files: list[str], target: IngestTarget) -> pa.Table:
    """The narrow rows of partition ``partition``'s store-time range, from every split's file, unsorted."""
    low = bounds[partition - 1] if partition > 0 else None
    high = bounds[partition] if partition < len(bounds) else None
    storage = target.storage()
    pieces = []
    for relative in narrow_files:
        narrow, spans = open_narrow_file(storage, relative)
        for index, span in enumerate(spans):
            if (low is not None and span.last < low) or (high is not None and span.first >= high):
                continue
            rows = narrow.get_batch(index)
            stamps = rows.column("store_timestamp")
            inside = None
            if low is not None and span.first < low:
                inside = pc.greater_equal(stamps, low)
            if high is not None and span.last >= high:
                below = pc.less(stamps, high)
                inside = below if inside is None else pc.and_(inside, below)
            pieces.append(rows if inside is None else rows.filter(inside))
    return pa.Table.from_batches(pieces, schema=NARROW_SCHEMA)


def _resolve_origin_turns(
    ordered: pa.Table, *, partition: int, bounds: list[int], narrow_files: list[str], target: IngestTarget
) -> pa.Table:
    """Fill ``origin_partition``/``origin_turn`` of the deliveries and commits whose parent (the delay-level or
    timer record, the half) was sent without a queue.

    The parent took a round-robin turn of its real topic in its own partition (found from its store time and the
    bounds); its ordinal among that partition's turns of the topic, with the partition's starting counter the
    plan computes, gives the queue, so the row can be placed before the parent's partition is written.
    """
    waiting = np.flatnonzero(
        pc.and_(ordered.column("parent_timestamp").is_valid(), ordered.column("queue_id").is_null()).to_numpy(
            zero_copy_only=False
        )
    )
    if not len(waiting):
        return ordered
    origin_stamps = ordered.column("parent_timestamp").to_numpy(zero_copy_only=False)[waiting]
    origin_partitions = parent_partitions(origin_stamps, bounds)
    ranks = ordered.column("parent_rank").to_numpy(zero_copy_only=False)[waiting]
    lines = ordered.column("parent_line").to_numpy(zero_copy_only=False)[waiting]
    turns = np.full(len(ordered), -1, dtype=np.int64)
    for origin in np.unique(origin_partitions).tolist():
        if origin == partition:
            rows = ordered
        else:
            rows = _gather_range(origin, bounds=bounds, narrow_files=narrow_files, target=target)
            rows = rows.filter(pc.equal(rows.column("kind"), MESSAGE_ROW)).sort_by(
                [(name, "ascending") for name in APPEND_ORDER]
            )
        ordinal = _turn_ordinals(rows)
        key = {(int(r), int(n)): int(o) for r, n, o in zip(
            rows.column("file_rank").to_numpy(zero_copy_only=False)[ordinal >= 0],
            rows.column("source_line").to_numpy(zero_copy_only=False)[ordinal >= 0],
            ordinal[ordinal >= 0],
            strict=True,
        )}  # fmt: skip
        for index in np.flatnonzero(origin_partitions == origin).tolist():
            found = key.get((int(ranks[index]), int(lines[index])))
            if found is None:
                raise RuntimeError(
                    f"the origin of a delivery (line {lines[index]}, file rank {ranks[index]}) "
                    f"is not in partition {origin}"
                )
            turns[waiting[index]] = found
    partitions = np.full(len(ordered), -1, dtype=np.int64)
    partitions[waiting] = origin_partitions
    has = turns >= 0
    ordered = ordered.set_column(
        ordered.schema.get_field_index("origin_partition"),
        "origin_partition",
        pa.array(partitions, pa.int32(), mask=~has),
    )
    return ordered.set_column(
        ordered.schema.get_field_index("origin_turn"), "origin_turn", pa.array(turns, pa.int64(), mask=~has)
    )


def parent_partitions(stamps: np.ndarray, bounds: list[int]) -> np.ndarray:
    """The partition holding each message stored at ``stamps`` (the bounds cut by store time)."""
    return np.searchsorted(np.array(bounds, dtype=np.int64), stamps, side="right")


def _turn_ordinals(rows: pa.Table) -> np.ndarray:
    """Each row's 0-based ordinal among the rows taking a turn of the same topic, in row order (-1: no turn)."""
    topics = rows.column("rr_topic")
    ordinals = np.full(len(rows), -1, dtype=np.int64)
    taking = np.flatnonzero(topics.is_valid().to_numpy(zero_copy_only=False))
    if len(taking):
        codes = (
            pc.dictionary_encode(topics.take(pa.array(taking))).combine_chunks().indices.to_numpy(zero_copy_only=False)
        )
        ordinals[taking] = ranks_within(codes.astype(np.int64))
    return ordinals


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


# Integer and timestamp columns stored as deltas (DELTA_BINARY_PACKED, then snappy): offsets, queue offsets and
# times grow by small steps, flags and magic codes hardly change. Measured on a commitlog file: as quick to write,
# ~5 % smaller with 1 KiB bodies (~13 % with 100-byte ones), 3-7 % quicker to read whole and 9-19 % for a scan of
# topic, keys, sys_flag and offsets. Not the body CRC: its bits are random, its deltas no smaller than its values.
_DELTA_COLUMNS = [
    field.name
    for field in COMMITLOG.arrow_schema
    if (pa.types.is_integer(field.type) or pa.types.is_timestamp(field.type))
    and field.name not in ("body_crc", *COMMITLOG.partition_by)
]
# The commitlog's Parquet options: pages of the same rows in every column, an offset index and no dictionary
# pages, so a key lookup reads single pages (``lake.pages``). Dictionaries on the few-valued columns (topics,
# hosts, flags) saved little once snappy had compressed their plain pages, and a page read cannot use them.
# No Arrow schema in the footer: the write task's bodies are ``binary_view`` (gathered without a copy), which the
# footer would name; without it every reader, pyarrow too, reads the Parquet types back as the table's schema.
COMMITLOG_WRITE_OPTIONS = {
    "compression": "snappy",
    "column_encoding": dict.fromkeys(_DELTA_COLUMNS, "DELTA_BINARY_PACKED"),
    "store_schema": False,
    **pages.WRITE_OPTIONS,
}


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
    origin_counters: Mapping[int, Mapping[str, int]] | None = None,
    clock: int | None = None,
    bounds: list[int] | None = None,
    starts: Mapping[int, PartitionStart] | None = None,
    scratch_splits: frozenset[int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Place one partition's narrow rows, fetch their messages and write them as commitlog files.

    One file per segment the partition touches, rows in offset order, row
    groups of about ``row_group_bytes``. Yields one ``WRITTEN`` row per
    file for the segment aggregates, and ``PENDING_DELAYS`` rows: per delay
    level, the lowest queue offset of a record written here whose delivery
    is due after ``clock``. A commit of a half of this run gets the half's physical offset from the half's
    partition (``bounds`` say which; one before this one is replayed from its start in ``starts``).
    ``scratch_splits``: the splits whose scratch files the driver keeps until this partition has finished; a
    row of another split is an error (its file may be gone).
    """
    use_task_memory_pool()
    placer = PartitionPlacer(
        start,
        queue_counts=queue_counts,
        default_queue_count=default_queue_count,
        segment_size=segment_size,
        origin_counters=origin_counters,
    )
    batches = [batch for batch in batches if batch.num_rows]
    placed = [placer.place(batch) for batch in batches]
    if not placed:
        return
    placement = pa.Table.from_batches(placed, schema=PLACEMENT_SCHEMA)
    if scratch_splits is not None:
        unexpected = set(np.unique(placement.column("split").to_numpy()).tolist()) - scratch_splits
        if unexpected:
            raise RuntimeError(
                f"partition {partition} holds rows of splits {sorted(unexpected)}, whose scratch files the driver did "
                "not count among its reads"
            )
    if clock is not None:
        yield from _pending_delays(pa.Table.from_batches(batches), placement, clock=clock)
    storage = target.storage()

    def open_scratch(split: int) -> pa.ipc.RecordBatchFileReader:
        return pa.ipc.open_file(storage.open_mapped(target.scratch_file(split)))

    with gc_paused():
        messages = fetch_messages(placement, open_scratch)
        narrow = pa.Table.from_batches(batches)
        if pc.any(
            pc.and_(pc.equal(narrow.column("kind"), MESSAGE_ROW), narrow.column("parent_timestamp").is_valid())
        ).as_py():
            messages = _with_half_offsets(
                messages,
                narrow,
                placement,
                partition=partition,
                bounds=bounds,
                replay=lambda other: _replayed(
                    other,
                    start=starts[other],
                    target=target,
                    queue_counts=queue_counts,
                    default_queue_count=default_queue_count,
                    segment_size=segment_size,
                    origin_counters=origin_counters,
                ),
            )
        segment_starts, table = commitlog_rows(
            messages, placement, segment_size=segment_size, source_file=files.__getitem__, batch_id=target.batch_id
        )
    del messages
    starts = segment_starts
    rows_per_group = max(1, int(row_group_bytes * table.num_rows / max(value_bytes(table), 1)))
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
            write_behind=True,
            **COMMITLOG_WRITE_OPTIONS,
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


def _replayed(partition: int, *, start: PartitionStart, target: IngestTarget, **placer_options) -> tuple:
    """Another partition's narrow rows and their placement, replayed from its start."""
    placer = PartitionPlacer(start, **placer_options)
    batches = [batch for batch in read_ordered(target, partition) if batch.num_rows]
    placed = [placer.place(batch) for batch in batches]
    return pa.Table.from_batches(batches, schema=NARROW_SCHEMA), pa.Table.from_batches(placed, schema=PLACEMENT_SCHEMA)


def _with_half_offsets(messages: pa.Table, narrow: pa.Table, placement: pa.Table, *, partition: int, bounds, replay):
    """``prepared_transaction_offset`` of the commits of this run's halves: the half's physical offset, found in
    its partition (this one, or another ``replay(partition)`` places again)."""
    is_commit = pc.and_(pc.equal(narrow.column("kind"), MESSAGE_ROW), narrow.column("parent_timestamp").is_valid())
    commits = np.flatnonzero(is_commit.to_numpy(zero_copy_only=False))
    stamps = narrow.column("parent_timestamp").to_numpy(zero_copy_only=False)[commits]
    ranks = narrow.column("parent_rank").to_numpy(zero_copy_only=False)[commits]
    lines = narrow.column("parent_line").to_numpy(zero_copy_only=False)[commits]
    homes = parent_partitions(stamps, bounds or [])
    offsets = messages.column("prepared_transaction_offset").to_numpy().copy()
    for home in np.unique(homes).tolist():
        rows, placed = (narrow, placement) if home == partition else replay(home)
        is_message = rows.column("kind").to_numpy(zero_copy_only=False) == MESSAGE_ROW
        where = {
            (rank, line): offset
            for rank, line, offset, message in zip(
                rows.column("file_rank").to_pylist(),
                rows.column("source_line").to_pylist(),
                placed.column("physical_offset").to_pylist(),
                is_message.tolist(),
                strict=True,
            )
            if message
        }
        for index in np.flatnonzero(homes == home).tolist():
            key = (int(ranks[index]), int(lines[index]))
            if key not in where:
                raise RuntimeError(
                    f"the half of a commit (line {key[1]}, file rank {key[0]}) is not in partition {home}"
                )
            offsets[commits[index]] = where[key]
    column = messages.schema.get_field_index("prepared_transaction_offset")
    return messages.set_column(column, "prepared_transaction_offset", pa.array(offsets, pa.int64()))


# What a write task also returns: where each delay level's next delivery is, among the records it wrote.
PENDING_DELAYS = columns(
    ("level", "int", "the delay level"),
    ("queue_offset", "bigint", "the lowest SCHEDULE_TOPIC_XXXX queue offset written whose delivery is pending"),
)


def _pending_delays(narrow: pa.Table, placement: pa.Table, *, clock: int) -> Iterator[pa.RecordBatch]:
    kind = narrow.column("kind").to_numpy(zero_copy_only=False)
    due = narrow.column("due").fill_null(-1).to_numpy(zero_copy_only=False)
    levels = narrow.column("level").fill_null(0).to_numpy(zero_copy_only=False)
    pending = (kind == MESSAGE_ROW) & (due > clock) & (levels > 0)
    if not pending.any():
        return
    offsets = placement.column("queue_offset").to_numpy()[pending]
    rows = []
    for level in np.unique(levels[pending]).tolist():
        rows.append({"level": level, "queue_offset": int(offsets[levels[pending] == level].min())})
    yield pa.RecordBatch.from_pylist(rows, schema=PENDING_DELAYS.arrow_schema)


# -- the Spark jobs that run these tasks (called by the driver) ----------------------------

# Row groups of ~4 MiB (~2,500 rows of 1 KiB messages). A warm lookup reads single pages whatever their size; a
# process's first lookup reads the row groups holding its offsets (rmqlake.lake.lookup), ~14 ms more than with
# 1 MiB ones on a 1 M-message lake (78 -> 92 ms median, the process's ~0.6 s of imports aside). pyarrow's writer
# costs ~50 us per column chunk whatever it holds: with 1 MiB row groups that was a fifth of the commitlog's
# write in ingest and import-store, whose write stage is 20-28 % shorter with these.
COMMITLOG_ROW_GROUP_BYTES = 4 * 1024 * 1024


# Inputs smaller than this are hashed by the driver, one file after another.
HASHED_IN_PARALLEL_FROM = 64 * 1024 * 1024


def fingerprint_files(
    spark, files: list[InputFile], *, progress_seconds: float = 0, in_threads: bool | None = None
) -> list[Fingerprint]:
    """Every input file's fingerprint, hashed on executors when the files are big (then in the order of their
    paths).

    A local master's executors are this machine's cores: the files are hashed there by threads of the driver
    instead (``hashlib`` lets go of the GIL while it hashes), with a line every ``progress_seconds`` (0: none).
    ``in_threads``: that choice made by the caller (``None``: by the master).
    """
    if len(files) == 1 or sum(f.size for f in files) < HASHED_IN_PARALLEL_FROM:
        return [fingerprint(f) for f in files]
    context = spark.sparkContext
    if in_threads is None:
        in_threads = context.master.startswith("local")
    if in_threads:
        # A Spark job of Python tasks cost 0.8-1.2 s to hash 1.2 GB in 24 files on 2 cores here, two threads 0.64 s.
        return _fingerprint_in_threads(files, threads=context.defaultParallelism, progress_seconds=progress_seconds)
    # Hash in parallel, one small result per file; a few files per task, as a Python task costs ~50 ms however
    # little it does.
    rdd = context.parallelize(files, min(len(files), 4 * context.defaultParallelism))
    return sorted(rdd.map(fingerprint).collect(), key=lambda f: f.path)


def _fingerprint_in_threads(files: list[InputFile], *, threads: int, progress_seconds: float) -> list[Fingerprint]:
    total = sum(f.size for f in files)
    started = last_line = time.monotonic()
    done_bytes = 0
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="rmqlake-hash") as pool:
        futures = {pool.submit(fingerprint, f): f for f in files}
        for future in as_completed(futures):
            done_bytes += futures[future].size
            now = time.monotonic()
            if progress_seconds and now - last_line >= progress_seconds and done_bytes < total:
                last_line = now
                log.info("hash input files: %s of %s bytes, %.0f MB/s", f"{done_bytes:,}", f"{total:,}",
                         done_bytes / 1e6 / max(now - started, 1e-9))  # fmt: skip
        return sorted((future.result() for future in futures), key=lambda f: f.path)


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

    def replay(partition: int, start: PartitionStart, origin_counters) -> int:
        queue_counts, default_count = options.queue_counts, options.default_queue_count

        def end_offset(index: int) -> int:
            placer = PartitionPlacer(
                start,
                queue_counts=queue_counts,
                default_queue_count=default_count,
                segment_size=segment_size,
                origin_counters=origin_counters,
            )
            for batch in read_ordered(target, index):
                if batch.num_rows:
                    placer.place(batch)
            return placer.position

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
                remainder=len(splits) + index,
            )
        )
    log.info("reading %d files in %d splits", len(files), len(splits))
    return tasks


@dataclass(frozen=True)
class ParsedSplits:
    """What the parse tasks found: per input file its lines, rejected lines and end lines; the split ids with
    messages (they have narrow files), with end lines, with halves; the latest store time (``None``: none); how
    many lines the JVM parser took and left; ``split_ids``: every id the parse used is below it."""

    per_file: dict[str, dict]
    with_messages: list[int]
    with_ends: list[int]
    with_halves: list[int]
    last_stored: int | None
    split_ids: int
    jvm_accepted: int = 0
    jvm_undecided: int = 0

    @property
    def ends(self) -> int:
        return sum(totals["ends"] for totals in self.per_file.values())


PARSE_TASKS_PER_CORE = 3  # enough tasks that a core finishing early takes another group


def split_groups(tasks: list, *, groups: int, weight: Callable | None = None) -> list[list]:
    """``tasks`` in at most ``groups`` groups of about equal ``weight`` (default: a split's bytes; largest first to
    the lightest group), each in ``index`` order; a task is never cut. Deterministic."""
    weight = weight or (lambda t: t.end - t.start)
    count = max(1, min(groups, len(tasks)))
    loads = [(0, group) for group in range(count)]
    members: list[list] = [[] for _ in range(count)]
    for task in sorted(tasks, key=lambda t: (-weight(t), t.index)):
        load, group = heapq.heappop(loads)
        members[group].append(task)
        heapq.heappush(loads, (load + weight(task), group))
    return [sorted(group, key=lambda t: t.index) for group in members if group]


@dataclass(frozen=True)
class PythonParse:
    """A Python parse task's share of a split: all its lines, or (``remainder``) those the JVM left."""

    task: SplitTask
    remainder: bool
    weight: int  # bytes to read: the split's, or its undecided lines' file
    undecided: bool = True  # a remainder: the JVM left lines
    jvm_halves: bool = False  # a remainder: the JVM accepted halves, whose file the task writes

    @property
    def index(self) -> int:
        return self.task.remainder if self.remainder else self.task.index

    def run(self, *, options: ParseOptions, target: IngestTarget) -> pa.RecordBatch:
        if self.remainder:
            return parse_remainder(
                self.task, options=options, target=target, undecided=self.undecided, jvm_halves=self.jvm_halves
            )
        return parse_split(self.task, options=options, target=target)


def jvm_can_parse(task: SplitTask, target: IngestTarget) -> bool:
    """A split the JVM parse job takes: plain text (gzip stays in Python), its file and the lake on a local disk,
    their paths passable to the job."""
    return (
        task.remainder is not None
        and not task.compressed
        and is_local_path(task.path)
        and is_local(target.lake_root)
        and passable(local_path(task.path))
        and passable(target.storage().file_path(target.scratch_dir))
    )


def parse_splits(
    spark, tasks: list[SplitTask], *, options: ParseOptions, target: IngestTarget, jvm: bool = False
) -> ParsedSplits:
    """Parse every split: with ``jvm``, the JVM parse job (``ingest.jvm``) takes the splits it can
    (``jvm_can_parse``) and Python parses the lines it leaves (``parse_remainder``); the other splits go
    through ``parse_split``, the reference. Python parse tasks run a few per core, each parsing a group.

    A Python task costs ~50 ms of a core before it does anything; with one task per split, the many files of
    a batch (an hour of every producer) paid it per file. The groups hold about equal bytes (``split_groups``).
    """
    in_jvm = [task for task in tasks if jvm and jvm_can_parse(task, target)]
    storage = target.storage()
    jvm_counts = parse_in_jvm(
        spark,
        [
            JvmSplit(
                split=task.index,
                file_rank=task.file_rank,
                path=local_path(task.path),
                start=task.start,
                end=task.end,
                first_line=task.first_line,
                hash32=task.hash32,
                scratch=storage.file_path(target.scratch_file(task.index)),
                narrow=storage.file_path(target.narrow_file(task.index)),
                undecided=storage.file_path(target.undecided_file(task.index)),
            )
            for task in in_jvm
        ],
        options=options,
    )
    by_index = {task.index: task for task in tasks}
    jvm_indexes = {task.index for task in in_jvm}  # a list lookup per task would be quadratic in the files
    work = [PythonParse(task, False, task.end - task.start) for task in tasks if task.index not in jvm_indexes]
    rows = []
    for counts in jvm_counts:
        if counts.gave_up is not None:
            task = by_index[counts.split]
            reason = counts.gave_up
            log.warning("the JVM parser left %s [%d, %d) to Python: %s", task.path, task.start, task.end, reason)
            work.append(PythonParse(task, False, task.end - task.start))
            continue
        rows.append(
            {"split": counts.split, "lines": counts.accepted, "rejected": 0, "ends": 0, "halves": counts.halves,
             "origins": 0, "last_store_timestamp": counts.last_store_timestamp}
        )  # fmt: skip
        if counts.undecided or counts.halves:
            task = by_index[counts.split]
            # listing the JVM's halves reads a few narrow columns of its scratch file: little next to parsing lines
            undecided = storage.file_path(target.undecided_file(task.index))
            size = storage.fs.get_file_info(undecided).size if counts.undecided else 0
            work.append(PythonParse(task, True, size, undecided=counts.undecided > 0, jvm_halves=counts.halves > 0))
    if work:
        groups = split_groups(work, groups=PARSE_TASKS_PER_CORE * spark.sparkContext.defaultParallelism,
                              weight=lambda w: w.weight)  # fmt: skip
        # spark.range with as many partitions as groups: exactly one group per task (hashing would pile some up).
        frame = spark.range(0, len(groups), 1, len(groups))

        def parse(batches):
            for batch in batches:
                for group in batch.column("id").to_pylist():
                    for share in groups[group]:
                        yield share.run(options=options, target=target)

        rows += frame.mapInArrow(parse, PARSED_COUNTS.ddl).collect()
    by_index.update({task.remainder: task for task in in_jvm})
    per_file: dict[str, dict] = {}
    with_messages, with_ends, with_halves = [], [], []
    last_stored = None
    for row in rows:
        totals = per_file.setdefault(
            by_index[row["split"]].path, {"lines": 0, "rejected": 0, "origins": 0, "ends": 0, "halves": 0}
        )
        for name in totals:
            totals[name] += row[name]
        if row["lines"] > row["rejected"] + row["ends"]:
            with_messages.append(row["split"])
        if row["ends"]:
            with_ends.append(row["split"])
        if row["halves"]:
            with_halves.append(row["split"])
        if row["last_store_timestamp"] is not None:
            last_stored = max(last_stored or row["last_store_timestamp"], row["last_store_timestamp"])
    return ParsedSplits(
        per_file,
        sorted(with_messages),
        sorted(with_ends),
        sorted(with_halves),
        last_stored,
        split_ids=2 * len(tasks),
        jvm_accepted=sum(c.accepted for c in jvm_counts),
        jvm_undecided=sum(c.undecided for c in jvm_counts),
    )


@dataclass(frozen=True)
class AppendOrder:
    """What ordering a run's narrow rows leaves for planning and writing them."""

    splits: tuple[int, ...]  # the splits ordered (their narrow files are not read again)
    stats: list[StatsRow]  # the partitions' counts
    bounds: list[int]  # the partitions' store-time ranges (``append_order_bounds``)
    reads: dict[int, frozenset[int]]  # per partition, the splits whose scratch files its write task may read


def order_partitions(
    spark, target: IngestTarget, splits: list[int], *, partitions: int, options: ParseOptions, clock: int
) -> AppendOrder:
    """Range bounds from the narrow files' footers (their batches' store-time spans), then ``order_partition``
    per range."""
    storage = target.storage()
    narrow_files = [target.narrow_file(split) for split in splits]
    spans = {split: open_narrow_file(storage, path)[1] for split, path in zip(splits, narrow_files, strict=True)}
    bounds = append_order_bounds((span for found in spans.values() for span in found), partitions)
    queue_counts, default_count = options.queue_counts, options.default_queue_count

    def order(partition: int) -> list[StatsRow]:
        counts = order_partition(
            partition,
            bounds=bounds,
            narrow_files=narrow_files,
            target=target,
            queue_counts=queue_counts,
            default_queue_count=default_count,
            clock=clock,
        )
        return stats_rows(counts)

    stats = spark.sparkContext.parallelize(range(partitions), partitions).flatMap(order).collect()
    return AppendOrder(splits=tuple(splits), stats=stats, bounds=bounds, reads=partition_reads(spans, bounds))


class _FinishedPartitions(AccumulatorParam):
    """An accumulator of the partitions whose tasks have finished: the driver learns of each as it finishes."""

    def zero(self, value: frozenset[int]) -> frozenset[int]:
        return frozenset()

    def addInPlace(self, value1: frozenset[int], value2: frozenset[int]) -> frozenset[int]:
        return value1 | value2


def place_and_write(
    spark,
    *,
    partitions: int,
    plan: AppendPlan,
    options,
    segment_size: int,
    files: Mapping[int, str],
    target,
    clock,
    order: AppendOrder,
):
    """Run ``write_partition`` on every partition, one task each.

    Meanwhile the narrow files are deleted, and each split's scratch file as soon as every partition that may
    read it (``order.reads``) has finished (``ScratchReclaimer``).

    Returns one ``WRITTEN`` row per file written, and the ``PENDING_DELAYS`` rows.
    """
    starts = plan.starts
    origin_counters = {partition: start.rr_counters for partition, start in starts.items()}
    queue_counts, default_count = options.queue_counts, options.default_queue_count
    bounds, reads = order.bounds, order.reads
    finished = spark.sparkContext.accumulator(frozenset(), _FinishedPartitions())

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
            origin_counters=origin_counters,
            clock=clock,
            bounds=bounds,
            starts=starts,
            scratch_splits=reads.get(partition, frozenset()),
        )
        rows = [(batch.schema.names == PENDING_DELAYS.arrow_schema.names, row) for batch in batches
                for row in batch.to_pylist()]  # fmt: skip
        finished.add(frozenset([partition]))
        return rows

    readers: dict[int, set[int]] = {}
    for partition, splits in reads.items():
        for split in splits:
            readers.setdefault(split, set()).add(partition)
    with ScratchReclaimer(target.storage()) as reclaimer:
        for split in order.splits:
            reclaimer.delete(target.narrow_file(split))
        for split, partitions_reading in sorted(readers.items()):
            reclaimer.delete(target.scratch_file(split), after=partitions_reading)
        reclaimer.follow(lambda: finished.value)
        results = spark.sparkContext.parallelize(range(partitions), partitions).flatMap(write).collect()
    return [row for pending, row in results if not pending], [row for pending, row in results if pending]


# What the task delivering origins of earlier runs returns: one row per split it wrote, and the groups of the
# origins it read that are still pending.
EARLIER_ORIGINS = columns(
    ("split", "int", "the scratch split the task wrote its deliveries to (null on a pending row)"),
    ("delivered", "bigint", "deliveries written to that split"),
    ("level", "int", "pending group: delay level, 0 for the timer wheel"),
    ("topic", "string", "pending group: the real topic"),
    ("count", "bigint", "pending group: deliveries not yet due"),
    ("next_due", "bigint", "pending group: the earliest due time"),
    ("min_offset", "bigint", "pending group: the lowest physical offset of its origins"),
    ("min_queue_offset", "bigint", "pending group: the lowest queue offset of its origins"),
)


def deliver_earlier_origins(
    records: pa.Table,
    *,
    split: int,
    delivered_until: int | None,
    clock: int,
    rules,
    target: IngestTarget,
) -> pa.RecordBatch:
    """Origins of earlier runs (commitlog rows): write the deliveries due in ``(delivered_until, clock]`` as split
    ``split``'s scratch and narrow files, and count the ones due later."""
    use_task_memory_pool()
    scratch_rows = scratch_rows_of_commitlog(records)
    found = Origins(scratch_rows, rules=rules)
    rows = np.array(found.rows, dtype=np.int64)
    due = np.array(found.due, dtype=np.int64)
    levels = np.array(found.level, dtype=np.int64)
    done = due <= (delivered_until if delivered_until is not None else np.iinfo(np.int64).min)
    now = ~done & (due <= clock)
    later = ~done & (due > clock)
    out = []
    if now.any():
        origins = scratch_rows.take(pa.array(rows[now]))
        deliveries = delivery_records(origins, due[now].tolist(), rules=rules)
        storage = target.storage()
        scratch = AtomicArrowFile(storage, target.scratch_file(split))
        scratch.write(deliveries, max_rows=SCRATCH_BATCH_ROWS)
        scratch.close()
        narrow = delivery_narrow_rows(
            deliveries,
            split=split,
            first_batch=0,
            file_rank=EARLIER_RUN_RANK,
            origin_timestamps=[EARLIER_RUN_TIMESTAMP] * origins.num_rows,
            levels=levels[now].tolist(),
        )
        _write_narrow(storage, target.narrow_file(split), [narrow])
        out.append({"split": split, "delivered": int(now.sum())})
    if later.any():
        pending = scratch_rows.take(pa.array(rows[later]))
        queue_offsets = records.column("queue_offset").take(pa.array(rows[later])).to_pylist()
        groups = pending_rows(
            real_topics(pending), levels[later].tolist(), due[later].tolist(), pending.column("source_line").to_pylist()
        )
        for group in groups:
            members = [
                offset
                for offset, topic, level in zip(
                    queue_offsets, real_topics(pending), levels[later].tolist(), strict=True
                )
                if topic == group["topic"] and level == group["level"]
            ]
            out.append({**group, "min_queue_offset": min(members)})
    return pa.RecordBatch.from_pylist(out, schema=EARLIER_ORIGINS.arrow_schema)


def earlier_deliveries(
    spark, lake, target: IngestTarget, *, first_split: int, pending_from: int, delivered_until, clock, rules,
    segment_size: int,
) -> tuple[list[int], int, list[dict]]:  # fmt: skip
    """Deliver the origins of earlier runs that came due (one task per slice of the commitlog from
    ``pending_from``, on executors).

    Returns the splits written, the deliveries they hold, and the groups still pending (``EARLIER_ORIGINS`` rows).
    """
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    from rmqlake.formats.segment import segment_file_name, segment_start
    from rmqlake.lake.spark_io import read_table

    first_segment = segment_file_name(segment_start(pending_from, segment_size))
    commitlog = read_table(spark, lake, "commitlog", partition_filters=[("segment", ">=", first_segment)])
    origins = commitlog.filter(
        F.col("topic").isin(*SCHEDULED_TOPICS) & (F.col("physical_offset") >= F.lit(pending_from))
    ).drop("store_time", "born_time")

    def deliver(batches):
        split = first_split + TaskContext.get().partitionId()
        tables = [pa.Table.from_batches([batch]) for batch in batches if batch.num_rows]
        if not tables:
            return
        records = pa.concat_tables(tables)
        yield deliver_earlier_origins(
            records, split=split, delivered_until=delivered_until, clock=clock, rules=rules, target=target
        )

    rows = [row.asDict() for row in origins.mapInArrow(deliver, EARLIER_ORIGINS.ddl).collect()]
    splits = sorted(row["split"] for row in rows if row["split"] is not None)
    delivered = sum(row["delivered"] for row in rows if row["split"] is not None)
    return splits, delivered, [row for row in rows if row["split"] is None]


# What a task writing the records of ends returns: one row per split of end lines.
ENDS_WRITTEN = columns(
    ("split", "int", "the split of the end lines"),
    ("written_split", "int", "the scratch split holding their records (null: none)"),
    ("commits", "bigint", "commit re-puts written"),
    ("rollbacks", "bigint", "rolled back halves (their op records written)"),
    ("refused", "bigint", "end lines refused (in the rejected staging folder)"),
)


@dataclass(frozen=True)
class EndsResolved:
    """What ``resolve_ends`` did: the splits it wrote, and per split of end lines its counts (``ENDS_WRITTEN``)."""

    written_splits: list[int]
    per_split: list[dict]

    @property
    def commits(self) -> int:
        return sum(row["commits"] for row in self.per_split)

    @property
    def rollbacks(self) -> int:
        return sum(row["rollbacks"] for row in self.per_split)

    @property
    def refused(self) -> int:
        return sum(row["refused"] for row in self.per_split)


def _task_files(spark, target: IngestTarget, relatives: list[str], schema):
    """The rows of small Parquet files the tasks wrote, as a DataFrame.

    Spark's own reader: a Python task per file took ~50 ms each and its worker's round trip, in every job that
    reads them (ends and halves are each read by two or three jobs of ``resolve_ends``)."""
    storage = target.storage()
    return spark.read.schema(schema.ddl).parquet(*[storage.uri(relative) for relative in relatives])


def _scratch_gather(storage, target: IngestTarget):
    """``scratch_rows(splits, batches, rows)`` for ``end_records_columns``: the scratch rows at those positions,
    in that order; each scratch batch is read once per call, each file opened once."""
    readers: dict[int, pa.ipc.RecordBatchFileReader] = {}

    def scratch_rows(splits: np.ndarray, batches: np.ndarray, rows: np.ndarray) -> pa.Table:
        order = np.lexsort((rows, batches, splits))
        splits, batches, rows = splits[order], batches[order], rows[order]
        starts = np.r_[0, np.flatnonzero((np.diff(splits) != 0) | (np.diff(batches) != 0)) + 1, len(order)]
        pieces = []
        for start, stop in itertools.pairwise(starts.tolist()):
            split = int(splits[start])
            if split not in readers:
                readers[split] = pa.ipc.open_file(storage.open_mapped(target.scratch_file(split)))
            pieces.append(readers[split].get_batch(int(batches[start])).take(pa.array(rows[start:stop], pa.int32())))
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return pa.Table.from_batches(pieces).take(inverse)

    return scratch_rows


def _lake_halves(spark, lake, keys):
    """The lake's halves with a UNIQ_KEY of ``keys``, as events (each marked where an op record of the lake names
    it); ``None`` when the lake has none.

    The halves are found on a few narrow columns first. The record's own columns (bodies, properties) are then
    read only in the commitlog segments that hold one, from the first of them to the last, and op records only
    after the first (a broker appends a half's op record after it): reading them for every record of the lake took
    15 s on 5 million messages, for a batch of 331 ends whose halves were all in the batch.
    """
    from pyspark.sql import functions as F

    from rmqlake.formats.transaction import CHECK_IMMUNITY_TIME_IN_SECONDS, HALF_TOPIC, OP_TOPIC, PGROUP, REAL_TOPIC
    from rmqlake.ingest.transactions import LAKE_EVENT_AT, LAKE_HALF_COLUMNS
    from rmqlake.lake.spark_io import read_table

    commitlog = read_table(spark, lake, "commitlog")
    halves = commitlog.filter(F.col("topic") == HALF_TOPIC)
    spans = (
        halves.select("segment", "physical_offset", "uniq_key")
        .join(keys, "uniq_key", "left_semi")
        .groupBy("segment")
        .agg(F.min("physical_offset").alias("first"), F.max("physical_offset").alias("last"))
        .collect()
    )  # a row per commitlog segment holding one
    if not spans:
        return None
    first, last = min(span["first"] for span in spans), max(span["last"] for span in spans)
    entries = (
        commitlog.filter((F.col("topic") == OP_TOPIC) & (F.col("physical_offset") > first))
        .select("queue_id", F.explode(F.split(F.decode("body", "UTF-8"), ",")).alias("entry"))
        .filter(F.col("entry").rlike("^[+-]?[0-9]{1,18}$"))
        .select("queue_id", F.col("entry").cast("bigint").alias("queue_offset"))
        .distinct()
        .withColumn("lake_ended", F.lit(True))
    )
    return (
        halves.filter(
            F.col("segment").isin([span["segment"] for span in spans]) & F.col("physical_offset").between(first, last)
        )
        .join(keys, "uniq_key", "left_semi")
        .join(entries, ["queue_id", "queue_offset"], "left")
        .select(
            "uniq_key",
            F.lit(EVENT_SOURCE_LAKE).alias("source"),
            F.lit(LAKE_EVENT_AT).cast("bigint").alias("at"),
            F.lit(-1).alias("rank"),
            F.col("physical_offset").alias("line"),
            F.col("born_timestamp"),
            F.col("properties")[REAL_TOPIC].alias("real_topic"),
            F.col("properties")[PGROUP].alias("half_group"),
            F.col("properties")[CHECK_IMMUNITY_TIME_IN_SECONDS].alias("check_immunity"),
            F.coalesce(F.col("lake_ended"), F.lit(False)).alias("lake_ended"),
            F.col("queue_offset").alias("half_queue_offset"),
            F.struct(*[F.col(name) for name in LAKE_HALF_COLUMNS]).alias("lake_record"),
        )
    )


def halves_in_append_order(halves, *, ranges: int):
    """``halves`` (``HALVES`` rows) with ``rank_in_batch``: each one's position among them in append order (store
    time, file rank, line), which makes its queue offset on the half topic.

    The halves are cut into ``ranges`` ranges of store time of one width; a window numbers the halves of each
    range, and the driver adds up the ranges' counts (a row per range). All in Spark's JVM: numbering them through
    a Python RDD (``zipWithIndex``) converted every half to a Python row and back, a fifth of the ends' time.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    low, high = halves.agg(F.min("store_timestamp"), F.max("store_timestamp")).first()
    if low is None:
        return halves.withColumn("rank_in_batch", F.lit(None).cast("bigint"))
    # store times are not negative: the differences fit a long; the width too, where the last range takes the rest
    width = min((high - low) // ranges + 1, (1 << 63) - 1)
    number = f"LEAST((store_timestamp - {low}L) div {width}L, {ranges - 1})"
    in_ranges = halves.withColumn("time_range", F.expr(f"CAST({number} AS INT)"))
    counts = dict(in_ranges.groupBy("time_range").count().collect())  # at most ``ranges`` rows
    starts, total = [], 0
    for number in range(ranges):
        starts.append(total)
        total += counts.get(number, 0)
    start = F.element_at(F.array(*(F.lit(value).cast("bigint") for value in starts)), F.col("time_range") + 1)
    in_range = Window.partitionBy("time_range").orderBy("store_timestamp", "file_rank", "source_line")
    return in_ranges.withColumn("rank_in_batch", start + F.row_number().over(in_range) - 1).drop("time_range")


def resolve_ends(
    spark,
    lake,
    target: IngestTarget,
    *,
    end_splits: list[int],
    half_splits: list[int],
    half_head: int,
    first_split: int,
    files: Mapping[int, str],
    file_ranks: Mapping[int, int],
    transaction_timeout_ms: int,
    partitions: int,
) -> EndsResolved:
    """Decide every end line of the batch and write what they store as extra splits ``first_split + split``.

    Spark gathers per UNIQ_KEY the lake's halves with that key (marked where an op record of the lake ended
    them), the batch's halves (each with its queue offset: ``half_head`` plus its rank among the batch's halves
    in append order) and the ends; ``decide_ends_columns`` decides them per partition of keys, then
    ``end_records_columns`` writes what they store per split of end lines.
    No message row reaches the driver: it collects one row per split of end lines, and one per commitlog segment
    holding a half of the lake with the UNIQ_KEY of an end.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    ends = _task_files(spark, target, [target.ends_file(split) for split in end_splits], END_LINES)
    end_events = ends.select(
        "uniq_key",
        F.lit(EVENT_SOURCE_END).alias("source"),
        F.col("store_timestamp").alias("at"),
        F.col("file_rank").alias("rank"),
        F.col("source_line").alias("line"),
        "split",
        "raw",
        "end",
        "topic",
        "producer_group",
        "from_check",
    )
    events = end_events
    if half_splits:
        halves = _task_files(spark, target, [target.halves_file(split) for split in half_splits], HALVES)
        ranked = halves_in_append_order(halves, ranges=partitions)
        batch_halves = ranked.join(ends.select("uniq_key").distinct(), "uniq_key", "left_semi").select(
            "uniq_key",
            F.lit(EVENT_SOURCE_BATCH).alias("source"),
            F.col("store_timestamp").alias("at"),
            F.col("file_rank").alias("rank"),
            F.col("source_line").alias("line"),
            F.col("born_timestamp"),
            F.col("real_topic"),
            F.col("producer_group").alias("half_group"),
            F.col("check_immunity"),
            (F.lit(half_head) + F.col("rank_in_batch")).alias("half_queue_offset"),
            F.col("split").alias("half_split"),
            F.col("scratch_batch").alias("half_batch"),
            F.col("scratch_row").alias("half_row"),
        )
        events = events.unionByName(batch_halves, allowMissingColumns=True)
    lake_halves = _lake_halves(spark, lake, ends.select("uniq_key").distinct()) if lake.exists("commitlog") else None
    if lake_halves is not None:
        events = events.unionByName(lake_halves, allowMissingColumns=True)
    events = events.repartition(partitions, "uniq_key").sortWithinPartitions("uniq_key", "at", "rank", "line")
    # what the write reads of a decided end and of its half (a row of every event column took a third of it)
    half_columns = [name for name in DECIDED_HALF_COLUMNS if name in events.columns]
    decided_schema = T.StructType(
        [
            *(events.schema[name] for name in DECIDED_END_COLUMNS),
            T.StructField("reason", T.StringType()),
            T.StructField("half", T.StructType([events.schema[name] for name in half_columns])),
        ]
    )

    def decide(batches):
        carried = None  # the events of the last UNIQ_KEY seen, which the next batch may continue
        for batch in batches:
            if not batch.num_rows:
                continue
            events = pa.Table.from_batches([batch] if carried is None else [*carried.to_batches(), batch])
            keys = events.column("uniq_key")
            last_key = pc.equal(keys, keys[-1]) if keys[-1].is_valid else pc.is_null(keys)
            cut = events.num_rows - int(pc.sum(last_key).as_py())  # the events are sorted: the last key's come last
            carried = events.slice(cut)
            if cut:
                yield from _decided(events.slice(0, cut)).to_batches()
        if carried is not None:
            yield from _decided(carried).to_batches()

    def _decided(events: pa.Table) -> pa.Table:
        return decide_ends_columns(events, transaction_timeout_ms=transaction_timeout_ms, half_columns=half_columns)

    decided = events.mapInArrow(decide, decided_schema)  # the ends only, each with its decision

    def write(batches):
        use_task_memory_pool()
        storage = target.storage()
        received = list(batches)
        if not received:
            return
        decided_ends = pa.Table.from_batches(received)
        scratch_rows = _scratch_gather(storage, target)
        splits = decided_ends.column("split").to_numpy()
        for split in np.unique(splits).tolist():
            written = first_split + split
            found = end_records_columns(
                decided_ends.filter(splits == split),
                split=written,
                file_rank=file_ranks[split],
                scratch_rows=scratch_rows,
            )
            if found.scratch is not None:
                scratch = AtomicArrowFile(storage, target.scratch_file(written))
                scratch.write(found.scratch, max_rows=SCRATCH_BATCH_ROWS)
                scratch.close()
                _write_narrow(storage, target.narrow_file(written), [found.narrow])
            if found.refused:
                lines = pa.RecordBatch.from_pylist(
                    [{"source_file": files[split], "source_line": row["line"], "raw": row["raw"],
                      "reject_reason": row["reason"]} for row in found.refused],
                    schema=pa.schema([PARSED_SCHEMA.field(name) for name in REJECTED_LINE_COLUMNS]),
                )  # fmt: skip
                _write_rejected(storage, target, written, [lines])
            yield pa.RecordBatch.from_pylist(
                [{"split": split, "written_split": written if found.scratch is not None else None,
                  "commits": found.commits, "rollbacks": found.rollbacks, "refused": len(found.refused)}],
                schema=ENDS_WRITTEN.arrow_schema,
            )  # fmt: skip

    rows = [
        row.asDict() for row in decided.repartition(partitions, "split").mapInArrow(write, ENDS_WRITTEN.ddl).collect()
    ]
    return EndsResolved(sorted(row["written_split"] for row in rows if row["written_split"] is not None), rows)
