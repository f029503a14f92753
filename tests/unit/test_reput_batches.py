"""Reput's column-wise dispatch of one Arrow batch against the per-record rules of formats."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rmqlake.formats.consumequeue import (
    DEFAULT_DELAY_LEVELS,
    SCHEDULE_TOPIC,
    cq_file_name,
    dispatch_tags_code,
    parse_delay_levels,
)
from rmqlake.formats.indexfile import is_indexed, message_index_keys
from rmqlake.formats.javahash import index_key_hash
from rmqlake.formats.record import consumes_queue_offset
from rmqlake.transforms.reput import cq_units_of_batch, index_keys_of_batch

# The commitlog columns the dispatch reads, as the reput task gets them.
DISPATCH_INPUT = pa.schema(
    [
        ("physical_offset", pa.int64()),
        ("total_size", pa.int32()),
        ("sys_flag", pa.int32()),
        ("store_timestamp", pa.int64()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("tags", pa.string()),
        ("uniq_key", pa.string()),
        ("keys_property", pa.string()),
        ("delay_property", pa.string()),
    ]
)


def _batch(count: int, seed: int) -> pa.RecordBatch:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        topic = rng.choice(["Orders", "订单Topic", SCHEDULE_TOPIC, "%RETRY%g1"])
        keys = rng.choice([None, "", "k1", "k1 k2", "  a   b ", "ключ x", "k" * 60])
        rows.append(
            {
                "physical_offset": 1000 + 300 * i,
                "total_size": 300,
                "sys_flag": rng.choice([0, 4, 8, 12, 0x10, 0x2C]),
                "store_timestamp": 1_700_000_000_000 + i,
                "topic": topic,
                "queue_id": rng.randrange(4),
                "queue_offset": rng.randrange(5000),
                "tags": rng.choice([None, "", "TagA", "标签"]),
                "uniq_key": rng.choice([None, f"{rng.getrandbits(128):032X}"]),
                "keys_property": keys,
                "delay_property": rng.choice([None, "3", "0", "99", "x"]) if topic == SCHEDULE_TOPIC else None,
            }
        )
    return pa.RecordBatch.from_pylist(rows, schema=DISPATCH_INPUT)


@pytest.mark.parametrize("levels", [DEFAULT_DELAY_LEVELS, "1s 2s 3s"])
def test_cq_units_equal_the_per_record_rules(levels):
    delay_levels = parse_delay_levels(levels)
    batch = _batch(400, 1)
    expected = []
    for row in batch.to_pylist():
        if not consumes_queue_offset(row["sys_flag"]):
            continue
        props = {} if row["delay_property"] is None else {"DELAY": row["delay_property"]}
        try:
            code = dispatch_tags_code(
                row["topic"], row["tags"], props, row["store_timestamp"], delay_levels=delay_levels
            )
        except ValueError:
            code = dispatch_tags_code(row["topic"], row["tags"], {}, row["store_timestamp"], delay_levels=delay_levels)
        expected.append(
            (
                row["topic"],
                row["queue_id"],
                row["queue_offset"],
                row["physical_offset"],
                300,
                code,
                row["store_timestamp"],
                cq_file_name(row["queue_offset"], 1000),
            )
        )
    units = cq_units_of_batch(batch, units_per_file=1000, delay_levels=delay_levels)
    got = [tuple(r.values()) for r in units.to_pylist()]
    assert got == expected and len(got) > 100


def test_index_keys_equal_the_per_record_rules():
    batch = _batch(400, 2)
    expected = set()
    for row in batch.to_pylist():
        if not is_indexed(row["sys_flag"]):
            continue
        for position, key in enumerate(message_index_keys(row["topic"], row["uniq_key"], row["keys_property"])):
            key_hash = index_key_hash(key)
            expected.add(
                (row["physical_offset"], position, row["store_timestamp"], row["topic"], key_hash, key_hash % 997)
            )
    rows = index_keys_of_batch(batch, slots=997).to_pylist()
    assert len(rows) == len(expected) > 200
    assert {tuple(r.values()) for r in rows} == expected
