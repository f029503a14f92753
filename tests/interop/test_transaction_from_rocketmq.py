"""A real broker's transactional messages, read back from its store: the truth rmqlake's rules must give.

tests/interop/transaction.py sends transactional messages with a real ``TransactionMQProducer`` whose
local transaction commits some, rolls back some and leaves some open, and waits until the broker has
applied every end. Then, field by field:

* each send is one half record: what :func:`rmqlake.formats.transaction.half` gives for the send as
  the broker received it (topic, queue, properties byte for byte, sysFlag), with the send's body,
  flag, born time and host, reconsume times, on the half topic's ConsumeQueue at the offset the
  producer was told;
* each commit is one record on the real topic: what :func:`~rmqlake.formats.transaction.commit`
  gives for the stored half (topic, queue, properties byte for byte, sysFlag,
  ``preparedTransactionOffset``), with the half's body, flag, born time and hosts, reconsume times,
  at the next queue offset of its queue and dispatched with its tags' hash;
* rolled back and open halves have no record anywhere else;
* the op records are what :func:`~rmqlake.formats.transaction.op_records` gives: on the op topic's
  queue 0, tags ``d``, properties byte for byte, sysFlag and flag 0, the broker's address as born and
  store host, and together they name each ended half once, never an open one.

Not compared, because the broker's timing decides them: store timestamps (a half's is its put time; a
commit's is the broker's clock when the end is applied, never before its half's, within
:data:`END_TOLERANCE_MS`), the op records' born and store times, how the ended halves are grouped
into op records (the batcher writes what has gathered each interval) and the order of the offsets in
them (the broker applies ends on a pool of threads, so two ends sent close together may be applied
in either order; each end is applied after its half is stored).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import rmqlake
from rmqlake.cli import main
from rmqlake.formats.consumequeue import tags_code
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.properties import broker_properties, parse_properties, serialize_properties
from rmqlake.formats.record import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE
from rmqlake.formats.transaction import (
    HALF_TOPIC,
    OP_TOPIC,
    commit,
    half,
    op_offsets,
    op_properties,
    op_records,
)
from rmqlake.lake import Lake
from rmqlake.quality import frames
from rmqlake.quality.suites import SUITES
from rmqlake.steps.compact import compact
from rmqlake.steps.expire import expire
from rmqlake.steps.ingest import ingest
from rmqlake.steps.quality import _context, _validate, quality, spark_source, suite_inputs
from rmqlake.steps.reput import reput
from rmqlake.steps.status import status
from rmqlake.steps.store import export_store, import_store
from rmqlake.timeutil import iso
from tests.conftest import CONF
from tests.interop import data, transaction
from tests.interop.conftest import lake_settings

pytestmark = pytest.mark.interop
END_TOLERANCE_MS = 30_000
STATES = {"COMMIT": "COMMIT_MESSAGE", "ROLLBACK": "ROLLBACK_MESSAGE", "UNKNOWN": "UNKNOW"}


@pytest.fixture(scope="module")
def broker(harness_runs) -> transaction.BrokerRun:
    run = harness_runs["transaction"].result(timeout=600)
    assert run.answer["settled"], run.answer  # every end applied within the harness's time
    return run


def sent_properties(send: dict, result: dict) -> list[tuple[str, str]]:
    """The properties the broker received for a transactional send, with its ``CLUSTER``, in storage order.

    Besides the spec's, the producer sends ``TRAN_MSG`` and ``PGROUP`` (``sendMessageInTransaction``),
    ``WAIT`` and the 5.x client's ``MSG_REGION`` and ``TRACE_ON``.
    """
    user = dict(send.get("properties", {}))
    user.update(TRAN_MSG="true", PGROUP=transaction.PRODUCER_GROUP, WAIT="true", MSG_REGION="DefaultRegion",
                TRACE_ON="true")  # fmt: skip
    return broker_properties(user, keys=send.get("keys"), tags=send.get("tags"), uniq_key=result["msgId"],
                             cluster_name=data.CLUSTER)  # fmt: skip


def records_of(broker: transaction.BrokerRun, uniq_key: str) -> list[dict]:
    return [r for r in broker.records if r["properties"].get("UNIQ_KEY") == uniq_key]


def unit_of(broker: transaction.BrokerRun, record: dict) -> dict:
    (unit,) = (u for u in broker.units if u["commitlog_offset"] == record["physical_offset"])
    return unit


def half_of(broker: transaction.BrokerRun, result: dict) -> dict:
    (stored,) = (r for r in records_of(broker, result["msgId"]) if r["topic"] == HALF_TOPIC)
    return stored


def test_every_send_is_accepted_and_ended_as_its_local_transaction_said(broker):
    for send, result in zip(broker.sends, broker.answer["sends"], strict=True):
        assert result["status"] == "SEND_OK", result
        assert result["localState"] == STATES[send["end"]]
        assert result["transactionId"] == result["msgId"]
    assert {s["end"] for s in broker.sends} == set(STATES)
    assert len({(s["topic"], r["queueId"]) for s, r in zip(broker.sends, broker.answer["sends"])}) > 2


def test_each_send_is_one_half_record_as_the_rules_give(broker):
    for send, result in zip(broker.sends, broker.answer["sends"], strict=True):
        stored = half_of(broker, result)
        ours = half(send["topic"], result["queueId"], sent_properties(send, result),
                    sys_flag=TRANSACTION_PREPARED_TYPE)  # fmt: skip
        assert (stored["topic"], stored["queue_id"]) == (ours.topic, ours.queue_id)
        assert stored["raw_properties"] == serialize_properties(ours.properties), send  # the record's bytes
        assert stored["sys_flag"] == ours.sys_flag
        assert stored["body"] == send["body"].encode()
        assert (stored["flag"], stored["reconsume_times"], stored["prepared_transaction_offset"]) == (0, 0, 0)
        assert stored["born_timestamp"] <= stored["store_timestamp"]
        assert stored["queue_offset"] == result["queueOffset"]
        unit = unit_of(broker, stored)
        assert (unit["topic"], unit["queue_id"], unit["queue_offset"]) == (HALF_TOPIC, 0, result["queueOffset"])
        assert unit["tags_code"] == tags_code(send.get("tags"))
    halves = sorted(u["queue_offset"] for u in broker.units if u["topic"] == HALF_TOPIC)
    assert halves == list(range(len(broker.sends)))  # no check-back re-puts


def test_each_commit_is_re_put_on_its_real_queue_as_the_rules_give(broker):
    next_offset = Counter()
    for send, result in sorted(zip(broker.sends, broker.answer["sends"]), key=lambda p: _committed_at(broker, p)):
        stored_half = half_of(broker, result)
        others = [r for r in records_of(broker, result["msgId"]) if r["topic"] != HALF_TOPIC]
        if send["end"] != "COMMIT":
            assert others == [], send  # a rollback or an open half appends nothing but op records
            continue
        (stored,) = others
        ours = commit(list(stored_half["properties"].items()), half_sys_flag=stored_half["sys_flag"],
                      half_physical_offset=stored_half["physical_offset"])  # fmt: skip
        where = (stored["topic"], stored["queue_id"])
        assert where == (ours.topic, ours.queue_id) == (send["topic"], result["queueId"])
        assert stored["raw_properties"] == serialize_properties(ours.properties), send
        assert stored["raw_properties"] == stored_half["raw_properties"]  # REAL_*, TRAN_MSG, PGROUP stay
        assert stored["sys_flag"] == ours.sys_flag
        assert stored["prepared_transaction_offset"] == ours.prepared_transaction_offset
        kept = ("body", "flag", "born_timestamp", "born_host", "store_host", "reconsume_times")
        assert {k: stored[k] for k in kept} == {k: stored_half[k] for k in kept}, send
        assert stored["physical_offset"] > stored_half["physical_offset"]
        assert 0 <= stored["store_timestamp"] - stored_half["store_timestamp"] <= END_TOLERANCE_MS
        queue = (stored["topic"], stored["queue_id"])
        assert stored["queue_offset"] == next_offset[queue]  # the store's next offset on the real queue
        next_offset[queue] += 1
        unit = unit_of(broker, stored)
        assert (unit["topic"], unit["queue_id"], unit["queue_offset"]) == (*queue, stored["queue_offset"])
        assert unit["tags_code"] == tags_code(send.get("tags"))
    assert sum(next_offset.values()) == sum(1 for s in broker.sends if s["end"] == "COMMIT")


def _committed_at(broker: transaction.BrokerRun, pair: tuple[dict, dict]) -> int:
    """Where the send's commit (or else its half) lies in the commitlog: the store's order."""
    return max(r["physical_offset"] for r in records_of(broker, pair[1]["msgId"]))


def test_op_records_name_each_ended_half_once_as_the_rules_give(broker):
    ops = [r for r in broker.records if r["topic"] == OP_TOPIC]
    assert ops, "no op record"
    store_host = half_of(broker, broker.answer["sends"][0])["store_host"]
    named = []
    for stored in ops:
        named += op_offsets(stored["body"])
        (ours,) = op_records(op_offsets(stored["body"]))
        assert stored["body"] == ours.body  # "offset," per ended half
        assert (stored["topic"], stored["queue_id"]) == (ours.topic, ours.queue_id)
        assert stored["raw_properties"] == serialize_properties(op_properties())
        assert (stored["sys_flag"], stored["flag"], stored["reconsume_times"]) == (ours.sys_flag, 0, 0)
        assert stored["prepared_transaction_offset"] == 0
        assert stored["born_host"] == stored["store_host"] == store_host
        assert stored["born_timestamp"] <= stored["store_timestamp"]
    ended = {
        result["queueOffset"]: half_of(broker, result)
        for send, result in zip(broker.sends, broker.answer["sends"], strict=True)
        if send["end"] != "UNKNOWN"
    }
    assert sorted(named) == sorted(ended)  # each ended half once, no open one
    for offset in named:  # written after the half it names
        (op,) = (r for r in ops if offset in op_offsets(r["body"]))
        assert op["physical_offset"] > ended[offset]["physical_offset"]
    # however the broker grouped them, the rules' records name the same halves in the same order
    assert [o for r in op_records(named) for o in op_offsets(r.body)] == named


# -- the same sends through rmqlake's ingest ------------------------------------------------------

# A record's fields rmqlake must give exactly as the broker stored them (offsets: see the test).
EXACT = ("topic", "queue_id", "flag", "sys_flag", "born_timestamp", "born_host", "store_host", "reconsume_times",
         "body", "total_size", "raw_properties", "store_timestamp")  # fmt: skip
OP_EXACT = ("topic", "queue_id", "flag", "sys_flag", "reconsume_times", "prepared_transaction_offset",
            "raw_properties")  # fmt: skip


def producer_logs(broker: transaction.BrokerRun, folder) -> list:
    """The sends and their ends as two producer logs, cut at the middle send's store time, so that some ends
    find their half in the lake: each send a ``PREPARED`` line with what the client sent (``TRAN_MSG``,
    ``PGROUP`` and the client's own properties) and the broker's store time and hosts; each end an
    ``endTransaction`` line at the broker's time for it (a commit's store time; a rollback's op record's)."""
    lines = []
    ops = [r for r in broker.records if r["topic"] == OP_TOPIC]
    for send, result in zip(broker.sends, broker.answer["sends"], strict=True):
        stored = half_of(broker, result)
        properties = dict(send.get("properties", {}))
        properties.update(TRAN_MSG="true", PGROUP=transaction.PRODUCER_GROUP, WAIT="true",
                          MSG_REGION="DefaultRegion", TRACE_ON="true")  # fmt: skip
        line = {"topic": send["topic"], "queueId": result["queueId"], "body": send["body"],
                "uniqKey": result["msgId"], "flag": stored["flag"], "bornTimestamp": stored["born_timestamp"],
                "storeTimestamp": stored["store_timestamp"], "bornHost": stored["born_host"],
                "storeHost": stored["store_host"], "transaction": "PREPARED", "properties": properties}  # fmt: skip
        line.update({name: send[name] for name in ("keys", "tags") if name in send})
        lines.append(line)
        if send["end"] == "COMMIT":
            (reput,) = (r for r in records_of(broker, result["msgId"]) if r["topic"] != HALF_TOPIC)
            at = reput["store_timestamp"]
        elif send["end"] == "ROLLBACK":
            at = next(r["store_timestamp"] for r in ops if result["queueOffset"] in op_offsets(r["body"]))
        else:
            continue
        lines.append({"endTransaction": send["end"], "uniqKey": result["msgId"], "storeTimestamp": at,
                      "producerGroup": transaction.PRODUCER_GROUP})  # fmt: skip
    lines.sort(key=lambda line: line["storeTimestamp"])
    cut = sorted(line["storeTimestamp"] for line in lines if "topic" in line)[len(broker.sends) // 2]
    folder.mkdir(parents=True)
    paths = []
    for name, part in (("early", [x for x in lines if x["storeTimestamp"] < cut]),
                       ("late", [x for x in lines if x["storeTimestamp"] >= cut])):  # fmt: skip
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in part))
        paths.append(path)
    return paths


@pytest.mark.spark
def test_the_sends_and_ends_as_producer_logs_give_the_brokers_records(spark, broker, tmp_path):
    """rmqlake's ingest of the sends and ends, in two runs (ends of the first run's halves in the second),
    against the broker's commitlog, record by record (a half and its commit by UNIQ_KEY).

    Equal: every field of every half and commit (topic, queue, sysFlag, flag, body, born time and host,
    store host, reconsume times, size, properties byte for byte, store time), the halves' queue offsets, the
    commits' queue offsets per queue, and each commit's ``preparedTransactionOffset`` pointing at its half.
    The op records: the same properties, queue, flags and hosts, and together the same ended halves. What
    the broker's timing decides differs by construction: it batches the ends of each interval into one op
    record written a little later, rmqlake writes one per end at the end's time; so op records' bodies,
    times and count, and every physical offset after the first op record, may differ.
    """
    settings = lake_settings(tmp_path / "lake")
    early, late = producer_logs(broker, tmp_path / "in")
    early_halves = {json.loads(x)["uniqKey"] for x in early.read_text().splitlines() if "topic" in json.loads(x)}
    late_ends = {json.loads(x)["uniqKey"] for x in late.read_text().splitlines() if "endTransaction" in json.loads(x)}
    assert early_halves & late_ends  # ends whose half an earlier run stored
    runs = [ingest(spark, settings, input_path=str(path)) for path in (early, late)]
    assert sum(run["rejected"] for run in runs) == 0
    assert sum(run["transaction_halves"] for run in runs) == len(broker.sends)
    ended = Counter(send["end"] for send in broker.sends)
    assert sum(run["transaction_commits"] for run in runs) == ended["COMMIT"]
    assert sum(run["transaction_rollbacks"] for run in runs) == ended["ROLLBACK"]
    rows = Lake.from_settings(settings, read_only=True).read_arrow("commitlog").to_pylist()
    ours = [{**row, "raw_properties": row["properties_bytes"]} for row in rows]
    theirs = broker.records

    def by_identity(records):
        found = {}
        for record in sorted(records, key=lambda r: r["physical_offset"]):
            if record["topic"] != OP_TOPIC:
                uniq = parse_properties(record["raw_properties"])["UNIQ_KEY"]
                found[(uniq, record["topic"] != HALF_TOPIC)] = record
        return found

    mine, their_records = by_identity(ours), by_identity(theirs)
    assert sorted(mine) == sorted(their_records)
    for identity, their in their_records.items():
        our = mine[identity]
        assert {k: our[k] for k in EXACT} == {k: their[k] for k in EXACT}, identity
        if identity[1]:  # a commit: at its half's offset, on its side
            half_record = mine[(identity[0], False)]
            assert our["prepared_transaction_offset"] == half_record["physical_offset"]
        else:
            assert our["queue_offset"] == their["queue_offset"], identity

    def commit_slots(records):
        return sorted((r["topic"], r["queue_id"], r["queue_offset"]) for (_, commit), r in records.items() if commit)

    assert commit_slots(mine) == commit_slots(their_records)
    our_ops = [r for r in ours if r["topic"] == OP_TOPIC]
    their_ops = [r for r in theirs if r["topic"] == OP_TOPIC]
    for op in our_ops:
        assert {k: op[k] for k in OP_EXACT} == {k: their_ops[0][k] for k in OP_EXACT}
        assert op["born_host"] == op["store_host"] == their_ops[0]["store_host"]
    named = sorted(o for op in our_ops for o in op_offsets(op["body"]))
    assert named == sorted(o for op in their_ops for o in op_offsets(op["body"]))
    assert len(our_ops) == ended["COMMIT"] + ended["ROLLBACK"]  # one op record per end


# -- the broker's store imported into a lake: everything downstream of ingest, on real halves, commits, op records


@pytest.fixture(scope="module")
def imported(spark, broker, tmp_path_factory) -> dict:
    """The broker's store imported (import-store), dispatched (reput) and exported again (export-store)."""
    root = tmp_path_factory.mktemp("transaction-lake")
    settings = lake_settings(root / "lake")
    result = import_store(spark, settings, store_dir=str(broker.store))
    assert result["corrupt_records"] == 0 and result["messages"] == len(broker.records), result
    reput(spark, settings)
    exported = export_store(spark, settings, out=str(root / "export"))
    return {"root": root, "settings": settings, "export": Path(exported["out"])}


