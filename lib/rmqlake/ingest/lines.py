"""Raw producer log lines → message fields, or a reject reason.

Pure Python and per line, so it runs inside Spark tasks and in plain unit
tests alike. Everything a line's outcome depends on is in ``ParseOptions``
plus the line's own position (file, line number, file fingerprint), so the
same input always gives the same result.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from rmqlake.formats.crc import body_crc
from rmqlake.formats.hosts import HostAddress, parse_host
from rmqlake.formats.javahash import select_queue_by_hash
from rmqlake.formats.json_text import JsonTextError, loads_strict
from rmqlake.formats.msgid import month_start_millis, offset_msg_id_prefix, uniq_key_prefix, uniq_key_tail
from rmqlake.formats.properties import (
    CLUSTER,
    DELAY,
    KEY_SEPARATOR,
    KEYS,
    MAX_PROPERTIES_LENGTH,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
    UNIQ_KEY,
    hashmap_order,
    properties_template,
    serialize_properties,
)
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    END_FILE_MIN_BLANK_LENGTH,
    RECORD_OVERHEAD_ALLOWANCE,
    STOREHOST_V6_FLAG,
    TRANSACTION_TYPES,
    magic_for_topic,
    record_size,
)
from rmqlake.formats.schedule import (
    SCHEDULE_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_PROPERTIES,
    ScheduleRefused,
    ScheduleRules,
    route,
)
from rmqlake.formats.topic import topic_error
from rmqlake.formats.transaction import HALF_TOPIC, OP_TOPIC, TRAN_MSG, half, is_half_send
from rmqlake.ingest.message import DECODE_REFUSED, LINE_DECODER, LineFields, ParsedMessage

# A re-routed message sent without a queue carries this REAL_QID until the append chooses its queue.
REAL_QID_PLACEHOLDER = "0"

JAVA_INT_MIN, JAVA_INT_MAX = -(2**31), 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1

# Topics a broker refuses sends to (TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET) whose records rmqlake writes
# itself: only the transactional path stores on them. (SCHEDULE_TOPIC_XXXX is refused by a broker too, but
# ingest keeps taking lines for it as they are given.)
FORBIDDEN_SEND_TOPICS = frozenset((HALF_TOPIC, OP_TOPIC))
END_KINDS = ("COMMIT", "ROLLBACK")


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
    schedule: ScheduleRules = field(default_factory=ScheduleRules)

    def __post_init__(self):
        # a key's queue is its hash modulo the count: a topic without queues has nowhere to put a message
        # (the configuration refuses such counts; this guards options built in code)
        counts = [
            *self.queue_counts.values(),
            *([self.default_queue_count] if self.default_queue_count is not None else []),
        ]
        if any(count < 1 for count in counts):
            raise ValueError(
                f"every topic needs at least one queue: {self.queue_counts}, default {self.default_queue_count}"
            )


class Rejection(ValueError):
    """Why a line cannot become a message."""


class EndTransaction(NamedTuple):
    """An ``endTransaction`` line: the producer ends the half message whose UNIQ_KEY is ``uniq_key``.

    Not a message itself: what it stores (a commit re-put and an op record, or the op record alone) depends on
    the half, found when the batch's halves and the lake's are known.
    """

    kind: str  # COMMIT or ROLLBACK
    uniq_key: str
    store_timestamp: int  # the broker's clock at the end: the commit's and the op record's store time
    topic: str | None  # the real topic the producer names, if any
    producer_group: str | None
    from_transaction_check: bool


def parse_line(
    raw: bytes | str,
    *,
    options: ParseOptions,
    source_line: int,
    file_hash32: int,
) -> ParsedMessage | EndTransaction:
    """Validate one producer log line and compute its record fields.

    Args:
        raw: the line without its newline.
        options: configuration values the rules depend on.
        source_line: 1-based line number (seeds the generated UNIQ_KEY counter).
        file_hash32: 32 bits of the input file's content hash (seeds the
            generated UNIQ_KEY's pid and class-loader fields).

    Returns:
        The message, or the end of a transaction (an ``endTransaction`` line).

    Raises:
        Rejection: the line cannot become a message; the text says why.
    """
    return line_parser(options).parse(raw, source_line=source_line, file_hash32=file_hash32)


_PARSERS: dict[int, tuple[ParseOptions, LineParser]] = {}


def line_parser(options: ParseOptions) -> LineParser:
    """The parser of ``options`` (kept, with its caches, while the options object lives)."""
    cached = _PARSERS.get(id(options))
    if cached is None or cached[0] is not options:
        if len(_PARSERS) > 16:
            _PARSERS.clear()
        cached = (options, LineParser(options))
        _PARSERS[id(options)] = cached
    return cached[1]


class _Topic(NamedTuple):
    problem: str | None
    queue_count: int | None
    magic: int
    length: int  # UTF-8 bytes
    compaction: bool


class _Host(NamedTuple):
    address: HostAddress | None
    problem: str | None
    text: str
    is_ipv6: bool
    msg_id_prefix: str


class LineParser:
    """Parses lines for one ``ParseOptions``; values that repeat across lines are computed once.

    Topics, hosts, property-name sets (their HashMap order), UNIQ_KEY
    prefixes and month starts repeat across millions of lines; each is
    worked out the first time it is seen.
    """

    def __init__(self, options: ParseOptions):
        self.options = options
        self._topics: dict[str, _Topic] = {}
        self._hosts: dict[str, _Host] = {}
        self._orders: dict[tuple[str, ...], tuple[list[str], str]] = {}
        self._uniq_prefixes: dict[tuple[bytes, int], str] = {}
        self._sizes: dict[tuple[int, bool, bool], int] = {}
        self._key_queues: dict[tuple[str, int], int] = {}
        self.size_limit = min(
            options.max_message_size + RECORD_OVERHEAD_ALLOWANCE, options.segment_size - END_FILE_MIN_BLANK_LENGTH
        )

    def parse(self, raw: bytes | str, *, source_line: int, file_hash32: int) -> ParsedMessage | EndTransaction:
        """See ``parse_line``."""
        try:
            fields = _decode_typed(raw)
            if fields is not None and fields.end_transaction is not None:
                return _end_line(fields, typed=True)
            body = None if fields is None else _plain_string(fields.body)
            if body is None:
                # msgspec refused the line, or its body is not a plain string: the json route says why, or
                # accepts what msgspec refused (an unknown field, an escaped body).
                fields = _fields_from_json(raw)
                if fields.end_transaction is not None:
                    return _end_line(fields, typed=False)
                body = None if fields.body is None else fields.body.encode("utf-8")
            return self._message(fields, body, source_line, file_hash32)
        except UnicodeEncodeError:
            raise Rejection("text contains a lone UTF-16 surrogate, which is not valid UTF-8") from None

    def _message(self, line: LineFields, text: bytes | None, source_line: int, file_hash32: int) -> ParsedMessage:
        """The message of a line whose field types are checked; ``text`` is the body string's UTF-8 bytes."""
        options = self.options
        topic = line.topic
        if topic is None:
            raise Rejection("missing required field 'topic'")
        if topic in FORBIDDEN_SEND_TOPICS:
            raise Rejection(f"the broker refuses this send: Sending message to topic[{topic}] is forbidden.")
        info = self.topic(topic)
        if info.problem:
            raise Rejection(info.problem)
        queue_count = info.queue_count

        if text is None:
            raise Rejection("missing required field 'body'")
        encoding = line.body_encoding
        if encoding is None or encoding == "utf8" or encoding == "utf-8":
            body = text
        elif encoding == "base64":
            try:
                body = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise Rejection("field 'body' is not valid base64 although bodyEncoding is 'base64'") from None
        else:
            raise Rejection(f"field 'bodyEncoding' must be 'utf8' or 'base64', got {encoding!r}")
        if len(body) > options.max_message_size:
            raise Rejection(f"body of {len(body)} bytes exceeds store.max_message_size {options.max_message_size}")

        keys = line.keys
        if keys is not None:
            if type(keys) is list:
                for token in keys:
                    if KEY_SEPARATOR in token:
                        raise Rejection(f"key {token!r} in the 'keys' list contains a space, the KEYS separator")
                keys = KEY_SEPARATOR.join(keys)
            _check_property_text("field 'keys'", keys)
            keys = keys or None
        tags = line.tags
        if tags is not None:
            _check_property_text("field 'tags'", tags)
            tags = tags or None
        born_ts = line.born_timestamp
        if born_ts is None:
            raise Rejection("missing required field 'bornTimestamp'")
        if not 0 <= born_ts <= JAVA_LONG_MAX:
            _reject_range("bornTimestamp", born_ts, 0, JAVA_LONG_MAX)
        store_ts = line.store_timestamp
        if store_ts is None:
            store_ts = born_ts
        elif not 0 <= store_ts <= JAVA_LONG_MAX:
            _reject_range("storeTimestamp", store_ts, 0, JAVA_LONG_MAX)
        flag = line.flag
        if flag is None:
            flag = 0
        elif not JAVA_INT_MIN <= flag <= JAVA_INT_MAX:
            _reject_range("flag", flag, JAVA_INT_MIN, JAVA_INT_MAX)
        reconsume = line.reconsume_times
        if reconsume is None:
            reconsume = 0
        elif not 0 <= reconsume <= JAVA_INT_MAX:
            _reject_range("reconsumeTimes", reconsume, 0, JAVA_INT_MAX)
        prepared_offset = line.prepared_transaction_offset
        if prepared_offset is None:
            prepared_offset = 0
        elif not 0 <= prepared_offset <= JAVA_LONG_MAX:
            _reject_range("preparedTransactionOffset", prepared_offset, 0, JAVA_LONG_MAX)
        transaction = line.transaction
        sys_flag = TRANSACTION_TYPES.get(transaction if transaction is not None else "NOT_TYPE")
        if sys_flag is None:
            raise Rejection(
                f"field 'transaction' must be one of {', '.join(TRANSACTION_TYPES)}, got {transaction!r:.40}"
            )
        born_text = line.born_host or options.default_born_host
        born_host = self.host(born_text)
        if born_host.problem:
            raise Rejection(born_host.problem)
        store_text = line.store_host or options.default_store_host
        store_host = self.host(store_text)
        if store_host.problem:
            raise Rejection(store_host.problem)

        queue_id = line.queue_id
        if queue_id is not None:
            if not JAVA_INT_MIN <= queue_id <= JAVA_INT_MAX:
                _reject_range("queueId", queue_id, JAVA_INT_MIN, JAVA_INT_MAX)
            if not 0 <= queue_id < queue_count:
                raise Rejection(f"queueId {queue_id} is out of range for topic {topic!r} with {queue_count} queues")
        key_list = [token for token in keys.split(KEY_SEPARATOR) if token] if keys else []
        if queue_id is None and keys:
            queue_id = self._key_queues.get((keys, queue_count))
            if queue_id is None:
                queue_id = select_queue_by_hash(keys, queue_count)
                if len(self._key_queues) < 1 << 20:
                    self._key_queues[(keys, queue_count)] = queue_id
        if info.compaction and not key_list:
            raise Rejection(f"topic {topic!r} has cleanup.policy COMPACTION and the message has no keys")

        uniq = line.uniq_key
        if uniq is not None:
            _check_property_text("field 'uniqKey'", uniq)
        if not uniq:
            prefix = self.uniq_prefix(born_host.address.address, file_hash32)
            try:
                month_start = month_start_millis(born_ts, options.timezone)
            except (ValueError, OverflowError):  # past the year 9999 in the zone: no calendar to count from
                raise Rejection(
                    f"field 'bornTimestamp' = {born_ts} is past the year 9999, so no UNIQ_KEY can be generated "
                    "for it; give the line a uniqKey"
                ) from None
            uniq = prefix + uniq_key_tail(timestamp_ms=born_ts, month_start_ms=month_start, counter=source_line)

        # The broker's HashMap: a repeated name keeps its first position and takes the last value.
        merged = _user_properties(line.properties)
        _scheduling_properties(merged, line)
        if keys:
            merged[KEYS] = keys
        if tags:
            merged[TAGS] = tags
        merged[UNIQ_KEY] = uniq
        if options.cluster_name:
            merged[CLUSTER] = options.cluster_name
        real_queue_round_robin = None
        moved = None  # where the broker stores the message instead of its topic and queue, with its pairs
        scheduled = DELAY in merged or not merged.keys().isdisjoint(TIMER_PROPERTIES)
        given_or_placeholder = queue_id if queue_id is not None else int(REAL_QID_PLACEHOLDER)
        if TRAN_MSG in merged and is_half_send(merged.items(), reconsume_times=reconsume):
            if scheduled:
                # the broker would move the half itself to the schedule topic, its REAL_TOPIC the half topic; a
                # transactional producer clears DELAY before it sends
                raise Rejection(
                    "a transactional half message (property TRAN_MSG) cannot carry a delay level or timer property"
                )
            moved = half(topic, given_or_placeholder, list(merged.items()), sys_flag=sys_flag)
            sys_flag = moved.sys_flag
        elif topic != SCHEDULE_TOPIC and scheduled:
            try:
                routed = route(
                    topic,
                    given_or_placeholder,
                    list(merged.items()),
                    sys_flag=sys_flag,
                    now_ms=store_ts,
                    rules=options.schedule,
                )
            except ScheduleRefused as refused:
                raise Rejection(f"the broker refuses this send: {refused}") from None
            moved = None if routed.kind == "plain" else routed
        if moved is not None:
            real_queue_round_robin = queue_id is None
            topic, queue_id, info = moved.topic, moved.queue_id, self.topic(moved.topic)
            properties = moved.properties  # in storage order
            properties_bytes = serialize_properties(properties)
        else:  # stored as sent (a PREPARED or ROLLBACK one, a timer already due): its map is unchanged
            names = tuple(merged)
            order, template = self.layout(names)
            values = [merged[name] for name in order]
            properties = list(zip(order, values, strict=True))
            properties_bytes = template.format(*values).encode("utf-8")
        if len(properties_bytes) > MAX_PROPERTIES_LENGTH:
            raise Rejection(f"properties of {len(properties_bytes)} bytes exceed the maximum {MAX_PROPERTIES_LENGTH}")

        if born_host.is_ipv6:
            sys_flag |= BORNHOST_V6_FLAG
        if store_host.is_ipv6:
            sys_flag |= STOREHOST_V6_FLAG
        fixed = self.fixed_size(info, born_host.is_ipv6, store_host.is_ipv6)
        size = fixed + len(body) + len(properties_bytes)  # record_size is linear in the two lengths
        if size > self.size_limit:
            self._reject_size(size)
        return ParsedMessage(
            topic,
            queue_id,
            flag,
            sys_flag,
            info.magic,
            born_ts,
            born_host.text,
            store_ts,
            store_host.text,
            store_host.msg_id_prefix,
            reconsume,
            prepared_offset,
            body,
            body_crc(body),
            properties,
            properties_bytes,
            key_list,
            tags,
            uniq,
            size,
            real_queue_round_robin,
        )

    # -- values worked out once (also used by the block route) --------------------------------

    def topic(self, topic: str) -> _Topic:
        """What the rules need of a topic: its problem if invalid, queue count, magic, UTF-8 length."""
        return self._topics.get(topic) or self._topic(topic)

    def host(self, text: str) -> _Host:
        """A host:port as given: its address, or the problem with it."""
        return self._hosts.get(text) or self._host(text)

    def layout(self, names: tuple[str, ...]) -> tuple[list[str], str]:
        """A property-name set (in insertion order): its storage order and serialisation template."""
        return self._orders.get(names) or self._layout(names)

    def uniq_prefix(self, address: bytes, file_hash32: int) -> str:
        """The fixed part of a generated UNIQ_KEY for a born host's address and an input file."""
        prefix = self._uniq_prefixes.get((address, file_hash32))
        if prefix is None:
            prefix = uniq_key_prefix(ip=address, pid=file_hash32 >> 16, class_loader_hash=file_hash32)
            self._uniq_prefixes[(address, file_hash32)] = prefix
        return prefix

    def fixed_size(self, info: _Topic, born_v6: bool, store_v6: bool) -> int:
        """The record size of a message of topic ``info`` without its body and properties."""
        fixed = self._sizes.get((info.length, born_v6, store_v6))
        return fixed if fixed is not None else self._fixed_size(info, born_v6, store_v6)

    def _layout(self, names: tuple[str, ...]) -> tuple[list[str], str]:
        order = [name for name, _ in hashmap_order((name, "") for name in names)]
        layout = (order, properties_template(order))
        if len(self._orders) < 65536:
            self._orders[names] = layout
        return layout

    def _topic(self, topic: str) -> _Topic:
        options = self.options
        problem = topic_error(topic)
        queue_count = options.queue_counts.get(topic, options.default_queue_count)
        if problem is None and queue_count is None:
            problem = f"topic {topic!r} is not in topics.yaml and broker.auto_create_topic_enable is false"
        info = _Topic(
            problem,
            queue_count,
            magic_for_topic(topic) if problem is None else 0,
            len(topic.encode("utf-8")),
            topic in options.compaction_topics,
        )
        self._topics[topic] = info
        return info

    def _host(self, text: str) -> _Host:
        try:
            address = parse_host(text)
        except ValueError as exc:
            host = _Host(None, str(exc), text, False, "")
        else:
            host = _Host(address, None, address.text, address.is_ipv6, offset_msg_id_prefix(address))
        if len(self._hosts) < 65536:
            self._hosts[text] = host
        return host

    def _fixed_size(self, info: _Topic, born_v6: bool, store_v6: bool) -> int:
        fixed = record_size(
            body_length=0,
            topic_length=info.length,
            properties_length=0,
            born_v6=born_v6,
            store_v6=store_v6,
            magic=info.magic,
        )
        self._sizes[(info.length, born_v6, store_v6)] = fixed
        return fixed

    def _reject_size(self, size: int) -> None:
        options = self.options
        limit = options.max_message_size + RECORD_OVERHEAD_ALLOWANCE
        if size > limit:
            raise Rejection(f"record of {size} bytes exceeds store.max_message_size + 64 KiB ({limit})")
        raise Rejection(
            f"record of {size} bytes cannot fit a commitlog segment of {options.segment_size} bytes "
            "(store.commitlog_segment_size)"
        )


