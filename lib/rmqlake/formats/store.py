"""A broker's store directory: file paths, the checkpoint file and the config JSON it reads (spec layout, 4.4).

Sources: StorePathConfigHelper.java, StoreCheckpoint.java,
TopicConfigSerializeWrapper / TopicConfig.java, ConsumerOffsetManager.java,
SubscriptionGroupManager / SubscriptionGroupConfig.java, ScheduleMessageService /
DelayOffsetSerializeWrapper.java (written by fastjson 1), TimerCheckpoint.java.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# the Apache RocketMQ release whose own classes judge the store in tests/interop (its pom pins the same)
ROCKETMQ_VERIFIED_VERSION = "5.3.3"
CHECKPOINT_FILE_SIZE = 4096  # one OS page, memory-mapped; only the first 40 bytes are used
_CHECKPOINT = struct.Struct(">qqqqq")
PERM_READ_WRITE = 6  # PermName.PERM_READ | PermName.PERM_WRITE
CLEANUP_POLICY_ATTRIBUTE = "cleanup.policy"


def commitlog_file(name: str) -> str:
    return f"commitlog/{name}"


def consumequeue_file(topic: str, queue_id: int, name: str) -> str:
    return f"consumequeue/{topic}/{queue_id}/{name}"


def index_file(name: str) -> str:
    return f"index/{name}"


@dataclass(frozen=True)
class Checkpoint:
    """``StoreCheckpoint``: store times of the last flushed message, dispatched CQ unit and full index file."""

    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    def encode(self) -> bytes:
        head = _CHECKPOINT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )
        return head + bytes(CHECKPOINT_FILE_SIZE - len(head))

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        return cls(*_CHECKPOINT.unpack_from(data, 0))


def topics_json(topics: Mapping[str, tuple[int, str]], *, data_version: int, timestamp: int) -> str:
    """``config/topics.json`` (TopicConfigSerializeWrapper) for ``{topic: (queues, cleanup_policy)}``.

    Read and write queue counts are the topic's queue count, permission
    read-write, and a COMPACTION topic carries the ``cleanup.policy``
    attribute (RocketMQ 5 topic attributes).
    """
    table = {}
    for name, (queues, policy) in sorted(topics.items()):
        table[name] = {
            "attributes": {CLEANUP_POLICY_ATTRIBUTE: policy} if policy != "DELETE" else {},
            "order": False,
            "perm": PERM_READ_WRITE,
            "readQueueNums": queues,
            "topicFilterType": "SINGLE_TAG",
            "topicName": name,
            "topicSysFlag": 0,
            "writeQueueNums": queues,
        }
    return _pretty({"dataVersion": _data_version(data_version, timestamp), "topicConfigTable": table})


def consumer_offsets_json(
    offsets: Mapping[tuple[str, str], Mapping[int, int]], *, data_version: int, timestamp: int
) -> str:
    """``config/consumerOffset.json``: ``{"offsetTable": {"topic@group": {queueId: offset}}}``.

    Queue ids are written as JSON strings (fastjson, which the broker reads
    it with, also accepts them; the broker itself writes them bare).
    """
    table = {
        f"{topic}@{group}": {str(queue): offset for queue, offset in sorted(queues.items())}
        for (topic, group), queues in sorted(offsets.items())
    }
    return _pretty({"dataVersion": _data_version(data_version, timestamp), "offsetTable": table})


def subscription_groups_json(groups: Iterable[str], *, data_version: int, timestamp: int) -> str:
    """``config/subscriptionGroup.json`` (SubscriptionGroupWrapper): each group with the broker's defaults.

    The defaults are those of a ``SubscriptionGroupConfig`` the broker
    auto-creates: consuming enabled, one retry queue, 16 retries.
    """
    table = {
        group: {
            "attributes": {},
            "brokerId": 0,
            "consumeBroadcastEnable": True,
            "consumeEnable": True,
            "consumeFromMinEnable": True,
            "consumeMessageOrderly": False,
            "consumeTimeoutMinute": 15,
            "groupName": group,
            "groupSysFlag": 0,
            "notifyConsumerIdsChangedEnable": True,
            "retryMaxTimes": 16,
            "retryQueueNums": 1,
            "whichBrokerWhenConsumeSlowly": 1,
        }
        for group in sorted(groups)
    }
    return _pretty(
        {"dataVersion": _data_version(data_version, timestamp), "forbiddenTable": {}, "subscriptionGroupTable": table}
    )


TIMER_CHECKPOINT = struct.Struct(">qqqqqqq")


def timer_checkpoint(queue_offset: int, *, data_version: int) -> bytes:
    """``config/timercheck`` (``TimerCheckpoint``, one 4096-byte page) of a broker whose timer wheel is empty.

    The wheel takes the timer topic's records from ``queue_offset`` on
    (``lastTimerQueueOffset``; a master starts at the lower of it and
    ``masterTimerQueueOffset``, so both are set); no timerlog written
    (``lastTimerLogFlushPos`` 0); the read position 0, which the broker moves
    to its own clock less the wheel's span, as it does without the file.
    Then ``stateVersion``, ``timestamp`` and ``counter`` of its data version:
    0, 0 (the broker reads no meaning into it) and ``data_version``, so that
    the bytes depend on the lake's content only.
    """
    head = TIMER_CHECKPOINT.pack(0, 0, queue_offset, queue_offset, 0, 0, data_version)
    return head + bytes(CHECKPOINT_FILE_SIZE - len(head))


def delay_offsets_json(offsets: Mapping[int, int], *, data_version: int, timestamp: int) -> str:
    """``config/delayOffset.json``: per delay level, the ``SCHEDULE_TOPIC_XXXX`` queue offset delivered up to.

    Byte for byte what ``ScheduleMessageService.persist`` writes: fastjson's
    pretty format (tabs, fields sorted), the integer levels as bare keys,
    the table on one line, no newline at the end. A level missing from the
    table is delivered from queue offset 0 by a broker starting on it.
    """
    version = _data_version(data_version, timestamp)
    fields = ",\n".join(f'\t\t"{name}":{value}' for name, value in version.items())
    table = ",".join(f"{int(level)}:{int(offset)}" for level, offset in sorted(offsets.items()))
    table += "\n\t" if table else ""  # fastjson closes a non-empty map on the next line
    return f'{{\n\t"dataVersion":{{\n{fields}\n\t}},\n\t"offsetTable":{{{table}}}\n}}'


# a JSON string, or an integer object key without quotes (fastjson writes map keys of a Map<Integer, ...> so)
_STRING_OR_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|(?<=[{,])(\s*)(-?[0-9]+)(?=\s*:)')
MAX_CONFIG_BYTES = 1 << 20


def parse_delay_offsets(text: str) -> dict[int, int]:
    """The offset table of a ``delayOffset.json``: ``{level: queue offset}``.

    Reads strict JSON and what fastjson writes (integer keys without
    quotes); nothing looser (fastjson itself also takes single quotes and
    bare words). A missing ``offsetTable`` is an empty table, as for the broker.

    Raises:
        ValueError: not such a document; the message says what is wrong.
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"{len(text)} characters, more than any offset table needs ({MAX_CONFIG_BYTES})")
    quoted = _STRING_OR_BARE_KEY.sub(
        lambda m: m.group(0) if m.group(2) is None else f'{m.group(1)}"{m.group(2)}"', text
    )
    try:
        document = json.loads(quoted)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(document, dict):
        raise ValueError(f"a JSON {type(document).__name__}, not an object")
    table = document.get("offsetTable", {})
    if not isinstance(table, dict):
        raise ValueError(f"offsetTable is a JSON {type(table).__name__}, not an object")
    offsets = {}
    for key, value in table.items():
        if not (key.isascii() and key.isdigit() and 0 < int(key) < 1 << 31):
            raise ValueError(f"offsetTable key {key!r} is not a delay level (an integer from 1)")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
            raise ValueError(f"offsetTable level {key}: {value!r} is not a queue offset (an integer from 0)")
        offsets[int(key)] = value
    return offsets


def _data_version(counter: int, timestamp: int) -> dict:
    return {"counter": counter, "stateVersion": 0, "timestamp": timestamp}


def _pretty(document: dict) -> str:
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
