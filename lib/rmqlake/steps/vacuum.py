"""``rmqlake vacuum``: remove the data files that runs removed from the tables (expiry, compaction).

Expiry and compaction only remove files from the Delta log, so readers of
older versions and time travel keep working; the files stay on disk until
vacuum, after ``lake.vacuum_retention_hours``. Going below Delta's own
deleted-file retention (168 h) needs ``lake.vacuum_below_delta_retention``.
"""

from __future__ import annotations

import logging
import time

from rmqlake.config import Settings
from rmqlake.lake.tables import TABLES
from rmqlake.steps.ingest import open_lake

log = logging.getLogger(__name__)


def vacuum(settings: Settings, *, dry_run: bool = False) -> dict:
    """Vacuum every table; returns the files removed (or that would be) per table."""
    started = time.monotonic()
    lake = open_lake(settings)
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
        "seconds": round(time.monotonic() - started, 3),
    }
