"""IndexFile entries built on the executors, one task per band of hash slots, from the keys the dispatch saved.

The Spark route (``reput.number_entries``, a range repartition on (file, slot), ``reput.chain_entries``' window,
a sort and a Spark write) is the reference, and the route for keys numbered by a global sort. This one gives the
same rows with less work: the dispatch tasks save their keys sorted by slot, so each band task reads only the
row groups of its band from every task's file; it numbers the keys from their run's first ordinal, sorts them by
(file, slot, entry number), links each entry to the previous one of its slot (seeded for the open file by that
file's last entry per slot, read from the files covering the band), and writes one Parquet file per index file
into the run's staging folder. Its header fields come back, a few rows a task: no shuffle, no sampling job, no
window, no read-back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from rmqlake.formats.javahash import INT_MAX
from rmqlake.lake.tables import INDEXFILE
from rmqlake.transforms.reput import IndexPlan

# Rows of a staged index row group: what Spark's 512 KiB row groups of these columns hold (~1 ms to decode for a
# key lookup, which decodes one row group of each index file for its slot).
INDEX_ROW_GROUP_ROWS = 10_240
# The columns of a staged file: the table's, but the partition column (its folder gives it).
_FILE_SCHEMA = pa.schema([field for field in INDEXFILE.arrow_schema if field.name not in INDEXFILE.partition_by])
_KEY_COLUMNS = ["topic", "physical_offset", "store_timestamp", "key_hash", "slot", "run_start", "local_no"]


@dataclass(frozen=True)
class OpenFilePart:
    """A data file of the open index file: where it is, relative to the lake root, and its slot range."""

    path: str
    min_slot: int | None
    max_slot: int | None


@dataclass(frozen=True)
class IndexBandTarget:
    """What the band tasks of a run read and where they write, relative to the lake root."""

    lake_root: str
    storage_options: dict
    keys_dir: str  # the dispatch's saved keys (``reput.DISPATCHED_KEYS``), each file sorted by slot
    staging_dir: str  # the run's staging folder of ``indexfile``
    run_id: str
    slots: int
    bands: int
    open_file_parts: tuple[OpenFilePart, ...] = ()

    def storage(self):
        from rmqlake.lake.storage import Storage

        return Storage(self.lake_root, self.storage_options)

    def band_slots(self, band: int) -> tuple[int, int]:
        """The band's slots: [low, high)."""
        return band * self.slots // self.bands, (band + 1) * self.slots // self.bands


def run_ordinals(run_start: np.ndarray, local_no: np.ndarray, run_firsts: Mapping[int, int]) -> np.ndarray:
    """Each key's ordinal: its run's first ordinal (``run_firsts``: run start -> first) plus its place in it."""
    starts = np.array(sorted(run_firsts), dtype=np.int64)
    firsts = np.array([run_firsts[start] for start in starts.tolist()], dtype=np.int64)
    where = np.searchsorted(starts, run_start)
    if len(run_start) and (where.max() >= len(starts) or not np.array_equal(starts[where], run_start)):
        raise RuntimeError("saved index keys name a key run the dispatch did not report")
    return firsts[where] + local_no.astype(np.int64)


