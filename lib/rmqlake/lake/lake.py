"""The lake: its tables, its ledger, and runs that change several tables as one decision.

A job does ``with lake.run("ingest") as run:`` (via ``run_job``), stages the
files of each table it changes, and calls ``run.commit(state=...)``. See
``ledger`` for why this is safe against crashes and concurrent runs.
"""

from __future__ import annotations

import bisect
import io
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from rmqlake.errors import CommitConflictError, LakeStateError
from rmqlake.lake.actions import DataFile, parquet_stats, partition_values_from_path
from rmqlake.lake.deltars import DeltaRsEngine
from rmqlake.lake.deltaspark import DeltaSparkEngine
from rmqlake.lake.ledger import LEDGER_APP_ID, LedgerEntry, commit_ledger, read_ledger
from rmqlake.lake.state import LakeState
from rmqlake.lake.storage import Storage, normalize_root
from rmqlake.lake.tables import TABLES, schema_differences, table_spec

if TYPE_CHECKING:
    from rmqlake.config import Settings

log = logging.getLogger(__name__)

STAGING_DIR = "_staging"


@dataclass
class TableOp:
    """One table commit of a run: files to add (staged), files to remove, extra app transactions."""

    table: str
    mode: Literal["append", "overwrite"] = "append"
    adds: list[DataFile] = field(default_factory=list)
    removes: list[DataFile] = field(default_factory=list)
    app_transactions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "table": self.table,
            "mode": self.mode,
            "adds": [f.to_json() for f in self.adds],
            "removes": [f.to_json() for f in self.removes],
            "app_transactions": self.app_transactions,
        }

    @classmethod
    def from_json(cls, data: dict) -> TableOp:
        return cls(
            table=data["table"],
            mode=data["mode"],
            adds=[DataFile.from_json(f) for f in data["adds"]],
            removes=[DataFile.from_json(f) for f in data["removes"]],
            app_transactions=dict(data.get("app_transactions", {})),
        )


