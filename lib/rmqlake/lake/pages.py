"""Rows of a Parquet data file read a page at a time: the point reads of key lookups.

A key lookup wants ~64 rows scattered over ~60 row groups. pyarrow reads whole
column chunks and costs ~15–20 µs per chunk however little it holds, so 60 row
groups of 20 columns cost ~20 ms before any decoding, and decoding ~1,400 rows
of 20 columns per wanted row costs the rest. A file written with
``WRITE_OPTIONS`` (pages of ``PAGE_ROWS`` rows in every column, an offset index,
no dictionary pages) allows instead:

* from the offset index, each page's place in the file and first row;
* from the looked-up column (sorted in our files), each page's first value;
* for the wanted values, their pages; those pages' bytes (header and
  compressed body, as stored) copied into one column chunk per column of a
  small Parquet file made in memory, which pyarrow decodes as one row group.
  The pages of every file a lookup needs go into that one file when the files
  share a frame (schema and writer), so pyarrow opens one file, not one per
  data file.

Nothing is decoded or re-encoded here: only the new file's frame (footer, chunk
metadata) is written, in Thrift's compact protocol, from the source file's own
schema bytes. A file whose layout does not allow it (written by Spark, with
dictionary pages, pages not aligned across columns, an offset index not where
pyarrow puts it) gets no ``PageMap`` and is read by row groups; the row-group
read stays the reference, and ``tests/unit/test_lake_pages.py`` compares both.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Rows a page: a lookup decodes this many rows per wanted row and column. The ingest write cost the same
# with pages of 256 rows as with pyarrow's default pages (1 KiB bodies); 128 cost +40-60 % in a study.
PAGE_ROWS = 256
# pyarrow writer options of the data files a lookup may read by pages (the commitlog's Parquet writers)
WRITE_OPTIONS = {"write_page_index": True, "max_rows_per_page": PAGE_ROWS, "use_dictionary": False}

_MAGIC = b"PAR1"

# Thrift compact protocol type codes (the ones Parquet's metadata uses)
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class LayoutRefused(ValueError):
    """The file cannot be read by pages (the row-group read applies)."""


class _Compact:
    """A reader of Thrift's compact protocol over bytes, enough for Parquet's footer, page index and headers."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def varint(self) -> int:
        buf, pos = self.buf, self.pos
        byte = buf[pos]
        pos += 1
        result = byte & 0x7F
        shift = 7
        while byte & 0x80:
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if shift > 70:
                raise LayoutRefused(f"varint longer than 10 bytes at {pos}")
        self.pos = pos
        return result

    def integer(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def field(self, last: int) -> tuple[int, int]:
        """(field id, type) of the next field header; (0, 0) at the struct's end."""
        header = self.buf[self.pos]
        self.pos += 1
        if header == 0:
            return 0, 0
        delta, kind = header >> 4, header & 0x0F
        return (last + delta if delta else self.integer()), kind

    def list_header(self) -> tuple[int, int]:
        header = self.buf[self.pos]
        self.pos += 1
        size = header >> 4
        return (self.varint() if size == 15 else size), header & 0x0F

    def skip(self, kind: int) -> None:
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.pos += 1
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.pos += 8
        elif kind == _BINARY:
            size = self.varint()  # read before the sum: ``pos += varint()`` would add to the old position
            self.pos += size
        elif kind in (_LIST, _SET):
            size, element = self.list_header()
            for _ in range(size):
                if element in (_TRUE, _FALSE):
                    self.pos += 1
                else:
                    self.skip(element)
        elif kind == _MAP:
            size = self.varint()
            if size:
                kinds = self.buf[self.pos]
                self.pos += 1
                for _ in range(size):
                    self.skip(kinds >> 4)
                    self.skip(kinds & 0x0F)
        elif kind == _STRUCT:
            last = 0
            while True:
                last, field_kind = self.field(last)
                if not field_kind:
                    return
                self.skip(field_kind)
        else:
            raise LayoutRefused(f"unknown Thrift type {kind} at {self.pos}")
        if self.pos > len(self.buf):
            raise LayoutRefused("Thrift value runs past the end")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _zigzag(value: int) -> bytes:
    """A compact-protocol integer (i16, i32, i64)."""
    return _varint((value << 1) ^ (value >> 63))


def _list_header(size: int, element: int) -> bytes:
    return bytes([size << 4 | element]) if size < 15 else bytes([0xF0 | element]) + _varint(size)


@dataclass(frozen=True)
class _Leaf:
    """A leaf column: its chunk metadata fields that do not change from row group to row group."""

    prefix: bytes  # ColumnMetaData fields 1-4 (type, encodings, path, codec) encoded, as the source file has them
    repeated: bool  # a leaf of a list or map: its pages' value counts are read from their headers
    column: str  # the top-level column it belongs to (the first name of its path): read only when that one is


@dataclass(frozen=True)
class _Frame:
    """What a made-up file takes from its source files' footers, encoded; files with equal frames (the same
    schema, columns and writer) have their pages read together."""

    head: bytes  # FileMetaData fields 1-2: version and schema
    leaves: tuple[_Leaf, ...]
    tail: bytes  # FileMetaData fields 5-6 (key/value metadata with the Arrow schema, created_by) and its end


@dataclass(frozen=True)
class PageMap:
    """Where the pages of a data file are, and the first value of the looked-up column in each."""

    frame: _Frame
    group_rows: np.ndarray  # rows per row group
    first_rows: tuple[np.ndarray, ...]  # per row group, each page's first row (the same in every column)
    page_groups: np.ndarray  # every page of the file in order: its row group,
    page_numbers: np.ndarray  # its number in the row group,
    page_ends: np.ndarray  # the row after its last in its row group,
    page_rows: np.ndarray  # its rows,
    page_locations: np.ndarray  # (pages, leaves, 2) int64: its offset and bytes in every leaf column,
    page_first_values: np.ndarray  # and the looked-up column's value in its first row (ascending)

    @property
    def nbytes(self) -> int:
        arrays = (*self.first_rows, self.page_groups, self.page_numbers, self.page_ends, self.page_rows)
        arrays += (self.page_locations, self.page_first_values)
        return sum(a.nbytes for a in arrays) + len(self.frame.head) + len(self.frame.tail)


def _unsigned(view: memoryview) -> memoryview:
    """``view`` as unsigned bytes (an Arrow buffer's memoryview has signed ones, and headers are read by value)."""
    return view if view.format == "B" else view.cast("B")


def page_map(buf: memoryview, metadata: pq.FileMetaData, column: str) -> PageMap:
    """The ``PageMap`` of the Parquet file whose bytes are ``buf``, for lookups by ``column``.

    Raises ``LayoutRefused`` when the file was not written so (see the module's docstring), or its metadata
    cannot be walked (a damaged file: the row-group read reports what is wrong with it).
    """
    try:
        return _page_map(_unsigned(memoryview(buf)), metadata, column)
    except (IndexError, ValueError, struct.error, pa.ArrowException) as error:
        if isinstance(error, LayoutRefused):
            raise
        raise LayoutRefused(f"metadata not readable: {error}") from error


def _page_map(buf: memoryview, metadata: pq.FileMetaData, column: str) -> PageMap:
    groups = metadata.num_row_groups
    leaf_count = metadata.num_columns
    if not groups or not metadata.num_rows:
        raise LayoutRefused("no rows")
    first = metadata.row_group(0).column(0)
    if not first.has_offset_index or first.has_dictionary_page:
        raise LayoutRefused("no offset index, or dictionary pages")
    footer_length = struct.unpack_from("<i", buf, len(buf) - 8)[0]
    if bytes(buf[-4:]) != _MAGIC or bytes(buf[:4]) != _MAGIC:
        raise LayoutRefused("not a plain Parquet file")
    if not 0 < footer_length < len(buf) - 12:
        raise LayoutRefused(f"footer length {footer_length}")
    reader = _Compact(buf, len(buf) - 8 - footer_length)
    version, schema, leaves, index_start = _footer_head(reader, leaf_count, metadata)
    group_rows = np.array([metadata.row_group(g).num_rows for g in range(groups)], np.int64)
    footer_start = len(buf) - 8 - footer_length
    first_rows, locations = _offset_indexes_fast(buf, index_start, footer_start, group_rows, leaf_count)
    last = metadata.row_group(groups - 1).column(leaf_count - 1)
    if int(locations[-1][-1, -1].sum()) != last.data_page_offset + last.total_compressed_size:
        raise LayoutRefused("the pages do not end where the last column chunk does")
    leaf = next((i for i in range(leaf_count) if metadata.schema.column(i).path == column), None)
    if leaf is None or leaves[leaf].repeated:
        raise LayoutRefused(f"no flat column {column}")
    values = pq.ParquetFile(pa.BufferReader(buf), metadata=metadata).read(columns=[column]).column(0)
    if values.null_count:
        raise LayoutRefused(f"{column} has nulls")
    values = values.to_numpy()
    if len(values) > 1 and not np.all(values[1:] > values[:-1]):
        raise LayoutRefused(f"{column} is not ascending")
    starts = np.concatenate([[0], np.cumsum(group_rows)[:-1]])
    page_groups = np.concatenate([np.full(len(rows), g, np.int32) for g, rows in enumerate(first_rows)])
    page_numbers = np.concatenate([np.arange(len(rows), dtype=np.int32) for rows in first_rows])
    page_rows = np.concatenate([starts[g] + rows for g, rows in enumerate(first_rows)])
    page_ends = np.concatenate([np.append(rows[1:], group_rows[g]) for g, rows in enumerate(first_rows)])
    return PageMap(
        frame=_frame(version, schema, leaves, metadata),
        group_rows=group_rows,
        first_rows=tuple(first_rows),
        page_groups=page_groups,
        page_numbers=page_numbers,
        page_ends=page_ends,
        page_rows=page_ends - np.concatenate(first_rows),
        # (leaves, pages, 2) per row group, turned page-first: a read takes every leaf of its chosen pages at once
        page_locations=np.concatenate([group.transpose(1, 0, 2) for group in locations]),
        page_first_values=values[page_rows],
    )


def _frame(version: int, schema: bytes, leaves: tuple[_Leaf, ...], metadata: pq.FileMetaData) -> _Frame:
    tail = bytearray()
    last = 4  # after the row groups
    if metadata.metadata:
        tail += b"\x19" + _list_header(len(metadata.metadata), _STRUCT)  # field 5: list<KeyValue>
        for key, value in metadata.metadata.items():
            tail += b"\x18" + _varint(len(key)) + key + b"\x18" + _varint(len(value)) + value + b"\x00"
        last = 5
    if metadata.created_by:
        created_by = metadata.created_by.encode()
        tail += bytes([(6 - last) << 4 | _BINARY]) + _varint(len(created_by)) + created_by
    tail += b"\x00"
    head = b"\x15" + _zigzag(version) + b"\x19" + schema
    frame = _Frame(head, leaves, bytes(tail))
    # One object per distinct frame (a lake has one or a few): a lookup groups its files by frame, and
    # comparing the same object is free where comparing equal ones walks every leaf.
    with _frames_lock:
        if len(_frames) < _FRAMES_KEPT:
            frame = _frames.setdefault(frame, frame)
    return frame


_FRAMES_KEPT = 64
_frames: dict[_Frame, _Frame] = {}
_frames_lock = threading.Lock()


def _footer_head(reader: _Compact, leaf_count: int, metadata: pq.FileMetaData) -> tuple:
    """Version, encoded schema, the leaves' chunk fields and where the offset indexes start, from the footer's
    first row group (the rest of the footer is not walked: pyarrow has parsed it)."""
    version, schema, last = None, None, 0
    while True:
        last, kind = reader.field(last)
        if not kind:
            raise LayoutRefused("footer without row groups")
        if last == 1 and kind == _I32:
            version = reader.integer()
        elif last == 2 and kind == _LIST:
            start = reader.pos
            reader.skip(_LIST)
            schema = bytes(reader.buf[start : reader.pos])
        elif last == 4 and kind == _LIST:
            break
        else:
            reader.skip(kind)
    if version is None or schema is None:
        raise LayoutRefused("footer without version or schema")
    reader.list_header()
    leaves, index_start = [], None
    last = 0
    while True:  # RowGroup 0
        last, kind = reader.field(last)
        if not kind:
            break
        if last != 1 or kind != _LIST:
            reader.skip(kind)
            continue
        count, _ = reader.list_header()
        if count != leaf_count:
            raise LayoutRefused(f"{count} column chunks for {leaf_count} columns")
        for number in range(count):
            prefix, offset_index = _column_chunk(reader)
            if offset_index is None:
                raise LayoutRefused(f"column {number} has no offset index")
            if number == 0:
                index_start = offset_index
            described = metadata.schema.column(number)
            leaves.append(_Leaf(prefix, described.max_repetition_level > 0, described.path.split(".")[0]))
    if index_start is None:
        raise LayoutRefused("no column chunks")
    return version, schema, tuple(leaves), index_start


def _column_chunk(reader: _Compact) -> tuple[bytes, int | None]:
    offset_index, prefix, last = None, None, 0
    while True:
        last, kind = reader.field(last)
        if not kind:
            break
        if last == 1 and kind == _BINARY:
            raise LayoutRefused("column chunk in another file")
        if last == 3 and kind == _STRUCT:
            prefix = _chunk_metadata(reader)
        elif last == 4 and kind == _I64:
            offset_index = reader.integer()
        elif last in (8, 9):
            raise LayoutRefused("encrypted column")
        else:
            reader.skip(kind)
    if prefix is None:
        raise LayoutRefused("column chunk without metadata")
    return prefix, offset_index


def _chunk_metadata(reader: _Compact) -> bytes:
    """ColumnMetaData fields 1-4 (type, encodings, path, codec), encoded again in order."""
    fields, last = {}, 0
    while True:
        last, kind = reader.field(last)
        if not kind:
            break
        if last in (2, 3) and kind == _LIST:
            start = reader.pos
            reader.skip(kind)
            fields[last] = bytes(reader.buf[start : reader.pos])
        elif last in (1, 4) and kind == _I32:
            fields[last] = reader.integer()
        elif last == 11:
            raise LayoutRefused("dictionary page")
        else:
            reader.skip(kind)
    if len(fields) != 4:
        raise LayoutRefused("column metadata without type, encodings, path or codec")
    return b"\x15" + _zigzag(fields[1]) + b"\x19" + fields[2] + b"\x19" + fields[3] + b"\x15" + _zigzag(fields[4])


_LOCATION_TOKENS = 7  # a PageLocation: 0x16 offset 0x15 size 0x16 first-row 0x00, each byte or varint one token
_LOCATION_MARKS = np.array([0x16, -1, 0x15, -1, 0x16, -1, 0x00])  # the field headers and the end; -1: a value


def _offset_indexes_fast(buf, start: int, end: int, group_rows: np.ndarray, leaf_count: int) -> tuple[list, list]:
    """``_offset_indexes``'s result, with the page locations decoded column-wise.

    In Thrift's compact protocol every varint ends with the one byte below 0x80 in it, and the field headers
    and struct ends of a PageLocation are single bytes below 0x80 too: counted in such "terminator" bytes, each
    PageLocation is exactly 7 tokens. So only the few bytes around each OffsetIndex's list (its header, the
    optional list of unencoded sizes after it) are walked in Python; the locations' values are gathered and
    decoded for the whole file at once, then checked as ``_offset_indexes`` checks them.
    """
    region = np.frombuffer(buf, np.uint8, offset=start, count=end - start)  # the page indexes, up to the footer
    is_terminator = region < 0x80
    terminators = np.flatnonzero(is_terminator)
    # scalar reads in the loop go through memoryviews: a NumPy scalar costs ~10x a Python int
    data, ends_at = buf[start:end], memoryview(terminators)
    before = memoryview(np.concatenate([[0], np.cumsum(is_terminator, dtype=np.int64)]))  # terminators before
    firsts_token, counts = [], []
    position = 0
    for _ in range(len(group_rows) * leaf_count):
        if data[position] != 0x19:  # field 1, a list
            raise LayoutRefused(f"offset index at {start + position} does not start with its page locations")
        count, position = _list_at(data, position + 1, _STRUCT, start)
        if not count:
            raise LayoutRefused(f"offset index at {start + position} without pages")
        token = before[position]
        firsts_token.append(token)
        counts.append(count)
        position = ends_at[token + _LOCATION_TOKENS * count - 1] + 1
        if data[position] == 0x19:  # field 2: the pages' unencoded byte sizes, list<i64>: skipped
            sizes, position = _list_at(data, position + 1, _I64, start)
            if sizes:
                position = ends_at[before[position] + sizes - 1] + 1
        if data[position] != 0:
            raise LayoutRefused(f"offset index at {start + position} with more fields than pyarrow writes")
        position += 1
    counts = np.array(counts, np.int64)
    tokens = np.repeat(np.array(firsts_token, np.int64), counts)
    tokens += _LOCATION_TOKENS * (np.arange(len(tokens)) - np.repeat(np.cumsum(counts) - counts, counts))
    tokens = tokens[:, None] + np.arange(_LOCATION_TOKENS)  # (pages, 7)
    if tokens.max() >= len(terminators):
        raise LayoutRefused("page locations run past the page index")
    ends = terminators[tokens]
    marks = _LOCATION_MARKS >= 0
    if np.any(region[ends[:, marks]] != _LOCATION_MARKS[marks]) or np.any(ends[:, 2::2] - ends[:, 1::2] != 1):
        raise LayoutRefused("page locations are not (offset, size, first row)")
    values = np.zeros((len(tokens), 3), np.uint64)
    lengths = ends[:, 1::2] - ends[:, 0:-1:2]  # bytes of each varint: after the header, up to its terminator
    if lengths.max() > 9:
        raise LayoutRefused("page location value beyond 63 bits")
    for byte in range(int(lengths.max())):
        present = lengths > byte
        at = np.where(present, ends[:, 0:-1:2] + 1 + byte, 0)
        values |= np.where(present, (region[at] & 0x7F).astype(np.uint64) << np.uint64(7 * byte), 0).astype(np.uint64)
    decoded = (values >> np.uint64(1)).astype(np.int64) ^ -(values & np.uint64(1)).astype(np.int64)
    return _checked_locations(decoded, counts, group_rows, leaf_count)


def _list_at(data, position: int, element: int, start: int) -> tuple[int, int]:
    """(size, position after the header) of the list header at ``position``, whose elements must be ``element``."""
    header = data[position]
    if header & 0x0F != element:
        raise LayoutRefused(f"offset index at {start + position}: a list of type {header & 0x0F}, not {element}")
    if header >> 4 != 15:
        return header >> 4, position + 1
    reader = _Compact(data, position + 1)
    return reader.varint(), reader.pos


def _checked_locations(decoded: np.ndarray, counts: np.ndarray, group_rows: np.ndarray, leaf_count: int):
    """Per row group its pages' first rows and (leaves, pages, 2) locations, from every page location of the
    file in order (offset, size, first row), checked as ``_offset_indexes`` checks them."""
    offsets, sizes, firsts = decoded[:, 0], decoded[:, 1], decoded[:, 2]
    if offsets[0] != len(_MAGIC) or np.any(offsets[1:] != offsets[:-1] + sizes[:-1]) or np.any(sizes <= 0):
        raise LayoutRefused("pages are not back to back from the file's start")
    per_group = counts.reshape(len(group_rows), leaf_count)
    if np.any(per_group != per_group[:, :1]):
        raise LayoutRefused("pages are not aligned across columns")
    first_rows, locations = [], []
    page = 0
    for group, rows in enumerate(group_rows.tolist()):
        pages = int(per_group[group, 0])
        span = slice(page, page + pages * leaf_count)
        group_firsts = firsts[span].reshape(leaf_count, pages)
        if np.any(group_firsts != group_firsts[:1]):
            raise LayoutRefused("pages are not aligned across columns")
        row_firsts = group_firsts[0]
        if row_firsts[0] != 0 or row_firsts[-1] >= rows or np.any(np.diff(row_firsts) <= 0):
            raise LayoutRefused("page first rows out of order")
        first_rows.append(row_firsts.copy())
        locations.append(np.stack([offsets[span], sizes[span]], axis=-1).reshape(leaf_count, pages, 2))
        page = span.stop
    return first_rows, locations


def _offset_indexes(reader: _Compact, group_rows: np.ndarray, leaf_count: int) -> tuple[list, list]:
    """Every column chunk's offset index, walked in the order pyarrow writes them (row group by row group, column
    by column, back to back), checked to describe pages that follow each other from the file's start to its
    last chunk's end, with the same first rows in every column of a row group.

    The reference of ``_offset_indexes_fast``, which a page map uses: a struct at a time, ~20x slower."""
    first_rows, locations = [], []
    end = len(_MAGIC)
    for rows in group_rows:
        group_locations, group_first = [], None
        for _ in range(leaf_count):
            offsets, sizes, firsts = _offset_index(reader)
            if not offsets or offsets[0] != end:
                raise LayoutRefused("a column chunk's pages do not start where the previous chunk's end")
            for offset, size in zip(offsets[1:], sizes, strict=False):
                end += size
                if offset != end:
                    raise LayoutRefused("pages of a column chunk are not back to back")
            end += sizes[-1]
            if group_first is None:
                group_first = firsts
                if firsts[0] != 0 or firsts[-1] >= rows or any(b <= a for a, b in itertools.pairwise(firsts)):
                    raise LayoutRefused("page first rows out of order")
            elif firsts != group_first:
                raise LayoutRefused("pages are not aligned across columns")
            group_locations.append((offsets, sizes))
        first_rows.append(np.array(group_first, np.int64))
        locations.append(np.array([np.column_stack(pair) for pair in group_locations], np.int64))
    return first_rows, locations


def _offset_index(reader: _Compact) -> tuple[list[int], list[int], list[int]]:
    """One OffsetIndex: its pages' offsets, sizes and first rows. The page locations are read inline (there are
    tens of thousands in a file); anything else goes through the generic reader."""
    offsets, sizes, firsts = [], [], []
    last = 0
    while True:
        last, kind = reader.field(last)
        if not kind:
            return offsets, sizes, firsts
        if last != 1 or kind != _LIST:
            reader.skip(kind)
            continue
        count, element = reader.list_header()
        if element != _STRUCT:
            raise LayoutRefused("offset index without page locations")
        buf, pos = reader.buf, reader.pos
        for _ in range(count):
            # PageLocation: offset (i64), compressed_page_size (i32), first_row_index (i64), then its end
            values = []
            for header in (0x16, 0x15, 0x16):
                if buf[pos] != header:
                    break
                byte = buf[pos + 1]
                pos += 2
                value, shift = byte & 0x7F, 7
                while byte & 0x80:
                    byte = buf[pos]
                    pos += 1
                    value |= (byte & 0x7F) << shift
                    shift += 7
                values.append((value >> 1) ^ -(value & 1))
            if len(values) != 3 or buf[pos] != 0:
                raise LayoutRefused(f"page location at {pos} is not (offset, size, first row)")
            pos += 1
            offsets.append(values[0])
            sizes.append(values[1])
            firsts.append(values[2])
        reader.pos = pos


def _page_values(buf, offset: int) -> int:
    """The value count in a data page's header (v1 or v2): its levels, for a leaf of a list or map.

    pyarrow's headers start type, uncompressed size, compressed size (three i32 fields, bytes 0x15) and then
    the data page header (0x2c: field 5, a struct; 0x1c after a crc, field 4) whose first field is the count
    (0x15): read inline; any other header goes through the generic reader.
    """
    position = offset
    for _ in range(3):
        if buf[position] != 0x15:
            return _page_values_generic(buf, offset)
        position += 1
        while buf[position] & 0x80:
            position += 1
        position += 1
    if buf[position] != 0x2C or buf[position + 1] != 0x15:
        return _page_values_generic(buf, offset)
    position += 2
    value, shift = 0, 0
    while True:
        byte = buf[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1)


def _page_values_generic(buf, offset: int) -> int:
    reader = _Compact(buf, offset)
    last = 0
    while True:
        last, kind = reader.field(last)
        if not kind:
            raise LayoutRefused(f"page at {offset} is not a data page")
        if last in (5, 8) and kind == _STRUCT:
            inner, inner_kind = reader.field(0)
            if inner != 1 or inner_kind != _I32:
                raise LayoutRefused(f"data page header at {offset} does not start with its value count")
            return reader.integer()
        reader.skip(kind)


@dataclass(frozen=True)
class PagesWanted:
    """A file's part of a page read: the file (its bytes, or an open descriptor of it), its page map, and the
    values wanted from it (sorted).

    A descriptor's pages are read with ``pread``, after the kernel is told of them all (``_PageReads``): a
    lookup's ~1,300 pages lie scattered over ~15 files, and those not in the page cache are then fetched
    together. Through a memory map each would fault in on its own when touched.
    """

    source: memoryview | int
    pages: PageMap
    values: np.ndarray


def read_pages(parts: list[PagesWanted], *, columns: list[str]) -> pa.Table | None:
    """The rows of the pages that can hold each part's values, read as one row group of one file made of those
    pages (``None``: no page can); the caller filters them to the values wanted.

    The parts must have equal frames (``PageMap.frame``): their pages then go into the same column chunks.
    Only the leaves of ``columns`` are copied: the made-up file's other column chunks are left empty, which
    pyarrow never looks into, as it reads the chunks of the columns asked for only.
    """
    frame = parts[0].pages.frame
    if any(part.pages.frame != frame for part in parts):
        raise ValueError("pages of files with different frames cannot be read together")
    read = _leaves_read(frame, columns)
    sources, located, total_rows = [], [], 0
    for part in parts:
        pages = part.pages
        chosen = np.unique(np.searchsorted(pages.page_first_values, part.values, side="right") - 1)
        chosen = chosen[chosen >= 0]
        if not len(chosen):
            continue
        total_rows += int(pages.page_rows[chosen].sum())
        sources.append(part.source if isinstance(part.source, int) else _unsigned(memoryview(part.source)))
        located.append(pages.page_locations[chosen][:, read].transpose(1, 0, 2))  # (leaves read, pages, 2)
    if not sources:
        return None
    # The made-up file: its magic, then leaf after leaf the chosen pages of every part in order, then its footer
    # (at most ``_footer_bound`` bytes). Each page's place in it follows from the sizes alone.
    pages_per_part = [part_located.shape[1] for part_located in located]
    every = np.concatenate(located, axis=1)  # (leaves read, pages of all parts, 2)
    offsets, sizes = every[:, :, 0].ravel(), every[:, :, 1].ravel()
    source_of = np.tile(np.repeat(np.arange(len(sources)), pages_per_part), every.shape[0])
    places = np.cumsum(sizes) - sizes + len(_MAGIC)
    data_end = len(_MAGIC) + int(sizes.sum())
    reads = []
    for number, source in enumerate(sources):
        mine = np.flatnonzero(source_of == number)
        reads.append(_PageReads.of(offsets[mine], sizes[mine], places[mine]))
        if isinstance(source, int):
            reads[-1].advise(source)
    made = bytearray(data_end + _footer_bound(frame) + 8)
    with memoryview(made) as out:
        out[: len(_MAGIC)] = _MAGIC
        for source, pages_read in zip(sources, reads, strict=True):
            pages_read.copy(source, out)
        chunks, per_leaf, read_number = [], every.shape[1], 0
        for leaf_number, leaf in enumerate(frame.leaves):
            if not read[leaf_number]:
                chunks.append((leaf, data_end, 0, 0))
                continue
            first = read_number * per_leaf
            start, end = int(places[first]), int(places[first + per_leaf - 1] + sizes[first + per_leaf - 1])
            read_number += 1
            # a leaf of a list or map has as many values as its pages' levels: read from the headers copied
            if leaf.repeated:
                value_count = sum(_page_values(out, at) for at in places[first : first + per_leaf].tolist())
            else:
                value_count = total_rows
            chunks.append((leaf, start, end - start, value_count))
        footer = _footer(frame, chunks, total_rows, data_bytes=data_end - len(_MAGIC))
        end = data_end + len(footer) + 8
        out[data_end:end] = footer + struct.pack("<i", len(footer)) + _MAGIC
    # pre_buffer off: the file is in memory, and pre-buffering would copy each chunk once more (~1/3 of the read)
    made_file = pa.BufferReader(pa.py_buffer(made).slice(0, end))
    return pq.ParquetFile(made_file, pre_buffer=False).read(columns=columns, use_threads=True)


def _leaves_read(frame: _Frame, columns: list[str]) -> np.ndarray:
    """Per leaf of ``frame``, whether a read of ``columns`` decodes it (every leaf, if a name is not a leaf's
    top-level column: pyarrow also takes a dotted path, which a top-level name does not cover)."""
    names = [leaf.column for leaf in frame.leaves]
    if not set(columns) <= set(names):
        return np.ones(len(names), bool)
    return np.isin(names, list(columns))


# Pages of one file closer than this are read with one ``pread`` (the gap read too). A lookup's ~1,300 pages lie
# in ~60 row groups; in a row group the pages of neighbouring small columns are a few KiB apart. Merging them
# cut the reads ~6x for ~4x the bytes: each ``pread`` costs ~2-3 us with Python around it, a cached KiB ~0.2 us.
_READ_GAP = 16 * 1024


@dataclass(frozen=True)
class _PageReads:
    """How one file's chosen pages are read: in offset order, in spans of pages less than ``_READ_GAP`` apart."""

    offsets: list[int]  # each page's offset in the file, ascending
    ends: list[int]  # and its end there
    places: list[int]  # and its place in the made-up file
    spans: list[tuple[int, int, int, int]]  # (first page, page after the last, start, end in the file)

    @classmethod
    def of(cls, offsets: np.ndarray, sizes: np.ndarray, places: np.ndarray) -> _PageReads:
        order = np.argsort(offsets, kind="stable")
        offsets, ends, places = offsets[order], offsets[order] + sizes[order], places[order]
        reach = np.maximum.accumulate(ends)
        breaks = np.flatnonzero(offsets[1:] - reach[:-1] > _READ_GAP) + 1
        firsts, lasts = np.concatenate(([0], breaks)), np.concatenate((breaks, [len(offsets)]))
        spans = zip(firsts.tolist(), lasts.tolist(), offsets[firsts].tolist(), reach[lasts - 1].tolist(), strict=True)
        return cls(offsets.tolist(), ends.tolist(), places.tolist(), list(spans))

    def advise(self, descriptor: int) -> None:
        """Tell the kernel of every span, so that the pages it does not hold are fetched together (one after
        another, each would wait for the disk): every file of a read is advised before any is copied."""
        if hasattr(os, "posix_fadvise"):
            for _, _, start, end in self.spans:
                os.posix_fadvise(descriptor, start, end - start, os.POSIX_FADV_WILLNEED)

    def copy(self, source: memoryview | int, out: memoryview) -> None:
        """The pages copied from ``source`` (a descriptor: a ``pread`` per span; a buffer: sliced) to their places
        in ``out``. A page past the file's end is refused with its offset."""
        offsets, ends, places = self.offsets, self.ends, self.places
        if not isinstance(source, int):
            for offset, end, place in zip(offsets, ends, places, strict=True):
                if end > len(source):
                    raise LayoutRefused(f"the file ends before its page at {offset} does")
                out[place : place + end - offset] = source[offset:end]
            return
        scratch = bytearray(max(end - start for _, _, start, end in self.spans))
        with memoryview(scratch) as span:
            for first, last, start, end in self.spans:
                if last - first == 1:  # one page: straight into its place
                    got = os.preadv(source, [out[places[first] : places[first] + end - start]], start)
                else:
                    got = os.preadv(source, [span[: end - start]], start)
                if got != end - start:
                    short = next(offset for offset, page_end in zip(offsets[first:last], ends[first:last])
                                 if page_end > start + got)  # fmt: skip
                    raise LayoutRefused(f"the file ends before its page at {short} does")
                if last - first > 1:
                    for offset, page_end, place in zip(offsets[first:last], ends[first:last], places[first:last]):
                        out[place : place + page_end - offset] = span[offset - start : page_end - start]


def _footer_bound(frame: _Frame) -> int:
    """Bytes ``_footer`` writes at most for ``frame``: its head and tail, 3 integer fields (a field header and a
    varint of at most 10 bytes each) and 10 bytes of headers, and per leaf its prefix, 5 integer fields and 3
    bytes of headers and ends."""
    return len(frame.head) + len(frame.tail) + 3 * 11 + 10 + sum(len(leaf.prefix) + 5 * 11 + 3 for leaf in frame.leaves)


def _footer(frame: _Frame, chunks: list, rows: int, *, data_bytes: int) -> bytes:
    """The made-up file's FileMetaData: one row group whose column chunks are the pages copied (field headers
    written by hand: each byte is a field id delta and a type, as ``_Compact.field`` reads them)."""
    out = bytearray(frame.head)  # fields 1-2
    out += b"\x16" + _zigzag(rows)  # 3: num_rows (i64)
    out += b"\x19\x1c"  # 4: row_groups, a list of one struct
    out += b"\x19" + _list_header(len(chunks), _STRUCT)  # RowGroup 1: columns
    for leaf, start, size, value_count in chunks:
        out += b"\x26" + _zigzag(start) + b"\x1c"  # ColumnChunk 2: file_offset; 3: meta_data
        out += leaf.prefix  # ColumnMetaData 1-4
        out += b"\x16" + _zigzag(value_count)  # 5: num_values
        out += b"\x16" + _zigzag(size) + b"\x16" + _zigzag(size)  # 6, 7: sizes (pyarrow reads by the compressed)
        out += b"\x26" + _zigzag(start) + b"\x00\x00"  # 9: data_page_offset; the ends of both structs
    out += b"\x16" + _zigzag(data_bytes) + b"\x16" + _zigzag(rows) + b"\x00"  # RowGroup 2, 3, end
    out += frame.tail
    return bytes(out)
