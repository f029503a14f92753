"""Point reads of a table by an integer column, with what a warm process may keep between lookups.

``Lake.lookup`` answers each call from the Delta snapshot and the Parquet
footers it reads again; a process that answers many lookups (a notebook
holding ``rmqlake.open``, a service) keeps instead:

* per table snapshot (table id and version: a commit, an expiry or a
  compaction makes a new version, and a table created anew at the same path
  has a new id), its data files with their partition values;
* per data file (its path and size: Delta never rewrites a file in place),
  its footer and the min/max of the looked-up column per row group, as
  sorted NumPy arrays.

A lookup then picks the row groups that can hold the wanted values with a
vectorised search and reads just those, file by file, with the footer
already parsed. A file written for point reads (``pages.WRITE_OPTIONS``, the
commitlog's) keeps a ``pages.PageMap`` too, from the process's second lookup
of the table on, and only the pages holding the wanted values are read (one
page per column instead of a row group's ~6); the row groups stay the route of
every other file, of a process's first lookup, and the fallback. Rows are
the same as ``Lake.lookup``'s; only what is read again differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rmqlake.lake import pages
from rmqlake.lake.deltars import log_path_to_relative
from rmqlake.lake.tables import table_spec

if TYPE_CHECKING:
    from rmqlake.lake.lake import Lake

log = logging.getLogger(__name__)

SNAPSHOTS_KEPT = 32  # table versions kept (each is a file list: small)
# Footers kept, in their bytes as stored: a parsed footer takes ~8x that in memory (a 5 M-message lake's
# commitlog has ~33 MB of footers at 512 rows a row group, ~250 MB parsed), so the bound is on bytes, not files.
FOOTER_BYTES_KEPT = 64 * 1024 * 1024
READ_THREADS = min(4, os.cpu_count() or 1)  # data files read at once by a lookup (0 or 1: one after another)


@dataclass(frozen=True)
class DataFileLayout:
    """A data file of a table version: where it is, its partition values, and its row groups' bounds."""

    path: str  # relative to the table folder, decoded
    size: int
    partition: dict
    metadata: pq.FileMetaData
    lows: np.ndarray  # per row group, min of the column (row groups without statistics: -inf .. +inf)
    highs: np.ndarray
    pages: pages.PageMap | None = None  # where its pages are, if it was written for point reads
    mapped: bool = False  # whether ``pages`` was looked for

    @property
    def weight(self) -> int:
        return self.metadata.serialized_size + (self.pages.nbytes if self.pages else 0)

    def groups_holding(self, wanted: np.ndarray) -> list[int]:
        """Row groups whose [min, max] holds one of ``wanted`` (sorted)."""
        if not len(wanted) or not len(self.lows):
            return []
        position = np.searchsorted(wanted, self.lows, side="left")
        inside = position < len(wanted)
        inside[inside] = wanted[position[inside]] <= self.highs[inside]
        return np.flatnonzero(inside).tolist()


class _Lru:
    """The values last used, up to ``capacity`` in total ``weight`` (each value weighs 1 unless told)."""

    def __init__(self, capacity: int, weight: Callable[[object], int] = lambda value: 1):
        self.capacity = capacity
        self.weight = weight
        self.held = 0
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, build: Callable[[], object]):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        value = build()
        weight = self.weight(value)
        with self._lock:
            if key in self._items:
                self.held -= self._items.pop(key)[1]
            self._items[key] = (value, weight)
            self.held += weight
            while self.held > self.capacity and len(self._items) > 1:  # the value just built always stays
                self.held -= self._items.popitem(last=False)[1][1]
        return value

    def put(self, key, value):
        """``value`` kept under ``key`` instead of what was, as the most recent; returns what is kept."""
        with self._lock:
            if key in self._items:
                self.held -= self._items.pop(key)[1]
        return self.get(key, lambda: value)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.held = 0

    def __len__(self) -> int:
        return len(self._items)


_snapshots = _Lru(SNAPSHOTS_KEPT)
_footers = _Lru(FOOTER_BYTES_KEPT, weight=lambda layout: layout.weight)
# Files read since the caches were cleared, by route: pages (a PageMap's), row groups, and page reads that
# failed and fell back to row groups.
_reads = {"pages": 0, "row_groups": 0, "page_fallbacks": 0}
_reads_lock = threading.Lock()