class Lake:
    """Table access and run management under one lake root.

    Args:
        root: local folder or object-store URI holding the tables.
        read_only: pin every table at the first version read (lookups: one
            log replay per table); such a Lake cannot start runs.
        storage_options: delta-rs / object-store options.
        staging_grace_hours: staged files of runs that never committed are
            removed once they are this old (younger ones may belong to a
            run that is still working).
    """

    def __init__(
        self,
        root: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        engine: str = "delta-rs",
        staging_grace_hours: float = 24.0,
        read_only: bool = False,
    ):
        self.root = normalize_root(root)
        self.storage_options = dict(storage_options or {})
        self.storage = Storage(self.root, self.storage_options)
        engines = {"delta-rs": DeltaRsEngine, "delta-spark": DeltaSparkEngine}
        if engine not in engines:
            raise ValueError(f"unknown lake engine {engine!r}; available: {', '.join(engines)}")
        self.engine = engines[engine](self.root, storage_options=self.storage_options, pin_snapshots=read_only)
        self.read_only = read_only
        self.staging_grace_hours = staging_grace_hours
        self._ledger: LedgerEntry | None = None  # read-only lakes with a half-applied run: the entry before it
        if read_only:
            self._pin_consistent_versions()

    @classmethod
    def from_settings(cls, settings: Settings, *, read_only: bool = False) -> Lake:
        """The lake of ``settings`` (``read_only``: pinned snapshots for lookups)."""
        return cls(
            settings.lake.root,
            storage_options=settings.lake.storage_options,
            engine=settings.lake.engine,
            staging_grace_hours=settings.lake.staging_grace_hours,
            read_only=read_only,
        )

    def _pin_consistent_versions(self) -> None:
        """Readers see the lake as of the last fully applied run.

        A run's table commits follow its ledger commit one by one; while some
        are missing (a crash, or simply a reader arriving between two of
        them) the tables already committed are read at their version before
        that run, so a reader never sees half a run (e.g. a segment expired
        while its CQ files are still listed).
        """
        entry = self.ledger()
        ops = [raw["table"] for raw in entry.manifest]
        done = {t: self.engine.transaction_version(t, LEDGER_APP_ID) for t in ops}
        if all(v is not None and v >= entry.seq for v in done.values()):
            return
        for table, applied in done.items():
            if applied is not None and applied >= entry.seq:
                before = self.engine.version(table) - 1
                log.info("reading %s at version %d: run seq %d is not fully applied yet", table, before, entry.seq)
                self.engine.pin(table, before)
        if entry.version:  # the state that goes with those versions: the ledger's previous entry
            self._ledger = read_ledger(self.root, storage_options=self.storage_options, version=entry.version - 1)

    def pin_every_table(self) -> bool:
        """Open every table now and keep the ledger entry they go with; False if a newer run got in between.

        A read-only Lake opens a table when it is first read; a reader that
        reads many tables over minutes (SQL, a notebook) pins them all at
        once instead, so a table first read later cannot be a run ahead. The
        tables hold exactly the entry's run when none is ahead of it (its
        ``rmqlake.ledger`` transaction newer than the entry's seq) and each
        table the run changed holds that change; otherwise a run committed
        while they were opened, and the caller opens a fresh Lake.
        """
        if not self.read_only:
            raise ValueError("only a read-only Lake pins its tables")
        entry = self.ledger()
        applied = {table: self.engine.transaction_version(table, LEDGER_APP_ID) or 0 for table in TABLES}
        if any(seq > entry.seq for seq in applied.values()):
            return False
        if any(applied.get(raw["table"], 0) < entry.seq for raw in entry.manifest):
            return False
        self._ledger = entry
        return True

    def travel_to(self, *, seq: int | None = None, at: datetime | None = None) -> LedgerEntry:
        """Read every table as it was right after run ``seq`` (or the last run committed at or before ``at``).

        Time travel for a read-only lake: each table is pinned at its last
        version whose ``rmqlake.ledger`` transaction is at most ``seq`` (a
        run's table commits carry its ledger seq), and the state is that
        run's ledger entry. A lake that is a whole store at every run thus
        reads as the whole store of that moment.

        Raises:
            LakeStateError: no such run (with the runs the lake has).
        """
        if not self.read_only:
            raise ValueError("time travel needs a read-only Lake (Lake(..., read_only=True))")
        latest = self.ledger()
        if latest.version is None or latest.seq == 0:
            raise LakeStateError(f"the lake at {self.root} has no committed run to travel to")

        def entry_at(version: int) -> LedgerEntry:
            return read_ledger(self.root, storage_options=self.storage_options, version=version)

        if at is not None:  # the last ledger version committed at or before ``at``
            versions = range(latest.version + 1)

            def committed_ms(version: int) -> int:  # timestamps given to --as-of have millisecond precision
                committed = entry_at(version).committed_at
                return int(committed.timestamp() * 1000) if committed else -1

            found = bisect.bisect_right(versions, int(at.timestamp() * 1000), key=committed_ms) - 1
            entry = entry_at(found) if found >= 0 else None
            if entry is None or entry.seq == 0:
                raise LakeStateError(f"no run was committed at or before {at.isoformat()} in {self.root}")
        else:
            if not 1 <= (seq or 0) <= latest.seq:
                raise LakeStateError(f"no run {seq} in {self.root}: its runs are 1..{latest.seq} (see rmqlake status)")
            found = bisect.bisect_left(range(latest.version + 1), seq, key=lambda v: entry_at(v).seq)
            entry = entry_at(found)
            if entry.seq != seq:
                raise LakeStateError(f"run {seq} is not in the ledger history of {self.root} (vacuumed?)")
        for table in TABLES:
            current = self.engine.version(table) if self.engine.exists(table) else None
            if current is None:
                continue

            def applied(version: int, table: str = table) -> int:
                return self.engine.open(table, version=version).transaction_version(LEDGER_APP_ID) or 0

            pinned = bisect.bisect_right(range(current + 1), entry.seq, key=applied) - 1
            self.engine.pin(table, pinned)
        self._ledger = entry
        log.info("reading the lake as of run %d (%s %s, %s)", entry.seq, entry.job, entry.run_id, entry.committed_at)
        return entry

    # -- reading -----------------------------------------------------------------
    def uri(self, table: str) -> str:
        return self.engine.uri(table)

    def exists(self, table: str) -> bool:
        return self.engine.exists(table)

    def version(self, table: str) -> int | None:
        return self.engine.version(table)

    def read_arrow(self, table: str, *, columns: Sequence[str] | None = None, version: int | None = None) -> pa.Table:
        """A small table (segments, ledger-sized metadata) as Arrow; empty if it does not exist."""
        if not self.exists(table):
            return table_spec(table).arrow_schema.empty_table()
        return self.engine.read_arrow(table, columns=columns, version=version)

    def scan(
        self,
        table: str,
        *,
        columns: Sequence[str] | None = None,
        partitions: list[tuple] | None = None,
        filter=None,
        version: int | None = None,
    ) -> pa.Table:
        """Rows of ``table`` matching ``filter`` (a pyarrow dataset expression), read with pyarrow.

        ``partitions`` (``[(column, "=" | "in", value)]``) prunes partition
        folders; row groups whose statistics cannot match ``filter`` are
        skipped. For lookups and metadata, not for bulk jobs.
        """
        spec = table_spec(table)
        if not self.exists(table):
            schema = spec.arrow_schema
            return schema.empty_table().select(list(columns)) if columns else schema.empty_table()
        dataset = self.engine.dataset(table, version=version)
        for column, op, value in partitions or []:
            field_type = dataset.schema.field(column).type
            if op == "=":
                clause = ds.field(column) == pa.scalar(value).cast(field_type)
            elif op == "in":
                clause = ds.field(column).isin(pa.array(list(value)).cast(field_type))
            else:
                raise ValueError(f"partition filter operator {op!r} is not supported (use '=' or 'in')")
            filter = clause if filter is None else clause & filter
        return dataset.to_table(columns=list(columns) if columns else None, filter=filter)

    def lookup(
        self, table: str, *, column: str, values: Sequence[int], columns: Sequence[str], files: Sequence[str]
    ) -> pa.Table:
        """Rows of ``files`` whose ``column`` is one of ``values``, reading only the row groups that can hold them.

        Row groups are chosen from their min/max statistics (``values``
        sorted), then filtered with a hash ``isin``: a handful of row groups
        are decoded whatever the size of the files. (A filter expression of
        many equalities prunes as well but costs far more to evaluate.)
        """
        wanted = sorted(values)
        if not wanted or not self.exists(table):
            return table_spec(table).arrow_schema.empty_table().select(list(columns))
        dataset = self.engine.dataset(table)
        chosen = set(files)
        pieces = []
        for fragment in dataset.get_fragments():
            if _table_relative(fragment.path, table) not in chosen:
                continue
            metadata = fragment.metadata  # the footer; read statistics of one column only (bodies have big ones)
            index = metadata.schema.names.index(column)
            groups = []
            for number in range(metadata.num_row_groups):
                stats = metadata.row_group(number).column(index).statistics
                bounds = (stats.min, stats.max) if stats is not None and stats.has_min_max else (None, None)
                if holds_any(wanted, *bounds):
                    groups.append(number)
            if groups:
                pieces.append(fragment.subset(row_group_ids=groups))
        if not pieces:
            return dataset.schema.empty_table().select(list(columns))
        subset = ds.FileSystemDataset(pieces, dataset.schema, dataset.format, dataset.filesystem)
        return subset.to_table(columns=list(columns), filter=ds.field(column).isin(wanted))

    def file_stats(self, table: str, columns: Sequence[str]) -> list[dict]:
        """Per data file: partition values and min/max of ``columns`` from the Delta log (no data read)."""
        if not self.exists(table):
            return []
        return self.engine.file_stats(table, columns)

    def foreign_commits(self) -> dict[str, list[dict]]:
        """Per table, the commits rmqlake did not make (another writer's DELETE, UPDATE, MERGE, ...).

        rmqlake's own commits carry ``rmqlake.*`` commit metadata (delta-rs) or user metadata (the Delta
        extension); a table's creation, vacuum's bookkeeping commits and OPTIMIZE (also with ZORDER BY: it
        rewrites files, every row stays) change no rows and are not listed.
        """
        found = {}
        for table in TABLES:
            if not self.exists(table):
                continue
            commits = [
                {"version": c.get("version"), "operation": c.get("operation"), "timestamp": c.get("timestamp")}
                for c in self.engine.history(table)
                if not _made_by_rmqlake(c) and c.get("operation") not in _NO_DATA_CHANGE and c.get("version")
            ]
            if commits:
                found[table] = sorted(commits, key=lambda c: c["version"])
        return found

    def min_physical_offset(self) -> int:
        """The commitlog's min offset: the start of its first segment not deleted (0 for an empty lake)."""
        segments = self.read_arrow("segments", columns=["start_offset", "status"]).to_pylist()
        return min((s["start_offset"] for s in segments if s["status"] != "deleted"), default=0)

    def ledger(self) -> LedgerEntry:
        if self._ledger is not None:
            return self._ledger
        return read_ledger(self.root, storage_options=self.storage_options)

    def state(self) -> LakeState:
        """The lake state of the latest committed run."""
        return self.ledger().state

    # -- runs ---------------------------------------------------------------------
    def begin(self, job: str, *, run_id: str | None = None, batch_id: str | None = None) -> LakeRun:
        """Start a run on the latest ledger entry, after making the tables hold everything it decided.

        The entry is read first and then rolled forward (not the other way
        round): a run committed in between would otherwise be the base while
        its table commits may still be missing.
        """
        if self.read_only:
            raise ValueError("this Lake was opened read_only (pinned snapshots, for lookups); open another to write")
        self.check_table_schemas(TABLES)  # before any work: a run would only fail at its commit
        base = read_ledger(self.root, storage_options=self.storage_options, create=True)
        self._roll_forward(base)
        self._sweep_staging()
        run_id = run_id or f"{job}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
        return LakeRun(self, job=job, run_id=run_id, base=base, batch_id=batch_id)

    def check_table_schemas(self, tables) -> None:
        """Refuse to write when an existing table's columns or partition columns are not its declaration's.

        A table created by another rmqlake version (e.g. before a column was added) would otherwise take
        files whose columns its schema does not list, or keep null where readers expect values.

        Raises:
            LakeStateError: naming each table, how it differs and how to rebuild the lake.
        """
        problems = []
        for name in tables:
            found = self.engine.table_schema(name)
            if found is None:
                continue
            fields, partition_by = found
            differences = schema_differences(table_spec(name), fields=fields, partition_by=partition_by)
            if differences:
                problems.append(f"table {name} ({self.uri(name)}): " + "; ".join(differences))
        if problems:
            raise LakeStateError(
                "the lake was written by another rmqlake version and its tables do not match what this version "
                "writes, so nothing was written:\n  "
                + "\n  ".join(problems)
                + "\nRebuild the lake under a new root: re-ingest the producer logs (rmqlake ingest), or export "
                "the store with the rmqlake version that wrote this lake (rmqlake export-store --out DIR) and "
                "import it with this one (rmqlake import-store)."
            )

    def roll_forward(self) -> list[str]:
        """Apply the table commits of the latest ledger entry that are still missing.

        Returns:
            The tables that were committed now (empty when nothing was pending).
        """
        return self._roll_forward(self.ledger())

    def _roll_forward(self, entry: LedgerEntry) -> list[str]:
        if not entry.manifest:
            return []
        applied = self._apply_manifest(entry, quiet=True)
        if applied:
            log.warning(
                "rolled forward %s run %s (seq %d): committed %s, which an interrupted run had left",
                entry.job,
                entry.run_id,
                entry.seq,
                ", ".join(applied),
            )
        return applied

    def pending_tables(self) -> list[str]:
        """Tables whose commit from the latest run is still missing (should be empty)."""
        entry = self.ledger()
        return [
            op["table"]
            for op in entry.manifest
            if (self.engine.transaction_version(op["table"], LEDGER_APP_ID) or 0) < entry.seq
        ]

    def _apply_manifest(self, entry: LedgerEntry, *, quiet: bool = False) -> list[str]:
        applied = []
        for raw in entry.manifest:
            op = TableOp.from_json(raw)
            done = self.engine.transaction_version(op.table, LEDGER_APP_ID)
            if done is not None and done >= entry.seq:
                continue
            self._place_staged_files(op, entry.run_id)
            spec = table_spec(op.table)
            metadata = {
                "rmqlake.job": entry.job or "",
                "rmqlake.run_id": entry.run_id or "",
                "rmqlake.seq": str(entry.seq),
            }
            if entry.batch_id:
                metadata["rmqlake.batch_id"] = entry.batch_id
            try:
                self.engine.commit_files(
                    spec,
                    adds=op.adds,
                    removes=op.removes,
                    mode=op.mode,
                    app_transactions={LEDGER_APP_ID: entry.seq, **op.app_transactions},
                    metadata=metadata,
                    deletion_timestamp=int(time.time() * 1000),
                )
            except CommitConflictError:
                # A concurrent roll-forward of the same entry may have won; that is fine.
                done = self.engine.transaction_version(op.table, LEDGER_APP_ID)
                if done is None or done < entry.seq:
                    raise
                continue
            applied.append(op.table)
            _crash_point(f"after-commit:{op.table}")
        for raw in entry.manifest:
            self.storage.delete_dir(f"{raw['table']}/{STAGING_DIR}/{entry.run_id}")
        return applied

    def _place_staged_files(self, op: TableOp, run_id: str | None) -> None:
        staging = f"{op.table}/{STAGING_DIR}/{run_id}"
        for data_file in op.adds:
            final = f"{op.table}/{data_file.path}"
            staged = f"{staging}/{data_file.path}"
            if self.storage.exists(staged):
                try:
                    self.storage.move(staged, final)
                except OSError:  # a concurrent roll-forward of the same run moved it first
                    if not self.storage.exists(final):
                        raise
            elif not self.storage.exists(final):
                raise LakeStateError(
                    f"file {final} of run {run_id} is neither staged nor in place; the lake cannot be rolled forward"
                )

    def _sweep_staging(self) -> None:
        """Remove staging folders of runs that never committed and are older than the grace period."""
        cutoff = time.time() * 1000 - self.staging_grace_hours * 3_600_000
        for name in TABLES:
            for run_dir, mtime in self.storage.list_dirs(f"{name}/{STAGING_DIR}"):
                if mtime < cutoff:
                    log.info("removing staged files of uncommitted run %s in %s", run_dir, name)
                    self.storage.delete_dir(f"{name}/{STAGING_DIR}/{run_dir}")


