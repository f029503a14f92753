"""The ingest tasks without Spark: a split's parse into its files, and a partition's placement and write."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.segment import place_records, segment_file_name, segment_start
from rmqlake.ingest import scratch as scratch_module
from rmqlake.ingest import tasks as tasks_module
from rmqlake.ingest.lines import ParseOptions
from rmqlake.ingest.plan import APPEND_ORDER, PartitionStart, append_order_bounds, partition_reads, stats_rows
from rmqlake.ingest.scratch import (
    NARROW_SCHEMA,
    NARROW_SPANS_KEY,
    AtomicArrowFile,
    IngestTarget,
    NarrowSpan,
    fetch_messages,
    open_narrow_file,
    read_ordered,
    write_narrow_file,
)
from rmqlake.ingest.tasks import SplitTask, order_partition, parse_split, write_partition

OPTIONS = ParseOptions(
    queue_counts={"Orders": 4},
    default_queue_count=None,
    compaction_topics=frozenset(),
    max_message_size=4096,
    segment_size=2048,
    cluster_name="DefaultCluster",
    default_store_host="10.0.0.5:10911",
    default_born_host="127.0.0.1:49152",
    timezone="UTC",
)


def _write_input(path, start: int, count: int, *, bad_every: int) -> None:
    lines = []
    for i in range(count):
        if i % bad_every == bad_every - 1:
            lines.append("{not json")
            continue
        doc = {"topic": "Orders", "body": "b" * (50 + i % 7), "bornTimestamp": start + 2 * i}
        if i % 3 == 0:
            doc["keys"] = f"k{i % 5}"
        lines.append(json.dumps(doc))
    path.write_text("\n".join(lines) + "\n")


def _target(root) -> IngestTarget:
    return IngestTarget(
        lake_root=str(root / "lake"),
        storage_options={},
        scratch_dir="commitlog/_staging/r1/_scratch",
        commitlog_dir="commitlog/_staging/r1",
        rejected_dir="rejected/_staging/r1",
        run_id="r1",
        batch_id="b1",
        rejected_at_us=0,
    )


def _parse_inputs(root, inputs: dict[str, tuple[int, int, int]]):
    """Write and parse one split per input: name -> (first timestamp, lines, every how many lines one is bad)."""
    folder = root / "in"
    folder.mkdir()
    target = _target(root)
    tasks = []
    for index, (name, (start, count, bad_every)) in enumerate(inputs.items()):
        _write_input(folder / name, start, count, bad_every=bad_every)
        size = (folder / name).stat().st_size
        tasks.append(SplitTask(index, index, str(folder / name), 0, size, False, "0" * 64, 1, 0x1234))
    counts = [parse_split(task, options=OPTIONS, target=target).to_pylist()[0] for task in tasks]
    return target, tasks, counts


@pytest.fixture
def parsed(tmp_path, monkeypatch):
    """Two inputs whose timestamps interleave, parsed into scratch and narrow files of small batches."""
    monkeypatch.setattr(tasks_module, "SCRATCH_BATCH_ROWS", 16)
    monkeypatch.setattr(scratch_module, "NARROW_BATCH_ROWS", 8)
    return _parse_inputs(tmp_path, {"a.jsonl": (1_000, 120, 25), "b.jsonl": (1_001, 90, 40)})


def test_a_split_writes_its_messages_narrow_rows_and_rejected_lines(parsed):
    target, _, counts = parsed
    assert [{k: row[k] for k in ("split", "lines", "rejected")} for row in counts] == [
        {"split": 0, "lines": 120, "rejected": 4},
        {"split": 1, "lines": 90, "rejected": 2},
    ]
    assert [row["last_store_timestamp"] for row in counts] == [1_000 + 2 * 119, 1_001 + 2 * 89]
    storage = target.storage()
    listed = [entry.path for entry in storage.list_files(target.scratch_dir)]
    assert listed == [
        "messages/split-000000.arrow",
        "messages/split-000001.arrow",
        "narrow/split-000000.arrow",
        "narrow/split-000001.arrow",
    ]  # no temporary files left
    scratch = pa.ipc.open_file(storage.open_mapped(target.scratch_file(0)))
    assert scratch.num_record_batches == 8 and scratch.read_all().column("source_line").to_pylist() == [
        line for line in range(1, 121) if line % 25
    ]
    narrow = read_narrow(storage, target.narrow_file(0))
    places = list(zip(narrow.column("scratch_batch").to_pylist(), narrow.column("scratch_row").to_pylist()))
    assert [scratch.get_batch(b).column("source_line")[r].as_py() for b, r in places] == narrow.column(
        "source_line"
    ).to_pylist()  # each narrow row says where its message is
    rejected = pq.read_table(storage.file_path(f"{target.rejected_dir}/part-000000-r1.parquet"))
    assert rejected.column("source_line").to_pylist() == [25, 50, 75, 100]
    assert set(rejected.column("reason").to_pylist()) == {
        "malformed JSON: Expecting property name enclosed in double quotes (column 2)"
    }
    assert rejected.column("raw").to_pylist()[0] == "{not json"


def read_narrow(storage, relative: str) -> pa.Table:
    return open_narrow_file(storage, relative)[0].read_all()


def test_a_narrow_files_footer_spans_each_batchs_store_times(parsed):
    target, tasks, _ = parsed
    storage = target.storage()
    for task in tasks:
        reader, spans = open_narrow_file(storage, target.narrow_file(task.index))
        assert reader.schema.equals(NARROW_SCHEMA) and len(spans) > 3
        batches = [reader.get_batch(index) for index in range(reader.num_record_batches)]
        assert spans == [
            NarrowSpan(b.column("store_timestamp")[0].as_py(), b.column("store_timestamp")[-1].as_py(), b.num_rows)
            for b in batches
        ]
        assert all(b.num_rows == 8 for b in batches[:-1])


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (None, "without its batches' store times"),
        ({NARROW_SPANS_KEY: "[[1, 1, 1]]"}, "1 store-time spans for 2 batches"),
    ],
)
def test_a_narrow_file_whose_footer_does_not_span_its_batches_is_refused(tmp_path, metadata, message):
    target = _target(tmp_path)
    storage = target.storage()
    file = AtomicArrowFile(storage, target.narrow_file(0), metadata=metadata)
    file.write(NARROW_SCHEMA.empty_table(), max_rows=8)
    file.write(pa.Table.from_pylist([{"store_timestamp": t} for t in (1, 2, 3)], schema=NARROW_SCHEMA), max_rows=2)
    file.close()
    with pytest.raises(RuntimeError, match=message):
        open_narrow_file(storage, target.narrow_file(0))


def _narrow_in_append_order(target, tasks) -> pa.Table:
    """Every split's narrow rows, in the append order the ordering step gives the write tasks."""
    storage = target.storage()
    return pa.concat_tables(read_narrow(storage, target.narrow_file(task.index)) for task in tasks).sort_by(
        [(column, "ascending") for column in APPEND_ORDER]
    )


