"""Body CRC: ``UtilAll.crc32`` = java.util.zip.CRC32 with the sign bit cleared."""

from __future__ import annotations

import zlib


def body_crc(body: bytes) -> int:
    """CRC32 (IEEE) of ``body`` masked with ``0x7FFFFFFF``; 0 for an empty body."""
    return zlib.crc32(body) & 0x7FFFFFFF
