"""The schedule.critical suite: delay-level and timer records against their deliveries and the lake state's
pending deliveries. Commitlog rows built in Spark (a few, the columns the suite reads), checked with GX."""

from __future__ import annotations

import json

import pytest

from rmqlake.lake.state import PendingGroup, PendingKey, ScheduleState
from rmqlake.quality.suites import SUITES
from rmqlake.steps.ingest import ingest
from rmqlake.steps.quality import _context, _validate, quality, spark_source
from rmqlake.steps.reput import reput
from rmqlake.steps.status import status
from rmqlake.timeutil import iso
from tests.conftest import make_settings

pytestmark = pytest.mark.spark
SUITE = SUITES["schedule.critical"]
COLUMNS = "physical_offset bigint, topic string, queue_id int, queue_offset bigint, sys_flag int, "
COLUMNS += "store_timestamp bigint, uniq_key string, properties map<string,string>"
SCHEDULE, TIMER = "SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"
CLOCK = 10_000  # the lake delivered up to here


def message(offset, topic, queue, queue_offset, stored, uniq, **properties):
    return (offset, topic, queue, queue_offset, 0, stored, uniq, {"UNIQ_KEY": uniq, **properties})


def real(topic, queue):
    return {"REAL_TOPIC": topic, "REAL_QID": str(queue)}


# With delay levels "1s 2s 3s": A (level 2, due 7000) and B (timer, due 8000 + 1000) are delivered; R was sent
# twice (one UNIQ_KEY, both due 7000: two deliveries); C (level 3, due 12500) and E (timer, due 21000) are pending.
ORIGINS = [
    message(100, SCHEDULE, 1, 0, 5000, "A", DELAY="2", **real("Orders", 0)),
    message(200, TIMER, 0, 0, 5000, "B", TIMER_OUT_MS="8000", **real("Orders", 1)),
    message(250, SCHEDULE, 0, 0, 6000, "R", DELAY="1", **real("Orders", 0)),
    message(260, SCHEDULE, 0, 1, 6000, "R", DELAY="1", **real("Orders", 0)),
    message(300, SCHEDULE, 2, 0, 9500, "C", DELAY="3", **real("Orders", 0)),
    message(350, TIMER, 0, 1, 9600, "E", TIMER_OUT_MS="20000", **real("Users", 0)),
]
DELIVERIES = [
    message(400, "Orders", 0, 1, 7000, "R", DELAY="1", **real("Orders", 0)),
    message(410, "Orders", 0, 2, 7000, "R", DELAY="1", **real("Orders", 0)),
    message(420, "Orders", 0, 3, 7000, "A", DELAY="2", **real("Orders", 0)),
    message(500, "Orders", 1, 0, 9000, "B", TIMER_DEQUEUE_MS="9000", **real("Orders", 1)),
]
PLAIN = [message(50, "Orders", 0, 0, 4000, "P"), message(600, "Orders", 1, 1, 9900, "A")]  # A again: another key
STATE = ScheduleState(
    delivered_until=CLOCK,
    pending_from=300,
    pending={PendingKey(3, "Orders"): PendingGroup(1, 12_500), PendingKey(0, "Users"): PendingGroup(1, 21_000)},
)


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return make_settings(tmp_path_factory.mktemp("schedule") / "lake", "broker.message_delay_level=1s 2s 3s")


def problems(spark, settings, tmp_path, rows, schedule) -> dict[str, list[str]]:
    """Failed expectations of the suite (column -> the values GX lists) and the frame's row count."""
    tables = {"commitlog": spark.createDataFrame(rows, COLUMNS), "schedule": schedule}
    frame = SUITE.frame(tables, settings).persist()
    context = _context(tmp_path / "gx")
    result = _validate(context, spark_source(context), SUITE, SUITE.expectations(settings), frame, settings)
    frame.unpersist()
    return {
        r.expectation_config.kwargs["column"]: sorted(r.result["partial_unexpected_list"])
        for r in result.results
        if not r.success
    }


def test_delivered_and_pending_records_agree_with_the_state(spark, settings, tmp_path):
    assert problems(spark, settings, tmp_path, ORIGINS + DELIVERIES + PLAIN, STATE) == {}


