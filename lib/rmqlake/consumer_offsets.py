"""Consumer offset snapshots: the broker's ``consumerOffset.json``.

``{"offsetTable": {"<topic>@<group>": {"<queueId>": <offset>}}, "dataVersion": {...}}``.
The broker writes it with fastjson, which leaves integer map keys unquoted
(``{0:250,1:251}``); both that and strict JSON are read. The snapshot time
comes from ``--as-of`` or from a timestamp in the file name
(``consumerOffset-20261121T040000Z.json``, ``...2026-11-21T04:00:00Z...``
or 13 digits of epoch milliseconds).

Snapshots come from brokers and people alike, so every entry is checked
against the broker's own rules before it is loaded: topics and groups as
the client validates them, queue ids in Java's int range, offsets in 0..
Java's long maximum. A file that breaks a rule is refused as a whole, with
the rule and the entry named. A UTF-8 byte order mark at its start is
skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from rmqlake.errors import InputError
from rmqlake.formats.json_text import JsonTextError, line_and_column, loads_strict
from rmqlake.formats.topic import VALID_TOPIC, topic_error

# an unquoted integer key right after '{' or ',' (fastjson's Map<Integer, Long>); ASCII digits and JSON whitespace
_BARE_KEY = re.compile(r"([{,][ \t\r\n]*)(-?[0-9]+)([ \t\r\n]*:)")
_NAME_TIMES = (
    (re.compile(r"([0-9]{8}T[0-9]{6})([0-9]{3})?Z?"), "%Y%m%dT%H%M%S"),
    (re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}[:-][0-9]{2}[:-][0-9]{2})(?:\.([0-9]{3}))?Z?"), None),
)
_EPOCH_MS = re.compile(r"(?<![0-9])([0-9]{13})(?![0-9])")
_QUEUE_ID = re.compile(r"-?[0-9]+")  # then at most 11 characters, so that int() reads it before the range check
QUEUE_ID_MAX = 2**31 - 1  # a Java int
OFFSET_MAX = 2**63 - 1  # a Java long
GROUP_MAX_LENGTH = 255
_BOM = "\ufeff"


@dataclass(frozen=True)
class OffsetRow:
    topic: str
    group: str
    queue_id: int
    offset: int


def parse_snapshot(data: bytes | str, *, path: str) -> list[OffsetRow]:
    """Rows of one snapshot.

    Args:
        data: the file's bytes (UTF-8) or text.
        path: the file, for messages.

    Raises:
        InputError: not UTF-8 or not strict JSON (with line and column), no
            ``offsetTable``, a key that is not ``<topic>@<group>`` with a valid
            topic and group, a queue id outside 0..2^31-1 or an offset
            outside 0..2^63-1.
    """
    text = _text(data, path)
    quoted, shifts = _quote_bare_keys(text)
    try:
        document = loads_strict(quoted)
    except JsonTextError as exc:
        if exc.path:
            where = "".join(f"[{part!r}]" for part in exc.path)
            raise InputError(f"{path}: {where} is {exc.reason}") from None
        if exc.position is None:
            raise InputError(f"{path}: not a consumerOffset.json: {exc.reason}") from None
        position = exc.position - 2 * sum(1 for at in shifts if at < exc.position)  # back to the file's own text
        line, column = line_and_column(text, position)
        raise InputError(f"{path}: line {line} column {column}: not a consumerOffset.json: {exc.reason}") from None
    table = document.get("offsetTable") if isinstance(document, dict) else None
    if not isinstance(table, dict):
        raise InputError(f'{path}: no "offsetTable" object (expected the broker\'s consumerOffset.json shape)')
    rows = []
    for name, queues in table.items():
        topic, group = _topic_and_group(name, path)
        if not isinstance(queues, dict):
            raise InputError(f"{path}: offsetTable[{name!r}] is not an object of queueId: offset")
        for queue, offset in queues.items():
            if not _QUEUE_ID.fullmatch(queue) or len(queue) > 11 or not 0 <= int(queue) <= QUEUE_ID_MAX:
                raise InputError(
                    f"{path}: offsetTable[{name!r}]: queue id {queue!r:.60} is not an integer 0..{QUEUE_ID_MAX}"
                )
            if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= OFFSET_MAX:
                raise InputError(
                    f"{path}: offsetTable[{name!r}][{queue}]: offset {offset!r:.60} is not an integer 0..{OFFSET_MAX}"
                )
            rows.append(OffsetRow(topic, group, int(queue), offset))
    return rows


def _text(data: bytes | str, path: str) -> str:
    if isinstance(data, (bytes, bytearray)):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise InputError(f"{path}: byte {exc.start} (line {line}) is not valid UTF-8") from None
    return data.removeprefix(_BOM)


def _topic_and_group(name: str, path: str) -> tuple[str, str]:
    """``<topic>@<group>`` split and checked as the client checks both names (topics cannot contain "@")."""
    topic, at, group = name.partition("@")
    if not at or not topic or not group:
        raise InputError(f"{path}: offsetTable key {name!r:.300} is not '<topic>@<group>'")
    problem = topic_error(topic)
    if problem:
        raise InputError(f"{path}: offsetTable key {name!r:.300}: {problem}")
    if not VALID_TOPIC.fullmatch(group):
        raise InputError(
            f"{path}: offsetTable key {name!r:.300}: group {group!r:.300} has characters outside [%|a-zA-Z0-9_-]"
        )
    if len(group) > GROUP_MAX_LENGTH:
        raise InputError(
            f"{path}: offsetTable key: group is {len(group)} characters long, the maximum is {GROUP_MAX_LENGTH}"
        )
    return topic, group


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
    """Epoch ms of the timestamp in the file name, or None.

    Raises:
        InputError: the name holds a timestamp that is not a real time (month 13, hour 25, ...).
    """
    name = path.rsplit("/", 1)[-1]
    for pattern, layout in _NAME_TIMES:
        match = pattern.search(name)
        if match:
            text = match.group(1)
            try:
                if layout:
                    moment = datetime.strptime(text, layout).replace(tzinfo=UTC)
                else:
                    iso_text = text[:13] + ":" + text[14:16] + ":" + text[17:19]
                    moment = datetime.fromisoformat(iso_text).replace(tzinfo=UTC)
            except ValueError:
                raise InputError(f"{path}: the time in the file name, {text}, is not a valid date and time") from None
            return int(moment.timestamp() * 1000) + int(match.group(2) or 0)
    match = _EPOCH_MS.search(name)
    return int(match.group(1)) if match else None
