"""Line validation: every class of bad input gets a reason naming what is wrong."""

from __future__ import annotations

import json

import pytest

from rmqlake.ingest.lines import ParseOptions, Rejection, parse_line

OPTIONS = ParseOptions(
    queue_counts={"Orders": 8, "Profiles": 4},
    default_queue_count=4,
    compaction_topics=frozenset({"Profiles"}),
    max_message_size=1024,
    segment_size=65536,
    cluster_name="DefaultCluster",
    default_store_host="10.0.0.5:10911",
    default_born_host="127.0.0.1:49152",
    timezone="UTC",
)
GOOD = {"topic": "Orders", "body": "hello", "bornTimestamp": 1700000000000}


def parse(doc, options=OPTIONS):
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return parse_line(raw, options=options, source_line=7, file_hash32=0x12345678)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"topic": "Orders", "body": "x"', "malformed JSON: Expecting ',' delimiter"),
        (b"[1, 2]", "a line must be a JSON object, got list"),
        (b"", "empty line"),
        (b"   ", "empty line"),
        (b'{"topic": "Orders", "body": "\xff"}', "line is not valid UTF-8 \\(byte 29\\)"),
        ({"body": "x", "bornTimestamp": 1}, "missing required field 'topic'"),
        ({"topic": "Orders", "bornTimestamp": 1}, "missing required field 'body'"),
        ({"topic": "Orders", "body": "x"}, "missing required field 'bornTimestamp'"),
        ({**GOOD, "bornTimestamp": "1700000000000"}, "field 'bornTimestamp' must be an integer, got str"),
        ({**GOOD, "bornTimestamp": True}, "field 'bornTimestamp' must be an integer, got bool"),
        ({**GOOD, "bornTimestamp": -1}, "field 'bornTimestamp' = -1 is outside 0.."),
        ({**GOOD, "bornTimestamp": 2**63 - 1}, "is past the year 9999, so no UNIQ_KEY can be generated"),
        ({**GOOD, "body": 5}, "field 'body' must be a string, got int"),
        ({**GOOD, "flag": 2**31}, "field 'flag' = 2147483648 is outside -2147483648..2147483647"),
        ({**GOOD, "topic": "Orders/EU"}, "topic 'Orders/EU' has characters outside"),
        ({**GOOD, "topic": ""}, "topic is blank"),
        ({**GOOD, "topic": "T" * 128}, "topic is 128 bytes long, the maximum is 127"),
        ({**GOOD, "topic": "%RETRY%" + "g" * 249}, "retry topic is 256 bytes long, the maximum is 255"),
        ({**GOOD, "body": "x" * 1025}, "body of 1025 bytes exceeds store.max_message_size 1024"),
        ({**GOOD, "properties": {"p": "v" * 32767}}, "properties of 32\\d+ bytes exceed the maximum 32767"),
        ({**GOOD, "properties": {"p": 1}}, "property 'p' must be a string, got int"),
        ({**GOOD, "properties": ["p"]}, "field 'properties' must be an object of strings"),
        ({**GOOD, "properties": {"p": "a\u0002b"}}, "property 'p' contains a property separator byte"),
        ({**GOOD, "queueId": 8}, "queueId 8 is out of range for topic 'Orders' with 8 queues"),
        ({**GOOD, "queueId": -1}, "queueId -1 is out of range"),
        ({**GOOD, "topic": "Profiles"}, "topic 'Profiles' has cleanup.policy COMPACTION and the message has no keys"),
        ({**GOOD, "topic": "Profiles", "keys": "   "}, "COMPACTION and the message has no keys"),
        ({**GOOD, "body": "!!", "bodyEncoding": "base64"}, "field 'body' is not valid base64"),
        ({**GOOD, "bodyEncoding": "latin1"}, "field 'bodyEncoding' must be 'utf8' or 'base64', got 'latin1'"),
        ({**GOOD, "bornHost": "10.0.0.999:1"}, "host address is not an IPv4 or IPv6 address: '10.0.0.999:1'"),
        ({**GOOD, "storeHost": "10.0.0.1"}, "host must be 'ip:port'"),
        ({**GOOD, "transaction": "HALF"}, "field 'transaction' must be one of NOT_TYPE, PREPARED, COMMIT, ROLLBACK"),
        ({**GOOD, "keys": ["a b"]}, "key 'a b' in the 'keys' list contains a space"),
        ({**GOOD, "keys": 5}, "field 'keys' must be a string or a list of strings, got int"),
        ({**GOOD, "body": "\ud800"}, "lone UTF-16 surrogate"),
    ],
)
def test_bad_lines_are_rejected_with_a_reason(line, reason):
    with pytest.raises(Rejection, match=reason):
        parse(line)