def _sends(broker: transaction.BrokerRun, end: str) -> list[tuple[dict, dict]]:
    return [(s, r) for s, r in zip(broker.sends, broker.answer["sends"], strict=True) if s["end"] == end]


@pytest.mark.spark
def test_export_store_gives_the_brokers_commitlog_and_consume_queues_back_byte_for_byte(broker, imported):
    store, out = broker.store, imported["export"]

    def listing(base: Path, part: str) -> list[str]:
        return sorted(str(p.relative_to(base / part)) for p in (base / part).rglob("*") if p.is_file())

    for part in ("commitlog", "consumequeue"):
        names = listing(store, part)
        assert listing(out, part) == names, part
        for name in names:
            assert (out / part / name).read_bytes() == (store / part / name).read_bytes(), f"{part}/{name}"
    assert {f"{t}/0/00000000000000000000" for t in (HALF_TOPIC, OP_TOPIC)} <= set(listing(out, "consumequeue"))
    # the index file's bytes are the broker's; its name is the broker's wall clock when it created it
    (mine,), (theirs,) = listing(out, "index"), listing(store, "index")
    assert (out / "index" / mine).read_bytes() == (store / "index" / theirs).read_bytes()


@pytest.mark.spark
def test_reput_dispatches_the_half_and_op_topics_like_any_topic(broker, imported):
    lake = Lake.from_settings(imported["settings"], read_only=True)
    units = lake.read_arrow("consumequeue", columns=["topic", "queue_id", "queue_offset", "commitlog_offset"])
    by_topic = Counter(units.column("topic").to_pylist())
    ops = [r for r in broker.records if r["topic"] == OP_TOPIC]
    assert by_topic[HALF_TOPIC] == len(broker.sends) and by_topic[OP_TOPIC] == len(ops)
    assert by_topic[transaction.ORDERS] + by_topic[transaction.PAYMENTS] == len(_sends(broker, "COMMIT"))
    theirs = sorted((u["topic"], u["queue_id"], u["queue_offset"], u["commitlog_offset"]) for u in broker.units)
    assert sorted(tuple(u.values()) for u in units.to_pylist()) == theirs


