"""Transactional messages through ingest, against the sequential reference broker (tests/reference.py).

Half sends are re-routed to the half topic, ends commit (a re-put on the real topic and queue, pointing at the
half's offset) or roll back, and every end appends an op record naming the half's queue offset. Ingest does it
in parallel: several partitions, small segments, halves sent without a queue (their REAL_QID is the real
topic's round-robin turn at the append, the commit's queue too), commits in another partition than their
half, halves of an earlier run found in the lake. Every record must be equal, byte for byte, and the ends the
reference refuses are the ones ingest rejects.
"""

from __future__ import annotations

import random

import pytest

from rmqlake.formats.transaction import HALF_TOPIC, OP_TOPIC, op_offsets
from rmqlake.ingest.tasks import halves_in_append_order
from rmqlake.ingest.transactions import HALVES
from rmqlake.lake import Lake
from rmqlake.steps.ingest import ingest
from rmqlake.steps.quality import quality
from tests.spark.test_ingest import assert_matches_reference, write_jsonl
from tests.spark.test_schedule_ingest import START, TOPICS, reference, settings_for
from tests.view_checks import assert_records_decode_to_their_stored_columns

pytestmark = pytest.mark.spark

GROUP = "txn-producers"


def transactional_sends(rng: random.Random, *, start: int, count: int, open_halves: list[dict]) -> list[dict]:
    """Plain, delayed and transactional sends over ``count`` seconds, with ends for most halves (some in the
    same second, some later, some left for the next batch in ``open_halves``) and ends a broker refuses."""
    lines = []
    for i in range(count):
        stamp = start + i * 1000 + rng.randrange(900)
        topic = rng.choice(list(TOPICS))
        line = {"topic": topic, "body": "t" * rng.randrange(10, 200), "bornTimestamp": stamp}
        if topic == "UserProfile":
            line["keys"] = f"user-{rng.randrange(20)}"
        placement = rng.random()
        if placement < 0.3:
            line["queueId"] = rng.randrange(TOPICS[topic])
        elif placement < 0.4 and topic != "UserProfile":
            line["keys"] = f"k{rng.randrange(30)}"
        choice = rng.random()
        if choice < 0.45:
            uniq = f"{0xC0A8000A0000:012X}{stamp:016X}{i:04X}"
            line.update(uniqKey=uniq, transaction="PREPARED", properties={"TRAN_MSG": "true", "PGROUP": GROUP})
            if rng.random() < 0.1:
                line["bornHost"] = "[2001:db8::9]:40000"
            end = {"endTransaction": rng.choice(["COMMIT", "COMMIT", "ROLLBACK"]), "uniqKey": uniq}
            later = rng.random()
            if later < 0.15:
                open_halves.append(end)  # ended by the next batch, or never
            else:
                end["storeTimestamp"] = stamp + (0 if later < 0.3 else rng.randrange(1, 20_000))
                if rng.random() < 0.2:
                    end.update(producerGroup=GROUP, topic=topic)
                lines.append(end)
                if rng.random() < 0.05:
                    lines.append({**end, "storeTimestamp": end["storeTimestamp"] + 5})  # already ended: refused
        elif choice < 0.55:
            line["delayLevel"] = rng.randrange(1, 4)
        elif choice < 0.6:
            line["transaction"] = rng.choice(["PREPARED", "ROLLBACK"])  # store-level: stored as sent
        lines.append(line)
    refused = [
        {"endTransaction": "COMMIT", "uniqKey": "NO-SUCH-HALF", "storeTimestamp": start + 10},
        {"endTransaction": "ROLLBACK", "uniqKey": lines[-1].get("uniqKey", "X"), "storeTimestamp": start},  # early
    ]
    for end in refused:
        lines.append(end)
    halves = [line for line in lines if line.get("transaction") == "PREPARED" and "properties" in line]
    wrong = rng.choice(halves)
    lines.append({"endTransaction": "COMMIT", "uniqKey": wrong["uniqKey"], "storeTimestamp": start + count * 1000,
                  "producerGroup": "another-group"})  # fmt: skip
    return lines


def ended_keys(records: list[dict]) -> set[str]:
    """The UNIQ_KEYs of the halves an op record among ``records`` names (by queue offset on the half topic)."""
    named = {offset for m in records if m["topic"] == OP_TOPIC for offset in op_offsets(m["body"])}
    return {m["uniq_key"] for m in records if m["topic"] == HALF_TOPIC and m["queue_offset"] in named}