class LakeRun:
    """One job run's changes to the lake, decided by a single ledger commit.

    ``state`` is the lake state the run started from; the job derives the new
    state from it (``dataclasses.replace``) and passes that to ``commit``.
    """

    def __init__(self, lake: Lake, *, job: str, run_id: str, base: LedgerEntry, batch_id: str | None):
        self.lake = lake
        self.job = job
        self.run_id = run_id
        self.base = base
        self.batch_id = batch_id
        self.seq = base.seq + 1
        self.state: LakeState = base.state
        self.ops: dict[str, TableOp] = {}
        self.committed = False

    def staging_uri(self, table: str) -> str:
        return self.lake.storage.uri(table, STAGING_DIR, self.run_id)

    def staging_dir(self, table: str) -> str:
        """This run's staging folder of ``table``, relative to the lake root (for writers using the lake storage)."""
        return f"{table}/{STAGING_DIR}/{self.run_id}"

    def op(self, table: str, *, mode: Literal["append", "overwrite"] = "append") -> TableOp:
        if table not in self.ops:
            self.ops[table] = TableOp(table=table, mode=mode)
        elif self.ops[table].mode != mode:
            raise ValueError(f"table {table} is already staged with mode {self.ops[table].mode}, not {mode}")
        return self.ops[table]

    def collect_staged(self, table: str, *, mode: Literal["append", "overwrite"] = "append") -> list[DataFile]:
        """Register every Parquet file under this run's staging folder of ``table`` for commit.

        Statistics come from the Parquet footers (no data is read). Files and
        folders whose name starts with ``_`` or ``.`` are hidden, as Spark
        hides them: temporary files, a job's scratch files.
        """
        staging = self.staging_dir(table)
        spec = table_spec(table).partition_by
        files = []
        for entry in self.lake.storage.list_files(staging):
            hidden = any(part.startswith(("_", ".")) for part in entry.path.split("/"))
            if hidden or not entry.path.endswith(".parquet"):
                continue
            folders = partition_values_from_path(entry.path)
            if list(folders) != list(spec):  # a name=value level that is no partition column breaks Delta readers
                raise ValueError(f"staged file {entry.path} of {table} is not in its partition folders {list(spec)}")
            metadata = pq.read_metadata(
                self.lake.storage.file_path(f"{staging}/{entry.path}"), filesystem=self.lake.storage.fs
            )
            _check_staged_columns(table, entry.path, metadata.schema.to_arrow_schema().names)
            num_records, stats = parquet_stats(metadata)
            files.append(
                DataFile(
                    path=entry.path,
                    size=entry.size,
                    partition_values=folders,
                    modification_time=entry.mtime_ms,
                    stats=stats,
                    num_records=num_records,
                )
            )
        self.op(table, mode=mode).adds.extend(files)
        return files

    def stage_arrow(self, table: str, data: pa.Table, *, mode: Literal["append", "overwrite"] = "append") -> DataFile:
        """Write a small Arrow table (one file, unpartitioned tables only) to staging."""
        spec = table_spec(table)
        if spec.partition_by:
            raise ValueError(f"stage_arrow writes unpartitioned tables only; {table} is partitioned")
        data = spec.schema.complete(data.select(spec.schema.stored.names).cast(spec.schema.stored.arrow_schema))
        buffer = io.BytesIO()
        pq.write_table(data, buffer, compression="snappy")
        name = f"part-{self.run_id}-{len(self.op(table, mode=mode).adds):05d}.parquet"
        self.lake.storage.write_bytes(f"{table}/{STAGING_DIR}/{self.run_id}/{name}", buffer.getvalue())
        num_records, stats = parquet_stats(pq.read_metadata(io.BytesIO(buffer.getvalue())))
        data_file = DataFile(
            path=name,
            size=len(buffer.getvalue()),
            modification_time=int(time.time() * 1000),
            stats=stats,
            num_records=num_records,
        )
        self.op(table, mode=mode).adds.append(data_file)
        return data_file

    def remove(self, table: str, files: Sequence[DataFile]) -> None:
        """Remove whole files from ``table`` in this run's commit (nothing is rewritten)."""
        self.op(table).removes.extend(files)

    def ensure_tables(self) -> None:
        """Create the tables this run changes that do not exist yet (empty, at version 0)."""
        for name in self.ops:
            self.lake.engine.ensure_table(table_spec(name))
        self.lake.check_table_schemas(self.ops)

    def commit(self, *, state: LakeState | None = None) -> dict[str, int | None]:
        """Decide the run (ledger commit), then make it visible table by table.

        ``state`` is the lake state after the run (``None``: unchanged).

        Returns:
            The new version of each table the run changed.

        Raises:
            CommitConflictError: another run committed first; nothing of this
                run is visible and its staged files are removed.
        """
        manifest = [op.to_json() for op in self.ops.values()]
        self.ensure_tables()
        self._check_removed_files_are_listed()
        _crash_point("before-ledger-commit")
        try:
            commit_ledger(
                self.lake.root,
                self.base,
                seq=self.seq,
                job=self.job,
                run_id=self.run_id,
                batch_id=self.batch_id,
                state=state if state is not None else self.state,
                manifest=manifest,
                storage_options=self.lake.storage_options,
            )
        except CommitConflictError:
            self.abort()
            raise
        self.committed = True
        _crash_point("after-ledger-commit")
        entry = self.lake.ledger()
        self.lake._apply_manifest(entry)
        return {name: self.lake.version(name) for name in self.ops}

    def _check_removed_files_are_listed(self) -> None:
        """Every file this run removes is still in its table.

        Another writer (an OPTIMIZE, a DELETE) that rewrote one since the run listed it would keep its rows
        in the file it wrote: removing the old file then deletes nothing. The run is recomputed instead.

        Raises:
            CommitConflictError: a removed file is no longer in its table; this run's staged files are removed.
        """
        for op in self.ops.values():
            if not op.removes:
                continue
            listed = {f.path for f in self.lake.engine.active_files(op.table)}
            gone = [f.path for f in op.removes if f.path not in listed]
            if gone:
                self.abort()
                raise CommitConflictError(
                    f"{len(gone)} file(s) that this {self.job} run removes from {op.table} (first: {gone[0]}) were "
                    "rewritten or removed by another writer since the run listed them (an OPTIMIZE or DELETE "
                    "running meanwhile?); the run is recomputed on the table as it is now"
                )

    def lake_moved(self) -> bool:
        """Whether another run has committed to the ledger since this run read its base."""
        if self.committed:
            return False
        latest = read_ledger(self.lake.root, storage_options=self.lake.storage_options)
        return latest.version != self.base.version

    def abort(self) -> None:
        """Remove this run's staged files (the run was not committed)."""
        if self.committed:
            return
        for name in TABLES:
            self.lake.storage.delete_dir(f"{name}/{STAGING_DIR}/{self.run_id}")


