"""Lake runs racing each other, in one process (real delta-rs tables, no Spark).

The process-level race (two ingest processes) is in tests/e2e; here each
interleaving is forced exactly.
"""

import pyarrow as pa
import pytest

from rmqlake.errors import CommitConflictError
from rmqlake.lake import Lake, run_with_retries
from rmqlake.lake.state import LakeState, ReputState
from rmqlake.lake.tables import INGEST_FILES


def _commit_one_file(lake: Lake, path: str) -> None:
    """A whole run of another job: one ingest_files row, committed."""
    run = lake.begin("other")
    row = {name: None for name in INGEST_FILES.columns} | {"path": path, "size_bytes": 1, "batch_id": path}
    run.stage_arrow("ingest_files", pa.Table.from_pylist([row]), mode="append")
    run.commit(state=LakeState(reput=ReputState(dispatched_offset=len(path))))


def test_an_error_raised_while_another_run_committed_is_a_lost_race(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    seen = []

    def work(run):
        seen.append((run.base.seq, run.state.dispatched_offset))
        if len(seen) == 1:
            # another run commits while this one works; this one then trips over the mixed state
            _commit_one_file(Lake(str(tmp_path / "lake")), "concurrent")
            raise ValueError("batch wrote to segment 00000000000000393216, which is sealed")
        run.commit()
        return {"seq": run.seq}

    result = run_with_retries(lake, "ingest", work, retries=2)

    assert seen == [(0, 0), (1, len("concurrent"))]
    assert result == {"seq": 2}
    assert lake.ledger().seq == 2


def test_an_error_without_a_concurrent_commit_is_raised_at_once(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    attempts = []

    def work(run):
        attempts.append(run.run_id)
        run.stage_arrow("ingest_files", INGEST_FILES.arrow_schema.empty_table(), mode="append")
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        run_with_retries(lake, "ingest", work, retries=2)
    assert len(attempts) == 1
    assert not (tmp_path / "lake" / "ingest_files" / "_staging" / attempts[0]).exists()


def test_a_run_that_keeps_losing_stops_after_the_configured_retries(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    attempts = []

    def work(run):
        attempts.append(run.base.seq)
        _commit_one_file(Lake(str(tmp_path / "lake")), f"concurrent-{len(attempts)}")
        run.commit()

    with pytest.raises(CommitConflictError, match=r"lost the commit race 3 times \(lake.commit_retries=2\)"):
        run_with_retries(lake, "ingest", work, retries=2)
    assert attempts == [0, 1, 2]
    assert lake.ledger().seq == 3


def test_files_of_a_partition_value_with_percent_signs_can_be_removed(tmp_path):
    """%RETRY% topics: Spark escapes '%' in folder names and the Delta log URI-encodes the path again."""
    import pyarrow.parquet as pq

    from rmqlake.lake.actions import DataFile
    from rmqlake.lake.deltars import DeltaRsEngine
    from rmqlake.lake.tables import CONSUMEQUEUE

    engine = DeltaRsEngine(str(tmp_path / "lake"))
    relative = "topic=%25RETRY%25cg_a/queue_id=0/cq_file=00000000000000000000/part-0.parquet"
    path = tmp_path / "lake" / "consumequeue" / relative
    path.parent.mkdir(parents=True)
    columns = [c for c in CONSUMEQUEUE.columns if c not in CONSUMEQUEUE.partition_by]
    pq.write_table(CONSUMEQUEUE.arrow_schema.empty_table().select(columns), path)
    added = DataFile(
        path=relative,
        size=path.stat().st_size,
        partition_values={"topic": "%RETRY%cg_a", "queue_id": "0", "cq_file": "00000000000000000000"},
        modification_time=0,
    )
    engine.commit_files(CONSUMEQUEUE, adds=[added], app_transactions={}, metadata={})

    (active,) = engine.active_files("consumequeue")
    assert active.path == relative and active.partition_values["topic"] == "%RETRY%cg_a"
    assert engine.file_stats("consumequeue", ["queue_offset"])[0]["path"] == relative
    engine.commit_files(CONSUMEQUEUE, adds=[], removes=[active], app_transactions={}, metadata={})
    assert engine.active_files("consumequeue") == []


def test_a_run_whose_removed_file_another_writer_rewrote_is_recomputed(tmp_path):
    """An OPTIMIZE between a run's listing and its commit: removing the listed file would delete nothing."""
    from deltalake import DeltaTable

    for path in ("a", "b"):
        _commit_one_file(Lake(str(tmp_path / "lake")), path)
    lake = Lake(str(tmp_path / "lake"))
    attempts = []

    def work(run):
        listed = lake.engine.active_files("ingest_files")
        attempts.append(len(listed))
        if len(attempts) == 1:
            DeltaTable(str(tmp_path / "lake" / "ingest_files")).optimize.compact()  # two files become one
        run.remove("ingest_files", listed)
        run.commit()
        return {"seq": run.seq}

    assert run_with_retries(lake, "expire", work, retries=2) == {"seq": 3}
    assert attempts == [2, 1]  # recomputed on the compacted file
    assert DeltaTable(str(tmp_path / "lake" / "ingest_files")).to_pyarrow_table().num_rows == 0