DEEP = b"[" * 1000 + b"]" * 1000
LONG_INTEGER = b"9" * 4301  # one digit more than int() converts by default


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({**GOOD, "topic": "Orders\n"}, r"topic 'Orders\\n' has characters outside"),  # "$" matches before a final \n
        ({**GOOD, "bornHost": "1.2.3.4:\u0668\u0660"}, "host port must be a number of ASCII digits"),
        ({**GOOD, "storeHost": "2001:db8::1:80"}, r"an IPv6 host must be written '\[ipv6\]:port' \(with brackets\)"),
        (b'{"topic": "Orders", "body": "x", "bornTimestamp": ' + LONG_INTEGER + b"}", "field 'bornTimestamp' is an "),
        (
            b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": [1, ' + LONG_INTEGER + b"]}",
            r"field 'extra'\[1\] is an integer of 4301 digits, more than the 4300 that can be read",
        ),
        (b'{"topic": "Orders", "body": ' + LONG_INTEGER + b', "bornTimestamp": 5}', "field 'body' is an integer"),
        (b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": ' + DEEP + b"}", "JSON nested too deeply"),
        (b'{"topic": "Orders", "body": ' + DEEP + b', "bornTimestamp": 5}', "JSON nested too deeply"),
        (b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "properties": ' + DEEP + b"}", "nested too deeply"),
        (b"[" * 5000, "JSON nested too deeply: more than 100 levels"),
        (b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": NaN}', r"NaN is not JSON"),
        (b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "flag": -Infinity}', r"-Infinity is not JSON"),
        (b'\xef\xbb\xbf{"topic": "Orders", "body": "x", "bornTimestamp": 5}', "byte order mark"),
    ],
)
def test_hostile_lines_are_rejected_not_raised(line, reason):
    with pytest.raises(Rejection, match=reason):
        parse(line)


def test_brackets_inside_strings_do_not_count_as_nesting():
    body = "[" * 500 + '"{' * 200
    assert parse({**GOOD, "body": body, "extra": {"a": [[1]]}}).body == body.encode()


def test_unknown_topic_is_rejected_only_without_auto_create():
    assert parse({**GOOD, "topic": "NewTopic"}).topic == "NewTopic"
    strict = ParseOptions(**{**OPTIONS.__dict__, "default_queue_count": None})
    with pytest.raises(
        Rejection, match=r"'NewTopic' is not in topics\.yaml and broker\.auto_create_topic_enable is false"
    ):
        parse({**GOOD, "topic": "NewTopic"}, strict)


@pytest.mark.parametrize(
    "change", [{"queue_counts": {"Orders": 8, "Profiles": 0}}, {"default_queue_count": 0}], ids=["topic", "default"]
)
def test_options_with_a_topic_without_queues_are_refused(change):
    # a key's queue is its hash modulo the count: options built in code cannot reach a division by zero
    with pytest.raises(ValueError, match="every topic needs at least one queue"):
        ParseOptions(**{**OPTIONS.__dict__, **change})


def test_record_that_cannot_fit_a_segment_is_rejected():
    small = ParseOptions(**{**OPTIONS.__dict__, "segment_size": 200})
    with pytest.raises(Rejection, match=r"record of 2\d\d bytes cannot fit a commitlog segment of 200 bytes"):
        parse({**GOOD, "body": "x" * 100}, small)


