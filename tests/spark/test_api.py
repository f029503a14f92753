"""The Python API (``rmqlake.open``) and ``rmqlake sql``: the CLI's answers, the README's example, pinned runs."""

from __future__ import annotations

import io
import json
import re
import shutil
from contextlib import redirect_stdout

import pytest

import rmqlake
from rmqlake import cli
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.lake import lake as lake_module
from rmqlake.lake.tables import TABLES
from rmqlake.query import message_view
from rmqlake.reader import result_of
from rmqlake.steps.compact import compact
from rmqlake.steps.ingest import ingest
from rmqlake.steps.offsets import load_offsets
from rmqlake.steps.reput import reput
from rmqlake.timeutil import iso
from tests.conftest import CONF, REPO, make_settings

pytestmark = pytest.mark.spark

T0 = 1_795_219_200_000  # 2026-11-21T00:00:00Z
TOPICS = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]
README_KEY = {"topic": "OrderEvents", "body": "hello", "keys": "order-000042", "tags": "TagA", "bornTimestamp": T0 + 5}


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """One generated hour ingested, dispatched and compacted, with consumer offsets; the next hour kept aside."""
    root = tmp_path_factory.mktemp("api")
    generate(root / "in", messages=400, topics=TOPICS, hours=2, seed=5, start_ms=T0)
    hours = sorted((root / "in" / "landing").glob("dt=*/hour=*"))
    (hours[0] / "readme.jsonl").write_text(json.dumps(README_KEY) + "\n")
    settings = make_settings(root / "lake")
    ingest(spark, settings, input_path=str(hours[0]))
    reput(spark, settings)
    compact(spark, settings)
    load_offsets(settings, input_path=str(root / "in" / "offsets"))
    return {"root": root, "settings": settings, "next_hour": hours[1]}


