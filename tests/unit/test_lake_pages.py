"""Point reads by pages (``lake.pages``) give the rows a read of whole row groups gives, for files written as
the commitlog's writers write them; files written otherwise, or damaged, are refused (and read by row groups),
never read wrongly."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rmqlake.ingest.tasks import COMMITLOG_WRITE_OPTIONS
from rmqlake.lake import pages as P
from rmqlake.lake.storage import Storage
from rmqlake.lake.tables import COMMITLOG

SCHEMA = COMMITLOG.arrow_schema.remove(COMMITLOG.arrow_schema.get_field_index("segment"))
COLUMNS = [name for name in SCHEMA.names if name != "source_file"]  # a read of most columns, not all


def rows(count: int, seed: int, *, first: int = 0) -> pa.Table:
    """Messages at ascending offsets with the odd shapes a commitlog holds: nulls, empty and absent maps and
    lists, empty and long bodies, multi-byte text."""
    rng = random.Random(seed)
    offset, out = first, []
    for number in range(count):
        keys = rng.choice([None, [], ["k"], [f"k{number}", "é" * rng.randrange(3), None]])
        properties = rng.choice([None, [], [("KEYS", "a b"), ("UNIQ_KEY", f"U{number}")], [("e", None)]])
        body = rng.choice([b"", None, bytes(rng.randrange(256) for _ in range(rng.randrange(300))), b"x" * 5000])
        out.append(
            {name: None for name in SCHEMA.names}
            | {
                "physical_offset": offset,
                "total_size": rng.randrange(100, 400),
                "topic": rng.choice(["t", "Topic-é", "x" * 120]),
                "queue_id": rng.randrange(8),
                "queue_offset": number,
                "store_timestamp": 1_795_219_200_000 + number,
                "store_time": None if number % 5 else 1_795_219_200_000_000,
                "keys": keys,
                "properties": properties,
                "body": body,
                "tags": rng.choice([None, "", "TagA"]),
            }
        )
        offset += rng.randrange(100, 400)
    return pa.Table.from_pylist(out, schema=SCHEMA)


def write(table: pa.Table, path, *, row_group: int, **options) -> tuple[memoryview, pq.FileMetaData]:
    pq.write_table(table, path, row_group_size=row_group, **({**COMMITLOG_WRITE_OPTIONS} | options))
    data = path.read_bytes()
    return memoryview(data), pq.read_metadata(pa.BufferReader(data))


def by_row_groups(buf, metadata, wanted: np.ndarray) -> pa.Table:
    """The reference: every row group whose bounds hold a wanted offset, read whole, then filtered."""
    groups = []
    for number in range(metadata.num_row_groups):
        stats = metadata.row_group(number).column(0).statistics
        if np.any((wanted >= stats.min) & (wanted <= stats.max)):
            groups.append(number)
    data = pq.ParquetFile(pa.BufferReader(buf), metadata=metadata).read_row_groups(groups, columns=COLUMNS)
    return data.filter(pc.is_in(data.column("physical_offset"), pa.array(wanted)))


def by_pages(buf, metadata, wanted: np.ndarray) -> pa.Table:
    page_map = P.page_map(buf, metadata, "physical_offset")
    data = P.read_pages([P.PagesWanted(buf, page_map, wanted)], columns=COLUMNS)
    if data is None:
        return pa.schema([SCHEMA.field(c) for c in COLUMNS]).empty_table()
    return data.filter(pc.is_in(data.column("physical_offset"), pa.array(wanted)))


@pytest.mark.parametrize(
    ("count", "row_group", "page_rows", "options"),
    [
        (1, 1, 1, {}),
        (7, 3, 2, {}),
        (200, 64, 7, {}),
        (600, 250, P.PAGE_ROWS, {}),
        (1000, 1000, 128, {}),
        # page headers with a checksum, and data pages v2: their value counts are read by the generic reader
        (200, 64, 7, {"write_page_checksum": True}),
        (200, 64, 7, {"data_page_version": "2.0"}),
        # integers stored plain, as rmqlake wrote them before it stored them as deltas
        (200, 64, 7, {"column_encoding": None}),
    ],
)
def test_pages_give_the_rows_of_whole_row_groups(tmp_path, count, row_group, page_rows, options):
    table = rows(count, seed=count)
    buf, metadata = write(table, tmp_path / "f.parquet", row_group=row_group, max_rows_per_page=page_rows, **options)
    page_map = P.page_map(buf, metadata, "physical_offset")
    for leaf, (offsets, repeated) in enumerate(
        zip(page_map.page_locations[:, :, 0].T, [f.repeated for f in page_map.frame.leaves])
    ):
        if repeated:  # the inline header read agrees with the generic one, or hands over to it
            counts = [P._page_values(buf, int(o)) for o in offsets]
            assert counts == [P._page_values_generic(buf, int(o)) for o in offsets], leaf
    offsets = table.column("physical_offset").to_numpy()
    rng = np.random.default_rng(count)
    picks = [
        offsets[:1],
        offsets[-1:],
        offsets,  # every row: every page
        np.sort(rng.choice(offsets, min(count, 64), replace=False)),
        np.array([offsets[0] - 1, offsets[-1] + 1, *(offsets[:-1] + 1)]),  # none is a row's offset
        np.sort(np.concatenate([rng.choice(offsets, 3), [offsets[-1] + 10**9]])),
    ]
    for wanted in picks:
        wanted = np.unique(wanted.astype(np.int64))
        expected = by_row_groups(buf, metadata, wanted)
        got = by_pages(buf, metadata, wanted)
        assert got.equals(expected.cast(got.schema)), wanted[:5]
        assert got.schema == expected.schema


def test_a_page_map_knows_every_page_and_its_first_offset(tmp_path):
    table = rows(50, seed=3)
    buf, metadata = write(table, tmp_path / "f.parquet", row_group=20, max_rows_per_page=8)
    page_map = P.page_map(buf, metadata, "physical_offset")
    assert page_map.group_rows.tolist() == [20, 20, 10]
    assert [f.tolist() for f in page_map.first_rows] == [[0, 8, 16], [0, 8, 16], [0, 8]]
    offsets = table.column("physical_offset").to_numpy()
    assert page_map.page_first_values.tolist() == offsets[[0, 8, 16, 20, 28, 36, 40, 48]].tolist()
    assert page_map.page_ends.tolist() == [8, 16, 20, 8, 16, 20, 8, 10]
    assert page_map.page_rows.tolist() == [8, 8, 4, 8, 8, 4, 8, 2]
    assert page_map.page_locations.shape == (8, metadata.num_columns, 2)
    # the made-up file's footer fits the room kept for it, whatever its integers
    chunks = [(leaf, 2**62, 2**62, 2**62) for leaf in page_map.frame.leaves]
    assert len(P._footer(page_map.frame, chunks, 2**62, data_bytes=2**62)) <= P._footer_bound(page_map.frame)
    for leaf in range(metadata.num_columns):  # each leaf's pages fill its column chunk, back to back
        for group in range(3):
            chunk = metadata.row_group(group).column(leaf)
            located = page_map.page_locations[page_map.page_groups == group, leaf]
            assert located[0, 0] == chunk.data_page_offset
            assert located.sum(axis=1)[:-1].tolist() == located[1:, 0].tolist()
            assert located[:, 1].sum() == chunk.total_compressed_size
    assert len(page_map.frame.leaves) == metadata.num_columns
    repeated = [leaf.repeated for leaf in page_map.frame.leaves]
    assert repeated.count(True) == 3  # the map's key and value, the list's item
    # each leaf knows its top-level column; a read of a column copies its leaves only, and a name that is not a
    # top-level column (pyarrow also takes dotted paths) makes every leaf read
    leaf_columns = [name for name in SCHEMA.names for _ in range(2 if name == "properties" else 1)]  # a map: 2
    assert [leaf.column for leaf in page_map.frame.leaves] == leaf_columns
    read = P._leaves_read(page_map.frame, ["body", "properties"])
    assert [leaf.column for leaf, taken in zip(page_map.frame.leaves, read) if taken] == ["body"] + ["properties"] * 2
    assert P._leaves_read(page_map.frame, ["properties.key_value.key"]).all()


def test_pages_of_several_files_are_read_together(tmp_path):
    """Files of one writer share a frame: their pages go into the same column chunks of one made-up file, and
    the rows are each file's own. A file of another schema has another frame and is not mixed in."""
    parts, expected, metadatas = [], [], []
    for number, (count, row_group, page_rows) in enumerate([(40, 16, 3), (300, 128, P.PAGE_ROWS), (9, 9, 9)]):
        table = rows(count, seed=number, first=number * 10**6)
        buf, metadata = write(table, tmp_path / f"{number}.parquet", row_group=row_group, max_rows_per_page=page_rows)
        offsets = table.column("physical_offset").to_numpy()
        wanted = np.unique(np.random.default_rng(number).choice(offsets, 5))
        parts.append(P.PagesWanted(buf, P.page_map(buf, metadata, "physical_offset"), wanted))
        expected.append(by_row_groups(buf, metadata, wanted))
        metadatas.append(metadata)
    assert len({part.pages.frame for part in parts}) == 1
    wanted = pa.array(np.concatenate([p.values for p in parts]))
    data = P.read_pages(parts, columns=COLUMNS)
    data = data.filter(pc.is_in(data.column("physical_offset"), wanted))
    assert data.equals(pa.concat_tables(expected).cast(data.schema))
    # a file cut short among them: the read is refused, not read short
    cut = parts[1].pages.page_locations[-1, -1].sum() - 1
    last_page = parts[1].pages.page_first_values[-1:]
    short = P.PagesWanted(memoryview(bytes(parts[1].source)[:cut]), parts[1].pages, last_page)
    with pytest.raises(P.LayoutRefused, match="ends before"):
        P.read_pages([parts[0], short, parts[2]], columns=COLUMNS)
    # the cut falls in the last leaf's pages (properties_bytes): a read without that column copies none of them
    fewer = [name for name in COLUMNS if name != "properties_bytes"]
    data = P.read_pages([parts[0], short, parts[2]], columns=fewer)
    wanted = pa.array(np.concatenate([parts[0].values, last_page, parts[2].values]))
    data = data.filter(pc.is_in(data.column("physical_offset"), wanted))
    last_row = by_row_groups(parts[1].source, metadatas[1], last_page)
    assert data.equals(pa.concat_tables([expected[0], last_row, expected[2]]).select(fewer).cast(data.schema))
    other = rows(5, seed=1).drop_columns(["tags"])
    buf, metadata = write(other, tmp_path / "other.parquet", row_group=5, max_rows_per_page=2)
    odd = P.PagesWanted(buf, P.page_map(buf, metadata, "physical_offset"), other.column("physical_offset").to_numpy())
    assert odd.pages.frame != parts[0].pages.frame
    with pytest.raises(ValueError, match="frames"):
        P.read_pages([*parts, odd], columns=COLUMNS[:3])


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"use_dictionary": True, "column_encoding": None}, "dictionary"),
        ({"write_page_index": False}, "offset index"),
        ({"max_rows_per_page": None, "data_page_size": 64}, "aligned"),  # pages cut by bytes: columns differ
    ],
)
def test_files_written_otherwise_are_refused(tmp_path, options, reason):
    buf, metadata = write(rows(300, seed=1), tmp_path / "f.parquet", row_group=100, **options)
    with pytest.raises(P.LayoutRefused, match=reason):
        P.page_map(buf, metadata, "physical_offset")


