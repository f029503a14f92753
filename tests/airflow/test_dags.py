"""The DAG factory: every spec becomes a DAG with the expected schedule, tasks and edges (DagBag, no database)."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from rmqlake.pipelines import load_pipelines
from tests.conftest import REPO

EXPECTED = {
    "ingest_hourly": ("0 * * * *", {"ingest": [], "reput": ["ingest"], "compact": ["reput"], "quality": ["compact"]}),
    "compaction": ("*/15 * * * *", {"compact": [], "quality": ["compact"]}),
    "expiry": ("0 4 * * *", {"expire": [], "vacuum": ["expire"], "quality": ["expire"]}),
    "disk_check": ("*/10 * * * *", {"expire": []}),
    "consumer_offsets": ("0 * * * *", {"offsets": [], "lag": ["offsets"]}),
}


def dag_bag(monkeypatch, runner: str) -> DagBag:
    monkeypatch.setenv("RMQLAKE_RUNNER", runner)
    return DagBag(dag_folder=str(REPO / "airflow_dags"))


@pytest.mark.parametrize("runner", ["spark-submit-operator", "local"])
def test_every_spec_is_a_dag_with_its_schedule_tasks_and_edges(monkeypatch, runner):
    bag = dag_bag(monkeypatch, runner)
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == set(EXPECTED) == set(load_pipelines(REPO / "pipelines"))
    for dag_id, (cron, edges) in EXPECTED.items():
        dag = bag.dags.get(dag_id)
        assert dag.timetable.summary == cron
        assert {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks} == edges
        assert [t.task_id for t in dag.topological_sort()]  # no cycle
        assert dag.max_active_runs == 1
    ingest = bag.dags.get("ingest_hourly")
    assert ingest.catchup is True and ingest.get_task("ingest").retries == 2
    assert {t.pool for t in ingest.tasks} == {"rmqlake_lake"}
    operator = type(ingest.get_task("ingest")).__name__
    assert operator == ("SparkSubmitOperator" if runner != "local" else "BashOperator")


def test_jobs_get_the_data_interval_not_the_wall_clock(monkeypatch):
    bag = dag_bag(monkeypatch, "spark-submit-operator")
    task = bag.dags.get("ingest_hourly").get_task("ingest")
    arguments = " ".join(task.application_args)
    assert "data_interval_start" in arguments and "--now {{ data_interval_end.isoformat() }}" in arguments
    assert task.application.endswith("jobs/ingest.py")


def test_a_bad_spec_is_an_import_error_naming_the_field(monkeypatch, tmp_path: Path):
    (tmp_path / "broken.yaml").write_text(
        "name: broken\nschedule: every hour\nstart_date: 2026-11-21\ntasks:\n  a: {job: ingest, depends_on: [b]}\n"
    )
    monkeypatch.setenv("RMQLAKE_PIPELINES", str(tmp_path))
    bag = dag_bag(monkeypatch, "local")
    (error,) = bag.import_errors.values()
    assert "schedule" in error and "'every hour' is neither a preset" in error
