"""One Airflow DAG per pipeline spec in ``pipelines/*.yaml`` (no DAG is written by hand).

Each task submits ``jobs/<job>.py`` with the spec's arguments, rendered by
Airflow from the run's data interval, so backfills and re-runs of a past
interval pass what the original run passed. Configure with environment
variables of the scheduler and workers:

* ``RMQLAKE_HOME``: the rmqlake checkout (default: this file's parent folder);
* ``RMQLAKE_PIPELINES``: the spec folder (default ``$RMQLAKE_HOME/pipelines``);
* ``RMQLAKE_RUNNER``: ``spark-submit-operator`` (default: SparkSubmitOperator of
  apache-airflow-providers-apache-spark, through the connection
  ``RMQLAKE_SPARK_CONN``, default ``spark_rmqlake``) or ``local`` (a
  BashOperator running ``spark-submit --master local[2]`` on the worker);
* ``RMQLAKE_CONF``, ``RMQLAKE_ENV``, ``RMQLAKE_LAKE``: passed to every job.
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import timedelta
from pathlib import Path

HOME = Path(os.environ.get("RMQLAKE_HOME", Path(__file__).resolve().parents[1]))
if str(HOME / "lib") not in sys.path:  # a checkout without the package installed
    sys.path.insert(0, str(HOME / "lib"))

from airflow.sdk import DAG  # noqa: E402
from airflow.timetables.interval import CronDataIntervalTimetable  # noqa: E402

from rmqlake.pipelines import PipelineSpec, TaskSpec, job_arguments, load_pipelines  # noqa: E402

PIPELINES = Path(os.environ.get("RMQLAKE_PIPELINES", HOME / "pipelines"))
RUNNER = os.environ.get("RMQLAKE_RUNNER", "spark-submit-operator")
SPARK_CONN = os.environ.get("RMQLAKE_SPARK_CONN", "spark_rmqlake")
RUNNERS = ("spark-submit-operator", "local")


def job_environment() -> dict[str, str]:
    """What every job gets: where the conf and the lake are, and the Python that runs it."""
    names = ("RMQLAKE_CONF", "RMQLAKE_ENV", "RMQLAKE_LAKE", "JAVA_HOME", "SPARK_CONF_DIR", "PYSPARK_PYTHON")
    environment = {name: os.environ[name] for name in names if os.environ.get(name)}
    environment.setdefault("PYSPARK_PYTHON", sys.executable)
    return environment


def build_dag(spec: PipelineSpec) -> DAG:
    """The DAG of one spec: its schedule as a cron data-interval timetable, its tasks and their edges."""
    if RUNNER not in RUNNERS:
        raise ValueError(f"RMQLAKE_RUNNER={RUNNER!r}; allowed: {', '.join(RUNNERS)}")
    schedule = CronDataIntervalTimetable(spec.cron, timezone="UTC") if spec.cron else "@once"
    with DAG(
        dag_id=spec.name,
        description=spec.description,
        schedule=schedule,
        start_date=spec.start_date,
        catchup=spec.catchup,
        max_active_runs=spec.max_active_runs,
        params=dict(spec.params),
        tags=["rmqlake"],
        default_args={"owner": "rmqlake"},
    ) as dag:
        operators = {name: _operator(name, spec.tasks[name], spec) for name in spec.order()}
        for name, task in spec.tasks.items():
            for upstream in task.depends_on:
                operators[upstream] >> operators[name]
    return dag


def _operator(name: str, task: TaskSpec, spec: PipelineSpec):
    common = {
        "task_id": name,
        "retries": task.retries,
        "retry_delay": timedelta(minutes=task.retry_delay_minutes),
        "execution_timeout": timedelta(minutes=task.timeout_minutes),
    }
    if spec.pool:
        common["pool"] = spec.pool
    application = str(HOME / "jobs" / f"{task.job}.py")
    arguments = job_arguments(task)
    package = HOME / "dist" / "rmqlake.zip"
    if RUNNER == "local":
        from airflow.providers.standard.operators.bash import BashOperator

        spark_submit = shlex.quote(str(Path(sys.executable).parent / "spark-submit"))
        # arguments are Jinja templates rendered before bash reads them: quote the rendered values, not the templates
        rendered = [f'"{argument}"' if '"' not in argument else argument for argument in arguments]
        command = " ".join([spark_submit, "--master", "'local[2]'", shlex.quote(application), *rendered])
        return BashOperator(bash_command=command, env=job_environment(), append_env=True, cwd=str(HOME), **common)
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return SparkSubmitOperator(
        application=application,
        application_args=arguments,
        conn_id=SPARK_CONN,
        py_files=str(package) if package.exists() else None,
        name=f"rmqlake-{spec.name}-{name}",
        env_vars=job_environment(),
        **common,
    )


for _spec in load_pipelines(PIPELINES).values():
    globals()[_spec.name] = build_dag(_spec)
