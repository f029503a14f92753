"""Scale run: generated hourly batches through ingest, reput, compact, expire and export-store at 1 M, 5 M and 20 M.

    .venv/bin/python bench/scale_bench.py [--messages 1000000,5000000,20000000] [--hour-messages 500000] [--json]

Per scale, on a Spark standalone cluster (master + 2 one-core workers; every
job is ``spark-submit --py-files dist/rmqlake.zip`` in client mode, as
``bench/driver_memory_bench.py`` runs them):

* the messages are generated hour by hour (``rmqlake.generate``, the bench
  topic plan with its COMPACTION topic, ~1 KiB bodies, ``--hour-messages``
  per hour, so more messages are more hours of the same traffic); hours are
  generated ``--generators`` at a time in parallel processes (each hour its
  own seed, so the files do not depend on how many run at once), then each
  hour is ingested (``--now`` = the hour's end, as the hourly pipeline does)
  and dispatched (reput), and its input deleted;
* one compaction over everything (the COMPACTION topic's first run);
* expiry at the deletion hour (04:00) once the first quarter of the hours is
  past the 72 h reserved time (the hours are placed so that it is), with no
  per-run segment limit, so it deletes about a quarter of the segments;
* export-store of what is left; its size is measured, then it is deleted, and
  so is the lake.

Printed per scale and step: seconds (spark-submit wall time, JVM start
included, summed over the hourly runs), seconds per million messages of the
scale (flat across scales when nothing grows with the lake), the jobs' own
seconds, rows and rows/s, the driver's peak resident memory (JVM and Python,
sampled from /proc; the largest over the step's runs) and the bytes of the
lake after the step (of the store for export-store). Then the large / small
ratios, the generation rate and the disk high-water mark (of this run's files,
and of the file system's used bytes while it ran). Segments are 128 MiB
(``--segment-size``) so that even 1 M messages make segments for expiry to
delete. Before each scale the free disk is checked against what it needs.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shutil
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from cluster_driver import driver_env, last_json, packaged_cluster, run_sampled, submit_command
from common import OUT, REPO, TOPIC_PLAN, machine

HOUR_MS = 3_600_000
# the expiry run's time at an hour of 2 hours' traffic: 2026-11-28T04:00:00Z, the deletion hour
DELETION_AT_MS = 1_795_838_400_000
RESERVED_HOURS = 72  # retention.file_reserved_hours of conf/defaults.yaml
STEPS = ("ingest", "reput", "compact", "expire", "export-store")
# disk per message seen at 1 KiB bodies: lake ~0.6 KB (Parquet), exported store ~1.3 KB; with a margin
DISK_PER_MESSAGE = 2_200


def hour_counts(messages: int, hour_messages: int) -> list[int]:
    """Messages per hour: ``hour_messages`` each, the last hour the rest."""
    hours = max(1, math.ceil(messages / hour_messages))
    return [min(hour_messages, messages - hour * hour_messages) for hour in range(hours)]


def timeline(hours: int) -> tuple[int, int]:
    """(start of the first hour, expiry time): a quarter of the span is past the reserved time at 04:00.

    ``now = start + 72 h + hours / 4``; the start is a whole hour and now falls in the deletion hour.
    """
    quarter_ms = hours * HOUR_MS // 4
    now_ms = DELETION_AT_MS + quarter_ms % HOUR_MS
    return now_ms - RESERVED_HOURS * HOUR_MS - quarter_ms, now_ms


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def generate_hour(task: dict) -> dict:
    """Producer logs of one hour under ``task["root"]`` (a process of the generation pool)."""
    from rmqlake.generate import TopicPlan, generate

    started = time.monotonic()
    summary = generate(
        task["root"],
        messages=task["messages"],
        topics=[TopicPlan(*plan) for plan in TOPIC_PLAN],
        hours=1,
        seed=task["seed"],
        start_ms=task["start_ms"],
        body_size=task["body_size"],
    )
    folder = Path(task["root"]) / Path(summary["files"][0]).parent
    return {**task, "input": str(folder), "lines": summary["lines"], "seconds": time.monotonic() - started}


def allocated_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (sparse files count what is written)."""
    if not path.exists():
        return 0
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def apparent_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class DiskWatch:
    """The file system's used bytes above its level at the start, sampled every 0.5 s; and this run's own peak."""

    def __init__(self, path: Path):
        self.path = path
        self.base = shutil.disk_usage(path).used
        self.peak = 0
        self.own_peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._done.is_set():
            self.peak = max(self.peak, shutil.disk_usage(self.path).used - self.base)
            time.sleep(0.5)

    def checkpoint(self, root: Path) -> None:
        self.own_peak = max(self.own_peak, allocated_bytes(root))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def check_disk(messages: int, hour_messages: int, generators: int) -> None:
    free = shutil.disk_usage(OUT).free
    need = DISK_PER_MESSAGE * (messages + hour_messages * generators)
    if need > free:
        raise SystemExit(
            f"bench-scale: {messages:,} messages need about {need / 1e9:.0f} GB of disk under {OUT}, "
            f"{free / 1e9:.0f} GB are free"
        )


