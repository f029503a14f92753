"""``rmqlake.sql.delta_connection``: DuckDB's delta extension from the duckdb-ext-delta package, with no download."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from rmqlake.errors import ConfigError
from rmqlake.sql import delta_connection


def test_delta_scan_reads_a_partitioned_table_offline(tmp_path):
    rows = pa.table(
        {
            "topic": ["%RETRY%cg", "%RETRY%cg", "OrderEvents"],
            "cq_file": ["00000000000000000000", "00000000000000001280", "00000000000000000000"],
            "queue_offset": pa.array([3, 64, 0], pa.int64()),
        }
    )
    write_deltalake(str(tmp_path / "t"), rows, partition_by=["topic", "cq_file"])
    connection = delta_connection()
    settings = dict(connection.sql("select name, value from duckdb_settings()").fetchall())
    assert settings["autoinstall_known_extensions"] == "false"  # never a download
    read = connection.sql(f"select * from delta_scan('{tmp_path / 't'}') order by queue_offset").fetchall()
    # partition values as written: the 20-digit names keep their zeros, the %-topic its percent signs
    assert read == [
        ("OrderEvents", "00000000000000000000", 0),
        ("%RETRY%cg", "00000000000000000000", 3),
        ("%RETRY%cg", "00000000000000001280", 64),
    ]


def test_a_duckdb_the_extension_is_not_built_for_is_a_configuration_error(monkeypatch):
    monkeypatch.setattr(duckdb, "__version__", "0.0.1")
    with pytest.raises(ConfigError, match=r"for DuckDB v1\.4\.4, not for the installed v0\.0\.1"):
        delta_connection()
