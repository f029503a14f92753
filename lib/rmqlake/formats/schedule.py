"""Where a broker stores a delay-level or timer message, and when it delivers it.

Sources: HookUtils.handleScheduleMessage / checkIfTimerMessage / transformTimerMessage /
transformDelayLevelMessage (what the broker stores for a send), ScheduleMessageService
(delay levels, computeDeliverTimestamp) and TimerMessageStore (the timer wheel's dequeue reads a
slot once the wall clock, floored to the precision, has passed it).

Properties are (name, value) pairs in storage order (the broker's ``HashMap`` iteration order);
a re-routed message's pairs are that map after the broker's puts and removals, in storage order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rmqlake.formats.consumequeue import DEFAULT_DELAY_LEVELS, SCHEDULE_TOPIC, parse_delay_levels
from rmqlake.formats.properties import DELAY, hashmap_order
from rmqlake.formats.record import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, transaction_type

TIMER_TOPIC = "rmq_sys_wheel_timer"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
TIMER_PROPERTIES = (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)
DEFAULT_TIMER_PRECISION_MS = 1000
DEFAULT_TIMER_MAX_DELAY_SEC = 3600 * 24 * 3

# Long.parseLong / Integer.parseInt: an optional sign and ASCII digits (Java also takes other Unicode
# digits, which no producer sends)
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


class ScheduleRefused(ValueError):
    """The broker refuses the send (``WHEEL_TIMER_MSG_ILLEGAL``, or a DELAY it cannot parse); the message says why."""


@dataclass(frozen=True)
class ScheduleRules:
    """The broker settings the rules read.

    Attributes:
        delay_levels: ``messageDelayLevel`` as {level: delay ms}, levels from 1.
        timer_precision_ms: ``timerPrecisionMs``.
        timer_max_delay_sec: ``timerMaxDelaySec``.
    """

    delay_levels: Mapping[int, int] = field(default_factory=lambda: parse_delay_levels(DEFAULT_DELAY_LEVELS))
    timer_precision_ms: int = DEFAULT_TIMER_PRECISION_MS
    timer_max_delay_sec: int = DEFAULT_TIMER_MAX_DELAY_SEC

    @classmethod
    def of(cls, *, message_delay_level: str, timer_precision_ms: int, timer_max_delay_sec: int) -> ScheduleRules:
        return cls(parse_delay_levels(message_delay_level), timer_precision_ms, timer_max_delay_sec)

    @property
    def max_delay_level(self) -> int:
        return max(self.delay_levels)


@dataclass(frozen=True)
class Routed:
    """Where a sent message is stored, and when the broker delivers it to its real topic.

    Attributes:
        topic, queue_id: where the record is stored (the sent ones for a message not re-routed).
        properties: the stored pairs, in storage order.
        kind: ``"plain"`` (stored where it was sent), ``"delay"`` or ``"timer"``.
        level: the (clamped) delay level of a ``"delay"`` message.
        due_ms: when a re-routed message is delivered: the ConsumeQueue tagsCode of a delay
            message; for a timer the first wall-clock ms at which the wheel reads its slot
            (``TIMER_OUT_MS`` + the precision).
    """

    topic: str
    queue_id: int
    properties: list[tuple[str, str]]
    kind: str = "plain"
    level: int | None = None
    due_ms: int | None = None


def java_long(text: str, *, bits: int = 64) -> int:
    """``Long.parseLong`` (``Integer.parseInt`` with ``bits=32``).

    Raises:
        ValueError: what Java refuses (no digits, other characters, out of range).
    """
    low, high = (_LONG_MIN, _LONG_MAX) if bits == 64 else (_INT_MIN, _INT_MAX)
    if not _JAVA_INTEGER.fullmatch(text):
        raise ValueError(f"not an integer: {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"out of range: {text!r}")
    return value


def _wrap_long(value: int) -> int:
    """Java's silent long overflow."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def route(
    topic: str,
    queue_id: int,
    properties: Sequence[tuple[str, str]],
    *,
    sys_flag: int,
    now_ms: int,
    rules: ScheduleRules,
) -> Routed:
    """``HookUtils.handleScheduleMessage`` for a message sent to ``topic``/``queue_id`` with ``properties``.

    ``now_ms`` is the broker's clock at the put: the message's store time in a rebuild.

    Raises:
        ScheduleRefused: a timer over ``timer_max_delay_sec``, a timer property that is not an
            integer, a delete-timer (``TIMER_DEL_UNIQKEY``) not in the future, a DELAY that is not an integer.
    """
    if transaction_type(sys_flag) not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
        return Routed(topic, queue_id, list(properties))
    pairs = dict(properties)
    level = _delay_level(pairs)
    if topic != TIMER_TOPIC and _is_timer(pairs, level):
        routed = _timer(topic, queue_id, pairs, now_ms=now_ms, rules=rules)
        if routed is not None:
            return routed
    if level > 0:
        if level > rules.max_delay_level:
            level = rules.max_delay_level
            pairs[DELAY] = str(level)  # setDelayTimeLevel: replaced in place
        pairs[REAL_TOPIC] = topic
        pairs[REAL_QID] = str(queue_id)
        due = now_ms + rules.delay_levels[level]  # computeDeliverTimestamp: the tagsCode the CQ unit carries
        return Routed(SCHEDULE_TOPIC, level - 1, hashmap_order(pairs.items()), "delay", level, due)
    return Routed(topic, queue_id, hashmap_order(pairs.items()))


