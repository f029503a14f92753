"""A real broker fed delay-level, timer and plain sends (java/ScheduleHarness.java); its store read back.

The sends cover the broker's rules: every configured delay level and one above the highest (the
broker clamps it), a delay level together with timer properties (the level wins, the timer
properties are dropped), timers in their three forms (``TIMER_DELAY_SEC``, ``TIMER_DELAY_MS``,
``TIMER_DELIVER_MS``; one on a whole second, the other branch of the broker's rounding), a timer
whose time has passed (stored on its topic at once), one over ``timerMaxDelaySec`` and one
unparsable (both refused), and plain sends around them. Delays are short (``messageDelayLevel``
``1s 2s 3s``) so that the broker delivers everything within seconds.

The broker's files are read after its clean shutdown: commitlog records with rmqlake's decoder
(proven equal to RocketMQ's MessageDecoder by test_store_from_rocketmq), ConsumeQueue units raw.
:func:`write_producer_log` writes the same sends as a producer log for rmqlake.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from rmqlake.formats.properties import parse_properties
from rmqlake.formats.record import BlankRecord, decode_record
from rmqlake.formats.store import topics_json
from tests.interop import data
from tests.interop.harness import run_java

DELAY_LEVELS = "1s 2s 3s"
TIMER_MAX_DELAY_SEC = 259200  # the broker's default
TIMER_PRECISION_MS = 1000  # the broker's default
DELAYED = "ScheduledOrders"  # delay-level sends
TIMED = "TimedOrders"  # timer sends
QUEUES = 4
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"


def sends() -> list[dict]:
    """The producer's sends, in order (ScheduleHarness spec entries); ``expect`` says what the broker does."""
    return [
        {"topic": DELAYED, "queueId": 0, "body": "plain before", "tags": "TagA", "keys": "plain-1", "expect": "plain"},
        {"topic": DELAYED, "queueId": 1, "body": "level 1", "tags": "TagB", "keys": "delay-1", "delayLevel": 1,
         "expect": "delay"},
        {"topic": DELAYED, "queueId": 2, "body": "level 2 with a user property", "delayLevel": 2,
         "properties": {"color": "red"}, "expect": "delay"},
        {"topic": DELAYED, "queueId": 3, "body": "level 3", "tags": "TagPay", "delayLevel": 3, "expect": "delay"},
        {"topic": DELAYED, "queueId": 0, "body": "level 7, clamped to 3", "keys": "clamped", "delayLevel": 7,
         "expect": "delay"},
        {"topic": DELAYED, "queueId": 1, "body": "level 1 and a timer: the level wins", "delayLevel": 1,
         "properties": {"TIMER_DELAY_SEC": "2"}, "expect": "delay"},
        {"topic": TIMED, "queueId": 0, "body": "timer delay sec", "tags": "TagT", "keys": "timer-sec",
         "properties": {"TIMER_DELAY_SEC": "2"}, "expect": "timer"},
        {"topic": TIMED, "queueId": 1, "body": "timer delay ms", "properties": {"TIMER_DELAY_MS": "2500"},
         "expect": "timer"},
        {"topic": TIMED, "queueId": 2, "body": "timer deliver ms", "deliverInMs": 3000, "expect": "timer"},
        {"topic": TIMED, "queueId": 3, "body": "timer deliver ms on a second", "deliverInMs": 2000,
         "deliverOnSecond": True, "expect": "timer"},
        {"topic": TIMED, "queueId": 0, "body": "timer in the past", "deliverInMs": -5000, "expect": "plain"},
        {"topic": TIMED, "queueId": 1, "body": "timer over the max",
         "properties": {"TIMER_DELAY_SEC": str(TIMER_MAX_DELAY_SEC + 1)}, "expect": "refused"},
        {"topic": TIMED, "queueId": 2, "body": "timer unparsable", "properties": {"TIMER_DELAY_MS": "soon"},
         "expect": "refused"},
        {"topic": TIMED, "queueId": 3, "body": "plain after", "tags": "TagA", "expect": "plain"},
    ]  # fmt: skip


@dataclass(frozen=True)
class BrokerRun:
    """What the broker answered and stored.

    Attributes:
        sends: the spec entries, in send order.
        answer: ScheduleHarness's answer (per send: status, msgId, queueOffset, or the refusal).
        store: the broker's store directory (after a clean shutdown).
        records: every commitlog record in physical order, as dicts (properties parsed).
        units: every ConsumeQueue unit: topic, queue_id, queue_offset, commitlog_offset, size, tags_code.
    """

    sends: list[dict]
    answer: dict
    store: Path
    records: list[dict]
    units: list[dict]


