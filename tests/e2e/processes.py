"""Helpers of the process-level tests: run rmqlake and spark-submit as users do, read tables back."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from rmqlake.cli import main
from rmqlake.generate import TopicPlan
from tests.conftest import CONF, JOB_PROCESS_JVM_OPTIONS, REPO

BIN = Path(sys.executable).parent
NOW = "2026-11-22T00:00:00Z"
SETTINGS = ["--env", "test", "--set", "store.commitlog_segment_size=8192", "--set", "ingest.sort_partitions=3"]
TABLES = ("commitlog", "segments", "rejected", "ingest_files")
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True), TopicPlan("Clickstream", 4, False)]


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["SPARK_SUBMIT_OPTS"] = JOB_PROCESS_JVM_OPTIONS  # Spark's logging quieted by CONF/log4j2.properties
    env.pop("SPARK_CONF_DIR", None)  # a non-empty one would keep the JVMs from their class-data archive
    env.pop("RMQLAKE_CRASH_AT", None)
    env.update(extra)
    return env


def rmqlake(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(BIN / "rmqlake"), *args], cwd=REPO, env=env or environment(), capture_output=True, text=True, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(f"rmqlake {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def in_process(*args: str) -> str:
    """``rmqlake ARGS`` in this process, on the test session's Spark; must succeed; its stdout.

    For the uninterrupted runs the process-level runs are compared with, and the run after killed ones (what
    it does depends on the lake they left, not on being a new process): one JVM start less each."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = main([*args, "--conf", str(CONF)])
    assert code == 0, f"rmqlake {' '.join(args)} exited {code}"
    return out.getvalue()


def spark_submit(job: str, *args: str) -> subprocess.CompletedProcess:
    """``spark-submit --master local[2] jobs/<job>.py ARGS`` from the repository, as users run it; must succeed."""
    result = subprocess.run(
        [str(BIN / "spark-submit"), "--master", "local[2]", f"jobs/{job}.py", *args],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def ingest_args(lake: Path, source: Path) -> list[str]:
    return ["ingest", "--lake", str(lake), "--input", str(source), "--now", NOW, *SETTINGS]


def table_rows(lake: Path, name: str) -> list[dict]:
    table = pa.table(DeltaTable(str(lake / name)).to_pyarrow_table())
    keys = {"commitlog": "physical_offset", "segments": "start_offset"}.get(name)
    rows = table.to_pylist()
    return sorted(
        rows, key=lambda r: r[keys] if keys else (r.get("source_file") or r.get("path"), r.get("source_line", 0))
    )


def visible_rows(lake: Path, name: str) -> int:
    if not (lake / name / "_delta_log").exists():
        return 0
    return len(DeltaTable(str(lake / name)).to_pyarrow_table())


def assert_same_tables(lake: Path, clean: Path) -> None:
    for name in TABLES:
        assert table_rows(lake, name) == table_rows(clean, name), f"table {name} differs from the clean run"


INDEX = ["--set", "store.index_slots=32", "--set", "store.index_max_entries=200", "--set", "store.cq_units_per_file=64"]


def rows(lake: Path, name: str) -> list[dict]:
    """All rows of a table, in a stable order."""
    table = pa.table(DeltaTable(str(lake / name)).to_pyarrow_table()).to_pylist()
    return sorted(table, key=lambda r: tuple(str(r[k]) for k in sorted(r)))
