"""The lake the interop tests share: built once per session from tests/interop/data.py, dispatched and exported.

Tests must not change it; one that needs to expire or compact works on a copy (:func:`copy_lake`).

The harness runs that take nothing from the session (a broker fed transactional or scheduled sends, a store
written by ``putMessage``) start in the background when the first interop test starts: their JVMs mostly wait
(for deliveries to fall due, ends to be applied, clean shutdowns), so they run beside each other and beside the
Spark work of the tests before them instead of one after the other. A test module takes its run's result from
:func:`harness_runs`; a failed run fails that module's tests as it did when the module started it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from rmqlake.config import Settings
from rmqlake.steps.ingest import ingest
from rmqlake.steps.reput import reput
from rmqlake.steps.store import export_store
from tests.conftest import make_settings
from tests.interop import data, schedule, store_checks, transaction
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


# the harness runs started in the background, by the test module that reads each
BACKGROUND_RUNS: dict[str, tuple[str, Callable[[Path], object]]] = {
    "schedule": ("test_schedule_from_rocketmq", schedule.run_broker),
    "transaction": ("test_transaction_from_rocketmq", transaction.run_broker),
    "store-write": ("test_store_from_rocketmq", store_checks.write_with_rocketmq),
}


@pytest.fixture(scope="session", autouse=True)
def harness_runs(request, tmp_path_factory) -> dict[str, Future]:
    """The :data:`BACKGROUND_RUNS` of the selected test modules, started when the first interop test starts."""
    selected = {item.module.__name__.rpartition(".")[2] for item in request.session.items}
    wanted = {name: run for name, (module, run) in BACKGROUND_RUNS.items() if module in selected}
    if not wanted:
        yield {}
        return
    # two JVMs at a time beside the tests: the schedule broker's deliveries are compared within a few seconds of
    # their due time, which a third busy JVM on two cores could push past
    pool = ThreadPoolExecutor(max_workers=min(2, len(wanted)), thread_name_prefix="harness")
    yield {name: pool.submit(run, tmp_path_factory.mktemp(name)) for name, run in wanted.items()}
    pool.shutdown(wait=True, cancel_futures=True)
