"""Configuration: YAML files + overlays + ``--set`` overrides → one frozen, typed object.

Load order (later wins): ``conf/defaults.yaml``, ``conf/topics.yaml`` (under
the ``topics`` key), ``conf/env/<env>.yaml``, then each ``--set key.path=value``.
Validation happens once, before any job does work, and every problem is
reported with its dotted key, the value found, what is allowed and where the
value came from.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from rmqlake.errors import ConfigError
from rmqlake.formats.consumequeue import DEFAULT_DELAY_LEVELS, parse_delay_levels
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from rmqlake.formats.schedule import ScheduleRules
from rmqlake.formats.topic import topic_error

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
# A JVM heap size as both -Xmx and Spark read it: digits and a unit (without one, -Xmx counts bytes, Spark MiB).
_JVM_MEMORY = re.compile(r"([1-9][0-9]{0,9})([kmgt])", re.IGNORECASE)
_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
SPARK_CONF_PATH = ["spark", "conf"]  # --set spark.conf.<Spark key>=<value>: passed to the SparkSession
DRIVER_MEMORY_MIN_MIB = 512  # Spark refuses a driver heap under 450 MiB (300 MiB reserved x 1.5)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class StoreSettings(_Section):
    """Broker store constants (MessageStoreConfig); defaults are the broker's."""

    commitlog_segment_size: int = Field(1073741824, ge=1024, le=INT_MAX)
    max_message_size: int = Field(4194304, ge=1, le=INT_MAX)
    cq_units_per_file: int = Field(300000, ge=1, le=INT_MAX // 20)
    index_slots: int = Field(5000000, ge=1, le=INT_MAX)
    index_max_entries: int = Field(20000000, ge=2, le=INT_MAX)
    message_index_enable: bool = True
    compaction_cq_file_size: int = Field(10485760, ge=46, le=INT_MAX)
    timer_precision_ms: int = Field(1000, ge=1, le=INT_MAX)
    timer_max_delay_sec: int = Field(259200, ge=1, le=INT_MAX)

    @model_validator(mode="after")
    def _index_file_fits_an_int(self) -> StoreSettings:
        size = 40 + 4 * self.index_slots + 20 * self.index_max_entries
        if size > INT_MAX:
            raise ValueError(
                f"an index file of {self.index_slots} slots and {self.index_max_entries} entries would be "
                f"{size} bytes; the broker maps it with an int size (max {INT_MAX})"
            )
        return self


class RetentionSettings(_Section):
    """File deletion rules (CleanCommitLogService)."""

    file_reserved_hours: int = Field(72, ge=0, le=INT_MAX)
    delete_when: str = "04"
    disk_max_used_ratio: float = Field(0.75, ge=0, le=1)
    disk_clean_forcibly_ratio: float = Field(0.85, ge=0, le=1)
    disk_warning_ratio: float = Field(0.90, ge=0, le=1)
    disk_capacity_bytes: int = Field(536870912000, ge=1, le=LONG_MAX)
    disk_other_used_bytes: int = Field(0, ge=0, le=LONG_MAX)
    max_segments_per_run: int = Field(10, ge=1, le=INT_MAX)
    clean_file_forcibly_enable: bool = True
    refuse_on_data_loss: bool = False

    @field_validator("delete_when", mode="before")
    @classmethod
    def _hours(cls, value: Any) -> str:
        text = str(value).strip()
        hours = [part.strip() for part in text.split(";")]
        if not text or any(not re.fullmatch(r"[0-9]{1,2}", h) or int(h) > 23 for h in hours):
            raise ValueError('must be hours of day 00-23 separated by \';\' (e.g. "04" or "04;16")')
        return text


class BrokerSettings(_Section):
    """Broker identity and topic defaults."""

    timezone: str = "UTC"
    cluster_name: str = "DefaultCluster"
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = Field(4, ge=1, le=65535)
    message_delay_level: str = DEFAULT_DELAY_LEVELS

    @field_validator("message_delay_level")
    @classmethod
    def _delay_levels(cls, value: str) -> str:
        try:
            levels = parse_delay_levels(value)
        except ValueError as problem:
            raise ValueError(str(problem)) from None
        if not levels:
            raise ValueError("must name at least one level, e.g. '1s 5s 10s'")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"must be an IANA time zone name such as 'UTC' or 'Asia/Shanghai', got {value!r}"
            ) from None
        return value

    @field_validator("cluster_name")
    @classmethod
    def _storable(cls, value: str) -> str:
        if NAME_VALUE_SEPARATOR in value or PROPERTY_SEPARATOR in value:
            raise ValueError(
                "must not contain the property separators 0x01 or 0x02: it is stored in every message's CLUSTER "
                "property"
            )
        return value


