"""The lake from Python (a notebook, a script): lookups, status, lag and SQL as Arrow tables or pandas.

``rmqlake.open`` returns a ``LakeReader``: read-only, every table pinned at
the last fully applied run when it opens (a run half applied, or one that
commits while the reader is open, is not seen; open again to see it). The
lookups are the CLI's (``rmqlake.query``, ``steps.status``,
``steps.offsets``) run on that pinned lake, so both give the same answers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa

from rmqlake import query as Q
from rmqlake.config import Settings, load_settings
from rmqlake.errors import LakeStateError, UsageError
from rmqlake.lake import Lake
from rmqlake.lake.tables import COMMITLOG, TABLES
from rmqlake.timeutil import parse_timestamp

PIN_ATTEMPTS = 5  # runs committing faster than a reader opens its tables: give up after this many tries
MESSAGE_SCHEMA = COMMITLOG.schema.select(Q.MESSAGE_VIEW_COLUMNS).arrow_schema
RESULT_METADATA_KEY = b"rmqlake.result"


def open_lake(
    lake: str | None = None,
    *,
    conf: str | os.PathLike | None = None,
    env: str | None = None,
    overrides: Sequence[str] = (),
    settings: Settings | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> LakeReader:
    """Open a lake for reading (``rmqlake.open``).

    Settings are found as the CLI finds them: ``conf`` (default
    ``$RMQLAKE_CONF``, else ``conf``; built-in defaults when that folder does
    not exist), ``env`` (default ``$RMQLAKE_ENV``), ``overrides``
    (``key.path=value``, as ``--set``) and ``lake`` (default
    ``$RMQLAKE_LAKE``, else ``lake.root``); or pass ``settings`` ready made.
    ``storage_options`` are added to ``lake.storage_options`` (object-store
    credentials, endpoints).
    """
    if settings is None:
        folder = conf if conf is not None else os.environ.get("RMQLAKE_CONF", "conf")
        env = env if env is not None else os.environ.get("RMQLAKE_ENV")
        lake = lake if lake is not None else os.environ.get("RMQLAKE_LAKE")
        if conf is None and not os.path.isdir(folder):
            settings = Settings.model_validate({"lake": {"root": lake}} if lake else {})
        else:
            settings = load_settings(folder, env=env, overrides=overrides, lake=lake)
    elif lake is not None:
        settings = settings.model_copy(update={"lake": settings.lake.model_copy(update={"root": lake})})
    if storage_options:
        options = {**settings.lake.storage_options, **storage_options}
        settings = settings.model_copy(update={"lake": settings.lake.model_copy(update={"storage_options": options})})
    return LakeReader(settings)


class LakeReader:
    """A read-only view of one lake, pinned at the last fully applied run.

    Every method returns a ``pyarrow.Table`` (``as_pandas=True``: a pandas
    DataFrame). A lookup's summary (status, next offset, metrics) is in the
    table's schema metadata under ``rmqlake.result`` (``result_of(table)``)
    and in a DataFrame's ``attrs``.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        for _ in range(PIN_ATTEMPTS):
            lake = Lake.from_settings(settings, read_only=True)
            if lake.pin_every_table():
                break
        else:
            raise LakeStateError(
                f"runs kept committing to {settings.lake.root} while its tables were opened; try again"
            )
        self.lake = lake
        self._sql = None

    def __repr__(self) -> str:
        return f"LakeReader({self.lake.root!r}, run {self.seq})"

    def __enter__(self) -> LakeReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._sql is not None:
            self._sql.close()
            self._sql = None

    @property
    def seq(self) -> int:
        """The last run the reader sees (``rmqlake status``'s ``ledger_seq``)."""
        return self.lake.ledger().seq

    @property
    def versions(self) -> dict[str, int | None]:
        """The version each table is read at (``None``: the table does not exist yet)."""
        return {table: self.lake.version(table) if self.lake.exists(table) else None for table in TABLES}

    # -- lookups ------------------------------------------------------------------
    def query_key(
        self,
        topic: str,
        key: str,
        *,
        begin: int | str | datetime | None = None,
        end: int | str | datetime | None = None,
        max_num: int = 64,
        as_pandas: bool = False,
    ):
        """Messages of ``topic`` whose KEYS hold ``key`` (``rmqlake query key``)."""
        if max_num < 1:
            raise UsageError("max_num must be at least 1")
        store = self.settings.store
        result = Q.query_key(
            self.lake,
            topic=topic,
            key=key,
            begin=_epoch_ms(begin, "begin") if begin is not None else 0,
            end=_epoch_ms(end, "end") if end is not None else Q.LONG_MAX,
            max_num=max_num,
            slots=store.index_slots,
            segment_size=store.commitlog_segment_size,
        )
        return _messages(result, as_pandas=as_pandas)

    def query_offset(
        self,
        topic: str,
        queue: int,
        offset: int,
        *,
        max_num: int = Q.DEFAULT_PULL_BATCH,
        tags: str = "*",
        compacted: bool = False,
        as_pandas: bool = False,
    ):
        """Messages of one queue from ``offset``, with a tag subscription (``rmqlake query offset``)."""
        if compacted:
            result = Q.query_compacted_offset(
                self.lake, topic=topic, queue=queue, offset=offset, max_num=max_num, tags=tags
            )
        else:
            result = Q.query_offset(
                self.lake,
                topic=topic,
                queue=queue,
                offset=offset,
                max_num=max_num,
                tags=tags,
                segment_size=self.settings.store.commitlog_segment_size,
                min_offsets=self.lake.state().queue_min_offsets,
            )
        return _messages(result, as_pandas=as_pandas)

    def query_msgid(self, msg_id: str, *, topic: str | None = None, as_pandas: bool = False):
        """A message by offsetMsgId or UNIQ_KEY (``rmqlake query msgid``)."""
        state = self.lake.state()
        store = self.settings.store
        result = Q.query_msgid(
            self.lake,
            msg_id=msg_id,
            topic=topic,
            slots=store.index_slots,
            segment_size=store.commitlog_segment_size,
            topics=sorted({queue.topic for queue in state.commitlog.queue_heads}) if state.commitlog else [],
        )
        return _messages(result, as_pandas=as_pandas)

    def message_tracks(self, msg_id: str, *, topic: str | None = None, as_pandas: bool = False):
        """Per consumer group with offsets in the lake, whether it consumed the message ``msg_id``
        (CONSUMED / NOT_CONSUME_YET, as ``rmqlake query msgid`` and mqadmin's queryMsgById track it)."""
        messages = self.query_msgid(msg_id, topic=topic)
        return _output(_rows_table(Q.message_tracks(self.lake, messages.to_pylist())), as_pandas=as_pandas)

    def query_time(
        self, topic: str, queue: int, at: int | str | datetime, *, boundary: str = "lower", as_pandas: bool = False
    ):
        """The queue offset of the first message stored at or after ``at`` (``rmqlake query time``), one row."""
        if boundary not in ("lower", "upper"):
            raise UsageError(f"boundary must be 'lower' or 'upper', not {boundary!r}")
        result = Q.query_time(
            self.lake,
            topic=topic,
            queue=queue,
            at=_epoch_ms(at, "at"),
            boundary=boundary,
            units_per_file=self.settings.store.cq_units_per_file,
            min_phy_offset=self.lake.min_physical_offset(),
            min_offsets=self.lake.state().queue_min_offsets,
        )
        return _output(_rows_table([result]), as_pandas=as_pandas)

    # -- state --------------------------------------------------------------------
    def status(self, *, as_pandas: bool = False) -> dict[str, Any]:
        """``rmqlake status``: ``{"store": one row, "topics": ..., "queues": ..., "runs": ..., "pending": ...,
        "transactions": ...}``, each a table (``pending``: deliveries not yet due, per level or timer and real
        topic; ``transactions``: open transactions per real topic)."""
        from rmqlake.steps.status import status

        report = status(self.settings, lake=self.lake)
        store = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in report["store"].items()}
        tables = {"store": _rows_table([store])} | {
            part: _rows_table(report[part]) for part in ("topics", "queues", "runs", "pending", "transactions")
        }
        return {part: _output(table, as_pandas=as_pandas) for part, table in tables.items()}

    def lag(self, *, group: str | None = None, history: bool = False, as_pandas: bool = False):
        """``rmqlake lag``: lag per group, topic and queue at the latest snapshot (``history``: per snapshot)."""
        from rmqlake.steps.offsets import lag

        report = lag(self.settings, group=group, lake=self.lake)
        return _output(_rows_table(report["history" if history else "latest"]), as_pandas=as_pandas)

    # -- SQL ----------------------------------------------------------------------
    def sql(self, query: str, *, as_pandas: bool = False):
        """Run DuckDB SQL over the pinned tables and the ``messages`` views (see ``rmqlake sql``)."""
        from rmqlake.sql import connect, run_sql

        if self._sql is None:
            self._sql = connect(self.lake)
        return _output(run_sql(self._sql, query), as_pandas=as_pandas)


