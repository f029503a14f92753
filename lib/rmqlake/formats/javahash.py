"""Java ``String.hashCode`` and the hashes RocketMQ derives from it.

Spec: conventions (String.hashCode over UTF-16 code units, 32-bit wrap),
2.3 (tagsCode), 3.4 (index key hash and slot).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1


def to_int32(value: int) -> int:
    """Wrap an integer to Java ``int`` (two's complement, 32 bits)."""
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value & 0x80000000 else value


def to_int64(value: int) -> int:
    """Wrap an integer to Java ``long`` (two's complement, 64 bits)."""
    value &= 0xFFFFFFFFFFFFFFFF
    return value - 0x10000000000000000 if value & 0x8000000000000000 else value


@lru_cache(maxsize=65536)
def java_string_hash(text: str) -> int:
    """Return Java's ``String.hashCode()`` of ``text``.

    The hash runs over UTF-16 code units, so a character outside the BMP
    (an emoji) contributes its two surrogates, exactly as in Java.

    Example:
        >>> java_string_hash("Aa") == java_string_hash("BB") == 2112
        True
    """
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def java_string_hashes(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``java_string_hash`` of every string of an Arrow array (int32; 0 for nulls).

    ASCII strings (one UTF-16 unit per byte) are hashed column-wise: one
    NumPy step per character position, over the strings at least that long
    (sorted by length, so that is a prefix). Other strings go one by one
    through ``java_string_hash``.
    """
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    texts = texts.cast(pa.large_string())
    count = len(texts)
    hashes = np.zeros(count, dtype=np.uint32)
    if count == 0:
        return hashes.view(np.int32)
    ascii_mask = pc.fill_null(pc.string_is_ascii(texts), False).to_numpy(zero_copy_only=False)
    valid = texts.is_valid().to_numpy(zero_copy_only=False)
    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64, count=count + 1, offset=texts.offset * 8)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    rows = np.flatnonzero(ascii_mask & valid)
    starts = offsets[:-1][rows]
    lengths = offsets[1:][rows] - starts
    order = np.argsort(-lengths, kind="stable")
    rows, starts, lengths = rows[order], starts[order], lengths[order]
    running = np.zeros(len(rows), dtype=np.uint32)
    longest = int(lengths[0]) if len(lengths) else 0
    ascending = lengths[::-1]
    for position in range(longest):
        # rows are sorted by length, longest first: those longer than ``position`` are a prefix
        still = len(rows) - int(np.searchsorted(ascending, position, side="right"))
        running[:still] = running[:still] * np.uint32(31) + data[starts[:still] + position]
    hashes[rows] = running
    for row in np.flatnonzero(~ascii_mask & valid).tolist():
        hashes[row] = java_string_hash(texts[row].as_py()) & 0xFFFFFFFF
    return hashes.view(np.int32)


def index_key_hashes(hashes: np.ndarray) -> np.ndarray:
    """``index_key_hash`` element-wise over int32 ``String.hashCode`` values."""
    hashes = hashes.astype(np.int64)
    return np.where(hashes == INT_MIN, 0, np.abs(hashes)).astype(np.int32)


def utf16_length(text: str) -> int:
    """Java ``String.length()``: the number of UTF-16 code units."""
    return len(text.encode("utf-16-be", "surrogatepass")) // 2


def index_key_hash(key: str) -> int:
    """``IndexFile.indexKeyHashMethod``: ``abs(hashCode)``, 0 for Integer.MIN_VALUE."""
    h = java_string_hash(key)
    return 0 if h == INT_MIN else abs(h)


def index_slot(key_hash: int, slot_count: int) -> int:
    """Slot of a non-negative index key hash."""
    return key_hash % slot_count


def index_key(topic: str, key: str) -> str:
    """``IndexService.buildKey``: ``topic + "#" + key``."""
    return f"{topic}#{key}"


def java_mod(dividend: int, divisor: int) -> int:
    """Java's ``%`` on ints: the result takes the sign of the dividend."""
    remainder = abs(dividend) % abs(divisor)
    return -remainder if dividend < 0 else remainder


def select_queue_by_hash(key: str, queue_count: int) -> int:
    """The client's ``SelectMessageQueueByHash``: ``|hashCode % n|``."""
    return abs(java_mod(java_string_hash(key), queue_count))
