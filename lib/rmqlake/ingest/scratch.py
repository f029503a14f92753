"""A run's scratch files and the writers that put every task file in place atomically.

Between the parse and the write, a split's messages wait in an Arrow IPC scratch file and their narrow rows
(what ordering and placing need) in a small Arrow IPC file; ``IngestTarget`` names them all.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rmqlake.ingest.message import MESSAGE_FIELDS, MESSAGE_TYPES
from rmqlake.lake.storage import Storage

log = logging.getLogger(__name__)

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
        ("kind", pa.int8()),  # 0: a message (or commit) of the input; 1: a delivery; 2: a transaction's op record
        ("origin_timestamp", pa.int64()),  # a delivery's origin's store time (a message: its own)
        ("rr_topic", pa.string()),  # the topic whose round-robin turn the row takes (null: none)
        ("due", pa.int64()),  # a delay-level or timer record's delivery time
        ("level", pa.int32()),  # its delay level (0: a timer)
        ("origin_partition", pa.int32()),  # a delivery of a record sent without a queue: where its turn was taken
        ("origin_turn", pa.int64()),  # and that turn's ordinal among the partition's turns of the real topic
        # the message of this run a delivery or a commit is made from (its delay-level or timer record, its
        # half): its append-order key, so its round-robin turn and its physical offset can be found
        ("parent_timestamp", pa.int64()),
        ("parent_rank", pa.int32()),
        ("parent_line", pa.int64()),
    ]
)


# A split's messages as kept between the parse and the write: everything but the file (one per split) and
# the raw text (only rejected lines keep it). An Arrow IPC file: written and read back (memory-mapped) at the
# speed of a copy, where Parquet encodes and decodes every value; the write task reads the batches it needs.
SCRATCH_COLUMNS = ["source_line", *MESSAGE_TYPES]
_SCRATCH_FIELDS = [("source_line", pa.int64()), *MESSAGE_FIELDS]
SCRATCH_BATCH_ROWS = 2048
NARROW_BATCH_ROWS = 8192  # ~300 KB: the unit the ordering step reads, and the grain of its range bounds
# A narrow file's footer key: per batch, the store times of its first and last rows and its rows, as JSON
# ``[[first, last, rows], ...]``. The rows are sorted by the append order, store time first, so the ordering
# step learns which batches reach into a range, and the driver the ranges' bounds, from the footers alone.
NARROW_SPANS_KEY = "rmqlake.store_time_spans"


def appended_narrow_rows(
    records: pa.Table,
    *,
    split: int,
    file_rank: int,
    first_batch: int,
    kinds: pa.Array,
    origin_timestamps: pa.Array,
    levels: pa.Array | None = None,
    parents: tuple[pa.Array, pa.Array, pa.Array] | None = None,
) -> pa.RecordBatch:
    """The narrow rows of records the run appends besides its input's messages (deliveries, the records of
    transaction ends), written to ``split``'s scratch file from ``first_batch``.

    ``kinds`` and ``origin_timestamps`` place them in the append order, ``levels`` are deliveries' delay levels,
    ``parents`` the ``parent_*`` columns (null: none). They take no round-robin turn and have no due time.
    """
    count = records.num_rows
    row = np.arange(count, dtype=np.int32)
    if parents is None:
        parents = (pa.nulls(count, pa.int64()), pa.nulls(count, pa.int32()), pa.nulls(count, pa.int64()))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(count, split, np.int32)),
            pa.array(np.full(count, file_rank, np.int32)),
            *(
                records.column(name).combine_chunks()
                for name in ("source_line", "store_timestamp", "topic", "queue_id", "sys_flag", "total_size")
            ),
            pa.array(first_batch + row // SCRATCH_BATCH_ROWS),
            pa.array(row % SCRATCH_BATCH_ROWS),
            kinds,
            origin_timestamps,
            pa.nulls(count, pa.string()),
            pa.nulls(count, pa.int64()),
            levels if levels is not None else pa.nulls(count, pa.int32()),
            pa.nulls(count, pa.int32()),
            pa.nulls(count, pa.int64()),
            *parents,
        ],
        schema=NARROW_SCHEMA,
    )


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
        return f"{self.scratch_dir}/narrow/split-{split:06d}.arrow"

    def undecided_file(self, split: int) -> str:
        """The lines of a split the JVM parser left to the per-line parser (``IngestParse``)."""
        return f"{self.scratch_dir}/undecided/split-{split:06d}.arrow"

    def ends_file(self, split: int) -> str:
        return f"{self.scratch_dir}/ends/split-{split:06d}.parquet"

    def halves_file(self, split: int) -> str:
        return f"{self.scratch_dir}/halves/split-{split:06d}.parquet"

    def ordered_file(self, partition: int) -> str:
        return f"{self.scratch_dir}/ordered/part-{partition:06d}.arrow"


_WRITE_BUFFER = 1 << 20  # bytes a data or scratch file's stream gathers before it writes them


class AtomicFile:
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

    def _open_stream(self) -> pa.NativeFile:
        """The temporary file, opened for writing through a buffer: Parquet and IPC writers hand the stream each
        page header, page and buffer on its own (a 64 MiB commitlog file of 256-row pages is ~18,600 writes),
        and a local file's stream would make each one a system call."""
        return self.storage.fs.open_output_stream(self._temporary_path(), compression=None, buffer_size=_WRITE_BUFFER)

    def _complete(self) -> None:
        self.storage.move(self.temporary, self.relative)


