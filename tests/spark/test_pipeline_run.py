"""`rmqlake pipeline run`: specs run locally, in order, with the run's dates; a failure stops downstream."""

from __future__ import annotations

import json

import pytest

from rmqlake.cli import main
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from tests.conftest import CONF, REPO

pytestmark = pytest.mark.spark
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]


def run(lake, landing, logical_date, capsys) -> tuple[int, list[dict]]:
    capsys.readouterr()
    code = main(
        [
            "pipeline",
            "run",
            "ingest_hourly",
            "--logical-date",
            logical_date,
            "--pipelines",
            str(REPO / "pipelines"),
            "--param",
            f"landing={landing}",
            "--conf",
            str(CONF),
            "--env",
            "test",
            "--lake",
            str(lake),
            "--json",
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"task"')]
    return code, lines


def test_hours_run_in_order_and_a_missing_hour_stops_downstream(tmp_path, capsys):
    generate(tmp_path / "in", messages=300, topics=TOPICS, hours=2, seed=8)
    landing = tmp_path / "in" / "landing"
    lake = tmp_path / "lake"
    code, tasks = run(lake, landing, "2026-11-21T00:00:00Z", capsys)
    assert code == 0 and [(t["task"], t["state"]) for t in tasks] == [
        ("ingest", "success"),
        ("reput", "success"),
        ("compact", "success"),
        ("quality", "success"),
    ]
    state = Lake(str(lake)).state()
    first_hour = state["runs"]["ingest"]
    assert first_hour["at"] == "2026-11-21T01:00:00+00:00"  # --now is the end of the hour's data interval
    assert state["reput"]["dispatched_offset"] == state["commitlog"]["next_offset"]
    assert state["compaction"]["positions"]["UserProfile"] == state["commitlog"]["next_offset"]

    before = {t: Lake(str(lake)).version(t) for t in ("commitlog", "consumequeue", "compaction_log")}
    code, tasks = run(lake, landing, "2026-11-21T05:00:00Z", capsys)  # no landing folder for that hour
    assert code == 1 and [(t["task"], t["state"]) for t in tasks] == [
        ("ingest", "failed"),
        ("reput", "upstream_failed"),
        ("compact", "upstream_failed"),
        ("quality", "upstream_failed"),
    ]
    assert {t: Lake(str(lake)).version(t) for t in before} == before  # the lake is as it was

    code, _ = run(lake, landing, "2026-11-21T01:00:00Z", capsys)
    assert code == 0
    manifest = json.loads((tmp_path / "in" / "MANIFEST.json").read_text())
    total = Lake(str(lake)).state()["commitlog"]["topics"]
    assert sum(t["messages"] for t in total.values()) == manifest["messages"]
