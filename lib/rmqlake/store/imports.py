"""Commitlog rows from broker store files: what one import task does to one commitlog file (executor side).

The task walks the file record by record, as the broker's recovery does,
and returns Arrow batches of commitlog rows, of the end-of-file blank and
of corrupt records (file, offset, reason).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator

import pyarrow as pa

from rmqlake.formats.properties import parse_properties
from rmqlake.formats.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    BlankRecord,
    CorruptRecordError,
    decode_record,
    record_error,
)
from rmqlake.lake.tables import COMMITLOG, TableSpec, columns
from rmqlake.store.record_runs import read_run
from rmqlake.store.rows import READ_BATCH_ROWS, row_from_record

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


def read_segment_file(
    path: str, *, start_offset: int, last: bool = True, check_crc: bool = True, columnar: bool = True
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
    """
    name = os.path.basename(path)
    rows: list[dict] = []
    with open(path, "rb") as handle:
        length = os.fstat(handle.fileno()).st_size
        if length == 0:
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            reader = _SegmentReader(data, length, name=name, path=path, start_offset=start_offset, check_crc=check_crc)
            position = 0
            ordinal = 0
            while position < length:
                if columnar:
                    run = read_run(data, position, length, start_offset=start_offset, name=name, path=path,
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
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=IMPORTED_SCHEMA)


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
