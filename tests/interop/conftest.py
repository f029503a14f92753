"""The lake the interop tests share: built once per session from tests/interop/data.py, dispatched and exported.

Tests must not change it; one that needs to expire or compact works on a copy (:func:`copy_lake`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from rmqlake.config import Settings
from rmqlake.steps.ingest import ingest
from rmqlake.steps.reput import reput
from rmqlake.steps.store import export_store
from tests.conftest import make_settings
from tests.interop import data
from tests.interop.harness import classpath


@dataclass(frozen=True)
class InteropLake:
    """A dispatched lake and its export.

    Attributes:
        root: the session folder holding everything below.
        lake: the lake root (tables).
        settings: settings of the lake (test overlay + :data:`data.SIZES`).
        store: the ``export-store`` directory (a clean shutdown: no ``abort`` file).
        messages: the messages in the producer log, in store order.
        ingest: ingest's metrics; ``export``: export-store's metrics.
    """

    root: Path
    lake: Path
    settings: Settings
    store: Path
    messages: list
    ingest: dict
    export: dict


def lake_settings(lake: Path, *overrides: str) -> Settings:
    """Settings for an interop lake at ``lake`` (the small sizes of :mod:`tests.interop.data`)."""
    return make_settings(lake, *data.SIZES, *overrides)


def copy_lake(source: InteropLake, target: Path) -> Settings:
    """A copy of the shared lake's tables at ``target``, for tests that change a lake."""
    shutil.copytree(source.lake, target)
    return lake_settings(target)


@pytest.fixture(scope="session")
def rocketmq_classpath() -> str:
    """The harness classpath; fails (never skips) when ``make jars`` has not been run."""
    return classpath()


@pytest.fixture(scope="session")
def interop_lake(spark, tmp_path_factory) -> InteropLake:
    """The messages of :func:`data.messages` ingested, dispatched and exported with the small sizes."""
    classpath()  # fail first, before Spark work, when the jars are missing
    root = tmp_path_factory.mktemp("interop")
    messages = data.messages()
    log = data.write_producer_log(root / "in" / "producer.jsonl", messages)
    settings = lake_settings(root / "lake")
    ingested = ingest(spark, settings, input_path=str(log))
    assert ingested["rejected"] == 0, ingested
    reput(spark, settings)
    exported = export_store(spark, settings, out=str(root / "store"))
    return InteropLake(
        root=root,
        lake=root / "lake",
        settings=settings,
        store=Path(exported["out"]),
        messages=messages,
        ingest=ingested,
        export=exported,
    )
