"""CommitLog segments: names and where each record lands.

A record fits in the current segment only when it leaves at least 8 bytes
free behind it (``size + 8 <= remaining``). Otherwise the broker writes an
8-byte blank record (TOTALSIZE = all remaining bytes, BLANK magic) and
appends the record at offset 0 of the next segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rmqlake.formats.record import END_FILE_MIN_BLANK_LENGTH

FILE_NAME_DIGITS = 20


def segment_file_name(start_offset: int) -> str:
    """``UtilAll.offset2FileName``: the start offset, zero padded to 20 digits."""
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"


def segment_start(offset: int, segment_size: int) -> int:
    """Start offset of the segment holding physical offset ``offset``."""
    return offset - offset % segment_size


def next_segment_start(offset: int, segment_size: int) -> int:
    """``rollNextFile``: start of the segment after the one holding ``offset``."""
    return offset + segment_size - offset % segment_size


def fits(record_size: int, remaining: int) -> bool:
    """True when a record of ``record_size`` bytes may be written with ``remaining`` bytes left."""
    return record_size + END_FILE_MIN_BLANK_LENGTH <= remaining


@dataclass(frozen=True)
class Blank:
    """An end-of-segment blank record written at ``position``, covering ``length`` bytes."""

    position: int
    length: int


@dataclass(frozen=True)
class Placement:
    """Where a run of records lands: one physical offset per record, the blanks
    written before rolls, and the write position after the last record."""

    offsets: np.ndarray
    blanks: tuple[Blank, ...]
    end_offset: int


def place_records(sizes, *, start_offset: int, segment_size: int) -> Placement:
    """Assign physical offsets to records appended in order from ``start_offset``.

    Vectorised over the prefix sums of ``sizes``: each segment's share is
    found with one binary search, so the cost grows with records plus
    segments rolled, not with their product.

    Args:
        sizes: TOTALSIZE of each record, in append order.
        start_offset: the commitlog write position before the first record.
        segment_size: ``store.commitlog_segment_size``.

    Raises:
        ValueError: a record cannot fit even an empty segment.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    count = len(sizes)
    if count and int(sizes.max()) + END_FILE_MIN_BLANK_LENGTH > segment_size:
        raise ValueError(
            f"a record of {int(sizes.max())} bytes cannot fit a segment of {segment_size} bytes "
            f"(each segment keeps {END_FILE_MIN_BLANK_LENGTH} bytes for its end-of-file blank)"
        )
    prefix = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(sizes, out=prefix[1:])
    offsets = np.empty(count, dtype=np.int64)
    blanks: list[Blank] = []
    position = start_offset
    first = 0
    while first < count:
        segment_end = next_segment_start(position, segment_size)
        # records first..last-1 fit: prefix[k+1] - prefix[first] + 8 <= segment_end - position
        limit = segment_end - END_FILE_MIN_BLANK_LENGTH - position + int(prefix[first])
        last = int(np.searchsorted(prefix, limit, side="right")) - 1
        last = min(max(last, first), count)
        offsets[first:last] = position + prefix[first:last] - prefix[first]
        position += int(prefix[last] - prefix[first])
        if last == count:
            break
        blanks.append(Blank(position=position, length=segment_end - position))
        position = segment_end
        first = last
    return Placement(offsets=offsets, blanks=tuple(blanks), end_offset=position)
