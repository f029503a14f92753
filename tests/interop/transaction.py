"""A real broker fed transactional sends (java/TransactionHarness.java); its store read back.

A ``TransactionMQProducer`` sends half messages to two topics (the producer picks the queues, round
robin); its local transaction commits some, rolls back some and leaves the rest unknown, so they stay
open (the broker's check-back is stopped: open halves stay as sent). Sends carry tags,
keys (several, or none) and user properties. The harness waits until every commit is on its topic and
the op records name every ended half, then shuts the broker down cleanly.

The broker's files are read with the same readers as the scheduled-message test
(:func:`tests.interop.schedule.commitlog_records`, :func:`tests.interop.schedule.consume_queue_units`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rmqlake.formats.store import topics_json
from tests.interop import data
from tests.interop.harness import run_java
from tests.interop.schedule import commitlog_records, consume_queue_units

ORDERS = "TxOrders"
PAYMENTS = "TxPayments"
TOPICS = {ORDERS: 4, PAYMENTS: 2}
PRODUCER_GROUP = "pg_rmqlake_tx"
OP_BATCH_INTERVAL_MS = 500


def sends() -> list[dict]:
    """The producer's transactional sends, in order (TransactionHarness spec entries)."""
    return [
        {"topic": ORDERS, "body": "order 1 committed", "tags": "TagA", "keys": "order-1", "end": "COMMIT"},
        {"topic": ORDERS, "body": "order 2 rolled back", "tags": "TagB", "keys": "order-2", "end": "ROLLBACK"},
        {"topic": ORDERS, "body": "order 3 open", "tags": "TagA", "keys": "order-3 shared", "end": "UNKNOWN"},
        {"topic": ORDERS, "body": "order 4 committed, user properties", "tags": "TagPay",
         "properties": {"color": "red", "region": "eu-west"}, "end": "COMMIT"},
        {"topic": PAYMENTS, "body": "payment 1 committed", "keys": "pay-1 shared", "end": "COMMIT"},
        {"topic": PAYMENTS, "body": "payment 2 rolled back", "tags": "TagRefund", "end": "ROLLBACK"},
        {"topic": ORDERS, "body": "order 5 committed, no tags or keys", "end": "COMMIT"},
        {"topic": PAYMENTS, "body": "payment 3 open", "tags": "TagPay", "properties": {"amount": "12.50"},
         "end": "UNKNOWN"},
        {"topic": ORDERS, "body": "order 6 committed", "tags": "TagB", "keys": "Aa BB",
         "properties": {"CHECK_IMMUNITY_TIME_IN_SECONDS": "60"}, "end": "COMMIT"},
        {"topic": PAYMENTS, "body": "payment 4 committed", "tags": "TagA", "keys": "pay-4", "end": "COMMIT"},
        {"topic": ORDERS, "body": "order 7 rolled back", "tags": "TagA", "end": "ROLLBACK"},
        {"topic": ORDERS, "body": "order 8 committed", "tags": "TagA", "keys": "order-8", "end": "COMMIT"},
    ]  # fmt: skip


@dataclass(frozen=True)
class BrokerRun:
    """What the broker answered and stored.

    Attributes:
        sends: the spec entries, in send order.
        answer: TransactionHarness's answer (per send: status, msgId, queueId, the half's queue offset).
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
    """Send :func:`sends` to a real broker in ``root`` and read its store once every end is applied."""
    store = root / "broker"
    (store / "config").mkdir(parents=True)
    topics = {name: (queues, "DELETE") for name, queues in TOPICS.items()}
    (store / "config" / "topics.json").write_text(topics_json(topics, data_version=1, timestamp=0))
    entries = sends()
    spec = {
        "store": str(store),
        "work": str(root / "work"),
        "cluster": data.CLUSTER,
        "timeoutSeconds": 120,
        "commitlogSegmentSize": data.SEGMENT,
        "cqUnitsPerFile": data.UNITS,
        "indexSlots": data.SLOTS,
        "indexMaxEntries": data.ENTRIES,
        "producerGroup": PRODUCER_GROUP,
        "opBatchIntervalMillis": OP_BATCH_INTERVAL_MS,
        "sends": entries,
        "settleMillis": 2 * OP_BATCH_INTERVAL_MS,
    }
    (root / "transaction.json").write_text(json.dumps(spec))
    answer = run_java("TransactionHarness", str(root / "transaction.json"), timeout=150)
    return BrokerRun(entries, answer, store, commitlog_records(store), consume_queue_units(store))