@pytest.mark.spark
def test_query_shows_the_half_by_its_offset_msg_id_and_the_committed_message_by_key(broker, imported):
    with rmqlake.open(settings=imported["settings"]) as reader:
        for send, result in _sends(broker, "COMMIT"):
            stored_half = half_of(broker, result)
            msg_id = offset_msg_id(parse_host(stored_half["store_host"]), stored_half["physical_offset"])
            (shown,) = reader.query_msgid(msg_id).to_pylist()
            assert (shown["topic"], shown["physical_offset"]) == (HALF_TOPIC, stored_half["physical_offset"])
            if not send.get("keys"):
                continue
            found = reader.query_key(send["topic"], send["keys"].split()[0]).to_pylist()
            # the commit re-put only ("Aa BB": two keys of one hash, so the lookup meets its entry twice)
            assert {(m["topic"], m["uniq_key"], m["sys_flag"] & 0xC) for m in found} == {
                (send["topic"], result["msgId"], TRANSACTION_COMMIT_TYPE)
            }, send
        for send, _ in _sends(broker, "ROLLBACK") + _sends(broker, "UNKNOWN"):
            if send.get("keys"):  # the half is on the half topic only: nothing on the real topic
                assert reader.query_key(send["topic"], send["keys"].split()[0]).num_rows == 0, send


