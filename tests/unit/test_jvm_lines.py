"""The JVM line parser (``rmqlake.jvm.CommonLineParser``, built by ``make jars``) accepts only what the per-line
parser accepts, with the same record fields to the byte; what it does not accept it leaves undecided.

The per-line parser is the reference. Each line here goes through both (the JVM one by its command-line tool);
every line the JVM accepts must give the reference's message field for field, and the common lines must be
accepted (a parser that leaves everything undecided would agree trivially).
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import random
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rmqlake.formats.transaction import HALF_TOPIC
from rmqlake.generate import TopicPlan, generate
from rmqlake.ingest.files import Split, iter_split_line_blocks
from rmqlake.ingest.jvm import month_table, options_text
from rmqlake.ingest.lines import ParsedMessage, ParseOptions, Rejection, parse_line
from rmqlake.ingest.message import MESSAGE_FIELDS
from rmqlake.ingest.parse import PARSED_SCHEMA, parse_lines
from rmqlake.ingest.scratch import SCRATCH_COLUMNS
from tests.java_oracle import _java_bin
from tests.unit.test_ingest_blocks import CLEAN_LINES, CORNER_LINES, HASH32, OPTIONS, SHANGHAI, SMALL_SEGMENTS, line

REPO = Path(__file__).resolve().parents[2]
JAR = REPO / ".jars" / "rmqlake-jvm.jar"
JAVA = _java_bin("java")


def jvm_parse(tmp_path: Path, lines: list[bytes], *, options: ParseOptions, first_line: int = 1) -> list[dict | None]:
    """The JVM parser's outcome per line: its fields (as ``reference`` gives them), or ``None``: undecided."""
    assert JAR.exists() and JAVA, f"{JAR} or java is missing: `make jars` builds the jar with the JDK"
    options_file, lines_file = tmp_path / "options.tsv", tmp_path / "lines.jsonl"
    options_file.write_text(options_text(options), encoding="utf-8")
    lines_file.write_bytes(b"".join(raw + b"\n" for raw in lines))
    result = subprocess.run(
        [JAVA, "-cp", str(JAR), "rmqlake.jvm.ParseLinesTool", str(options_file), str(lines_file),
         str(first_line), str(HASH32)],
        check=True, capture_output=True,
    )  # fmt: skip
    outcomes = [json.loads(text) for text in result.stdout.decode("utf-8").splitlines()]
    assert [o["line"] for o in outcomes] == list(range(first_line, first_line + len(lines)))
    return [None if len(o) == 1 else {k: v for k, v in o.items() if k != "line"} for o in outcomes]


def reference(raw: bytes, *, options: ParseOptions, number: int) -> dict | None:
    """The per-line parser's message of a line in the JVM tool's form; ``None`` for a rejected or an end line."""
    try:
        parsed = parse_line(raw, options=options, source_line=number, file_hash32=HASH32)
    except Rejection:
        return None
    if not isinstance(parsed, ParsedMessage):
        return None
    fields = parsed._asdict()
    if fields["real_queue_round_robin"] is not None and fields["topic"] != HALF_TOPIC:
        return None  # re-routed by a delay level or timer: never accepted by the JVM parser
    fields["body"] = base64.b64encode(fields["body"]).decode()
    fields["properties_bytes"] = base64.b64encode(fields["properties_bytes"]).decode()
    fields["properties"] = [list(pair) for pair in fields["properties"]]
    fields["keys"] = list(fields["keys"])
    return fields


def assert_agree(tmp_path, lines, *, options=OPTIONS, first_line=1) -> tuple[int, int]:
    """Every line the JVM accepts has the reference's fields; returns (accepted by the JVM, plain messages)."""
    got = jvm_parse(tmp_path, lines, options=options, first_line=first_line)
    options = dataclasses.replace(options)  # a fresh reference: caches start empty
    accepted = plain = 0
    for number, (raw, have) in enumerate(zip(lines, got, strict=True), start=first_line):
        want = reference(raw, options=options, number=number)
        plain += want is not None
        if have is not None:
            accepted += 1
            assert have == want, raw[:300]
    return accepted, plain


ALL_OPTIONS = pytest.mark.parametrize(
    "options", [OPTIONS, SHANGHAI, SMALL_SEGMENTS], ids=["utc", "shanghai-no-cluster", "small-segments"]
)