def result_of(table: pa.Table) -> dict:
    """A lookup's summary (status, offsets, metrics) kept in its table's schema metadata."""
    raw = (table.schema.metadata or {}).get(RESULT_METADATA_KEY)
    return json.loads(raw) if raw else {}


def _epoch_ms(value: int | str | datetime, name: str) -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise UsageError(f"{name}: a datetime needs a time zone (datetime(..., tzinfo=UTC))")
        return int(value.timestamp() * 1000)
    if isinstance(value, int):
        return value
    return parse_timestamp(value, option=name)


def _messages(result: dict, *, as_pandas: bool):
    """Messages as rows of the commitlog's columns, with the lookup's summary in the schema metadata."""
    table = pa.Table.from_pylist(result["rows"], schema=MESSAGE_SCHEMA)
    summary = {k: v for k, v in result.items() if k not in ("rows", "metrics")} | result.get("metrics", {})
    table = table.replace_schema_metadata({RESULT_METADATA_KEY: json.dumps(summary, default=str)})
    return _output(table, as_pandas=as_pandas)


def _rows_table(rows: Sequence[Mapping]) -> pa.Table:
    """Rows whose keys may differ (run records of different jobs): every key a column, missing ones null."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return pa.table({c: pa.array([row.get(c) for row in rows]) for c in columns})


def _output(table: pa.Table, *, as_pandas: bool):
    if not as_pandas:
        return table
    frame = table.to_pandas()
    frame.attrs.update(result_of(table))
    return frame
