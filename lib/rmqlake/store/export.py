"""Broker store files from table data files: what one export task does to one file (executor side).

Each task reads the Parquet data files of one commitlog segment, one CQ
file, one index file or one compacted queue straight from the lake (their
paths come from the Delta log, so no shuffle), and writes each record,
unit or entry at its byte position with ``formats`` encoders: rows may come
in any order, only coverage is checked. Files are written at the broker's
preallocated size; bytes never written are zeros (a sparse file on most
file systems).
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import struct
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from rmqlake.formats.compaction import SPARSE_END_UNIT, encode_sparse_unit, place_records
from rmqlake.formats.consumequeue import CQ_UNIT_SIZE, PRE_BLANK_UNIT, encode_unit
from rmqlake.formats.indexfile import ENTRY_SIZE, HEADER_SIZE, IndexEntry, IndexHeader, entry_position
from rmqlake.formats.record import encode_blank, encode_record
from rmqlake.lake.tables import CONSUMEQUEUE, INDEXFILE
from rmqlake.store.columnar import CQ_UNIT, INDEX_ENTRY, EncodedRecords, contiguous_runs, encode_record_batch, tiles
from rmqlake.store.rows import READ_BATCH_ROWS, RECORD_COLUMNS, record_from_row

# rows the columnar encoder takes at once (~16 MiB of ~1 KiB records): fewer, larger writes. A segment's rows are
# taken in runs of whole row groups of up to this many rows; a larger row group is read in batches of this many.
SEGMENT_BATCH_ROWS = 16384


# A commitlog segment is one task (it is one broker file, 1 GiB on a broker). Decoding its Parquet and encoding
# its records both release the GIL for most of their time, so this many threads share the work: in an export
# whose only big task is one 1 GiB segment, the other core is not left idle once the small tasks are done.
SEGMENT_ENCODERS = 2


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(uri) if "://" in uri else (pafs.LocalFileSystem(), uri)


def _batches(uris: Sequence[str], columns: list[str], *, batch_rows: int = READ_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    for uri in uris:
        filesystem, path = _filesystem(uri)
        with filesystem.open_input_file(path) as handle:
            yield from pq.ParquetFile(handle).iter_batches(batch_size=batch_rows, columns=columns)


@dataclass(frozen=True)
class _RowGroups:
    """Consecutive row groups of one Parquet file: a unit of a segment's encoding."""

    uri: str
    metadata: pq.FileMetaData  # read once, when the file is cut into units
    indices: list[int]


