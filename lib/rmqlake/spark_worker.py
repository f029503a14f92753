"""What rmqlake changes in a Spark Python worker process, once, when the worker first imports rmqlake."""

from __future__ import annotations

import os
import sys
import zipimport


def keep_zip_importers() -> int:
    """Stop the worker's per-task ``importlib.invalidate_caches()`` from re-reading zip archives.

    Before every task a PySpark worker calls ``importlib.invalidate_caches()``
    (``pyspark.worker_util.setup_spark_files``). On Python 3.11 that makes
    every ``zipimporter`` on ``sys.path`` read its archive's whole directory
    again: pyspark.zip and py4j's zip (Spark puts them on the worker's
    PYTHONPATH) and any ``--py-files`` zip. Measured here with py-spy: about
    0.1 s of every Python task, whatever the task does; 3 s of a 19 s ingest
    of 1 M messages. Those archives do not change while a worker lives (a file
    added later comes under a new path, with a new importer), so the importers
    that exist now keep the directory they have read.

    Returns how many importers were changed.
    """
    changed = 0
    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter) and "invalidate_caches" not in vars(finder):
            finder.invalidate_caches = _keep_directory
            changed += 1
    return changed


def _keep_directory() -> None:
    """The archive's directory as read stays valid for the worker's life (see ``keep_zip_importers``)."""


def in_spark_worker() -> bool:
    """True in a reused PySpark worker process (the daemon sets this for the workers it forks)."""
    return "SPARK_REUSE_WORKER" in os.environ