def _crash_point(name: str) -> None:
    """Test hooks at the points where a crash matters.

    ``RMQLAKE_CRASH_AT=<name>`` kills the process here, as ``kill -9`` would;
    ``RMQLAKE_HOLD_AT=<name>:<path>`` waits (up to 5 minutes) until ``path``
    exists, so a test can line two runs up at the same point; while waiting,
    ``<path>.waiting.<pid>`` exists.
    """
    crash = os.environ.get("RMQLAKE_CRASH_AT")
    if crash == name:
        log.error("RMQLAKE_CRASH_AT=%s: exiting abruptly (test hook)", name)
        os._exit(137)
    hold = os.environ.get("RMQLAKE_HOLD_AT", "")
    if hold.startswith(name + ":"):
        flag = hold[len(name) + 1 :]
        log.warning("RMQLAKE_HOLD_AT: waiting at %s for %s (test hook)", name, flag)
        waiting = f"{flag}.waiting.{os.getpid()}"
        with open(waiting, "w"):
            pass
        deadline = time.time() + 300
        while not os.path.exists(flag) and time.time() < deadline:
            time.sleep(0.1)
        os.remove(waiting)


def run_with_retries(lake: Lake, job: str, work: Callable[[LakeRun], dict], *, retries: int, batch_id=None) -> dict:
    """Run ``work`` in a lake run, recomputing on a fresh state after a lost commit race.

    A run reads tables while it works, not all at the start; when another run
    commits meanwhile, those reads can mix two lake states, so whatever the
    run then raises is a symptom of the race, not a fault of its input: it is
    recomputed too. (Nothing mixed can commit: the ledger commit would
    conflict.)
    """
    attempt = 0
    while True:
        run = lake.begin(job, batch_id=batch_id)
        try:
            return work(run)
        except Exception as exc:
            if run.committed:  # decided: a later run rolls it forward; never recompute it
                raise
            run.abort()
            if not isinstance(exc, CommitConflictError) and not run.lake_moved():
                raise
            attempt += 1
            if attempt > retries:
                raise CommitConflictError(
                    f"{job} lost the commit race {attempt} times (lake.commit_retries={retries}); "
                    f"another run keeps committing to {lake.root}. Last conflict: {exc}"
                ) from exc
            log.warning("%s run %s lost a commit race; recomputing on the new lake state (%s)", job, run.run_id, exc)
        except BaseException:
            run.abort()
            raise


