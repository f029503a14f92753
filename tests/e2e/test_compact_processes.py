"""Compaction in separate processes: killed before and after its ledger commit.

`spark-submit jobs/compact.py` runs in tests/airflow (SparkSubmitOperator).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.processes import INDEX, SETTINGS, environment, in_process, rmqlake, rows

pytestmark = pytest.mark.slow
COMPACTED = ("compaction_log", "compaction_cq")


@pytest.fixture(scope="module")
def compacted(spark, tmp_path_factory, reput_lake) -> Path:
    """One uninterrupted compaction (in this process: the reference the killed ones are compared with)."""
    lake = tmp_path_factory.mktemp("compact-clean") / "lake"
    shutil.copytree(reput_lake, lake)
    in_process("compact", "--lake", str(lake), *SETTINGS, *INDEX)
    assert rows(lake, "compaction_log")
    return lake


def test_killed_compactions_are_redone_or_rolled_forward(tmp_path, reput_lake, compacted):
    lake = tmp_path / "lake"
    shutil.copytree(reput_lake, lake)
    for point in ("before-ledger-commit", "after-commit:compaction_log"):
        crashed = rmqlake(
            "compact", "--lake", str(lake), *SETTINGS, *INDEX, env=environment(RMQLAKE_CRASH_AT=point), check=False
        )
        assert crashed.returncode == 137
        if point == "before-ledger-commit":
            assert rows(lake, "compaction_log") == []  # nothing visible
        else:
            assert rows(lake, "compaction_log") and not rows(lake, "compaction_cq")  # decided, half applied
    again = in_process("compact", "--lake", str(lake), *SETTINGS, *INDEX, "--json")  # the next run
    assert '"status": "up_to_date"' in again  # it finished the decided run first, then had no work
    for name in COMPACTED:
        assert rows(lake, name) == rows(compacted, name), name
