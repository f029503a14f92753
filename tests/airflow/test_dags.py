"""The DAG factory: each spec in ``pipelines/`` is a DAG with the spec's schedule, tasks and edges (DagBag, no
database); parsing the DAG file has no side effects."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import pytest
import yaml
from airflow.dag_processing.dagbag import DagBag
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, Param

from rmqlake.pipelines import load_pipeline, render_doc
from rmqlake.steps import TABLES_WRITTEN
from tests.conftest import REPO

DAG_FILE = REPO / "airflow_dags" / "rmqlake_dags.py"
SPECS = sorted((REPO / "pipelines").glob("*.yaml"))
# Airflow's cron presets, as its timetables summarise them
AIRFLOW_PRESETS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *"}


@pytest.fixture(scope="module")
def bag() -> DagBag:
    bag = DagBag(dag_folder=str(REPO / "airflow_dags"))
    assert bag.import_errors == {}
    return bag


def dag_folder_for(specs: Path, folder: Path) -> Path:
    """A DAG folder whose one file builds the DAGs of the specs in ``specs`` with the factory."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "specs_dags.py").write_text(
        "# airflow DAG file: the rmqlake DAG factory over a given spec folder\n"
        "from pathlib import Path\n\n"
        "from airflow_dags.rmqlake_dags import build_dags\n\n"
        f"globals().update(build_dags(Path({str(specs)!r})))\n"
    )
    return folder


def test_every_spec_is_a_dag(bag):
    assert set(bag.dag_ids) == {yaml.safe_load(path.read_text())["name"] for path in SPECS}


@pytest.mark.parametrize("path", SPECS, ids=[path.stem for path in SPECS])
def test_the_dag_has_the_spec_schedule_tasks_and_edges(bag, path: Path):
    spec = yaml.safe_load(path.read_text())
    dag = bag.dags[spec["name"]]
    assert dag.timetable.summary == AIRFLOW_PRESETS.get(spec["schedule"], spec["schedule"])
    assert dag.catchup is spec.get("catchup", False)
    assert dag.max_active_runs == spec.get("max_active_runs")
    edges = {name: sorted(task.get("depends_on", [])) for name, task in spec["tasks"].items()}
    assert {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks} == edges
    order = [t.task_id for t in dag.topological_sort()]  # no cycle; every task after what it depends on
    assert all(order.index(upstream) < order.index(name) for name, ups in edges.items() for upstream in ups)
    for name, task in spec["tasks"].items():
        operator = dag.get_task(name)
        assert isinstance(operator, SparkSubmitOperator)
        assert operator.application == f"jobs/{task['job']}.py"
        assert operator.retries == task.get("retries", operator.retries)
        assert operator.pool == spec.get("pool", operator.pool)


@pytest.mark.parametrize("path", SPECS, ids=[path.stem for path in SPECS])
def test_the_dag_is_documented_from_its_spec(bag, path: Path):
    spec = yaml.safe_load(path.read_text())
    dag = bag.dags[spec["name"]]
    assert dag.doc_md == render_doc(load_pipeline(path))
    assert spec["description"] in dag.doc_md and spec["doc"].strip() in dag.doc_md
    assert all(f"| `{name}` | `{task['job']}` |" in dag.doc_md for name, task in spec["tasks"].items())
    assert set(dag.tags) == {"rmqlake", *spec["tags"]}


@pytest.mark.parametrize("path", SPECS, ids=[path.stem for path in SPECS])
def test_params_are_typed_and_described(bag, path: Path):
    spec = yaml.safe_load(path.read_text())
    params = bag.dags[spec["name"]].params
    assert set(params) == set(spec.get("params", {}))
    for name, declared in spec.get("params", {}).items():
        param = params.get_param(name)
        assert isinstance(param, Param)
        assert (param.value, param.description) == (declared["default"], declared["description"])
        assert param.schema["type"] == "string" and param.description


@pytest.mark.parametrize("path", SPECS, ids=[path.stem for path in SPECS])
def test_each_task_outlets_the_assets_of_the_tables_its_job_writes(bag, path: Path):
    spec = yaml.safe_load(path.read_text())
    dag = bag.dags[spec["name"]]
    for name, task in spec["tasks"].items():
        outlets = dag.get_task(name).outlets
        assert all(isinstance(outlet, Asset) for outlet in outlets)
        expected = [f"rmqlake://{spec.get('lake', 'default')}/{table}" for table in TABLES_WRITTEN[task["job"]]]
        assert [outlet.uri for outlet in outlets] == expected
        assert [outlet.name for outlet in outlets] == expected  # what a user's Asset("rmqlake://...") names
    writers = [t for t in dag.tasks if any(o.uri.endswith("/commitlog") for o in t.outlets)]
    assert [t.task_id for t in writers] == [
        n for n, t in spec["tasks"].items() if "commitlog" in TABLES_WRITTEN[t["job"]]
    ]


def test_the_spark_submit_runner_refuses_to_run_without_the_package(bag, monkeypatch, tmp_path):
    task = bag.dags["ingest_hourly"].get_task("reput")
    submitted = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(self.py_files))
    monkeypatch.setenv("RMQLAKE_RUNNER", "spark-submit-operator")
    monkeypatch.setenv("RMQLAKE_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"dist/rmqlake\.zip does not exist.*Run `make package`"):
        task.execute({})
    assert submitted == []  # nothing was submitted
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "rmqlake.zip").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    task.execute({})
    assert submitted == [str(tmp_path / "dist" / "rmqlake.zip")]


