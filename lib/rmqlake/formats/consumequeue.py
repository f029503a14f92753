"""ConsumeQueue units, files and tagsCode."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping

from rmqlake.formats.javahash import java_string_hash

CQ_UNIT_SIZE = 20
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT = struct.Struct(">qiq")
# fillPreBlank: units before the first real unit of a queue that starts mid-way
PRE_BLANK_UNIT = (0, 0x7FFFFFFF, 0)

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(levels: str = DEFAULT_DELAY_LEVELS) -> dict[int, int]:
    """``messageDelayLevel`` → {level: delay ms}, levels numbered from 1 (``ScheduleMessageService.parseDelayLevel``).

    Raises:
        ValueError: a level that is not a whole number followed by s, m, h or d (the broker then refuses to start).
    """
    table = {}
    for level, token in enumerate(levels.split(), start=1):
        if not re.fullmatch(r"[0-9]{1,12}[smhd]", token):
            raise ValueError(f"level {level} is {token!r}: each level is a whole number followed by s, m, h or d")
        table[level] = int(token[:-1]) * _UNIT_MS[token[-1]]
    return table


# the broker's default ``messageDelayLevel`` as {level: delay ms}
DEFAULT_DELAY_TABLE = parse_delay_levels()


def tags_code(tags: str | None) -> int:
    """``tagsString2tagsCode``: the sign-extended ``String.hashCode`` of TAGS, 0 without tags."""
    return java_string_hash(tags) if tags else 0


def delay_level(properties: Mapping[str, str], *, delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE) -> int | None:
    """The DELAY level as the dispatcher reads it, capped at the highest of ``delay_levels``; ``None`` without DELAY.

    Raises:
        ValueError: DELAY is not an integer (``Integer.parseInt`` fails and
            the broker cannot dispatch the record).
    """
    text = properties.get("DELAY")
    if text is None:
        return None
    level = int(text)
    return min(level, max(delay_levels))


def dispatch_tags_code(
    topic: str,
    tags: str | None,
    properties: Mapping[str, str],
    store_timestamp: int,
    *,
    delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE,
) -> int:
    """tagsCode of a dispatched record.

    On ``SCHEDULE_TOPIC_XXXX`` with a positive DELAY level it is the delivery
    time (``computeDeliverTimestamp``: ``storeTimestamp`` + the level's delay
    in ``delay_levels``, the broker's ``messageDelayLevel``, the level capped
    at the highest; + 1000 ms for a level the table lacks); otherwise the TAGS hash.
    """
    code = tags_code(tags)
    if topic == SCHEDULE_TOPIC:
        level = delay_level(properties, delay_levels=delay_levels)
        if level is not None and level > 0:
            code = store_timestamp + delay_levels.get(level, 1000)
    return code


def encode_unit(commit_log_offset: int, size: int, tags_code_value: int) -> bytes:
    """A 20-byte CQ unit: commitLogOffset (long), size (int), tagsCode (long)."""
    return _UNIT.pack(commit_log_offset, size, tags_code_value)


def decode_unit(buf: bytes, position: int = 0) -> tuple[int, int, int]:
    """(commitLogOffset, size, tagsCode) of the unit at ``position``."""
    return _UNIT.unpack_from(buf, position)


def cq_file_size(units_per_file: int) -> int:
    return units_per_file * CQ_UNIT_SIZE


def cq_file_name(queue_offset: int, units_per_file: int) -> str:
    """Name of the CQ file holding ``queue_offset``: its first unit's logical byte offset, 20 digits."""
    file_size = cq_file_size(units_per_file)
    return f"{(queue_offset * CQ_UNIT_SIZE) // file_size * file_size:020d}"


def cq_position(queue_offset: int, units_per_file: int) -> int:
    """Byte position of the unit inside its file."""
    return (queue_offset * CQ_UNIT_SIZE) % cq_file_size(units_per_file)


