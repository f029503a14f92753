"""Taking the write task's rows from the scratch batches: the binary columns gathered as views give exactly what
Arrow's take (the reference) gives, and the same Parquet bytes."""

from __future__ import annotations

import io
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqlake.ingest.message import MESSAGE_TYPES
from rmqlake.ingest.scratch import as_views, binary_views, take_rows, value_bytes
from rmqlake.ingest.tasks import COMMITLOG_WRITE_OPTIONS

SCHEMA = pa.schema(
    [
        ("source_line", pa.int64()),
        ("body", pa.binary()),
        ("properties_bytes", pa.binary()),
        ("uniq_key", pa.string()),
        ("properties", MESSAGE_TYPES["properties"]),
        ("keys", MESSAGE_TYPES["keys"]),
    ]
)


def _batch(first: int, count: int, *, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    bodies = []
    for i in range(count):
        kind = (first + i) % 6
        if kind == 0:
            bodies.append(b"")  # an empty body
        elif kind == 1:
            bodies.append("été 😀 订单".encode() * int(rng.integers(1, 40)))
        elif kind == 2:
            bodies.append(bytes(rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8)))  # binary
        elif kind == 3:
            bodies.append(b"x" * 12)  # short enough to sit inside a view
        elif kind == 4:
            bodies.append(b"\x00" * 13)
        else:
            bodies.append(b"y" * int(rng.integers(1, 5000)))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(range(first, first + count), pa.int64()),
            pa.array(bodies, pa.binary()),
            pa.array([None if i % 5 == 4 else f"K\x01{i}\x02".encode() for i in range(count)], pa.binary()),
            pa.array([f"U{i}" if i % 3 else None for i in range(count)], pa.string()),
            pa.array([[("a", str(i))] if i % 2 else [] for i in range(count)], MESSAGE_TYPES["properties"]),
            pa.array([["k", "l"] if i % 4 else None for i in range(count)], MESSAGE_TYPES["keys"]),
        ],
        schema=SCHEMA,
    )


def _batches() -> list[pa.RecordBatch]:
    sliced = _batch(500, 300, seed=3).slice(17, 200)  # a batch that starts inside its buffers
    return [
        _batch(0, 97, seed=1),
        _batch(97, 0, seed=2),
        sliced,
        _batch(1000, 1, seed=4),
        _batch(2000, 2048, seed=5),
    ]


@pytest.mark.parametrize(
    "pick",
    [
        lambda n: np.arange(n),
        lambda n: np.arange(n)[::-1],
        lambda n: np.random.default_rng(7).permutation(n),
        lambda n: np.random.default_rng(8).integers(0, n, 3 * n),  # rows taken twice
        lambda n: np.array([n - 1]),
        lambda n: np.zeros(0, np.int64),
        lambda n: np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)]),
    ],
)
def test_take_rows_gives_what_arrow_take_gives(pick):
    table = pa.Table.from_batches(_batches(), schema=SCHEMA)
    indices = pick(table.num_rows).astype(np.int64)
    expected = table.take(pa.array(indices, pa.int64()))
    got = take_rows(table, indices)
    if len(indices):
        assert [got.schema.field(name).type for name in ("body", "properties_bytes")] == [pa.binary_view()] * 2
    for field in got.schema:
        got.column(field.name).validate(full=True)
    assert got.cast(expected.schema).equals(expected)
    for name in ("body", "properties_bytes"):
        assert got.column(name).to_pylist() == expected.column(name).to_pylist()
    assert value_bytes(got) == value_bytes(expected)
    assert _parquet(got) == _parquet(expected)


def _parquet(table: pa.Table) -> bytes:
    """``table`` as the commitlog's writer writes it (row groups of 500 rows), in memory."""
    options = {name: value for name, value in COMMITLOG_WRITE_OPTIONS.items() if name != "column_encoding"}
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=500, **options)
    return out.getvalue()


def test_take_rows_of_one_batch_and_of_none():
    single = pa.Table.from_batches([_batch(0, 50, seed=9)], schema=SCHEMA)
    indices = np.array([3, 3, 49, 0], np.int64)
    assert take_rows(single, indices).cast(SCHEMA).equals(single.take(pa.array(indices)))
    empty = pa.Table.from_batches([], schema=SCHEMA)
    assert take_rows(empty, np.zeros(0, np.int64)).equals(empty.take(pa.array([], pa.int64())))