@pytest.mark.spark
def test_status_lists_the_open_transactions_per_real_topic_with_the_oldest(broker, imported, capsys):
    open_halves = [half_of(broker, result) for _, result in _sends(broker, "UNKNOWN")]
    oldest = min(open_halves, key=lambda h: h["store_timestamp"])
    expected = sorted(
        (topic, sum(1 for h in open_halves if h["properties"]["REAL_TOPIC"] == topic))
        for topic in {h["properties"]["REAL_TOPIC"] for h in open_halves}
    )
    assert len(expected) == 2  # one open on each topic
    report = status(imported["settings"])
    assert [(t["topic"], t["open"]) for t in report["transactions"]] == expected
    for row in report["transactions"]:
        first = min((h for h in open_halves if h["properties"]["REAL_TOPIC"] == row["topic"]),
                    key=lambda h: h["store_timestamp"])  # fmt: skip
        assert (row["oldest_uniq_key"], row["oldest_store_timestamp"]) == (
            first["properties"]["UNIQ_KEY"],
            first["store_timestamp"],
        )
        assert row["oldest_store_time"] == iso(first["store_timestamp"])
    store = report["store"]
    assert store["open_transactions"] == len(open_halves)
    assert (store["oldest_open_transaction"], store["oldest_open_transaction_uniq_key"]) == (
        iso(oldest["store_timestamp"]), oldest["properties"]["UNIQ_KEY"]
    )  # fmt: skip
    with rmqlake.open(settings=imported["settings"]) as reader:
        assert reader.status()["transactions"].to_pylist() == report["transactions"]
    lake = str(imported["settings"].lake.root)
    assert main(["status", "--json", "--conf", str(CONF), "--env", "test", "--lake", lake]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line for line in lines if line["kind"] == "transaction"] == [
        {"kind": "transaction", **row} for row in report["transactions"]
    ]


