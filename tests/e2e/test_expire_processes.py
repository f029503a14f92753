"""Expiry in separate processes: killed before and between its commits, then re-run with the same --now."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rmqlake.lake import Lake
from tests.e2e.processes import INDEX, SETTINGS, environment, in_process, rmqlake, rows, spark_submit

pytestmark = pytest.mark.slow
NOW = "2026-11-25T04:00:00Z"  # every sealed segment of the generated hours is past 72 h
EXPIRED_TABLES = ("commitlog", "segments", "consumequeue", "indexfile", "indexfile_header")


def expire_args(lake: Path, *extra: str) -> list[str]:
    return ["expire", "--lake", str(lake), "--now", NOW, *SETTINGS, *INDEX, *extra]


@pytest.fixture(scope="module")
def expired(spark, tmp_path_factory, reput_lake) -> Path:
    """One uninterrupted expiry (in this process: the reference the killed ones are compared with)."""
    lake = tmp_path_factory.mktemp("expire-clean") / "lake"
    shutil.copytree(reput_lake, lake)
    result = json.loads(in_process(*expire_args(lake), "--json"))
    assert result["segments_deleted"] == 10
    return lake


def test_killed_expiries_then_a_rerun_with_the_same_now_equal_one_run(tmp_path, reput_lake, expired):
    lake = tmp_path / "lake"
    shutil.copytree(reput_lake, lake)
    crashed = rmqlake(*expire_args(lake), env=environment(RMQLAKE_CRASH_AT="before-ledger-commit"), check=False)
    assert crashed.returncode == 137
    for name in EXPIRED_TABLES:
        assert rows(lake, name) == rows(reput_lake, name), name  # nothing of it is visible

    crashed = rmqlake(*expire_args(lake), env=environment(RMQLAKE_CRASH_AT="after-commit:commitlog"), check=False)
    assert crashed.returncode == 137
    # decided: the next run of any job completes it first
    status = json.loads(rmqlake("status", "--lake", str(lake), *SETTINGS, "--json").stdout.splitlines()[0])
    assert status["pending_tables"]
    # meanwhile a reader sees the lake before that run, never half of it
    reader = Lake(str(lake), read_only=True)
    for name in ("commitlog", "segments", "consumequeue"):
        offsets = sorted(map(str, reader.read_arrow(name).to_pylist()))
        assert offsets == sorted(map(str, Lake(str(reput_lake)).read_arrow(name).to_pylist())), name
    assert reader.state().expire is None

    again = json.loads(in_process(*expire_args(lake), "--json"))  # the next run
    assert again["status"] == "already_applied"
    for name in EXPIRED_TABLES:
        assert rows(lake, name) == rows(expired, name), name


def test_dry_run_and_spark_submit_expire(tmp_path, reput_lake, expired):
    lake = tmp_path / "lake"
    shutil.copytree(reput_lake, lake)
    plan = rmqlake(*expire_args(lake, "--dry-run"))
    assert "would delete" in plan.stderr and "expired" in plan.stdout
    for name in EXPIRED_TABLES:
        assert rows(lake, name) == rows(reput_lake, name), name
    submitted = spark_submit("expire", *expire_args(lake)[1:], "--json")
    for name in EXPIRED_TABLES:
        assert rows(lake, name) == rows(expired, name), name
    # Spark merges the Python driver's stderr into its stdout: the job points it back at the JVM's stderr
    results = [json.loads(line) for line in submitted.stdout.splitlines()]
    assert results[0]["status"] == "deleted"
    assert "rmqlake.steps.expire: commit done" in submitted.stderr