class AtomicArrowFile(AtomicFile):
    """An Arrow IPC file, written batch after batch; ``metadata`` goes into its footer."""

    def __init__(self, storage: Storage, relative: str, *, metadata: dict[str, str] | None = None):
        super().__init__(storage, relative)
        self.metadata = metadata
        self.batches = 0
        self._stream = None
        self._writer = None

    def write(self, batch: pa.RecordBatch | pa.Table, *, max_rows: int) -> None:
        """Append ``batch`` as batches of ``max_rows`` rows (the last one shorter)."""
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks()
            batch = batch.to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist([], schema=batch.schema)
        if self._writer is None:
            self._stream = self._open_stream()
            self._writer = pa.ipc.new_file(self._stream, batch.schema, metadata=self.metadata)
        for start in range(0, batch.num_rows, max_rows):
            self._writer.write_batch(batch.slice(start, max_rows))
            self.batches += 1

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._stream.close()
        self._complete()


class AtomicParquet(AtomicFile):
    """A Parquet file, written table after table in row groups of ``row_group_size`` rows.

    ``write_behind``: on a local disk (Linux), after each table the kernel is asked to start writing what the file
    holds so far to the disk (``sync_file_range``, not waiting for it), so that a job's data files reach the disk while
    it computes the next ones, instead of all at once when something syncs or memory runs short. For a lake's data
    files, which outlive the job; not for scratch files, which are deleted before the disk would need them. The
    requests are made on a thread of their own (``wait_for_writeback_requests``): one blocks while the disk's queue
    is full (~28 ms each in an ingest's write stage), and the task meanwhile encodes the next row groups.
    """

    def __init__(self, storage: Storage, relative: str, *, row_group_size: int, write_behind: bool = False,
                 **writer_options):  # fmt: skip
        super().__init__(storage, relative)
        self.row_group_size = row_group_size
        self.writer_options = writer_options
        self.writer: pq.ParquetWriter | None = None
        self._stream: pa.NativeFile | None = None
        self.write_behind = write_behind and isinstance(storage.fs, pafs.LocalFileSystem) and bool(_SYNC_FILE_RANGE)

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if self.writer is None:
            self._stream = self._open_stream()
            self.writer = pq.ParquetWriter(self._stream, table.schema, **self.writer_options)
        self.writer.write_table(table, row_group_size=self.row_group_size)
        if self.write_behind:
            self._stream.flush()  # what the buffer holds goes to the file, and so to the disk with the rest
            self._start_writeback(self._stream.tell())

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()  # a writer given a stream leaves it open
        written = self._stream.tell()
        self._stream.close()
        if self.write_behind:
            self._start_writeback(written)  # the last row groups and the footer
        self._complete()

    def _start_writeback(self, written: int) -> None:
        """The writeback of the file's first ``written`` bytes requested on the writeback thread. The descriptor is
        opened here, so the request reaches the file even once it has been moved into place."""
        descriptor = os.open(self.storage.file_path(self.temporary), os.O_RDONLY)
        try:
            _writeback_thread().submit(self._request_writeback, descriptor, written)
        except RuntimeError:  # the interpreter is shutting down: the kernel writes the file back in its own time
            os.close(descriptor)

    def _request_writeback(self, descriptor: int, written: int) -> None:
        try:
            if _SYNC_FILE_RANGE(descriptor, 0, written, SYNC_FILE_RANGE_WRITE) != 0:
                self.write_behind = False  # a file system without it: the data goes to disk as it would have anyway
        finally:
            os.close(descriptor)


