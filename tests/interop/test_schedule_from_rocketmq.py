"""A real broker's delay-level and timer handling, read back from its store: the truth rmqlake's rules must give.

tests/interop/schedule.py sends the messages (every delay level and a clamped one, timers in their three
forms, one due already, two refused, plain ones) to a real RocketMQ broker with ``messageDelayLevel``
``1s 2s 3s`` and waits until everything due is delivered. Then:

* each re-routed record is what :func:`rmqlake.formats.schedule.route` gives for the send at the
  record's store time: topic, queue, properties byte for byte (``REAL_TOPIC``, ``REAL_QID``,
  ``TIMER_OUT_MS``, the clamped ``DELAY``), and the ConsumeQueue tagsCode of a delay record is the
  due time the rules give;
* each delivery is on the real topic and queue, after the due time the rules give, with the
  schedule record's body, flag, sysFlag, born time and hosts, reconsume times.

Wall-clock values are compared within a tolerance, nothing else: the broker reads its clock for a
relative timer (``TIMER_DELAY_SEC``/``TIMER_DELAY_MS``) in the put hook, a moment before it stamps the
store time the rules count from, so its ``TIMER_OUT_MS`` may be one precision step lower; a delivery's
store time is the broker's wall clock when its delivery service ran (``ScheduleMessageService`` polls,
the timer wheel reads a slot once that second has passed), never before the due time, within
:data:`DELIVERY_TOLERANCE_MS` after it.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from rmqlake.formats.consumequeue import tags_code
from rmqlake.formats.properties import broker_properties
from rmqlake.formats.schedule import (
    SCHEDULE_TOPIC,
    TIMER_DEQUEUE_MS,
    TIMER_ENQUEUE_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    ScheduleRefused,
    ScheduleRules,
    route,
)
from rmqlake.formats.schedule import delivery as delivery_of
from rmqlake.lake import Lake
from rmqlake.steps.store import import_store
from tests.conftest import make_settings
from tests.interop import data, schedule

pytestmark = pytest.mark.interop
RULES = ScheduleRules.of(
    message_delay_level=schedule.DELAY_LEVELS,
    timer_precision_ms=schedule.TIMER_PRECISION_MS,
    timer_max_delay_sec=schedule.TIMER_MAX_DELAY_SEC,
)
DELIVERY_TOLERANCE_MS = 5000


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> schedule.BrokerRun:
    run = schedule.run_broker(tmp_path_factory.mktemp("schedule"))
    assert run.answer["delivered"], run.answer  # everything due arrived within the harness's time
    return run


def sent_properties(send: dict, result: dict) -> list[tuple[str, str]]:
    """The properties the broker received for a send, with its ``CLUSTER``, in storage order.

    Besides the spec's, the producer sends ``WAIT``, ``DELAY`` (setDelayTimeLevel), ``TIMER_DELIVER_MS``
    (the harness's absolute timers) and the 5.x client's ``MSG_REGION`` and ``TRACE_ON``.
    """
    user = dict(send.get("properties", {}))
    if "delayLevel" in send:
        user["DELAY"] = str(send["delayLevel"])
    if "deliverMs" in result:
        user["TIMER_DELIVER_MS"] = result["deliverMs"]
    user.update(WAIT="true", MSG_REGION="DefaultRegion", TRACE_ON="true")
    return broker_properties(user, keys=send.get("keys"), tags=send.get("tags"), uniq_key=result["msgId"],
                             cluster_name=data.CLUSTER)  # fmt: skip


def records_of(broker: schedule.BrokerRun, uniq_key: str) -> list[dict]:
    return [r for r in broker.records if r["properties"].get("UNIQ_KEY") == uniq_key]


def unit_of(broker: schedule.BrokerRun, record: dict) -> dict:
    (unit,) = (u for u in broker.units if u["commitlog_offset"] == record["physical_offset"])
    return unit


def test_the_sends_are_accepted_or_refused_as_the_rules_say(broker):
    for send, result in zip(broker.sends, broker.answer["sends"], strict=True):
        if send["expect"] == "refused":
            assert result["status"] == "REFUSED", result
            assert "timer message illegal" in result["remark"]
            assert not any(r["body"] == send["body"].encode() for r in broker.records)
            with pytest.raises(ScheduleRefused, match="timer message illegal"):
                route(send["topic"], send["queueId"], sent_properties(send, {"msgId": "x"}), sys_flag=0,
                      now_ms=result["sentAt"], rules=RULES)  # fmt: skip
        else:
            assert result["status"] == "SEND_OK", result


def test_re_routed_records_are_what_the_rules_give(broker):
    kinds = set()
    for send, result in zip(broker.sends, broker.answer["sends"], strict=True):
        if send["expect"] == "refused":
            continue
        first = records_of(broker, result["msgId"])[0]
        routed = route(send["topic"], send["queueId"], sent_properties(send, result), sys_flag=first["sys_flag"],
                       now_ms=first["store_timestamp"], rules=RULES)  # fmt: skip
        kinds.add(routed.kind)
        assert routed.kind == send["expect"], send
        assert (first["topic"], first["queue_id"]) == (routed.topic, routed.queue_id), send
        expected = routed.properties
        if routed.kind == "timer" and "deliverMs" not in result:
            # a relative timer: the broker's clock in the put hook is at most its store time
            theirs, ours = int(first["properties"][TIMER_OUT_MS]), int(dict(expected)[TIMER_OUT_MS])
            assert ours - theirs in (0, RULES.timer_precision_ms), (ours, theirs)
            expected = [(k, str(theirs) if k == TIMER_OUT_MS else v) for k, v in expected]
        assert list(first["properties"].items()) == expected, send  # storage order: the record's bytes
        unit = unit_of(broker, first)
        assert unit["queue_offset"] == first["queue_offset"]
        if routed.kind == "delay":
            assert unit["tags_code"] == routed.due_ms, send  # the schedule topic's tagsCode: the due time
            assert first["queue_offset"] == result["queueOffset"]
        elif routed.kind == "timer":
            assert (unit["topic"], unit["tags_code"]) == (TIMER_TOPIC, tags_code(send.get("tags")))
    assert kinds == {"plain", "delay", "timer"}


def test_deliveries_are_appended_on_the_real_topic_after_their_due_time(broker):
    delivered = 0
    for send, result in zip(broker.sends, broker.answer["sends"], strict=True):
        if send["expect"] not in ("delay", "timer"):
            assert len(records_of(broker, result.get("msgId", "-"))) <= 1
            continue
        first, *later = records_of(broker, result["msgId"])
        assert len(later) == 1, (send, later)  # delivered exactly once
        delivery = later[0]
        routed = route(send["topic"], send["queueId"], sent_properties(send, result), sys_flag=first["sys_flag"],
                       now_ms=first["store_timestamp"], rules=RULES)  # fmt: skip
        assert (delivery["topic"], delivery["queue_id"]) == (send["topic"], send["queueId"])
        kept = ("body", "flag", "sys_flag", "born_timestamp", "born_host", "store_host", "reconsume_times")
        assert {k: delivery[k] for k in kept} == {k: first[k] for k in kept}, send
        due = routed.due_ms
        if send["expect"] == "timer":
            due = int(first["properties"][TIMER_OUT_MS]) + RULES.timer_precision_ms  # the broker's own
        stored = delivery["store_timestamp"]
        assert due <= stored <= due + DELIVERY_TOLERANCE_MS, (send, stored)
        ours = delivery_of(first["topic"], list(first["properties"].items()), store_timestamp=first["store_timestamp"],
                           due_ms=due, rules=RULES)  # fmt: skip
        assert (ours.topic, ours.queue_id) == (delivery["topic"], delivery["queue_id"])
        theirs = delivery["properties"]
        if send["expect"] == "timer":
            # wall clock: the wheel's write time (floored) when it took the record, and the dequeue time
            enqueued = int(theirs[TIMER_ENQUEUE_MS])
            assert 0 <= enqueued - int(dict(ours.properties)[TIMER_ENQUEUE_MS]) <= DELIVERY_TOLERANCE_MS
            assert due <= int(theirs[TIMER_DEQUEUE_MS]) <= stored
            clock = {TIMER_ENQUEUE_MS: theirs[TIMER_ENQUEUE_MS], TIMER_DEQUEUE_MS: theirs[TIMER_DEQUEUE_MS]}
            ours = replace(ours, properties=[(k, clock.get(k, v)) for k, v in ours.properties])
        assert ours.properties == list(theirs.items()), send  # the delivery's bytes
        unit = unit_of(broker, delivery)
        assert (unit["topic"], unit["queue_id"], unit["tags_code"]) == (
            send["topic"], send["queueId"], tags_code(send.get("tags"))
        )  # fmt: skip
        delivered += 1
    assert delivered == sum(1 for s in broker.sends if s["expect"] in ("delay", "timer"))


def test_the_schedule_and_timer_topics_hold_one_record_per_re_routed_send(broker):
    on = {
        topic: sorted((u["queue_id"], u["queue_offset"]) for u in broker.units if u["topic"] == topic)
        for topic in (SCHEDULE_TOPIC, TIMER_TOPIC)
    }
    delays = [s for s in broker.sends if s["expect"] == "delay"]
    timers = [s for s in broker.sends if s["expect"] == "timer"]
    assert len(on[SCHEDULE_TOPIC]) == len(delays)
    assert len(on[TIMER_TOPIC]) == len(timers)
    assert {q for q, _ in on[TIMER_TOPIC]} == {0}


def test_delay_offsets_hold_the_next_schedule_offset_per_level(broker):
    """``config/delayOffset.json`` (written by fastjson: bare integer keys) once every delay record is delivered."""
    text = (broker.store / "config" / "delayOffset.json").read_text()
    table = re.search(r'"offsetTable"\s*:\s*\{([^}]*)\}', text).group(1)
    offsets = {int(level): int(offset) for level, offset in re.findall(r"(\d+)\s*:\s*(\d+)", table)}
    records = [u for u in broker.units if u["topic"] == SCHEDULE_TOPIC]
    assert offsets == {queue + 1: sum(1 for u in records if u["queue_id"] == queue) for queue in range(3)}


@pytest.mark.spark
def test_import_store_finds_every_scheduled_message_of_the_broker_delivered(spark, broker, tmp_path):
    """``import-store`` of the broker's store: every re-routed record has its delivery there (the delay one keeps
    DELAY/REAL_TOPIC/REAL_QID, the timer one REAL_TOPIC/REAL_QID and the wheel's stamps), so nothing is pending
    and the delay offsets the records give are those of the broker's ``delayOffset.json``."""
    settings = make_settings(tmp_path / "lake", *data.SIZES, f"broker.message_delay_level={schedule.DELAY_LEVELS}")
    metrics = import_store(spark, settings, store_dir=str(broker.store))
    re_routed = sum(1 for s in broker.sends if s["expect"] in ("delay", "timer"))
    assert (metrics["schedule_delivered"], metrics["schedule_pending"]) == (re_routed, 0)
    assert (metrics["schedule_redelivered"], metrics["schedule_unreadable"]) == (0, 0)
    assert metrics["delay_offsets_file"] is True and metrics["delay_offsets_differing"] == []
    state = Lake.from_settings(settings).state().schedule
    assert (state.pending, state.pending_from) == ({}, None)
    assert set(state.delay_offsets) == {1, 2, 3}