@ALL_OPTIONS
def test_corner_lines(tmp_path, options):
    accepted, plain = assert_agree(tmp_path, CORNER_LINES, options=options, first_line=65530)
    assert accepted >= plain // 2  # the plain ones among them are mostly taken


def test_generated_logs_with_bad_lines_delays_and_transactions(tmp_path: Path):
    topics = [TopicPlan("Orders", 8, False), TopicPlan("Profiles", 4, True), TopicPlan("Clicks", 4, False)]
    root = tmp_path / "logs"
    generate(root, messages=4000, topics=topics, hours=2, bad_rate=0.05, seed=23, max_message_size=4096,
             schedule_share=0.05, transaction_share=0.1)  # fmt: skip
    options = ParseOptions(**{**OPTIONS.__dict__, "queue_counts": {"Orders": 8, "Profiles": 4, "Clicks": 4}})
    accepted = plain = 0
    for path in sorted(root.rglob("*.jsonl")):
        counts = assert_agree(tmp_path, path.read_bytes().split(b"\n")[:-1], options=options)
        accepted, plain = accepted + counts[0], plain + counts[1]
    assert plain > 3000
    assert accepted >= 0.97 * plain, (accepted, plain)
    halves = sum(path.read_bytes().count(b'"TRAN_MSG"') for path in root.rglob("*.jsonl"))
    assert halves > 200  # among the plain lines the JVM takes


def test_common_shapes_are_accepted(tmp_path):
    """Each plain shape the JVM parser is meant to take, taken (not handed back)."""
    clean = [
        *CLEAN_LINES,
        line(bornHost="[::ffff:a01:203]:80", storeHost="[2001:DB8:0:0:1:0:0:1]:1", flag=-5, reconsumeTimes=3),
        line(keys=" a  b ", tags="", uniqKey="", properties={"KEYS": "given", "e": ""}, storeTimestamp=0),
        line(topic="Auto", preparedTransactionOffset=2**63 - 1, bornTimestamp=0, queueId=None, keys=None),
        b'{ "topic" : "Orders" ,\t"body":"x", "bornTimestamp" : 5 , "tags": null }  ',
        # transactional halves: stored on the half topic, with a queue given, by the keys' hash, or round robin
        line(transaction="PREPARED", properties={"TRAN_MSG": "true", "PGROUP": "g"}, queueId=3),
        line(transaction="PREPARED", properties={"TRAN_MSG": "TRUE", "PGROUP": "g"}, keys=["k1", "k2"]),
        line(properties={"TRAN_MSG": "True", "REAL_QID": "9", "a": "1"}, bornHost="[2001:db8::1]:7", uniqKey="U7"),
        line(topic="%RETRY%" + "g" * 150, properties={"TRAN_MSG": "true", "__transactionId__": "mine"}, tags="t"),
    ]
    got = jvm_parse(tmp_path, clean, options=OPTIONS)
    assert [index for index, fields in enumerate(got) if fields is None] == []
    accepted, plain = assert_agree(tmp_path, clean)
    assert accepted == plain == len(clean)
    halves = got[-4:]
    assert all(fields["topic"] == HALF_TOPIC and fields["queue_id"] == 0 for fields in halves)
    assert [fields["real_queue_round_robin"] for fields in halves] == [False, False, True, True]


