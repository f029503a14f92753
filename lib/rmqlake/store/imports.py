"""Commitlog rows from broker store files: what one import task does to one commitlog file (executor side).

The task walks the file record by record, as the broker's recovery does,
and returns Arrow batches of commitlog rows, of the end-of-file blank and
of corrupt records (file, offset, reason).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.properties import parse_properties
from rmqlake.formats.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
    BlankRecord,
    CorruptRecordError,
    decode_record,
    record_error,
)
from rmqlake.ingest.jvm import passable
from rmqlake.ingest.plan import COMMITLOG_FILE
from rmqlake.ingest.scratch import AtomicParquet, as_views, binary_views, value_bytes
from rmqlake.ingest.tasks import COMMITLOG_ROW_GROUP_BYTES, COMMITLOG_WRITE_OPTIONS, use_task_memory_pool
from rmqlake.lake.storage import Storage, is_local
from rmqlake.lake.tables import COMMITLOG, TableSpec, columns
from rmqlake.store.record_runs import MIN_RECORD_SIZE, read_run
from rmqlake.store.rows import READ_BATCH_ROWS, row_from_record

log = logging.getLogger(__name__)

# one row per record read: the commitlog's columns, or the end-of-file blank / a corrupt record (flags)
IMPORTED = TableSpec(
    "imported_records",
    COMMITLOG.schema.stored  # the staging writer computes the derived columns
    + columns(
        ("blank_end", "boolean", "the row is the 8-byte end-of-file blank, not a message"),
        ("corrupt_reason", "string", "why the bytes here are not a valid record, or null"),
    ),
)
IMPORTED_SCHEMA = IMPORTED.arrow_schema
# The rows rmqlake's JVM decoder (``rmqlake.jvm.StoreRecords``) writes of a run of clean records: the imported
# columns but those alike for every row of a piece, which ``read_segment_file`` adds (the tests compare the two),
# with the body's place in the store file instead of its bytes (``read_segment_file`` points at them there).
PIECE_COLUMNS = ("segment", "batch_id", "source_file", "source_line", "blank_end", "corrupt_reason")
DECODED = IMPORTED.schema.without(*PIECE_COLUMNS, "body") + columns(
    ("body_at", "bigint", "where the record's body starts in the store file"),
    ("body_length", "int", "the body's bytes"),
)


def read_segment_file(
    path: str,
    *,
    start_offset: int,
    last: bool = True,
    check_crc: bool = True,
    columnar: bool = True,
    start: int = 0,
    stop: int | None = None,
    first_ordinal: int = 1,
    reached: WalkEnd | None = None,
    decoded: DecodedRun | None = None,
) -> Iterator[pa.RecordBatch]:
    """The records of one commitlog file, walked as the broker's recovery walks it, with nothing left out.

    Every byte up to the end of the written data is accounted for by one
    row: a message, the end-of-file blank record (``blank_end``), or a
    corrupt range (``corrupt_reason`` naming the file and its start and end
    byte; ``physical_offset`` and ``total_size`` give the range). Zeros from
    some point to the end of the file are the unwritten tail of the newest
    file (``last``); in an older file, which must end with its blank record,
    they are a corrupt range too.

    A record whose size can be trusted (it agrees with the size formula) but
    which fails a check (body CRC, PHYSICALOFFSET, properties not UTF-8, a
    topic, host or queue id that cannot be kept) is one corrupt range and
    the walk goes on after it. Anything else (zeros or garbage where a
    record should start, an unknown magic code, a TOTALSIZE that disagrees
    with the fields) is where the broker's recovery stops reading the file;
    here the walk looks for the next byte position that holds a record
    passing every check, PHYSICALOFFSET equal to that position included, and
    goes on from there; the bytes in between are one corrupt range.

    ``columnar``: runs of messages that pass every check are decoded a run
    at a time (``store.record_runs``); each record that does not, and what
    follows from it, is read here record by record, the reference, which
    ``False`` uses for every record.

    ``start``, ``stop`` and ``first_ordinal`` walk a piece of the file
    (``plan_pieces``): from ``start`` as if the walk had reached it with
    ``first_ordinal - 1`` rows, up to the first position at or after
    ``stop``; ``reached`` is told that position and the rows given.

    ``decoded``: the run of clean records from ``start`` that the JVM decoder read (``DecodedRun``); its rows
    are given first, and the walk goes on where the run ended.
    """
    name = os.path.basename(path)
    rows: list[dict] = []
    with open(path, "rb") as handle:
        length = os.fstat(handle.fileno()).st_size
        if length == 0:
            return
        position = start
        ordinal = first_ordinal - 1
        if decoded is not None and decoded.rows:
            yield from decoded.batches(name=name, path=path, first_ordinal=first_ordinal)
            position, ordinal = decoded.position, ordinal + decoded.rows
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            reader = _SegmentReader(data, length, name=name, path=path, start_offset=start_offset, check_crc=check_crc)
            limit = length if stop is None else stop
            while position < limit:
                if columnar:  # a run stays inside the piece: a record crossing its end is the reference's
                    run = read_run(data, position, limit, start_offset=start_offset, name=name, path=path,
                                   first_ordinal=ordinal + 1, check_crc=check_crc, schema=IMPORTED_SCHEMA)  # fmt: skip
                    if run is not None:
                        if rows:
                            yield pa.RecordBatch.from_pylist(rows, schema=IMPORTED_SCHEMA)
                            rows = []
                        batch, position = run
                        ordinal += batch.num_rows
                        yield batch
                        continue
                ordinal += 1
                kind, size, value = reader.read(position)
                if kind == _BAD and size is None and _zeros(data, position, length):  # no record from here on
                    if not last:
                        reason = "zeros up to the file end: no end-of-file blank record, yet a newer file follows"
                        rows.append(reader.corrupt(ordinal, position, length, reason))
                    else:
                        ordinal -= 1  # the unwritten tail of the newest file: no row
                    break
                if kind == _MESSAGE:
                    rows.append(row_from_record(name, path, ordinal, value, reader.properties))
                elif kind == _BLANK:
                    rows.append(_blank(name, path, start_offset + position, ordinal, size))
                elif size is not None:  # a record of trusted size that fails a check: skip exactly it
                    rows.append(reader.corrupt(ordinal, position, position + size, value))
                else:  # the broker's recovery stops here; read on from the next record that passes every check
                    resume = reader.resync(position + 1)
                    end = resume if resume is not None else (length if not last else _written_end(data, length))
                    rows.append(reader.corrupt(ordinal, position, end, f"{value}; the broker's recovery stops here"))
                    if resume is None:
                        break
                    position = resume
                    continue
                if kind == _BLANK:
                    break
                position += size
                if len(rows) >= READ_BATCH_ROWS:
                    yield pa.RecordBatch.from_pylist(rows, schema=IMPORTED_SCHEMA)
                    rows = []
            if reached is not None:
                reached.position, reached.rows = position, ordinal - first_ordinal + 1
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=IMPORTED_SCHEMA)


@dataclass(frozen=True)
class DecodedRun:
    """The run of clean records at the start of a piece that the JVM decoder read: where it ended, its records, and
    the Arrow IPC file of their ``DECODED`` rows (``None`` without records)."""

    position: int
    rows: int
    file: str | None = None

    def batches(self, *, name: str, path: str, first_ordinal: int) -> Iterator[pa.RecordBatch]:
        """Its rows in ``IMPORTED_SCHEMA``, numbered from ``first_ordinal``; the bodies as ``binary_view`` values
        pointing into the store file ``path``, mapped (``binary_views``), not copied.

        Raises:
            ValueError: the file holds other columns or another number of rows than the JVM said, or a body
                outside the store file.
        """
        reader = pa.ipc.open_file(pa.memory_map(self.file))
        if not reader.schema.equals(_DECODED_SCHEMA):
            raise ValueError(f"{self.file}: the JVM decoder wrote columns {reader.schema}, not {_DECODED_SCHEMA}")
        store = pa.memory_map(path).read_buffer()
        segment, source = pa.scalar(name, pa.string()), pa.scalar(path, pa.string())
        given = 0
        for number in range(reader.num_record_batches):
            batch = reader.get_batch(number)
            count = batch.num_rows
            piece = {
                "segment": pa.repeat(segment, count),
                "batch_id": pa.nulls(count, pa.string()),
                "source_file": pa.repeat(source, count),
                "source_line": pa.array(np.arange(first_ordinal + given, first_ordinal + given + count)),
                "blank_end": pa.repeat(pa.scalar(False), count),
                "corrupt_reason": pa.nulls(count, pa.string()),
                "body": _bodies(store, batch, path=path),
            }
            arrays = [piece[field.name] if field.name in piece else batch.column(field.name) for field in
                      IMPORTED_SCHEMA]  # fmt: skip
            given += count
            yield pa.RecordBatch.from_arrays(arrays, schema=IMPORTED.schema.viewed_arrow_schema(arrays))
        if given != self.rows:
            raise ValueError(f"{self.file}: {given} rows, but the JVM decoder said {self.rows}")


_DECODED_SCHEMA = DECODED.arrow_schema


def _bodies(store: pa.Buffer, batch: pa.RecordBatch, *, path: str) -> pa.Array:
    """The bodies of a decoded batch, pointing into the mapped store file: one buffer from the batch's first body
    to its last (consecutive records), or the bodies copied where that span is 2 GiB or more."""
    starts = batch.column("body_at").to_numpy()
    lengths = batch.column("body_length").to_numpy()
    if not len(starts):
        return pa.array([], pa.binary())
    ends = starts + lengths
    low, high = int(starts.min()), int(ends.max())
    if low < 0 or high > store.size or (lengths < 0).any():
        raise ValueError(f"{path}: the JVM decoder placed bodies at bytes {low}..{high} of a {store.size}-byte file")
    if high - low >= 1 << 31:
        return pa.array([store.slice(int(at), int(n)).to_pybytes() for at, n in zip(starts, lengths)], pa.binary())
    return binary_views(store.slice(low, high - low), starts - low, lengths)


@dataclass
class WalkEnd:
    """Where a walk over a piece of a commitlog file stopped, and how many rows it gave."""

    position: int = 0
    rows: int = 0


@dataclass(frozen=True)
class FilePiece:
    """A byte range of one commitlog file, read by one import task."""

    path: str
    start_offset: int  # the file's first physical offset (its name)
    last: bool  # the newest file of the store
    start: int  # the piece's first byte in the file
    stop: int | None  # where the next piece starts; ``None``: the piece reaches the file end
    first_ordinal: int  # the ``source_line`` of the piece's first row
    records: int  # the records the TOTALSIZE walk found from ``start`` to ``stop`` (0 for the last piece)


def plan_pieces(path: str, *, start_offset: int, last: bool, piece_bytes: int) -> Iterator[FilePiece]:
    """``path`` cut into pieces of about ``piece_bytes``, at record starts found by walking the TOTALSIZE fields;
    each piece is given as soon as the walk has passed its end (the caller can start reading it).

    The walk checks no more than ``record_runs``' run walk does (a message magic code and a size that fits
    in the file) and reads 8 bytes a record. Where the file is damaged, the record walk may not land where
    this walk did: the pieces of a file then read differently from the whole file, and
    ``pieces_read_as_planned`` tells; the walk stops at the first record it cannot step over (the end-of-file
    blank, zeros, damage) and the last piece takes the rest of the file.
    """
    length = os.path.getsize(path)
    start, ordinal = 0, 1
    if length >= 2 * piece_bytes:
        unpack = _SIZE_AND_MAGIC.unpack_from
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            count = 0
            at, cut, limit = 0, piece_bytes, length - piece_bytes // 2  # no last piece under half a piece
            while at < limit:
                size, magic = unpack(data, at)
                if (magic != MAGIC_V1 and magic != MAGIC_V2) or size < MIN_RECORD_SIZE or size > length - at:
                    break
                at += size
                count += 1
                if at >= cut and at <= limit:
                    yield FilePiece(path, start_offset, last, start, at, ordinal, count)
                    start, ordinal, count, cut = at, ordinal + count, 0, at + piece_bytes
    yield FilePiece(path, start_offset, last, start, None, ordinal, 0)


def pieces_read_as_planned(pieces: list[FilePiece], reached: list[WalkEnd]) -> bool:
    """Whether the record walk over each piece but the last stopped where the next one starts, having given one
    row per record the planning walk found: the pieces then give the rows of the whole file, ``source_line``
    included."""
    return all(
        piece.stop is None or (end.position == piece.stop and end.rows == piece.records)
        for piece, end in zip(pieces, reached, strict=True)
    )


_SIZE_AND_MAGIC = struct.Struct(">ii")
_ZERO_CHUNK = bytes(1 << 22)
_MESSAGE, _BLANK, _BAD = "message", "blank", "bad"
_MAGICS = [struct.pack(">i", m) for m in (MAGIC_V1, MAGIC_V2, BLANK_MAGIC)]


def _zeros(data, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` is all zero bytes (the first 4 KiB first, then in 4 MiB chunks)."""
    head = min(start + 4096, end)
    if data[start:head] != _ZERO_CHUNK[: head - start]:
        return False
    for at in range(head, end, len(_ZERO_CHUNK)):
        upto = min(at + len(_ZERO_CHUNK), end)
        if data[at:upto] != _ZERO_CHUNK[: upto - at]:
            return False
    return True


