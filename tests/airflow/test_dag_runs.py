"""Real DAG runs: ``dag.test()`` against a sqlite metadata DB, each task a real ``spark-submit`` of a job
through SparkSubmitOperator (the default runner) and a ``spark`` connection to ``local[2]``.

The ``ingest_hourly`` DAG runs two consecutive past hours in order, as a
backfill or catch-up creates them (``max_active_runs`` is 1, so one after the
other; ``airflow backfill create --dry-run`` confirms which runs a backfill of
those hours creates: executing them needs a scheduler and an API server).
The second hour's first attempt finds no landing folder: its ingest
fails, reput, compaction and quality do not run, and the lake is as it was. Re-run once
the hour has landed, the lake equals the same two hours run one by one by
``rmqlake pipeline run`` (with the same missing hour in between: the local runner
stops downstream tasks the same way). Those local runs are processes started at the
beginning, running beside the DAG runs on their own lake: each waits on its JVM much of
the time, so together they take little more than the DAG runs alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from airflow.dag_processing.dagbag import DagBag
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import TABLES, Lake
from tests.airflow.test_dags import dag_folder_for
from tests.conftest import CONF, JOB_PROCESS_JVM_OPTIONS, REPO

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
FIRST_HOUR = datetime(2026, 11, 21, 0, tzinfo=UTC)  # the generator's first hour
HOURS = [FIRST_HOUR, FIRST_HOUR + timedelta(hours=1)]
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]
COMPARED = ("commitlog", "segments", "rejected", "consumequeue", "indexfile", "compaction_log", "compaction_cq")


@pytest.fixture(scope="module")
def landing(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("input")
    generate(root, messages=400, topics=TOPICS, hours=len(HOURS), bad_rate=0.01, seed=21)
    return root / "landing"


def rmqlake_home(folder: Path) -> Path:
    """A checkout as the spark-submit runner needs it: ``jobs/``, ``dist/rmqlake.zip`` (as `make package`) and
    ``.jars/rmqlake-jvm.jar`` (as `make jars`: the runner ships it, the test overlay's ingest parses with it)."""
    (folder / "jobs").symlink_to(REPO / "jobs")
    (folder / ".jars").mkdir()
    (folder / ".jars" / "rmqlake-jvm.jar").symlink_to(REPO / ".jars" / "rmqlake-jvm.jar")
    (folder / "dist").mkdir()
    with zipfile.ZipFile(folder / "dist" / "rmqlake.zip", "w", zipfile.ZIP_DEFLATED) as package:
        for path in sorted((REPO / "lib" / "rmqlake").rglob("*.py")):
            package.write(path, path.relative_to(REPO / "lib"))
    return folder


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    """A migrated metadata DB, the pool the specs use, the spark connection, specs without retry delays and a
    checkout with the package."""
    specs = tmp_path_factory.mktemp("pipelines")
    for path in (REPO / "pipelines").glob("*.yaml"):
        spec = yaml.safe_load(path.read_text())
        for task in spec["tasks"].values():
            task["retries"] = 0  # a retry would wait minutes; the failure is the point here
        (specs / path.name).write_text(yaml.safe_dump(spec))
    lake = tmp_path_factory.mktemp("airflow-lake") / "lake"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RMQLAKE_RUNNER", "spark-submit-operator")
        patch.setenv("RMQLAKE_HOME", str(rmqlake_home(tmp_path_factory.mktemp("home"))))
        patch.setenv("RMQLAKE_LAKE", str(lake))
        patch.setenv("RMQLAKE_ENV", "test")
        patch.delenv("SPARK_CONF_DIR", raising=False)  # as `make test` runs: see JOB_PROCESS_JVM_OPTIONS
        patch.setenv("SPARK_SUBMIT_OPTS", JOB_PROCESS_JVM_OPTIONS)  # the spark-submit JVMs of the tasks
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        patch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")  # spark-submit of this virtualenv
        patch.setenv("AIRFLOW_CONN_SPARK_RMQLAKE", json.dumps({"conn_type": "spark", "host": "local[2]"}))
        subprocess.run([str(BIN / "airflow"), "db", "migrate"], check=True, capture_output=True, timeout=300)
        from airflow.models.pool import Pool

        Pool.create_or_update_pool("rmqlake_lake", 1, "one job writes a lake at a time", include_deferred=False)
        bag = DagBag(dag_folder=str(dag_folder_for(specs, tmp_path_factory.mktemp("dags"))))
        assert bag.import_errors == {}
        yield bag, lake


def run_hour(dag, hour: datetime, landing: Path) -> dict[str, str]:
    """One DAG run for the hour [hour, hour + 1h); returns the state of each task."""
    # a run triggered at T covers the interval that ends at T (Airflow 3's manual runs)
    run = dag.test(logical_date=hour + timedelta(hours=1), run_conf={"landing": str(landing)})
    assert run.data_interval_start == hour
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def asset_events() -> set[str]:
    """URIs of the Assets with an event in the metadata DB: what a DAG scheduled on them would run after."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return {event.uri for event in session.scalars(select(AssetEvent))}


def pipeline_run(lake: Path, hour: datetime, landing: Path) -> tuple[int, dict[str, str]]:
    """``rmqlake pipeline run ingest_hourly`` for the hour, as a process: exit code and task states."""
    spec = ["pipeline", "run", "ingest_hourly", "--logical-date", hour.isoformat(), "--param", f"landing={landing}"]
    done = subprocess.run(
        [str(BIN / "rmqlake"), *spec, "--conf", str(CONF), "--env", "test", "--lake", str(lake), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"task"')]
    assert lines, done.stderr[-3000:]
    return done.returncode, {line["task"]: line["state"] for line in lines}


def one_by_one(lake: Path, landing: Path, missing: Path) -> dict:
    """The first hour, the second before it landed, then the second: each run's exit code and task states,
    and the table versions after the first run and after the failed one."""
    runs: dict = {"first": pipeline_run(lake, HOURS[0], landing)}
    runs["versions_before"] = {name: Lake(str(lake)).version(name) for name in TABLES}
    runs["failed"] = pipeline_run(lake, HOURS[1], missing)
    runs["versions_after"] = {name: Lake(str(lake)).version(name) for name in TABLES}
    runs["second"] = pipeline_run(lake, HOURS[1], landing)
    return runs


def lake_rows(lake: Path, table: str) -> list[dict]:
    rows = Lake(str(lake)).read_arrow(table).to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_ingest_hourly_runs_past_hours_in_order_and_a_failed_hour_changes_nothing(airflow, landing, tmp_path):
    bag, lake = airflow
    dag = bag.dags["ingest_hourly"]
    assert all(isinstance(task, SparkSubmitOperator) for task in dag.tasks)
    # the same spec run locally, hour by hour, with a missing hour in between (`rmqlake pipeline run`)
    local_lake = tmp_path / "one-by-one"
    with ThreadPoolExecutor(max_workers=1) as pool:
        local = pool.submit(one_by_one, local_lake, landing, tmp_path / "not-landed-yet")

        first = run_hour(dag, HOURS[0], landing)
        assert first == {"ingest": "success", "reput": "success", "compact": "success", "quality": "success"}
        assert {"rmqlake://default/commitlog", "rmqlake://default/consumequeue"} <= asset_events()  # DAGs can follow
        state = Lake(str(lake)).state()
        assert state.runs["ingest"].at == "2026-11-21T01:00:00+00:00"  # --now is the interval's end
        assert state.runs["ingest"].metrics["rows_out"] > 0
        assert state.dispatched_offset == state.next_offset

        versions = {name: Lake(str(lake)).version(name) for name in TABLES}
        seq = Lake(str(lake)).ledger().seq
        failed = run_hour(dag, HOURS[1], tmp_path / "not-landed-yet")
        assert failed == {"ingest": "failed", "reput": "upstream_failed", "compact": "upstream_failed"} | {
            "quality": "upstream_failed"
        }
        after = Lake(str(lake))
        assert {name: after.version(name) for name in TABLES} == versions and after.ledger().seq == seq
        assert after.pending_tables() == []

        second = run_hour(dag, HOURS[1], landing)  # the hour has landed: re-run it
        assert set(second.values()) == {"success"}
        assert Lake(str(lake)).state().runs["quality"].metrics["critical_failures"] == 0  # passed, on both hours

        # the runs a backfill of these hours creates are these intervals, in this order
        window = ["--from-date", HOURS[0].isoformat(), "--to-date", HOURS[-1].isoformat()]
        reprocess = ["--reprocess-behavior", "completed"]  # list them although runs of those intervals exist
        planned = subprocess.run(
            [str(BIN / "airflow"), "backfill", "create", "--dag-id", "ingest_hourly", "--dry-run", *window, *reprocess],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert planned.returncode == 0, planned.stderr[-2000:]
        logical_dates = re.findall(
            r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)\+00:00", planned.stdout.split("Runs to be")[-1]
        )
        assert [datetime.fromisoformat(d).replace(tzinfo=UTC) for d in logical_dates] == HOURS

        runs = local.result(timeout=1200)
    assert runs["first"] == (0, first)
    assert runs["failed"] == (1, failed)
    assert runs["versions_after"] == runs["versions_before"]
    assert runs["second"] == (0, second)
    manifest = json.loads((landing.parent / "MANIFEST.json").read_text())
    topics = Lake(str(local_lake)).state().commitlog.topics
    assert sum(t.messages for t in topics.values()) == manifest["messages"]
    for table in COMPARED:
        assert lake_rows(lake, table) == lake_rows(local_lake, table), f"{table} differs"
