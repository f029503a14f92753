"""Raw producer log lines (CONTRACT §2) → message fields, or a reject reason.

Pure Python and per line, so it runs inside Spark tasks and in plain unit
tests alike. Everything a line's outcome depends on is in ``ParseOptions``
plus the line's own position (file, line number, file fingerprint), so the
same input always gives the same result.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from rmqlake.formats.crc import body_crc
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.javahash import select_queue_by_hash
from rmqlake.formats.msgid import month_start_millis, offset_msg_id_prefix, uniq_key
from rmqlake.formats.properties import (
    CLUSTER,
    KEY_SEPARATOR,
    KEYS,
    MAX_PROPERTIES_LENGTH,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
    UNIQ_KEY,
    hashmap_order,
    serialize_properties,
    split_keys,
)
from rmqlake.formats.record import (
    END_FILE_MIN_BLANK_LENGTH,
    RECORD_OVERHEAD_ALLOWANCE,
    TRANSACTION_TYPES,
    magic_for_topic,
    record_size,
)
from rmqlake.formats.topic import topic_error

JAVA_INT_MIN, JAVA_INT_MAX = -(2**31), 2**31 - 1
_topic_error = lru_cache(maxsize=4096)(topic_error)
_magic_for_topic = lru_cache(maxsize=4096)(magic_for_topic)
_msg_id_prefix = lru_cache(maxsize=4096)(offset_msg_id_prefix)
JAVA_LONG_MAX = 2**63 - 1
_BORN_V6 = 0x10
_STORE_V6 = 0x20


@dataclass(frozen=True)
class ParseOptions:
    """The configuration values a line's validation depends on."""

    queue_counts: dict[str, int]
    default_queue_count: int | None
    compaction_topics: frozenset[str]
    max_message_size: int
    segment_size: int
    cluster_name: str
    default_store_host: str
    default_born_host: str
    timezone: str


class ParsedMessage(NamedTuple):
    """A valid line: every record field known before the message is placed in the log.

    ``queue_id`` is ``None`` when the queue is chosen round robin at append time.
    (A tuple, so that Spark tasks turn thousands of them into columns cheaply.)
    """

    topic: str
    queue_id: int | None
    flag: int
    sys_flag: int
    magic: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    store_host_prefix: str
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    body_crc: int
    properties: dict[str, str]
    properties_bytes: bytes
    keys: list[str]
    tags: str | None
    uniq_key: str
    total_size: int


class Rejection(ValueError):
    """Why a line cannot become a message."""


def _int_field(doc: dict, name: str, *, default=None, minimum=JAVA_INT_MIN, maximum=JAVA_INT_MAX, required=False):
    if name not in doc or doc[name] is None:
        if required:
            raise Rejection(f"missing required field '{name}'")
        return default
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise Rejection(f"field '{name}' must be an integer, got {type(value).__name__} {value!r:.40}")
    if not minimum <= value <= maximum:
        raise Rejection(f"field '{name}' = {value} is outside {minimum}..{maximum}")
    return value


def _str_field(doc: dict, name: str, *, required=False) -> str | None:
    if name not in doc or doc[name] is None:
        if required:
            raise Rejection(f"missing required field '{name}'")
        return None
    value = doc[name]
    if not isinstance(value, str):
        raise Rejection(f"field '{name}' must be a string, got {type(value).__name__}")
    return value


def _check_property_text(what: str, text: str) -> None:
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        raise Rejection(f"{what} contains a property separator byte (0x01 or 0x02), which the broker cannot store")


def _keys_field(doc: dict) -> str | None:
    value = doc.get("keys")
    if value is None:
        return None
    if isinstance(value, list):
        for token in value:
            if not isinstance(token, str):
                raise Rejection(f"field 'keys' must be a string or a list of strings, found {type(token).__name__}")
            if KEY_SEPARATOR in token:
                raise Rejection(f"key {token!r} in the 'keys' list contains a space, the KEYS separator")
        value = KEY_SEPARATOR.join(value)
    elif not isinstance(value, str):
        raise Rejection(f"field 'keys' must be a string or a list of strings, got {type(value).__name__}")
    _check_property_text("field 'keys'", value)
    return value or None


def _body(doc: dict) -> bytes:
    text = _str_field(doc, "body", required=True)
    encoding = doc.get("bodyEncoding", "utf8")
    if encoding in (None, "utf8", "utf-8"):
        return text.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise Rejection("field 'body' is not valid base64 although bodyEncoding is 'base64'") from None
    raise Rejection(f"field 'bodyEncoding' must be 'utf8' or 'base64', got {encoding!r}")


def _user_properties(doc: dict) -> list[tuple[str, str]]:
    value = doc.get("properties")
    if value is None:
        return []
    if not isinstance(value, dict):
        raise Rejection(f"field 'properties' must be an object of strings, got {type(value).__name__}")
    pairs = []
    for name, text in value.items():
        if not isinstance(text, str):
            raise Rejection(f"property '{name}' must be a string, got {type(text).__name__}")
        _check_property_text(f"property name {name!r}", name)
        _check_property_text(f"property '{name}'", text)
        if name and text:  # the broker's parser drops empty names and values (spec 1.5)
            pairs.append((name, text))
    return pairs


def parse_line(
    raw: bytes | str,
    *,
    options: ParseOptions,
    source_line: int,
    file_hash32: int,
) -> ParsedMessage:
    """Validate one producer log line and compute its record fields.

    Args:
        raw: the line without its newline.
        options: configuration values the rules depend on.
        source_line: 1-based line number (seeds the generated UNIQ_KEY counter).
        file_hash32: 32 bits of the input file's content hash (seeds the
            generated UNIQ_KEY's pid and class-loader fields).

    Raises:
        Rejection: the line cannot become a message; the text says why.
    """
    try:
        return _parse(raw, options=options, source_line=source_line, file_hash32=file_hash32)
    except UnicodeEncodeError:
        raise Rejection("text contains a lone UTF-16 surrogate, which is not valid UTF-8") from None


