"""Fuzzing the import walk: mutated commitlog segments (bit flips, truncations, zeroed runs, crafted TOTALSIZE
fields, stray record heads), derandomized Hypothesis examples. The walk never fails, and every byte of a file is a
message that writes back to exactly its bytes, the blank record, or a corrupt range naming the file and its bytes;
only the newest file may end in unclaimed zeros (its unwritten tail)."""

from __future__ import annotations

import functools
import random
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqlake import store
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2, encode_blank, encode_record
from tests.unit.test_store_import import record

SEGMENT = 4096
FUZZ = settings(
    max_examples=1500,
    derandomize=True,  # the same examples every run
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@functools.cache
def base_files() -> list[tuple[int, bytes]]:
    """Two sealed segments and the newest, part-written one: V1 and V2 records, IPv4 and IPv6 hosts."""
    files, offset, number = [], 0, 0
    v6 = parse_host("[2001:db8::7]:50200")
    for index in range(3):
        start, data = index * SEGMENT, bytearray()
        while True:
            kind = number % 5
            changes = {}
            if kind == 1:
                changes = {"born_host": v6, "sys_flag": 0x10}
            elif kind == 3:
                changes = {"topic": "%RETRY%cg_" + "settlement_" * 12, "magic": MAGIC_V2}
            body = bytes(random.Random(number).randrange(256) for _ in range(number * 37 % 300))
            encoded = encode_record(record(offset, number, body=body, **changes))
            if index == 2 and len(data) > SEGMENT // 2:
                break
            if len(data) + len(encoded) + 8 > SEGMENT:
                data += encode_blank(SEGMENT - len(data))
                break
            data += encoded
            offset += len(encoded)
            number += 1
        offset = start + SEGMENT
        files.append((start, bytes(data) + bytes(SEGMENT - len(data))))
    return files


BOUNDARY_SIZES = [0, -1, 1, 7, 8, 2**31 - 1, -(2**31), SEGMENT, SEGMENT + 1]


@st.composite
def mutated(draw) -> tuple[int, bytes, bool]:
    """(file index, mutated bytes, walked as the newest file): 1-3 mutations, half of them aimed at record starts."""
    files = base_files()
    index = draw(st.integers(0, len(files) - 1))
    start, data = files[index]
    heads = record_starts(data)
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        spot = draw(st.sampled_from(heads) | st.integers(0, max(len(out) - 1, 0)))
        spot += draw(st.sampled_from([0, 0, 4, 8, 52, 84]))
        kind = draw(st.sampled_from(["flip", "truncate", "zeros", "size", "magic", "bytes"]))
        if kind == "flip":
            for bit in draw(st.lists(st.integers(0, 8 * len(out) - 1), min_size=1, max_size=8)):
                out[bit // 8] ^= 1 << bit % 8
        elif kind == "truncate":
            del out[min(spot, len(out)) :]
        elif kind == "zeros":
            length = draw(st.integers(1, 400))
            out[spot : spot + length] = bytes(len(out[spot : spot + length]))
        elif kind == "size":  # a crafted TOTALSIZE
            value = draw(st.sampled_from(BOUNDARY_SIZES) | st.integers(-(2**31), 2**31 - 1))
            out[spot : spot + 4] = struct.pack(">i", value)[: len(out[spot : spot + 4])]
        elif kind == "magic":  # a stray record head: resync must not trust it
            head = struct.pack(
                ">ii", draw(st.integers(8, 600)), draw(st.sampled_from([MAGIC_V1, MAGIC_V2, BLANK_MAGIC]))
            )
            out[spot : spot + 8] = head[: len(out[spot : spot + 8])]
        else:
            chunk = draw(st.binary(min_size=1, max_size=64))
            out[spot : spot + len(chunk)] = chunk[: len(out[spot : spot + len(chunk)])]
        if not out:
            break
    last = index == len(files) - 1 and draw(st.booleans() | st.just(True))
    return start, bytes(out), last


def record_starts(data: bytes) -> list[int]:
    starts, position = [], 0
    while position + 8 <= len(data):
        size, magic = struct.unpack_from(">ii", data, position)
        if magic not in (MAGIC_V1, MAGIC_V2):
            break
        starts.append(position)
        position += size
    return [*starts, position]


def check_walk(path, start: int, data: bytes, *, last: bool) -> list[dict]:
    rows = [r for b in store.read_segment_file(str(path), start_offset=start, last=last) for r in b.to_pylist()]
    position = 0
    for row in sorted(rows, key=lambda r: r["physical_offset"]):
        begin = row["physical_offset"] - start
        assert begin == position, (row, position)  # no gap, no overlap
        size = row["total_size"]
        assert size > 0
        if row["corrupt_reason"]:
            assert row["corrupt_reason"].startswith(f"{path} at offset {row['physical_offset']} (bytes ")
        elif row["blank_end"]:
            assert begin + size == len(data)
        else:  # a message: written back, it is exactly its bytes
            record = store.record_from_row(row)
            assert encode_record(record) == data[begin : begin + size]
        position = begin + size
    assert position <= len(data)
    if position < len(data):  # unclaimed bytes: only the newest file's unwritten tail
        assert last and not any(data[position:]), (position, len(data))
    return rows


@FUZZ
@given(case=mutated())
def test_mutated_segments_are_accounted_for_byte_by_byte(case, tmp_path_factory):
    start, data, last = case
    path = tmp_path_factory.mktemp("fuzz") / f"{start:020d}"
    path.write_bytes(data)
    check_walk(path, start, data, last=last)


def test_unmutated_segments_read_whole(tmp_path):
    for index, (start, data) in enumerate(base_files()):
        path = tmp_path / f"{start:020d}"
        path.write_bytes(data)
        rows = [r for b in store.read_segment_file(str(path), start_offset=start) for r in b.to_pylist()]
        assert not [r for r in rows if r["corrupt_reason"]]
        assert sum(1 for r in rows if r["blank_end"]) == (index < 2)
        check_walk(path, start, data, last=index == 2)
