"""Table definitions: name, columns and partition columns of every lake table.

Each column is declared once, with its Spark SQL type and a one-line comment; a ``Schema`` (an ordered
set of columns, a table's or an intermediate frame's) yields the Spark DDL, the Arrow schema, the
comments and a Python record type from them. Both engines create the tables with the comments as Delta
field metadata and the description as the table's. Columns beyond what a broker stores are marked
``extra`` in the table descriptions.

A column ``derived_from`` another is computed from it when rows are staged (``Schema.complete`` for Arrow
writers, ``spark_io.stage_dataframe`` for Spark ones), never by the code that builds the rows: e.g. the
TIMESTAMP ``store_time`` beside the epoch-millisecond ``store_timestamp`` the broker stores.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Column:
    """One column: name, Spark SQL type, and what it holds (in RocketMQ terms where it applies).

    ``derived_from`` names the epoch-millisecond column a ``timestamp`` column is the same instant of.
    """

    name: str
    type: str
    comment: str
    derived_from: str | None = None

    def __post_init__(self):
        if self.derived_from is not None and self.type != "timestamp":
            raise ValueError(f"{self.name}: only a timestamp column is derived (from epoch milliseconds)")

    @property
    def arrow_type(self) -> pa.DataType:
        return _arrow_type(self.type)

    @property
    def arrow_field(self) -> pa.Field:
        """The column as an Arrow field with its comment as field metadata (what delta-rs writes to the schema)."""
        return pa.field(self.name, self.arrow_type, metadata={"comment": self.comment})

    @property
    def commented_ddl(self) -> str:
        """``name type COMMENT '...'``: Spark DDL whose schema carries the comment as field metadata."""
        quoted = self.comment.replace("\\", "\\\\").replace("'", "\\'")
        return f"`{self.name}` {self.type} COMMENT '{quoted}'"

    @property
    def python_type(self) -> type:
        return _python_type(self.type)


@dataclass(frozen=True)
class Schema:
    """Columns in order: a table's, or a frame's between tasks."""

    columns: tuple[Column, ...]

    def __post_init__(self):
        names = [column.name for column in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"repeated column in {names}")

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """(column, Spark type) pairs in order."""
        return tuple((column.name, column.type) for column in self.columns)

    @property
    def ddl(self) -> str:
        """The schema as Spark DDL (``name type, ...``)."""
        return ", ".join(f"{column.name} {column.type}" for column in self.columns)

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(column.name, column.arrow_type) for column in self.columns])

    @property
    def commented_arrow_schema(self) -> pa.Schema:
        """The Arrow schema with each column's comment as field metadata."""
        return pa.schema([column.arrow_field for column in self.columns])

    @property
    def commented_ddl(self) -> str:
        """Spark DDL with each column's comment."""
        return ", ".join(column.commented_ddl for column in self.columns)

    @property
    def comments(self) -> dict[str, str]:
        return {column.name: column.comment for column in self.columns}

    @property
    def derived(self) -> tuple[Column, ...]:
        """The columns computed from another column of the schema when rows are staged."""
        return tuple(column for column in self.columns if column.derived_from is not None)

    @property
    def stored(self) -> Schema:
        """The columns that row builders provide: all but the derived ones."""
        return Schema(tuple(column for column in self.columns if column.derived_from is None))

    def complete(self, data: pa.Table) -> pa.Table:
        """``data`` as this schema: its columns in order, derived columns computed from their sources.

        A derived column ``data`` already holds is computed again, so a copied row never keeps a value
        that disagrees with its source.
        """
        arrays = [
            derive_timestamp(data.column(column.derived_from)) if column.derived_from else data.column(column.name)
            for column in self.columns
        ]
        return pa.Table.from_arrays(arrays, schema=self.viewed_arrow_schema(arrays))

    def viewed_arrow_schema(self, arrays: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Schema:
        """``arrow_schema``, with each binary column that ``arrays`` (one per column) hold as ``binary_view`` typed
        so: values gathered as views into other buffers, not copied. Parquet stores both types alike; written
        without the Arrow schema in the file's metadata, the file is the same bytes either way."""
        return pa.schema(
            [
                field.with_type(array.type) if field.type == pa.binary() and array.type == pa.binary_view() else field
                for field, array in zip(self.arrow_schema, arrays, strict=True)
            ]
        )

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"no column {name!r}; columns: {', '.join(self.names)}")

    def select(self, names: Iterable[str | Column]) -> Schema:
        """The named columns, in the order given; a ``Column`` given instead of a name is taken as it is."""
        return Schema(tuple(self.column(name) if isinstance(name, str) else name for name in names))

    def without(self, *names: str) -> Schema:
        return Schema(tuple(column for column in self.columns if column.name not in names))

    def __add__(self, other: Schema | Iterable[Column]) -> Schema:
        return Schema(self.columns + tuple(other.columns if isinstance(other, Schema) else other))

    def record_type(self, name: str, doc: str = "") -> type:
        """A NamedTuple of these columns (a plain tuple per row: cheap to build by the million)."""
        record = NamedTuple(name, [(column.name, column.python_type) for column in self.columns])
        record.__doc__ = doc or record.__doc__
        return record


