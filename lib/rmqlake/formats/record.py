"""CommitLog record layout: size formula, encoding and decoding.

All integers are big-endian and signed. The record version is carried only
by the magic code: V1 stores the topic length in one byte, V2 in a short.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, replace

import numpy as np

from rmqlake.formats.crc import body_crc as compute_body_crc
from rmqlake.formats.hosts import HostAddress, decode_host
from rmqlake.formats.javahash import utf16_length
from rmqlake.formats.topic import topic_error

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB
BLANK_MAGIC = -875286124  # 0xCBD43194, end of segment
END_FILE_MIN_BLANK_LENGTH = 8
MAX_V1_TOPIC_CHARS = 127
MAX_V1_TOPIC_BYTES = 127  # the V1 topic length field is one signed byte

# sysFlag bits
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_TYPE_MASK = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20

TRANSACTION_TYPES = {
    "NOT_TYPE": TRANSACTION_NOT_TYPE,
    "PREPARED": TRANSACTION_PREPARED_TYPE,
    "COMMIT": TRANSACTION_COMMIT_TYPE,
    "ROLLBACK": TRANSACTION_ROLLBACK_TYPE,
}

# Bytes of the fixed fields without the two host fields and the
# variable-length parts: 4+4+4+4+4+8+8+4+8 + 8 + 4+8 + 4 (body length) + 2 (properties length)
FIXED_FIELDS_LENGTH = 72 + 2
# The encoder reserves 64 KiB beyond maxMessageSize for the non-body fields.
RECORD_OVERHEAD_ALLOWANCE = 64 * 1024

_HEAD = struct.Struct(">iiiiiqqiq")  # total size .. born timestamp (48 bytes)


def magic_for_topic(topic: str) -> int:
    """V1 unless the topic has more than 127 Java chars (``autoMessageVersionOnTopicLen``)."""
    return MAGIC_V2 if utf16_length(topic) > MAX_V1_TOPIC_CHARS else MAGIC_V1


def topic_length_field_size(magic: int) -> int:
    """1 byte for V1, 2 for V2."""
    if magic == MAGIC_V1:
        return 1
    if magic == MAGIC_V2:
        return 2
    raise ValueError(f"not a message magic code: {magic}")


def record_size(
    *, body_length: int, topic_length: int, properties_length: int, born_v6: bool, store_v6: bool, magic: int
) -> int:
    """``MessageExtEncoder.calMsgLength``: TOTALSIZE of a record.

    ``72 + b + s + bodyLen + L + topicLen + 2 + propLen`` with b, s = 8 or 20
    and L = 1 (V1) or 2 (V2). Lengths are byte counts (topic and properties
    as UTF-8).
    """
    b = 20 if born_v6 else 8
    s = 20 if store_v6 else 8
    return FIXED_FIELDS_LENGTH + b + s + body_length + topic_length_field_size(magic) + topic_length + properties_length


def record_sizes(
    *,
    body_lengths: np.ndarray,
    topic_lengths: np.ndarray,
    properties_lengths: np.ndarray,
    born_v6: np.ndarray,
    store_v6: np.ndarray,
    magics: np.ndarray,
) -> np.ndarray:
    """``record_size`` of many records at once (int64); every magic is V1 or V2."""
    if not np.isin(magics, (MAGIC_V1, MAGIC_V2)).all():
        raise ValueError("not a message magic code among the magics")
    return (
        FIXED_FIELDS_LENGTH
        + np.where(born_v6, 20, 8)
        + np.where(store_v6, 20, 8)
        + np.asarray(body_lengths, np.int64)
        + np.where(magics == MAGIC_V1, 1, 2)
        + np.asarray(topic_lengths, np.int64)
        + np.asarray(properties_lengths, np.int64)
    )


def transaction_type(sys_flag: int) -> int:
    """``sysFlag & 0xC``."""
    return sys_flag & TRANSACTION_TYPE_MASK


def consumes_queue_offset(sys_flag: int) -> bool:
    """NOT_TYPE and COMMIT get a queue offset and a CQ unit; PREPARED and ROLLBACK do not."""
    return transaction_type(sys_flag) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


def consumes_queue_offsets(sys_flags):
    """``consumes_queue_offset`` element-wise over a NumPy array of sysFlags (a boolean array)."""
    kind = sys_flags & TRANSACTION_TYPE_MASK
    return (kind == TRANSACTION_NOT_TYPE) | (kind == TRANSACTION_COMMIT_TYPE)


def sys_flag_with_hosts(sys_flag: int, *, born_host: HostAddress, store_host: HostAddress) -> int:
    """Set the two IPv6 bits from the address types, as the broker does."""
    flag = sys_flag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
    if born_host.is_ipv6:
        flag |= BORNHOST_V6_FLAG
    if store_host.is_ipv6:
        flag |= STOREHOST_V6_FLAG
    return flag


@dataclass(frozen=True)
class Record:
    """One CommitLog message record, field for field.

    ``properties`` holds the serialised bytes exactly as stored; use
    ``formats.properties.parse_properties`` to read them as a map.
    ``body_crc`` and ``total_size`` of a decoded record are the stored values.
    """

    topic: str
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: HostAddress
    store_timestamp: int
    store_host: HostAddress
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    properties: bytes
    magic: int = MAGIC_V1
    body_crc: int | None = None
    total_size: int | None = None

    def computed_size(self) -> int:
        """TOTALSIZE by the size formula."""
        return record_size(
            body_length=len(self.body),
            topic_length=len(self.topic.encode("utf-8")),
            properties_length=len(self.properties),
            born_v6=self.born_host.is_ipv6,
            store_v6=self.store_host.is_ipv6,
            magic=self.magic,
        )

    def with_placement(self, *, physical_offset: int, queue_offset: int) -> Record:
        return replace(self, physical_offset=physical_offset, queue_offset=queue_offset)


def encode_record(record: Record) -> bytes:
    """Encode a record exactly as ``MessageExtEncoder`` + ``doAppend`` write it.

    ``body_crc`` defaults to the CRC of the body. The IPv6 bits of
    ``sys_flag`` must agree with the host addresses.

    Raises:
        ValueError: inconsistent IPv6 bits, a topic too long for the magic,
            or properties longer than 32767 bytes.
    """
    expected_flag = sys_flag_with_hosts(record.sys_flag, born_host=record.born_host, store_host=record.store_host)
    if expected_flag != record.sys_flag:
        raise ValueError(
            f"sysFlag 0x{record.sys_flag:x} disagrees with the host address types (expected 0x{expected_flag:x})"
        )
    topic_bytes = record.topic.encode("utf-8")
    topic_field = topic_length_field_size(record.magic)
    if topic_field == 1 and len(topic_bytes) > MAX_V1_TOPIC_BYTES:
        raise ValueError(f"topic of {len(topic_bytes)} bytes does not fit a V1 record (max {MAX_V1_TOPIC_BYTES})")
    if len(record.properties) > 32767:
        raise ValueError(f"properties of {len(record.properties)} bytes exceed 32767")
    size = record.computed_size()
    crc = compute_body_crc(record.body) if record.body_crc is None else record.body_crc
    out = bytearray()
    out += _HEAD.pack(
        size,
        record.magic,
        crc,
        record.queue_id,
        record.flag,
        record.queue_offset,
        record.physical_offset,
        record.sys_flag,
        record.born_timestamp,
    )
    out += record.born_host.encode()
    out += struct.pack(">q", record.store_timestamp)
    out += record.store_host.encode()
    out += struct.pack(">iqi", record.reconsume_times, record.prepared_transaction_offset, len(record.body))
    out += record.body
    out += struct.pack(">b" if topic_field == 1 else ">h", len(topic_bytes))
    out += topic_bytes
    out += struct.pack(">h", len(record.properties))
    out += record.properties
    if len(out) != size:  # guards the formula against the layout
        raise AssertionError(f"encoded {len(out)} bytes, size formula says {size}")
    return bytes(out)


def encode_blank(remaining: int) -> bytes:
    """The 8-byte end-of-file blank record: TOTALSIZE = ``remaining`` bytes left, BLANK magic."""
    if remaining < END_FILE_MIN_BLANK_LENGTH:
        raise ValueError(f"a blank record needs at least 8 bytes, got {remaining}")
    return struct.pack(">ii", remaining, BLANK_MAGIC)


@dataclass(frozen=True)
class BlankRecord:
    """End of segment marker: the rest of the segment (``total_size`` bytes) is unused."""

    physical_offset: int
    total_size: int


class CorruptRecordError(ValueError):
    """A record cannot be decoded: bad magic, truncated, or size mismatch.

    ``total_size`` is set only when the record's size can be trusted (its
    TOTALSIZE agrees with the size formula, only the body CRC is wrong), so
    a reader may skip exactly that record; otherwise it is ``None``.
    """

    def __init__(self, reason: str, *, position: int, total_size: int | None = None):
        super().__init__(f"{reason} at position {position}")
        self.reason = reason
        self.position = position
        self.total_size = total_size


def decode_record(buf: bytes | memoryview, position: int = 0, *, check_crc: bool = False) -> Record | BlankRecord:
    """Decode the record at ``position`` of ``buf``.

    Returns a ``BlankRecord`` for the end-of-file marker. The stored
    PHYSICALOFFSET field is returned as written; the caller knows where it
    read from.

    Raises:
        CorruptRecordError: fewer bytes than TOTALSIZE, an unknown magic, a
            TOTALSIZE that disagrees with the size formula ("size mismatch",
            ``total_size`` set so a reader can skip it), or a body CRC
            mismatch when ``check_crc``. Only a CRC mismatch carries
            ``total_size``: in the other cases TOTALSIZE itself may be the
            damaged field.
    """
    available = len(buf) - position
    if available < 8:
        raise CorruptRecordError("truncated record header", position=position)
    total_size, magic = struct.unpack_from(">ii", buf, position)
    if magic == BLANK_MAGIC:
        return BlankRecord(physical_offset=position, total_size=total_size)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise CorruptRecordError(f"unknown magic code 0x{magic & 0xFFFFFFFF:08X}", position=position)
    if total_size <= 0:
        raise CorruptRecordError(f"TOTALSIZE {total_size} is not a record size", position=position)
    if total_size > available:
        raise CorruptRecordError(f"TOTALSIZE {total_size} exceeds the {available} bytes available", position=position)
    try:
        record = _decode_fields(buf, position, total_size, magic)
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise CorruptRecordError(f"unreadable record ({exc})", position=position) from None
    if record.computed_size() != total_size:
        raise CorruptRecordError(
            f"size mismatch: TOTALSIZE {total_size}, fields add up to {record.computed_size()}", position=position
        )
    if check_crc and compute_body_crc(record.body) != record.body_crc:
        raise CorruptRecordError(
            f"body CRC mismatch: stored {record.body_crc}, computed {compute_body_crc(record.body)}",
            position=position,
            total_size=total_size,
        )
    return record


def _decode_fields(buf, position: int, total_size: int, magic: int) -> Record:
    end = position + total_size
    (_size, _magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts) = _HEAD.unpack_from(
        buf, position
    )
    pos = position + _HEAD.size
    born = decode_host(buf, pos, ipv6=bool(sys_flag & BORNHOST_V6_FLAG))
    pos += born.field_length
    (store_ts,) = struct.unpack_from(">q", buf, pos)
    pos += 8
    store = decode_host(buf, pos, ipv6=bool(sys_flag & STOREHOST_V6_FLAG))
    pos += store.field_length
    reconsume, prepared, body_length = struct.unpack_from(">iqi", buf, pos)
    pos += 16
    if body_length < 0 or pos + body_length > end:
        raise IndexError(f"body length {body_length} runs past the record")
    body = bytes(buf[pos : pos + body_length])
    pos += body_length
    if magic == MAGIC_V1:
        (topic_length,) = struct.unpack_from(">b", buf, pos)
        pos += 1
    else:
        (topic_length,) = struct.unpack_from(">h", buf, pos)
        pos += 2
    if topic_length < 0 or pos + topic_length > end:
        raise IndexError(f"topic length {topic_length} runs past the record")
    topic = bytes(buf[pos : pos + topic_length]).decode("utf-8")
    pos += topic_length
    (properties_length,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if properties_length < 0 or pos + properties_length > end:
        raise IndexError(f"properties length {properties_length} runs past the record")
    properties = bytes(buf[pos : pos + properties_length])
    return Record(
        topic=topic,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born,
        store_timestamp=store_ts,
        store_host=store,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        properties=properties,
        magic=magic,
        body_crc=crc,
        total_size=total_size,
    )


MAX_PORT = 65535


def record_error(record: Record) -> str | None:
    """Why a decoded record cannot be kept and written back byte for byte, or ``None`` when it can.

    The topic must pass the topic rules (it names folders of the store),
    ports must be 0..65535, an IPv6 field must not hold an IPv4-mapped
    address (its text form reads back as IPv4, an 8-byte field) and the
    queue id must not be negative.
    """
    problem = topic_error(record.topic)
    if problem:
        return problem
    if record.queue_id < 0:
        return f"queue id {record.queue_id} is negative"
    for name, host in (("born host", record.born_host), ("store host", record.store_host)):
        if not 0 <= host.port <= MAX_PORT:
            return f"{name} port {host.port} is outside 0..{MAX_PORT}"
        if host.is_ipv6 and ipaddress.IPv6Address(host.address).ipv4_mapped is not None:
            return f"{name} {host.text} is an IPv4-mapped address in an IPv6 field; it would be written back as IPv4"
    return None