def test_a_partition_is_placed_fetched_and_written_in_offset_order(parsed):
    target, tasks, _ = parsed
    storage = target.storage()
    narrow = _narrow_in_append_order(target, tasks)
    start = PartitionStart(physical_offset=1000, rr_counters={"Orders": 2}, queue_offsets={("Orders", 1): 40})
    written = [
        row
        for batch in write_partition(
            narrow.to_batches(max_chunksize=37),
            partition=3,
            start=start,
            queue_counts=OPTIONS.queue_counts,
            default_queue_count=None,
            segment_size=2048,
            files={task.index: task.path for task in tasks},
            target=target,
            row_group_bytes=4096,
        )
        for row in batch.to_pylist()
    ]
    placement = place_records(narrow.column("total_size").to_numpy(), start_offset=1000, segment_size=2048)
    segments = sorted({segment_file_name(segment_start(int(o), 2048)) for o in placement.offsets})
    assert [row["segment"] for row in written] == segments  # one file per segment touched, in order
    rows = []
    for row in written:
        table = pq.read_table(storage.file_path(f"{target.commitlog_dir}/{row['file']}"))
        assert table.column("physical_offset").to_pylist() == sorted(table.column("physical_offset").to_pylist())
        assert row["message_count"] == table.num_rows
        rows += table.to_pylist()
    assert [r["physical_offset"] for r in rows] == placement.offsets.tolist()
    assert [(r["source_file"], r["source_line"]) for r in rows] == [
        (tasks[split].path, line)
        for split, line in zip(narrow.column("split").to_pylist(), narrow.column("source_line").to_pylist())
    ]
    store = parse_host("10.0.0.5:10911")
    assert all(r["msg_id"] == offset_msg_id(store, r["physical_offset"]) for r in rows)
    assert all(r["batch_id"] == "b1" for r in rows)
    assert sum(row["message_count"] for row in written) == narrow.num_rows


