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
        ('{"offsetTable":{"A@g":{0:"x"}}}', r"offsetTable\['A@g'\]\[0\]: offset 'x' is not an integer 0\.\."),
        # hostile entries: each broker rule, and what json.loads alone raised or let through
        ('{"offsetTable":{"A@g":{0:9223372036854775808}}}', r"offset 9223372036854775808 is not an integer 0\.\."),
        ('{"offsetTable":{"A@g":{0:-1}}}', r"\[0\]: offset -1 is not an integer 0\.\.9223372036854775807"),
        ('{"offsetTable":{"A@g":{2147483648:1}}}', r"queue id '2147483648' is not an integer 0\.\.2147483647"),
        ('{"offsetTable":{"A@g":{-1:1}}}', r"queue id '-1' is not an integer 0\.\.2147483647"),
        ('{"offsetTable":{"A@g":{"\u0661":1}}}', r"queue id '\u0661' is not an integer"),  # Arabic-Indic one
        ('{"offsetTable":{"A@g":{0:' + "9" * 4301 + "}}}", r"\['offsetTable'\]\['A@g'\]\['0'\] is an integer of 4301"),
        ('{"offsetTable":' + "[" * 5000 + "]" * 5000 + "}", "JSON nested too deeply"),
        ('{"offsetTable":{"A@g":{0:NaN}}}', "NaN is not JSON"),
        ('{"offsetTable":{"../../x@g":{0:1}}}', r"key '\.\./\.\./x@g': topic '\.\./\.\./x' has characters outside"),
        ('{"offsetTable":{"A@../g":{0:1}}}', r"group '\.\./g' has characters outside"),
        ('{"offsetTable":{"A\\n@g":{0:1}}}', r"topic 'A\\n' has characters outside"),
        ('{"offsetTable":{"A@' + "g" * 256 + '":{0:1}}}', "group is 256 characters long, the maximum is 255"),
    ],
)
def test_bad_snapshots_name_the_file_and_the_reason(text, message):
    with pytest.raises(InputError, match=message):
        parse_snapshot(text, path="c.json")


def test_bytes_are_checked_as_utf8_and_a_leading_byte_order_mark_is_skipped():
    text = '{"offsetTable":{"A@g":{0:5}}}'
    assert parse_snapshot(b"\xef\xbb\xbf" + text.encode(), path="c.json") == [OffsetRow("A", "g", 0, 5)]
    with pytest.raises(InputError, match=r"c\.json: byte 2 \(line 2\) is not valid UTF-8"):
        parse_snapshot(b"{\n\xff" + text.encode(), path="c.json")


def test_a_name_with_an_impossible_time_is_refused():
    with pytest.raises(InputError, match="the time in the file name, 20261399T000000, is not a valid date"):
        snapshot_time("consumerOffset-20261399T000000Z.json")
    assert snapshot_time("consumerOffset-\u0662\u0660\u0662\u0666\u0661\u0661\u0662\u0661T040000Z.json") is None


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