def _delay_level(pairs: dict[str, str]) -> int:
    """``getDelayTimeLevel``: ``Integer.parseInt(DELAY)``, 0 without it."""
    text = pairs.get(DELAY)
    if text is None:
        return 0
    try:
        return java_long(text, bits=32)
    except ValueError:
        raise ScheduleRefused(f"DELAY is not an integer: {text!r}") from None


def _is_timer(pairs: dict[str, str], level: int) -> bool:
    """``checkIfTimerMessage``; a delay level wins and drops the timer properties."""
    if level > 0:
        for name in TIMER_PROPERTIES:
            pairs.pop(name, None)
        return False
    if TIMER_OUT_MS in pairs:
        return False
    return any(name in pairs for name in TIMER_PROPERTIES)


def _timer(topic: str, queue_id: int, pairs: dict[str, str], *, now_ms: int, rules: ScheduleRules) -> Routed | None:
    """``transformTimerMessage``: the timer topic record, or ``None`` when the time has passed (stored as sent)."""
    for name in (TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS):
        if name in pairs:
            try:
                value = java_long(pairs[name])
            except ValueError:
                raise ScheduleRefused(f"timer message illegal: {name} is not an integer: {pairs[name]!r}") from None
            deliver = {
                TIMER_DELAY_SEC: lambda v: _wrap_long(now_ms + _wrap_long(v * 1000)),
                TIMER_DELAY_MS: lambda v: _wrap_long(now_ms + v),
                TIMER_DELIVER_MS: lambda v: v,
            }[name](value)
            break
    if deliver <= now_ms:
        if TIMER_DEL_UNIQKEY in pairs:
            raise ScheduleRefused("timer message illegal: a timer delete not in the future")
        return None
    if deliver - now_ms > rules.timer_max_delay_sec * 1000:
        raise ScheduleRefused(
            f"timer message illegal: the delay {deliver - now_ms} ms is over the max delay "
            f"{rules.timer_max_delay_sec * 1000} ms"
        )
    precision = rules.timer_precision_ms
    out = deliver - precision if deliver % precision == 0 else deliver // precision * precision
    pairs[TIMER_OUT_MS] = str(out)
    pairs[REAL_TOPIC] = topic
    pairs[REAL_QID] = str(queue_id)
    return Routed(TIMER_TOPIC, 0, hashmap_order(pairs.items()), "timer", None, out + precision)


def delivery(topic: str, properties: Sequence[tuple[str, str]], *, store_timestamp: int, due_ms: int,
             rules: ScheduleRules) -> Routed:  # fmt: skip
    """The record a broker appends when a re-routed record (on ``topic``, stored at ``store_timestamp``) comes due.

    From ``SCHEDULE_TOPIC_XXXX`` (``ScheduleMessageService.messageTimeUp``) the properties are stored as
    they were: the broker serialises them before it drops ``DELAY`` and the timer ones from its map,
    so ``DELAY``, ``REAL_TOPIC`` and ``REAL_QID`` stay. From the timer topic
    (``TimerMessageStore.convert``) they gain ``TIMER_ENQUEUE_MS`` (the wheel's write time when it
    took the record: its store time floored to the precision) and ``TIMER_DEQUEUE_MS`` (the delivery
    time), and keep ``REAL_TOPIC``/``REAL_QID`` (removed from a copy after serialising). Body, flag,
    sysFlag, born time and hosts and reconsume times are the record's; the caller places it at ``due_ms``.
    """
    pairs = dict(properties)
    real_topic, real_queue = pairs[REAL_TOPIC], java_long(pairs[REAL_QID], bits=32)
    if topic == SCHEDULE_TOPIC:
        stored = list(properties)
    elif topic == TIMER_TOPIC:
        precision = rules.timer_precision_ms
        pairs[TIMER_ENQUEUE_MS] = str(store_timestamp // precision * precision)
        pairs[TIMER_DEQUEUE_MS] = str(due_ms)
        stored = hashmap_order(pairs.items())
    else:
        raise ValueError(f"{topic} holds no scheduled messages")
    return Routed(real_topic, real_queue, stored)


def due_ms(topic: str, properties: Mapping[str, str], store_timestamp: int, rules: ScheduleRules) -> int | None:
    """When the broker delivers a record stored on ``topic``; ``None`` for a record it never delivers.

    A record on ``SCHEDULE_TOPIC_XXXX`` is due at its ConsumeQueue tagsCode (``computeDeliverTimestamp``:
    store time + its level's delay, the level capped at the highest, an unknown level + 1000 ms); one on the
    timer topic when the wheel reads its slot (``TIMER_OUT_MS`` + the precision). Either needs ``REAL_TOPIC``
    and ``REAL_QID`` to be delivered anywhere, and its numbers to parse as the broker parses them.
    """
    if topic not in (SCHEDULE_TOPIC, TIMER_TOPIC) or REAL_TOPIC not in properties or REAL_QID not in properties:
        return None
    try:
        java_long(properties[REAL_QID], bits=32)
        if topic == SCHEDULE_TOPIC:
            level = java_long(properties.get(DELAY, ""), bits=32)
            if level <= 0:
                return None
            level = min(level, rules.max_delay_level)
            return store_timestamp + rules.delay_levels.get(level, 1000)
        return java_long(properties.get(TIMER_OUT_MS, "")) + rules.timer_precision_ms
    except ValueError:
        return None
