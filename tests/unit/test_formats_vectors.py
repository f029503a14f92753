"""formats against every vector of shared/spec/vectors.json."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rmqlake.formats.consumequeue import tags_code
from rmqlake.formats.crc import body_crc
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.javahash import index_key_hash, index_slot, java_string_hash, utf16_length
from rmqlake.formats.msgid import (
    decode_offset_msg_id,
    offset_msg_id,
    offset_msg_id_prefix,
    offset_msg_ids_with_prefix,
)
from rmqlake.formats.properties import parse_properties, serialize_properties
from rmqlake.formats.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    BlankRecord,
    Record,
    decode_record,
    encode_blank,
    encode_record,
    magic_for_topic,
    sys_flag_with_hosts,
)
from tests.vectors import SPEC_VECTORS, VECTORS_COPY, section

MAGICS = {"MESSAGE_VERSION_V1": MAGIC_V1, "MESSAGE_VERSION_V2": MAGIC_V2}


def test_vectors_copy_matches_the_spec():
    if not SPEC_VECTORS.exists():
        pytest.skip(f"{SPEC_VECTORS} is not present in this checkout")
    assert VECTORS_COPY.read_bytes() == SPEC_VECTORS.read_bytes()


@pytest.mark.parametrize("case", section("string_hash"), ids=lambda c: repr(c["key"]))
def test_string_hash_matches_java(case):
    assert java_string_hash(case["key"]) == case["hashCode"]
    assert utf16_length(case["key"]) == case["utf16_code_units"]
    assert index_key_hash(case["key"]) == case["indexKeyHash"]
    assert index_slot(case["indexKeyHash"], 5_000_000) == case["slot"]
    assert tags_code(case["key"] or None) == (case["tagsCode_if_used_as_TAGS"] if case["key"] else 0)


@pytest.mark.parametrize("case", section("crc32"), ids=lambda c: c["hex"][:16] or "empty")
def test_body_crc_matches_util_all_crc32(case):
    assert body_crc(bytes.fromhex(case["hex"])) == case["UtilAll_crc32"] == case["masked"]


def vector_host(text: str):
    """The vectors write IPv6 hosts as Java prints them (``2001:db8:0:0:0:0:0:1:40000``); rmqlake takes
    ``[ipv6]:port`` only, so the address is bracketed first."""
    address, _, port = text.rpartition(":")
    return parse_host(f"[{address}]:{port}" if ":" in address else text)


def _record_from_vector(case) -> Record:
    inputs, expected = case["inputs"], case["expected"]
    born, store = vector_host(inputs["bornHost"]), vector_host(inputs["storeHost"])
    return Record(
        topic=inputs["topic"],
        queue_id=inputs["queueId"],
        flag=inputs["flag"],
        queue_offset=expected["storedQueueOffset"],
        physical_offset=inputs["physicalOffset"],
        sys_flag=sys_flag_with_hosts(inputs["sysFlagRequested"], born_host=born, store_host=store),
        born_timestamp=inputs["bornTimestamp"],
        born_host=born,
        store_timestamp=inputs["storeTimestamp"],
        store_host=store,
        reconsume_times=inputs["reconsumeTimes"],
        prepared_transaction_offset=inputs["preparedTransactionOffset"],
        body=bytes.fromhex(inputs["body_hex"]),
        properties=serialize_properties([tuple(p) for p in inputs["properties_in_order"]]),
        magic=magic_for_topic(inputs["topic"]),
    )


@pytest.mark.parametrize("case", section("commitlog_records"), ids=lambda c: c["name"])
def test_record_encoding_matches_message_ext_encoder(case):
    expected = case["expected"]
    record = _record_from_vector(case)
    assert record.magic == MAGICS[expected["magic"]]
    assert record.sys_flag == expected["sysFlag"]
    assert record.properties.hex() == expected["propertiesString_hex"]
    assert len(record.properties) == expected["propertiesLength"]
    assert record.computed_size() == expected["totalSize"]
    encoded = encode_record(record)
    assert encoded.hex() == expected["record_hex"]
    assert body_crc(record.body) == expected["bodyCRC"]
    assert offset_msg_id(record.store_host, record.physical_offset) == expected["offsetMsgId"]
    prefix = pa.array([offset_msg_id_prefix(record.store_host)])
    assert offset_msg_ids_with_prefix(prefix, np.array([record.physical_offset])).to_pylist() == [
        expected["offsetMsgId"]
    ]


@pytest.mark.parametrize("case", section("commitlog_records"), ids=lambda c: c["name"])
def test_record_decoding_round_trips(case):
    expected = case["expected"]
    decoded = decode_record(bytes.fromhex(expected["record_hex"]), check_crc=True)
    assert isinstance(decoded, Record)
    assert decoded.total_size == expected["totalSize"]
    assert decoded.body_crc == expected["bodyCRC"]
    assert decoded.topic == case["inputs"]["topic"]
    assert decoded.queue_offset == expected["storedQueueOffset"]
    assert decoded.physical_offset == case["inputs"]["physicalOffset"]
    assert decoded.store_timestamp == case["inputs"]["storeTimestamp"]
    assert decoded.born_host == vector_host(case["inputs"]["bornHost"])
    assert decoded.store_host == vector_host(case["inputs"]["storeHost"])
    assert parse_properties(decoded.properties) == dict(map(tuple, case["inputs"]["properties_in_order"]))
    assert encode_record(decoded).hex() == expected["record_hex"]
    host, offset = decode_offset_msg_id(expected["offsetMsgId"])
    assert (host, offset) == (decoded.store_host, decoded.physical_offset)


def test_blank_record_matches_vector():
    blank = section("commitlog_blank_record")
    assert encode_blank(blank["maxBlank"]).hex() == blank["hex"]
    decoded = decode_record(bytes.fromhex(blank["hex"]) + bytes(blank["maxBlank"] - 8))
    assert decoded == BlankRecord(physical_offset=0, total_size=100)
    assert blank["fields"]["magic"] == BLANK_MAGIC
