"""Index entries numbered per run of the commitlog (one pass, per-run counts) against the global dispatch order."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pyarrow as pa
import pytest

from rmqlake.formats.consumequeue import SCHEDULE_TOPIC
from rmqlake.lake.storage import Storage
from rmqlake.transforms.reput import (
    BATCH,
    DISPATCHED_KEYS,
    KEY,
    RUN,
    UNIT,
    CommitlogFile,
    KeyRun,
    OpenIndexFile,
    TaskDispatch,
    contiguous_runs,
    cq_units_of_batch,
    dispatch_batch,
    dispatch_tasks,
    index_keys_of_batch,
    name_new_files,
    plan_index,
    request_batches,
    run_timestamps,
    runs_are_disjoint,
    saved_parts,
    summarize,
)
from tests.unit.test_reput_batches import DISPATCH_INPUT

SEGMENT = 64 * 1024
SLOTS = 97


def _commitlog(count: int, seed: int, *, indexed: bool = True) -> list[dict]:
    """Records back to back, a segment's tail left as padding; store times that may go backwards."""
    rng = random.Random(seed)
    rows, offset, stored = [], 0, 1_700_000_000_000
    for i in range(count):
        size = rng.choice([120, 300, 1000, 4000])
        if offset % SEGMENT + size > SEGMENT:  # the rest of the segment is padding: the next record starts a new one
            offset = (offset // SEGMENT + 1) * SEGMENT
        topic = rng.choice(
            [
                "Orders",
                "订单Topic",
                SCHEDULE_TOPIC,
                "RMQ_SYS_TRANS_HALF_TOPIC",
                "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                "t" * 200,
            ]
        )
        stored += rng.choice([0, 1, 999, 1000, 5000, -2000])
        rows.append(
            {
                "physical_offset": offset,
                "total_size": size,
                "sys_flag": rng.choice([0, 4, 8, 12, 0x2C] if indexed else [12, 0x2C]),
                "store_timestamp": stored,
                "topic": topic,
                "queue_id": rng.randrange(4),
                "queue_offset": i,
                "tags": rng.choice([None, "", "TagA"]),
                "uniq_key": rng.choice([None, f"{rng.getrandbits(64):016X}"]),
                "keys_property": rng.choice([None, "", "k1", "k1 k2", "  a   b ", "ключ x"]),
                "delay_property": rng.choice([None, "3", "x"]) if topic == SCHEDULE_TOPIC else None,
            }
        )
        offset += size
    return rows


def _file_groups(rows: list[dict], rng: random.Random, *, cuts: int, most: int) -> list[list[dict]]:
    """The commitlog cut at ``cuts`` places into file-like slices, which tasks read in any order, 1 to ``most``
    slices each: the rows of each group of slices."""
    bounds = sorted({0, len(rows), *rng.sample(range(1, len(rows)), cuts)})
    slices = [rows[a:b] for a, b in itertools.pairwise(bounds)]
    rng.shuffle(slices)
    groups = []
    while slices:
        take = rng.randint(1, most)
        groups.append([row for piece in slices[:take] for row in piece])
        slices = slices[take:]
    return groups


def _packed_batches(rows: list[dict], seed: int) -> list[pa.RecordBatch]:
    """Several file-like slices to a batch, and an empty batch."""
    groups = _file_groups(rows, random.Random(seed), cuts=12, most=3)
    batches = [pa.RecordBatch.from_pylist(group, schema=DISPATCH_INPUT) for group in groups]
    batches.append(pa.RecordBatch.from_pylist([], schema=DISPATCH_INPUT))  # an empty batch
    return batches


def _dispatched(batches: list[pa.RecordBatch]) -> pa.Table:
    out = [part for batch in batches for part in dispatch_batch(batch, units_per_file=50, slots=SLOTS)]
    return pa.Table.from_batches(out)


def _global_order(rows: list[dict]) -> list[dict]:
    """The reference: every index key, sorted by (physical offset, position in the message)."""
    keys = index_keys_of_batch(pa.RecordBatch.from_pylist(rows, schema=DISPATCH_INPUT), slots=SLOTS).to_pylist()
    return sorted(keys, key=lambda k: (k["physical_offset"], k["key_pos"]))


def test_contiguous_runs_split_where_a_record_does_not_follow_the_previous_one():
    offsets = np.array([0, 10, 30, 100, 110, 0, 10], np.int64)
    sizes = np.array([10, 20, 5, 10, 10, 10, 10], np.int32)
    assert contiguous_runs(offsets, sizes) == [(0, 3), (3, 5), (5, 7)]
    assert contiguous_runs(np.zeros(0, np.int64), np.zeros(0, np.int32)) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_per_run_numbering_equals_the_global_order(seed):
    rows = _commitlog(600, seed)
    table = _dispatched(_packed_batches(rows, seed))
    summary = summarize(table.filter(pa.compute.greater_equal(table.column("kind"), RUN)).to_pylist())
    assert runs_are_disjoint(summary.runs) and len(summary.runs) > 12
    # an open file with little room and small files: several roll over inside a run
    open_file = OpenIndexFile("20231114221320000", 7, 1_699_999_000_000, 1_699_999_900_000, 0, 0, 3)
    plan = plan_index({run.start: run.count for run in summary.runs}, open_file=open_file, max_entries=61)
    keys = table.filter(pa.compute.equal(table.column("kind"), KEY)).to_pylist()
    numbered = sorted(keys, key=lambda k: plan.partition_starts[k["run_start"]] + k["local_no"])
    expected = _global_order(rows)
    assert len(numbered) == len(expected) == plan.total > 500
    fields = ["physical_offset", "key_pos", "store_timestamp", "topic", "key_hash", "slot"]
    assert [{f: k[f] for f in fields} for k in numbered] == expected
    assert sorted(plan.partition_starts[k["run_start"]] + k["local_no"] for k in keys) == list(range(plan.total))

    # the new files' names and time bases: run ends known on the driver, the rest looked up by ordinal
    by_ordinal = {i: k["store_timestamp"] for i, k in enumerate(expected)}
    known = run_timestamps(summary.runs, plan)
    assert all(by_ordinal[o] == t for o, t in known.items())
    firsts = plan.first_ordinals()
    assert len(firsts) > 5
    wanted = {*firsts, *(o - 1 for o in firsts)}
    times = {o: known.get(o, by_ordinal[o]) for o in wanted}
    got = name_new_files(plan, times, times, zone="Asia/Shanghai", last_name=open_file.name)
    want = name_new_files(plan, by_ordinal, by_ordinal, zone="Asia/Shanghai", last_name=open_file.name)
    assert got == want


def _tasks_reading_files(rows: list[dict], seed: int) -> list[list[pa.RecordBatch]]:
    """Each task reads a few file-like slices in batches of any size, so that a batch may end inside a slice and
    the next one go on from there."""
    rng = random.Random(seed)
    tasks = []
    for task_rows in _file_groups(rows, rng, cuts=10, most=4):
        bounds = sorted({0, len(task_rows), *rng.sample(range(1, len(task_rows)), min(5, len(task_rows) - 1))})
        tasks.append(
            [pa.RecordBatch.from_pylist(task_rows[a:b], schema=DISPATCH_INPUT) for a, b in itertools.pairwise(bounds)]
        )
    return tasks


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_a_task_carries_its_runs_across_batches_and_numbers_as_the_global_order(seed):
    rows = _commitlog(700, seed)
    tasks = _tasks_reading_files(rows, seed)
    out = []
    for batches in tasks:
        task = TaskDispatch(units_per_file=50, slots=SLOTS)
        for batch in batches:
            out.extend(task.add(batch))
        out.extend(task.finish())
    table = pa.Table.from_batches(out)
    summary = summarize(table.filter(pa.compute.greater_equal(table.column("kind"), RUN)).to_pylist())
    assert runs_are_disjoint(summary.runs)
    assert summary.messages == len(rows)
    assert table.filter(pa.compute.equal(table.column("kind"), BATCH)).num_rows == len(tasks)
    # one run per stretch of records a task read back to back, however many batches it took
    stretches = 0
    for batches in tasks:
        task_rows = pa.Table.from_batches(batches)
        offsets = task_rows.column("physical_offset").to_numpy()
        sizes = task_rows.column("total_size").to_numpy()
        stretches += len(contiguous_runs(offsets, sizes))
    assert len(summary.runs) <= stretches < sum(len(batches) for batches in tasks) + len(tasks) * 4
    plan = plan_index({run.start: run.count for run in summary.runs}, open_file=None, max_entries=83)
    keys = table.filter(pa.compute.equal(table.column("kind"), KEY)).to_pylist()
    numbered = sorted(keys, key=lambda k: plan.partition_starts[k["run_start"]] + k["local_no"])
    fields = ["physical_offset", "key_pos", "store_timestamp", "topic", "key_hash", "slot"]
    assert [{f: k[f] for f in fields} for k in numbered] == _global_order(rows)
    assert sorted(plan.partition_starts[k["run_start"]] + k["local_no"] for k in keys) == list(range(plan.total))
    by_ordinal = {i: k["store_timestamp"] for i, k in enumerate(_global_order(rows))}
    assert all(by_ordinal[o] == t for o, t in run_timestamps(summary.runs, plan).items())
    # the same rows as a dispatch batch by batch, which closes every run at the end of its batch
    per_batch = pa.Table.from_batches(
        [
            part
            for batches in tasks
            for batch in batches
            for part in dispatch_batch(batch, units_per_file=50, slots=SLOTS)
        ]
    )
    per_batch_runs = per_batch.filter(pa.compute.equal(per_batch.column("kind"), RUN)).num_rows
    assert len(summary.runs) < per_batch_runs
    units = [t.filter(pa.compute.equal(t.column("kind"), UNIT)).sort_by("physical_offset") for t in (table, per_batch)]
    assert units[0].equals(units[1])


def test_summary_counts_messages_units_and_the_last_unit():
    rows = _commitlog(500, 7)
    batches = _packed_batches(rows, 7)
    table = _dispatched(batches)
    summary = summarize(table.filter(pa.compute.greater_equal(table.column("kind"), RUN)).to_pylist())
    units = pa.Table.from_batches([cq_units_of_batch(b, units_per_file=50) for b in batches]).to_pylist()
    assert summary.messages == len(rows)
    assert summary.units == len(units)
    assert summary.last_unit_timestamp == max(units, key=lambda u: u["commitlog_offset"])["store_timestamp"]
    got = table.filter(pa.compute.equal(table.column("kind"), UNIT))
    assert sorted(
        zip(*(got.column(c).to_pylist() for c in ("physical_offset", "tags_code", "cq_file")), strict=True)
    ) == sorted((u["commitlog_offset"], u["tags_code"], u["cq_file"]) for u in units)
    assert table.filter(pa.compute.equal(table.column("kind"), BATCH)).num_rows == len(batches)


def test_runs_of_records_that_are_never_indexed_make_no_run():
    rows = _commitlog(200, 4, indexed=False)
    table = _dispatched(_packed_batches(rows, 4))
    summary = summarize(table.filter(pa.compute.greater_equal(table.column("kind"), RUN)).to_pylist())
    assert summary.runs == () and summary.messages == 200
    assert plan_index({}, open_file=None, max_entries=61).total == 0


def test_overlapping_runs_are_detected():
    assert runs_are_disjoint([KeyRun(0, 3, 1, 90, 2), KeyRun(100, 1, 3, 100, 3)])
    assert not runs_are_disjoint([KeyRun(0, 3, 1, 100, 2), KeyRun(100, 1, 3, 100, 3)])
    assert not runs_are_disjoint([KeyRun(0, 3, 1, 500, 2), KeyRun(100, 1, 3, 200, 3)])


def test_what_a_task_saves_is_its_units_and_keys_and_only_totals_and_runs_reach_the_driver():
    rows = _commitlog(400, 9)
    batches = _tasks_reading_files(rows, 9)[0]
    task = TaskDispatch(units_per_file=50, slots=SLOTS)
    out = [part for batch in batches for part in task.add(batch)] + task.finish()
    units, keys, summary = saved_parts(out)
    dispatched = pa.Table.from_batches(out)
    assert (
        pa.Table.from_batches(units).to_pylist()
        == pa.Table.from_batches([cq_units_of_batch(b, units_per_file=50) for b in batches]).to_pylist()
    )
    assert all(k.schema == DISPATCHED_KEYS.arrow_schema for k in keys)
    assert (
        pa.Table.from_batches(keys).to_pylist()
        == dispatched.filter(pa.compute.equal(dispatched.column("kind"), KEY))
        .select(DISPATCHED_KEYS.arrow_schema.names)
        .to_pylist()
    )
    kinds = pa.Table.from_batches(summary).column("kind").to_pylist()
    assert kinds.count(BATCH) == 1 and set(kinds) <= {RUN, BATCH}


def test_dispatch_tasks_are_whole_files_in_offset_order_of_at_least_the_task_rows():
    files = [
        CommitlogFile("commitlog/segment=b/part-2.parquet", 30, 900),
        CommitlogFile("commitlog/segment=a/part-0.parquet", 60, 0),
        CommitlogFile("commitlog/segment=a/part-1.parquet", 50, 400),
        CommitlogFile("commitlog/segment=b/part-3.parquet", 0, None),  # no statistics: last, a task of its own
        CommitlogFile("commitlog/segment=b/part-4.parquet", 10, 1000),
    ]
    assert dispatch_tasks(files, task_rows=100) == [
        ["commitlog/segment=a/part-0.parquet", "commitlog/segment=a/part-1.parquet"],
        ["commitlog/segment=b/part-2.parquet", "commitlog/segment=b/part-4.parquet"],
        ["commitlog/segment=b/part-3.parquet"],
    ]
    in_order = sorted(files, key=lambda f: (f.min_offset is None, f.min_offset or 0))
    assert dispatch_tasks(files, task_rows=1) == [[f.path] for f in in_order]
    assert dispatch_tasks([], task_rows=10) == []


def test_a_damaged_commitlog_data_file_is_named_in_the_error(tmp_path):
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / "part-0.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(ValueError, match=r"commitlog data file commitlog/part-0\.parquet cannot be read as Parquet"):
        list(request_batches(Storage(str(tmp_path)), "commitlog/part-0.parquet", from_offset=0))
