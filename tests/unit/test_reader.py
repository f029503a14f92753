"""``rmqlake.open`` and ``rmqlake sql`` without Spark: pinning on small delta-rs tables, the views, the import cost."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout

import duckdb
import pyarrow as pa
import pytest

import rmqlake
from rmqlake import cli
from rmqlake.config import Settings
from rmqlake.errors import UsageError
from rmqlake.lake import Lake
from rmqlake.lake import lake as lake_module
from rmqlake.lake.state import LakeState, ReputState
from rmqlake.lake.tables import COMMITLOG, INGEST_FILES, SEGMENTS
from rmqlake.reader import open_lake, result_of
from rmqlake.sql import VIEWS, printable_rows
from rmqlake.timeutil import iso
from tests.conftest import CONF


class Crash(BaseException):
    """Stands for ``kill -9`` at a commit point."""


def commit_run(root, name: str, *, crash_after: str | None = None, monkeypatch=None) -> None:
    """A run adding one ingest_files row and one segments row (two table commits after the ledger's)."""
    if crash_after:

        def crash(point: str) -> None:
            if point == f"after-commit:{crash_after}":
                raise Crash(point)

        monkeypatch.setattr(lake_module, "_crash_point", crash)
    run = Lake(str(root)).begin("other")
    files = {c: None for c in INGEST_FILES.columns} | {"path": name, "size_bytes": 1, "batch_id": name}
    segment = {c: None for c in SEGMENTS.columns} | {"segment": name, "start_offset": 0, "status": "active"}
    run.stage_arrow("ingest_files", pa.Table.from_pylist([files]))
    run.stage_arrow("segments", pa.Table.from_pylist([segment]))
    try:
        run.commit(state=LakeState(reput=ReputState(dispatched_offset=len(name))))
    finally:
        if crash_after:
            monkeypatch.undo()


def counts(store) -> dict:
    query = "SELECT (SELECT count(*) FROM ingest_files) AS files, (SELECT count(*) FROM segments) AS segments"
    return store.sql(query).to_pylist()[0]


def reader(root):
    return rmqlake.open(settings=Settings.model_validate({"lake": {"root": str(root)}}))


def test_importing_rmqlake_imports_neither_spark_nor_delta_nor_duckdb():
    heavy = ("pyspark", "deltalake", "duckdb", "pyarrow")
    code = f"import sys, rmqlake; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_sql_and_the_reader_see_the_last_fully_applied_run_in_every_table(tmp_path, monkeypatch):
    root = tmp_path / "lake"
    commit_run(root, "first")
    with pytest.raises(Crash):
        commit_run(root, "second", crash_after="ingest_files", monkeypatch=monkeypatch)
    latest = Lake(str(root))
    assert latest.pending_tables() == ["segments"]
    assert latest.read_arrow("ingest_files").num_rows == 2  # a plain reader sees one table a run ahead

    store = reader(root)
    assert counts(store) == {"files": 1, "segments": 1} and store.seq == 1
    assert store.lake.state().dispatched_offset == len("first")
    assert store.status()["store"].column("ledger_seq").to_pylist() == [1]
    out = io.StringIO()
    with redirect_stdout(out):
        argv = ["sql", "SELECT count(*) AS n FROM ingest_files", "--conf", str(CONF), "--lake", str(root), "--json"]
        assert cli.main(argv) == 0
    assert json.loads(out.getvalue()) == {"n": 1}

    latest.roll_forward()
    assert counts(store) == {"files": 1, "segments": 1}  # an open reader keeps its run
    assert counts(reader(root)) == {"files": 2, "segments": 2} and reader(root).seq == 2


def test_a_run_committed_while_the_tables_are_opened_is_noticed(tmp_path):
    root = tmp_path / "lake"
    commit_run(root, "first")
    opening = Lake(str(root), read_only=True)  # has read the ledger and pinned the last run's tables
    commit_run(root, "second")
    assert not opening.pin_every_table()
    fresh = Lake(str(root), read_only=True)
    assert fresh.pin_every_table() and fresh.ledger().seq == 2
    commit_run(root, "third")
    assert fresh.ledger().seq == 2 and fresh.read_arrow("ingest_files").num_rows == 2  # pinned, ledger too


def test_absent_tables_are_empty_views_and_sql_errors_are_usage_errors(tmp_path):
    root = tmp_path / "lake"
    commit_run(root, "first")
    store = reader(root)
    assert store.sql("SELECT count(*) AS n FROM messages").to_pylist() == [{"n": 0}]
    assert store.sql("SELECT * FROM commitlog").schema.names == COMMITLOG.columns
    assert store.query_key("OrderEvents", "k").num_rows == 0
    assert result_of(store.query_key("OrderEvents", "k"))["returned"] == 0
    assert store.query_offset("OrderEvents", 0, 0, as_pandas=True).attrs["status"] == "NO_MESSAGE_IN_QUEUE"
    with pytest.raises(UsageError, match="SQL: Catalog Error"):
        store.sql("SELECT * FROM nowhere")
    assert cli.main(["sql", "SELECT 1", "--conf", str(CONF), "--lake", str(tmp_path / "none")]) == 2


def test_the_messages_view_has_iso_times_and_utf8_bodies_only_where_valid():
    rows = [
        {"body": b"caf\xc3\xa9", "store_timestamp": 1_795_219_200_123, "born_timestamp": 1_795_219_200_000},
        {"body": b"\xff\xfe\x00", "store_timestamp": 0, "born_timestamp": 0},
    ]
    table = COMMITLOG.arrow_schema.empty_table().to_pylist() + [
        {c: None for c in COMMITLOG.columns} | row | {"keys": ["a", "b"]} for row in rows
    ]
    connection = duckdb.connect()
    connection.register("commitlog", pa.Table.from_pylist(table, schema=COMMITLOG.arrow_schema))
    connection.execute(f"CREATE VIEW messages AS {VIEWS['messages'][1]}")
    got = connection.sql("SELECT store_time, born_time, body_text, keys FROM messages").fetchall()
    assert got == [
        (iso(1_795_219_200_123), iso(1_795_219_200_000), "café", "a b"),
        (iso(0), iso(0), None, "a b"),
    ]


def test_printable_rows_and_settings_resolution(tmp_path, monkeypatch):
    table = pa.table({"b": pa.array([b"ok", b"\xff"]), "n": [1, 2]})
    assert list(printable_rows(table)) == [{"b": "ok", "n": 1}, {"b": "base64:/w==", "n": 2}]
    root = tmp_path / "lake"
    commit_run(root, "first")
    monkeypatch.chdir(tmp_path)  # no conf/ here: built-in defaults
    monkeypatch.delenv("RMQLAKE_CONF", raising=False)
    monkeypatch.delenv("RMQLAKE_ENV", raising=False)
    assert open_lake("lake").seq == 1
    monkeypatch.setenv("RMQLAKE_LAKE", str(root))
    store = open_lake(conf=CONF, env="test", overrides=["store.index_slots=8"], storage_options={"timeout": "5s"})
    assert store.settings.store.index_slots == 8 and store.settings.lake.storage_options == {"timeout": "5s"}
    assert store.lake.root.endswith("lake") and store.seq == 1
