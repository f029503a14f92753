"""The band tasks' index entries (``index_bands``) against the Spark route they replace (the reference).

The same saved keys, plan and open file go through both: the band tasks read real scratch and open-file
Parquet files and stage real files, which are read back; the Spark route numbers, chains and aggregates the
same keys as DataFrames. Rows and header fields must be equal.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqlake.lake.storage import Storage
from rmqlake.transforms import index_bands as B
from rmqlake.transforms.reput import (
    DISPATCHED_KEYS,
    INDEX_COLUMNS,
    OpenIndexFile,
    add_run_ordinals,
    chain_entries,
    header_aggregates,
    index_rows,
    name_new_files,
    number_entries,
    plan_index,
    sort_by_slot,
)

pytestmark = pytest.mark.spark

SLOTS, ENTRIES = 37, 60
OPEN = OpenIndexFile(
    name="20261125100000000",
    entries=9,
    begin_timestamp=1_795_000_000_000,
    end_timestamp=1_795_000_050_000,
    begin_phy_offset=0,
    end_phy_offset=900,
    hash_slot_count=6,
)


def _keys(rng: random.Random, runs: list[tuple[int, int]]) -> list[dict]:
    """Keys of runs (start offset, count): store times that wobble, some before the open file's begin."""
    rows, clock = [], OPEN.begin_timestamp - 3_000
    for start, count in runs:
        for local_no in range(count):
            clock += rng.randrange(-1_500, 4_000)
            rows.append(
                {
                    "topic": rng.choice(["OrderEvents", "Clickstream"]),
                    "physical_offset": start + 100 * (local_no // 2),
                    "store_timestamp": clock,
                    "key_pos": local_no % 2,
                    "key_hash": rng.randrange(2**31),
                    "slot": rng.randrange(SLOTS),
                    "run_start": start,
                    "local_no": local_no,
                }
            )
    return rows


def _plan(keys: list[dict], runs: list[tuple[int, int]], *, open_file):
    plan = plan_index(dict(runs), open_file=open_file, max_entries=ENTRIES)
    by_ordinal = {plan.partition_starts[k["run_start"]] + k["local_no"]: k["store_timestamp"] for k in keys}
    firsts = plan.first_ordinals()
    return name_new_files(
        plan,
        {o: by_ordinal[o] for o in firsts},
        {o - 1: by_ordinal[o - 1] for o in firsts if o > 0},
        zone="Asia/Shanghai",
        last_name=open_file.name if open_file else None,
    )


def _save_keys(storage: Storage, keys: list[dict], tasks: int) -> None:
    """The keys as the dispatch tasks save them: a file per task, sorted by slot, in small row groups."""
    table = pa.Table.from_pylist(keys, schema=DISPATCHED_KEYS.arrow_schema)
    for task, part in enumerate(np.array_split(np.arange(table.num_rows), tasks)):
        path = storage.file_path(f"keys/part-{task:05d}.parquet")
        storage.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        pq.write_table(sort_by_slot(table.take(pa.array(part))), path, row_group_size=16)


def _save_open_file(storage: Storage, rng: random.Random) -> tuple[list[B.OpenFilePart], list[tuple]]:
    """The open file's existing entries 1..9 in two data files covering slot ranges, as earlier runs left them."""
    entries = [(number, rng.randrange(SLOTS)) for number in range(1, OPEN.entries + 1)]
    parts = []
    for number, chosen in enumerate((lambda s: s < SLOTS // 2, lambda s: s >= SLOTS // 2)):
        rows = sorted((slot, no) for no, slot in entries if chosen(slot))
        if not rows:
            continue
        table = pa.table({"slot": [r[0] for r in rows], "index_no": [r[1] for r in rows]})
        relative = f"indexfile/index_file={OPEN.name}/part-{number}.parquet"
        storage.fs.create_dir(storage.file_path(relative).rsplit("/", 1)[0], recursive=True)
        pq.write_table(
            table.cast(pa.schema([("slot", pa.int32()), ("index_no", pa.int32())])), storage.file_path(relative)
        )
        parts.append(B.OpenFilePart(relative, min(r[0] for r in rows), max(r[0] for r in rows)))
    return parts, [(OPEN.name, slot, no) for no, slot in entries]


def _staged_rows(storage: Storage) -> list[dict]:
    rows = []
    for entry in storage.list_files("staging"):
        if entry.path.startswith(".") or "/." in entry.path:
            continue
        name = entry.path.split("/")[0].removeprefix("index_file=")
        for row in pq.read_table(storage.file_path(f"staging/{entry.path}")).to_pylist():
            rows.append({"index_file": name, **row})
    return sorted(rows, key=lambda r: (r["index_file"], r["index_no"]))


@pytest.mark.parametrize(("bands", "with_open_file"), [(1, True), (3, False), (8, True)])
def test_band_tasks_stage_the_entries_and_headers_of_the_spark_route(spark, tmp_path, with_open_file, bands):
    rng = random.Random(bands * 10 + with_open_file)
    runs = [(1_000, 70), (90_000, 55), (300_000, 90)]  # 215 keys: the open file's rest and four new files
    keys = _keys(rng, runs)
    storage = Storage(str(tmp_path))
    open_file = OPEN if with_open_file else None
    plan = _plan(keys, runs, open_file=open_file)
    assert len(plan.new_files) >= 3
    _save_keys(storage, keys, tasks=4)
    parts, existing = _save_open_file(storage, rng) if with_open_file else ([], [])
    target = B.IndexBandTarget(
        lake_root=str(tmp_path),
        storage_options={},
        keys_dir="keys",
        staging_dir="staging",
        run_id="run",
        slots=SLOTS,
        bands=bands,
        open_file_parts=tuple(parts),
    )
    header_parts = [part for band in range(bands) for part in B.build_band(band, target=target, plan=plan)]
    got = _staged_rows(storage)
    got_headers = B.combine_header_parts(header_parts)

    frame = spark.createDataFrame(keys, DISPATCHED_KEYS.ddl)
    numbered = number_entries(add_run_ordinals(spark, frame, run_starts=plan.partition_starts), plan=plan)
    seeds = None
    if existing:
        seeds = (
            spark.createDataFrame(existing, "index_file string, slot int, index_no int")
            .groupBy("index_file", "slot")
            .max("index_no")
            .withColumnRenamed("max(index_no)", "seed_index")
        )
    reference = index_rows(chain_entries(numbered, seeds=seeds))
    want = sorted((r.asDict() for r in reference.collect()), key=lambda r: (r["index_file"], r["index_no"]))
    want_headers = sorted((r.asDict() for r in header_aggregates(reference).collect()), key=lambda r: r["index_file"])

    assert len(got) == len(keys) == len(want)
    assert [{c: r[c] for c in INDEX_COLUMNS} for r in got] == want
    assert got_headers == want_headers
    assert any(r["prev_index"] for r in got)  # chains, not only heads
    if with_open_file:
        assert any(r["index_file"] == OPEN.name and 1 <= r["prev_index"] <= OPEN.entries for r in got)  # seeded


def test_staged_files_are_sorted_by_slot_in_row_groups_of_the_index_size(tmp_path):
    rng = random.Random(5)
    runs = [(0, 30_000)]
    keys = _keys(rng, runs)
    storage = Storage(str(tmp_path))
    plan = plan_index(dict(runs), open_file=None, max_entries=5_000_000)
    plan = name_new_files(plan, {0: keys[0]["store_timestamp"]}, {}, zone="UTC", last_name=None)
    _save_keys(storage, keys, tasks=2)
    target = B.IndexBandTarget(str(tmp_path), {}, "keys", "staging", "run", SLOTS, 2)
    for band in range(2):
        B.build_band(band, target=target, plan=plan)
    files = [e.path for e in storage.list_files("staging")]
    assert len(files) == 2
    for path in files:
        table = pq.read_table(storage.file_path(f"staging/{path}"))
        order = list(zip(table.column("slot").to_pylist(), table.column("index_no").to_pylist(), strict=True))
        assert order == sorted(order)
        metadata = pq.read_metadata(storage.file_path(f"staging/{path}"))
        assert metadata.row_group(0).num_rows == min(B.INDEX_ROW_GROUP_ROWS, metadata.num_rows)
