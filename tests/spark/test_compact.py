"""Compaction against an independent reference: a dict of the latest message per KEYS string per queue."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rmqlake.errors import UsageError
from rmqlake.formats.compaction import JAVA_WHITESPACE_REGEX, is_blank, sparse_cq_file_name
from rmqlake.formats.consumequeue import tags_code
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table
from rmqlake.query import query_compacted_offset
from rmqlake.steps.compact import compact
from rmqlake.steps.ingest import ingest
from rmqlake.steps.reput import reput
from tests.conftest import make_settings
from tests.reference import RefBroker, RefConfig

pytestmark = pytest.mark.spark

TOPICS = {"OrderEvents": 8, "UserProfile": 4, "Clickstream": 4}
SEGMENT = 16384
CQ_FILE = 46 * 7 + 30  # 7 units per sparse file: rounding to whole units and several files per queue


def settings_for(tmp_path: Path, *overrides: str):
    return make_settings(
        tmp_path / "lake",
        f"store.commitlog_segment_size={SEGMENT}",
        f"store.compaction_cq_file_size={CQ_FILE}",
        "ingest.sort_partitions=3",
        *overrides,
    )


def write_updates(folder: Path, *, batches: int = 3, per_batch: int = 260, seed: int = 7) -> list[Path]:
    """Many updates of few keys: tombstones, explicit queues (one key in several queues), blank-ish keys,
    transactions and DELETE-topic traffic mixed in."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    paths = []
    born = 1_763_683_200_000
    for batch in range(batches):
        lines = []
        for _ in range(per_batch):
            born += rng.randint(1, 2000)
            roll = rng.random()
            if roll < 0.2:
                lines.append({"topic": "OrderEvents", "body": f"order-{born}", "bornTimestamp": born, "keys": "o1"})
                continue
            key = f"user-{rng.randint(0, 24):02d}"
            line = {"topic": "UserProfile", "bornTimestamp": born, "keys": key, "body": f"{key}@{born}"}
            if roll < 0.3:
                line["body"] = ""  # tombstone
            elif roll < 0.4:
                line["queueId"] = rng.randint(0, 3)  # the same key in another queue is another key
            elif roll < 0.43:
                line["keys"] = [key, "alias"]  # KEYS "user-NN alias": a different compaction key
            elif roll < 0.45:
                line["keys"] = "\t"  # accepted at ingest (a token), blank for the broker's compaction
                line["queueId"] = 1
            elif roll < 0.47:
                line["transaction"] = "PREPARED"  # takes no queue offset: never compacted
            if rng.random() < 0.3:
                line["tags"] = rng.choice(["TagA", "TagB"])
            lines.append(line)
        path = folder / f"batch-{batch}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        paths.append(path)
    return paths