def test_a_partition_written_from_views_is_the_file_arrows_take_gives(parsed, monkeypatch):
    """The bodies and property bytes go to the writer as views into the scratch batches (no value copied): the
    commitlog files are the same bytes as when the rows are gathered by Arrow's take, the reference."""
    target, tasks, _ = parsed
    storage = target.storage()
    narrow = _narrow_in_append_order(target, tasks)

    def files_written() -> dict[str, bytes]:
        written = write_partition(
            narrow.to_batches(max_chunksize=37),
            partition=0,
            start=PartitionStart(physical_offset=0, rr_counters={}, queue_offsets={}),
            queue_counts=OPTIONS.queue_counts,
            default_queue_count=None,
            segment_size=4096,
            files={task.index: task.path for task in tasks},
            target=target,
            row_group_bytes=3000,
        )
        names = [row["file"] for batch in written for row in batch.to_pylist()]
        return {name: Path(storage.file_path(f"{target.commitlog_dir}/{name}")).read_bytes() for name in names}

    viewed = files_written()
    monkeypatch.setattr(scratch_module, "take_rows", lambda table, indices: table.take(pa.array(indices, pa.int64())))
    taken = files_written()
    assert len(viewed) > 1 and viewed.keys() == taken.keys()
    for name, data in viewed.items():
        assert data == taken[name], name
    groups = [pq.ParquetFile(storage.file_path(f"{target.commitlog_dir}/{name}")).num_row_groups for name in viewed]
    assert max(groups) > 1  # row groups reckoned alike from both


def test_fetch_refuses_a_placement_listing_lines_the_scratch_lacks(parsed):
    target, _, _ = parsed
    storage = target.storage()
    placement = pa.table(
        {
            "split": pa.array([0], pa.int32()),
            "source_line": pa.array([25], pa.int64()),  # a rejected line: no message
            "scratch_batch": pa.array([1], pa.int32()),
            "scratch_row": pa.array([8], pa.int32()),
        }
    )
    with pytest.raises(RuntimeError, match="do not hold the lines"):
        fetch_messages(placement, lambda split: pa.ipc.open_file(storage.open_mapped(target.scratch_file(split))))


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_ranges_gather_every_narrow_row_once_in_append_order(tmp_path, monkeypatch, partitions):
    """Three files whose timestamps tie (ties go by file, then line) and interleave, in batches of 8 rows."""
    monkeypatch.setattr(scratch_module, "NARROW_BATCH_ROWS", 8)
    target, tasks, _ = _parse_inputs(
        tmp_path, {"a.jsonl": (1_000, 120, 25), "b.jsonl": (1_000, 90, 40), "c.jsonl": (1_101, 60, 1000)}
    )
    storage = target.storage()
    files = [target.narrow_file(task.index) for task in tasks]
    narrow = pa.concat_tables(read_narrow(storage, path) for path in files)
    assert all(open_narrow_file(storage, path)[0].num_record_batches > 3 for path in files)
    bounds = append_order_bounds([span for path in files for span in open_narrow_file(storage, path)[1]], partitions)
    assert len(bounds) == partitions - 1 and bounds == sorted(bounds)

    counts = [
        stats_rows(
            order_partition(
                partition,
                bounds=bounds,
                narrow_files=files,
                target=target,
                queue_counts=OPTIONS.queue_counts,
                default_queue_count=None,
                clock=0,
            )
        )
        for partition in range(partitions)
    ]
    ordered = [pa.Table.from_batches(read_ordered(target, p), schema=NARROW_SCHEMA) for p in range(partitions)]
    expected = narrow.sort_by([(name, "ascending") for name in APPEND_ORDER])
    assert pa.concat_tables(ordered).equals(expected)
    for partition, rows in enumerate(ordered):
        stamps = rows.column("store_timestamp").to_pylist()
        assert all(bounds[partition - 1] <= t for t in stamps) if partition else True
        assert all(t < bounds[partition] for t in stamps) if partition < len(bounds) else True
    messages = [row.value for rows in counts for row in rows if row.kind == "messages"]
    assert messages == [rows.num_rows for rows in ordered]
    assert max(messages) <= 1.5 * narrow.num_rows / partitions  # about equal ranges


