"""Broker file bytes from Arrow batches column-wise: commitlog records, CQ units, index entries.

``formats.record.encode_record`` (one record at a time, from a ``Record``)
is the reference. Here a whole batch of ``commitlog`` rows is encoded at
once: the fixed-width fields as big-endian NumPy structured arrays, hosts
and topics once per distinct value, and the pieces of every record joined
by one Arrow kernel, whose data buffer is then the batch's records back to
back. A batch the reference would refuse (a null, an unparsable host, IPv6
bits that disagree with the hosts, a topic too long for its magic, oversized
properties, a TOTALSIZE the fields do not add up to) is not encoded here:
the caller runs the reference over it, which raises its own error, so both
routes fail alike (``tests/unit/test_store_columnar.py`` runs them side by
side).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    MAGIC_V1,
    MAGIC_V2,
    MAX_V1_TOPIC_BYTES,
    STOREHOST_V6_FLAG,
    record_sizes,
)
from rmqlake.lake.tables import COMMITLOG

MAX_PROPERTIES_BYTES = 32767
MAX_V2_TOPIC_BYTES = 32767

# TOTALSIZE .. BORNTIMESTAMP, STORETIMESTAMP, RECONSUMETIMES .. BODYLENGTH: the fixed fields between the hosts
_HEAD = np.dtype(
    [
        ("total_size", ">i4"),
        ("magic", ">i4"),
        ("body_crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("physical_offset", ">i8"),
        ("sys_flag", ">i4"),
        ("born_timestamp", ">i8"),
    ]
)
_STORE_TIME = np.dtype([("store_timestamp", ">i8")])
_TAIL = np.dtype([("reconsume_times", ">i4"), ("prepared_transaction_offset", ">i8"), ("body_length", ">i4")])
_PROPERTIES_LENGTH = np.dtype([("length", ">i2")])
CQ_UNIT = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
INDEX_ENTRY = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")])
# the integer columns' types in the table: a value of any other type is left to the reference
_INTEGER_TYPES = {f.name: f.type for f in COMMITLOG.arrow_schema if pa.types.is_integer(f.type)}
# columns whose null the reference encodes (as empty bytes); a null anywhere else is the reference's error
_NULL_AS_EMPTY = ("body", "properties_bytes")


@dataclass(frozen=True)
class EncodedRecords:
    """A batch's records back to back in ``data`` (row order); ``starts[i]`` is where row i begins in it."""

    physical_offset: np.ndarray  # int64, per row
    total_size: np.ndarray  # int64, per row
    starts: np.ndarray  # int64, rows + 1
    data: memoryview


def encode_record_batch(batch: pa.RecordBatch) -> EncodedRecords | None:
    """The records of a batch of ``commitlog`` rows (``store.rows.RECORD_COLUMNS``), or ``None`` when some row
    is one the reference refuses or encodes to another size than its TOTALSIZE (the caller then runs it)."""
    count = batch.num_rows
    for name in batch.schema.names:
        if name not in _NULL_AS_EMPTY and batch.column(name).null_count:
            return None
        if name in _INTEGER_TYPES and batch.column(name).type != _INTEGER_TYPES[name]:
            return None  # a wider integer type than the table's: the reference says what fits its field
    magic = batch.column("magic").to_numpy()
    if not np.isin(magic, (MAGIC_V1, MAGIC_V2)).all():
        return None
    is_v1 = magic == MAGIC_V1
    born = _hosts(batch.column("born_host"))
    store = _hosts(batch.column("store_host"))
    if born is None or store is None:
        return None
    born_field, born_v6 = born
    store_field, store_v6 = store
    sys_flag = batch.column("sys_flag").to_numpy()
    expected_flag = (sys_flag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)) | (born_v6 * BORNHOST_V6_FLAG)
    expected_flag |= store_v6 * STOREHOST_V6_FLAG
    if (expected_flag != sys_flag).any():
        return None
    topic_field, topic_length = _topics(batch.column("topic"), is_v1)
    if (is_v1 & (topic_length > MAX_V1_TOPIC_BYTES)).any() or (topic_length > MAX_V2_TOPIC_BYTES).any():
        return None
    body = _binary(batch.column("body"))
    properties = _binary(batch.column("properties_bytes"))
    body_length = pc.binary_length(body).to_numpy(zero_copy_only=False).astype(np.int64)
    properties_length = pc.binary_length(properties).to_numpy(zero_copy_only=False).astype(np.int64)
    if (properties_length > MAX_PROPERTIES_BYTES).any():
        return None
    size = record_sizes(
        body_lengths=body_length,
        topic_lengths=topic_length,
        properties_lengths=properties_length,
        born_v6=born_v6,
        store_v6=store_v6,
        magics=magic,
    )
    total_size = batch.column("total_size").to_numpy().astype(np.int64)
    if (size != total_size).any():
        return None

    head = np.empty(count, _HEAD)
    for name in _HEAD.names:
        head[name] = total_size if name == "total_size" else batch.column(name).to_numpy()
    store_time = np.empty(count, _STORE_TIME)
    store_time["store_timestamp"] = batch.column("store_timestamp").to_numpy()
    tail = np.empty(count, _TAIL)
    tail["reconsume_times"] = batch.column("reconsume_times").to_numpy()
    tail["prepared_transaction_offset"] = batch.column("prepared_transaction_offset").to_numpy()
    tail["body_length"] = body_length
    properties_field = np.empty(count, _PROPERTIES_LENGTH)
    properties_field["length"] = properties_length
    joined = pc.binary_join_element_wise(
        _fixed(head),
        born_field,
        _fixed(store_time),
        store_field,
        _fixed(tail),
        body,
        topic_field,
        _fixed(properties_field),
        properties,
        pa.scalar(b"", pa.large_binary()),
    )
    starts = np.frombuffer(joined.buffers()[1], np.int64)[joined.offset : joined.offset + count + 1]
    data = memoryview(joined.buffers()[2]) if count else memoryview(b"")
    if count and int(starts[-1] - starts[0]) != int(total_size.sum()):  # guards the pieces against the layout
        raise AssertionError(f"encoded {int(starts[-1] - starts[0])} bytes, TOTALSIZEs add up to {total_size.sum()}")
    return EncodedRecords(batch.column("physical_offset").to_numpy(), total_size, starts, data)


