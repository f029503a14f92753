"""One Airflow DAG per pipeline spec in ``pipelines/*.yaml`` (no DAG is written by hand).

Each task submits ``jobs/<job>.py`` with the spec's arguments, rendered by
Airflow from the run's data interval, so backfills and re-runs of a past
interval pass what the original run passed.

Parsing this file has no side effects and depends on nothing but the files:
the ``rmqlake`` package is installed in Airflow's environment, and the specs
are the ``pipelines`` folder next to this file's folder. How a job is
submitted is read from the worker's environment when the task runs:

* ``RMQLAKE_RUNNER``: ``spark-submit-operator`` (default: ``spark-submit``
  through the Spark connection ``RMQLAKE_SPARK_CONN``, default
  ``spark_rmqlake``, as SparkSubmitOperator of
  apache-airflow-providers-apache-spark does) or ``local``
  (``spark-submit --master local[2]`` on the worker);
* ``RMQLAKE_HOME``: the rmqlake checkout holding ``jobs/`` and
  ``dist/rmqlake.zip`` (default: this file's parent folder); the
  ``spark-submit-operator`` runner ships the zip with ``--py-files`` and
  fails when it is missing (``make package`` builds it); both runners ship
  ``.jars/rmqlake-jvm.jar`` of that checkout with ``--jars`` when it is
  there (``make jars`` builds it): ingest's JVM line parser; the ``local``
  runner starts the driver JVM with the options rmqlake gives one it starts
  itself (``spark.class_archive``: ``.jars/spark-classes.jsa`` of that checkout);
* ``RMQLAKE_CONF``, ``RMQLAKE_ENV``, ``RMQLAKE_LAKE``: passed to every job.

Each DAG carries its spec's documentation (``doc_md``), params (``Param``
with a type and a description), tags (``rmqlake`` and the spec's) and, per
task, the Assets of the lake tables its job writes (``outlets``,
``rmqlake://<lake>/<table>``), so other DAGs can be scheduled on them.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, Param
from airflow.timetables.interval import CronDataIntervalTimetable

from rmqlake.pipelines import PipelineSpec, TaskSpec, job_arguments, load_pipelines, param_type, render_doc

CHECKOUT = Path(__file__).resolve().parents[1]
PIPELINES = CHECKOUT / "pipelines"
RUNNERS = ("spark-submit-operator", "local")
DEFAULT_RUNNER = "spark-submit-operator"
DEFAULT_SPARK_CONN = "spark_rmqlake"
PACKAGE = Path("dist") / "rmqlake.zip"  # under RMQLAKE_HOME; `make package` builds it
JVM_JAR = Path(".jars") / "rmqlake-jvm.jar"  # under RMQLAKE_HOME; `make jars` builds it: ingest's JVM parser
CLASS_ARCHIVE = Path(".jars") / "spark-classes.jsa"  # under RMQLAKE_HOME; `make jars` makes it (local runner)
JOB_ENVIRONMENT = ("RMQLAKE_CONF", "RMQLAKE_ENV", "RMQLAKE_LAKE", "JAVA_HOME", "SPARK_CONF_DIR", "PYSPARK_PYTHON")


def job_environment() -> dict[str, str]:
    """What every job gets: where the conf and the lake are, and the Python that runs it (read on the worker)."""
    environment = {name: os.environ[name] for name in JOB_ENVIRONMENT if os.environ.get(name)}
    environment.setdefault("PYSPARK_PYTHON", sys.executable)
    return environment


class RmqlakeJobOperator(SparkSubmitOperator):
    """``spark-submit jobs/<job>.py`` with the spec's arguments; the runner, the checkout, the Spark connection
    and the job's environment are the worker's, read when the task runs (never while the DAG file is parsed)."""

    def __init__(self, *, job: str, **kwargs) -> None:
        super().__init__(application=f"jobs/{job}.py", conn_id=DEFAULT_SPARK_CONN, **kwargs)
        self.job = job

    def execute(self, context) -> None:
        runner = os.environ.get("RMQLAKE_RUNNER", DEFAULT_RUNNER)
        if runner not in RUNNERS:
            raise ValueError(f"RMQLAKE_RUNNER={runner!r}; allowed: {', '.join(RUNNERS)}")
        home = Path(os.environ.get("RMQLAKE_HOME", CHECKOUT))
        self.application = str(home / "jobs" / f"{self.job}.py")
        self.env_vars = job_environment()
        jar = home / JVM_JAR
        if jar.is_file() and str(jar) not in (self.jars or "").split(","):
            self.jars = ",".join(filter(None, [self.jars, str(jar)]))  # ingest parses in the JVM where it can
        if runner == "local":
            self.run_locally(home)
            return
        package = home / PACKAGE
        if not package.is_file():
            # without it, executors on other hosts could not import rmqlake: fail here, not inside Spark
            raise FileNotFoundError(
                f"{package} does not exist: the {runner} runner ships rmqlake to the executors with --py-files. "
                f"Run `make package` in {home} (or set RMQLAKE_HOME to a checkout where it ran)"
            )
        self.py_files = str(package)
        self._conn_id = os.environ.get("RMQLAKE_SPARK_CONN", DEFAULT_SPARK_CONN)
        self._hook = None  # built from the connection chosen above
        super().execute(context)

    def local_command(self, home: Path) -> list[str]:
        """``spark-submit --master local[2]`` of this virtualenv, the job and its rendered arguments.

        This Spark is the one ``make jars`` made the checkout's class-data archive with, on this machine: the
        driver JVM gets the options rmqlake gives one it starts itself (the archive when it is there)."""
        from rmqlake.config import SparkSettings
        from rmqlake.session import driver_java_options

        spark_submit = str(Path(sys.executable).parent / "spark-submit")
        jars = ["--jars", self.jars] if self.jars else []
        conf = os.environ.get("RMQLAKE_CONF") or home / "conf"
        java = driver_java_options(SparkSettings(class_archive=str(home / CLASS_ARCHIVE)), conf_dir=conf)
        return [spark_submit, "--master", "local[2]", "--driver-java-options", java, *jars, self.application,
                *self.application_args]  # fmt: skip

    def run_locally(self, home: Path) -> None:
        from airflow.providers.standard.hooks.subprocess import SubprocessHook

        self._subprocess = SubprocessHook()
        result = self._subprocess.run_command(
            command=self.local_command(home), env={**os.environ, **self.env_vars}, cwd=str(home)
        )
        if result.exit_code != 0:
            raise RuntimeError(f"spark-submit of {self.application} exited with {result.exit_code}")

    def on_kill(self) -> None:
        if getattr(self, "_subprocess", None) is not None:
            self._subprocess.send_sigterm()
        else:
            super().on_kill()


def build_dag(spec: PipelineSpec) -> DAG:
    """The DAG of one spec: its schedule as a cron data-interval timetable, its tasks and their edges."""
    schedule = CronDataIntervalTimetable(spec.cron, timezone="UTC") if spec.cron else "@once"
    with DAG(
        dag_id=spec.name,
        description=spec.description,
        doc_md=render_doc(spec),
        schedule=schedule,
        start_date=spec.start_date,
        catchup=spec.catchup,
        max_active_runs=spec.max_active_runs,
        params={name: _param(name, spec) for name in spec.params},
        tags=spec.dag_tags,
        default_args={"owner": "rmqlake"},
    ) as dag:
        operators = {name: _operator(name, spec.tasks[name], spec) for name in spec.order()}
        for name, task in spec.tasks.items():
            for upstream in task.depends_on:
                operators[upstream] >> operators[name]
    return dag


def build_dags(folder: Path) -> dict[str, DAG]:
    """One DAG per spec in ``folder``, by DAG id."""
    return {spec.name: build_dag(spec) for spec in load_pipelines(folder).values()}


def _param(name: str, spec: PipelineSpec) -> Param:
    default = spec.params[name]
    return Param(default, type=param_type(default), description=spec.param_descriptions.get(name))


def _operator(name: str, task: TaskSpec, spec: PipelineSpec) -> RmqlakeJobOperator:
    options = {
        "task_id": name,
        "outlets": [Asset(uri) for uri in spec.outlets(name)],
        "retries": task.retries,
        "retry_delay": timedelta(minutes=task.retry_delay_minutes),
        "execution_timeout": timedelta(minutes=task.timeout_minutes),
    }
    if spec.pool:
        options["pool"] = spec.pool
    return RmqlakeJobOperator(
        job=task.job, application_args=job_arguments(task), name=f"rmqlake-{spec.name}-{name}", **options
    )


globals().update(build_dags(PIPELINES))
