"""The properties string of a record.

Serialised as ``name 0x01 value 0x02`` per entry, UTF-8, length in a signed
short. The order is the iteration order of the writer's Java ``HashMap``;
for a message received from a producer that map is the broker's
``new HashMap<>(128)``, filled in insertion order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

from rmqlake.formats.javahash import java_string_hash

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_LENGTH = 32767  # Short.MAX_VALUE: PROPERTIES_SIZE_EXCEEDED above it

KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
CLUSTER = "CLUSTER"
WAIT = "WAIT"
DELAY = "DELAY"
KEY_SEPARATOR = " "

BROKER_MAP_INITIAL_CAPACITY = 128
_LOAD_FACTOR = 0.75


def _spread(h: int) -> int:
    """``HashMap.hash``: ``h ^ (h >>> 16)`` on the unsigned 32-bit pattern."""
    u = h & 0xFFFFFFFF
    return u ^ (u >> 16)


def hashmap_order(
    pairs: Iterable[tuple[str, str]], *, initial_capacity: int = BROKER_MAP_INITIAL_CAPACITY
) -> list[tuple[str, str]]:
    """Entries in the iteration order of a Java ``HashMap`` filled with ``pairs``.

    A ``put`` of an existing name replaces its value in place. Iteration
    walks the buckets ``spread(hashCode) & (capacity - 1)`` in index order,
    each bucket in insertion order; the table doubles each time the size
    passes ``0.75 × capacity`` and a doubling keeps relative order within
    the split buckets, so the final order depends only on the final
    capacity. (Buckets of 8+ entries become trees in Java; property sets
    that collide that much are not modelled.)
    """
    merged: dict[str, str] = {}
    for name, value in pairs:
        merged[name] = value  # dict keeps first-insertion position, last value
    capacity = initial_capacity
    while len(merged) > capacity * _LOAD_FACTOR:
        capacity *= 2
    mask = capacity - 1
    return sorted(merged.items(), key=lambda item: _bucket(item[0], mask))


@lru_cache(maxsize=65536)
def _bucket(name: str, mask: int) -> int:
    return _spread(java_string_hash(name)) & mask


def serialize_properties(pairs: Iterable[tuple[str, str]]) -> bytes:
    """``MessageDecoder.messageProperties2String`` over ``pairs`` in the given order.

    Entries whose value is ``None`` are skipped, as Java skips null values.
    """
    parts = []
    for name, value in pairs:
        if value is None:
            continue
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts).encode("utf-8")


def properties_template(names: Iterable[str]) -> str:
    """A ``str.format`` template that serialises values for ``names``, in this order, as
    ``serialize_properties`` does: ``template.format(*values)`` (hot path: one template per name set)."""
    return "".join(
        f"{name.replace('{', '{{').replace('}', '}}')}{NAME_VALUE_SEPARATOR}{{}}{PROPERTY_SEPARATOR}" for name in names
    )


def broker_properties(
    user_properties: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    keys: str | None,
    tags: str | None,
    uniq_key: str | None,
    cluster_name: str | None,
) -> list[tuple[str, str]]:
    """The property entries a broker stores for a sent message, in storage order.

    Insertion order is the producer's ``properties`` object, then ``KEYS``,
    ``TAGS``, ``UNIQ_KEY`` and ``CLUSTER``; the stored order
    is the iteration order of the broker's ``HashMap`` of capacity 128.
    """
    items = list(user_properties.items()) if isinstance(user_properties, Mapping) else list(user_properties)
    for name, value in ((KEYS, keys), (TAGS, tags), (UNIQ_KEY, uniq_key), (CLUSTER, cluster_name)):
        if value is not None:
            items.append((name, value))
    return hashmap_order(items)


def parse_properties(data: bytes | str) -> dict[str, str]:
    """``MessageDecoder.string2messageProperties``.

    Split on 0x02; segments shorter than 3 characters are ignored; the first
    0x01 separates name and value; empty names or values are dropped; a
    later duplicate overwrites an earlier one.
    """
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    result: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        if len(segment) < 3:
            continue
        name, sep, value = segment.partition(NAME_VALUE_SEPARATOR)
        if not sep or not name or not value:
            continue
        result[name] = value
    return result


def property_columns(properties: Mapping[str, str]) -> dict:
    """The commitlog columns a record's parsed properties give (every writer's and a key lookup's rule): the
    pairs in order, the KEYS tokens, TAGS and UNIQ_KEY (``None`` when absent)."""
    return {
        "properties": list(properties.items()),
        "keys": split_keys(properties.get(KEYS)),
        "tags": properties.get(TAGS),
        "uniq_key": properties.get(UNIQ_KEY),
    }


def split_keys(keys: str | None) -> list[str]:
    """KEYS tokens as the index builds them.

    Java ``String.split(" ")``: consecutive spaces make empty tokens, which
    the index skips; tabs are not separators.
    """
    if not keys:
        return []
    return [token for token in keys.split(KEY_SEPARATOR) if token]