def _problems(frame) -> dict[str, list[str]]:
    """The problem columns' values (one small row per commit or named half, never a message row)."""
    names = ("commit_problem", "op_entry_problem", "repeated_end_problem")
    return {n: sorted(r[0] for r in frame.where(F.col(n).isNotNull()).select(n).collect()) for n in names}


@pytest.mark.spark
def test_the_transaction_suites_pass_on_the_brokers_store(spark, imported):
    checked = quality(spark, imported["settings"], suites=["transactions"])
    assert {s["suite"]: (s["failed"], s["rows"]) for s in checked["suites"]} == {
        "transactions.critical": (0, 7 + 10),  # a row per commit re-put and per half an op entry names
        "transactions.warning": (0, 7 + 10),
    }


@pytest.mark.spark
def test_the_transaction_suites_name_a_commit_without_its_half_a_stray_op_entry_and_a_second_end(
    spark, broker, imported, tmp_path
):
    lake = Lake.from_settings(imported["settings"], read_only=True)
    tables = suite_inputs(spark, lake, lake.state(), ["commitlog"])
    commitlog = tables["commitlog"]
    send, result = _sends(broker, "COMMIT")[1]
    dropped = half_of(broker, result)
    (reput_commit,) = (r for r in records_of(broker, result["msgId"]) if r["topic"] != HALF_TOPIC)
    other_commit = next(r for r in broker.records if r["topic"] != HALF_TOPIC and r["sys_flag"] & 0xC == 8
                        and r["physical_offset"] != reput_commit["physical_offset"])  # fmt: skip
    # the broker groups op entries into one op record or several, as its op queue's timing falls: the
    # first one gets two entries more, a half no record has (99) and a second end of half 0
    ops = sorted((r for r in broker.records if r["topic"] == OP_TOPIC), key=lambda r: r["physical_offset"])
    extended = ops[0]["physical_offset"]
    op = F.col("physical_offset") == extended
    is_other = F.col("physical_offset") == other_commit["physical_offset"]
    broken = (
        commitlog.where(F.col("physical_offset") != dropped["physical_offset"])  # a committed half gone
        .withColumn("body", F.when(op, F.concat("body", F.lit(b"99,0,"))).otherwise(F.col("body")))
        # a store-level COMMIT (no TRAN_MSG) pointing nowhere: not a re-put, not checked
        .withColumn("properties", F.when(is_other, F.map_filter("properties", lambda k, v: k != "TRAN_MSG"))
                    .otherwise(F.col("properties")))
        .withColumn("prepared_transaction_offset", F.when(is_other, F.lit(123456789)).otherwise(
                    F.col("prepared_transaction_offset")))
    )  # fmt: skip
    commit_text = (
        f"commit {send['topic']} queue {result['queueId']} offset {reput_commit['queue_offset']} at physical offset "
        f"{reput_commit['physical_offset']} (uniq key {result['msgId']})"
    )
    bodies = {r["physical_offset"]: op_offsets(r["body"]) for r in ops}
    bodies[extended] = [*bodies[extended], 99, 0]

    def named(offset: int) -> str:
        naming = ", ".join(str(at) for at in sorted(bodies) if offset in bodies[at])
        return f"half queue 0 offset {offset}, named by the op record(s) at physical offset {naming}"

    assert sum(offsets.count(0) for offsets in bodies.values()) == 2
    assert _problems(frames.transaction_frame(broken, min_physical_offset=0)) == {
        "commit_problem": [
            f"{commit_text}: prepared_transaction_offset {dropped['physical_offset']} is not a record on {HALF_TOPIC}"
        ],
        "op_entry_problem": sorted(
            f"{named(offset)}: no record on {HALF_TOPIC} has that queue offset"
            for offset in (dropped["queue_offset"], 99)
        ),
        "repeated_end_problem": [f"{named(0)}: ended 2 times"],
    }
    # through Great Expectations: the critical suite fails, its unexpected values name the records
    suite = SUITES["transactions.critical"]
    context = _context(tmp_path / "gx")
    checked = _validate(
        context,
        spark_source(context),
        suite,
        suite.expectations(imported["settings"]),
        suite.frame({**tables, "commitlog": broken}, imported["settings"]),
        imported["settings"],
    )
    failed = {r.expectation_config.kwargs["column"]: r.result["partial_unexpected_list"]
              for r in checked.results if not r.success}  # fmt: skip
    assert set(failed) == {"commit_problem", "op_entry_problem"}
    assert any(commit_text in text for text in failed["commit_problem"])


