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

from collections import Counter

import pytest

from rmqlake.formats.consumequeue import tags_code
from rmqlake.formats.properties import broker_properties, serialize_properties
from rmqlake.formats.record import TRANSACTION_PREPARED_TYPE
from rmqlake.formats.transaction import (
    HALF_TOPIC,
    OP_TOPIC,
    commit,
    half,
    op_offsets,
    op_properties,
    op_records,
)
from tests.interop import data, transaction

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
