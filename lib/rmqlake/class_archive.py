"""``make jars``: the class-data archive a job's driver JVM starts from (``spark.class_archive``).

A job process (an hourly ``spark-submit``, an ``rmqlake`` command) spends a good part of its first seconds
reading, parsing and verifying some 20,000 classes from Spark's jars. JDK class-data sharing maps them from
one file instead, already parsed and verified. This module makes that file: one JVM runs ingest, reput,
compact, expire and export-store on a few thousand generated messages in a temporary folder, with
``-XX:ArchiveClassesAtExit``, and the JVM writes the classes it loaded when it exits.

The archive holds the JDK's and the jars' classes as they are now: ``make jars`` makes it again when the
virtualenv or the jars change. A JVM given a stale archive (another JDK, other jars) does without it and
says so on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rmqlake.config import load_settings
from rmqlake.generate import TopicPlan, generate

MESSAGES = 3000  # enough for every step to run each of its stages; few enough for a minute's work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rmqlake.class_archive", description=__doc__)
    parser.add_argument("out", help="the archive to write (replaced when the JVM has written it whole)")
    parser.add_argument("--conf", default="conf")
    args = parser.parse_args(argv)
    if os.environ.get("SPARK_CONF_DIR"):
        print("unset SPARK_CONF_DIR: the jobs use the archive only when it is unset, as it was then", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    partial = out.with_name(f".{out.name}.partial")
    partial.unlink(missing_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rmqlake-class-archive-") as folder:
        settings = load_settings(
            args.conf,
            env="local",
            lake=str(Path(folder) / "lake"),
            overrides=[
                "spark.class_archive=",  # not the archive being replaced
                "lake.engine=delta-rs",  # whatever conf/ says: this session has no Delta extension
                f"spark.conf.spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit={partial}",
                "spark.progress_seconds=0",
            ],
        )
        _run_jobs(settings, data=Path(folder) / "data", conf_dir=args.conf)
        _stop_jvm()
    if not partial.is_file():
        print(f"the JVM wrote no archive at {partial}", file=sys.stderr)
        return 1
    os.replace(partial, out)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f}s")
    return 0


def _run_jobs(settings, *, data: Path, conf_dir: str) -> None:
    """The steps of the hourly pipeline and of the daily ones, on two generated hours, in this JVM."""
    from rmqlake.session import get_spark
    from rmqlake.steps.compact import compact
    from rmqlake.steps.expire import expire
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput
    from rmqlake.steps.store import export_store

    plans = [TopicPlan(n, t.queues, t.cleanup_policy == "COMPACTION") for n, t in settings.topics.items()]
    summary = generate(data, messages=MESSAGES, topics=plans, hours=2, bad_rate=0.01, seed=7,
                       schedule_share=0.02, transaction_share=0.02)  # fmt: skip
    spark = get_spark(settings.spark, conf_dir=conf_dir, app_name="rmqlake-class-archive")
    for hour in sorted((data / "landing").glob("dt=*/hour=*")):
        ingest(spark, settings, input_path=str(hour))
        reput(spark, settings)
        compact(spark, settings)
    end = datetime.fromtimestamp(summary["end_ms"] / 1000, tz=UTC)
    expire(spark, settings, now=(end + timedelta(days=3)).replace(hour=4, minute=0, second=0, microsecond=0))
    export_store(spark, settings, out=str(data / "store"), overwrite=True)


def _stop_jvm() -> None:
    """Stop Spark and wait for its JVM to exit: it writes the archive on its way out, which takes seconds."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    SparkSession.getActiveSession().stop()
    gateway = SparkContext._gateway
    process = gateway.proc
    process.stdin.close()  # the JVM exits when its stdin closes
    process.wait(timeout=600)


if __name__ == "__main__":
    sys.exit(main())
