"""Derived timestamp columns, comments for the Delta schemas, and the refusal to write into a table whose
schema is not its declaration's (a lake of an older rmqlake), on real delta-rs tables (no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from rmqlake.errors import LakeStateError
from rmqlake.lake import TABLES, Lake
from rmqlake.lake.tables import (
    COMMITLOG,
    COMPACTION_LOG,
    CONSUMEQUEUE,
    INGEST_FILES,
    SEGMENTS,
    TIMESTAMP_MS_RANGE,
    Column,
    columns,
    derive_timestamp,
    schema_differences,
)

# Which tables carry which derived timestamps (of the epoch-millisecond columns beside them).
DERIVED = {
    "commitlog": {"born_time": "born_timestamp", "store_time": "store_timestamp"},
    "compaction_log": {"born_time": "born_timestamp", "store_time": "store_timestamp"},
}


@pytest.mark.parametrize("spec", TABLES.values(), ids=list(TABLES))
def test_derived_columns_are_timestamps_of_an_epoch_millisecond_column_beside_them(spec):
    derived = {column.name: column.derived_from for column in spec.schema.derived}
    assert derived == DERIVED.get(spec.name, {})
    for name, source in derived.items():
        assert spec.schema.column(name).type == "timestamp"
        assert spec.schema.column(source).type == "bigint"
        assert abs(spec.columns.index(name) - spec.columns.index(source)) == 1  # beside it
    assert spec.schema.stored.names == [name for name in spec.columns if name not in derived]


def test_only_a_timestamp_column_is_derived():
    with pytest.raises(ValueError, match="only a timestamp"):
        Column("x", "bigint", "x", derived_from="store_timestamp")


def test_derived_timestamps_are_the_same_instant_to_the_millisecond_and_null_past_the_year_9999():
    low, high = TIMESTAMP_MS_RANGE
    millis = [0, 1, 999, 1_764_028_800_123, low, high, high + 1, low - 1, 2**63 - 1, None]
    derived = derive_timestamp(pa.array(millis, pa.int64()))
    assert derived.type == pa.timestamp("us", tz="UTC")
    expected = [ms * 1000 if ms is not None and low <= ms <= high else None for ms in millis]
    assert pc.cast(derived, pa.int64()).to_pylist() == expected
    assert str(derived[3]) == "2025-11-25 00:00:00.123000+00:00"


def test_complete_orders_the_columns_and_computes_derived_ones_again():
    schema = COMMITLOG.schema.select(["store_timestamp", "store_time", "topic"])
    stale = pa.table(
        {"topic": ["T"], "store_time": pa.array([0], pa.timestamp("us", tz="UTC")), "store_timestamp": [5]}
    )
    completed = schema.complete(stale)
    assert completed.schema == schema.arrow_schema
    assert completed.to_pylist()[0]["store_time"].timestamp() == 0.005
    assert schema.stored.complete(stale.select(["store_timestamp", "topic"])).column_names == [
        "store_timestamp",
        "topic",
    ]


def test_commented_schemas_carry_every_comment_quoted():
    schema = columns(("a", "string", "it's a \\ path"), ("b", "map<string,string>", "name → value"))
    assert (
        schema.commented_ddl == "`a` string COMMENT 'it\\'s a \\\\ path', `b` map<string,string> COMMENT 'name → value'"
    )
    assert [field.metadata for field in schema.commented_arrow_schema] == [
        {b"comment": b"it's a \\ path"},
        {b"comment": "name → value".encode()},
    ]


def test_schema_differences_name_missing_columns_and_other_partitions():
    fields = {name: kind for name, kind in CONSUMEQUEUE.fields}
    delta_names = {"bigint": "long", "int": "integer"}
    fields = {name: delta_names.get(kind, kind) for name, kind in fields.items()}
    assert schema_differences(CONSUMEQUEUE, fields=fields, partition_by=list(CONSUMEQUEUE.partition_by)) == []
    old = {name: kind for name, kind in fields.items() if name != "cq_file"} | {"legacy": "string"}
    found = schema_differences(CONSUMEQUEUE, fields=old, partition_by=["topic"])
    assert found[0] == "it lacks the columns cq_file (string)"
    assert found[1] == "it has columns rmqlake no longer writes: legacy"
    assert found[2].startswith("it is partitioned by (topic), rmqlake writes it partitioned by (")
    retyped = fields | {"size": "long"}
    assert schema_differences(CONSUMEQUEUE, fields=retyped, partition_by=list(CONSUMEQUEUE.partition_by)) == [
        "types differ: size is long, not integer"
    ]


def _old_commitlog(root) -> None:
    """The commitlog as an older rmqlake created it: without the derived timestamps."""
    old = pa.schema([field for field in COMMITLOG.arrow_schema if field.name not in ("store_time", "born_time")])
    DeltaTable.create(f"{root}/commitlog", old, partition_by=["segment"])


def test_a_lake_with_a_table_of_an_older_schema_refuses_every_run_before_it_writes(tmp_path):
    root = tmp_path / "lake"
    _old_commitlog(root)
    lake = Lake(str(root))
    with pytest.raises(LakeStateError) as raised:
        lake.begin("ingest")
    message = str(raised.value)
    assert (
        f"table commitlog ({root}/commitlog): it lacks the columns born_time (timestamp), store_time (timestamp)"
        in (message)
    )
    assert "re-ingest the producer logs" in message and "export-store" in message and "import-store" in message
    assert sorted(path.name for path in root.iterdir()) == ["commitlog"]  # not even the ledger was created
    assert DeltaTable(str(root / "commitlog")).version() == 0


def test_a_table_changed_during_a_run_is_refused_at_its_commit(tmp_path):
    root = tmp_path / "lake"
    lake = Lake(str(root))
    run = lake.begin("ingest")
    run.stage_arrow("ingest_files", INGEST_FILES.arrow_schema.empty_table())
    # another rmqlake version creates the table meanwhile, partitioned differently
    DeltaTable.create(f"{root}/ingest_files", INGEST_FILES.arrow_schema, partition_by=["batch_id"])
    with pytest.raises(LakeStateError, match=r"table ingest_files .*partitioned by \(batch_id\)"):
        run.commit()
    assert lake.ledger().seq == 0


def test_tables_this_version_creates_pass_the_check(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for spec in TABLES.values():
        lake.engine.ensure_table(spec)
    lake.check_table_schemas(TABLES)
    assert lake.begin("ingest").seq == 1


def test_compaction_log_has_the_commitlog_columns():
    assert COMPACTION_LOG.schema == COMMITLOG.schema


def test_a_staged_file_without_the_derived_columns_is_refused(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    run = lake.begin("ingest")
    folder = tmp_path / "lake" / run.staging_dir("commitlog") / "segment=00000000000000000000"
    folder.mkdir(parents=True)
    stored = COMMITLOG.schema.stored.without("segment")
    pq.write_table(stored.arrow_schema.empty_table(), folder / "part-0.parquet")
    with pytest.raises(LakeStateError, match="lacks the columns born_time, store_time"):
        run.collect_staged("commitlog")
    complete = COMMITLOG.schema.without("segment")
    pq.write_table(complete.complete(stored.arrow_schema.empty_table()), folder / "part-0.parquet")
    assert len(run.collect_staged("commitlog")) == 1


def test_an_overwrite_keeps_the_comments_and_the_description(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for _ in range(2):  # an overwrite commits the table's schema again
        run = lake.begin("expire")
        run.stage_arrow("segments", SEGMENTS.arrow_schema.empty_table(), mode="overwrite")
        run.commit()
    table = DeltaTable(lake.uri("segments"))
    assert {field.name: field.metadata.get("comment") for field in table.schema().fields} == SEGMENTS.comments
    assert table.metadata().description == SEGMENTS.description
