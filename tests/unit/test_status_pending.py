"""``rmqlake status`` lists the delay-level and timer deliveries not yet due (ledger state only, no Spark)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import rmqlake
from rmqlake import cli
from rmqlake.config import Settings
from rmqlake.lake.state import PendingGroup, PendingKey, ScheduleState
from rmqlake.steps.status import status
from tests.conftest import CONF
from tests.schedule_states import commit_schedule_state

T0 = 1_764_000_000_000  # 2025-11-24T16:00:00Z
SCHEDULE = ScheduleState(
    delivered_until=T0,
    pending_from=4096,
    pending={
        PendingKey(0, "OrderEvents"): PendingGroup(count=2, next_due=T0 + 61_000),
        PendingKey(3, "UserProfile"): PendingGroup(count=1, next_due=T0 + 9_000),
        PendingKey(3, "OrderEvents"): PendingGroup(count=4, next_due=T0 + 1_500),
    },
    delay_offsets={3: 7},
)


def settings_of(root) -> Settings:
    return Settings.model_validate({"lake": {"root": str(root)}})


def run_status(root, *options: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["status", "--conf", str(CONF), "--lake", str(root), *options]) == 0
    return out.getvalue()


def test_status_lists_pending_deliveries_per_level_and_real_topic(tmp_path):
    root = tmp_path / "lake"
    commit_schedule_state(root, SCHEDULE)
    report = status(settings_of(root))
    assert report["pending"] == [
        {"schedule": "delay", "level": 3, "topic": "OrderEvents", "count": 4, "next_due": "2025-11-24T16:00:01.500Z"},
        {"schedule": "delay", "level": 3, "topic": "UserProfile", "count": 1, "next_due": "2025-11-24T16:00:09.000Z"},
        {
            "schedule": "timer",
            "level": None,
            "topic": "OrderEvents",
            "count": 2,
            "next_due": "2025-11-24T16:01:01.000Z",
        },
    ]
    store = report["store"]
    assert store["pending_deliveries"] == 7
    assert store["delivered_until"] == "2025-11-24T16:00:00.000Z"
    assert store["next_delivery"] == "2025-11-24T16:00:01.500Z"

    lines = [json.loads(line) for line in run_status(root, "--json").splitlines()]
    assert [{k: v for k, v in r.items() if k != "kind"} for r in lines if r["kind"] == "pending"] == report["pending"]
    (cli_store,) = [r for r in lines if r["kind"] == "store"]
    assert cli_store["pending_deliveries"] == 7 and cli_store["delivered_until"] == store["delivered_until"]

    text = run_status(root)
    assert "pending deliveries" in text and "2025-11-24T16:01:01.000Z" in text and "timer" in text
    tables = rmqlake.open(str(root), conf=CONF).status()
    assert tables["pending"].to_pylist() == report["pending"]


def test_without_a_schedule_section_nothing_is_pending(tmp_path):
    root = tmp_path / "lake"
    commit_schedule_state(root, None)
    report = status(settings_of(root))
    assert report["pending"] == []
    assert {k: report["store"][k] for k in ("pending_deliveries", "delivered_until", "next_delivery")} == {
        "pending_deliveries": 0,
        "delivered_until": None,
        "next_delivery": None,
    }
    assert "pending deliveries" not in run_status(root)
    assert not [line for line in run_status(root, "--json").splitlines() if json.loads(line)["kind"] == "pending"]