def test_offsets_not_ascending_or_a_missing_column_are_refused(tmp_path):
    table = rows(30, seed=2)
    reversed_rows = table.take(list(range(29, -1, -1)))
    buf, metadata = write(reversed_rows, tmp_path / "r.parquet", row_group=10, max_rows_per_page=4)
    with pytest.raises(P.LayoutRefused, match="ascending"):
        P.page_map(buf, metadata, "physical_offset")
    buf, metadata = write(table, tmp_path / "f.parquet", row_group=10, max_rows_per_page=4)
    with pytest.raises(P.LayoutRefused, match="no flat column"):
        P.page_map(buf, metadata, "keys")


def test_damaged_metadata_is_refused_or_read_as_the_row_groups_are(tmp_path):
    """Bytes changed in the page index and footer: the page map is refused, or what it reads is what the row
    groups of the same bytes give (or pyarrow raises, and the lookup reads the row groups) — never other rows."""
    table = rows(120, seed=9)
    good, metadata = write(table, tmp_path / "f.parquet", row_group=40, max_rows_per_page=6)
    good = bytes(good)
    wanted = np.unique(table.column("physical_offset").to_numpy()[::7])
    last = metadata.row_group(metadata.num_row_groups - 1).column(metadata.num_columns - 1)
    tail_start = last.data_page_offset + last.total_compressed_size  # page indexes, then the footer
    rng = random.Random(5)
    outcomes = {"refused": 0, "same": 0}
    for _ in range(300):
        damaged = bytearray(good)
        for _ in range(rng.choice([1, 1, 2, 4])):
            damaged[rng.randrange(tail_start, len(good) - 8)] = rng.randrange(256)
        try:
            damaged_metadata = pq.read_metadata(pa.BufferReader(bytes(damaged)))
            reference = by_row_groups(bytes(damaged), damaged_metadata, wanted)
        except (pa.ArrowException, OSError, ValueError, TypeError, AttributeError):
            continue  # pyarrow cannot read this file by row groups either
        try:
            page_map = P.page_map(memoryview(damaged), damaged_metadata, "physical_offset")
            got = P.read_pages([P.PagesWanted(memoryview(damaged), page_map, wanted)], columns=COLUMNS)
        except (P.LayoutRefused, pa.ArrowException):
            outcomes["refused"] += 1  # the lookup reads the row groups
            continue
        got = got.filter(pc.is_in(got.column("physical_offset"), pa.array(wanted)))
        assert got.equals(reference)
        outcomes["same"] += 1
    assert outcomes["refused"] and outcomes["same"]


