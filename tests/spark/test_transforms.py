"""The DataFrame transforms on a few hand-written rows, against rows derived by hand from the broker's rules.

Each test states the rule its expected rows come from; nothing expected is
computed with the code under test. Java ``String.hashCode`` values are worked
out by hand (h = 31·h + char): "A" = 65, "TagA" = 2598919, "T#a" = 81906,
"T#b" = 81907, "T#u1" = 2539755.
"""

from __future__ import annotations

import random

import pytest
from chispa import assert_df_equality
from pyspark.sql import Observation

from rmqlake.lake.tables import CONSUMEQUEUE
from rmqlake.transforms.columns import dispatchable
from rmqlake.transforms.compaction import (
    KEY,
    compacted_units,
    compaction_stats,
    dispatched_messages,
    key_columns,
    latest_per_key,
)
from rmqlake.transforms.reput import (
    INDEX_KEYS,
    chain_entries,
    consume_queue_units,
    dispatch_requests,
    header_aggregates,
    header_observations,
    index_keys,
    observed_aggregates,
    order_keys,
)
from rmqlake.transforms.segments import segment_aggregates

pytestmark = pytest.mark.spark

NOT_TYPE, PREPARED, COMMIT, ROLLBACK = 0x0, 0x4, 0x8, 0xC  # MessageSysFlag transaction bits (mask 0xC)

DISPATCH_DDL = """physical_offset bigint, total_size int, sys_flag int, store_timestamp bigint, topic string,
    queue_id int, queue_offset bigint, tags string, uniq_key string, keys_property string, delay_property string"""


def equal(actual, expected, **options):
    assert_df_equality(actual, expected, ignore_nullable=True, ignore_row_order=True, **options)


def test_dispatchable_keeps_not_type_and_commit_messages(spark):
    # MessageSysFlag: bits 2-3 are the transaction type; other bits (compressed 0x1, IPv6 0x10) do not matter
    frame = spark.createDataFrame([(f,) for f in (0x0, 0x4, 0x8, 0xC, 0x1 | 0x8, 0x10 | 0x4)], "sys_flag int")
    expected = spark.createDataFrame([(0x0,), (0x8,), (0x9,)], "sys_flag int")
    equal(frame.filter(dispatchable()), expected)


def test_dispatch_requests_read_keys_and_delay_from_the_properties(spark):
    commitlog = spark.createDataFrame(
        [(0, 100, 0, 1000, "T", 0, 0, "A", "u1", {"KEYS": "a b", "TAGS": "A"}, b"body")],
        """physical_offset bigint, total_size int, sys_flag int, store_timestamp bigint, topic string, queue_id int,
        queue_offset bigint, tags string, uniq_key string, properties map<string,string>, body binary""",
    )
    expected = spark.createDataFrame([(0, 100, 0, 1000, "T", 0, 0, "A", "u1", "a b", None)], DISPATCH_DDL)
    equal(dispatch_requests(commitlog), expected)


def test_consume_queue_units_one_unit_per_dispatchable_message(spark):
    # ConsumeQueue unit = (commitlog offset, size, tagsCode) at its queue offset; 2 units per file: a file is 40
    # bytes, named by its first unit's byte offset (queue offset 2 → file 00000000000000000040).
    # tagsCode = TAGS hashCode (0 without tags); on SCHEDULE_TOPIC_XXXX with DELAY level 3 it is the delivery
    # time: storeTimestamp + 10 s (messageDelayLevel "1s 5s 10s ...").
    messages = spark.createDataFrame(
        [
            (0, 100, NOT_TYPE, 1000, "T", 1, 0, "TagA", None, None, None),
            (100, 90, COMMIT, 1001, "T", 1, 1, None, None, None, None),
            (190, 80, PREPARED, 1002, "T", 1, 0, "A", None, None, None),
            (270, 70, ROLLBACK, 1003, "T", 1, 0, "A", None, None, None),
            (340, 60, NOT_TYPE, 1004, "T", 1, 2, "A", None, None, None),
            (400, 50, NOT_TYPE, 5000, "SCHEDULE_TOPIC_XXXX", 2, 0, "A", None, None, "3"),
        ],
        DISPATCH_DDL,
    )
    expected = spark.createDataFrame(
        [
            ("T", 1, 0, 0, 100, 2598919, 1000, "00000000000000000000"),
            ("T", 1, 1, 100, 90, 0, 1001, "00000000000000000000"),
            ("T", 1, 2, 340, 60, 65, 1004, "00000000000000000040"),
            ("SCHEDULE_TOPIC_XXXX", 2, 0, 400, 50, 15000, 5000, "00000000000000000000"),
        ],
        CONSUMEQUEUE.spark_schema,
    )
    equal(consume_queue_units(messages, units_per_file=2), expected)