_writeback: tuple[int, ThreadPoolExecutor] | None = None  # the process it belongs to, and the thread
_writeback_lock = threading.Lock()


def _writeback_thread() -> ThreadPoolExecutor:
    """The process's writeback thread: one, so requests reach the kernel in the order the files were written (a
    process forked from one that had it starts its own)."""
    global _writeback
    with _writeback_lock:
        if _writeback is None or _writeback[0] != os.getpid():
            _writeback = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="rmqlake-writeback"))
        return _writeback[1]


def wait_for_writeback_requests() -> None:
    """Returns once every writeback request made so far has been handed to the kernel (not once the disk has the
    bytes: that is what ``fsync`` is for)."""
    _writeback_thread().submit(lambda: None).result()


class ScratchReclaimer:
    """Deletes a run's scratch files on a thread of its own, each once the partitions that read it have finished.

    Deleting is mostly waiting for the disk: on a file system that discards the blocks it frees (ext4 mounted with
    ``discard``), unlinking a written-back 50 MB scratch file took ~37 ms, and the 1.2 GB of a 1 M-message ingest
    ~1.5 s, in which the driver did nothing else. Deleted while the write tasks run, that wait overlaps their work,
    and the disk holds less scratch at a time. A file whose partitions do not all finish (the job failed) is left
    for the run's own clean-up: the scratch folder's removal, or the run's abort.
    """

    def __init__(self, storage: Storage, *, poll_seconds: float = 0.1):
        self._storage = storage
        self._poll_seconds = poll_seconds
        self._waiting: list[tuple[str, frozenset[int]]] = []  # (file, the partitions that must finish first)
        self._finished: Callable[[], frozenset[int]] = frozenset
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.deleted = 0
        self._thread = threading.Thread(target=self._run, name="rmqlake-scratch-reclaimer", daemon=True)
        self._thread.start()

    def delete(self, relative: str, *, after: Iterable[int] = ()) -> None:
        """Delete ``relative`` once every partition in ``after`` has finished (none: now)."""
        with self._lock:
            self._waiting.append((relative, frozenset(after)))

    def follow(self, finished: Callable[[], frozenset[int]]) -> None:
        """Learn the finished partitions from ``finished`` (called on the reclaimer's thread)."""
        self._finished = finished

    def close(self) -> None:
        """Delete what may be deleted, then stop; what still waits is left to the run's clean-up."""
        self._closing.set()
        self._thread.join()

    def __enter__(self) -> ScratchReclaimer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            closing = self._closing.wait(self._poll_seconds)
            self._delete_ready()
            if closing:
                return

    def _delete_ready(self) -> None:
        finished = self._finished()
        with self._lock:
            ready = [relative for relative, after in self._waiting if after <= finished]
            self._waiting = [(relative, after) for relative, after in self._waiting if not after <= finished]
        for relative in ready:
            try:
                self._storage.delete_file(relative)
            except FileNotFoundError:
                continue  # a split with nothing to keep has no file
            except OSError as error:
                log.warning("could not delete the scratch file %s now (%s); the run's clean-up removes it", relative,
                            error)  # fmt: skip
                continue
            self.deleted += 1


SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait for it


def _sync_file_range():
    """glibc's ``sync_file_range`` (Python's ``os`` has none), or ``None`` off Linux. Unlike
    ``posix_fadvise(POSIX_FADV_DONTNEED)``, it keeps the pages cached: the job's next step reads these files."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _sync_file_range()


@dataclass(frozen=True)
class NarrowSpan:
    """A batch of a narrow file: the store times of its first and last rows, and its rows."""

    first: int
    last: int
    rows: int


def write_narrow_file(storage: Storage, relative: str, rows: pa.Table) -> None:
    """A split's narrow rows (``NARROW_SCHEMA``, sorted by the append order) as an Arrow IPC file of
    ``NARROW_BATCH_ROWS``-row batches, each batch's ``NarrowSpan`` in its footer (``NARROW_SPANS_KEY``)."""
    stamps = rows.column("store_timestamp")
    if stamps.null_count:
        raise ValueError(f"{relative}: narrow rows without a store time")
    stamps = stamps.to_numpy()
    spans = []
    for first in range(0, rows.num_rows, NARROW_BATCH_ROWS):
        stop = min(first + NARROW_BATCH_ROWS, rows.num_rows)
        spans.append([int(stamps[first]), int(stamps[stop - 1]), stop - first])
    file = AtomicArrowFile(storage, relative, metadata={NARROW_SPANS_KEY: json.dumps(spans)})
    file.write(rows, max_rows=NARROW_BATCH_ROWS)
    file.close()


