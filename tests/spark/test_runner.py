"""Every job that changes the lake reports the stable metric keys: in its result, its ``--json`` line and its run
record in the lake state."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from rmqlake.cli import main
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.steps import TABLES_WRITTEN
from rmqlake.steps.runner import STABLE_METRICS
from tests.conftest import CONF

pytestmark = pytest.mark.spark

TOPICS = [TopicPlan("OrderEvents", 4, False), TopicPlan("UserProfile", 2, True)]
SMALL = ["store.commitlog_segment_size=16384", "store.cq_units_per_file=64", "retention.max_segments_per_run=5"]
NOW = "2026-11-22T00:00:00Z"
# (job, arguments, lake): every lake-changing job, with real work to do
JOBS = [
    ("ingest", ("--input", "{landing}/dt=2026-11-21/hour=00", "--now", NOW), "lake"),
    ("reput", (), "lake"),
    ("ingest", ("--input", "{landing}/dt=2026-11-21/hour=01", "--now", NOW), "lake"),
    ("reput", (), "lake"),
    ("compact", ("--now", NOW), "lake"),
    ("offsets", ("--input", "{offsets}"), "lake"),
    ("expire", ("--now", "2026-11-25T04:00:00Z"), "lake"),
    ("quality", ("--suite", "commitlog.critical", "--now", NOW), "lake"),
    ("vacuum", (), "lake"),
    ("export-store", ("--out", "{store}"), "lake"),
    ("import-store", ("{store}",), "imported"),
    ("reput", (), "imported"),
    ("reput", (), "imported"),  # nothing new: a job that commits nothing
]
RECORDED = ["ingest", "reput", "compact", "offsets", "expire", "quality", "import-store"]


def _cli(*args: str) -> list[dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main([*args, "--json"])
    assert code == 0, args
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory) -> dict:
    """The ``--json`` result of every job, and the lake states: ``{"results": [(job, lake, result)], "lakes": {}}``."""
    root = tmp_path_factory.mktemp("runner")
    generate(root / "in", messages=400, topics=TOPICS, hours=2, bad_rate=0.01, seed=21)
    paths = {"landing": root / "in" / "landing", "offsets": root / "in" / "offsets", "store": root / "store"}
    lakes = {"lake": root / "lake", "imported": root / "imported"}
    options = [a for s in SMALL for a in ("--set", s)]
    results = []
    for job, args, lake in JOBS:
        lines = _cli(job, *(a.format(**paths) for a in args), "--conf", str(CONF), "--env", "test",
                     "--lake", str(lakes[lake]), *options)  # fmt: skip
        results.append((job, lake, lines[0]))
    return {"results": results, "lakes": {name: Lake(str(path)).state() for name, path in lakes.items()}}


@pytest.mark.parametrize("job", sorted({job for job, _, _ in JOBS} - {"export-store"}))
def test_every_job_reports_the_stable_metrics(runs, job):
    for name, _, result in runs["results"]:
        if name != job:
            continue
        assert set(STABLE_METRICS) <= set(result), (job, sorted(result))
        assert all(isinstance(result[k], int) for k in ("rows_in", "rows_out", "rejected", "files_added")), result
        assert isinstance(result["table_versions"], dict) and isinstance(result["seconds"], float)


@pytest.mark.parametrize("job", RECORDED)
def test_the_run_record_has_the_stable_metrics_and_the_committed_versions(runs, job):
    lake = "imported" if job == "import-store" else "lake"
    record = runs["lakes"][lake].runs[job]
    assert set(STABLE_METRICS) <= set(record.metrics), (job, sorted(record.metrics))
    last = [r for name, on, r in runs["results"] if (name, on) == (job, lake) and r["table_versions"]][-1]
    assert record.metrics["table_versions"] == last["table_versions"]
    assert record.metrics["files_added"] == last["files_added"]
    assert (record.metrics["rows_in"], record.metrics["rows_out"]) == (last["rows_in"], last["rows_out"])


def test_what_rows_in_and_rows_out_count(runs):
    (_, _, ingested), (_, _, dispatched) = runs["results"][:2]
    assert ingested["rows_in"] == ingested["rows_out"] + ingested["rejected"] and ingested["rejected"] > 0
    assert dispatched["rows_in"] == ingested["rows_out"] and dispatched["rows_out"] == dispatched["cq_units"]
    assert dispatched["files_added"] > 0 and set(dispatched["table_versions"]) >= {"consumequeue", "indexfile"}
    vacuumed = next(result for name, _, result in runs["results"] if name == "vacuum")
    assert (vacuumed["rows_in"], vacuumed["files_added"], vacuumed["table_versions"]) == (0, 0, {})
    imported = next(result for name, _, result in runs["results"] if name == "import-store")
    assert imported["rows_out"] == imported["messages"] and imported["rejected"] == imported["corrupt_records"]
    idle = runs["results"][-1][2]
    assert idle["status"] == "up_to_date" and (idle["rows_in"], idle["table_versions"]) == (0, {})


@pytest.mark.parametrize("job", sorted({job for job, _, _ in JOBS} - {"export-store"}))  # export-store only reads
def test_a_job_commits_only_to_the_tables_it_declares(runs, job):
    # the Airflow DAGs declare these as the task's outlets: a table missing here would never trigger its Asset
    committed = {table for name, _, result in runs["results"] if name == job for table in result["table_versions"]}
    assert committed <= set(TABLES_WRITTEN[job]), sorted(committed - set(TABLES_WRITTEN[job]))
    if job in ("ingest", "reput", "compact", "offsets", "quality"):  # each did its full work here
        assert committed == set(TABLES_WRITTEN[job])


def test_spark_conf_from_set_reaches_the_jobs_session(spark, tmp_path, monkeypatch):
    seen = {}

    def reput(session, settings):
        seen["partitions"] = session.conf.get("spark.sql.shuffle.partitions")
        return {}

    monkeypatch.setattr("rmqlake.steps.reput.reput", reput)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        args = ["--conf", str(CONF), "--env", "test", "--lake", str(tmp_path / "lake")]
        _cli("reput", *args, "--set", "spark.conf.spark.sql.shuffle.partitions=3")
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert seen == {"partitions": "3"}
