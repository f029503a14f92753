"""What rmqlake changes in a Spark Python worker: zip importers keep the directory they read (Spark's per-task cache
invalidation no longer re-reads archives), and the daemon's collection after each task freezes what survives it."""

from __future__ import annotations

import gc
import importlib
import os
import sys
import weakref
import zipfile
import zipimport

from rmqlake.spark_worker import _freeze_after_daemon_collection, freeze_after_task_collections, keep_zip_importers


def _zip(path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in modules.items():
            archive.writestr(f"{name}.py", text)


def test_a_kept_importer_is_not_re_read_on_invalidation(tmp_path, monkeypatch):
    archive = tmp_path / "libs.zip"
    _zip(archive, {"rmq_zip_a": "VALUE = 1"})
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.delitem(sys.modules, "rmq_zip_a", raising=False)
    assert importlib.import_module("rmq_zip_a").VALUE == 1
    importer = sys.path_importer_cache[str(archive)]
    assert isinstance(importer, zipimport.zipimporter)

    assert keep_zip_importers() >= 1
    assert keep_zip_importers() == 0  # once per importer

    reads = []
    monkeypatch.setattr(zipimport, "_read_directory", lambda path: reads.append(path) or {})
    importlib.invalidate_caches()  # what the worker does before every task
    assert reads == []
    assert importer.find_spec("rmq_zip_a") is not None  # the directory read at first is kept


def _collect_as_the_daemon(generation: int = 2) -> None:
    """``gc.collect()`` called from a frame of a file named as PySpark's daemon module is."""
    exec(
        compile(f"gc.collect({generation})", os.path.join("site-packages", "pyspark", "daemon.py"), "exec"), {"gc": gc}
    )


def test_only_the_daemons_full_collection_freezes_what_survives_it():
    gc.unfreeze()
    freeze_after_task_collections()
    try:
        assert freeze_after_task_collections() is False  # once per process
        gc.collect()  # a full collection from anywhere else (here: during a task) freezes nothing
        assert gc.get_freeze_count() == 0
        _collect_as_the_daemon(generation=1)  # nor does a young one
        assert gc.get_freeze_count() == 0

        _collect_as_the_daemon()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the modules, classes and functions this process keeps
        kept = [[] for _ in range(10)]  # what the next task leaves for the worker to keep
        dropped = _Node()  # and a cycle it drops
        dropped.itself = dropped
        alive = weakref.ref(dropped)
        del dropped
        _collect_as_the_daemon()
        assert alive() is None  # freed by the collection, before the freeze
        assert frozen + len(kept) <= gc.get_freeze_count() < frozen + len(kept) + 1000
    finally:
        gc.callbacks.remove(_freeze_after_daemon_collection)
        gc.unfreeze()


class _Node:
    itself: _Node
