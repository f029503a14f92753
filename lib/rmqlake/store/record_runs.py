"""Commitlog rows from a run of records in a broker's commitlog file, decoded column-wise.

``imports._SegmentReader`` (one record at a time with
``formats.record.decode_record``) is the reference. Here the records from
a position on are walked by their TOTALSIZE fields (the one per-record
Python step), and the longest run of them that passes every check the
reference makes is decoded at once: fixed fields with NumPy gathers from
the file's bytes, bodies, topics and properties as Arrow views over them,
properties parsed with Arrow string kernels. The run ends before the first
record that is not a message passing every check (a damaged record, the
end-of-file blank, zeros): the reference reads that one, so corrupt ranges,
resyncing and the end of a file stay its alone
(``tests/unit/test_store_columnar.py`` compares both over damaged files).
"""

from __future__ import annotations

import ipaddress
import struct
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.hosts import HostAddress
from rmqlake.formats.msgid import offset_msg_id_prefix, offset_msg_ids_with_prefix
from rmqlake.formats.properties import (
    KEY_SEPARATOR,
    KEYS,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
    UNIQ_KEY,
    parse_properties,
    split_keys,
)
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    FIXED_FIELDS_LENGTH,
    MAGIC_V1,
    MAGIC_V2,
    MAX_PORT,
    STOREHOST_V6_FLAG,
)
from rmqlake.formats.topic import topic_error