class HostsSettings(_Section):
    """Default socket addresses for messages that do not carry their own."""

    store_host: str = "127.0.0.1:10911"
    born_host: str = "127.0.0.1:49152"

    @field_validator("store_host", "born_host")
    @classmethod
    def _host(cls, value: str) -> str:
        return str(parse_host(value))


DELTA_DELETED_FILE_RETENTION_HOURS = 168  # delta.deletedFileRetentionDuration default, enforced by delta-rs vacuum


class LakeSettings(_Section):
    """Where the tables live and which Delta engine commits them."""

    root: str = "./lake"
    engine: Literal["delta-rs", "delta-spark"] = "delta-rs"
    storage_options: dict[str, str] = Field(default_factory=dict)
    commit_retries: int = Field(2, ge=0, le=10)
    staging_grace_hours: float = Field(24.0, ge=0)
    vacuum_retention_hours: float = Field(168.0, ge=0)
    vacuum_below_delta_retention: bool = False

    @field_validator("root")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value or "\x00" in value:
            raise ValueError("must be a folder path or object-store URI (not empty, no NUL character)")
        return value

    @model_validator(mode="after")
    def _deliberate_short_vacuum(self) -> LakeSettings:
        if self.vacuum_retention_hours < DELTA_DELETED_FILE_RETENTION_HOURS and not self.vacuum_below_delta_retention:
            raise ValueError(
                f"vacuum_retention_hours={self.vacuum_retention_hours:g} is below Delta's deleted-file retention "
                f"({DELTA_DELETED_FILE_RETENTION_HOURS} h): readers on an older version and time travel would lose "
                "files. Set lake.vacuum_below_delta_retention=true to do it deliberately"
            )
        return self


