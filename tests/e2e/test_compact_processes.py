"""Compaction in separate processes: killed before and after its ledger commit, and under spark-submit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.test_ingest_processes import SETTINGS, environment, landing, rmqlake, spark_submit  # noqa: F401
from tests.e2e.test_reput_processes import INDEX, clean, ingested, rows  # noqa: F401

pytestmark = pytest.mark.slow
COMPACTED = ("compaction_log", "compaction_cq")


@pytest.fixture(scope="module")
def compacted(tmp_path_factory, clean) -> Path:  # noqa: F811 - the fixture imported above
    lake = tmp_path_factory.mktemp("compact-clean") / "lake"
    shutil.copytree(clean, lake)
    rmqlake("compact", "--lake", str(lake), *SETTINGS, *INDEX)
    assert rows(lake, "compaction_log")
    return lake


@pytest.mark.parametrize("point", ["before-ledger-commit", "after-commit:compaction_log"])
def test_killed_compaction_is_redone_or_rolled_forward(tmp_path, clean, compacted, point):  # noqa: F811
    lake = tmp_path / "lake"
    shutil.copytree(clean, lake)
    crashed = rmqlake(
        "compact", "--lake", str(lake), *SETTINGS, *INDEX, env=environment(RMQLAKE_CRASH_AT=point), check=False
    )
    assert crashed.returncode == 137
    if point == "before-ledger-commit":
        assert rows(lake, "compaction_log") == []  # nothing visible
    again = rmqlake("compact", "--lake", str(lake), *SETTINGS, *INDEX, "--json")
    expected = "compacted" if point == "before-ledger-commit" else "up_to_date"
    assert f'"status": "{expected}"' in again.stdout
    for name in COMPACTED:
        assert rows(lake, name) == rows(compacted, name), name


def test_spark_submit_compact(tmp_path, clean, compacted):  # noqa: F811
    lake = tmp_path / "lake"
    shutil.copytree(clean, lake)
    spark_submit("compact", "--lake", str(lake), *SETTINGS, *INDEX)
    for name in COMPACTED:
        assert rows(lake, name) == rows(compacted, name), name
