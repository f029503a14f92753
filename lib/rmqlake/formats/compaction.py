"""Compaction rules of RocketMQ 5 COMPACTION topics (spec 5).

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

import unicodedata

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
