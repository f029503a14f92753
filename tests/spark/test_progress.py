"""Progress lines while a job's Spark stages run: a heartbeat from the driver's live status store."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
import time
from contextlib import redirect_stdout

import pytest

from rmqlake.cli import main
from rmqlake.generate import TopicPlan, generate
from rmqlake.progress import JOB_DESCRIPTION, JOB_GROUP, Stages
from rmqlake.steps.runner import run_step
from tests.conftest import CONF, make_settings

pytestmark = pytest.mark.spark

HOLD_LIMIT_SECONDS = 180  # a held task gives up after this, so a missing line fails the test instead of hanging it
LINE = re.compile(
    r"stage (?P<stage>\d+)(?: attempt \d+)? \((?P<what>[^)]*)\): tasks (?P<done>\d+)/(?P<tasks>\d+) done, "
    r"(?P<running>\d+) running(?:, \d+ failed)?; "
    r"read (?P<read_rows>[\d,]+) rows [\d,.]+ (?:B|KiB|MiB|GiB|TiB); "
    r"written [\d,]+ rows [\d,.]+ (?:B|KiB|MiB|GiB|TiB); "
    r"shuffle read [\d,]+ rows [\d,.]+ (?:B|KiB|MiB|GiB|TiB); "
    r"shuffle written [\d,]+ rows [\d,.]+ (?:B|KiB|MiB|GiB|TiB)"
    r"(?:; rate in [\d,]+ rows/s [\d,.]+ (?:B|KiB|MiB|GiB|TiB)/s, out [\d,]+ rows/s [\d,.]+ (?:B|KiB|MiB|GiB|TiB)/s)?$"
)


class _Lines(logging.Handler):
    """Collects the progress lines; the first that ``accepts`` takes creates ``marker`` (letting held tasks end)."""

    def __init__(self, marker: str | None = None, accepts=None):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.threads: set[str] = set()
        self.released: str | None = None
        self.marker, self.accepts = marker, accepts

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        self.threads.add(record.threadName)
        if self.marker and self.released is None and self.accepts(line):
            self.released = line
            open(self.marker, "w").close()


@pytest.fixture
def progress_lines():
    logger = logging.getLogger("rmqlake.progress")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _held(marker: str, limit: float):
    """A partition function: partition 0 ends at once, the others wait (at most ``limit`` s) for ``marker``."""

    def hold(index, rows):
        count = sum(1 for _ in rows)
        deadline = time.monotonic() + limit
        while index > 0 and not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield count

    return hold


def _progress_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rmqlake-progress")]


def test_a_held_stage_beats_with_its_description_tasks_rows_and_bytes(spark, tmp_path, progress_lines):
    data, marker = tmp_path / "lines.txt", str(tmp_path / "release")
    data.write_text("".join(f"line {i}\n" for i in range(20000)))

    def released_by(line: str) -> bool:
        match = LINE.match(line)
        return bool(match and "progress-test: hold" in match["what"] and match["done"] == "1"
                    and match["tasks"] == "2" and int(match["read_rows"].replace(",", "")) > 0)  # fmt: skip

    progress_lines.marker, progress_lines.accepts = marker, released_by
    seen: dict = {}

    def work(step):
        with Stages(logging.getLogger("rmqlake.test"))("hold"):
            rdd = spark.sparkContext.textFile(str(data), 2)
            seen["counts"] = rdd.mapPartitionsWithIndex(_held(marker, HOLD_LIMIT_SECONDS)).collect()
        seen["threads"] = _progress_threads()
        return {}

    settings = make_settings(tmp_path / "lake", "spark.progress_seconds=0.1")
    run_step("progress-test", settings, work, ledger=False)

    assert progress_lines.released, f"no line released the held task; lines: {progress_lines.lines[-5:]}"
    assert sum(seen["counts"]) == 20000
    line = LINE.match(progress_lines.released)
    assert line["what"].startswith("progress-test: hold; collect at "), line["what"]
    assert (line["done"], line["tasks"], line["running"]) == ("1", "2", "1")
    assert all(LINE.match(text) for text in progress_lines.lines), progress_lines.lines
    assert seen["threads"] == ["rmqlake-progress-progress-test"]
    # the heartbeat ended with the step: no thread left, nothing logged after, Spark's job properties restored
    assert _progress_threads() == []
    logged = len(progress_lines.lines)
    spark.sparkContext.parallelize(range(10), 2).count()
    assert len(progress_lines.lines) == logged
    assert spark.sparkContext.getLocalProperty(JOB_DESCRIPTION) is None
    assert spark.sparkContext.getLocalProperty(JOB_GROUP) is None


def test_interval_zero_starts_no_heartbeat(spark, tmp_path, progress_lines):
    seen = {}

    def work(step):
        with Stages(logging.getLogger("rmqlake.test"))("count"):
            seen["rows"] = spark.sparkContext.parallelize(range(1000), 2).count()
            seen["threads"] = _progress_threads()
            seen["description"] = spark.sparkContext.getLocalProperty(JOB_DESCRIPTION)
        return {}

    run_step("quiet-test", make_settings(tmp_path / "lake", "spark.progress_seconds=0"), work, ledger=False)

    assert seen == {"rows": 1000, "threads": [], "description": "quiet-test: count"}
    assert progress_lines.lines == [] and _progress_threads() == []


def test_ingest_logs_progress_to_stderr_and_keeps_stdout_json(spark, tmp_path, progress_lines):
    generate(tmp_path / "in", messages=300, topics=[TopicPlan("OrderEvents", 2, False)], hours=1, seed=5)
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["ingest", "--input", str(tmp_path / "in" / "landing"), "--conf", str(CONF), "--env", "test",
                     "--lake", str(tmp_path / "lake"), "--set", "spark.progress_seconds=0.01", "--json"])  # fmt: skip

    assert code == 0
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(results) == 1 and results[0]["rows_out"] > 0
    # whether a short ingest beats depends on its speed; every line it logs has the format and names its job
    assert all(LINE.match(text) for text in progress_lines.lines), progress_lines.lines
    assert all(LINE.match(text)["what"].startswith("ingest") for text in progress_lines.lines)
    assert progress_lines.threads <= {"rmqlake-progress-ingest"} and _progress_threads() == []
