"""Socket addresses as the broker writes them.

A host is the raw address (4 bytes IPv4, 16 bytes IPv6) followed by the
port as a 4-byte big-endian int. The canonical text form used in the
tables is ``a.b.c.d:port`` or ``[v6]:port`` (compressed IPv6).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from functools import cached_property, lru_cache

IPV4_FIELD_LENGTH = 8
IPV6_FIELD_LENGTH = 20


@dataclass(frozen=True)
class HostAddress:
    """One socket address: raw address bytes and port."""

    address: bytes
    port: int

    @property
    def is_ipv6(self) -> bool:
        return len(self.address) == 16

    @property
    def field_length(self) -> int:
        """Length of the record field (address + 4-byte port): 8 or 20."""
        return len(self.address) + 4

    def encode(self) -> bytes:
        """The record field: address bytes + port as a big-endian int."""
        return self.address + struct.pack(">i", self.port)

    @cached_property
    def text(self) -> str:
        if self.is_ipv6:
            return f"[{ipaddress.IPv6Address(self.address).compressed}]:{self.port}"
        return f"{ipaddress.IPv4Address(self.address)}:{self.port}"

    def __str__(self) -> str:
        return self.text


@lru_cache(maxsize=4096)
def parse_host(text: str) -> HostAddress:
    """Parse ``ip:port`` (IPv4) or ``[ipv6]:port``.

    An IPv6 address must be in brackets: without them its last group cannot
    be told from the port. The port is 1 to 5 ASCII digits. An IPv4-mapped
    IPv6 address (``[::ffff:a.b.c.d]``) becomes IPv4, as Java's
    ``InetAddress`` turns it into an ``Inet4Address`` (so the broker would
    write an 8-byte field and no IPv6 sysFlag bit).

    Raises:
        ValueError: the text is not an address with a port in 0..65535.
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"host must be 'ip:port', got {text!r:.80}")
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError(f"host must be '[ipv6]:port', got {text!r:.80}")
        addr_text, port_text = text[1:close], text[close + 2 :]
    else:
        addr_text, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"host must be 'ip:port', got {text!r:.80}")
        if ":" in addr_text:
            raise ValueError(f"an IPv6 host must be written '[ipv6]:port' (with brackets), got {text!r:.80}")
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        raise ValueError(f"host port must be a number of ASCII digits 0..65535, got {text!r:.80}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"host port must be 0..65535, got {port} in {text!r:.80}")
    if "%" in addr_text:
        raise ValueError(f"host address has an IPv6 zone id, which a store record cannot hold: {text!r:.80}")
    try:
        address = ipaddress.ip_address(addr_text)
    except ValueError:
        raise ValueError(f"host address is not an IPv4 or IPv6 address: {text!r:.80}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return HostAddress(address.packed, port)


def decode_host(buf: bytes, offset: int, *, ipv6: bool) -> HostAddress:
    """Read a host field at ``offset`` (20 bytes when ``ipv6``, else 8)."""
    size = 16 if ipv6 else 4
    address = bytes(buf[offset : offset + size])
    (port,) = struct.unpack_from(">i", buf, offset + size)
    return HostAddress(address, port)


def canonical_host(text: str) -> str:
    """Normalise a host string to the table form (``ip:port`` / ``[v6]:port``)."""
    return str(parse_host(text))