@pytest.mark.parametrize("bad", [-1, 10_000])
def test_take_rows_refuses_positions_outside_the_table_as_arrow_does(bad):
    table = pa.Table.from_batches(_batches(), schema=SCHEMA)
    indices = np.array([0, bad], np.int64)
    with pytest.raises(IndexError):
        table.take(pa.array(indices))
    with pytest.raises(IndexError):
        take_rows(table, indices)


def test_a_lake_data_file_asks_for_its_writeback_as_it_is_written_and_is_the_same_file(tmp_path, monkeypatch):
    import os

    import pyarrow.parquet as pq

    from rmqlake.ingest import scratch
    from rmqlake.ingest.scratch import SYNC_FILE_RANGE_WRITE, AtomicParquet, wait_for_writeback_requests
    from rmqlake.lake.storage import Storage

    assert scratch._SYNC_FILE_RANGE is not None  # glibc's, on this Linux machine
    started, sizes, threads = [], [], set()

    def sync_file_range(fd, offset, count, flags):
        started.append((offset, count, flags))
        sizes.append(os.fstat(fd).st_size)  # what reached the file: the stream's buffer was flushed first
        threads.add(threading.current_thread().name)
        return 0

    monkeypatch.setattr(scratch, "_SYNC_FILE_RANGE", sync_file_range)
    table = pa.table({"n": list(range(1000)), "s": [f"v{i}" for i in range(1000)]})
    for behind in (True, False):
        file = AtomicParquet(Storage(str(tmp_path)), f"t/{behind}.parquet", row_group_size=100, write_behind=behind)
        file.write(table.slice(0, 600))
        file.write(table.slice(600))
        file.close()
    wait_for_writeback_requests()
    # after each table and at the close, the file so far, asked for on the writeback thread, not waiting for it
    assert [(offset, flags) for offset, _, flags in started] == [(0, SYNC_FILE_RANGE_WRITE)] * 3
    requested = [count for _, count, _ in started]
    assert 0 < requested[0] < requested[1] < requested[2] == (tmp_path / "t" / "True.parquet").stat().st_size
    assert all(size >= count for size, count in zip(sizes, requested, strict=True))  # every byte asked for was there
    assert len(threads) == 1 and threading.current_thread().name not in threads
    assert pq.read_table(tmp_path / "t" / "True.parquet").equals(pq.read_table(tmp_path / "t" / "False.parquet"))
    assert not [p for p in (tmp_path / "t").iterdir() if p.name.startswith(".")]  # no temporary file left


def _write_behind_in_child(folder: str, answer) -> None:
    from rmqlake.ingest import scratch
    from rmqlake.lake.storage import Storage

    requested = []
    scratch._SYNC_FILE_RANGE = lambda fd, offset, count, flags: requested.append(count) or 0
    file = scratch.AtomicParquet(Storage(folder), "t/child.parquet", row_group_size=10, write_behind=True)
    file.write(pa.table({"n": list(range(100))}))
    file.close()
    scratch.wait_for_writeback_requests()
    answer.put(requested)


def test_a_forked_process_makes_its_writeback_requests_on_a_thread_of_its_own(tmp_path):
    """Spark's Python workers are forked: a thread of the parent does not exist in the child, and a request queued
    for it would never be made (nor its descriptor closed)."""
    import multiprocessing

    from rmqlake.ingest import scratch

    scratch.wait_for_writeback_requests()  # the parent's thread exists
    context = multiprocessing.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=_write_behind_in_child, args=(str(tmp_path), answer))
    child.start()
    requested = answer.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert len(requested) == 2 and requested[-1] == (tmp_path / "t" / "child.parquet").stat().st_size


def test_the_real_writeback_call_takes_a_file_and_a_refusal_turns_it_off(tmp_path, monkeypatch):
    import os

    import pyarrow.parquet as pq

    from rmqlake.ingest import scratch
    from rmqlake.ingest.scratch import SYNC_FILE_RANGE_WRITE, AtomicParquet, wait_for_writeback_requests
    from rmqlake.lake.storage import Storage

    path = tmp_path / "data"
    path.write_bytes(bytes(1 << 20))
    descriptor = os.open(path, os.O_RDONLY)
    try:  # glibc's, with the argument types and flag rmqlake gives it
        assert scratch._SYNC_FILE_RANGE(descriptor, 0, 0, SYNC_FILE_RANGE_WRITE) == 0
    finally:
        os.close(descriptor)
    calls = []

    def refused(*arguments):  # a file system without it (EINVAL, ESPIPE)
        calls.append(arguments)
        return -1

    monkeypatch.setattr(scratch, "_SYNC_FILE_RANGE", refused)
    table = pa.table({"n": list(range(1000))})
    file = AtomicParquet(Storage(str(tmp_path)), "t/refused.parquet", row_group_size=100, write_behind=True)
    file.write(table.slice(0, 600))
    wait_for_writeback_requests()
    assert not file.write_behind  # asked once, then never again
    file.write(table.slice(600))
    file.close()
    wait_for_writeback_requests()
    assert len(calls) == 1
    assert pq.read_table(tmp_path / "t" / "refused.parquet").equals(table)


