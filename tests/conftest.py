"""Shared fixtures: one SparkSession for the whole run, the JDK oracle, settings for a temp lake."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqlake.config import SparkSettings, load_settings
from rmqlake.session import driver_java_options
from tests.java_oracle import JavaOracle

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
# For the jobs the tests start as processes (rmqlake, spark-submit), read by Spark's launcher: such a JVM lives
# a minute at most, on small data, so it spends its time starting up and compiling, and the client-only JIT
# compiles far less; nobody looks at its web UI. Spark, Delta and the jobs run as they do for users, and with
# what rmqlake gives a driver JVM it starts itself (the class-data archive of `make jars`, quiet logging): the
# processes run with SPARK_CONF_DIR unset, as `make test` runs them.
JOB_PROCESS_JIT_AND_UI = "-XX:TieredStopAtLevel=1 -Dspark.ui.enabled=false"
JOB_PROCESS_JVM_OPTIONS = f"{JOB_PROCESS_JIT_AND_UI} {driver_java_options(SparkSettings(), conf_dir=CONF)}"


@pytest.fixture(scope="session")
def spark():
    """``local[2]`` with the Delta Lake extension loaded (jars from ``make jars``), so that a test picks the
    engine per lake with ``lake.engine``; lakes of the default delta-rs engine never go through it."""
    from rmqlake.config import SparkSettings
    from rmqlake.logs import configure_logging
    from rmqlake.session import get_spark

    configure_logging("INFO")
    settings = SparkSettings(master="local[2]", shuffle_partitions=2, delta_jars=str(REPO / ".jars" / "delta"))
    session = get_spark(settings, conf_dir=CONF, app_name="rmqlake-tests", delta_extension=True)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def java_oracle(tmp_path_factory):
    oracle = JavaOracle(tmp_path_factory.mktemp("java"))
    yield oracle
    oracle.close()


def make_settings(lake: Path, *overrides: str, env: str | None = "test"):
    """Settings for a lake under a test's tmp_path (test overlay + ``--set`` style overrides)."""
    return load_settings(CONF, env=env, overrides=list(overrides), lake=str(lake))
