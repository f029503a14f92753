"""Message ids: the broker's offsetMsgId and the client's UNIQ_KEY."""

from __future__ import annotations

import struct
from datetime import datetime
from functools import lru_cache
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.hosts import HostAddress
from rmqlake.formats.javahash import to_int32


def offset_msg_id_prefix(store_host: HostAddress) -> str:
    """Upper-case hex of store address + port: the part of an offsetMsgId fixed per host."""
    return store_host.encode().hex().upper()


def offset_msg_id(store_host: HostAddress, physical_offset: int) -> str:
    """``MessageDecoder.createMessageId``: hex(address + port + physical offset), upper case.

    Example:
        >>> from rmqlake.formats.hosts import parse_host
        >>> offset_msg_id(parse_host("10.0.0.5:10911"), 0)
        '0A00000500002A9F0000000000000000'
    """
    return offset_msg_id_with_prefix(offset_msg_id_prefix(store_host), physical_offset)


def offset_msg_id_with_prefix(prefix: str, physical_offset: int) -> str:
    """offsetMsgId from a precomputed ``offset_msg_id_prefix`` (hot path: one per message)."""
    return f"{prefix}{physical_offset & 0xFFFFFFFFFFFFFFFF:016X}"


def offset_msg_ids_with_prefix(prefixes: pa.Array, physical_offsets: np.ndarray) -> pa.Array:
    """``offset_msg_id_with_prefix`` over arrays: Arrow strings of prefixes, NumPy int64 offsets."""
    count = len(physical_offsets)
    digits = _HEX_PAIRS[np.ascontiguousarray(physical_offsets, dtype=">i8").view(np.uint8)].reshape(count, 16)
    offsets = pa.py_buffer(np.arange(0, 16 * count + 1, 16, dtype=np.int32))
    hex_text = pa.Array.from_buffers(pa.string(), count, [None, offsets, pa.py_buffer(digits.tobytes())])
    return pc.binary_join_element_wise(prefixes, hex_text, "")


_HEX_PAIRS = np.array([list(f"{byte:02X}".encode()) for byte in range(256)], dtype=np.uint8)


def decode_offset_msg_id(msg_id: str) -> tuple[HostAddress, int]:
    """Split an offsetMsgId into (store host, physical offset).

    32 hex characters decode as IPv4, 56 as IPv6 (``MessageDecoder.decodeMessageId``).

    Raises:
        ValueError: not 32 or 56 hex characters.
    """
    text = msg_id.strip()
    if len(text) not in (32, 56):
        raise ValueError(f"an offsetMsgId has 32 (IPv4) or 56 (IPv6) hex characters, got {len(text)}: {msg_id!r}")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"an offsetMsgId is hexadecimal, got {msg_id!r}") from None
    address_length = 4 if len(raw) == 16 else 16
    (port,) = struct.unpack_from(">i", raw, address_length)
    (offset,) = struct.unpack_from(">q", raw, address_length + 4)
    return HostAddress(raw[:address_length], port), offset


def month_start_millis(timestamp_ms: int, zone: str) -> int:
    """Epoch ms of 00:00:00.000 on the first day of ``timestamp_ms``'s month in ``zone``."""
    return _month_start_of_minute(timestamp_ms // 60_000, zone)


@lru_cache(maxsize=4096)
def _month_start_of_minute(minute: int, zone: str) -> int:
    # Month starts fall on whole minutes in every current zone, so one answer per minute.
    moment = datetime.fromtimestamp(minute * 60, ZoneInfo(zone))
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


def uniq_key(
    *, ip: bytes, pid: int, class_loader_hash: int, timestamp_ms: int, month_start_ms: int, counter: int
) -> str:
    """A client message id in ``MessageClientIDSetter``'s layout.

    ip (4|16) + pid (short) + class-loader hash (int) + ms since the start
    of the month (int, wraps like Java's cast; small negatives clamp to 0)
    + counter (low 16 bits), as upper-case hex.
    """
    return uniq_key_prefix(ip=ip, pid=pid, class_loader_hash=class_loader_hash) + uniq_key_tail(
        timestamp_ms=timestamp_ms, month_start_ms=month_start_ms, counter=counter
    )


def uniq_key_prefix(*, ip: bytes, pid: int, class_loader_hash: int) -> str:
    """The part of a UNIQ_KEY fixed per process: ip + pid + class-loader hash, upper-case hex."""
    return (ip + struct.pack(">hi", to_int16(pid), to_int32(class_loader_hash))).hex().upper()


def uniq_key_tail(*, timestamp_ms: int, month_start_ms: int, counter: int) -> str:
    """The per-message part of a UNIQ_KEY: ms since the month start (int) + counter (short), upper-case hex."""
    diff = to_int32(timestamp_ms - month_start_ms)
    if -1_000_000 < diff < 0:
        diff = 0
    return f"{diff & 0xFFFFFFFF:08X}{counter & 0xFFFF:04X}"


def to_int16(value: int) -> int:
    value &= 0xFFFF
    return value - 0x10000 if value & 0x8000 else value
