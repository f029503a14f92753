"""Progress of long jobs: stage timing lines, and a heartbeat while Spark work runs.

``Stages`` times the named stages of a step and logs one line when each
ends. ``spark_progress`` covers the time in between: while a step runs, a
daemon thread on the driver reads Spark's live status every few seconds and
logs one line per active Spark stage (its description, tasks done of total,
the rows and bytes it has read and written so far, and its rate since the
previous line). Executors report rows and bytes of running tasks with their
heartbeats (``spark.executor.heartbeatInterval``), finished tasks at once.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# Spark's local properties behind SparkContext.setJobGroup / setJobDescription (thread-local in the JVM).
JOB_GROUP = "spark.jobGroup.id"
JOB_DESCRIPTION = "spark.job.description"
# The job whose Spark work runs in this thread, as ``spark_progress`` named it; prefixes the stage descriptions.
_spark_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("rmqlake_spark_job", default=None)


class Stages:
    """Times named stages of a run; ``seconds`` goes into the run's metrics.

    Inside a ``spark_progress`` block, the Spark jobs a stage starts carry
    the description ``<job>: <stage>`` (in Spark's UI and the progress lines).

    Example:
        >>> stages = Stages(logging.getLogger("x"))
        >>> with stages("parse") as note:
        ...     note["rows"] = 10
    """

    def __init__(self, logger: logging.Logger):
        self.log = logger
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        started = time.monotonic()
        note: dict = {}
        with spark_description(name):
            yield note
        elapsed = time.monotonic() - started
        self.seconds[name] = round(self.seconds.get(name, 0.0) + elapsed, 3)
        details = ", ".join(f"{k} {v}" for k, v in note.items())
        rows = note.get("rows")
        rate = f", {rows / elapsed:,.0f} rows/s" if rows and elapsed > 0 else ""
        self.log.info("%s done in %.1fs%s%s", name, elapsed, f" ({details})" if details else "", rate)


def active_spark_context():
    """The running SparkContext of this process, or ``None`` (without importing PySpark where nothing has)."""
    if "pyspark" not in sys.modules:
        return None
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    return context if context is not None and context._jsc is not None else None


@contextmanager
def _local_properties(context, values: dict[str, str | None]) -> Iterator[None]:
    """Set Spark local properties of this thread for the block, then restore what was there."""
    if context is None:
        yield
        return
    previous = {key: context.getLocalProperty(key) for key in values}
    for key, value in values.items():
        context.setLocalProperty(key, value)
    try:
        yield
    finally:
        if active_spark_context() is context:  # a stopped context has no properties left to restore
            for key, value in previous.items():
                context.setLocalProperty(key, value)  # None removes the property


def in_another_thread(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` to be called in another thread: the Spark jobs it starts there carry this thread's job group
    and description (Spark's local properties are per thread), so they show in this job's progress lines."""
    context = active_spark_context()
    if context is None:
        return function
    properties = {key: context.getLocalProperty(key) for key in (JOB_GROUP, JOB_DESCRIPTION)}

    def run(*args, **kwargs) -> T:
        for key, value in properties.items():
            context.setLocalProperty(key, value)
        return function(*args, **kwargs)

    return run


@contextmanager
def spark_description(stage: str) -> Iterator[None]:
    """Describe the Spark jobs started in the block as ``<job>: <stage>`` (inside ``spark_progress`` only)."""
    job = _spark_job.get()
    context = active_spark_context() if job else None
    with _local_properties(context, {JOB_DESCRIPTION: f"{job}: {stage}"}):
        yield


@contextmanager
def spark_progress(job: str, *, interval: float) -> Iterator[None]:
    """Run the block as rmqlake job ``job``: its Spark jobs in the job group ``rmqlake-<job>``, and one progress
    line per active Spark stage every ``interval`` seconds while it runs (``0``: no lines).

    Without a running SparkContext, or inside another ``spark_progress`` block, it changes nothing. The
    heartbeat thread is stopped and joined before the block's result or exception goes on, so no line
    follows the step; a failure of the heartbeat itself is logged once and ends the heartbeat, never the job.
    """
    context = active_spark_context()
    if context is None or _spark_job.get() is not None:
        yield
        return
    token = _spark_job.set(job)
    heartbeat = _Heartbeat(context, job=job, interval=interval) if interval > 0 else None
    try:
        with _local_properties(context, {JOB_GROUP: f"rmqlake-{job}", JOB_DESCRIPTION: job}):
            if heartbeat is not None:
                heartbeat.start()
            try:
                yield
            finally:
                if heartbeat is not None:
                    heartbeat.stop()
    finally:
        _spark_job.reset(token)


@dataclass(frozen=True)
class StageProgress:
    """What Spark's status store knows of one running stage attempt."""

    stage_id: int
    attempt: int
    description: str
    call_site: str
    tasks: int
    tasks_done: int
    tasks_running: int
    tasks_failed: int
    input_rows: int
    input_bytes: int
    output_rows: int
    output_bytes: int
    shuffle_read_rows: int
    shuffle_read_bytes: int
    shuffle_write_rows: int
    shuffle_write_bytes: int
    submitted: float | None  # epoch seconds

    @property
    def rows_in(self) -> int:
        return self.input_rows + self.shuffle_read_rows

    @property
    def bytes_in(self) -> int:
        return self.input_bytes + self.shuffle_read_bytes

    @property
    def rows_out(self) -> int:
        return self.output_rows + self.shuffle_write_rows

    @property
    def bytes_out(self) -> int:
        return self.output_bytes + self.shuffle_write_bytes


def active_stages(context) -> list[StageProgress]:
    """The active stage attempts of ``context``'s application, from the driver's live status store.

    PySpark's ``statusTracker`` reports tasks only; rows and bytes live in the JVM's status store.

    A stage the listener has not yet seen submitted is left out: the store lists a stage as soon as the
    scheduler stamps its submission time, but its description (the job properties) arrives with the
    listener's submitted event, which can lag a few heartbeats behind; such a stage is still PENDING.
    """
    stages = context._jsc.sc().statusStore().activeStages()
    listed = (stages.apply(i) for i in range(stages.size()))
    return [_stage_progress(stage) for stage in listed if stage.status().toString() == "ACTIVE"]


def _stage_progress(stage) -> StageProgress:
    description = stage.description()
    submitted = stage.submissionTime()
    return StageProgress(
        stage_id=stage.stageId(),
        attempt=stage.attemptId(),
        description=description.get() if description.isDefined() else "",
        call_site=stage.name(),
        tasks=stage.numTasks(),
        tasks_done=stage.numCompleteTasks(),
        tasks_running=stage.numActiveTasks(),
        tasks_failed=stage.numFailedTasks(),
        input_rows=stage.inputRecords(),
        input_bytes=stage.inputBytes(),
        output_rows=stage.outputRecords(),
        output_bytes=stage.outputBytes(),
        shuffle_read_rows=stage.shuffleReadRecords(),
        shuffle_read_bytes=stage.shuffleReadBytes(),
        shuffle_write_rows=stage.shuffleWriteRecords(),
        shuffle_write_bytes=stage.shuffleWriteBytes(),
        submitted=submitted.get().getTime() / 1000 if submitted.isDefined() else None,
    )


def progress_line(stage: StageProgress, *, since: StageProgress | None, seconds: float | None) -> str:
    """One heartbeat line: ``stage 3 (ingest: read and parse; collect at parse.py:88): tasks 1/2 done, ...``.

    The rate is per second over ``seconds``: since ``since`` (the previous line of the same stage), else
    since the stage was submitted.
    """
    site = _short_call_site(stage.call_site)
    what = "; ".join(part for part in (stage.description, site) if part)
    attempt = f" attempt {stage.attempt}" if stage.attempt else ""
    failed = f", {stage.tasks_failed} failed" if stage.tasks_failed else ""
    line = (
        f"stage {stage.stage_id}{attempt} ({what}): tasks {stage.tasks_done}/{stage.tasks} done, "
        f"{stage.tasks_running} running{failed}; "
        f"read {stage.input_rows:,} rows {_size(stage.input_bytes)}; "
        f"written {stage.output_rows:,} rows {_size(stage.output_bytes)}; "
        f"shuffle read {stage.shuffle_read_rows:,} rows {_size(stage.shuffle_read_bytes)}; "
        f"shuffle written {stage.shuffle_write_rows:,} rows {_size(stage.shuffle_write_bytes)}"
    )
    if not seconds or seconds <= 0:
        return line
    base_in = (since.rows_in, since.bytes_in) if since else (0, 0)
    base_out = (since.rows_out, since.bytes_out) if since else (0, 0)
    rows_in, bytes_in = (stage.rows_in - base_in[0]) / seconds, (stage.bytes_in - base_in[1]) / seconds
    rows_out, bytes_out = (stage.rows_out - base_out[0]) / seconds, (stage.bytes_out - base_out[1]) / seconds
    return f"{line}; rate in {rows_in:,.0f} rows/s {_size(bytes_in)}/s, out {rows_out:,.0f} rows/s {_size(bytes_out)}/s"


def _short_call_site(name: str) -> str:
    """``collect at /long/path/to/parse.py:88`` as ``collect at parse.py:88``."""
    action, sep, where = name.partition(" at ")
    return f"{action} at {os.path.basename(where)}" if sep else name


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


class _Heartbeat:
    """The daemon thread behind ``spark_progress``."""

    def __init__(self, context, *, job: str, interval: float):
        self.context = context
        self.interval = interval
        self._stopped = threading.Event()
        # The thread logs with the step's log prefix ([job=... run=...]), which lives in context variables.
        log_context = contextvars.copy_context()
        self.thread = threading.Thread(
            target=log_context.run, args=(self._beat,), name=f"rmqlake-progress-{job}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopped.set()
        # A beat is a few calls into the driver's JVM; waiting for it keeps lines from following the step.
        self.thread.join()

    def _beat(self) -> None:
        seen: dict[tuple[int, int], tuple[StageProgress | None, float | None]] = {}
        while not self._stopped.wait(self.interval):
            try:
                seen = self._log_stages(seen)
            except Exception as exc:  # progress lines must never fail the job they report on
                if not self._stopped.is_set() and active_spark_context() is self.context:
                    log.warning("progress lines stopped: Spark's status could not be read (%s)", exc)
                return  # a stopped SparkContext ends the lines silently

    def _log_stages(self, seen: dict) -> dict:
        """Log one line per active stage; returns each stage's state and time, for the next line's rate."""
        stages = active_stages(self.context)
        now = time.time()
        current = {}
        for stage in stages:
            if self._stopped.is_set():
                break
            key = (stage.stage_id, stage.attempt)
            if not stage.description and key not in seen:
                # The live status store can show a stage the listener is still marking submitted: ACTIVE, its job's
                # description not set yet. Its line waits a beat; a stage of a job without one is logged then.
                current[key] = (None, stage.submitted)
                continue
            previous, at = seen.get(key, (None, stage.submitted))
            log.info("%s", progress_line(stage, since=previous, seconds=now - at if at is not None else None))
            current[key] = (stage, now)
        return current
