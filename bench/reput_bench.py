"""Reput throughput next to ingest throughput (key lookups: bench/lookup_bench.py).

    .venv/bin/python bench/reput_bench.py [--messages 1000000] [--json]

``--messages`` generated messages (~1 KiB bodies) are ingested, then
dispatched by reput, in one warm SparkSession: both rates are printed and
their ratio (target: reput at least as fast as ingest).

After a warm-up on a 100,000-message sample, the pair (ingest, reput) runs twice on the same input into two
lakes: the second pair, past the JIT compilation the sample leaves unfinished, gives the headline ratio;
the first pair's is reported next to it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from common import REPO, dataset, report, timed, warmup_input


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rmqlake.config import load_settings
    from rmqlake.logs import configure_logging
    from rmqlake.session import get_spark
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    configure_logging("WARNING")
    spark = get_spark(load_settings(REPO / "conf").spark, conf_dir=REPO / "conf", app_name="rmqlake-bench-reput")
    work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-"))
    try:
        warm = load_settings(REPO / "conf", lake=str(work / "warm"))
        ingest(spark, warm, input_path=str(warmup_input()))
        reput(spark, warm)
        landing = dataset(f"ingest-{args.messages}", messages=args.messages, body_size=1024)
        first = load_settings(REPO / "conf", lake=str(work / "first-lake"))
        with timed() as first_ingest:
            ingest(spark, first, input_path=str(landing))
        with timed() as first_reput:
            reput(spark, first)
        shutil.rmtree(work / "first-lake", ignore_errors=True)
        settings = load_settings(REPO / "conf", lake=str(work / "lake"))
        with timed() as ingest_time:
            ingested = ingest(spark, settings, input_path=str(landing))
        with timed() as reput_time:
            dispatched = reput(spark, settings)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    n = ingested["rows_out"]
    rows = [
        {
            "run": "ingest",
            "messages": n,
            "seconds": round(ingest_time["seconds"], 2),
            "messages/s": round(n / ingest_time["seconds"]),
        },
        {
            "run": "reput",
            "messages": dispatched["rows_in"],
            "seconds": round(reput_time["seconds"], 2),
            "messages/s": round(dispatched["rows_in"] / reput_time["seconds"]),
        },
    ]
    summary = {
        "reput_vs_ingest_rate": round(ingest_time["seconds"] / reput_time["seconds"], 2),
        "first_pair_reput_vs_ingest_rate": round(first_ingest["seconds"] / first_reput["seconds"], 2),
        "first_pair_seconds": {"ingest": round(first_ingest["seconds"], 2), "reput": round(first_reput["seconds"], 2)},
        "reput_target": ">= 1.0",
        "index_entries": dispatched["index_entries"],
        "reput_stage_seconds": dispatched["stage_seconds"],
    }
    report("reput", rows, summary, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
