"""What rmqlake changes in a Spark Python worker process, once, when the worker first imports rmqlake."""

from __future__ import annotations

import gc
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


def freeze_after_task_collections() -> bool:
    """Keep what a worker holds for its life out of the full collection PySpark's daemon runs after every task.

    A reused worker runs ``gc.collect()`` after each task (``pyspark.daemon``). A full collection visits every
    object the collector tracks: once the worker has imported rmqlake's task modules (PySpark, pyarrow, NumPy,
    pandas), over 100,000 of them, 20-80 ms of CPU after every task whatever the task did (measured here: a worker
    spent 24 ms of CPU per one-row task, 5 ms with this hook). What that collection leaves is what the
    worker keeps (modules, classes, caches): the task's objects are gone by then, freed by reference counting or
    by the collection itself. So after it, ``gc.freeze()`` moves the survivors to the permanent generation, which
    later collections skip, and the next one visits only what the next task left. Collections started anywhere
    else (the automatic ones during a task, when the task's data is alive) freeze nothing. Objects frozen and
    later dropped are still freed by reference counting; only a reference cycle among them waits for the
    worker's exit.

    Returns whether the hook was added (once per process).
    """
    if _freeze_after_daemon_collection in gc.callbacks:
        return False
    gc.callbacks.append(_freeze_after_daemon_collection)
    return True


_DAEMON_FILE = os.path.join("pyspark", "daemon.py")


def _freeze_after_daemon_collection(phase: str, info: dict) -> None:
    if phase == "stop" and info.get("generation") == 2:
        # the frame that called ``gc.collect()``, or the one running when a collection started (none in a thread
        # of native code)
        caller = sys._getframe(0).f_back
        if caller is not None and caller.f_code.co_filename.endswith(_DAEMON_FILE):
            gc.freeze()