def _decode_typed(raw: bytes | str) -> LineFields | None:
    try:
        return LINE_DECODER.decode(raw)
    except DECODE_REFUSED:
        return None


def _reject_range(name: str, value: int, minimum: int, maximum: int) -> None:
    raise Rejection(f"field '{name}' = {value} is outside {minimum}..{maximum}")


def _plain_string(raw: msgspec.Raw) -> bytes | None:
    """The UTF-8 bytes of a JSON string without escapes; ``None`` for anything else (absent, null, a number,
    escapes, bytes that are not UTF-8), which the json route then handles."""
    view = memoryview(raw)
    if len(view) < 2 or view[0] != 0x22:  # 0x22: '"'
        return None
    text = bytes(view[1:-1])  # one copy: the body
    if b"\\" in text:
        return None
    if not text.isascii():
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return text


def _scheduling_properties(merged: dict[str, str], line: LineFields) -> None:
    """The client's ``setDelayTimeLevel`` / ``setDeliverTimeMs``: fields ``delayLevel`` / ``deliverTimeMs`` become
    properties ``DELAY`` / ``TIMER_DELIVER_MS`` (a property of the same name given too must agree)."""
    for field_name, name, value, low in (
        ("delayLevel", DELAY, line.delay_level, 0),
        ("deliverTimeMs", TIMER_DELIVER_MS, line.deliver_time_ms, 0),
    ):
        if value is None:
            continue
        high = JAVA_INT_MAX if name == DELAY else JAVA_LONG_MAX
        if not low <= value <= high:
            _reject_range(field_name, value, low, high)
        if name == DELAY and value == 0:
            continue  # level 0: not delayed, as the client sends it
        given = merged.get(name)
        if given is not None and given != str(value):
            raise Rejection(f"field '{field_name}' = {value} and property {name} = {given!r} disagree")
        merged[name] = str(value)