def _row_group_units(uris: Sequence[str], *, unit_rows: int) -> Iterator[_RowGroups]:
    """Each file's row groups in order, in runs of as many as add up to at most ``unit_rows`` rows (read as one
    batch); a larger row group is a run of its own."""
    for uri in uris:
        filesystem, path = _filesystem(uri)
        with filesystem.open_input_file(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
        indices, rows = [], 0
        for index in range(metadata.num_row_groups):
            group_rows = metadata.row_group(index).num_rows
            if indices and rows + group_rows > unit_rows:
                yield _RowGroups(uri, metadata, indices)
                indices, rows = [], 0
            indices.append(index)
            rows += group_rows
        if indices:
            yield _RowGroups(uri, metadata, indices)


def _write_row_groups(
    unit: _RowGroups, *, out: _SegmentFile, start: int, segment: str
) -> tuple[np.ndarray, np.ndarray]:
    """Encode a unit's rows a batch at a time (column-wise, or one by one where the columnar encoder leaves a
    batch) and write them into the segment starting at ``start`` open as ``out``; their records' offsets and
    sizes. However large the file's row groups, a batch at a time is held."""
    filesystem, path = _filesystem(unit.uri)
    offsets, sizes = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    with filesystem.open_input_file(path) as handle:  # a handle of its own: threads read one file at once
        batches = pq.ParquetFile(handle, metadata=unit.metadata).iter_batches(
            batch_size=SEGMENT_BATCH_ROWS, row_groups=unit.indices, columns=RECORD_COLUMNS, use_threads=False
        )
        for batch in batches:
            encoded = encode_record_batch(batch)
            if encoded is None:
                encoded = _encode_per_record(batch, segment)
            _write_records(out.write, encoded, start)
            offsets.append(encoded.physical_offset)
            sizes.append(encoded.total_size)
    return np.concatenate(offsets), np.concatenate(sizes)


def _in_order(units: Iterator, work: Callable, *, workers: int, depth: int) -> Iterator:
    """``work(unit)`` for each of ``units``, computed by ``workers`` threads at most ``depth`` units ahead, given
    in the units' order; an exception is raised where its unit's result would have been."""
    with ThreadPoolExecutor(workers, thread_name_prefix="segment-encode") as pool:
        pending = deque(pool.submit(work, unit) for unit in itertools.islice(units, depth))
        try:
            while pending:
                result = pending.popleft().result()
                pending.extend(pool.submit(work, unit) for unit in itertools.islice(units, 1))
                yield result
        finally:  # stopped early (an error, or the consumer closed): what has not started never starts
            for future in pending:
                future.cancel()


def _inside(out: str, *parts: str) -> Path:
    """``out/part/...``, refusing a part that is not a plain file or folder name, or a path that leads outside ``out``.

    Raises:
        ValueError: a part is empty, ``.`` or ``..``, or holds a path separator or a NUL.
    """
    root = Path(out).resolve()
    for part in parts:
        if part in ("", ".", "..") or any(c in part for c in "/\\\0"):
            raise ValueError(f"{part!r} is not a plain file or folder name; refusing to write outside {root}")
    path = root.joinpath(*parts)
    if not path.resolve().is_relative_to(root):
        raise ValueError(f"{path} resolves outside {root}; refusing to write it")
    return path


def _set_mtime(path: Path, mtime_ms: int | None) -> None:
    """Give a written file the modification time the broker's file would have (epoch ms; ``None``: leave it)."""
    if mtime_ms is not None:
        os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))


def _preallocated(path: Path, size: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "wb")  # noqa: SIM115 - closed by the caller after truncate
    handle.truncate(size)
    return handle


# written bytes from which the kernel is asked to start writing a file's dirty pages to disk
_WRITE_BEHIND_BYTES = 8 << 20


def _pwrite(fd: int, position: int, data) -> None:
    """Write ``data`` at ``position`` of the file open as ``fd`` (threads may write one file at once: there is
    no shared file position). For a large write, have the kernel start writing it to disk now
    (``POSIX_FADV_DONTNEED`` starts writeback of dirty pages), so that the disk works while the next batch is
    encoded instead of after the last one; the pages need not stay cached: nothing here reads them again."""
    view = memoryview(data).cast("B")
    at = position
    while view:
        written = os.pwrite(fd, view, at)
        if not written:  # a file system that takes nothing without saying why: not a loop forever
            raise OSError(f"wrote nothing at offset {at} ({len(view)} bytes left)")
        view, at = view[written:], at + written
    if at - position >= _WRITE_BEHIND_BYTES and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, position, at - position, os.POSIX_FADV_DONTNEED)


# Segment records go to the disk straight from an aligned buffer (O_DIRECT) where the file system takes it. An
# export writes 1 GiB files that nothing here reads back; through the page cache every byte was also copied
# into a newly cached page, and the same export with its segment writes left out took 2.0 s instead of 3.0 s.
# Offsets, lengths and the buffer's address must be multiples of the device's logical block: 4 KiB (or the
# memory page, if larger) serves every device.
DIRECT_ALIGN = max(4096, mmap.PAGESIZE)
DIRECT_BUFFER_BYTES = 8 << 20


