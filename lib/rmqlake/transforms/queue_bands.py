"""ConsumeQueue files staged on the executors, one task per band of CQ files, from the units the dispatch saved.

The Spark route (a hash repartition of the units on (topic, queue, CQ file), a sort within partitions and a
partitioned Spark write) is the reference. This one stages the same rows with less work: each dispatch task
saves its units with the band of their CQ file (``unit_bands``, a hash of topic, queue and file number) and
sorted by it, so a band task reads only the row groups of its band from every task's file, sorts them by
(topic, queue, queue offset) and writes one Parquet file per CQ file into the run's staging folder, in the
folders Spark's ``partitionBy`` makes: no shuffle, no JVM rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from rmqlake.formats.javahash import java_string_hashes
from rmqlake.lake.actions import partition_folder
from rmqlake.lake.tables import CONSUMEQUEUE

# The band column a dispatch task adds to the units it saves.
BAND = "band"
# Rows of a saved units row group: a band task decodes the row groups its band's rows are in (a task's units
# are sorted by band, so ~one row group of another band's rows at each end).
UNITS_ROW_GROUP_ROWS = 16_384
# The columns of a staged CQ file: the table's, but the partition columns (its folders give them).
_FILE_COLUMNS = [name for name in CONSUMEQUEUE.schema.names if name not in CONSUMEQUEUE.partition_by]
_FILE_SCHEMA = pa.schema([CONSUMEQUEUE.arrow_schema.field(name) for name in _FILE_COLUMNS])
# One row group per staged file, as Spark's 128 MiB blocks make of a CQ file (300,000 units are ~10 MB).
_FILE_ROW_GROUP_ROWS = 1 << 22


def unit_bands(units: pa.RecordBatch | pa.Table, *, bands: int, units_per_file: int) -> np.ndarray:
    """The band (0 .. ``bands`` - 1) of each unit: a hash of its topic, queue and CQ file number, the same in
    every task, so all units of one CQ file meet in one band task."""
    if units.num_rows == 0:
        return np.zeros(0, np.int32)
    topics = units.column("topic")
    if isinstance(topics, pa.ChunkedArray):
        topics = topics.combine_chunks()
    encoded = pc.dictionary_encode(topics)
    topic_hashes = java_string_hashes(encoded.dictionary).astype(np.uint64)
    topic_of = encoded.indices.to_numpy(zero_copy_only=False)
    queue_ids = units.column("queue_id").to_numpy().astype(np.uint64)
    file_numbers = (units.column("queue_offset").to_numpy() // units_per_file).astype(np.uint64)
    mixed = (topic_hashes[topic_of] * np.uint64(1_000_003) + queue_ids) * np.uint64(1_000_003) + file_numbers
    return (mixed % np.uint64(bands)).astype(np.int32)


def sort_by_band(units: pa.Table) -> pa.Table:
    """Units in band order (within a band the order does not matter: the band task sorts by queue offset)."""
    if units.num_rows == 0:
        return units
    return units.take(pa.array(np.argsort(units.column(BAND).to_numpy(), kind="stable")))


@dataclass(frozen=True)
class QueueBandTarget:
    """What the band tasks of a run read and where they write, relative to the lake root."""

    lake_root: str
    storage_options: dict
    units_dir: str  # the dispatch's saved units (``consumequeue`` rows and their band), each file sorted by band
    staging_dir: str  # the run's staging folder of ``consumequeue``
    run_id: str

    def storage(self):
        from rmqlake.lake.storage import Storage

        return Storage(self.lake_root, self.storage_options)


def _read_band(storage, paths: list[str], band: int) -> pa.Table:
    dataset = ds.dataset([storage.file_path(p) for p in paths], format="parquet", filesystem=storage.fs)
    return dataset.to_table(columns=CONSUMEQUEUE.schema.names, filter=ds.field(BAND) == band)


def cq_file_bounds(units: pa.Table) -> list[tuple[int, int]]:
    """(start, stop) row slices of each CQ file of units sorted by (topic, queue, queue offset)."""
    if units.num_rows == 0:
        return []
    changes = np.zeros(units.num_rows, dtype=bool)
    changes[0] = True
    for name in CONSUMEQUEUE.partition_by:
        column = units.column(name)
        if pa.types.is_string(column.type):
            column = pc.dictionary_encode(column.combine_chunks()).indices
        values = column.to_numpy(zero_copy_only=False) if isinstance(column, pa.Array) else column.to_numpy()
        changes[1:] |= values[1:] != values[:-1]
    starts = np.flatnonzero(changes).tolist()
    return list(zip(starts, [*starts[1:], units.num_rows], strict=True))


def build_band(band: int, *, target: QueueBandTarget) -> list[dict]:
    """Stage the CQ units of ``band``: one file per CQ file, rows in queue offset order; (CQ file, rows) of each.

    Files are written under a hidden name and moved into place (named by band and run): a retried task replaces
    them.
    """
    from rmqlake.ingest.scratch import AtomicParquet

    storage = target.storage()
    unit_files = [f"{target.units_dir}/{entry.path}" for entry in storage.list_files(target.units_dir)]
    unit_files = [path for path in unit_files if path.endswith(".parquet") and "/." not in path]
    if not unit_files:
        return []
    units = _read_band(storage, unit_files, band)
    if units.num_rows == 0:
        return []
    order = pc.sort_indices(units, [("topic", "ascending"), ("queue_id", "ascending"), ("queue_offset", "ascending")])
    units = units.take(order)
    staged = []
    for start, stop in cq_file_bounds(units):
        topic, queue_id, cq_file = (units.column(name)[start].as_py() for name in CONSUMEQUEUE.partition_by)
        folders = "/".join(
            partition_folder(name, None if value is None else str(value))
            for name, value in zip(CONSUMEQUEUE.partition_by, (topic, queue_id, cq_file), strict=True)
        )
        writer = AtomicParquet(
            storage,
            f"{target.staging_dir}/{folders}/part-{band:05d}-{target.run_id}.parquet",
            row_group_size=_FILE_ROW_GROUP_ROWS,
            compression="snappy",
        )
        writer.write(units.slice(start, stop - start).select(_FILE_COLUMNS).cast(_FILE_SCHEMA))
        writer.close()
        staged.append({"topic": topic, "queue_id": queue_id, "cq_file": cq_file, "units": stop - start})
    return staged
