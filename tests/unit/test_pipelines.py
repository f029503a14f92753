"""Pipeline specs: validation errors, order, and the arguments a run of a logical date gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqlake.errors import ConfigError
from rmqlake.lake.tables import TABLES
from rmqlake.pipelines import JOBS, asset_uri, job_arguments, load_pipeline, load_pipelines, render, render_doc
from rmqlake.steps import TABLES_WRITTEN
from rmqlake.timeutil import parse_timestamp, to_datetime
from tests.conftest import REPO


def test_ingest_hourly_renders_the_hour_it_covers():
    spec = load_pipeline(REPO / "pipelines" / "ingest_hourly.yaml")
    assert spec.order() == ["ingest", "reput", "compact", "quality"]
    logical = to_datetime(parse_timestamp("2026-11-21T23:00:00Z"))
    args = render(job_arguments(spec.tasks["ingest"]), spec=spec, logical_date=logical)
    assert args == [
        "--input",
        "demo-data/landing/dt=2026-11-21/hour=23",
        "--now",
        "2026-11-22T00:00:00+00:00",
    ]


def test_expiry_runs_as_of_the_deletion_hour():
    spec = load_pipeline(REPO / "pipelines" / "expiry.yaml")
    logical = to_datetime(parse_timestamp("2026-11-21T04:00:00Z"))
    assert render(job_arguments(spec.tasks["expire"]), spec=spec, logical_date=logical) == [
        "--now",
        "2026-11-22T04:00:00+00:00",
    ]
    every_ten = load_pipeline(REPO / "pipelines" / "disk_check.yaml")
    assert every_ten.interval(logical)[1] == to_datetime(parse_timestamp("2026-11-21T04:10:00Z"))


def test_all_shipped_specs_load():
    assert set(load_pipelines(REPO / "pipelines")) == {
        "ingest_hourly",
        "compaction",
        "expiry",
        "disk_check",
        "consumer_offsets",
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("schedule: '@hourly'\nstart_date: 2026-11-21\ntasks: {a: {job: load}}", "tasks.a.job: Input should be"),
        ("schedule: '61 * * * *'\nstart_date: 2026-11-21\ntasks: {a: {job: reput}}", "schedule: Value error"),
        (
            "schedule: '@daily'\nstart_date: 2026-11-21\ntasks: {a: {job: reput, depends_on: [b]}, b: {job: reput, "
            "depends_on: [a]}}",
            "depend on each other in a cycle",
        ),
        ("schedule: '@daily'\nstart_date: 2026-11-21\ntasks: {a: {job: reput, depends_on: [x]}}", "'x', which is not"),
        ("schedule: '@daily'\nstart_date: 2026-11-21\ntasks: {a: {job: reput, retries: 99}}", "tasks.a.retries"),
        ("schedule: '@daily'\nstart_date: 2026-11-21\ntasks: {a: {job: reput, args: {'--now': x}}}", "without dashes"),
        (
            "schedule: '@daily'\nstart_date: 2026-11-21\nparams: {p: {value: 1}}\ntasks: {a: {job: reput}}",
            "param 'p': a default alone, or a mapping of default and description",
        ),
        ("schedule: '@daily'\nstart_date: 2026-11-21\nlake: My Lake\ntasks: {a: {job: reput}}", "lake: String"),
    ],
)
def test_bad_specs_name_the_file_the_field_and_what_is_allowed(tmp_path: Path, body, message):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\n" + body + "\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml") as error:
        load_pipeline(path)
    assert message in str(error.value)


def test_name_must_match_the_file(tmp_path: Path):
    path = tmp_path / "other.yaml"
    path.write_text("name: bad\nschedule: '@once'\nstart_date: 2026-11-21\ntasks: {a: {job: reput}}\n")
    with pytest.raises(ConfigError, match="must equal the file name"):
        load_pipeline(path)


SPECS = load_pipelines(REPO / "pipelines")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_shipped_spec_documents_itself_and_its_params(name):
    spec = SPECS[name]
    assert spec.description and spec.doc.strip() and spec.tags
    assert set(spec.param_descriptions) == set(spec.params)  # every param explained
    doc = render_doc(spec)
    assert doc.startswith(f"# {spec.name}\n") and spec.description in doc and spec.doc.strip() in doc
    assert f"`{spec.schedule}`" in doc
    for param, description in spec.param_descriptions.items():
        assert f"| `{param}` | string | `{spec.params[param]}` | {description} |" in doc
    for task_name, task in spec.tasks.items():
        assert f"| `{task_name}` | `{task.job}` |" in doc


def test_params_take_a_default_alone_or_a_default_and_a_description(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: p\nschedule: '@once'\nstart_date: 2026-11-21\ntags: [ops, rmqlake]\n"
        "params:\n  plain: x\n  documented: {default: 3, description: how many}\n  flag: {default: true}\n"
        "tasks: {a: {job: reput}}\n"
    )
    spec = load_pipeline(path)
    assert spec.params == {"plain": "x", "documented": 3, "flag": True}  # what templates see as params
    assert spec.param_descriptions == {"documented": "how many"}
    assert spec.dag_tags == ["rmqlake", "ops"]  # the default tag first, each once
    doc = render_doc(spec)
    assert "| `documented` | integer | `3` | how many |" in doc and "| `flag` | boolean | `True` |  |" in doc


def test_every_job_declares_the_tables_it_writes():
    assert set(JOBS) <= set(TABLES_WRITTEN)
    assert {table for tables in TABLES_WRITTEN.values() for table in tables} <= set(TABLES)


def test_outlets_are_the_tables_the_job_writes_under_the_lake_name(tmp_path: Path):
    spec = SPECS["ingest_hourly"]
    assert spec.lake == "default"
    assert spec.outlets("ingest") == [f"rmqlake://default/{t}" for t in ("commitlog", "segments", "rejected")] + [
        "rmqlake://default/ingest_files"
    ]
    path = tmp_path / "named.yaml"
    path.write_text("name: named\nlake: prod-eu\nschedule: '@once'\nstart_date: 2026-11-21\ntasks: {a: {job: reput}}\n")
    named = load_pipeline(path)
    assert named.outlets("a") == [asset_uri("prod-eu", t) for t in ("consumequeue", "indexfile", "indexfile_header")]
    assert SPECS["consumer_offsets"].outlets("lag") == []  # lag only reads


def test_a_list_argument_repeats_the_option(tmp_path: Path):
    path = tmp_path / "sets.yaml"
    path.write_text(
        "name: sets\nschedule: '@once'\nstart_date: 2026-11-21\ntasks:\n  a:\n    job: reput\n    args:\n"
        "      set: [spark.conf.spark.sql.shuffle.partitions=3, spark.conf.spark.sql.adaptive.enabled=false]\n"
    )
    assert job_arguments(load_pipeline(path).tasks["a"]) == [
        "--set",
        "spark.conf.spark.sql.shuffle.partitions=3",
        "--set",
        "spark.conf.spark.sql.adaptive.enabled=false",
    ]