def test_lines_left_to_the_reference(tmp_path):
    """Shapes the JVM parser does not take: each is handed back (``None``), whatever the reference makes of it."""
    undecided = [
        line(body='say "hi"'),  # an escape
        b'{"topic": "Orders", "body": "x", "bornTimestamp": 5, "topic": "Other"}',  # a repeated field
        line(extra=1),  # an unknown field
        line(properties={"a": "1", "DELAY": "3"}),  # re-routed by the broker
        line(delayLevel=2),
        line(body="QR==", bodyEncoding="base64"),  # not canonical base64
        line(body="QQ", bodyEncoding="base64"),  # unpadded
        line(bornHost="010.0.0.1:80"),  # a leading zero
        line(bornHost="[::1.2.3.4]:80"),  # embedded IPv4
        line(bornTimestamp=1.5),
        line(bornTimestamp=2**63),
        line(queueId=8),
        line(topic="Profiles"),  # a compacted topic without keys
        line(topic="RMQ_SYS_TRANS_HALF_TOPIC"),
        line(bornTimestamp=7_258_118_400_000),  # 2200-01-01: past the month table
        {"endTransaction": "COMMIT", "uniqKey": "AB", "storeTimestamp": 5},
        line(properties={"TRAN_MSG": "true", "DELAY": "3"}),  # a half with a delay level: refused
        line(properties={"TRAN_MSG": "yes"}),  # not a half: stored as sent, TRAN_MSG and all
        line(properties={"TRAN_MSG": "tru\u0435"}),  # a Cyrillic e
        line(properties={f"p{i}": "v" for i in range(1)} | {"Aa": "1", "BB": "2"}),  # fine: a colliding pair only
        line(properties={"TRAN_MSG": ""}),  # fine: an empty value is dropped, as the broker's parser drops it
    ]
    undecided[15] = json.dumps(undecided[15]).encode()
    got = jvm_parse(tmp_path, undecided, options=OPTIONS)
    assert [fields is None for fields in got] == [True] * 19 + [False, False]
    assert_agree(tmp_path, undecided)


def test_a_crowded_hashmap_bucket_is_left_to_the_reference(tmp_path):
    """Names whose hashes share a bucket 8 times make the broker's HashMap bucket a tree (an order the reference
    does not model): the JVM parser hands such a line back; 7 in a bucket it takes."""
    crowd = [a + b + c for a in ("Aa", "BB") for b in ("Aa", "BB") for c in ("Aa", "BB")]  # equal String.hashCode
    lines = [line(properties=dict.fromkeys(crowd, "v")), line(properties=dict.fromkeys(crowd[:7], "v"))]
    got = jvm_parse(tmp_path, lines, options=OPTIONS)
    assert got[0] is None and got[1] is not None
    assert_agree(tmp_path, lines)


def test_fuzzed_lines(tmp_path):
    """Bytes flipped, cut, duplicated and spliced in clean lines: whatever the JVM accepts, the reference gives."""
    rng = random.Random(5)
    seeds = [
        line(keys=f"k{i}", tags="T", properties={"a": str(i), "é": "ü"}, bornHost="[2001:db8::21]:50100")
        for i in range(20)
    ] + [line(body=base64.b64encode(bytes(range(i, i + 9))).decode(), bodyEncoding="base64") for i in range(10)]
    alphabet = b'{}[]",:\\ 0123456789-.eEnultrfaQ=+/\x00\x01\x02\xc3\xa9\xed\xa0\x80\xf0\x9f\x98\x80'
    fuzzed = []
    for _ in range(1500):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.choice([1, 1, 2, 3])):
            if not raw:
                break
            at = rng.randrange(len(raw))
            action = rng.randrange(4)
            if action == 0:
                raw[at] = rng.choice(alphabet)
            elif action == 1:
                del raw[at : at + rng.randrange(1, 4)]
            elif action == 2:
                raw[at:at] = bytes([rng.choice(alphabet)])
            else:
                raw = raw[:at]
        fuzzed.append(bytes(raw).replace(b"\n", b" "))
    accepted, _ = assert_agree(tmp_path, fuzzed)
    assert accepted > 50  # mutations that keep a line valid are still taken (84 of these 1,500)


@pytest.mark.parametrize("zone", ["UTC", "Asia/Shanghai", "Europe/Berlin", "America/Sao_Paulo", "Australia/Lord_Howe"])
def test_generated_uniq_keys_count_from_the_month_start_in_the_zone(tmp_path, zone):
    """Born times on both sides of month starts, in zones with summer time (Sao Paulo's changed at midnight)."""
    options = dataclasses.replace(OPTIONS, timezone=zone)
    table = month_table(zone, first_year=1985, end_year=2030)
    stamps = []
    for start, _ in table[1:-1]:
        stamps += [start - 1, start, start + 59_999, start + 60_000, start + 86_400_000 * 3]
    lines = [line(bornTimestamp=stamp) for stamp in stamps]
    accepted, plain = assert_agree(tmp_path, lines, options=options)
    assert accepted >= 0.9 * plain


def test_month_table_marks_months_whose_start_is_not_plain():
    table = dict(month_table("America/Sao_Paulo", first_year=1985, end_year=2020))
    assert all(start % 60_000 == 0 for start in table)
    assert not all(table.values())  # summer time began at midnight, some of it on the 1st of a month
    assert all(month_table("UTC", first_year=1990, end_year=1991)[i][1] for i in range(12))


