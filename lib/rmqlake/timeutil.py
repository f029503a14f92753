"""Timestamps on the command line: epoch milliseconds, ISO-8601 or mqadmin's ``yyyy-MM-dd#HH:mm:ss:SSS``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from rmqlake.errors import UsageError

# UtilAll.YYYY_MM_DD_HH_MM_SS_SSS, the format mqadmin's printMsg, consumeMessage and the like take for times
MQADMIN_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})#([0-9]{2}):([0-9]{2}):([0-9]{2}):([0-9]{3})")


def parse_timestamp(text: str | int, *, option: str = "timestamp") -> int:
    """Epoch milliseconds of ``text`` (digits = epoch ms; ISO-8601 without zone = UTC; mqadmin's
    ``yyyy-MM-dd#HH:mm:ss:SSS`` = UTC: mqadmin reads it in the JVM's zone, a lake has none).

    Raises:
        UsageError: neither form, or outside the years 1..9999 (non-ASCII digits are neither form).
    """
    if isinstance(text, int):
        return _in_range(text, text, option)
    value = text.strip()
    digits = value.removeprefix("-")
    if digits.isascii() and digits.isdigit():
        if len(digits) > 19:
            raise UsageError(f"{option}: {text!r:.60} is outside the years 1..9999 in epoch milliseconds")
        return _in_range(int(value), text, option)
    mqadmin = MQADMIN_TIME.fullmatch(value)
    try:
        if mqadmin:
            *fields, millis = (int(part) for part in mqadmin.groups())
            moment = datetime(*fields, millis * 1000, tzinfo=UTC)
        elif "#" in value:  # ISO-8601 parsing takes any separator: '#' means mqadmin's form, exactly
            raise ValueError(value)
        else:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option}: {text!r:.60} is neither epoch milliseconds nor ISO-8601 (e.g. 2026-11-22T04:00:00Z) "
            "nor yyyy-MM-dd#HH:mm:ss:SSS (e.g. 2026-11-22#04:00:00:000)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return _in_range(int(moment.timestamp() * 1000), text, option)
    except OverflowError:  # a zone offset moving year 1 or 9999 past the calendar's end
        raise UsageError(f"{option}: {text!r:.60} is outside the years 1..9999") from None


# What ``to_datetime`` can represent: 0001-01-01T00:00Z .. 9999-12-31T23:59:59.999Z.
MIN_EPOCH_MS, MAX_EPOCH_MS = -62_135_596_800_000, 253_402_300_799_999


def _in_range(epoch_ms: int, text: str | int, option: str) -> int:
    if not MIN_EPOCH_MS <= epoch_ms <= MAX_EPOCH_MS:
        raise UsageError(f"{option}: {text!r:.60} is outside the years 1..9999 in epoch milliseconds")
    return epoch_ms


def epoch_ms(value: datetime | int) -> int:
    """Epoch milliseconds of a timestamp read from a table (a datetime) or already in milliseconds."""
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else int(value)


def to_datetime(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000.0, UTC)


def iso(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return to_datetime(epoch_ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")
