"""An independent reader of a broker store directory, written from the spec with struct and zlib only.

It shares nothing with ``rmqlake.formats`` (hashes come from tests/reference.py), so an export that
agrees with it agrees with the spec, not merely with the exporter's own encoder.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from tests.reference import MAGIC_V1, MAGIC_V2, key_hash

BLANK_MAGIC = 0xCBD43194 - (1 << 32)
BORN_V6, STORE_V6 = 0x10, 0x20
TX_MASK, TX_PREPARED, TX_ROLLBACK = 0xC, 0x4, 0xC


@dataclass
class StoreWalk:
    records: dict[int, dict] = field(default_factory=dict)  # physical offset -> fields
    blanks: dict[str, int] = field(default_factory=dict)  # segment file -> position of its blank record
    ends: dict[str, int] = field(default_factory=dict)  # segment file -> end of its written data
    queues: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # queue offsets in commitlog order


def walk_commitlog(store: Path, segment_size: int) -> StoreWalk:
    """Every record of every segment file: magic, TOTALSIZE, CRC and PHYSICALOFFSET checked as it goes."""
    walk = StoreWalk()
    names = sorted(os.listdir(store / "commitlog"))
    for number, name in enumerate(names):
        data = (store / "commitlog" / name).read_bytes()
        assert len(data) == segment_size, f"{name}: {len(data)} bytes, segments are {segment_size}"
        start, position = int(name), 0
        while position + 8 <= len(data):
            size, magic = struct.unpack_from(">ii", data, position)
            if size == 0 and magic == 0:
                break  # end of the written data (the active segment)
            if magic == BLANK_MAGIC:
                assert size == len(data) - position, f"{name}: blank TOTALSIZE {size} != bytes left"
                assert not any(data[position + 8 :]), f"{name}: bytes after the blank record"
                walk.blanks[name] = position
                break
            assert magic in (MAGIC_V1, MAGIC_V2), f"{name}@{position}: magic {magic:#x}"
            record = _record(data[position : position + size], magic)
            assert record["physical_offset"] == start + position, f"{name}@{position}: PHYSICALOFFSET field"
            assert record["crc"] == zlib.crc32(record["body"]) & 0x7FFFFFFF, f"{name}@{position}: body CRC"
            walk.records[start + position] = record
            if record["sys_flag"] & TX_MASK not in (TX_PREPARED, TX_ROLLBACK):
                walk.queues.setdefault((record["topic"], record["queue_id"]), []).append(record["queue_offset"])
            position += size
        walk.ends[name] = position
        if number < len(names) - 1:
            assert name in walk.blanks, f"{name}: a sealed segment must end with a blank record"
            assert len(data) - position >= 8, f"{name}: fewer than 8 bytes left for the blank"
        else:
            assert not any(data[position:]), f"{name}: bytes after the written data of the active segment"
    for queue, offsets in walk.queues.items():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"{queue}: queue offsets not contiguous"
    return walk


def _record(raw: bytes, magic: int) -> dict:
    size, _, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts = struct.unpack_from(
        ">iiiiiqqiq", raw, 0
    )
    position = 48
    born_len = 20 if sys_flag & BORN_V6 else 8
    position += born_len
    (store_ts,) = struct.unpack_from(">q", raw, position)
    position += 8
    position += 20 if sys_flag & STORE_V6 else 8
    _reconsume, _prepared, body_len = struct.unpack_from(">iqi", raw, position)
    position += 16
    body = raw[position : position + body_len]
    position += body_len
    if magic == MAGIC_V1:
        topic_len = raw[position]
        position += 1
    else:
        (topic_len,) = struct.unpack_from(">h", raw, position)
        position += 2
    topic = raw[position : position + topic_len].decode()
    position += topic_len
    (props_len,) = struct.unpack_from(">h", raw, position)
    position += 2
    props = raw[position : position + props_len].decode()
    assert position + props_len == size, "fields do not add up to TOTALSIZE"
    properties = dict(p.split("\x01", 1) for p in props.split("\x02") if "\x01" in p)
    return {
        "size": size,
        "crc": crc,
        "queue_id": queue_id,
        "flag": flag,
        "queue_offset": queue_offset,
        "physical_offset": physical_offset,
        "sys_flag": sys_flag,
        "store_timestamp": store_ts,
        "born_timestamp": born_ts,
        "topic": topic,
        "body": body,
        "properties": properties,
    }


def check_consume_queues(store: Path, walk: StoreWalk, *, units_per_file: int, min_offsets: dict) -> int:
    """Every unit at or above its queue's min offset points to a record of that queue, offset and size."""
    checked = 0
    root = store / "consumequeue"
    for topic in os.listdir(root):
        for queue in os.listdir(root / topic):
            for name in sorted(os.listdir(root / topic / queue)):
                data = (root / topic / queue / name).read_bytes()
                assert len(data) == units_per_file * 20, f"{topic}/{queue}/{name}: {len(data)} bytes"
                for position in range(0, len(data), 20):
                    offset, size, _tags = struct.unpack_from(">qiq", data, position)
                    queue_offset = (int(name) + position) // 20
                    if offset == 0 and size in (0, 0x7FFFFFFF):
                        continue  # never written, or a pre-blank unit
                    if queue_offset < min_offsets.get((topic, int(queue)), 0):
                        continue  # a dead unit of a kept file (its message expired)
                    record = walk.records.get(offset)
                    assert record is not None, f"{topic}/{queue} unit {queue_offset} points to no record ({offset})"
                    assert (record["topic"], record["queue_id"], record["queue_offset"], record["size"]) == (
                        topic,
                        int(queue),
                        queue_offset,
                        size,
                    ), f"{topic}/{queue} unit {queue_offset}"
                    checked += 1
    return checked


