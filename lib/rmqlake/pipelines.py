"""Pipeline specs (``pipelines/*.yaml``): one definition for Airflow and for ``rmqlake pipeline run``.

A spec names its schedule and its tasks; each task runs one rmqlake job
with arguments that may use the run's dates as Jinja templates, the same
variables Airflow gives its operators: ``logical_date``,
``data_interval_start``, ``data_interval_end``, ``ds`` and ``params``. So a
backfill or a re-run of a past hour passes exactly what the original run
passed (``--now``, input folders), and the jobs never read the wall clock.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rmqlake.errors import ConfigError
from rmqlake.steps import TABLES_WRITTEN

JOBS = ("ingest", "reput", "compact", "expire", "offsets", "lag", "vacuum", "quality")
CRON_PRESETS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *"}
PRESETS = (*CRON_PRESETS, "@once")
DEFAULT_TAG = "rmqlake"
ASSET_SCHEME = "rmqlake"
Scalar = str | int | float | bool
# JSON-schema type of a param, from its default (bool first: a bool is an int in Python)
_PARAM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def asset_uri(lake: str, table: str) -> str:
    """The stable Asset URI of a lake table: ``rmqlake://<lake name>/<table>``.

    The lake's root (a folder or an object-store URI) is known only on the
    worker when a job runs, and may differ between workers; the name is the
    spec's ``lake`` field, fixed when the DAG is parsed, so other DAGs can
    be scheduled on it.
    """
    return f"{ASSET_SCHEME}://{lake}/{table}"


def param_type(value: Scalar) -> str:
    """The JSON-schema type Airflow validates a param against, from the param's default."""
    return next(name for kind, name in _PARAM_TYPES if isinstance(value, kind))


class TaskSpec(BaseModel):
    """One task: a job, its arguments (templated), its upstream tasks and how Airflow retries it."""

    model_config = ConfigDict(extra="forbid")

    job: Literal[JOBS]  # type: ignore[valid-type]
    # a list is the option repeated: ``set: [a=1, b=2]`` is ``--set a=1 --set b=2``
    args: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    retries: int = Field(1, ge=0, le=10)
    retry_delay_minutes: float = Field(5, ge=0)
    timeout_minutes: float = Field(120, gt=0)

    @field_validator("args")
    @classmethod
    def _option_names(cls, value: dict) -> dict:
        for name in value:
            if not name.replace("-", "").isalnum() or name.startswith("-"):
                raise ValueError(f"argument {name!r}: use the option name without dashes, e.g. 'input' for --input")
        return value


class PipelineSpec(BaseModel):
    """A pipeline: schedule, start, catch-up, concurrency and its tasks.

    ``params`` maps a name to its default, written in the YAML either as the
    default alone or as ``{default: ..., description: ...}``; the
    descriptions are kept apart in ``param_descriptions``, so ``params`` is
    what the jobs' templates see (as Airflow's ``params``).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = ""  # one line: the DAG's description
    doc: str = ""  # Markdown: what the pipeline does and why, the start of the DAG's documentation
    lake: str = Field("default", pattern=r"^[a-z0-9][a-z0-9_.-]*$")  # the lake's name in the Asset URIs
    tags: list[str] = Field(default_factory=list)
    schedule: str
    start_date: datetime
    catchup: bool = False
    max_active_runs: int = Field(1, ge=1)
    pool: str | None = None  # an Airflow pool shared by the pipelines that write one lake
    params: dict[str, Scalar] = Field(default_factory=dict)
    param_descriptions: dict[str, str] = Field(default_factory=dict)
    tasks: dict[str, TaskSpec]

    @model_validator(mode="before")
    @classmethod
    def _param_long_form(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or not isinstance(raw.get("params"), dict):
            return raw
        params, descriptions = {}, dict(raw.get("param_descriptions") or {})
        for name, value in raw["params"].items():
            if isinstance(value, dict):
                unknown = set(value) - {"default", "description"}
                if "default" not in value or unknown:
                    raise ValueError(
                        f"param {name!r}: a default alone, or a mapping of default and description "
                        f"(found keys: {', '.join(map(str, value))})"
                    )
                params[name] = value["default"]
                if value.get("description"):
                    descriptions[name] = str(value["description"])
            else:
                params[name] = value
        return {**raw, "params": params, "param_descriptions": descriptions}

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        if value in PRESETS:
            return value
        from croniter import croniter

        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(
                f"{value!r} is neither a preset ({', '.join(PRESETS)}) nor a valid 5-field cron expression"
            )
        return value

    @field_validator("start_date")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    @model_validator(mode="after")
    def _graph(self) -> PipelineSpec:
        if not self.tasks:
            raise ValueError("a pipeline needs at least one task")
        for name, task in self.tasks.items():
            for upstream in task.depends_on:
                if upstream not in self.tasks:
                    raise ValueError(f"task {name!r} depends on {upstream!r}, which is not a task of this pipeline")
        self.order()  # raises on a cycle
        for name in self.param_descriptions:
            if name not in self.params:
                raise ValueError(f"param_descriptions names {name!r}, which is not a param")
        return self

    @property
    def dag_tags(self) -> list[str]:
        """The DAG's tags: ``rmqlake`` first, then the spec's own (each once)."""
        return list(dict.fromkeys([DEFAULT_TAG, *self.tags]))

    def outlets(self, task: str) -> list[str]:
        """Asset URIs of the lake tables the task's job writes (see ``asset_uri``)."""
        return [asset_uri(self.lake, table) for table in TABLES_WRITTEN[self.tasks[task].job]]

    def order(self) -> list[str]:
        """Task names in dependency order (ties in declaration order)."""
        done: list[str] = []
        pending = dict(self.tasks)
        while pending:
            ready = [n for n, t in pending.items() if all(u in done for u in t.depends_on)]
            if not ready:
                raise ValueError(f"the tasks {', '.join(sorted(pending))} depend on each other in a cycle")
            done += ready
            for name in ready:
                del pending[name]
        return done

    @property
    def cron(self) -> str | None:
        """The schedule as a cron expression (presets expanded); None for ``@once``."""
        return CRON_PRESETS.get(self.schedule, self.schedule) if self.schedule != "@once" else None

    def interval(self, logical_date: datetime) -> tuple[datetime, datetime]:
        """The run's data interval, as Airflow's CronDataIntervalTimetable gives it: [logical date, next fire)."""
        if self.cron is None:
            return logical_date, logical_date
        from croniter import croniter

        return logical_date, croniter(self.cron, logical_date).get_next(datetime)


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read and validate one spec; errors name the file, the field and what is allowed."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the pipeline spec: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a pipeline spec is a mapping (name, schedule, start_date, tasks, ...)")
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "\n".join(
            f"  {'.'.join(str(p) for p in error['loc']) or '(spec)'}: {error['msg']}" for error in exc.errors()
        )
        raise ConfigError(f"{path}: invalid pipeline spec:\n{problems}") from None
    if spec.name != path.stem:
        raise ConfigError(f"{path}: name {spec.name!r} must equal the file name ({path.stem!r})")
    return spec


