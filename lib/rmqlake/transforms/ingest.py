"""Ingest: producer log lines → CommitLog rows, placed exactly as a broker appends them.

The broker appends one message at a time; here the same sequential rules are
computed in parallel (DESIGN "Algorithms that must scale"):

1. ``parse_batch``: each line → record fields or a reject reason.
2. ``order_for_append``: range-partition and sort by the append order
   (storeTimestamp, source file, line), so partition i precedes i+1.
3. ``partition_stats``: per partition, message count and bytes, round-robin
   counts per topic and offset-consuming counts per queue. A few numbers
   per partition and queue, collected by the caller.
4. ``plan_append`` (driver): prefix sums give each partition its starting
   queue offsets, round-robin counters and physical offset. Only a partition
   that crosses a segment end is replayed (by a one-partition job the caller
   supplies) to learn where it ends.
5. ``place_messages``: each partition replays its own rolls from its start.
"""

from __future__ import annotations

import gc
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.msgid import offset_msg_id_with_prefix
from rmqlake.formats.record import consumes_queue_offset
from rmqlake.formats.segment import next_segment_start, place_records, segment_file_name, segment_start
from rmqlake.producer_log import ParseOptions, Rejection, parse_line

log = logging.getLogger(__name__)

APPEND_ORDER = ("store_timestamp", "source_file", "source_line")

