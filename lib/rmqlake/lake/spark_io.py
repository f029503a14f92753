"""Spark ⇄ lake: read a table's current files, stage a DataFrame as a table's new files."""

from __future__ import annotations

from typing import Literal

from pyspark.sql import functions as F

from rmqlake.lake.actions import DataFile
from rmqlake.lake.lake import Lake, LakeRun
from rmqlake.lake.tables import table_spec


def read_table(spark, lake: Lake, table: str, *, version: int | None = None, partition_filters=None):
    """The table as a DataFrame with its declared schema (empty when it does not exist yet).

    Spark reads exactly the files in the Delta snapshot (``version`` for time
    travel); partition columns come from the folder names, typed by the
    declared schema.
    """
    spec = table_spec(table)
    schema = spec.spark_schema
    if lake.engine.name == "delta-spark" and lake.exists(table):
        return _read_delta(spark, lake, table, spec, version=version, partition_filters=partition_filters)
    uris = (
        lake.engine.file_uris(table, version=version, partition_filters=partition_filters) if lake.exists(table) else []
    )
    if not uris:
        return spark.createDataFrame([], schema)
    frame = spark.read.schema(schema).option("basePath", lake.uri(table)).parquet(*uris)
    return frame.select(*spec.columns)


def _read_delta(spark, lake: Lake, table: str, spec, *, version, partition_filters):
    """Through the Delta extension, at the version the lake reads (pinned, time travel, or ``version``)."""
    snapshot = lake.engine.open(table, version=version)
    frame = spark.read.format("delta").option("versionAsOf", snapshot.version()).load(lake.uri(table))
    for column, op, value in partition_filters or []:
        column_ = F.col(column)
        condition = {
            "=": column_ == value,
            "!=": column_ != value,
            "<": column_ < value,
            "<=": column_ <= value,
            ">": column_ > value,
            ">=": column_ >= value,
            "in": column_.isin(list(value)),
            "not in": ~column_.isin(list(value)),
        }[op]
        frame = frame.where(condition)
    return frame.select(*[F.col(name).cast(kind).alias(name) for name, kind in spec.fields])


def stage_dataframe(
    run: LakeRun,
    frame,
    table: str,
    *,
    mode: Literal["append", "overwrite"] = "append",
    options: dict[str, str] | None = None,
    file_groups: str | None = None,
) -> list[DataFile]:
    """Write ``frame`` as Parquet into the run's staging folder of ``table`` and register the files.

    The frame is reordered to the table's columns; partition columns become
    folders, as in the table itself. ``file_groups`` names a column whose
    value each data file holds only one of: it becomes one more folder level
    (``<column>_group=<value>``, not a Delta partition column; the column stays
    in the data), so whole groups can later be removed without rewriting
    a file — e.g. the CQ units of one ConsumeQueue file.
    """
    spec = table_spec(table)
    selected = frame.select(*spec.columns)
    folders = list(spec.partition_by)
    if file_groups:
        selected = selected.withColumn(group_folder(file_groups), F.col(file_groups))
        folders.append(group_folder(file_groups))
    writer = selected.write.mode("overwrite").option("compression", "snappy")
    for key, value in (options or {}).items():
        writer = writer.option(key, value)
    if folders:
        writer = writer.partitionBy(*folders)
    writer.parquet(run.staging_uri(table))
    return run.collect_staged(table, mode=mode)


def group_folder(column: str) -> str:
    """Folder name (before ``=``) of a ``file_groups`` column."""
    return f"{column}_group"
