"""A real RocketMQ 5.3.3 broker started on an ``export-store`` directory with scheduled messages in it.

The lake is sent delay-level and timer messages; its ingest delivers those due by its clock and
leaves the others pending, all due before the broker starts. tests/interop/java/BrokerHarness.java
starts the broker on the export (``messageDelayLevel`` ``1s 2s 3s``), waits until the real topics
hold what it should deliver and 3 s longer for anything delivered twice, then a consumer reads both
topics from the first offset.

Delay levels go on from ``config/delayOffset.json``: exactly the pending ones are delivered. The timer
wheel goes on from the queue offset in ``config/timercheck`` (the first pending timer's): a timer the
lake delivered but stored after a pending one is delivered again (without the file the broker takes
the whole timer queue again and delivers every timer a second time).
"""

from __future__ import annotations

import json
import struct
import time
from collections import Counter
from pathlib import Path

import pytest

from rmqlake.formats.store import parse_delay_offsets
from rmqlake.steps.ingest import ingest
from rmqlake.steps.reput import reput
from rmqlake.steps.store import export_store
from tests.interop import data
from tests.interop.conftest import lake_settings
from tests.interop.harness import run_java

pytestmark = [pytest.mark.interop, pytest.mark.spark]
DELAY_LEVELS = "1s 2s 3s"
DELAYED, TIMED = "DelayedOrders", "TimedOrders"


def line(topic: str, queue: int, at: int, key: str, **fields) -> dict:
    return {"topic": topic, "queueId": queue, "body": f"body of {key}", "bornTimestamp": at - 5,
            "storeTimestamp": at, "uniqKey": key, **fields}  # fmt: skip


@pytest.fixture(scope="module")
def served(spark, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("schedule-export")
    t0 = (int(time.time() * 1000) - 600_000) // 1000 * 1000  # ten minutes ago: everything is due at the broker
    lines = [
        line(DELAYED, 0, t0, "plain-1"),
        line(DELAYED, 1, t0 + 100, "delay-delivered", delayLevel=1),  # due t0 + 1100
        line(TIMED, 0, t0 + 200, "timer-delivered", deliverTimeMs=t0 + 2000),  # due t0 + 2000
        line(TIMED, 1, t0 + 1500, "timer-pending", deliverTimeMs=t0 + 5000),  # due t0 + 5000
        line(TIMED, 2, t0 + 1600, "timer-delivered-after", deliverTimeMs=t0 + 3000),  # stored after the pending one
        line(DELAYED, 2, t0 + 2500, "delay-pending-1", delayLevel=1),  # due t0 + 3500
        line(DELAYED, 3, t0 + 2600, "delay-pending-3", delayLevel=3),  # due t0 + 5600
        line(DELAYED, 0, t0 + 3000, "plain-2"),  # the lake's clock
    ]
    log = root / "in" / "lines.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps(item) + "\n" for item in lines))
    settings = lake_settings(root / "lake", f"broker.message_delay_level={DELAY_LEVELS}")
    assert ingest(spark, settings, input_path=str(log))["rejected"] == 0
    reput(spark, settings)
    exported = export_store(spark, settings, out=str(root / "store"))
    store = Path(exported["out"])
    files = {
        "delay_offsets": parse_delay_offsets((store / "config" / "delayOffset.json").read_text()),
        "timercheck": struct.unpack_from(">qqqq", (store / "config" / "timercheck").read_bytes()),
    }
    spec = {
        "store": str(store),
        "work": str(root / "work"),
        "cluster": data.CLUSTER,
        "timeoutSeconds": 60,
        "commitlogSegmentSize": data.SEGMENT,
        "cqUnitsPerFile": data.UNITS,
        "indexSlots": data.SLOTS,
        "indexMaxEntries": data.ENTRIES,
        "messageDelayLevel": DELAY_LEVELS,
        "timerLogFileSize": 1 << 20,
        "expectMessages": {DELAYED: 5, TIMED: 4},
        "settleMillis": 3000,  # delay levels of 1-3 s and a timer wheel of 1 s: anything else would show by then
        "haltAfterAnswer": True,
        "groups": [{"group": "cg_schedule", "topics": [DELAYED, TIMED], "fromFirst": True,
                    "autoCreateSubscriptionGroup": True, "maxSeconds": 15}],
    }  # fmt: skip
    (root / "spec.json").write_text(json.dumps(spec))
    answer = run_java("BrokerHarness", str(root / "spec.json"), timeout=90)
    assert answer["delivered"], answer  # the broker delivered at least what is pending
    group = answer["groups"][0]
    assert group["complete"], group
    return {"export": exported, "files": files, "messages": group["messages"], "clock": t0 + 3000}


def received(served: dict, topic: str) -> Counter:
    return Counter(m["msgId"] for m in served["messages"] if m["topic"] == topic)


def test_the_export_tells_the_broker_where_delivery_goes_on(served):
    assert served["files"]["delay_offsets"] == {1: 1, 3: 0}  # level 1: offset 0 delivered, 1 pending; level 3: 0
    # lastReadTimeMs, lastTimerLogFlushPos, lastTimerQueueOffset, masterTimerQueueOffset: the first pending timer
    assert served["files"]["timercheck"] == (0, 0, 1, 1)
    assert (served["export"]["timer_queue_offset"], served["export"]["timer_redelivered"]) == (1, 1)


def test_pending_delay_messages_are_delivered_once_and_delivered_ones_not_again(served):
    assert received(served, DELAYED) == Counter(["plain-1", "plain-2", "delay-delivered", "delay-pending-1",
                                                 "delay-pending-3"])  # fmt: skip
    by_key = {m["msgId"]: m for m in served["messages"] if m["topic"] == DELAYED}
    assert (by_key["delay-pending-1"]["queueId"], by_key["delay-pending-3"]["queueId"]) == (2, 3)  # REAL_QID
    assert by_key["delay-pending-1"]["queueOffset"] == 0 and by_key["delay-pending-3"]["queueOffset"] == 0
    assert min(by_key[k]["storeTimestamp"] for k in ("delay-pending-1", "delay-pending-3")) > served["clock"]


def test_pending_timers_are_delivered_once_and_delivered_ones_stored_after_them_again(served):
    """The broker's wheel takes the timer queue in order from ``config/timercheck``'s offset (the first pending
    timer): a timer the lake delivered but stored after a pending one is delivered a second time."""
    assert received(served, TIMED) == Counter({"timer-delivered": 1, "timer-pending": 1, "timer-delivered-after": 2})