def open_narrow_file(storage: Storage, relative: str) -> tuple[pa.ipc.RecordBatchFileReader, list[NarrowSpan]]:
    """A narrow file (memory-mapped on a local disk) and its batches' spans, read from its footer."""
    reader = pa.ipc.open_file(storage.open_mapped(relative))
    listed = (reader.metadata or {}).get(NARROW_SPANS_KEY.encode())
    if listed is None:
        raise RuntimeError(f"{relative}: a narrow file without its batches' store times ({NARROW_SPANS_KEY})")
    spans = [NarrowSpan(int(first), int(last), int(rows)) for first, last, rows in json.loads(listed)]
    if len(spans) != reader.num_record_batches:
        raise RuntimeError(f"{relative}: {len(spans)} store-time spans for {reader.num_record_batches} batches")
    return reader, spans


ORDERED_BATCH_ROWS = 1 << 20


def write_ordered(target: IngestTarget, partition: int, rows: pa.Table) -> None:
    """A partition's narrow rows in append order (``NARROW_SCHEMA``), kept for the placement and write steps: an
    Arrow IPC file, as Python alone reads it: written and read back as uncompressed Parquet, a million rows took
    ~0.13 s of CPU more."""
    file = AtomicArrowFile(target.storage(), target.ordered_file(partition))
    file.write(rows, max_rows=ORDERED_BATCH_ROWS)
    file.close()


def read_ordered(target: IngestTarget, partition: int) -> list[pa.RecordBatch]:
    """A partition's narrow rows in append order, as ``order_partition`` saved them (none if it was empty)."""
    storage = target.storage()
    path = target.ordered_file(partition)
    if not storage.exists(path):
        return []
    reader = pa.ipc.open_file(storage.open_mapped(path))
    return [reader.get_batch(index) for index in range(reader.num_record_batches)]


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
    messages = take_rows(pa.Table.from_batches(pieces), take)
    found = messages.column("source_line").to_numpy()
    if not np.array_equal(found, placement.column("source_line").to_numpy()):
        raise RuntimeError("the scratch files do not hold the lines the placement lists where it says")
    return messages