@pytest.mark.parametrize("bounds", [[4, 5, 9], [2, 4, 8], [5, 6, 7], [9, 10, 11]])
def test_a_range_takes_exactly_its_store_times_where_batches_end_on_its_bounds(tmp_path, monkeypatch, bounds):
    """Batches of 4 rows whose first or last store time is a bound, or tie across a batch's end."""
    monkeypatch.setattr(scratch_module, "NARROW_BATCH_ROWS", 4)
    target = _target(tmp_path)
    stamps = [1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 9, 9, 10]  # batches: 1-4, 4-7, 8-9, 10
    rows = [{"store_timestamp": stamp, "source_line": line} for line, stamp in enumerate(stamps)]
    write_narrow_file(target.storage(), target.narrow_file(0), pa.Table.from_pylist(rows, schema=NARROW_SCHEMA))
    edges = [None, *bounds, None]
    for partition, (low, high) in enumerate(itertools.pairwise(edges)):
        gathered = tasks_module._gather_range(
            partition, bounds=bounds, narrow_files=[target.narrow_file(0)], target=target
        )
        assert gathered.column("source_line").to_pylist() == [
            line
            for line, stamp in enumerate(stamps)
            if (low is None or stamp >= low) and (high is None or stamp < high)
        ], (low, high)


@pytest.mark.parametrize("bounds", [[], [4, 5, 9], [2, 4, 8], [5, 6, 7], [9, 10, 11], [4, 4, 30]])
def test_a_partitions_reads_hold_every_split_its_range_gathers_and_no_split_reaching_elsewhere(
    tmp_path, monkeypatch, bounds
):
    """The driver deletes a split's scratch file once the partitions reading it have finished: every split whose
    rows a range gathers must be among its reads, and a split whose batches all lie outside it must not."""
    monkeypatch.setattr(scratch_module, "NARROW_BATCH_ROWS", 4)
    target = _target(tmp_path)
    storage = target.storage()
    splits = {
        0: [1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 9, 9, 10],  # batches: 1-4, 4-7, 8-9, 10
        1: [5, 5, 5, 6],  # one batch, inside a range or on a bound
        2: [11, 12, 40, 41, 42],  # a gap across two batches
        3: [3],
    }
    spans = {}
    for split, stamps in splits.items():
        rows = [{"split": split, "store_timestamp": stamp, "source_line": line} for line, stamp in enumerate(stamps)]
        write_narrow_file(storage, target.narrow_file(split), pa.Table.from_pylist(rows, schema=NARROW_SCHEMA))
        spans[split] = open_narrow_file(storage, target.narrow_file(split))[1]
    reads = partition_reads(spans, bounds)
    edges = [None, *bounds, None]
    for partition, (low, high) in enumerate(itertools.pairwise(edges)):
        gathered = tasks_module._gather_range(
            partition, bounds=bounds, narrow_files=[target.narrow_file(split) for split in splits], target=target
        )
        assert set(gathered.column("split").to_pylist()) <= reads.get(partition, frozenset()), (low, high)
        assert reads.get(partition, frozenset()) == {
            split
            for split, found in spans.items()
            if any((low is None or span.last >= low) and (high is None or span.first < high) for span in found)
        }, (low, high)
    assert set(reads) <= set(range(len(bounds) + 1))


def test_a_partition_refuses_rows_of_a_split_the_driver_does_not_keep_for_it(parsed):
    """A row of a split outside the partition's reads means its scratch file may already be deleted: the task
    stops before it reads or writes anything."""
    target, tasks, _ = parsed
    storage = target.storage()
    narrow = _narrow_in_append_order(target, tasks)
    start = PartitionStart(physical_offset=0, rr_counters={}, queue_offsets={})
    options = dict(
        partition=0,
        start=start,
        queue_counts=OPTIONS.queue_counts,
        default_queue_count=None,
        segment_size=2048,
        files={task.index: task.path for task in tasks},
        target=target,
        row_group_bytes=4096,
    )
    with pytest.raises(RuntimeError, match=r"rows of splits \[1\], whose scratch files the driver did not count"):
        list(write_partition(narrow.to_batches(), scratch_splits=frozenset({0}), **options))

    def data_files() -> list[str]:
        return [entry.path for entry in storage.list_files(target.commitlog_dir) if entry.path.startswith("segment=")]

    assert not data_files()
    written = list(write_partition(narrow.to_batches(), scratch_splits=frozenset({0, 1}), **options))
    assert sum(batch.num_rows for batch in written) == len(data_files()) > 0


