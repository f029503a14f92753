"""Timestamps on the command line: epoch milliseconds or ISO-8601."""

from __future__ import annotations

from datetime import UTC, datetime

from rmqlake.errors import UsageError


def parse_timestamp(text: str | int, *, option: str = "timestamp") -> int:
    """Epoch milliseconds of ``text`` (digits = epoch ms; ISO-8601 without zone = UTC).

    Raises:
        UsageError: neither form.
    """
    if isinstance(text, int):
        return text
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option}: {text!r} is neither epoch milliseconds nor ISO-8601 (e.g. 2026-11-22T04:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def epoch_ms(value: datetime | int) -> int:
    """Epoch milliseconds of a timestamp read from a table (a datetime) or already in milliseconds."""
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else int(value)


def to_datetime(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000.0, UTC)


def iso(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return to_datetime(epoch_ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")
