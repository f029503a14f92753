"""export-store and import-store throughput next to the disk's sequential write speed, measured in the same run.

    .venv/bin/python bench/export_bench.py [--messages 1000000] [--segments 100] [--runs 3] [--json]

Two lakes (cached under bench/out):

1. ``1000k/1GiB``: ``--messages`` generated messages (~1 KiB bodies, the
   ingest benchmark's input) ingested and dispatched with the default store
   sizes (1 GiB commitlog segments): the headline.
2. ``100x4MiB``: the expiry benchmark's lake, about ``--segments``
   commitlog segments of 4 MiB (~1 KiB bodies): many small files and tasks.

Each run exports the lake as a broker store directory, then imports that
store into a new lake, and between them writes the same bytes as the
export's commitlog files hold (their records and end-of-file blanks, in
files of the same sizes) sequentially in 1 MiB writes into the same file
system, twice: straight to the device (``O_DIRECT``, then ``fsync``), the
baseline of the ratios; and through the page cache, as ``cp`` would,
printed beside it. All are timed up to ``os.sync()``, so page-cache tricks
do not count. The import is set against the same write baseline: its input
was just written, so reading it back comes from memory and says nothing of
the disk, while its output is written to the same disk. Printed per run:
seconds, MB/s of commitlog data and the ratios export / disk and import /
disk; then the medians and where the time went (stage seconds) in the last
run.

Why the device write is the baseline: a write through the page cache also
pays for the memory it fills. On a virtual machine that hands freed memory
back to its host (free page reporting), memory the guest has not used for a
couple of seconds costs ~1.5-2 s per GiB to touch again, so the same cached
write of 1.2 GB took 0.6 s or 2.9 s depending on what ran just before it,
and the ratios moved by 3-4x between repetitions. The device write does not
fill the page cache and moved by ~20 %. Where the file system refuses
``O_DIRECT`` (tmpfs, some FUSE mounts) the cached write is the baseline and
the run says so (``disk_direct``).
"""

from __future__ import annotations

import argparse
import errno
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import LAKE_LAYOUT, OUT, REPO, dataset, report, timed
from expire_bench import _sizes, lake_with_segments

CHUNK = 1024 * 1024


def lake_of_messages(spark, messages: int) -> Path:
    """The ingest benchmark's input ingested and dispatched with the default store sizes (cached)."""
    from rmqlake.config import load_settings
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    root = OUT / f"export-lake-{messages}"
    marker = root / "DONE.json"
    if marker.exists() and json.loads(marker.read_text()).get("layout") == LAKE_LAYOUT:
        return root / "lake"
    shutil.rmtree(root, ignore_errors=True)
    landing = dataset(f"ingest-{messages}", messages=messages, body_size=1024)
    settings = load_settings(REPO / "conf", lake=str(root / "lake"))
    started = time.monotonic()
    ingest(spark, settings, input_path=str(landing))
    reput(spark, settings)
    marker.write_text(json.dumps({"messages": messages, "layout": LAKE_LAYOUT,
                                  "seconds": round(time.monotonic() - started)}))  # fmt: skip
    return root / "lake"


def sequential_write(folder: Path, sizes: list[int]) -> None:
    """Files of ``sizes`` bytes of non-zero data, in 1 MiB writes through the page cache, then ``os.sync()``."""
    folder.mkdir(parents=True)
    block = os.urandom(CHUNK)
    for number, size in enumerate(sizes):
        with open(folder / f"{number:020d}", "wb") as out:
            for at in range(0, size, CHUNK):
                out.write(block[: min(CHUNK, size - at)])
    os.sync()


# O_DIRECT wants offsets, lengths and the buffer's address in multiples of the device's logical block (512 B
# or 4 KiB): a file's last write is rounded up to this, at most 4 KiB more than its data per file
DIRECT_ALIGN = 4096