def test_bodies_are_taken_exactly_when_they_are_utf8(tmp_path):
    """A body of any bytes (overlong forms, surrogates, code points past U+10FFFF, cut sequences, valid ones of
    every length): the JVM parser takes the line exactly when Python's strict codec decodes the body."""
    rng = random.Random(11)
    valid = [
        b"a",
        b"plain text ",
        b"\xc3\xa9",
        b"\xe8\xae\xa2",
        b"\xf0\x9f\x98\x80",
        b"\xf4\x8f\xbf\xbf",
        b"\xe0\xa0\x80",
    ]
    valid += [b"\xed\x9f\xbf"]  # the last code point before the surrogates
    overlong = [b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xf0\x80\x80\x80"]
    beyond = [b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80"]  # a surrogate, past U+10FFFF
    cut = [b"\x80", b"\xbf", b"\xc3", b"\xe8\xae", b"\xf0\x9f\x98", b"\xff"]
    pieces = valid * 3 + overlong + beyond + cut
    bodies = [b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12))) for _ in range(600)]
    lines = [b'{"topic": "Orders", "bornTimestamp": 5, "body": "' + body + b'"}' for body in bodies]
    got = jvm_parse(tmp_path, lines, options=OPTIONS)
    for body, fields in zip(bodies, got, strict=True):
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            assert fields is None, body
        else:
            assert fields is not None and base64.b64decode(fields["body"]) == body, body
    assert_agree(tmp_path, lines)


def test_every_two_byte_start_of_a_character_is_judged_as_python_judges_it(tmp_path):
    """Every non-ASCII byte followed by every byte a JSON string may hold, then none to three continuation bytes
    and ASCII: the JVM parser takes the line exactly when Python's strict codec decodes the body."""
    tails = [b"", b"\x80", b"\x80\xbf", b"\xbf\x80\x80", b"\x8f\xbfa"]
    seconds = [b for b in range(0x20, 0x100) if b not in (0x22, 0x5C)]
    bodies = [b"x" + bytes([lead, second]) + tail + b" y" for lead in range(0x80, 0x100) for second in seconds
              for tail in tails]  # fmt: skip
    lines = [b'{"topic": "Orders", "bornTimestamp": 5, "body": "' + body + b'"}' for body in bodies]
    got = jvm_parse(tmp_path, lines, options=OPTIONS)
    taken = [fields is not None for fields in got]
    decodes = []
    for body in bodies:
        try:
            body.decode("utf-8")
            decodes.append(True)
        except UnicodeDecodeError:
            decodes.append(False)
    wrong = [body for body, have, want in zip(bodies, taken, decodes, strict=True) if have != want]
    assert not wrong, wrong[:10]
    assert sum(decodes) > 3000  # valid sequences of every length are among them


def test_characters_at_every_position_of_a_word_are_judged_as_python_judges_them(tmp_path):
    """A character, or a cut or forbidden sequence, after 0 to 17 ASCII bytes and before 0 to 9: where the ASCII
    run read eight bytes at a time ends, where the body ends (a sequence the closing quote cuts), between two
    characters. The JVM parser takes the line exactly when Python's strict codec decodes the body."""
    sequences = [b"\xc3\xa9", b"\xe8\xae\xa2", b"\xf0\x9f\x98\x80", b"\xf4\x8f\xbf\xbf", b"\xed\x9f\xbf",
                 b"\xc3", b"\xe8\xae", b"\xf0\x9f\x98", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                 b"\xe0\x9f\xbf", b"\xf0\x8f\xbf\xbf", b"\xc3\xa9\xe8\xae\xa2", b"\xe8\xae\xa2\xbf"]  # fmt: skip
    bodies = [b"a" * before + sequence + b"z" * after for sequence in sequences for before in range(18)
              for after in (0, 1, 7, 9)]  # fmt: skip
    lines = [b'{"topic": "Orders", "bornTimestamp": 5, "body": "' + body + b'"}' for body in bodies]
    got = jvm_parse(tmp_path, lines, options=OPTIONS)
    wrong = []
    for body, fields in zip(bodies, got, strict=True):
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            decodes = False
        else:
            decodes = True
        if (fields is not None) != decodes or (decodes and base64.b64decode(fields["body"]) != body):
            wrong.append(body)
    assert not wrong, wrong[:10]


