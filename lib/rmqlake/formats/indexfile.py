"""IndexFile layout, insertion rules and the key query.

An index file is a 40-byte header, ``slots`` 4-byte slots and ``entries``
20-byte entries. Entry 0 is never used, so a file holds ``entries - 1``
keys; each slot holds the number of the newest entry of its chain and each
entry the number of the previous one (``prev_index``, 0 ends the chain).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from rmqlake.formats.javahash import INT_MAX, index_key, index_key_hash
from rmqlake.formats.properties import split_keys
from rmqlake.formats.record import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK, transaction_type

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
MAX_QUERY_RESULTS = 64  # maxMsgsNumBatch
NAME_FORMAT = "%Y%m%d%H%M%S"
_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")


def index_file_size(slots: int, entries: int) -> int:
    """``40 + 4 × slots + 20 × entries`` bytes, preallocated."""
    return HEADER_SIZE + SLOT_SIZE * slots + ENTRY_SIZE * entries


def capacity(entries: int) -> int:
    """Keys a file takes: entry 0 is unused, so ``entries - 1``."""
    return entries - 1


def is_indexed(sys_flag: int) -> bool:
    """NOT_TYPE, PREPARED and COMMIT messages are indexed; ROLLBACK is not."""
    return transaction_type(sys_flag) != TRANSACTION_ROLLBACK_TYPE


def indexed(sys_flags):
    """``is_indexed`` element-wise over a NumPy array of sysFlags (a boolean array)."""
    return (sys_flags & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK_TYPE


def message_index_keys(topic: str, uniq_key: str | None, keys: str | None) -> list[str]:
    """Index keys of one message in insertion order: ``topic#UNIQ_KEY``, then ``topic#token`` per KEYS token."""
    result = [index_key(topic, uniq_key)] if uniq_key is not None else []
    result += [index_key(topic, token) for token in split_keys(keys)]
    return result


def time_diff(store_timestamp: int, begin_timestamp: int) -> int:
    """Seconds from the file's begin timestamp: truncated, clamped to [0, Integer.MAX_VALUE]; 0 if begin <= 0."""
    if begin_timestamp <= 0:
        return 0
    delta = store_timestamp - begin_timestamp
    seconds = abs(delta) // 1000 * (1 if delta >= 0 else -1)  # Java long division truncates toward zero
    return max(0, min(seconds, INT_MAX))


def file_name(timestamp_ms: int, zone: str) -> str:
    """``UtilAll.timeMillisToHumanString``: ``yyyyMMddHHmmssSSS`` in ``zone``."""
    moment = datetime.fromtimestamp(timestamp_ms / 1000.0, ZoneInfo(zone))
    return moment.strftime(NAME_FORMAT) + f"{timestamp_ms % 1000:03d}"


def next_file_name(previous: str | None, timestamp_ms: int, zone: str) -> str:
    """Name of a new index file, from its first key's store time.

    The broker names a file by the wall clock when it creates it; rmqlake uses
    the store time of the first message indexed in it, so names are the same
    on every run. Files load in name order, so a name that would not sort
    after ``previous`` (equal or earlier store time) becomes ``previous`` + 1 ms.
    """
    name = file_name(timestamp_ms, zone)
    if previous is None or name > previous:
        return name
    moment = datetime.strptime(previous[:14], NAME_FORMAT).replace(microsecond=int(previous[14:]) * 1000)
    later = moment + timedelta(milliseconds=1)
    return later.strftime(NAME_FORMAT) + f"{later.microsecond // 1000:03d}"


@dataclass(frozen=True)
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int

    def encode(self) -> bytes:
        return _HEADER.pack(
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    @classmethod
    def decode(cls, data: bytes, position: int = 0) -> IndexHeader:
        return cls(*_HEADER.unpack_from(data, position))


@dataclass(frozen=True)
class IndexEntry:
    key_hash: int
    phy_offset: int
    time_diff: int
    prev_index: int

    def encode(self) -> bytes:
        return _ENTRY.pack(self.key_hash, self.phy_offset, self.time_diff, self.prev_index)

    @classmethod
    def decode(cls, data: bytes, position: int = 0) -> IndexEntry:
        return cls(*_ENTRY.unpack_from(data, position))


def entry_position(index_no: int, slots: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * slots + ENTRY_SIZE * index_no


def slot_position(slot: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * slot


def is_time_matched(begin: int, end: int, header: IndexHeader) -> bool:
    """``IndexFile.isTimeMatched``: the query range overlaps the file's time range."""
    return (
        (begin < header.begin_timestamp and end > header.end_timestamp)
        or header.begin_timestamp <= begin <= header.end_timestamp
        or header.begin_timestamp <= end <= header.end_timestamp
    )


def select_phy_offsets(
    results: list[int],
    *,
    key: str,
    slot_value: int,
    entries: Mapping[int, IndexEntry],
    header: IndexHeader,
    max_num: int,
    begin: int,
    end: int,
) -> None:
    """``IndexFile.selectPhyOffset``: walk one slot chain newest first, appending matching offsets.

    Only the key hash is compared (equal hashes of different keys match; the
    caller re-checks the real key). The time filter uses the second-truncated
    time ``begin_timestamp + time_diff × 1000``, and the walk stops at the
    first entry older than ``begin``.

    Args:
        slot_value: the slot's value (newest entry number of the chain), 0 if empty.
        entries: entry number → entry, for at least the entries of this chain.
    """
    if slot_value <= 0 or slot_value > header.index_count or header.index_count <= 1:
        return
    wanted = index_key_hash(key)
    number = slot_value
    while len(results) < max_num:
        entry = entries[number]
        if entry.time_diff < 0:
            break
        read_time = header.begin_timestamp + entry.time_diff * 1000
        if entry.key_hash == wanted and begin <= read_time <= end:
            results.append(entry.phy_offset)
        previous = entry.prev_index
        if previous <= 0 or previous > header.index_count or previous == number or read_time < begin:
            break
        number = previous
