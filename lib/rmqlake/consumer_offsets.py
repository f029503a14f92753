"""Consumer offset snapshots: the broker's ``consumerOffset.json`` (CONTRACT §2).

``{"offsetTable": {"<topic>@<group>": {"<queueId>": <offset>}}, "dataVersion": {...}}``.
The broker writes it with fastjson, which leaves integer map keys unquoted
(``{0:250,1:251}``); both that and strict JSON are read. The snapshot time
comes from ``--as-of`` or from a timestamp in the file name
(``consumerOffset-20261121T040000Z.json``, ``...2026-11-21T04:00:00Z...``
or 13 digits of epoch milliseconds).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from rmqlake.errors import InputError

# an unquoted integer key right after '{' or ',' (fastjson's Map<Integer, Long>)
_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")
_NAME_TIMES = (
    (re.compile(r"(\d{8}T\d{6})(\d{3})?Z?"), "%Y%m%dT%H%M%S"),
    (re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}[:-]\d{2}[:-]\d{2})(?:\.(\d{3}))?Z?"), None),
)
_EPOCH_MS = re.compile(r"(?<!\d)(\d{13})(?!\d)")


@dataclass(frozen=True)
class OffsetRow:
    topic: str
    group: str
    queue_id: int
    offset: int


def parse_snapshot(text: str, *, path: str) -> list[OffsetRow]:
    """Rows of one snapshot.

    Raises:
        InputError: not JSON (with line and column), no ``offsetTable``, a key
            without ``@``, or a non-integer queue id or offset.
    """
    quoted, shifts = _quote_bare_keys(text)
    try:
        document = json.loads(quoted)
    except json.JSONDecodeError as exc:
        position = exc.pos - 2 * sum(1 for at in shifts if at < exc.pos)  # back to the file's own text
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        raise InputError(f"{path}: line {line} column {column}: not a consumerOffset.json: {exc.msg}") from None
    table = document.get("offsetTable") if isinstance(document, dict) else None
    if not isinstance(table, dict):
        raise InputError(f'{path}: no "offsetTable" object (expected the broker\'s consumerOffset.json shape)')
    rows = []
    for name, queues in table.items():
        topic, at, group = name.partition("@")  # topic names cannot contain "@"
        if not at or not topic or not group:
            raise InputError(f"{path}: offsetTable key {name!r} is not '<topic>@<group>'")
        if not isinstance(queues, dict):
            raise InputError(f"{path}: offsetTable[{name!r}] is not an object of queueId: offset")
        for queue, offset in queues.items():
            if not str(queue).lstrip("-").isdigit() or not isinstance(offset, int) or isinstance(offset, bool):
                raise InputError(f"{path}: offsetTable[{name!r}]: queue {queue!r} -> {offset!r} is not int -> int")
            rows.append(OffsetRow(topic, group, int(queue), offset))
    return rows


def _quote_bare_keys(text: str) -> tuple[str, list[int]]:
    """Strict JSON of fastjson's output, and where (in the result) each added pair of quotes starts."""
    parts, shifts, last = [], [], 0
    for match in _BARE_KEY.finditer(text):
        parts.append(text[last : match.start(2)])
        shifts.append(sum(len(p) for p in parts))
        parts.append(f'"{match.group(2)}"')
        last = match.end(2)
    parts.append(text[last:])
    return "".join(parts), shifts


def snapshot_time(path: str) -> int | None:
    """Epoch ms of the timestamp in the file name, or None."""
    name = path.rsplit("/", 1)[-1]
    for pattern, layout in _NAME_TIMES:
        match = pattern.search(name)
        if match:
            text = match.group(1)
            if layout:
                moment = datetime.strptime(text, layout).replace(tzinfo=UTC)
            else:
                moment = datetime.fromisoformat(text[:13] + ":" + text[14:16] + ":" + text[17:19]).replace(tzinfo=UTC)
            return int(moment.timestamp() * 1000) + int(match.group(2) or 0)
    match = _EPOCH_MS.search(name)
    return int(match.group(1)) if match else None
