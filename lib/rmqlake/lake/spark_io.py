"""Spark ⇄ lake: read a table's current files, stage a DataFrame as a table's new files."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import unquote

from pyspark.sql import functions as F

from rmqlake.lake.actions import DataFile, partition_values_from_path
from rmqlake.lake.lake import Lake, LakeRun
from rmqlake.lake.tables import TIMESTAMP_MS_RANGE, Column, Schema, table_spec


def read_table(spark, lake: Lake, table: str, *, version: int | None = None, partition_filters=None):
    """The table as a DataFrame with its declared schema (empty when it does not exist yet).

    Spark reads exactly the files of the Delta snapshot (``version`` for time
    travel; ``partition_filters``, ``[(column, op, value)]``, prune them) and
    every partition value comes from the Delta log, wherever a writer put the
    file. With the delta-spark engine that is ``format("delta")`` at the
    version the lake reads (Delta's statistics skip files); otherwise the
    Parquet files of the log's add actions.
    """
    spec = table_spec(table)
    if not lake.exists(table):
        return spark.createDataFrame([], spec.spark_schema)
    if lake.engine.name == "delta-spark":
        return _read_delta(spark, lake, table, spec, version=version, partition_filters=partition_filters)
    files = [f for f in lake.engine.active_files(table, version=version) if _kept(f, spec, partition_filters or [])]
    if not files:
        return spark.createDataFrame([], spec.spark_schema)
    root = lake.uri(table)
    paths = [f"{root}/{f.path}" for f in files]
    if _partitions_in_folders(files, spec):
        # the usual layout (Spark's partitionBy folders, as rmqlake, delta-rs and Delta write them): the folder
        # names are the log's partition values, so Spark takes them from there, typed by the declared schema
        frame = spark.read.schema(spec.spark_schema).option("basePath", root).parquet(*paths)
        return frame.select(*spec.columns)
    return _read_with_log_partitions(spark, lake, table, spec, files, paths)


def _kept(data_file: DataFile, spec, filters) -> bool:
    """Whether a file's partition values (from the log) pass ``[(column, op, value)]``."""
    for column, op, value in filters:
        kind = dict(spec.fields)[column]
        raw = data_file.partition_values.get(column)
        if raw is None:
            return False
        typed = int(raw) if kind in ("int", "bigint", "smallint") else raw
        if op == "in" or op == "not in":
            wanted = {int(v) if isinstance(typed, int) else v for v in value}
            if (typed in wanted) != (op == "in"):
                return False
            continue
        other = int(value) if isinstance(typed, int) else value
        passed = {
            "=": typed == other,
            "!=": typed != other,
            "<": typed < other,
            "<=": typed <= other,
            ">": typed > other,
            ">=": typed >= other,
        }[op]
        if not passed:
            return False
    return True


def _partitions_in_folders(files: list[DataFile], spec) -> bool:
    """Whether Spark's folder-name partition discovery gives exactly the log's partition values of every file.

    It does for one folder layout whose ``column=value`` levels name each partition column with its value;
    files of mixed depths (e.g. rewritten by another writer without rmqlake's extra grouping level) or
    outside such folders do not, and are read with the log's values instead.
    """
    layouts = set()
    for data_file in files:
        folders = [part.partition("=") for part in data_file.path.split("/")[:-1]]
        if any(not sep for _, sep, _ in folders):
            return False
        layouts.add(tuple(name for name, _, _ in folders))
        found = partition_values_from_path(data_file.path)
        if any(found.get(c) != data_file.partition_values.get(c) for c in spec.partition_by):
            return False
    return len(layouts) == 1 and set(spec.partition_by) <= set(next(iter(layouts)))


def _read_with_log_partitions(spark, lake: Lake, table: str, spec, files: list[DataFile], paths: list[str]):
    """The files read without partition discovery; partition columns joined on from the log by file path.

    Spark names each row's file in ``_metadata.file_path`` (qualified, URI-encoded); the log side is keyed
    by the same string, decoded on both sides.
    """
    data_columns = [(name, kind) for name, kind in spec.fields if name not in spec.partition_by]
    data = spark.read.schema(", ".join(f"`{n}` {k}" for n, k in data_columns)).parquet(*paths)
    jvm = spark._jvm
    hadoop_root = jvm.org.apache.hadoop.fs.Path(lake.uri(table))
    qualified = hadoop_root.getFileSystem(spark._jsc.hadoopConfiguration()).makeQualified(hadoop_root)
    root = re.sub("^file:///", "file:/", unquote(qualified.toUri().toString()))  # Hadoop writes local files both ways
    log_side = spark.createDataFrame(
        [(f"{root}/{f.path}", *(f.partition_values.get(c) for c in spec.partition_by)) for f in files],
        ", ".join(["`_rmqlake_file` string", *(f"`{c}` string" for c in spec.partition_by)]),
    )
    # url_decode reads "+" as a space; Hadoop leaves a literal "+" unescaped, so it is escaped first
    key = F.expr("regexp_replace(url_decode(replace(_metadata.file_path, '+', '%2B')), '^file:///', 'file:/')")
    joined = data.withColumn("_rmqlake_file", key).join(F.broadcast(log_side), "_rmqlake_file")
    kinds = dict(spec.fields)
    return joined.select(
        *[F.col(f"`{c}`").cast(kinds[c]).alias(c) if c in spec.partition_by else F.col(f"`{c}`") for c in spec.columns]
    )


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
) -> list[DataFile]:
    """Write ``frame`` as Parquet into the run's staging folder of ``table`` and register the files.

    The frame is reordered to the table's columns, derived ones computed
    (``table_columns``); partition columns become folders, as in the table itself.
    """
    spec = table_spec(table)
    writer = frame.select(*table_columns(spec.schema)).write.mode("overwrite").option("compression", "snappy")
    for key, value in (options or {}).items():
        writer = writer.option(key, value)
    if spec.partition_by:
        writer = writer.partitionBy(*spec.partition_by)
    writer.parquet(run.staging_uri(table))
    return run.collect_staged(table, mode=mode)


def table_columns(schema: Schema) -> list:
    """Column expressions selecting ``schema`` from a frame: derived columns computed from their sources.

    A derived column the frame already holds (rows copied from another table) is computed again, so it
    always agrees with its source.
    """
    return [derived_column(column) if column.derived_from else F.col(f"`{column.name}`") for column in schema.columns]


def derived_column(column: Column):
    """Spark's ``tables.derive_timestamp``: the epoch milliseconds as a timestamp, null outside the range."""
    low, high = TIMESTAMP_MS_RANGE
    millis = F.col(f"`{column.derived_from}`")
    return F.when(millis.between(low, high), F.timestamp_millis(millis)).alias(column.name)
