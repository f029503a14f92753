"""The lake ledger: one small Delta table that is the commit point of every run.

Delta commits are atomic per table, and a run changes several tables. So a
run first writes all its files to staging, then commits ONE ledger row
holding (a) the new lake state (write offsets, queue heads, dispatch
positions, ...) and (b) a manifest of the table commits that make the run
visible. Only then are the table commits made, each tagged with the app
transaction ``rmqlake.ledger = seq``.

* Nothing of a run is visible before its ledger commit; a run killed before
  it leaves only staged files, which are removed later.
* After its ledger commit a run is decided: any later run first "rolls
  forward" a manifest whose table commits are missing (each table's app
  transaction tells which are), so the result equals an uninterrupted run.
* The ledger commit overwrites the ledger's single file; two runs that
  started from the same ledger version both remove that file, so Delta's
  conflict check lets exactly one of them commit. The loser recomputes on
  the new state or fails with a clear message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from rmqlake.errors import CommitConflictError, LakeStateError
from rmqlake.lake.state import LakeState

LEDGER_TABLE = "_rmqlake_ledger"
LEDGER_APP_ID = "rmqlake.ledger"
LEDGER_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("job", pa.string()),
        ("run_id", pa.string()),
        ("batch_id", pa.string()),
        ("committed_at", pa.timestamp("us", tz="UTC")),
        ("state", pa.string()),
        ("manifest", pa.string()),
    ]
)


@dataclass
class LedgerEntry:
    """The ledger as read at ``version`` (``None``: no run has committed yet)."""

    seq: int = 0
    version: int | None = None
    job: str | None = None
    run_id: str | None = None
    batch_id: str | None = None
    committed_at: datetime | None = None
    state: LakeState = field(default_factory=LakeState)
    manifest: list[dict[str, Any]] = field(default_factory=list)
    handle: DeltaTable | None = None


def read_ledger(
    root: str, *, storage_options: dict[str, str] | None = None, create: bool = False, version: int | None = None
) -> LedgerEntry:
    """The latest ledger entry (a fresh lake gives seq 0 and an empty state).

    With ``create``, a missing ledger is created empty first, so that the
    entry carries a snapshot to commit against: a commit must be based on
    the version that was read, or a concurrent run could go unnoticed.
    """
    uri = f"{root}/{LEDGER_TABLE}"
    try:
        dt = DeltaTable(uri, version=version, storage_options=storage_options or None)
    except TableNotFoundError:
        if not create:
            return LedgerEntry()
        try:
            DeltaTable.create(uri, LEDGER_SCHEMA, mode="ignore", storage_options=storage_options or None)
        except Exception:  # created concurrently by another run
            if not DeltaTable.is_deltatable(uri, storage_options=storage_options or None):
                raise
        dt = DeltaTable(uri, storage_options=storage_options or None)
    rows = dt.to_pyarrow_table().to_pylist()
    if not rows:
        return LedgerEntry(version=dt.version(), handle=dt)
    row = max(rows, key=lambda r: r["seq"])
    return LedgerEntry(
        seq=row["seq"],
        version=dt.version(),
        job=row["job"],
        run_id=row["run_id"],
        batch_id=row["batch_id"],
        committed_at=row["committed_at"],
        state=LakeState.from_json(json.loads(row["state"])),
        manifest=json.loads(row["manifest"]),
        handle=dt,
    )


def commit_ledger(
    root: str,
    base: LedgerEntry,
    *,
    seq: int,
    job: str,
    run_id: str,
    batch_id: str | None,
    state: LakeState,
    manifest: list[dict[str, Any]],
    storage_options: dict[str, str] | None = None,
) -> int:
    """Overwrite the ledger with the next entry, based on the snapshot ``base`` was read from.

    Raises:
        CommitConflictError: another run committed to the ledger since ``base`` was read.
    """
    row = pa.table(
        {
            "seq": [seq],
            "job": [job],
            "run_id": [run_id],
            "batch_id": [batch_id],
            "committed_at": [datetime.now(UTC)],
            "state": [json.dumps(state.to_json(), sort_keys=True)],
            "manifest": [json.dumps(manifest, sort_keys=True)],
        },
        schema=LEDGER_SCHEMA,
    )
    if base.handle is None or base.version is None:
        raise ValueError("commit_ledger needs the ledger snapshot the run started from (read_ledger(create=True))")
    properties = CommitProperties(
        app_transactions=[Transaction(LEDGER_APP_ID, seq)],
        custom_metadata={"rmqlake.job": job, "rmqlake.run_id": run_id},
    )
    try:
        write_deltalake(
            base.handle,
            row,
            mode="overwrite",
            storage_options=storage_options or None,
            commit_properties=properties,
        )
    except CommitFailedError as exc:
        raise CommitConflictError(
            f"another run committed to the lake while {job} run {run_id} was working (ledger seq {base.seq}); "
            f"its work was not committed: {exc}"
        ) from exc
    entry = read_ledger(root, storage_options=storage_options)
    if entry.version != base.version + 1 or entry.run_id != run_id:
        # Cannot happen while Delta's conflict check works; never continue on a stale state.
        raise LakeStateError(
            f"ledger version {entry.version} (run {entry.run_id}) follows {base.version} after run {run_id} "
            "committed: another run committed in between without a conflict; inspect the lake before going on"
        )
    return entry.version
