"""Lookups: by key (collisions re-checked), by queue offset with tags, by msgId (and whether each group consumed
it), by time and time range; lag in time; and the CLI output."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from rmqlake import cli
from rmqlake import query as Q
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.steps.ingest import ingest
from rmqlake.steps.offsets import lag, load_offsets
from rmqlake.steps.reput import reput
from rmqlake.timeutil import iso, to_datetime
from tests.conftest import CONF, make_settings
from tests.reference import RefBroker, RefConfig, RefDispatcher
from tests.view_checks import assert_records_decode_to_their_stored_columns

pytestmark = pytest.mark.spark

TOPICS = {"OrderEvents": 8, "UserProfile": 4, "Clickstream": 4}
SLOTS, ENTRIES, SEGMENT = 8, 30, 16384
T0 = 1_795_219_200_000  # 2026-11-21T00:00:00Z

CRAFTED = [
    # keys "Aa" and "BB" have the same String.hashCode: the index returns both, the re-check keeps the right one
    {"topic": "OrderEvents", "body": "aa-1", "bornTimestamp": T0 + 1000, "keys": "Aa", "tags": "Aa"},
    {"topic": "OrderEvents", "body": "bb-1", "bornTimestamp": T0 + 1500, "keys": "BB", "tags": "BB"},
    {"topic": "OrderEvents", "body": "aa-2", "bornTimestamp": T0 + 2500, "keys": "Aa x", "tags": "TagA"},
    # same key in another topic: not returned for OrderEvents
    {"topic": "Clickstream", "body": "other topic", "bornTimestamp": T0 + 2600, "keys": "Aa"},
    {"topic": "OrderEvents", "body": "aa-3", "bornTimestamp": T0 + 9000, "keys": "Aa", "tags": "TagB"},
]


@pytest.fixture(scope="module")
def store(spark, tmp_path_factory, java_oracle):
    root = tmp_path_factory.mktemp("query")
    topics = [TopicPlan(name, queues, name == "UserProfile") for name, queues in TOPICS.items()]
    generate(root / "in", messages=500, topics=topics, hours=1, seed=31, start_ms=T0)
    crafted = root / "in" / "crafted.jsonl"
    crafted.write_text("\n".join(json.dumps(line) for line in CRAFTED) + "\n")
    overrides = [
        f"store.commitlog_segment_size={SEGMENT}",
        f"store.index_slots={SLOTS}",
        f"store.index_max_entries={ENTRIES}",
        "store.cq_units_per_file=40",
    ]
    settings = make_settings(root / "lake", *overrides)
    ingest(spark, settings, input_path=str(root / "in"))
    reput(spark, settings)
    broker = RefBroker(
        RefConfig(segment_size=SEGMENT, queue_counts=dict(TOPICS), compaction_topics=frozenset({"UserProfile"})),
        java_oracle,
    )
    broker.ingest_files(sorted(str(p) for p in (root / "in").rglob("*.jsonl")))
    ref = RefDispatcher(SLOTS, ENTRIES, 40)
    for message in broker.messages:
        ref.dispatch(message)
    return {
        "settings": settings,
        "lake": Lake.from_settings(settings),
        "broker": broker,
        "ref": ref,
        "root": root,
        "overrides": overrides,
    }


def run_cli(store, *args) -> list[dict]:
    argv = [*args, "--conf", str(CONF), "--env", "test", "--lake", str(store["root"] / "lake"), "--json"]
    for override in store["overrides"]:
        argv += ["--set", override]
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(argv) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def key_query(store, key, **options):
    return Q.query_key(
        store["lake"], topic=options.pop("topic", "OrderEvents"), key=key, slots=SLOTS, segment_size=SEGMENT, **options
    )


def test_hash_collisions_are_removed_by_the_key_recheck(store):
    result = key_query(store, "Aa")
    assert [r["body"] for r in result["rows"]] == [b"aa-1", b"aa-2", b"aa-3"]  # ascending offsets, as the broker
    assert result["metrics"]["index_hits"] == 4 and result["metrics"]["collisions_removed"] == 1  # bb-1
    assert [r["body"] for r in key_query(store, "BB")["rows"]] == [b"bb-1"]
    assert [r["body"] for r in key_query(store, "Aa", topic="Clickstream")["rows"]] == [b"other topic"]


def test_index_walk_equals_the_reference_for_every_key_and_window(store):
    broker, ref = store["broker"], store["ref"]
    reader = Q.IndexReader(store["lake"], slots=SLOTS)
    keys = sorted({(m["topic"], k) for m in broker.messages for k in [*m["keys"], m["uniq_key"]]})
    assert len(keys) > 500 and len(ref.files) > 20
    assert assert_records_decode_to_their_stored_columns(store["lake"]) == len(broker.messages)
    windows = [
        (0, Q.LONG_MAX, 64),
        (T0 + 600_000, T0 + 1_800_000, 64),
        (T0 + 1_000, T0 + 2_000, 64),
        (0, Q.LONG_MAX, 2),
    ]
    for topic, key in keys:
        for begin, end, max_num in windows:
            got = reader.query_offsets(f"{topic}#{key}", max_num=max_num, begin=begin, end=end)
            assert got == ref.query(topic, key, max_num, begin, end), (topic, key, begin, end, max_num)
    # the whole lookup (index, then messages) for keys spread over every topic, uniq keys and KEYS tokens
    for topic, key in keys[:: len(keys) // 24]:
        result = key_query(store, key, topic=topic)
        expected = [m["physical_offset"] for m in broker.messages if m["topic"] == topic and key in m["keys"]]
        assert [r["physical_offset"] for r in result["rows"]] == expected[-64:], (topic, key)
        assert result["rows"] == key_query(store, key, topic=topic, cached=False)["rows"]  # the reference route


def test_time_filter_compares_second_truncated_times_inclusively(store):
    ref = store["ref"]
    aa = [m for m in store["broker"].messages if m["topic"] == "OrderEvents" and "Aa" in m["keys"]]
    # the time the index keeps for each: its file's begin + whole seconds since then
    read_back = {}
    for _name, index_file in ref.files:
        for _h, phy, diff, _p in index_file.entry_table.values():
            if phy in {m["physical_offset"] for m in aa}:
                read_back[phy] = index_file.begin_timestamp + diff * 1000
    for message in aa:
        seen = read_back[message["physical_offset"]]
        assert seen <= message["store_timestamp"] < seen + 1000 or seen > message["store_timestamp"]

        def offsets(begin, end):
            return [r["physical_offset"] for r in key_query(store, "Aa", begin=begin, end=end)["rows"]]

        assert message["physical_offset"] in offsets(seen, seen)  # both bounds inclusive
        assert message["physical_offset"] not in offsets(seen + 1, Q.LONG_MAX)  # later than its truncated time
    assert [r["body"] for r in key_query(store, "Aa", max_num=1)["rows"]] == [b"aa-3"]  # newest first


def test_queue_offsets_with_tag_filter_and_collisions(store):
    broker = store["broker"]
    crafted = [m for m in broker.messages if m["body"] in (b"aa-1", b"bb-1")]
    queue = crafted[0]["queue_id"]
    units = sorted(
        (m["queue_offset"], m["body"])
        for m in broker.messages
        if m["topic"] == "OrderEvents" and m["queue_id"] == queue and m["sys_flag"] & 0xC in (0, 8)
    )
    result = Q.query_offset(
        store["lake"], topic="OrderEvents", queue=queue, offset=0, max_num=1000, tags="Aa", segment_size=SEGMENT
    )
    # "Aa" and "BB" share a tagsCode: both pass the broker's filter, the client drops "BB"
    bb_same_queue = any(m["body"] == b"bb-1" and m["queue_id"] == queue for m in crafted)
    assert result["status"] == "FOUND" and [r["body"] for r in result["rows"]] == [b"aa-1"]
    assert result["metrics"]["tag_collisions_removed"] == (1 if bb_same_queue else 0)
    everything = Q.query_offset(
        store["lake"], topic="OrderEvents", queue=queue, offset=0, max_num=1000, segment_size=SEGMENT
    )
    assert [(r["queue_offset"], r["body"]) for r in everything["rows"]] == units
    assert everything["next_begin_offset"] == len(units) == everything["max_offset"]
    batch = Q.query_offset(store["lake"], topic="OrderEvents", queue=queue, offset=1, max_num=3, segment_size=SEGMENT)
    assert [r["queue_offset"] for r in batch["rows"]] == [1, 2, 3] and batch["next_begin_offset"] == 4
    for offset, status in ((len(units), "OFFSET_OVERFLOW_ONE"), (len(units) + 5, "OFFSET_OVERFLOW_BADLY")):
        assert (
            Q.query_offset(store["lake"], topic="OrderEvents", queue=queue, offset=offset, segment_size=SEGMENT)[
                "status"
            ]
            == status
        )
    assert (
        Q.query_offset(store["lake"], topic="NoSuchTopic", queue=0, offset=0, segment_size=SEGMENT)["status"]
        == "NO_MESSAGE_IN_QUEUE"
    )


def test_msgid_round_trip_by_offset_msg_id_and_uniq_key(store):
    message = store["broker"].messages[123]
    by_offset = Q.query_msgid(store["lake"], msg_id=message["msg_id"], slots=SLOTS, segment_size=SEGMENT)
    assert by_offset["metrics"]["found_by"] == "offsetMsgId"
    assert [r["physical_offset"] for r in by_offset["rows"]] == [message["physical_offset"]]
    by_uniq = Q.query_msgid(store["lake"], msg_id=message["uniq_key"], slots=SLOTS, segment_size=SEGMENT, topics=TOPICS)
    assert by_uniq["metrics"]["found_by"] == "UNIQ_KEY"
    # a transaction's half message and its COMMIT share the UNIQ_KEY; ROLLBACK records are not indexed
    same_id = [
        m["physical_offset"]
        for m in store["broker"].messages
        if m["uniq_key"] == message["uniq_key"] and m["sys_flag"] & 0xC != 0xC
    ]
    assert [r["physical_offset"] for r in by_uniq["rows"]] == same_id


def test_queue_offset_at_a_time(store):
    broker = store["broker"]
    queue = [m for m in broker.messages if m["topic"] == "Clickstream" and m["queue_id"] == 1]
    middle = queue[len(queue) // 2]
    answer = Q.query_time(store["lake"], topic="Clickstream", queue=1, at=middle["store_timestamp"], units_per_file=40)
    first_at_or_after = min(m["queue_offset"] for m in queue if m["store_timestamp"] >= middle["store_timestamp"])
    assert answer["queue_offset"] == first_at_or_after


def test_cli_query_and_status_print_json_lines(store):
    lines = run_cli(store, "query", "key", "--topic", "OrderEvents", "--key", "Aa")
    assert lines[0]["kind"] == "result" and lines[0]["returned"] == 3
    assert [line["body"] for line in lines[1:]] == ["aa-1", "aa-2", "aa-3"]
    status = run_cli(store, "status")
    summary = status[0]
    assert summary["kind"] == "store" and summary["dispatch_lag_bytes"] == 0
    assert summary["max_physical_offset"] == store["broker"].next_offset
    queues = {(q["topic"], q["queue_id"]): q for q in status if q["kind"] == "queue"}
    for (topic, queue), head in store["broker"].queue_heads.items():
        assert queues[(topic, queue)]["max_offset"] == head == queues[(topic, queue)]["written_offset"]


# -- mqadmin parity: consumed or not per group, lag in time, messages by time range -------------------------------

AS_OF = T0 + 2 * 3_600_000  # the snapshot: after every message of the hour of traffic


def queue_units_of(store, topic: str, queue: int) -> list[dict]:
    """The queue's dispatched messages (normal and COMMIT records) in queue-offset order."""
    return sorted(
        (
            m
            for m in store["broker"].messages
            if m["topic"] == topic and m["queue_id"] == queue and m["sys_flag"] & 0xC in (0, 8)
        ),
        key=lambda m: m["queue_offset"],
    )


