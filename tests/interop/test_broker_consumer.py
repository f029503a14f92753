"""A real RocketMQ 5.3.3 name server and broker serve an ``export-store`` directory to real consumers.

tests/interop/java/BrokerHarness.java starts a NamesrvController and a BrokerController in one JVM
(127.0.0.1, free ports) whose store root is the export of the shared interop lake, its first
commitlog segments expired, plus two consumer offset snapshots; then it runs DefaultLitePullConsumers,
one group after the other, and answers with what each group received. The broker creates no topic
(they come from ``config/topics.json``) and, for the lake's groups, no subscription group (they come
from ``config/subscriptionGroup.json``); their committed offsets come from ``config/consumerOffset.json``.

Expected messages come from the producer messages of tests/interop/data.py: per queue, the messages
that take a queue offset (not PREPARED or ROLLBACK), in store order; a queue is live from the min
offset the lake corrected after expiry, which the broker must find on its own.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rmqlake.lake import Lake
from rmqlake.steps.compact import compact
from rmqlake.steps.expire import expire
from rmqlake.steps.offsets import load_offsets, queue_bounds
from rmqlake.steps.store import export_store
from tests.interop import data
from tests.interop.conftest import copy_lake, lake_settings
from tests.interop.harness import run_java

pytestmark = [pytest.mark.interop, pytest.mark.spark]
LAKE_GROUP = "cg_interop_orders"  # committed offsets in the lake; the broker must not auto-create it
NEW_GROUP = "cg_interop_new"  # unknown to the lake: reads from the first offset
COMPACTED_GROUP = "cg_interop_compacted"  # unknown to the lake, reads the COMPACTION topics
LAKE_TOPICS = [data.ORDERS, data.TX]
LIVE_TOPICS = [data.ORDERS, data.TX, data.RETRY]  # every DELETE topic with messages
EXPIRED_SEGMENTS = 2


def queues(messages) -> dict[tuple[str, int], list]:
    """Per (topic, queue): the messages at queue offsets 0, 1, ... (PREPARED and ROLLBACK take none)."""
    out: dict[tuple[str, int], list] = defaultdict(list)
    for message in messages:
        if message.transaction not in ("PREPARED", "ROLLBACK"):
            out[(message.topic, message.queue_id)].append(message)
    return out


def committed_offsets(expected: dict[tuple[str, int], list]) -> tuple[dict, dict]:
    """An older and a newer snapshot of the lake group's offsets; the newer one is what the broker must load.

    Per queue of the newer snapshot: half way, 0 (a reset, lower than the older snapshot's), the
    end (nothing left to read) and one before the end.
    """
    older, newer = {}, {}
    for topic in LAKE_TOPICS:
        for queue in range(4):
            count = len(expected.get((topic, queue), []))
            older[(topic, queue)] = count // 3
            newer[(topic, queue)] = [count // 2, 0, count, max(count - 1, 0)][queue]
    older[(data.ORDERS, 1)] = 5
    return older, newer


def write_snapshot(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    """A consumerOffset.json as the broker's fastjson writes it (queue ids unquoted)."""
    per_topic: dict[str, list[str]] = defaultdict(list)
    for (topic, queue), offset in sorted(offsets.items()):
        per_topic[topic].append(f"{queue}:{offset}")
    table = ",".join(f'"{topic}@{LAKE_GROUP}":{{{",".join(items)}}}' for topic, items in per_topic.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"offsetTable":{' + table + '},"dataVersion":{"counter":1}}\n')


@pytest.fixture(scope="module")
def served(spark, interop_lake) -> dict:
    """The shared lake plus consumer offsets, exported and served by a real broker to three groups."""
    root = interop_lake.root / "d3-broker"
    settings = copy_lake(interop_lake, root / "lake")
    compact(spark, settings)  # before expiry: the compacted queues keep keys whose messages expire
    segments = sorted(Lake.from_settings(settings).read_arrow("segments").to_pylist(), key=lambda s: s["start_offset"])
    modified = segments[EXPIRED_SEGMENTS]["first_store_timestamp"]  # the last write to the segment before it
    now = datetime.fromtimestamp((modified + 72 * 3_600_000) / 1000, tz=UTC)
    settings = lake_settings(root / "lake", f"retention.delete_when={now.hour:02d}")
    assert expire(spark, settings, now=now)["segments_deleted"] == EXPIRED_SEGMENTS
    expected = queues(interop_lake.messages)
    older, newer = committed_offsets(expected)
    write_snapshot(root / "offsets" / "consumerOffset-20261120T080000Z.json", older)
    write_snapshot(root / "offsets" / "consumerOffset-20261120T090000Z.json", newer)
    load_offsets(settings, input_path=str(root / "offsets"))
    store = Path(export_store(spark, settings, out=str(root / "store"))["out"])
    topics_json = json.loads((store / "config" / "topics.json").read_text())["topicConfigTable"]
    compaction = sorted(
        name
        for name, topic in settings.topics.items()
        if topic.cleanup_policy == "COMPACTION" and any(t == name for t, _ in expected)
    )
    groups = [
        {"group": LAKE_GROUP, "topics": LAKE_TOPICS, "fromFirst": False, "autoCreateSubscriptionGroup": False},
        {"group": NEW_GROUP, "topics": LIVE_TOPICS, "fromFirst": True, "autoCreateSubscriptionGroup": True},
    ]
    if compaction:
        groups.append(
            {"group": COMPACTED_GROUP, "topics": compaction, "fromFirst": True, "autoCreateSubscriptionGroup": True}
        )
    spec = {
        "store": str(store),
        "work": str(root / "work"),
        "cluster": data.CLUSTER,
        "timeoutSeconds": 150,
        "commitlogSegmentSize": data.SEGMENT,
        "cqUnitsPerFile": data.UNITS,
        "indexSlots": data.SLOTS,
        "indexMaxEntries": data.ENTRIES,
        "groups": [{**g, "maxSeconds": 30 if g["group"] != COMPACTED_GROUP else 6} for g in groups],
        "haltAfterAnswer": True,  # the tests read the answer, not the store after it: no broker shutdown
    }
    (root / "spec.json").write_text(json.dumps(spec))
    answer = run_java("BrokerHarness", str(root / "spec.json"), timeout=180)
    lake = Lake.from_settings(settings, read_only=True)
    return {
        "answer": answer,
        "groups": {g["group"]: g for g in answer["groups"]},
        "expected": expected,
        "committed": newer,
        "bounds": queue_bounds(lake, lake.state()),
        "msg_ids": {
            r["uniq_key"]: r["msg_id"] for r in lake.read_arrow("commitlog", columns=["uniq_key", "msg_id"]).to_pylist()
        },
        "topics_json": topics_json,
        "compaction": compaction,
    }


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def received(group: dict) -> dict[tuple[str, int], list[dict]]:
    """What a group received, per queue, in queue offset order; a message received twice fails."""
    seen = Counter((m["topic"], m["queueId"], m["queueOffset"]) for m in group["messages"])
    assert [k for k, n in seen.items() if n > 1] == [], "messages received more than once"
    out: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for message in sorted(group["messages"], key=lambda m: (m["topic"], m["queueId"], m["queueOffset"])):
        out[(message["topic"], message["queueId"])].append(message)
    return out


def assert_received_exactly(served: dict, group: dict, starts: dict[tuple[str, int], int], topics: list[str]) -> None:
    """Per queue of ``topics``: the messages at offsets [start, max), ids, bodies, keys, tags and store times
    right, and nothing else."""
    got = received(group)
    assert {q for q in got if q[0] not in topics} == set(), "messages from topics the group did not subscribe to"
    queues_of = sorted(q for q in served["expected"] if q[0] in topics)
    assert queues_of, topics
    for queue in queues_of:
        messages = served["expected"][queue]
        start = starts[queue]
        want = [
            (offset, m.uniq_key, served["msg_ids"][m.uniq_key], sha256(m.body), m.keys, m.tags, m.store_timestamp)
            for offset, m in enumerate(messages)
            if offset >= start
        ]
        have = [
            (
                r["queueOffset"],
                r["msgId"],
                r["offsetMsgId"],
                r["bodySha256"],
                r.get("keys"),
                r.get("tags"),
                r["storeTimestamp"],
            )
            for r in got.get(queue, [])
        ]
        assert have == want, f"{group['group']} on {queue}: from offset {start} of {len(messages)}"
    assert set(got) <= set(queues_of)
    assert group["complete"], f"{group['group']}: some queue was not read to its max offset"


def test_the_broker_serves_the_lakes_queues_and_topic_configs(served):
    answer = served["answer"]
    assert answer["rocketmqVersion"] == "V5_3_3"
    bounds = {(q["topic"], q["queueId"]): (q["minOffset"], q["maxOffset"]) for q in answer["queues"]}
    for queue, messages in served["expected"].items():
        if queue[0] in LIVE_TOPICS:
            assert bounds[queue] == served["bounds"][queue], queue  # min as corrected after expiry, max
            assert bounds[queue][1] == len(messages), queue
    assert any(bounds[q][0] > 0 for q in served["expected"] if q[0] in LIVE_TOPICS)  # expiry removed some
    for name in LIVE_TOPICS:
        config, broker = served["topics_json"][name], answer["topics"][name]
        assert (broker["readQueueNums"], broker["writeQueueNums"], broker["perm"]) == (
            config["readQueueNums"],
            config["writeQueueNums"],
            config["perm"],
        )


def test_a_lake_group_receives_exactly_the_messages_after_its_latest_committed_offsets(served):
    group = served["groups"][LAKE_GROUP]
    loaded = {tuple(k.rsplit("/", 1)): v for k, v in group["committed"].items()}
    assert {(t, int(q)): v for (t, q), v in loaded.items()} == served["committed"]  # the newer snapshot
    starts = {q: max(served["committed"].get(q, 0), served["bounds"][q][0]) for q in served["expected"]}
    assert any(0 < s < len(served["expected"][q]) for q, s in starts.items())  # some queues are read half way
    assert any(served["committed"][q] < served["bounds"][q][0] for q in starts if q[0] in LAKE_TOPICS)  # expired
    assert_received_exactly(served, group, starts, LAKE_TOPICS)


def test_a_new_group_from_the_first_offset_receives_every_live_message(served):
    group = served["groups"][NEW_GROUP]
    assert set(group["committed"].values()) == {-1}  # unknown to the lake and the broker
    starts = {q: served["bounds"][q][0] for q in served["expected"]}
    assert_received_exactly(served, group, starts, LIVE_TOPICS)


def test_a_new_group_receives_the_latest_message_of_every_key_of_a_compaction_topic(served):
    """The broker serves a COMPACTION topic from the compaction store export-store wrote from the lake's
    compacted queues: per key the latest message, none for a key whose latest message has an empty body
    (a tombstone), expired messages included (the lake compacted before expiry)."""
    assert served["compaction"], "the shared interop lake has a COMPACTION topic with messages"
    got = received(served["groups"][COMPACTED_GROUP])
    assert {q[0] for q in got} <= set(served["compaction"])
    tombstones = 0
    for queue, messages in served["expected"].items():
        if queue[0] not in served["compaction"]:
            continue
        latest = {m.keys: (offset, m) for offset, m in enumerate(messages)}  # the newest per key
        tombstones += sum(1 for _, m in latest.values() if not m.body)
        want = sorted(
            (offset, m.uniq_key, sha256(m.body), m.keys, m.tags, m.store_timestamp)
            for offset, m in latest.values()
            if m.body
        )
        have = [
            (r["queueOffset"], r["msgId"], r["bodySha256"], r.get("keys"), r.get("tags"), r["storeTimestamp"])
            for r in got.get(queue, [])
        ]
        assert have == want, f"{queue}: not the latest message of every key"
    assert tombstones > 0  # some key was removed by its empty-body latest message