class _SegmentFile:
    """A segment file open twice: through the page cache (``fd``) and, where the file system allows it, straight
    to the disk (O_DIRECT). ``write`` puts the whole aligned blocks of a run of bytes straight to the disk and
    the partly covered blocks at its ends through the page cache: each block of the file is written one way
    only, so the two never hold different bytes of one block. Threads may write at once."""

    def __init__(self, path: Path, fd: int):
        self.fd = fd
        self._direct_fd: int | None = None
        if hasattr(os, "O_DIRECT"):
            try:
                self._direct_fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
            except OSError as error:
                if error.errno != errno.EINVAL:  # EINVAL: this file system refuses O_DIRECT
                    raise
        self._direct = self._direct_fd is not None  # False from the first refused write on
        self._lock = threading.Lock()
        self.direct_bytes = 0  # written straight to the disk
        self._buffers = threading.local()  # an aligned buffer per writing thread, reused for every write

    def close(self) -> None:
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None

    def write(self, position: int, data) -> None:
        view = memoryview(data).cast("B")
        head = -position % DIRECT_ALIGN
        aligned = (len(view) - head) // DIRECT_ALIGN * DIRECT_ALIGN if len(view) > head else 0
        if not (self._direct and aligned):
            _pwrite(self.fd, position, view)
            return
        if head:
            _pwrite(self.fd, position, view[:head])
        self._write_direct(position + head, view[head : head + aligned])
        if head + aligned < len(view):
            _pwrite(self.fd, position + head + aligned, view[head + aligned :])

    def _write_direct(self, position: int, view: memoryview) -> None:
        """Aligned ``view`` at aligned ``position``, through this thread's aligned buffer."""
        buffer = getattr(self._buffers, "buffer", None)
        if buffer is None:
            buffer = self._buffers.buffer = mmap.mmap(-1, DIRECT_BUFFER_BYTES)  # page-aligned
        for at in range(0, len(view), DIRECT_BUFFER_BYTES):
            length = min(DIRECT_BUFFER_BYTES, len(view) - at)
            if not self._direct:  # refused meanwhile (another thread): the rest through the page cache
                _pwrite(self.fd, position + at, view[at:])
                return
            buffer[:length] = view[at : at + length]
            try:
                written = os.pwrite(self._direct_fd, memoryview(buffer)[:length], position + at)
            except OSError as error:  # a file system that opens with O_DIRECT but refuses its writes
                if error.errno != errno.EINVAL:
                    raise
                self._direct = False
                _pwrite(self.fd, position + at, view[at:])
                return
            if written != length:  # a short direct write leaves an unaligned rest: not ours to guess at
                raise OSError(f"wrote {written} of {length} bytes at offset {position + at} (O_DIRECT)")
            with self._lock:
                self.direct_bytes += length


def _write_records(write: Callable[[int, memoryview], None], encoded: EncodedRecords, start: int) -> None:
    """Each run of consecutive records of ``encoded`` in one ``write(position, bytes)``, at its place in the
    segment starting at ``start``."""
    runs = contiguous_runs(encoded.physical_offset, encoded.total_size)
    for first, stop in zip(runs[:-1].tolist(), runs[1:].tolist(), strict=True):
        write(int(encoded.physical_offset[first]) - start, encoded.data[encoded.starts[first] : encoded.starts[stop]])


def _check_covered(spans: list[tuple[int, int]], start: int, end: int, what: str) -> None:
    """``spans`` (offset, size) must tile [start, end) exactly: no gap, no overlap."""
    position = start
    for offset, size in sorted(spans):
        if offset != position:
            kind = "gap" if offset > position else "overlap"
            raise ValueError(f"{what}: {kind} at offset {position} (next record starts at {offset})")
        position += size
    if position != end:
        raise ValueError(f"{what}: records end at {position}, expected {end}")


