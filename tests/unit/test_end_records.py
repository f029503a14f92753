"""The records of transaction ends written column by column, against the per-record reference (``end_records``).

Each scenario mixes halves of the batch (read from scratch positions) and of the lake (their commitlog columns),
commits and rollbacks, ends the decision refused, commits the processor refuses (a lake half whose real queue
does not parse), IPv6 store hosts, a topic long enough for the V2 magic and round-robin real queues.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from rmqlake.formats.properties import serialize_properties
from rmqlake.formats.transaction import REAL_QID, REAL_TOPIC
from rmqlake.ingest.lines import parse_line
from rmqlake.ingest.message import MESSAGE_TYPES
from rmqlake.ingest.transactions import (
    EVENT_SOURCE_BATCH,
    EVENT_SOURCE_LAKE,
    LAKE_HALF_COLUMNS,
    end_records,
    end_records_columns,
)
from tests.unit.test_ingest_blocks import HASH32, OPTIONS

LONG_TOPIC = "%RETRY%" + "g" * 150  # a topic of OPTIONS over 127 chars: its records take the V2 magic
HOSTS = ("10.0.0.5:10911", "[2001:db8::7]:10911", "127.0.0.1:49152")
SCRATCH_SPLITS = (0, 3)
ROWS_PER_BATCH = 4  # a small scratch batch, so that the halves lie in many
SCRATCH_SCHEMA = pa.schema([("source_line", pa.int64()), *MESSAGE_TYPES.items()])

LAKE_RECORD = pa.struct(
    [pa.field(name, pa.int64() if name in ("physical_offset", "queue_offset") else MESSAGE_TYPES[name])
     for name in LAKE_HALF_COLUMNS]
)  # fmt: skip
HALF_FIELDS = [
    pa.field("source", pa.int32()),
    pa.field("at", pa.int64()),
    pa.field("rank", pa.int32()),
    pa.field("line", pa.int64()),
    pa.field("half_queue_offset", pa.int64()),
    pa.field("half_split", pa.int32()),
    pa.field("half_batch", pa.int32()),
    pa.field("half_row", pa.int32()),
]


def _decided_schema(with_lake: bool) -> pa.Schema:
    """The decided ends as Spark hands them to the write (a lake without halves: no ``lake_record``)."""
    half = pa.struct(HALF_FIELDS + ([pa.field("lake_record", LAKE_RECORD)] if with_lake else []))
    return pa.schema(
        [("split", pa.int32()), ("line", pa.int64()), ("raw", pa.string()), ("end", pa.string()),
         ("at", pa.int64()), ("reason", pa.string()), ("half", half)]
    )  # fmt: skip


def _half_message(rng: random.Random, number: int) -> dict:
    """A half as the parse stores it (scratch columns)."""
    doc = {
        "topic": rng.choice(["Orders", "Orders", LONG_TOPIC]),
        "body": "b" * rng.randrange(0, 40),
        "bornTimestamp": 1795219200000 + number,
        "uniqKey": f"U{number}",
        "transaction": "PREPARED",
        "properties": {"TRAN_MSG": "true", "PGROUP": "g"},
        "storeHost": rng.choice(HOSTS),
        "bornHost": rng.choice(HOSTS),
    }
    if rng.random() < 0.5:
        doc["queueId"] = 0  # else the real queue is the round-robin turn at the append
    message = parse_line(json.dumps(doc).encode(), options=OPTIONS, source_line=number, file_hash32=HASH32)
    return {"source_line": number, **dict(zip(MESSAGE_TYPES, message, strict=True))}


def _lake_record(rng: random.Random, number: int) -> dict:
    """A half of the lake: its commitlog columns; now and then one whose real topic or queue a broker cannot use,
    and one whose properties map says otherwise than its properties string (the string is what a broker reads)."""
    half = _half_message(rng, number)
    pairs = list(half["properties"])
    damage = rng.random()
    if damage < 0.15:
        pairs = [(name, "x" if name == REAL_QID else value) for name, value in pairs]
        half["properties_bytes"] = serialize_properties(pairs)
    elif damage < 0.25:
        half["properties_bytes"] = serialize_properties([pair for pair in pairs if pair[0] != REAL_TOPIC])
    elif damage < 0.35:
        pairs = [pair for pair in pairs if pair[0] != REAL_QID]
    record = {**half, "properties": pairs, "physical_offset": rng.randrange(1 << 40), "queue_offset": number}
    return {name: record[name] for name in LAKE_HALF_COLUMNS}


def _scenario(seed: int, *, with_lake: bool):
    rng = random.Random(seed)
    batch_halves = [_half_message(rng, number) for number in range(rng.randrange(1, 12))]
    positions = [(SCRATCH_SPLITS[n % 2], n // ROWS_PER_BATCH, n % ROWS_PER_BATCH) for n in range(len(batch_halves))]
    decided = []
    for line in rng.sample(range(1, 1000), rng.randrange(1, 25)):
        from_lake = with_lake and rng.random() < 0.4
        at = rng.randrange(len(batch_halves))
        half = {
            "source": EVENT_SOURCE_LAKE if from_lake else EVENT_SOURCE_BATCH,
            "at": rng.randrange(1 << 41),
            "rank": rng.randrange(4),
            "line": rng.randrange(1, 1000),
            "half_queue_offset": rng.randrange(1 << 33),
            "half_split": None if from_lake else positions[at][0],
            "half_batch": None if from_lake else positions[at][1],
            "half_row": None if from_lake else positions[at][2],
        }
        if with_lake:
            half["lake_record"] = _lake_record(rng, line) if from_lake else None
        refused = rng.random() < 0.2
        decided.append(
            {"split": 5, "line": line, "raw": f'{{"line": {line}}}', "end": rng.choice(["COMMIT", "ROLLBACK"]),
             "at": rng.randrange(1 << 41), "reason": f"refused {line}" if refused else None,
             "half": None if refused and rng.random() < 0.5 else half}
        )  # fmt: skip
    return pa.Table.from_pylist(decided, schema=_decided_schema(with_lake)), batch_halves, positions


def _routes(table: pa.Table, batch_halves: list[dict], positions: list[tuple]):
    by_position = dict(zip(positions, range(len(positions)), strict=True))
    scratch = pa.Table.from_pylist(batch_halves, schema=SCRATCH_SCHEMA)

    def scratch_rows(splits, batches, rows):
        wanted = [by_position[at] for at in zip(splits.tolist(), batches.tolist(), rows.tolist(), strict=True)]
        return scratch.take(pa.array(wanted, pa.int64()))

    reference = end_records(
        table.to_pylist(), split=9, file_rank=2, scratch_row=lambda *at: batch_halves[by_position[at]]
    )
    columns = end_records_columns(table, split=9, file_rank=2, scratch_rows=scratch_rows)
    return reference, columns


@pytest.mark.parametrize("with_lake", [True, False])
def test_the_ends_records_column_by_column_are_the_references(with_lake):
    seen = {"commits": 0, "rollbacks": 0, "refused commits": 0, "v2": 0, "v6 ops": 0, "lake commits": 0}
    for seed in range(60):
        table, batch_halves, positions = _scenario(seed, with_lake=with_lake)
        reference, columns = _routes(table, batch_halves, positions)
        assert (columns.commits, columns.rollbacks) == (reference.commits, reference.rollbacks), seed
        refused = [(row["line"], row["raw"], row["reason"]) for row in reference.refused]
        assert [(row["line"], row["raw"], row["reason"]) for row in columns.refused] == refused, seed
        if reference.scratch is None:
            assert columns.scratch is None and columns.narrow is None, seed
            continue
        assert columns.scratch.schema == reference.scratch.schema, seed
        assert columns.scratch.to_pylist() == reference.scratch.to_pylist(), seed
        assert columns.narrow.schema == reference.narrow.schema, seed
        assert columns.narrow.to_pylist() == reference.narrow.to_pylist(), seed

        records = reference.scratch.to_pylist()
        seen["commits"] += reference.commits
        seen["rollbacks"] += reference.rollbacks
        seen["refused commits"] += sum("no real topic and queue" in row["reason"] for row in reference.refused)
        seen["v2"] += sum(row["magic"] == -626843477 for row in records)
        seen["v6 ops"] += sum(row["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC" and row["sys_flag"] == 0x30
                              for row in records)  # fmt: skip
        seen["lake commits"] += sum(row["prepared_transaction_offset"] > 0 for row in records)
    assert all(seen[name] for name in ("commits", "rollbacks", "v2", "v6 ops")), seen
    if with_lake:
        assert seen["refused commits"] and seen["lake commits"], seen


def test_a_split_whose_ends_are_all_refused_stores_nothing():
    table, batch_halves, positions = _scenario(3, with_lake=False)
    table = table.set_column(5, "reason", pa.array([f"no {n}" for n in range(table.num_rows)], pa.string()))
    reference, columns = _routes(table, batch_halves, positions)
    assert reference.scratch is None and columns.scratch is None and columns.narrow is None
    assert [row["reason"] for row in columns.refused] == [row["reason"] for row in reference.refused]
    assert np.all(np.diff([row["line"] for row in columns.refused]) > 0)
