"""The broker's transactional-message rules (rmqlake.formats.transaction) on hand-made messages.

The real broker's store is the judge in tests/interop/test_transaction_from_rocketmq.py; these pin
the edges a producer rarely reaches.
"""

from __future__ import annotations

import pytest

from rmqlake.formats.properties import broker_properties, hashmap_order
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    transaction_type,
)
from rmqlake.formats.transaction import (
    HALF_TOPIC,
    OP_TOPIC,
    TRANSACTION_ID,
    EndRefused,
    commit,
    end_refusal,
    half,
    is_half_send,
    op_offsets,
    op_properties,
    op_records,
)

SENT = broker_properties(
    {"TRAN_MSG": "true", "PGROUP": "pg", "color": "red"},
    keys="k1 k2",
    tags="TagA",
    uniq_key="7F0000010001",
    cluster_name="DefaultCluster",
)


def test_a_send_is_a_half_when_tran_msg_parses_as_true():
    assert is_half_send([("TRAN_MSG", "true")])
    assert is_half_send([("TRAN_MSG", "TRUE")])  # Boolean.parseBoolean ignores case
    assert not is_half_send([("TRAN_MSG", "yes")])
    assert not is_half_send([])
    # a pre-4.6.1 client's retry: reconsumed and delayed, stored as sent
    assert not is_half_send([("TRAN_MSG", "true"), ("DELAY", "3")], reconsume_times=1)
    assert is_half_send([("TRAN_MSG", "true"), ("DELAY", "3")], reconsume_times=0)


def test_the_half_goes_to_queue_0_of_the_half_topic_with_its_real_topic_and_queue():
    stored = half("Orders", 3, SENT, sys_flag=TRANSACTION_PREPARED_TYPE | BORNHOST_V6_FLAG)
    assert (stored.topic, stored.queue_id) == (HALF_TOPIC, 0)
    assert transaction_type(stored.sys_flag) == TRANSACTION_NOT_TYPE
    assert stored.sys_flag & BORNHOST_V6_FLAG  # only the transaction bits are reset
    pairs = dict(stored.properties)
    assert pairs["REAL_TOPIC"] == "Orders" and pairs["REAL_QID"] == "3"
    assert pairs[TRANSACTION_ID] == pairs["UNIQ_KEY"] == "7F0000010001"
    assert stored.properties == hashmap_order([*SENT, (TRANSACTION_ID, "7F0000010001"), ("REAL_TOPIC", "Orders"),
                                               ("REAL_QID", "3")])  # fmt: skip


def test_a_half_without_uniq_key_has_no_transaction_id():
    stored = half("Orders", 0, [("TRAN_MSG", "true")], sys_flag=TRANSACTION_PREPARED_TYPE)
    assert TRANSACTION_ID not in dict(stored.properties)


def test_a_commit_keeps_every_half_property_and_points_to_the_half():
    stored_half = half("Orders", 2, SENT, sys_flag=TRANSACTION_PREPARED_TYPE)
    stored = commit(stored_half.properties, half_sys_flag=stored_half.sys_flag, half_physical_offset=4096)
    assert (stored.topic, stored.queue_id) == ("Orders", 2)
    assert stored.properties == stored_half.properties
    assert transaction_type(stored.sys_flag) == TRANSACTION_COMMIT_TYPE
    assert stored.prepared_transaction_offset == 4096


@pytest.mark.parametrize("qid", [None, "x", "99999999999"])
def test_a_commit_of_a_half_without_a_real_queue_is_refused(qid):
    pairs = [("REAL_TOPIC", "Orders")] + ([] if qid is None else [("REAL_QID", qid)])
    with pytest.raises(EndRefused):
        commit(pairs, half_sys_flag=0, half_physical_offset=0)


def test_an_end_past_the_check_immunity_time_is_refused():
    pairs = [("CHECK_IMMUNITY_TIME_IN_SECONDS", "10")]
    assert end_refusal(pairs, born_timestamp=0, now_ms=10_000) is None
    assert end_refusal(pairs, born_timestamp=0, now_ms=10_001) is not None
    # never shorter than the transaction timeout; unparsable counts as 0
    assert end_refusal([("CHECK_IMMUNITY_TIME_IN_SECONDS", "1")], born_timestamp=0, now_ms=6000) is None
    assert end_refusal([("CHECK_IMMUNITY_TIME_IN_SECONDS", "soon")], born_timestamp=0, now_ms=6001) is not None
    assert end_refusal([], born_timestamp=0, now_ms=10**9) is None
    # the check-back may end it at any time
    assert end_refusal(pairs, born_timestamp=0, now_ms=10**9, from_transaction_check=True) is None


def test_an_end_from_another_producer_group_is_refused():
    pairs = [("PGROUP", "pg")]
    assert end_refusal(pairs, born_timestamp=0, now_ms=1, producer_group="pg") is None
    assert end_refusal(pairs, born_timestamp=0, now_ms=1, producer_group="other") is not None
    assert end_refusal([], born_timestamp=0, now_ms=1, producer_group="pg") is not None
    assert end_refusal(pairs, born_timestamp=0, now_ms=1) is None  # an end naming no group


def test_op_records_name_the_ended_halves_in_order():
    (record,) = op_records([5, 0, 12])
    assert (record.topic, record.queue_id, record.sys_flag) == (OP_TOPIC, 0, 0)
    assert record.body == b"5,0,12,"
    assert dict(record.properties) == {"TAGS": "d", "WAIT": "true"}
    assert record.properties == op_properties()
    assert op_offsets(record.body) == [5, 0, 12]


def test_op_records_are_cut_once_a_body_reaches_the_max_size():
    records = op_records(range(10), max_size=6)  # "0,1,2," is 6 characters
    assert [r.body for r in records] == [b"0,1,2,", b"3,4,5,", b"6,7,8,", b"9,"]
    assert [o for r in records for o in op_offsets(r.body)] == list(range(10))
