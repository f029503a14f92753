"""Byte rules beyond the vectors: property order (checked against the real JDK), hosts, ids, decoding errors."""

from __future__ import annotations

import random

import pytest

from rmqlake.formats.consumequeue import (
    cq_file_name,
    cq_position,
    decode_unit,
    delay_level,
    dispatch_tags_code,
    encode_unit,
    parse_delay_levels,
)
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.javahash import java_string_hash, select_queue_by_hash
from rmqlake.formats.msgid import decode_offset_msg_id, uniq_key
from rmqlake.formats.properties import (
    hashmap_order,
    parse_properties,
    properties_template,
    serialize_properties,
    split_keys,
)
from rmqlake.formats.record import CorruptRecordError, decode_record
from rmqlake.formats.segment import place_records
from tests.vectors import section


def _random_name(rng: random.Random) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-éü订"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))


@pytest.mark.parametrize("count", [1, 4, 20, 96, 97, 150, 200])
def test_property_order_is_the_jdk_hashmap_order(java_oracle, count):
    rng = random.Random(count)
    for _ in range(5):
        pairs = [(_random_name(rng), _random_name(rng)) for _ in range(count)]
        pairs += [
            ("KEYS", "k1 k2"),
            ("TAGS", "TagA"),
            ("UNIQ_KEY", "C0A8010A0D3118B4AAC2000000000000"),
            ("CLUSTER", "c"),
        ]
        pairs.append((pairs[0][0], "overwritten"))  # a later put of an existing name keeps its place
        ordered = hashmap_order(pairs)
        assert serialize_properties(ordered) == java_oracle.broker_properties(pairs)
        template = properties_template([name for name, _ in ordered])  # the ingest hot path
        assert template.format(*[value for _, value in ordered]).encode() == java_oracle.broker_properties(pairs)


def test_properties_template_keeps_braces_in_names_and_values():
    pairs = [("a{0}", "v}"), ("{", "{1}"), ("}}", "x")]
    template = properties_template([name for name, _ in pairs])
    assert template.format(*[value for _, value in pairs]).encode() == serialize_properties(pairs)


def test_string_hash_matches_the_jdk_on_random_text(java_oracle):
    rng = random.Random(3)
    for _ in range(200):
        text = "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0xFFFF), 0x1F600])) for _ in range(9))
        text = text.encode("utf-8", "ignore").decode("utf-8")
        assert java_string_hash(text) == java_oracle.string_hash(text)


def test_property_parsing_follows_string2message_properties():
    raw = b"A\x011\x02\x02B\x01\x02\x01x\x02C\x012\x02A\x013\x02xy\x02"
    # "" and "xy" (< 3 chars) are ignored, B has an empty value, "\x01x" an empty name; A is overwritten
    assert parse_properties(raw) == {"A": "3", "C": "2"}


def test_keys_split_on_single_spaces_only():
    assert split_keys("a  b\tc ") == ["a", "b\tc"]
    assert split_keys(None) == [] and split_keys("") == []


@pytest.mark.parametrize(
    ("text", "canonical", "field"),
    [
        ("192.168.1.10:54321", "192.168.1.10:54321", "c0a8010a0000d431"),
        ("[2001:db8::1]:40000", "[2001:db8::1]:40000", "20010db800000000000000000000000100009c40"),
        ("[::ffff:10.0.0.9]:7", "10.0.0.9:7", "0a00000900000007"),
    ],
)
def test_hosts_parse_to_the_broker_field(text, canonical, field):
    host = parse_host(text)
    assert str(host) == canonical
    assert host.encode().hex() == field


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.1", "must be 'ip:port'"),
        ("10.0.0.1:70000", "0..65535"),
        ("host:80", "not an IPv4 or IPv6"),
        ("[::1]80", "'\\[ipv6\\]:port'"),
        # without brackets the last group of an IPv6 address cannot be told from the port
        ("2001:db8:0:0:0:0:0:1:40000", "an IPv6 host must be written '\\[ipv6\\]:port' \\(with brackets\\)"),
        ("::ffff:10.0.0.9:7", "with brackets"),
        ("1.2.3.4:\u0668\u0660", "number of ASCII digits"),  # Arabic-Indic "80": int() would read it as 80
        ("1.2.3.4:\u00b2", "number of ASCII digits"),  # superscript two: isdigit() but not int()
        ("1.2.3.4:" + "9" * 5000, "number of ASCII digits"),
        ("[fe80::1%eth0]:80", "zone id"),
        ("\u0661.2.3.4:80", "not an IPv4 or IPv6"),
    ],
)
def test_bad_hosts_are_refused_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message):
        parse_host(text)


def test_offset_msg_id_rejects_wrong_lengths():
    with pytest.raises(ValueError, match="32 \\(IPv4\\) or 56 \\(IPv6\\)"):
        decode_offset_msg_id("0A000005")


def test_uniq_key_has_the_client_layout_and_wraps_like_java():
    # the vector record's UNIQ_KEY: ip C0A8010A, pid 0x0D31, class-loader hash 0x18B4AAC2, time 0, counter 0
    assert (
        uniq_key(
            ip=bytes.fromhex("C0A8010A"),
            pid=0x0D31,
            class_loader_hash=0x18B4AAC2,
            timestamp_ms=500,
            month_start_ms=500,
            counter=0,
        )
        == section("commitlog_records")[0]["inputs"]["properties_in_order"][0][1]
    )
    late = uniq_key(
        ip=b"\x01\x02\x03\x04",
        pid=1,
        class_loader_hash=2,
        timestamp_ms=30 * 86_400_000,
        month_start_ms=0,
        counter=65537,
    )
    assert late[20:28] == f"{(30 * 86_400_000) & 0xFFFFFFFF:08X}" and late[28:] == "0001"  # int overflow, low 16 bits


