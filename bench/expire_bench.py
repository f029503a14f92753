"""Expiry cost: k segments deleted from lakes of 10 and 100 segments; no data byte rewritten.

    .venv/bin/python bench/expire_bench.py [--deleted 5] [--json]

Two lakes are built once (cached under bench/out) with the same segment size:
one of ~10 segments and one of ~100 (10x the bytes). Each is copied and
expired at a deletion hour with ``retention.max_segments_per_run = k``, so
both delete exactly k segments with their CQ and index files. Printed: the
seconds of each run, their ratio (≈ 1 when the cost follows the segments
deleted, ≈ 10 if it followed the bytes stored), and the data files and bytes
the run added to commitlog, consumequeue and indexfile (0: deletion only
removes whole files from the Delta log).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from common import LAKE_LAYOUT, OUT, REPO, report, timed

SEGMENT = 4 * 1024 * 1024
BODY = 1000
HOUR_MS = 3_600_000
START_MS = 1_763_510_400_000  # 2026-11-19T00:00:00Z


def lake_with_segments(spark, segments: int) -> Path:
    """A lake of about ``segments`` commitlog segments, spread over 48 hours of store time (cached)."""
    from rmqlake.config import load_settings
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    root = OUT / f"expire-{segments}"
    marker = root / "DONE.json"
    wanted = {"segments": segments, "sizes": _sizes(), "layout": LAKE_LAYOUT}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return root / "lake"
    shutil.rmtree(root, ignore_errors=True)
    messages = segments * SEGMENT // (BODY + 180)
    landing = root / "landing"
    landing.mkdir(parents=True)
    with open(landing / "part-0000.jsonl", "w") as out:
        for i in range(messages):
            line = {
                "topic": "OrderEvents",
                "body": f"{i:010d}" + "x" * (BODY - 10),
                "keys": f"order-{i % 5000}",
                "bornTimestamp": START_MS + i * 48 * HOUR_MS // messages,
            }
            out.write(json.dumps(line) + "\n")
    settings = load_settings(REPO / "conf", lake=str(root / "lake"), overrides=_sizes())
    ingest(spark, settings, input_path=str(landing))
    reput(spark, settings)
    marker.write_text(json.dumps(wanted))
    return root / "lake"


def _sizes() -> list[str]:
    return [
        f"store.commitlog_segment_size={SEGMENT}",
        "store.cq_units_per_file=1000",
        "store.index_max_entries=20000",
    ]


def added_files(lake_root: Path, before: dict[str, set[str]]) -> tuple[int, int]:
    from rmqlake.lake import Lake

    lake = Lake(str(lake_root))
    files = [f for t in before for f in lake.engine.active_files(t) if f.path not in before[t]]
    return len(files), sum(f.size for f in files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deleted", type=int, default=5, help="segments deleted per run (k)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rmqlake.config import load_settings
    from rmqlake.lake import Lake
    from rmqlake.logs import configure_logging
    from rmqlake.session import get_spark
    from rmqlake.steps.expire import expire
    from rmqlake.timeutil import to_datetime

    configure_logging("WARNING")
    spark = get_spark(load_settings(REPO / "conf").spark, conf_dir=REPO / "conf", app_name="rmqlake-bench-expire")
    now = to_datetime(START_MS + 124 * HOUR_MS)  # 04:00, 2026-11-24: the first day is past 72 h
    rows = []
    work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-expire-"))
    try:
        for size in (10, 100):
            source = lake_with_segments(spark, size)
            lake_root = work / f"lake-{size}"
            shutil.copytree(source, lake_root)
            overrides = [*_sizes(), f"retention.max_segments_per_run={args.deleted}"]
            settings = load_settings(REPO / "conf", lake=str(lake_root), overrides=overrides)
            lake = Lake(str(lake_root))
            tables = ("commitlog", "consumequeue", "indexfile")
            before = {t: {f.path for f in lake.engine.active_files(t)} for t in tables}
            stored = sum(f.size for t in tables for f in lake.engine.active_files(t))
            live = len([s for s in lake.read_arrow("segments").to_pylist() if s["status"] != "deleted"])
            expire(spark, settings, now=now, dry_run=True)  # warm-up: JVM, metadata caches
            with timed() as took:
                result = expire(spark, settings, now=now)
            added, added_bytes = added_files(lake_root, before)
            rows.append(
                {
                    "lake": f"{live} segments",
                    "stored_mb": round(stored / 1e6),
                    "segments_deleted": result["segments_deleted"],
                    "cq_files_deleted": result["cq_files_deleted"],
                    "index_files_deleted": result["index_files_deleted"],
                    "seconds": round(took["seconds"], 2),
                    "data_files_added": added,
                    "data_bytes_written": added_bytes,
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        "k": args.deleted,
        "stored_bytes_ratio": round(rows[1]["stored_mb"] / max(rows[0]["stored_mb"], 1), 1),
        "seconds_ratio_100_vs_10": round(rows[1]["seconds"] / rows[0]["seconds"], 2),
        "data_bytes_rewritten": sum(r["data_bytes_written"] for r in rows),
    }
    report("expiry", rows, summary, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
