"""Producer log lines → record columns, a block of lines at a time.

``lines.LineParser`` is the reference: it states every rule of a
line and gives every reject reason, one line at a time. Here the same rules
run column-wise over a block of lines (NumPy and Arrow kernels) once
msgspec has decoded them: what repeats across lines (topics, hosts,
transaction types, property-name sets) is looked up once per distinct
value, what is per message (ranges, sizes, queue choice, UNIQ_KEY, the
properties' bytes) is computed per column. Python still touches each line
to decode it, pick its fields and take its body's CRC, which is where the
per-line time that is left goes.

This path only *accepts*. A line for which any rule fails, or whose shape
it does not handle (a body with escapes, a value out of Arrow's range, an
empty property value, ...), is returned as "not decided here" and goes
through the per-line parser, which accepts or rejects it with its reason.
So both routes give the same rows (``tests/unit/test_ingest_blocks.py``
runs them side by side).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import zlib
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.javahash import java_string_hashes
from rmqlake.formats.msgid import month_start_millis
from rmqlake.formats.properties import (
    CLUSTER,
    DELAY,
    KEY_SEPARATOR,
    KEYS,
    MAX_PROPERTIES_LENGTH,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
    UNIQ_KEY,
)
from rmqlake.formats.record import BORNHOST_V6_FLAG, STOREHOST_V6_FLAG, TRANSACTION_TYPES
from rmqlake.formats.schedule import TIMER_PROPERTIES
from rmqlake.formats.transaction import TRAN_MSG
from rmqlake.ingest.lines import FORBIDDEN_SEND_TOPICS, JAVA_INT_MAX, JAVA_INT_MIN, LineParser
from rmqlake.ingest.message import DECODE_REFUSED, LINE_DECODER, MESSAGE_TYPES, LineFields

_ABSENT = LineFields()  # stands in for a line msgspec refused, so every column has a value per line
_SEPARATORS = f"[{NAME_VALUE_SEPARATOR}{PROPERTY_SEPARATOR}]"
_QUOTE = 0x22
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_BODY_OFFSETS_LIMIT = 2**31 - 1  # int32 offsets of a binary array
_CALENDAR_SAFE_MS = 253_370_764_800_000  # 9999-01-01T00:00Z: month starts are known in every zone before it
_ARROW_REFUSED = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeEncodeError)


@dataclass
class BlockColumns:
    """What ``parse_block`` decided: the accepted lines' message columns, and the lines it left to the per-line
    parser (positions in the block, ascending)."""

    accepted: np.ndarray  # positions in the block, ascending
    columns: dict[str, pa.Array]  # MESSAGE_TYPES columns of the accepted lines, in block order
    undecided: np.ndarray  # positions in the block, ascending


def parse_block(parser: LineParser, lines: list[bytes], *, first_line: int, file_hash32: int) -> BlockColumns:
    """Accept, column-wise, the lines of a block that pass every rule of ``parser``; leave the others undecided.

    Args:
        parser: the per-line parser whose rules (and caches of topics, hosts, property layouts) apply.
        lines: consecutive lines of one file, without newlines.
        first_line: the 1-based number of ``lines[0]``.
        file_hash32: as for ``lines.parse_line``.
    """
    count = len(lines)
    if not count:
        return BlockColumns(np.zeros(0, np.int64), {}, np.zeros(0, np.int64))
    fields = []
    refused = np.zeros(count, dtype=bool)
    decode = LINE_DECODER.decode
    for position, raw in enumerate(lines):
        try:
            fields.append(decode(raw))
        except DECODE_REFUSED:
            fields.append(_ABSENT)
            refused[position] = True
    try:
        return _Block(parser, fields, refused, first_line, file_hash32).decide()
    except _ARROW_REFUSED:
        # A value Arrow will not hold as typed (an integer beyond int64, a lone surrogate): all lines go per line.
        return BlockColumns(np.zeros(0, np.int64), {}, np.arange(count))


# Properties the broker re-routes a message by (a delay level, a timer, a transactional half): the per-line
# parser applies the routing.
_SCHEDULING = frozenset((DELAY, *TIMER_PROPERTIES, TRAN_MSG))


class _Block:
    """One block's columns while the rules run; ``slow`` marks the lines left to the per-line parser."""

    def __init__(self, parser: LineParser, fields: list[LineFields], refused: np.ndarray, first_line, file_hash32):
        self.parser = parser
        self.options = parser.options
        self.fields = fields
        self.count = len(fields)
        self.slow = refused.copy()
        self.lines = np.arange(first_line, first_line + self.count, dtype=np.int64)
        self.file_hash32 = file_hash32

    def column(self, name: str) -> list:
        return list(map(attrgetter(name), self.fields))

    def mark(self, mask) -> None:
        """Leave the lines of ``mask`` (a boolean NumPy array or Arrow array, nulls meaning no) to the per-line
        parser."""
        if isinstance(mask, (pa.Array, pa.ChunkedArray)):
            mask = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
        self.slow |= mask

    def decide(self) -> BlockColumns:
        out: dict[str, pa.Array] = {}
        # a delay level or timer: the per-line parser applies the broker's re-routing; an end line is not a message
        self.mark(
            np.array(
                [
                    f.delay_level is not None or f.deliver_time_ms is not None or f.end_transaction is not None
                    for f in self.fields
                ],
                bool,
            )
        )
        out["real_queue_round_robin"] = pa.nulls(self.count, pa.bool_())
        topic_info = self._topics(out)
        body_length = self._bodies(out)
        keys, has_keys = self._keys(out, topic_info)
        tags, has_tags = self._tags(out)
        self._numbers(out, topic_info, keys, has_keys)
        born_v6, store_v6, born_address = self._hosts(out)
        uniq = self._uniq_keys(out, born_address)
        properties_length = self._properties(out, keys, has_keys, tags, has_tags, uniq)
        out["sys_flag"] = pa.array(
            out.pop("_transaction_flag") | (born_v6 * BORNHOST_V6_FLAG) | (store_v6 * STOREHOST_V6_FLAG), pa.int32()
        )
        fixed = self._fixed_sizes(topic_info, born_v6, store_v6)
        size = fixed + body_length + properties_length
        self.mark(size > self.parser.size_limit)
        out["total_size"] = pa.array(size.astype(np.int32))

        accepted = np.flatnonzero(~self.slow)
        take = None if len(accepted) == self.count else pa.array(accepted)
        columns = {}
        for name in MESSAGE_TYPES:
            if name == "body_crc":
                columns[name] = _body_crcs(columns["body"])  # after "body": only the accepted bodies
            else:
                columns[name] = out[name] if take is None else out[name].take(take)
        return BlockColumns(accepted, columns, np.flatnonzero(self.slow))

    # -- the rules, column by column ----------------------------------------------------------

    def _topics(self, out: dict) -> dict[str, np.ndarray]:
        topics = pa.array(self.column("topic"), pa.string())
        self.mark(pc.is_null(topics))
        encoded = pc.dictionary_encode(topics)
        infos = [self.parser.topic(t) for t in encoded.dictionary.to_pylist()]
        codes = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
        if not infos:  # every topic is null
            infos = [self.parser.topic("")]
        table = {
            "problem": np.array([info.problem is not None for info in infos]),
            "queue_count": np.array([info.queue_count or 1 for info in infos], np.int64),
            "magic": np.array([info.magic for info in infos], np.int32),
            "length": np.array([info.length for info in infos], np.int64),
            "compaction": np.array([info.compaction for info in infos]),
        }
        self.mark(table["problem"][codes])
        self.mark(pc.is_in(topics, pa.array(sorted(FORBIDDEN_SEND_TOPICS))))  # the per-line parser refuses them
        out["topic"] = topics
        out["magic"] = pa.array(table["magic"][codes])
        info = {name: values[codes] for name, values in table.items()}
        info["code"] = codes
        return info

    def _bodies(self, out: dict) -> np.ndarray:
        """The body bytes (a plain JSON string, or base64 decoded); returns their lengths."""
        raws = self.column("body")
        lengths = np.fromiter(map(len, raws), dtype=np.int64, count=self.count)
        offsets = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] > _BODY_OFFSETS_LIMIT:
            raise OverflowError("a block's bodies exceed a binary array's offsets")
        joined = b"".join(raws)
        data = np.frombuffer(joined, dtype=np.uint8)
        quoted = lengths >= 2
        where = np.flatnonzero(quoted)
        quoted[where] = (data[offsets[where]] == _QUOTE) & (data[offsets[where + 1] - 1] == _QUOTE)
        self.mark(~quoted)  # absent, null, not a string: the per-line parser says why
        stripped = joined.replace(b'"', b"") if quoted.all() and b"\\" not in joined else None
        if stripped is not None and len(stripped) == len(joined) - 2 * self.count:
            # Every body is a JSON string without escapes, so without a quote inside: dropping every quote
            # leaves the bodies back to back (a plain copy; slicing each value costs several times more).
            body_offsets = (offsets - 2 * np.arange(self.count + 1)).astype(np.int32)
            bodies = pa.Array.from_buffers(
                pa.binary(), self.count, [None, pa.py_buffer(body_offsets), pa.py_buffer(stripped)]
            )
        else:
            literal = pa.Array.from_buffers(
                pa.binary(), self.count, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(joined)]
            )
            bodies = pc.binary_slice(literal, 1, -1)
            self.mark(pc.match_substring(bodies, "\\"))  # escapes: the json route decodes them

        encodings = pa.array(self.column("body_encoding"), pa.string())
        base64_rows = pc.fill_null(pc.equal(encodings, "base64"), False).to_numpy(zero_copy_only=False)
        plain = pc.or_(pc.is_null(encodings), pc.is_in(encodings, pa.array(["utf8", "utf-8"]))).to_numpy(
            zero_copy_only=False
        )
        self.mark(~plain & ~base64_rows)
        self._check_utf8(bodies, plain & ~self.slow)
        if base64_rows.any():
            bodies = self._base64_bodies(bodies, base64_rows & ~self.slow)
        body_offsets = _offsets(bodies)
        body_length = np.diff(body_offsets)
        self.mark(body_length > self.options.max_message_size)
        out["body"] = bodies
        return body_length

    def _check_utf8(self, bodies: pa.Array, rows: np.ndarray) -> None:
        """Leave the bodies of ``rows`` that are not valid UTF-8 to the per-line parser (one check of the whole
        array; line by line only when it fails)."""
        if not all_utf8(bodies):
            for position in np.flatnonzero(rows):
                try:
                    bodies[int(position)].as_py().decode("utf-8")
                except UnicodeDecodeError:
                    self.slow[position] = True

    def _base64_bodies(self, bodies: pa.Array, rows: np.ndarray) -> pa.Array:
        """``bodies`` with the base64 text of ``rows`` decoded: the runs of other bodies are copied as they are."""
        offsets = _offsets(bodies)
        lengths = np.diff(offsets)
        data = bodies.buffers()[2]
        view = memoryview(data if data is not None else b"")
        pieces = []
        copied_to = int(offsets[0])
        for position in np.flatnonzero(rows).tolist():
            start, end = int(offsets[position]), int(offsets[position + 1])
            pieces.append(view[copied_to:start])
            try:
                decoded = base64.b64decode(view[start:end], validate=True)
            except (binascii.Error, ValueError):
                self.slow[position] = True
                decoded = b""
            pieces.append(decoded)
            lengths[position] = len(decoded)
            copied_to = end
        pieces.append(view[copied_to : int(offsets[-1])])
        new_offsets = np.zeros(len(bodies) + 1, dtype=np.int32)
        np.cumsum(lengths, out=new_offsets[1:])
        return pa.Array.from_buffers(
            pa.binary(), len(bodies), [None, pa.py_buffer(new_offsets), pa.py_buffer(b"".join(pieces))]
        )

    def _keys(self, out: dict, topic_info: dict) -> tuple[pa.Array, np.ndarray]:
        values = self.column("keys")
        for position, keys in enumerate(values):
            if type(keys) is list:
                if any(KEY_SEPARATOR in token for token in keys):
                    self.slow[position] = True
                    values[position] = None
                else:
                    values[position] = KEY_SEPARATOR.join(keys)
        keys = pa.array(values, pa.string())
        self.mark(pc.match_substring_regex(keys, _SEPARATORS))
        has_keys = pc.fill_null(pc.greater(pc.binary_length(keys), 0), False).to_numpy(zero_copy_only=False)
        keys = pc.if_else(pa.array(has_keys), keys, pa.scalar(None, pa.string()))
        # KEYS is split on spaces, empty tokens dropped
        tokens = pc.split_pattern(pc.fill_null(keys, ""), KEY_SEPARATOR)
        flat = pc.list_flatten(tokens)
        kept = pc.greater(pc.binary_length(flat), 0)
        parents = pc.list_parent_indices(tokens).filter(kept).to_numpy()
        per_row = np.bincount(parents, minlength=self.count)
        list_offsets = np.zeros(self.count + 1, dtype=np.int32)
        np.cumsum(per_row, out=list_offsets[1:])
        out["keys"] = pa.ListArray.from_arrays(pa.array(list_offsets), flat.filter(kept)).cast(MESSAGE_TYPES["keys"])
        self.mark(topic_info["compaction"] & (per_row == 0))
        return keys, has_keys

    def _tags(self, out: dict) -> tuple[pa.Array, np.ndarray]:
        tags = pa.array(self.column("tags"), pa.string())
        self.mark(pc.match_substring_regex(tags, _SEPARATORS))
        has_tags = pc.fill_null(pc.greater(pc.binary_length(tags), 0), False).to_numpy(zero_copy_only=False)
        tags = pc.if_else(pa.array(has_tags), tags, pa.scalar(None, pa.string()))
        out["tags"] = tags
        return tags, has_tags

    def _numbers(self, out: dict, topic_info: dict, keys: pa.Array, has_keys: np.ndarray) -> None:
        def integers(name: str, default: int | None, low: int, high: int) -> np.ndarray:
            values = pa.array(self.column(name), pa.int64())
            present = pc.is_valid(values).to_numpy(zero_copy_only=False)
            numbers = pc.fill_null(values, 0 if default is None else default).to_numpy()
            self.mark(present & ((numbers < low) | (numbers > high)))
            if default is None:
                self.mark(~present)
            return numbers

        born = integers("born_timestamp", None, 0, 2**63 - 1)
        store_values = pa.array(self.column("store_timestamp"), pa.int64())
        store = pc.fill_null(store_values, 0).to_numpy()
        store = np.where(pc.is_valid(store_values).to_numpy(zero_copy_only=False), store, born)
        self.mark(store < 0)
        out["born_timestamp"] = pa.array(born)
        out["store_timestamp"] = pa.array(store)
        out["flag"] = pa.array(integers("flag", 0, JAVA_INT_MIN, JAVA_INT_MAX).astype(np.int32))
        out["reconsume_times"] = pa.array(integers("reconsume_times", 0, 0, JAVA_INT_MAX).astype(np.int32))
        out["prepared_transaction_offset"] = pa.array(integers("prepared_transaction_offset", 0, 0, 2**63 - 1))

        transactions = pa.array(self.column("transaction"), pa.string())
        encoded = pc.dictionary_encode(pc.fill_null(transactions, "NOT_TYPE"))
        flags = [TRANSACTION_TYPES.get(name) for name in encoded.dictionary.to_pylist()]
        self.mark(np.array([flag is None for flag in flags] or [False])[encoded.indices.to_numpy()])
        table = np.array([flag or 0 for flag in flags] or [0], dtype=np.int32)
        out["_transaction_flag"] = table[encoded.indices.to_numpy()]

        # the queue: as given (checked against the topic's queue count), else by the keys' hash, else round robin
        queue_count = topic_info["queue_count"]
        given = pa.array(self.column("queue_id"), pa.int64())
        has_queue = pc.is_valid(given).to_numpy(zero_copy_only=False)
        queue = pc.fill_null(given, 0).to_numpy()
        self.mark(has_queue & ((queue < 0) | (queue >= queue_count)))
        by_key = ~has_queue & has_keys
        if by_key.any():
            hashes = java_string_hashes(keys).astype(np.int64)
            queue = np.where(by_key, np.abs(np.fmod(hashes, queue_count)), queue)
        out["queue_id"] = pa.array(queue.astype(np.int32), mask=~(has_queue | by_key))

    def _hosts(self, out: dict) -> tuple[np.ndarray, np.ndarray, list]:
        results = []
        for field, default in (
            ("born_host", self.options.default_born_host),
            ("store_host", self.options.default_store_host),
        ):
            texts = pa.array(self.column(field), pa.string())
            texts = pc.if_else(pc.fill_null(pc.greater(pc.binary_length(texts), 0), False), texts, default)
            encoded = pc.dictionary_encode(texts)
            hosts = [self.parser.host(t) for t in encoded.dictionary.to_pylist()]
            codes = encoded.indices.to_numpy()
            self.mark(np.array([host.problem is not None for host in hosts], dtype=bool)[codes])
            normal = pa.array([host.text for host in hosts], pa.string())
            out[field] = normal.take(encoded.indices)
            if field == "store_host":
                out["store_host_prefix"] = pa.array([host.msg_id_prefix for host in hosts], pa.string()).take(
                    encoded.indices
                )
            results.append((np.array([host.is_ipv6 for host in hosts])[codes], hosts, codes))
        (born_v6, born_hosts, born_codes), (store_v6, _, _) = results
        return born_v6.astype(np.int32), store_v6.astype(np.int32), (born_hosts, born_codes)

    def _uniq_keys(self, out: dict, born_address) -> pa.Array:
        """UNIQ_KEY as given, or generated as the client would (spec: MessageClientIDSetter)."""
        given = pa.array(self.column("uniq_key"), pa.string())
        self.mark(pc.match_substring_regex(given, _SEPARATORS))
        generate = ~pc.fill_null(pc.greater(pc.binary_length(given), 0), False).to_numpy(zero_copy_only=False)
        # far-future born times (near the calendar's end) are left to the per-line parser, which rejects them
        generate &= ~self.slow & ~self._marked(out["born_timestamp"].to_numpy() > _CALENDAR_SAFE_MS)
        if not generate.any():
            out["uniq_key"] = given
            return given
        hosts, codes = born_address
        prefixes = []
        for host in hosts:
            # a host with a problem has no address; its lines are left to the per-line parser already
            address = host.address.address if host.address is not None else b""
            prefixes.append(self.parser.uniq_prefix(address, self.file_hash32))
        positions = np.flatnonzero(generate)
        born = out["born_timestamp"].to_numpy()[positions]
        minutes, minute_of_row = np.unique(born // 60_000, return_inverse=True)
        zone = self.options.timezone
        month_start = np.array([month_start_millis(int(m) * 60_000, zone) for m in minutes], np.int64)[minute_of_row]
        since = (born - month_start).astype(np.int64)
        since = ((since + 2**31) % 2**32 - 2**31).astype(np.int64)  # Java (int) cast
        since[(since > -1_000_000) & (since < 0)] = 0
        tail = _hex_digits(since.astype(np.uint64) & 0xFFFFFFFF, 8, self.lines[positions] & 0xFFFF, 4)
        prefix = pa.array(prefixes, pa.string()).take(pa.array(codes[positions]))
        generated = pc.binary_join_element_wise(prefix, tail, "")
        full = pc.replace_with_mask(given, pa.array(generate), generated)
        out["uniq_key"] = full
        return full

    def _properties(self, out, keys, has_keys, tags, has_tags, uniq) -> np.ndarray:
        """Merge the producer's properties with KEYS, TAGS, UNIQ_KEY and CLUSTER, in the broker's HashMap order
        (one layout per distinct name set, from the per-line parser's cache); returns their serialised lengths."""
        user = self.column("properties")
        groups: dict[tuple, list[int]] = {}
        layouts = zip(
            [tuple(names) if names else () for names in user], (has_keys * 2 + has_tags).tolist(), strict=True
        )
        for position, layout in enumerate(layouts):
            groups.setdefault(layout, []).append(position)

        cluster = self.options.cluster_name
        lengths = np.zeros(self.count, dtype=np.int64)
        widths = np.zeros(self.count, dtype=np.int64)  # stored properties per line (0: none, or not decided here)
        pieces_bytes, order_of_rows = [], []
        entry_names, entry_values, entry_slots = [], [], []  # per group: names, values name-major, map positions
        for (names, flags), every_row in groups.items():
            with_keys, with_tags = flags & 2, flags & 1
            positions = np.array(every_row, dtype=np.int64)
            positions = positions[~self.slow[positions]]
            if not len(positions):
                continue
            rows = positions.tolist()
            take = pa.array(positions)
            if any(not name or NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name for name in names) or (
                not _SCHEDULING.isdisjoint(names)
            ):
                self.slow[positions] = True  # refused, or re-routed by the per-line parser
                continue
            values: dict[str, pa.Array] = {}
            for name in names:
                value = pa.array([user[row][name] for row in rows], pa.string())
                self.mark_rows(positions, pc.or_(pc.equal(value, ""), pc.match_substring_regex(value, _SEPARATORS)))
                values[name] = value
            if with_keys:
                values[KEYS] = keys.take(take)
            if with_tags:
                values[TAGS] = tags.take(take)
            values[UNIQ_KEY] = uniq.take(take)
            if cluster:
                values[CLUSTER] = pa.repeat(pa.scalar(cluster, pa.string()), len(rows))
            merged = tuple(values)  # a name given twice keeps its first position and takes the last value
            order, _ = self.parser.layout(merged)
            parts = (
                part for name in order for part in (f"{name}{NAME_VALUE_SEPARATOR}", values[name], PROPERTY_SEPARATOR)
            )
            serialised = pc.binary_join_element_wise(*parts, "").cast(pa.binary())
            self.mark_rows(positions, pc.is_null(serialised))
            lengths[positions] = np.diff(_offsets(serialised))
            widths[positions] = len(order)
            entry_names.append(order)
            entry_values.extend(values[name] for name in order)
            entry_slots.append(positions)
            pieces_bytes.append(serialised)
            order_of_rows.append(positions)
        self.mark(lengths > MAX_PROPERTIES_LENGTH)
        # back to block order; the lines outside every group are left to the per-line parser and get empty values
        rows = np.concatenate(order_of_rows) if order_of_rows else np.zeros(0, np.int64)
        placed = np.full(self.count, len(rows), dtype=np.int64)
        placed[rows] = np.arange(len(rows))
        self.mark(placed == len(rows))
        filler_bytes = pa.array([b""], pa.binary())
        out["properties_bytes"] = pa.concat_arrays([*pieces_bytes, filler_bytes]).take(pa.array(placed))
        out["properties"] = _maps_in_block_order(widths * (placed < len(rows)), entry_names, entry_values, entry_slots)
        return lengths

    def _marked(self, mask: np.ndarray) -> np.ndarray:
        self.slow |= mask
        return mask

    def mark_rows(self, positions: np.ndarray, mask: pa.Array) -> None:
        self.slow[positions] |= pc.fill_null(mask, False).to_numpy(zero_copy_only=False)

    def _fixed_sizes(self, topic_info: dict, born_v6: np.ndarray, store_v6: np.ndarray) -> np.ndarray:
        """The record size without body and properties, per line: one value per (topic, born v6, store v6)."""
        parser = self.parser
        fixed = np.zeros(self.count, dtype=np.int64)
        combos = topic_info["code"] * 4 + born_v6 * 2 + store_v6
        for combo in np.unique(combos[~self.slow]).tolist():
            rows = combos == combo
            first = int(np.flatnonzero(rows & ~self.slow)[0])  # a line left to the per-line parser may lack a topic
            info = parser.topic(self.fields[first].topic)
            fixed[rows] = parser.fixed_size(info, bool(born_v6[first]), bool(store_v6[first]))
        return fixed


def _maps_in_block_order(widths: np.ndarray, names: list[list[str]], values: list[pa.Array], slots) -> pa.Array:
    """The ``properties`` map of every line of a block, built once in block order: line ``i`` has ``widths[i]``
    entries; group ``g`` (its lines at ``slots[g]``) has the names ``names[g]`` and, name after name, one value
    array per name (``values``, the groups one after another). A line of no group has an empty map."""
    offsets = np.zeros(len(widths) + 1, dtype=np.int64)
    np.cumsum(widths, out=offsets[1:])
    total = int(offsets[-1])
    value_source = np.empty(total, dtype=np.int64)  # each entry's position in the values, concatenated
    name_source = np.empty(total, dtype=np.int64)  # and in the names, concatenated
    value_base = name_base = 0
    for order, rows in zip(names, slots, strict=True):
        width, count = len(order), len(rows)
        entries = offsets[rows][:, None] + np.arange(width)[None, :]
        value_source[entries] = value_base + np.arange(width)[None, :] * count + np.arange(count)[:, None]
        name_source[entries] = name_base + np.arange(width)[None, :]
        value_base += width * count
        name_base += width
    map_type = MESSAGE_TYPES["properties"]
    all_names = pa.array([name for order in names for name in order], map_type.key_type)
    all_values = pa.concat_arrays(values) if values else pa.array([], map_type.item_type)
    return pa.MapArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        all_names.take(pa.array(name_source)),
        all_values.take(pa.array(value_source)),
        type=map_type,
    )


