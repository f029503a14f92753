"""The broker's re-routing of delay-level and timer sends (HookUtils.handleScheduleMessage), rule by rule.

tests/interop/test_schedule_from_rocketmq.py holds the same rules against a real broker's store.
"""

from __future__ import annotations

import pytest

from rmqlake.formats.properties import broker_properties, hashmap_order, serialize_properties
from rmqlake.formats.record import TRANSACTION_PREPARED_TYPE
from rmqlake.formats.schedule import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    ScheduleRefused,
    ScheduleRules,
    delivery,
    due_ms,
    java_long,
    route,
)

RULES = ScheduleRules.of(message_delay_level="1s 2s 3s", timer_precision_ms=1000, timer_max_delay_sec=259200)
NOW = 1795687200123  # a store time that is not on a whole second


def sent(**user: str) -> list[tuple[str, str]]:
    return broker_properties(user, keys="k1", tags="TagA", uniq_key="7F00000100002A9F0000000000000001",
                             cluster_name="DefaultCluster")  # fmt: skip


def routed(properties, *, topic="Orders", queue_id=2, sys_flag=0, now_ms=NOW, rules=RULES):
    return route(topic, queue_id, properties, sys_flag=sys_flag, now_ms=now_ms, rules=rules)


def test_a_plain_message_stays_where_it_was_sent():
    props = sent(color="red")
    r = routed(props)
    assert (r.topic, r.queue_id, r.properties, r.kind, r.due_ms) == ("Orders", 2, props, "plain", None)


@pytest.mark.parametrize(("level", "stored_level"), [(1, 1), (2, 2), (3, 3), (4, 3), (18, 3)])
def test_a_delay_level_goes_to_the_schedule_topic_queue_level_minus_one_clamped(level, stored_level):
    r = routed(sent(DELAY=str(level)))
    assert (r.topic, r.queue_id, r.kind, r.level) == (SCHEDULE_TOPIC, stored_level - 1, "delay", stored_level)
    props = dict(r.properties)
    assert props["DELAY"] == str(stored_level)
    assert (props["REAL_TOPIC"], props["REAL_QID"]) == ("Orders", "2")
    assert r.due_ms == NOW + 1000 * stored_level  # the schedule topic's CQ tagsCode
    assert r.properties == hashmap_order(r.properties)  # storage order


def test_delay_level_zero_or_negative_is_a_plain_message():
    for text in ("0", "-1"):
        r = routed(sent(DELAY=text))
        assert (r.topic, r.kind, dict(r.properties)["DELAY"]) == ("Orders", "plain", text)


def test_an_unparsable_delay_is_refused():
    with pytest.raises(ScheduleRefused, match="DELAY is not an integer"):
        routed(sent(DELAY="soon"))


def test_a_delay_level_wins_over_timer_properties_which_are_dropped():
    r = routed(sent(DELAY="1", TIMER_DELAY_SEC="2", TIMER_DELAY_MS="5", TIMER_DELIVER_MS=str(NOW + 9000)))
    props = dict(r.properties)
    assert (r.topic, r.kind) == (SCHEDULE_TOPIC, "delay")
    assert not {"TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_DELIVER_MS", "TIMER_OUT_MS"} & set(props)


@pytest.mark.parametrize(
    ("timer", "out"),
    [
        ({"TIMER_DELAY_SEC": "2"}, 1795687202000),  # now + 2000 = ...202123, floored
        ({"TIMER_DELAY_MS": "2500"}, 1795687202000),  # ...202623, floored
        ({"TIMER_DELIVER_MS": "1795687203500"}, 1795687203000),
        ({"TIMER_DELIVER_MS": "1795687203000"}, 1795687202000),  # on a whole second: one precision earlier
        ({"TIMER_DELAY_SEC": "1", "TIMER_DELAY_MS": "99999"}, 1795687201000),  # seconds are read first
    ],
)
def test_a_timer_goes_to_the_timer_topic_with_timer_out_ms_rounded_as_the_broker(timer, out):
    r = routed(sent(**timer))
    props = dict(r.properties)
    assert (r.topic, r.queue_id, r.kind) == (TIMER_TOPIC, 0, "timer")
    assert props["TIMER_OUT_MS"] == str(out)
    assert (props["REAL_TOPIC"], props["REAL_QID"]) == ("Orders", "2")
    assert {k: props[k] for k in timer} == timer  # the timer properties stay
    assert r.due_ms == out + 1000  # the wheel reads the slot once its whole second has passed