def direct_write(folder: Path, sizes: list[int]) -> bool:
    """``sequential_write`` straight to the device (``O_DIRECT``, each file ``fsync``-ed), then ``os.sync()``;
    ``False`` (nothing left behind) when the file system refuses ``O_DIRECT``: the caller falls back."""
    if not hasattr(os, "O_DIRECT"):
        return False
    folder.mkdir(parents=True)
    block = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
    block.write(os.urandom(CHUNK))
    try:
        for number, size in enumerate(sizes):
            fd = os.open(folder / f"{number:020d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            try:
                for at in range(0, size, CHUNK):
                    length = -(-min(CHUNK, size - at) // DIRECT_ALIGN) * DIRECT_ALIGN
                    if os.pwrite(fd, memoryview(block)[:length], at) != length:
                        raise OSError(f"a short O_DIRECT write at {at} of {folder / f'{number:020d}'}")
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        shutil.rmtree(folder)
        return False
    finally:
        block.close()
    os.sync()
    return True


def written_sizes(commitlog: Path) -> list[int]:
    """Per commitlog file, the bytes up to the end of its end-of-file blank (sealed) or of its last record:
    what the export wrote with data; the rest of a file is a hole. A record and the blank end in non-zero
    bytes only by chance, so this may be a few bytes short: noise next to megabytes."""
    sizes = []
    for path in sorted(commitlog.iterdir()):
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = len(data)
            while end > 0:
                at = max(0, end - CHUNK)
                kept = len(data[at:end].rstrip(b"\0"))
                if kept:
                    end = at + kept
                    break
                end = at
            sizes.append(end)
    return sizes


def run_lake(spark, label: str, lake: Path, overrides: list[str], runs: int, work: Path) -> tuple[list[dict], dict]:
    from rmqlake.config import load_settings
    from rmqlake.steps.store import export_store, import_store

    settings = load_settings(REPO / "conf", lake=str(lake), overrides=overrides)
    export_store(spark, settings, out=str(work / "warm-up"))  # JVM, Python workers, metadata caches
    warm = load_settings(REPO / "conf", lake=str(work / "warm-lake"), overrides=overrides)
    import_store(spark, warm, store_dir=str(work / "warm-up"))
    # the disk's first large write of a run is often faster (a cache below the file system): warm it up too
    warm_sizes = written_sizes(work / "warm-up" / "commitlog")
    direct = direct_write(work / "warm-direct", warm_sizes)
    sequential_write(work / "warm-baseline", warm_sizes)
    for folder in ("warm-up", "warm-lake", "warm-baseline", "warm-direct"):
        shutil.rmtree(work / folder, ignore_errors=True)
    rows, last = [], {}
    for number in range(1, runs + 1):
        store = work / f"store-{number}"
        with timed() as took:
            exported = export_store(spark, settings, out=str(store))
            os.sync()
        sizes = written_sizes(store / "commitlog")
        with timed() as cached:
            sequential_write(work / f"baseline-{number}", sizes)
        shutil.rmtree(work / f"baseline-{number}")
        if direct:
            with timed() as disk:
                if not direct_write(work / f"direct-{number}", sizes):
                    raise SystemExit(f"O_DIRECT was taken in the warm-up and refused in run {number}")
            shutil.rmtree(work / f"direct-{number}")
        else:
            disk = cached
        target = load_settings(REPO / "conf", lake=str(work / f"imported-{number}"), overrides=overrides)
        with timed() as back:
            imported = import_store(spark, target, store_dir=str(store))
            os.sync()
        if imported["messages"] != exported["records"] or imported["corrupt_records"]:
            raise SystemExit(
                f"the import of {store} read {imported['messages']} messages "
                f"({imported['corrupt_records']} corrupt), the export wrote {exported['records']}"
            )
        shutil.rmtree(store)
        shutil.rmtree(work / f"imported-{number}")
        mb = sum(sizes) / 1e6
        rows.append(
            {
                "lake": label,
                "run": number,
                "commitlog_files": len(sizes),
                "data_mb": round(mb, 1),
                "records": exported["records"],
                "export_s": round(took["seconds"], 2),
                "import_s": round(back["seconds"], 2),
                "disk_write_s": round(disk["seconds"], 2),
                "cached_write_s": round(cached["seconds"], 2),
                "disk_direct": direct,
                "export_mb_s": round(mb / took["seconds"], 1),
                "import_mb_s": round(mb / back["seconds"], 1),
                "disk_mb_s": round(mb / disk["seconds"], 1),
                "cached_mb_s": round(mb / cached["seconds"], 1),
                "export_vs_disk": round(disk["seconds"] / took["seconds"], 3),
                "import_vs_disk": round(disk["seconds"] / back["seconds"], 3),
            }
        )
        last = {
            "export_stage_seconds": exported["stage_seconds"],
            "import_stage_seconds": imported.get("stage_seconds"),
        }
    return rows, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--segments", type=int, default=100, help="the 4 MiB-segment lake; 0 leaves it out")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rmqlake.config import load_settings
    from rmqlake.logs import configure_logging
    from rmqlake.session import get_spark

    configure_logging("WARNING")
    settings = load_settings(REPO / "conf")
    spark = get_spark(settings.spark, conf_dir=REPO / "conf", app_name="rmqlake-bench-export")
    lakes = [(f"{args.messages // 1000}k/1GiB", lake_of_messages(spark, args.messages), [])]
    if args.segments:
        lakes.append((f"{args.segments}x4MiB", lake_with_segments(spark, args.segments), _sizes()))
    OUT.mkdir(parents=True, exist_ok=True)
    rows, summary = [], {}
    for label, lake, overrides in lakes:
        work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-export-", dir=OUT))
        try:
            lake_rows, last = run_lake(spark, label, lake, overrides, args.runs, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows += lake_rows
        summary[label] = {
            "export_vs_disk_median": statistics.median(r["export_vs_disk"] for r in lake_rows),
            "import_vs_disk_median": statistics.median(r["import_vs_disk"] for r in lake_rows),
            "target": ">= 0.5",
            "disk": "O_DIRECT" if all(r["disk_direct"] for r in lake_rows) else "page cache (O_DIRECT refused)",
            "export_vs_cached_write_median": statistics.median(
                round(r["cached_write_s"] / r["export_s"], 3) for r in lake_rows
            ),
            **last,
        }
    if args.json:
        report("export-store and import-store", rows, {"lakes": summary}, as_json=True)
    else:
        flat = {f"{label}: {key}": value for label, values in summary.items() for key, value in values.items()}
        report("export-store and import-store", rows, flat, as_json=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