def _spark_conf_value(value: Any) -> str:
    """Spark settings are strings; a number or a bool is written as Spark reads it (``3``, ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise ValueError(f"a Spark setting is a string, a number or a bool, not a {type(value).__name__}")


SparkConfValue = Annotated[str, BeforeValidator(_spark_conf_value)]


class SparkSettings(_Section):
    """Session settings used when rmqlake builds the session (not under spark-submit)."""

    master: str = "local[2]"
    app_name: str = "rmqlake"
    shuffle_partitions: int = Field(4, ge=1, le=INT_MAX)
    driver_memory: str = "2g"
    conf: dict[str, SparkConfValue] = Field(default_factory=dict)  # passed to the session as they are
    delta_jars: str = ".jars/delta"  # lake.engine delta-spark outside spark-submit: the folder `make jars` fills
    jvm_jar: str = ".jars/rmqlake-jvm.jar"  # rmqlake's JVM code (`make jars`), given to Spark with spark.jars
    # The driver JVM's class-data archive (`make jars`): used when the file is there; "" never.
    class_archive: str = ".jars/spark-classes.jsa"
    # Seconds between progress lines while a job's Spark stages run (0: none); a day at most, so a typo shows.
    progress_seconds: float = Field(10.0, ge=0, le=86400, allow_inf_nan=False)

    @field_validator("driver_memory")
    @classmethod
    def _jvm_memory(cls, value: str) -> str:
        match = _JVM_MEMORY.fullmatch(value)
        if match is None:
            raise ValueError("must be a JVM memory size: digits and a unit k, m, g or t, such as 512m or 2g")
        if int(match.group(1)) * _MIB[match.group(2).lower()] < DRIVER_MEMORY_MIN_MIB:
            raise ValueError(f"must be at least {DRIVER_MEMORY_MIN_MIB}m: Spark's driver refuses a heap under 450 MiB")
        return value

    @field_validator("conf")
    @classmethod
    def _no_downloads(cls, value: dict[str, str]) -> dict[str, str]:
        for key in ("spark.jars.packages", "spark.jars.repositories"):
            if value.get(key):
                raise ValueError(
                    f"{key} would make Spark download jars at run time, which hangs or fails offline; "
                    "ship jars with spark.jars instead"
                )
        return value


class IngestSettings(_Section):
    """How ingest reads and splits its input."""

    split_bytes: int = Field(128 * 1024 * 1024, ge=1024, le=LONG_MAX)
    sort_partitions: int | None = Field(None, ge=1, le=INT_MAX)
    log_rejects: int = Field(20, ge=0, le=INT_MAX)
    write_when_disk_full: bool = False
    # Where lines are parsed: "jvm" (rmqlake's JVM parser for the common lines, the per-line parser for the
    # rest; needs spark.jvm_jar), "python" (the per-line parser and its column-wise route only), "auto" (the JVM
    # where its jar is on the classpath).
    parser: Literal["auto", "jvm", "python"] = "auto"


class ImportStoreSettings(_Section):
    """How import-store reads a broker store."""

    # Where commitlog records are decoded: "jvm" (rmqlake's JVM decoder for the runs of clean records, the Python
    # reader for the rest; needs spark.jvm_jar), "python" (the Python reader only), "auto" (the JVM where its jar
    # is on the classpath).
    reader: Literal["auto", "jvm", "python"] = "auto"


class QualitySettings(_Section):
    """Where the Great Expectations project and its Data Docs live, and how much a failure shows."""

    project_dir: str | None = None
    partial_unexpected_count: int = Field(20, ge=0, le=1000)
    max_reject_ratio: float = Field(0.01, ge=0, le=1)
    report: bool = True


class TopicSettings(_Section):
    """One topic of ``topics.yaml``."""

    queues: int = Field(..., ge=1, le=65535)
    cleanup_policy: Literal["DELETE", "COMPACTION"] = "DELETE"


class Settings(_Section):
    """Everything a job may need, validated. Pass the individual values on, not this object."""

    store: StoreSettings = StoreSettings()
    retention: RetentionSettings = RetentionSettings()
    broker: BrokerSettings = BrokerSettings()
    hosts: HostsSettings = HostsSettings()
    lake: LakeSettings = LakeSettings()
    spark: SparkSettings = SparkSettings()
    ingest: IngestSettings = IngestSettings()
    import_store: ImportStoreSettings = ImportStoreSettings()
    quality: QualitySettings = QualitySettings()
    topics: dict[str, TopicSettings] = Field(default_factory=dict)

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: dict[str, TopicSettings]) -> dict[str, TopicSettings]:
        for name in value:
            problem = topic_error(name)
            if problem:
                raise ValueError(f"topic name {name!r} is invalid: {problem}")
        return value

    def queue_count(self, topic: str) -> int | None:
        """Queues of ``topic``: from topics.yaml, else the auto-create default, else ``None``."""
        if topic in self.topics:
            return self.topics[topic].queues
        return self.broker.default_topic_queue_nums if self.broker.auto_create_topic_enable else None

    def schedule_rules(self) -> ScheduleRules:
        """The delay levels and timer limits the broker's re-routing and delivery read."""
        return ScheduleRules.of(
            message_delay_level=self.broker.message_delay_level,
            timer_precision_ms=self.store.timer_precision_ms,
            timer_max_delay_sec=self.store.timer_max_delay_sec,
        )

    def compaction_topics(self) -> list[str]:
        return sorted(name for name, t in self.topics.items() if t.cleanup_policy == "COMPACTION")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except _YAML_REFUSED as exc:
        raise ConfigError(f"configuration file {path} is not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {path} must hold a mapping at the top, found {type(data).__name__}")
    return data


# PyYAML raises more than YAMLError: ValueError for an integer longer than int() reads, RecursionError when nested
# deeper than the stack allows.
_YAML_REFUSED = (yaml.YAMLError, ValueError, RecursionError)


