"""Reput in separate processes: killed between its table commits.

`spark-submit jobs/reput.py` runs in tests/airflow (SparkSubmitOperator).
"""

from __future__ import annotations

import shutil

import pytest

from tests.e2e.processes import INDEX, SETTINGS, environment, in_process, rmqlake, rows

pytestmark = pytest.mark.slow
REPUT_TABLES = ("consumequeue", "indexfile", "indexfile_header")


def test_reput_killed_between_table_commits_is_rolled_forward(tmp_path, clean_lake, reput_lake):
    lake = tmp_path / "lake"
    shutil.copytree(clean_lake, lake)
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
    again = in_process("reput", "--lake", str(lake), *SETTINGS, *INDEX, "--json")  # the next run
    assert '"status": "up_to_date"' in again  # the next run finished the decided one, then had no work
    for name in REPUT_TABLES:
        assert rows(lake, name) == rows(reput_lake, name), name