def test_queue_selection_by_hash_is_the_clients():
    # SelectMessageQueueByHash: value = hashCode % n, abs when negative
    assert select_queue_by_hash("Aa", 8) == 2112 % 8
    assert java_string_hash("TopicTest#KEY1") < 0
    assert select_queue_by_hash("TopicTest#KEY1", 7) == abs(-((-java_string_hash("TopicTest#KEY1")) % 7))


@pytest.mark.parametrize("unit", section("consumequeue_units"), ids=lambda u: u["note"][:30])
def test_consume_queue_units_match_vectors(unit):
    assert encode_unit(unit["commitLogOffset"], unit["size"], unit["tagsCode"]).hex() == unit["unit_hex"]
    assert decode_unit(bytes.fromhex(unit["unit_hex"])) == (unit["commitLogOffset"], unit["size"], unit["tagsCode"])
    if unit["file"] != "n/a":
        assert cq_file_name(unit["queueOffset"], 300_000) == unit["file"]
        assert cq_position(unit["queueOffset"], 300_000) == unit["positionInFile"]


def test_tags_code_of_the_delay_topic_is_the_delivery_time():
    record = next(r for r in section("commitlog_records") if r["name"] == "v1_schedule_topic_delay")
    inputs = record["inputs"]
    properties = dict(map(tuple, inputs["properties_in_order"]))
    unit = next(u for u in section("consumequeue_units") if u["topic"] == "SCHEDULE_TOPIC_XXXX")
    assert (
        dispatch_tags_code(inputs["topic"], properties["TAGS"], properties, inputs["storeTimestamp"])
        == unit["tagsCode"]
    )
    assert dispatch_tags_code("TopicTest", "TagA", {"DELAY": "3"}, 0) == java_string_hash("TagA")


def test_delay_topic_tags_code_follows_the_configured_levels():
    """computeDeliverTimestamp with messageDelayLevel="1s 2s 3s": store time + the level's delay, the level
    capped at the highest; a level <= 0 keeps the TAGS hash; DELAY on another topic changes nothing."""
    levels = parse_delay_levels("1s 2s 3s")

    def code(delay: str, topic: str = "SCHEDULE_TOPIC_XXXX") -> int:
        return dispatch_tags_code(topic, "TagA", {"DELAY": delay}, 50_000, delay_levels=levels)

    assert [code(str(level)) for level in (1, 2, 3)] == [51_000, 52_000, 53_000]
    assert code("4") == code("18") == 53_000  # clamped to the highest configured level, not the default's 18th
    assert code("0") == code("-2") == java_string_hash("TagA")
    assert code("3", topic="TopicTest") == java_string_hash("TagA")
    assert delay_level({"DELAY": "9"}, delay_levels=levels) == 3 and delay_level({}, delay_levels=levels) is None
    # the default table: level 4 is 30 s; a table with a gap has no delay for the missing level: + 1000 ms
    assert dispatch_tags_code("SCHEDULE_TOPIC_XXXX", None, {"DELAY": "4"}, 50_000) == 80_000
    assert dispatch_tags_code("SCHEDULE_TOPIC_XXXX", None, {"DELAY": "2"}, 50_000, delay_levels={1: 5, 3: 7}) == 51_000


def test_decoder_reports_corruption_with_position():
    record = bytes.fromhex(section("commitlog_records")[0]["expected"]["record_hex"])
    with pytest.raises(CorruptRecordError, match="unknown magic code 0x00000000 at position 0"):
        decode_record(bytes(16))
    with pytest.raises(CorruptRecordError, match="exceeds the 100 bytes available"):
        decode_record(record[:100])
    bad_size = (len(record) + 1).to_bytes(4, "big") + record[4:] + b"\x00"
    with pytest.raises(CorruptRecordError, match="size mismatch: TOTALSIZE 177, fields add up to 176"):
        decode_record(bad_size)
    flipped = record[:-20] + bytes([record[-20] ^ 1]) + record[-19:]
    decode_record(flipped)  # properties byte flip: CRC covers the body only
    body_flip = record[:90] + bytes([record[90] ^ 1]) + record[91:]  # body starts at 72 + 8 + 8
    with pytest.raises(CorruptRecordError, match="body CRC mismatch"):
        decode_record(body_flip, check_crc=True)


def test_placement_matches_a_plain_loop_on_random_sizes():
    rng = random.Random(9)
    segment = 1000
    sizes = [rng.randint(92, 400) for _ in range(2000)]
    placement = place_records(sizes, start_offset=1234, segment_size=segment)
    position, expected = 1234, []
    for size in sizes:
        remaining = segment - position % segment
        if size + 8 > remaining:
            position += remaining
        expected.append(position)
        position += size
    assert placement.offsets.tolist() == expected
    assert placement.end_offset == position
    with pytest.raises(ValueError, match="cannot fit a segment of 1000 bytes"):
        place_records([993], start_offset=0, segment_size=segment)