@pytest.fixture(scope="module")
def offsets(store):
    """One snapshot: cg_done consumed all of OrderEvents, cg_half half of queue 1 only, cg_click only Clickstream."""
    queue = queue_units_of(store, "OrderEvents", 1)
    half = len(queue) // 2
    table = {
        "OrderEvents@cg_done": {q: len(queue_units_of(store, "OrderEvents", q)) for q in range(TOPICS["OrderEvents"])},
        "OrderEvents@cg_half": {1: half},
        "Clickstream@cg_click": {0: 1},
    }
    folder = store["root"] / "offsets"
    folder.mkdir(exist_ok=True)
    (folder / f"consumerOffset-{AS_OF}.json").write_text(json.dumps({"offsetTable": table}))
    assert load_offsets(store["settings"], input_path=str(folder))["rows_out"] == 10
    return {"queue": queue, "half": half}


def test_msgid_tells_per_group_whether_the_message_was_consumed(store, offsets):
    queue, half = offsets["queue"], offsets["half"]
    consumed, pending = queue[half - 1], queue[half]  # cg_half's offset `half` is the next one to consume
    for message, expected in ((consumed, "CONSUMED"), (pending, "NOT_CONSUME_YET")):
        lines = run_cli(store, "query", "msgid", message["msg_id"])
        assert [line["kind"] for line in lines] == ["result", "message", "track", "track"]  # no cg_click
        tracks = {line["group"]: line for line in lines if line["kind"] == "track"}
        assert tracks["cg_done"]["track_type"] == "CONSUMED"
        assert tracks["cg_half"]["track_type"] == expected
        assert tracks["cg_half"]["consumer_offset"] == half and tracks["cg_half"]["as_of"] == iso(AS_OF)
        assert tracks["cg_half"]["queue_offset"] == message["queue_offset"]
    other_queue = queue_units_of(store, "OrderEvents", 2)[0]  # cg_half has no offset for queue 2
    tracks = Q.message_tracks(store["lake"], [other_queue])
    assert [(t["group"], t["consumer_offset"], t["track_type"]) for t in tracks] == [
        ("cg_done", len(queue_units_of(store, "OrderEvents", 2)), "CONSUMED"),
        ("cg_half", None, "NOT_CONSUME_YET"),
    ]