def test_transactions_are_stored_as_the_reference_broker_stores_them(spark, tmp_path, java_oracle):
    rng = random.Random(20)
    settings = settings_for(tmp_path)
    broker = reference(java_oracle)
    carried: list[dict] = []
    first = transactional_sends(rng, start=START, count=90, open_halves=carried)
    second = transactional_sends(rng, start=START + 100_000, count=40, open_halves=[])
    for end in carried[: len(carried) * 2 // 3]:  # the rest stay open
        second.append({**end, "storeTimestamp": START + 100_500})
    again: list[str] = []
    for index, lines in enumerate((first, second)):
        # ends of halves the first batch ended, in older and newer segments of the lake: an op record there names
        # each, so the broker refuses them
        if index:
            again = sorted(ended_keys(broker.messages))
            again = again[:2] + again[-2:]
            lines += [{"endTransaction": "COMMIT", "uniqKey": key, "storeTimestamp": START + 100_700} for key in again]
        path = write_jsonl(tmp_path / "in" / f"b{index}.jsonl", lines)
        metrics = ingest(spark, settings, input_path=str(path))
        broker.ingest_files([str(path)])
        assert_matches_reference(spark, settings, broker)
        assert metrics["rows_in"] == len(lines)
    records = broker.messages
    commits = [m for m in records if m["sys_flag"] & 0xC == 8 and m["prepared_transaction_offset"]]
    by_offset = {m["physical_offset"]: m for m in records}
    assert len(commits) > 20
    assert any(by_offset[c["prepared_transaction_offset"]]["segment"] != c["segment"] for c in commits)
    assert any(int(dict(c["pairs"])["REAL_QID"]) >= 10 for c in commits)  # a round-robin turn of 12 queues
    assert any(c["store_timestamp"] == START + 100_500 for c in commits)  # halves of the first run, from the lake
    ended = [offset for m in records if m["topic"] == OP_TOPIC for offset in op_offsets(m["body"])]
    halves = [m for m in records if m["topic"] == HALF_TOPIC]
    assert len(ended) == len(set(ended)) < len(halves)  # some stay open
    assert len(broker.rejected) >= 4
    lake = Lake.from_settings(settings)
    assert assert_records_decode_to_their_stored_columns(lake) == len(records)  # halves, commits, op records
    rejected = lake.read_arrow("rejected", columns=["reason"]).column(0).to_pylist()
    assert any("already ended" in reason for reason in rejected)
    assert len(again) == 4
    assert len({m["segment"] for m in halves if m["uniq_key"] in again}) > 1
    for key in again:
        assert f"the half message with UNIQ_KEY {key!r} was already ended" in rejected
    assert any("no half message" in reason for reason in rejected)
    assert any("producer group" in reason for reason in rejected)
    checked = quality(spark, settings, suites=["transactions", "commitlog.warning"])  # op records resend nothing
    assert sorted((suite["suite"], suite["failed"]) for suite in checked["suites"]) == [
        ("commitlog.warning", 0),
        ("transactions.critical", 0),
        ("transactions.warning", 0),
    ]


@pytest.mark.parametrize("ranges", [1, 3, 7])
def test_the_batchs_halves_are_numbered_in_append_order_across_time_ranges(spark, ranges):
    """A half's queue offset is its rank among the batch's halves in append order (store time, file rank, line):
    numbered per range of store times, ranges added up; ties, the extremes and empty ranges included."""
    rng = random.Random(ranges)
    stamps = [0, (1 << 63) - 1, START, START, START + 1, *(START + rng.randrange(10_000) for _ in range(60))]
    rows = [
        {"split": number % 5, "file_rank": rng.randrange(3), "source_line": rng.randrange(1, 40),
         "store_timestamp": stamp, "scratch_batch": 0, "scratch_row": number, "uniq_key": f"U{number}",
         "born_timestamp": 0, "real_topic": "T", "producer_group": GROUP, "check_immunity": None}
        for number, stamp in enumerate(stamps)
    ]  # fmt: skip
    rows = list({(r["store_timestamp"], r["file_rank"], r["source_line"]): r for r in rows}.values())  # a line once
    expected = sorted(rows, key=lambda r: (r["store_timestamp"], r["file_rank"], r["source_line"]))
    halves = spark.createDataFrame(rows, HALVES.ddl)
    numbered = dict(halves_in_append_order(halves, ranges=ranges).select("uniq_key", "rank_in_batch").collect())
    assert numbered == {row["uniq_key"]: rank for rank, row in enumerate(expected)}
