"""Ask RocketMQ's store about an exported lake, and check each answer against the lake and rmqlake's own answers."""

from __future__ import annotations

import json
from pathlib import Path

from rmqlake.lake import Lake
from rmqlake.query import query_key, query_msgid, query_offset, query_time
from rmqlake.steps.status import status
from tests.interop import data
from tests.interop.harness import message_fields, run_java

LONG_MAX = 2**63 - 1


def store_request(store: Path, **queries) -> dict:
    """The harness request: the store directory, the lake's file sizes, and the lookups to answer."""
    return {
        "storeDir": str(store),
        "segmentSize": data.SEGMENT,
        "cqUnitsPerFile": data.UNITS,
        "indexSlots": data.SLOTS,
        "indexMaxEntries": data.ENTRIES,
        "keyQueries": queries.get("key_queries", []),
        "offsets": queries.get("offsets", []),
        "timeQueries": queries.get("time_queries", []),
    }


def read_store(store: Path, request: dict) -> dict:
    path = store.parent / f"{store.name}-request.json"
    path.write_text(json.dumps(request))
    return run_java("StoreHarness", "read", str(path))


def commitlog_rows(settings) -> dict[int, dict]:
    rows = Lake.from_settings(settings, read_only=True).read_arrow("commitlog").to_pylist()
    return {row["physical_offset"]: row for row in rows}


