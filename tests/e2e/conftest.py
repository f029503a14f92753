"""Lakes shared by the process-level tests (session scope: each is built once, then copied by the tests).

They are the uninterrupted runs the killed and concurrent processes must end up equal to, so they run in this
process on the test session's Spark (``spark`` first: a job must never build the session without the Delta
extension the other tests need)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rmqlake.generate import generate
from tests.e2e.processes import INDEX, SETTINGS, TOPICS, in_process, ingest_args


@pytest.fixture(scope="session")
def landing(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("input")
    # with delayed, timer and transactional messages: the killed, retried and concurrent runs re-route and deliver
    # them, and end transactions whose halves are in the same run or (ends in the next hour) the lake
    generate(root, messages=1200, topics=TOPICS, hours=2, bad_rate=0.01, seed=99, schedule_share=0.05,
             transaction_share=0.05)  # fmt: skip
    return root / "landing"


@pytest.fixture(scope="session")
def clean_lake(spark, tmp_path_factory, landing) -> Path:
    """One uninterrupted ingest of both hours (the lake every interrupted run must end up equal to)."""
    lake = tmp_path_factory.mktemp("clean") / "lake"
    metrics = json.loads(in_process(*ingest_args(lake, landing), *INDEX, "--json"))
    lines = json.loads((landing.parent / "MANIFEST.json").read_text())["lines"]
    assert metrics["rows_in"] == lines and metrics["rows_out"] + metrics["rejected"] == lines
    assert metrics["transaction_commits"] > 0 and metrics["transaction_rollbacks"] > 0
    return lake


@pytest.fixture(scope="session")
def reput_lake(spark, tmp_path_factory, clean_lake) -> Path:
    """``clean_lake`` after one reput."""
    lake = tmp_path_factory.mktemp("reput-clean") / "lake"
    shutil.copytree(clean_lake, lake)
    in_process("reput", "--lake", str(lake), *SETTINGS, *INDEX)
    return lake