def take_rows(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """``table.take(indices)`` (the reference, which it falls back to), with each binary column gathered as views.

    Arrow's take of a binary column spread over many batches joins the batches first, then copies the values
    taken: every body copied twice. Here a binary column comes back as ``binary_view``, 16 bytes per row pointing
    into the batches' own buffers (memory-mapped scratch files), and no value is copied: the Parquet writer reads
    the bodies where they are and writes the same bytes as from a binary column (``viewed_arrow_schema``).
    """
    if not len(indices) or indices.min() < 0 or indices.max() >= table.num_rows:
        return table.take(pa.array(indices, pa.int64()))  # the same IndexError for a position outside the table
    columns = []
    taken = None
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.type == pa.binary():
            columns.append(gather_views(column, indices))
            continue
        if taken is None:
            taken = pa.array(indices, pa.int64())
        columns.append(column.take(taken))
    schema = pa.schema(
        [field.with_type(column.type) for field, column in zip(table.schema, columns, strict=True)],
        metadata=table.schema.metadata,
    )
    return pa.Table.from_arrays(columns, schema=schema)


_VIEW_INLINE = 12  # a view of a value this long or shorter holds the value itself, and no buffer index


def gather_views(column: pa.ChunkedArray, indices: np.ndarray) -> pa.Array:
    """The values of the binary ``column`` at ``indices`` (each in range) as one ``binary_view`` array whose
    longer values stay in ``column``'s data buffers.

    Each chunk is viewed (Arrow's cast makes the views, pointing into the chunk's data buffer); the views of all
    chunks are stacked, their buffer numbers shifted past the buffers of the chunks before, and taken by NumPy.
    """
    views, buffers, valid = [], [], []
    has_nulls = column.null_count > 0
    for chunk in column.chunks:
        viewed = chunk.cast(pa.binary_view())
        rows = np.frombuffer(viewed.buffers()[1], np.int32, count=4 * (viewed.offset + len(viewed)))
        rows = rows.reshape(-1, 4)[viewed.offset :]
        if buffers:
            rows = rows.copy()
            rows[rows[:, 0] > _VIEW_INLINE, 2] += len(buffers)
        views.append(rows)
        buffers.extend(viewed.buffers()[2:])
        if has_nulls:
            valid.append(chunk.is_valid().to_numpy(zero_copy_only=False))
    taken = np.concatenate(views)[indices] if views else np.zeros((0, 4), np.int32)
    validity, nulls = None, 0
    if has_nulls:
        present = np.concatenate(valid)[indices]
        taken[~present] = 0  # a null's view: no value, no buffer
        nulls = int(len(present) - np.count_nonzero(present))
        validity = pa.array(present).buffers()[1] if nulls else None
    views_buffer = pa.py_buffer(np.ascontiguousarray(taken))
    return pa.Array.from_buffers(pa.binary_view(), len(indices), [validity, views_buffer, *buffers], null_count=nulls)


def binary_views(data: pa.Buffer, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """``binary_view`` values ``data[start : start + length]`` (each inside ``data``, which is under 2 GiB): the
    longer values point into ``data``, nothing is copied but their first bytes into the views."""
    count = len(starts)
    if data.size >= 1 << 31:
        raise ValueError(f"views point into buffers under 2 GiB, not {data.size} bytes")
    lengths = np.asarray(lengths, np.int32)
    views = np.zeros((count, 16), np.uint8)
    if data.size and count:
        places = np.asarray(starts, np.int64)[:, None] + np.arange(_VIEW_INLINE)
        head = np.frombuffer(data, np.uint8)[np.minimum(places, data.size - 1)]
        head[np.arange(_VIEW_INLINE) >= lengths[:, None]] = 0  # past a short value: zeros, as the format wants
        views[:, 4:] = head
    words = views.view(np.int32)  # length, then 12 bytes inline, or a 4-byte prefix, buffer 0 and the offset
    words[:, 0] = lengths
    long = lengths > _VIEW_INLINE
    words[long, 2] = 0
    words[long, 3] = np.asarray(starts)[long]
    buffers = [data] if long.any() else []
    return pa.Array.from_buffers(pa.binary_view(), count, [None, pa.py_buffer(views), *buffers])


def as_views(table: pa.Table) -> pa.Table:
    """``table`` with its binary columns as ``binary_view`` (Arrow's cast makes the views; no value is copied)."""
    if not any(field.type == pa.binary() for field in table.schema):
        return table
    columns = [column.cast(pa.binary_view()) if column.type == pa.binary() else column for column in table.columns]
    schema = pa.schema([field.with_type(column.type) for field, column in zip(table.schema, columns, strict=True)])
    return pa.Table.from_arrays(columns, schema=schema)


def value_bytes(table: pa.Table) -> int:
    """The bytes ``table`` would take as contiguous Arrow arrays (a binary view counted as the value it points at
    and an offset): what row group sizes are reckoned from, the same whichever way its rows were gathered."""
    total = 0
    for column in table.columns:
        if column.type in (pa.binary_view(), pa.binary()):
            total += sum(int(_value_lengths(chunk).sum()) for chunk in column.chunks) + 4 * (len(column) + 1)
            total += (len(column) + 7) // 8 if column.null_count else 0
        else:
            total += column.nbytes
    return total


def _value_lengths(chunk: pa.Array) -> np.ndarray:
    """Each value's length in a binary or binary view array (0 for a null)."""
    if not len(chunk):
        return np.zeros(0, np.int32)
    if chunk.type == pa.binary():
        offsets = np.frombuffer(chunk.buffers()[1], np.int32, count=chunk.offset + len(chunk) + 1)[chunk.offset :]
        lengths = np.diff(offsets)
    else:
        views = np.frombuffer(chunk.buffers()[1], np.int32, count=4 * (chunk.offset + len(chunk)))
        lengths = views.reshape(-1, 4)[chunk.offset :, 0].copy()
    if chunk.null_count:
        lengths[~chunk.is_valid().to_numpy(zero_copy_only=False)] = 0
    return lengths
