"""Progress lines: their format, the heartbeat's setting, and no heartbeat without Spark."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rmqlake.config import load_settings
from rmqlake.errors import ConfigError
from rmqlake.progress import StageProgress, progress_line
from tests.conftest import CONF


def _stage(**changes) -> StageProgress:
    values = dict(
        stage_id=3, attempt=0, description="ingest: read and parse", call_site="collect at /opt/lib/parse.py:88",
        tasks=8, tasks_done=2, tasks_running=2, tasks_failed=0, input_rows=120000, input_bytes=15 * 2**20,
        output_rows=0, output_bytes=0, shuffle_read_rows=0, shuffle_read_bytes=0, shuffle_write_rows=120000,
        shuffle_write_bytes=3 * 2**20, submitted=1000.0,
    )  # fmt: skip
    return StageProgress(**{**values, **changes})


def test_a_line_names_the_stage_and_counts_tasks_rows_and_bytes():
    assert progress_line(_stage(), since=None, seconds=None) == (
        "stage 3 (ingest: read and parse; collect at parse.py:88): tasks 2/8 done, 2 running; "
        "read 120,000 rows 15.0 MiB; written 0 rows 0 B; shuffle read 0 rows 0 B; shuffle written 120,000 rows 3.0 MiB"
    )


def test_the_rate_is_since_the_previous_line():
    earlier = _stage(input_rows=20000, input_bytes=5 * 2**20, shuffle_write_rows=20000, shuffle_write_bytes=2**20)
    line = progress_line(_stage(tasks_failed=1, attempt=1), since=earlier, seconds=10)
    assert "stage 3 attempt 1 (" in line and "2 running, 1 failed;" in line
    assert line.endswith("; rate in 10,000 rows/s 1.0 MiB/s, out 10,000 rows/s 204.8 KiB/s")
    assert progress_line(_stage(), since=None, seconds=60).endswith(
        "rate in 2,000 rows/s 256.0 KiB/s, out 2,000 rows/s 51.2 KiB/s"
    )


def test_a_stage_without_description_shows_its_call_site():
    assert progress_line(_stage(description=""), since=None, seconds=None).startswith(
        "stage 3 (collect at parse.py:88)"
    )


def test_a_stage_first_seen_without_description_waits_a_beat(monkeypatch, caplog):
    """The live status store can list a stage as ACTIVE before the listener has set its job's description: its
    first line waits a beat, then it is logged with or without one; a described stage is logged at once."""
    import rmqlake.progress as progress

    beats = iter([
        [_stage(stage_id=3, description=""), _stage(stage_id=4)],
        [_stage(stage_id=3), _stage(stage_id=4), _stage(stage_id=5, description="")],
        [_stage(stage_id=5, description="")],
    ])  # fmt: skip
    monkeypatch.setattr(progress, "active_stages", lambda context: next(beats))
    heartbeat = progress._Heartbeat(None, job="ingest", interval=1)
    seen = {}
    with caplog.at_level("INFO", logger="rmqlake.progress"):
        for _ in range(3):
            seen = heartbeat._log_stages(seen)
    logged = [r.getMessage().split(":")[0] for r in caplog.records]
    assert logged == ["stage 4 (ingest", "stage 3 (ingest", "stage 4 (ingest", "stage 5 (collect at parse.py"]


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "100000", "often"])
def test_progress_seconds_is_validated(value):
    with pytest.raises(ConfigError, match=r"spark\.progress_seconds"):
        load_settings(CONF, overrides=[f"spark.progress_seconds={value}"])


def test_progress_seconds_default_and_off():
    assert load_settings(CONF).spark.progress_seconds == 10
    assert load_settings(CONF, overrides=["spark.progress_seconds=0"]).spark.progress_seconds == 0


def test_without_spark_no_heartbeat_starts():
    """In a fresh interpreter (this one may hold the suite's SparkSession): no thread, and PySpark not imported."""
    check = (
        "import sys, threading\n"
        "from rmqlake.progress import spark_progress\n"
        "before = threading.active_count()\n"
        "with spark_progress('ingest', interval=0.01):\n"
        "    assert threading.active_count() == before, threading.enumerate()\n"
        "assert 'pyspark' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