def write_segment(task: dict, *, columnar: bool = True) -> dict:
    """Write commitlog segment ``task["segment"]`` (records, then the blank record of a sealed segment).

    ``task``: ``segment``, ``start_offset``, ``data_end`` (end of its last
    record), ``sealed``, ``file_size``, ``mtime_ms`` (the file's last-modified
    time, optional), ``files`` (Parquet URIs), ``out``. ``columnar``: encode
    a batch of rows at once (``store.columnar``); ``False`` encodes record by
    record with ``formats.record.encode_record``, the reference (a batch the
    columnar encoder leaves goes that way too).
    """
    start, data_end, size = task["start_offset"], task["data_end"], task["file_size"]
    path = _inside(task["out"], "commitlog", task["segment"])
    with _preallocated(path, size) as handle:
        fd = handle.fileno()
        if columnar:
            units = _row_group_units(task["files"], unit_rows=SEGMENT_BATCH_ROWS)
            out = _SegmentFile(path, fd)
            try:
                write = partial(_write_row_groups, out=out, start=start, segment=task["segment"])
                written = list(_in_order(units, write, workers=SEGMENT_ENCODERS, depth=2 * SEGMENT_ENCODERS))
            finally:
                out.close()
        else:  # the reference writes through the page cache only
            written = []
            for batch in _batches(task["files"], RECORD_COLUMNS):
                encoded = _encode_per_record(batch, task["segment"])
                _write_records(partial(_pwrite, fd), encoded, start)
                written.append((encoded.physical_offset, encoded.total_size))
        all_offsets = np.concatenate([offsets for offsets, _ in written]) if written else np.zeros(0, np.int64)
        all_sizes = np.concatenate([sizes for _, sizes in written]) if written else np.zeros(0, np.int64)
        if not tiles(all_offsets, all_sizes, start, data_end):  # the reference check says where and how
            _check_covered(list(zip(all_offsets.tolist(), all_sizes.tolist(), strict=True)), start, data_end,
                           f"segment {task['segment']}")  # fmt: skip
        if task["sealed"]:  # the 8-byte end-of-file marker: TOTALSIZE = every byte left after the last record
            _pwrite(fd, data_end - start, encode_blank(start + size - data_end))
    _set_mtime(path, task.get("mtime_ms"))
    return {
        "file": f"commitlog/{task['segment']}",
        "records": len(all_offsets),
        "bytes": data_end - start,
        "last_offset": int(all_offsets.max()) if len(all_offsets) else None,
    }


