"""The default Delta engine: delta-rs commits files that Spark (or pyarrow) wrote.

Only this module (and ``ledger``) import ``deltalake``. Every commit carries
the run's app transactions, so a table's progress is recorded atomically
with its rows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from rmqlake.errors import CommitConflictError
from rmqlake.lake.actions import DataFile
from rmqlake.lake.tables import TABLE_PROPERTIES, TableSpec

log = logging.getLogger(__name__)


class DeltaRsEngine:
    """Table access through delta-rs. Paths are ``<root>/<table name>``."""

    name = "delta-rs"

    def __init__(self, root: str, *, storage_options: Mapping[str, str] | None = None, pin_snapshots: bool = False):
        self.root = root
        self.storage_options = dict(storage_options or {})
        # Lookups pin each table at the version first read: one log replay per table per query process.
        self._pinned: dict[str, DeltaTable | None] | None = {} if pin_snapshots else None
        self._datasets: dict = {}

    def uri(self, table: str) -> str:
        return f"{self.root}/{table}"

    def open(self, table: str, *, version: int | None = None) -> DeltaTable | None:
        """The table at ``version`` (latest when ``None``), or ``None`` if it does not exist."""
        if self._pinned is not None and version is None:
            if table not in self._pinned:
                self._pinned[table] = self._load(table, None)
            return self._pinned[table]
        return self._load(table, version)

    def pin(self, table: str, version: int) -> None:
        """Read ``table`` at ``version`` from now on (a pinned engine only; -1: the table did not exist)."""
        if self._pinned is None:
            raise ValueError("only an engine with pinned snapshots can pin a version")
        self._pinned[table] = self._load(table, version) if version >= 0 else None

    def _load(self, table: str, version: int | None) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri(table), version=version, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def exists(self, table: str) -> bool:
        if self._pinned is not None and table in self._pinned:
            return self._pinned[table] is not None
        return DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options or None)

    def ensure_table(self, spec: TableSpec) -> None:
        """Create ``spec`` empty if it does not exist (a concurrent creation is fine)."""
        if self.exists(spec.name):
            return
        try:
            DeltaTable.create(
                self.uri(spec.name),
                spec.schema.commented_arrow_schema,  # field metadata {"comment": ...}: what Spark's COMMENT writes
                mode="ignore",
                partition_by=list(spec.partition_by) or None,
                name=spec.name,
                description=spec.description or None,
                configuration=TABLE_PROPERTIES,
                storage_options=self.storage_options or None,
            )
        except Exception:  # another process created it first
            if not self.exists(spec.name):
                raise

    def table_schema(self, table: str) -> tuple[dict[str, str], list[str]] | None:
        """The table's columns (name -> Delta type name: ``long``, ``timestamp``, ``array``, ...) and partition
        columns, from its latest metadata; ``None`` if it does not exist."""
        try:  # the schema only: without the file list, which a large table's log replay spends most time on
            dt = DeltaTable(self.uri(table), storage_options=self.storage_options or None, without_files=True)
        except TableNotFoundError:
            return None
        fields = {field.name: field.type.type for field in dt.schema().fields}
        return fields, list(dt.metadata().partition_columns)

    def version(self, table: str) -> int | None:
        dt = self.open(table)
        return None if dt is None else dt.version()

    def transaction_version(self, table: str, app_id: str) -> int | None:
        dt = self.open(table)
        return None if dt is None else dt.transaction_version(app_id)

    def file_uris(self, table: str, *, version: int | None = None, partition_filters=None) -> list[str]:
        dt = self.open(table, version=version)
        if dt is None:
            return []
        return dt.file_uris(partition_filters=partition_filters)

    def active_files(self, table: str, *, version: int | None = None) -> list[DataFile]:
        """Add actions of the table's current snapshot."""
        dt = self.open(table, version=version)
        if dt is None:
            return []
        actions = pa.table(dt.get_add_actions(flatten=False)).to_pylist()
        return [
            DataFile(
                path=log_path_to_relative(a["path"]),
                size=a["size_bytes"],
                # the log keeps partition values as strings; delta-rs hands them back typed
                partition_values={k: None if v is None else str(v) for k, v in (a.get("partition") or {}).items()},
                modification_time=a.get("modification_time") or 0,
                num_records=a.get("num_records") or 0,
            )
            for a in actions
        ]

    def commit_files(
        self,
        spec: TableSpec,
        *,
        adds: Sequence[DataFile],
        removes: Sequence[DataFile] = (),
        mode: Literal["append", "overwrite"] = "append",
        app_transactions: Mapping[str, int],
        metadata: Mapping[str, str],
        deletion_timestamp: int = 0,
    ) -> int:
        """Commit ``adds`` (files already in place) and ``removes`` in one Delta commit.

        Returns:
            The new table version.

        Raises:
            CommitConflictError: a concurrent commit conflicts with this one.
        """
        self.ensure_table(spec)
        dt = self.open(spec.name)
        actions: list = [
            AddAction(
                path=f.path,
                size=f.size,
                partition_values=f.partition_values,
                modification_time=f.modification_time,
                data_change=True,
                stats=f.stats,
            )
            for f in adds
        ]
        actions += [
            RemoveAction(
                path=f.path,
                data_change=True,
                deletion_timestamp=deletion_timestamp,
                size=f.size,
                partition_values=f.partition_values,
            )
            for f in removes
        ]
        properties = CommitProperties(
            app_transactions=[Transaction(app_id, version) for app_id, version in app_transactions.items()],
            custom_metadata=dict(metadata),
        )
        try:
            dt.create_write_transaction(
                actions,
                mode=mode,
                schema=spec.schema.commented_arrow_schema,  # an overwrite writes it as the table's schema again
                partition_by=list(spec.partition_by) or None,
                commit_properties=properties,
            )
        except CommitFailedError as exc:
            raise CommitConflictError(
                f"commit to table {spec.name} conflicted with a concurrent commit: {exc}"
            ) from exc
        dt.update_incremental()
        return dt.version()

    def file_stats(self, table: str, columns) -> list[dict]:
        dt = self.open(table)
        rows = pa.table(dt.get_add_actions(flatten=False)).to_pylist()
        return [
            {
                "path": log_path_to_relative(row["path"]),
                "size": row.get("size_bytes"),
                "partition": row.get("partition") or {},
                "num_records": row.get("num_records"),
                "min": {c: (row.get("min") or {}).get(c) for c in columns},
                "max": {c: (row.get("max") or {}).get(c) for c in columns},
            }
            for row in rows
        ]

    def dataset(self, table: str, *, version: int | None = None):
        """A pyarrow dataset over the table's files; partition columns are fields, so filters on them prune files."""
        if self._pinned is not None and version is None:
            key = f"dataset:{table}"
            if key not in self._datasets:
                self._datasets[key] = self._dataset(table, None)
            return self._datasets[key]
        return self._dataset(table, version)

    def _dataset(self, table: str, version: int | None):
        dt = self.open(table, version=version)
        if dt is None:
            raise FileNotFoundError(f"table {self.uri(table)} does not exist")
        return dt.to_pyarrow_dataset()

    def read_arrow(self, table: str, *, columns: Sequence[str] | None = None, version: int | None = None) -> pa.Table:
        """A whole small table as Arrow (metadata tables only; never message rows)."""
        dt = self.open(table, version=version)
        if dt is None:
            raise FileNotFoundError(f"table {self.uri(table)} does not exist")
        return dt.to_pyarrow_table(columns=list(columns) if columns else None)

    def vacuum(self, table: str, *, retention_hours: float, dry_run: bool, below_table_retention: bool) -> list[str]:
        """Files removed from the table more than ``retention_hours`` ago (deleted unless ``dry_run``).

        delta-rs refuses a retention under the table's
        ``delta.deletedFileRetentionDuration`` (7 days by default) unless told
        to; ``below_table_retention`` is that deliberate choice, made in config.
        """
        dt = self.open(table)
        if dt is None:
            return []
        return dt.vacuum(
            retention_hours=int(retention_hours),
            dry_run=dry_run,
            enforce_retention_duration=not below_table_retention,
        )

    def history(self, table: str, *, limit: int | None = None) -> list[dict]:
        dt = self.open(table)
        return [] if dt is None else dt.history(limit)


def log_path_to_relative(path: str) -> str:
    """The file's path relative to the table folder, from the URI-encoded path of its Delta log action.

    Spark escapes partition values in folder names (``%`` -> ``%25``) and the
    log URI-encodes the path again (``%25`` -> ``%2525``); delta-rs hands the
    log's form back but encodes whatever path it is given, so a remove made
    with the log's form would name a file that does not exist (``%252525``)
    and remove nothing. Paths leave this module decoded, as adds take them.
    """
    return unquote(path)
