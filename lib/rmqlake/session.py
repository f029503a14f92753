"""The one place that builds a SparkSession.

Under ``spark-submit`` the submitted master and settings win and only
rmqlake's SQL settings are added; in a plain Python process (the
``rmqlake`` CLI, tests) the session is built from the ``spark`` conf
section. Either way Spark is never asked to download anything: the Delta
Lake jars of ``lake.engine: delta-spark`` come from the folder ``make jars``
fills (``spark.delta_jars``), or from the user's ``--jars``.
"""

from __future__ import annotations

import glob
import logging
import os
import shlex
import stat
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

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# The two jars of the Delta Lake Spark extension (jars/pom.xml pins their version); Spark provides the rest.
DELTA_JARS = ("delta-spark_2.13", "delta-storage")
# Delta's own defaults are sized for big tables (50 partitions per log replay); rmqlake's tables have few
# files per commit. Applied only where the user did not set them.
DELTA_SQL_CONF = {"spark.databricks.delta.snapshotPartitions": "4"}
# Spark talks to its Python workers over TCP on the loopback by default: here each Python task then waited ~30 ms
# more than over a Unix domain socket (400 one-row tasks: 11.9 s against 5.1 s), which a job of small tasks (an
# export of 4 MiB segments, an import of small files) pays per task. A default only: the user's spark.conf wins.
PYTHON_WORKER_CONF = {"spark.python.unix.domain.socket.enabled": "true"}
CHECKOUT = Path(__file__).resolve().parents[2]  # lib/rmqlake/session.py -> the checkout, for .jars/delta


def under_spark_submit() -> bool:
    """True when this Python process was started by ``spark-submit``."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def separate_stderr() -> bool:
    """Under ``spark-submit``, send this process's stderr to the submitting JVM's stderr; return whether it did.

    Spark starts a Python driver with its stderr merged into its stdout, and copies both to the JVM's stdout:
    log lines would land among ``--json`` results. On Linux the JVM's stderr is ``/proc/<parent>/fd/2``. It is
    reopened only when it is a pipe or a terminal: the JVM's writes to a regular file go at the JVM's own file
    offset, and would overwrite ours. Anywhere else the streams stay merged, as Spark leaves them.
    """
    if not under_spark_submit():
        return False
    parent = os.getppid()
    try:
        if not os.path.basename(os.readlink(f"/proc/{parent}/exe")).startswith("java"):
            return False
        # non-blocking, so that the open never waits for a reader (a FIFO's open does where the kernel applies
        # FIFO rules to reopened pipes); writes are made blocking again below
        jvm_stderr = os.open(f"/proc/{parent}/fd/2", os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:  # not Linux, not ours to open, a socket, or a pipe without a reader
        return False
    try:
        mode = os.fstat(jvm_stderr).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            return False
        os.set_blocking(jvm_stderr, True)  # writes wait for a full pipe, as writes to stderr do
        sys.stderr.flush()
        os.dup2(jvm_stderr, sys.stderr.fileno())
        return True
    finally:
        os.close(jvm_stderr)


def _find_java17() -> str | None:
    for pattern in ("/usr/lib/jvm/java-17-openjdk*", "/usr/lib/jvm/*17*"):
        for candidate in sorted(glob.glob(pattern)):
            if os.path.exists(os.path.join(candidate, "bin", "java")):
                return candidate
    return None


def prepare_environment() -> None:
    """Environment variables a local PySpark launch needs (only those not already set)."""
    if "JAVA_HOME" not in os.environ:
        java = _find_java17()
        if java:
            os.environ["JAVA_HOME"] = java
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if any(flag in submit_args.split() for flag in _DOWNLOAD_FLAGS):
        raise ConfigError(
            "PYSPARK_SUBMIT_ARGS asks Spark to download packages (--packages/--repositories); "
            "that hangs or fails offline. Ship jars with --jars instead."
        )


def delta_jar_paths(folder: str | Path) -> list[str]:
    """The Delta Lake jars in ``folder`` (relative: to the working directory, else to this checkout).

    Raises:
        ConfigError: a jar is missing, naming the folder and the command that fetches it.
    """
    folder = Path(folder)
    candidates = [folder] if folder.is_absolute() else [Path.cwd() / folder, CHECKOUT / folder]
    for base in candidates:
        found = {prefix: sorted(base.glob(f"{prefix}-*.jar")) for prefix in DELTA_JARS}
        if all(len(jars) == 1 for jars in found.values()):
            return [str(jars[0].resolve()) for jars in found.values()]
    where = " or ".join(str(c) for c in dict.fromkeys(candidates))
    raise ConfigError(
        f"lake.engine is delta-spark but {where} does not hold exactly one {' and one '.join(DELTA_JARS)} jar "
        "(spark.delta_jars). Run `make jars` once (Maven fetches the pinned Delta Lake jars into .jars/delta), "
        "or give the jars to spark-submit with --jars"
    )


def _built_file(path: str | Path) -> str | None:
    """A file ``make jars`` builds (relative: to the working directory, else to this checkout), or ``None``
    when it is not there."""
    path = Path(path)
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, CHECKOUT / path]
    return next((str(c.resolve()) for c in candidates if c.is_file()), None)


def jvm_jar_path(jar: str | Path) -> str | None:
    """rmqlake's JVM jar (``spark.jvm_jar``), or ``None`` when it is not there (``make jars`` builds it)."""
    return _built_file(jar)


