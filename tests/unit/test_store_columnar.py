"""The column-wise export writers against the per-record reference: the same bytes, files and errors.

Commitlog segments, CQ files and index files are written both ways from the
same Parquet files (rows shuffled, several files, odd records) and compared
byte for byte; rows the reference refuses raise the same error both ways.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqlake.formats.crc import body_crc
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    MAGIC_V1,
    MAGIC_V2,
    MULTI_TAGS_FLAG,
    STOREHOST_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Record,
    encode_blank,
    encode_record,
)
from rmqlake.lake.tables import COMMITLOG, CONSUMEQUEUE, INDEXFILE
from rmqlake.store import IMPORTED_SCHEMA, export, read_segment_file, record_runs
from rmqlake.store.columnar import encode_record_batch
from rmqlake.store.record_runs import _parsed_per_string, _parsed_properties, read_run
from rmqlake.store.rows import RECORD_COLUMNS, record_from_row
from tests.unit.test_store_fuzz import FUZZ, mutated

FUZZ_BOTH = settings(FUZZ, max_examples=100)
SCHEMA = pa.schema([COMMITLOG.arrow_schema.field(name) for name in RECORD_COLUMNS])
V4, V6 = parse_host("10.0.0.7:50100"), parse_host("[2001:db8::7]:50200")
V6_STORE = parse_host("[fe80::1]:10911")
STORE = parse_host("192.168.1.10:10911")


def _record(number: int, rng: random.Random) -> Record:
    """A record of odd shape ``number`` picks: hosts, topics, bodies, properties, flags, magic."""
    born = (V4, V6, V6_STORE)[number % 3]
    store = (STORE, V6_STORE)[number % 2 if number % 7 else 0]
    topic = ("OrderEvents", "主题-" * 30, "t" * 127, "T" * 128, "%RETRY%group", "x" * 3000)[number % 6]
    body = (b"", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))), b"\0" * 5)[number % 3]
    properties = (
        b"",
        f"KEYS\x01k{number} k{number + 1}\x02UNIQ_KEY\x01U{number:04d}\x02TAGS\x01\xe2\x9c\x93".encode(),
        b"A\x01" + b"v" * 32765 if number % 11 == 0 else b"DELAY\x013\x02",
    )[number % 3]
    kind = (0, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE)[number % 4]
    flags = kind | (COMPRESSED_FLAG if number % 5 == 0 else 0) | (MULTI_TAGS_FLAG if number % 9 == 0 else 0)
    flags |= (BORNHOST_V6_FLAG if born.is_ipv6 else 0) | (STOREHOST_V6_FLAG if store.is_ipv6 else 0)
    return Record(
        topic=topic,
        queue_id=number % 8,
        flag=(-1, 0, 2**31 - 1)[number % 3],
        queue_offset=number * 3,
        physical_offset=0,
        sys_flag=flags,
        born_timestamp=-(2**63) if number == 4 else 1_795_219_200_000 + number,
        born_host=born,
        store_timestamp=2**63 - 1 if number == 5 else 1_795_219_200_000 + number,
        store_host=store,
        reconsume_times=number % 17,
        prepared_transaction_offset=(0, 12345, 2**62)[number % 3],
        body=body,
        properties=properties,
        magic=MAGIC_V1 if len(topic.encode()) <= 127 and number % 4 else MAGIC_V2,
        body_crc=(body_crc(body), 0, 2**31 - 1, -5)[number % 4],
    )


def _rows(count: int, *, start: int = 0, seed: int = 1) -> list[dict]:
    """``count`` placed records from ``start`` as ``commitlog`` rows (in file order)."""
    rng = random.Random(seed)
    rows, offset = [], start
    for number in range(count):
        record = replace(_record(number, rng), physical_offset=offset)
        size = record.computed_size()
        row = {name: getattr(record, name, None) for name in RECORD_COLUMNS}
        row.update(born_host=record.born_host.text, store_host=record.store_host.text,
                   properties_bytes=record.properties, total_size=size)  # fmt: skip
        rows.append(row)
        offset += size
    return rows


def _reference_bytes(rows: list[dict]) -> bytes:
    return b"".join(encode_record(record_from_row(row)) for row in rows)


def test_a_batch_encodes_to_the_reference_bytes():
    rows = _rows(132)
    encoded = encode_record_batch(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    assert encoded is not None
    assert bytes(encoded.data[encoded.starts[0] : encoded.starts[-1]]) == _reference_bytes(rows)
    assert encoded.total_size.tolist() == [r["total_size"] for r in rows]
    assert encoded.physical_offset.tolist() == [r["physical_offset"] for r in rows]


def test_null_body_and_properties_are_empty_bytes_both_ways():
    rows = [dict(r) for r in _rows(6)]
    for row in rows:
        if not row["body"]:
            row["body"] = None
        if not row["properties_bytes"]:
            row["properties_bytes"] = None
    encoded = encode_record_batch(pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
    assert bytes(encoded.data[: encoded.starts[-1]]) == _reference_bytes(rows)


@pytest.mark.parametrize(
    "change",
    [
        {"sys_flag": 0x10},  # an IPv6 bit the IPv4 hosts do not have
        {"topic": "T" * 128, "magic": MAGIC_V1},  # too long for a one-byte length
        {"topic": "t" * 32768, "magic": MAGIC_V2},
        {"properties_bytes": b"p" * 32768},
        {"total_size": 99},
        {"magic": 0x1234},
        {"queue_id": None},
        {"body_crc": None},  # the reference takes the CRC of the body
        {"born_host": "not-a-host"},
        {"store_host": "1.2.3.4:70000"},
        {"store_host": "[::ffff:1.2.3.4]:80"},  # reads as IPv4, as Java does
    ],
    ids=lambda c: ",".join(c),
)
def test_rows_the_columnar_encoder_leaves_go_through_the_reference(change, tmp_path):
    rows = _rows(8, start=4096)
    rows[5] = {**rows[5], "born_host": V4.text, "store_host": STORE.text, "sys_flag": 0, **change}
    assert encode_record_batch(pa.RecordBatch.from_pylist(rows, schema=SCHEMA)) is None
    outcomes = []
    for columnar in (True, False):
        task = _segment_task(tmp_path, [rows], start=4096, columnar=columnar)
        try:
            export.write_segment(task, columnar=columnar)
        except Exception as exc:
            outcomes.append((type(exc), str(exc)))
            continue
        outcomes.append((tmp_path / f"out-{columnar}" / "commitlog" / task["segment"]).read_bytes())
    assert outcomes[0] == outcomes[1]


def _segment_task(tmp_path, parts: list[list[dict]], *, start: int, columnar: bool, size: int | None = None,
                  data_end: int | None = None, sealed: bool = True) -> dict:  # fmt: skip
    files = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for number, rows in enumerate(parts):
        path = tmp_path / f"part-{columnar}-{number}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, row_group_size=7)
        files.append(str(path))
    every = [r for rows in parts for r in rows]
    end = max((r["physical_offset"] + r["total_size"] for r in every), default=start)
    return {
        "segment": f"{start:020d}",
        "start_offset": start,
        "data_end": end if data_end is None else data_end,
        "sealed": sealed,
        "file_size": size or (end - start + 64),
        "mtime_ms": 1_795_219_200_123,
        "files": files,
        "out": str(tmp_path / f"out-{columnar}"),
    }


def _both_segments(tmp_path, parts, monkeypatch, **options) -> tuple[bytes, bytes]:
    monkeypatch.setattr(export, "SEGMENT_BATCH_ROWS", 5)  # records of one file span several batches
    monkeypatch.setattr(export, "_WRITE_BEHIND_BYTES", 1)  # every write asks for writeback
    results, data = [], []
    for columnar in (True, False):
        task = _segment_task(tmp_path, parts, columnar=columnar, **options)
        results.append(export.write_segment(task, columnar=columnar))
        data.append((tmp_path / f"out-{columnar}" / "commitlog" / task["segment"]).read_bytes())
    assert results[0] == results[1]
    return data[0], data[1]


def test_a_segment_is_the_same_file_both_ways_rows_in_any_order(tmp_path, monkeypatch):
    rows = _rows(60, start=1 << 20)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    columnar, reference = _both_segments(tmp_path, [shuffled[:25], shuffled[25:]], monkeypatch, start=1 << 20)
    assert columnar == reference
    assert reference[: sum(r["total_size"] for r in rows)] == _reference_bytes(rows)


def test_a_segment_ending_exactly_full_or_unsealed_is_the_same_file_both_ways(tmp_path, monkeypatch):
    rows = _rows(12)
    end = sum(r["total_size"] for r in rows)
    full = _both_segments(tmp_path / "full", [rows], monkeypatch, start=0, size=end + 8)  # the blank is 8 bytes
    assert full[0] == full[1] and full[0][-8:-4] == (8).to_bytes(4, "big")
    open_ = _both_segments(tmp_path / "open", [rows], monkeypatch, start=0, sealed=False)
    assert open_[0] == open_[1] and not any(open_[0][end:])
    empty = _both_segments(tmp_path / "empty", [], monkeypatch, start=0, size=64)
    assert empty[0] == empty[1]


def test_a_segment_written_straight_to_the_disk_is_the_reference_file(tmp_path, monkeypatch):
    """Runs of records long enough for whole 4 KiB blocks: those go through O_DIRECT, the blocks at a run's ends
    through the page cache, from two threads, runs in any order; the file is the one the reference writes
    through the page cache alone."""
    monkeypatch.setattr(export, "SEGMENT_BATCH_ROWS", 64)
    opened = []

    class Recorded(export._SegmentFile):
        def __init__(self, *args):
            super().__init__(*args)
            opened.append(self)

    monkeypatch.setattr(export, "_SegmentFile", Recorded)
    rows = _rows(700, start=1 << 20)
    chunks = [rows[at : at + 50] for at in range(0, len(rows), 50)]
    random.Random(5).shuffle(chunks)
    parts = [[r for chunk in chunks[:7] for r in chunk], [r for chunk in chunks[7:] for r in chunk]]
    results, data = [], []
    for columnar in (True, False):
        task = _segment_task(tmp_path, parts, columnar=columnar, start=1 << 20)
        results.append(export.write_segment(task, columnar=columnar))
        data.append((tmp_path / f"out-{columnar}" / "commitlog" / task["segment"]).read_bytes())
    assert results[0] == results[1]
    assert data[0] == data[1]
    assert data[1][: sum(r["total_size"] for r in rows)] == _reference_bytes(rows)
    assert len(opened) == 1 and opened[0].direct_bytes > 0  # the reference opens none


@pytest.mark.parametrize("refused", [None, "open", "write"])
def test_segment_file_writes_put_every_byte_where_plain_writes_do(refused, tmp_path, monkeypatch):
    """Runs at unaligned positions, in any order, from two threads, across more than one aligned buffer; and a
    file system that refuses O_DIRECT when the file is opened, or at its first write: the same bytes as plain
    writes, and straight to the disk only where O_DIRECT was taken."""
    rng = random.Random(9)
    data = rng.randbytes(300_000)
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    spans = list(zip([0, *cuts], [*cuts, len(data)], strict=True))
    rng.shuffle(spans)
    base = 100  # every run starts off a block boundary
    monkeypatch.setattr(export, "DIRECT_BUFFER_BYTES", 3 * export.DIRECT_ALIGN)
    real_open, real_pwrite = os.open, os.pwrite
    if refused == "open":

        def refusing_open(path, flags, *args):
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "O_DIRECT refused")
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", refusing_open)
    expected = bytearray(len(data) + 2 * base)
    expected[base : base + len(data)] = data
    path = tmp_path / "segment"
    with open(path, "wb") as handle:
        handle.truncate(len(expected))
        out = export._SegmentFile(path, handle.fileno())
        if refused == "write":

            def refusing_pwrite(fd, buffer, position):
                if fd == out._direct_fd:
                    raise OSError(errno.EINVAL, "O_DIRECT write refused")
                return real_pwrite(fd, buffer, position)

            monkeypatch.setattr(os, "pwrite", refusing_pwrite)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda span: out.write(base + span[0], data[span[0] : span[1]]), spans))
        out.close()
    assert path.read_bytes() == bytes(expected)
    assert (out.direct_bytes > 0) == (refused is None)


@pytest.mark.parametrize("damage", ["gap", "overlap", "short"])
def test_rows_that_do_not_tile_the_segment_fail_alike(damage, tmp_path, monkeypatch):
    monkeypatch.setattr(export, "SEGMENT_BATCH_ROWS", 4)
    rows = _rows(10)
    if damage == "gap":
        del rows[4]
    elif damage == "overlap":
        rows.append(rows[3])
    errors = []
    for columnar in (True, False):
        task = _segment_task(tmp_path, [rows], start=0, columnar=columnar)
        if damage == "short":
            task["data_end"] += 1
        with pytest.raises(ValueError) as raised:
            export.write_segment(task, columnar=columnar)
        errors.append(str(raised.value))
    assert errors[0] == errors[1]


def _cq_task(tmp_path, queue_offsets: list[int], *, name: str, first: bool, tag: str) -> dict:
    table = pa.table(
        {
            "queue_offset": queue_offsets,
            "commitlog_offset": [q * 1000 + 7 for q in queue_offsets],
            "size": [1000 + q % 3 for q in queue_offsets],
            "tags_code": [(-(2**63) if q % 5 == 0 else q * 31) for q in queue_offsets],
            "store_timestamp": [1_795_219_200_000 + (q * 7919) % 1000 for q in queue_offsets],
        },
        schema=pa.schema([CONSUMEQUEUE.arrow_schema.field(n) for n in export.CQ_COLUMNS]),
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"cq-{tag}.parquet"
    pq.write_table(table, path, row_group_size=3)
    return {"topic": "OrderEvents", "queue_id": 3, "cq_file": name, "file_size": 40 * 20, "first_in_queue": first,
            "files": [str(path)], "out": str(tmp_path / f"out-{tag}")}  # fmt: skip


@pytest.mark.parametrize(
    ("queue_offsets", "name", "first"),
    [
        (list(range(40)), "00000000000000000000", True),
        ([7, 5, 6, 9, 8], "00000000000000000000", True),  # pre-blank units before offset 5
        ([47, 45, 46], "00000000000000000800", False),
        ([45, 46, 48], "00000000000000000800", False),  # a gap
        ([45, 46, 46], "00000000000000000800", False),  # a unit twice
        ([45, 80], "00000000000000000800", False),  # beyond the file
        ([], "00000000000000000000", True),
    ],
)
def test_cq_files_are_the_same_both_ways(queue_offsets, name, first, tmp_path):
    valid = bool(queue_offsets) and max(queue_offsets) - min(queue_offsets) + 1 == len(set(queue_offsets)) == len(
        queue_offsets
    )
    valid = valid and all(0 <= q * 20 - int(name) < 40 * 20 for q in queue_offsets)
    probe = _cq_task(tmp_path / "probe", queue_offsets, name=name, first=first, tag="probe") if valid else None
    assert not valid or export._write_cq_file_columnar(probe) is not None  # the columnar route takes a clean file
    outcomes = []
    for columnar in (True, False):
        task = _cq_task(tmp_path, queue_offsets, name=name, first=first, tag=str(columnar))
        try:
            result = export.write_cq_file(task, columnar=columnar)
        except (ValueError, IndexError) as exc:
            outcomes.append((type(exc), str(exc).replace(f"out-{columnar}", "out")))
            continue
        path = tmp_path / f"out-{columnar}" / "consumequeue" / "OrderEvents" / "3" / name
        outcomes.append((result, path.read_bytes(), path.stat().st_mtime_ns))
    assert outcomes[0] == outcomes[1]


def _index_task(tmp_path, numbers: list[int], *, tag: str, index_count: int | None = None) -> dict:
    slots = 13
    table = pa.table(
        {
            "index_no": numbers,
            "key_hash": [(n * 2654435761) % 2**31 - (n % 2) * 2**31 for n in numbers],
            "slot": [(n * 7) % slots for n in numbers],
            "phy_offset": [n * 1100 for n in numbers],
            "time_diff": [n % 100 for n in numbers],
            "prev_index": [max(n - 7, 0) for n in numbers],
        },
        schema=pa.schema([INDEXFILE.arrow_schema.field(n) for n in export.INDEX_COLUMNS]),
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"index-{tag}.parquet"
    pq.write_table(table, path, row_group_size=4)
    header = {"begin_timestamp": 1_795_219_200_000, "end_timestamp": 1_795_219_260_000, "begin_phy_offset": 0,
              "end_phy_offset": 99_000, "hash_slot_count": 9,
              "index_count": len(numbers) + 1 if index_count is None else index_count}  # fmt: skip
    return {"index_file": "20261119000000000", "header": header, "slots": slots, "file_size": 40 + 13 * 4 + 30 * 20,
            "files": [str(path)], "out": str(tmp_path / f"out-{tag}")}  # fmt: skip


@pytest.mark.parametrize(
    ("numbers", "index_count"),
    [
        (list(range(1, 30)), None),
        ([5, 3, 4, 1, 2, 9, 8], None),  # shuffled, with a gap in the entry numbers
        ([1, 2, 2], None),  # an entry number twice
        ([1, 2, 3], 7),  # the header counts other entries
        ([], 1),
        ([1, 31], None),  # beyond the file's entries
    ],
)
def test_index_files_are_the_same_both_ways(numbers, index_count, tmp_path):
    if index_count is None and len(set(numbers)) == len(numbers) and numbers and max(numbers) < 30:
        probe = _index_task(tmp_path / "probe", numbers, tag="probe")
        assert export._write_index_file_columnar(probe) is not None  # the columnar route takes a clean file
    outcomes = []
    for columnar in (True, False):
        task = _index_task(tmp_path, numbers, tag=str(columnar), index_count=index_count)
        try:
            result = export.write_index_file(task, columnar=columnar)
        except ValueError as exc:
            outcomes.append(str(exc).replace(f"out-{columnar}", "out"))
            continue
        path = tmp_path / f"out-{columnar}" / "index" / "20261119000000000"
        outcomes.append((result, path.read_bytes(), path.stat().st_mtime_ns))
    assert outcomes[0] == outcomes[1]


# -- import: the columnar run reader against the per-record walk ---------------------------------


@pytest.fixture(autouse=True)
def _runs_of_any_length(monkeypatch):
    """The files here are small: let the columnar reader take runs of one record on."""
    monkeypatch.setattr(record_runs, "MIN_RUN_RECORDS", 1)


def _read_both(path, start: int, *, last: bool = True, check_crc: bool = True) -> list[dict]:
    rows = []
    for columnar in (True, False):
        batches = read_segment_file(str(path), start_offset=start, last=last, check_crc=check_crc, columnar=columnar)
        rows.append([row for batch in batches for row in batch.to_pylist()])
    assert rows[0] == rows[1]
    return rows[0]


def _odd_records(start: int) -> bytes:
    """Records with odd properties (repeated names, empty names and values, short entries, no separator,
    multi-byte text, spaces in KEYS), V2 topics, IPv6 hosts, empty bodies."""
    properties = [
        b"",
        b"KEYS\x01a  b \x02TAGS\x01t\x02UNIQ_KEY\x01U1\x02",
        b"KEYS\x01a\x02KEYS\x01b\x02TAGS\x01x\x02",  # a repeated name: first position, last value
        b"\x01v\x02n\x01\x02ab\x02\xc3\xa9\x01\x02x\x01y\x02",  # empty name, empty value, short, 2-char entry
        "TAGS\x01✓\x02名\x01値\x02noseparator\x02".encode(),
        b"KEYS\x01   \x02",
        b"A\x01" + b"v" * 32765,
    ]
    data, offset = bytearray(), start
    for number in range(40):
        born, store_host = ((V4, STORE), (V6, STORE), (V4, V6_STORE), (V6, V6_STORE))[number % 4]
        topic = ("OrderEvents", "%RETRY%cg_" + "settlement_" * 12, "t" * 127)[number % 3]
        body = b"" if number % 5 == 0 else bytes(range(number % 256)) * 3
        record = Record(
            topic=topic,
            queue_id=number % 3,
            flag=number - 20,
            queue_offset=number,
            physical_offset=offset,
            sys_flag=(BORNHOST_V6_FLAG if born.is_ipv6 else 0)
            | (STOREHOST_V6_FLAG if store_host.is_ipv6 else 0)
            | (TRANSACTION_PREPARED_TYPE if number % 6 == 1 else 0)
            | (COMPRESSED_FLAG if number % 7 == 2 else 0),
            born_timestamp=1_795_219_200_000 + number,
            born_host=born,
            store_timestamp=1_795_219_200_000 + number,
            store_host=store_host,
            reconsume_times=number % 4,
            prepared_transaction_offset=number * 100,
            body=body,
            properties=properties[number % len(properties)],
            magic=MAGIC_V2 if number % 3 == 1 or number % 4 == 3 else MAGIC_V1,
        )
        encoded = encode_record(record)
        data += encoded
        offset += len(encoded)
    return bytes(data)


def test_odd_records_read_the_same_both_ways(tmp_path):
    data = _odd_records(1 << 30)
    path = tmp_path / f"{1 << 30:020d}"
    path.write_bytes(data + encode_blank(8))
    rows = _read_both(path, 1 << 30, last=False)
    assert len(rows) == 41 and rows[-1]["blank_end"] and not any(r["corrupt_reason"] for r in rows)
    assert dict(rows[2]["properties"]) == {"KEYS": "b", "TAGS": "x"} and rows[1]["keys"] == ["a", "b"]
    unsealed = tmp_path / "unsealed" / f"{1 << 30:020d}"
    unsealed.parent.mkdir()
    unsealed.write_bytes(data + bytes(4096))
    _read_both(unsealed, 1 << 30)


# Damage to one field of a record: (byte position in the record, the bytes written there).
DAMAGED_FIELDS = [
    (8, b"\x00\x00\x00\x01"),  # BODYCRC
    (12, b"\xff\xff\xff\xff"),  # a negative queue id
    (28, b"\x00\x00\x00\x00\x00\x00\x00\x09"),  # PHYSICALOFFSET
    (52, b"\xff\xff\xff\xff"),  # the born host's port, negative
    (0, b"\x00\x00\x00\x10"),  # TOTALSIZE too small
    (0, b"\x00\x00\x7f\xff"),  # TOTALSIZE running into the next record
    (4, b"\x12\x34\x56\x78"),  # magic
]


def damaged_segment(folder: Path, start: int, *, record_number: int, at: int, patch: bytes) -> tuple[Path, int]:
    """A sealed segment at ``start`` of ``_odd_records`` with ``patch`` written at byte ``at`` of record
    ``record_number``: its path, and where that record starts in it."""
    data = bytearray(_odd_records(start))
    position = 0
    for _ in range(record_number):
        position += int.from_bytes(data[position : position + 4], "big")
    data[position + at : position + at + len(patch)] = patch
    path = folder / f"{start:020d}"
    path.write_bytes(bytes(data) + encode_blank(64) + bytes(56))
    return path, position


@pytest.mark.parametrize(("at", "patch"), DAMAGED_FIELDS)
@pytest.mark.parametrize("record_number", [0, 7, 39])
def test_a_damaged_record_reads_the_same_both_ways(at, patch, record_number, tmp_path):
    start = 1 << 30
    path, _ = damaged_segment(tmp_path, start, record_number=record_number, at=at, patch=patch)
    for check_crc in (True, False):
        _read_both(path, start, last=False, check_crc=check_crc)


def test_bad_text_in_topics_and_properties_reads_the_same_both_ways(tmp_path):
    start = 0
    data = bytearray(_odd_records(start))
    first = int.from_bytes(data[0:4], "big")
    second = int.from_bytes(data[first : first + 4], "big")
    topic_at = data.find(b"OrderEvents", 0, first)
    data[topic_at] = 0xFF  # not UTF-8
    props_at = data.find(b"KEYS\x01a", first, first + second)
    data[props_at + 1] = 0xC3  # a lone lead byte
    mapped = bytearray(_odd_records(start))
    v6 = mapped.find(parse_host(V6.text).address)
    mapped[v6 : v6 + 16] = bytes(10) + b"\xff\xff" + bytes([1, 2, 3, 4])  # ::ffff:1.2.3.4 in an IPv6 field
    for number, content in enumerate((data, mapped)):
        path = tmp_path / str(number) / f"{start:020d}"
        path.parent.mkdir()
        path.write_bytes(bytes(content) + bytes(100))
        rows = _read_both(path, start)
        assert any(r["corrupt_reason"] for r in rows)


@FUZZ_BOTH
@given(case=mutated())
def test_mutated_segments_read_the_same_both_ways(case, tmp_path_factory):
    start, data, last = case
    path = tmp_path_factory.mktemp("fuzz") / f"{start:020d}"
    path.write_bytes(data)
    _read_both(path, start, last=last)


@FUZZ_BOTH
@given(
    strings=st.lists(
        st.lists(st.sampled_from(["\x01", "\x02", " ", "a", "é", "名", "KEYS", "TAGS", "UNIQ_KEY", "k1"]), max_size=12),
        min_size=1,
        max_size=8,
    )
)
def test_properties_parse_like_the_reference(strings):
    properties = pa.array(["".join(parts).encode() for parts in strings], pa.binary())
    columnar = _parsed_properties(properties, len(properties))
    reference = _parsed_per_string(properties)
    assert {k: v.to_pylist() for k, v in columnar.items()} == {k: v.to_pylist() for k, v in reference.items()}


@pytest.mark.parametrize("distinct", [2, 64, 65, 300])  # a bit per name up to 64 names, unique pairs above
@pytest.mark.parametrize("repeated", [False, True])
def test_a_repeated_name_is_found_however_many_names_a_run_has(distinct, repeated):
    # string i holds names i and i + 1; with ``repeated``, the middle string names its first name again
    parts = [[f"name{i}", f"name{(i + 1) % distinct}"] for i in range(distinct)]
    if repeated:
        parts[distinct // 2].append(parts[distinct // 2][0])
    parents = np.array([i for i, names in enumerate(parts) for _ in names], np.int64)
    names = pa.array([name for names in parts for name in names], pa.string())
    assert record_runs._repeats(parents, names) is repeated
    properties = pa.array(
        ["\x02".join(f"{name}\x01{i}.{j}" for j, name in enumerate(names)).encode() for i, names in enumerate(parts)]
    )
    columnar = _parsed_properties(properties, len(properties))
    reference = _parsed_per_string(properties)
    assert {k: v.to_pylist() for k, v in columnar.items()} == {k: v.to_pylist() for k, v in reference.items()}


def test_a_clean_file_is_read_in_runs(tmp_path):
    data = _odd_records(0)
    run = read_run(data + bytes(8), 0, len(data) + 8, start_offset=0, name="0", path="p", first_ordinal=1,
                   check_crc=True, schema=IMPORTED_SCHEMA)  # fmt: skip
    assert run is not None and run[0].num_rows == 40 and run[1] == len(data)


@given(
    st.one_of(
        st.permutations(range(5, 40)),  # a valid index file's entry numbers: the scatter
        st.lists(st.integers(0, 12), max_size=12),  # repeats and gaps: the sort
        st.lists(st.integers(-(2**40), 2**40), max_size=8),
    )
)
def test_index_entries_are_ordered_as_a_stable_sort_orders_them(numbers):
    values = np.array(numbers, np.int64)
    assert export._ascending_order(values).tolist() == np.argsort(values, kind="stable").tolist()


def test_a_segments_files_are_read_in_runs_of_whole_row_groups_up_to_a_batch(tmp_path):
    rows = _rows(21)
    path = tmp_path / "groups.parquet"
    with pq.ParquetWriter(path, SCHEMA) as writer:
        at = 0
        for size in (3, 3, 3, 10, 2):  # a row group per write
            writer.write_table(pa.Table.from_pylist(rows[at : at + size], schema=SCHEMA))
            at += size
    units = list(export._row_group_units([str(path), str(path)], unit_rows=6))
    # a group larger than a batch is a run of its own (read in batches), the others fill runs up to a batch
    assert [unit.indices for unit in units] == [[0, 1], [2], [3], [4]] * 2


def test_segment_units_are_encoded_by_threads_at_once_and_given_in_order():
    both_running = threading.Barrier(2, timeout=10)  # broken (and the test failed) unless two units run at once

    def work(unit: int) -> int:
        if unit < 2:
            both_running.wait()
        if unit == 0:
            time.sleep(0.05)  # the first unit finishes last: the order given is still the units' order
        return unit * 10

    assert list(export._in_order(iter(range(7)), work, workers=2, depth=3)) == [0, 10, 20, 30, 40, 50, 60]


def test_segment_units_stop_at_an_error_in_their_order_and_nothing_far_ahead_was_started():
    started, units = [], iter(range(1000))

    def work(unit: int) -> int:
        started.append(unit)
        if unit == 3:
            raise ValueError("unit 3 is bad")
        return unit

    given = []
    with pytest.raises(ValueError, match="unit 3 is bad"):
        for result in export._in_order(units, work, workers=2, depth=4):
            given.append(result)
    assert given == [0, 1, 2]
    assert max(started) <= 3 + 4  # at most ``depth`` units beyond the one being given
    assert next(units) <= 8  # the rest were never taken


def test_segment_units_stop_when_the_writer_stops_taking_them():
    started, units = [], iter(range(1000))

    def work(unit: int) -> int:
        started.append(unit)
        return unit

    encoded = export._in_order(units, work, workers=2, depth=2)
    assert next(encoded) == 0
    encoded.close()
    assert max(started) <= 2 and next(units) <= 3


def test_a_parquet_file_that_cannot_be_read_fails_both_routes_alike(tmp_path):
    errors = []
    for columnar in (True, False):
        task = _segment_task(tmp_path, [], start=0, columnar=columnar, size=64)
        task["files"] = [str(tmp_path / "missing.parquet")]
        with pytest.raises(OSError) as raised:
            export.write_segment(task, columnar=columnar)
        errors.append(str(raised.value))
    assert errors[0] == errors[1]


def test_files_differing_in_nullability_are_one_index_file_and_wider_integers_go_through_the_reference(tmp_path):
    task = _index_task(tmp_path, list(range(1, 12)), tag="split")
    whole = pq.read_table(task["files"][0])
    strict = pa.schema([f.with_nullable(f.name not in ("time_diff", "prev_index")) for f in whole.schema])
    pq.write_table(whole.slice(0, 5).cast(strict), tmp_path / "a.parquet")  # as another engine writes them
    pq.write_table(whole.slice(5), tmp_path / "b.parquet")
    task["files"] = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert export._write_index_file_columnar({**task, "out": str(tmp_path / "probe")}) is not None
    outcomes = []
    for columnar in (True, False):
        export.write_index_file({**task, "out": str(tmp_path / f"o-{columnar}")}, columnar=columnar)
        outcomes.append((tmp_path / f"o-{columnar}" / "index" / task["index_file"]).read_bytes())
    assert outcomes[0] == outcomes[1]
    wide = whole.cast(whole.schema.set(0, pa.field("index_no", pa.int64())))
    pq.write_table(wide, tmp_path / "wide.parquet")
    assert export._write_index_file_columnar({**task, "files": [str(tmp_path / "wide.parquet")]}) is None
    rows = _rows(3)
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    widened = batch.cast(SCHEMA.set(SCHEMA.get_field_index("queue_id"), pa.field("queue_id", pa.int64())))
    assert encode_record_batch(batch) is not None and encode_record_batch(widened) is None