def _binary(column: pa.Array) -> pa.Array:
    return pc.fill_null(column, pa.scalar(b"", column.type)).cast(pa.large_binary())


def _fixed(values: np.ndarray) -> pa.Array:
    """A NumPy structured array as a ``large_binary`` array of its rows, without copying."""
    width = values.dtype.itemsize
    offsets = np.arange(0, width * (len(values) + 1), width, dtype=np.int64)
    return pa.Array.from_buffers(
        pa.large_binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(values.view(np.uint8))]
    )


def _hosts(column: pa.Array) -> tuple[pa.Array, np.ndarray] | None:
    """Each row's host field bytes and whether it is IPv6, parsing each distinct host once; ``None`` when one
    does not parse."""
    encoded = pc.dictionary_encode(column)
    fields, v6 = [], []
    for text in encoded.dictionary.to_pylist():
        try:
            host = parse_host(text)
        except ValueError:
            return None
        fields.append(host.encode())
        v6.append(host.is_ipv6)
    indices = encoded.indices
    return (
        pa.array(fields, pa.large_binary()).take(indices),
        np.array(v6, dtype=bool)[indices.to_numpy()].astype(np.int64),
    )


def _topics(column: pa.Array, is_v1: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Each row's topic field (length in 1 byte for V1, 2 for V2, then the UTF-8 bytes) and the byte length."""
    encoded = pc.dictionary_encode(column)
    v1, v2, lengths = [], [], []
    for text in encoded.dictionary.to_pylist():
        raw = text.encode("utf-8")
        lengths.append(len(raw))
        v1.append(struct.pack(">b", len(raw)) + raw if len(raw) <= MAX_V1_TOPIC_BYTES else b"")
        v2.append(struct.pack(">h", len(raw)) + raw if len(raw) <= MAX_V2_TOPIC_BYTES else b"")
    indices = encoded.indices
    field = pc.if_else(
        pa.array(is_v1),
        pa.array(v1, pa.large_binary()).take(indices),
        pa.array(v2, pa.large_binary()).take(indices),
    )
    return field, np.array(lengths, dtype=np.int64)[indices.to_numpy()]


def contiguous_runs(offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Row numbers where a run of back-to-back records begins (each next one starts where the last ends), plus
    the row count: run ``k`` is rows ``runs[k]`` to ``runs[k + 1]``."""
    if not len(offsets):
        return np.zeros(1, np.int64)
    breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + sizes[:-1]) + 1
    return np.concatenate(([0], breaks, [len(offsets)])).astype(np.int64)


def tiles(offsets: np.ndarray, sizes: np.ndarray, start: int, end: int) -> bool:
    """Whether the spans (offset, size) tile [start, end) exactly: no gap, no overlap."""
    if not len(offsets):
        return start == end
    order = np.lexsort((sizes, offsets))
    offsets, sizes = offsets[order], sizes[order]
    ends = np.cumsum(sizes) + start
    return bool(offsets[0] == start and (offsets[1:] == ends[:-1]).all() and ends[-1] == end)
