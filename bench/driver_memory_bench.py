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
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import OUT, REPO, dataset, report

sys.path.insert(0, str(REPO))
from tests.cluster.standalone import standalone_cluster

BIN = Path(sys.executable).parent
SETTINGS = ["--conf", str(REPO / "conf"), "--set", "store.commitlog_segment_size=67108864"]


def _tree(pid: int) -> dict[int, str]:
    """pid -> command name of ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            names[int(entry)] = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
    found, todo = {}, [pid]
    while todo:
        current = todo.pop()
        found[current] = names.get(current, "?")
        todo += children.get(current, [])
    return found


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_sampled(command: list[str], env: dict) -> dict:
    """Run ``command``; the peak RSS of its java and python descendants (the driver), sampled every 0.2 s."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks = {"java": 0.0, "python": 0.0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for pid, name in _tree(process.pid).items():
                kind = "java" if name.startswith("java") else "python" if name.startswith("python") else None
                if kind:
                    peaks[kind] = max(peaks[kind], _rss_mb(pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    _, err = process.communicate()
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{err[-3000:]}")
    return {
        "seconds": round(time.monotonic() - started, 1),
        "driver_jvm_mb": round(peaks["java"]),
        "driver_python_mb": round(peaks["python"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    subprocess.run(["make", "package"], cwd=REPO, check=True, capture_output=True)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["SPARK_CONF_DIR"] = str(REPO / "conf")
    work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-memory-", dir=OUT))
    rows = []
    try:
        with standalone_cluster(work / "cluster", env, workers=2, cores=1, memory="4g") as cluster:
            for messages in args.messages:
                landing = dataset(f"memory-{messages}", messages=messages, body_size=100, hours=6)
                lake = work / f"lake-{messages}"
                for job, options in (("ingest", ["--input", str(landing)]), ("reput", [])):
                    command = [
                        str(BIN / "spark-submit"),
                        *("--master", cluster["url"], "--driver-memory", "1g", "--executor-memory", "3g"),
                        *("--py-files", str(REPO / "dist" / "rmqlake.zip")),
                        *("--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.cores.max=2"),
                        f"jobs/{job}.py",
                        *options,
                        *("--lake", str(lake), *SETTINGS),
                    ]
                    rows.append({"messages": messages, "job": job, **run_sampled(command, env)})
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
