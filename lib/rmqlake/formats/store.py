"""A broker's store directory: file paths, the checkpoint file and the config JSON it reads (spec layout, 4.4).

Sources: StorePathConfigHelper.java, StoreCheckpoint.java,
TopicConfigSerializeWrapper / TopicConfig.java, ConsumerOffsetManager.java,
SubscriptionGroupManager / SubscriptionGroupConfig.java.
"""

from __future__ import annotations

import json
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


def _data_version(counter: int, timestamp: int) -> dict:
    return {"counter": counter, "stateVersion": 0, "timestamp": timestamp}


def _pretty(document: dict) -> str:
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