def test_a_timer_not_in_the_future_is_stored_where_it_was_sent():
    for timer in ({"TIMER_DELIVER_MS": str(NOW)}, {"TIMER_DELAY_SEC": "0"}, {"TIMER_DELAY_MS": "-5"}):
        props = sent(**timer)
        r = routed(props)
        assert (r.topic, r.queue_id, r.kind, r.properties) == ("Orders", 2, "plain", props)


def test_refused_timers_say_why():
    with pytest.raises(ScheduleRefused, match="over the max delay 259200000 ms"):
        routed(sent(TIMER_DELAY_SEC="259201"))
    routed(sent(TIMER_DELAY_SEC="259200"))  # at the max: accepted
    with pytest.raises(ScheduleRefused, match="TIMER_DELAY_MS is not an integer: 'soon'"):
        routed(sent(TIMER_DELAY_MS="soon"))
    with pytest.raises(ScheduleRefused, match="a timer delete not in the future"):
        routed(sent(TIMER_DELIVER_MS="5", TIMER_DEL_UNIQKEY="x"))


def test_prepared_messages_and_timer_topic_records_are_not_re_routed():
    props = sent(DELAY="2")
    assert routed(props, sys_flag=TRANSACTION_PREPARED_TYPE).topic == "Orders"
    already = sent(TIMER_DELAY_SEC="2", TIMER_OUT_MS="1795687202000")
    assert routed(already).kind == "plain"
    # a record on the timer topic skips the timer rules (a rolled timer) but not the delay rule
    assert routed(sent(TIMER_DELAY_SEC="2"), topic=TIMER_TOPIC, queue_id=0).kind == "plain"


def test_java_long_parses_as_java_does():
    assert java_long("+12") == 12 and java_long("-0") == 0 and java_long("007") == 7
    for bad in ("", " 1", "1 ", "1_000", "1.0", "0x10", "9223372036854775808"):
        with pytest.raises(ValueError):
            java_long(bad)
    assert java_long("2147483647", bits=32) == 2147483647
    with pytest.raises(ValueError):
        java_long("2147483648", bits=32)


# Recorded from RocketMQ 5.3.3 (tests/interop/test_schedule_from_rocketmq.py's broker, messageDelayLevel
# "1s 2s 3s"): a level-1 send and a TIMER_DELAY_SEC=2 send, their re-routed records and deliveries.
UNIQ = "FD00000000000000000000000000000211994E0E2F2A7BDFFD000001"
BROKER_DELAY_RECORD = (
    b"MSG_REGION\x01DefaultRegion\x02UNIQ_KEY\x01" + UNIQ.encode() + b"\x02CLUSTER\x01DefaultCluster\x02"
    b"DELAY\x011\x02TAGS\x01TagB\x02KEYS\x01delay-1\x02WAIT\x01true\x02TRACE_ON\x01true\x02"
    b"REAL_TOPIC\x01ScheduledOrders\x02REAL_QID\x011\x02"
)
TIMER_UNIQ = "FD00000000000000000000000000000211994E0E2F2A7BDFFD1A0006"
BROKER_TIMER_RECORD = (
    b"TIMER_DELAY_SEC\x012\x02TIMER_OUT_MS\x011795569478000\x02MSG_REGION\x01DefaultRegion\x02"
    b"UNIQ_KEY\x01" + TIMER_UNIQ.encode() + b"\x02CLUSTER\x01DefaultCluster\x02TAGS\x01TagT\x02"
    b"KEYS\x01timer-sec\x02WAIT\x01true\x02TRACE_ON\x01true\x02REAL_TOPIC\x01TimedOrders\x02REAL_QID\x010\x02"
)
BROKER_TIMER_DELIVERY = (
    b"TIMER_DELAY_SEC\x012\x02TIMER_OUT_MS\x011795569478000\x02MSG_REGION\x01DefaultRegion\x02"
    b"UNIQ_KEY\x01" + TIMER_UNIQ.encode() + b"\x02CLUSTER\x01DefaultCluster\x02TIMER_ENQUEUE_MS\x011795569476000\x02"
    b"TAGS\x01TagT\x02KEYS\x01timer-sec\x02WAIT\x01true\x02TRACE_ON\x01true\x02"
    b"TIMER_DEQUEUE_MS\x011795569479000\x02REAL_TOPIC\x01TimedOrders\x02REAL_QID\x010\x02"
)  # the broker wrote its wall clock at dequeue, 1795569479025; a rebuild writes the due time