def test_jobs_get_the_data_interval_not_the_wall_clock(bag):
    task = bag.dags["ingest_hourly"].get_task("ingest")
    arguments = " ".join(task.application_args)
    assert "data_interval_start" in arguments and "--now {{ data_interval_end.isoformat() }}" in arguments
    assert {t.pool for t in bag.dags["ingest_hourly"].tasks} == {"rmqlake_lake"}


def test_the_runner_and_checkout_are_the_workers_read_when_the_task_runs(bag, monkeypatch, tmp_path):
    task = bag.dags["ingest_hourly"].get_task("ingest")
    task.application_args = ["--input", "landing/dt=2026-11-21/hour=04"]  # as rendered
    launched = {}

    class Hook:
        def run_command(self, *, command, env, cwd):
            launched.update(command=command, env=env, cwd=cwd)
            return type("Result", (), {"exit_code": 0})()

    monkeypatch.setattr("airflow.providers.standard.hooks.subprocess.SubprocessHook", Hook)
    monkeypatch.setenv("RMQLAKE_RUNNER", "local")
    monkeypatch.setenv("RMQLAKE_HOME", str(tmp_path))
    monkeypatch.setenv("RMQLAKE_LAKE", "/data/lake")
    monkeypatch.delenv("RMQLAKE_CONF", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "log4j2.properties").write_text("rootLogger.level = warn\n")
    task.execute({})
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    job = str(tmp_path / "jobs" / "ingest.py")
    java = [
        "--driver-java-options",
        f"-Xlog:disable -Xlog:all=warning:stderr -Dlog4j2.configurationFile={tmp_path}/conf/log4j2.properties",
    ]
    assert launched["command"] == [spark_submit, "--master", "local[2]", *java, job, *task.application_args]
    assert launched["cwd"] == str(tmp_path) and launched["env"]["RMQLAKE_LAKE"] == "/data/lake"
    jar = tmp_path / ".jars" / "rmqlake-jvm.jar"  # where `make jars` builds it: shipped with --jars
    jar.parent.mkdir()
    jar.write_bytes(b"PK\x05\x06" + bytes(18))
    archive = tmp_path / ".jars" / "spark-classes.jsa"  # where `make jars` makes it: the driver JVM maps it
    archive.write_bytes(b"archive")
    task.execute({})
    task.execute({})  # a retry ships it once
    java[1] += f" -XX:SharedArchiveFile={archive} -Xshare:auto"
    assert launched["command"] == [spark_submit, "--master", "local[2]", *java, "--jars", str(jar), job,
                                   *task.application_args]  # fmt: skip
    monkeypatch.setenv("RMQLAKE_RUNNER", "yarn")
    with pytest.raises(ValueError, match="RMQLAKE_RUNNER='yarn'; allowed: spark-submit-operator, local"):
        task.execute({})


def test_a_bad_spec_is_an_import_error_naming_the_field(tmp_path: Path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "broken.yaml").write_text(
        "name: broken\nschedule: every hour\nstart_date: 2026-11-21\ntasks:\n  a: {job: ingest, depends_on: [b]}\n"
    )
    bag = DagBag(dag_folder=str(dag_folder_for(specs, tmp_path / "dags")))
    (error,) = bag.import_errors.values()
    assert "schedule" in error and "'every hour' is neither a preset" in error


class RecordingEnviron(MutableMapping):
    """``os.environ`` that remembers which names were looked up, and who looked."""

    def __init__(self, real):
        self.real, self.reads = real, []

    def _record(self, name):
        frame = sys._getframe(2)
        if frame.f_code.co_filename == os.__file__ or frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back  # os.getenv: who called it
        caller = frame.f_code.co_filename
        self.reads.append((name, caller))

    def __getitem__(self, name):
        self._record(name)
        return self.real[name]

    def get(self, name, default=None):
        self._record(name)
        return self.real.get(name, default)

    def __contains__(self, name):
        self._record(name)
        return name in self.real

    def __setitem__(self, name, value):
        raise AssertionError(f"the DAG file sets {name}")

    def __delitem__(self, name):
        raise AssertionError(f"the DAG file deletes {name}")

    def __iter__(self) -> Iterator[str]:
        self._record("*")
        return iter(self.real)

    def __len__(self):
        return len(self.real)


def test_parsing_the_dag_file_reads_no_environment_and_leaves_sys_path_alone(monkeypatch):
    path_before = list(sys.path)
    environ = RecordingEnviron(os.environ)
    monkeypatch.setattr(os, "environ", environ)
    spec = importlib.util.spec_from_file_location("rmqlake_dags_parsed", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.undo()
    assert sys.path == path_before
    assert dict(os.environ) == dict(environ.real)
    # Airflow reads its own settings (AIRFLOW__*) while DAGs are built; the DAG file and rmqlake read none (the
    # virtualenv may live inside the checkout: its packages are not ours)
    ours_roots = (str(REPO / "airflow_dags"), str(REPO / "lib"))
    ours = [(name, caller) for name, caller in environ.reads if caller.startswith(ours_roots)]
    assert ours == []
    assert {yaml.safe_load(path.read_text())["name"] for path in SPECS} <= set(vars(module))