def test_a_truncated_gzip_input_keeps_its_lines_and_rejects_where_it_breaks(tmp_path):
    import gzip

    lines = [json.dumps({"topic": "Orders", "body": f"m{i}", "bornTimestamp": 1_000 + i}) for i in range(3000)]
    packed = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[: len(packed) // 2])
    target = _target(tmp_path)
    task = SplitTask(0, 0, str(path), 0, path.stat().st_size, True, "0" * 64, 1, 0x1234)
    counts = parse_split(task, options=OPTIONS, target=target).to_pylist()[0]
    storage = target.storage()
    kept = pa.ipc.open_file(storage.open_mapped(target.scratch_file(0))).read_all().column("source_line").to_pylist()
    assert 0 < len(kept) < 3000 and kept == list(range(1, len(kept) + 1))
    assert counts == {
        "split": 0,
        "lines": len(kept) + 1,
        "rejected": 1,
        "last_store_timestamp": 1_000 + len(kept) - 1,
        "origins": 0,
        "ends": 0,
        "halves": 0,
    }
    rejected = pq.read_table(storage.file_path(f"{target.rejected_dir}/part-000000-r1.parquet")).to_pylist()
    assert [(r["source_file"], r["source_line"]) for r in rejected] == [(str(path), len(kept) + 1)]
    assert rejected[0]["reason"].startswith(
        "the gzip data ends early or is damaged (Compressed file ended before the end-of-stream marker was reached)"
    )
    assert lines[len(kept)].startswith(rejected[0]["raw"])


@pytest.mark.parametrize("groups", [1, 2, 3, 6, 50])
def test_split_groups_parse_every_split_once_in_groups_of_about_equal_bytes(groups):
    sizes = [40, 38, 41, 39, 128, 5, 0, 37, 44, 36, 40, 40]
    tasks = [
        SplitTask(
            index=i, file_rank=i, path=f"f{i}", start=0, end=size, compressed=False, sha256="", first_line=1, hash32=0
        )
        for i, size in enumerate(sizes)
    ]
    grouped = tasks_module.split_groups(tasks, groups=groups)
    assert len(grouped) == min(groups, len(tasks))
    assert sorted(task.index for group in grouped for task in group) == list(range(len(tasks)))
    for group in grouped:
        assert [task.index for task in group] == sorted(task.index for task in group)
    loads = [sum(task.end - task.start for task in group) for group in grouped]
    assert max(loads) - min(loads) <= max(sizes)  # the greedy fill: no group exceeds another by more than a split
    assert grouped == tasks_module.split_groups(list(reversed(tasks)), groups=groups)
    assert tasks_module.split_groups([], groups=groups) == []


def test_options_the_jvm_parser_cannot_take_leave_the_parse_to_python_or_stop_a_jvm_only_run(tmp_path, caplog):
    """A cluster name with a tab cannot be passed to the JVM job: "auto" parses in Python (a warning), "jvm" stops;
    neither looks at Spark for it."""
    from rmqlake.errors import ConfigError
    from rmqlake.steps.ingest import parse_options, use_jvm_parser
    from tests.conftest import make_settings

    for parser, outcome in (("auto", False), ("python", False), ("jvm", ConfigError)):
        settings = make_settings(tmp_path / "lake", f"ingest.parser={parser}")
        options = dataclasses.replace(parse_options(settings), cluster_name="a\tb")
        if outcome is ConfigError:
            with pytest.raises(ConfigError, match=r"ingest.parser is jvm, but a tab or line break in .* cannot be"):
                use_jvm_parser(None, settings, options)
        else:
            assert use_jvm_parser(None, settings, options) is outcome
    assert any("lines are parsed in Python" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("input_mib", "shuffle", "cores", "expected"),
    [
        (100, 4, 2, 4),  # under a partition per 128 MiB: spark.shuffle_partitions
        (1150, 4, 2, 10),  # 9 partitions of 128 MiB, rounded up to whole waves of 2 cores
        (1024, 4, 2, 8),  # already whole waves
        (1150, 4, 8, 16),
        (1150, 4, 1, 9),  # one core: every count is whole waves
        (300, 4, 16, 4),  # fewer partitions than cores: one wave, not padded
        (1150, 12, 8, 16),
    ],
)
def test_the_default_sort_partitions_fill_whole_waves_of_the_cores(input_mib, shuffle, cores, expected):
    from rmqlake.steps.ingest import default_sort_partitions

    assert default_sort_partitions(input_bytes=input_mib << 20, shuffle_partitions=shuffle, cores=cores) == expected
