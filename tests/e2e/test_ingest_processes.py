"""Ingest as users run it, in separate processes: CLI errors, kill -9, concurrent runs.

`spark-submit jobs/ingest.py` runs in tests/airflow (SparkSubmitOperator), compared with `rmqlake pipeline run`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from rmqlake.lake import Lake
from rmqlake.timeutil import parse_timestamp
from tests.conftest import REPO
from tests.e2e import processes
from tests.e2e.processes import (
    BIN,
    TABLES,
    assert_same_tables,
    environment,
    in_process,
    ingest_args,
    rmqlake,
    table_rows,
    visible_rows,
)
from tests.reference import RefBroker, RefConfig

pytestmark = pytest.mark.slow
# the crash and concurrency cases under both Delta engines (delta-spark: the Delta Lake extension commits)
ENGINES = [
    pytest.param([], id="delta-rs"),
    pytest.param(["--set", "lake.engine=delta-spark"], id="delta-spark", marks=pytest.mark.delta_spark),
]


def test_configuration_error_exits_2_and_writes_nothing(tmp_path, landing):
    lake = tmp_path / "lake"
    result = rmqlake(*ingest_args(lake, landing), "--set", "retention.delete_when=25", check=False)
    assert result.returncode == 2
    assert "retention.delete_when = 25: must be hours of day 00-23" in result.stderr
    assert "Traceback" not in result.stderr
    assert not lake.exists()


def test_missing_input_exits_1_with_the_path(tmp_path):
    result = rmqlake("ingest", "--lake", str(tmp_path / "lake"), "--input", str(tmp_path / "nope*.jsonl"), check=False)
    assert result.returncode == 1
    assert f"no input file matches {tmp_path / 'nope*.jsonl'}" in result.stderr


def kill_while_writing(lake, args: list[str], staging) -> None:
    """1. kill -9 of the whole process group while the commitlog files are written (after the parse's scratch
    files): nothing is visible."""
    process = subprocess.Popen(
        [str(BIN / "rmqlake"), *args],
        cwd=REPO,
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 300
    writing = False
    while not writing and time.time() < deadline:
        writing = staging.exists() and any(staging.glob("*/segment=*"))
        time.sleep(0.05)
    assert writing, "the run never started writing commitlog files"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert all(visible_rows(lake, name) == 0 for name in TABLES)


@pytest.mark.parametrize("engine", ENGINES)
def test_runs_killed_during_the_write_before_and_after_the_ledger_commit_then_one_rerun(
    tmp_path, landing, clean_lake, engine
):
    """One lake, killed runs in a row, then a normal run: it equals a clean run (of the delta-rs engine).

    The kill -9 while the files are written runs under delta-rs only: the staged files are written and swept by
    the lake's storage whatever the engine, before any commit; the kills around the ledger and table commits,
    which the engine makes, and the roll-forward run under both."""
    lake = tmp_path / "lake"

    def ingest_args(lake, source):
        return [*processes.ingest_args(lake, source), *engine]

    staging = lake / "commitlog" / "_staging"
    killed = 0
    if not engine:  # delta-rs
        kill_while_writing(lake, ingest_args(lake, landing), staging)
        killed += 1

    # 2. killed just before the ledger commit: all its Parquet files are written, none is visible
    crashed = rmqlake(
        *ingest_args(lake, landing), env=environment(RMQLAKE_CRASH_AT="before-ledger-commit"), check=False
    )
    assert crashed.returncode == 137
    killed += 1
    assert len(list(staging.iterdir())) == killed  # every killed run left its staged files
    assert all(visible_rows(lake, name) == 0 for name in TABLES)

    # 3. killed after the ledger commit, between table commits: decided, rolled forward by the next run
    crashed = rmqlake(
        *ingest_args(lake, landing), env=environment(RMQLAKE_CRASH_AT="after-commit:commitlog"), check=False
    )
    assert crashed.returncode == 137
    status = json.loads(rmqlake("status", "--lake", str(lake), "--json").stdout.splitlines()[0])
    assert status["pending_tables"] and "commitlog" not in status["pending_tables"]

    again = json.loads(in_process(*ingest_args(lake, landing), "--json"))  # the next run
    assert again["status"] == "already_ingested"
    assert_same_tables(lake, clean_lake)


@pytest.mark.parametrize("engine", ENGINES)
def test_two_concurrent_ingests_commit_one_after_the_other(tmp_path, landing, java_oracle, engine):
    lake = tmp_path / "lake"

    def hour_end(hour) -> int:  # the clock the hourly DAG gives a run: its interval's end
        day, number = hour.parent.name[3:], int(hour.name[5:])
        return parse_timestamp(f"{day}T00:00:00Z") + (number + 1) * 3_600_000

    def ingest_args(lake, hour):
        return [*processes.ingest_args(lake, hour), "--now", str(hour_end(hour)), *engine]

    flag = tmp_path / "go"
    hours = sorted(landing.glob("dt=*/hour=*"))
    env = environment(RMQLAKE_HOLD_AT=f"before-ledger-commit:{flag}")
    runs = [
        subprocess.Popen(
            [str(BIN / "rmqlake"), *ingest_args(lake, hour), "--json"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for hour in hours
    ]
    deadline = time.time() + 300
    while len(list(tmp_path.glob("go.waiting.*"))) < 2 and time.time() < deadline:
        time.sleep(0.1)
    flag.touch()  # both runs hold just before their ledger commit, computed from the same ledger version
    outputs = [run.communicate(timeout=600) for run in runs]
    for number, (_, err) in enumerate(outputs):
        (tmp_path / f"run-{number}.stderr").write_text(err)  # kept by pytest for the last sessions
    assert [run.returncode for run in runs] == [0, 0], [err[err.find("Traceback") :][:4000] for _, err in outputs]
    assert sum("lost a commit race; recomputing on the new lake state" in err for _, err in outputs) == 1
    commitlog = table_rows(lake, "commitlog")
    first_batch = commitlog[0]["batch_id"]
    order = [hours[i] for i, (out, _) in enumerate(outputs) if json.loads(out)["batch_id"] == first_batch]
    order += [h for h in hours if h not in order]
    broker = RefBroker(
        RefConfig(
            segment_size=8192,
            queue_counts={"OrderEvents": 8, "UserProfile": 4, "Clickstream": 4},
            compaction_topics=frozenset({"UserProfile"}),
        ),
        java_oracle,
    )
    for hour in order:  # hour 0 first: hour 1's run delivers what was pending; hour 1 first: hour 0's does
        broker.ingest_files([str(p) for p in sorted(hour.glob("*.jsonl"))], now=hour_end(hour))
    assert [(r["physical_offset"], r["queue_id"], r["queue_offset"], r["source_line"]) for r in commitlog] == [
        (m["physical_offset"], m["queue_id"], m["queue_offset"], m["source_line"]) for m in broker.messages
    ]
    # the delayed messages: re-routed, delivered by whichever run's clock passed them, each once
    assert any(r["topic"] == "SCHEDULE_TOPIC_XXXX" for r in commitlog)
    assert sum(r["source_file"] == "(scheduled delivery)" for r in commitlog) == sum(
        m["source_file"] == "(scheduled delivery)" for m in broker.messages
    )
    assert (
        len(commitlog) == len(broker.messages)
        and len(broker.scheduled) == Lake(str(lake)).state().schedule.pending_count
    )