def _written_end(data, length: int) -> int:
    """One past the last non-zero byte of the file (0 for a file of zeros)."""
    end = length
    while end > 0:
        at = max(0, end - len(_ZERO_CHUNK))
        kept = len(data[at:end].rstrip(b"\0"))
        if kept:
            return at + kept
        end = at
    return 0


class _SegmentReader:
    """Reads and checks one record at a time in one mapped commitlog file."""

    def __init__(self, data, length: int, *, name: str, path: str, start_offset: int, check_crc: bool):
        self.data, self.length, self.name, self.path = data, length, name, path
        self.start_offset, self.check_crc = start_offset, check_crc
        self.properties: dict[str, str] = {}  # the parsed properties of the last message read

    def read(self, position: int) -> tuple[str, int | None, object]:
        """(``message``, size, Record), (``blank``, size, None) or (``bad``, trusted size or None, reason)."""
        if self.length - position < 8:
            return _BAD, None, f"{self.length - position} bytes left, too few for a record header"
        try:
            record = decode_record(self.data, position, check_crc=self.check_crc)
        except CorruptRecordError as exc:
            return _BAD, exc.total_size, exc.reason
        if isinstance(record, BlankRecord):
            if position + record.total_size != self.length:
                return _BAD, None, f"blank record of TOTALSIZE {record.total_size} does not reach the file end"
            return _BLANK, record.total_size, None
        size = record.total_size
        if record.physical_offset != self.start_offset + position:
            return _BAD, size, f"PHYSICALOFFSET field is {record.physical_offset}"
        problem = record_error(record)
        if problem:
            return _BAD, size, problem
        try:
            self.properties = parse_properties(record.properties)
        except UnicodeDecodeError as exc:
            return _BAD, size, f"properties are not valid UTF-8 ({exc.reason} at byte {exc.start})"
        return _MESSAGE, size, record

    def resync(self, start: int) -> int | None:
        """The first position at or after ``start`` holding a message that passes every check, or the blank
        record ending the file; ``None`` when there is none."""
        found = [self.data.find(magic, start + 4) for magic in _MAGICS]
        while True:
            hits = [at for at in found if at >= 0]
            if not hits:
                return None
            candidate = min(hits) - 4
            if self.read(candidate)[0] != _BAD:
                return candidate
            found = [
                self.data.find(m, at + 1) if at == candidate + 4 else at for m, at in zip(_MAGICS, found, strict=True)
            ]

    def corrupt(self, ordinal: int, start: int, end: int, reason: str) -> dict:
        first, stop = self.start_offset + start, self.start_offset + end
        return _corrupt(self.name, self.path, first, stop - first, ordinal,
                        f"(bytes {first}-{stop}, {stop - first} bytes): {reason}")  # fmt: skip


