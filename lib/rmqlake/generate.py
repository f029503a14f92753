"""Realistic, deterministic producer logs for demos, tests and benchmarks (``rmqlake generate``).

Same seed, same files, byte for byte (gzip members carry no timestamp).
Shape: bursty traffic over several hours from several producer hosts (one
IPv6), Zipf-like keys with repeated updates, skewed tags, bodies from empty
to tens of KiB (text, unicode and binary), user properties, transactions
(store-level PREPARED then COMMIT or ROLLBACK), a long ``%RETRY%`` topic, a share of scheduled
messages (delay levels, and timers as ``deliverTimeMs`` or a ``TIMER_DELAY_SEC`` property), a
share of a transactional producer's half sends with their end lines (committed, rolled back or
left open), and optional bad lines of every kind the input format refuses.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import random
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rmqlake.formats.consumequeue import DEFAULT_DELAY_LEVELS, parse_delay_levels
from rmqlake.formats.javahash import select_queue_by_hash
from rmqlake.formats.properties import KEY_SEPARATOR
from rmqlake.formats.schedule import DEFAULT_TIMER_MAX_DELAY_SEC, TIMER_DELAY_SEC
from rmqlake.formats.transaction import HALF_QUEUE_ID, HALF_TOPIC, OP_TOPIC, PGROUP, TRAN_MSG

PRODUCERS = ("10.1.0.11:50001", "10.1.0.12:50002", "10.1.0.13:50003", "[2001:db8::21]:50100")
TAGS = (("TagA", 40), ("TagB", 25), ("TagPay", 15), ("TagRefund", 5), ("TagShip", 10), (None, 5))
RETRY_GROUP = "cg_" + "settlement_reconciliation_worker_" * 4
BAD_KINDS = (
    "malformed_json",
    "not_an_object",
    "missing_topic",
    "missing_body",
    "missing_born_timestamp",
    "mistyped_field",
    "bad_topic_characters",
    "topic_too_long",
    "body_too_large",
    "properties_too_long",
    "queue_id_out_of_range",
    "compaction_without_keys",
    "bad_base64",
    "bad_host",
    "bad_transaction",
    "empty_line",
    "invalid_utf8",
)
# a timer's delay is at most this fraction of the max delay (the default 3 days: 43 minutes), so that
# the hours of traffic generated see most timers delivered
TIMER_DELAY_FRACTION = 0.01
SCHEDULE_KINDS = (("delay", 2), ("deliver_time", 2), ("delay_sec", 1))
HOUR_MS = 3_600_000
# how a transactional producer's local transaction ends: (end, weight); None leaves the half open
TRANSACTION_ENDS = (("COMMIT", 80), ("ROLLBACK", 12), (None, 8))
TRANSACTION_COUNTS = ("sent", "committed", "rolled_back", "open", "ends_in_a_later_hour", "from_transaction_check")
# the share of ends the producer gives only when the broker checks the half back
CHECK_BACK_SHARE = 0.15
# the broker checks halves older than transactionTimeOut every transactionCheckInterval, a half at most
# transactionCheckMax times (a producer may answer UNKNOWN to the first checks)
TRANSACTION_TIMEOUT_MS = 6_000
TRANSACTION_CHECK_INTERVAL_MS = 30_000
TRANSACTION_CHECK_MAX = 15
# one TransactionMQProducer group per application; each producer host runs one of them
PRODUCER_GROUPS = ("pg_order_tx", "pg_payment_tx")
# end lines ingest refuses: one naming no half, one repeating an end
BAD_END_KINDS = ("end_without_half", "end_twice")


@dataclass(frozen=True)
class TopicPlan:
    name: str
    queues: int
    compaction: bool


def _zipf_index(rng: random.Random, size: int, skew: float = 1.2) -> int:
    return min(int(rng.paretovariate(skew)) - 1, size - 1)


def _body_size(rng: random.Random, fixed: int | None = None) -> int:
    if fixed is not None:
        return int(fixed * rng.uniform(0.9, 1.1))
    if rng.random() < 0.01:
        return 0
    return min(int(rng.lognormvariate(math.log(300), 1.3)), 48 * 1024)


_WORDS = ("order", "amount", "status", "paid", "user", "region", "sku", "qty", "订单", "Ünïcödé", "😀")


def _body(rng: random.Random, size: int) -> tuple[str, str | None]:
    if size == 0:
        return "", None
    if rng.random() < 0.05:
        return base64.b64encode(rng.randbytes(size)).decode("ascii"), "base64"
    words = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word.encode("utf-8")) + 1
    return " ".join(words), None


def _timestamps(rng: random.Random, count: int, *, start_ms: int, hours: int) -> list[int]:
    """Bursty arrival times: hourly weights plus a few short bursts per hour."""
    hour_ms = 3_600_000
    weights = [rng.uniform(0.5, 1.5) for _ in range(hours)]
    bursts = [
        (h, rng.uniform(0, hour_ms - 300_000), rng.uniform(60_000, 300_000)) for h in range(hours) for _ in range(2)
    ]
    times = []
    for _ in range(count):
        if rng.random() < 0.3:
            hour, begin, length = rng.choice(bursts)
            offset = hour * hour_ms + begin + rng.uniform(0, length)
        else:
            hour = rng.choices(range(hours), weights)[0]
            offset = hour * hour_ms + rng.uniform(0, hour_ms)
        times.append(start_ms + int(offset))
    return sorted(times)


def _message(rng: random.Random, topic: TopicPlan, born: int, producer: str, body_size: int | None = None) -> dict:
    line: dict = {"topic": topic.name, "bornTimestamp": born, "bornHost": producer}
    delay = rng.randint(0, 40)
    if delay:
        line["storeTimestamp"] = born + delay
    if topic.compaction:
        line["keys"] = f"user-{_zipf_index(rng, 2000):05d}"
    elif topic.name.startswith("Order"):
        key = f"order-{_zipf_index(rng, 50_000):06d}"
        line["keys"] = [key, f"user-{_zipf_index(rng, 5000):05d}"] if rng.random() < 0.3 else key
    tag = rng.choices([t for t, _ in TAGS], [w for _, w in TAGS])[0]
    if tag:
        line["tags"] = tag
    body, encoding = _body(rng, _body_size(rng, body_size))
    if topic.compaction and rng.random() < 0.05:
        body, encoding = "", None  # tombstone
    line["body"] = body
    if encoding:
        line["bodyEncoding"] = encoding
    if rng.random() < 0.3:
        line["properties"] = {"traceId": f"{rng.getrandbits(64):016x}", "region": rng.choice(["eu-1", "us-2", "ap-3"])}
    if rng.random() < 0.02:
        line["queueId"] = rng.randrange(topic.queues)
    if rng.random() < 0.01:
        line["flag"] = rng.randint(1, 7)
    return line


def _bad_line(rng: random.Random, kind: str, *, born: int, topics: list[TopicPlan], max_message_size: int) -> bytes:
    plain = next((t for t in topics if not t.compaction), topics[0])
    good = {"topic": plain.name, "body": "x", "bornTimestamp": born}
    if kind == "malformed_json":
        return b'{"topic": "' + plain.name.encode() + b'", "body": "unterminated'
    if kind == "not_an_object":
        return json.dumps([good]).encode()
    if kind == "missing_topic":
        return json.dumps({k: v for k, v in good.items() if k != "topic"}).encode()
    if kind == "missing_body":
        return json.dumps({k: v for k, v in good.items() if k != "body"}).encode()
    if kind == "missing_born_timestamp":
        return json.dumps({k: v for k, v in good.items() if k != "bornTimestamp"}).encode()
    if kind == "mistyped_field":
        return json.dumps({**good, "bornTimestamp": str(born)}).encode()
    if kind == "bad_topic_characters":
        return json.dumps({**good, "topic": "Orders/EU"}).encode()
    if kind == "topic_too_long":
        return json.dumps({**good, "topic": "T" * 128}).encode()
    if kind == "body_too_large":
        return json.dumps({**good, "body": "x" * (max_message_size + 1)}).encode()
    if kind == "properties_too_long":
        return json.dumps({**good, "properties": {"blob": "p" * 32768}}).encode()
    if kind == "queue_id_out_of_range":
        return json.dumps({**good, "queueId": plain.queues + 7}).encode()
    if kind == "compaction_without_keys":
        compacted = next((t for t in topics if t.compaction), None)
        return json.dumps({**good, "topic": compacted.name if compacted else plain.name}).encode()
    if kind == "bad_base64":
        return json.dumps({**good, "body": "not base64!", "bodyEncoding": "base64"}).encode()
    if kind == "bad_host":
        return json.dumps({**good, "bornHost": "10.1.0.999:5"}).encode()
    if kind == "bad_transaction":
        return json.dumps({**good, "transaction": "HALF"}).encode()
    if kind == "empty_line":
        return b""
    if kind == "invalid_utf8":
        return (
            b'{"topic": "'
            + plain.name.encode()
            + b'", "body": "\xff\xfe", "bornTimestamp": '
            + str(born).encode()
            + b"}"
        )
    raise ValueError(f"unknown bad line kind {kind!r}")


def _schedule(rng: random.Random, line: dict, *, delay_levels: int, timer_max_delay_sec: int) -> str:
    """Make ``line`` a delay-level or timer message; returns its kind (``"delay"`` or ``"timer"``).

    Timers are due between 1 s and :data:`TIMER_DELAY_FRACTION` of the max delay after the born
    time, so always after the store time (at most 40 ms later) and never over the max.
    """
    kind = rng.choices([k for k, _ in SCHEDULE_KINDS], [w for _, w in SCHEDULE_KINDS])[0]
    if kind == "delay":
        line["delayLevel"] = rng.randint(1, delay_levels)
        return "delay"
    seconds = rng.randint(1, max(1, int(timer_max_delay_sec * TIMER_DELAY_FRACTION)))
    if kind == "deliver_time":
        line["deliverTimeMs"] = line["bornTimestamp"] + seconds * 1000 + rng.randrange(1000)
    else:
        line["properties"] = {**line.get("properties", {}), TIMER_DELAY_SEC: str(seconds)}
    return "timer"


def _encode(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _producer_group(producer: str) -> str:
    return PRODUCER_GROUPS[PRODUCERS.index(producer) % len(PRODUCER_GROUPS)]


def _half_send(rng: random.Random, line: dict, *, producer: str) -> dict | None:
    """Make ``line`` a transactional producer's half send; returns its end line, ``None`` for one left open.

    The half carries ``TRAN_MSG`` and ``PGROUP`` (the producer host's group) and a ``uniqKey`` (the
    end names the half by it). The producer ends most transactions 100 ms to 3 s after the store
    time; :data:`CHECK_BACK_SHARE` of them only when the broker checks the half back, after the
    transaction timeout and one to :data:`TRANSACTION_CHECK_MAX` check intervals (so some ends
    fall into the next hour's file). The end line's ``storeTimestamp`` is when
    the broker stored the end; it names the topic and producer group, as a client's request does.
    """
    group = _producer_group(producer)
    line["transaction"] = "PREPARED"
    line["uniqKey"] = f"{rng.getrandbits(128):032X}"
    line["properties"] = {**line.get("properties", {}), TRAN_MSG: "true", PGROUP: group}
    end = rng.choices([e for e, _ in TRANSACTION_ENDS], [w for _, w in TRANSACTION_ENDS])[0]
    if end is None:
        return None
    stored = line.get("storeTimestamp", line["bornTimestamp"])
    record = {"endTransaction": end, "uniqKey": line["uniqKey"], "topic": line["topic"], "producerGroup": group}
    if rng.random() < CHECK_BACK_SHARE:
        checks = rng.randint(1, TRANSACTION_CHECK_MAX)
        record["storeTimestamp"] = (
            stored + TRANSACTION_TIMEOUT_MS + checks * TRANSACTION_CHECK_INTERVAL_MS + rng.randrange(1000)
        )
        record["fromTransactionCheck"] = True
    else:
        record["storeTimestamp"] = stored + rng.randint(100, 3000)
    return record


def _bad_end(
    rng: random.Random, kind: str, ends: list[tuple[str, dict]], *, start_ms: int, hours: int
) -> tuple[str, dict]:
    """An end line ingest refuses, with its producer: one naming no half sent, or a repeat of an end in ``ends``.

    A repeat comes up to 5 s after the end it repeats (within the last hour: at the same time, after it
    in the file).
    """
    if kind == "end_without_half":
        producer = rng.choice(PRODUCERS)
        end = {
            "endTransaction": rng.choice(["COMMIT", "ROLLBACK"]),
            "uniqKey": f"{rng.getrandbits(128):032X}",
            "producerGroup": _producer_group(producer),
            "storeTimestamp": start_ms + rng.randrange(hours * HOUR_MS),
        }
        return producer, end
    if kind == "end_twice":
        producer, first = rng.choice(ends)
        at = min(first["storeTimestamp"] + rng.randint(1, 5000), start_ms + hours * HOUR_MS - 1)
        return producer, {**first, "storeTimestamp": at}
    raise ValueError(f"unknown bad end kind {kind!r}")


def generate(
    out: str | Path,
    *,
    messages: int,
    topics: list[TopicPlan],
    hours: int = 3,
    bad_rate: float = 0.0,
    seed: int = 42,
    start_ms: int = 1795219200000,  # 2026-11-21T00:00:00Z
    gzip_files: bool = False,
    max_message_size: int = 4194304,
    transactions: bool = True,
    retry_topic: bool = True,
    body_size: int | None = None,
    schedule_share: float = 0.0,
    delay_levels: int = len(parse_delay_levels(DEFAULT_DELAY_LEVELS)),
    timer_max_delay_sec: int = DEFAULT_TIMER_MAX_DELAY_SEC,
    transaction_share: float = 0.0,
) -> dict:
    """Write producer logs under ``out/landing/dt=YYYY-MM-DD/hour=HH/``, one file per producer and hour.

    Args:
        messages: valid messages to write (store-level transactions count each record; the end
            lines of half sends come on top).
        topics: topics to write to; COMPACTION topics always get keys.
        bad_rate: extra bad lines as a fraction of ``messages``, cycling
            through every kind in ``BAD_KINDS``; with transactions, on top,
            the same fraction of the end lines (at least two) as end lines
            ingest refuses, alternating the kinds in ``BAD_END_KINDS``.
        body_size: bodies of about this many bytes (±10 %) instead of the
            default spread from empty to tens of KiB.
        schedule_share: the fraction of plain messages (neither transactional nor
            on a COMPACTION or retry topic) sent as scheduled ones: 2/5 with a
            ``delayLevel`` from 1 to ``delay_levels``, 2/5 with a ``deliverTimeMs``,
            1/5 with a ``TIMER_DELAY_SEC`` property (timers due in at most
            :data:`TIMER_DELAY_FRACTION` of ``timer_max_delay_sec``). The choice
            draws from its own random stream: the other messages, and every
            message with a share of 0, are the same as without it.
        delay_levels, timer_max_delay_sec: the broker's ``messageDelayLevel``
            count and ``timerMaxDelaySec`` the scheduled messages stay within.
        transaction_share: the fraction of the plain messages not scheduled
            sent as a transactional producer's half sends (``transaction``
            PREPARED with ``TRAN_MSG`` and ``PGROUP``), each followed by its end
            line (``endTransaction``) in the producer's file of the hour the end
            is stored in: most COMMIT, some ROLLBACK, some never (left open, as
            is a half whose end would come after the last hour). End lines are
            extra lines, not messages. The choice draws from its own random
            stream: the messages are the same as without it.

    Returns:
        A summary also written to ``out/MANIFEST.json``: lines, messages,
        bad lines per kind, scheduled messages per kind, transactions
        (``sent``, ``committed``, ``rolled_back``, ``open``, the ends stored in
        a later hour than their half and those ``from_transaction_check``),
        ``records`` (what ingest appends to the commitlog for the lines: a
        message or half one record, a commit two, the message again on its
        topic and queue and an op record, a rollback one op record; deliveries
        of scheduled messages not counted), files, and the time range.
    """
    rng = random.Random(seed)
    schedule_rng = random.Random(f"schedule-{seed}")
    transaction_rng = random.Random(f"transaction-{seed}")
    out = Path(out)
    if messages < 0 or hours < 1 or not 0 <= bad_rate <= 1 or not topics:
        raise ValueError("messages must be >= 0, hours >= 1, bad_rate in [0, 1] and topics non-empty")
    if not 0 <= schedule_share <= 1 or delay_levels < 1 or timer_max_delay_sec < 1:
        raise ValueError("schedule_share must be in [0, 1], delay_levels and timer_max_delay_sec >= 1")
    if not 0 <= transaction_share <= 1:
        raise ValueError("transaction_share must be in [0, 1]")
    scheduled: Counter = Counter({"delay": 0, "timer": 0})
    transactional: Counter = Counter(dict.fromkeys(TRANSACTION_COUNTS, 0))
    queues = {t.name: t.queues for t in topics}
    ends_written: list[tuple[str, dict]] = []  # (producer, end line)
    times = _timestamps(rng, messages, start_ms=start_ms, hours=hours)
    weights = [3 if not t.compaction else 2 for t in topics]
    retry = TopicPlan("%RETRY%" + RETRY_GROUP, 1, False)
    per_file: dict[tuple[int, str], list[tuple[int, int, bytes]]] = {}
    per_queue_hour: Counter = Counter()
    order = 0
    written = 0
    index = 0
    while written < messages:
        born = times[index]
        index += 1
        producer = rng.choice(PRODUCERS)
        half_sent, end = False, None
        if retry_topic and rng.random() < 0.002:
            line = _message(rng, retry, born, producer, body_size)
            line["reconsumeTimes"] = rng.randint(1, 3)
            records = [line]
        else:
            topic = rng.choices(topics, weights)[0]
            line = _message(rng, topic, born, producer, body_size)
            records = [line]
            if transactions and not topic.compaction and rng.random() < 0.02 and written + 2 <= messages:
                line["transaction"] = "PREPARED"
                line["uniqKey"] = f"{rng.getrandbits(128):032X}"
                end = {**line, "transaction": "COMMIT" if rng.random() < 0.85 else "ROLLBACK"}
                end["bornTimestamp"] = born + rng.randint(100, 3000)
                end.pop("storeTimestamp", None)
                records.append(end)
            elif not topic.compaction and schedule_share and schedule_rng.random() < schedule_share:
                kind = _schedule(schedule_rng, line, delay_levels=delay_levels, timer_max_delay_sec=timer_max_delay_sec)
                scheduled[kind] += 1
            elif not topic.compaction and transaction_share and transaction_rng.random() < transaction_share:
                half_sent, end = True, _half_send(transaction_rng, line, producer=producer)
        for record in records:
            hour = (record["bornTimestamp"] - start_ms) // HOUR_MS
            per_file.setdefault((hour, producer), []).append((record["bornTimestamp"], order, _encode(record)))
            if record["topic"] != retry.name:
                _count_queue(per_queue_hour, record, hour, queues=queues)
            order += 1
            written += 1
        if half_sent:
            transactional["sent"] += 1
            end_hour = hours if end is None else (end["storeTimestamp"] - start_ms) // HOUR_MS
            if end_hour >= hours:  # no end, or none before the traffic stops: left open
                transactional["open"] += 1
            else:
                committed = end["endTransaction"] == "COMMIT"
                per_file.setdefault((end_hour, producer), []).append((end["storeTimestamp"], order, _encode(end)))
                ends_written.append((producer, end))
                _count_end(per_queue_hour, line, end_hour, committed=committed, queues=queues)
                order += 1
                transactional["committed" if committed else "rolled_back"] += 1
                transactional["ends_in_a_later_hour"] += end_hour > (line["bornTimestamp"] - start_ms) // HOUR_MS
                transactional["from_transaction_check"] += end.get("fromTransactionCheck", False)
    bad_total = round(messages * bad_rate)
    bad_kinds: Counter = Counter()
    oversize_written = False
    for number in range(bad_total):
        kind = BAD_KINDS[number % len(BAD_KINDS)]
        if kind == "body_too_large" and oversize_written:
            kind = "malformed_json"
        oversize_written |= kind == "body_too_large"
        born = start_ms + rng.randrange(hours * HOUR_MS)
        producer = rng.choice(PRODUCERS)
        raw = _bad_line(rng, kind, born=born, topics=topics, max_message_size=max_message_size)
        per_file.setdefault(((born - start_ms) // HOUR_MS, producer), []).append((born, order, raw))
        order += 1
        bad_kinds[kind] += 1
    # bad end lines come on top of the other bad lines, from the transactions' own random stream
    bad_ends = max(2, round(len(ends_written) * bad_rate)) if ends_written and bad_rate else 0
    for number in range(bad_ends):
        kind = BAD_END_KINDS[number % len(BAD_END_KINDS)]
        producer, end = _bad_end(transaction_rng, kind, ends_written, start_ms=start_ms, hours=hours)
        hour = (end["storeTimestamp"] - start_ms) // HOUR_MS
        per_file.setdefault((hour, producer), []).append((end["storeTimestamp"], order, _encode(end)))
        order += 1
        bad_kinds[kind] += 1
    files = []
    for (hour, producer), lines in sorted(per_file.items()):
        moment = datetime.fromtimestamp((start_ms + hour * HOUR_MS) / 1000, UTC)
        folder = out / "landing" / f"dt={moment:%Y-%m-%d}" / f"hour={moment:%H}"
        folder.mkdir(parents=True, exist_ok=True)
        host = producer.replace("[", "").replace("]", "").replace(":", "_")
        path = folder / f"producer-{host}.jsonl{'.gz' if gzip_files else ''}"
        data = b"\n".join(raw for _, _, raw in sorted(lines)) + b"\n"
        if gzip_files:
            data = gzip.compress(data, mtime=0)
        path.write_bytes(data)
        files.append(str(path.relative_to(out)))
    ends = transactional["committed"] + transactional["rolled_back"]
    summary = {
        "seed": seed,
        "messages": written,
        "bad_lines": bad_total + bad_ends,
        "bad_kinds": dict(sorted(bad_kinds.items())),
        "scheduled": dict(scheduled),
        "transactions": dict(transactional),
        "lines": written + ends + bad_total + bad_ends,
        "records": written + 2 * transactional["committed"] + transactional["rolled_back"],
        "files": files,
        "hours": hours,
        "start_ms": start_ms,
        "end_ms": start_ms + hours * HOUR_MS,
        "topics": [t.name for t in topics]
        + ([retry.name] if retry_topic else [])
        + ([HALF_TOPIC] if transactional["sent"] else [])
        + ([OP_TOPIC] if ends else []),
    }
    out.mkdir(parents=True, exist_ok=True)
    summary["offset_snapshots"] = _offset_snapshots(out, per_queue_hour, topics=topics, start_ms=start_ms, hours=hours)
    (out / "MANIFEST.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


# consumer groups of the snapshots: (group, share of a topic's messages consumed at each snapshot)
CONSUMER_GROUPS = (("cg_billing", 0.9), ("cg_audit", 0.5))


ROUND_ROBIN = -1  # the queue of messages without queueId or keys: chosen at append time


def _queue_of(record: dict, *, queues: dict[str, int]) -> int:
    """The queue of ``record``: its ``queueId``, else the key hash (as ingest selects), else :data:`ROUND_ROBIN`."""
    queue = record.get("queueId")
    keys = record.get("keys")
    if queue is None and keys:
        queue = select_queue_by_hash(
            KEY_SEPARATOR.join(keys) if isinstance(keys, list) else keys, queues[record["topic"]]
        )
    return ROUND_ROBIN if queue is None else queue


def _count_queue(counts: Counter, record: dict, hour: int, *, queues: dict[str, int]) -> None:
    """Count ``record`` towards its queue: by ``queueId``, else the key hash (as ingest selects), else round robin.

    ``counts`` keys: (topic, queue, hour, takes_offset); a PREPARED or
    ROLLBACK message takes no queue offset but may take a round-robin turn, and
    so does a scheduled one (counted as taking none: a lower bound). A half
    send takes its topic's turn the same way (the turn is its ``REAL_QID``) and
    an offset on queue 0 of the half topic.
    """
    # a scheduled message takes its queue offset only when delivered, maybe after the snapshot
    scheduled = "delayLevel" in record or "deliverTimeMs" in record or TIMER_DELAY_SEC in record.get("properties", {})
    takes_offset = record.get("transaction") not in ("PREPARED", "ROLLBACK") and not scheduled
    counts[(record["topic"], _queue_of(record, queues=queues), hour, takes_offset)] += 1
    if record.get("transaction") == "PREPARED" and TRAN_MSG in record.get("properties", {}):
        counts[(HALF_TOPIC, HALF_QUEUE_ID, hour, True)] += 1


def _count_end(counts: Counter, half: dict, hour: int, *, committed: bool, queues: dict[str, int]) -> None:
    """Count the end of ``half`` stored in ``hour``: its op record, and a commit's message on the half's queue.

    A commit of a half sent round robin takes its offset on the queue of the
    half's turn: that turn, counted as taking none, takes one from this hour on.
    """
    counts[(OP_TOPIC, HALF_QUEUE_ID, hour, True)] += 1
    if not committed:
        return
    queue = _queue_of(half, queues=queues)
    if queue == ROUND_ROBIN:
        counts[(half["topic"], ROUND_ROBIN, hour, False)] -= 1
    counts[(half["topic"], queue, hour, True)] += 1


def _offset_snapshots(
    out: Path, per_queue_hour: Counter, *, topics: list[TopicPlan], start_ms: int, hours: int
) -> list[str]:
    """One ``offsets/consumerOffset-<time>.json`` per hour end, as a broker's ConsumerOffsetManager persists it.

    Each group's offset is a share of what a queue surely holds by then:
    the messages whose queue is known (``queueId`` or key hash) plus a lower
    bound of its round-robin turns (turns are spread evenly, less those taken
    by messages that take no offset). So a committed offset never passes the
    queue's max offset, as on a broker. Queue ids are unquoted, as the
    broker's fastjson writes them.
    """
    folder = out / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    so_far: Counter = Counter()
    paths = []
    for hour in range(hours):
        for (topic, queue, at, takes_offset), count in per_queue_hour.items():
            if at == hour:
                so_far[(topic, queue, takes_offset)] += count
        table = []
        for group, share in CONSUMER_GROUPS:
            for topic in topics:
                turns = so_far[(topic.name, ROUND_ROBIN, True)] + so_far[(topic.name, ROUND_ROBIN, False)]
                surely = max(0, turns // topic.queues - 1 - so_far[(topic.name, ROUND_ROBIN, False)])
                queues = ",".join(
                    f"{q}:{int((so_far[(topic.name, q, True)] + surely) * share)}" for q in range(topic.queues)
                )
                table.append(f'"{topic.name}@{group}":{{{queues}}}')
        moment = datetime.fromtimestamp((start_ms + (hour + 1) * 3_600_000) / 1000, UTC)
        path = folder / f"consumerOffset-{moment:%Y%m%dT%H%M%S}Z.json"
        version = '"dataVersion":{"counter":' + str(hour + 1) + "}"
        path.write_text('{"offsetTable":{' + ",".join(table) + "}," + version + "}\n")
        paths.append(str(path.relative_to(out)))
    return paths
