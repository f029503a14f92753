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
from tests.view_checks import assert_records_decode_to_their_stored_columns

pytestmark = pytest.mark.spark

LEVELS = "1s 2s 3s 5s 10s 30s"  # short levels, so deliveries fall inside and between the runs
TOPICS = {"Wide": 12, "OrderEvents": 8, "UserProfile": 4}  # Wide: REAL_QIDs of two digits; UserProfile: COMPACTION
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
    config = RefConfig(
        segment_size=SEGMENT,
        queue_counts=dict(TOPICS),
        compaction_topics=frozenset({"UserProfile"}),
        delay_levels=LEVELS,
        timer_max_delay_sec=120,
    )
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
        if rng.random() < 0.1:
            line["transaction"] = rng.choice(["PREPARED", "COMMIT", "ROLLBACK"])  # only COMMIT is re-routed
        if rng.random() < 0.1:
            line["bornHost"] = "[2001:db8::7]:50000"  # wider records, and sysFlag bits the delivery keeps
        if line["topic"] == "UserProfile" and rng.random() < 0.8:
            line["keys"] = f"user-{rng.randrange(20)}"
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
        expected: dict[PendingKey, int] = {}
        for origin in broker.scheduled:
            key = PendingKey(origin["route"]["level"], origin["route"]["real_topic"])
            expected[key] = expected.get(key, 0) + 1
        assert {key: group.count for key, group in state.pending.items()} == expected
        assert state.pending_count == len(broker.scheduled) == metrics["pending_deliveries"]
        next_offsets = {}  # delayOffset.json: the next queue offset each level delivers
        for level in range(1, len(LEVELS.split()) + 1):
            waiting = [o["queue_offset"] for o in broker.scheduled if o["route"]["level"] == level]
            if waiting or ("SCHEDULE_TOPIC_XXXX", level - 1) in broker.queue_heads:
                next_offsets[level] = min(waiting, default=broker.queue_heads.get(("SCHEDULE_TOPIC_XXXX", level - 1)))
        assert dict(state.delay_offsets) == next_offsets
        if broker.scheduled:
            assert state.pending_from <= min(o["physical_offset"] for o in broker.scheduled)
        for key, group in state.pending.items():
            dues = [o["route"]["due"] for o in broker.scheduled if PendingKey(o["route"]["level"],
                    o["route"]["real_topic"]) == key]  # fmt: skip
            assert group.next_due == min(dues)
    delivered = [m for m in broker.messages if m["topic"] in TOPICS and "REAL_TOPIC" in dict(m.get("pairs", []))]
    assert len(delivered) > 40  # the test exercises what it claims
    assert assert_records_decode_to_their_stored_columns(Lake.from_settings(settings)) == len(broker.messages)
    assert any(int(dict(m["pairs"])["REAL_QID"]) >= 10 for m in delivered)  # two-digit REAL_QIDs
    assert broker.rejected  # timers over the maximum delay


def _at(ms: int):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC)


def test_pending_messages_wait_on_the_schedule_topic_and_expiry_loses_them_as_a_broker_does(spark, tmp_path):
    """A pull and a key lookup on the real topic find a delayed message only once delivered (before, a key
    lookup on SCHEDULE_TOPIC_XXXX finds it). Delayed messages whose segment expires before they are due are
    gone (a broker's ScheduleMessageService finds no record behind the queue unit): the state counts only what
    is left, which later runs deliver."""
    from rmqlake.query import query_key, query_offset
    from rmqlake.steps.expire import expire
    from rmqlake.steps.quality import quality
    from rmqlake.steps.reput import reput

    lines = [
        {"topic": "OrderEvents", "queueId": 0, "keys": f"order-{i}", "body": "x" * 600,
         "bornTimestamp": START + i * 1000, "delayLevel": 6}
        for i in range(60)
    ]  # fmt: skip
    settings = settings_for(
        tmp_path, "retention.file_reserved_hours=0", "retention.delete_when=04", "quality.report=false"
    )
    path = write_jsonl(tmp_path / "in" / "sends.jsonl", lines)
    ingest(spark, settings, input_path=str(path))
    lake = Lake.from_settings(settings)
    before = lake.state().schedule
    assert before.pending_count == 30  # due 30 s after their store time: the last 30 are not due by the last one
    reput(spark, settings)
    slots, sizes = settings.store.index_slots, {"segment_size": SEGMENT}
    dispatched = Lake.from_settings(settings)
    pulled = query_offset(dispatched, topic="OrderEvents", queue=0, offset=0, max_num=64, **sizes)
    assert [(m["keys"], m["store_timestamp"]) for m in pulled["rows"]] == [
        ([f"order-{i}"], START + i * 1000 + 30_000) for i in range(30)
    ]  # the deliveries, at their due times; nothing of the 30 waiting
    for i, found in ((0, 1), (59, 0)):
        keyed = query_key(dispatched, topic="OrderEvents", key=f"order-{i}", slots=slots, **sizes)
        assert len(keyed["rows"]) == found
        waiting = query_key(dispatched, topic="SCHEDULE_TOPIC_XXXX", key=f"order-{i}", slots=slots, **sizes)
        assert [(m["queue_id"], m["store_timestamp"]) for m in waiting["rows"]] == [(5, START + i * 1000)]
    deleted = expire(spark, settings, now=_at(_next_hour(START, 4)))
    assert deleted["segments_deleted"] > 0
    lost = deleted["scheduled_deliveries_lost"]
    after = Lake.from_settings(settings).state().schedule
    left = [
        row
        for row in lake.read_arrow("commitlog", columns=["topic", "physical_offset", "store_timestamp"]).to_pylist()
        if row["topic"] == "SCHEDULE_TOPIC_XXXX" and row["physical_offset"] >= deleted["min_physical_offset"]
        and row["store_timestamp"] + 30_000 > before.delivered_until
    ]  # fmt: skip
    assert lost > 0 and after.pending_count == len(left) == before.pending_count - lost
    assert after.pending_from >= deleted["min_physical_offset"]
    checked = quality(spark, settings, suites=["schedule"])
    assert [(s["suite"], s["failed"]) for s in checked["suites"]] == [("schedule.critical", 0)]


def _next_hour(ms: int, hour: int) -> int:
    """The first time after ``ms`` at ``hour``:00 UTC, a day later at least (so the reserved time has passed)."""
    from datetime import UTC, datetime, timedelta

    moment = datetime.fromtimestamp(ms / 1000, UTC).replace(hour=hour, minute=0, second=0, microsecond=0)
    return int((moment + timedelta(days=1)).timestamp() * 1000)