def _blank(segment: str, path: str, offset: int, ordinal: int, size: int) -> dict:
    return {"segment": segment, "physical_offset": offset, "total_size": size, "source_file": path,
            "source_line": ordinal, "blank_end": True}  # fmt: skip


def _corrupt(segment: str, path: str, offset: int, size: int, ordinal: int, reason: str) -> dict:
    return {"segment": segment, "physical_offset": offset, "total_size": size, "source_file": path,
            "source_line": ordinal, "blank_end": False,
            "corrupt_reason": f"{path} at offset {offset} {reason}"}  # fmt: skip


# -- one import task: a piece of a commitlog file into the commitlog's staging folder ----------------------------


@dataclass(frozen=True)
class ImportTarget:
    """Where the import tasks of a run write, relative to the lake root."""

    lake_root: str
    storage_options: dict
    commitlog_dir: str  # the commitlog's staging folder of the run
    corrupt_dir: str  # a hidden folder in it: the corrupt rows, read by the driver only when there are any
    batch_id: str
    decoded_dir: str | None = None  # a hidden folder in it: the JVM decoder's files, a piece's gone once it is read

    def storage(self) -> Storage:
        return Storage(self.lake_root, self.storage_options)

    def decoded_file(self, number: int) -> str:
        return f"{self.decoded_dir}/piece-{number:05d}.arrow"


