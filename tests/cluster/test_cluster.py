"""Every job on a real Spark standalone cluster: a master and two workers (separate JVMs and Python workers, own
work directories, 127.0.0.1), each job submitted with ``--py-files dist/rmqlake.zip`` as users do; the tables
and the exported store must equal those of the same jobs run locally. ``make cluster-test`` runs this module
(CI runs it after ``make test``); the cluster is stopped afterwards, also when a test fails.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from rmqlake.cli import main
from rmqlake.generate import TopicPlan, generate
from tests.cluster.standalone import master_state, standalone_cluster
from tests.conftest import CONF, REPO
from tests.e2e.processes import environment, rows

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]
SETTINGS = [
    "--env", "test",
    "--set", "store.commitlog_segment_size=16384",
    "--set", "store.cq_units_per_file=64",
    "--set", "store.index_slots=256",
    "--set", "store.index_max_entries=300",
    "--set", "retention.max_segments_per_run=5",
]  # fmt: skip
NOW = "2026-11-22T00:00:00Z"
EXPIRE_AT = "2026-11-25T04:00:00Z"
COMPARED = {
    "commitlog": [],
    "segments": [],
    "rejected": [],
    "ingest_files": [],
    "consumequeue": [],
    "indexfile": [],
    "indexfile_header": [],
    "compaction_log": [],
    "compaction_cq": [],
    "dq_results": ["run_id", "checked_at"],  # who checked and when; what was checked must be the same
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and two 1-core workers; yields the master URL and UI port; always stopped afterwards."""
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), environment()) as running:
        yield running


@pytest.fixture(scope="module")
def package():
    subprocess.run(["make", "package"], cwd=REPO, check=True, capture_output=True, timeout=600)
    return REPO / "dist" / "rmqlake.zip"


DELTA_JARS = sorted(str(p) for p in (REPO / ".jars" / "delta").glob("*.jar"))
JVM_JAR = str(REPO / ".jars" / "rmqlake-jvm.jar")  # ingest's JVM parser (the test overlay asks for it)


def submit(cluster: dict, package: Path, script: str, *args: str, jars: list[str] = ()) -> subprocess.CompletedProcess:
    """spark-submit to the cluster; ``jars`` go with ``--jars``, as a user ships the Delta Lake jars."""
    command = [
        str(BIN / "spark-submit"),
        *("--master", cluster["url"]),
        *("--py-files", str(package)),
        *(("--jars", ",".join(jars)) if jars else ()),
        *("--conf", f"spark.pyspark.python={sys.executable}"),
        *("--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2"),
        *("--conf", "spark.sql.shuffle.partitions=4"),
        script,
        *args,
    ]
    # --py-files puts the zip on PYTHONPATH of the driver and of every Python worker, ahead of site-packages
    # (where this checkout's editable install points at lib/): the probe test shows which one is imported
    result = subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr[-4000:]}"
    return result


JOBS = [
    ("ingest", ["--input", "{landing}/dt=2026-11-21/hour=00", "--now", NOW]),
    ("reput", []),
    ("ingest", ["--input", "{landing}/dt=2026-11-21/hour=01", "--now", NOW]),
    ("reput", []),
    ("compact", ["--now", NOW]),
    ("expire", ["--now", EXPIRE_AT]),
    ("quality", []),
    ("export_store", ["--out", "{store}"]),
]


def test_executors_import_the_shipped_package(cluster, package, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import rmqlake\n"
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        "where = spark.sparkContext.parallelize(range(4), 4).map(lambda _: __import__('rmqlake').__file__).collect()\n"
        "print('DRIVER', rmqlake.__file__)\n"
        "print('EXECUTORS', sorted(set(where)))\n"
    )
    out = submit(cluster, package, str(probe)).stdout
    driver = next(line for line in out.splitlines() if line.startswith("DRIVER"))
    executors = next(line for line in out.splitlines() if line.startswith("EXECUTORS"))
    assert "rmqlake.zip" in driver and executors.count("rmqlake.zip") >= 1 and str(REPO / "lib") not in executors


def test_every_job_on_the_cluster_under_both_engines_equals_the_local_run(cluster, package, tmp_path):
    """The cluster runs every job with delta-rs and, the Delta Lake jars shipped with --jars, with delta-spark;
    ingest parses in the JVM (its jar shipped with --jars) in the first, in Python in the second."""
    assert len(DELTA_JARS) == 2, "the Delta Lake jars are missing from .jars/delta: run `make jars`"
    assert Path(JVM_JAR).is_file(), "run `make jars`: it builds .jars/rmqlake-jvm.jar"
    generate(tmp_path / "in", messages=600, topics=TOPICS, hours=2, bad_rate=0.01, seed=31)
    landing = tmp_path / "in" / "landing"
    lakes = {"cluster": tmp_path / "cluster-lake", "cluster-delta-spark": tmp_path / "ds-lake", "local": tmp_path / "l"}
    for name, lake in lakes.items():
        for job, options in JOBS:
            args = [a.format(landing=landing, store=tmp_path / f"{name}-store") for a in options]
            args += ["--conf", str(CONF), "--lake", str(lake), *SETTINGS]
            if name == "cluster":
                result = submit(cluster, package, f"jobs/{job}.py", *args, "--json", jars=[JVM_JAR])
                if job == "ingest":
                    metrics = json.loads(result.stdout.strip().splitlines()[-1])
                    assert metrics["lines_parsed_in_jvm"] > 0.9 * metrics["rows_out"], metrics
            elif name == "cluster-delta-spark":
                submit(cluster, package, f"jobs/{job}.py", *args, "--set", "lake.engine=delta-spark",
                       "--set", "ingest.parser=python", jars=DELTA_JARS)  # fmt: skip
            else:
                assert main([job.replace("_", "-"), *args]) == 0, job
    assert master_state(cluster["ui"])["completedapps"]  # the jobs really ran on this cluster
    history = DeltaTable(str(lakes["cluster-delta-spark"] / "commitlog")).history()
    assert all("Delta-Lake/4.1.0" in c.get("engineInfo", "") for c in history)  # committed by the extension
    for name in ("cluster", "cluster-delta-spark"):
        for table, volatile in COMPARED.items():
            got = [{k: v for k, v in r.items() if k not in volatile} for r in rows(lakes[name], table)]
            expected = [{k: v for k, v in r.items() if k not in volatile} for r in rows(lakes["local"], table)]
            assert got == expected, f"table {table} differs between the {name} run and the local run"
        assert _checksums(tmp_path / f"{name}-store") == _checksums(tmp_path / "local-store")


def _checksums(store: Path) -> dict[str, str]:
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.rglob("*"))
        if p.is_file()
        and p.name not in ("topics.json", "consumerOffset.json", "subscriptionGroup.json", "delayOffset.json")  # clocks
    }
