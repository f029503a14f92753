"""A real broker's delay-level and timer handling, read back from its store: the truth rmqlake's rules must give.

tests/interop/schedule.py sends the messages (every delay level and a clamped one, timers in their three
forms, one due already, two refused, plain ones) to a real RocketMQ broker with ``messageDelayLevel``
``1s 2s 3s`` and waits until everything due is delivered. Then:

* each re-routed record is what :func:`rmqlake.formats.schedule.route` gives for the send at the
  record's store time: topic, queue, properties byte for byte (``REAL_TOPIC``, ``REAL_QID``,
  ``TIMER_OUT_MS``, the clamped ``DELAY``), and the ConsumeQueue tagsCode of a delay record is the
  due time the rules give;
* each delivery is on the real topic and queue, after the due time the rules give, with the
  schedule record's body, flag, sysFlag, born time and hosts, reconsume times;
* the same sends as a producer log (each with the broker's store time), ingested by rmqlake with the
  clock at the broker's last delivery and dispatched by reput, give the broker's commitlog records
  and ConsumeQueue units, and its delay offsets (what is compared exactly, and why the rest differs:
  the tests at the end).

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
from datetime import UTC, datetime

import pytest

from rmqlake.formats.consumequeue import tags_code
from rmqlake.formats.properties import broker_properties, parse_properties
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
from rmqlake.steps.ingest import ingest
from rmqlake.steps.reput import reput
from rmqlake.steps.store import import_store
from tests.interop import data, schedule
from tests.interop.conftest import lake_settings
from tests.view_checks import assert_records_decode_to_their_stored_columns

pytestmark = pytest.mark.interop
RULES = ScheduleRules.of(
    message_delay_level=schedule.DELAY_LEVELS,
    timer_precision_ms=schedule.TIMER_PRECISION_MS,
    timer_max_delay_sec=schedule.TIMER_MAX_DELAY_SEC,
)
DELIVERY_TOLERANCE_MS = 5000


@pytest.fixture(scope="module")
def broker(harness_runs) -> schedule.BrokerRun:
    run = harness_runs["schedule"].result(timeout=600)
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


def delay_offsets(broker: schedule.BrokerRun) -> dict[int, int]:
    """``config/delayOffset.json`` (written by fastjson: bare integer keys) as {level: next queue offset}."""
    text = (broker.store / "config" / "delayOffset.json").read_text()
    table = re.search(r'"offsetTable"\s*:\s*\{([^}]*)\}', text).group(1)
    return {int(level): int(offset) for level, offset in re.findall(r"(\d+)\s*:\s*(\d+)", table)}


def test_delay_offsets_hold_the_next_schedule_offset_per_level(broker):
    """The broker's delay offsets once every delay record is delivered."""
    offsets = delay_offsets(broker)
    records = [u for u in broker.units if u["topic"] == SCHEDULE_TOPIC]
    assert offsets == {queue + 1: sum(1 for u in records if u["queue_id"] == queue) for queue in range(3)}


# --- the same sends as a producer log, rebuilt by rmqlake -------------------------------------------------

# the record fields a rebuild must give exactly (store timestamps, physical offsets and properties below)
EXACT = ("topic", "queue_id", "queue_offset", "sys_flag", "flag", "body", "born_timestamp", "born_host",
         "store_host", "reconsume_times", "prepared_transaction_offset", "total_size")  # fmt: skip
# properties a broker sets from its wall clock on a timer's delivery
WHEEL_CLOCK = (TIMER_ENQUEUE_MS, TIMER_DEQUEUE_MS)