# What an import task returns: one row per piece read.
PIECE_READ = columns(
    ("path", "string", "the commitlog file"),
    ("number", "int", "the piece's number in the run"),
    ("position", "bigint", "where the record walk over the piece stopped"),
    ("rows", "bigint", "rows the walk gave: messages, corrupt ranges, the end-of-file blank"),
    ("messages", "bigint", "messages written"),
    ("corrupt", "bigint", "corrupt ranges"),
    ("blank", "boolean", "the piece ends with the file's end-of-file blank record"),
    ("message_file", "string", "the Parquet file of its messages, relative to the lake root (null: none)"),
    ("corrupt_file", "string", "the Parquet file of its corrupt rows, relative to the lake root (null: none)"),
    ("decoded", "bigint", "messages of it the JVM decoder read"),
)  # and ``queues``: ``QueueTotals.rows`` of its messages

_FLUSH_BYTES = 32 << 20  # messages are handed to the Parquet writer in about this many bytes


def import_piece(
    piece: FilePiece, *, number: int, target: ImportTarget, columnar: bool = True, decoded: DecodedRun | None = None
) -> dict:
    """Read ``piece`` and write its messages as a commitlog Parquet file of the run's staging folder (the rows a
    Spark write of ``read_segment_file``'s messages stages), its corrupt rows to ``target.corrupt_dir``.

    ``decoded``: the run of clean records at the piece's start that the JVM decoder read; its file is removed
    once the piece is written. When the file is gone (a task run again after it), the piece is read in Python.

    Files are written under a hidden name and moved into place: a retried task replaces them.
    """
    if decoded is not None and decoded.file is not None and not os.path.exists(decoded.file):
        decoded = None
    use_task_memory_pool()
    storage = target.storage()
    segment = os.path.basename(piece.path)
    name = f"part-{number:05d}-{target.batch_id}.parquet"
    messages = _BufferedParquet(
        AtomicParquet(
            storage,
            f"{target.commitlog_dir}/segment={segment}/{name}",
            row_group_size=1,
            write_behind=True,
            **COMMITLOG_WRITE_OPTIONS,
        ),
        row_group_bytes=COMMITLOG_ROW_GROUP_BYTES,
        views=True,
    )
    corrupt = _BufferedParquet(
        AtomicParquet(storage, f"{target.corrupt_dir}/{name}", row_group_size=1, compression="snappy"),
        row_group_bytes=COMMITLOG_ROW_GROUP_BYTES,
    )
    reached = WalkEnd()
    blank = False
    queues = QueueTotals()
    stored = COMMITLOG_FILE.stored
    batch_ids = pa.repeat(pa.scalar(target.batch_id, pa.string()), 0)
    for batch in read_segment_file(piece.path, start_offset=piece.start_offset, last=piece.last, columnar=columnar,
                                   start=piece.start, stop=piece.stop, first_ordinal=piece.first_ordinal,
                                   reached=reached, decoded=decoded):  # fmt: skip
        is_corrupt = batch.column("corrupt_reason").is_valid()
        is_message = pc.and_(pc.invert(batch.column("blank_end")), pc.invert(is_corrupt))
        kept = batch if pc.all(is_message).as_py() else batch.filter(is_message)
        if kept.num_rows:
            if len(batch_ids) != kept.num_rows:
                batch_ids = pa.repeat(pa.scalar(target.batch_id, pa.string()), kept.num_rows)
            arrays = [batch_ids if n == "batch_id" else kept.column(n) for n in stored.names]
            table = COMMITLOG_FILE.complete(pa.Table.from_arrays(arrays, schema=stored.viewed_arrow_schema(arrays)))
            messages.write(table)
            queues.add(table)
        if kept.num_rows < batch.num_rows:
            corrupt.write(pa.Table.from_batches([batch.filter(is_corrupt)]))
            blank = blank or pc.any(batch.column("blank_end")).as_py()
    written = {"messages": messages.close(), "corrupt": corrupt.close(), "decoded": decoded.rows if decoded else 0}
    if decoded is not None and decoded.file is not None:
        os.remove(decoded.file)  # its pages need not reach the disk
    return {
        "path": piece.path,
        "number": number,
        "position": reached.position,
        "rows": reached.rows,
        **written,
        "blank": blank,
        "message_file": messages.relative(),
        "corrupt_file": corrupt.relative(),
        "queues": queues.rows(segment),
    }


