"""SQL over the lake with DuckDB: every table as a view of its pinned version, plus convenience views.

Each table is registered as its pinned version's Arrow dataset (a
read-only ``Lake`` pins every table at the last fully applied run), so
DuckDB scans the Parquet files itself, pushing column choices and filters
down, and one query never sees one table a run ahead of another. Nothing
is collected into Python but the query's result.
"""

from __future__ import annotations

import base64
import importlib.util
from collections.abc import Iterable
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa

from rmqlake.lake import Lake
from rmqlake.lake.tables import TABLES, table_spec

ISO_MS = "'%Y-%m-%dT%H:%M:%S.%gZ'"  # as rmqlake prints times (timeutil.iso): UTC, milliseconds


def _iso(column: str) -> str:
    return f"strftime(make_timestamp({column} * 1000), {ISO_MS})"


def _message_view(table: str) -> str:
    """A message table with readable times and bodies: ``body_text`` is NULL where the body is not UTF-8."""
    return f"""
        SELECT topic, queue_id, queue_offset, physical_offset, total_size AS size,
               {_iso("store_timestamp")} AS store_time, {_iso("born_timestamp")} AS born_time,
               array_to_string(keys, ' ') AS keys, tags, msg_id, uniq_key,
               try(decode(body)) AS body_text, body, properties,
               store_timestamp, born_timestamp, born_host, store_host, sys_flag, flag, reconsume_times, segment
        FROM {table}
    """


# Convenience views over the tables: name -> (what it shows, its SELECT).
VIEWS = {
    "messages": ("commitlog rows with ISO-8601 UTC times and UTF-8 bodies", _message_view("commitlog")),
    "compacted_messages": (
        "compaction_log rows (latest message per key) like messages",
        _message_view("compaction_log"),
    ),
}


def connect(lake: Lake):
    """A DuckDB connection whose views are ``lake``'s tables at their pinned versions and ``VIEWS``.

    A table that does not exist yet is an empty view with its schema, so
    every query works on a young lake.
    """
    import duckdb

    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    for table in TABLES:
        data = lake.engine.dataset(table) if lake.exists(table) else table_spec(table).arrow_schema.empty_table()
        connection.register(table, data)
    for name, (_, select) in VIEWS.items():
        connection.execute(f"CREATE VIEW {name} AS {select}")
    return connection


def delta_connection(*, database: str = ":memory:"):
    """A DuckDB connection with DuckDB's ``delta`` extension loaded, for ``delta_scan('<lake>/<table>')``.

    The extension comes from the ``duckdb-ext-delta`` package (the ``readers`` extra), never from a download:
    DuckDB would otherwise fetch it from the network on first use. It loads only into the DuckDB version it
    was built for.

    Raises:
        ConfigError: the package is not installed, or holds no extension for the installed DuckDB.
    """
    import duckdb

    from rmqlake.errors import ConfigError

    wanted = f"v{duckdb.__version__}"
    package = importlib.util.find_spec("duckdb_ext")
    folders = [Path(p) / "extensions" for p in (package.submodule_search_locations or [])] if package else []
    if not folders:
        raise ConfigError(
            "DuckDB's delta extension is not installed: pip install 'rmqlake[readers]' (the duckdb-ext-delta package)"
        )
    found = [folder for folder in folders if (folder / wanted).is_dir()]
    if not found:
        built = sorted(v.name for folder in folders if folder.is_dir() for v in folder.iterdir())
        raise ConfigError(
            f"duckdb-ext-delta holds the delta extension for DuckDB {', '.join(built) or 'no version'}, "
            f"not for the installed {wanted}; install the DuckDB version it is built for"
        )
    connection = duckdb.connect(
        database,
        config={
            "extension_directory": str(found[0]),
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        },
    )
    try:
        connection.execute("LOAD delta")
    except duckdb.Error as exc:
        connection.close()
        raise ConfigError(
            f"DuckDB cannot load the delta extension from {found[0]}: {str(exc).splitlines()[0]}"
        ) from None
    return connection


def run_sql(connection, query: str) -> pa.Table:
    """The result of ``query`` as an Arrow table (DuckDB's errors become one-line usage errors)."""
    import duckdb

    from rmqlake.errors import UsageError

    try:
        relation = connection.sql(query)  # None for statements without a result (SET, CREATE VIEW)
        return relation.to_arrow_table() if relation is not None else pa.table({})
    except duckdb.Error as exc:
        raise UsageError(f"SQL: {str(exc).splitlines()[0]}") from None


def printable_rows(table: pa.Table) -> Iterable[dict]:
    """Result rows for JSON and the terminal: bytes as UTF-8 text where valid, else ``base64:...``."""
    for row in table.to_pylist():
        yield {name: _printable(value) for name, value in row.items()}


def _printable(value):
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value