def client_sent(uniq: str, *, keys: str, tags: str, **user: str) -> list[tuple[str, str]]:
    user.update(WAIT="true", MSG_REGION="DefaultRegion", TRACE_ON="true")
    return broker_properties(user, keys=keys, tags=tags, uniq_key=uniq, cluster_name="DefaultCluster")


def test_a_delay_record_and_its_delivery_match_the_broker_byte_for_byte():
    r = route("ScheduledOrders", 1, client_sent(UNIQ, keys="delay-1", tags="TagB", DELAY="1"), sys_flag=0,
              now_ms=1795569476871, rules=RULES)  # fmt: skip
    assert (r.topic, r.queue_id, r.due_ms) == (SCHEDULE_TOPIC, 0, 1795569477871)  # the broker's CQ tagsCode
    assert serialize_properties(r.properties) == BROKER_DELAY_RECORD
    d = delivery(r.topic, r.properties, store_timestamp=1795569476871, due_ms=r.due_ms, rules=RULES)
    assert (d.topic, d.queue_id) == ("ScheduledOrders", 1)
    assert serialize_properties(d.properties) == BROKER_DELAY_RECORD  # DELAY, REAL_TOPIC, REAL_QID stay


def test_a_timer_record_and_its_delivery_match_the_broker_byte_for_byte():
    r = route("TimedOrders", 0, client_sent(TIMER_UNIQ, keys="timer-sec", tags="TagT", TIMER_DELAY_SEC="2"),
              sys_flag=0, now_ms=1795569476892, rules=RULES)  # fmt: skip
    assert (r.topic, r.queue_id, r.due_ms) == (TIMER_TOPIC, 0, 1795569479000)
    assert serialize_properties(r.properties) == BROKER_TIMER_RECORD
    d = delivery(r.topic, r.properties, store_timestamp=1795569476892, due_ms=r.due_ms, rules=RULES)
    assert (d.topic, d.queue_id) == ("TimedOrders", 0)
    assert serialize_properties(d.properties) == BROKER_TIMER_DELIVERY


def test_only_schedule_and_timer_records_have_deliveries():
    with pytest.raises(ValueError, match="holds no scheduled messages"):
        delivery("Orders", sent(REAL_TOPIC="a", REAL_QID="0"), store_timestamp=NOW, due_ms=NOW, rules=RULES)


def test_due_time_read_back_from_the_stored_record_is_the_one_route_gave():
    """due_ms of what route stored (delay levels, a clamped level, timers in both forms) is Routed.due_ms."""
    for props in (
        sent(DELAY="2"),
        sent(DELAY="9"),
        sent(TIMER_DELAY_MS="4500"),
        sent(TIMER_DELIVER_MS=str(NOW + 7000)),
    ):
        r = routed(props)
        assert r.kind != "plain" and due_ms(r.topic, dict(r.properties), NOW, RULES) == r.due_ms
    real = {"REAL_TOPIC": "Orders", "REAL_QID": "1"}
    assert due_ms(SCHEDULE_TOPIC, {"DELAY": "3", **real}, 1000, RULES) == 4000
    minute = ScheduleRules.of(message_delay_level="1m", timer_precision_ms=1, timer_max_delay_sec=1)
    assert due_ms(SCHEDULE_TOPIC, {"DELAY": "1", **real}, 1000, minute) == 61_000
    assert due_ms(TIMER_TOPIC, {"TIMER_OUT_MS": "5000", **real}, 1000, RULES) == 6000


@pytest.mark.parametrize(
    ("topic", "properties"),
    [
        ("Orders", {"DELAY": "3"}),  # not re-routed: delivered at once, never by the schedule
        (SCHEDULE_TOPIC, {}),
        (SCHEDULE_TOPIC, {"DELAY": "0"}),
        (SCHEDULE_TOPIC, {"DELAY": "-1"}),
        (SCHEDULE_TOPIC, {"DELAY": " 3"}),  # Integer.parseInt refuses it
        (TIMER_TOPIC, {"TIMER_DELIVER_MS": "5000"}),
        (TIMER_TOPIC, {"TIMER_OUT_MS": "soon"}),
    ],
)
def test_no_due_time_for_a_record_the_broker_never_delivers(topic, properties):
    assert due_ms(topic, {**properties, "REAL_TOPIC": "Orders", "REAL_QID": "1"}, 1000, RULES) is None
    assert due_ms(SCHEDULE_TOPIC, {"DELAY": "3", "REAL_TOPIC": "Orders"}, 1000, RULES) is None  # no real queue