def index_files(store: Path) -> list[Path]:
    return sorted((store / "index").iterdir())


def check_index_file(path: Path, walk: StoreWalk, *, slots: int, min_offset: int) -> int:
    """Header counts, slot heads and chains (backwards, acyclic), and each live entry's key."""
    data = path.read_bytes()
    _begin_ts, _end_ts, _begin_phy, _end_phy, slot_count, index_count = struct.unpack_from(">qqqqii", data, 0)
    heads = struct.unpack_from(f">{slots}i", data, 40)
    entries_at = 40 + 4 * slots
    used = sum(1 for head in heads if head)
    assert used == slot_count, f"{path.name}: {used} slots in use, header says {slot_count}"
    seen = 0
    for slot, head in enumerate(heads):
        number = head
        while number:
            key_hash_value, phy, _diff, previous = struct.unpack_from(">iqii", data, entries_at + 20 * number)
            assert 0 <= previous < number, f"{path.name}: chain of slot {slot} does not point backwards"
            assert key_hash_value % slots == slot, f"{path.name}: entry {number} is in the wrong slot"
            if phy >= min_offset:
                record = walk.records[phy]
                keys = [f"{record['topic']}#{k}" for k in record["properties"].get("KEYS", "").split(" ") if k]
                keys.append(f"{record['topic']}#{record['properties'].get('UNIQ_KEY')}")
                assert key_hash_value in {key_hash(k) for k in keys}, f"{path.name}: entry {number} key"
            seen += 1
            number = previous
    assert seen == index_count - 1, f"{path.name}: {seen} entries on chains, header counts {index_count - 1}"
    return seen


def query_key(store: Path, topic: str, key: str, *, slots: int, max_results: int = 64) -> list[int]:
    """Walk the index files' bytes for ``topic#key`` (newest file first) and keep the offsets whose record has it."""
    walk_hash = key_hash(f"{topic}#{key}")
    found: list[int] = []
    for path in reversed(index_files(store)):
        data = path.read_bytes()
        (number,) = struct.unpack_from(">i", data, 40 + 4 * (walk_hash % slots))
        while number and len(found) < max_results:
            hash_value, phy, _diff, previous = struct.unpack_from(">iqii", data, 40 + 4 * slots + 20 * number)
            if hash_value == walk_hash:
                found.append(phy)
            number = previous
    return found