def driver_java_options(settings: SparkSettings, conf_dir: str | Path | None = None) -> str:
    """``spark.driver.extraJavaOptions`` for a driver JVM rmqlake starts itself (not under ``spark-submit``):
    rmqlake's, then the user's (``spark.conf``), which win where they set the same flag.

    - The JVM's own warnings go to stderr: stdout carries ``--json`` output.
    - ``conf_dir/log4j2.properties`` quiets Spark's logging, unless ``SPARK_CONF_DIR`` names the user's.
    - ``spark.class_archive``, when the file is there: the JVM maps the classes a job loads, already parsed
      and verified, from that archive instead of reading them from the jars (a job process starts several
      seconds sooner). The archive holds the class path it was made with, which Spark's launcher starts with
      ``SPARK_CONF_DIR``, and JDK 17 makes none with a non-empty folder there: ``make jars`` makes it with
      ``SPARK_CONF_DIR`` unset, and with one set the archive is left out and a warning says so.
    """
    options = ["-Xlog:disable", "-Xlog:all=warning:stderr"]
    spark_conf_dir = os.environ.get("SPARK_CONF_DIR")
    log4j = Path(conf_dir) / "log4j2.properties" if conf_dir is not None else None
    if not spark_conf_dir and log4j is not None and log4j.is_file():
        options.append(shlex.quote(f"-Dlog4j2.configurationFile={log4j.resolve()}"))
    archive = _built_file(settings.class_archive) if settings.class_archive else None
    if archive is not None:
        if spark_conf_dir:
            log.warning(
                "spark.class_archive %s is not used: it was made with SPARK_CONF_DIR unset, and the JVM's class "
                "path starts with SPARK_CONF_DIR (%s); unset it for a start several seconds faster",
                archive,
                spark_conf_dir,
            )
        else:
            options += [shlex.quote(f"-XX:SharedArchiveFile={archive}"), "-Xshare:auto"]
    own = settings.conf.get("spark.driver.extraJavaOptions", "")
    return " ".join([*options, *([own] if own else [])])


def require_jvm_jar(settings: SparkSettings, *, setting: str = "ingest.parser") -> None:
    """Refuse, before Spark starts, ``setting: jvm`` (``ingest.parser``, ``import_store.reader``) without the jar
    (outside spark-submit, where the jars are the user's ``--jars``; the job checks the class once the session
    runs).

    Raises:
        ConfigError: naming the setting, the path looked for and the command that builds it.
    """
    if not under_spark_submit() and jvm_jar_path(settings.jvm_jar) is None:
        raise ConfigError(
            f"{setting} is jvm but spark.jvm_jar ({settings.jvm_jar}) is not there. Run `make jars` once (it "
            f"builds .jars/rmqlake-jvm.jar), point spark.jvm_jar at the jar, or set {setting} to auto or python"
        )


def jvm_class_loaded(spark, name: str) -> bool:
    """Whether the session's JVM has the class ``name`` (``spark.jars`` are in the context class loader)."""
    try:
        jvm = spark._jvm  # a session without a local JVM (Spark Connect) has none
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
    except Exception:  # py4j wraps the ClassNotFoundException
        return False
    return True


