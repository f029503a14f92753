"""Compaction throughput in MB/s per core, beside Kafka's log-cleaner anchor and a plain Spark window.

    .venv/bin/python bench/compact_bench.py [--gib 1.0] [--keys-ratio 0.1] [--json]

A COMPACTION topic of about ``--gib`` GiB of commitlog (4 KiB bodies; keys
drawn Zipf-like from ``--keys-ratio`` × messages distinct keys, so most
messages are updates of a hot minority; 5 % tombstones) is generated,
ingested and dispatched once and kept under bench/out. Then, in one warm
SparkSession:

* ``rmqlake compact`` over all of it (first run: every queue rewritten);
* the baseline: the same commitlog rows read by plain Spark, the latest row
  per (topic, queue, KEYS) by a window, tombstones dropped, written as
  Parquet — what a hand-written Spark job would do, without the lake's
  commit, positions or CQ;
* an incremental run after another ~10 % of traffic is ingested.

Throughput is commitlog bytes read / seconds / cores, printed beside the
anchor of 16.5 MB/s per thread (Kafka's log cleaner, KIP-280 / LinkedIn's
published cleaner figures).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import LAKE_LAYOUT, OUT, REPO, report, timed

KAFKA_CLEANER_MB_PER_THREAD = 16.5
BODY = 4000


def write_topic(folder: Path, *, messages: int, keys: int, seed: int, start_ms: int) -> None:
    """Producer log lines of one COMPACTION topic: Zipf-like key popularity, 5 % tombstones."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(keys)]
    picks = rng.choices(range(keys), weights=weights, k=messages)
    filler = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(BODY))
    per_file = 50_000
    for part in range(0, messages, per_file):
        with open(folder / f"part-{part // per_file:04d}.jsonl", "w") as out:
            for i in range(part, min(part + per_file, messages)):
                body = "" if rng.random() < 0.05 else f"{i:010d}{filler[: BODY - 10]}"
                line = {
                    "topic": "UserProfile",
                    "keys": f"user-{picks[i]:08d}",
                    "bornTimestamp": start_ms + i,
                    "body": body,
                }
                out.write(json.dumps(line) + "\n")


def prepared_lake(spark, *, gib: float, keys_ratio: float) -> tuple[Path, Path]:
    """(lake with the bulk ingested and dispatched, landing folder of the increment), cached."""
    from rmqlake.config import load_settings
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    messages = int(gib * 2**30 / (BODY + 200))
    wanted = {"gib": gib, "keys_ratio": keys_ratio, "messages": messages, "layout": LAKE_LAYOUT}
    root = OUT / f"compact-{gib}"
    marker = root / "PARAMS.json"
    lake, increment = root / "lake", root / "increment"
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return lake, increment
    shutil.rmtree(root, ignore_errors=True)
    keys = max(1, int(messages * keys_ratio))
    started = time.monotonic()
    write_topic(root / "bulk", messages=messages, keys=keys, seed=1, start_ms=1_763_683_200_000)
    write_topic(increment, messages=messages // 10, keys=keys, seed=2, start_ms=1_763_683_200_000 + messages)
    print(f"generated {messages:,} + {messages // 10:,} messages in {time.monotonic() - started:.0f}s", file=sys.stderr)
    settings = load_settings(REPO / "conf", lake=str(lake))
    ingest(spark, settings, input_path=str(root / "bulk"))
    reput(spark, settings)
    marker.write_text(json.dumps(wanted))
    return lake, increment


def plain_spark_latest_per_key(spark, lake: Path, out: Path) -> int:
    """The baseline: a window over the same commitlog rows; returns rows kept."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from rmqlake.lake import Lake
    from rmqlake.lake.spark_io import read_table

    rows = read_table(spark, Lake(str(lake)), "commitlog").filter(F.col("topic") == "UserProfile")
    key = F.element_at("properties", F.lit("KEYS"))
    latest = Window.partitionBy("topic", "queue_id", key).orderBy(F.col("queue_offset").desc())
    kept = rows.withColumn("rank", F.row_number().over(latest)).filter("rank = 1 and length(body) > 0").drop("rank")
    kept.write.mode("overwrite").partitionBy("topic", "queue_id").parquet(str(out))
    return spark.read.parquet(str(out)).count()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="commitlog size of the topic (default 1 GiB)")
    parser.add_argument("--keys-ratio", type=float, default=0.1, help="distinct keys / messages (default 0.1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rmqlake.config import load_settings
    from rmqlake.logs import configure_logging
    from rmqlake.session import get_spark
    from rmqlake.steps.compact import compact
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    configure_logging("WARNING")
    spark = get_spark(load_settings(REPO / "conf").spark, conf_dir=REPO / "conf", app_name="rmqlake-bench-compact")
    cores = os.cpu_count() or 1
    source, increment = prepared_lake(spark, gib=args.gib, keys_ratio=args.keys_ratio)
    work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-compact-"))
    try:
        lake = work / "lake"
        shutil.copytree(source, lake)
        settings = load_settings(REPO / "conf", lake=str(lake))
        with timed() as baseline_time:
            baseline_kept = plain_spark_latest_per_key(spark, lake, work / "baseline")
        with timed() as full_time:
            full = compact(spark, settings)
        ingest(spark, settings, input_path=str(increment))
        reput(spark, settings)
        with timed() as incremental_time:
            incremental = compact(spark, settings)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert full["messages_kept"] == baseline_kept, (full["messages_kept"], baseline_kept)

    def rate(nbytes: int, seconds: float) -> float:
        return round(nbytes / 1e6 / seconds / cores, 1)

    rows = [
        {
            "run": "rmqlake compact (all queues, first run)",
            "messages_read": full["messages_read"],
            "mb_read": round(full["bytes_read"] / 1e6),
            "kept": full["messages_kept"],
            "seconds": round(full_time["seconds"], 1),
            "mb/s/core": rate(full["bytes_read"], full_time["seconds"]),
        },
        {
            "run": "plain Spark window, latest per key -> Parquet",
            "messages_read": full["messages_read"],
            "mb_read": round(full["bytes_read"] / 1e6),
            "kept": baseline_kept,
            "seconds": round(baseline_time["seconds"], 1),
            "mb/s/core": rate(full["bytes_read"], baseline_time["seconds"]),
        },
        {
            "run": "rmqlake compact (incremental, +10 %)",
            "messages_read": incremental["messages_read"],
            "mb_read": round(incremental["bytes_read"] / 1e6),
            "kept": incremental["messages_kept"],
            "seconds": round(incremental_time["seconds"], 1),
            "mb/s/core": rate(incremental["bytes_read"], incremental_time["seconds"]),
        },
    ]
    compact_rate = rate(full["bytes_read"], full_time["seconds"])
    summary = {
        "cores": cores,
        "compact_mb_s_per_core": compact_rate,
        "kafka_cleaner_mb_s_per_thread": KAFKA_CLEANER_MB_PER_THREAD,
        "vs_kafka_anchor": round(compact_rate / KAFKA_CLEANER_MB_PER_THREAD, 2),
        "vs_plain_spark": round(baseline_time["seconds"] / full_time["seconds"], 2),
        "duplicate_ratio": round(1 - full["keys"] / full["messages_read"], 3),
        "size_ratio_after_before": full["ratio"],
        "tombstones_applied": full["tombstones_applied"],
        "stage_seconds": full["stage_seconds"],
    }
    report("compaction", rows, summary, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