def test_lag_shows_the_store_times_at_the_committed_offset_and_the_lag_in_time(store, offsets):
    queue, half = offsets["queue"], offsets["half"]
    rows = {(r["group"], r["queue_id"]): r for r in lag(store["settings"])["latest"]}
    behind = rows[("cg_half", 1)]
    assert behind["lag"] == len(queue) - half
    assert behind["last_time"] == iso(queue[half - 1]["store_timestamp"])  # mqadmin's LastTime: offset - 1
    assert behind["next_time"] == iso(queue[half]["store_timestamp"])  # oldest message not consumed yet
    assert behind["lag_ms"] == AS_OF - queue[half]["store_timestamp"] > 0
    done = rows[("cg_done", 1)]
    assert done["lag"] == 0 and done["lag_ms"] == 0 and done["next_time"] is None
    assert done["last_time"] == iso(queue[-1]["store_timestamp"])
    started = rows[("cg_click", 0)]
    assert started["last_time"] == iso(queue_units_of(store, "Clickstream", 0)[0]["store_timestamp"])
    lines = run_cli(store, "lag", "--group", "cg_half")
    assert [(line["kind"], line["lag_ms"]) for line in lines if line["kind"] == "queue"] == [
        ("queue", behind["lag_ms"])
    ]


def mqadmin_time(epoch_ms: int) -> str:
    return to_datetime(epoch_ms).strftime("%Y-%m-%d#%H:%M:%S:") + f"{epoch_ms % 1000:03d}"


