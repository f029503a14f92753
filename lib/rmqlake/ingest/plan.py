"""The broker's append, planned: append order, queue choice and queue offsets, partition starts, placement.

Driver-side plans from a few counts per partition and the per-batch kernels that replay them in a task; no
file I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rmqlake.formats.msgid import offset_msg_ids_with_prefix
from rmqlake.formats.record import consumes_queue_offsets
from rmqlake.formats.segment import next_segment_start, place_records, segment_start
from rmqlake.lake.tables import COMMITLOG, columns

# file_rank: the input file's position in path order, so ordering by it orders by path.
APPEND_ORDER = ("store_timestamp", "file_rank", "source_line")


def append_order_bounds(footers: Iterable[pq.FileMetaData], partitions: int) -> list[int]:
    """``partitions - 1`` store timestamps cutting the messages into ranges of about equal size.

    Partition ``i`` holds the messages with ``bounds[i-1] <= store_timestamp
    < bounds[i]``, so every message of one timestamp is in one partition and
    partition ``i`` precedes ``i + 1`` in the append order. The bounds come
    from the narrow files' row-group statistics (each split's rows are
    sorted), read on the driver: a few numbers per row group, no rows.
    """
    groups = []  # (min, max, rows) of every row group
    for footer in footers:
        column = footer.schema.names.index("store_timestamp")
        for index in range(footer.num_row_groups):
            group = footer.row_group(index)
            stats = group.column(column).statistics
            groups.append((stats.min, stats.max, group.num_rows))
    if partitions <= 1 or not groups:
        return []
    # Spread each row group's rows evenly over its timestamp range, then take the quantiles.
    lows = np.array([g[0] for g in groups], dtype=np.float64)
    highs = np.array([g[1] for g in groups], dtype=np.float64)
    rows = np.array([g[2] for g in groups], dtype=np.float64)
    points = np.unique(np.concatenate([lows, highs]))
    below = np.zeros(len(points))  # rows with a timestamp below each point
    for low, high, count in zip(lows, highs, rows, strict=True):
        span = max(high - low, 1.0)
        below += count * np.clip((points - low) / span, 0.0, 1.0)
    wanted = below[-1] * np.arange(1, partitions) / partitions
    bounds = np.ceil(np.interp(wanted, below, points)).astype(np.int64)
    return np.maximum.accumulate(bounds).tolist()


# One count of a partition (``stats_of_partition``): the frame the ordering tasks return to the driver.
STATS = columns(
    ("partition", "int", "the append-order partition counted"),
    ("kind", "string", "messages, bytes, rr_total, rr_consuming, queue, topic_messages or topic_bytes"),
    ("topic", "string", "the topic counted, for the per-topic and per-queue kinds"),
    ("queue_id", "int", "the queue counted, for the queue kind"),
    ("bucket", "int", "a round-robin message's local ordinal modulo the topic's queue count (rr_consuming)"),
    ("value", "bigint", "the count"),
)
_STATS_SCHEMA = STATS.arrow_schema


def _queue_count(topic: str, queue_counts: Mapping[str, int], default: int | None) -> int:
    count = queue_counts.get(topic, default)
    if count is None:
        raise ValueError(f"topic {topic!r} has no queue count")  # parse_line rejects such lines
    return count


class QueueAssigner:
    """The broker's queue choice and queue offsets for messages in append order, batch after batch.

    A message without a queue takes the next round-robin turn of its topic
    (ordinal modulo the topic's queue count); a NOT_TYPE or COMMIT message
    takes the next offset of its queue. Vectorised: per batch, a message's
    turn (or offset) is the counter before the batch plus its rank among the
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
    ):
        self.rr = dict(rr_counters)
        self.heads = dict(queue_offsets)
        self.queue_counts = queue_counts
        self.default_queue_count = default_queue_count

    def assign(self, batch: pa.RecordBatch) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(topic names, topic code per row, round-robin mask, queue ids, queue offsets; 0 if none consumed)."""
        encoded = pc.dictionary_encode(batch.column("topic"))
        names = encoded.dictionary.to_pylist()
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        given = batch.column("queue_id")
        round_robin = given.is_null().to_numpy(zero_copy_only=False)
        queues = given.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        if round_robin.any():
            rows = np.flatnonzero(round_robin)
            topic_codes = codes[rows]
            turns = np.array([self.rr.get(name, 0) for name in names], dtype=np.int64)
            counts = np.ones(len(names), dtype=np.int64)
            for code in np.unique(topic_codes).tolist():
                counts[code] = _queue_count(names[code], self.queue_counts, self.default_queue_count)
            queues[rows] = (turns[topic_codes] + _ranks_within(topic_codes)) % counts[topic_codes]
            for code, taken in enumerate(np.bincount(topic_codes, minlength=len(names)).tolist()):
                if taken:
                    self.rr[names[code]] = int(turns[code]) + taken
        offsets = np.zeros(batch.num_rows, dtype=np.int64)
        consuming = np.flatnonzero(consumes_queue_offsets(batch.column("sys_flag").to_numpy(zero_copy_only=False)))
        if len(consuming):
            keys = (codes[consuming] << 32) | queues[consuming]  # queue ids are 0..count-1 here
            distinct, inverse = np.unique(keys, return_inverse=True)
            queue_keys = [(names[key >> 32], key & 0xFFFFFFFF) for key in distinct.tolist()]
            heads = np.array([self.heads.get(key, 0) for key in queue_keys], dtype=np.int64)
            offsets[consuming] = heads[inverse] + _ranks_within(keys)
            for key, head, taken in zip(queue_keys, heads.tolist(), np.bincount(inverse).tolist(), strict=True):
                self.heads[key] = head + taken
        return names, codes, round_robin, queues, offsets


def _ranks_within(keys: np.ndarray) -> np.ndarray:
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

    Kinds: ``messages``/``bytes`` (partition totals), ``rr_total`` (round-robin
    messages per topic), ``rr_consuming`` (offset-consuming round-robin
    messages per topic by their local ordinal modulo the queue count) and
    ``queue`` (offset-consuming messages with a known queue).
    """
    messages = total_bytes = 0
    per_topic: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rr_consuming: dict[tuple[str, int], int] = defaultdict(int)
    per_queue: dict[tuple[str, int], int] = defaultdict(int)
    # Counters from zero: a round-robin message's queue is then its local ordinal modulo the queue count.
    local = QueueAssigner({}, {}, queue_counts=queue_counts, default_queue_count=default_queue_count)
    for batch in batches:
        if not batch.num_rows:
            continue
        names, codes, round_robin, queues, _ = local.assign(batch)
        sizes = batch.column("total_size").to_numpy(zero_copy_only=False).astype(np.int64)
        messages += batch.num_rows
        total_bytes += int(sizes.sum())
        counts = np.bincount(codes, minlength=len(names)).tolist()
        weights = np.bincount(codes, weights=sizes, minlength=len(names)).tolist()
        for code, name in enumerate(names):
            per_topic[name][0] += counts[code]
            per_topic[name][1] += int(weights[code])
        consuming = consumes_queue_offsets(batch.column("sys_flag").to_numpy(zero_copy_only=False))
        for mask, target in ((round_robin & consuming, rr_consuming), (~round_robin & consuming, per_queue)):
            if mask.any():
                keys, taken = np.unique((codes[mask] << 32) | queues[mask], return_counts=True)
                for key, count in zip(keys.tolist(), taken.tolist(), strict=True):
                    target[(names[key >> 32], key & 0xFFFFFFFF)] += count
    rr_total = {topic: turns for topic, turns in local.rr.items() if turns}  # counted from zero in this partition
    rows = [(partition, "messages", None, None, None, messages), (partition, "bytes", None, None, None, total_bytes)]
    rows += [(partition, "rr_total", t, None, None, n) for t, n in rr_total.items()]
    rows += [(partition, "rr_consuming", t, None, b, n) for (t, b), n in rr_consuming.items()]
    rows += [(partition, "queue", t, q, None, n) for (t, q), n in per_queue.items()]
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
    replay: Callable[[int, int], int],
) -> AppendPlan:
    """Turn per-partition counts into per-partition starting values (driver side, no message rows).

    Args:
        stats_rows: ``StatsRow``s of every partition (``stats_rows`` of ``order_partition``'s batches).
        partitions: number of partitions of the ordered frame.
        start_offset: commitlog write position before the batch.
        queue_heads: next queue offset per (topic, queue) before the batch.
        rr_counters: round-robin messages per topic before the batch.
        replay: ``replay(partition, start_offset) -> end_offset`` for a
            partition that crosses a segment end (runs on that partition only).
    """
    messages = defaultdict(int)
    sizes = defaultdict(int)
    rr_total: dict[int, dict[str, int]] = defaultdict(dict)
    rr_consuming: dict[int, dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    per_queue: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
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
        elif row.kind == "topic_messages":
            topic_totals[row.topic][0] += row.value
        elif row.kind == "topic_bytes":
            topic_totals[row.topic][1] += row.value
    heads = dict(queue_heads)
    counters = dict(rr_counters)
    position = start_offset
    starts: dict[int, PartitionStart] = {}
    replayed = 0
    for partition in range(partitions):
        starts[partition] = PartitionStart(position, dict(counters), dict(heads))
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
        size = sizes[partition]
        if size == 0:
            continue
        if position + size + 8 <= next_segment_start(position, segment_size):
            position += size  # every record of the partition fits the current segment
        else:
            position = replay(partition, position)
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


def replay_end_offset(sizes: Iterable[int], *, start_offset: int, segment_size: int, chunk: int = 65536) -> int:
    """Write position after appending records of ``sizes`` from ``start_offset`` (rolls included)."""
    position = start_offset
    buffer: list[int] = []
    for size in sizes:
        buffer.append(size)
        if len(buffer) >= chunk:
            position = place_records(buffer, start_offset=position, segment_size=segment_size).end_offset
            buffer = []
    if buffer:
        position = place_records(buffer, start_offset=position, segment_size=segment_size).end_offset
    return position


PLACEMENT_SCHEMA = pa.schema(
    [
        ("split", pa.int32()),
        ("source_line", pa.int64()),
        ("scratch_batch", pa.int32()),
        ("scratch_row", pa.int32()),
        ("physical_offset", pa.int64()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
    ]
)


class PartitionPlacer:
    """Replays the broker's append for one partition, batch after batch, from its start."""

    def __init__(self, start: PartitionStart, *, queue_counts, default_queue_count, segment_size: int):
        self.position = start.physical_offset
        self.queues = QueueAssigner(
            start.rr_counters, start.queue_offsets, queue_counts=queue_counts, default_queue_count=default_queue_count
        )
        self.segment_size = segment_size

    def place(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Narrow rows in append order → their ``PLACEMENT_SCHEMA`` rows (queue, queue offset, physical offset)."""
        placement = place_records(
            batch.column("total_size").to_numpy(zero_copy_only=False),
            start_offset=self.position,
            segment_size=self.segment_size,
        )
        self.position = placement.end_offset
        _, _, _, queue_ids, queue_offsets = self.queues.assign(batch)
        return pa.RecordBatch.from_arrays(
            [
                batch.column("split"),
                batch.column("source_line"),
                batch.column("scratch_batch"),
                batch.column("scratch_row"),
                pa.array(placement.offsets, pa.int64()),
                pa.array(queue_ids, pa.int32()),
                pa.array(queue_offsets, pa.int64()),
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
        "msg_id": offset_msg_ids_with_prefix(messages.column("store_host_prefix").combine_chunks(), offsets),
        "batch_id": pa.repeat(pa.scalar(batch_id, pa.string()), messages.num_rows),
        "source_file": pc.take(names, pa.array(codes)),
    }
    stored = COMMITLOG_FILE.stored
    columns = [computed[name] if name in computed else messages.column(name) for name in stored.names]
    table = COMMITLOG_FILE.complete(pa.Table.from_arrays(columns, schema=stored.arrow_schema))
    return starts, table


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