class Steps:
    """The runs of each step at one scale, summed per step."""

    def __init__(self, cluster: dict, env: dict, *, lake: Path, settings: list[str]):
        self.cluster, self.env, self.lake, self.settings = cluster, env, lake, settings
        self.runs: dict[str, list[dict]] = {step: [] for step in STEPS}

    def run(self, step: str, options: list[str], *, rows) -> dict:
        """Submit ``jobs/<step>.py``; ``rows(result)`` = the rows it worked on."""
        job = step.replace("-", "_")
        command = submit_command(self.cluster, job, [*options, "--lake", str(self.lake), *self.settings, "--json"])
        figures, stdout = run_sampled(command, self.env)
        result = last_json(stdout)
        entry = {**figures, "job_seconds": result.get("seconds") or 0.0, "rows": rows(result), "result": result}
        self.runs[step].append(entry)
        return entry

    def row(self, step: str, *, messages: int, nbytes: int) -> dict:
        runs = self.runs[step]
        seconds = sum(r["seconds"] for r in runs)
        rows = sum(r["rows"] for r in runs)
        return {
            "messages": messages,
            "step": step,
            "runs": len(runs),
            "seconds": round(seconds, 1),
            "s_per_M": round(seconds / (messages / 1e6), 1),
            "job_seconds": round(sum(r["job_seconds"] for r in runs), 1),
            "rows": rows,
            "rows_per_s": round(rows / seconds) if seconds else 0,
            "driver_jvm_mb": max(r["driver_jvm_mb"] for r in runs),
            "driver_python_mb": max(r["driver_python_mb"] for r in runs),
            "bytes": nbytes,
        }


