"""Reput: dispatch CommitLog rows to ConsumeQueue units and IndexFile entries.

The broker's ReputMessageService dispatches one record at a time. Here:

* ConsumeQueue units need nothing sequential (queue offsets were assigned
  at ingest): one row per NOT_TYPE/COMMIT message, tagsCode as the broker computes it.
* IndexFile entries are numbered in dispatch order (physical offset, then
  the key's position in the message). One pass (``dispatch``) gives the units,
  the keys numbered within each run of contiguous commitlog records, and one
  small row per run with its key count: prefix sums of the counts, in offset
  order, give each run its first ordinal, which fixes each entry's file and
  entry number. (Should runs overlap, ``order_keys`` numbers the keys by a
  global range sort instead.) ``prev_index`` is the previous entry of the same
  file and slot, seeded for the open file by its last entry per slot: built by
  one task per band of slots (``index_bands``), or by a window after a global sort.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.consumequeue import DEFAULT_DELAY_TABLE, SCHEDULE_TOPIC, cq_file_name, dispatch_tags_code
from rmqlake.formats.indexfile import capacity, indexed, next_file_name
from rmqlake.formats.javahash import INT_MAX, index_key_hashes, java_string_hashes
from rmqlake.formats.properties import KEY_SEPARATOR
from rmqlake.formats.record import consumes_queue_offsets
from rmqlake.lake.tables import COMMITLOG, CONSUMEQUEUE, columns
from rmqlake.transforms import queue_bands as QB

DISPATCH_COLUMNS = [
    "physical_offset",
    "total_size",
    "sys_flag",
    "store_timestamp",
    "topic",
    "queue_id",
    "queue_offset",
    "tags",
    "uniq_key",
    "keys_property",
    "delay_property",
]
_COMMITLOG_TYPES = {field.name: field.type for field in COMMITLOG.arrow_schema}


def dispatch_requests(commitlog):
    """What the dispatchers read of each record (the broker's DispatchRequest): no body, two properties."""
    from pyspark.sql import functions as F

    return commitlog.select(
        *[c for c in DISPATCH_COLUMNS if not c.endswith("_property")],
        F.element_at("properties", F.lit("KEYS")).alias("keys_property"),
        F.element_at("properties", F.lit("DELAY")).alias("delay_property"),
    )


# The units a dispatch computes are the consumequeue table's rows.
_CQ_SCHEMA = CONSUMEQUEUE.arrow_schema


def cq_units_of_batch(
    batch: pa.RecordBatch, *, units_per_file: int, delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE
) -> pa.RecordBatch:
    """CQ units of the dispatchable messages of one Arrow batch of commitlog rows.

    Column-wise: tagsCode is the TAGS hash (``java_string_hashes``) except on
    the delay topic, whose rows (rare) go one by one through
    ``dispatch_tags_code`` with the broker's ``delay_levels``; each distinct CQ file is named once.
    """
    flags = batch.column("sys_flag").to_numpy(zero_copy_only=False)
    batch = batch.filter(pa.array(consumes_queue_offsets(flags)))
    codes = java_string_hashes(batch.column("tags")).astype(np.int64)
    on_delay_topic = pc.fill_null(pc.equal(batch.column("topic"), SCHEDULE_TOPIC), False).to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(on_delay_topic).tolist():
        topic, tags, stored, delay = (
            batch.column(name)[row].as_py() for name in ("topic", "tags", "store_timestamp", "delay_property")
        )
        props = {} if delay is None else {"DELAY": delay}
        try:
            codes[row] = dispatch_tags_code(topic, tags, props, stored, delay_levels=delay_levels)
        except ValueError:  # a non-numeric DELAY on the delay topic: the broker cannot parse it either
            codes[row] = dispatch_tags_code(topic, tags, {}, stored, delay_levels=delay_levels)
    queue_offsets = batch.column("queue_offset").to_numpy(zero_copy_only=False)
    file_numbers = queue_offsets // units_per_file
    distinct, first, inverse = np.unique(file_numbers, return_index=True, return_inverse=True)
    names = pa.array([cq_file_name(int(queue_offsets[i]), units_per_file) for i in first.tolist()], pa.string())
    return pa.RecordBatch.from_arrays(
        [
            batch.column("topic"),
            batch.column("queue_id"),
            batch.column("queue_offset"),
            batch.column("physical_offset"),
            batch.column("total_size"),
            pa.array(codes, pa.int64()),
            batch.column("store_timestamp"),
            pc.take(names, pa.array(inverse)) if len(distinct) else pa.array([], pa.string()),
        ],
        schema=_CQ_SCHEMA,
    )


def consume_queue_units(messages, *, units_per_file: int, delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE):
    """One CQ unit per NOT_TYPE/COMMIT message (``consumequeue`` rows); ``delay_levels``: the broker's
    ``messageDelayLevel`` as {level: ms}, which the delay topic's tagsCode reads."""

    def units(batches):
        for batch in batches:
            yield cq_units_of_batch(batch, units_per_file=units_per_file, delay_levels=delay_levels)

    return messages.select(*DISPATCH_COLUMNS).mapInArrow(units, CONSUMEQUEUE.spark_schema)


# One index key of a message, before the keys are grouped into IndexFiles.
INDEX_KEYS = columns(
    ("physical_offset", "bigint", "the message's physical offset in the CommitLog"),
    ("key_pos", "int", "the key's position among the message's index keys (UNIQ_KEY, then KEYS)"),
    ("store_timestamp", "bigint", "the message's storeTimestamp, epoch milliseconds"),
    ("topic", "string", "the message's topic"),
    ("key_hash", "int", "abs(String.hashCode) of topic#key"),
    ("slot", "int", "the hash slot: key_hash % hashSlotNum"),
)
_KEYS_SCHEMA = INDEX_KEYS.arrow_schema


def index_keys_of_batch(batch: pa.RecordBatch, *, slots: int) -> pa.RecordBatch:
    """One row per index key of each indexed message, in the broker's key order (``message_index_keys``):
    ``topic#UNIQ_KEY`` (position 0 when present), then ``topic#token`` per non-empty KEYS token. Column-wise."""
    flags = batch.column("sys_flag").to_numpy(zero_copy_only=False)
    batch = batch.filter(pa.array(indexed(flags)))
    rows = np.arange(batch.num_rows)
    has_uniq = batch.column("uniq_key").is_valid().to_numpy(zero_copy_only=False)
    # KEYS tokens: split on spaces, empty tokens dropped (split_keys)
    tokens = pc.split_pattern(batch.column("keys_property"), KEY_SEPARATOR)
    token_rows = pc.list_parent_indices(tokens).to_numpy(zero_copy_only=False)
    token_values = pc.list_flatten(tokens)
    kept = pc.not_equal(token_values, "").to_numpy(zero_copy_only=False)
    token_rows, token_values = token_rows[kept], token_values.filter(pa.array(kept))
    token_positions = _ranks_in_order(token_rows) + has_uniq[token_rows].astype(np.int64)
    uniq_rows = rows[has_uniq]
    message_of = np.concatenate([uniq_rows, token_rows]).astype(np.int64)
    positions = np.concatenate([np.zeros(len(uniq_rows), np.int64), token_positions])
    suffixes = pa.concat_arrays(
        [batch.column("uniq_key").filter(pa.array(has_uniq)).cast(pa.string()), token_values.cast(pa.string())]
    )
    topics = batch.column("topic").take(pa.array(message_of))
    key_hashes = index_key_hashes(java_string_hashes(pc.binary_join_element_wise(topics, suffixes, "#")))
    return pa.RecordBatch.from_arrays(
        [
            batch.column("physical_offset").take(pa.array(message_of)),
            pa.array(positions.astype(np.int32)),
            batch.column("store_timestamp").take(pa.array(message_of)),
            topics,
            pa.array(key_hashes),
            pa.array((key_hashes.astype(np.int64) % slots).astype(np.int32)),
        ],
        schema=_KEYS_SCHEMA,
    )


# What one pass over the commitlog gives (``dispatch``): every row is one of these kinds.
UNIT, KEY, RUN, BATCH = 0, 1, 2, 3
DISPATCHED = columns(
    ("kind", "int", "0: a CQ unit, 1: an index key, 2: a run of index keys, 3: the totals of a task's commitlog rows"),
    ("topic", "string", "unit, key: the message's topic"),
    ("queue_id", "int", "unit: the queue"),
    ("queue_offset", "bigint", "unit: the queue offset"),
    ("physical_offset", "bigint", "unit, key: the message's offset; run: its first key's; totals: the last unit's"),
    ("total_size", "int", "unit: the message's total size"),
    ("tags_code", "bigint", "unit: the tagsCode"),
    ("store_timestamp", "bigint", "unit, key: the message's store time; run: its first key's; totals: last unit's"),
    ("cq_file", "string", "unit: the CQ file name"),
    ("key_pos", "int", "key: the key's position among the message's index keys"),
    ("key_hash", "int", "key: abs(String.hashCode) of topic#key"),
    ("slot", "int", "key: the hash slot"),
    ("run_start", "bigint", "key, run: the physical offset of the run's first key (names the run)"),
    ("local_no", "bigint", "key: 0-based position in its run, in dispatch order; run: its keys; totals: rows read"),
    ("last_offset", "bigint", "run: the physical offset of its last key"),
    ("last_timestamp", "bigint", "run: the store time of its last key"),
    ("units", "bigint", "totals: CQ units"),
)
_DISPATCHED_SCHEMA = DISPATCHED.arrow_schema


def _dispatched(kind: int, count: int, values: Mapping[str, pa.Array]) -> pa.RecordBatch:
    """``count`` rows of ``kind``; the columns not in ``values`` are null."""
    arrays = [pa.array(np.full(count, kind, np.int32))]
    for field in list(_DISPATCHED_SCHEMA)[1:]:
        value = values.get(field.name)
        arrays.append(pa.nulls(count, field.type) if value is None else value.cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=_DISPATCHED_SCHEMA)


def contiguous_runs(offsets: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) row slices of the maximal runs of records that follow each other in the commitlog
    (each at the previous one's offset + size).

    A Spark task may read several commitlog files in one batch, in any order;
    a run is a stretch of the commitlog that no other task's rows fall into.
    """
    if not len(offsets):
        return []
    follows = offsets[1:] == offsets[:-1] + sizes[:-1].astype(np.int64)
    bounds = [0, *(np.flatnonzero(~follows) + 1).tolist(), len(offsets)]
    return list(itertools.pairwise(bounds))


def dispatch_batch(
    batch: pa.RecordBatch,
    *,
    units_per_file: int,
    slots: int,
    index: bool = True,
    delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE,
) -> list[pa.RecordBatch]:
    """Everything reput needs of one batch of commitlog rows, in ``DISPATCHED`` rows (``TaskDispatch`` of a
    task that reads this one batch)."""
    task = TaskDispatch(units_per_file=units_per_file, slots=slots, index=index, delay_levels=delay_levels)
    return [*task.add(batch), *task.finish()]


@dataclass
class _OpenRun:
    """The run of index keys that the next batch may go on with: its first key and count so far, its last key."""

    start: int
    count: int
    first_timestamp: int
    last_offset: int
    last_timestamp: int

    def row(self) -> pa.RecordBatch:
        return _dispatched(
            RUN,
            1,
            {
                "physical_offset": pa.array([self.start], pa.int64()),
                "store_timestamp": pa.array([self.first_timestamp], pa.int64()),
                "run_start": pa.array([self.start], pa.int64()),
                "local_no": pa.array([self.count], pa.int64()),
                "last_offset": pa.array([self.last_offset], pa.int64()),
                "last_timestamp": pa.array([self.last_timestamp], pa.int64()),
            },
        )


class TaskDispatch:
    """Everything reput needs of the commitlog rows one task reads, batch after batch, in ``DISPATCHED`` rows.

    ``add(batch)`` gives the batch's CQ units (``cq_units_of_batch``) and, with
    ``index``, its index keys (``index_keys_of_batch``) of each run of records
    that follow each other in the commitlog, in dispatch order and numbered
    within the run. A run goes on across batches while the next batch starts
    where the previous one ended (a task reads a file's row groups in order), so
    ``finish()`` gives one RUN row per run with keys (its count, first and last
    key) and one BATCH row for the task (rows read, units, the last unit's
    offset and store time): what the driver collects grows with the tasks and
    the files, not with the messages.
    """

    def __init__(
        self,
        *,
        units_per_file: int,
        slots: int,
        index: bool = True,
        delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE,
    ):
        self.units_per_file, self.slots, self.index, self.delay_levels = units_per_file, slots, index, delay_levels
        self.rows = self.units = 0
        self.last_unit: tuple[int, int] | None = None  # (physical offset, store time) of the newest unit
        self.records_end: int | None = None  # where the last record read ends: a batch starting there goes on
        self.open_run: _OpenRun | None = None
        self.closed: list[_OpenRun] = []

    def add(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        out = []
        self.rows += batch.num_rows
        units = cq_units_of_batch(batch, units_per_file=self.units_per_file, delay_levels=self.delay_levels)
        if units.num_rows:
            out.append(
                _dispatched(
                    UNIT,
                    units.num_rows,
                    {
                        "topic": units.column("topic"),
                        "queue_id": units.column("queue_id"),
                        "queue_offset": units.column("queue_offset"),
                        "physical_offset": units.column("commitlog_offset"),
                        "total_size": units.column("size"),
                        "tags_code": units.column("tags_code"),
                        "store_timestamp": units.column("store_timestamp"),
                        "cq_file": units.column("cq_file"),
                    },
                )
            )
            self.units += units.num_rows
            unit_offsets = units.column("commitlog_offset").to_numpy(zero_copy_only=False)
            newest = int(np.argmax(unit_offsets))
            if self.last_unit is None or int(unit_offsets[newest]) > self.last_unit[0]:
                self.last_unit = (int(unit_offsets[newest]), units.column("store_timestamp")[newest].as_py())
        if not self.index or not batch.num_rows:
            return out
        offsets = batch.column("physical_offset").to_numpy(zero_copy_only=False)
        sizes = batch.column("total_size").to_numpy(zero_copy_only=False)
        for start, stop in contiguous_runs(offsets, sizes):
            if self.records_end is None or int(offsets[start]) != self.records_end:
                self._close_run()
            self.records_end = int(offsets[stop - 1]) + int(sizes[stop - 1])
            keys = index_keys_of_batch(batch.slice(start, stop - start), slots=self.slots)
            if keys.num_rows:
                out.append(self._numbered(keys))
        return out

    def _numbered(self, keys: pa.RecordBatch) -> pa.RecordBatch:
        """KEY rows of ``keys`` (one run of records), in dispatch order, going on with the open run."""
        order = np.lexsort(
            (keys.column("key_pos").to_numpy(zero_copy_only=False), keys.column("physical_offset").to_numpy())
        )
        keys = keys.take(pa.array(order))
        key_offsets = keys.column("physical_offset")
        key_times = keys.column("store_timestamp")
        count = keys.num_rows
        if self.open_run is None:
            self.open_run = _OpenRun(key_offsets[0].as_py(), 0, key_times[0].as_py(), 0, 0)
        run = self.open_run
        numbered = _dispatched(
            KEY,
            count,
            {
                "topic": keys.column("topic"),
                "physical_offset": key_offsets,
                "store_timestamp": key_times,
                "key_pos": keys.column("key_pos"),
                "key_hash": keys.column("key_hash"),
                "slot": keys.column("slot"),
                "run_start": pa.array(np.full(count, run.start, np.int64)),
                "local_no": pa.array(np.arange(run.count, run.count + count, dtype=np.int64)),
            },
        )
        run.count += count
        run.last_offset, run.last_timestamp = key_offsets[-1].as_py(), key_times[-1].as_py()
        return numbered

    def _close_run(self) -> None:
        if self.open_run is not None:
            self.closed.append(self.open_run)
            self.open_run = None

    def finish(self) -> list[pa.RecordBatch]:
        """The task's RUN rows (its runs with keys) and its BATCH row (its totals, zero if it read nothing)."""
        self._close_run()
        out = [run.row() for run in self.closed]
        self.closed = []
        last_unit = {}
        if self.last_unit is not None:
            last_unit = {
                "physical_offset": pa.array([self.last_unit[0]], pa.int64()),
                "store_timestamp": pa.array([self.last_unit[1]], pa.int64()),
            }
        batch_row = {"local_no": pa.array([self.rows], pa.int64()), "units": pa.array([self.units], pa.int64())}
        out.append(_dispatched(BATCH, 1, {**batch_row, **last_unit}))
        return out


# The index keys of a dispatch as its tasks save them for the index stage (``dispatch`` with a ``DispatchScratch``).
DISPATCHED_KEYS = columns(
    ("topic", "string", "the message's topic"),
    ("physical_offset", "bigint", "the message's offset"),
    ("store_timestamp", "bigint", "the message's store time"),
    ("key_pos", "int", "the key's position among the message's index keys"),
    ("key_hash", "int", "abs(String.hashCode) of topic#key"),
    ("slot", "int", "the hash slot"),
    ("run_start", "bigint", "the physical offset of the run's first key (names the run)"),
    ("local_no", "bigint", "0-based position in its run, in dispatch order"),
)
_KEYS_OUT = DISPATCHED_KEYS.arrow_schema
_UNITS_OUT = _CQ_SCHEMA.append(pa.field(QB.BAND, pa.int32()))  # the saved units: CQ rows and their band
_UNIT_SOURCES = {"commitlog_offset": "physical_offset", "size": "total_size"}  # CQ column -> DISPATCHED column


@dataclass(frozen=True)
class DispatchScratch:
    """Where a dispatch's tasks save its CQ units (``consumequeue`` rows) and index keys (``DISPATCHED_KEYS``),
    relative to the lake root: one Parquet file of each per task, named by the task's partition, so a retried
    task replaces its own files."""

    lake_root: str
    storage_options: dict
    folder: str

    @property
    def units_dir(self) -> str:
        return f"{self.folder}/units"

    @property
    def keys_dir(self) -> str:
        return f"{self.folder}/keys"

    def storage(self):
        from rmqlake.lake.storage import Storage

        return Storage(self.lake_root, self.storage_options)


# The index keys a dispatch task holds before it sorts them by slot and saves them: a band task of the index
# stage reads the row groups of its slots only (``index_bands``).
KEYS_SORTED_ROWS = 1 << 20
_KEYS_ROW_GROUP_ROWS = 16_384


def _scratch_writer(scratch: DispatchScratch, folder: str, partition: int, *, row_group_size: int = 1 << 20):
    from rmqlake.ingest.scratch import AtomicParquet

    return AtomicParquet(
        scratch.storage(), f"{folder}/part-{partition:05d}.parquet", row_group_size=row_group_size, compression="none"
    )


def sort_by_slot(keys: pa.Table) -> pa.Table:
    """Keys in slot order (the order within a slot does not matter: each key carries its run and place)."""
    if keys.num_rows == 0:
        return keys
    return keys.take(pa.array(np.argsort(keys.column("slot").to_numpy(), kind="stable")))


def saved_parts(out: Iterable[pa.RecordBatch]) -> tuple[list[pa.RecordBatch], list[pa.RecordBatch], list]:
    """``TaskDispatch`` output split into CQ units (``consumequeue`` rows), index keys (``DISPATCHED_KEYS``) and
    the RUN and BATCH rows the driver collects."""
    units, keys, summary = [], [], []
    for batch in out:
        kind = batch.column(0)[0].as_py() if batch.num_rows else None
        if kind == UNIT:
            names = [_UNIT_SOURCES.get(name, name) for name in _CQ_SCHEMA.names]
            units.append(pa.RecordBatch.from_arrays([batch.column(n) for n in names], schema=_CQ_SCHEMA))
        elif kind == KEY:
            keys.append(pa.RecordBatch.from_arrays([batch.column(n) for n in _KEYS_OUT.names], schema=_KEYS_OUT))
        elif batch.num_rows:
            summary.append(batch)
    return units, keys, summary


class _SortedScratch:
    """A scratch file of one task, written in chunks of up to ``KEYS_SORTED_ROWS`` rows, each sorted by
    ``order`` (a band task reads the row groups of its slots or CQ files only)."""

    def __init__(self, writer, schema: pa.Schema, order):
        self.writer, self.schema, self.order = writer, schema, order
        self.held: list[pa.RecordBatch] = []
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.held.append(batch)
        self.rows += batch.num_rows
        if self.rows >= KEYS_SORTED_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.held:
            self.writer.write(self.order(pa.Table.from_batches(self.held, schema=self.schema)))
            self.held, self.rows = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()


@dataclass(frozen=True)
class _TaskOptions:
    """What every dispatch task is given, by either route."""

    units_per_file: int
    slots: int
    index: bool
    delay_levels: Mapping[int, int]
    scratch: DispatchScratch
    cq_bands: int


def _dispatch_task(batches: Iterable[pa.RecordBatch], partition: int, options: _TaskOptions) -> list[pa.RecordBatch]:
    """One task's dispatch of its commitlog rows (``DISPATCH_COLUMNS`` batches): its CQ units (with their band of
    ``cq_bands``, ``queue_bands.unit_bands``) and index keys saved in ``scratch`` under files named by
    ``partition``; its RUN and BATCH rows returned."""
    units_per_file, scratch = options.units_per_file, options.scratch
    task = TaskDispatch(
        units_per_file=units_per_file, slots=options.slots, index=options.index, delay_levels=options.delay_levels
    )
    # A task killed half way leaves hidden temporary files only, which readers skip.
    units_file = _SortedScratch(
        _scratch_writer(scratch, scratch.units_dir, partition, row_group_size=QB.UNITS_ROW_GROUP_ROWS),
        _UNITS_OUT,
        QB.sort_by_band,
    )
    keys_file = _SortedScratch(
        _scratch_writer(scratch, scratch.keys_dir, partition, row_group_size=_KEYS_ROW_GROUP_ROWS),
        _KEYS_OUT,
        sort_by_slot,
    )
    for batch in batches:
        units, keys, _ = saved_parts(task.add(batch))
        for part in units:
            bands = QB.unit_bands(part, bands=options.cq_bands, units_per_file=units_per_file)
            units_file.add(part.append_column(QB.BAND, pa.array(bands, pa.int32())))
        for part in keys:
            keys_file.add(part)
    units_file.close()
    keys_file.close()
    return saved_parts(task.finish())[2]


def dispatch(
    messages,
    *,
    units_per_file: int,
    slots: int,
    index: bool = True,
    delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE,
    scratch: DispatchScratch,
    cq_bands: int,
):
    """One pass over the commitlog rows of a DataFrame (``dispatch_requests``), a ``TaskDispatch`` per Spark
    task: each task saves its CQ units and index keys in ``scratch`` (pyarrow), and only its RUN and BATCH rows
    (``DISPATCHED``) come out, a few rows a task: every unit and key going through Spark's rows and a cache cost
    more than the dispatch itself. The reference of ``dispatch_files``, which reads the data files itself."""

    options = _TaskOptions(units_per_file, slots, index, delay_levels, scratch, cq_bands)

    def saved(batches):
        from pyspark import TaskContext

        yield from _dispatch_task(batches, TaskContext.get().partitionId(), options)

    return messages.select(*DISPATCH_COLUMNS).mapInArrow(saved, DISPATCHED.ddl)


# The commitlog rows a dispatch task reads at least (whole data files, in order): ~10 MB of the dispatch's
# columns, so a lake of many small hourly files does not make a task of each.
DISPATCH_TASK_ROWS = 100_000
# Rows of a batch read from a commitlog file: row groups are small (4 MiB, ~4,000 messages of ~1 KiB) and a
# ``TaskDispatch`` batch has a fixed cost (sorts, kernels), so several row groups make one batch.
_REQUEST_BATCH_ROWS = 65_536
_REQUEST_SCHEMA = pa.schema(
    [pa.field(name, pa.string() if name.endswith("_property") else _COMMITLOG_TYPES[name]) for name in DISPATCH_COLUMNS]
)


@dataclass(frozen=True)
class CommitlogFile:
    """A commitlog data file to dispatch: its path relative to the lake root, rows (from the Delta log, 0 if
    unknown) and the smallest physical offset in it (``None`` if the log has no statistics)."""

    path: str
    rows: int
    min_offset: int | None


def dispatch_tasks(files: Iterable[CommitlogFile], *, task_rows: int = DISPATCH_TASK_ROWS) -> list[list[str]]:
    """The files' paths cut into tasks in physical order, each task whole files of at least ``task_rows`` rows
    (but the last): what the driver holds grows with the files, not the messages."""
    ordered = sorted(files, key=lambda f: (f.min_offset is None, f.min_offset or 0, f.path))
    tasks: list[list[str]] = []
    rows = task_rows
    for file in ordered:
        if rows >= task_rows or not file.rows:  # a file of unknown size is a task of its own
            tasks.append([])
            rows = 0
        tasks[-1].append(file.path)
        rows += file.rows or task_rows
    return tasks


def request_batches(storage, path: str, *, from_offset: int) -> Iterator[pa.RecordBatch]:
    """``dispatch_requests``' rows of one commitlog data file (``path`` relative to the lake root) at or after
    ``from_offset``, in the file's order: row groups that end before it (by their statistics) are not read."""
    import pyarrow.parquet as pq

    with storage.fs.open_input_file(storage.file_path(path)) as source:
        try:
            parquet = pq.ParquetFile(source)
        except (pa.ArrowException, OSError) as exc:  # Arrow's message does not name the file
            raise ValueError(f"commitlog data file {path} cannot be read as Parquet: {exc}") from exc
        metadata = parquet.metadata
        offset_column = metadata.schema.to_arrow_schema().get_field_index("physical_offset")
        if offset_column < 0:
            raise ValueError(f"commitlog file {path} has no physical_offset column")
        groups = []
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(offset_column).statistics
            if stats is None or not stats.has_min_max or stats.max >= from_offset:
                groups.append(group)
        if not groups:
            return
        read = [c for c in DISPATCH_COLUMNS if not c.endswith("_property")] + ["properties"]
        for batch in parquet.iter_batches(batch_size=_REQUEST_BATCH_ROWS, row_groups=groups, columns=read):
            properties = batch.column("properties")
            columns = [batch.column(name) for name in read[:-1]]
            columns += [pc.map_lookup(properties, "KEYS", "first"), pc.map_lookup(properties, "DELAY", "first")]
            requests = pa.RecordBatch.from_arrays(columns, names=DISPATCH_COLUMNS).cast(_REQUEST_SCHEMA)
            offsets = requests.column("physical_offset")
            lowest = pc.min(offsets).as_py()
            if offsets.null_count or (lowest is not None and lowest < from_offset):  # as Spark's filter: no nulls
                requests = requests.filter(pc.greater_equal(offsets, from_offset))
            if requests.num_rows:
                yield requests


def dispatch_files(
    context,
    tasks: Sequence[Sequence[str]],
    *,
    from_offset: int,
    units_per_file: int,
    slots: int,
    index: bool = True,
    delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE,
    scratch: DispatchScratch,
    cq_bands: int,
) -> list[dict]:
    """``dispatch`` reading the commitlog's data files itself, one Spark task per entry of ``tasks`` (paths
    relative to the lake root, ``dispatch_tasks``), rows at or after ``from_offset``: no JVM scan of the
    files, no map column built as Spark rows and turned into Arrow again for Python. The RUN and BATCH rows
    (``DISPATCHED``, as dicts), a few a task."""
    if not tasks:
        return []
    paths = [list(task) for task in tasks]
    options = _TaskOptions(units_per_file, slots, index, delay_levels, scratch, cq_bands)

    def run(partition: int, entries):
        storage = scratch.storage()
        task_paths = [path for entry in entries for path in entry]
        batches = (b for path in task_paths for b in request_batches(storage, path, from_offset=from_offset))
        for batch in _dispatch_task(batches, partition, options):
            yield from batch.to_pylist()

    return context.parallelize(paths, len(paths)).mapPartitionsWithIndex(run).collect()


@dataclass(frozen=True)
class KeyRun:
    """A run of index keys in dispatch order, as one task read it: its first and last key, its key count."""

    start: int
    count: int
    first_timestamp: int
    last_offset: int
    last_timestamp: int


@dataclass(frozen=True)
class DispatchSummary:
    """The BATCH and RUN rows of a dispatch, added up on the driver."""

    messages: int
    units: int
    last_unit_timestamp: int | None
    runs: tuple[KeyRun, ...]


def summarize(rows: Iterable[Mapping]) -> DispatchSummary:
    """Messages read, CQ units and the store time of the last one, and the key runs in physical order."""
    messages = units = 0
    last_unit = None
    runs = []
    for row in rows:
        if row["kind"] == BATCH:
            messages += row["local_no"]
            units += row["units"]
            if row["physical_offset"] is not None and (last_unit is None or row["physical_offset"] > last_unit[0]):
                last_unit = (row["physical_offset"], row["store_timestamp"])
        elif row["kind"] == RUN:
            runs.append(
                KeyRun(
                    row["run_start"], row["local_no"], row["store_timestamp"], row["last_offset"], row["last_timestamp"]
                )
            )
    runs.sort(key=lambda run: run.start)
    return DispatchSummary(messages, units, None if last_unit is None else last_unit[1], tuple(runs))


def runs_are_disjoint(runs: Iterable[KeyRun]) -> bool:
    """Whether the runs (sorted by start) cover disjoint offset ranges: then the dispatch order is the runs in
    order, each in its own order, and a key's ordinal is its run's first ordinal plus its place in the run."""
    previous = None
    for run in runs:
        if previous is not None and run.start <= previous.last_offset:
            return False
        previous = run
    return True


def run_timestamps(runs: Iterable[KeyRun], plan: IndexPlan) -> dict[int, int]:
    """ordinal → store time of each run's first and last key (``plan.partition_starts`` numbers the runs)."""
    times = {}
    for run in runs:
        first = plan.partition_starts[run.start]
        times[first] = run.first_timestamp
        times[first + run.count - 1] = run.last_timestamp
    return times


def _ranks_in_order(groups: np.ndarray) -> np.ndarray:
    """0-based position of each element within its run of equal, adjacent values (groups are sorted)."""
    if not len(groups):
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    return np.arange(len(groups)) - np.repeat(starts, np.diff(np.r_[starts, len(groups)]))


def index_keys(messages, *, slots: int):
    """Index keys (``topic#UNIQ_KEY``, ``topic#token``...) of NOT_TYPE/PREPARED/COMMIT messages with hash and slot."""

    def keys(batches):
        for batch in batches:
            yield index_keys_of_batch(batch, slots=slots)

    return messages.select(*DISPATCH_COLUMNS).mapInArrow(keys, INDEX_KEYS.ddl)


def order_keys(keys, *, partitions: int):
    """Keys in dispatch order, range-partitioned, with ``local_no`` (0-based position within the partition).

    ``monotonically_increasing_id`` puts the partition in the upper bits and
    the row's position in the lower 33 bits.
    """
    from pyspark.sql import functions as F

    ordered = keys.repartitionByRange(partitions, "physical_offset", "key_pos").sortWithinPartitions(
        "physical_offset", "key_pos"
    )
    row_id = F.monotonically_increasing_id()
    return ordered.withColumn("partition", (row_id / (1 << 33)).cast("int")).withColumn(
        "local_no", row_id.bitwiseAND((1 << 33) - 1)
    )


@dataclass(frozen=True)
class OpenIndexFile:
    """The last index file before this run: name, entries in it, header timestamps and offsets."""

    name: str
    entries: int
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int


@dataclass(frozen=True)
class IndexPlan:
    """Where this run's keys go: the open file's room, the new files' names and time bases."""

    partition_starts: dict[int, int]
    open_file: OpenIndexFile | None
    room: int
    per_file: int
    total: int
    new_files: tuple[str, ...] = ()
    new_file_begin: tuple[int, ...] = ()
    new_file_previous_end: tuple[int, ...] = ()

    def file_of(self, ordinal: int) -> tuple[int, int]:
        """(file number: 0 = open file, 1.. = new files; entry number) of the ``ordinal``-th key."""
        if ordinal < self.room:
            return 0, self.open_file.entries + 1 + ordinal
        rest = ordinal - self.room
        return 1 + rest // self.per_file, 1 + rest % self.per_file

    def new_file_count(self) -> int:
        if self.total <= self.room:
            return 0
        return (self.total - self.room + self.per_file - 1) // self.per_file

    def first_ordinals(self) -> list[int]:
        """Ordinals of the first key of each new file and of the key before it."""
        return [self.room + k * self.per_file for k in range(self.new_file_count())]


def plan_index(partition_counts: Mapping[int, int], *, open_file: OpenIndexFile | None, max_entries: int) -> IndexPlan:
    """Prefix sums of keys per partition, and how many keys still fit the open file."""
    starts, running = {}, 0
    for partition in sorted(partition_counts):
        starts[partition] = running
        running += partition_counts[partition]
    per_file = capacity(max_entries)
    room = per_file - open_file.entries if open_file else 0
    return IndexPlan(starts, open_file, max(room, 0), per_file, running)


def name_new_files(
    plan: IndexPlan, first_keys: Mapping[int, int], last_before: Mapping[int, int], *, zone: str, last_name: str | None
) -> IndexPlan:
    """Give new files their names and time bases from the store times of their first keys.

    Args:
        first_keys: ordinal → store time, for each new file's first key.
        last_before: ordinal → store time, for the key just before each new
            file's first key (the end time of the file it follows).
        last_name: name of the newest existing index file.
    """
    names, begins, previous_ends = [], [], []
    previous = last_name
    for ordinal in plan.first_ordinals():
        previous = next_file_name(previous, first_keys[ordinal], zone)
        names.append(previous)
        begins.append(first_keys[ordinal])
        if ordinal - 1 in last_before:
            previous_ends.append(last_before[ordinal - 1])
        else:  # the key before is in the open file, or there is no earlier file at all
            previous_ends.append(plan.open_file.end_timestamp if plan.open_file else 0)
    return IndexPlan(
        plan.partition_starts,
        plan.open_file,
        plan.room,
        plan.per_file,
        plan.total,
        tuple(names),
        tuple(begins),
        tuple(previous_ends),
    )


def add_ordinals(ordered_keys, *, partition_starts: Mapping[int, int]):
    """``ordinal``: the key's 0-based position in this run's dispatch order."""
    from pyspark.sql import functions as F

    if not partition_starts:
        return ordered_keys.withColumn("ordinal", F.lit(0).cast("bigint"))
    starts = F.create_map(*[F.lit(value) for item in sorted(partition_starts.items()) for value in item])
    return ordered_keys.withColumn(
        "ordinal", (F.element_at(starts, F.col("partition")) + F.col("local_no")).cast("bigint")
    )


def add_run_ordinals(spark, keys, *, run_starts: Mapping[int, int]):
    """``ordinal`` of ``dispatch``'s keys: their run's first ordinal (``run_starts``) plus their place in it."""
    from pyspark.sql import functions as F

    starts = spark.createDataFrame(sorted(run_starts.items()), "run_start bigint, run_first bigint")
    return (
        keys.join(F.broadcast(starts), "run_start")
        .withColumn("ordinal", (F.col("run_first") + F.col("local_no")).cast("bigint"))
        .drop("run_first")
    )


def number_entries(with_ordinals, *, plan: IndexPlan):
    """Index file, entry number and time diff of every key (SQL over a few literals per file)."""
    from pyspark.sql import functions as F

    open_entries = plan.open_file.entries if plan.open_file else 0
    rest = F.col("ordinal") - F.lit(plan.room)
    in_open = F.col("ordinal") < F.lit(plan.room)
    file_no = F.when(in_open, F.lit(0)).otherwise(F.expr(f"(ordinal - {plan.room}) div {plan.per_file}") + 1)
    index_no = F.when(in_open, F.col("ordinal") + F.lit(open_entries + 1)).otherwise(
        F.pmod(rest, F.lit(plan.per_file)) + 1
    )
    names = [plan.open_file.name if plan.open_file else "", *list(plan.new_files)]
    begins = [plan.open_file.begin_timestamp if plan.open_file else 0, *list(plan.new_file_begin)]
    previous_ends = [0, *list(plan.new_file_previous_end)]

    def pick(values, cast):
        return F.element_at(F.array(*[F.lit(v).cast(cast) for v in values]), F.col("file_no") + 1)

    frame = with_ordinals.withColumn("file_no", file_no.cast("int")).withColumn("index_no", index_no.cast("int"))
    frame = frame.withColumn("index_file", pick(names, "string"))
    # The first key of a new file is timed from the previous file's end; no base before any file.
    first_of_new = (F.col("file_no") > 0) & (F.col("index_no") == 1)
    frame = frame.withColumn(
        "time_base", F.when(first_of_new, pick(previous_ends, "bigint")).otherwise(pick(begins, "bigint"))
    )
    seconds = F.expr("(store_timestamp - time_base) div 1000")  # Java long division: truncates toward zero
    clamped = F.when(F.col("time_base") <= 0, F.lit(0)).otherwise(
        F.least(F.greatest(seconds, F.lit(0)), F.lit(INT_MAX))
    )
    return frame.withColumn("time_diff", clamped.cast("int")).drop("time_base")


def chain_entries(numbered, *, seeds=None):
    """``prev_index``: the previous entry of the same file and slot; for the first entry of a slot in
    the open file, its last entry there before this run (``seeds``: index_file, slot, seed_index)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy("index_file", "slot").orderBy("index_no")
    chained = numbered.withColumn("prev_in_run", F.lag("index_no").over(window))
    if seeds is not None:
        chained = chained.join(seeds, on=["index_file", "slot"], how="left")
        previous = F.coalesce(F.col("prev_in_run"), F.col("seed_index"), F.lit(0))
    else:
        previous = F.coalesce(F.col("prev_in_run"), F.lit(0))
    return chained.withColumn("prev_index", previous.cast("int"))


INDEX_COLUMNS = [
    "index_file",
    "index_no",
    "key_hash",
    "slot",
    "phy_offset",
    "time_diff",
    "prev_index",
    "topic",
    "store_timestamp",
]


def index_rows(chained):
    """``indexfile`` rows."""
    from pyspark.sql import functions as F

    return chained.select(
        "index_file",
        "index_no",
        "key_hash",
        "slot",
        F.col("physical_offset").alias("phy_offset"),
        "time_diff",
        "prev_index",
        "topic",
        "store_timestamp",
    )


def header_aggregates(rows):
    """Per index file of this run: first/last key, keys that opened an empty slot, last entry number."""
    from pyspark.sql import functions as F

    return rows.groupBy("index_file").agg(
        F.min_by("store_timestamp", "index_no").alias("first_timestamp"),
        F.min_by("phy_offset", "index_no").alias("first_phy_offset"),
        F.max_by("store_timestamp", "index_no").alias("last_timestamp"),
        F.max_by("phy_offset", "index_no").alias("last_phy_offset"),
        F.sum(F.when(F.col("prev_index") == 0, 1).otherwise(0)).alias("new_slots"),
        F.max("index_no").alias("last_index_no"),
        F.min("index_no").alias("first_index_no"),
    )


# Files a run writes entries to whose header aggregates are observed during the write (``header_observations``);
# a run writing to more (tiny index files) reads its staged entries back (``header_aggregates``).
OBSERVED_FILES_MAX = 16
_HEADER_FIELDS = (
    "first_timestamp",
    "first_phy_offset",
    "last_timestamp",
    "last_phy_offset",
    "new_slots",
    "last_index_no",
    "first_index_no",
)


def header_observations(files: list[str]) -> list:
    """``header_aggregates`` of ``files`` as aggregate columns of one row, to observe (``DataFrame.observe``)
    while the rows are written instead of reading them back: ``<field>_<n>`` for the n-th of ``files``."""
    from pyspark.sql import functions as F

    columns = []
    for n, name in enumerate(files):
        number = F.when(F.col("index_file") == F.lit(name), F.col("index_no"))  # null elsewhere: min_by skips it
        columns += [
            F.min_by("store_timestamp", number).alias(f"first_timestamp_{n}"),
            F.min_by("phy_offset", number).alias(f"first_phy_offset_{n}"),
            F.max_by("store_timestamp", number).alias(f"last_timestamp_{n}"),
            F.max_by("phy_offset", number).alias(f"last_phy_offset_{n}"),
            F.sum(F.when(number.isNotNull() & (F.col("prev_index") == 0), 1).otherwise(0)).alias(f"new_slots_{n}"),
            F.max(number).alias(f"last_index_no_{n}"),
            F.min(number).alias(f"first_index_no_{n}"),
        ]
    return columns


def observed_aggregates(files: list[str], observed: Mapping) -> list[dict]:
    """``header_aggregates``' rows from ``header_observations``' values (files without entries left out)."""
    rows = []
    for n, name in enumerate(files):
        if observed.get(f"last_index_no_{n}") is None:
            continue
        rows.append({"index_file": name, **{field: observed[f"{field}_{n}"] for field in _HEADER_FIELDS}})
    return rows


def merge_headers(existing: Iterable[Mapping], aggregates: Iterable[Mapping]) -> list[dict]:
    """``indexfile_header`` rows after the run (the broker's header fields)."""
    headers = {row["index_file"]: dict(row) for row in existing}
    for agg in aggregates:
        name = agg["index_file"]
        header = headers.get(name)
        if header is None:
            header = headers[name] = {
                "index_file": name,
                "begin_timestamp": agg["first_timestamp"],
                "begin_phy_offset": agg["first_phy_offset"],
                "hash_slot_count": 0,
            }
        header["end_timestamp"] = agg["last_timestamp"]
        header["end_phy_offset"] = agg["last_phy_offset"]
        header["hash_slot_count"] += agg["new_slots"]
        header["index_count"] = agg["last_index_no"] + 1
    return sorted(headers.values(), key=lambda h: h["index_file"])
