"""Fuzzing the import walk: mutated commitlog segments (bit flips, truncations, zeroed runs, crafted TOTALSIZE
fields, stray magic codes), seeded. The walk never fails, and every byte of a file is a message that writes back
to exactly its bytes, the blank record, or a corrupt range naming the file and its bytes; only the newest file may
end in unclaimed zeros (its unwritten tail)."""

from __future__ import annotations

import random
import struct

import pytest

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2, encode_blank, encode_record
from rmqlake.transforms import store_files
from tests.unit.test_store_import import record

SEGMENT = 4096
CASES = 300  # per seed


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


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        at = rng.randrange(len(out)) if out else 0
        if kind == 0:  # bit flips
            for _ in range(rng.randint(1, 8)):
                spot = rng.randrange(len(out))
                out[spot] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncation
            del out[rng.randrange(len(out) + 1) :]
        elif kind == 2:  # a zeroed run
            out[at : at + rng.randint(1, 400)] = bytes(len(out[at : at + rng.randint(1, 400)]))
        elif kind == 3:  # a crafted TOTALSIZE at a record start or anywhere
            value = rng.choice([0, -1, 1, 7, 8, 2**31 - 1, -(2**31), len(out) - at, rng.randrange(1, 600)])
            out[at : at + 4] = struct.pack(">i", value)[: len(out[at : at + 4])]
        elif kind == 4:  # a stray magic code (resync must not trust it)
            magic = rng.choice([MAGIC_V1, MAGIC_V2, BLANK_MAGIC])
            out[at : at + 8] = (struct.pack(">i", rng.randrange(8, 600)) + struct.pack(">i", magic))[
                : len(out[at : at + 8])
            ]
        else:  # random bytes
            out[at : at + rng.randint(1, 64)] = rng.randbytes(len(out[at : at + 64]))[: rng.randint(1, 64)]
    return bytes(out)


def check_walk(path, start: int, data: bytes, *, last: bool) -> list[dict]:
    rows = [r for b in store_files.read_segment_file(str(path), start_offset=start, last=last) for r in b.to_pylist()]
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
            record = store_files.record_from_row(row)
            assert encode_record(record) == data[begin : begin + size]
        position = begin + size
    assert position <= len(data)
    if position < len(data):  # unclaimed bytes: only the newest file's unwritten tail
        assert last and not any(data[position:]), (position, len(data))
    return rows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_segments_are_accounted_for_byte_by_byte(seed, tmp_path):
    rng = random.Random(seed)
    files = base_files()
    seen = {"skipped": 0, "resynced": 0, "read on after a corrupt range": 0}
    for case in range(CASES):
        index = rng.randrange(len(files))
        start, original = files[index]
        data = mutate(original, rng)
        path = tmp_path / f"{start:020d}"
        path.write_bytes(data)
        rows = check_walk(path, start, data, last=index == len(files) - 1)
        if case % 10 == 0:  # the same bytes as an older file
            check_walk(path, start, data, last=False)
        bad = [r["physical_offset"] for r in rows if r["corrupt_reason"]]
        seen["resynced"] += any("recovery stops here" in r["corrupt_reason"] for r in rows if r["corrupt_reason"])
        seen["skipped"] += any("recovery stops here" not in r["corrupt_reason"] for r in rows if r["corrupt_reason"])
        seen["read on after a corrupt range"] += bool(bad) and any(
            r["physical_offset"] > bad[0] and not (r["corrupt_reason"] or r["blank_end"]) for r in rows
        )
    assert min(seen.values()) > CASES // 10, seen  # the mutations reach every path of the walk


def test_unmutated_segments_read_whole(tmp_path):
    for index, (start, data) in enumerate(base_files()):
        path = tmp_path / f"{start:020d}"
        path.write_bytes(data)
        rows = [r for b in store_files.read_segment_file(str(path), start_offset=start) for r in b.to_pylist()]
        assert not [r for r in rows if r["corrupt_reason"]]
        assert sum(1 for r in rows if r["blank_end"]) == (index < 2)
        check_walk(path, start, data, last=index == 2)
