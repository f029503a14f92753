"""The driver-side plan of ingest and the segments update, on a handful of inline rows."""

from __future__ import annotations

from types import SimpleNamespace as Row

import pyarrow as pa

from rmqlake.ingest.plan import PartitionPlacer, PartitionStart, plan_append, stats_of_partition
from rmqlake.transforms.segments import update_segments


def stats(*rows):
    return [Row(partition=p, kind=k, topic=t, queue_id=q, bucket=b, value=v) for p, k, t, q, b, v in rows]


def test_plan_gives_each_partition_its_prefix_and_replays_only_crossing_partitions():
    replayed = []

    def replay(partition, start, origin_counters):
        replayed.append((partition, start.physical_offset))
        return 1000 + 50  # partition 1 crossed into the second segment

    plan = plan_append(
        stats(
            (0, "messages", None, None, None, 2),
            (0, "bytes", None, None, None, 300),
            (0, "queue", "T", 0, None, 2),
            (1, "messages", None, None, None, 3),
            (1, "bytes", None, None, None, 800),  # 100 + 300 + 800 + 8 > 1000: crosses
            (1, "rr_total", "T", None, None, 3),  # round robin: ordinals 0, 1, 2 after 1 earlier
            (1, "rr_consuming", "T", None, 0, 1),
            (1, "rr_consuming", "T", None, 2, 1),  # ordinal 1 is PREPARED: no offset
            (2, "messages", None, None, None, 1),
            (2, "bytes", None, None, None, 100),
            (2, "queue", "T", 1, None, 1),
        ),
        partitions=3,
        start_offset=100,
        queue_heads={("T", 0): 5},
        rr_counters={"T": 1},
        queue_counts={"T": 2},
        default_queue_count=None,
        segment_size=1000,
        replay=replay,
    )
    assert replayed == [(1, 400)]
    assert [plan.starts[p].physical_offset for p in range(3)] == [100, 400, 1050]
    assert plan.end_offset == 1150
    assert plan.starts[1].queue_offsets == {("T", 0): 7}
    assert plan.starts[1].rr_counters == {"T": 1}
    # rr ordinal 0 of partition 1 -> global 1 -> queue 1; ordinal 2 -> global 3 -> queue 1
    assert plan.starts[2].queue_offsets == {("T", 0): 7, ("T", 1): 2}
    assert plan.queue_heads == {("T", 0): 7, ("T", 1): 3}
    assert plan.rr_counters == {"T": 4}
    assert plan.messages == 6


def _batch(topics, queues, flags, sizes):
    return pa.RecordBatch.from_pydict(
        {
            "topic": pa.array(topics, pa.string()),
            "queue_id": pa.array(queues, pa.int32()),
            "sys_flag": pa.array(flags, pa.int32()),
            "total_size": pa.array(sizes, pa.int32()),
        }
    )


def test_partition_stats_count_round_robin_by_ordinal_modulo_queues():
    batch = _batch(["T", "T", "T", "U"], [None, None, 1, None], [0, 4, 0, 8], [100, 100, 100, 100])
    rows = stats_of_partition(3, [batch], queue_counts={"T": 2}, default_queue_count=4).to_pylist()
    got = {(r["kind"], r["topic"], r["queue_id"], r["bucket"]): r["value"] for r in rows}
    assert got == {
        ("messages", None, None, None): 4,
        ("bytes", None, None, None): 400,
        ("rr_total", "T", None, None): 2,
        ("rr_total", "U", None, None): 1,
        ("rr_consuming", "T", None, 0): 1,  # ordinal 1 is PREPARED
        ("rr_consuming", "U", None, 0): 1,  # COMMIT consumes an offset
        ("queue", "T", 1, None): 1,
        ("topic_messages", "T", None, None): 3,
        ("topic_bytes", "T", None, None): 300,
        ("topic_messages", "U", None, None): 1,
        ("topic_bytes", "U", None, None): 100,
    }


