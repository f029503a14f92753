"""How a ``commitlog`` row and a broker record correspond, both ways (the export encodes rows, the import
decodes records into rows)."""

from __future__ import annotations

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.properties import property_columns
from rmqlake.formats.record import Record
from rmqlake.lake.tables import COMMITLOG

# the stored columns a record's bytes come from (the rest are derived from them or are provenance)
RECORD_COLUMNS = [
    name
    for name in COMMITLOG.schema.stored.names  # derived columns (store_time, ...) are not record bytes
    if name not in ("segment", "properties", "keys", "tags", "uniq_key", "msg_id", "batch_id")
    and not name.startswith("source_")
]
# rows per Arrow batch, read from Parquet or built from a commitlog file
READ_BATCH_ROWS = 2048


def record_from_row(row: dict) -> Record:
    """The record of a ``commitlog`` row: its stored fields and stored properties bytes (bytes as written)."""
    return Record(
        topic=row["topic"],
        queue_id=row["queue_id"],
        flag=row["flag"],
        queue_offset=row["queue_offset"],
        physical_offset=row["physical_offset"],
        sys_flag=row["sys_flag"],
        born_timestamp=row["born_timestamp"],
        born_host=parse_host(row["born_host"]),
        store_timestamp=row["store_timestamp"],
        store_host=parse_host(row["store_host"]),
        reconsume_times=row["reconsume_times"],
        prepared_transaction_offset=row["prepared_transaction_offset"],
        body=row["body"] or b"",
        properties=row["properties_bytes"] or b"",
        magic=row["magic"],
        body_crc=row["body_crc"],
    )


def row_from_record(segment: str, path: str, ordinal: int, record: Record, properties: dict[str, str]) -> dict:
    """The ``commitlog`` row of a decoded record (plus the import's ``blank_end``/``corrupt_reason`` flags).

    ``ordinal`` (the record's number in its file) is the row's ``source_line``.
    """
    return {
        "segment": segment,
        "physical_offset": record.physical_offset,
        "total_size": record.total_size,
        "magic": record.magic,
        "body_crc": record.body_crc,
        "queue_id": record.queue_id,
        "flag": record.flag,
        "queue_offset": record.queue_offset,
        "sys_flag": record.sys_flag,
        "born_timestamp": record.born_timestamp,
        "born_host": record.born_host.text,
        "store_timestamp": record.store_timestamp,
        "store_host": record.store_host.text,
        "reconsume_times": record.reconsume_times,
        "prepared_transaction_offset": record.prepared_transaction_offset,
        "body": record.body,
        "topic": record.topic,
        **property_columns(properties),
        "msg_id": offset_msg_id(record.store_host, record.physical_offset),
        "source_file": path,
        "source_line": ordinal,
        "properties_bytes": record.properties,
        "blank_end": False,
        "corrupt_reason": None,
    }
