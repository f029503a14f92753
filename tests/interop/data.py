"""The messages the interop tests store, on both sides: a producer log for rmqlake, a put list for the harness.

Deterministic for a seed and written in plain Python. The variety is what a broker must get right:
several commitlog segments, many CQ files, several index files (full ones rolled over), IPv6 born
and store hosts, a ``%RETRY%`` topic longer than 127 characters (V2 magic), store-level
PREPARED/COMMIT/ROLLBACK records, empty bodies, properties at and near the 32767-byte limit, keys
colliding on String.hashCode ("Aa"/"BB"), multi-key messages and keys shared by several messages.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path

# small store sizes, so that every kind of file rolls over on a few hundred messages
SEGMENT, UNITS, SLOTS, ENTRIES = 65536, 16, 64, 200
SIZES = [
    f"store.commitlog_segment_size={SEGMENT}",
    f"store.cq_units_per_file={UNITS}",
    f"store.index_slots={SLOTS}",
    f"store.index_max_entries={ENTRIES}",
]
CLUSTER = "DefaultCluster"
ORDERS = "InteropOrders"  # auto-created: broker.default_topic_queue_nums (4) queues
TX = "InteropTx"
PROFILES = "UserProfile"  # COMPACTION in conf/topics.yaml (4 queues): every message needs keys
RETRY = "%RETRY%" + "cg_" + "interop_settlement_group_" * 6  # 160 characters: V2 magic
COLLIDING = ["Aa", "BB", "AaAa", "BBBB", "AaBB"]  # equal String.hashCode in pairs and triples
TAGS = ["TagA", "TagB", "TagPay", "TagRefund"]  # "TagPay" has a negative hash
STORE_HOSTS = ["127.0.0.1:10911", "[2001:db8::1]:10911"]
BORN_HOSTS = ["10.1.2.3:50100", "[2001:db8::7]:50200", "[fe80::1:2]:40000", "192.168.7.9:61000"]
START_MS = 1795687200000  # 2026-11-26 10:00:00 UTC
PROPERTY_LIMIT = 32767


@dataclass(frozen=True)
class Message:
    """One message as a producer sent it and the broker stored it (store-level fields included)."""

    topic: str
    queue_id: int
    body: bytes
    flag: int
    born_timestamp: int
    store_timestamp: int
    born_host: str
    store_host: str
    reconsume_times: int
    transaction: str  # NOT_TYPE, PREPARED, COMMIT, ROLLBACK
    properties: tuple[tuple[str, str], ...]  # user properties, in the producer's order
    keys: str | None
    tags: str | None
    uniq_key: str

    def broker_properties(self) -> list[tuple[str, str]]:
        """The broker's map insertion order: user properties, KEYS, TAGS, UNIQ_KEY, CLUSTER."""
        pairs = list(self.properties)
        if self.keys is not None:
            pairs.append(("KEYS", self.keys))
        if self.tags is not None:
            pairs.append(("TAGS", self.tags))
        pairs.append(("UNIQ_KEY", self.uniq_key))
        pairs.append(("CLUSTER", CLUSTER))
        return pairs

    def producer_line(self, *, store_timestamp: int | None = None) -> dict:
        """The producer log line (``store_timestamp`` overrides, e.g. with the broker's own)."""
        line = {
            "topic": self.topic,
            "queueId": self.queue_id,
            "body": base64.b64encode(self.body).decode(),
            "bodyEncoding": "base64",
            "flag": self.flag,
            "bornTimestamp": self.born_timestamp,
            "storeTimestamp": self.store_timestamp if store_timestamp is None else store_timestamp,
            "bornHost": self.born_host,
            "storeHost": self.store_host,
            "reconsumeTimes": self.reconsume_times,
            "transaction": self.transaction,
            "uniqKey": self.uniq_key,
        }
        if self.properties:
            line["properties"] = dict(self.properties)
        if self.keys is not None:
            line["keys"] = self.keys
        if self.tags is not None:
            line["tags"] = self.tags
        return line

    def put_spec(self) -> dict:
        """What the Java harness needs to build the MessageExtBrokerInner."""
        return {
            "topic": self.topic,
            "queueId": self.queue_id,
            "body": base64.b64encode(self.body).decode(),
            "flag": self.flag,
            "bornTimestamp": self.born_timestamp,
            "bornHost": self.born_host,
            "storeHost": self.store_host,
            "reconsumeTimes": self.reconsume_times,
            "transaction": self.transaction,
            "properties": [list(pair) for pair in self.broker_properties()],
        }