def identities(records: list[dict]) -> list[tuple[str, int]]:
    """Each record, in physical order, as (UNIQ_KEY, n): the n-th record of that key (0 sent, 1 its delivery)."""
    seen: dict[str, int] = {}
    out = []
    for record in records:
        key = record["properties"]["UNIQ_KEY"]
        out.append((key, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
    return out


def in_the_same_place(ours: list[dict], theirs: list[dict]) -> set[tuple[str, int]]:
    """The records up to the first place where the two physical orders differ."""
    same = set()
    for our, their in zip(identities(ours), identities(theirs), strict=False):
        if our != their:
            break
        same.add(our)
    return same


def lake_records(lake: Lake) -> list[dict]:
    """The lake's commitlog rows in physical order, shaped as :func:`schedule.commitlog_records` gives the broker's."""
    rows = sorted(lake.read_arrow("commitlog").to_pylist(), key=lambda r: r["physical_offset"])
    return [
        {**{k: row[k] for k in (*EXACT, "physical_offset", "store_timestamp")},
         "properties": parse_properties(row["properties_bytes"]), "raw_properties": row["properties_bytes"]}
        for row in rows
    ]  # fmt: skip


def timer_out_shift(ours: dict, theirs: dict) -> int:
    """How much later rmqlake's ``TIMER_OUT_MS`` is than the broker's: 0, or one precision step for a relative
    timer whose put-hook clock (a moment before the store time) was in the step before."""
    if TIMER_OUT_MS not in theirs["properties"]:
        return 0
    shift = int(ours["properties"][TIMER_OUT_MS]) - int(theirs["properties"][TIMER_OUT_MS])
    relative = {"TIMER_DELAY_SEC", "TIMER_DELAY_MS"} & set(theirs["properties"])
    assert shift == 0 or (relative and shift == RULES.timer_precision_ms), (ours, theirs)
    return shift


@pytest.fixture(scope="module")
def rebuilt(spark, broker, tmp_path_factory) -> dict:
    """The broker's sends as a producer log, ingested (clock: the broker's last delivery) and dispatched."""
    root = tmp_path_factory.mktemp("schedule-lake")
    log = schedule.write_producer_log(broker, root / "in" / "producer.jsonl")
    settings = lake_settings(
        root / "lake",
        f"broker.message_delay_level={schedule.DELAY_LEVELS}",
        f"store.timer_max_delay_sec={schedule.TIMER_MAX_DELAY_SEC}",
        f"store.timer_precision_ms={schedule.TIMER_PRECISION_MS}",
    )
    last_delivery = max(r["store_timestamp"] for r in broker.records)
    ingested = ingest(spark, settings, input_path=str(log), now=datetime.fromtimestamp(last_delivery / 1000, UTC))
    reput(spark, settings)
    lake = Lake.from_settings(settings, read_only=True)
    units = lake.read_arrow(
        "consumequeue", columns=["topic", "queue_id", "queue_offset", "commitlog_offset", "size", "tags_code"]
    ).to_pylist()
    return {"ingest": ingested, "lake": lake, "records": lake_records(lake), "units": units}


@pytest.mark.spark
def test_the_sends_as_a_producer_log_give_the_brokers_commitlog(broker, rebuilt):
    """rmqlake's ingest of the sends (each line with the store time, born time and hosts of the broker's record
    for it, and the client's ``MSG_REGION``/``TRACE_ON``/``WAIT``) against the broker's commitlog.

    Compared record by record, a record being (UNIQ_KEY, n): the sent record (n = 0) or its delivery (n = 1).
    What differs by construction:

    * nothing but the sends: the broker writes no record of its own here (the timer wheel keeps its
      bookkeeping in timerlog/timerwheel, the delay service in config/delayOffset.json), so both sides
      hold exactly the same records;
    * the broker's wall clock: a delivery's store time is when its delivery service ran, rmqlake's is
      the due time (the schedule record's tagsCode; ``TIMER_OUT_MS`` + the precision for a timer): the
      broker's is never earlier and at most :data:`DELIVERY_TOLERANCE_MS` later. A timer delivery's
      ``TIMER_ENQUEUE_MS`` (the wheel's write time, rmqlake: the store time floored) and
      ``TIMER_DEQUEUE_MS`` (the delivery time) likewise; a relative timer's ``TIMER_OUT_MS`` may be one
      precision step lower on the broker (see the module docstring). Every other property is equal
      byte for byte, in storage order, and so is the record size;
    * the order of deliveries: the broker appends them as its services come round, rmqlake in due
      order. Physical offsets are equal for every record up to the first place where the two orders
      differ: at least every sent record when the broker stored them all before its first delivery
      (the sends take about 100 ms, the shortest delay is 1 s); in a run without scheduling jitter,
      all records. Queue offsets are compared for all: the deliveries that share a queue here are of
      one level, delivered in send order by both.

    Every other field is equal: topic, queue id and offset, sysFlag, flag, body, born time and host,
    store host, reconsume times, prepared transaction offset, and the sent records' store times.
    """
    theirs, ours = broker.records, rebuilt["records"]
    their_ids, our_ids = identities(theirs), identities(ours)
    assert sorted(our_ids) == sorted(their_ids)
    reasons = [r["reason"] for r in rebuilt["lake"].read_arrow("rejected").to_pylist()]
    assert len(reasons) == sum(1 for s in broker.sends if s["expect"] == "refused")  # as the broker refused them
    assert all("timer message illegal" in reason for reason in reasons), reasons
    same_place = in_the_same_place(ours, theirs)
    sent = {i for i in their_ids if i[1] == 0}
    if all(n == 0 for _, n in their_ids[: len(sent)]):  # the broker stored every send before any delivery
        assert sent <= same_place, (our_ids, their_ids)
    mine, their_records = dict(zip(our_ids, ours, strict=True)), dict(zip(their_ids, theirs, strict=True))
    for identity, their in their_records.items():
        our = mine[identity]
        assert {k: our[k] for k in EXACT} == {k: their[k] for k in EXACT}, identity
        if identity in same_place:
            assert our["physical_offset"] == their["physical_offset"], identity
        shift = timer_out_shift(mine[(identity[0], 0)], their_records[(identity[0], 0)])
        if identity[1] == 0:
            assert our["store_timestamp"] == their["store_timestamp"], identity
        else:  # a delivery: stored when the broker's service ran, by rmqlake at the due time
            due = our["store_timestamp"] - shift
            assert 0 <= their["store_timestamp"] - due <= DELIVERY_TOLERANCE_MS, (identity, due, their)
        if shift == 0 and not set(WHEEL_CLOCK) & set(their["properties"]):
            assert our["raw_properties"] == their["raw_properties"], identity  # the stored bytes
            continue
        assert list(our["properties"]) == list(their["properties"]), identity  # names in storage order
        clock = {TIMER_OUT_MS: shift}
        for name, value in their["properties"].items():
            if name == TIMER_ENQUEUE_MS:
                assert 0 <= int(value) - int(our["properties"][name]) <= DELIVERY_TOLERANCE_MS, identity
            elif name == TIMER_DEQUEUE_MS:
                assert int(our["properties"][name]) == our["store_timestamp"], identity
                assert due <= int(value) <= their["store_timestamp"], identity
            elif name in clock:
                assert int(our["properties"][name]) - int(value) == clock[name], identity
            else:
                assert our["properties"][name] == value, (identity, name)


@pytest.mark.spark
def test_the_rebuild_has_nothing_pending_and_the_brokers_delay_offsets(broker, rebuilt):
    """With the clock at the broker's last delivery everything is delivered, and the delivery progress per level
    is the broker's ``config/delayOffset.json``."""
    state = rebuilt["lake"].state().schedule
    assert state.pending == {} and state.pending_from is None
    assert state.delivered_until == max(r["store_timestamp"] for r in broker.records)
    assert dict(state.delay_offsets) == delay_offsets(broker)


@pytest.mark.spark
def test_reput_of_the_rebuild_gives_the_brokers_consume_queues(broker, rebuilt):
    """Every ConsumeQueue unit, by the record it points at: the same topic, queue, queue offset, size and
    tagsCode (a ``SCHEDULE_TOPIC_XXXX`` unit's is the due time, which both compute from the store time);
    the same commitlog offset where the record's physical offset is the same (see the test above)."""

    def by_record(records: list[dict], units: list[dict]) -> dict:
        identity = dict(zip((r["physical_offset"] for r in records), identities(records), strict=True))
        return {identity[u["commitlog_offset"]]: u for u in units}

    ours, theirs = by_record(rebuilt["records"], rebuilt["units"]), by_record(broker.records, broker.units)
    assert len(rebuilt["units"]) == len(broker.units) == len(ours) == len(theirs)
    same_place = in_the_same_place(rebuilt["records"], broker.records)
    fields = ("topic", "queue_id", "queue_offset", "size", "tags_code")
    for identity, unit in theirs.items():
        assert {k: ours[identity][k] for k in fields} == {k: unit[k] for k in fields}, identity
        if identity in same_place:
            assert ours[identity]["commitlog_offset"] == unit["commitlog_offset"], identity


@pytest.mark.spark
def test_import_store_finds_every_scheduled_message_of_the_broker_delivered(spark, broker, tmp_path):
    """``import-store`` of the broker's store: every re-routed record has its delivery there (the delay one keeps
    DELAY/REAL_TOPIC/REAL_QID, the timer one REAL_TOPIC/REAL_QID and the wheel's stamps), so nothing is pending
    and the delay offsets the records give are those of the broker's ``delayOffset.json``."""
    settings = lake_settings(tmp_path / "lake", f"broker.message_delay_level={schedule.DELAY_LEVELS}")
    metrics = import_store(spark, settings, store_dir=str(broker.store))
    re_routed = sum(1 for s in broker.sends if s["expect"] in ("delay", "timer"))
    assert (metrics["schedule_delivered"], metrics["schedule_pending"]) == (re_routed, 0)
    assert (metrics["schedule_redelivered"], metrics["schedule_unreadable"]) == (0, 0)
    assert metrics["delay_offsets_file"] is True and metrics["delay_offsets_differing"] == []
    assert assert_records_decode_to_their_stored_columns(Lake.from_settings(settings)) > re_routed
    state = Lake.from_settings(settings).state().schedule
    assert (state.pending, state.pending_from) == ({}, None)
    assert set(state.delay_offsets) == {1, 2, 3}