# the smallest record: IPv4 hosts, a V1 topic length byte, empty body, topic and properties
MIN_RECORD_SIZE = FIXED_FIELDS_LENGTH + 8 + 8 + 1
RUN_ROWS = 16384  # records decoded at once
# fewer records than this are read by the reference: its cost per record is below this route's cost per run
MIN_RUN_RECORDS = 64
RUN_BYTES = 1 << 30  # and at most this many bytes of them (Arrow views address a buffer with 32-bit offsets)
_SIZE_AND_MAGIC = struct.Struct(">ii")
_HEAD = np.dtype(
    [("total_size", ">i4"), ("magic", ">i4"), ("body_crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
     ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"), ("born_timestamp", ">i8")]
)  # fmt: skip


def read_run(data, position: int, length: int, *, start_offset: int, name: str, path: str, first_ordinal: int,
             check_crc: bool, schema: pa.Schema) -> tuple[pa.RecordBatch, int] | None:  # fmt: skip
    """The rows of the messages from ``position`` of ``data`` (a mapped commitlog file of ``length`` bytes) up to
    the first record the reference would not read as a message passing every check, and the position after the
    last of them; ``None`` when the record at ``position`` is not such a message.

    ``first_ordinal`` is the ``source_line`` of the first row.
    """
    starts, sizes = _walk(data, position, length)
    if len(starts) < MIN_RUN_RECORDS:
        return None
    end = starts[-1] + sizes[-1]
    chunk = data[position:end]  # a copy: no Arrow or NumPy object outlives the run holding the mapped file
    run = _Run(chunk, np.array(starts, np.int64) - position, np.array(sizes, np.int64))
    count = run.clean_prefix(start_offset=start_offset + position, check_crc=check_crc)
    if not count:
        return None
    batch = run.batch(count, name=name, path=path, first_ordinal=first_ordinal, schema=schema)
    return batch, position + int(run.starts[count - 1] + run.sizes[count - 1])


def _walk(data, position: int, length: int) -> tuple[list[int], list[int]]:
    """Positions and sizes of the records from ``position`` by their TOTALSIZE, while each has a message magic
    code and a size that could hold a record inside the file."""
    unpack = _SIZE_AND_MAGIC.unpack_from
    starts: list[int] = []
    sizes: list[int] = []
    at, limit = position, position + RUN_BYTES
    while len(starts) < RUN_ROWS and length - at >= MIN_RECORD_SIZE:
        size, magic = unpack(data, at)
        if (magic != MAGIC_V1 and magic != MAGIC_V2) or size < MIN_RECORD_SIZE or size > length - at:
            break
        if at + size > limit and starts:
            break
        starts.append(at)
        sizes.append(size)
        at += size
    return starts, sizes


class _Run:
    """The records of one run: their fields, gathered column-wise, and which of them are clean."""

    def __init__(self, chunk: bytes, starts: np.ndarray, sizes: np.ndarray):
        self.chunk = chunk
        self.u8 = np.frombuffer(chunk, np.uint8)
        self.starts, self.sizes = starts, sizes

    def int_at(self, at: np.ndarray, width: int) -> np.ndarray:
        """The big-endian signed ints of ``width`` bytes at ``at`` (positions clipped into the chunk: a value
        read outside a record belongs to a record that is not clean)."""
        at = np.clip(at, 0, len(self.u8) - width)
        raw = self.u8[at[:, None] + np.arange(width)]
        return raw.view(f">i{width}").ravel().astype(np.int64)

    def views(self, at: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """``binary`` values of ``lengths`` bytes at ``at`` (built as Arrow binary views, then copied out)."""
        count = len(at)
        views = np.zeros((count, 16), np.uint8)
        words = views.view(np.int32)
        words[:, 0] = lengths
        inline = lengths <= 12
        for byte in range(12):
            keep = (byte < lengths) & (inline | (byte < 4))
            views[:, 4 + byte] = np.where(keep, self.u8[np.clip(at + byte, 0, len(self.u8) - 1)], 0)
        words[~inline, 2] = 0
        words[~inline, 3] = at[~inline]
        buffers = [None, pa.py_buffer(views), pa.py_buffer(self.chunk)]
        return pa.Array.from_buffers(pa.binary_view(), count, buffers).cast(pa.binary())

    def clean_prefix(self, *, start_offset: int, check_crc: bool) -> int:
        """How many records from the first are messages passing every check of the reference; gathers their
        fields on the way."""
        rel, end = self.starts, self.starts + self.sizes
        # the fields up to BORNHOST sit at the same place in every record: one gather of 48 bytes a record
        head = self.u8[np.clip(rel, 0, len(self.u8) - _HEAD.itemsize)[:, None] + np.arange(_HEAD.itemsize)]
        fields = np.ascontiguousarray(head).view(_HEAD).ravel()
        self.magic = fields["magic"].astype(np.int64)
        self.body_crc = fields["body_crc"].astype(np.int64)
        self.queue_id = fields["queue_id"].astype(np.int64)
        self.flag = fields["flag"].astype(np.int64)
        self.queue_offset = fields["queue_offset"].astype(np.int64)
        self.physical_offset = fields["physical_offset"].astype(np.int64)
        self.sys_flag = fields["sys_flag"].astype(np.int64)
        self.born_timestamp = fields["born_timestamp"].astype(np.int64)
        born_length = np.where(self.sys_flag & BORNHOST_V6_FLAG, 20, 8)
        store_length = np.where(self.sys_flag & STOREHOST_V6_FLAG, 20, 8)
        born_at = rel + 48
        store_time_at = born_at + born_length
        store_at = store_time_at + 8
        tail_at = store_at + store_length
        self.store_timestamp = self.int_at(store_time_at, 8)
        self.reconsume_times = self.int_at(tail_at, 4)
        self.prepared_transaction_offset = self.int_at(tail_at + 4, 8)
        body_length = self.int_at(tail_at + 12, 4)
        body_at = tail_at + 16
        topic_field_at = body_at + body_length
        v1 = self.magic == MAGIC_V1
        topic_field = np.where(v1, 1, 2)
        topic_length = np.where(v1, self.int_at(topic_field_at, 1), self.int_at(topic_field_at, 2))
        topic_at = topic_field_at + topic_field
        properties_field_at = topic_at + topic_length
        properties_length = self.int_at(properties_field_at, 2)
        properties_at = properties_field_at + 2
        ok = (body_at <= end) & (body_length >= 0) & (topic_field_at <= end)
        ok &= (topic_at <= end) & (topic_length >= 0) & (properties_field_at + 2 <= end)
        ok &= (properties_length >= 0) & (properties_at + properties_length == end)  # the size formula
        ok &= self.physical_offset == start_offset + rel
        ok &= self.queue_id >= 0
        count = _leading(ok)
        if not count:
            return 0
        self.trim(count, born_at, born_length, store_at, store_length, body_at, body_length, topic_at, topic_length,
                  properties_at, properties_length)  # fmt: skip
        if check_crc:  # the reference's body CRC: zlib's CRC-32 of each body, sign bit cleared
            view = memoryview(self.chunk)
            crc32 = zlib.crc32
            spans = zip(self.body_at.tolist(), (self.body_at + self.body_length).tolist(), strict=True)
            crcs = np.fromiter((crc32(view[a:b]) for a, b in spans), np.int64, count=len(self.body_at))
            ok = (crcs & 0x7FFFFFFF) == self.body_crc
        else:
            ok = np.ones(count, bool)
        self.born_host, born_ok = self.hosts(self.born_at, self.born_length)
        self.store_host, store_ok = self.hosts(self.store_at, self.store_length, msg_ids=True)
        ok &= born_ok & store_ok
        self.topic, topic_ok = self.topics()
        ok &= topic_ok
        self.properties_bytes = self.views(self.properties_at, self.properties_length)
        ok &= _utf8(self.properties_bytes)
        return _leading(ok)

    def trim(self, count: int, *arrays) -> None:
        names = ("born_at", "born_length", "store_at", "store_length", "body_at", "body_length", "topic_at",
                 "topic_length", "properties_at", "properties_length")  # fmt: skip
        for name, values in zip(names, arrays, strict=True):
            setattr(self, name, values[:count])
        for name in ("starts", "sizes", "magic", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
                     "sys_flag", "born_timestamp", "store_timestamp", "reconsume_times",
                     "prepared_transaction_offset"):  # fmt: skip
            setattr(self, name, getattr(self, name)[:count])

    def hosts(self, at: np.ndarray, lengths: np.ndarray, *, msg_ids: bool = False) -> tuple[pa.Array, np.ndarray]:
        """Each record's host as text, and whether the reference keeps it (port 0..65535, an IPv6 field not
        holding an IPv4-mapped address); each distinct host is looked at once."""
        fields = self.u8[np.clip(at, 0, len(self.u8) - 20)[:, None] + np.arange(20)]
        fields[lengths == 8, 8:] = 0
        keys = np.ascontiguousarray(np.concatenate([fields, (lengths == 20)[:, None].astype(np.uint8)], axis=1))
        width = keys.shape[1]
        encoded = pc.dictionary_encode(
            pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(keys), [None, pa.py_buffer(keys)])
        )  # hashing: each distinct host once
        distinct = np.frombuffer(encoded.dictionary.buffers()[1], np.uint8)[
            encoded.dictionary.offset * width : (encoded.dictionary.offset + len(encoded.dictionary)) * width
        ].reshape(-1, width)
        inverse = encoded.indices.to_numpy()
        texts, kept, prefixes = [], [], []
        for key in distinct:
            raw = key[:20].tobytes() if key[20] else key[:8].tobytes()
            host = HostAddress(raw[:-4], int.from_bytes(raw[-4:], "big", signed=True))
            keep = 0 <= host.port <= MAX_PORT
            if keep and host.is_ipv6:
                keep = ipaddress.IPv6Address(host.address).ipv4_mapped is None
            kept.append(keep)
            texts.append(host.text if keep else "")
            prefixes.append(offset_msg_id_prefix(host) if keep else "")
        if msg_ids:
            self.prefix = pa.array(prefixes, pa.string()).take(pa.array(inverse))
        return pa.array(texts, pa.string()).take(pa.array(inverse)), np.array(kept, bool)[inverse]

    def topics(self) -> tuple[pa.Array, np.ndarray]:
        """Each record's topic, and whether the reference keeps it (UTF-8, passing the topic rules)."""
        raw = self.views(self.topic_at, self.topic_length)
        encoded = pc.dictionary_encode(raw)
        texts, kept = [], []
        for value in encoded.dictionary.to_pylist():
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                texts.append("")
                kept.append(False)
                continue
            texts.append(text)
            kept.append(topic_error(text) is None)
        indices = encoded.indices
        return pa.array(texts, pa.string()).take(indices), np.array(kept, bool)[indices.to_numpy()]

    def batch(self, count: int, *, name: str, path: str, first_ordinal: int, schema: pa.Schema) -> pa.RecordBatch:
        """The rows of the first ``count`` records (all clean), as the reference builds them."""
        properties = self.properties_bytes.slice(0, count)
        parsed = _parsed_properties(properties, count)
        columns = {
            "segment": pa.repeat(pa.scalar(name, pa.string()), count),
            "physical_offset": self.physical_offset[:count],
            "total_size": self.sizes[:count],
            "magic": self.magic[:count],
            "body_crc": self.body_crc[:count],
            "queue_id": self.queue_id[:count],
            "flag": self.flag[:count],
            "queue_offset": self.queue_offset[:count],
            "sys_flag": self.sys_flag[:count],
            "born_timestamp": self.born_timestamp[:count],
            "born_host": self.born_host.slice(0, count),
            "store_timestamp": self.store_timestamp[:count],
            "store_host": self.store_host.slice(0, count),
            "reconsume_times": self.reconsume_times[:count],
            "prepared_transaction_offset": self.prepared_transaction_offset[:count],
            "body": self.views(self.body_at[:count], self.body_length[:count]),
            "topic": self.topic.slice(0, count),
            **parsed,
            "msg_id": offset_msg_ids_with_prefix(self.prefix.slice(0, count), self.physical_offset[:count]),
            "batch_id": pa.nulls(count, pa.string()),
            "source_file": pa.repeat(pa.scalar(path, pa.string()), count),
            "source_line": np.arange(first_ordinal, first_ordinal + count, dtype=np.int64),
            "properties_bytes": properties,
            "blank_end": pa.repeat(pa.scalar(False), count),
            "corrupt_reason": pa.nulls(count, pa.string()),
        }
        arrays = [_arrow(columns[field.name]).cast(field.type) for field in schema]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _arrow(values) -> pa.Array:
    return pa.array(values) if isinstance(values, np.ndarray) else values


def _leading(ok: np.ndarray) -> int:
    """How many values from the first are true."""
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else len(ok)


def _utf8(values: pa.Array) -> np.ndarray:
    """Whether each value is UTF-8 as Python's codec decodes it (Arrow checks the whole array; only an array
    that fails is looked at value by value)."""
    try:
        values.cast(pa.string())
        return np.ones(len(values), bool)
    except pa.ArrowInvalid:
        pass
    kept = []
    for value in values.to_pylist():
        try:
            value.decode("utf-8")
            kept.append(True)
        except UnicodeDecodeError:
            kept.append(False)
    return np.array(kept, bool)


def _parsed_properties(properties: pa.Array, count: int) -> dict[str, pa.Array]:
    """``properties`` (a map), ``keys``, ``tags`` and ``uniq_key`` of UTF-8 properties strings, as
    ``formats.properties.parse_properties`` and ``split_keys`` give them, with Arrow string kernels; an array
    where a name repeats in one string (the reference keeps the first position and the last value) is parsed
    string by string with the reference."""
    text = properties.cast(pa.string())
    segments = pc.split_pattern(text, PROPERTY_SEPARATOR)
    flat = pc.list_flatten(segments)
    parents = pc.list_parent_indices(segments).to_numpy()
    # a segment's first separator parts its name from its value; a segment without one is dropped, and so is one
    # with an empty name or value (which drops every segment shorter than 3 characters, as the reference does)
    halves = pc.split_pattern(flat, NAME_VALUE_SEPARATOR, max_splits=1)
    bounds = halves.offsets.to_numpy()
    parted = np.flatnonzero(np.diff(bounds) == 2)
    name_at = bounds[parted] - bounds[0]
    parts = pc.list_flatten(halves)
    names, values = parts.take(name_at), parts.take(name_at + 1)
    kept = pc.and_(pc.not_equal(names, ""), pc.not_equal(values, ""))
    names, values = names.filter(kept), values.filter(kept)
    parents = parents[parted][kept.to_numpy(zero_copy_only=False)]
    if len(names) and _repeats(parents, names):
        return _parsed_per_string(properties)
    offsets = np.zeros(count + 1, np.int32)
    np.cumsum(np.bincount(parents, minlength=count), out=offsets[1:])
    keys_text = _named(names, values, parents, count, KEYS)
    tokens = pc.split_pattern(keys_text, KEY_SEPARATOR)
    token_flat = pc.list_flatten(tokens)
    token_parents = pc.list_parent_indices(tokens).to_numpy()
    nonempty = pc.not_equal(token_flat, "")
    token_parents = token_parents[nonempty.to_numpy(zero_copy_only=False)]
    token_offsets = np.zeros(count + 1, np.int32)
    np.cumsum(np.bincount(token_parents, minlength=count), out=token_offsets[1:])
    return {
        "properties": pa.MapArray.from_arrays(pa.array(offsets), names, values),
        "keys": pa.ListArray.from_arrays(pa.array(token_offsets), token_flat.filter(nonempty)),
        "tags": _named(names, values, parents, count, TAGS),
        "uniq_key": _named(names, values, parents, count, UNIQ_KEY),
    }


_NAME_BITS = 64  # distinct property names a run may have for the bit test of ``_repeats``


def _repeats(parents: np.ndarray, names: pa.Array) -> bool:
    """Whether a name appears twice in one string (``parents``: each name's string, in ascending order)."""
    encoded = pc.dictionary_encode(names)
    codes = encoded.indices.to_numpy()
    if len(encoded.dictionary) <= _NAME_BITS:
        # a bit per distinct name, or-ed per string: a string repeats a name when it has fewer bits than names
        # (a sixth of the time of the unique pairs below, the largest part of the parse)
        starts = np.flatnonzero(np.concatenate([[True], parents[1:] != parents[:-1]]))
        masks = np.bitwise_or.reduceat(np.left_shift(np.uint64(1), codes.astype(np.uint64)), starts)
        return bool((np.bitwise_count(masks) != np.diff(np.append(starts, len(parents)))).any())
    pairs = parents.astype(np.int64) * len(encoded.dictionary) + codes
    return len(np.unique(pairs)) != len(pairs)


def _named(names: pa.Array, values: pa.Array, parents: np.ndarray, count: int, wanted: str) -> pa.Array:
    """Per string, the value of property ``wanted``, or null."""
    where = pc.equal(names, wanted).to_numpy(zero_copy_only=False)
    rows = parents[where]
    take = np.full(count, -1, np.int64)
    take[rows] = np.flatnonzero(where)
    return values.take(pa.array(take, mask=take < 0))


def _parsed_per_string(properties: pa.Array) -> dict[str, pa.Array]:
    parsed = [parse_properties(value) for value in properties.to_pylist()]
    return {
        "properties": pa.array([list(p.items()) for p in parsed], pa.map_(pa.string(), pa.string())),
        "keys": pa.array([split_keys(p.get(KEYS)) for p in parsed], pa.list_(pa.string())),
        "tags": pa.array([p.get(TAGS) for p in parsed], pa.string()),
        "uniq_key": pa.array([p.get(UNIQ_KEY) for p in parsed], pa.string()),
    }
