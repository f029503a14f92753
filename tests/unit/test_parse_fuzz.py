"""Seeded fuzzing of what users feed rmqlake without having written it: producer log lines, consumer offset
snapshots and configuration. Each parser either gives a value that keeps its rules or refuses with its own
error; nothing else may escape. Producer lines are parsed both ways (column-wise block route and per-line
parser), which must agree line for line.

Hypothesis runs derandomized (the same examples every run) with a bounded number of examples.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqlake.config import DRIVER_MEMORY_MIN_MIB, Settings, load_settings
from rmqlake.consumer_offsets import GROUP_MAX_LENGTH, OFFSET_MAX, QUEUE_ID_MAX, parse_snapshot
from rmqlake.errors import ConfigError, InputError
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.properties import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from rmqlake.formats.topic import VALID_TOPIC, topic_error
from tests.conftest import CONF
from tests.unit.test_ingest_blocks import OPTIONS, SHANGHAI, SMALL_SEGMENTS, WRAPPED, assert_same, block_route

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# -- what hostile text is made of ----------------------------------------------------------------

BOUNDARY_INTS = [0, 1, -1, 5, 7, 8, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, -(2**63), 2**64]
BOUNDARY_INTS += [1795219200000, WRAPPED, 253_402_300_800_000]
integers = st.sampled_from(BOUNDARY_INTS) | st.integers()
texts = st.text(
    st.characters(codec="utf-8") | st.sampled_from(["\x01", "\x02", " ", "\\", '"', "\ud800", "\u0668", "\ufeff"]),
    max_size=12,
)
json_values = st.recursive(
    st.none() | st.booleans() | integers | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
# Byte strings that broke parsers before: spliced into otherwise valid text.
HOSTILE_BYTES = [
    b"NaN",
    b"-Infinity",
    b"[" * 150,
    b"{" * 3 + b"[" * 120 + b"]" * 120,
    b"\xef\xbb\xbf",
    b"\xff",
    b"\xc3",
    b"\\",
    b'"',
    b"9" * 4301,
    b"\\ud800",
    b"\x00",
    b"\r",
    b",",
    b":",
    b"\xd9\xa8\xd9\xa0",  # Arabic-Indic "80"
]


# Values no serializer writes, spliced in where a value belongs: the parser meets them as values.
RAW_VALUES = [
    b"NaN",
    b"-Infinity",
    b"1e999",
    b"9" * 4301,
    b"-" + b"9" * 4400,
    b"[" * 1000 + b"]" * 1000,
    b'{"a":' * 600 + b"1" + b"}" * 600,
    b"[" * 99 + b"]" * 99,
    b"[" * 101 + b"]" * 101,
]
_RAW = "\u2063raw\u2063"  # a placeholder string that no strategy draws
_PLACEHOLDER = re.compile(b"|".join(re.escape(json.dumps(_RAW, ensure_ascii=a).encode()) for a in (True, False)))


@st.composite
def with_raw_values(draw, value):
    """``value`` with some leaves replaced by the placeholder of a raw value (see ``render_raw``)."""
    if isinstance(value, dict):
        return {key: draw(with_raw_values(inner)) for key, inner in value.items()}
    if isinstance(value, list):
        return [draw(with_raw_values(inner)) for inner in value]
    return _RAW if draw(st.integers(0, 9)) == 0 else value


def render_raw(text: str, raws: list[bytes]) -> bytes:
    """``text`` as UTF-8 with each quoted placeholder replaced by the next of ``raws``."""
    pieces = _PLACEHOLDER.split(text.encode("utf-8", "surrogatepass"))
    return b"".join(piece + (raws[i % len(raws)] if i < len(pieces) - 1 else b"") for i, piece in enumerate(pieces))


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` with up to three splices, deletions or truncations (never a newline: lines are split on it)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(out)))
        kind = draw(st.sampled_from(["insert", "delete", "truncate", "flip"]))
        if kind == "insert":
            out[at:at] = draw(st.sampled_from(HOSTILE_BYTES) | st.binary(max_size=4).filter(lambda b: b"\n" not in b))
        elif kind == "delete":
            del out[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del out[at:]
        elif out:
            spot = min(at, len(out) - 1)
            out[spot] = draw(st.integers(0, 255).filter(lambda b: b != 0x0A))
    return bytes(out)


# -- producer log lines: both routes agree, accepted messages keep the rules ----------------------

TOPICS = ["Orders", "Profiles", "AutoCreated", "%RETRY%" + "g" * 150, "", " ", "Orders\n", "Bad/Topic", "T" * 128]
HOSTS = [
    "10.0.0.5:10911",
    "[2001:db8::1]:80",
    "[::ffff:10.0.0.9]:7",
    "1.2.3.4:00080",
    "2001:db8::1:80",
    "1.2.3.4:\u0668\u0660",
    "[fe80::1%eth0]:80",
    "1.2.3.4:70000",
    "",
    "host:80",
]
FIELDS = {
    "topic": st.sampled_from(TOPICS) | texts,
    "body": texts | st.sampled_from(["aGk=", "!!", "", "x" * 4097]) | json_values,
    "bodyEncoding": st.sampled_from(["utf8", "utf-8", "base64", "latin1", ""]) | json_values,
    "keys": texts | st.lists(texts, max_size=3) | json_values,
    "tags": texts | json_values,
    "properties": st.dictionaries(texts, texts, max_size=3) | json_values,
    "uniqKey": texts | json_values,
    "queueId": integers | json_values,
    "flag": integers,
    "bornTimestamp": integers | json_values,
    "storeTimestamp": integers,
    "reconsumeTimes": integers,
    "preparedTransactionOffset": integers,
    "transaction": st.sampled_from(["NOT_TYPE", "PREPARED", "COMMIT", "ROLLBACK", "HALF", ""]) | json_values,
    "bornHost": st.sampled_from(HOSTS) | texts,
    "storeHost": st.sampled_from(HOSTS) | texts,
}


@st.composite
def producer_lines(draw) -> bytes:
    doc = {"topic": "Orders", "body": "hello", "bornTimestamp": 1795219200000}
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        doc[name] = draw(FIELDS[name])
    for name in draw(st.lists(st.sampled_from(["topic", "body", "bornTimestamp"]), max_size=1)):
        del doc[name]
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["extra", "delayLevel", "topic"]))] = draw(json_values)
    doc = draw(with_raw_values(doc))
    raws = draw(st.lists(st.sampled_from(RAW_VALUES), min_size=1, max_size=2))
    line = render_raw(json.dumps(doc, ensure_ascii=draw(st.booleans())), raws)
    return draw(mutated(line)) if draw(st.booleans()) else line


def _not_json(name: str):
    raise AssertionError(f"a line holding {name} was accepted")


@settings(FUZZ, max_examples=400)
@given(
    lines=st.lists(producer_lines(), min_size=1, max_size=6),
    first_line=st.sampled_from([1, 65534]),
    options=st.sampled_from([OPTIONS, SHANGHAI, SMALL_SEGMENTS]),
)
def test_fuzzed_producer_lines_get_the_same_outcome_on_both_routes(lines, first_line, options):
    assert_same(lines, first_line=first_line, options=options)  # any exception other than a reject fails here
    for raw, (outcome, value) in zip(lines, block_route(lines, first_line, options), strict=True):
        if outcome == "message":
            json.loads(raw.removeprefix(b"\xef\xbb\xbf"), parse_constant=_not_json)  # strict JSON only
            assert topic_error(value["topic"]) is None
            assert parse_host(value["born_host"]).text == value["born_host"]
            assert parse_host(value["store_host"]).text == value["store_host"]


# -- consumer offset snapshots ---------------------------------------------------------------------

OFFSET_KEYS = ["OrderEvents@cg_billing", "%RETRY%cg@cg", "../../x@g", "A@", "@g", "nogroup", "A\n@g", "A@g/h"]
OFFSET_KEYS += ["A@" + "g" * 256, "T" * 128 + "@g"]


def render(value, *, bare_keys: bool) -> str:
    """JSON, with integer map keys unquoted as fastjson writes them when ``bare_keys``."""
    if isinstance(value, dict):
        items = (
            (
                str(key) if bare_keys and isinstance(key, int) else json.dumps(str(key)),
                render(inner, bare_keys=bare_keys),
            )
            for key, inner in value.items()
        )
        return "{" + ",".join(f"{key}:{inner}" for key, inner in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(inner, bare_keys=bare_keys) for inner in value) + "]"
    return json.dumps(value, ensure_ascii=False)


snapshots = st.fixed_dictionaries(
    {
        "offsetTable": st.dictionaries(
            st.sampled_from(OFFSET_KEYS) | texts,
            st.dictionaries(integers, integers | json_values, max_size=3) | json_values,
            max_size=3,
        )
    },
    optional={"dataVersion": json_values},
)


def outcome(data: bytes):
    try:
        return parse_snapshot(data, path="c.json")
    except InputError as exc:
        assert str(exc).startswith("c.json")  # every refusal names the file
        return InputError


@settings(FUZZ, max_examples=300)
@given(document=snapshots, mutate=st.booleans(), data=st.data())
def test_fuzzed_offset_snapshots_load_valid_rows_or_are_refused(document, mutate, data):
    document = data.draw(with_raw_values(document))
    raws = data.draw(st.lists(st.sampled_from(RAW_VALUES), min_size=1, max_size=2))
    strict = render_raw(render(document, bare_keys=False), raws)
    broker = render_raw(render(document, bare_keys=True), raws)
    if mutate:
        text = data.draw(mutated(broker))
        rows = outcome(text)
    else:
        rows = outcome(broker)
        assert outcome(strict) == rows  # fastjson's bare keys and strict JSON mean the same
    if rows is InputError:
        return
    for row in rows:
        assert topic_error(row.topic) is None
        assert VALID_TOPIC.fullmatch(row.group) and len(row.group) <= GROUP_MAX_LENGTH
        assert 0 <= row.queue_id <= QUEUE_ID_MAX and 0 <= row.offset <= OFFSET_MAX


# -- configuration ---------------------------------------------------------------------------------


def _leaf_keys(model: type, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            keys += _leaf_keys(annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


CONF_KEYS = [*_leaf_keys(Settings), "topics.OrderEvents.queues", "topics.New.cleanup_policy", "topics.Or\\nders"]
YAML_VALUES = [
    "",
    "0",
    "-1",
    "2g",
    "256m",
    "xyz",
    "1e999",
    ".nan",
    "-.inf",
    "0x10",
    "true",
    "null",
    "~",
    "[1, 2]",
    "{a: 1}",
    "&a [*a]",
    "!!python/object/apply:os.system [ls]",
    "9" * 5000,
    "[" * 3000,
    "{a: " * 2000,
    '"\\x01"',
    "Main\x02",
    "\u0660\u0664",
    "10.0.0.1:\u0668\u0660",
    "2001:db8::1:80",
    "'unclosed",
    "04;25",
]
INT64 = range(-(2**63), 2**63)


@pytest.fixture(scope="module")
def conf_copy(tmp_path_factory):
    conf = tmp_path_factory.mktemp("fuzz") / "conf"
    shutil.copytree(CONF, conf)
    return conf


@settings(FUZZ, max_examples=200)
@given(
    overrides=st.lists(st.tuples(st.sampled_from(CONF_KEYS) | texts, st.sampled_from(YAML_VALUES) | texts), max_size=3),
    overlay=st.none()
    | st.dictionaries(st.sampled_from(["store", "spark", "broker", "hosts", "topics", "x"]), json_values),
    data=st.data(),
)
def test_fuzzed_configuration_is_valid_or_a_config_error(conf_copy, overrides, overlay, data):
    env = None
    if overlay is not None:
        text = yaml.safe_dump(overlay, allow_unicode=True).encode()
        if data.draw(st.booleans()):
            text = data.draw(mutated(text))
        (conf_copy / "env" / "fuzz.yaml").write_bytes(text)
        env = "fuzz"
    try:
        loaded = load_settings(conf_copy, env=env, overrides=[f"{key}={value}" for key, value in overrides])
    except ConfigError:
        return
    broker, spark = loaded.broker, loaded.spark
    assert NAME_VALUE_SEPARATOR not in broker.cluster_name and PROPERTY_SEPARATOR not in broker.cluster_name
    assert parse_host(loaded.hosts.store_host) and parse_host(loaded.hosts.born_host)
    assert all(topic_error(name) is None for name in loaded.topics)
    memory = re.fullmatch(r"([0-9]+)([kmgt])", spark.driver_memory.lower())
    assert (
        memory and int(memory[1]) * {"k": 1 / 1024, "m": 1, "g": 1024, "t": 2**20}[memory[2]] >= DRIVER_MEMORY_MIN_MIB
    )
    assert all(re.fullmatch("[0-9]{1,2}", hour) for hour in loaded.retention.delete_when.split(";"))
    for section in (loaded.store, loaded.retention, loaded.ingest, loaded.spark, loaded.lake):
        for value in section.model_dump().values():
            assert not isinstance(value, int) or value in INT64