def run_broker(root: Path) -> BrokerRun:
    """Send :func:`sends` to a real broker in ``root`` and read its store once everything due is delivered."""
    store = root / "broker"
    (store / "config").mkdir(parents=True)
    topics = {DELAYED: (QUEUES, "DELETE"), TIMED: (QUEUES, "DELETE")}
    (store / "config" / "topics.json").write_text(topics_json(topics, data_version=1, timestamp=0))
    entries = sends()
    expected = {topic: sum(1 for s in entries if s["topic"] == topic and s["expect"] != "refused") for topic in topics}
    spec = {
        "store": str(store),
        "work": str(root / "work"),
        "cluster": data.CLUSTER,
        "timeoutSeconds": 150,
        "commitlogSegmentSize": data.SEGMENT,
        "cqUnitsPerFile": data.UNITS,
        "indexSlots": data.SLOTS,
        "indexMaxEntries": data.ENTRIES,
        "messageDelayLevel": DELAY_LEVELS,
        "timerMaxDelaySec": TIMER_MAX_DELAY_SEC,
        "timerLogFileSize": 1 << 20,
        "sends": [{k: v for k, v in s.items() if k != "expect"} for s in entries],
        "expectMessages": expected,
        "settleMillis": 1500,
    }
    (root / "schedule.json").write_text(json.dumps(spec))
    answer = run_java("ScheduleHarness", str(root / "schedule.json"), timeout=180)
    return BrokerRun(entries, answer, store, commitlog_records(store), consume_queue_units(store))


# what the producer adds to every send besides the spec's properties: WAIT (waitStoreMsgOK), and the
# 5.x client's MSG_REGION and TRACE_ON
CLIENT_PROPERTIES = {"WAIT": "true", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


def producer_line(send: dict, result: dict, stored: dict | None, *, producer: dict) -> dict:
    """A send as a producer log line: what the client sent, with the broker's store time and hosts.

    ``stored`` is the record the broker stored for the send (its first one, before any delivery),
    ``None`` for a refused send: that line gets the send's time as born and store time and the
    ``producer``'s (another record's) born and store hosts. A delay level is the line's
    ``delayLevel``, an absolute timer its ``deliverTimeMs``; relative timers stay properties.
    """
    record = stored or {"born_timestamp": result["sentAt"], "store_timestamp": result["sentAt"], "flag": 0,
                        "reconsume_times": 0, "born_host": producer["born_host"],
                        "store_host": producer["store_host"]}  # fmt: skip
    line = {
        "topic": send["topic"],
        "queueId": send["queueId"],
        "body": send["body"],
        "flag": record["flag"],
        "bornTimestamp": record["born_timestamp"],
        "storeTimestamp": record["store_timestamp"],
        "bornHost": record["born_host"],
        "storeHost": record["store_host"],
        "reconsumeTimes": record["reconsume_times"],
        "properties": {**send.get("properties", {}), **CLIENT_PROPERTIES},
    }
    for field, name in (("keys", "keys"), ("tags", "tags"), ("delayLevel", "delayLevel"), ("msgId", "uniqKey")):
        value = send.get(field, result.get(field))
        if value is not None:
            line[name] = value
    if "deliverMs" in result:
        line["deliverTimeMs"] = int(result["deliverMs"])
    return line


def write_producer_log(run: BrokerRun, path: Path) -> Path:
    """Every send of ``run`` (refused ones included), in send order, as one JSON Lines producer log."""
    producer = run.records[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for send, result in zip(run.sends, run.answer["sends"], strict=True):
            stored = next((r for r in run.records if r["properties"].get("UNIQ_KEY") == result.get("msgId")), None)
            handle.write(json.dumps(producer_line(send, result, stored, producer=producer)) + "\n")
    return path


def commitlog_records(store: Path) -> list[dict]:
    """Every record of the broker's commitlog segments, in physical order (blank records left out)."""
    records = []
    for name in sorted(os.listdir(store / "commitlog")):
        raw = (store / "commitlog" / name).read_bytes()
        position = 0
        while position + 4 <= len(raw) and struct.unpack_from(">i", raw, position)[0] > 0:
            record = decode_record(raw, position, check_crc=True)
            if isinstance(record, BlankRecord):
                break
            records.append(
                {
                    "topic": record.topic,
                    "queue_id": record.queue_id,
                    "flag": record.flag,
                    "queue_offset": record.queue_offset,
                    "physical_offset": record.physical_offset,
                    "sys_flag": record.sys_flag,
                    "born_timestamp": record.born_timestamp,
                    "born_host": str(record.born_host),
                    "store_timestamp": record.store_timestamp,
                    "store_host": str(record.store_host),
                    "reconsume_times": record.reconsume_times,
                    "prepared_transaction_offset": record.prepared_transaction_offset,
                    "body": record.body,
                    "properties": parse_properties(record.properties),
                    "raw_properties": record.properties,
                    "total_size": record.total_size,
                }
            )
            position += record.total_size
    return records


def consume_queue_units(store: Path) -> list[dict]:
    """Every unit of the broker's ConsumeQueue files (files are preallocated: a zero size ends a file)."""
    units = []
    for topic in sorted(os.listdir(store / "consumequeue")):
        for queue in sorted(os.listdir(store / "consumequeue" / topic), key=int):
            for name in sorted(os.listdir(store / "consumequeue" / topic / queue)):
                raw = (store / "consumequeue" / topic / queue / name).read_bytes()
                for position in range(0, len(raw), 20):
                    offset, size, tags = struct.unpack_from(">qiq", raw, position)
                    if size == 0:
                        break
                    units.append(
                        {
                            "topic": topic,
                            "queue_id": int(queue),
                            "queue_offset": (int(name) + position) // 20,
                            "commitlog_offset": offset,
                            "size": size,
                            "tags_code": tags,
                        }
                    )
    return units