@pytest.mark.spark
def test_halves_gone_with_expired_segments_are_not_problems(spark, broker, imported):
    """As after expiry: everything below a committed half deleted, op entries and commits naming older halves stay."""
    lake = Lake.from_settings(imported["settings"], read_only=True)
    commitlog = suite_inputs(spark, lake, lake.state(), ["commitlog"])["commitlog"]
    last_commit = next(r for r in reversed(broker.records) if r["prepared_transaction_offset"] > 0)
    # the first record after the last commit's half: that half is deleted, the commit is not
    cut = min(
        r["physical_offset"]
        for r in broker.records
        if r["physical_offset"] > last_commit["prepared_transaction_offset"]
    )
    assert cut <= last_commit["physical_offset"]
    left = commitlog.where(F.col("physical_offset") >= cut)
    assert _problems(frames.transaction_frame(left, min_physical_offset=cut)) == {
        "commit_problem": [], "op_entry_problem": [], "repeated_end_problem": []
    }  # fmt: skip
    # the same records without a deletion to explain them: the halves are missing
    missing = _problems(frames.transaction_frame(left, min_physical_offset=0))
    assert missing["commit_problem"] and missing["op_entry_problem"]


@pytest.mark.spark
def test_compaction_keeps_commits_only_and_expiry_deletes_open_halves_with_their_segment(spark, broker, imported):
    """On a copy of the lake: TxOrders made a COMPACTION topic, and plain messages after the broker's records
    seal its segment, which expiry then deletes with the open halves in it (as a broker deletes them)."""
    root = imported["root"] / "expired"
    shutil.copytree(imported["settings"].lake.root, root / "lake")
    orders = f"topics.{transaction.ORDERS}"
    settings = lake_settings(
        root / "lake",
        f"{orders}.queues={transaction.TOPICS[transaction.ORDERS]}",
        f"{orders}.cleanup_policy=COMPACTION",
    )
    last = max(r["store_timestamp"] for r in broker.records)
    lines = [
        {"topic": "TxFiller", "queueId": 0, "body": "x" * 400, "bornTimestamp": last, "storeTimestamp": last + i}
        for i in range(150)
    ]
    (root / "in").mkdir()
    (root / "in" / "filler.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert ingest(spark, settings, input_path=str(root / "in"))["rejected"] == 0
    reput(spark, settings)

    compacted = compact(spark, settings)
    kept = Lake.from_settings(settings, read_only=True).read_arrow("compaction_log").to_pylist()
    keyed = {r["msgId"] for s, r in _sends(broker, "COMMIT") if s["topic"] == transaction.ORDERS and s.get("keys")}
    assert compacted["messages_kept"] == len(kept) == len(keyed) > 0  # each commit's keys are its own
    assert {(m["topic"], m["sys_flag"] & 0xC, m["uniq_key"]) for m in kept} == {
        (transaction.ORDERS, TRANSACTION_COMMIT_TYPE, key) for key in keyed
    }  # the halves stay on the half topic, never compacted

    before = status(settings)["store"]["open_transactions"]
    expired = expire(spark, settings, now=datetime(2100, 1, 1, 4, tzinfo=UTC))
    assert expired["segments_deleted"] == 1 and expired["min_physical_offset"] == data.SEGMENT
    assert expired["open_transactions_deleted"] == before == len(_sends(broker, "UNKNOWN"))
    after = status(settings)
    assert after["transactions"] == [] and after["store"]["open_transactions"] == 0
    checked = quality(spark, settings, suites=["transactions"])
    assert {s["suite"]: s["failed"] for s in checked["suites"]} == {
        "transactions.critical": 0,
        "transactions.warning": 0,
    }
