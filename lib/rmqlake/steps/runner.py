"""One way to run a job that changes the lake: open the lake, time it, retry a lost commit race, record the run.

Every job's result (and so its ``--json`` line and its run record in the
lake state's ``runs``) carries the stable metric keys, besides its own:

* ``rows_in``: rows the job read to do its work (0 where it reads none);
* ``rows_out``: rows it wrote to its main table (0 where it writes none);
* ``rejected``: input rows it refused (0 where it refuses none);
* ``files_added``: data files its commit added;
* ``table_versions``: the version of each table it committed (``{}``: none);
* ``seconds``: wall time of the whole job.

Per job:

==============  ==================================  =================================  ====================
job             rows_in                             rows_out                           rejected
==============  ==================================  =================================  ====================
ingest          input lines                         messages appended to commitlog     rejected lines
reput           commitlog messages dispatched       consumequeue units written         0
compact         messages read (new and compacted)   messages kept in compaction_log    0
expire          0 (it removes whole files)          0                                  0
offsets         snapshot rows read                  consumer_offsets rows appended     0
quality         rows the checked suites validated   dq_results rows written            0
vacuum          0                                   0                                  0
import-store    commitlog records read              messages imported                  corrupt records
==============  ==================================  =================================  ====================

``files_added`` is the number of data files the run's commit added over
all tables it changed, except for ingest, where it has always counted the
commitlog's files only. ``vacuum`` changes no lake state: it runs without a
ledger commit and keeps no run record. ``export-store`` and ``lag`` only
read the lake and do not run here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from rmqlake.config import Settings
from rmqlake.lake import Lake, LakeRun, run_with_retries
from rmqlake.lake.state import LakeState, RunRecord
from rmqlake.progress import spark_progress

STABLE_METRICS = ("rows_in", "rows_out", "rejected", "files_added", "table_versions", "seconds")


@dataclass(frozen=True)
class StepRun:
    """One attempt of a job: its lake, its lake run (``None`` for a job without a ledger commit) and its clock."""

    job: str
    settings: Settings
    lake: Lake
    run: LakeRun | None
    now: datetime
    started: float

    def seconds(self) -> float:
        """Seconds since the job started (not this attempt: a recomputed run counts its lost attempts)."""
        return round(time.monotonic() - self.started, 3)

    def commit(self, state: LakeState, *, record: Mapping) -> dict[str, int | None]:
        """Commit ``state`` with this run's record: ``record`` plus the stable metrics.

        The record's ``table_versions`` are the versions this commit gives
        each table: the ledger commit decides them (no other run can commit
        to these tables before this run's table commits, which follow it).

        Returns:
            The new version of each table the run changed.
        """
        run = self._lake_run()
        run.ensure_tables()
        planned = {name: (self.lake.version(name) or 0) + 1 for name in run.ops}
        metrics = {
            **_defaults(),
            "files_added": added_files(run),
            **record,
            "table_versions": planned,
            "seconds": self.seconds(),
        }
        return run.commit(
            state=state.with_run(
                self.job, RunRecord(seq=run.seq, run_id=run.run_id, at=self.now.isoformat(), metrics=metrics)
            )
        )

    def _lake_run(self) -> LakeRun:
        if self.run is None:
            raise ValueError(f"{self.job} runs without a lake run; it cannot commit")
        return self.run


def run_step(
    job: str,
    settings: Settings,
    work: Callable[[StepRun], dict],
    *,
    now: datetime | None = None,
    started: float | None = None,
    batch_id: str | None = None,
    ledger: bool = True,
) -> dict:
    """Run ``work`` as job ``job`` on the lake of ``settings``; returns its metrics with the stable keys.

    ``work`` gets a ``StepRun`` and commits through ``StepRun.commit`` (or
    not at all: nothing to do). With ``ledger``, it runs in a lake run,
    recomputed on the new state after a lost commit race
    (``lake.commit_retries``); without, once and outside any lake run.
    ``started`` (default: now) is when the job's clock started, for jobs
    that do work before opening the lake; ``now`` (default: the wall clock)
    is the job's time, as recorded in its run record. While it runs, its
    Spark jobs carry its name and a progress line per active Spark stage is
    logged every ``spark.progress_seconds`` (``rmqlake.progress``).
    """
    started = time.monotonic() if started is None else started
    now = now or datetime.now(UTC)
    lake = Lake.from_settings(settings)

    def attempt(run: LakeRun | None) -> dict:
        result = work(StepRun(job=job, settings=settings, lake=lake, run=run, now=now, started=started))
        if run is not None and run.committed:
            return {"files_added": added_files(run), **result}
        return result

    with spark_progress(job, interval=settings.spark.progress_seconds):
        if ledger:
            result = run_with_retries(lake, job, attempt, retries=settings.lake.commit_retries, batch_id=batch_id)
        else:
            result = attempt(None)
    return with_stable_metrics(result, seconds=round(time.monotonic() - started, 3))


def with_stable_metrics(result: Mapping, *, seconds: float) -> dict:
    """``result`` with every stable metric key (0, ``{}`` or ``seconds`` where the job set none)."""
    return {**_defaults(), "seconds": seconds, **result}


def added_files(run: LakeRun) -> int:
    """The data files ``run`` adds over all tables it changes."""
    return sum(len(op.adds) for op in run.ops.values())


def _defaults() -> dict:
    return {"rows_in": 0, "rows_out": 0, "rejected": 0, "files_added": 0, "table_versions": {}}