def run_cli(lake, *args) -> list[dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main([*args, "--conf", str(CONF), "--env", "test", "--lake", str(lake), "--json"]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def cli_messages(lake, *args) -> tuple[dict, list[dict]]:
    lines = run_cli(lake, "query", *args)
    return lines[0], [{k: v for k, v in line.items() if k != "kind"} for line in lines if line["kind"] == "message"]


def cli_tracks(lake, msg_id: str) -> list[dict]:
    lines = run_cli(lake, "query", "msgid", msg_id)
    return [{k: v for k, v in line.items() if k != "kind"} for line in lines if line["kind"] == "track"]


def api_messages(table) -> list[dict]:
    return [message_view(row, full=True) for row in table.to_pylist()]


def without_timing(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("kind", "seconds")}


def test_every_lookup_agrees_with_the_cli(built):
    lake = built["root"] / "lake"
    store = rmqlake.open(str(lake), conf=CONF, env="test")
    orders = store.query_key("OrderEvents", "order-000042")
    summary, rows = cli_messages(lake, "key", "--topic", "OrderEvents", "--key", "order-000042")
    assert orders.num_rows >= 1 and api_messages(orders) == rows
    assert without_timing(result_of(orders)) == without_timing(summary)
    assert b"hello" in orders.column("body").to_pylist()

    first = next(r for r in store.query_offset("OrderEvents", 0, 0, max_num=50).to_pylist() if r["uniq_key"])
    for table, (summary, rows) in [
        (
            store.query_offset("OrderEvents", first["queue_id"], 0, max_num=50),
            cli_messages(lake, "offset", "--topic", "OrderEvents", "--queue", str(first["queue_id"]), "--offset", "0"),
        ),
        (
            store.query_offset("OrderEvents", first["queue_id"], 0, tags="TagA"),
            cli_messages(
                *(lake, "offset", "--topic", "OrderEvents", "--queue", str(first["queue_id"])),
                *("--offset", "0", "--tags", "TagA"),
            ),
        ),
        (
            store.query_offset("UserProfile", 0, 0, compacted=True),
            cli_messages(lake, "offset", "--topic", "UserProfile", "--queue", "0", "--offset", "0", "--compacted"),
        ),
        (store.query_msgid(first["msg_id"]), cli_messages(lake, "msgid", first["msg_id"])),
        (store.query_msgid(first["uniq_key"]), cli_messages(lake, "msgid", first["uniq_key"])),
    ]:
        assert api_messages(table) == rows and rows
        assert without_timing(result_of(table)) == without_timing(summary)
    tracks = cli_tracks(lake, first["msg_id"])
    assert store.message_tracks(first["msg_id"]).to_pylist() == tracks and tracks
    assert (
        store.query_offset("OrderEvents", first["queue_id"], 0, max_num=50, as_pandas=True).attrs["status"] == "FOUND"
    )

    at = iso(first["store_timestamp"])
    for boundary in ("lower", "upper"):
        answer = store.query_time("OrderEvents", first["queue_id"], at, boundary=boundary)
        expected = run_cli(
            *(lake, "query", "time", "--topic", "OrderEvents", "--queue", str(first["queue_id"])),
            *("--at", at, "--boundary", boundary),
        )
        assert answer.to_pylist() == expected and expected[0]["queue_offset"] >= 0


def present(row: dict) -> dict:
    return {k: v for k, v in row.items() if v is not None and k != "kind"}


def test_status_and_lag_agree_with_the_cli(built):
    lake = built["root"] / "lake"
    store = rmqlake.open(str(lake), conf=CONF, env="test")
    report = store.status()
    lines = run_cli(lake, "status")
    for part, kind in [("queues", "queue"), ("topics", "topic"), ("runs", "run")]:
        # a table has every column of every row (run records of different jobs): compare the values present
        assert [present(r) for r in report[part].to_pylist()] == [present(r) for r in lines if r["kind"] == kind]
    (store_row,) = report["store"].to_pylist()
    (cli_store,) = [r for r in lines if r["kind"] == "store"]
    assert store_row["ledger_seq"] == cli_store["ledger_seq"] == store.seq
    assert store_row["max_physical_offset"] == cli_store["max_physical_offset"] > 0
    assert store.status(as_pandas=True)["queues"].shape[0] == len(report["queues"])

    latest = store.lag()
    cli_lag = run_cli(lake, "lag")
    assert latest.num_rows > 0
    assert latest.to_pylist() == [{k: v for k, v in r.items() if k != "kind"} for r in cli_lag if r["kind"] == "queue"]
    history = store.lag(history=True).to_pylist()
    assert history == [{k: v for k, v in r.items() if k != "kind"} for r in cli_lag if r["kind"] == "history"]
    group = latest.column("group")[0].as_py()
    assert set(store.lag(group=group).column("group").to_pylist()) == {group}


def test_sql_views_and_the_cli_command(built):
    lake = built["root"] / "lake"
    store = rmqlake.open(str(lake), conf=CONF, env="test")
    counts = store.sql("SELECT topic, count(*) AS n FROM messages GROUP BY topic ORDER BY topic").to_pylist()
    by_topic = {t["topic"]: t["messages"] for t in store.status()["topics"].to_pylist()}
    assert {r["topic"]: r["n"] for r in counts} == by_topic
    assert run_cli(lake, "sql", "SELECT topic, count(*) AS n FROM messages GROUP BY topic ORDER BY topic") == counts

    where = "WHERE keys = 'order-000042' AND body_text = 'hello'"
    (hello,) = store.sql(f"SELECT * FROM messages {where}").to_pylist()
    (message,) = [m for m in store.query_key("OrderEvents", "order-000042").to_pylist() if m["body"] == b"hello"]
    assert hello["store_time"] == iso(message["store_timestamp"]) and hello["born_time"] == iso(T0 + 5)
    assert hello["msg_id"] == message["msg_id"] and hello["body"] == b"hello"
    (cli_hello,) = run_cli(lake, "sql", f"SELECT msg_id, body, body_text, store_time FROM messages {where}")
    assert cli_hello == {
        "msg_id": message["msg_id"],
        "body": "hello",
        "body_text": "hello",
        "store_time": iso(message["store_timestamp"]),
    }

    # every table is a view, absent ones empty; the compacted view reads compaction_log
    names = {r["name"] for r in store.sql("SHOW TABLES").to_pylist()}
    assert set(TABLES) | {"messages", "compacted_messages"} <= names
    assert store.sql("SELECT count(*) AS n FROM rejected").column("n")[0].as_py() == 0
    compacted = store.sql("SELECT count(*) AS n FROM compacted_messages").column("n")[0].as_py()
    assert (
        compacted == Lake.from_settings(built["settings"]).read_arrow("compaction_log", columns=["topic"]).num_rows > 0
    )
    assert store.sql("SELECT count(*) AS n FROM messages", as_pandas=True)["n"][0] == sum(by_topic.values())

    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["sql", "SELECT topic, count(*) AS n FROM messages GROUP BY topic", "--lake", str(lake)]) == 0
    assert "OrderEvents" in out.getvalue() and "UserProfile" in out.getvalue()
    assert cli.main(["sql", "SELECT * FROM no_such_table", "--conf", str(CONF), "--lake", str(lake)]) == 2


def test_the_readme_notebook_example_runs(built, monkeypatch):
    readme = (REPO / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "store = rmqlake.open(" in b]
    assert len(blocks) == 1, "the README has one Python session example"
    monkeypatch.chdir(built["root"])
    monkeypatch.setenv("RMQLAKE_CONF", str(CONF))
    monkeypatch.setenv("RMQLAKE_ENV", "test")
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["orders"].num_rows >= 1


def reading_examples() -> list[str]:
    """The Python examples of the README's "Reading the tables" section (Spark, DuckDB, Polars, delta-rs)."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Reading the tables\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_reading_examples_run_on_a_lake(built, spark, monkeypatch, capsys):
    """Each example runs as written in the folder holding ``lake/`` (the Spark one gets this session from
    getOrCreate, which has the Delta extension); what they print is the tables' content."""
    examples = reading_examples()
    assert len(examples) == 4, "Spark, DuckDB, Polars, delta-rs"
    monkeypatch.chdir(built["root"])
    monkeypatch.setenv("RMQLAKE_CONF", str(CONF))
    monkeypatch.setenv("RMQLAKE_ENV", "test")
    for example in examples:
        exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "OrderEvents" in printed and "UserProfile" in printed
    assert re.search(r"^store_time .*timestamp.* as a UTC timestamp", printed, flags=re.M)  # delta-rs: type and comment


class Crash(BaseException):
    """Stands for ``kill -9`` at a commit point (without leaving the test process)."""


def test_readers_see_the_last_fully_applied_run_in_every_table(built, spark, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    shutil.copytree(built["root"] / "lake", lake)
    settings = make_settings(lake)
    before = rmqlake.open(settings=settings)
    counts = {table: f"SELECT count(*) AS n FROM {table}" for table in [*TABLES, "messages"]}
    expected = {name: before.sql(query).column("n")[0].as_py() for name, query in counts.items()}
    expected_status = before.status()
    expected_key = before.query_key("OrderEvents", "order-000042").to_pylist()

    def crash_after_commitlog(name: str) -> None:
        if name == "after-commit:commitlog":
            raise Crash(name)

    monkeypatch.setattr(lake_module, "_crash_point", crash_after_commitlog)
    with pytest.raises(Crash):
        ingest(spark, settings, input_path=str(built["next_hour"]))
    monkeypatch.undo()
    latest = Lake.from_settings(settings)
    assert latest.pending_tables() and "commitlog" not in latest.pending_tables()  # half applied, for real
    assert latest.read_arrow("commitlog", columns=["topic"]).num_rows > expected["commitlog"]

    store = rmqlake.open(settings=settings)
    assert store.seq == before.seq and store.versions == before.versions
    assert {name: store.sql(query).column("n")[0].as_py() for name, query in counts.items()} == expected
    assert store.status()["store"].to_pylist() == expected_status["store"].to_pylist()
    assert store.status()["queues"].to_pylist() == expected_status["queues"].to_pylist()
    assert store.query_key("OrderEvents", "order-000042").to_pylist() == expected_key
    assert run_cli(lake, "sql", counts["commitlog"]) == [{"n": expected["commitlog"]}]
    assert run_cli(lake, "sql", counts["segments"]) == [{"n": expected["segments"]}]

    # rolled forward: a new reader sees the run in every table; the open one keeps its pinned run
    assert latest.roll_forward()
    after = rmqlake.open(settings=settings)
    assert after.seq == before.seq + 1
    assert after.sql(counts["commitlog"]).column("n")[0].as_py() > expected["commitlog"]
    assert after.sql(counts["ingest_files"]).column("n")[0].as_py() > expected["ingest_files"]
    assert store.sql(counts["commitlog"]).column("n")[0].as_py() == expected["commitlog"]

    # runs committing while a reader opens its tables: its pinning notices, and rmqlake.open opens afresh
    reput(spark, settings)
    opening = Lake.from_settings(settings, read_only=True)  # pins the tables of the reput it read
    extra = tmp_path / "extra" / "late.jsonl"
    extra.parent.mkdir()
    extra.write_text(json.dumps({**README_KEY, "keys": "order-late", "bornTimestamp": T0 + 7_200_000}) + "\n")
    ingest(spark, settings, input_path=str(extra))
    reput(spark, settings)
    assert not opening.pin_every_table()
    latest_reader = rmqlake.open(settings=settings)
    assert latest_reader.seq == after.seq + 3
    assert latest_reader.query_key("OrderEvents", "order-late").num_rows == 1