def _encode_per_record(batch: pa.RecordBatch, segment: str) -> EncodedRecords:
    """The records of a batch encoded one by one with ``encode_record`` (the reference route)."""
    chunks, offsets, sizes = [], [], []
    for row in batch.to_pylist():
        encoded = encode_record(record_from_row(row))
        if len(encoded) != row["total_size"]:
            raise ValueError(
                f"segment {segment}: record at {row['physical_offset']} encodes to {len(encoded)} "
                f"bytes, its total_size is {row['total_size']}"
            )
        chunks.append(encoded)
        offsets.append(row["physical_offset"])
        sizes.append(len(encoded))
    starts = np.zeros(len(chunks) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    return EncodedRecords(np.array(offsets, np.int64), np.array(sizes, np.int64), starts, memoryview(b"".join(chunks)))


CQ_COLUMNS = ["queue_offset", "commitlog_offset", "size", "tags_code", "store_timestamp"]
INDEX_COLUMNS = ["index_no", "key_hash", "slot", "phy_offset", "time_diff", "prev_index"]
# |queue offset| and file starts up to which ``queue_offset * 20 - start`` cannot overflow an int64
_SAFE_OFFSET = 2**58


def write_cq_file(task: dict, *, columnar: bool = True) -> dict:
    """Write CQ file ``task["cq_file"]`` of one queue: each unit at ``queue_offset * 20`` minus the file's start.

    Its modification time is the store time of its last unit (the broker
    writes a unit as it dispatches the message).

    ``task``: ``topic``, ``queue_id``, ``cq_file``, ``file_size``,
    ``first_in_queue`` (the queue's first file: units before its first unit
    are the broker's pre-blank units), ``files``, ``out``. ``columnar``:
    all units as one NumPy array; ``False`` (and any file that is not a
    run of units inside the file) goes unit by unit, the reference.
    """
    written = _write_cq_file_columnar(task) if columnar else None
    return written if written is not None else _write_cq_file_per_unit(task)


def _write_cq_file_columnar(task: dict) -> dict | None:
    """``write_cq_file`` in one write of the units, or ``None`` (nothing written) when the reference must say
    what is wrong."""
    base, size = int(task["cq_file"]), task["file_size"]
    table = _table(task["files"], CQ_COLUMNS, CONSUMEQUEUE.arrow_schema)
    if table is None or base >= _SAFE_OFFSET:
        return None
    queue_offset = table.column("queue_offset").to_numpy()
    if np.abs(queue_offset).max() >= _SAFE_OFFSET:
        return None
    positions = queue_offset * CQ_UNIT_SIZE - base
    if positions.min() < 0 or positions.max() >= size:
        return None
    order = np.argsort(positions, kind="stable")
    positions = positions[order]
    if not tiles(positions, np.full(len(positions), CQ_UNIT_SIZE), int(positions[0]), int(positions[-1]) + 20):
        return None
    units = np.empty(len(positions), CQ_UNIT)
    for name in CQ_UNIT.names:
        units[name] = table.column(name).to_numpy()[order]
    path = _inside(task["out"], "consumequeue", task["topic"], str(task["queue_id"]), task["cq_file"])
    with _preallocated(path, size) as handle:
        if task["first_in_queue"] and positions[0] > 0:  # ConsumeQueue.fillPreBlank
            handle.write(encode_unit(*PRE_BLANK_UNIT) * (int(positions[0]) // CQ_UNIT_SIZE))
        handle.seek(int(positions[0]))
        handle.write(units.tobytes())
    _set_mtime(path, int(table.column("store_timestamp")[int(np.argmax(queue_offset))].as_py()))
    return {"file": f"consumequeue/{task['topic']}/{task['queue_id']}/{task['cq_file']}", "units": len(positions)}


def _table(uris: Sequence[str], columns: list[str], types: pa.Schema) -> pa.Table | None:
    """The columns of a task's Parquet files as one table; ``None`` when it has no rows, a null, or a column
    not of the table's type (the per-row reference then says what it makes of it)."""
    batches = list(_batches(uris, columns, batch_rows=SEGMENT_BATCH_ROWS))
    if not batches:
        return None
    try:  # files may differ in the fields' nullability (written by another engine): the types must agree
        table = pa.table({name: pa.chunked_array([b.column(name) for b in batches]) for name in columns})
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    mismatched = any(table.column(n).type != types.field(n).type or table.column(n).null_count for n in columns)
    if not table.num_rows or mismatched:
        return None
    return table.combine_chunks()


def _write_cq_file_per_unit(task: dict) -> dict:
    base = int(task["cq_file"])
    path = _inside(task["out"], "consumequeue", task["topic"], str(task["queue_id"]), task["cq_file"])
    columns = CQ_COLUMNS
    positions = []
    last_unit = (-1, None)  # (queue offset, store time) of the newest unit: the file's last write
    with _preallocated(path, task["file_size"]) as handle:
        for batch in _batches(task["files"], columns):
            for queue_offset, commitlog_offset, size, tags, stored in zip(
                *(batch.column(c).to_pylist() for c in columns), strict=True
            ):
                if queue_offset > last_unit[0]:
                    last_unit = (queue_offset, stored)
                position = queue_offset * CQ_UNIT_SIZE - base
                if not 0 <= position < task["file_size"]:
                    raise ValueError(f"{path}: queue offset {queue_offset} does not belong to this CQ file")
                handle.seek(position)
                handle.write(encode_unit(commitlog_offset, size, tags))
                positions.append(position)
        positions.sort()
        _check_covered([(p, CQ_UNIT_SIZE) for p in positions], positions[0], positions[-1] + CQ_UNIT_SIZE, str(path))
        if task["first_in_queue"] and positions[0] > 0:  # ConsumeQueue.fillPreBlank
            handle.seek(0)
            handle.write(encode_unit(*PRE_BLANK_UNIT) * (positions[0] // CQ_UNIT_SIZE))
    _set_mtime(path, last_unit[1])
    return {"file": f"consumequeue/{task['topic']}/{task['queue_id']}/{task['cq_file']}", "units": len(positions)}


def write_index_file(task: dict, *, columnar: bool = True) -> dict:
    """Write index file ``task["index_file"]``: header, slot table (each slot: its newest entry), entries.

    Its modification time is the header's end timestamp: the store time of
    the last entry put (a file without entries keeps the time it is written).

    ``task``: ``index_file``, ``header`` (the ``indexfile_header`` row),
    ``slots``, ``file_size``, ``files``, ``out``. ``columnar``: the slot
    table and the entries as NumPy arrays; ``False`` (and any file whose
    entries are not distinct, in range and counted by the header) goes
    entry by entry, the reference.
    """
    written = _write_index_file_columnar(task) if columnar else None
    return written if written is not None else _write_index_file_per_entry(task)


def _write_index_file_columnar(task: dict) -> dict | None:
    slots, header = task["slots"], task["header"]
    table = _table(task["files"], INDEX_COLUMNS, INDEXFILE.arrow_schema)
    if table is None:
        return None
    numbers = table.column("index_no").to_numpy().astype(np.int64)
    slot = table.column("slot").to_numpy().astype(np.intp)
    order = _ascending_order(numbers)
    index_no = numbers[order]
    if (
        len(index_no) + 1 != header["index_count"]
        or index_no[0] < 0
        or entry_position(int(index_no[-1]), slots) + ENTRY_SIZE > task["file_size"]
        or (index_no[1:] == index_no[:-1]).any()
        or slot.min() < 0
        or slot.max() >= slots
    ):
        return None
    heads = np.zeros(slots, np.int64)
    # values of the heads' type and indices of NumPy's index type take ``ufunc.at``'s fast loop: int32 values
    # took ten times as long (0.15 s for the 1.7 M entries of a 1 M-message index file)
    np.maximum.at(heads, slot, numbers)
    entries = np.empty(len(index_no), INDEX_ENTRY)
    for name in INDEX_ENTRY.names:
        entries[name] = table.column(name).to_numpy()[order]
    path = _inside(task["out"], "index", task["index_file"])
    with _preallocated(path, task["file_size"]) as handle:
        fd = handle.fileno()
        _pwrite(fd, 0, _index_header(header))
        _pwrite(fd, HEADER_SIZE, heads.astype(">i4").tobytes())
        runs = contiguous_runs(index_no, np.ones(len(index_no), np.int64))
        for first, stop in zip(runs[:-1].tolist(), runs[1:].tolist(), strict=True):
            _pwrite(fd, entry_position(int(index_no[first]), slots), entries[first:stop].tobytes())
    _set_mtime(path, header["end_timestamp"] or None)
    return {"file": f"index/{task['index_file']}", "entries": len(index_no)}


def _ascending_order(numbers: np.ndarray) -> np.ndarray:
    """``np.argsort(numbers, kind="stable")``; for a permutation of a range of integers (a valid index file's
    entry numbers, in the slot order reput writes them) by one scatter: 15 ms instead of the sort's 160 ms for
    the 1.7 M entries of a 1 M-message index file."""
    if len(numbers):
        low = int(numbers.min())
        if int(numbers.max()) - low + 1 == len(numbers):
            order = np.full(len(numbers), -1, np.int64)
            order[numbers - low] = np.arange(len(numbers))
            if (order >= 0).all():  # every number of the range once: no repeats
                return order
    return np.argsort(numbers, kind="stable")


def _index_header(header: dict) -> bytes:
    return IndexHeader(
        header["begin_timestamp"],
        header["end_timestamp"],
        header["begin_phy_offset"],
        header["end_phy_offset"],
        header["hash_slot_count"],
        header["index_count"],
    ).encode()


def _write_index_file_per_entry(task: dict) -> dict:
    slots = task["slots"]
    path = _inside(task["out"], "index", task["index_file"])
    columns = INDEX_COLUMNS
    heads = array("i", bytes(4 * slots))
    entries = 0
    with _preallocated(path, task["file_size"]) as handle:
        header = task["header"]
        handle.write(_index_header(header))
        for batch in _batches(task["files"], columns):
            for index_no, key_hash, slot, phy_offset, time_diff, prev_index in zip(
                *(batch.column(c).to_pylist() for c in columns), strict=True
            ):
                handle.seek(entry_position(index_no, slots))
                handle.write(IndexEntry(key_hash, phy_offset, time_diff, prev_index).encode())
                heads[slot] = max(heads[slot], index_no)
                entries += 1
        if entries + 1 != header["index_count"]:
            raise ValueError(f"{path}: {entries} entries, the header counts {header['index_count']} (entries + 1)")
        if struct.pack("=i", 1) != struct.pack(">i", 1):
            heads.byteswap()  # the file is big-endian
        handle.seek(HEADER_SIZE)
        handle.write(heads.tobytes())
    _set_mtime(path, header["end_timestamp"] or None)
    return {"file": f"index/{task['index_file']}", "entries": entries}


def write_compaction_queue(task: dict) -> dict:
    """Write one compacted queue's files of the broker's compaction store: its compaction log and sparse CQ files.

    The records are laid out in queue offset order as the broker appends
    them (``formats.compaction.place_records``), each with PHYSICALOFFSET
    set to its position in the compaction log; each gets a 46-byte unit at
    the same ordinal in the CQ file named like its log file. A file pair
    left for the next gets the log's blank record and the CQ's end unit.
    The files of a queue follow from the sizes of all its records, so one
    task writes them all. Modification times: the store time of the
    file pair's last record.

    ``task``: ``topic``, ``queue_id``, ``log_files`` and ``cq_files``
    (Parquet URIs of the queue's ``compaction_log`` and ``compaction_cq``
    rows), ``log_file_size``, ``cq_file_size``, ``out``.
    """
    topic, queue = task["topic"], str(task["queue_id"])
    log_size, cq_size = task["log_file_size"], task["cq_file_size"]
    units = {}
    columns = ["queue_offset", "tags_code", "store_timestamp"]
    for batch in _batches(task["cq_files"], columns):
        for queue_offset, tags, stored in zip(*(batch.column(c).to_pylist() for c in columns), strict=True):
            units[queue_offset] = (tags, stored)
    stored = [c for c in RECORD_COLUMNS if c not in ("topic", "queue_id")]  # partition values: from the task
    rows = sorted(
        (
            {**row, "topic": task["topic"], "queue_id": task["queue_id"]}
            for batch in _batches(task["log_files"], stored)
            for row in batch.to_pylist()
        ),
        key=lambda row: row["queue_offset"],
    )
    offsets = [row["queue_offset"] for row in rows]
    if len(set(offsets)) != len(offsets) or set(offsets) != set(units):
        raise ValueError(
            f"compacted queue {topic}/{queue}: compaction_log holds {len(offsets)} records "
            f"({len(set(offsets))} queue offsets), compaction_cq {len(units)} units, not of the same queue offsets"
        )
    written: list[str] = []
    handles = None  # (start, log handle, cq handle, store time of the last record)

    def close() -> None:
        start, log_handle, cq_handle, stored = handles
        log_handle.close()
        cq_handle.close()
        for folder in ("compactionLog", "compactionCq"):
            _set_mtime(_inside(task["out"], "compaction", folder, topic, queue, f"{start:020d}"), stored)

    placed = place_records((row["total_size"] for row in rows), log_file_size=log_size, cq_file_size=cq_size)
    records = iter(rows)
    for kind, place in placed:
        if kind == "end":
            start, log_handle, cq_handle, _ = handles
            log_handle.seek(place.position - start)
            log_handle.write(encode_blank(start + log_size - place.position))
            cq_handle.seek(place.cq_position)
            cq_handle.write(SPARSE_END_UNIT)
            close()
            handles = None
            continue
        row = next(records)
        if handles is None:
            name = f"{place.file_start:020d}"
            log_path = _inside(task["out"], "compaction", "compactionLog", topic, queue, name)
            cq_path = _inside(task["out"], "compaction", "compactionCq", topic, queue, name)
            handles = (place.file_start, _preallocated(log_path, log_size), _preallocated(cq_path, cq_size), None)
            written.append(name)
        start, log_handle, cq_handle, _ = handles
        encoded = encode_record(replace(record_from_row(row), physical_offset=place.position))
        if len(encoded) != row["total_size"]:
            raise ValueError(
                f"compacted queue {topic}/{queue}: record at queue offset {row['queue_offset']} encodes to "
                f"{len(encoded)} bytes, its total_size is {row['total_size']}"
            )
        log_handle.seek(place.position - start)
        log_handle.write(encoded)
        tags, stored = units[row["queue_offset"]]
        cq_handle.seek(place.cq_position)
        cq_handle.write(encode_sparse_unit(place.position, len(encoded), tags, stored, row["queue_offset"]))
        handles = (start, log_handle, cq_handle, stored)
    if handles is not None:
        close()
    return {"queue": f"{topic}/{queue}", "files": len(written), "records": len(rows)}