def use_jvm_job(spark, settings: SparkSettings, *, setting: str, choice: str, job_class: str, otherwise: str) -> bool:
    """Whether a step runs its JVM job, as ``setting`` (``choice``: auto, jvm or python) says: "auto" runs it where
    ``job_class`` is loaded, else logs ``otherwise`` (what the step does instead).

    Raises:
        ConfigError: ``choice`` is "jvm" but the session lacks the class (spark-submit without the jar).
    """
    if choice == "python":
        return False
    if jvm_class_loaded(spark, job_class):
        return True
    if choice == "jvm":
        raise ConfigError(
            f"{setting} is jvm but the session does not have rmqlake's JVM classes: give spark-submit "
            f"--jars {settings.jvm_jar} (`make jars` builds it), or set {setting} to auto or python"
        )
    log.warning("rmqlake's JVM classes are not on the classpath (`make jars` builds them): %s", otherwise)
    return False


def session_conf(settings: SparkSettings, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The settings rmqlake gives the session builder, later ones winning: the shuffle partitions and
    ``PYTHON_WORKER_CONF``, the user's ``spark.conf`` (conf files or ``--set spark.conf.<key>=<value>``),
    ``extra`` (the Delta extension), then the SQL settings rmqlake's jobs rely on."""
    return {
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        **PYTHON_WORKER_CONF,
        **settings.conf,
        **(extra or {}),
        **REQUIRED_SQL_CONF,
    }


def get_spark(
    settings: SparkSettings | None = None,
    *,
    conf_dir: str | Path | None = None,
    app_name: str | None = None,
    delta_extension: bool = False,
):
    """Return the SparkSession, building it on first use.

    Args:
        settings: the ``spark`` conf section (defaults when ``None``).
        conf_dir: folder whose ``log4j2.properties`` quiets Spark's logging (see `driver_java_options`).
        app_name: overrides ``spark.app_name``.
        delta_extension: load the Delta Lake extension (``lake.engine: delta-spark``): its SQL extension
            and catalog, and, outside ``spark-submit``, its jars from ``settings.delta_jars`` through
            ``spark.jars``. Under ``spark-submit`` the jars are the user's (``--jars``): a JVM that is
            already running cannot take new ones.

    Outside ``spark-submit``, rmqlake's own jar (``settings.jvm_jar``: ingest's JVM parser) also goes on
    ``spark.jars`` when it is there.

    Raises:
        ConfigError: the settings would make Spark download jars, or the Delta jars are missing.
    """
    settings = settings or SparkSettings()
    prepare_environment()
    from pyspark.sql import SparkSession

    extra: dict[str, str] = {}
    if delta_extension:
        extra = {"spark.sql.extensions": DELTA_EXTENSION, "spark.sql.catalog.spark_catalog": DELTA_CATALOG}
        extra.update({k: v for k, v in DELTA_SQL_CONF.items() if k not in settings.conf})
        own = settings.conf.get("spark.sql.extensions", "")
        if own and DELTA_EXTENSION not in own:
            extra["spark.sql.extensions"] = f"{own},{DELTA_EXTENSION}"
    if not under_spark_submit() and SparkSession.getActiveSession() is None:
        jars = [j for j in settings.conf.get("spark.jars", "").split(",") if j]
        if delta_extension:
            jars += delta_jar_paths(settings.delta_jars)
        own_jar = jvm_jar_path(settings.jvm_jar)  # rmqlake's JVM code, when built: see ingest.parser
        if own_jar is not None and own_jar not in jars:
            jars.append(own_jar)
        if jars:
            extra["spark.jars"] = ",".join(jars)
        extra["spark.driver.extraJavaOptions"] = driver_java_options(settings, conf_dir)

    builder = SparkSession.builder.appName(app_name or settings.app_name)
    if not under_spark_submit():
        builder = (
            builder.master(settings.master)
            .config("spark.driver.memory", settings.driver_memory)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    for key, value in session_conf(settings, extra).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    packages = spark.sparkContext.getConf().get("spark.jars.packages", "")
    if packages:
        raise ConfigError(f"spark.jars.packages is set ({packages}); rmqlake jobs never download jars at run time")
    for key, value in REQUIRED_SQL_CONF.items():
        spark.conf.set(key, value)
    return spark