def offset_in_queue_by_time(
    files: list[tuple[int, list[tuple[int, int]]]],
    *,
    timestamp: int,
    boundary: str = "lower",
    min_logic_offset: int = 0,
    min_phy_offset: int = 0,
) -> int:
    """``ConsumeQueue.getOffsetInQueueByTime`` over a queue's files.

    Args:
        files: per CQ file in order, (first queue offset, units) where each
            unit is (commitLogOffset, store time); the store time is -1 when
            the message can no longer be read (its segment was deleted).
        boundary: ``lower`` (first offset stored at or after ``timestamp``) or
            ``upper`` (last offset stored at or before it).
        min_logic_offset: the queue's min offset (units below it are skipped).
        min_phy_offset: commitlog min offset (units below it count as too old).

    Returns:
        The queue offset, with the broker's answers for the corner cases
        (all units earlier → one past the last unit for ``lower``; all later →
        the file's first offset for ``lower``, 0 for ``upper``).
    """
    if not files:
        return 0
    lower = boundary == "lower"
    chosen = _file_by_time(files, timestamp=timestamp, lower=lower)
    if chosen is None:
        return 0
    first, units = chosen
    floor = max(min_logic_offset - first, 0)
    ceiling = len(units) - 1
    if ceiling < 0:
        return 0

    def store_time(position: int) -> int:
        return units[position][1]

    if store_time(ceiling) < timestamp:
        return first + ceiling + 1 if lower else first + ceiling
    if store_time(floor) > timestamp:
        return first if lower else 0
    low, high = floor, ceiling
    target = left = right = -1
    while high >= low:
        middle = (low + high) // 2
        phy, stored = units[middle]
        if phy < min_phy_offset:
            low, left = middle + 1, middle
            continue
        if stored < 0:
            return 0
        if stored == timestamp:
            target = middle
            break
        if stored > timestamp:
            high, right = middle - 1, middle
        else:
            low, left = middle + 1, middle
    if target != -1:
        step = -1 if lower else 1
        limit_ok = (lambda p: p >= floor) if lower else (lambda p: p <= ceiling)
        while limit_ok(target + step) and store_time(target + step) == timestamp:
            target += step
        return first + target
    # no unit at exactly ``timestamp``: the enclosing units (-1 when the search never moved that way)
    return first + (right if lower else left)


def files_for_time_search(
    units: Iterable[tuple[int, int, int]], *, units_per_file: int
) -> list[tuple[int, list[tuple[int, int]]]]:
    """A queue's units as :func:`offset_in_queue_by_time` reads its files: per file, from the file's first slot.

    Args:
        units: (queue offset, commitLogOffset, store time) in queue-offset
            order; store time -1 for a message that can no longer be read.
        units_per_file: units per CQ file.

    Returns:
        Per CQ file in order, (its first queue offset, units). A queue that
        starts inside its first file gets the broker's pre-blank units before
        its first unit (``ConsumeQueue.fillPreBlank``): they point at offset 0
        with an unreadable size, so their store time is -1.
    """
    files: list[tuple[int, list[tuple[int, int]]]] = []
    for queue_offset, commitlog_offset, stored in units:
        first = queue_offset - queue_offset % units_per_file
        if not files or files[-1][0] != first:
            files.append((first, [(PRE_BLANK_UNIT[0], -1)] * (queue_offset - first)))
        files[-1][1].append((commitlog_offset, stored))
    return files


def store_offset_by_time(
    files: list[tuple[int, list[tuple[int, int]]]],
    *,
    timestamp: int,
    boundary: str = "lower",
    min_logic_offset: int = 0,
    min_phy_offset: int = 0,
) -> int:
    """``DefaultMessageStore.getOffsetInQueueByTime``: the queue's answer kept within its min and max offsets.

    The store (``ConsumeQueueStore``) clamps what :func:`offset_in_queue_by_time`
    answers to ``[minOffsetInQueue, maxOffsetInQueue]``, so a time before the
    queue's first live message gives its min offset (not the file's first
    offset, nor 0 for ``upper``) once expiry moved the min offset up.

    Args:
        files: as for :func:`offset_in_queue_by_time`; the last file's units
            end at the queue's max offset.
        min_logic_offset: the queue's min offset.

    Returns:
        The queue offset, ``min_logic_offset <= offset <= max offset``.
    """
    offset = offset_in_queue_by_time(
        files, timestamp=timestamp, boundary=boundary, min_logic_offset=min_logic_offset, min_phy_offset=min_phy_offset
    )
    maximum = files[-1][0] + len(files[-1][1]) if files else 0
    return min(max(offset, min_logic_offset), maximum)


def _file_by_time(files, *, timestamp: int, lower: bool):
    """``MappedFileQueue.getConsumeQueueMappedFileByTime``."""
    if lower:  # the first file whose last unit was stored at or after the time, else the newest file
        for first, units in files[:-1]:
            if units and units[-1][1] >= timestamp:
                return first, units
        return files[-1]
    for first, units in reversed(files):  # the newest file whose first unit is not later (unknown: -1 counts)
        if units and units[0][1] <= timestamp:
            return first, units
    return None
