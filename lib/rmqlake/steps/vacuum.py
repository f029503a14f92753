"""``rmqlake vacuum``: remove the data files that runs removed from the tables (expiry, compaction).

Expiry and compaction only remove files from the Delta log, so readers of
older versions and time travel keep working; the files stay on disk until
vacuum, after ``lake.vacuum_retention_hours``. Going below Delta's own
deleted-file retention (168 h) needs ``lake.vacuum_below_delta_retention``.
"""

from __future__ import annotations

import logging

from rmqlake.config import Settings
from rmqlake.lake.tables import TABLES
from rmqlake.steps.runner import StepRun, run_step

log = logging.getLogger(__name__)


def vacuum(settings: Settings, *, dry_run: bool = False) -> dict:
    """Vacuum every table; returns the files removed (or that would be) per table, and the stable metrics (all 0:
    vacuum deletes files the tables no longer list; no row and no lake state changes)."""
    return run_step("vacuum", settings, lambda step: _vacuum(step, dry_run=dry_run), ledger=False)


def _vacuum(step: StepRun, *, dry_run: bool) -> dict:
    settings, lake = step.settings, step.lake
    hours = settings.lake.vacuum_retention_hours
    if settings.lake.vacuum_below_delta_retention:
        log.warning("vacuum retention %.0f h: below Delta's 168 h guard, deliberately (config)", hours)
    removed = {}
    for name in TABLES:
        if not lake.exists(name):
            continue
        files = lake.engine.vacuum(
            name,
            retention_hours=hours,
            dry_run=dry_run,
            below_table_retention=settings.lake.vacuum_below_delta_retention,
        )
        if files:
            removed[name] = len(files)
            log.info("%s %d files of %s", "would remove" if dry_run else "removed", len(files), name)
    return {
        "dry_run": dry_run,
        "retention_hours": hours,
        "files": removed,
        "files_total": sum(removed.values()),
        "seconds": step.seconds(),
    }
