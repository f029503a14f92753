"""The class-data archive ``make jars`` makes (``spark.class_archive``), in the job processes rmqlake starts:
Spark's classes come from it. A stale archive is done without: the job runs, the JVM's warning is on stderr
and stdout holds only the job's JSON."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pyspark
import pytest

from tests.conftest import JOB_PROCESS_JIT_AND_UI
from tests.e2e.processes import environment, ingest_args, rmqlake
from tests.java_oracle import _java_bin

pytestmark = pytest.mark.slow


def ingest_an_hour(tmp_path, landing, *overrides: str):
    hour = next(iter(sorted(landing.glob("dt=*/hour=*"))))
    settings = [a for o in overrides for a in ("--set", o)]
    # the test processes' JVM options without the archive: the one under test is the job's own
    return rmqlake(*ingest_args(tmp_path / "lake", hour), *settings, "--json",
                   env=environment(SPARK_SUBMIT_OPTS=JOB_PROCESS_JIT_AND_UI))  # fmt: skip


def test_a_job_process_starts_from_the_archive_make_jars_made(tmp_path, landing):
    loaded = tmp_path / "loaded.txt"  # where each class the JVM loads came from
    done = ingest_an_hour(tmp_path, landing, f"spark.conf.spark.driver.extraJavaOptions=-Xlog:class+load:file={loaded}")
    assert json.loads(done.stdout)["status"] == "ingested"
    assert "shared archive" not in done.stderr
    sources = dict(re.findall(r"\] (\S+) source: (.+)", loaded.read_text()))
    for name in ("org.apache.spark.SparkContext", "org.apache.spark.sql.execution.python.MapInArrowExec"):
        assert sources[name] == "shared objects file (top)", name  # the top archive: `make jars`'s


def test_a_job_process_does_without_an_archive_it_cannot_map(tmp_path, landing):
    # an archive of Spark classes from jars elsewhere, as a Spark installed again leaves: Spark's launcher, whose
    # main class exits at once without arguments, run from a copy of its jar
    launcher = shutil.copy(next(Path(pyspark.__file__).parent.glob("jars/spark-launcher_*.jar")), tmp_path)
    stale = tmp_path / "stale.jsa"
    subprocess.run([_java_bin("java"), f"-XX:ArchiveClassesAtExit={stale}", "-Xlog:disable", "-cp", launcher,
                    "org.apache.spark.launcher.Main"], capture_output=True, timeout=120)  # fmt: skip
    assert stale.is_file()
    done = ingest_an_hour(tmp_path, landing, f"spark.class_archive={stale}")
    assert json.loads(done.stdout)["status"] == "ingested"  # nothing but the JSON on stdout
    assert "Unable to use shared archive" in done.stderr
