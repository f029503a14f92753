"""What a broker stores for a transactional message: the half, the commit re-put, the op records.

Sources: SendMessageProcessor (a send whose ``TRAN_MSG`` is true is a half send),
TransactionalMessageBridge.parseHalfMessageInner (the half record), EndTransactionProcessor
(``checkPrepareMessage``, ``rejectCommitOrRollback``, ``endMessageTransaction`` and what
``processRequest`` sets on the re-put), TransactionalMessageServiceImpl.deletePrepareMessage /
getOpMessage and TransactionalMessageBridge.makeOpMessageInner / writeOp (the op records).

Properties are (name, value) pairs in storage order (the broker's ``HashMap`` iteration order).
A rollback stores nothing but its op record; an open half (no end) stays on the half topic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rmqlake.formats.properties import DELAY, TAGS, UNIQ_KEY, WAIT, hashmap_order
from rmqlake.formats.record import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
HALF_QUEUE_ID = 0
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
TRANSACTION_ID = "__transactionId__"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
REMOVE_TAG = "d"
OFFSET_SEPARATOR = ","
DEFAULT_TRANSACTION_TIMEOUT_MS = 6000  # BrokerConfig.transactionTimeOut
DEFAULT_OP_MAX_SIZE = 4096  # BrokerConfig.transactionOpMsgMaxSize
OP_MAP_INITIAL_CAPACITY = 16  # the op Message's own properties map: a default HashMap

# Integer.parseInt / Long.parseLong: an optional sign and ASCII digits
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")


class EndRefused(ValueError):
    """The broker refuses the end of a transaction (nothing is stored); the message says why."""


@dataclass(frozen=True)
class Stored:
    """A record the broker appends for a transactional message.

    Attributes:
        topic, queue_id: where it is stored.
        properties: its pairs, in storage order.
        sys_flag: its sysFlag (the caller's host bits included).
        prepared_transaction_offset: the field of that name (the half's commitlog offset on a commit).
        body: the body, where the rule decides it (op records); ``None``: the message's own.
    """

    topic: str
    queue_id: int
    properties: list[tuple[str, str]]
    sys_flag: int
    prepared_transaction_offset: int = 0
    body: bytes | None = None


def _reset_transaction(sys_flag: int, kind: int) -> int:
    """``MessageSysFlag.resetTransactionValue``."""
    return (sys_flag & ~TRANSACTION_TYPE_MASK) | kind


def java_int(text: str | None) -> int | None:
    """``Integer.parseInt``, ``None`` where Java throws."""
    if text is None or not _JAVA_INTEGER.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << 31) <= value < (1 << 31) else None


def is_half_send(properties: Iterable[tuple[str, str]], *, reconsume_times: int = 0) -> bool:
    """Whether the broker stores a send as a half message (``SendMessageProcessor``).

    ``TRAN_MSG`` parses as true (``Boolean.parseBoolean``: "true" in any case), except a message
    both reconsumed and delayed (a pre-4.6.1 client's retry of a transactional message), which is
    stored as sent.
    """
    pairs = dict(properties)
    if pairs.get(TRAN_MSG, "").lower() != "true":
        return False
    return not (reconsume_times > 0 and (java_int(pairs.get(DELAY)) or 0) > 0)


def half(topic: str, queue_id: int, properties: Sequence[tuple[str, str]], *, sys_flag: int) -> Stored:
    """``TransactionalMessageBridge.parseHalfMessageInner`` for a half send to ``topic``/``queue_id``.

    ``properties`` are the stored pairs of the send as the broker received it (``CLUSTER`` and the
    broker's ``UNIQ_KEY`` included), in storage order. The broker puts ``__transactionId__`` (the
    ``UNIQ_KEY``, when there is one), ``REAL_TOPIC`` and ``REAL_QID`` into the same map, clears the
    transaction bits of the sysFlag (the producer sends PREPARED: the half is stored as NOT_TYPE, so
    it takes a queue offset and is dispatched) and stores it on queue 0 of the half topic.
    Body, flag, born time and host, reconsume times are the send's.
    """
    pairs = list(properties)
    uniq = dict(pairs).get(UNIQ_KEY)
    if uniq:
        pairs.append((TRANSACTION_ID, uniq))
    pairs += [(REAL_TOPIC, topic), (REAL_QID, str(queue_id))]
    return Stored(HALF_TOPIC, HALF_QUEUE_ID, hashmap_order(pairs), _reset_transaction(sys_flag, TRANSACTION_NOT_TYPE))


def end_refusal(
    half_properties: Sequence[tuple[str, str]],
    *,
    born_timestamp: int,
    now_ms: int,
    producer_group: str | None = None,
    from_transaction_check: bool = False,
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
) -> str | None:
    """Why the broker refuses an end of the half at ``now_ms``, or ``None``.

    ``EndTransactionProcessor``: ``rejectCommitOrRollback`` refuses a producer's end (not one from
    the check-back) of a half carrying ``CHECK_IMMUNITY_TIME_IN_SECONDS`` more than that time (at
    least the transaction timeout; an unparsable value counts as 0) after its born time
    (``ILLEGAL_OPERATION``: only the check-back may end it then). ``checkPrepareMessage`` refuses an
    end whose producer group is not the half's ``PGROUP`` (``producer_group``, when the end names
    one); its other checks (the request's queue and commitlog offsets are the half's) hold for any
    end that names its half. The broker does not look at whether the half was already ended.
    """
    pairs = dict(half_properties)
    if producer_group is not None and pairs.get(PGROUP) != producer_group:
        return f"the producer group {producer_group!r} is not the half's {pairs.get(PGROUP)!r}"
    immunity = pairs.get(CHECK_IMMUNITY_TIME_IN_SECONDS)
    if from_transaction_check or not immunity:
        return None
    seconds = int(immunity) if _JAVA_INTEGER.fullmatch(immunity) and -(1 << 63) <= int(immunity) < (1 << 63) else 0
    window = max(seconds * 1000, transaction_timeout_ms)
    late = now_ms - born_timestamp
    if late > window:
        return f"the end came {late} ms after the born time, over the check immunity time {window} ms"
    return None


def commit(half_properties: Sequence[tuple[str, str]], *, half_sys_flag: int, half_physical_offset: int) -> Stored:
    """The record ``EndTransactionProcessor`` appends when a producer commits the half.

    ``endMessageTransaction`` copies the half into a new message for ``REAL_TOPIC``/``REAL_QID``:
    body, flag, born time and host, store host, reconsume times and sysFlag are the half's, the
    sysFlag's transaction bits become COMMIT and ``preparedTransactionOffset`` is the half's commitlog
    offset. The properties string is serialised from the half's map before the processor removes
    ``REAL_TOPIC``, ``REAL_QID`` and ``TRAN_MSG`` from it, so the stored properties are the half's,
    all of them (``TRAN_MSG``, ``PGROUP``, ``__transactionId__``, ``REAL_TOPIC``, ``REAL_QID``
    included), in the half's order. The store assigns the queue offset on the real queue (a COMMIT
    takes one and is dispatched) and its own clock as the store time (the processor's copy of the
    half's store time is overwritten by the put).

    Raises:
        EndRefused: ``REAL_TOPIC`` missing or ``REAL_QID`` not an integer (the processor fails).
    """
    pairs = dict(half_properties)
    topic, queue_id = pairs.get(REAL_TOPIC), java_int(pairs.get(REAL_QID))
    if not topic or queue_id is None:
        real_qid = pairs.get(REAL_QID)
        raise EndRefused(f"the half names no real topic and queue: REAL_TOPIC={topic!r} REAL_QID={real_qid!r}")
    return Stored(
        topic,
        queue_id,
        list(half_properties),
        _reset_transaction(half_sys_flag, TRANSACTION_COMMIT_TYPE),
        prepared_transaction_offset=half_physical_offset,
    )


def op_properties() -> list[tuple[str, str]]:
    """An op record's stored pairs: ``TAGS`` ``d`` and ``WAIT`` ``true``.

    ``new Message(opTopic, "d", body)``: its own default ``HashMap``; ``makeOpMessageInner`` serialises
    it before it sets ``WAIT`` false and a ``UNIQ_KEY`` on the same map, so neither reaches the record.
    """
    return hashmap_order([(TAGS, REMOVE_TAG), (WAIT, "true")], initial_capacity=OP_MAP_INITIAL_CAPACITY)


def op_records(
    half_queue_offsets: Iterable[int], *, half_queue_id: int = HALF_QUEUE_ID, max_size: int = DEFAULT_OP_MAX_SIZE
) -> list[Stored]:
    """Op records naming ended halves, by their queue offsets on the half topic, in end order.

    ``deletePrepareMessage`` queues ``"<offset>,"`` per ended half (commit or rollback alike); the
    op batcher (``getOpMessage``) concatenates queued entries into one body until it reaches
    ``max_size`` characters. Each record goes to the op topic's queue of the half's queue id, with
    sysFlag 0, flag 0, tags ``d`` and the broker's store host as born and store host; its born time
    is the broker's clock when it writes it.

    How a broker groups entries into records is its timing (an entry waits up to
    ``transactionOpBatchInterval`` for others; a full buffer is written at once): this packs
    greedily, the grouping of entries ended together. Any grouping names the same halves in the
    same order, which is all the broker's check service reads (:func:`op_offsets`).
    """
    records: list[Stored] = []
    body = ""
    for offset in half_queue_offsets:
        body += f"{offset}{OFFSET_SEPARATOR}"
        if len(body) >= max_size:
            records.append(Stored(OP_TOPIC, half_queue_id, op_properties(), 0, body=body.encode()))
            body = ""
    if body:
        records.append(Stored(OP_TOPIC, half_queue_id, op_properties(), 0, body=body.encode()))
    return records


def op_offsets(body: bytes) -> list[int]:
    """The half queue offsets an op record's body names, in order (the check service splits on ``,``)."""
    return [int(part) for part in body.decode("utf-8").split(OFFSET_SEPARATOR) if _JAVA_INTEGER.fullmatch(part)]
