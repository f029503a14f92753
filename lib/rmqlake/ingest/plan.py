"""The broker's append, planned: append order, queue choice and queue offsets, partition starts, placement.

Driver-side plans from a few counts per partition and the per-batch kernels that replay them in a task; no
file I/O.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.msgid import offset_msg_ids_with_prefix
from rmqlake.formats.properties import serialize_properties
from rmqlake.formats.record import consumes_queue_offsets
from rmqlake.formats.schedule import REAL_QID
from rmqlake.formats.segment import next_segment_start, place_records, segment_start
from rmqlake.ingest.lines import REAL_QID_PLACEHOLDER
from rmqlake.ingest.scratch import NarrowSpan
from rmqlake.lake.tables import COMMITLOG, columns

# file_rank: the input file's position in path order, so ordering by it orders by path. A delivery row (kind 1)
# goes after the messages stored at its due time, and deliveries due together go in their origins' append order
# (origin_timestamp, file_rank, source_line: the origin's; an origin of an earlier run sorts first, by offset).
APPEND_ORDER = ("store_timestamp", "kind", "origin_timestamp", "file_rank", "source_line")
MESSAGE_ROW, DELIVERY_ROW = 0, 1


def append_order_bounds(spans: Iterable[NarrowSpan], partitions: int) -> list[int]:
    """``partitions - 1`` store timestamps cutting the messages into ranges of about equal size.

    Partition ``i`` holds the messages with ``bounds[i-1] <= store_timestamp
    < bounds[i]``, so every message of one timestamp is in one partition and
    partition ``i`` precedes ``i + 1`` in the append order. The bounds come
    from the store-time spans of the narrow files' batches (each split's rows
    are sorted), which their footers list: a few numbers per batch, no rows.
    """
    spans = list(spans)
    if partitions <= 1 or not spans:
        return []
    # Spread each batch's rows evenly over its timestamp range, then take the quantiles.
    lows = np.array([span.first for span in spans], dtype=np.float64)
    highs = np.array([span.last for span in spans], dtype=np.float64)
    rows = np.array([span.rows for span in spans], dtype=np.float64)
    points = np.unique(np.concatenate([lows, highs]))
    below = np.zeros(len(points))  # rows with a timestamp below each point
    for low, high, count in zip(lows, highs, rows, strict=True):
        span = max(high - low, 1.0)
        below += count * np.clip((points - low) / span, 0.0, 1.0)
    wanted = below[-1] * np.arange(1, partitions) / partitions
    bounds = np.ceil(np.interp(wanted, below, points)).astype(np.int64)
    return np.maximum.accumulate(bounds).tolist()


def partition_reads(spans: Mapping[int, Iterable[NarrowSpan]], bounds: list[int]) -> dict[int, frozenset[int]]:
    """Per partition of ``bounds`` (``append_order_bounds``), the splits whose narrow files have a batch reaching
    into its store-time range: the splits whose scratch files its write task may read (every one it reads, as the
    ordering step gathers a range's rows from exactly those batches; perhaps a few more).

    ``spans``: each split's narrow-file batches (``NarrowSpan``). A partition no split reaches is left out.
    """
    reads: dict[int, set[int]] = defaultdict(set)
    for split, found in spans.items():
        for span in found:
            # partition i holds bounds[i-1] <= store_timestamp < bounds[i]
            first, last = bisect.bisect_right(bounds, span.first), bisect.bisect_right(bounds, span.last)
            for partition in range(first, last + 1):
                reads[partition].add(split)
    return {partition: frozenset(splits) for partition, splits in sorted(reads.items())}


# One count of a partition (``stats_of_partition``): the frame the ordering tasks return to the driver.
STATS = columns(
    ("partition", "int", "the append-order partition counted"),
    ("kind", "string", "the count: see stats_of_partition"),
    ("topic", "string", "the topic counted, for the per-topic and per-queue kinds"),
    ("queue_id", "int", "the queue counted, for the queue kind; the origin partition for rr_delivery"),
    ("bucket", "int", "a round-robin message's local ordinal modulo the topic's queue count (rr_consuming)"),
    ("value", "bigint", "the count"),
)
_STATS_SCHEMA = STATS.arrow_schema


def _queue_count(topic: str, queue_counts: Mapping[str, int], default: int | None) -> int:
    count = queue_counts.get(topic, default)
    if count is None:
        raise ValueError(f"topic {topic!r} has no queue count")  # parse_line rejects such lines
    return count


class Assigned(NamedTuple):
    """What ``QueueAssigner.assign`` decided for a batch, row by row."""

    names: list[str]  # the batch's topics
    codes: np.ndarray  # each row's topic, an index into names
    plain_round_robin: np.ndarray  # rows whose own queue was chosen round robin
    queues: np.ndarray  # each row's queue (-1: a delivery whose origin's turn is not known here)
    offsets: np.ndarray  # each row's queue offset (0 where none is consumed)
    real_queues: np.ndarray  # REAL_QID chosen at append time (re-routed rows sent without a queue, and their
    # deliveries); -1 elsewhere


class QueueAssigner:
    """The broker's queue choice and queue offsets for messages in append order, batch after batch.

    A message without a queue takes the next round-robin turn of its topic
    (ordinal modulo the topic's queue count); a NOT_TYPE or COMMIT message
    takes the next offset of its queue. A re-routed message sent without a
    queue takes a turn of its real topic (``rr_topic``) for its REAL_QID and
    is stored on its schedule queue; its delivery goes to the queue that turn
    chose (``origin_partition``/``origin_turn``: the turn's ordinal in the
    origin's partition, resolved with ``origin_counters``, each partition's
    starting round-robin counters). Vectorised: per batch, a message's turn
    (or offset) is the counter before the batch plus its rank among the
    batch's messages of the same topic (or queue), so Python runs per topic
    and queue, not per message.
    """

    def __init__(
        self,
        rr_counters: Mapping[str, int],
        queue_offsets: Mapping[tuple[str, int], int],
        *,
        queue_counts,
        default_queue_count,
        origin_counters: Mapping[int, Mapping[str, int]] | None = None,
    ):
        self.rr = dict(rr_counters)
        self.heads = dict(queue_offsets)
        self.queue_counts = queue_counts
        self.default_queue_count = default_queue_count
        self.origin_counters = origin_counters

    def count(self, topic: str) -> int:
        return _queue_count(topic, self.queue_counts, self.default_queue_count)

    def assign(self, batch: pa.RecordBatch) -> Assigned:
        encoded = pc.dictionary_encode(batch.column("topic"))
        names = encoded.dictionary.to_pylist()
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        count = batch.num_rows
        given = batch.column("queue_id")
        no_queue = given.is_null().to_numpy(zero_copy_only=False)
        queues = given.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        turn_topics = _column(batch, "rr_topic")
        if turn_topics is None:  # rows of a batch without re-routed messages: a row without a queue takes a turn
            turn_topics = pc.if_else(given.is_null(), batch.column("topic"), pa.scalar(None, pa.string()))
        takes_turn = turn_topics.is_valid().to_numpy(zero_copy_only=False)
        chosen = np.full(count, -1, dtype=np.int64)
        if takes_turn.any():
            rows = np.flatnonzero(takes_turn)
            turn_encoded = pc.dictionary_encode(turn_topics.take(pa.array(rows)))
            turn_names = turn_encoded.dictionary.to_pylist()
            turn_codes = turn_encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            turns = np.array([self.rr.get(name, 0) for name in turn_names], dtype=np.int64)
            counts = np.array([self.count(name) for name in turn_names], dtype=np.int64)
            chosen[rows] = (turns[turn_codes] + ranks_within(turn_codes)) % counts[turn_codes]
            for code, taken in enumerate(np.bincount(turn_codes, minlength=len(turn_names)).tolist()):
                if taken:
                    self.rr[turn_names[code]] = int(turns[code]) + taken
        plain = takes_turn & no_queue
        queues[plain] = chosen[plain]
        real_queues = np.where(takes_turn & ~no_queue, chosen, -1)
        origin_turns = _column(batch, "origin_turn")
        if origin_turns is not None and origin_turns.null_count < count:
            waiting = np.flatnonzero(origin_turns.is_valid().to_numpy(zero_copy_only=False))
            if self.origin_counters is not None:
                partitions = batch.column("origin_partition").to_numpy(zero_copy_only=False)
                ordinals = origin_turns.to_numpy(zero_copy_only=False)
                for row in waiting.tolist():
                    topic = names[codes[row]]
                    before = self.origin_counters[int(partitions[row])].get(topic, 0)
                    queues[row] = (before + int(ordinals[row])) % self.count(topic)
                real_queues[waiting] = queues[waiting]
        offsets = np.zeros(count, dtype=np.int64)
        consumes = consumes_queue_offsets(batch.column("sys_flag").to_numpy(zero_copy_only=False)) & (queues >= 0)
        consuming = np.flatnonzero(consumes)
        if len(consuming):
            keys = (codes[consuming] << 32) | queues[consuming]  # queue ids are 0..count-1 here
            distinct, inverse = np.unique(keys, return_inverse=True)
            queue_keys = [(names[key >> 32], key & 0xFFFFFFFF) for key in distinct.tolist()]
            heads = np.array([self.heads.get(key, 0) for key in queue_keys], dtype=np.int64)
            offsets[consuming] = heads[inverse] + ranks_within(keys)
            for key, head, taken in zip(queue_keys, heads.tolist(), np.bincount(inverse).tolist(), strict=True):
                self.heads[key] = head + taken
        return Assigned(names, codes, plain, queues, offsets, real_queues)


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


def real_qid_growth(real_queues: np.ndarray) -> np.ndarray:
    """Bytes a record grows by when its placeholder REAL_QID becomes the chosen queue (0 where none is chosen)."""
    digits = np.ones(len(real_queues), dtype=np.int64)
    for power in (10, 100, 1000, 10000):
        digits += real_queues >= power
    return np.where(real_queues >= 0, digits - len(REAL_QID_PLACEHOLDER), 0)


def ranks_within(keys: np.ndarray) -> np.ndarray:
    """Each element's 0-based rank among the elements with the same key, in array order."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    group_starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[group_starts, len(keys)])
    ranks = np.empty(len(keys), dtype=np.int64)
    ranks[order] = np.arange(len(keys)) - np.repeat(group_starts, sizes)
    return ranks


def stats_of_partition(
    partition: int,
    batches: Iterable[pa.RecordBatch],
    *,
    queue_counts: Mapping[str, int],
    default_queue_count: int | None,
) -> pa.RecordBatch:
    """Counts of one partition (see module docstring, step 2).

    Kinds: ``messages``/``bytes`` (partition totals, bytes before any REAL_QID
    is chosen), ``rr_total`` (round-robin turns per topic), ``rr_consuming``
    (offset-consuming round-robin messages per topic by their local ordinal
    modulo the queue count), ``queue`` (offset-consuming messages with a known
    queue), ``rr_reroute`` (re-routed messages taking a turn of their real
    topic, by local ordinal modulo its queue count: their REAL_QID's length)
    and ``rr_delivery`` (deliveries of such messages, per topic, origin
    partition (``queue_id``) and origin turn modulo the queue count).
    """
    messages = total_bytes = 0
    per_topic: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rr_consuming: dict[tuple[str, int], int] = defaultdict(int)
    per_queue: dict[tuple[str, int], int] = defaultdict(int)
    rr_reroute: dict[tuple[str, int], int] = defaultdict(int)
    rr_delivery: dict[tuple[str, int, int], int] = defaultdict(int)
    # Counters from zero: a round-robin message's queue is then its local ordinal modulo the queue count.
    local = QueueAssigner({}, {}, queue_counts=queue_counts, default_queue_count=default_queue_count)
    for batch in batches:
        if not batch.num_rows:
            continue
        assigned = local.assign(batch)
        names, codes, round_robin, queues = assigned.names, assigned.codes, assigned.plain_round_robin, assigned.queues
        sizes = batch.column("total_size").to_numpy(zero_copy_only=False).astype(np.int64)
        messages += batch.num_rows
        total_bytes += int(sizes.sum())
        counts = np.bincount(codes, minlength=len(names)).tolist()
        weights = np.bincount(codes, weights=sizes, minlength=len(names)).tolist()
        for code, name in enumerate(names):
            per_topic[name][0] += counts[code]
            per_topic[name][1] += int(weights[code])
        consuming = consumes_queue_offsets(batch.column("sys_flag").to_numpy(zero_copy_only=False))
        known = queues >= 0
        for mask, target in ((round_robin & consuming, rr_consuming), (~round_robin & consuming & known, per_queue)):
            if mask.any():
                keys, taken = np.unique((codes[mask] << 32) | queues[mask], return_counts=True)
                for key, count in zip(keys.tolist(), taken.tolist(), strict=True):
                    target[(names[key >> 32], key & 0xFFFFFFFF)] += count
        rerouted = np.flatnonzero(assigned.real_queues >= 0)
        if len(rerouted):
            turn_topics = batch.column("rr_topic").take(pa.array(rerouted)).to_pylist()
            for topic, bucket in zip(turn_topics, assigned.real_queues[rerouted].tolist(), strict=True):
                rr_reroute[(topic, bucket)] += 1
        origin_turns = _column(batch, "origin_turn")
        if origin_turns is not None and origin_turns.null_count < batch.num_rows:
            waiting = np.flatnonzero(origin_turns.is_valid().to_numpy(zero_copy_only=False))
            partitions = batch.column("origin_partition").to_numpy(zero_copy_only=False)
            ordinals = origin_turns.to_numpy(zero_copy_only=False)
            for row in waiting.tolist():
                topic = names[codes[row]]
                rr_delivery[(topic, int(partitions[row]), int(ordinals[row]) % local.count(topic))] += 1
    rr_total = {topic: turns for topic, turns in local.rr.items() if turns}  # counted from zero in this partition
    rows = [(partition, "messages", None, None, None, messages), (partition, "bytes", None, None, None, total_bytes)]
    rows += [(partition, "rr_total", t, None, None, n) for t, n in rr_total.items()]
    rows += [(partition, "rr_consuming", t, None, b, n) for (t, b), n in rr_consuming.items()]
    rows += [(partition, "queue", t, q, None, n) for (t, q), n in per_queue.items()]
    rows += [(partition, "rr_reroute", t, None, b, n) for (t, b), n in rr_reroute.items()]
    rows += [(partition, "rr_delivery", t, p, b, n) for (t, p, b), n in rr_delivery.items()]
    rows += [(partition, "topic_messages", t, None, None, c) for t, (c, _) in per_topic.items()]
    rows += [(partition, "topic_bytes", t, None, None, b) for t, (_, b) in per_topic.items()]
    return pa.RecordBatch.from_arrays(
        [pa.array([row[i] for row in rows], field.type) for i, field in enumerate(_STATS_SCHEMA)], schema=_STATS_SCHEMA
    )


StatsRow = STATS.record_type("StatsRow", "One count of ``stats_of_partition``, as the driver's plan reads it.")


def stats_rows(batch: pa.RecordBatch) -> list[StatsRow]:
    return [StatsRow(**row) for row in batch.to_pylist()]


@dataclass(frozen=True)
class PartitionStart:
    """Where partition ``partition`` starts: physical offset, round-robin counters, queue heads."""

    physical_offset: int
    rr_counters: dict[str, int]
    queue_offsets: dict[tuple[str, int], int]


@dataclass(frozen=True)
class AppendPlan:
    """Starting values of every partition and the lake state after the batch."""

    starts: dict[int, PartitionStart]
    end_offset: int
    rr_counters: dict[str, int]
    queue_heads: dict[tuple[str, int], int]
    partitions_replayed: int
    messages: int
    message_bytes: int
    topic_totals: dict[str, tuple[int, int]]


def plan_append(
    stats_rows: Iterable,
    *,
    partitions: int,
    start_offset: int,
    queue_heads: Mapping[tuple[str, int], int],
    rr_counters: Mapping[str, int],
    queue_counts: Mapping[str, int],
    default_queue_count: int | None,
    segment_size: int,
    replay: Callable[[int, PartitionStart, Mapping[int, Mapping[str, int]]], int],
) -> AppendPlan:
    """Turn per-partition counts into per-partition starting values (driver side, no message rows).

    Args:
        stats_rows: ``StatsRow``s of every partition (``stats_rows`` of ``order_partition``'s batches).
        partitions: number of partitions of the ordered frame.
        start_offset: commitlog write position before the batch.
        queue_heads: next queue offset per (topic, queue) before the batch.
        rr_counters: round-robin messages per topic before the batch.
        replay: ``replay(partition, start, origin_counters) -> end_offset`` for a
            partition that crosses a segment end (runs on that partition only;
            ``origin_counters``: the round-robin counters each partition so far starts with).
    """
    messages = defaultdict(int)
    sizes = defaultdict(int)
    rr_total: dict[int, dict[str, int]] = defaultdict(dict)
    rr_consuming: dict[int, dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    per_queue: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
    rr_reroute: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
    rr_delivery: dict[int, dict[tuple[str, int, int], int]] = defaultdict(dict)
    topic_totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in stats_rows:
        if row.kind == "messages":
            messages[row.partition] = row.value
        elif row.kind == "bytes":
            sizes[row.partition] = row.value
        elif row.kind == "rr_total":
            rr_total[row.partition][row.topic] = row.value
        elif row.kind == "rr_consuming":
            rr_consuming[row.partition][row.topic][row.bucket] = row.value
        elif row.kind == "queue":
            per_queue[row.partition][(row.topic, row.queue_id)] = row.value
        elif row.kind == "rr_reroute":
            rr_reroute[row.partition][(row.topic, row.bucket)] = row.value
        elif row.kind == "rr_delivery":
            rr_delivery[row.partition][(row.topic, row.queue_id, row.bucket)] = row.value
        elif row.kind == "topic_messages":
            topic_totals[row.topic][0] += row.value
        elif row.kind == "topic_bytes":
            topic_totals[row.topic][1] += row.value
    heads = dict(queue_heads)
    counters = dict(rr_counters)
    position = start_offset
    starts: dict[int, PartitionStart] = {}
    origin_counters: dict[int, dict[str, int]] = {}
    replayed = 0
    for partition in range(partitions):
        starts[partition] = PartitionStart(position, dict(counters), dict(heads))
        origin_counters[partition] = starts[partition].rr_counters
        growth = 0  # the REAL_QIDs chosen in this partition: the byte count assumed one digit each
        for (topic, bucket), count in rr_reroute[partition].items():
            queue = (counters.get(topic, 0) + bucket) % _queue_count(topic, queue_counts, default_queue_count)
            growth += count * int(real_qid_growth(np.array([queue]))[0])
        for (topic, origin, bucket), count in rr_delivery[partition].items():
            before = origin_counters[origin].get(topic, 0)
            queue = (before + bucket) % _queue_count(topic, queue_counts, default_queue_count)
            heads[(topic, queue)] = heads.get((topic, queue), 0) + count
            growth += count * int(real_qid_growth(np.array([queue]))[0])
        for key, count in per_queue[partition].items():
            heads[key] = heads.get(key, 0) + count
        for topic, buckets in rr_consuming[partition].items():
            queue_count = _queue_count(topic, queue_counts, default_queue_count)
            before = counters.get(topic, 0)
            for bucket, count in buckets.items():
                queue = (before + bucket) % queue_count
                heads[(topic, queue)] = heads.get((topic, queue), 0) + count
        for topic, count in rr_total[partition].items():
            counters[topic] = counters.get(topic, 0) + count
        size = sizes[partition] + growth
        if size == 0:
            continue
        if position + size + 8 <= next_segment_start(position, segment_size):
            position += size  # every record of the partition fits the current segment
        else:
            position = replay(partition, starts[partition], origin_counters)
            replayed += 1
    return AppendPlan(
        starts=starts,
        end_offset=position,
        rr_counters=counters,
        queue_heads=heads,
        partitions_replayed=replayed,
        messages=sum(messages.values()),
        message_bytes=sum(sizes.values()),
        topic_totals={topic: (count, size) for topic, (count, size) in topic_totals.items()},
    )


PLACEMENT_SCHEMA = pa.schema(
    [
        ("split", pa.int32()),
        ("source_line", pa.int64()),
        ("scratch_batch", pa.int32()),
        ("scratch_row", pa.int32()),
        ("physical_offset", pa.int64()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("total_size", pa.int32()),
        ("real_queue", pa.int32()),  # the REAL_QID chosen at append time; null where the record has its own
    ]
)


class PartitionPlacer:
    """Replays the broker's append for one partition, batch after batch, from its start."""

    def __init__(
        self,
        start: PartitionStart,
        *,
        queue_counts,
        default_queue_count,
        segment_size: int,
        origin_counters: Mapping[int, Mapping[str, int]] | None = None,
    ):
        self.position = start.physical_offset
        self.queues = QueueAssigner(
            start.rr_counters,
            start.queue_offsets,
            queue_counts=queue_counts,
            default_queue_count=default_queue_count,
            origin_counters=origin_counters or {},
        )
        self.segment_size = segment_size

    def place(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Narrow rows in append order → their ``PLACEMENT_SCHEMA`` rows (queue, queue offset, physical offset)."""
        assigned = self.queues.assign(batch)
        sizes = batch.column("total_size").to_numpy(zero_copy_only=False) + real_qid_growth(assigned.real_queues)
        placement = place_records(sizes, start_offset=self.position, segment_size=self.segment_size)
        self.position = placement.end_offset
        chosen = assigned.real_queues >= 0
        return pa.RecordBatch.from_arrays(
            [
                batch.column("split"),
                batch.column("source_line"),
                batch.column("scratch_batch"),
                batch.column("scratch_row"),
                pa.array(placement.offsets, pa.int64()),
                pa.array(assigned.queues, pa.int32()),
                pa.array(assigned.offsets, pa.int64()),
                pa.array(sizes, pa.int32()),
                pa.array(assigned.real_queues, pa.int32(), mask=~chosen),
            ],
            schema=PLACEMENT_SCHEMA,
        )


# A commitlog data file's columns: all but the partition column (its folder gives it).
COMMITLOG_FILE = COMMITLOG.schema.without("segment")
COMMITLOG_FILE_SCHEMA = COMMITLOG_FILE.arrow_schema


def commitlog_rows(messages: pa.Table, placement: pa.Table, *, segment_size: int, source_file, batch_id: str):
    """The commitlog rows of placed messages: placement columns, segment, offsetMsgId and batch joined in.

    Returns (each row's segment start offset as a NumPy array, table of ``COMMITLOG_FILE_SCHEMA`` columns).
    """
    offsets = placement.column("physical_offset").to_numpy()
    starts = segment_start(offsets, segment_size)  # element-wise on the array
    distinct, codes = np.unique(placement.column("split").to_numpy(), return_inverse=True)
    names = pa.array([source_file(int(split)) for split in distinct.tolist()], pa.string())
    computed = {
        "physical_offset": placement.column("physical_offset"),
        "queue_id": placement.column("queue_id"),
        "queue_offset": placement.column("queue_offset"),
        "total_size": placement.column("total_size"),
        "msg_id": offset_msg_ids_with_prefix(messages.column("store_host_prefix").combine_chunks(), offsets),
        "batch_id": pa.repeat(pa.scalar(batch_id, pa.string()), messages.num_rows),
        "source_file": pc.take(names, pa.array(codes)),
    }
    if placement.column("real_queue").null_count < placement.num_rows:
        computed.update(_with_real_qids(messages, placement.column("real_queue")))
    stored = COMMITLOG_FILE.stored
    columns = [computed[name] if name in computed else messages.column(name) for name in stored.names]
    table = COMMITLOG_FILE.complete(pa.Table.from_arrays(columns, schema=stored.viewed_arrow_schema(columns)))
    return starts, table


def _with_real_qids(messages: pa.Table, real_queues: pa.ChunkedArray) -> dict[str, pa.Array]:
    """``properties`` and ``properties_bytes`` with each placeholder REAL_QID replaced by the queue chosen."""
    properties = messages.column("properties").to_pylist()
    serialised = messages.column("properties_bytes").to_pylist()
    for row, queue in enumerate(real_queues.to_pylist()):
        if queue is None:
            continue
        properties[row] = [(name, str(queue) if name == REAL_QID else value) for name, value in properties[row]]
        serialised[row] = serialize_properties(properties[row])
    return {
        "properties": pa.array(properties, messages.schema.field("properties").type),
        "properties_bytes": pa.array(serialised, pa.binary()),
    }


def merge_segment_aggregates(written: Iterable) -> list[dict]:
    """Per segment: the files' counts summed, first/last store time of the first/last record by offset."""
    segments: dict[str, dict] = {}
    for row in sorted(written, key=lambda r: r["first_offset"]):
        merged = segments.get(row["segment"])
        if merged is None:
            segments[row["segment"]] = {
                "segment": row["segment"],
                "message_count": row["message_count"],
                "data_end": row["data_end"],
                "first_store_timestamp": row["first_store_timestamp"],
                "last_store_timestamp": row["last_store_timestamp"],
            }
        else:
            merged["message_count"] += row["message_count"]
            merged["data_end"] = max(merged["data_end"], row["data_end"])
            merged["last_store_timestamp"] = row["last_store_timestamp"]
    return list(segments.values())
