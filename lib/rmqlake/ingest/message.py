"""What a producer log line is and what a valid line becomes: the message model both parse routes share.

``LineFields`` is a line's JSON shape; ``PARSED_MESSAGE`` is an accepted line's record fields, taken from the
commitlog's column declarations: ``ParsedMessage`` (its row type) and ``MESSAGE_TYPES`` (its Arrow types)
derive from it, so a new message field is declared once for the per-line route (``lines``), the column-wise
route (``blocks``) and the scratch files between tasks.
"""

from __future__ import annotations

import msgspec

from rmqlake.lake.tables import COMMITLOG, Column

# A valid line: every record field known before the message is placed in the log, in the order the per-line
# parser builds them (rows are zipped with the columns by position). The commitlog's own declarations, plus
# the offsetMsgId's host half, which the placement completes with the physical offset.
STORE_HOST_PREFIX = Column(
    "store_host_prefix", "string", "the offsetMsgId's first half: store host address and port, upper-case hex"
)
REAL_QUEUE_ROUND_ROBIN = Column(
    "real_queue_round_robin",
    "boolean",
    "a re-routed message sent without a queue: its REAL_QID is the round-robin turn of its real topic at append",
)
PARSED_MESSAGE = COMMITLOG.schema.select(
    [
        "topic",
        "queue_id",
        "flag",
        "sys_flag",
        "magic",
        "born_timestamp",
        "born_host",
        "store_timestamp",
        "store_host",
        STORE_HOST_PREFIX,
        "reconsume_times",
        "prepared_transaction_offset",
        "body",
        "body_crc",
        "properties",
        "properties_bytes",
        "keys",
        "tags",
        "uniq_key",
        "total_size",
        REAL_QUEUE_ROUND_ROBIN,
    ]
)
ParsedMessage = PARSED_MESSAGE.record_type(
    "ParsedMessage",
    """A valid line's record fields (``PARSED_MESSAGE``).

    ``queue_id`` is ``None`` when the queue is chosen round robin at append time.
    ``properties`` are the stored (name, value) pairs in storage order.
    (A tuple, so that Spark tasks turn thousands of them into columns cheaply.)
    """,
)
MESSAGE_TYPES = {field.name: field.type for field in PARSED_MESSAGE.arrow_schema}
MESSAGE_FIELDS = list(MESSAGE_TYPES.items())  # (name, Arrow type) of a ParsedMessage's fields, in its order


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
    delay_level: int | None = None
    deliver_time_ms: int | None = None
    # an end line (``EndTransaction``): these, ``uniqKey``, ``storeTimestamp`` and optionally ``topic``
    end_transaction: str | None = None
    producer_group: str | None = None
    from_transaction_check: bool | None = None


LINE_DECODER = msgspec.json.Decoder(LineFields)


# msgspec raises UnicodeDecodeError for bad UTF-8 in a string, RecursionError for deep nesting (where depends on
# the stack): the json route then decides, with a fixed nesting limit.
DECODE_REFUSED = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
