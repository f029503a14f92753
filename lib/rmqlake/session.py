"""The one place that builds a SparkSession.

Under ``spark-submit`` the submitted master and settings win and only
rmqlake's SQL settings are added; in a plain Python process (the
``rmqlake`` CLI, tests) the session is built from the ``spark`` conf
section. Either way Spark is never asked to download anything.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from pathlib import Path

from rmqlake.config import SparkSettings
from rmqlake.errors import ConfigError

log = logging.getLogger(__name__)

# Settings rmqlake's jobs rely on, whatever the cluster.
REQUIRED_SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.debug.maxToStringFields": "200",
}
_DOWNLOAD_FLAGS = ("--packages", "--repositories")


def under_spark_submit() -> bool:
    """True when this Python process was started by ``spark-submit``."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _find_java17() -> str | None:
    for pattern in ("/usr/lib/jvm/java-17-openjdk*", "/usr/lib/jvm/*17*"):
        for candidate in sorted(glob.glob(pattern)):
            if os.path.exists(os.path.join(candidate, "bin", "java")):
                return candidate
    return None


def prepare_environment(conf_dir: str | Path | None = None) -> None:
    """Environment variables a local PySpark launch needs (only those not already set)."""
    if "JAVA_HOME" not in os.environ:
        java = _find_java17()
        if java:
            os.environ["JAVA_HOME"] = java
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if conf_dir is not None and "SPARK_CONF_DIR" not in os.environ:
        log4j = Path(conf_dir) / "log4j2.properties"
        if log4j.exists():
            os.environ["SPARK_CONF_DIR"] = str(Path(conf_dir).resolve())
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if any(flag in submit_args.split() for flag in _DOWNLOAD_FLAGS):
        raise ConfigError(
            "PYSPARK_SUBMIT_ARGS asks Spark to download packages (--packages/--repositories); "
            "that hangs or fails offline. Ship jars with --jars instead."
        )


def get_spark(
    settings: SparkSettings | None = None, *, conf_dir: str | Path | None = None, app_name: str | None = None
):
    """Return the SparkSession, building it on first use.

    Args:
        settings: the ``spark`` conf section (defaults when ``None``).
        conf_dir: folder whose ``log4j2.properties`` quiets Spark's logging.
        app_name: overrides ``spark.app_name``.

    Raises:
        ConfigError: the settings would make Spark download jars.
    """
    settings = settings or SparkSettings()
    prepare_environment(conf_dir)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name or settings.app_name)
    if not under_spark_submit():
        builder = (
            builder.master(settings.master)
            .config("spark.driver.memory", settings.driver_memory)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    builder = builder.config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
    for key, value in {**settings.conf, **REQUIRED_SQL_CONF}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    packages = spark.sparkContext.getConf().get("spark.jars.packages", "")
    if packages:
        raise ConfigError(f"spark.jars.packages is set ({packages}); rmqlake jobs never download jars at run time")
    for key, value in REQUIRED_SQL_CONF.items():
        spark.conf.set(key, value)
    return spark
