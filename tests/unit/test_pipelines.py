"""Pipeline specs: validation errors, order, and the arguments a run of a logical date gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqlake.errors import ConfigError
from rmqlake.pipelines import job_arguments, load_pipeline, load_pipelines, render
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