def _check_property_text(what: str, text: str) -> None:
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        raise Rejection(f"{what} contains a property separator byte (0x01 or 0x02), which the broker cannot store")


def _user_properties(properties: dict[str, str] | None) -> dict[str, str]:
    if not properties:
        return {}
    merged = {}
    for name, text in properties.items():
        _check_property_text(f"property name {name!r}", name)
        _check_property_text(f"property '{name}'", text)
        if name and text:  # the broker's parser drops empty names and values
            merged[name] = text
    return merged


# -- the json route: lines msgspec refused, and lines whose bytes are not checked yet ----------


def _fields_from_json(raw: bytes | str) -> LineFields:
    """Decode with ``json`` and check every field's type, rejecting with the reason."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Rejection(f"line is not valid UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    if not text.strip():
        raise Rejection("empty line")
    if text.startswith("\ufeff"):
        raise Rejection("line starts with a UTF-8 byte order mark, which is skipped only at the start of a file")
    try:
        doc = loads_strict(text)
    except JsonTextError as exc:
        raise Rejection(_json_problem(exc, text)) from None
    if not isinstance(doc, dict):
        raise Rejection(f"a line must be a JSON object, got {type(doc).__name__}")
    return LineFields(
        topic=_str_field(doc, "topic"),
        body=_str_field(doc, "body"),
        body_encoding=_encoding_field(doc),
        keys=_keys_field(doc),
        tags=_str_field(doc, "tags"),
        born_timestamp=_int_field(doc, "bornTimestamp"),
        store_timestamp=_int_field(doc, "storeTimestamp"),
        flag=_int_field(doc, "flag"),
        reconsume_times=_int_field(doc, "reconsumeTimes"),
        prepared_transaction_offset=_int_field(doc, "preparedTransactionOffset"),
        transaction=_transaction_field(doc),
        born_host=_str_field(doc, "bornHost"),
        store_host=_str_field(doc, "storeHost"),
        queue_id=_int_field(doc, "queueId"),
        uniq_key=_str_field(doc, "uniqKey"),
        properties=_properties_field(doc),
        delay_level=_int_field(doc, "delayLevel"),
        deliver_time_ms=_int_field(doc, "deliverTimeMs"),
        end_transaction=_str_field(doc, "endTransaction"),
        producer_group=_str_field(doc, "producerGroup"),
        from_transaction_check=_bool_field(doc, "fromTransactionCheck"),
    )


# The fields of an end line besides endTransaction, uniqKey and storeTimestamp: the optional ones are allowed.
_END_LINE_OPTIONAL = ("topic", "producer_group", "from_transaction_check")
# the other fields, (name, JSON name), in declaration order: the first one a line has is named in its rejection
_END_LINE_OTHERS = tuple(
    (name, json_name)
    for name, json_name in zip(LineFields.__struct_fields__, LineFields.__struct_encode_fields__, strict=True)
    if name not in ("end_transaction", "uniq_key", "store_timestamp", *_END_LINE_OPTIONAL)
)


def _end_line(line: LineFields, *, typed: bool) -> EndTransaction:
    """An ``endTransaction`` line's fields, checked (``typed``: decoded by msgspec, whose absent body is empty)."""
    kind = line.end_transaction
    if kind not in END_KINDS:
        raise Rejection(f"field 'endTransaction' must be COMMIT or ROLLBACK, got {kind!r:.40}")
    absent_body = msgspec.Raw(b"") if typed else None
    for name, json_name in _END_LINE_OTHERS:
        value = getattr(line, name)
        if value is not None and not (name == "body" and value == absent_body):
            raise Rejection(
                f"an endTransaction line names the half by uniqKey and has no message fields; it has '{json_name}'"
            )
    if not line.uniq_key:
        raise Rejection("an endTransaction line needs 'uniqKey': the UNIQ_KEY of the half message it ends")
    stamp = line.store_timestamp
    if stamp is None:
        raise Rejection("an endTransaction line needs 'storeTimestamp': when the broker ends the transaction")
    if not 0 <= stamp <= JAVA_LONG_MAX:
        _reject_range("storeTimestamp", stamp, 0, JAVA_LONG_MAX)
    return EndTransaction(
        kind, line.uniq_key, stamp, line.topic, line.producer_group, bool(line.from_transaction_check)
    )


