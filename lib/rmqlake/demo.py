"""``make demo``: generate data, run every job that exists on it, print where to look.

Runs in one process with one local SparkSession; the lake is ``./lake``
(recreated each time) and the generated producer logs are ``./demo-data``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from rmqlake.config import load_settings
from rmqlake.generate import TopicPlan, generate
from rmqlake.logs import configure_logging
from rmqlake.report import render_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rmqlake.demo", description=__doc__)
    parser.add_argument("--conf", default="conf")
    parser.add_argument("--env", default="local")
    parser.add_argument("--data", default="demo-data", help="where the generated producer logs go")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    configure_logging("INFO")
    settings = load_settings(args.conf, env=args.env)
    lake_root = Path(settings.lake.root)
    for folder in (lake_root, Path(args.data)):
        if folder.exists():
            shutil.rmtree(folder)

    plans = [TopicPlan(n, t.queues, t.cleanup_policy == "COMPACTION") for n, t in settings.topics.items()]
    summary = generate(args.data, messages=args.messages, topics=plans, hours=3, bad_rate=0.002, seed=args.seed)
    print(f"generated {summary['messages']} messages and {summary['bad_lines']} bad lines in {args.data}/landing")

    from rmqlake.session import get_spark
    from rmqlake.steps.ingest import ingest

    spark = get_spark(settings.spark, conf_dir=args.conf, app_name="rmqlake-demo")
    started = time.monotonic()
    ingested = ingest(spark, settings, input_path=str(Path(args.data) / "landing"))
    seconds = time.monotonic() - started
    segments = len({row["segment"] for row in _segments(settings)})
    print()
    print(
        render_table(
            [
                {
                    "messages": ingested["rows_out"],
                    "rejected lines": ingested["rejected"],
                    "commitlog bytes (padding included)": ingested["commitlog_bytes"],
                    "segments": segments,
                    "rate (messages/s)": round(ingested["rows_out"] / seconds),
                    "batch": ingested["batch_id"],
                }
            ]
        )
    )
    root = Path(settings.lake.root).resolve()
    print(
        f"""
Tables (Delta Lake) under {root}:
  {root}/commitlog     one row per message, partitioned by segment
  {root}/segments      one row per commitlog segment
  {root}/rejected      bad input lines with file, line and reason
  {root}/ingest_files  input files already ingested (re-runs skip them)

Look at them:
  .venv/bin/rmqlake status
  .venv/bin/python -c "from deltalake import DeltaTable; print(DeltaTable('{root}/segments').to_pandas())"
  .venv/bin/python -c "import duckdb; from deltalake import DeltaTable; \\
t = DeltaTable('{root}/commitlog').to_pyarrow_dataset(); \\
print(duckdb.sql('select topic, count(*), sum(total_size) from t group by topic'))"
  .venv/bin/pyspark   then: spark.read.parquet(*DeltaTable('{root}/commitlog').file_uris())
"""
    )
    spark.stop()
    return 0


def _segments(settings):
    from rmqlake.steps.ingest import open_lake

    return open_lake(settings).read_arrow("segments").to_pylist()


if __name__ == "__main__":
    sys.exit(main())
