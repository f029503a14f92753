"""Delay-level and timer messages through ingest, against the sequential reference broker (tests/reference.py).

The reference re-routes each send as HookUtils does, takes round-robin turns one message at a time, and appends
every delivery due by the run's clock at its due time among the run's messages; ingest does the same in
parallel (several partitions, small segments, REAL_QIDs of one and two digits, deliveries whose origin took a
round-robin turn in another partition, origins of earlier runs). Every record must be equal, byte for byte.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rmqlake.lake import Lake
from rmqlake.lake.state import PendingKey
from rmqlake.steps.ingest import ingest
from tests.conftest import make_settings
from tests.reference import RefBroker, RefConfig
from tests.spark.test_ingest import assert_matches_reference, write_jsonl

pytestmark = pytest.mark.spark

LEVELS = "1s 2s 3s 5s 10s 30s"  # short levels, so deliveries fall inside and between the runs
TOPICS = {"Wide": 12, "OrderEvents": 8, "Clickstream": 4}  # Wide: REAL_QIDs of two digits
SEGMENT = 8192
START = 1_764_000_000_000


def settings_for(tmp_path: Path, *overrides: str):
    return make_settings(
        tmp_path / "lake",
        f"store.commitlog_segment_size={SEGMENT}",
        "ingest.sort_partitions=5",
        f"broker.message_delay_level={LEVELS}",
        "store.timer_max_delay_sec=120",
        "topics.Wide.queues=12",
        *overrides,
    )


def reference(java_oracle) -> RefBroker:
    config = RefConfig(segment_size=SEGMENT, queue_counts=dict(TOPICS), delay_levels=LEVELS, timer_max_delay_sec=120)
    return RefBroker(config, java_oracle)


def sends(rng: random.Random, *, start: int, count: int) -> list[dict]:
    """Plain, delay-level and timer sends over ``count`` seconds from ``start``, in every form the input allows."""
    lines = []
    for i in range(count):
        stamp = start + i * 1000 + rng.randrange(1000)
        line = {"topic": rng.choice(list(TOPICS)), "body": "m" * rng.randrange(20, 300), "bornTimestamp": stamp}
        choice = rng.random()
        if choice < 0.3:
            line["delayLevel"] = rng.randrange(1, 9)  # levels 7 and 8 are clamped to 6
        elif choice < 0.4:
            line["properties"] = {"DELAY": str(rng.randrange(1, 4))}
        elif choice < 0.5:
            line["deliverTimeMs"] = stamp + rng.choice([-5000, 0, 1500, 4000, 20_000, 200_000])  # past, over max
        elif choice < 0.55:
            line["properties"] = {"TIMER_DELAY_SEC": str(rng.choice([2, 7]))}
        elif choice < 0.6:
            line["properties"] = {"TIMER_DELAY_MS": str(rng.choice([1000, 2500]))}
        placement = rng.random()
        if placement < 0.3:
            line["queueId"] = rng.randrange(TOPICS[line["topic"]])
        elif placement < 0.45:
            line["keys"] = f"k{rng.randrange(50)}"
        if rng.random() < 0.3:
            line["tags"] = rng.choice(["a", "b"])
        lines.append(line)
    return lines


def test_delays_and_timers_are_re_routed_and_delivered_as_the_reference_broker_does(spark, tmp_path, java_oracle):
    rng = random.Random(7)
    settings = settings_for(tmp_path)
    broker = reference(java_oracle)
    batches = [
        sends(rng, start=START, count=120),
        sends(rng, start=START + 125_000, count=60),  # after a gap: earlier origins come due among these
        [],  # only a clock: every 30 s delivery and the near timers come due
    ]
    nows = [None, None, START + 200_000]
    for index, (lines, now) in enumerate(zip(batches, nows, strict=True)):
        path = write_jsonl(tmp_path / "in" / f"b{index}.jsonl", lines or [{"not": "a message"}])
        metrics = ingest(spark, settings, input_path=str(path), now=None if now is None else _at(now))
        broker.ingest_files([str(path)], now=now)
        assert_matches_reference(spark, settings, broker)
        state = Lake.from_settings(settings).state().schedule
        assert state.delivered_until == broker.clock
        assert state.pending_count == len(broker.scheduled) == metrics["pending_deliveries"]
        expected: dict[PendingKey, int] = {}
        for origin in broker.scheduled:
            key = PendingKey(origin["route"]["level"], origin["route"]["real_topic"])
            expected[key] = expected.get(key, 0) + 1
        assert {key: group.count for key, group in state.pending.items()} == expected
        for key, group in state.pending.items():
            dues = [o["route"]["due"] for o in broker.scheduled if PendingKey(o["route"]["level"],
                    o["route"]["real_topic"]) == key]  # fmt: skip
            assert group.next_due == min(dues)
    delivered = [m for m in broker.messages if m["topic"] in TOPICS and "REAL_TOPIC" in dict(m.get("pairs", []))]
    assert len(delivered) > 40  # the test exercises what it claims
    assert any(int(dict(m["pairs"])["REAL_QID"]) >= 10 for m in delivered)  # two-digit REAL_QIDs
    assert broker.rejected  # timers over the maximum delay


def _at(ms: int):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC)