def _parse(
    raw: bytes | str,
    *,
    options: ParseOptions,
    source_line: int,
    file_hash32: int,
) -> ParsedMessage:
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Rejection(f"line is not valid UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    if not text.strip():
        raise Rejection("empty line")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Rejection(f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(doc, dict):
        raise Rejection(f"a line must be a JSON object, got {type(doc).__name__}")

    topic = _str_field(doc, "topic", required=True)
    problem = _topic_error(topic)
    if problem:
        raise Rejection(problem)
    queue_count = options.queue_counts.get(topic, options.default_queue_count)
    if queue_count is None:
        raise Rejection(f"topic {topic!r} is not in topics.yaml and broker.auto_create_topic_enable is false")

    body = _body(doc)
    if len(body) > options.max_message_size:
        raise Rejection(f"body of {len(body)} bytes exceeds store.max_message_size {options.max_message_size}")

    keys = _keys_field(doc)
    tags = _str_field(doc, "tags")
    if tags is not None:
        _check_property_text("field 'tags'", tags)
        tags = tags or None
    born_ts = _int_field(doc, "bornTimestamp", required=True, minimum=0, maximum=JAVA_LONG_MAX)
    store_ts = _int_field(doc, "storeTimestamp", default=born_ts, minimum=0, maximum=JAVA_LONG_MAX)
    flag = _int_field(doc, "flag", default=0)
    reconsume = _int_field(doc, "reconsumeTimes", default=0, minimum=0)
    prepared_offset = _int_field(doc, "preparedTransactionOffset", default=0, minimum=0, maximum=JAVA_LONG_MAX)
    transaction = doc.get("transaction", "NOT_TYPE")
    if transaction is None:
        transaction = "NOT_TYPE"
    if transaction not in TRANSACTION_TYPES:
        raise Rejection(f"field 'transaction' must be one of {', '.join(TRANSACTION_TYPES)}, got {transaction!r:.40}")
    try:
        born_host = parse_host(_str_field(doc, "bornHost") or options.default_born_host)
        store_host = parse_host(_str_field(doc, "storeHost") or options.default_store_host)
    except ValueError as exc:
        raise Rejection(str(exc)) from None

    queue_id = _int_field(doc, "queueId", default=None, minimum=JAVA_INT_MIN)
    if queue_id is not None and not 0 <= queue_id < queue_count:
        raise Rejection(f"queueId {queue_id} is out of range for topic {topic!r} with {queue_count} queues")
    if queue_id is None and keys:
        queue_id = select_queue_by_hash(keys, queue_count)
    if topic in options.compaction_topics and not split_keys(keys):
        raise Rejection(f"topic {topic!r} has cleanup.policy COMPACTION and the message has no keys")

    given_uniq = _str_field(doc, "uniqKey")
    if given_uniq is not None:
        _check_property_text("field 'uniqKey'", given_uniq)
    uniq = given_uniq or uniq_key(
        ip=born_host.address,
        pid=file_hash32 >> 16,
        class_loader_hash=file_hash32,
        timestamp_ms=born_ts,
        month_start_ms=month_start_millis(born_ts, options.timezone),
        counter=source_line,
    )
    entries = _user_properties(doc)
    for name, value in ((KEYS, keys), (TAGS, tags), (UNIQ_KEY, uniq), (CLUSTER, options.cluster_name)):
        if value:
            entries.append((name, value))
    ordered = hashmap_order(entries)
    properties_bytes = serialize_properties(ordered)
    if len(properties_bytes) > MAX_PROPERTIES_LENGTH:
        raise Rejection(f"properties of {len(properties_bytes)} bytes exceed the maximum {MAX_PROPERTIES_LENGTH}")

    sys_flag = TRANSACTION_TYPES[transaction]
    if born_host.is_ipv6:
        sys_flag |= _BORN_V6
    if store_host.is_ipv6:
        sys_flag |= _STORE_V6
    magic = _magic_for_topic(topic)
    size = record_size(
        body_length=len(body),
        topic_length=len(topic.encode("utf-8")),
        properties_length=len(properties_bytes),
        born_v6=born_host.is_ipv6,
        store_v6=store_host.is_ipv6,
        magic=magic,
    )
    if size > options.max_message_size + RECORD_OVERHEAD_ALLOWANCE:
        limit = options.max_message_size + RECORD_OVERHEAD_ALLOWANCE
        raise Rejection(f"record of {size} bytes exceeds store.max_message_size + 64 KiB ({limit})")
    if size + END_FILE_MIN_BLANK_LENGTH > options.segment_size:
        raise Rejection(
            f"record of {size} bytes cannot fit a commitlog segment of {options.segment_size} bytes "
            "(store.commitlog_segment_size)"
        )
    properties = dict(ordered)
    return ParsedMessage(
        topic=topic,
        queue_id=queue_id,
        flag=flag,
        sys_flag=sys_flag,
        magic=magic,
        born_timestamp=born_ts,
        born_host=born_host.text,
        store_timestamp=store_ts,
        store_host=store_host.text,
        store_host_prefix=_msg_id_prefix(store_host),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared_offset,
        body=body,
        body_crc=body_crc(body),
        properties=properties,
        properties_bytes=properties_bytes,
        keys=split_keys(keys),
        tags=tags,
        uniq_key=uniq,
        total_size=size,
    )
