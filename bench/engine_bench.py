"""The two Delta engines on the same jobs: ingest, reput and expire, whole job and Delta commit latency.

    .venv/bin/python bench/engine_bench.py [--messages 200000] [--json]

One Spark session with the Delta Lake extension loaded (jars from ``make jars``), so that only
``lake.engine`` differs between the runs. For each engine, a fresh lake: ingest of the first half of the
hours, reput, ingest of the rest, reput, expire (deleting sealed segments). Printed per job: the whole
job's seconds, the seconds spent in table commits (``commit_files``: delta-rs' Rust commit vs the
extension's ``OptimisticTransaction``) and their count, and the delta-spark / delta-rs ratio. A warm-up
run on a small lake (not counted) loads the classes of both engines first.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from common import OUT, REPO, dataset, report, timed

ENGINES = ("delta-rs", "delta-spark")
EXPIRE_AT = "2026-11-30T04:00:00Z"
SIZES = ["store.commitlog_segment_size=8388608", "store.cq_units_per_file=100000", "store.index_max_entries=200000"]


class CommitClock:
    """Seconds and count of ``commit_files`` calls of either engine class."""

    def __init__(self):
        from rmqlake.lake.deltars import DeltaRsEngine
        from rmqlake.lake.deltaspark import DeltaSparkEngine

        self.seconds, self.count = 0.0, 0
        for cls in (DeltaRsEngine, DeltaSparkEngine):
            original = cls.__dict__["commit_files"]

            def clocked(engine, *args, _original=original, **kwargs):
                started = time.monotonic()
                try:
                    return _original(engine, *args, **kwargs)
                finally:
                    self.seconds += time.monotonic() - started
                    self.count += 1

            cls.commit_files = clocked

    def take(self) -> tuple[float, int]:
        taken = (self.seconds, self.count)
        self.seconds, self.count = 0.0, 0
        return taken


def pipeline(spark, landing: Path, lake: Path, engine: str, clock: CommitClock) -> list[dict]:
    from rmqlake.config import load_settings
    from rmqlake.steps.expire import expire
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput
    from rmqlake.timeutil import parse_timestamp, to_datetime

    settings = load_settings(REPO / "conf", lake=str(lake), overrides=[*SIZES, f"lake.engine={engine}"])
    hours = sorted(landing.glob("dt=*/hour=*"))
    half = len(hours) // 2
    steps = [
        ("ingest", lambda: [ingest(spark, settings, input_path=str(h)) for h in hours[:half]]),
        ("reput", lambda: reput(spark, settings)),
        ("ingest", lambda: [ingest(spark, settings, input_path=str(h)) for h in hours[half:]]),
        ("reput", lambda: reput(spark, settings)),
        ("expire", lambda: expire(spark, settings, now=to_datetime(parse_timestamp(EXPIRE_AT, option="--now")))),
    ]
    rows = []
    clock.take()
    for job, work in steps:
        with timed() as took:
            work()
        commit_seconds, commits = clock.take()
        rows.append({"engine": engine, "job": job, "seconds": round(took["seconds"], 2),
                     "commit_seconds": round(commit_seconds, 3), "commits": commits})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from rmqlake.config import SparkSettings
    from rmqlake.session import get_spark

    spark = get_spark(
        SparkSettings(master="local[2]", shuffle_partitions=4), conf_dir=REPO / "conf", delta_extension=True
    )
    clock = CommitClock()
    warmup = dataset("engine-warmup", messages=2_000, body_size=500, hours=2)
    landing = dataset("engines", messages=args.messages, body_size=500, hours=4)
    rows = []
    for engine in ENGINES:
        for source, counted in ((warmup, False), (landing, True)):
            lake = OUT / f"engine-lake-{engine}"
            shutil.rmtree(lake, ignore_errors=True)
            measured = pipeline(spark, source, lake, engine, clock)
            if counted:
                rows += measured
    by = {(r["engine"], r["job"]): r for r in rows}  # the second ingest / reput of each engine
    summary = {"messages": args.messages}
    for job in ("ingest", "reput", "expire"):
        rs, ds = by[("delta-rs", job)], by[("delta-spark", job)]
        summary[f"{job}_ratio"] = round(ds["seconds"] / rs["seconds"], 2)
        summary[f"{job}_commit_ms_per_table_rs"] = round(1000 * rs["commit_seconds"] / max(rs["commits"], 1), 1)
        summary[f"{job}_commit_ms_per_table_spark"] = round(1000 * ds["commit_seconds"] / max(ds["commits"], 1), 1)
    report("delta-rs vs delta-spark (ratio: delta-spark seconds / delta-rs seconds)", rows, summary, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