def _pyspark_jars() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "jars" / "*")


def jvm_split(tmp_path, path: Path, start: int, end: int, *, first_line: int, options=OPTIONS):
    """The JVM's scratch of one split: (its messages, its undecided lines) as Arrow tables."""
    options_file = tmp_path / "options.tsv"
    options_file.write_text(options_text(options), encoding="utf-8")
    messages, undecided = tmp_path / f"messages-{start}.arrow", tmp_path / f"undecided-{start}.arrow"
    subprocess.run(
        [JAVA, "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", f"{JAR}:{_pyspark_jars()}",
         "rmqlake.jvm.SplitScratch", str(options_file), str(path), str(start), str(end), str(first_line), str(HASH32),
         str(messages), str(undecided)],
        check=True, capture_output=True,
    )  # fmt: skip
    return pa.ipc.open_file(messages).read_all(), pa.ipc.open_file(undecided).read_all()


def python_split(path: Path, start: int, end: int, *, first_line: int, options=OPTIONS) -> pa.Table:
    """The Python route's parse of the same split (``PARSED_SCHEMA`` rows, every line)."""
    batches = []
    for lines in iter_split_line_blocks(Split(str(path), start, end, False, "")):
        batches.append(parse_lines(lines, source_file="f", first_line=first_line, file_hash32=HASH32, options=options))
        first_line += len(lines)
    return pa.Table.from_batches(batches, schema=PARSED_SCHEMA)


def test_a_split_parsed_in_the_jvm_gives_the_python_routes_messages(tmp_path):
    """A file cut into splits at arbitrary bytes (inside lines, at a line start, past a BOM, with CRLF and a last
    line without a newline): per split, the JVM's messages are the Python route's, row for row in the scratch
    schema, and its undecided lines are the other lines, byte for byte."""
    topics = [TopicPlan("Orders", 8, False), TopicPlan("Profiles", 4, True), TopicPlan("Clicks", 4, False)]
    root = tmp_path / "logs"
    generate(root, messages=3000, topics=topics, hours=1, bad_rate=0.05, seed=29, max_message_size=4096,
             transaction_share=0.1)  # fmt: skip
    options = ParseOptions(**{**OPTIONS.__dict__, "queue_counts": {"Orders": 8, "Profiles": 4, "Clicks": 4}})
    lines = b"".join(path.read_bytes() for path in sorted(root.rglob("*.jsonl"))).split(b"\n")[:-1]
    lines[5] = lines[5] + b"\r"
    data = b"\xef\xbb\xbf" + b"\n".join(lines)  # a byte order mark first, no newline last
    path = tmp_path / "input.jsonl"
    path.write_bytes(data)
    cuts = sorted({0, 1, 2, 7, 4096, data.index(b"\n", 9000) + 1, len(data) // 2, len(data) - 3, len(data)})
    scratch_schema = pa.schema([("source_line", pa.int64()), *MESSAGE_FIELDS])
    assert scratch_schema.names == SCRATCH_COLUMNS
    seen_lines = []
    for start, end in itertools.pairwise(cuts):
        # the split's first line starts after the first newline at or after start - 1
        first_line = 1 if start == 0 else data.count(b"\n", 0, start - 1) + 2
        messages, undecided = jvm_split(tmp_path, path, start, end, first_line=first_line, options=options)
        expected = python_split(path, start, end, first_line=first_line, options=options)
        assert messages.schema.equals(scratch_schema), messages.schema
        taken = pc.is_in(expected.column("source_line"), messages.column("source_line"))
        assert expected.filter(taken).select(SCRATCH_COLUMNS).equals(messages), (start, end)
        left = expected.filter(pc.invert(taken))
        assert left.column("source_line").equals(undecided.column("source_line").cast(pa.int64()))
        seen_lines += expected.column("source_line").to_pylist()
        if len(expected):
            python_raws = [raw for raw in iter_split_line_blocks(Split(str(path), start, end, False, ""))]
            flat = [line for block in python_raws for line in block]
            positions = [number - first_line for number in undecided.column("source_line").to_pylist()]
            assert undecided.column("raw").to_pylist() == [flat[p] for p in positions]
    assert seen_lines == list(range(1, len(lines) + 1))  # every line in exactly one split