def test_index_keys_uniq_key_first_then_each_keys_token(spark):
    # IndexService.buildIndex: topic#UNIQ_KEY, then topic#key per non-empty KEYS token (split on spaces);
    # ROLLBACK messages are not indexed; hash = abs(hashCode), slot = hash % slots (5 here)
    messages = spark.createDataFrame(
        [
            (0, 100, NOT_TYPE, 1000, "T", 0, 0, None, "u1", "a  b", None),
            (100, 100, PREPARED, 1001, "T", 0, 0, None, None, "b", None),
            (200, 100, ROLLBACK, 1002, "T", 0, 0, None, "u1", "a", None),
        ],
        DISPATCH_DDL,
    )
    expected = spark.createDataFrame(
        [
            (0, 0, 1000, "T", 2539755, 0),
            (0, 1, 1000, "T", 81906, 1),
            (0, 2, 1000, "T", 81907, 2),
            (100, 0, 1001, "T", 81907, 2),
        ],
        INDEX_KEYS.ddl,
    )
    equal(index_keys(messages, slots=5), expected)


def test_order_keys_numbers_keys_in_dispatch_order(spark):
    # dispatch order: physical offset, then the key's position in its message
    keys = spark.createDataFrame([(300, 0), (100, 1), (100, 0), (200, 0)], "physical_offset bigint, key_pos int")
    expected = spark.createDataFrame(
        [(100, 0, 0, 0), (100, 1, 0, 1), (200, 0, 0, 2), (300, 0, 0, 3)],
        "physical_offset bigint, key_pos int, partition int, local_no bigint",
    )
    equal(order_keys(keys, partitions=1), expected)


def test_order_keys_partitions_are_ranges_of_the_dispatch_order(spark):
    keys = spark.createDataFrame(
        [(offset, 0) for offset in (700, 100, 500, 300, 600, 200)], "physical_offset bigint, key_pos int"
    )
    rows = order_keys(keys, partitions=2).collect()
    by_number = sorted(rows, key=lambda r: (r.partition, r.local_no))
    assert [r.physical_offset for r in by_number] == [100, 200, 300, 500, 600, 700]
    for partition in {r.partition for r in rows}:
        assert sorted(r.local_no for r in rows if r.partition == partition) == list(
            range(sum(r.partition == partition for r in rows))
        )


def test_chain_entries_link_each_entry_to_the_previous_of_its_slot(spark):
    # IndexFile.putKey: an entry's prevIndex is the slot's previous entry in the same file, 0 for the first;
    # in the open file the first new entry of a slot links to the slot's last entry before the run (seed)
    numbered = spark.createDataFrame(
        [("f1", 1, 3), ("f1", 1, 5), ("f1", 2, 4), ("f2", 1, 1), ("f2", 1, 2)],
        "index_file string, slot int, index_no int",
    )
    seeds = spark.createDataFrame([("f1", 1, 2)], "index_file string, slot int, seed_index int")
    expected = spark.createDataFrame(
        [("f1", 1, 3, 2), ("f1", 1, 5, 3), ("f1", 2, 4, 0), ("f2", 1, 1, 0), ("f2", 1, 2, 1)],
        "index_file string, slot int, index_no int, prev_index int",
    )
    equal(chain_entries(numbered, seeds=seeds).select(*expected.columns), expected)
    unseeded = expected.withColumn("prev_index", expected.prev_index * (expected.index_no != 3).cast("int"))
    equal(chain_entries(numbered).select(*expected.columns), unseeded)