class QueueTotals:
    """Per topic and queue of the messages added: count, bytes, end of data, the store times of the first and
    the last message (by offset), the last queue offset taken by a message that is dispatched (NOT_TYPE or
    COMMIT). Tables are added in offset order."""

    def __init__(self):
        self.queues: dict[tuple[str, int], list] = {}

    def add(self, table: pa.Table) -> None:
        offsets = table.column("physical_offset")
        kind = pc.bit_wise_and(table.column("sys_flag"), TRANSACTION_TYPE_MASK)
        dispatched = pc.is_in(kind, pa.array([TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE], kind.type))
        columns = {
            "topic": table.column("topic"),
            "queue_id": table.column("queue_id"),
            "size": pc.cast(table.column("total_size"), pa.int64()),
            "end": pc.add(offsets, pc.cast(table.column("total_size"), pa.int64())),
            "offset": offsets,
            "stored": table.column("store_timestamp"),
            "dispatched": pc.if_else(dispatched, table.column("queue_offset"), None),
        }
        grouped = pa.table(columns).group_by(["topic", "queue_id"], use_threads=False)  # ordered: first and last
        aggregates = [("offset", "count"), ("size", "sum"), ("end", "max"), ("offset", "first"), ("stored", "first"),
                      ("offset", "last"), ("stored", "last"), ("dispatched", "max")]  # fmt: skip
        for row in grouped.aggregate(aggregates).to_pylist():
            first = (row["offset_first"], row["stored_first"])
            last = (row["offset_last"], row["stored_last"])
            seen = self.queues.get((row["topic"], row["queue_id"]))
            if seen is None:
                self.queues[(row["topic"], row["queue_id"])] = [
                    row["offset_count"], row["size_sum"], row["end_max"], first, last, row["dispatched_max"]
                ]  # fmt: skip
                continue
            seen[0] += row["offset_count"]
            seen[1] += row["size_sum"]
            seen[2] = max(seen[2], row["end_max"])
            seen[3] = min(seen[3], first)
            seen[4] = max(seen[4], last)
            if row["dispatched_max"] is not None:
                seen[5] = row["dispatched_max"] if seen[5] is None else max(seen[5], row["dispatched_max"])

    def rows(self, segment: str) -> list[dict]:
        """The totals as rows of (segment, topic, queue), as a group-by of the staged messages gives them."""
        return [
            {
                "segment": segment,
                "topic": topic,
                "queue_id": queue,
                "n": count,
                "b": size,
                "data_end": end,
                "first_offset": first[0],
                "first_store_timestamp": first[1],
                "last_offset": last[0],
                "last_store_timestamp": last[1],
                "last_dispatched": dispatched,
            }
            for (topic, queue), (count, size, end, first, last, dispatched) in sorted(self.queues.items())
        ]


