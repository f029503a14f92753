"""What a producer log line is and what a valid line becomes: the message model both parse routes share.

``LineFields`` is a line's JSON shape; ``ParsedMessage`` is an accepted line's record fields, and
``MESSAGE_TYPES`` their Arrow types, so a new message field is declared here once for the per-line
route (``lines``), the column-wise route (``blocks``) and the scratch files between tasks.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import pyarrow as pa


class ParsedMessage(NamedTuple):
    """A valid line: every record field known before the message is placed in the log.

    ``queue_id`` is ``None`` when the queue is chosen round robin at append time.
    ``properties`` are the stored (name, value) pairs in storage order.
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
    properties: list[tuple[str, str]]
    properties_bytes: bytes
    keys: list[str]
    tags: str | None
    uniq_key: str
    total_size: int


# The Arrow type of each message column, in ``ParsedMessage``'s field order (the per-line rows are zipped by position).
MESSAGE_TYPES = {
    "topic": pa.string(),
    "queue_id": pa.int32(),
    "flag": pa.int32(),
    "sys_flag": pa.int32(),
    "magic": pa.int32(),
    "born_timestamp": pa.int64(),
    "born_host": pa.string(),
    "store_timestamp": pa.int64(),
    "store_host": pa.string(),
    "store_host_prefix": pa.string(),
    "reconsume_times": pa.int32(),
    "prepared_transaction_offset": pa.int64(),
    "body": pa.binary(),
    "body_crc": pa.int32(),
    "properties": pa.map_(pa.string(), pa.string()),
    "properties_bytes": pa.binary(),
    "keys": pa.list_(pa.field("element", pa.string())),
    "tags": pa.string(),
    "uniq_key": pa.string(),
    "total_size": pa.int32(),
}


class LineFields(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A line's fields with their JSON types checked; ``None`` when absent or null.

    msgspec decodes a line straight into this: types checked in C, a
    repeated name keeps its last value as ``json`` does, and every string is
    decoded, so an accepted line is valid UTF-8 throughout. Unknown fields
    are refused because msgspec would skip them without checking their
    UTF-8: a line it refuses takes the slower ``json`` route, which ignores
    unknown fields, checks the whole line and says why a line is bad.
    """

    topic: str | None = None
    queue_id: int | None = None
    # The body as its raw JSON text: a plain string is copied, not decoded to str and encoded back.
    body: msgspec.Raw = msgspec.Raw(b"")
    body_encoding: str | None = None
    keys: str | list[str] | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None
    uniq_key: str | None = None
    flag: int | None = None
    born_timestamp: int | None = None
    store_timestamp: int | None = None
    born_host: str | None = None
    store_host: str | None = None
    reconsume_times: int | None = None
    prepared_transaction_offset: int | None = None
    transaction: str | None = None


LINE_DECODER = msgspec.json.Decoder(LineFields)


# msgspec raises UnicodeDecodeError for bad UTF-8 in a string, RecursionError for deep nesting (where depends on
# the stack): the json route then decides, with a fixed nesting limit.
DECODE_REFUSED = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
MESSAGE_FIELDS = list(MESSAGE_TYPES.items())  # (name, Arrow type) of a ParsedMessage's fields, in its order
