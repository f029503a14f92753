"""Ingest: producer log lines → CommitLog rows, placed exactly as a broker appends them.

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

import gc
import itertools
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rmqlake.formats.msgid import offset_msg_ids_with_prefix
from rmqlake.formats.record import consumes_queue_offsets
from rmqlake.formats.segment import next_segment_start, place_records, segment_file_name, segment_start
from rmqlake.ingest.blocks import BlockColumns, parse_block
from rmqlake.ingest.files import DamagedInput, Split, iter_split_line_blocks
from rmqlake.ingest.lines import ParseOptions, Rejection, line_parser
from rmqlake.ingest.message import MESSAGE_TYPES
from rmqlake.lake.storage import Storage
from rmqlake.lake.tables import COMMITLOG, REJECTED

log = logging.getLogger(__name__)

# file_rank: the input file's position in path order, so ordering by it orders by path.
APPEND_ORDER = ("store_timestamp", "file_rank", "source_line")

_MESSAGE_FIELDS = list(MESSAGE_TYPES.items())  # a ParsedMessage's fields, in its order
PARSED_SCHEMA = pa.schema(
    [
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
        ("raw", pa.string()),
        ("reject_reason", pa.string()),
        *_MESSAGE_FIELDS,
    ]
)
_MESSAGE_NAMES = [name for name, _ in _MESSAGE_FIELDS]


_NO_MESSAGE = (None,) * len(_MESSAGE_FIELDS)


def parse_lines(
    lines: list[bytes],
    *,
    source_file: str,
    first_line: int,
    file_hash32: int,
    options: ParseOptions,
) -> pa.RecordBatch:
    """Parse consecutive lines of one file into one Arrow batch of ``PARSED_SCHEMA`` (in line order).

    Lines are accepted column-wise where possible (``ingest.blocks``);
    the others go through the per-line parser, which rejects them with a
    reason or accepts what the column-wise route does not handle.
    """
    parser = line_parser(options)
    with _gc_paused():
        block = parse_block(parser, lines, first_line=first_line, file_hash32=file_hash32)
        accepted = _accepted_batch(source_file, first_line, block)
        if not len(block.undecided):
            return accepted
        positions = block.undecided.tolist()
        numbers = [first_line + position for position in positions]
        texts, reasons, rows = [], [], []
        _parse_into(numbers, file_hash32, [lines[p] for p in positions], parser, texts, reasons, rows)
        per_line = _parsed_batch(source_file, numbers, texts, reasons, rows)
        if not accepted.num_rows:
            return per_line
        in_line_order = np.argsort(np.concatenate([block.accepted, block.undecided]), kind="stable")
        merged = pa.Table.from_batches([accepted, per_line]).take(pa.array(in_line_order))
        return merged.combine_chunks().to_batches()[0]


def _accepted_batch(source_file: str, first_line: int, block: BlockColumns) -> pa.RecordBatch:
    count = len(block.accepted)
    nothing = pa.nulls(count, pa.string())
    arrays = [
        pa.repeat(pa.scalar(source_file, pa.string()), count),
        pa.array(block.accepted + first_line, pa.int64()),
        nothing,
        nothing,
    ]
    arrays += [block.columns[name] if count else pa.array([], t) for name, t in _MESSAGE_FIELDS]
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED_SCHEMA)


def _parsed_batch(source_file: str, numbers: range, texts: list, reasons: list, rows: list) -> pa.RecordBatch:
    count = len(numbers)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in _MESSAGE_FIELDS]
    arrays = [
        pa.array([source_file] * count, pa.string()),
        pa.array(numbers, pa.int64()),
        pa.array(texts, pa.string()),
        pa.array(reasons, pa.string()),
    ]
    arrays += [pa.array(column, field_type) for column, (_, field_type) in zip(columns, _MESSAGE_FIELDS, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED_SCHEMA)


def _parse_into(numbers, hash32, raws, parser, texts, reasons, rows) -> None:
    parse = parser.parse
    for source_line, raw in zip(numbers, raws, strict=True):
        try:
            message = parse(raw, source_line=source_line, file_hash32=hash32)
        except Rejection as exc:
            texts.append(raw.decode("utf-8", "replace"))
            reasons.append(str(exc))
            rows.append(_NO_MESSAGE)
            continue
        texts.append(None)
        reasons.append(None)
        rows.append(message)


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


@contextmanager
def _gc_paused():
    """Parsing allocates many short-lived objects and no cycles: the cycle collector would only cost time (a
    third of the parse when it runs while a batch's rows are alive). They are freed by reference counting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# -- step 1: a task per split -----------------------------------------------------------------

# The narrow row of a message: what ordering, counting and placing it needs.
NARROW_SCHEMA = pa.schema(
    [
        ("split", pa.int32()),
        ("file_rank", pa.int32()),
        ("source_line", pa.int64()),
        ("store_timestamp", pa.int64()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("sys_flag", pa.int32()),
        ("total_size", pa.int32()),
        ("scratch_batch", pa.int32()),  # where the message is in its split's scratch file: batch, row in the batch
        ("scratch_row", pa.int32()),
    ]
)
PARSED_COUNTS_DDL = "split int, lines bigint, rejected bigint"
# A split's messages as kept between the parse and the write: everything but the file (one per split) and
# the raw text (only rejected lines keep it). An Arrow IPC file: written and read back (memory-mapped) at the
# speed of a copy, where Parquet encodes and decodes every value; the write task reads the batches it needs.
SCRATCH_COLUMNS = ["source_line", *_MESSAGE_NAMES]
SCRATCH_BATCH_ROWS = 2048
NARROW_ROW_GROUP_ROWS = 8192  # ~300 KB: the unit the ordering step reads, and the grain of its range bounds


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


@dataclass(frozen=True)
class IngestTarget:
    """Where a run's tasks write (relative to the lake root) and the values every written row shares."""

    lake_root: str
    storage_options: dict
    scratch_dir: str  # <commitlog staging>/_scratch: hidden from the staged files that are committed
    commitlog_dir: str  # the commitlog's staging folder of the run
    rejected_dir: str  # the rejected table's staging folder of the run
    run_id: str
    batch_id: str
    rejected_at_us: int  # epoch microseconds

    def storage(self) -> Storage:
        return Storage(self.lake_root, self.storage_options)

    def scratch_file(self, split: int) -> str:
        return f"{self.scratch_dir}/messages/split-{split:06d}.arrow"

    def narrow_file(self, split: int) -> str:
        return f"{self.scratch_dir}/narrow/split-{split:06d}.parquet"

    def ordered_file(self, partition: int) -> str:
        return f"{self.scratch_dir}/ordered/part-{partition:06d}.parquet"


def parse_split(task: SplitTask, *, options: ParseOptions, target: IngestTarget) -> pa.RecordBatch:
    """Parse one split into its three files; return its counts (one ``PARSED_COUNTS_DDL`` row).

    * scratch: the messages (``SCRATCH_COLUMNS``), for the write step;
    * narrow: one ``NARROW_SCHEMA`` row per message, for ordering and placing;
    * ``rejected`` staging: the lines that are not messages, with their reasons.

    Spark reads only the narrow files: message bodies never enter the JVM.
    Files appear under their final names when complete, so a retried task
    replaces them and a killed one leaves only hidden temporary files.
    """
    use_task_memory_pool()
    storage = target.storage()
    scratch = _AtomicArrowFile(storage, target.scratch_file(task.index))
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
        schema=pa.schema([("split", pa.int32()), ("lines", pa.int64()), ("rejected", pa.int64())]),
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
    writer = _AtomicParquet(
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
    writer = _AtomicParquet(
        storage,
        f"{target.rejected_dir}/part-{split:06d}-{target.run_id}.parquet",
        row_group_size=max(count, 1),
        compression="snappy",
    )
    writer.write(table)
    writer.close()


class _AtomicFile:
    """A file written under a hidden temporary name and moved into place when complete: a retried task replaces
    it, a killed one leaves only a hidden temporary file (``collect_staged`` skips those)."""

    def __init__(self, storage: Storage, relative: str):
        self.storage = storage
        self.relative = relative
        folder, name = relative.rsplit("/", 1)
        self.temporary = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"

    def _temporary_path(self) -> str:
        path = self.storage.file_path(self.temporary)
        self.storage.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        return path

    def _complete(self) -> None:
        self.storage.move(self.temporary, self.relative)


class _AtomicArrowFile(_AtomicFile):
    """An Arrow IPC file, written batch after batch."""

    def __init__(self, storage: Storage, relative: str):
        super().__init__(storage, relative)
        self.batches = 0
        self._stream = None
        self._writer = None

    def write(self, batch: pa.RecordBatch, *, max_rows: int) -> None:
        """Append ``batch`` as batches of ``max_rows`` rows (the last one shorter)."""
        if self._writer is None:
            self._stream = self.storage.fs.open_output_stream(self._temporary_path())
            self._writer = pa.ipc.new_file(self._stream, batch.schema)
        for start in range(0, batch.num_rows, max_rows):
            self._writer.write_batch(batch.slice(start, max_rows))
            self.batches += 1

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._stream.close()
        self._complete()


class _AtomicParquet(_AtomicFile):
    """A Parquet file, written table after table in row groups of ``row_group_size`` rows."""

    def __init__(self, storage: Storage, relative: str, *, row_group_size: int, **writer_options):
        super().__init__(storage, relative)
        self.row_group_size = row_group_size
        self.writer_options = writer_options
        self.writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if self.writer is None:
            self.writer = pq.ParquetWriter(
                self._temporary_path(), table.schema, filesystem=self.storage.fs, **self.writer_options
            )
        self.writer.write_table(table, row_group_size=self.row_group_size)

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        self._complete()


# -- step 2: range partitions in append order ----------------------------------------------


def append_order_bounds(footers: Iterable[pq.FileMetaData], partitions: int) -> list[int]:
    """``partitions - 1`` store timestamps cutting the messages into ranges of about equal size.

    Partition ``i`` holds the messages with ``bounds[i-1] <= store_timestamp
    < bounds[i]``, so every message of one timestamp is in one partition and
    partition ``i`` precedes ``i + 1`` in the append order. The bounds come
    from the narrow files' row-group statistics (each split's rows are
    sorted), read on the driver: a few numbers per row group, no rows.
    """
    groups = []  # (min, max, rows) of every row group
    for footer in footers:
        column = footer.schema.names.index("store_timestamp")
        for index in range(footer.num_row_groups):
            group = footer.row_group(index)
            stats = group.column(column).statistics
            groups.append((stats.min, stats.max, group.num_rows))
    if partitions <= 1 or not groups:
        return []
    # Spread each row group's rows evenly over its timestamp range, then take the quantiles.
    lows = np.array([g[0] for g in groups], dtype=np.float64)
    highs = np.array([g[1] for g in groups], dtype=np.float64)
    rows = np.array([g[2] for g in groups], dtype=np.float64)
    points = np.unique(np.concatenate([lows, highs]))
    below = np.zeros(len(points))  # rows with a timestamp below each point
    for low, high, count in zip(lows, highs, rows, strict=True):
        span = max(high - low, 1.0)
        below += count * np.clip((points - low) / span, 0.0, 1.0)
    wanted = below[-1] * np.arange(1, partitions) / partitions
    bounds = np.ceil(np.interp(wanted, below, points)).astype(np.int64)
    return np.maximum.accumulate(bounds).tolist()


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
    saved = _AtomicParquet(
        storage, target.ordered_file(partition), row_group_size=1 << 20, compression="none", write_statistics=False
    )
    saved.write(ordered)
    saved.close()
    return stats_of_partition(
        partition, ordered.to_batches(), queue_counts=queue_counts, default_queue_count=default_queue_count
    )


# -- step 3: per-partition statistics -------------------------------------------------------

_STATS_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("bucket", pa.int32()),
        ("value", pa.int64()),
    ]
)


def _queue_count(topic: str, queue_counts: Mapping[str, int], default: int | None) -> int:
    count = queue_counts.get(topic, default)
    if count is None:
        raise ValueError(f"topic {topic!r} has no queue count")  # parse_line rejects such lines
    return count


class QueueAssigner:
    """The broker's queue choice and queue offsets for messages in append order, batch after batch.

    A message without a queue takes the next round-robin turn of its topic
    (ordinal modulo the topic's queue count); a NOT_TYPE or COMMIT message
    takes the next offset of its queue. Vectorised: per batch, a message's
    turn (or offset) is the counter before the batch plus its rank among the
    batch's messages of the same topic (or queue), so Python runs per topic
    and queue, not per message.
    """

    def __init__(
        self,
        rr_counters: Mapping[str, int],
        queue_offsets: Mapping[tuple[str, int], int],
        *,
        queue_counts,
        default_queue_count,
    ):
        self.rr = dict(rr_counters)
        self.heads = dict(queue_offsets)
        self.queue_counts = queue_counts
        self.default_queue_count = default_queue_count

    def assign(self, batch: pa.RecordBatch) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(topic names, topic code per row, round-robin mask, queue ids, queue offsets; 0 if none consumed)."""
        encoded = pc.dictionary_encode(batch.column("topic"))
        names = encoded.dictionary.to_pylist()
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        given = batch.column("queue_id")
        round_robin = given.is_null().to_numpy(zero_copy_only=False)
        queues = given.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        if round_robin.any():
            rows = np.flatnonzero(round_robin)
            topic_codes = codes[rows]
            turns = np.array([self.rr.get(name, 0) for name in names], dtype=np.int64)
            counts = np.ones(len(names), dtype=np.int64)
            for code in np.unique(topic_codes).tolist():
                counts[code] = _queue_count(names[code], self.queue_counts, self.default_queue_count)
            queues[rows] = (turns[topic_codes] + _ranks_within(topic_codes)) % counts[topic_codes]
            for code, taken in enumerate(np.bincount(topic_codes, minlength=len(names)).tolist()):
                if taken:
                    self.rr[names[code]] = int(turns[code]) + taken
        offsets = np.zeros(batch.num_rows, dtype=np.int64)
        consuming = np.flatnonzero(consumes_queue_offsets(batch.column("sys_flag").to_numpy(zero_copy_only=False)))
        if len(consuming):
            keys = (codes[consuming] << 32) | queues[consuming]  # queue ids are 0..count-1 here
            distinct, inverse = np.unique(keys, return_inverse=True)
            queue_keys = [(names[key >> 32], key & 0xFFFFFFFF) for key in distinct.tolist()]
            heads = np.array([self.heads.get(key, 0) for key in queue_keys], dtype=np.int64)
            offsets[consuming] = heads[inverse] + _ranks_within(keys)
            for key, head, taken in zip(queue_keys, heads.tolist(), np.bincount(inverse).tolist(), strict=True):
                self.heads[key] = head + taken
        return names, codes, round_robin, queues, offsets


def _ranks_within(keys: np.ndarray) -> np.ndarray:
    """Each element's 0-based rank among the elements with the same key, in array order."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    group_starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[group_starts, len(keys)])
    ranks = np.empty(len(keys), dtype=np.int64)
    ranks[order] = np.arange(len(keys)) - np.repeat(group_starts, sizes)
    return ranks


def stats_of_partition(
    partition: int,
    batches: Iterable[pa.RecordBatch],
    *,
    queue_counts: Mapping[str, int],
    default_queue_count: int | None,
) -> pa.RecordBatch:
    """Counts of one partition (see module docstring, step 2).

    Kinds: ``messages``/``bytes`` (partition totals), ``rr_total`` (round-robin
    messages per topic), ``rr_consuming`` (offset-consuming round-robin
    messages per topic by their local ordinal modulo the queue count) and
    ``queue`` (offset-consuming messages with a known queue).
    """
    messages = total_bytes = 0
    per_topic: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rr_consuming: dict[tuple[str, int], int] = defaultdict(int)
    per_queue: dict[tuple[str, int], int] = defaultdict(int)
    # Counters from zero: a round-robin message's queue is then its local ordinal modulo the queue count.
    local = QueueAssigner({}, {}, queue_counts=queue_counts, default_queue_count=default_queue_count)
    for batch in batches:
        if not batch.num_rows:
            continue
        names, codes, round_robin, queues, _ = local.assign(batch)
        sizes = batch.column("total_size").to_numpy(zero_copy_only=False).astype(np.int64)
        messages += batch.num_rows
        total_bytes += int(sizes.sum())
        counts = np.bincount(codes, minlength=len(names)).tolist()
        weights = np.bincount(codes, weights=sizes, minlength=len(names)).tolist()
        for code, name in enumerate(names):
            per_topic[name][0] += counts[code]
            per_topic[name][1] += int(weights[code])
        consuming = consumes_queue_offsets(batch.column("sys_flag").to_numpy(zero_copy_only=False))
        for mask, target in ((round_robin & consuming, rr_consuming), (~round_robin & consuming, per_queue)):
            if mask.any():
                keys, taken = np.unique((codes[mask] << 32) | queues[mask], return_counts=True)
                for key, count in zip(keys.tolist(), taken.tolist(), strict=True):
                    target[(names[key >> 32], key & 0xFFFFFFFF)] += count
    rr_total = {topic: turns for topic, turns in local.rr.items() if turns}  # counted from zero in this partition
    rows = [(partition, "messages", None, None, None, messages), (partition, "bytes", None, None, None, total_bytes)]
    rows += [(partition, "rr_total", t, None, None, n) for t, n in rr_total.items()]
    rows += [(partition, "rr_consuming", t, None, b, n) for (t, b), n in rr_consuming.items()]
    rows += [(partition, "queue", t, q, None, n) for (t, q), n in per_queue.items()]
    rows += [(partition, "topic_messages", t, None, None, c) for t, (c, _) in per_topic.items()]
    rows += [(partition, "topic_bytes", t, None, None, b) for t, (_, b) in per_topic.items()]
    return pa.RecordBatch.from_arrays(
        [pa.array([row[i] for row in rows], field.type) for i, field in enumerate(_STATS_SCHEMA)], schema=_STATS_SCHEMA
    )


class StatsRow(NamedTuple):
    """One count of ``stats_of_partition``, as the driver's plan reads it."""

    partition: int
    kind: str
    topic: str | None
    queue_id: int | None
    bucket: int | None
    value: int


def stats_rows(batch: pa.RecordBatch) -> list[StatsRow]:
    return [StatsRow(**row) for row in batch.to_pylist()]


def read_ordered(target: IngestTarget, partition: int) -> list[pa.RecordBatch]:
    """A partition's narrow rows in append order, as ``order_partition`` saved them (none if it was empty)."""
    storage = target.storage()
    path = target.ordered_file(partition)
    if not storage.exists(path):
        return []
    return pq.read_table(storage.file_path(path), filesystem=storage.fs).to_batches()


# -- step 4: the plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionStart:
    """Where partition ``partition`` starts: physical offset, round-robin counters, queue heads."""

    physical_offset: int
    rr_counters: dict[str, int]
    queue_offsets: dict[tuple[str, int], int]


@dataclass(frozen=True)
class AppendPlan:
    """Starting values of every partition and the lake state after the batch."""

    starts: dict[int, PartitionStart]
    end_offset: int
    rr_counters: dict[str, int]
    queue_heads: dict[tuple[str, int], int]
    partitions_replayed: int
    messages: int
    message_bytes: int
    topic_totals: dict[str, tuple[int, int]]


def plan_append(
    stats_rows: Iterable,
    *,
    partitions: int,
    start_offset: int,
    queue_heads: Mapping[tuple[str, int], int],
    rr_counters: Mapping[str, int],
    queue_counts: Mapping[str, int],
    default_queue_count: int | None,
    segment_size: int,
    replay: Callable[[int, int], int],
) -> AppendPlan:
    """Turn per-partition counts into per-partition starting values (driver side, no message rows).

    Args:
        stats_rows: ``StatsRow``s of every partition (``stats_rows`` of ``order_partition``'s batches).
        partitions: number of partitions of the ordered frame.
        start_offset: commitlog write position before the batch.
        queue_heads: next queue offset per (topic, queue) before the batch.
        rr_counters: round-robin messages per topic before the batch.
        replay: ``replay(partition, start_offset) -> end_offset`` for a
            partition that crosses a segment end (runs on that partition only).
    """
    messages = defaultdict(int)
    sizes = defaultdict(int)
    rr_total: dict[int, dict[str, int]] = defaultdict(dict)
    rr_consuming: dict[int, dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    per_queue: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
    topic_totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in stats_rows:
        if row.kind == "messages":
            messages[row.partition] = row.value
        elif row.kind == "bytes":
            sizes[row.partition] = row.value
        elif row.kind == "rr_total":
            rr_total[row.partition][row.topic] = row.value
        elif row.kind == "rr_consuming":
            rr_consuming[row.partition][row.topic][row.bucket] = row.value
        elif row.kind == "queue":
            per_queue[row.partition][(row.topic, row.queue_id)] = row.value
        elif row.kind == "topic_messages":
            topic_totals[row.topic][0] += row.value
        elif row.kind == "topic_bytes":
            topic_totals[row.topic][1] += row.value
    heads = dict(queue_heads)
    counters = dict(rr_counters)
    position = start_offset
    starts: dict[int, PartitionStart] = {}
    replayed = 0
    for partition in range(partitions):
        starts[partition] = PartitionStart(position, dict(counters), dict(heads))
        for key, count in per_queue[partition].items():
            heads[key] = heads.get(key, 0) + count
        for topic, buckets in rr_consuming[partition].items():
            queue_count = _queue_count(topic, queue_counts, default_queue_count)
            before = counters.get(topic, 0)
            for bucket, count in buckets.items():
                queue = (before + bucket) % queue_count
                heads[(topic, queue)] = heads.get((topic, queue), 0) + count
        for topic, count in rr_total[partition].items():
            counters[topic] = counters.get(topic, 0) + count
        size = sizes[partition]
        if size == 0:
            continue
        if position + size + 8 <= next_segment_start(position, segment_size):
            position += size  # every record of the partition fits the current segment
        else:
            position = replay(partition, position)
            replayed += 1
    return AppendPlan(
        starts=starts,
        end_offset=position,
        rr_counters=counters,
        queue_heads=heads,
        partitions_replayed=replayed,
        messages=sum(messages.values()),
        message_bytes=sum(sizes.values()),
        topic_totals={topic: (count, size) for topic, (count, size) in topic_totals.items()},
    )


def replay_end_offset(sizes: Iterable[int], *, start_offset: int, segment_size: int, chunk: int = 65536) -> int:
    """Write position after appending records of ``sizes`` from ``start_offset`` (rolls included)."""
    position = start_offset
    buffer: list[int] = []
    for size in sizes:
        buffer.append(size)
        if len(buffer) >= chunk:
            position = place_records(buffer, start_offset=position, segment_size=segment_size).end_offset
            buffer = []
    if buffer:
        position = place_records(buffer, start_offset=position, segment_size=segment_size).end_offset
    return position


# -- step 5: placement and write -----------------------------------------------------------

PLACEMENT_SCHEMA = pa.schema(
    [
        ("split", pa.int32()),
        ("source_line", pa.int64()),
        ("scratch_batch", pa.int32()),
        ("scratch_row", pa.int32()),
        ("physical_offset", pa.int64()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
    ]
)


class PartitionPlacer:
    """Replays the broker's append for one partition, batch after batch, from its start."""

    def __init__(self, start: PartitionStart, *, queue_counts, default_queue_count, segment_size: int):
        self.position = start.physical_offset
        self.queues = QueueAssigner(
            start.rr_counters, start.queue_offsets, queue_counts=queue_counts, default_queue_count=default_queue_count
        )
        self.segment_size = segment_size

    def place(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Narrow rows in append order → their ``PLACEMENT_SCHEMA`` rows (queue, queue offset, physical offset)."""
        placement = place_records(
            batch.column("total_size").to_numpy(zero_copy_only=False),
            start_offset=self.position,
            segment_size=self.segment_size,
        )
        self.position = placement.end_offset
        _, _, _, queue_ids, queue_offsets = self.queues.assign(batch)
        return pa.RecordBatch.from_arrays(
            [
                batch.column("split"),
                batch.column("source_line"),
                batch.column("scratch_batch"),
                batch.column("scratch_row"),
                pa.array(placement.offsets, pa.int64()),
                pa.array(queue_ids, pa.int32()),
                pa.array(queue_offsets, pa.int64()),
            ],
            schema=PLACEMENT_SCHEMA,
        )


WRITTEN_DDL = """segment string, message_count bigint, first_offset bigint, data_end bigint,
    first_store_timestamp bigint, last_store_timestamp bigint, file string"""
_WRITTEN_SCHEMA = pa.schema(
    [
        ("segment", pa.string()),
        ("message_count", pa.int64()),
        ("first_offset", pa.int64()),
        ("data_end", pa.int64()),
        ("first_store_timestamp", pa.int64()),
        ("last_store_timestamp", pa.int64()),
        ("file", pa.string()),
    ]
)
_COMMITLOG_FILE_SCHEMA = pa.schema([field for field in COMMITLOG.arrow_schema if field.name != "segment"])
# Columns worth dictionary pages (few distinct values); trying it on bodies and ids only costs time.
_DICTIONARY_COLUMNS = [
    name
    for name in _COMMITLOG_FILE_SCHEMA.names
    if name not in ("body", "properties_bytes", "properties", "msg_id", "uniq_key", "physical_offset", "body_crc")
]


def fetch_messages(placement: pa.Table, open_scratch: Callable[[int], pa.ipc.RecordBatchFileReader]) -> pa.Table:
    """The scratch rows (``SCRATCH_COLUMNS``) of the placed lines, in placement order.

    Each split's file is read only in the batches holding its lines (the
    narrow rows say which batch and row); a check of the lines found
    against the lines wanted guards against a mix-up.
    """
    splits = placement.column("split").to_numpy()
    batches = placement.column("scratch_batch").to_numpy()
    rows = placement.column("scratch_row").to_numpy()
    pieces, take = [], np.empty(len(splits), dtype=np.int64)
    base = 0
    for split in np.unique(splits).tolist():
        mine = np.flatnonzero(splits == split)
        wanted, where = np.unique(batches[mine], return_inverse=True)
        scratch = open_scratch(split)
        read = [scratch.get_batch(int(index)) for index in wanted]
        starts = np.cumsum([0] + [batch.num_rows for batch in read[:-1]])
        take[mine] = base + starts[where] + rows[mine]
        base += sum(batch.num_rows for batch in read)
        pieces.extend(read)
    if not pieces:
        return pa.table({name: pa.array([], type) for name, type in _SCRATCH_FIELDS})
    # One chunk first: a take across many small batches costs about twice the copy (measured).
    messages = pa.Table.from_batches(pieces).combine_chunks().take(pa.array(take))
    found = messages.column("source_line").to_numpy()
    if not np.array_equal(found, placement.column("source_line").to_numpy()):
        raise RuntimeError("the scratch files do not hold the lines the placement lists where it says")
    return messages


_SCRATCH_FIELDS = [("source_line", pa.int64()), *_MESSAGE_FIELDS]


def commitlog_rows(messages: pa.Table, placement: pa.Table, *, segment_size: int, source_file, batch_id: str):
    """The commitlog rows of placed messages: placement columns, segment, offsetMsgId and batch joined in.

    Returns (each row's segment start offset as a NumPy array, table of ``_COMMITLOG_FILE_SCHEMA`` columns).
    """
    offsets = placement.column("physical_offset").to_numpy()
    starts = segment_start(offsets, segment_size)  # element-wise on the array
    distinct, codes = np.unique(placement.column("split").to_numpy(), return_inverse=True)
    names = pa.array([source_file(int(split)) for split in distinct.tolist()], pa.string())
    computed = {
        "physical_offset": placement.column("physical_offset"),
        "queue_id": placement.column("queue_id"),
        "queue_offset": placement.column("queue_offset"),
        "msg_id": offset_msg_ids_with_prefix(messages.column("store_host_prefix").combine_chunks(), offsets),
        "batch_id": pa.repeat(pa.scalar(batch_id, pa.string()), messages.num_rows),
        "source_file": pc.take(names, pa.array(codes)),
    }
    columns = [computed[f.name] if f.name in computed else messages.column(f.name) for f in _COMMITLOG_FILE_SCHEMA]
    table = pa.Table.from_arrays(columns, schema=_COMMITLOG_FILE_SCHEMA)
    return starts, table


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
    groups of about ``row_group_bytes``. Yields one ``WRITTEN_DDL`` row per
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

    with _gc_paused():
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
        writer = _AtomicParquet(
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
            schema=_WRITTEN_SCHEMA,
        )


def merge_segment_aggregates(written: Iterable) -> list[dict]:
    """Per segment: the files' counts summed, first/last store time of the first/last record by offset."""
    segments: dict[str, dict] = {}
    for row in sorted(written, key=lambda r: r["first_offset"]):
        merged = segments.get(row["segment"])
        if merged is None:
            segments[row["segment"]] = {
                "segment": row["segment"],
                "message_count": row["message_count"],
                "data_end": row["data_end"],
                "first_store_timestamp": row["first_store_timestamp"],
                "last_store_timestamp": row["last_store_timestamp"],
            }
        else:
            merged["message_count"] += row["message_count"]
            merged["data_end"] = max(merged["data_end"], row["data_end"])
            merged["last_store_timestamp"] = row["last_store_timestamp"]
    return list(segments.values())