def number_entries(ordinal: np.ndarray, store_timestamp: np.ndarray, plan: IndexPlan):
    """(file number: 0 the open file, 1.. new ones; entry number; time diff) of each key, as
    ``reput.number_entries`` gives them."""
    open_entries = plan.open_file.entries if plan.open_file else 0
    in_open = ordinal < plan.room
    rest = ordinal - plan.room
    file_no = np.where(in_open, 0, np.floor_divide(rest, plan.per_file) + 1)
    index_no = np.where(in_open, ordinal + open_entries + 1, np.mod(rest, plan.per_file) + 1)
    begins = np.array([plan.open_file.begin_timestamp if plan.open_file else 0, *plan.new_file_begin], np.int64)
    previous_ends = np.array([0, *plan.new_file_previous_end], dtype=np.int64)
    # The first key of a new file is timed from the previous file's end; no base before any file.
    first_of_new = (file_no > 0) & (index_no == 1)
    time_base = np.where(first_of_new, previous_ends[file_no], begins[file_no])
    elapsed = store_timestamp - time_base
    seconds = np.where(elapsed < 0, -((-elapsed) // 1000), elapsed // 1000)  # Java long division: toward zero
    time_diff = np.where(time_base <= 0, 0, np.clip(seconds, 0, INT_MAX))
    return file_no.astype(np.int64), index_no.astype(np.int32), time_diff.astype(np.int32)


def last_entry_per_slot(slot: np.ndarray, index_no: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slots in order, the largest entry number of each) of existing entries, by a sort: the reference of
    ``band_slot_heads``."""
    if not len(slot):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.lexsort((index_no, slot))
    slot, index_no = slot[order], index_no[order]
    last = np.flatnonzero(np.append(slot[1:] != slot[:-1], True))
    return slot[last].astype(np.int64), index_no[last].astype(np.int64)


def band_slot_heads(slot: np.ndarray, index_no: np.ndarray, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """``last_entry_per_slot`` of entries whose slots are all in [low, high), in one pass without a sort.

    The open index file's entries are read every run for the chain seeds and grow to 20 M before the file
    rolls; sorting them made reput slower as the file filled (~6 s of a core at 12 M entries), while the
    largest entry number per slot over a dense array of the band's slots costs ~0.05 µs an entry (the array
    takes 8 bytes a slot: 40 MB for a band of all 5 M slots).
    """
    if not len(slot):
        return last_entry_per_slot(np.empty(0, np.int64), np.empty(0, np.int64))
    slot = np.asarray(slot, dtype=np.int64)
    if int(slot.min()) < low or int(slot.max()) >= high:
        raise ValueError(f"index entries outside the slots [{low}, {high}) they were read for")
    unset = np.iinfo(np.int64).min  # no entry number is this small: it marks the slots without entries
    heads = np.full(high - low, unset, dtype=np.int64)
    np.maximum.at(heads, slot - low, np.asarray(index_no, dtype=np.int64))  # same dtypes: NumPy's fast path
    present = np.flatnonzero(heads != unset)
    return present + low, heads[present]


def chain(file_no: np.ndarray, slot: np.ndarray, index_no: np.ndarray, seeds: tuple[np.ndarray, np.ndarray]):
    """(row order by file, slot and entry number; ``prev_index`` of each row in that order): the previous entry
    of the same file and slot, or for a slot's first entry in the open file (file 0) its last entry there
    before this run (``seeds``: ``last_entry_per_slot`` of the open file), else 0."""
    order = np.lexsort((index_no, slot, file_no))
    file_no, slot, index_no = file_no[order], slot[order], index_no[order]
    previous = np.zeros(len(order), dtype=np.int64)
    same = np.zeros(len(order), dtype=bool)
    same[1:] = (file_no[1:] == file_no[:-1]) & (slot[1:] == slot[:-1])
    previous[1:] = index_no[:-1]
    seed_slots, seed_entries = seeds
    if len(seed_slots):
        where = np.minimum(np.searchsorted(seed_slots, slot), len(seed_slots) - 1)
        seeded = (file_no == 0) & (seed_slots[where] == slot)
        previous = np.where(~same & seeded, seed_entries[where], previous)
        same |= seeded
    return order, np.where(same, previous, 0).astype(np.int32)


def header_parts(names: Sequence[str], file_no, index_no, prev_index, store_timestamp, phy_offset) -> list[dict]:
    """``reput.header_aggregates``' fields per index file, over some of its entries (rows in entry order within
    each file), to combine with ``combine_header_parts``."""
    parts = []
    for number in np.unique(file_no).tolist():
        rows = np.flatnonzero(file_no == number)
        first = rows[np.argmin(index_no[rows])]
        last = rows[np.argmax(index_no[rows])]
        parts.append(
            {
                "index_file": names[number],
                "first_timestamp": int(store_timestamp[first]),
                "first_phy_offset": int(phy_offset[first]),
                "last_timestamp": int(store_timestamp[last]),
                "last_phy_offset": int(phy_offset[last]),
                "new_slots": int(np.count_nonzero(prev_index[rows] == 0)),
                "last_index_no": int(index_no[last]),
                "first_index_no": int(index_no[first]),
            }
        )
    return parts


def combine_header_parts(parts: Iterable[Mapping]) -> list[dict]:
    """``header_parts`` of several tasks as one row per index file (``reput.header_aggregates``' rows)."""
    combined: dict[str, dict] = {}
    for part in parts:
        row = combined.get(part["index_file"])
        if row is None:
            combined[part["index_file"]] = dict(part)
            continue
        if part["first_index_no"] < row["first_index_no"]:
            row.update({k: part[k] for k in ("first_timestamp", "first_phy_offset", "first_index_no")})
        if part["last_index_no"] > row["last_index_no"]:
            row.update({k: part[k] for k in ("last_timestamp", "last_phy_offset", "last_index_no")})
        row["new_slots"] += part["new_slots"]
    return [combined[name] for name in sorted(combined)]


def _read_band(storage, paths: Sequence[str], columns: list[str], low: int, high: int) -> pa.Table:
    """Rows of ``paths`` with a slot in [low, high): row groups whose slot statistics miss it are not read."""
    dataset = ds.dataset([storage.file_path(p) for p in paths], format="parquet", filesystem=storage.fs)
    return dataset.to_table(columns=columns, filter=(ds.field("slot") >= low) & (ds.field("slot") < high))


def open_file_seeds(target: IndexBandTarget, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """``last_entry_per_slot`` of the open index file's entries in slots [low, high) (``band_slot_heads``)."""
    parts = [
        part.path
        for part in target.open_file_parts
        if part.min_slot is None or part.max_slot is None or (part.min_slot < high and part.max_slot >= low)
    ]
    if not parts:
        return last_entry_per_slot(np.empty(0, np.int64), np.empty(0, np.int64))
    existing = _read_band(target.storage(), parts, ["slot", "index_no"], low, high)
    return band_slot_heads(existing.column("slot").to_numpy(), existing.column("index_no").to_numpy(), low, high)


def build_band(band: int, *, target: IndexBandTarget, plan: IndexPlan) -> list[dict]:
    """Stage the index entries of the keys in ``band``'s slots, one file per index file; their ``header_parts``.

    Files are written under a hidden name and moved into place (named by band): a retried task replaces them.
    """
    from rmqlake.ingest.scratch import AtomicParquet

    storage = target.storage()
    low, high = target.band_slots(band)
    key_files = [f"{target.keys_dir}/{entry.path}" for entry in storage.list_files(target.keys_dir)]
    key_files = [path for path in key_files if path.endswith(".parquet") and "/." not in path]
    keys = _read_band(storage, key_files, _KEY_COLUMNS, low, high) if key_files else None
    if keys is None or keys.num_rows == 0:
        return []
    ordinal = run_ordinals(
        keys.column("run_start").to_numpy(), keys.column("local_no").to_numpy(), plan.partition_starts
    )
    timestamps = keys.column("store_timestamp").to_numpy()
    file_no, index_no, time_diff = number_entries(ordinal, timestamps, plan)
    no_seeds = last_entry_per_slot(np.empty(0, np.int64), np.empty(0, np.int64))
    seeds = open_file_seeds(target, low, high) if plan.open_file is not None and plan.room > 0 else no_seeds
    order, prev_index = chain(file_no, keys.column("slot").to_numpy(), index_no, seeds)
    file_no, index_no, time_diff = file_no[order], index_no[order], time_diff[order]
    rows = keys.take(pa.array(order))
    names = [plan.open_file.name if plan.open_file else "", *plan.new_files]
    entries = pa.table(
        {
            "index_no": index_no,
            "key_hash": rows.column("key_hash"),
            "slot": rows.column("slot"),
            "phy_offset": rows.column("physical_offset"),
            "time_diff": time_diff,
            "prev_index": prev_index,
            "topic": rows.column("topic"),
            "store_timestamp": rows.column("store_timestamp"),
        }
    ).cast(_FILE_SCHEMA)
    bounds = np.flatnonzero(np.diff(file_no)) + 1  # rows are in file order
    for start, stop in zip([0, *bounds.tolist()], [*bounds.tolist(), len(file_no)], strict=True):
        name = names[int(file_no[start])]
        writer = AtomicParquet(
            storage,
            f"{target.staging_dir}/index_file={name}/part-{band:05d}-{target.run_id}.parquet",
            row_group_size=INDEX_ROW_GROUP_ROWS,
            compression="snappy",
        )
        writer.write(entries.slice(start, stop - start))
        writer.close()
    return header_parts(
        names,
        file_no,
        index_no,
        prev_index,
        entries.column("store_timestamp").to_numpy(),
        entries.column("phy_offset").to_numpy(),
    )