def _offsets(array: pa.Array) -> np.ndarray:
    """The value offsets of a binary or string array (``len + 1`` int64)."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)
    return offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)


def all_utf8(values: pa.Array) -> bool:
    """Whether every value of a binary array is valid UTF-8 as Python's strict codec decides (no surrogates,
    no overlong forms, nothing above U+10FFFF).

    polars' check (simdutf8) runs at several GB/s; Arrow's own (``validate(full=True)``) runs at about 1 GB/s on
    text with many multi-byte characters, a tenth of the parse.
    """
    try:
        pl.from_arrow(values).cast(pl.String, strict=True)
    except pl.exceptions.PolarsError:
        return False
    return True


def _body_crcs(bodies: pa.Array) -> pa.Array:
    """``formats.crc.body_crc`` of each body (zlib's CRC-32 over slices of the array's data buffer)."""
    offsets = _offsets(bodies).tolist()
    data = bodies.buffers()[2]
    view = memoryview(data) if data is not None else memoryview(b"")
    crc32 = zlib.crc32
    crcs = np.fromiter(
        (crc32(view[start:end]) for start, end in itertools.pairwise(offsets)), dtype=np.uint32, count=len(bodies)
    )
    return pa.array((crcs & 0x7FFFFFFF).astype(np.int32))


def _hex_digits(high: np.ndarray, high_digits: int, low: np.ndarray, low_digits: int) -> pa.Array:
    """Strings of ``high`` as ``high_digits`` then ``low`` as ``low_digits`` upper-case hex digits."""
    width = high_digits + low_digits
    digits = np.empty((len(high), width), dtype=np.uint8)
    for column in range(high_digits):
        digits[:, column] = _HEX_DIGITS[(high >> np.uint64(4 * (high_digits - 1 - column))) & np.uint64(0xF)]
    low = low.astype(np.uint64)
    for column in range(low_digits):
        digits[:, high_digits + column] = _HEX_DIGITS[
            (low >> np.uint64(4 * (low_digits - 1 - column))) & np.uint64(0xF)
        ]
    offsets = np.arange(0, len(high) * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(high), [None, pa.py_buffer(offsets), pa.py_buffer(digits.tobytes())])
