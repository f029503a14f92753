"""Compaction rules of RocketMQ 5 COMPACTION topics.

Sources: store/.../kv/CompactionLog.java (``shouldRetainMsg``,
``asyncPutMessage``, ``getCompactionLogSize``), store/.../queue/BatchConsumeQueue.java.

* The key is the **whole** ``KEYS`` property string, not its space-separated
  tokens (``msgExt.getKeys()``).
* A record without a non-blank key is never copied to the compaction log.
* Per topic and queue only the latest record of each key survives (highest
  queue offset); if that record's body is empty it is a tombstone: it is
  dropped as well, and the key disappears.
* The compacted queue (a SparseConsumeQueue) keeps the original queue
  offsets, so it has gaps; its units are 46 bytes in files of
  ``compactionCqMappedFileSize`` rounded down to a whole number of units.
"""

from __future__ import annotations

import struct
import unicodedata
from dataclasses import dataclass

SPARSE_CQ_UNIT_SIZE = 46  # BatchConsumeQueue.CQ_STORE_UNIT_SIZE
DEFAULT_COMPACTION_CQ_FILE_SIZE = 10 * 1024 * 1024  # compactionCqMappedFileSize


def is_blank(text: str | None) -> bool:
    """``StringUtils.isBlank``: null, empty or only whitespace (Java ``Character.isWhitespace``)."""
    return text is None or all(_java_whitespace(c) for c in text)


def _java_whitespace(char: str) -> bool:
    # Character.isWhitespace: space, line and paragraph separators except the no-break spaces,
    # plus \t \n \u000B \f \r and \u001C-\u001F
    if char in JAVA_WHITESPACE_CONTROLS:
        return True
    return unicodedata.category(char) in ("Zs", "Zl", "Zp") and char not in NO_BREAK_SPACES


JAVA_WHITESPACE_CONTROLS = "\t\n\u000b\f\r\u001c\u001d\u001e\u001f"
NO_BREAK_SPACES = "\u00a0\u2007\u202f"
# the same set as a Java regex class, for Spark (which evaluates regular expressions with java.util.regex)
JAVA_WHITESPACE_REGEX = r"[[\t\n\x0B\f\r\x1C-\x1F]\p{Z}&&[^\u00A0\u2007\u202F]]"


def sparse_cq_file_size(configured: int = DEFAULT_COMPACTION_CQ_FILE_SIZE) -> int:
    """The compaction CQ file size the broker uses: rounded down to whole 46-byte units."""
    return configured // SPARSE_CQ_UNIT_SIZE * SPARSE_CQ_UNIT_SIZE


def sparse_cq_file_name(ordinal: int, configured_file_size: int = DEFAULT_COMPACTION_CQ_FILE_SIZE) -> str:
    """File of the ``ordinal``-th unit (0-based) of a compacted queue: its first byte's offset, 20 digits.

    Units of a sparse queue are stored densely (their queue offsets have
    gaps, their positions do not), so the file follows from the unit's
    position in the compacted queue, not from its queue offset.
    """
    size = sparse_cq_file_size(configured_file_size)
    return f"{ordinal * SPARSE_CQ_UNIT_SIZE // size * size:020d}"


# -- the broker's compaction store on disk ------------------------------------------------------
#
# ``compaction/compactionLog/{topic}/{queueId}/`` holds a queue's compaction log: the raw records
# one after the other, each with PHYSICALOFFSET rewritten to its position in this log (QUEUEOFFSET
# and every other byte as in the commitlog). ``compaction/compactionCq/{topic}/{queueId}/`` holds
# its sparse queue: one 46-byte unit per record. A log file and the queue file describing it share
# their name: the log file's start offset, 20 digits. Both are preallocated at full size
# (``MappedFileQueue`` refuses a file of another size). The log file size is a multiple of the
# queue file size (``CompactionLog.getCompactionLogSize``), so both roll over together: before a
# record that would leave fewer than 8 bytes in the log file, or when the queue file has room for
# one unit only, the log file gets the 8-byte blank record and the queue file an end unit.

DEFAULT_COMPACTION_LOG_FILE_SIZE = 100 * 1024 * 1024  # compactionMappedFileSize
END_FILE_MIN_BLANK_LENGTH = 8
_SPARSE_UNIT = struct.Struct(
    ">qiqqqhii"
)  # pos, size, tagsCode, storeTime, msgBaseOffset, batchSize, compacted, reserved
SPARSE_END_UNIT = _SPARSE_UNIT.pack(-1, 0, 0, 0, 0, 0, -1, 0)  # SparseConsumeQueue.putEndPositionInfo


def compaction_log_file_size(
    cq_file_size: int = DEFAULT_COMPACTION_CQ_FILE_SIZE, configured: int = DEFAULT_COMPACTION_LOG_FILE_SIZE
) -> int:
    """The compaction log file size the broker uses (``getCompactionLogSize``): a multiple of the CQ file size."""
    cq = sparse_cq_file_size(cq_file_size)
    whole, rest = divmod(configured, cq)
    if whole < 5:
        return cq * 5
    return whole * cq if 0 < rest < cq >> 1 else (whole + 1) * cq


def encode_sparse_unit(position: int, size: int, tags_code: int, store_timestamp: int, queue_offset: int) -> bytes:
    """One unit of a compacted queue as ``putBatchMessagePositionInfo`` writes it (batch of 1, no compacted offset)."""
    return _SPARSE_UNIT.pack(position, size, tags_code, store_timestamp, queue_offset, 1, -1, 0)


@dataclass(frozen=True)
class Placement:
    """Where a record goes: the log file's start offset, its position in the compaction log, its unit's position."""

    file_start: int
    position: int
    cq_position: int


def place_records(sizes, *, log_file_size: int, cq_file_size: int):
    """Lay a queue's records (sizes in queue offset order) out as the broker appends them one by one.

    Yields ``("record", Placement)`` per record and, before a record that
    opens the next file pair, ``("end", Placement)`` for the end of the
    file pair it leaves (``position``: where its blank record goes,
    ``cq_position``: where its end unit goes).
    """
    if cq_file_size < 2 * SPARSE_CQ_UNIT_SIZE:
        raise ValueError(f"a compaction CQ file of {cq_file_size} bytes holds no unit besides its end unit")
    start, used, units = 0, 0, 0
    for size in sizes:
        if size + END_FILE_MIN_BLANK_LENGTH > log_file_size:
            raise ValueError(f"a record of {size} bytes does not fit a compaction log file of {log_file_size}")
        if units + SPARSE_CQ_UNIT_SIZE >= cq_file_size or size + END_FILE_MIN_BLANK_LENGTH > log_file_size - used:
            yield "end", Placement(start, start + used, units)
            start, used, units = start + log_file_size, 0, 0
        yield "record", Placement(start, start + used, units)
        used += size
        units += SPARSE_CQ_UNIT_SIZE