def test_valid_line_gets_broker_fields():
    message = parse({**GOOD, "keys": ["k1", "k2"], "tags": "TagA", "properties": {"empty": "", "a": "1"}})
    assert message.keys == ["k1", "k2"]
    properties = dict(message.properties)
    assert properties["KEYS"] == "k1 k2"
    assert properties["CLUSTER"] == "DefaultCluster"
    assert "empty" not in properties  # the broker's parser drops empty values
    assert message.queue_id is not None  # chosen by the KEYS hash
    assert message.store_timestamp == message.born_timestamp
    assert message.store_host == "10.0.0.5:10911" and message.store_host_prefix == "0A00000500002A9F"
    assert message.total_size == len(message.body) + len(message.topic) + len(message.properties_bytes) + 91
    assert len(message.uniq_key) == 32 and message.uniq_key.startswith("7F000001" + "1234" + "12345678")


def test_keyless_message_without_queue_is_left_for_round_robin():
    assert parse(GOOD).queue_id is None
    assert parse({**GOOD, "queueId": 3}).queue_id == 3


# A line takes msgspec's typed route unless msgspec refuses it; the json route then decides. Either way the
# outcome must be what the json route alone gives.
EQUIVALENT_LINES = [
    json.dumps({**GOOD, "keys": ["k1", "k2"], "tags": "T", "properties": {"a": "1", "b": "2"}}).encode(),
    json.dumps({**GOOD, "extra": {"nested": [1, 2.5, None]}}).encode(),  # unknown field: json route, accepted
    json.dumps({**GOOD, "body": 'quote " and \\ backslash'}).encode(),  # escaped body: json route
    json.dumps({**GOOD, "body": "\u00e9t\u00e9 😀"}, ensure_ascii=False).encode(),  # plain multibyte body
    json.dumps({**GOOD, "body": "\u00e9t\u00e9 😀"}).encode(),  # the same body escaped
    json.dumps({**GOOD, "body": "aGVsbG8=", "bodyEncoding": "base64"}).encode(),
    json.dumps({**GOOD, "body": "aGVsbG8", "bodyEncoding": "base64"}).encode(),  # bad base64
    json.dumps({**GOOD, "body": None}).encode(),
    b'{"topic": "Orders", "topic": "Profiles", "keys": "k", "body": "x", "bornTimestamp": 5}',  # last name wins
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": NaN}',  # NaN is not JSON, even where ignored
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": "\xff"}',  # bad UTF-8 in a skipped field
    b'{"topic": "Orders", "body": "\xe9", "bornTimestamp": 5}',  # bad UTF-8 in the body
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "extra": "\\ud800"}',  # lone surrogate, unknown field
    b'\xef\xbb\xbf{"topic": "Orders", "body": "x", "bornTimestamp": 5}',  # BOM
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5} ',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5.0}',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 99999999999999999999}',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "queueId": 2, "flag": -3, "reconsumeTimes": 1}',
    b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "transaction": "PREPARED", "storeHost": "[::1]:1"}',
]


def _outcome(route, raw):
    try:
        return route(raw)
    except Rejection as exc:
        return f"rejected: {exc}"


@pytest.mark.parametrize("raw", EQUIVALENT_LINES)
def test_typed_route_and_json_route_agree(raw):
    from rmqlake.ingest.lines import _fields_from_json, line_parser

    parser = line_parser(OPTIONS)

    def json_only(line):
        fields = _fields_from_json(line)
        body = None if fields.body is None else fields.body.encode("utf-8")
        return parser._message(fields, body, 7, 0x12345678)

    def both(line):
        return parse(line)

    assert _outcome(both, raw) == _outcome(json_only, raw)


def test_plain_lines_take_the_typed_route():
    from rmqlake.ingest.lines import _decode_typed, _plain_string

    fields = _decode_typed(EQUIVALENT_LINES[0])
    assert fields is not None and _plain_string(fields.body) == b"hello"
    assert _plain_string(_decode_typed(EQUIVALENT_LINES[3]).body) == "\u00e9t\u00e9 😀".encode()
    assert _decode_typed(EQUIVALENT_LINES[1]) is None  # unknown field
    assert _plain_string(_decode_typed(EQUIVALENT_LINES[2]).body) is None  # escapes


def test_a_long_integer_before_malformed_json_is_malformed_json():
    line = b'{"topic": "Orders", "body": "x", "bornTimestamp": ' + LONG_INTEGER + b', "flag": }'
    with pytest.raises(Rejection, match="malformed JSON: Expecting value"):
        parse(line)
