"""Java ``String.hashCode`` and the hashes RocketMQ derives from it.

Spec: conventions (String.hashCode over UTF-16 code units, 32-bit wrap),
2.3 (tagsCode), 3.4 (index key hash and slot).
"""

from __future__ import annotations

from functools import lru_cache

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


def utf16_length(text: str) -> int:
    """Java ``String.length()``: the number of UTF-16 code units."""
    return len(text.encode("utf-16-be", "surrogatepass")) // 2


def index_key_hash(key: str) -> int:
    """``IndexFile.indexKeyHashMethod``: ``abs(hashCode)``, 0 for Integer.MIN_VALUE."""
    h = java_string_hash(key)
    return 0 if h == INT_MIN else abs(h)


def index_slot(key_hash: int, slot_count: int) -> int:
    """Slot of a non-negative index key hash (spec 3.4)."""
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