def test_header_aggregates_first_and_last_entry_of_each_file(spark):
    # IndexHeader: begin = first key put, end = last key put; hashSlotCount counts keys that opened an empty slot
    rows = spark.createDataFrame(
        [("f1", 1, 0, 100, 10), ("f1", 2, 1, 200, 20), ("f1", 3, 0, 300, 30)],
        "index_file string, index_no int, prev_index int, store_timestamp bigint, phy_offset bigint",
    )
    expected = spark.createDataFrame(
        [("f1", 100, 10, 300, 30, 2, 3, 1)],
        """index_file string, first_timestamp bigint, first_phy_offset bigint, last_timestamp bigint,
        last_phy_offset bigint, new_slots bigint, last_index_no int, first_index_no int""",
    )
    equal(header_aggregates(rows), expected)


def test_header_observations_equal_the_aggregates_read_back(spark):
    # observed while the entries are written: the same fields as header_aggregates, per file of the run
    rng = random.Random(11)
    entries = []
    for name in ("20231114221320000", "20231114231320000", "20231115001320000"):
        for number in rng.sample(range(1, 400), 120):
            entries.append((name, number, rng.choice([0, 0, number - 1]), rng.randrange(10**12), rng.randrange(10**9)))
    rows = spark.createDataFrame(
        entries, "index_file string, index_no int, prev_index int, store_timestamp bigint, phy_offset bigint"
    )
    files = ["20231114221320000", "20231114231320000", "no-entries-here", "20231115001320000"]
    observation = Observation("headers")
    rows.observe(observation, *header_observations(files)).write.format("noop").mode("overwrite").save()
    got = sorted(observed_aggregates(files, observation.get), key=lambda r: r["index_file"])
    want = sorted((r.asDict() for r in header_aggregates(rows).collect()), key=lambda r: r["index_file"])
    assert got == want and len(got) == 3


COMMITLOG_KEYS_DDL = "topic string, physical_offset bigint, sys_flag int, properties map<string,string>"


def test_dispatched_messages_of_the_topics_since_their_position(spark):
    # only dispatched records (NOT_TYPE, COMMIT) in [position, end) reach the compaction log; a blank KEYS
    # (StringUtils.isBlank: Java whitespace only) has no key
    commitlog = spark.createDataFrame(
        [
            ("C", 50, NOT_TYPE, {"KEYS": "k"}),
            ("C", 100, NOT_TYPE, {"KEYS": "k"}),
            ("C", 150, PREPARED, {"KEYS": "k"}),
            ("C", 200, COMMIT, {"KEYS": " \t"}),
            ("C", 250, NOT_TYPE, {}),
            ("D", 260, NOT_TYPE, {"KEYS": "d"}),
            ("C", 300, NOT_TYPE, {"KEYS": "k"}),
            ("O", 120, NOT_TYPE, {"KEYS": "o"}),
        ],
        COMMITLOG_KEYS_DDL,
    )
    expected = spark.createDataFrame(
        [
            ("C", 100, NOT_TYPE, {"KEYS": "k"}, "k"),
            ("C", 200, COMMIT, {"KEYS": " \t"}, None),
            ("C", 250, NOT_TYPE, {}, None),
            ("D", 260, NOT_TYPE, {"KEYS": "d"}, "d"),
        ],
        f"{COMMITLOG_KEYS_DDL}, {KEY} string",
    )
    actual = dispatched_messages(commitlog, positions={"C": 100, "D": 0}, end=300)
    # ordered here: chispa's row-order-free comparison sorts on every column, and Spark cannot sort a map
    assert_df_equality(actual.orderBy("physical_offset"), expected.orderBy("physical_offset"), ignore_nullable=True)


def test_dispatched_messages_without_topics_is_empty(spark):
    commitlog = spark.createDataFrame([("C", 0, 0, {"KEYS": "k"})], COMMITLOG_KEYS_DDL)
    assert dispatched_messages(commitlog, positions={}, end=10).collect() == []