def test_query_range_lists_messages_from_begin_inclusive_to_end_exclusive(store):
    queue = queue_units_of(store, "Clickstream", 1)
    times = [m["store_timestamp"] for m in queue]
    assert times == sorted(times) and len(queue) > 20
    begin, end = times[5], times[15]

    def lower(at):  # searchOffset: the first offset stored at or after
        return Q.query_time(store["lake"], topic="Clickstream", queue=1, at=at, units_per_file=40)["queue_offset"]

    expected = [m["queue_offset"] for m in queue if begin <= m["store_timestamp"] < end]
    assert expected == list(range(lower(begin), lower(end)))
    assert queue[5]["queue_offset"] in expected and queue[15]["queue_offset"] not in expected  # [begin, end)
    result = Q.query_range(
        store["lake"], topic="Clickstream", queue=1, begin=begin, end=end, units_per_file=40, segment_size=SEGMENT
    )
    assert [r["queue_offset"] for r in result["rows"]] == expected
    assert [r["body"] for r in result["rows"]] == [m["body"] for m in queue if m["queue_offset"] in expected]
    assert result["metrics"]["returned"] == len(expected) and not result["metrics"]["truncated"]
    # mqadmin's time format on the command line; every queue of the topic without --queue
    lines = run_cli(
        store, "query", "range", "--topic", "Clickstream", "--begin", mqadmin_time(begin), "--end", mqadmin_time(end)
    )
    messages = [line for line in lines if line["kind"] == "message"]
    everywhere = sorted(
        (m["queue_id"], m["queue_offset"])
        for q in range(TOPICS["Clickstream"])
        for m in queue_units_of(store, "Clickstream", q)
        if begin <= m["store_timestamp"] < end
    )
    assert [(m["queue_id"], m["queue_offset"]) for m in messages] == everywhere
    assert lines[0]["returned"] == len(everywhere) and lines[0]["queues"] == TOPICS["Clickstream"]
    capped = Q.query_range(
        store["lake"], topic="Clickstream", begin=begin, end=end, max_num=2, units_per_file=40, segment_size=SEGMENT
    )
    assert len(capped["rows"]) == 2 and capped["metrics"]["truncated"]