def test_a_missing_a_repeated_and_an_early_delivery_and_a_wrong_pending_count_are_named(spark, settings, tmp_path):
    deliveries = [d for d in DELIVERIES[1:] if d[6] != "A"]  # A is not delivered, R only once
    deliveries.append(message(510, "Orders", 1, 1, 9000, "B", TIMER_DEQUEUE_MS="9000", **real("Orders", 1)))
    deliveries.append(message(520, "Orders", 0, 4, 12_500, "C", DELAY="3", **real("Orders", 0)))  # C before due
    state = ScheduleState(
        delivered_until=CLOCK,
        pending_from=320,  # above C
        pending={PendingKey(3, "Orders"): PendingGroup(2, 12_500), PendingKey(0, "Users"): PendingGroup(1, 21_000)},
    )
    found = problems(spark, settings, tmp_path, ORIGINS + deliveries + PLAIN, state)
    assert found == {
        "due_delivery_problem": [
            # a repeated UNIQ_KEY is matched by count, and named by its first record
            f"{SCHEDULE} queue 0 offset 0 (uniq key R) and 1 more with that uniq key, real queue and due time, "
            "due at 7000 (delivered up to 10000): 1 delivery record(s) on Orders queue 0 stored at 7000, expected 2",
            f"{SCHEDULE} queue 1 offset 0 (uniq key A), due at 7000 (delivered up to 10000): 0 delivery record(s) "
            "on Orders queue 0 stored at 7000, expected 1",
            f"{TIMER} queue 0 offset 0 (uniq key B), due at 9000 (delivered up to 10000): 2 delivery record(s) "
            "on Orders queue 1 stored at 9000, expected 1",
        ],
        "early_delivery_problem": [
            f"{SCHEDULE} queue 2 offset 0 (uniq key C), due at 12500, after the clock the lake delivered up to "
            "(10000): 1 delivery record(s) on Orders queue 0 stored at 12500"
        ],
        "pending_problem": [
            "pending delay level 3 to Orders: 1 record(s) not yet due (first due 12500) where the lake state has 2 "
            "(first due 12500); pending delay level 3 to Orders: its first record not yet due, at physical offset "
            "300, is below the lake state's pending_from 320"
        ],
    }


def test_a_lake_without_schedule_records_passes_unless_its_state_has_pending_ones(spark, settings, tmp_path):
    assert problems(spark, settings, tmp_path, PLAIN, None) == {}
    assert problems(spark, settings, tmp_path, PLAIN, STATE)["pending_problem"] == [
        "pending delay level 3 to Orders: 0 record(s) not yet due (first due -) where the lake state has 1 "
        "(first due 12500)",
        "pending timers to Users: 0 record(s) not yet due (first due -) where the lake state has 1 (first due 21000)",
    ]


def test_a_lake_ingested_from_delay_and_timer_sends_passes(spark, tmp_path):
    """Sends with delayLevel, deliverTimeMs and TIMER_DELAY_SEC through ingest and reput: the schedule and
    consumequeue suites pass, and status lists what is not yet due; a later run delivers it, and they pass again."""
    start = 1_764_000_000_000
    lines = [
        {"topic": "OrderEvents", "body": "d1", "bornTimestamp": start, "delayLevel": 1},  # due +1 s: delivered
        {"topic": "OrderEvents", "body": "d9", "bornTimestamp": start + 100, "delayLevel": 9},  # level 3: pending
        {"topic": "OrderEvents", "body": "t", "bornTimestamp": start + 200, "deliverTimeMs": start + 1500},
        {"topic": "OrderEvents", "body": "t30", "bornTimestamp": start + 300, "properties": {"TIMER_DELAY_SEC": "30"}},
        {"topic": "OrderEvents", "body": "p", "bornTimestamp": start + 2500},  # the run's clock
    ]
    path = tmp_path / "in" / "sends.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    settings = make_settings(tmp_path / "lake", "broker.message_delay_level=1s 2s 3s", "quality.report=false")
    ingest(spark, settings, input_path=str(path))
    reput(spark, settings)
    metrics = quality(spark, settings, suites=["schedule", "consumequeue"])
    assert {s["suite"]: s["failed"] for s in metrics["suites"]} == {"schedule.critical": 0, "consumequeue.critical": 0}
    # one row per schedule record (two delivered, two pending) and per pending group
    assert next(s["rows"] for s in metrics["suites"] if s["suite"] == "schedule.critical") == 4 + 2
    assert [(p["schedule"], p["level"], p["count"], p["next_due"]) for p in status(settings)["pending"]] == [
        ("delay", 3, 1, iso(start + 100 + 3000)),
        ("timer", None, 1, iso(start + 30_000 + 1000)),  # TIMER_OUT_MS floored to the second, + the precision
    ]

    later = tmp_path / "in" / "later.jsonl"  # its clock passes both: the earlier run's records are delivered now
    later.write_text(json.dumps({"topic": "OrderEvents", "body": "q", "bornTimestamp": start + 40_000}) + "\n")
    ingest(spark, settings, input_path=str(later))
    metrics = quality(spark, settings, suites=["schedule"])
    assert [(s["suite"], s["failed"], s["rows"]) for s in metrics["suites"]] == [("schedule.critical", 0, 4)]
    assert status(settings)["pending"] == []
