"""The import walk of commitlog files on hostile bytes: every byte range becomes a message, the blank record, or a
corrupt range with its file and bytes; records the lake could not write back are refused on the way in."""

from __future__ import annotations

import itertools
from pathlib import Path

from rmqlake import store
from rmqlake.formats.hosts import HostAddress, parse_host
from rmqlake.formats.record import MAGIC_V2, Record, encode_blank, encode_record

SEGMENT = 4096
BORN = parse_host("10.0.0.7:50100")
STORE = parse_host("10.0.0.1:10911")


def record(offset: int, number: int, **changes) -> Record:
    fields = {
        "topic": "OrderEvents",
        "queue_id": number % 2,
        "flag": 0,
        "queue_offset": number // 2,
        "physical_offset": offset,
        "sys_flag": 0,
        "born_timestamp": 1_795_219_200_000 + number,
        "born_host": BORN,
        "store_timestamp": 1_795_219_200_000 + number,
        "store_host": STORE,
        "reconsume_times": 0,
        "prepared_transaction_offset": 0,
        "body": f"body-{number:03d}".encode(),
        "properties": f"KEYS\x01k{number}\x02UNIQ_KEY\x01U{number:04d}\x02".encode(),
    }
    return Record(**{**fields, **changes})


def segment(start: int, count: int, *, sealed: bool, size: int = SEGMENT, changes=None) -> tuple[bytes, list[int]]:
    """``count`` records from ``start`` (``changes`` by record number), then the blank record when ``sealed``."""
    data, offsets = bytearray(), []
    for number in range(count):
        offsets.append(start + len(data))
        data += encode_record(record(start + len(data), number, **(changes or {}).get(number, {})))
    if sealed:
        data += encode_blank(size - len(data))
    return bytes(data) + bytes(size - len(data)), offsets


def walk(path: Path, start: int, *, last: bool = True) -> list[dict]:
    return [r for b in store.read_segment_file(str(path), start_offset=start, last=last) for r in b.to_pylist()]


def messages(rows: list[dict]) -> list[int]:
    return [r["physical_offset"] for r in rows if not r["blank_end"] and r["corrupt_reason"] is None]


def corrupt(rows: list[dict]) -> list[tuple[int, int, str]]:
    return [(r["physical_offset"], r["physical_offset"] + r["total_size"], r["corrupt_reason"]) for r in rows
            if r["corrupt_reason"]]  # fmt: skip


def test_invalid_utf8_in_properties_is_one_rejected_record_and_the_rest_is_read(tmp_path):
    data, offsets = segment(0, 6, sealed=True)
    broken = bytearray(data)
    size = offsets[3] - offsets[2]
    broken[offsets[3] - 8] = 0xFF  # a byte of record 2's properties: the body CRC does not cover them
    path = tmp_path / "00000000000000000000"
    path.write_bytes(bytes(broken))
    rows = walk(path, 0)
    assert messages(rows) == offsets[:2] + offsets[3:]
    (bad,) = corrupt(rows)
    assert bad[:2] == (offsets[2], offsets[2] + size)
    assert bad[2].startswith(f"{path} at offset {offsets[2]} (bytes {offsets[2]}-{offsets[3]}, {size} bytes): ")
    assert "properties are not valid UTF-8" in bad[2]
    assert [r["physical_offset"] for r in rows if r["blank_end"]] == [offsets[-1] + size]


def test_zeroed_size_in_a_sealed_segment_is_reported_and_the_records_after_it_are_read(tmp_path):
    data, offsets = segment(SEGMENT, 8, sealed=True)
    broken = bytearray(data)
    at = offsets[3] - SEGMENT
    broken[at : at + 4] = bytes(4)  # record 3's TOTALSIZE: the broker's recovery stops here
    path = tmp_path / f"{SEGMENT:020d}"
    path.write_bytes(bytes(broken))
    rows = walk(path, SEGMENT, last=False)
    assert messages(rows) == offsets[:3] + offsets[4:]
    ((start, end, reason),) = corrupt(rows)
    assert (start, end) == (offsets[3], offsets[4]) and "TOTALSIZE 0 is not a record size" in reason
    assert "the broker's recovery stops here" in reason and str(path) in reason
    assert sum(1 for r in rows if r["blank_end"]) == 1


def test_zeros_instead_of_the_blank_record_of_an_older_file_are_a_corrupt_range(tmp_path):
    data, offsets = segment(0, 3, sealed=False)
    path = tmp_path / "00000000000000000000"
    path.write_bytes(data)
    end = offsets[-1] + len(encode_record(record(offsets[-1], 2)))
    assert corrupt(walk(path, 0, last=True)) == []  # the newest file: zeros are its unwritten tail
    ((start, stop, reason),) = corrupt(walk(path, 0, last=False))
    assert (start, stop) == (end, SEGMENT) and "no end-of-file blank record" in reason


def test_garbage_in_the_newest_file_is_reported_up_to_its_last_written_byte(tmp_path):
    data, offsets = segment(0, 4, sealed=False)
    end = offsets[-1] + len(encode_record(record(offsets[-1], 3)))
    broken = bytearray(data)
    broken[end : end + 8] = b"\x00\x00\x00\x30\x12\x34\x56\x78"  # a torn write: not a record
    path = tmp_path / "00000000000000000000"
    path.write_bytes(bytes(broken))
    rows = walk(path, 0)
    assert messages(rows) == offsets
    ((start, stop, reason),) = corrupt(rows)
    assert (start, stop) == (end, end + 8) and "unknown magic code 0x12345678" in reason


def test_records_the_lake_could_not_write_back_are_rejected_with_their_reason(tmp_path):
    changes = {
        1: {"topic": "../../../pw"},  # a topic that would be a path outside the store
        2: {"born_host": HostAddress(BORN.address, 70000)},  # no such port
        3: {"store_host": HostAddress(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), 10911), "sys_flag": 0x20},
        4: {"queue_id": -1},
        5: {"topic": "OrderEvents" * 12, "magic": MAGIC_V2},  # 132 bytes, not a %RETRY% topic
    }
    data, offsets = segment(0, 7, sealed=True, changes=changes)
    path = tmp_path / "00000000000000000000"
    path.write_bytes(data)
    rows = walk(path, 0)
    assert messages(rows) == [offsets[0], offsets[6]]
    reasons = [reason.split(": ", 1)[1] for _, _, reason in corrupt(rows)]
    assert reasons == [
        "topic '../../../pw' has characters outside [%|a-zA-Z0-9_-]",
        "born host port 70000 is outside 0..65535",
        "store host [::ffff:a00:1]:10911 is an IPv4-mapped address in an IPv6 field; it would be written back as IPv4",
        "queue id -1 is negative",
        "topic is 132 bytes long, the maximum is 127 (only %RETRY% topics may be longer)",
    ]
    assert [(s, e) for s, e, _ in corrupt(rows)] == list(itertools.pairwise(offsets[1:7]))