_MESSAGE_FIELDS = [
    ("topic", pa.string()),
    ("queue_id", pa.int32()),
    ("flag", pa.int32()),
    ("sys_flag", pa.int32()),
    ("magic", pa.int32()),
    ("born_timestamp", pa.int64()),
    ("born_host", pa.string()),
    ("store_timestamp", pa.int64()),
    ("store_host", pa.string()),
    ("store_host_prefix", pa.string()),
    ("reconsume_times", pa.int32()),
    ("prepared_transaction_offset", pa.int64()),
    ("body", pa.binary()),
    ("body_crc", pa.int32()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("properties_bytes", pa.binary()),
    ("keys", pa.list_(pa.field("element", pa.string()))),
    ("tags", pa.string()),
    ("uniq_key", pa.string()),
    ("total_size", pa.int32()),
]
PARSED_SCHEMA = pa.schema(
    [
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
        ("raw", pa.string()),
        ("reject_reason", pa.string()),
        *_MESSAGE_FIELDS,
    ]
)
PARSED_DDL = """source_file string, source_line bigint, raw string, reject_reason string, topic string,
    queue_id int, flag int, sys_flag int, magic int, born_timestamp bigint, born_host string,
    store_timestamp bigint, store_host string, store_host_prefix string, reconsume_times int,
    prepared_transaction_offset bigint, body binary, body_crc int, properties map<string,string>,
    properties_bytes binary, keys array<string>, tags string, uniq_key string, total_size int"""
_MESSAGE_NAMES = [name for name, _ in _MESSAGE_FIELDS]


_NO_MESSAGE = (None,) * len(_MESSAGE_FIELDS)
_PROPERTIES_INDEX = _MESSAGE_NAMES.index("properties")


def parse_batch(batch: pa.RecordBatch, *, options: ParseOptions) -> pa.RecordBatch:
    """Parse one Arrow batch of lines (source_file, source_line, file_hash32, raw)."""
    return parse_raw_lines(
        batch.column("source_file").to_pylist(),
        batch.column("source_line").to_pylist(),
        batch.column("file_hash32").to_pylist(),
        batch.column("raw").to_pylist(),
        options=options,
    )


def parse_raw_lines(files: list, numbers: list, hashes: list, raws: list, *, options: ParseOptions) -> pa.RecordBatch:
    """Parse lines given as parallel lists into one Arrow batch of ``PARSED_SCHEMA``."""
    texts, reasons, rows = [], [], []
    with _gc_paused():
        _parse_into(numbers, hashes, raws, options, texts, reasons, rows)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in _MESSAGE_FIELDS]
    columns[_PROPERTIES_INDEX] = [None if p is None else list(p.items()) for p in columns[_PROPERTIES_INDEX]]
    arrays = [
        pa.array(files, pa.string()),
        pa.array(numbers, pa.int64()),
        pa.array(texts, pa.string()),
        pa.array(reasons, pa.string()),
    ]
    arrays += [pa.array(column, field_type) for column, (_, field_type) in zip(columns, _MESSAGE_FIELDS, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED_SCHEMA)


def _parse_into(numbers, hashes, raws, options, texts, reasons, rows) -> None:
    for source_line, hash32, raw in zip(numbers, hashes, raws, strict=True):
        try:
            message = parse_line(raw, options=options, source_line=source_line, file_hash32=hash32)
        except Rejection as exc:
            texts.append(raw.decode("utf-8", "replace"))
            reasons.append(str(exc))
            rows.append(_NO_MESSAGE)
            continue
        texts.append(None)
        reasons.append(None)
        rows.append(message)


@contextmanager
def _gc_paused():
    """Parsing allocates many short-lived objects and no cycles; the cycle collector only costs time here."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def valid_messages(parsed):
    """The parsed rows that became messages."""
    return parsed.filter("reject_reason IS NULL").drop("raw", "reject_reason")


def rejected_lines(parsed, *, batch_id: str, rejected_at):
    """The parsed rows that did not become messages, as ``rejected`` table rows."""
    from pyspark.sql import functions as F

    return parsed.filter("reject_reason IS NOT NULL").select(
        F.lit(batch_id).alias("batch_id"),
        "source_file",
        "source_line",
        "raw",
        F.col("reject_reason").alias("reason"),
        F.lit(rejected_at).cast("timestamp").alias("rejected_at"),
    )


def order_for_append(messages, *, partitions: int):
    """Range-partition and sort by the append order, so partition order is log order."""
    return messages.repartitionByRange(partitions, *APPEND_ORDER).sortWithinPartitions(*APPEND_ORDER)


# -- step 3: per-partition statistics -------------------------------------------------------

STATS_DDL = "partition int, kind string, topic string, queue_id int, bucket int, value bigint"
_STATS_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("bucket", pa.int32()),
        ("value", pa.int64()),
    ]
)


def _queue_count(topic: str, queue_counts: Mapping[str, int], default: int | None) -> int:
    count = queue_counts.get(topic, default)
    if count is None:
        raise ValueError(f"topic {topic!r} has no queue count")  # parse_line rejects such lines
    return count


def stats_of_partition(
    partition: int,
    batches: Iterable[pa.RecordBatch],
    *,
    queue_counts: Mapping[str, int],
    default_queue_count: int | None,
) -> pa.RecordBatch:
    """Counts of one partition (see module docstring, step 3).

    Kinds: ``messages``/``bytes`` (partition totals), ``rr_total`` (round-robin
    messages per topic), ``rr_consuming`` (offset-consuming round-robin
    messages per topic by their local ordinal modulo the queue count) and
    ``queue`` (offset-consuming messages with a known queue).
    """
    messages = total_bytes = 0
    per_topic: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rr_total: dict[str, int] = defaultdict(int)
    rr_consuming: dict[tuple[str, int], int] = defaultdict(int)
    per_queue: dict[tuple[str, int], int] = defaultdict(int)
    for batch in batches:
        messages += batch.num_rows
        total_bytes += pc.sum(batch.column("total_size")).as_py() or 0
        topics = batch.column("topic").to_pylist()
        queues = batch.column("queue_id").to_pylist()
        flags = batch.column("sys_flag").to_pylist()
        sizes = batch.column("total_size").to_pylist()
        for topic, queue, flag, size in zip(topics, queues, flags, sizes, strict=True):
            totals = per_topic[topic]
            totals[0] += 1
            totals[1] += size
            consuming = consumes_queue_offset(flag)
            if queue is None:
                ordinal = rr_total[topic]
                rr_total[topic] = ordinal + 1
                if consuming:
                    rr_consuming[(topic, ordinal % _queue_count(topic, queue_counts, default_queue_count))] += 1
            elif consuming:
                per_queue[(topic, queue)] += 1
    rows = [(partition, "messages", None, None, None, messages), (partition, "bytes", None, None, None, total_bytes)]
    rows += [(partition, "rr_total", t, None, None, n) for t, n in rr_total.items()]
    rows += [(partition, "rr_consuming", t, None, b, n) for (t, b), n in rr_consuming.items()]
    rows += [(partition, "queue", t, q, None, n) for (t, q), n in per_queue.items()]
    rows += [(partition, "topic_messages", t, None, None, c) for t, (c, _) in per_topic.items()]
    rows += [(partition, "topic_bytes", t, None, None, b) for t, (_, b) in per_topic.items()]
    return pa.RecordBatch.from_arrays(
        [pa.array([row[i] for row in rows], field.type) for i, field in enumerate(_STATS_SCHEMA)], schema=_STATS_SCHEMA
    )


def partition_stats(ordered, *, queue_counts: Mapping[str, int], default_queue_count: int | None):
    """One small set of counts per partition of ``ordered`` (a few rows per queue)."""

    def stats(batches):
        from pyspark import TaskContext

        yield stats_of_partition(
            TaskContext.get().partitionId(), batches, queue_counts=queue_counts, default_queue_count=default_queue_count
        )

    return ordered.select("topic", "queue_id", "sys_flag", "total_size").mapInArrow(stats, STATS_DDL)


# -- step 4: the plan ------------------------------------------------------------------------


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
        stats_rows: rows of ``partition_stats`` (attribute access: partition, kind, ...).
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


# -- step 5: placement -----------------------------------------------------------------------

PLACED_COLUMNS = [
    "segment",
    "physical_offset",
    "total_size",
    "magic",
    "body_crc",
    "queue_id",
    "flag",
    "queue_offset",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "body",
    "topic",
    "properties",
    "keys",
    "tags",
    "uniq_key",
    "msg_id",
    "source_file",
    "source_line",
    "properties_bytes",
]
PLACED_DDL = """segment string, physical_offset bigint, total_size int, magic int, body_crc int, queue_id int,
    flag int, queue_offset bigint, sys_flag int, born_timestamp bigint, born_host string,
    store_timestamp bigint, store_host string, reconsume_times int, prepared_transaction_offset bigint,
    body binary, topic string, properties map<string,string>, keys array<string>, tags string,
    uniq_key string, msg_id string, source_file string, source_line bigint, properties_bytes binary"""


class PartitionPlacer:
    """Replays the broker's append for one partition, batch after batch, from its start."""

    def __init__(self, start: PartitionStart, *, queue_counts, default_queue_count, segment_size: int):
        self.position = start.physical_offset
        self.rr = dict(start.rr_counters)
        self.heads = dict(start.queue_offsets)
        self.queue_counts = queue_counts
        self.default_queue_count = default_queue_count
        self.segment_size = segment_size

    def place(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        topics = batch.column("topic").to_pylist()
        queues = batch.column("queue_id").to_pylist()
        flags = batch.column("sys_flag").to_pylist()
        prefixes = batch.column("store_host_prefix").to_pylist()
        placement = place_records(
            batch.column("total_size").to_numpy(), start_offset=self.position, segment_size=self.segment_size
        )
        self.position = placement.end_offset
        offsets = placement.offsets.tolist()
        queue_ids, queue_offsets, segments, msg_ids = [], [], [], []
        for topic, queue, flag, prefix, offset in zip(topics, queues, flags, prefixes, offsets, strict=True):
            if queue is None:
                ordinal = self.rr.get(topic, 0)
                self.rr[topic] = ordinal + 1
                queue = ordinal % _queue_count(topic, self.queue_counts, self.default_queue_count)
            queue_ids.append(queue)
            if consumes_queue_offset(flag):
                head = self.heads.get((topic, queue), 0)
                self.heads[(topic, queue)] = head + 1
                queue_offsets.append(head)
            else:
                queue_offsets.append(0)
            segments.append(segment_file_name(segment_start(offset, self.segment_size)))
            msg_ids.append(offset_msg_id_with_prefix(prefix, offset))
        computed = {
            "segment": pa.array(segments, pa.string()),
            "physical_offset": pa.array(offsets, pa.int64()),
            "queue_id": pa.array(queue_ids, pa.int32()),
            "queue_offset": pa.array(queue_offsets, pa.int64()),
            "msg_id": pa.array(msg_ids, pa.string()),
        }
        arrays = [computed[name] if name in computed else batch.column(name) for name in PLACED_COLUMNS]
        return pa.RecordBatch.from_arrays(arrays, names=PLACED_COLUMNS)


def place_messages(ordered, *, plan: AppendPlan, queue_counts, default_queue_count, segment_size: int):
    """Give every message its queue, queue offset, physical offset, segment and offsetMsgId."""
    starts = plan.starts

    def place_partition(batches):
        from pyspark import TaskContext

        placer = PartitionPlacer(
            starts[TaskContext.get().partitionId()],
            queue_counts=queue_counts,
            default_queue_count=default_queue_count,
            segment_size=segment_size,
        )
        for batch in batches:
            yield placer.place(batch)

    return ordered.mapInArrow(place_partition, PLACED_DDL)
