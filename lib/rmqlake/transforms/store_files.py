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
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from rmqlake.formats.consumequeue import CQ_UNIT_SIZE, PRE_BLANK_UNIT, encode_unit
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.indexfile import HEADER_SIZE, IndexEntry, IndexHeader, entry_position
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.properties import KEYS, TAGS, UNIQ_KEY, parse_properties, split_keys
from rmqlake.formats.record import (
    BlankRecord,
    CorruptRecordError,
    Record,
    decode_record,
    encode_blank,
    encode_record,
)
from rmqlake.lake.tables import COMMITLOG, MESSAGE_COLUMNS, TableSpec

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
    record), ``sealed``, ``file_size``, ``files`` (Parquet URIs), ``out``.
    """
    start, data_end, size = task["start_offset"], task["data_end"], task["file_size"]
    path = Path(task["out"]) / "commitlog" / task["segment"]
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

    ``task``: ``topic``, ``queue_id``, ``cq_file``, ``file_size``,
    ``first_in_queue`` (the queue's first file: units before its first unit
    are the broker's pre-blank units), ``files``, ``out``.
    """
    base = int(task["cq_file"])
    path = Path(task["out"]) / "consumequeue" / task["topic"] / str(task["queue_id"]) / task["cq_file"]
    columns = ["queue_offset", "commitlog_offset", "size", "tags_code"]
    positions = []
    with _preallocated(path, task["file_size"]) as handle:
        for batch in _batches(task["files"], columns):
            for queue_offset, commitlog_offset, size, tags in zip(
                *(batch.column(c).to_pylist() for c in columns), strict=True
            ):
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
    return {"file": f"consumequeue/{task['topic']}/{task['queue_id']}/{task['cq_file']}", "units": len(positions)}


def write_index_file(task: dict) -> dict:
    """Write index file ``task["index_file"]``: header, slot table (each slot: its newest entry), entries.

    ``task``: ``index_file``, ``header`` (the ``indexfile_header`` row),
    ``slots``, ``file_size``, ``files``, ``out``.
    """
    slots = task["slots"]
    path = Path(task["out"]) / "index" / task["index_file"]
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
    return {"file": f"index/{task['index_file']}", "entries": entries}


# -- import ------------------------------------------------------------------------------------

# one row per record read: the commitlog's columns, or the end-of-file blank / a corrupt record (flags)
IMPORTED = TableSpec(
    "imported_records", "segment string, " + MESSAGE_COLUMNS + ", blank_end boolean, corrupt_reason string"
)
IMPORTED_SCHEMA = IMPORTED.arrow_schema


def read_segment_file(path: str, *, start_offset: int, check_crc: bool = True) -> Iterator[pa.RecordBatch]:
    """The records of one commitlog file, as the broker's recovery walks it.

    A blank record ends the segment (a row with ``blank_end``); four zero
    bytes of TOTALSIZE end the written data (a partially written last
    segment). A corrupt record whose size is known (CRC or size mismatch) is
    reported and skipped, as reput skips it; one whose size cannot be
    trusted is reported and ends the walk of this file.
    """
    name = os.path.basename(path)
    rows: list[dict] = []
    with open(path, "rb") as handle:
        length = os.fstat(handle.fileno()).st_size
        if length == 0:
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            position = 0
            ordinal = 0
            while position < length:
                if position + 4 > length or data[position : position + 4] == b"\0\0\0\0":
                    break  # end of the written data
                ordinal += 1
                offset = start_offset + position
                try:
                    record = decode_record(data, position, check_crc=check_crc)
                except CorruptRecordError as exc:
                    rows.append(_corrupt(name, path, offset, ordinal, exc.reason))
                    if exc.total_size is None:
                        break
                    position += exc.total_size
                    continue
                if isinstance(record, BlankRecord):
                    if position + record.total_size != length:
                        rows.append(_corrupt(name, path, offset, ordinal, "blank record does not reach the file end"))
                    rows.append(_blank(name, path, offset, ordinal, record.total_size))
                    break
                if record.physical_offset != offset:
                    rows.append(
                        _corrupt(name, path, offset, ordinal, f"PHYSICALOFFSET field is {record.physical_offset}")
                    )
                    position += record.total_size
                    continue
                rows.append(_message_row(name, path, ordinal, record))
                position += record.total_size
                if len(rows) >= READ_BATCH_ROWS:
                    yield pa.RecordBatch.from_pylist(rows, schema=IMPORTED_SCHEMA)
                    rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=IMPORTED_SCHEMA)


def _message_row(segment: str, path: str, ordinal: int, record: Record) -> dict:
    properties = parse_properties(record.properties)
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


def _corrupt(segment: str, path: str, offset: int, ordinal: int, reason: str) -> dict:
    return {"segment": segment, "physical_offset": offset, "source_file": path, "source_line": ordinal,
            "blank_end": False, "corrupt_reason": f"{path} at offset {offset}: {reason}"}  # fmt: skip
