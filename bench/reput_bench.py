"""Reput throughput next to ingest throughput, and key-lookup latency next to a full scan.

    .venv/bin/python bench/reput_bench.py [--messages 1000000] [--lookup-messages 5000000] [--json]

1. ``--messages`` generated messages (~1 KiB bodies) are ingested, then
   dispatched by reput, in one warm SparkSession: both rates are printed and
   their ratio (target: reput at least as fast as ingest).
2. A lake of ``--lookup-messages`` messages (100-byte bodies, broker-default
   index sizes) is built once and kept under bench/out. For keys picked from
   it, ``query key`` (index slot → chain → the segments of the offsets found)
   is timed against a full scan of the commitlog's topic and keys columns with
   pyarrow for the same key. Both return the same offsets.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import OUT, REPO, dataset, report, timed


def build_lookup_lake(spark, messages: int) -> Path:
    from rmqlake.config import load_settings
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    root = OUT / f"lookup-lake-{messages}"
    marker = root / "DONE.json"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    landing = dataset(f"lookup-{messages}", messages=messages, body_size=100, hours=12, seed=5)
    settings = load_settings(REPO / "conf", lake=str(root))
    started = time.monotonic()
    for hour in sorted(landing.glob("dt=*/hour=*")):
        ingest(spark, settings, input_path=str(hour))
    reput(spark, settings)
    marker.write_text(json.dumps({"messages": messages, "seconds": round(time.monotonic() - started)}))
    return root


def full_scan(lake, topic: str, key: str) -> list[int]:
    import pyarrow.compute as pc

    table = lake.scan("commitlog", columns=["physical_offset", "topic", "keys", "sys_flag"])
    # the index holds every record but ROLLBACK ones: the scan must answer the same question
    table = table.filter(pc.not_equal(pc.bit_wise_and(table.column("sys_flag"), 0xC), 0xC))
    keys = table.column("keys")
    flat = pc.list_flatten(keys)
    parents = pc.list_parent_indices(keys)
    hit_rows = pc.unique(pc.filter(parents, pc.equal(flat, key)))
    matches = table.take(hit_rows).filter(pc.equal(table.take(hit_rows).column("topic"), topic))
    return sorted(matches.column("physical_offset").to_pylist())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--lookup-messages", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=20, help="keys to look up")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rmqlake import query as Q
    from rmqlake.config import load_settings
    from rmqlake.lake import Lake
    from rmqlake.logs import configure_logging
    from rmqlake.session import get_spark
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    configure_logging("WARNING")
    spark = get_spark(load_settings(REPO / "conf").spark, conf_dir=REPO / "conf", app_name="rmqlake-bench-reput")
    work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-"))
    try:
        warm = load_settings(REPO / "conf", lake=str(work / "warm"))
        ingest(spark, warm, input_path=str(dataset("ingest-warmup", messages=20_000, body_size=1024, hours=1, seed=2)))
        reput(spark, warm)
        settings = load_settings(REPO / "conf", lake=str(work / "lake"))
        landing = dataset(f"ingest-{args.messages}", messages=args.messages, body_size=1024)
        with timed() as ingest_time:
            ingested = ingest(spark, settings, input_path=str(landing))
        with timed() as reput_time:
            dispatched = reput(spark, settings)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lookup_root = build_lookup_lake(spark, args.lookup_messages)
    lake = Lake(str(lookup_root), read_only=True)
    store = load_settings(REPO / "conf").store
    sample = lake.scan("commitlog", columns=["topic", "keys"]).slice(0, 200_000)
    candidates = sorted(
        {
            (t, k)
            for t, ks in zip(sample.column("topic").to_pylist(), sample.column("keys").to_pylist(), strict=True)
            for k in (ks or [])
        }
    )
    picked = random.Random(7).sample(candidates, min(args.keys, len(candidates)))
    lookups, scans = [], []
    for topic, key in picked:
        Q.query_key(lake, topic=topic, key=key, slots=store.index_slots, segment_size=store.commitlog_segment_size)
        started = time.perf_counter()
        result = Q.query_key(
            lake, topic=topic, key=key, slots=store.index_slots, segment_size=store.commitlog_segment_size
        )
        lookups.append(time.perf_counter() - started)
        if len(scans) < 3:
            started = time.perf_counter()
            scanned = full_scan(lake, topic, key)
            scans.append(time.perf_counter() - started)
            found = [r["physical_offset"] for r in result["rows"]]
            assert found == scanned[-64:], (topic, key, found, scanned)
    lookup_ms = statistics.median(lookups) * 1000
    scan_ms = statistics.median(scans) * 1000
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
        {
            "run": f"query key ({len(lookups)} keys, median)",
            "messages": args.lookup_messages,
            "seconds": round(lookup_ms / 1000, 4),
            "messages/s": None,
        },
        {
            "run": "full scan of commitlog for the key (median of 3)",
            "messages": args.lookup_messages,
            "seconds": round(scan_ms / 1000, 3),
            "messages/s": None,
        },
    ]
    summary = {
        "reput_vs_ingest_rate": round(ingest_time["seconds"] / reput_time["seconds"], 2),
        "reput_target": ">= 1.0",
        "lookup_ms_median": round(lookup_ms, 1),
        "lookup_ms_max": round(max(lookups) * 1000, 1),
        "full_scan_ms": round(scan_ms, 1),
        "lookup_speedup": round(scan_ms / lookup_ms, 1),
        "lookup_target": ">= 20",
        "index_entries": dispatched["index_entries"],
        "reput_stage_seconds": dispatched["stage_seconds"],
    }
    report("reput and key lookup", rows, summary, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