def load_pipelines(folder: str | Path) -> dict[str, PipelineSpec]:
    """Every spec of a folder, by name."""
    return {spec.name: spec for spec in (load_pipeline(p) for p in sorted(Path(folder).glob("*.yaml")))}


def job_arguments(task: TaskSpec) -> list[str]:
    """The task's options as command-line arguments (still templated): ``--name value``, ``--flag``; a list
    repeats the option (``--set a=1 --set b=2``)."""
    args: list[str] = []
    for name, values in task.args.items():
        for value in values if isinstance(values, list) else [values]:
            if value is True:
                args.append(f"--{name}")
            elif value is not False:
                args += [f"--{name}", str(value)]
    return args


def render_doc(spec: PipelineSpec) -> str:
    """The DAG's documentation (Markdown): what the pipeline does, its schedule, params and tasks."""
    lines = [f"# {spec.name}", ""]
    lines += [spec.description, ""] if spec.description else []
    lines += [spec.doc.strip(), ""] if spec.doc.strip() else []
    schedule = f"`{spec.schedule}`" + ("" if spec.cron in (None, spec.schedule) else f" (`{spec.cron}`)")
    lines += [
        "## Schedule",
        "",
        f"- schedule: {schedule}, from {spec.start_date.isoformat()}",
        f"- catch-up: {'yes' if spec.catchup else 'no'}; at most {spec.max_active_runs} run(s) at a time",
    ]
    lines += [f"- pool: `{spec.pool}`"] if spec.pool else []
    lines += [f"- lake: `{spec.lake}` (Assets `{asset_uri(spec.lake, '<table>')}`)", ""]
    if spec.params:
        lines += ["## Params", "", "| param | type | default | description |", "| --- | --- | --- | --- |"]
        for name, value in spec.params.items():
            description = _cell(spec.param_descriptions.get(name, ""))
            lines.append(f"| `{name}` | {param_type(value)} | `{_cell(str(value))}` | {description} |")
        lines.append("")
    lines += ["## Tasks", "", "| task | job | after | arguments | writes |", "| --- | --- | --- | --- | --- |"]
    for name in spec.order():
        task = spec.tasks[name]
        after = ", ".join(task.depends_on) or "-"
        arguments = f"`{_cell(' '.join(job_arguments(task)))}`" if task.args else "-"
        writes = ", ".join(TABLES_WRITTEN[task.job]) or "-"
        lines.append(f"| `{name}` | `{task.job}` | {after} | {arguments} | {writes} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def render(arguments: list[str], *, spec: PipelineSpec, logical_date: datetime) -> list[str]:
    """The arguments with the run's template variables filled in, as Airflow renders them."""
    import jinja2

    start, end = spec.interval(logical_date)
    context: dict[str, Any] = {
        "logical_date": logical_date,
        "data_interval_start": start,
        "data_interval_end": end,
        "ds": logical_date.strftime("%Y-%m-%d"),
        "ts": logical_date.isoformat(),
        "params": spec.params,
    }
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    try:
        return [environment.from_string(argument).render(context) for argument in arguments]
    except jinja2.TemplateError as exc:
        raise ConfigError(f"pipeline {spec.name}: cannot render {arguments}: {exc}") from None
