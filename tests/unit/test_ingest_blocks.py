"""The column-wise route (ingest.blocks) gives, line for line, what the per-line parser gives.

The per-line parser is the reference (its rules are tested against the
spec in test_ingest_lines.py). Every line here is parsed both ways, in
blocks of several shapes (alone, among clean lines, all together), so the
column-wise path is checked both where it decides and where it must hand a
line over.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import pytest

from rmqlake.generate import TopicPlan, generate
from rmqlake.ingest.blocks import parse_block
from rmqlake.ingest.lines import EndTransaction, ParseOptions, Rejection, line_parser, parse_line
from rmqlake.ingest.parse import parse_lines

OPTIONS = ParseOptions(
    queue_counts={"Orders": 8, "Profiles": 4, "%RETRY%" + "g" * 150: 1},
    default_queue_count=4,
    compaction_topics=frozenset({"Profiles"}),
    max_message_size=4096,
    segment_size=65536,
    cluster_name="DefaultCluster",
    default_store_host="10.0.0.5:10911",
    default_born_host="127.0.0.1:49152",
    timezone="UTC",
)
SHANGHAI = ParseOptions(**{**OPTIONS.__dict__, "timezone": "Asia/Shanghai", "cluster_name": ""})
SMALL_SEGMENTS = ParseOptions(**{**OPTIONS.__dict__, "segment_size": 4096})  # records over 4088 bytes cannot fit
HASH32 = 0x9E3779B9
GOOD = {"topic": "Orders", "body": "hello", "bornTimestamp": 1795219200000}
LATE_IN_MONTH = 1796860800000 + 86_399_000  # 2026-12-10T23:59:59Z: ms since the month start still fit an int
WRAPPED = 1798675200000  # 2026-12-31: ms since the month start wrap past Java's int range


def line(**changes) -> bytes:
    doc = {**GOOD, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not _DROP}, ensure_ascii=False).encode()


_DROP = object()

CORNER_LINES = [
    line(),
    line(body=""),
    line(body="été 😀 订单"),
    line(body='say "hi"\n'),  # escapes: the json route
    b'{"topic": "Orders", "body": "\\u00e9t\\u00e9", "bornTimestamp": 5}',
    line(body=base64.b64encode(b"\x00\xffbinary").decode(), bodyEncoding="base64"),
    line(body="!!", bodyEncoding="base64"),
    line(body="aGk=", bodyEncoding="utf-8"),
    line(body="x", bodyEncoding="latin1"),
    line(body=None),
    line(body=5),
    line(body=_DROP),
    line(body="x" * 4097),
    line(body="x" * 4000),
    line(body="x" * 3900, properties={"p": "v" * 200}),
    line(keys="k1"),
    line(keys="  k1   k2 "),
    line(keys=""),
    line(keys="   "),
    line(keys=["a", "b"]),
    line(keys=["a b"]),
    line(keys=[]),
    line(keys=["", "x"]),
    line(keys="a\u0001b"),
    line(keys=[1]),
    line(keys="k1", queueId=3),
    line(queueId=7),
    line(queueId=8),
    line(queueId=-1),
    line(queueId=2**31),
    line(tags=""),
    line(tags="TagA"),
    line(tags="a\u0002"),
    line(uniqKey=""),
    line(uniqKey="7F00000112AB"),
    line(uniqKey="u\u0001"),
    line(properties={}),
    line(properties={"a": "1", "b": "2"}),
    line(properties={"b": "2", "a": "1"}),
    line(properties={"KEYS": "user"}),
    line(properties={"KEYS": "user"}, keys="field"),
    line(properties={"TAGS": "user"}, tags="field"),
    line(properties={"UNIQ_KEY": "user"}),
    line(properties={"CLUSTER": "user"}),
    line(properties={"a": ""}),
    line(properties={"": "v"}),
    line(properties={"a\u0001": "v"}),
    line(properties={"p": 1}),
    line(properties={f"p{i}": str(i) for i in range(120)}),  # past 96 names the HashMap doubles
    line(properties={"p": "v" * 32767}),
    line(properties={"名前": "値"}),
    line(topic="Profiles", keys="user-1"),
    line(topic="Profiles"),
    line(topic="Profiles", keys=" "),
    line(topic="AutoCreated"),
    line(topic="Bad/Topic"),
    line(topic=""),
    line(topic=None),
    line(topic="%RETRY%" + "g" * 150, reconsumeTimes=3),
    line(bornTimestamp=LATE_IN_MONTH),
    line(bornTimestamp=WRAPPED),
    line(bornTimestamp=0),
    line(bornTimestamp=-1),
    line(bornTimestamp=2**63 - 1),
    line(bornTimestamp=2**63),
    line(bornTimestamp="1"),
    line(bornTimestamp=_DROP),
    line(storeTimestamp=None),
    line(storeTimestamp=1795219200123),
    line(storeTimestamp=-5),
    line(flag=-(2**31)),
    line(flag=2**31),
    line(reconsumeTimes=-1),
    line(preparedTransactionOffset=12345),
    line(preparedTransactionOffset=-1),
    line(transaction="PREPARED"),
    line(transaction="COMMIT"),
    line(transaction="ROLLBACK"),
    line(transaction="NOT_TYPE"),
    line(transaction=""),
    line(transaction="BOGUS"),
    # transactional halves: re-routed by the per-line parser
    line(transaction="PREPARED", properties={"TRAN_MSG": "true", "PGROUP": "g"}),
    line(transaction="PREPARED", properties={"TRAN_MSG": "TRUE"}, queueId=3, keys="k1"),
    line(properties={"TRAN_MSG": "true"}),  # the broker decides by TRAN_MSG alone
    line(properties={"TRAN_MSG": "false"}),
    line(transaction="PREPARED", properties={"TRAN_MSG": "true"}, delayLevel=2),  # refused
    line(transaction="PREPARED", properties={"TRAN_MSG": "true", "DELAY": "3"}, reconsumeTimes=1),  # a retry
    line(topic="RMQ_SYS_TRANS_HALF_TOPIC"),  # sends to the transaction topics are refused
    line(topic="RMQ_SYS_TRANS_OP_HALF_TOPIC"),
    # end lines
    b'{"endTransaction": "COMMIT", "uniqKey": "AB12", "storeTimestamp": 5}',
    b'{"endTransaction": "ROLLBACK", "uniqKey": "AB12", "storeTimestamp": 5, "topic": "Orders", '
    b'"producerGroup": "g", "fromTransactionCheck": true}',
    b'{"endTransaction": "ABORT", "uniqKey": "AB12", "storeTimestamp": 5}',
    b'{"endTransaction": "COMMIT", "storeTimestamp": 5}',
    b'{"endTransaction": "COMMIT", "uniqKey": "AB12"}',
    b'{"endTransaction": "COMMIT", "uniqKey": "AB12", "storeTimestamp": 5, "body": "x"}',
    b'{"endTransaction": "COMMIT", "uniqKey": "AB12", "storeTimestamp": 5, "fromTransactionCheck": "yes"}',
    b'{"endTransaction": 1, "uniqKey": "AB12", "storeTimestamp": 5}',
    line(bornHost="[2001:db8::21]:50100"),
    line(storeHost="[::1]:10911"),
    line(bornHost=""),
    line(storeHost="host-without-port"),
    line(bornHost="10.1.0.11:50001", storeHost="10.0.0.6:10911"),
    b'{"topic": "Orders", "topic": "Profiles", "keys": "k", "body": "x", "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "tags": "\\ud800"}',
    b'{"topic": "Orders", "body": "\xff", "bornTimestamp": 5}',
    # bodies that are not UTF-8 as Python's strict codec decides: the per-line parser rejects them
    b'{"topic": "Orders", "body": "ok \xed\xa0\x80 surrogate", "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "\xc0\xaf overlong", "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "\xf4\x90\x80\x80 above U+10FFFF", "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "cut \xf0\x9f\x98", "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "\x80 lone continuation", "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "\xef\xbf\xbf\xf4\x8f\xbf\xbf edges", "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": 1}',
    b'{"topic": "Orders", "body": "x"',
    b"",
    b"[1]",
    # hostile input: each must be a reject with the same reason on both routes, never an exception
    line(topic="Orders\n"),
    line(bornHost="1.2.3.4:\u0668\u0660"),
    line(storeHost="2001:db8::1:80"),
    line(bornHost="[fe80::1%eth0]:80"),
    b'{"topic": "Orders", "body": "x", "bornTimestamp": ' + b"9" * 4301 + b"}",
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": ' + b"9" * 4301 + b"}",
    b'{"topic": "Orders", "body": ' + b"[" * 1000 + b"]" * 1000 + b', "bornTimestamp": 5}',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": ' + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}",
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "keys": ' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": NaN}',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": Infinity}',
    b'\xef\xbb\xbf{"topic": "Orders", "body": "x", "bornTimestamp": 5}',
]


def per_line(lines, first_line, options):
    outcomes = []
    for number, raw in enumerate(lines, start=first_line):
        try:
            parsed = parse_line(raw, options=options, source_line=number, file_hash32=HASH32)
        except Rejection as exc:
            outcomes.append(("rejected", str(exc)))
        else:
            outcomes.append(("end" if isinstance(parsed, EndTransaction) else "message", parsed._asdict()))
    return outcomes


def block_route(lines, first_line, options):
    batch = parse_lines(lines, source_file="f", first_line=first_line, file_hash32=HASH32, options=options)
    outcomes = []
    for number, row in enumerate(batch.to_pylist(), start=first_line):
        assert row["source_line"] == number
        if row["reject_reason"] is not None:
            assert row["raw"] is not None
            outcomes.append(("rejected", row["reject_reason"]))
        elif row["end_transaction"] is not None:
            end = EndTransaction(row["end_transaction"], row["uniq_key"], row["store_timestamp"], row["topic"],
                                 row["end_producer_group"], row["end_from_check"])  # fmt: skip
            outcomes.append(("end", end._asdict()))
        else:
            message = {name: row[name] for name in _MESSAGE_NAMES}
            outcomes.append(("message", message))
    return outcomes


_MESSAGE_NAMES = list(parse_line(line(), options=OPTIONS, source_line=1, file_hash32=0)._fields)


def assert_same(lines, *, first_line=1, options=OPTIONS):
    # Fresh options objects, so each route starts with empty caches (topics, hosts, layouts, sizes) and the block
    # route runs first: both meet every value for the first time in these lines.
    got = block_route(lines, first_line, dataclasses.replace(options))
    expected = per_line(lines, first_line, dataclasses.replace(options))
    for raw, want, have in zip(lines, expected, got, strict=True):
        assert have == want, raw[:200]


ALL_OPTIONS = pytest.mark.parametrize(
    "options", [OPTIONS, SHANGHAI, SMALL_SEGMENTS], ids=["utc", "shanghai-no-cluster", "small-segments"]
)
# Values Arrow will not hold as typed send their whole block to the per-line parser.
ARROW_REFUSED = (b"9223372036854775808", b"\\ud800")


@ALL_OPTIONS
def test_corner_lines_all_in_one_block(options):
    lines = [raw for raw in CORNER_LINES if not any(value in raw for value in ARROW_REFUSED)]
    assert_same(lines, options=options)
    decided = parse_block(line_parser(options), lines, first_line=1, file_hash32=HASH32)
    assert len(decided.accepted) > 40  # the column-wise route did the work, not only the per-line parser


@ALL_OPTIONS
def test_corner_lines_with_values_arrow_refuses(options):
    assert_same(CORNER_LINES, options=options)


@ALL_OPTIONS
@pytest.mark.parametrize("index", range(len(CORNER_LINES)))
def test_each_corner_line_among_clean_lines(index, options):
    clean = [line(keys=f"k{i}", tags="T", properties={"a": str(i)}) for i in range(5)]
    corner = CORNER_LINES[index]
    assert_same([*clean, corner, *clean], first_line=65530, options=options)  # the UNIQ_KEY counter wraps at 65536
    assert_same([corner, *clean], options=options)  # first in its block: the block meets it before any clean line


def test_generated_logs_with_bad_lines_of_every_kind(tmp_path: Path):
    topics = [TopicPlan("Orders", 8, False), TopicPlan("Profiles", 4, True), TopicPlan("Clicks", 4, False)]
    generate(tmp_path, messages=3000, topics=topics, hours=2, bad_rate=0.05, seed=17, max_message_size=4096)
    options = ParseOptions(**{**OPTIONS.__dict__, "queue_counts": {"Orders": 8, "Profiles": 4, "Clicks": 4}})
    files = sorted(tmp_path.rglob("*.jsonl"))
    assert files
    for path in files:
        lines = path.read_bytes().split(b"\n")[:-1]
        assert_same(lines, options=options)


# Lines of the common shapes, each of which the fast routes (column-wise, JVM) must take themselves.
CLEAN_LINES = [
    line(keys="k1", tags="T", properties={"a": "1"}),
    line(keys=["x", "y"], bornHost="[2001:db8::21]:50100", transaction="PREPARED"),
    line(body=base64.b64encode(b"\x00\x01").decode(), bodyEncoding="base64", queueId=1),
    line(body="été 😀", uniqKey="7F00000112AB", topic="%RETRY%" + "g" * 150),
    line(topic="Profiles", keys="user-1", bornTimestamp=WRAPPED),
]


def test_clean_lines_are_decided_column_wise():
    """The column-wise route must not quietly hand everything to the per-line parser."""
    clean = CLEAN_LINES
    decided = parse_block(line_parser(OPTIONS), clean * 3, first_line=1, file_hash32=HASH32)
    assert decided.undecided.tolist() == []
    assert decided.accepted.tolist() == list(range(15))
    unusual = parse_block(
        line_parser(OPTIONS), [clean[0], line(body='a "q"'), b"{", clean[0]], first_line=1, file_hash32=1
    )
    assert unusual.accepted.tolist() == [0, 3]
    assert unusual.undecided.tolist() == [1, 2]


def test_an_empty_block_is_an_empty_batch():
    batch = parse_lines([], source_file="f", first_line=1, file_hash32=HASH32, options=OPTIONS)
    assert (
        batch.num_rows == 0
        and batch.schema
        == parse_lines([line()], source_file="f", first_line=1, file_hash32=HASH32, options=OPTIONS).schema
    )


def test_message_columns_follow_the_parsed_message_fields():
    from rmqlake.ingest.message import MESSAGE_TYPES, ParsedMessage

    assert list(MESSAGE_TYPES) == list(ParsedMessage._fields)


def _strict_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_the_whole_array_utf8_check_agrees_with_python_value_by_value():
    """``all_utf8`` (the block route's one check of a block's bodies) against Python's strict codec, per value:
    a multi-byte character split across two values is two bad values, though the buffer is valid UTF-8."""
    import random

    import pyarrow as pa

    from rmqlake.ingest.blocks import all_utf8

    pieces = [b"a", b"", b"\xc3\xa9", b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xff", b"\x80", b"\xc0\xaf",
              b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf0\x9f", b"\x00",
              b"\xef\xbb\xbf", b"\xe0\x80\x80", b"\xf8\x88\x80\x80\x80"]  # fmt: skip
    generator = random.Random(23)
    for _ in range(400):
        values = [
            b"".join(generator.choices(pieces, k=generator.randrange(0, 6))) for _ in range(generator.randrange(1, 5))
        ]
        expected = all(_strict_utf8(value) for value in values)
        array = pa.array(values, pa.binary())
        assert all_utf8(array) == expected, values
        assert all_utf8(array.slice(1)) == all(_strict_utf8(value) for value in values[1:]), values
    split = pa.array([b"x\xe4\xb8", b"\xad"], pa.binary())  # the buffer "x中" is valid, the values are not
    assert not all_utf8(split)
