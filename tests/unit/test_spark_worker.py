"""Zip importers keep the directory they read: Spark's per-task cache invalidation no longer re-reads archives."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport

from rmqlake.spark_worker import keep_zip_importers


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
