"""export-store and import-store of scheduled messages: ``config/delayOffset.json``, ``config/timercheck`` and the
lake's schedule state.

The first run sends delay-level and timer messages; ingest delivers those due by its clock and leaves two
delay messages pending. The second run stores what only a broker's store holds: a timer record with its
delivery although due after an undelivered one (a broker stopped while a level's thread lagged).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

import pytest

from rmqlake.formats.store import delay_offsets_json, parse_delay_offsets
from rmqlake.lake import Lake
from rmqlake.lake.state import PendingGroup, PendingKey
from rmqlake.steps.ingest import ingest
from rmqlake.steps.store import export_store, import_store
from tests.conftest import make_settings

pytestmark = pytest.mark.spark
T0 = 1795687200000
SETTINGS = ["broker.message_delay_level=1s 2s 3s", "store.commitlog_segment_size=16384"]
TIMER = "rmq_sys_wheel_timer"


def line(topic: str, queue: int, at: int, key: str, **fields) -> dict:
    return {"topic": topic, "queueId": queue, "body": f"body of {key}", "bornTimestamp": at - 5,
            "storeTimestamp": at, "uniqKey": key, **fields}  # fmt: skip


FIRST = [
    line("Orders", 0, T0, "plain-1"),
    line("Orders", 1, T0 + 100, "A", delayLevel=1),  # due T0 + 1100: delivered
    line("Timed", 0, T0 + 200, "T1", deliverTimeMs=T0 + 2000),  # TIMER_OUT_MS T0 + 1000, due T0 + 2000: delivered
    line("Orders", 1, T0 + 2500, "C", delayLevel=1),  # due T0 + 3500: pending
    line("Orders", 1, T0 + 2600, "B", delayLevel=3),  # due T0 + 5600: pending
    line("Orders", 0, T0 + 3000, "plain-2"),  # the run's clock
]
# a timer record due T0 + 10000 and a delivery of it, as a broker's store may hold them
D_TIMER = {"TIMER_OUT_MS": str(T0 + 9000), "REAL_TOPIC": "Timed", "REAL_QID": "1"}
SECOND = [
    line(TIMER, 0, T0 + 4000, "D", properties=D_TIMER),
    line("Timed", 1, T0 + 4100, "D", properties={**D_TIMER, "TIMER_ENQUEUE_MS": str(T0 + 4000)}),  # C comes due
]


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in lines))
    return path


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("schedule-store")
    settings = make_settings(root / "lake", *SETTINGS)
    assert ingest(spark, settings, input_path=str(write_lines(root / "in1" / "a.jsonl", FIRST)))["rejected"] == 0
    first_seq = Lake.from_settings(settings).ledger().seq
    assert ingest(spark, settings, input_path=str(write_lines(root / "in2" / "b.jsonl", SECOND)))["rejected"] == 0
    then = export_store(spark, settings, out=str(root / "then"), as_of=str(first_seq))
    now = export_store(spark, settings, out=str(root / "now"))
    return {"root": root, "settings": settings, "then": Path(then["out"]), "now": Path(now["out"]), "metrics": now}


def offsets_of(settings) -> dict[str, int]:
    rows = Lake.from_settings(settings).read_arrow("commitlog", columns=["uniq_key", "physical_offset"]).to_pylist()
    return {r["uniq_key"]: r["physical_offset"] for r in rows}


def test_export_writes_the_delay_offsets_as_the_broker_does(lake):
    text = (lake["then"] / "config" / "delayOffset.json").read_text()
    # level 1: A delivered (queue offset 0), C not (1); level 3: B not (0); level 2 has no queue
    assert parse_delay_offsets(text) == {1: 1, 3: 0}
    stamp = json.loads(text.replace("{1:1,3:0", '{"1":1,"3":0'))["dataVersion"]
    assert text == delay_offsets_json({1: 1, 3: 0}, data_version=stamp["counter"], timestamp=stamp["timestamp"])
    assert '"offsetTable":{1:1,3:0\n\t}' in text  # fastjson's bare integer keys
    # no timer pending then: a broker's timer wheel starts at the timer queue's head (T1 at 0 is delivered)
    checkpoint = (lake["then"] / "config" / "timercheck").read_bytes()
    assert len(checkpoint) == 4096 and struct.unpack_from(">qqqq", checkpoint) == (0, 0, 1, 1)

    # now C is delivered too; D (timer queue offset 1) is pending in the lake
    assert parse_delay_offsets((lake["now"] / "config" / "delayOffset.json").read_text()) == {1: 2, 3: 0}
    assert lake["metrics"]["delay_offsets"] == {"1": 2, "3": 0}
    checkpoint = (lake["now"] / "config" / "timercheck").read_bytes()
    assert struct.unpack_from(">qqqq", checkpoint) == (0, 0, 1, 1)
    assert (lake["metrics"]["timer_queue_offset"], lake["metrics"]["timer_redelivered"]) == (1, 0)


def test_import_makes_the_next_ingest_deliver_what_the_broker_had_not(spark, lake):
    settings = make_settings(lake["root"] / "imported-then", *SETTINGS)
    metrics = import_store(spark, settings, store_dir=str(lake["then"]))
    assert (metrics["schedule_delivered"], metrics["schedule_pending"], metrics["schedule_redelivered"]) == (2, 2, 0)
    assert metrics["delay_offsets_file"] is True and metrics["delay_offsets_differing"] == []
    state = Lake.from_settings(settings).state().schedule
    assert state.delivered_until == T0 + 3000  # the store's clock: after A and T1 were due, before C
    assert state.pending == {
        PendingKey(1, "Orders"): PendingGroup(1, T0 + 3500),
        PendingKey(3, "Orders"): PendingGroup(1, T0 + 5600),
    }
    assert state.pending_from == offsets_of(settings)["C"]
    assert state.delay_offsets == {1: 1, 3: 0}

    # the next ingest delivers C and B when they come due, and A and T1 (the broker delivered them) never again
    later = write_lines(lake["root"] / "in3" / "c.jsonl", [line("Orders", 0, T0 + 6000, "plain-3")])
    assert ingest(spark, settings, input_path=str(later))["rejected"] == 0
    rows = Lake.from_settings(settings).read_arrow("commitlog", columns=["uniq_key", "topic"]).to_pylist()
    deliveries = Counter(r["uniq_key"] for r in rows if r["topic"] in ("Orders", "Timed"))
    assert {key: deliveries[key] for key in ("A", "T1", "C", "B")} == {"A": 1, "T1": 1, "C": 1, "B": 1}
    assert Lake.from_settings(settings).state().schedule.pending == {}

    # its export: every level delivered up to its queue's head
    again = export_store(spark, settings, out=str(lake["root"] / "imported-then-export"))
    assert parse_delay_offsets((Path(again["out"]) / "config" / "delayOffset.json").read_text()) == {1: 2, 3: 1}


def test_a_delivery_due_after_an_undelivered_one_is_delivered_again_rather_than_one_lost(spark, lake):
    store = lake["now"]
    # a broker that stopped before it persisted level 1's progress: its file is behind the records
    (store / "config" / "delayOffset.json").write_text('{"offsetTable":{"1":0,"3":0}}')
    settings = make_settings(lake["root"] / "imported-now", *SETTINGS)
    metrics = import_store(spark, settings, store_dir=str(store))
    assert metrics["delay_offsets_differing"] == [1]
    assert (metrics["schedule_delivered"], metrics["schedule_redelivered"]) == (4, 1)
    state = Lake.from_settings(settings).state().schedule
    assert state.delivered_until == T0 + 5599  # just before B's due: D (due T0 + 10000) is pending again
    assert state.pending == {
        PendingKey(0, "Timed"): PendingGroup(1, T0 + 10000),
        PendingKey(3, "Orders"): PendingGroup(1, T0 + 5600),
    }
    assert state.delay_offsets == {1: 2, 3: 0}  # the records, not the file