def _count(route: str) -> None:
    with _reads_lock:
        _reads[route] += 1


def clear_caches() -> None:
    """Forget every kept snapshot file list and footer (the next lookup reads them again)."""
    _snapshots.clear()
    _footers.clear()
    with _reads_lock:
        for route in _reads:
            _reads[route] = 0
        _looked_up.clear()


def cache_sizes() -> dict[str, int]:
    """What the caches hold, and the files read by each route since they were cleared."""
    return {"snapshots": len(_snapshots), "footers": len(_footers), "footer_bytes": _footers.held, **_reads}


def _bounds(metadata: pq.FileMetaData, column: str) -> tuple[np.ndarray, np.ndarray]:
    groups = metadata.num_row_groups
    lows = np.full(groups, np.iinfo(np.int64).min, dtype=np.int64)
    highs = np.full(groups, np.iinfo(np.int64).max, dtype=np.int64)
    leaf = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == column), None)
    for number in range(groups if leaf is not None else 0):
        stats = metadata.row_group(number).column(leaf).statistics
        if stats is not None and stats.has_min_max:
            lows[number], highs[number] = stats.min, stats.max
    return lows, highs


def _files(lake: Lake, table: str) -> tuple[tuple, list[tuple[str, int, dict]]]:
    """The snapshot's identity and its data files (path, size, partition values), as the engine pins it."""
    dt = lake.engine.open(table)
    identity = (lake.engine.uri(table), dt.metadata().id, dt.version())

    def listed():
        actions = pa.table(dt.get_add_actions(flatten=False))
        wanted = [name for name in ("path", "size_bytes", "partition") if name in actions.column_names]
        return [
            (log_path_to_relative(row["path"]), row["size_bytes"], row.get("partition") or {})
            for row in actions.select(wanted).to_pylist()
        ]

    return identity, _snapshots.get(identity, listed)


def table_layout(
    lake: Lake,
    table: str,
    column: str,
    *,
    partitions: Callable[[dict], bool] | None = None,
    page_maps: bool = False,
) -> list[DataFileLayout]:
    """The data files of ``table`` as the lake reads it now, each with its row groups' bounds of ``column``.

    ``partitions(values)``: only the files of the partitions it accepts (the others' footers are not read).
    ``page_maps``: also each file's page map (``None`` for a file not written for page reads).
    """
    identity, files = _files(lake, table)

    def layout(path: str, size: int, partition: dict) -> DataFileLayout:
        key = (identity[0], path, size, column)

        def read() -> DataFileLayout:
            with lake.storage.open_mapped(f"{table}/{path}") as source:
                metadata = pq.read_metadata(source)
            return DataFileLayout(path, size, partition, metadata, *_bounds(metadata, column))

        found = _footers.get(key, read)
        if not page_maps or found.mapped:
            return found
        page_map = None
        with lake.storage.mapped_view(f"{table}/{path}") as view, contextlib.suppress(pages.LayoutRefused):
            # a file written otherwise (by Spark, an older writer) is refused: it is read by row groups
            page_map = None if view is None else pages.page_map(view, found.metadata, column)
        return _footers.put(key, dataclasses.replace(found, pages=page_map, mapped=True))

    return [layout(*f) for f in files if partitions is None or partitions(f[2])]


def snapshot_value(lake: Lake, table: str, name: str, build: Callable[[], object]):
    """``build()`` computed once per snapshot of ``table`` (e.g. a small table's rows), kept like its file list."""
    identity, _ = _files(lake, table)
    return _snapshots.get((*identity, name), build)