def _scratch_files(tmp_path, names):
    from rmqlake.lake.storage import Storage

    storage = Storage(str(tmp_path))
    for name in names:
        storage.write_bytes(f"s/{name}", b"x")
    return storage


def _left(tmp_path) -> list[str]:
    return sorted(path.name for path in (tmp_path / "s").iterdir())


def test_the_reclaimer_deletes_a_file_once_every_partition_reading_it_has_finished(tmp_path):
    """Driven step by step (the thread is left asleep): a file waits for all of its partitions, in any order."""
    from rmqlake.ingest.scratch import ScratchReclaimer

    storage = _scratch_files(tmp_path, ["narrow", "both", "later", "never"])
    finished: set[int] = set()
    reclaimer = ScratchReclaimer(storage, poll_seconds=3600)
    try:
        reclaimer.delete("s/narrow")  # no partition reads it
        reclaimer.delete("s/both", after=[0, 1])
        reclaimer.delete("s/later", after=[2])
        reclaimer.delete("s/never", after=[1, 3])  # partition 3 does not finish
        reclaimer.delete("s/absent", after=[0])  # a split with nothing kept has no file
        reclaimer.follow(lambda: frozenset(finished))
        reclaimer._delete_ready()
        assert _left(tmp_path) == ["both", "later", "never"]
        finished.add(1)
        reclaimer._delete_ready()
        assert _left(tmp_path) == ["both", "later", "never"]
        finished.update({0, 2})
        reclaimer._delete_ready()
        assert _left(tmp_path) == ["never"]
    finally:
        reclaimer.close()
    assert _left(tmp_path) == ["never"]  # left for the run's clean-up
    assert reclaimer.deleted == 3


def test_the_reclaimers_thread_deletes_while_the_caller_waits_and_closing_deletes_what_is_ready(tmp_path):
    import time

    from rmqlake.ingest.scratch import ScratchReclaimer

    storage = _scratch_files(tmp_path, ["a", "b", "c"])
    finished: set[int] = set()
    with ScratchReclaimer(storage, poll_seconds=0.01) as reclaimer:
        reclaimer.follow(lambda: frozenset(finished))
        reclaimer.delete("s/a", after=[0])
        reclaimer.delete("s/b", after=[1])
        reclaimer.delete("s/c", after=[2])
        finished.add(0)
        deadline = time.monotonic() + 60
        while "a" in _left(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _left(tmp_path) == ["b", "c"]  # deleted by the thread, the caller doing nothing
        finished.add(1)  # finishes as the reclaimer closes: still deleted
    assert _left(tmp_path) == ["c"]
    assert not reclaimer._thread.is_alive()


def test_views_into_a_buffer_are_its_bytes_at_those_places():
    rng = np.random.default_rng(11)
    data = pa.py_buffer(bytes(rng.integers(0, 256, 5000, dtype=np.uint8)))
    lengths = rng.integers(0, 40, 300)
    lengths[:4] = [0, 12, 13, 4]
    starts = rng.integers(0, data.size - lengths)
    starts[-1], lengths[-1] = data.size - 3, 3  # a short value ending with the buffer
    starts[-2], lengths[-2] = data.size - 20, 20  # a long one
    got = binary_views(data, starts, lengths)
    got.validate(full=True)
    raw = data.to_pybytes()
    assert got.to_pylist() == [raw[a : a + n] for a, n in zip(starts.tolist(), lengths.tolist())]
    assert got.cast(pa.binary()).equals(pa.array(got.to_pylist(), pa.binary()))
    assert binary_views(pa.py_buffer(b""), np.zeros(2, np.int64), np.zeros(2, np.int32)).to_pylist() == [b"", b""]
    assert as_views(pa.table({"b": pa.array([b"x" * 20, None])})).column("b").to_pylist() == [b"x" * 20, None]