class _BufferedParquet:
    """Tables gathered and written a few tens of MB at a time, in row groups of about ``row_group_bytes``: the
    record walk hands over runs of thousands of rows and single rows alike."""

    def __init__(self, file: AtomicParquet, *, row_group_bytes: int, views: bool = False):
        self.file, self.row_group_bytes, self.views = file, row_group_bytes, views
        self.pending: list[pa.Table] = []
        self.pending_bytes = 0
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self.views:  # one type, whether the rows come from the JVM's run or from the Python reader
            table = as_views(table)
        self.pending.append(table)
        self.pending_bytes += value_bytes(table)
        self.rows += table.num_rows
        if self.pending_bytes >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        table = pa.concat_tables(self.pending) if len(self.pending) > 1 else self.pending[0]
        self.pending, self.pending_bytes = [], 0
        self.file.row_group_size = max(1, int(self.row_group_bytes * table.num_rows / max(value_bytes(table), 1)))
        self.file.write(table)

    def close(self) -> int:
        """Writes what is pending and puts the file in place (none without rows); the rows written."""
        self.flush()
        self.file.close()
        return self.rows

    def relative(self) -> str | None:
        return self.file.relative if self.rows else None


def import_files(files: list[tuple[str, int, bool]], *, target: ImportTarget, piece_bytes: int, submit) -> list[dict]:
    """Import commitlog files (path, first physical offset, newest file) as pieces of about ``piece_bytes``.

    ``submit(tasks)`` starts ``import_task`` over a list of tasks (on Spark's executors, or in a plain loop)
    and returns a future of their results. The files too small to cut go in one submission, a piece of a big
    file as soon as it is planned, so that reading the first pieces overlaps planning the rest. A file whose
    pieces did not read as planned (``pieces_read_as_planned``: damage the planning walk stepped over) loses
    what its pieces wrote and is read again as one piece. Returns the ``PIECE_READ`` rows of what was kept.
    """
    tasks: list[dict] = []

    def task(piece: FilePiece) -> dict:
        tasks.append({"piece": piece, "number": len(tasks)})
        return tasks[-1]

    small = {path for path, _, _ in files if os.path.getsize(path) < 2 * piece_bytes}
    planned: list[list[dict]] = []  # per file, its tasks
    for path, start, last in files:
        if path in small:
            planned.append([task(FilePiece(path, start, last, 0, None, 1, 0))])
    waiting = [submit([one for (one,) in planned])] if planned else []
    for path, start, last in files:
        if path in small:
            continue
        planned.append([])
        for piece in plan_pieces(path, start_offset=start, last=last, piece_bytes=piece_bytes):
            planned[-1].append(task(piece))
            waiting.append(submit([planned[-1][-1]]))
    results = {result["number"]: result for future in waiting for result in future.result()}
    again: list[dict] = []
    storage = target.storage()
    for file_tasks in planned:
        reached = [WalkEnd(results[t["number"]]["position"], results[t["number"]]["rows"]) for t in file_tasks]
        if pieces_read_as_planned([t["piece"] for t in file_tasks], reached):
            continue
        for t in file_tasks:
            read = results.pop(t["number"])
            for written in (read["message_file"], read["corrupt_file"]):
                if written is not None:
                    storage.delete_file(written)
        again.append(task(replace(file_tasks[0]["piece"], stop=None, records=0)))
    if again:
        results.update((result["number"], result) for result in submit(again).result())
    return [results[n] for n in sorted(results)]


