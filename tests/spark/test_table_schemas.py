"""What both engines write into the tables' Delta schemas (column comments, descriptions), and the
timestamps the Spark stage writer derives from epoch milliseconds."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from rmqlake.lake import TABLES, Lake
from rmqlake.lake.spark_io import stage_dataframe
from rmqlake.lake.tables import COMMITLOG, TIMESTAMP_MS_RANGE

pytestmark = [pytest.mark.spark, pytest.mark.delta_spark]

ENGINES = ("delta-rs", "delta-spark")


@pytest.fixture(scope="module", params=ENGINES)
def created(request, spark, tmp_path_factory):
    """Every table created empty by one engine."""
    root = tmp_path_factory.mktemp(request.param)
    lake = Lake(str(root), engine=request.param)
    for spec in TABLES.values():
        lake.engine.ensure_table(spec)
    return lake


def test_every_column_comment_and_the_description_are_in_the_delta_schema(created):
    for spec in TABLES.values():
        table = DeltaTable(created.uri(spec.name))
        comments = {field.name: field.metadata.get("comment") for field in table.schema().fields}
        assert comments == spec.comments, spec.name
        assert table.metadata().description == spec.description, spec.name
        assert list(table.metadata().partition_columns) == list(spec.partition_by), spec.name


def test_spark_describes_every_column_with_its_comment(spark, created):
    for spec in TABLES.values():
        described = spark.sql(f"DESCRIBE TABLE delta.`{created.uri(spec.name)}`").collect()  # a few schema rows
        comments = {row.col_name: row.comment for row in described if row.col_name in spec.comments}
        assert comments == spec.comments, spec.name
        kinds = {row.col_name: row.data_type for row in described if row.col_name in spec.comments}
        assert kinds == dict(spec.fields), spec.name


EDGES = [0, 1, 999, 1_764_028_800_123, TIMESTAMP_MS_RANGE[1], TIMESTAMP_MS_RANGE[1] + 1, 2**63 - 1]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_spark_stage_writer_derives_timestamps_equal_to_the_milliseconds(spark, tmp_path, engine):
    lake = Lake(str(tmp_path / "lake"), engine=engine)
    rows = [(i, ms, EDGES[-1 - i]) for i, ms in enumerate(EDGES)]
    frame = spark.createDataFrame(rows, "physical_offset bigint, store_timestamp bigint, born_timestamp bigint")
    for column in COMMITLOG.schema.stored.columns:  # the other columns: typed nulls
        if column.name not in frame.columns:
            frame = frame.selectExpr("*", f"CAST(NULL AS {column.type}) AS `{column.name}`")
    # a stale value where the frame already holds one: the writer computes it again from its source
    frame = frame.selectExpr("*", "TIMESTAMP'2000-01-01 00:00:00' AS store_time")
    run = lake.begin("test")
    stage_dataframe(run, frame.withColumn("segment", frame.physical_offset.cast("string")), "commitlog")
    run.commit()
    data = (
        DeltaTable(lake.uri("commitlog")).to_pyarrow_table(columns=list(COMMITLOG.columns)).sort_by("physical_offset")
    )
    for derived, source in (("store_time", "store_timestamp"), ("born_time", "born_timestamp")):
        assert data.schema.field(derived).type == pa.timestamp("us", tz="UTC")
        millis = data.column(source).to_pylist()
        times = pc.cast(data.column(derived), pa.int64()).to_pylist()
        expected = [ms * 1000 if ms <= TIMESTAMP_MS_RANGE[1] else None for ms in millis]
        assert times == expected, derived
