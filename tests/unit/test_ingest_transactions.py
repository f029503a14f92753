"""Transactional lines at parse time, and how ends are decided, without Spark."""

from __future__ import annotations

import itertools
import json
import random

import pyarrow as pa
import pytest

from rmqlake.formats.properties import parse_properties
from rmqlake.ingest.lines import EndTransaction, Rejection, parse_line
from rmqlake.ingest.transactions import (
    DECIDED_END_COLUMNS,
    EVENT_SOURCE_BATCH,
    EVENT_SOURCE_END,
    EVENT_SOURCE_LAKE,
    decide_ends,
    decide_ends_columns,
)
from tests.unit.test_ingest_blocks import HASH32, OPTIONS


def parse(**doc):
    return parse_line(json.dumps(doc).encode(), options=OPTIONS, source_line=7, file_hash32=HASH32)


HALF = {"topic": "Orders", "body": "b", "bornTimestamp": 5, "uniqKey": "U1", "transaction": "PREPARED",
        "properties": {"TRAN_MSG": "true", "PGROUP": "g"}}  # fmt: skip


def test_a_half_send_is_stored_on_the_half_topic_with_its_real_topic_and_queue():
    given = parse(**HALF, queueId=5)
    assert (given.topic, given.queue_id, given.sys_flag & 0xC) == ("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0)
    named = parse_properties(given.properties_bytes)
    assert named["REAL_TOPIC"] == "Orders" and named["REAL_QID"] == "5" and named["__transactionId__"] == "U1"
    assert named["TRAN_MSG"] == "true" and named["PGROUP"] == "g"
    assert given.real_queue_round_robin is False
    round_robin = parse(**HALF)
    assert round_robin.real_queue_round_robin is True  # its REAL_QID is the real topic's turn at the append


def test_the_old_store_level_prepared_type_is_unchanged():
    stored = parse(topic="Orders", body="b", bornTimestamp=5, transaction="PREPARED", queueId=1)
    assert (stored.topic, stored.queue_id, stored.sys_flag & 0xC) == ("Orders", 1, 0x4)


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({**HALF, "delayLevel": 3}, "cannot carry a delay level or timer"),
        ({"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "body": "b", "bornTimestamp": 5}, "is forbidden"),
        ({"topic": "RMQ_SYS_TRANS_OP_HALF_TOPIC", "body": "b", "bornTimestamp": 5}, "is forbidden"),
        ({"endTransaction": "COMMIT", "storeTimestamp": 5}, "needs 'uniqKey'"),
        ({"endTransaction": "COMMIT", "uniqKey": "U1"}, "needs 'storeTimestamp'"),
        ({"endTransaction": "UNKNOW", "uniqKey": "U1", "storeTimestamp": 5}, "must be COMMIT or ROLLBACK"),
        ({"endTransaction": "COMMIT", "uniqKey": "U1", "storeTimestamp": 5, "queueId": 1}, "has 'queueId'"),
        ({"endTransaction": "COMMIT", "uniqKey": "U1", "storeTimestamp": -1}, "outside"),
    ],
)
def test_refused_lines_say_why(doc, reason):
    with pytest.raises(Rejection, match=reason):
        parse(**doc)


def test_an_end_line_is_read_as_an_end():
    end = parse(endTransaction="ROLLBACK", uniqKey="U1", storeTimestamp=9, producerGroup="g", topic="Orders")
    assert end == EndTransaction("ROLLBACK", "U1", 9, "Orders", "g", False)


def _half(source, line, *, group="g", ended=False, born=0, real="Orders"):
    return {"source": source, "uniq_key": "U", "at": line, "rank": 0, "line": line, "half_group": group,
            "check_immunity": None, "born_timestamp": born, "real_topic": real, "lake_ended": ended}  # fmt: skip


def _end(line, kind="COMMIT", **extra):
    return {"source": EVENT_SOURCE_END, "uniq_key": "U", "at": line, "rank": 0, "line": line, "end": kind,
            "topic": None, "producer_group": None, "from_check": False, **extra}  # fmt: skip


def _reasons(events):
    return [d["reason"] for d in decide_ends(iter(events), transaction_timeout_ms=6000)]


def test_each_end_ends_the_latest_half_before_it_once():
    assert _reasons([_end(1), _half(EVENT_SOURCE_BATCH, 2), _end(3), _end(4, "ROLLBACK")]) == [
        "no half message with UNIQ_KEY 'U' was stored before this end",
        None,
        "the half message with UNIQ_KEY 'U' was already ended",
    ]
    # a half the lake's op records ended; a second half with the key (a retried send) can still be ended
    assert _reasons([_half(EVENT_SOURCE_LAKE, 0, ended=True), _end(1), _half(EVENT_SOURCE_BATCH, 2), _end(3)]) == [
        "the half message with UNIQ_KEY 'U' was already ended",
        None,
    ]


def test_the_brokers_refusals_and_a_wrong_topic():
    refused = _reasons([_half(EVENT_SOURCE_BATCH, 1), _end(2, producer_group="other"), _end(3, topic="Else"), _end(4)])
    assert refused[0].startswith("the broker refuses this end: the producer group 'other'")
    assert refused[1] == "the end names topic 'Else'; the half's real topic is 'Orders'"
    assert refused[2] is None  # the half stays open after a refused end
    late = {**_half(EVENT_SOURCE_BATCH, 1), "check_immunity": "10"}
    assert "check immunity" in _reasons([late, _end(20_000)])[0]
    assert _reasons([late, _end(20_000, from_check=True)]) == [None]


def _events(rng: random.Random) -> list[dict]:
    """Several UNIQ_KEYs' events in append order: halves of the lake (some ended) and of the batch, ends of every
    kind the broker refuses or accepts, ends before any half, several halves and ends per key."""
    events = []
    for key in sorted(f"K{n}" for n in range(rng.randrange(1, 12))):
        line = 0
        for _ in range(rng.randrange(1, 8)):
            line += rng.randrange(1, 5)
            if rng.random() < 0.4:
                source = EVENT_SOURCE_LAKE if not events or rng.random() < 0.3 else EVENT_SOURCE_BATCH
                half = _half(source, line, group=rng.choice(["g", "g", None]), ended=rng.random() < 0.3,
                             born=rng.randrange(3), real=rng.choice(["Orders", "Other"]))  # fmt: skip
                half["check_immunity"] = rng.choice([None, None, "1", "x", "99"])
                events.append({**half, "uniq_key": key, "half_queue_offset": rng.randrange(100)})
            else:
                end = _end(line, rng.choice(["COMMIT", "ROLLBACK"]), producer_group=rng.choice([None, "g", "h"]),
                           topic=rng.choice([None, None, "Orders", "Else"]), from_check=rng.random() < 0.2)  # fmt: skip
                events.append({**end, "uniq_key": key, "at": line * rng.choice([1, 2_000, 200_000]), "split": 1,
                               "raw": f"raw {line}"})  # fmt: skip
    return events


EVENT_SCHEMA = pa.schema(
    [("uniq_key", pa.string()), ("source", pa.int32()), ("at", pa.int64()), ("rank", pa.int32()),
     ("line", pa.int64()), ("split", pa.int32()), ("raw", pa.string()), ("end", pa.string()), ("topic", pa.string()),
     ("producer_group", pa.string()), ("from_check", pa.bool_()), ("born_timestamp", pa.int64()),
     ("real_topic", pa.string()), ("half_group", pa.string()), ("check_immunity", pa.string()),
     ("lake_ended", pa.bool_()), ("half_queue_offset", pa.int64())]
)  # fmt: skip
HALF_COLUMNS = ["source", "at", "rank", "line", "half_queue_offset"]


@pytest.mark.parametrize("seed", range(40))
def test_ends_decided_column_by_column_are_the_references_decisions(seed):
    events = _events(random.Random(seed))
    table = pa.Table.from_pylist(events, schema=EVENT_SCHEMA)
    expected = []
    for _, group in itertools.groupby(table.to_pylist(), key=lambda event: event["uniq_key"]):
        for end in decide_ends(group, transaction_timeout_ms=6000):
            half = end["half"] and {name: end["half"][name] for name in HALF_COLUMNS}
            expected.append(
                {**{name: end[name] for name in DECIDED_END_COLUMNS}, "reason": end["reason"], "half": half}
            )
    decided = decide_ends_columns(table, transaction_timeout_ms=6000, half_columns=HALF_COLUMNS)
    assert decided.to_pylist() == expected
    assert decided.schema.names == [*DECIDED_END_COLUMNS, "reason", "half"]


def test_the_decisions_cover_every_reason():
    kinds = ("no half message", "already ended", "producer group", "check immunity", "names topic")
    seen = dict.fromkeys([*kinds, "accepted"], 0)
    for seed in range(40):
        table = pa.Table.from_pylist(_events(random.Random(seed)), schema=EVENT_SCHEMA)
        decided = decide_ends_columns(table, transaction_timeout_ms=6000, half_columns=HALF_COLUMNS)
        for reason in decided.column("reason").to_pylist():
            seen[next((kind for kind in kinds if reason and kind in reason), "accepted")] += 1
    assert all(seen.values()), seen


def test_ends_without_any_half_are_refused_column_by_column_too():
    ends = [{**_end(line), "uniq_key": f"K{line % 3}", "split": 1, "raw": f"raw {line}"} for line in range(9)]
    ends.sort(key=lambda end: end["uniq_key"])
    names = ["uniq_key", "source", "at", "rank", "line", "split", "raw", "end", "topic", "producer_group", "from_check"]
    table = pa.Table.from_pylist(ends, schema=pa.schema([EVENT_SCHEMA.field(name) for name in names]))
    decided = decide_ends_columns(table, transaction_timeout_ms=6000, half_columns=["source", "at", "rank", "line"])
    assert decided.column("reason").to_pylist() == [
        f"no half message with UNIQ_KEY {end['uniq_key']!r} was stored before this end" for end in ends
    ]
    assert decided.column("half").null_count == len(ends)
