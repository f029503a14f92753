"""The CQ band tasks (``queue_bands``) and the partition folders they write, against Spark's own."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqlake.lake.actions import partition_folder, partition_values_from_path
from rmqlake.lake.storage import Storage
from rmqlake.lake.tables import CONSUMEQUEUE
from rmqlake.transforms import queue_bands as QB

pytestmark = pytest.mark.spark

UNITS_PER_FILE = 5
# Values Spark escapes in a folder name and some it leaves alone (RocketMQ topics allow %, | and -).
AWKWARD = ["%RETRY%cg", "a=b", "sl/ash", "co:lon", "q?#*", "br[ac]e{s}^", "quo'te\"", "back\\slash", "tab\tend",
           "del\x7f", "pipe|dash-under_", "ünï", "sp ace", ""]  # fmt: skip


def test_partition_folders_are_the_ones_spark_writes(spark, tmp_path):
    frame = spark.createDataFrame([(value, i) for i, value in enumerate(AWKWARD)], "topic string, n int")
    frame.write.partitionBy("topic").parquet(str(tmp_path / "out"))
    written = {p.parent.name for p in (tmp_path / "out").rglob("*.parquet")}
    assert written == {partition_folder("topic", value) for value in AWKWARD}
    for value in AWKWARD:
        folder = partition_folder("topic", value)
        assert partition_values_from_path(f"{folder}/x.parquet") == {"topic": value or None}


def _units(rng: random.Random, count: int) -> pa.Table:
    """Units of a few queues in random order, their queue offsets unique per queue."""
    rows = []
    next_offset: dict[tuple[str, int], int] = {}
    for n in range(count):
        topic, queue = rng.choice(["OrderEvents", "%RETRY%cg", "a=b"]), rng.randrange(3)
        offset = next_offset.get((topic, queue), 0)
        next_offset[(topic, queue)] = offset + 1
        rows.append(
            {
                "topic": topic,
                "queue_id": queue,
                "queue_offset": offset,
                "commitlog_offset": 100 * n,
                "size": 100,
                "tags_code": rng.randrange(-(2**31), 2**31),
                "store_timestamp": 1_795_000_000_000 + n,
                "cq_file": f"{offset // UNITS_PER_FILE * UNITS_PER_FILE * 20:020d}",
            }
        )
    rng.shuffle(rows)
    return pa.Table.from_pylist(rows, schema=CONSUMEQUEUE.arrow_schema)


@pytest.mark.parametrize("bands", [1, 3, 8])
def test_band_tasks_stage_one_file_per_cq_file_in_queue_offset_order(tmp_path: Path, bands):
    rng = random.Random(bands)
    units = _units(rng, 240)
    storage = Storage(str(tmp_path))
    # two dispatch tasks' saved units, each sorted by band in row groups of 16 rows
    for part, piece in enumerate((units.slice(0, 100), units.slice(100))):
        band = QB.unit_bands(piece, bands=bands, units_per_file=UNITS_PER_FILE)
        assert band.min() >= 0 and band.max() < bands
        saved = QB.sort_by_band(piece.append_column(QB.BAND, pa.array(band, pa.int32())))
        (tmp_path / "units").mkdir(exist_ok=True)
        pq.write_table(saved, tmp_path / "units" / f"part-{part:05d}.parquet", row_group_size=16)
    target = QB.QueueBandTarget(str(tmp_path), {}, "units", "staging", "run1")
    staged = [row for band in range(bands) for row in QB.build_band(band, target=target)]
    assert sum(row["units"] for row in staged) == units.num_rows
    got = []
    for entry in storage.list_files("staging"):
        values = partition_values_from_path(entry.path)
        table = pq.read_table(tmp_path / "staging" / entry.path)
        assert table.column_names == [n for n in CONSUMEQUEUE.schema.names if n not in CONSUMEQUEUE.partition_by]
        offsets = table.column("queue_offset").to_numpy()
        assert np.all(np.diff(offsets) == 1)  # the whole CQ file, in order
        got += [{**values, "queue_id": int(values["queue_id"]), **row} for row in table.to_pylist()]
    assert len({(r["topic"], r["queue_id"], r["cq_file"]) for r in got}) == len(storage.list_files("staging"))
    key = lambda r: (r["topic"], r["queue_id"], r["queue_offset"])  # noqa: E731
    assert sorted(got, key=key) == sorted(units.to_pylist(), key=key)


def test_a_cq_file_s_units_meet_in_one_band_whichever_task_saved_them():
    units = _units(random.Random(7), 300)
    whole = QB.unit_bands(units, bands=5, units_per_file=UNITS_PER_FILE)
    halves = np.concatenate([QB.unit_bands(units.slice(0, 150), bands=5, units_per_file=UNITS_PER_FILE),
                             QB.unit_bands(units.slice(150), bands=5, units_per_file=UNITS_PER_FILE)])  # fmt: skip
    assert np.array_equal(whole, halves)
    files = {}
    for row, band in zip(units.to_pylist(), whole.tolist(), strict=True):
        assert files.setdefault((row["topic"], row["queue_id"], row["cq_file"]), band) == band
    assert len(set(whole.tolist())) > 1