def columns(*declared: tuple[str, str, str] | Column) -> Schema:
    """A schema from (name, Spark type, comment) triples (or ``Column``s, for derived ones)."""
    return Schema(tuple(column if isinstance(column, Column) else Column(*column) for column in declared))


# The epoch milliseconds a timestamp column holds: years 1 to 9999, what Spark, Delta readers and Python's
# datetime represent. A producer may give a bornTimestamp up to Long.MAX_VALUE; its timestamp is null.
TIMESTAMP_MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)


def derive_timestamp(epoch_ms: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    """Epoch milliseconds as UTC timestamps (microseconds, as Spark and Delta keep them): the same instant.

    Null outside ``TIMESTAMP_MS_RANGE`` (and where the milliseconds are null). The Spark writers compute the
    same with ``timestamp_millis`` (``spark_io.derived_column``).
    """
    millis = pc.cast(epoch_ms, pa.int64())
    low, high = TIMESTAMP_MS_RANGE
    representable = pc.and_(pc.greater_equal(millis, low), pc.less_equal(millis, high))
    kept = pc.if_else(representable, millis, pa.scalar(None, pa.int64()))
    result = pc.cast(kept.cast(pa.timestamp("ms", tz="UTC")), pa.timestamp("us", tz="UTC"))
    return result if isinstance(result, pa.ChunkedArray) else pa.chunked_array([result])


# Every table is created with these properties, by either engine: the plain protocol (reader 1, writer 2, no
# table features) that every reader of the lake opens (delta-rs, Spark, DuckDB and Polars through delta-rs).
# Deletion vectors would raise it to reader 3 / writer 7 with features, and a DELETE by Spark on a cluster
# whose session defaults turn them on would write them; pinned off here. Delta enables the other features
# (row tracking, in-commit timestamps, v2 checkpoints) only when asked; they are not named at all, because
# delta-rs 1.6 cannot even parse those properties (its kernel rejects "delta.enableRowTracking": "false").
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false"}


@dataclass(frozen=True)
class TableSpec:
    """A lake table: its folder name, columns and partition columns."""

    name: str
    schema: Schema
    partition_by: tuple[str, ...] = ()
    description: str = ""

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """(column, Spark type) pairs in table order."""
        return self.schema.fields

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.schema.arrow_schema

    @property
    def spark_schema(self) -> str:
        """The schema as Spark DDL (``name type, ...``)."""
        return self.schema.ddl

    @property
    def columns(self) -> list[str]:
        return self.schema.names

    @property
    def comments(self) -> dict[str, str]:
        return self.schema.comments


def schema_differences(spec: TableSpec, *, fields: dict[str, str], partition_by: list[str]) -> list[str]:
    """How a table's Delta schema (column name -> type name) and partition columns differ from ``spec``.

    Types are compared by name (``long``, ``timestamp``, ``array``, ...): a table made by another rmqlake
    version differs in columns or partitioning, not in how a type is nested. Empty when they match.
    """
    declared = {name: _DELTA_TYPE_NAMES.get(kind.split("<")[0], kind) for name, kind in spec.fields}
    found = []
    missing = [name for name in declared if name not in fields]
    unknown = [name for name in fields if name not in declared]
    changed = [
        f"{name} is {fields[name]}, not {declared[name]}"
        for name in declared
        if name in fields and fields[name] != declared[name]
    ]
    if missing:
        found.append("it lacks the columns " + ", ".join(f"{n} ({spec.schema.column(n).type})" for n in missing))
    if unknown:
        found.append("it has columns rmqlake no longer writes: " + ", ".join(unknown))
    if changed:
        found.append("types differ: " + "; ".join(changed))
    if list(partition_by) != list(spec.partition_by):
        found.append(
            f"it is partitioned by ({', '.join(partition_by)}), rmqlake writes it partitioned by "
            f"({', '.join(spec.partition_by)})"
        )
    return found


# Delta's names of the Spark SQL types (the ``type`` of a Delta schema field; nested types by their kind).
_DELTA_TYPE_NAMES = {"bigint": "long", "int": "integer", "smallint": "short", "array": "array", "map": "map"}


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
_SPARK_TO_PYTHON = {
    "int": int,
    "bigint": int,
    "smallint": int,
    "string": str,
    "binary": bytes,
    "boolean": bool,
    "double": float,
    "timestamp": object,
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


def _python_type(spark_type: str) -> type:
    spark_type = spark_type.strip()
    if spark_type.startswith("array<"):
        return list[_python_type(spark_type[6:-1])]
    if spark_type.startswith("map<"):
        # a row holds a map as (key, value) pairs in their order: what Arrow builds a map column from
        key, value = _split_top_level(spark_type[4:-1])
        return list[tuple[_python_type(key), _python_type(value)]]
    return _SPARK_TO_PYTHON[spark_type]


# The columns of one stored message (commitlog and compaction_log rows), in table order.
MESSAGE_COLUMNS = columns(
    ("physical_offset", "bigint", "the record's start in the CommitLog: its commitLogOffset (PHYSICALOFFSET)"),
    ("total_size", "int", "TOTALSIZE: the record's length in bytes, this field included"),
    ("magic", "int", "MAGICCODE: the record layout version (V1, or V2 for topics longer than 127 characters)"),
    ("body_crc", "int", "BODYCRC: the CRC32 of the body as the broker stores it"),
    ("queue_id", "int", "QUEUEID: the queue of the topic the message was put in"),
    ("flag", "int", "FLAG: the producer's message flag, stored as given"),
    ("queue_offset", "bigint", "QUEUEOFFSET: position in the ConsumeQueue of (topic, queue_id)"),
    ("sys_flag", "int", "SYSFLAG: transaction type, compression and the IPv6 host bits (MessageSysFlag)"),
    ("born_timestamp", "bigint", "BORNTIMESTAMP: when the producer created the message, epoch milliseconds"),
    Column("born_time", "timestamp", "born_timestamp as a UTC timestamp (extra)", derived_from="born_timestamp"),
    ("born_host", "string", "BORNHOST: the producer's address, host:port"),
    ("store_timestamp", "bigint", "STORETIMESTAMP: when the broker stored the message, epoch milliseconds"),
    Column("store_time", "timestamp", "store_timestamp as a UTC timestamp (extra)", derived_from="store_timestamp"),
    ("store_host", "string", "STOREHOST: the broker's address, host:port"),
    ("reconsume_times", "int", "RECONSUMETIMES: how many times the message was redelivered"),
    ("prepared_transaction_offset", "bigint", "PREPAREDTRANSACTIONOFFSET: the half message's offset, for a commit"),
    ("body", "binary", "BODY: the message body bytes as stored"),
    ("topic", "string", "TOPIC: the topic name"),
    ("properties", "map<string,string>", "PROPERTIES, as name → value (TAGS, KEYS, UNIQ_KEY, ...)"),
    ("keys", "array<string>", "the KEYS property split on spaces: what the IndexFile indexes"),
    ("tags", "string", "the TAGS property, or null"),
    ("uniq_key", "string", "the UNIQ_KEY property: the client's msgId"),
    ("msg_id", "string", "the offsetMsgId: store host and physical offset, in hex"),
    ("batch_id", "string", "extra: the ingest batch that wrote the message"),
    ("source_file", "string", "extra: the producer log file of the message ('(scheduled delivery)': see source_line)"),
    ("source_line", "bigint", "extra: its 1-based line number there ('(scheduled delivery)': its message's offset)"),
    ("properties_bytes", "binary", "extra: the PROPERTIES field's bytes, exactly as stored"),
)
SEGMENT = Column("segment", "string", "the CommitLog file name: its start offset, 20 digits")

COMMITLOG = TableSpec(
    "commitlog",
    Schema((SEGMENT,)) + MESSAGE_COLUMNS,
    ("segment",),
    "one row per stored message; properties_bytes (extra) are the stored properties bytes; store_time and "
    "born_time (extra) are the epoch-millisecond times as timestamps",
)
SEGMENTS = TableSpec(
    "segments",
    Schema((SEGMENT,))
    + columns(
        ("start_offset", "bigint", "the segment's first physical offset"),
        ("end_offset", "bigint", "the active segment's write position, or the segment end once sealed"),
        ("size_bytes", "bigint", "end_offset - start_offset"),
        ("message_count", "bigint", "records written to the segment"),
        ("padding_bytes", "bigint", "bytes after the last record of a sealed segment (8-byte BLANK_MAGIC + zeros)"),
        ("first_store_timestamp", "bigint", "storeTimestamp of the first record, epoch milliseconds"),
        ("last_store_timestamp", "bigint", "storeTimestamp of the last record, epoch milliseconds"),
        ("status", "string", "active (the one being written), sealed or deleted"),
        ("deleted_at", "timestamp", "when expiry deleted the segment"),
        ("deleted_reason", "string", "why: expired (fileReservedTime), disk pressure, forced or manual"),
        ("retained_reason", "string", "extra: why expiry kept the segment past its reserved time"),
        ("retained_at", "timestamp", "extra: when expiry last kept it"),
    ),
    (),
    "one row per commitlog segment ever opened; retained_reason (extra): why expiry kept it past its reserved time",
)
REJECTED = TableSpec(
    "rejected",
    columns(
        ("batch_id", "string", "the ingest batch that read the line"),
        ("source_file", "string", "the producer log file"),
        ("source_line", "bigint", "the 1-based line number"),
        ("raw", "string", "the line as read (invalid UTF-8 replaced)"),
        ("reason", "string", "why the line cannot become a message"),
        ("rejected_at", "timestamp", "when the batch ran"),
    ),
    (),
    "input lines that could not become messages",
)
INGEST_FILES = TableSpec(
    "ingest_files",
    columns(
        ("path", "string", "the input file as given or discovered"),
        ("size_bytes", "bigint", "its size when read"),
        ("sha256", "string", "the SHA-256 of its content"),
        ("batch_id", "string", "the ingest batch that read it"),
        ("lines", "bigint", "lines read"),
        ("messages", "bigint", "lines that became messages"),
        ("rejected", "bigint", "lines rejected"),
        ("ingested_at", "timestamp", "when the batch ran"),
    ),
    (),
    "extra: every input file ingested, so a re-run of the same files changes nothing",
)

CONSUMEQUEUE = TableSpec(
    "consumequeue",
    columns(
        ("topic", "string", "the topic of the queue"),
        ("queue_id", "int", "the queue"),
        ("queue_offset", "bigint", "the unit's position in the ConsumeQueue of (topic, queue_id)"),
        ("commitlog_offset", "bigint", "the message's physical offset in the CommitLog (the unit's first 8 bytes)"),
        ("size", "int", "the message's total size (the unit's next 4 bytes)"),
        ("tags_code", "bigint", "the tags hash code, or the delivery time of a delayed message (last 8 bytes)"),
        ("store_timestamp", "bigint", "the message's storeTimestamp, epoch milliseconds"),
        ("cq_file", "string", "the ConsumeQueue file name: its start offset in bytes, 20 digits"),
    ),
    ("topic", "queue_id", "cq_file"),
    "one 20-byte ConsumeQueue unit per dispatchable message; files sorted by queue_offset",
)
INDEXFILE = TableSpec(
    "indexfile",
    columns(
        ("index_file", "string", "the IndexFile name: the creation time, yyyyMMddHHmmssSSS"),
        ("index_no", "int", "the entry's number in the file (its indexCount when written, from 1)"),
        ("key_hash", "int", "abs(String.hashCode) of topic#key"),
        ("slot", "int", "the hash slot: key_hash % hashSlotNum"),
        ("phy_offset", "bigint", "the message's physical offset in the CommitLog"),
        ("time_diff", "int", "seconds from the file's beginTimestamp to the message's storeTimestamp"),
        ("prev_index", "int", "the slot's previous entry (the chain a lookup walks); 0 ends it"),
        ("topic", "string", "the message's topic"),
        ("store_timestamp", "bigint", "extra: the message's storeTimestamp, epoch milliseconds"),
    ),
    ("index_file",),
    "one IndexFile entry per index key; files sorted by slot so a key lookup reads few row groups "
    "(store_timestamp is extra)",
)
INDEXFILE_HEADER = TableSpec(
    "indexfile_header",
    columns(
        ("index_file", "string", "the IndexFile name: the creation time, yyyyMMddHHmmssSSS"),
        ("begin_timestamp", "bigint", "beginTimestamp: storeTimestamp of the first entry, epoch milliseconds"),
        ("end_timestamp", "bigint", "endTimestamp: storeTimestamp of the last entry, epoch milliseconds"),
        ("begin_phy_offset", "bigint", "beginPhyOffset: physical offset of the first entry's message"),
        ("end_phy_offset", "bigint", "endPhyOffset: physical offset of the last entry's message"),
        ("hash_slot_count", "int", "hashSlotCount: slots in use"),
        ("index_count", "int", "indexCount: the next entry number (entries + 1)"),
    ),
    (),
    "one 40-byte IndexFile header per index file",
)

COMPACTION_LOG = TableSpec(
    "compaction_log",
    COMMITLOG.schema,
    ("topic", "queue_id"),
    "the latest message per KEYS of each COMPACTION topic queue: commitlog columns, original offsets kept",
)
COMPACTION_CQ = TableSpec(
    "compaction_cq",
    CONSUMEQUEUE.schema,
    ("topic", "queue_id"),
    "units of the compacted queues: original queue offsets (with gaps); cq_file is the sparse queue file "
    "(46-byte units in compactionCqMappedFileSize files)",
)
CONSUMER_OFFSETS = TableSpec(
    "consumer_offsets",
    columns(
        ("topic", "string", "the topic (the part before @ of an offsetTable key)"),
        ("group", "string", "the consumer group (the part after @)"),
        ("queue_id", "int", "the queue"),
        ("offset", "bigint", "the group's committed consume offset in the queue"),
        ("as_of", "timestamp", "when the snapshot was taken"),
        ("source_file", "string", "extra: the consumerOffset.json snapshot read"),
    ),
    (),
    "consumer offset snapshots (consumerOffset.json), one row per group, topic, queue and snapshot "
    "(source_file is extra)",
)

DQ_RESULTS = TableSpec(
    "dq_results",
    columns(
        ("run_id", "string", "the quality run"),
        ("suite", "string", "the suite the expectation belongs to"),
        ("table_name", "string", "the table checked"),
        ("expectation", "string", "what was expected (its description, else its type)"),
        ("success", "boolean", "whether it held"),
        ("observed", "string", "the GX result (counts, unexpected values) as JSON"),
        ("severity", "string", "how a failure counts: critical or warning"),
        ("table_version", "bigint", "the Delta version of the table checked"),
        ("checked_at", "timestamp", "when the run checked it"),
    ),
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
