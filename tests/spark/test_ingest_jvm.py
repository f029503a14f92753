"""The ingest's parse stage in the JVM (``IngestParse``, with ``parse_remainder`` for the lines it leaves) writes
what the Python parse (``parse_split``, the reference) writes, split by split: the same messages with the same
narrow rows, the same rejected lines, transaction ends and halves, the same counts.

Only where the rows sit differs: the JVM route keeps the messages it parses under the split's id and those of
the lines it leaves under the split's ``remainder`` id. So the files are compared by what they hold, each
message joined to its narrow row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rmqlake.generate import TopicPlan, generate
from rmqlake.ingest import tasks as ingest_tasks
from rmqlake.ingest.files import InputFile, resolve_inputs
from rmqlake.ingest.scratch import (
    NARROW_BATCH_ROWS,
    NARROW_SCHEMA,
    SCRATCH_COLUMNS,
    IngestTarget,
    NarrowSpan,
    open_narrow_file,
)
from rmqlake.ingest.tasks import fingerprint_files, jvm_can_parse, parse_splits, split_tasks
from rmqlake.lake.tables import REJECTED
from rmqlake.steps.ingest import parse_options
from tests.conftest import make_settings

pytestmark = pytest.mark.spark

TOPICS = {"OrderEvents": 8, "UserProfile": 4, "Clickstream": 4}
# Where the rows are, which differs between the routes by design.
POSITION = ("split", "scratch_batch", "scratch_row")


def target_in(folder: Path) -> IngestTarget:
    return IngestTarget(
        lake_root=str(folder),
        storage_options={},
        scratch_dir="staging/commitlog/_scratch",
        commitlog_dir="staging/commitlog",
        rejected_dir="staging/rejected",
        run_id="r-test",
        batch_id="b-test",
        rejected_at_us=1_795_219_200_000_000,
    )


def messages_of(target: IngestTarget, splits: list[int]) -> pa.Table:
    """Every message the parse wrote: its narrow row (without its position) and its scratch row, by line."""
    root = Path(target.lake_root)
    pieces = []
    for split in splits:
        reader, spans = open_narrow_file(target.storage(), target.narrow_file(split))
        batches = [reader.get_batch(index) for index in range(reader.num_record_batches)]
        assert all(batch.num_rows == NARROW_BATCH_ROWS for batch in batches[:-1])
        # the footer spans each batch's store times, which the ordering step picks batches by
        assert spans == [NarrowSpan(b["store_timestamp"][0].as_py(), b["store_timestamp"][-1].as_py(), b.num_rows)
                         for b in batches]  # fmt: skip
        narrow = pa.Table.from_batches(batches, schema=reader.schema)
        assert narrow.schema.equals(NARROW_SCHEMA), narrow.schema
        scratch = pa.ipc.open_file(pa.memory_map(str(root / target.scratch_file(split))))
        assert scratch.schema.names == SCRATCH_COLUMNS
        rows = []
        for batch, row in zip(narrow.column("scratch_batch").to_pylist(), narrow.column("scratch_row").to_pylist(),
                              strict=True):  # fmt: skip
            rows.append(scratch.get_batch(batch).slice(row, 1))
        records = pa.Table.from_batches(rows, schema=scratch.schema)
        assert records.column("source_line").equals(narrow.column("source_line"))
        # a split's narrow rows are in the append order, which ordering relies on
        stamps = narrow.column("store_timestamp").to_pylist()
        assert stamps == sorted(stamps)
        columns = {name: narrow.column(name) for name in NARROW_SCHEMA.names if name not in POSITION}
        columns.update({f"record_{name}": records.column(name) for name in SCRATCH_COLUMNS})
        pieces.append(pa.table(columns))
    table = pa.concat_tables(pieces)
    return table.sort_by([("file_rank", "ascending"), ("source_line", "ascending"), ("kind", "ascending"),
                          ("store_timestamp", "ascending")])  # fmt: skip


def staged_rows(target: IngestTarget, folder: str, order: list[str]) -> list[dict]:
    files = sorted((Path(target.lake_root) / folder).glob("*.parquet"))
    if not files:
        return []
    table = pa.concat_tables([pq.read_table(f) for f in files])
    return table.sort_by([(name, "ascending") for name in order]).to_pylist()


def parse_both(spark, tmp_path: Path, files: list[InputFile], *, split_bytes: int, options):
    prints = fingerprint_files(spark, files)
    tasks = split_tasks(spark, prints, split_bytes=split_bytes)
    python, jvm = target_in(tmp_path / "python"), target_in(tmp_path / "jvm")
    return (
        tasks,
        (python, parse_splits(spark, tasks, options=options, target=python, jvm=False)),
        (jvm, parse_splits(spark, tasks, options=options, target=jvm, jvm=True)),
    )


def assert_same_files(tasks, python_side, jvm_side) -> None:
    (python, by_python), (jvm, by_jvm) = python_side, jvm_side
    assert by_jvm.per_file == by_python.per_file
    assert by_jvm.last_stored == by_python.last_stored
    remainders = {task.remainder: task.index for task in tasks}
    assert all(split < len(tasks) for split in by_python.with_messages)
    gzip = {task.path for task in tasks if task.compressed}
    plain_lines = sum(totals["lines"] for path, totals in by_python.per_file.items() if path not in gzip)
    assert by_jvm.jvm_accepted + by_jvm.jvm_undecided == plain_lines
    assert messages_of(jvm, by_jvm.with_messages).equals(messages_of(python, by_python.with_messages))
    rejected_order = ["source_file", "source_line"]
    assert staged_rows(jvm, jvm.rejected_dir, rejected_order) == staged_rows(python, python.rejected_dir,
                                                                               rejected_order)  # fmt: skip
    # the ends and halves are the same lines, found under the split's id or its remainder's
    for folder in ("ends", "halves"):
        got = staged_rows(jvm, f"{jvm.scratch_dir}/{folder}", ["file_rank", "source_line"])
        want = staged_rows(python, f"{python.scratch_dir}/{folder}", ["file_rank", "source_line"])
        for row in got:
            row["split"] = remainders.get(row["split"], row["split"])
        assert [_without_position(r) for r in got] == [_without_position(r) for r in want]
        assert len(want) > 0, folder


def _without_position(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("scratch_batch", "scratch_row")}


def test_the_jvm_parse_writes_what_the_python_parse_writes(spark, tmp_path):
    """Generated hours with bad lines, delay levels, timers and transactions, cut into small splits, plus a file
    of odd lines (below) and a gzip file (parsed in Python either way)."""
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=4000, topics=topics, hours=2, bad_rate=0.03, seed=41, schedule_share=0.05,
             transaction_share=0.05, max_message_size=8192)  # fmt: skip
    generate(tmp_path / "gz", messages=300, topics=topics, hours=1, bad_rate=0.05, seed=43, gzip_files=True)
    plain = sorted((tmp_path / "in" / "landing").rglob("*.jsonl"))
    lines = plain[0].read_bytes().split(b"\n")[:-1]
    odd = tmp_path / "in" / "landing" / "odd.jsonl"
    # a byte order mark, CRLF line ends, lines out of store-time order, no newline at the end
    odd.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines[:200]) + b"\r\n" + b"\n".join(lines[400:200:-1]))
    inputs = [*resolve_inputs(str(tmp_path / "in" / "landing")), *resolve_inputs(str(tmp_path / "gz" / "landing"))]
    settings = make_settings(tmp_path / "lake")
    options = dataclasses.replace(parse_options(settings), queue_counts=dict(TOPICS))
    tasks, by_python, by_jvm = parse_both(spark, tmp_path, inputs, split_bytes=64 * 1024, options=options)
    assert any(task.compressed for task in tasks) and len(tasks) > len(inputs)  # gzip, and files cut in several
    assert not any(jvm_can_parse(task, by_jvm[0]) for task in tasks if task.compressed)
    assert by_jvm[1].jvm_accepted > 0.8 * sum(t["lines"] for t in by_python[1].per_file.values()) - 400
    assert by_jvm[1].jvm_undecided > 0
    assert_same_files(tasks, by_python, by_jvm)


def test_a_split_of_lines_the_jvm_leaves_only(spark, tmp_path):
    """A file of escaped strings and bad lines only: the JVM accepts nothing, writes no scratch or narrow file,
    and the remainder holds every message."""
    path = tmp_path / "in" / "escaped.jsonl"
    path.parent.mkdir()
    rows = [json.dumps({"topic": "OrderEvents", "body": f"line \u00e9 {i}", "storeTimestamp": 1795219200000 + i,
                        "bornTimestamp": 1795219200000 + i}) for i in range(50)]  # fmt: skip
    path.write_text("\n".join([*rows, "{not json", ""]), encoding="utf-8")
    settings = make_settings(tmp_path / "lake")
    options = dataclasses.replace(parse_options(settings), queue_counts=dict(TOPICS))
    tasks, by_python, by_jvm = parse_both(spark, tmp_path, resolve_inputs(str(path)), split_bytes=1 << 20,
                                          options=options)  # fmt: skip
    assert by_jvm[1].jvm_accepted == 0 and by_jvm[1].jvm_undecided == 52 - 1  # the last line is empty
    assert by_jvm[1].with_messages == [tasks[0].remainder]
    assert not (Path(by_jvm[0].lake_root) / by_jvm[0].scratch_file(0)).exists()
    (python, by_p), (jvm, by_j) = by_python, by_jvm
    assert by_j.per_file == by_p.per_file
    assert messages_of(jvm, by_j.with_messages).equals(messages_of(python, by_p.with_messages))


def test_no_hidden_file_is_left_and_a_rerun_replaces_the_files(spark, tmp_path):
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=500, topics=topics, hours=1, bad_rate=0.05, seed=5)
    settings = make_settings(tmp_path / "lake")
    options = dataclasses.replace(parse_options(settings), queue_counts=dict(TOPICS))
    prints = fingerprint_files(spark, resolve_inputs(str(tmp_path / "in" / "landing")))
    tasks = split_tasks(spark, prints, split_bytes=16 * 1024)
    target = target_in(tmp_path / "jvm")
    first = parse_splits(spark, tasks, options=options, target=target, jvm=True)
    before = messages_of(target, first.with_messages)
    again = parse_splits(spark, tasks, options=options, target=target, jvm=True)
    assert again == first
    assert messages_of(target, again.with_messages).equals(before)
    hidden = [p for p in Path(target.lake_root).rglob(".*") if p.is_file()]
    assert hidden == []


def test_rejected_rows_keep_the_table_schema(spark, tmp_path):
    path = tmp_path / "in" / "bad.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"topic": "OrderEvents"}\n\xff\xfe\n[1, 2]\n')
    settings = make_settings(tmp_path / "lake")
    options = dataclasses.replace(parse_options(settings), queue_counts=dict(TOPICS))
    prints = fingerprint_files(spark, resolve_inputs(str(path)))
    tasks = split_tasks(spark, prints, split_bytes=1 << 20)
    target = target_in(tmp_path / "jvm")
    parsed = parse_splits(spark, tasks, options=options, target=target, jvm=True)
    assert parsed.per_file[str(path)]["rejected"] == 3
    table = pq.read_table(next((Path(target.lake_root) / target.rejected_dir).glob("*.parquet")))
    assert table.schema.equals(REJECTED.arrow_schema)
    assert pc.all(pc.is_valid(table.column("reason"))).as_py()


def test_a_split_with_a_line_too_long_for_the_jvm_is_parsed_in_python(spark, tmp_path, caplog):
    """A 70 MiB line (past what the JVM reads into memory): the JVM gives the split back, writing nothing, and the
    Python route parses it, with the same files as a Python-only parse; the other split stays in the JVM."""
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(tmp_path / "in", messages=300, topics=topics, hours=1, seed=7)
    first = sorted((tmp_path / "in" / "landing").rglob("*.jsonl"))[0]
    lines = first.read_bytes().split(b"\n")[:-1]
    huge = b'{"topic": "OrderEvents", "bornTimestamp": 5, "body": "' + b"x" * (70 << 20) + b'"}'
    path = tmp_path / "long" / "long.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"\n".join([*lines[:50], huge, *lines[50:]]) + b"\n")
    settings = make_settings(tmp_path / "lake")
    options = dataclasses.replace(parse_options(settings), queue_counts=dict(TOPICS))
    inputs = [*resolve_inputs(str(path)), *resolve_inputs(str(first))]
    with caplog.at_level("WARNING", logger="rmqlake.ingest.tasks"):
        _, by_python, by_jvm = parse_both(spark, tmp_path, inputs, split_bytes=1 << 30, options=options)
    assert [r.getMessage() for r in caplog.records if "left" in r.getMessage()] == [
        f"the JVM parser left {path} [0, {path.stat().st_size}) to Python: the line starting at byte "
        f"{sum(len(line) + 1 for line in lines[:50])} is longer than 64 MiB"
    ]
    (python, by_p), (jvm, by_j) = by_python, by_jvm
    assert by_j.per_file == by_p.per_file and by_p.per_file[str(path)]["rejected"] == 1
    assert by_j.jvm_accepted == len(lines)  # the other file's lines, in the JVM
    assert messages_of(jvm, by_j.with_messages).equals(messages_of(python, by_p.with_messages))
    assert not list((Path(jvm.lake_root) / jvm.scratch_dir / "undecided").glob(".*"))


@pytest.mark.parametrize("in_threads", [None, True, False], ids=["by the master", "driver threads", "a Spark job"])
def test_input_files_are_hashed_alike_by_every_route(spark, tmp_path, monkeypatch, caplog, in_threads):
    """Big inputs are hashed in parallel: by threads of the driver under a local master (this session's), else by
    a Spark job; the files one by one, each fingerprint the SHA-256 of its bytes, in the order of the paths."""
    rng = random.Random(3)
    folder = tmp_path / "in"
    folder.mkdir()
    for number in (7, 2, 11, 5, 3):
        (folder / f"f{number:02d}.jsonl").write_bytes(rng.randbytes(rng.randrange(0, 300_000)))
    files = resolve_inputs(str(folder))
    expected = [hashlib.sha256(Path(f.path).read_bytes()).hexdigest() for f in sorted(files, key=lambda f: f.path)]
    monkeypatch.setattr(ingest_tasks, "HASHED_IN_PARALLEL_FROM", 0)
    with caplog.at_level("INFO", logger="rmqlake.ingest.tasks"):
        prints = fingerprint_files(spark, files[::-1], progress_seconds=1e-9, in_threads=in_threads)
    assert [p.sha256 for p in prints] == expected
    assert [(p.path, p.size) for p in prints] == sorted((f.path, f.size) for f in files)
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hash input files")]
    assert bool(progress) == (in_threads is not False)  # a line per file but the last one, from the threads