def _walk_both(buf: memoryview, metadata: pq.FileMetaData):
    """The page index walked by the reference and by the column-wise route: (reference, fast), each a result or
    the refusal."""
    footer_start = len(buf) - 8 - int.from_bytes(bytes(buf[-8:-4]), "little")
    _, _, _, start = P._footer_head(P._Compact(buf, footer_start), metadata.num_columns, metadata)
    rows = np.array([metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
    results = []
    for walk in (
        lambda: P._offset_indexes(P._Compact(buf, start), rows, metadata.num_columns),
        lambda: P._offset_indexes_fast(buf, start, footer_start, rows, metadata.num_columns),
    ):
        try:
            first_rows, locations = walk()
            results.append(([f.tolist() for f in first_rows], [loc.tolist() for loc in locations]))
        except (P.LayoutRefused, IndexError, ValueError):
            results.append("refused")
    return results


@pytest.mark.parametrize(("count", "row_group", "page_rows"), [(1, 1, 1), (90, 40, 2), (700, 300, 17), (64, 64, 64)])
def test_the_column_wise_page_index_walk_equals_the_reference(tmp_path, count, row_group, page_rows):
    """Also with more than 15 pages a chunk (a list size after the list's header byte), and damaged bytes: the
    column-wise walk never accepts what the reference refuses or reads differently."""
    buf, metadata = write(
        rows(count, seed=count), tmp_path / "f.parquet", row_group=row_group, max_rows_per_page=page_rows
    )
    reference, fast = _walk_both(buf, metadata)
    assert reference != "refused" and fast == reference
    good = bytes(buf)
    last = metadata.row_group(metadata.num_row_groups - 1).column(metadata.num_columns - 1)
    index_start = last.data_page_offset + last.total_compressed_size
    footer_start = len(good) - 8 - int.from_bytes(good[-8:-4], "little")
    rng = random.Random(count)
    refused = 0
    for _ in range(200):
        damaged = bytearray(good)
        for _ in range(rng.choice([1, 2, 3])):
            damaged[rng.randrange(index_start, footer_start)] = rng.randrange(256)
        reference, fast = _walk_both(memoryview(damaged), metadata)
        if fast != "refused":
            assert fast == reference
        refused += fast == "refused"
    assert refused


@pytest.mark.parametrize("read_gap", [None, -1], ids=["spans of pages", "a pread per page"])
def test_a_memory_mapped_file_is_read_as_its_bytes_are(tmp_path, monkeypatch, read_gap):
    """The lake's memory map of a file (plain bytes), an Arrow buffer's memoryview (signed bytes) and the file's
    descriptor (its pages read with pread, in spans or one by one) read alike; a file cut short is refused, not
    read short."""
    if read_gap is not None:
        monkeypatch.setattr(P, "_READ_GAP", read_gap)
    table = rows(30, seed=4)
    buf, metadata = write(table, tmp_path / "f.parquet", row_group=10, max_rows_per_page=3)
    wanted = table.column("physical_offset").to_numpy()[::4]
    expected = by_row_groups(buf, metadata, wanted)
    storage = Storage(str(tmp_path))
    page_map = P.page_map(buf, metadata, "physical_offset")
    with storage.mapped_view("f.parquet") as view, storage.read_descriptor("f.parquet") as descriptor:
        assert bytes(view) == bytes(buf)
        for source in (view, memoryview(pa.py_buffer(bytes(buf))), descriptor):
            if not isinstance(source, int):
                mapped = P.page_map(source, metadata, "physical_offset")
                assert mapped.frame is page_map.frame
                for field in ("page_locations", "page_rows", "page_ends", "page_first_values"):
                    assert np.array_equal(getattr(mapped, field), getattr(page_map, field)), field
            got = P.read_pages([P.PagesWanted(source, page_map, wanted)], columns=COLUMNS)
            got = got.filter(pc.is_in(got.column("physical_offset"), pa.array(wanted)))
            assert got.equals(expected)
    last_page = int(page_map.page_locations[-1, -1].sum())  # where the last leaf's last page ends
    (tmp_path / "cut.parquet").write_bytes(bytes(buf)[: last_page - 1])
    with storage.read_descriptor("cut.parquet") as descriptor:
        for source in (descriptor, memoryview(bytes(buf)[: last_page - 1])):
            with pytest.raises(P.LayoutRefused, match="ends before its page"):
                P.read_pages([P.PagesWanted(source, page_map, page_map.page_first_values[-1:])], columns=COLUMNS)
    (tmp_path / "empty").write_bytes(b"")
    with storage.mapped_view("empty") as view:
        assert bytes(view) == b""