def _json_problem(exc: JsonTextError, text: str) -> str:
    if exc.path:
        inside = "".join(f"[{part!r}]" for part in exc.path[1:])
        return f"field '{exc.path[0]}'{inside} is {exc.reason}"
    where = exc.where(text)
    return f"malformed JSON: {exc.reason} (column {where[1]})" if where else exc.reason


def _int_field(doc: dict, name: str) -> int | None:
    value = doc.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise Rejection(f"field '{name}' must be an integer, got {type(value).__name__} {value!r:.40}")
    return value


def _str_field(doc: dict, name: str) -> str | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise Rejection(f"field '{name}' must be a string, got {type(value).__name__}")
    return value


def _bool_field(doc: dict, name: str) -> bool | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, bool):
        raise Rejection(f"field '{name}' must be true or false, got {type(value).__name__} {value!r:.40}")
    return value


def _encoding_field(doc: dict) -> str | None:
    value = doc.get("bodyEncoding")
    if value is not None and value not in ("utf8", "utf-8", "base64"):
        raise Rejection(f"field 'bodyEncoding' must be 'utf8' or 'base64', got {value!r}")
    return value


def _transaction_field(doc: dict) -> str | None:
    value = doc.get("transaction")
    if value is not None and (not isinstance(value, str) or value not in TRANSACTION_TYPES):
        raise Rejection(f"field 'transaction' must be one of {', '.join(TRANSACTION_TYPES)}, got {value!r:.40}")
    return value


def _keys_field(doc: dict) -> str | list[str] | None:
    value = doc.get("keys")
    if isinstance(value, list):
        for token in value:
            if not isinstance(token, str):
                raise Rejection(f"field 'keys' must be a string or a list of strings, found {type(token).__name__}")
    elif value is not None and not isinstance(value, str):
        raise Rejection(f"field 'keys' must be a string or a list of strings, got {type(value).__name__}")
    return value


def _properties_field(doc: dict) -> dict[str, str] | None:
    value = doc.get("properties")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Rejection(f"field 'properties' must be an object of strings, got {type(value).__name__}")
    for name, text in value.items():
        if not isinstance(text, str):
            raise Rejection(f"property '{name}' must be a string, got {type(text).__name__}")
    return value