def _stored_length(pairs: list[tuple[str, str]]) -> int:
    return sum(len(k.encode()) + len(v.encode()) + 2 for k, v in pairs)


def _uniq_key(rng: random.Random, ipv6: bool) -> str:
    return "".join(rng.choice("0123456789ABCDEF") for _ in range(56 if ipv6 else 32))


def messages(count: int = 900, *, seed: int = 16) -> list[Message]:
    """``count`` messages in store order (store times strictly non-decreasing, some equal)."""
    rng = random.Random(seed)
    out: list[Message] = []
    now = START_MS
    for i in range(count):
        now += rng.choice([0, 0, 120, 350, 700, 999, 1000, 1001, 2500])  # equal times and second boundaries
        kind = rng.random()
        topic, queue, transaction, reconsume = ORDERS, rng.randrange(4), "NOT_TYPE", 0
        if kind < 0.12:
            topic, queue, reconsume = RETRY, 0, rng.randint(1, 3)
        elif kind < 0.27:
            topic, queue = TX, rng.randrange(2)
            transaction = rng.choice(["PREPARED", "COMMIT", "ROLLBACK", "NOT_TYPE"])
        elif kind < 0.35:
            topic, queue = PROFILES, rng.randrange(4)
        body_size = 0 if i % 10 == 3 else rng.choice([1, 17, 64, 200, 640])
        body = bytes(rng.randrange(256) for _ in range(body_size)) if i % 4 else f"body {i} ✓".encode()[:body_size]
        keys = None
        choice = i % 7
        if choice in (0, 1):
            keys = f"order-{i % 97}"  # shared by several messages
        elif choice == 2:
            keys = f"order-{i % 97} cust-{i % 13} region-{i % 5}"  # multi-key
        elif choice == 3:
            keys = rng.choice(COLLIDING)  # String.hashCode collisions
        elif choice == 4:
            keys = f"cust-{i % 13}  spaced-{i}"  # a double space: an empty token, skipped
        if topic == PROFILES:
            keys = f"user-{i % 23}"  # compaction keys; an empty body is a tombstone
        tags = rng.choice(TAGS) if i % 5 else None
        props: list[tuple[str, str]] = []
        if i % 3 == 0:
            props.append(("traceId", f"t-{i:06d}"))
        if i % 11 == 0:
            props.append(("región", "café ☕"))  # non-ASCII names and values
        store_host = STORE_HOSTS[1] if i % 6 == 5 else STORE_HOSTS[0]
        born_host = BORN_HOSTS[i % len(BORN_HOSTS)]
        uniq = _uniq_key(rng, False)
        message = Message(
            topic=topic,
            queue_id=queue,
            body=body,
            flag=rng.choice([0, 0, 1, -7, 2**31 - 1]),
            born_timestamp=now - rng.randrange(0, 800),
            store_timestamp=now,
            born_host=born_host,
            store_host=store_host,
            reconsume_times=reconsume,
            transaction=transaction,
            properties=tuple(props),
            keys=keys,
            tags=tags,
            uniq_key=uniq,
        )
        if i in (150, 420, 700):  # properties exactly at, and just under, the limit
            target = PROPERTY_LIMIT - (0 if i == 420 else rng.randrange(1, 40))
            base = [*message.broker_properties(), ("pad", "")]
            pad = "p" * (target - _stored_length(base))
            message = Message(**{**message.__dict__, "properties": (*message.properties, ("pad", pad))})
            assert _stored_length(message.broker_properties()) == target
        out.append(message)
    return out


def write_producer_log(path: Path, items: list[Message], *, store_timestamps: list[int] | None = None) -> Path:
    """The messages as one JSON Lines producer log (store times overridden by ``store_timestamps``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for n, message in enumerate(items):
            stamp = None if store_timestamps is None else store_timestamps[n]
            handle.write(json.dumps(message.producer_line(store_timestamp=stamp), ensure_ascii=False) + "\n")
    return path