def import_task(task: dict, *, target: ImportTarget) -> dict:
    """``import_piece`` of one task of ``import_files``, read in Python."""
    return import_piece(task["piece"], number=task["number"], target=target)


DECODE_JOB = "rmqlake.jvm.StoreRecords"


def numbered_decode_line(task: dict, target: ImportTarget) -> str:
    """The JVM decoder's line for a task of ``import_files``: its number, then ``decode_task_line``'s fields."""
    file = target.storage().file_path(target.decoded_file(task["number"]))
    return f"{task['number']}\t{decode_task_line(task['piece'], file)}"


def import_decoded(answer: str, *, tasks: Mapping[int, dict], target: ImportTarget) -> dict:
    """``import_piece`` of the task a JVM decoder's answer line (its task number, then ``decoded_run``'s fields)
    is for, with the run it decoded; with the JVM code's reason under ``jvm_gave_up`` when it gave the piece up."""
    number, _, decoded = answer.partition("\t")
    task = tasks[int(number)]
    run = decoded_run(decoded, file=target.storage().file_path(target.decoded_file(task["number"])))
    if isinstance(run, str):
        return {**import_piece(task["piece"], number=task["number"], target=target), "jvm_gave_up": run}
    return import_piece(task["piece"], number=task["number"], target=target, decoded=run)