def read_rows(
    lake: Lake,
    table: str,
    *,
    column: str,
    values: Sequence[int],
    columns: Sequence[str],
    partitions: Callable[[dict], bool] | None = None,
) -> pa.Table:
    """Rows whose ``column`` is one of ``values``: ``Lake.lookup``'s rows, from kept file lists and footers.

    ``partitions(values)`` narrows the files read to the partitions it accepts (e.g. the segments the
    values fall in). ``columns`` are stored columns (not partition columns).
    """
    schema = table_spec(table).arrow_schema
    wanted = np.unique(np.asarray(list(values), dtype=np.int64))
    work = []
    if len(wanted) and lake.exists(table):
        # Page maps cost a one-lookup process more than they save it (~25 ms a file to build, a key's offsets
        # lie in ~15 files): they are built from a process's second lookup of a table on.
        page_maps = _looked_up_before(lake, table, column)
        work = [(layout, groups) for layout in table_layout(lake, table, column, partitions=partitions,
                                                            page_maps=page_maps)
                if (groups := layout.groups_holding(wanted))]  # fmt: skip

    read_columns = list(dict.fromkeys([*columns, column]))

    def wanted_rows(data: pa.Table) -> pa.Table:
        data = data.filter(pc.is_in(data.column(column), pa.array(wanted, data.schema.field(column).type)))
        return data.select(list(columns))

    def read(layout: DataFileLayout, groups: list[int], threads: bool) -> pa.Table:
        _count("row_groups")
        with lake.storage.open_mapped(f"{table}/{layout.path}") as source:
            data = pq.ParquetFile(source, metadata=layout.metadata).read_row_groups(
                groups, columns=read_columns, use_threads=threads
            )
        return wanted_rows(data)

    if not work:
        return schema.empty_table().select(list(columns))
    # Files with page maps: their pages all go into one made-up file (per frame: one, as one writer wrote them).
    # Frames are grouped by identity (``pages`` keeps one object per distinct frame): hashing one walks its leaves.
    tables, by_row_groups, by_frame = [], [], {}
    for layout, groups in work:
        if layout.pages is None:
            by_row_groups.append((layout, groups))
        else:
            by_frame.setdefault(id(layout.pages.frame), []).append((layout, groups))
    for paged in by_frame.values():
        data = _read_pages(lake, table, paged, wanted, read_columns)
        if data is None:
            by_row_groups += paged
        else:
            tables.append(wanted_rows(data))
    if len(by_row_groups) == 1 or READ_THREADS < 2:
        tables += [read(layout, groups, True) for layout, groups in by_row_groups]
    elif by_row_groups:
        # A file's few row groups are too little work for Arrow's column threads; files are read side by side.
        tables += list(_pool().map(lambda item: read(*item, False), by_row_groups))
    return pa.concat_tables(tables) if tables else schema.empty_table().select(list(columns))


_looked_up: set[tuple[str, str, str]] = set()


def _looked_up_before(lake: Lake, table: str, column: str) -> bool:
    key = (lake.engine.uri(table), table, column)
    with _reads_lock:
        seen = key in _looked_up
        _looked_up.add(key)
    return seen


def _read_pages(lake: Lake, table: str, work: list, wanted: np.ndarray, columns: list[str]) -> pa.Table | None:
    """The pages of ``work``'s files (layouts with page maps, and their row groups holding ``wanted`` values)
    that can hold those values, read together; ``None`` if the read fails (the caller reads the row groups)."""
    with contextlib.ExitStack() as files:
        parts = []
        for layout, groups in work:
            descriptor = files.enter_context(lake.storage.read_descriptor(f"{table}/{layout.path}"))
            if descriptor is None:  # not a local file (no page map is built for one): read by row groups
                return None
            chosen = np.array(groups, np.int64)
            # the wanted values inside one of the chosen row groups (a page-mapped file's bounds are ascending)
            position = np.searchsorted(layout.lows[chosen], wanted, side="right") - 1
            inside = position >= 0
            inside[inside] = wanted[inside] <= layout.highs[chosen][position[inside]]
            parts.append(pages.PagesWanted(descriptor, layout.pages, wanted[inside]))
        try:
            data = pages.read_pages(parts, columns=columns)
        except (pages.LayoutRefused, pa.ArrowException, ValueError, IndexError, OSError) as error:
            for _ in work:
                _count("page_fallbacks")
            log.warning("reading %d files by row groups: their pages could not be read (%s)", len(work), error)
            return None
    for _ in work:
        _count("pages")
    return data if data is not None else work[0][0].metadata.schema.to_arrow_schema().empty_table().select(columns)


_read_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _read_pool
    with _pool_lock:
        if _read_pool is None:
            _read_pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="rmqlake-lookup")
        return _read_pool