MESSAGES_DDL = (
    f"topic string, queue_id int, {KEY} string, queue_offset bigint, total_size int, is_new boolean, body binary"
)
KEEP_CASES = [
    # the latest row of a key is kept when it has a body; an empty body is a tombstone; no key: dropped
    ("C", 0, "k1", 0, 100, False, b"old"),
    ("C", 0, "k1", 2, 110, True, b"new"),
    ("C", 0, "k2", 1, 120, False, b"x"),
    ("C", 0, "k2", 3, 60, True, b""),
    ("C", 0, None, 4, 70, True, b"nokey"),
    ("C", 1, "k1", 0, 80, True, b"other queue"),
]


def test_latest_per_key_keeps_the_newest_row_with_a_body(spark):
    messages = spark.createDataFrame(KEEP_CASES, MESSAGES_DDL)
    flags = [(False, False), (True, True), (False, False), (True, False), (False, False), (True, True)]
    expected = spark.createDataFrame(
        [(*row, *flag) for row, flag in zip(KEEP_CASES, flags, strict=True)],
        MESSAGES_DDL + ", is_latest boolean, keep boolean",
    )
    equal(latest_per_key(messages), expected)


def test_key_columns_carry_the_body_length_not_the_body(spark):
    messages = spark.createDataFrame(KEEP_CASES[:2], MESSAGES_DDL)
    expected = spark.createDataFrame(
        [("C", 0, "k1", 0, 100, False, 3), ("C", 0, "k1", 2, 110, True, 3)],
        f"topic string, queue_id int, {KEY} string, queue_offset bigint, total_size int, is_new boolean, "
        "body_length int",
    )
    equal(key_columns(messages), expected)


def test_compaction_stats_count_the_flagged_rows(spark):
    flagged = latest_per_key(key_columns(spark.createDataFrame(KEEP_CASES, MESSAGES_DDL)))
    # new rows: 110 + 60 + 70 + 80 bytes, one without key; keys: (0,k1) (0,k2) (1,k1); kept: 110 and 80;
    # the k2 tombstone applied; bytes before: all 540, after: 190
    expected = spark.createDataFrame(
        [(4, 320, 1, 3, 2, 1, 540, 190)],
        """messages_read bigint, bytes_read bigint, messages_without_key bigint, keys bigint, messages_kept bigint,
        tombstones_applied bigint, bytes_before bigint, bytes_after bigint""",
    )
    equal(compaction_stats(flagged), expected)


def test_compacted_units_are_dense_per_queue(spark):
    # SparseConsumeQueue: 46-byte units in queue-offset order; a 100-byte configured file holds 2 units (92
    # bytes), so the third unit of a queue starts file 00000000000000000092
    log = spark.createDataFrame(
        [("C", 0, 7, 700, 50, "A", 1), ("C", 0, 3, 300, 40, None, 2), ("C", 0, 9, 900, 60, "TagA", 3),
         ("C", 1, 5, 500, 30, "A", 4)],
        """topic string, queue_id int, queue_offset bigint, physical_offset bigint, total_size int, tags string,
        store_timestamp bigint""",
    )  # fmt: skip
    expected = spark.createDataFrame(
        [
            ("C", 0, 3, 300, 40, 0, 2, "00000000000000000000"),
            ("C", 0, 7, 700, 50, 65, 1, "00000000000000000000"),
            ("C", 0, 9, 900, 60, 2598919, 3, "00000000000000000092"),
            ("C", 1, 5, 500, 30, 65, 4, "00000000000000000000"),
        ],
        CONSUMEQUEUE.spark_schema,
    )
    equal(compacted_units(log, cq_file_size=100), expected)


def test_segment_aggregates_per_segment(spark):
    # a segment's data ends after its last record; its first/last store times are those of its first/last record
    commitlog = spark.createDataFrame(
        [("0", 0, 100, 7), ("0", 100, 50, 5), ("1024", 1024, 30, 9)],
        "segment string, physical_offset bigint, total_size int, store_timestamp bigint",
    )
    assert sorted(segment_aggregates(commitlog), key=lambda r: r["segment"]) == [
        {"segment": "0", "message_count": 2, "data_end": 150, "first_store_timestamp": 7, "last_store_timestamp": 5},
        {"segment": "1024", "message_count": 1, "data_end": 1054, "first_store_timestamp": 9,
         "last_store_timestamp": 9},
    ]  # fmt: skip