def decode_task_line(piece: FilePiece, file: str, *, check_crc: bool = True) -> str:
    """The JVM decoder's task for ``piece`` (``StoreRecords.decoding`` takes it after the task's number): its file,
    where the file's offsets start, the piece's bytes (-1: to the file's end), whether body CRCs are checked, and
    the Arrow IPC file to write."""
    stop = -1 if piece.stop is None else piece.stop
    fields = (piece.path, piece.start_offset, piece.start, stop, int(check_crc), file)
    return "\t".join(str(field) for field in fields)


def decoded_run(answer: str, *, file: str) -> DecodedRun | str:
    """The run of a decoder task's answer line (``file`` holds its rows), or why the JVM code gave the piece up."""
    fields = answer.split("\t")
    if fields[0] == "gave up":
        return fields[1] if len(fields) > 1 else "no reason given"
    position, rows = int(fields[0]), int(fields[1])
    return DecodedRun(position, rows, file if rows else None)


def jvm_can_decode(files: list[tuple[str, int, bool]], target: ImportTarget) -> bool:
    """Whether the JVM decoder can read the store's files and write into the lake: both on a local disk, their
    paths passable to the job (UTF-8 without tabs or line breaks)."""
    return (
        target.decoded_dir is not None
        and is_local(target.lake_root)
        and passable(target.storage().file_path(target.decoded_dir))
        and all(passable(path) for path, _, _ in files)
    )
