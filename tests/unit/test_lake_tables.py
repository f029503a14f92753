"""Every table's declared columns yield one consistent schema: Spark DDL, Arrow, comments, Python record type."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rmqlake.ingest.message import MESSAGE_TYPES, PARSED_MESSAGE, ParsedMessage
from rmqlake.ingest.plan import STATS, StatsRow
from rmqlake.lake.tables import COMMITLOG, TABLES, Column, Schema, TableSpec, columns

# The Spark type each Arrow type is written as (what both engines create the tables with).
SPARK_OF_ARROW = {
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.string(): "string",
    pa.binary(): "binary",
    pa.bool_(): "boolean",
    pa.float64(): "double",
    pa.timestamp("us", tz="UTC"): "timestamp",
}


def spark_type_of(arrow: pa.DataType) -> str:
    if pa.types.is_list(arrow):
        return f"array<{spark_type_of(arrow.value_type)}>"
    if pa.types.is_map(arrow):
        return f"map<{spark_type_of(arrow.key_type)},{spark_type_of(arrow.item_type)}>"
    return SPARK_OF_ARROW[arrow]


@pytest.mark.parametrize("spec", TABLES.values(), ids=list(TABLES))
def test_a_table_yields_one_schema_in_every_form(spec: TableSpec):
    names = spec.columns
    assert names == [name for name, _ in spec.fields] == spec.arrow_schema.names == list(spec.comments)
    assert spec.spark_schema == ", ".join(f"{name} {kind}" for name, kind in spec.fields)
    assert [spark_type_of(field.type) for field in spec.arrow_schema] == [kind for _, kind in spec.fields]
    record = spec.schema.record_type("Row")
    assert list(record._fields) == names
    assert set(spec.partition_by) <= set(names)


@pytest.mark.parametrize("spec", TABLES.values(), ids=list(TABLES))
def test_every_column_has_a_one_line_comment(spec: TableSpec):
    for name, comment in spec.comments.items():
        assert comment.strip(), f"{spec.name}.{name} has no comment"
        assert "\n" not in comment, f"{spec.name}.{name}: the comment is more than one line"


def test_the_parsed_message_is_the_commitlog_declaration():
    assert list(ParsedMessage._fields) == PARSED_MESSAGE.names == list(MESSAGE_TYPES)
    for name, arrow_type in MESSAGE_TYPES.items():
        if name in COMMITLOG.columns:
            assert COMMITLOG.arrow_schema.field(name).type == arrow_type, name
    assert set(MESSAGE_TYPES) - set(COMMITLOG.columns) == {"store_host_prefix", "real_queue_round_robin"}


def test_record_types_build_rows_by_name_and_position():
    row = StatsRow(partition=0, kind="messages", topic=None, queue_id=None, bucket=None, value=3)
    assert row == (0, "messages", None, None, None, 3)
    assert list(StatsRow._fields) == STATS.names


def test_a_schema_refuses_a_repeated_column_and_an_unknown_name():
    with pytest.raises(ValueError, match="repeated"):
        Schema((Column("a", "int", "one"), Column("a", "bigint", "two")))
    with pytest.raises(KeyError, match="no column"):
        columns(("a", "int", "one")).select(["b"])