def _yaml_problem(exc: Exception) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _merge(base: dict[str, Any], overlay: Mapping[str, Any], source: str, sources: dict[str, str], prefix=""):
    for key, value in overlay.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value, source, sources, prefix=dotted + ".")
        else:
            base[key] = copy.deepcopy(value)
            _record_sources(value, dotted, source, sources)


def _record_sources(value: Any, dotted: str, source: str, sources: dict[str, str]) -> None:
    sources[dotted] = source
    if isinstance(value, Mapping):
        for key, inner in value.items():
            _record_sources(inner, f"{dotted}.{key}", source, sources)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``key.path=value``; the value is read as a YAML scalar (``8``, ``true``, ``"04"``).

    Raises:
        ConfigError: no ``=`` or an empty key.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set expects key.path=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except _YAML_REFUSED:
        value = raw
    return key.split("."), value


def load_settings(
    conf_dir: str | Path = "conf",
    *,
    env: str | None = None,
    overrides: Sequence[str] = (),
    lake: str | None = None,
) -> Settings:
    """Read, merge and validate the configuration.

    Args:
        conf_dir: folder holding ``defaults.yaml``, ``topics.yaml`` and ``env/``.
        env: overlay name, read from ``conf/env/<env>.yaml``.
        overrides: ``key.path=value`` strings, applied last.
        lake: ``--lake``, overrides ``lake.root``.

    Raises:
        ConfigError: a file is missing or malformed, or a value is invalid.
    """
    conf = Path(conf_dir)
    sources: dict[str, str] = {}
    merged: dict[str, Any] = {}
    _merge(merged, _read_yaml(conf / "defaults.yaml"), str(conf / "defaults.yaml"), sources)
    topics_file = conf / "topics.yaml"
    if topics_file.exists():
        topics_doc = _read_yaml(topics_file)
        _merge(merged, {"topics": topics_doc.get("topics", topics_doc)}, str(topics_file), sources)
    if env:
        env_file = conf / "env" / f"{env}.yaml"
        if not env_file.exists():
            available = sorted(p.stem for p in (conf / "env").glob("*.yaml"))
            raise ConfigError(
                f"--env {env}: no file {env_file}; available environments: {', '.join(available) or 'none'}"
            )
        _merge(merged, _read_yaml(env_file), str(env_file), sources)
    for text in overrides:
        path, value = parse_override(text)
        if path[:2] == SPARK_CONF_PATH and len(path) > 2:  # a Spark key holds dots: one key under spark.conf
            path = [*SPARK_CONF_PATH, ".".join(path[2:])]
        overlay: dict[str, Any] = {path[-1]: value}
        for part in reversed(path[:-1]):
            overlay = {part: overlay}
        _merge(merged, overlay, f"--set {text}", sources)
    if lake:
        _merge(merged, {"lake": {"root": lake}}, "--lake", sources)
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None
    except RecursionError:
        raise ConfigError("invalid configuration: a value is nested too deeply") from None


def _describe(exc: ValidationError, sources: Mapping[str, str]) -> str:
    lines = ["invalid configuration:"]
    for error in exc.errors():
        dotted = ".".join(str(part) for part in error["loc"])
        source = _source_of(dotted, sources)
        value = error.get("input")
        if error["type"] == "extra_forbidden":
            parent = dotted.rsplit(".", 1)[0] if "." in dotted else ""
            allowed = _allowed_keys(parent)
            message = f"unknown key; allowed keys{' under ' + parent if parent else ''}: {', '.join(allowed)}"
        else:
            message = error["msg"].removeprefix("Value error, ")
        shown = "" if isinstance(value, dict) else f" = {_shown(value)}"
        lines.append(f"  {dotted}{shown}: {message}" + (f" (from {source})" if source else ""))
    return "\n".join(lines)


def _shown(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _source_of(dotted: str, sources: Mapping[str, str]) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:end]))
        if found:
            return found
    return None


def _allowed_keys(parent: str) -> list[str]:
    parts = parent.split(".") if parent else []
    if len(parts) == 2 and parts[0] == "topics":
        return sorted(TopicSettings.model_fields)
    model: type[BaseModel] = Settings
    for part in parts:
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)
