"""Driver memory as the message count grows: ingest + reput of 1 M and 5 M messages on a standalone cluster.

    .venv/bin/python bench/driver_memory_bench.py [--messages 1000000 5000000] [--json]

A Spark standalone cluster (master + 2 one-core workers, tests/cluster/standalone.py)
runs the jobs as ``spark-submit --master spark://... --py-files dist/rmqlake.zip``
in client mode, so the driver (the spark-submit JVM and its Python process) is
apart from the executors. Its processes are sampled every 0.2 s from /proc
(resident set, high-water mark); the driver JVM's heap is capped at 1 GiB, so a
driver that collected message rows would fail or swap rather than pass. Printed:
per size and job the seconds and the peak RSS of the driver JVM and of the driver
Python, and the 5 M / 1 M ratios next to the ratio of messages (flat ≈ 1).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from cluster_driver import driver_env, packaged_cluster, run_sampled, submit_command
from common import OUT, REPO, dataset, report

SETTINGS = ["--conf", str(REPO / "conf"), "--set", "store.commitlog_segment_size=67108864"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = driver_env()
    work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-memory-", dir=OUT))
    rows = []
    try:
        with packaged_cluster(work / "cluster", env) as cluster:
            for messages in args.messages:
                landing = dataset(f"memory-{messages}", messages=messages, body_size=100, hours=6)
                lake = work / f"lake-{messages}"
                for job, options in (("ingest", ["--input", str(landing)]), ("reput", [])):
                    command = submit_command(cluster, job, [*options, "--lake", str(lake), *SETTINGS])
                    figures, _ = run_sampled(command, env)
                    rows.append({"messages": messages, "job": job, **figures})
                    print(rows[-1], file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sizes = sorted(set(args.messages))
    summary = {"messages_ratio": round(sizes[-1] / sizes[0], 1)}
    for job in ("ingest", "reput"):
        small, large = (next(r for r in rows if r["messages"] == n and r["job"] == job) for n in (sizes[0], sizes[-1]))
        summary[f"{job}_driver_jvm_ratio"] = round(large["driver_jvm_mb"] / max(small["driver_jvm_mb"], 1), 2)
        summary[f"{job}_driver_python_ratio"] = round(large["driver_python_mb"] / max(small["driver_python_mb"], 1), 2)
    report("driver memory (standalone cluster, client mode)", rows, summary, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
