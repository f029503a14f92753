"""Table definitions: name, schema and partition columns of every lake table.

Schemas are Spark DDL so they read like the contract; ``arrow_schema``
derives the Arrow/Delta schema used when a table is created. Columns
beyond the contract are marked ``extra``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa

MESSAGE_COLUMNS = """
    physical_offset bigint, total_size int, magic int, body_crc int, queue_id int, flag int,
    queue_offset bigint, sys_flag int, born_timestamp bigint, born_host string,
    store_timestamp bigint, store_host string, reconsume_times int,
    prepared_transaction_offset bigint, body binary, topic string,
    properties map<string,string>, keys array<string>, tags string, uniq_key string,
    msg_id string, batch_id string, source_file string, source_line bigint,
    properties_bytes binary
"""


# Every table is created with these properties, by either engine: the plain protocol (reader 1, writer 2, no
# table features) that every reader of the lake opens (delta-rs, Spark, DuckDB and Polars through delta-rs).
# Deletion vectors would raise it to reader 3 / writer 7 with features, and a DELETE by Spark on a cluster
# whose session defaults turn them on would write them; pinned off here. Delta enables the other features
# (row tracking, in-commit timestamps, v2 checkpoints) only when asked; they are not named at all, because
# delta-rs 1.6 cannot even parse those properties (its kernel rejects "delta.enableRowTracking": "false").
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false"}


@dataclass(frozen=True)
class TableSpec:
    """A lake table: its folder name, columns (Spark DDL) and partition columns."""

    name: str
    ddl: str
    partition_by: tuple[str, ...] = ()
    description: str = ""

    @cached_property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """(column, Spark type) pairs in table order."""
        return tuple(tuple(column.split(" ", 1)) for column in _split_top_level(" ".join(self.ddl.split())))

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(name, _arrow_type(spark_type)) for name, spark_type in self.fields])

    @property
    def spark_schema(self) -> str:
        """The schema as Spark DDL (``name type, ...``)."""
        return ", ".join(f"{name} {spark_type}" for name, spark_type in self.fields)

    @property
    def columns(self) -> list[str]:
        return [name for name, _ in self.fields]


_SPARK_TO_ARROW = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "smallint": pa.int16(),
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "double": pa.float64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def _split_top_level(text: str, separator: str = ",") -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        if char == separator and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _arrow_type(spark_type: str) -> pa.DataType:
    spark_type = spark_type.strip()
    if spark_type.startswith("array<"):
        return pa.list_(pa.field("element", _arrow_type(spark_type[6:-1])))
    if spark_type.startswith("map<"):
        key, value = _split_top_level(spark_type[4:-1])
        return pa.map_(_arrow_type(key), _arrow_type(value))
    return _SPARK_TO_ARROW[spark_type]


COMMITLOG = TableSpec(
    "commitlog",
    "segment string, " + MESSAGE_COLUMNS,
    ("segment",),
    "one row per stored message; properties_bytes (extra) are the stored properties bytes",
)
SEGMENTS = TableSpec(
    "segments",
    """segment string, start_offset bigint, end_offset bigint, size_bytes bigint, message_count bigint,
    padding_bytes bigint, first_store_timestamp bigint, last_store_timestamp bigint, status string,
    deleted_at timestamp, deleted_reason string, retained_reason string, retained_at timestamp""",
    (),
    "one row per commitlog segment ever opened; retained_reason (extra): why expiry kept it past its reserved time",
)
REJECTED = TableSpec(
    "rejected",
    "batch_id string, source_file string, source_line bigint, raw string, reason string, rejected_at timestamp",
    (),
    "input lines that could not become messages",
)
INGEST_FILES = TableSpec(
    "ingest_files",
    """path string, size_bytes bigint, sha256 string, batch_id string, lines bigint, messages bigint,
    rejected bigint, ingested_at timestamp""",
    (),
    "extra: every input file ingested, so a re-run of the same files changes nothing",
)

CONSUMEQUEUE = TableSpec(
    "consumequeue",
    """topic string, queue_id int, queue_offset bigint, commitlog_offset bigint, size int, tags_code bigint,
    store_timestamp bigint, cq_file string""",
    ("topic", "queue_id"),
    "one 20-byte ConsumeQueue unit per dispatchable message; files sorted by queue_offset",
)
INDEXFILE = TableSpec(
    "indexfile",
    """index_file string, index_no int, key_hash int, slot int, phy_offset bigint, time_diff int, prev_index int,
    topic string, store_timestamp bigint""",
    ("index_file",),
    "one IndexFile entry per index key; files sorted by slot so a key lookup reads few row groups "
    "(store_timestamp is extra)",
)
INDEXFILE_HEADER = TableSpec(
    "indexfile_header",
    """index_file string, begin_timestamp bigint, end_timestamp bigint, begin_phy_offset bigint, end_phy_offset bigint,
    hash_slot_count int, index_count int""",
    (),
    "one 40-byte IndexFile header per index file",
)

COMPACTION_LOG = TableSpec(
    "compaction_log",
    "segment string, " + MESSAGE_COLUMNS,
    ("topic", "queue_id"),
    "the latest message per KEYS of each COMPACTION topic queue: commitlog columns, original offsets kept",
)
COMPACTION_CQ = TableSpec(
    "compaction_cq",
    CONSUMEQUEUE.ddl,
    ("topic", "queue_id"),
    "units of the compacted queues: original queue offsets (with gaps); cq_file is the sparse queue file "
    "(46-byte units in compactionCqMappedFileSize files)",
)
CONSUMER_OFFSETS = TableSpec(
    "consumer_offsets",
    "topic string, group string, queue_id int, offset bigint, as_of timestamp, source_file string",
    (),
    "consumer offset snapshots (consumerOffset.json), one row per group, topic, queue and snapshot "
    "(source_file is extra)",
)

DQ_RESULTS = TableSpec(
    "dq_results",
    """run_id string, suite string, table_name string, expectation string, success boolean, observed string,
    severity string, table_version bigint, checked_at timestamp""",
    (),
    "one row per expectation per quality run; observed: the GX result (counts, unexpected values) as JSON",
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        COMMITLOG,
        SEGMENTS,
        REJECTED,
        INGEST_FILES,
        CONSUMEQUEUE,
        INDEXFILE,
        INDEXFILE_HEADER,
        COMPACTION_LOG,
        COMPACTION_CQ,
        CONSUMER_OFFSETS,
        DQ_RESULTS,
    )
}


def table_spec(name: str) -> TableSpec:
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; tables: {', '.join(sorted(TABLES))}") from None
