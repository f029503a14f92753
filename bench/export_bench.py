"""export-store throughput next to the disk's sequential write speed, measured in the same run.

    .venv/bin/python bench/export_bench.py [--segments 100] [--json]

The lake of the expiry benchmark (about ``--segments`` commitlog segments of
4 MiB, ~1 KiB bodies; cached under bench/out) is exported as a broker store
directory. The baseline writes the same number of segment-sized files of
non-zero bytes, in 1 MiB writes, into the same file system. Both are timed
up to ``os.sync()``, so page-cache tricks do not count. Printed: the seconds,
MB/s of commitlog file bytes, and export / disk as a ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from common import OUT, REPO, report, timed
from expire_bench import SEGMENT, _sizes, lake_with_segments

CHUNK = 1024 * 1024


def sequential_write(folder: Path, files: int, size: int) -> None:
    folder.mkdir(parents=True)
    block = os.urandom(CHUNK)
    for number in range(files):
        with open(folder / f"{number * size:020d}", "wb") as out:
            for _ in range(size // CHUNK):
                out.write(block)
    os.sync()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rmqlake.config import load_settings
    from rmqlake.logs import configure_logging
    from rmqlake.session import get_spark
    from rmqlake.steps.store import export_store

    configure_logging("WARNING")
    settings = load_settings(REPO / "conf")
    spark = get_spark(settings.spark, conf_dir=REPO / "conf", app_name="rmqlake-bench-export")
    lake = lake_with_segments(spark, args.segments)
    settings = load_settings(REPO / "conf", lake=str(lake), overrides=_sizes())
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rmqlake-bench-export-", dir=OUT))
    try:
        export_store(spark, settings, out=str(work / "warm-up"))  # JVM, Python workers, metadata caches
        with timed() as took:
            result = export_store(spark, settings, out=str(work / "store"))
            os.sync()
        files = result["commitlog_files"]
        with timed() as disk:
            sequential_write(work / "baseline", files, SEGMENT)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    file_mb = files * SEGMENT / 1e6
    rows = [
        {
            "writer": "export-store (commitlog + CQ + index)",
            "files": files,
            "commitlog_mb": round(file_mb, 1),
            "records": result["records"],
            "seconds": round(took["seconds"], 2),
            "mb_per_s": round(file_mb / took["seconds"], 1),
        },
        {
            "writer": "sequential write, 1 MiB blocks",
            "files": files,
            "commitlog_mb": round(file_mb, 1),
            "records": None,
            "seconds": round(disk["seconds"], 2),
            "mb_per_s": round(file_mb / disk["seconds"], 1),
        },
    ]
    summary = {
        "export_vs_disk": round(rows[0]["mb_per_s"] / rows[1]["mb_per_s"], 3),
        "data_mb_per_s": round(result["commitlog_data_bytes"] / 1e6 / took["seconds"], 1),
        "stage_seconds": result["stage_seconds"],
    }
    report("export-store", rows, summary, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
