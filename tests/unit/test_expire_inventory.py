"""Expiry's inventory of CQ files from the consumequeue table's Delta log (real delta-rs tables, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqlake.errors import CheckFailedError
from rmqlake.lake import Lake
from rmqlake.lake.actions import DataFile
from rmqlake.lake.tables import CONSUMEQUEUE
from rmqlake.steps.expire import _queue_files

CQ_FILE = "00000000000000001280"


def _add_file(lake: Lake, units: list[tuple[int, int]], *, name: str, stats: str = "{}") -> None:
    """One data file of CQ file ``CQ_FILE`` of queue OrderEvents/0 holding (queue_offset, commitlog_offset) units,
    committed with the statistics ``stats`` (``{}``: none, as a writer that collects none leaves it)."""
    relative = f"topic=OrderEvents/queue_id=0/cq_file={CQ_FILE}/{name}.parquet"
    path = Path(lake.storage.file_path(f"consumequeue/{relative}"))
    columns = [c for c in CONSUMEQUEUE.columns if c not in CONSUMEQUEUE.partition_by]
    rows = [
        {"queue_offset": q, "commitlog_offset": c, "size": 100, "tags_code": 0, "store_timestamp": 0} for q, c in units
    ]
    data = pa.Table.from_pylist(rows, schema=CONSUMEQUEUE.arrow_schema.empty_table().select(columns).schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, path)
    added = DataFile(
        path=relative,
        size=path.stat().st_size,
        partition_values={"topic": "OrderEvents", "queue_id": "0", "cq_file": CQ_FILE},
        stats=stats,
    )
    lake.engine.commit_files(CONSUMEQUEUE, adds=[added], app_transactions={}, metadata={})


def test_a_cq_file_s_bounds_come_from_the_parquet_footer_when_the_log_has_no_statistics(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    _add_file(lake, [(64, 5000), (65, 5100), (66, 5200)], name="a")
    _add_file(lake, [(67, 5300)], name="b")
    queue = _queue_files(lake)[("OrderEvents", 0)]
    assert queue.first_unit_offset == {CQ_FILE: 5000} and queue.last_unit_offset == {CQ_FILE: 5300}
    assert queue.min_queue_offset == {CQ_FILE: 64} and queue.max_queue_offset == 67
    assert len(queue.files[CQ_FILE]) == 2


def test_a_file_without_statistics_anywhere_is_refused_naming_it(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    _add_file(lake, [(64, 5000)], name="a")
    path = lake.storage.file_path(f"consumequeue/topic=OrderEvents/queue_id=0/cq_file={CQ_FILE}/a.parquet")
    table = pq.read_table(path)
    pq.write_table(table, path, write_statistics=False)
    with pytest.raises(CheckFailedError, match=rf"consumequeue data file .*cq_file={CQ_FILE}/a.parquet has no min/max"):
        _queue_files(lake)