def run_scale(cluster, env, pool, args, messages: int, disk: DiskWatch) -> tuple[list[dict], dict]:
    """One scale from an empty lake; its rows per step, and its generation and per-hour figures."""
    root = OUT / "scale" / f"m{messages}"
    shutil.rmtree(root, ignore_errors=True)
    lake, inputs, export = root / "lake", root / "input", root / "export"
    counts = hour_counts(messages, args.hour_messages)
    start_ms, expire_ms = timeline(len(counts))
    end_ms = start_ms + len(counts) * HOUR_MS
    settings = ["--conf", str(REPO / "conf"), "--set", f"store.commitlog_segment_size={args.segment_size}"]
    steps = Steps(cluster, env, lake=lake, settings=settings)
    tasks = [
        {
            "root": str(inputs / f"hour-{hour:04d}"),
            "messages": count,
            "seed": args.seed * 100_000 + hour,
            "start_ms": start_ms + hour * HOUR_MS,
            "body_size": args.body_size,
        }
        for hour, count in enumerate(counts)
    ]
    generation = {"seconds": 0.0, "process_seconds": 0.0, "lines": 0}
    hours = []
    ingest_bytes = reput_bytes = 0
    try:
        for first in range(0, len(tasks), args.generators):
            started = time.monotonic()
            made = pool.map(generate_hour, tasks[first : first + args.generators])
            generation["seconds"] += time.monotonic() - started
            generation["process_seconds"] += sum(m["seconds"] for m in made)
            generation["lines"] += sum(m["lines"] for m in made)
            disk.checkpoint(root)
            for hour in made:
                hour_end = iso(hour["start_ms"] + HOUR_MS)
                options = ["--input", hour["input"], "--now", hour_end]
                ingested = steps.run("ingest", options, rows=lambda r: r["rows_out"])
                shutil.rmtree(hour["root"])
                ingest_bytes = apparent_bytes(lake)
                dispatched = steps.run("reput", [], rows=lambda r: r["rows_in"])
                reput_bytes = apparent_bytes(lake)
                disk.checkpoint(root)
                hours.append(
                    {
                        "hour": iso(hour["start_ms"]),
                        "messages": hour["messages"],
                        "ingest_s": ingested["seconds"],
                        "reput_s": dispatched["seconds"],
                        "ingest_driver_jvm_mb": ingested["driver_jvm_mb"],
                        "reput_driver_jvm_mb": dispatched["driver_jvm_mb"],
                    }
                )
                print(f"{messages:,}: {hours[-1]}", file=sys.stderr)
        steps.run("compact", ["--now", iso(end_ms)], rows=lambda r: r["rows_in"])
        compact_bytes = apparent_bytes(lake)
        expired = steps.run(
            "expire",
            ["--now", iso(expire_ms), "--set", "retention.max_segments_per_run=1000000"],
            rows=lambda r: sum(s["messages"] for s in r["segments"]),
        )
        expire_bytes = apparent_bytes(lake)
        exported = steps.run("export-store", ["--out", str(export)], rows=lambda r: r["records"])
        disk.checkpoint(root)
        export_bytes, export_disk_bytes = apparent_bytes(export), allocated_bytes(export)
        shutil.rmtree(export)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sizes = {
        "ingest": ingest_bytes,
        "reput": reput_bytes,
        "compact": compact_bytes,
        "expire": expire_bytes,
        "export-store": export_bytes,
    }
    rows = [steps.row(step, messages=messages, nbytes=sizes[step]) for step in STEPS]
    detail = {
        "messages": messages,
        "hours": len(counts),
        "first_hour": iso(start_ms),
        "expire_now": iso(expire_ms),
        "segments_deleted": expired["result"]["segments_deleted"],
        "segments_exported": exported["result"]["commitlog_files"],
        # segment, CQ and index files have their fixed sizes; what is not written takes no disk
        "export_disk_bytes": export_disk_bytes,
        "seconds_total": round(generation["seconds"] + sum(r["seconds"] for s in STEPS for r in steps.runs[s]), 1),
        "generation_seconds": round(generation["seconds"], 1),
        "generation_process_seconds": round(generation["process_seconds"], 1),
        "generation_lines_per_s": round(generation["lines"] / generation["seconds"]),
        "per_hour": hours,
    }
    return rows, detail