def test_placer_continues_round_robin_queue_offsets_and_rolls_across_batches():
    start = PartitionStart(physical_offset=900, rr_counters={"T": 3}, queue_offsets={("T", 1): 10})
    placer = PartitionPlacer(start, queue_counts={"T": 2}, default_queue_count=None, segment_size=1000)

    def narrow(batch, lines):
        columns = {name: batch.column(name) for name in batch.schema.names}
        columns["split"] = pa.array([7] * batch.num_rows, pa.int32())
        columns["source_line"] = pa.array(lines, pa.int64())
        columns["scratch_batch"] = pa.array([0] * batch.num_rows, pa.int32())
        columns["scratch_row"] = pa.array(range(batch.num_rows), pa.int32())
        return pa.RecordBatch.from_pydict(columns)

    first = placer.place(narrow(_batch(["T"], [None], [0], [50]), [1]))
    second = placer.place(narrow(_batch(["T", "T"], [None, 1], [0, 4], [100, 100]), [2, 3]))
    assert first.column("queue_id").to_pylist() == [1] and first.column("queue_offset").to_pylist() == [10]
    assert first.column("physical_offset").to_pylist() == [900]
    assert second.column("queue_id").to_pylist() == [0, 1]
    assert second.column("queue_offset").to_pylist() == [0, 0]  # queue 0 was empty; PREPARED takes none
    assert second.column("physical_offset").to_pylist() == [1000, 1100]  # 950 + 100 + 8 > 1000: roll
    assert second.column("source_line").to_pylist() == [2, 3] and second.column("split").to_pylist() == [7, 7]


def test_segments_seal_on_roll_and_merge_into_the_active_one():
    existing = [
        {
            "segment": "00000000000000000000",
            "start_offset": 0,
            "end_offset": 1000,
            "size_bytes": 1000,
            "message_count": 4,
            "padding_bytes": 20,
            "first_store_timestamp": 1,
            "last_store_timestamp": 4,
            "status": "sealed",
            "deleted_at": None,
            "deleted_reason": None,
        },
        {
            "segment": "00000000000000001000",
            "start_offset": 1000,
            "end_offset": 1900,
            "size_bytes": 900,
            "message_count": 3,
            "padding_bytes": 0,
            "first_store_timestamp": 5,
            "last_store_timestamp": 7,
            "status": "active",
            "deleted_at": None,
            "deleted_reason": None,
        },
    ]
    # the batch's first record did not fit the 100 bytes left: segment 1000 is sealed with no new record
    batch = [
        {
            "segment": "00000000000000002000",
            "message_count": 2,
            "data_end": 2300,
            "first_store_timestamp": 8,
            "last_store_timestamp": 9,
        }
    ]
    rows = update_segments(existing, batch, segment_size=1000, end_offset=2300)
    assert [(r["segment"], r["status"], r["end_offset"], r["padding_bytes"], r["message_count"]) for r in rows] == [
        ("00000000000000000000", "sealed", 1000, 20, 4),
        ("00000000000000001000", "sealed", 2000, 100, 3),
        ("00000000000000002000", "active", 2300, 0, 2),
    ]
    more = [
        {
            "segment": "00000000000000002000",
            "message_count": 1,
            "data_end": 2400,
            "first_store_timestamp": 10,
            "last_store_timestamp": 11,
        }
    ]
    rows = update_segments(rows, more, segment_size=1000, end_offset=2400)
    assert rows[-1]["message_count"] == 3 and rows[-1]["first_store_timestamp"] == 8
    assert rows[-1]["last_store_timestamp"] == 11 and rows[-1]["size_bytes"] == 400


def test_vectorised_queue_assignment_equals_the_broker_one_message_at_a_time():
    """QueueAssigner (per batch, NumPy) against the rule applied message by message, over random batches."""
    import random

    from rmqlake.formats.record import consumes_queue_offset
    from rmqlake.ingest.plan import QueueAssigner

    rng = random.Random(11)
    queue_counts = {"A": 3, "B": 1, "C": 8}
    rr = {"A": 5}
    heads = {("A", 0): 7, ("C", 3): 2}
    assigner = QueueAssigner(rr, heads, queue_counts=queue_counts, default_queue_count=None)
    for _ in range(30):
        count = rng.randint(0, 40)
        topics = [rng.choice("ABC") for _ in range(count)]
        queues = [None if rng.random() < 0.5 else rng.randrange(queue_counts[t]) for t in topics]
        flags = [rng.choice([0, 4, 8, 12, 0x10 | 8]) for _ in range(count)]
        batch = _batch(topics, queues, flags, [100] * count)
        assigned = assigner.assign(batch)
        got_queues, got_offsets = assigned.queues, assigned.offsets
        for i, (topic, queue, flag) in enumerate(zip(topics, queues, flags, strict=True)):
            if queue is None:
                turn = rr.get(topic, 0)
                rr[topic] = turn + 1
                queue = turn % queue_counts[topic]
            offset = 0
            if consumes_queue_offset(flag):
                offset = heads.get((topic, queue), 0)
                heads[(topic, queue)] = offset + 1
            assert (got_queues[i], got_offsets[i]) == (queue, offset)
    assert assigner.rr == rr and assigner.heads == heads