def reference_compaction(messages: list[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    """Latest non-empty message per whole-KEYS string per queue, replayed in queue-offset order."""
    latest: dict[tuple[str, int], dict[str, dict]] = {}
    for m in sorted(messages, key=lambda m: (m["topic"], m["queue_id"], m["queue_offset"])):
        if m["topic"] != "UserProfile" or m["sys_flag"] & 0xC not in (0, 8) or is_blank(m["keys_property"]):
            continue
        latest.setdefault((m["topic"], m["queue_id"]), {})[m["keys_property"]] = m
    return {q: {k: m for k, m in keys.items() if m["body"]} for q, keys in latest.items()}


def reference_broker(java_oracle, paths: list[Path]) -> RefBroker:
    broker = RefBroker(
        RefConfig(segment_size=SEGMENT, queue_counts=dict(TOPICS), compaction_topics=frozenset({"UserProfile"})),
        java_oracle,
    )
    for path in paths:
        broker.ingest_files([str(path)])
    return broker


def compacted_rows(spark, settings) -> tuple[list[dict], list[dict]]:
    lake = Lake.from_settings(settings)
    log = [r.asDict() for r in read_table(spark, lake, "compaction_log").orderBy("physical_offset").collect()]
    cq = [r.asDict() for r in read_table(spark, lake, "compaction_cq").orderBy("commitlog_offset").collect()]
    return log, cq


def assert_matches_reference(spark, settings, expected: dict) -> None:
    log, cq = compacted_rows(spark, settings)
    want = sorted((m for keys in expected.values() for m in keys.values()), key=lambda m: m["physical_offset"])
    assert [(r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], r["body"]) for r in log] == [
        (m["topic"], m["queue_id"], m["queue_offset"], m["physical_offset"], m["body"]) for m in want
    ]
    assert [r["msg_id"] for r in log] == [m["msg_id"] for m in want]
    assert [(u["queue_offset"], u["commitlog_offset"], u["size"], u["tags_code"]) for u in cq] == [
        (m["queue_offset"], m["physical_offset"], m["total_size"], tags_code(m["tags"])) for m in want
    ]
    for queue, keys in expected.items():  # sparse files: the n-th kept unit of a queue, 46 bytes each
        offsets = sorted(m["queue_offset"] for m in keys.values())
        files = {u["queue_offset"]: u["cq_file"] for u in cq if (u["topic"], u["queue_id"]) == queue}
        assert [files[o] for o in offsets] == [sparse_cq_file_name(n, CQ_FILE) for n in range(len(offsets))]


def test_incremental_compaction_equals_the_reference_after_every_run(spark, tmp_path, java_oracle):
    paths = write_updates(tmp_path / "in")
    settings = settings_for(tmp_path)
    runs = []
    for n, path in enumerate(paths):
        ingest(spark, settings, input_path=str(path))
        reput(spark, settings)
        runs.append(compact(spark, settings))
        broker = reference_broker(java_oracle, paths[: n + 1])
        expected = reference_compaction(broker.messages)
        assert_matches_reference(spark, settings, expected)
    kept = sum(len(keys) for keys in expected.values())
    assert runs[-1]["status"] == "compacted" and runs[-1]["messages_kept"] == kept
    assert sum(r["tombstones_applied"] for r in runs) > 0 and sum(r["messages_without_key"] for r in runs) > 0
    assert any(len(keys) > 1 for keys in expected.values())
    queues_per_key = {}
    for queue, keys in expected.items():
        for key in keys:
            queues_per_key.setdefault(key, set()).add(queue)
    assert max(len(q) for q in queues_per_key.values()) > 1  # a key in several queues is compacted per queue
    assert runs[-1]["bytes_after"] < runs[-1]["bytes_before"] and 0 < runs[-1]["ratio"] < 1
    for keys in expected.values():  # original queue offsets are kept, so compacted queues have gaps
        offsets = sorted(m["queue_offset"] for m in keys.values())
        assert offsets != list(range(len(offsets)))

    # one compaction over everything gives the same tables
    single = settings_for(tmp_path / "single")
    ingest(spark, single, input_path=str(tmp_path / "in"))
    reput(spark, single)
    compact(spark, single)

    def without_batch(tables):  # batch ids name the ingest runs, which differ
        log, cq = tables
        return [{k: v for k, v in r.items() if k != "batch_id"} for r in log], cq

    assert without_batch(compacted_rows(spark, single)) == without_batch(compacted_rows(spark, settings))


def test_rerun_changes_nothing_and_delete_topics_are_untouched(spark, tmp_path, java_oracle):
    paths = write_updates(tmp_path / "in", batches=1, seed=11)
    settings = settings_for(tmp_path)
    ingest(spark, settings, input_path=str(paths[0]))
    assert compact(spark, settings)["status"] == "up_to_date"  # nothing dispatched yet: compaction follows reput
    reput(spark, settings)
    lake = Lake.from_settings(settings)
    before = {t: lake.version(t) for t in ("commitlog", "consumequeue", "indexfile", "segments")}
    first = compact(spark, settings)
    tables = compacted_rows(spark, settings)
    versions = {t: lake.version(t) for t in ("compaction_log", "compaction_cq")}
    again = compact(spark, settings)
    assert again["status"] == "up_to_date" and again["table_versions"] == {}
    assert {t: lake.version(t) for t in ("compaction_log", "compaction_cq")} == versions
    assert compacted_rows(spark, settings) == tables
    assert {t: lake.version(t) for t in before} == before  # compaction writes only its own tables
    assert {r["topic"] for r in tables[0]} == {"UserProfile"}
    state = lake.state()
    assert state.compaction.positions == {"UserProfile": state.dispatched_offset}
    assert state.runs["compact"].metrics["messages_kept"] == first["messages_kept"] > 0


def test_consumer_reading_the_compacted_queue_sees_the_latest_value_of_every_key(spark, tmp_path, java_oracle):
    paths = write_updates(tmp_path / "in", batches=2, seed=3)
    settings = settings_for(tmp_path)
    for path in paths:
        ingest(spark, settings, input_path=str(path))
        reput(spark, settings)
        compact(spark, settings)
    expected = reference_compaction(reference_broker(java_oracle, paths).messages)
    lake = Lake.from_settings(settings, read_only=True)
    for (topic, queue), keys in expected.items():
        seen, offset = {}, 0
        while True:
            page = query_compacted_offset(lake, topic=topic, queue=queue, offset=offset, max_num=5)
            if page["status"] != "FOUND":
                assert page["status"] == "OFFSET_OVERFLOW_ONE"
                break
            for message in page["rows"]:
                seen[dict(message["properties"])["KEYS"]] = message["body"]
            offset = page["next_begin_offset"]
        assert seen == {k: m["body"] for k, m in keys.items()}
    # an offset inside a gap starts at the next kept message
    queue, keys = next(iter(expected.items()))
    offsets = sorted(m["queue_offset"] for m in keys.values())
    gap = next(o for o in range(offsets[-1]) if o not in offsets)
    page = query_compacted_offset(lake, topic=queue[0], queue=queue[1], offset=gap, max_num=1)
    assert page["rows"][0]["queue_offset"] == min(o for o in offsets if o > gap)
    assert query_compacted_offset(lake, topic="UserProfile", queue=99, offset=0)["status"] == "NO_MESSAGE_IN_QUEUE"


def test_topic_option_compacts_one_topic_and_refuses_delete_topics(spark, tmp_path):
    settings = settings_for(tmp_path, "topics.Clickstream.cleanup_policy=COMPACTION")
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"topic": t, "body": f"v{i}", "bornTimestamp": 1000 + i, "keys": f"k{i % 3}"}) + "\n"
            for i, t in enumerate(["UserProfile", "Clickstream"] * 6)
        )
    )
    ingest(spark, settings, input_path=str(path))
    reput(spark, settings)
    with pytest.raises(UsageError, match="OrderEvents: not a COMPACTION topic"):
        compact(spark, settings, topic="OrderEvents")
    first = compact(spark, settings, topic="Clickstream")
    assert first["topics"] == ["Clickstream"] and first["messages_read"] == 6
    log, _ = compacted_rows(spark, settings)
    assert {r["topic"] for r in log} == {"Clickstream"}
    second = compact(spark, settings)  # UserProfile catches up; Clickstream has nothing new
    assert second["topics"] == ["Clickstream", "UserProfile"] and second["messages_read"] == 6
    log, _ = compacted_rows(spark, settings)
    assert sorted({r["topic"] for r in log}) == ["Clickstream", "UserProfile"]
    assert len(log) == 6  # three keys per topic


BLANK_CASES = ["", " ", "\t", " \n\r\f\u000b", "\u001c\u001f", "\u2003\u3000", "\u2028\u2029"]
NOT_BLANK_CASES = ["\u00a0", "\u2007", "\u202f", "\u0085", "a", " a ", "\u200b"]


@pytest.mark.parametrize("text", BLANK_CASES + NOT_BLANK_CASES)
def test_blank_keys_in_spark_match_javas_isblank(spark, text):
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(text,)], "k string")
    blank = frame.select((F.regexp_replace("k", JAVA_WHITESPACE_REGEX, "") == "").alias("b")).first()["b"]
    assert blank == is_blank(text) == (text in BLANK_CASES)
