"""Key lookup latency against the commitlog's and the indexfile's row-group sizes, and what each size costs.

    .venv/bin/python bench/lookup_layout_study.py [--rows 1448,512,256,128] [--parts commitlog,pages,index,write]
    .venv/bin/python bench/lookup_layout_study.py --parts spark      # Spark reads of the rewritten commitlogs

Reads the 5 M lookup lake (``bench/lookup_bench.py`` builds it) and never
writes to it: the commitlog and indexfile data files are rewritten, with the
ingest's writer options and other row-group sizes, under
``bench/out/lookup-layout-study``. Single process, pyarrow only (``spark``
part aside):

* ``commitlog``: per row-group size, the write time, footer bytes, cold open
  (footers + row-group bounds of every file), the Delta stats taken from the
  footers at commit, the warm lookup of each timed key's index offsets (as
  ``lake.lookup.read_rows`` does it, rows to Python), and a full scan;
* ``pages``: one file written with small data pages and a page index: does
  pyarrow, DuckDB or polars skip pages for a filter on ``physical_offset``?
* ``index``: one slot of every index file as the lake has it (Spark, ~4 MiB
  row groups) and rewritten in row groups of 16,384 and 65,536 rows;
* ``write``: 128 MiB of commitlog rows with ~1 KiB bodies (the ingest
  workload), written at each size in bytes per row group, and their Delta stats;
* ``spark``: Spark reading the rewritten commitlogs (reput's dispatch columns
  and every column).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from common import OUT, REPO

LAKE = OUT / "lookup-lake-5000000"
STUDY = OUT / "lookup-layout-study"
MIB = 1 << 20
WRITE_BLOCKS = [1024 * 1024, 128 * 1024]  # parquet.block.size values of the Spark write measured beside the default


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def timed_keys(lake, keys: int, warmup: int) -> list[tuple[str, str, list[int]]]:
    """The bench's keys (same pick) and their index offsets (newest 64), found through the lake's index."""
    import random

    from rmqlake.config import load_settings
    from rmqlake.formats.javahash import index_key
    from rmqlake.query import LONG_MAX, IndexReader

    store = load_settings(REPO / "conf").store
    sample = lake.scan("commitlog", columns=["topic", "keys"]).slice(0, 200_000)
    candidates = sorted(
        {
            (t, k)
            for t, ks in zip(sample.column("topic").to_pylist(), sample.column("keys").to_pylist(), strict=True)
            for k in (ks or [])
        }
    )
    picked = random.Random(7).sample(candidates, keys + warmup + 3)[: warmup + keys]
    reader = IndexReader(lake, slots=store.index_slots)
    return [(t, k, sorted(reader.query_offsets(index_key(t, k), max_num=64, begin=0, end=LONG_MAX))) for t, k in picked]


FILES_LIMIT = None  # --files: a smoke run over the first few files


def commitlog_files() -> list[Path]:
    return sorted((LAKE / "commitlog").glob("segment=*/*.parquet"))[:FILES_LIMIT]


def writer_options() -> dict:
    from rmqlake.ingest.tasks import COMMITLOG_WRITE_OPTIONS

    return dict(COMMITLOG_WRITE_OPTIONS)


def rewrite(source: Path, target: Path, rows: int, **extra) -> float:
    """``source``'s rows written to ``target`` in row groups of ``rows``; the seconds the write took."""
    import pyarrow.parquet as pq

    table = pq.read_table(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with pq.ParquetWriter(target, table.schema, **writer_options(), **extra) as writer:
        writer.write_table(table, row_group_size=rows)
    return time.perf_counter() - started


def layouts(files: list[Path]):
    import pyarrow.parquet as pq

    from rmqlake.lake.lookup import DataFileLayout, _bounds

    out = []
    for path in files:
        metadata = pq.read_metadata(path)
        out.append(DataFileLayout(str(path), path.stat().st_size, {}, metadata, *_bounds(metadata, "physical_offset")))
    return out


POOL = None


def lookup_rows(files, offsets: list[int], columns: list[str], *, variant: str = "one pass") -> list[dict]:
    """``read_rows``' work for one key: the row groups holding the offsets, read with the footer kept.

    ``two phase``: the offsets first, then the other columns of the row groups holding a match only;
    ``threads``: the files read by two threads, each decoding its row groups with one.
    """
    global POOL
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = np.asarray(offsets, dtype=np.int64)
    if variant == "threads":
        from concurrent.futures import ThreadPoolExecutor

        POOL = POOL or ThreadPoolExecutor(2)
        work = [(layout, layout.groups_holding(wanted)) for layout in files]

        def read(item):
            layout, groups = item
            data = pq.ParquetFile(layout.path, metadata=layout.metadata).read_row_groups(
                groups, columns=list(dict.fromkeys([*columns, "physical_offset"])), use_threads=False
            )
            return data.filter(pc.is_in(data.column("physical_offset"), pa.array(wanted))).select(columns)

        pieces = list(POOL.map(read, [w for w in work if w[1]]))
        return pa.concat_tables(pieces).to_pylist() if pieces else []
    pieces = []
    for layout in files:
        groups = layout.groups_holding(wanted)
        if not groups:
            continue
        reader = pq.ParquetFile(layout.path, metadata=layout.metadata)
        if variant == "two phase":
            found = reader.read_row_groups(groups, columns=["physical_offset"]).column(0)
            sizes = [layout.metadata.row_group(g).num_rows for g in groups]
            hit = np.isin(found.to_numpy(), wanted)
            starts = np.cumsum([0, *sizes])
            groups = [g for g, a, b in zip(groups, starts[:-1], starts[1:], strict=True) if hit[a:b].any()]
        data = reader.read_row_groups(groups, columns=list(dict.fromkeys([*columns, "physical_offset"])))
        data = data.filter(pc.is_in(data.column("physical_offset"), pa.array(wanted)))
        pieces.append(data.select(columns))
    return pa.concat_tables(pieces).to_pylist() if pieces else []


def full_scan(files) -> float:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    started = time.perf_counter()
    table = ds.dataset([str(f) for f in files], format="parquet").to_table(
        columns=["physical_offset", "topic", "keys", "sys_flag"]
    )
    table = table.filter(pc.not_equal(pc.bit_wise_and(table.column("sys_flag"), 0xC), 0xC))
    pc.list_flatten(table.column("keys"))
    return time.perf_counter() - started


def study_commitlog(rows_list: list[int], keys) -> list[dict]:
    from rmqlake.lake.actions import parquet_stats
    from rmqlake.query import MESSAGE_VIEW_COLUMNS

    sources = commitlog_files()
    results, reference = [], None
    for rows in rows_list:
        folder = STUDY / f"commitlog-rg{rows}"
        targets = [folder / s.relative_to(LAKE / "commitlog") for s in sources]
        write_s = 0.0
        if not (folder / "DONE").exists():
            write_s = sum(rewrite(s, t, rows) for s, t in zip(sources, targets, strict=True))
            (folder / "DONE").write_text(json.dumps({"write_s": write_s}))
        write_s = json.loads((folder / "DONE").read_text())["write_s"]
        started = time.perf_counter()
        files = layouts(targets)
        open_s = time.perf_counter() - started
        started = time.perf_counter()
        for layout in files:
            parquet_stats(layout.metadata)
        stats_s = time.perf_counter() - started
        for variant in ("one pass", "two phase", "threads") if rows == rows_list[0] else ("one pass", "threads"):
            for _, _, offsets in keys[:5]:  # warm-up: page cache and allocator
                lookup_rows(files, offsets, MESSAGE_VIEW_COLUMNS, variant=variant)
            times, answers = [], []
            for _ in range(3):
                for _, _, offsets in keys[5:]:
                    started = time.perf_counter()
                    answers.append(lookup_rows(files, offsets, MESSAGE_VIEW_COLUMNS, variant=variant))
                    times.append(time.perf_counter() - started)
            if reference is None:
                reference = answers
            assert answers == reference, f"rows differ at {rows} rows per group ({variant})"
            groups_read = statistics.median(
                sum(len(f.groups_holding(__import__("numpy").asarray(o))) for f in files) for _, _, o in keys[5:]
            )
            scans = [full_scan(targets) for _ in range(2)] if variant == "one pass" else [float("nan")]
            write_s = write_s if variant == "one pass" else float("nan")
            results.append(
                {
                    "rows_per_group": rows,
                    "variant": variant,
                    "row_groups": sum(f.metadata.num_row_groups for f in files),
                    "groups_read_p50": groups_read,
                    "lookup_p50_ms": ms(statistics.median(times)),
                    "lookup_p90_ms": ms(sorted(times)[int(0.9 * (len(times) - 1))]),
                    "scan_ms": ms(min(scans)),
                    "write_s": round(write_s, 2),
                    "data_mb": round(sum(t.stat().st_size for t in targets) / MIB, 1),
                    "footer_mb": round(sum(f.metadata.serialized_size for f in files) / MIB, 2),
                    "open_ms": ms(open_s),
                    "delta_stats_ms": ms(stats_s),
                }
            )
            print(json.dumps(results[-1]), flush=True)
    return results


def study_pages(keys) -> list[dict]:
    """Does a reader skip data pages through the page index when a filter selects a few rows?"""
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    source = max(commitlog_files(), key=lambda p: p.stat().st_size)
    table = pq.read_table(source, columns=["physical_offset", "body", "properties", "msg_id"])
    offsets = table.column("physical_offset").to_pylist()
    wanted = [offsets[len(offsets) // 3], offsets[2 * len(offsets) // 3]]
    results = []
    for name, extra in [
        ("1448 rows, one page a chunk", {}),
        ("1448 rows, pages of 64 rows + page index", {"max_rows_per_page": 64, "write_page_index": True}),
        ("whole file one row group, one page a chunk", {"_rows": table.num_rows}),
        (
            "whole file one row group, pages of 64 rows + page index",
            {"_rows": table.num_rows, "max_rows_per_page": 64, "write_page_index": True, "data_page_size": 1 << 30},
        ),
    ]:
        rows = extra.pop("_rows", 1448)
        target = STUDY / "pages" / f"{abs(hash(name))}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(target, table.schema, compression="snappy", **extra) as writer:
            writer.write_table(table, row_group_size=rows)
        readers = {
            "pyarrow dataset filter": lambda target=target: (
                ds.dataset(str(target)).to_table(filter=ds.field("physical_offset").isin(wanted)).num_rows
            ),
            "duckdb": lambda target=target: (
                duckdb.sql(
                    f"select * from read_parquet('{target}') where physical_offset in ({wanted[0]}, {wanted[1]})"
                )
                .fetch_arrow_table()
                .num_rows
            ),
            "polars scan filter": lambda target=target: (
                pl.scan_parquet(target).filter(pl.col("physical_offset").is_in(wanted)).collect().height
            ),
        }
        for reader, run in readers.items():
            assert run() == 2
            times = []
            for _ in range(5):
                started = time.perf_counter()
                run()
                times.append(time.perf_counter() - started)
            results.append({"file": name, "reader": reader, "ms": ms(statistics.median(times))})
            print(json.dumps(results[-1]), flush=True)
    return results


def study_index(keys, sizes: list[int]) -> list[dict]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from rmqlake.config import load_settings
    from rmqlake.formats.javahash import index_key, index_key_hash
    from rmqlake.lake.lookup import DataFileLayout, _bounds

    slots = load_settings(REPO / "conf").store.index_slots
    sources = sorted((LAKE / "indexfile").glob("index_file=*/*.parquet"))
    columns = ["index_no", "key_hash", "phy_offset", "time_diff", "prev_index"]
    results, reference = [], None
    for rows in [0, *sizes]:
        if rows:
            targets = [STUDY / f"indexfile-rg{rows}" / s.relative_to(LAKE / "indexfile") for s in sources]
            for s, t in zip(sources, targets, strict=True):
                if not t.exists():
                    table = pq.read_table(s)
                    t.parent.mkdir(parents=True, exist_ok=True)
                    pq.write_table(table, t, row_group_size=rows, compression="snappy")
        else:
            targets = sources
        files = []
        for path in targets:
            metadata = pq.read_metadata(path)
            files.append(DataFileLayout(str(path), 0, {}, metadata, *_bounds(metadata, "slot")))

        def slot_rows(slot: int, files=files) -> list:
            wanted = np.asarray([slot], dtype=np.int64)
            pieces = []
            for layout in files:
                groups = layout.groups_holding(wanted)
                if groups:
                    data = pq.ParquetFile(layout.path, metadata=layout.metadata).read_row_groups(
                        groups, columns=[*columns, "slot"]
                    )
                    pieces.append(
                        data.filter(pc.equal(data.column("slot"), pa.scalar(slot, pa.int32()))).select(columns)
                    )
            return pa.concat_tables(pieces).sort_by("index_no").to_pylist()

        wanted_slots = [index_key_hash(index_key(t, k)) % slots for t, k, _ in keys]
        for slot in wanted_slots[:5]:
            slot_rows(slot)
        times, answers = [], []
        for _ in range(3):
            for slot in wanted_slots[5:]:
                started = time.perf_counter()
                answers.append(slot_rows(slot))
                times.append(time.perf_counter() - started)
        reference = reference or answers
        assert answers == reference
        results.append(
            {
                "indexfile_rows_per_group": rows or "as written (Spark, 4 MiB)",
                "row_groups": sum(f.metadata.num_row_groups for f in files),
                "slot_read_p50_ms": ms(statistics.median(times)),
                "footer_kb": round(sum(f.metadata.serialized_size for f in files) / 1024, 1),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


def kib_rows():
    """~128 MiB of commitlog rows with ~1 KiB bodies: ten of the lake's 100-byte bodies joined per row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    source = max(commitlog_files(), key=lambda p: p.stat().st_size)
    table = pq.read_table(source)
    bodies = table.column("body").combine_chunks()
    rng = np.random.default_rng(3)
    pieces = [pc.take(bodies, rng.permutation(len(bodies))) for _ in range(10)]
    joined = pc.binary_join_element_wise(
        *[p.cast(pa.large_binary()) for p in pieces], pa.scalar(b"", pa.large_binary())
    )
    table = table.set_column(table.schema.get_field_index("body"), "body", joined.cast(pa.binary()))
    per_row = table.nbytes / table.num_rows
    return table.slice(0, int(128 * MIB / per_row))


def study_write(row_bytes: list[int]) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rmqlake.lake.actions import parquet_stats

    table = kib_rows()
    results = []
    for group_bytes in row_bytes:
        rows = max(1, int(group_bytes * table.num_rows / table.nbytes))
        times = []
        for _ in range(3):
            sink = pa.BufferOutputStream()
            started = time.perf_counter()
            with pq.ParquetWriter(sink, table.schema, **writer_options()) as writer:
                writer.write_table(table, row_group_size=rows)
            times.append(time.perf_counter() - started)
        buffer = sink.getvalue()
        metadata = pq.read_metadata(pa.BufferReader(buffer))
        started = time.perf_counter()
        parquet_stats(metadata)
        stats_s = time.perf_counter() - started
        started = time.perf_counter()
        pq.read_table(pa.BufferReader(buffer))
        read_s = time.perf_counter() - started
        results.append(
            {
                "group_kib": group_bytes // 1024,
                "rows_per_group": rows,
                "write_s_per_128MiB": round(statistics.median(times), 3),
                "read_all_s": round(read_s, 3),
                "footer_kb": round(metadata.serialized_size / 1024, 1),
                "delta_stats_ms": ms(stats_s),
                "file_mb": round(len(buffer) / MIB, 1),
                "rows": table.num_rows,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


def study_spark(rows_list: list[int]) -> list[dict]:
    from pyspark.sql import functions as F

    from rmqlake.config import load_settings
    from rmqlake.session import get_spark
    from rmqlake.transforms.reput import DISPATCH_COLUMNS

    settings = load_settings(REPO / "conf")
    spark = get_spark(settings.spark, conf_dir=REPO / "conf", app_name="rmqlake-lookup-layout-study")
    stored = [c for c in DISPATCH_COLUMNS if not c.endswith("_property")]
    results = []
    for rows in rows_list:
        folder = STUDY / f"commitlog-rg{rows}"
        for name, columns in [("dispatch columns", [*stored, "properties"]), ("every column", None)]:
            times = []
            for _ in range(2):
                frame = spark.read.parquet(str(folder))
                frame = frame.select(*columns) if columns else frame
                started = time.perf_counter()
                frame.select(F.xxhash64(*frame.columns).alias("h")).agg(F.sum("h")).collect()
                times.append(time.perf_counter() - started)
            results.append({"rows_per_group": rows, "read": name, "spark_s": round(min(times), 2)})
            print(json.dumps(results[-1]), flush=True)
    # Spark writing the commitlog rows (an import's write) with its default row groups and with small ones
    source = spark.read.parquet(str(STUDY / f"commitlog-rg{rows_list[0]}")).cache()
    source.count()
    for block in [0, *WRITE_BLOCKS]:
        target = STUDY / f"spark-write-{block}"
        writer = source.write.mode("overwrite").option("compression", "snappy")
        if block:
            writer = writer.option("parquet.block.size", str(block))
        started = time.perf_counter()
        writer.parquet(str(target))
        seconds = time.perf_counter() - started
        import pyarrow.parquet as pq

        groups = sum(pq.read_metadata(f).num_row_groups for f in target.glob("*.parquet"))
        results.append(
            {"spark_write_block_bytes": block or "default", "row_groups": groups, "spark_s": round(seconds, 2)}
        )
        print(json.dumps(results[-1]), flush=True)
    source.unpersist()
    spark.stop()
    return results


def main() -> int:
    global FILES_LIMIT, STUDY
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1448,512,256,128", help="commitlog rows per row group")
    parser.add_argument("--index-rows", default="65536,16384")
    parser.add_argument("--write-kib", default="1024,384,192,96", help="bytes (KiB) per row group for 'write'")
    parser.add_argument("--parts", default="commitlog,pages,index,write")
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--files", type=int, default=None, help="only the first N commitlog files (smoke run)")
    parser.add_argument("--study-dir", default=str(OUT / "lookup-layout-study"))
    args = parser.parse_args()
    FILES_LIMIT, STUDY = args.files, Path(args.study_dir)
    from rmqlake.lake import Lake
    from rmqlake.logs import configure_logging

    configure_logging("WARNING")
    parts = args.parts.split(",")
    rows_list = [int(r) for r in args.rows.split(",")]
    out = {}
    keys = None
    if {"commitlog", "index"} & set(parts):
        keys = timed_keys(Lake(str(LAKE), read_only=True), args.keys, 5)
    if "commitlog" in parts:
        out["commitlog"] = study_commitlog(rows_list, keys)
    if "pages" in parts:
        out["pages"] = study_pages(keys)
    if "index" in parts:
        out["index"] = study_index(keys, [int(r) for r in args.index_rows.split(",")])
    if "write" in parts:
        out["write"] = study_write([int(k) * 1024 for k in args.write_kib.split(",")])
    if "spark" in parts:
        out["spark"] = study_spark(rows_list)
    STUDY.mkdir(parents=True, exist_ok=True)
    (STUDY / f"results-{int(time.time())}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
