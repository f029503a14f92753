"""consumerOffset.json snapshots: the broker's fastjson shape, strict JSON, errors, snapshot times."""

from __future__ import annotations

import json

import pytest

from rmqlake.consumer_offsets import OffsetRow, parse_snapshot, snapshot_time
from rmqlake.errors import InputError
from rmqlake.generate import CONSUMER_GROUPS, TopicPlan, generate
from rmqlake.timeutil import parse_timestamp

BROKER_WRITTEN = """{
\t"dataVersion":{"counter":12,"stateVersion":0,"timestamp":1763697600000},
\t"offsetTable":{
\t\t"OrderEvents@cg_billing":{0:250,1:251,10:7},
\t\t"%RETRY%cg_billing@cg_billing":{0:3}
\t}
}"""


def test_fastjson_unquoted_queue_ids_and_strict_json_give_the_same_rows():
    rows = parse_snapshot(BROKER_WRITTEN, path="c.json")
    assert rows == [
        OffsetRow("OrderEvents", "cg_billing", 0, 250),
        OffsetRow("OrderEvents", "cg_billing", 1, 251),
        OffsetRow("OrderEvents", "cg_billing", 10, 7),
        OffsetRow("%RETRY%cg_billing", "cg_billing", 0, 3),
    ]
    strict = {
        "offsetTable": {
            "OrderEvents@cg_billing": {"0": 250, "1": 251, "10": 7},
            "%RETRY%cg_billing@cg_billing": {"0": 3},
        }
    }
    assert parse_snapshot(json.dumps(strict), path="c.json") == rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"offsetTable":{"A@g":{0:1}', "c.json: line 1 column 28"),
        ('{"other":{}}', 'no "offsetTable"'),
        ('{"offsetTable":{"nogroup":{0:1}}}', "'nogroup' is not '<topic>@<group>'"),
        ('{"offsetTable":{"A@g":{0:"x"}}}', "is not int -> int"),
    ],
)
def test_bad_snapshots_name_the_file_and_the_reason(text, message):
    with pytest.raises(InputError, match=message):
        parse_snapshot(text, path="c.json")


def test_snapshot_time_from_the_file_name():
    expected = parse_timestamp("2026-11-21T04:00:00Z")
    assert snapshot_time("/x/consumerOffset-20261121T040000Z.json") == expected
    assert snapshot_time("consumerOffset.2026-11-21T04:00:00Z.json") == expected
    assert snapshot_time("consumerOffset.json.1763697600000") == 1763697600000
    assert snapshot_time("consumerOffset.json") is None


def test_generated_snapshots_parse_and_grow_hour_by_hour(tmp_path):
    topics = [TopicPlan("OrderEvents", 8, False), TopicPlan("UserProfile", 4, True)]
    summary = generate(tmp_path, messages=400, topics=topics, hours=3, seed=3)
    assert len(summary["offset_snapshots"]) == 3
    totals = []
    for name in summary["offset_snapshots"]:
        rows = parse_snapshot((tmp_path / name).read_text(), path=name)
        assert {r.group for r in rows} == {g for g, _ in CONSUMER_GROUPS}
        totals.append(sum(r.offset for r in rows))
        assert snapshot_time(name) is not None
    assert totals == sorted(totals) and totals[-1] > 0