def markdown(rows: list[dict]) -> str:
    columns = (
        ("messages", "messages"),
        ("step", "step"),
        ("runs", "runs"),
        ("seconds", "seconds"),
        ("s_per_M", "s per M messages"),
        ("job_seconds", "job seconds"),
        ("rows", "rows"),
        ("rows_per_s", "rows/s"),
        ("driver_jvm_mb", "driver JVM peak MB"),
        ("driver_python_mb", "driver Python peak MB"),
        ("bytes", "lake / store bytes"),
    )
    lines = ["| " + " | ".join(title for _, title in columns) + " |"]
    lines.append("| " + " | ".join("---" if key == "step" else "---:" for key, _ in columns) + " |")
    for row in rows:
        cells = [f"{row[key]:,}" if isinstance(row[key], int) else str(row[key]) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise(rows: list[dict], details: list[dict], disk: DiskWatch) -> dict:
    sizes = sorted({r["messages"] for r in rows})
    small, large = sizes[0], sizes[-1]
    summary: dict = {"messages_ratio": round(large / small, 1)}
    for step in STEPS:
        low, high = (next(r for r in rows if r["messages"] == n and r["step"] == step) for n in (small, large))
        summary[f"{step}_s_per_M_ratio"] = round(high["s_per_M"] / max(low["s_per_M"], 0.1), 2)
        summary[f"{step}_driver_jvm_ratio"] = round(high["driver_jvm_mb"] / max(low["driver_jvm_mb"], 1), 2)
        summary[f"{step}_driver_python_ratio"] = round(high["driver_python_mb"] / max(low["driver_python_mb"], 1), 2)
    summary["generation_lines_per_s"] = [d["generation_lines_per_s"] for d in details]
    summary["disk_high_water_gb"] = round(disk.own_peak / 1e9, 2)
    summary["filesystem_used_high_water_gb"] = round(disk.peak / 1e9, 2)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--messages",
        default="1000000,5000000,20000000",
        type=lambda text: [int(n) for n in text.split(",")],
        help="comma-separated scales (default 1000000,5000000,20000000)",
    )
    parser.add_argument("--hour-messages", type=int, default=500_000, help="messages per hourly batch")
    parser.add_argument("--body-size", type=int, default=1000, help="bytes per body, ±10 %% (default 1000)")
    parser.add_argument("--segment-size", type=int, default=128 * 1024 * 1024, help="commitlog segment bytes")
    parser.add_argument("--generators", type=int, default=multiprocessing.cpu_count(), help="generation processes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for messages in args.messages:
        check_disk(messages, args.hour_messages, args.generators)
    env = driver_env()
    disk = DiskWatch(OUT)
    rows, details = [], []
    # spawn: the generation processes start clean, not as copies of a process running threads
    context = multiprocessing.get_context("spawn")
    try:
        with (
            context.Pool(args.generators, maxtasksperchild=1) as pool,
            packaged_cluster(OUT / "scale" / "cluster", env) as cluster,
        ):
            for messages in args.messages:
                check_disk(messages, args.hour_messages, args.generators)
                scale_rows, detail = run_scale(cluster, env, pool, args, messages, disk)
                rows += scale_rows
                details.append(detail)
                print(markdown(scale_rows), file=sys.stderr)
    finally:
        disk.stop()
        shutil.rmtree(OUT / "scale", ignore_errors=True)
    summary = summarise(rows, details, disk)
    if args.json:
        import json

        print(json.dumps({"benchmark": "scale", **summary, "rows": rows, "scales": details, "machine": machine()}))
        return 0
    print("\n== scale: hourly batches through ingest, reput, compact, expire, export-store ==\n")
    print(markdown(rows))
    print()
    for detail in details:
        per_hour = detail.pop("per_hour")
        ingest = [h["ingest_s"] for h in per_hour]
        reput = [h["reput_s"] for h in per_hour]
        # reput over the same hour's ingest: ingest does not grow with the lake, so this cancels a host whose
        # speed moves from hour to hour
        relative = [r / i for r, i in zip(reput, ingest, strict=True)]
        quarter = max(1, len(reput) // 4)
        print(
            f"* {detail['messages']:,} messages: {detail['hours']} hour(s) from {detail['first_hour']}, "
            f"expire at {detail['expire_now']} deleted {detail['segments_deleted']} segments, "
            f"{detail['segments_exported']} exported; per hour, ingest first {ingest[0]} s, last {ingest[-1]} s, "
            f"max {max(ingest)} s, reput first {reput[0]} s, last {reput[-1]} s, max {max(reput)} s, "
            f"median of the first / last quarter of hours {statistics.median(reput[:quarter]):.1f} / "
            f"{statistics.median(reput[-quarter:]):.1f} s, reput / ingest of the same hour "
            f"{statistics.median(relative[:quarter]):.2f} / {statistics.median(relative[-quarter:]):.2f}; "
            f"generated in {detail['generation_seconds']} s "
            f"({detail['generation_lines_per_s']:,} lines/s, {detail['generation_process_seconds']} s of processes); "
            f"store on disk {detail['export_disk_bytes']:,} bytes; {detail['seconds_total']} s in all"
        )
    print()
    for key, value in summary.items():
        print(f"* {key}: {value}")
    print(f"* machine: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
