"""Broker store files from table data files and back: what one Spark task does for one file (executor side).

Export tasks read the Parquet data files of one commitlog segment, one CQ
file or one index file straight from the lake (their paths come from the
Delta log, so no shuffle), and write each record, unit or entry at its
byte position with ``formats`` encoders: rows may come in any order, only
coverage is checked. Files are written at the broker's preallocated size;
bytes never written are zeros (a sparse file on most file systems).

The import task walks one commitlog file record by record, as the broker's
recovery does, and returns Arrow batches of commitlog rows and of corrupt
records (file, offset, reason).
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from rmqlake.formats.compaction import SPARSE_END_UNIT, encode_sparse_unit, place_records
from rmqlake.formats.consumequeue import CQ_UNIT_SIZE, PRE_BLANK_UNIT, encode_unit
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.indexfile import HEADER_SIZE, IndexEntry, IndexHeader, entry_position
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.properties import KEYS, TAGS, UNIQ_KEY, parse_properties, split_keys
from rmqlake.formats.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    BlankRecord,
    CorruptRecordError,
    Record,
    decode_record,
    encode_blank,
    encode_record,
    record_error,
)
from rmqlake.lake.tables import COMMITLOG, TableSpec, columns

# the stored columns a record's bytes come from (the rest are derived from them or are provenance)
RECORD_COLUMNS = [
    name
    for name in COMMITLOG.columns
    if name not in ("segment", "properties", "keys", "tags", "uniq_key", "msg_id", "batch_id")
    and not name.startswith("source_")
]
READ_BATCH_ROWS = 2048


def _batches(uris: Sequence[str], columns: list[str]) -> Iterator[pa.RecordBatch]:
    for uri in uris:
        filesystem, path = pafs.FileSystem.from_uri(uri) if "://" in uri else (pafs.LocalFileSystem(), uri)
        with filesystem.open_input_file(path) as handle:
            yield from pq.ParquetFile(handle).iter_batches(batch_size=READ_BATCH_ROWS, columns=columns)


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


def write_segment(task: dict) -> dict:
    """Write commitlog segment ``task["segment"]`` (records, then the blank record of a sealed segment).

    ``task``: ``segment``, ``start_offset``, ``data_end`` (end of its last
    record), ``sealed``, ``file_size``, ``mtime_ms`` (the file's last-modified
    time, optional), ``files`` (Parquet URIs), ``out``.
    """
    start, data_end, size = task["start_offset"], task["data_end"], task["file_size"]
    path = _inside(task["out"], "commitlog", task["segment"])
    spans: list[tuple[int, int]] = []
    with _preallocated(path, size) as handle:
        for batch in _batches(task["files"], RECORD_COLUMNS):
            for row in batch.to_pylist():
                encoded = encode_record(record_from_row(row))
                if len(encoded) != row["total_size"]:
                    raise ValueError(
                        f"segment {task['segment']}: record at {row['physical_offset']} encodes to {len(encoded)} "
                        f"bytes, its total_size is {row['total_size']}"
                    )
                handle.seek(row["physical_offset"] - start)
                handle.write(encoded)
                spans.append((row["physical_offset"], len(encoded)))
        _check_covered(spans, start, data_end, f"segment {task['segment']}")
        if task["sealed"]:  # the 8-byte end-of-file marker: TOTALSIZE = every byte left after the last record
            handle.seek(data_end - start)
            handle.write(encode_blank(start + size - data_end))
    _set_mtime(path, task.get("mtime_ms"))
    last = max((offset for offset, _ in spans), default=None)
    return {
        "file": f"commitlog/{task['segment']}",
        "records": len(spans),
        "bytes": data_end - start,
        "last_offset": last,
    }


def record_from_row(row: dict) -> Record:
    """The record of a ``commitlog`` row: its stored fields and stored properties bytes (bytes as written)."""
    return Record(
        topic=row["topic"],
        queue_id=row["queue_id"],
        flag=row["flag"],
        queue_offset=row["queue_offset"],
        physical_offset=row["physical_offset"],
        sys_flag=row["sys_flag"],
        born_timestamp=row["born_timestamp"],
        born_host=parse_host(row["born_host"]),
        store_timestamp=row["store_timestamp"],
        store_host=parse_host(row["store_host"]),
        reconsume_times=row["reconsume_times"],
        prepared_transaction_offset=row["prepared_transaction_offset"],
        body=row["body"] or b"",
        properties=row["properties_bytes"] or b"",
        magic=row["magic"],
        body_crc=row["body_crc"],
    )


def write_cq_file(task: dict) -> dict:
    """Write CQ file ``task["cq_file"]`` of one queue: each unit at ``queue_offset * 20`` minus the file's start.

    Its modification time is the store time of its last unit (the broker
    writes a unit as it dispatches the message).

    ``task``: ``topic``, ``queue_id``, ``cq_file``, ``file_size``,
    ``first_in_queue`` (the queue's first file: units before its first unit
    are the broker's pre-blank units), ``files``, ``out``.
    """
    base = int(task["cq_file"])
    path = _inside(task["out"], "consumequeue", task["topic"], str(task["queue_id"]), task["cq_file"])
    columns = ["queue_offset", "commitlog_offset", "size", "tags_code", "store_timestamp"]
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


def write_index_file(task: dict) -> dict:
    """Write index file ``task["index_file"]``: header, slot table (each slot: its newest entry), entries.

    Its modification time is the header's end timestamp: the store time of
    the last entry put (a file without entries keeps the time it is written).

    ``task``: ``index_file``, ``header`` (the ``indexfile_header`` row),
    ``slots``, ``file_size``, ``files``, ``out``.
    """
    slots = task["slots"]
    path = _inside(task["out"], "index", task["index_file"])
    columns = ["index_no", "key_hash", "slot", "phy_offset", "time_diff", "prev_index"]
    heads = array("i", bytes(4 * slots))
    entries = 0
    with _preallocated(path, task["file_size"]) as handle:
        header = task["header"]
        handle.write(
            IndexHeader(
                header["begin_timestamp"],
                header["end_timestamp"],
                header["begin_phy_offset"],
                header["end_phy_offset"],
                header["hash_slot_count"],
                header["index_count"],
            ).encode()
        )
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


# -- import ------------------------------------------------------------------------------------

# one row per record read: the commitlog's columns, or the end-of-file blank / a corrupt record (flags)
IMPORTED = TableSpec(
    "imported_records",
    COMMITLOG.schema
    + columns(
        ("blank_end", "boolean", "the row is the 8-byte end-of-file blank, not a message"),
        ("corrupt_reason", "string", "why the bytes here are not a valid record, or null"),
    ),
)
IMPORTED_SCHEMA = IMPORTED.arrow_schema


def read_segment_file(
    path: str, *, start_offset: int, last: bool = True, check_crc: bool = True
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
                ordinal += 1
                kind, size, value = reader.read(position)
                if kind == _BAD and size is None and _zeros(data, position, length):  # no record from here on
                    if not last:
                        reason = "zeros up to the file end: no end-of-file blank record, yet a newer file follows"
                        rows.append(reader.corrupt(ordinal, position, length, reason))
                    break
                if kind == _MESSAGE:
                    rows.append(_message_row(name, path, ordinal, value, reader.properties))
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


def _message_row(segment: str, path: str, ordinal: int, record: Record, properties: dict[str, str]) -> dict:
    return {
        "segment": segment,
        "physical_offset": record.physical_offset,
        "total_size": record.total_size,
        "magic": record.magic,
        "body_crc": record.body_crc,
        "queue_id": record.queue_id,
        "flag": record.flag,
        "queue_offset": record.queue_offset,
        "sys_flag": record.sys_flag,
        "born_timestamp": record.born_timestamp,
        "born_host": record.born_host.text,
        "store_timestamp": record.store_timestamp,
        "store_host": record.store_host.text,
        "reconsume_times": record.reconsume_times,
        "prepared_transaction_offset": record.prepared_transaction_offset,
        "body": record.body,
        "topic": record.topic,
        "properties": list(properties.items()),
        "keys": split_keys(properties.get(KEYS)),
        "tags": properties.get(TAGS),
        "uniq_key": properties.get(UNIQ_KEY),
        "msg_id": offset_msg_id(record.store_host, record.physical_offset),
        "source_file": path,
        "source_line": ordinal,
        "properties_bytes": record.properties,
        "blank_end": False,
        "corrupt_reason": None,
    }


def _blank(segment: str, path: str, offset: int, ordinal: int, size: int) -> dict:
    return {"segment": segment, "physical_offset": offset, "total_size": size, "source_file": path,
            "source_line": ordinal, "blank_end": True}  # fmt: skip


def _corrupt(segment: str, path: str, offset: int, size: int, ordinal: int, reason: str) -> dict:
    return {"segment": segment, "physical_offset": offset, "total_size": size, "source_file": path,
            "source_line": ordinal, "blank_end": False,
            "corrupt_reason": f"{path} at offset {offset} {reason}"}  # fmt: skip