def lookups(settings, rows: dict[int, dict]) -> dict:
    """Key, offsetMsgId and time lookups chosen from the lake, and the lake's own answers to them."""
    lake = Lake.from_settings(settings, read_only=True)
    store = settings.store
    ordered = [rows[o] for o in sorted(rows)]
    keys: list[tuple[str, str]] = [(data.ORDERS, k) for k in data.COLLIDING]
    keys += [(data.ORDERS, k) for k in ("order-3", "order-50", "cust-4", "region-2", "spaced-101", "no-such-key")]
    keys += [(r["topic"], r["keys"][0]) for r in ordered[::37] if r["keys"]]
    keys += [(data.TX, k) for r in ordered if r["topic"] == data.TX and r["keys"] for k in r["keys"][:1]][:12]
    first, last = ordered[0]["store_timestamp"], ordered[-1]["store_timestamp"]
    middle = ordered[len(ordered) // 2]["store_timestamp"]
    ranges = [(0, LONG_MAX), (middle + 500, LONG_MAX), (first, middle - 1), (middle - 30_000, middle + 30_000)]
    key_queries = [{"topic": t, "key": k, "maxNum": 64, "begin": b, "end": e} for t, k in keys for b, e in ranges] + [
        {"topic": t, "key": k, "maxNum": 3, "begin": 0, "end": LONG_MAX} for t, k in keys[:6]
    ]
    key_answers = []
    for q in key_queries:
        answer = query_key(lake, topic=q["topic"], key=q["key"], begin=q["begin"], end=q["end"], max_num=q["maxNum"],
                           slots=store.index_slots, segment_size=store.commitlog_segment_size)  # fmt: skip
        key_answers.append(answer)
    uniq = ordered[5::41]
    uniq_answers = [
        query_msgid(
            lake,
            msg_id=r["uniq_key"],
            topic=r["topic"],
            slots=store.index_slots,
            segment_size=store.commitlog_segment_size,
        )
        for r in uniq
    ]
    key_queries += [
        {"topic": r["topic"], "key": r["uniq_key"], "maxNum": 64, "begin": 0, "end": LONG_MAX} for r in uniq
    ]
    picked = ordered[::23] + [r for r in ordered if r["topic"] == data.TX][:20]
    msg_ids = [r["msg_id"] for r in picked]
    msg_answers = [
        query_msgid(lake, msg_id=m, slots=store.index_slots, segment_size=store.commitlog_segment_size) for m in msg_ids
    ]
    time_queries, time_answers = [], []
    expiry = _expiry(settings)
    for queue in status(settings)["queues"]:
        if queue["max_offset"] == 0:
            continue
        here = (queue["topic"], queue["queue_id"])
        stamps = sorted({r["store_timestamp"] for r in ordered if (r["topic"], r["queue_id"]) == here})
        probes = {first - 1, last + 1, stamps[0], stamps[-1], *stamps[:: max(1, len(stamps) // 6)]}
        probes |= {s + 1 for s in stamps[:: max(1, len(stamps) // 5)]}
        for at in sorted(probes):
            for boundary in ("lower", "upper"):
                time_queries.append(
                    {"topic": queue["topic"], "queueId": queue["queue_id"], "timestamp": at, "boundary": boundary}
                )
                time_answers.append(
                    query_time(
                        lake,
                        topic=queue["topic"],
                        queue=queue["queue_id"],
                        at=at,
                        boundary=boundary,
                        units_per_file=store.cq_units_per_file,
                        **expiry,
                    )["queue_offset"]
                )
    return {
        "request": {
            "key_queries": key_queries,
            "offsets": [int(m[-16:], 16) for m in msg_ids],
            "time_queries": time_queries,
        },
        "key_answers": key_answers,
        "uniq": uniq,
        "uniq_answers": uniq_answers,
        "msg_ids": msg_ids,
        "msg_answers": msg_answers,
        "time_answers": time_answers,
    }


def _expiry(settings) -> dict:
    mins = Lake.from_settings(settings, read_only=True).state().queue_min_offsets
    return {"min_phy_offset": status(settings)["store"]["min_physical_offset"], "min_offsets": mins}


def assert_store_answers_equal_the_lake(answer: dict, settings, asked: dict) -> None:
    """Everything the broker's store answered equals the lake's tables and rmqlake's query/status answers."""
    rows = commitlog_rows(settings)
    state = status(settings)
    assert answer["minPhyOffset"] == state["store"]["min_physical_offset"]
    assert answer["maxPhyOffset"] == state["store"]["max_physical_offset"]

    lake = Lake.from_settings(settings, read_only=True)
    min_offsets = _expiry(settings)["min_offsets"]
    expected_queues = {(q["topic"], q["queue_id"]): q for q in state["queues"]}
    broker_queues = {(q["topic"], q["queueId"]): q for q in answer["queues"]}
    assert set(broker_queues) == set(expected_queues)
    units = lake.read_arrow("consumequeue", columns=["topic", "queue_id", "queue_offset", "commitlog_offset"])
    by_queue: dict[tuple[str, int], dict[int, int]] = {}
    for unit in units.to_pylist():
        by_queue.setdefault((unit["topic"], unit["queue_id"]), {})[unit["queue_offset"]] = unit["commitlog_offset"]
    for key, broker in sorted(broker_queues.items()):
        expected = expected_queues[key]
        assert (broker["minOffset"], broker["maxOffset"]) == (expected["min_offset"], expected["max_offset"]), key
        cq = by_queue[key]
        wanted = [message_fields(rows[cq[o]]) for o in range(expected["min_offset"], expected["max_offset"])]
        assert len(broker["messages"]) == len(wanted), key
        for got, want in zip(broker["messages"], wanted, strict=True):
            assert got == want, f"{key} queue offset {want['queueOffset']}"
        for probe, broker_status in broker["statuses"].items():
            ours = query_offset(lake, topic=key[0], queue=key[1], offset=int(probe), max_num=1,
                                segment_size=data.SEGMENT, min_offsets=min_offsets)  # fmt: skip
            assert ours["status"] == broker_status, (key, probe)

    request = asked["request"]
    key_count = len(asked["key_answers"])
    for q, found, ours in zip(request["key_queries"], answer["keyQueries"], asked["key_answers"], strict=False):
        # the store returns what the index chain holds (collisions included); the client re-checks topic and key
        kept = [m["commitLogOffset"] for m in found if m["topic"] == q["topic"]
                and q["key"] in m["properties"].get("KEYS", "").split(" ")]  # fmt: skip
        assert kept == [r["physical_offset"] for r in ours["rows"]], q
        assert len(found) == ours["metrics"]["returned"] + ours["metrics"]["collisions_removed"], q
        assert all(m == message_fields(rows[m["commitLogOffset"]]) for m in found), q
    for q, found, row, ours in zip(
        request["key_queries"][key_count:],
        answer["keyQueries"][key_count:],
        asked["uniq"],
        asked["uniq_answers"],
        strict=True,
    ):
        kept = [m["commitLogOffset"] for m in found if m["properties"].get("UNIQ_KEY") == q["key"]]
        indexed = row["sys_flag"] & 0xC != 0xC  # a ROLLBACK record is not indexed
        assert kept == [r["physical_offset"] for r in ours["rows"]] == [row["physical_offset"]][: int(indexed)], q
    assert sum(len(found) for found in answer["keyQueries"]) > len(answer["keyQueries"])  # the queries do find
    for msg_id, looked, ours in zip(asked["msg_ids"], answer["lookups"], asked["msg_answers"], strict=True):
        (row,) = ours["rows"]
        assert looked == message_fields(rows[row["physical_offset"]], raw=False) and looked["msgId"] == msg_id
    assert answer["timeQueries"] == asked["time_answers"]


def write_with_rocketmq(root: Path) -> dict:
    """The messages of :func:`data.messages` put into an empty store in ``root`` by RocketMQ's
    ``DefaultMessageStore.putMessage`` (StoreHarness ``write``), shut down cleanly: the store and what the
    harness printed."""
    messages = data.messages()
    request = {
        "storeDir": str(root / "broker"),
        "segmentSize": data.SEGMENT,
        "cqUnitsPerFile": data.UNITS,
        "indexSlots": data.SLOTS,
        "indexMaxEntries": data.ENTRIES,
        "messages": [m.put_spec() for m in messages],
    }
    (root / "write.json").write_text(json.dumps(request))
    answer = run_java("StoreHarness", "write", str(root / "write.json"))
    return {"root": root, "store": root / "broker", "messages": messages, "answer": answer}
