"""Reput in separate processes: killed between its table commits, and under spark-submit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.e2e.test_ingest_processes import (  # noqa: F401 - fixtures and helpers
    SETTINGS,
    environment,
    ingest_args,
    landing,
    rmqlake,
    spark_submit,
)

pytestmark = pytest.mark.slow
REPUT_TABLES = ("consumequeue", "indexfile", "indexfile_header")
INDEX = ["--set", "store.index_slots=32", "--set", "store.index_max_entries=200", "--set", "store.cq_units_per_file=64"]


def rows(lake: Path, name: str) -> list[dict]:
    table = pa.table(DeltaTable(str(lake / name)).to_pyarrow_table()).to_pylist()
    return sorted(table, key=lambda r: tuple(str(r[k]) for k in sorted(r)))


@pytest.fixture(scope="module")
def ingested(tmp_path_factory, landing) -> Path:  # noqa: F811 - the fixture imported above
    lake = tmp_path_factory.mktemp("reput-base") / "lake"
    rmqlake(*ingest_args(lake, landing), *INDEX)
    return lake


@pytest.fixture(scope="module")
def clean(tmp_path_factory, ingested) -> Path:
    lake = tmp_path_factory.mktemp("reput-clean") / "lake"
    shutil.copytree(ingested, lake)
    rmqlake("reput", "--lake", str(lake), *SETTINGS, *INDEX)
    return lake


def test_reput_killed_between_table_commits_is_rolled_forward(tmp_path, ingested, clean):
    lake = tmp_path / "lake"
    shutil.copytree(ingested, lake)
    crashed = rmqlake(
        "reput",
        "--lake",
        str(lake),
        *SETTINGS,
        *INDEX,
        env=environment(RMQLAKE_CRASH_AT="after-commit:consumequeue"),
        check=False,
    )
    assert crashed.returncode == 137
    assert rows(lake, "consumequeue") and not rows(lake, "indexfile")  # half applied until the next run
    again = rmqlake("reput", "--lake", str(lake), *SETTINGS, *INDEX, "--json")
    assert '"status": "up_to_date"' in again.stdout  # the next run finished the decided one, then had no work
    for name in REPUT_TABLES:
        assert rows(lake, name) == rows(clean, name), name


def test_spark_submit_reput(tmp_path, ingested, clean):
    lake = tmp_path / "lake"
    shutil.copytree(ingested, lake)
    spark_submit("reput", "--lake", str(lake), *SETTINGS, *INDEX)
    for name in REPUT_TABLES:
        assert rows(lake, name) == rows(clean, name), name