_NO_DATA_CHANGE = frozenset({"CREATE TABLE", "VACUUM START", "VACUUM END", "OPTIMIZE"})


def _made_by_rmqlake(commit_info: Mapping[str, Any]) -> bool:
    """Whether a commit carries rmqlake's metadata (a top-level key, or the Delta extension's userMetadata)."""
    return any(key.startswith("rmqlake.") for key in commit_info) or '"rmqlake.' in str(
        commit_info.get("userMetadata") or ""
    )


def _check_staged_columns(table: str, path: str, names: Sequence[str]) -> None:
    """A staged file holds every column of its table but the partition columns (its folders give those).

    Derived columns are computed by the staging writers; a writer of its own that skipped them (or any
    other column) would leave nulls the table's readers cannot tell from missing values.
    """
    spec = table_spec(table)
    missing = [name for name in spec.columns if name not in names and name not in spec.partition_by]
    if missing:
        raise LakeStateError(
            f"staged file {path} of table {table} lacks the columns {', '.join(missing)}; "
            "rows are staged through LakeRun.stage_arrow or spark_io.stage_dataframe, which compute derived columns"
        )


def _table_relative(path: str, table: str) -> str:
    """A fragment path of a table's dataset, relative to the table folder (as in the Delta log)."""
    marker = f"{table}/"
    return path.split(marker, 1)[1] if path.startswith(marker) or f"/{marker}" in path else path


def holds_any(sorted_values: Sequence[int], low, high) -> bool:
    """Whether [low, high] holds one of ``sorted_values`` (unknown bounds: assume it may)."""
    if low is None or high is None:
        return True
    position = bisect.bisect_left(sorted_values, low)
    return position < len(sorted_values) and sorted_values[position] <= high
