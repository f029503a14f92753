"""``rmqlake describe``: the tables and their columns, from the one schema of each table, without a lake."""

import json
import os
import subprocess
import sys
from pathlib import Path

from rmqlake import cli
from rmqlake.lake.tables import TABLES


def run(capsys, *argv: str) -> tuple[int, list[dict]]:
    code = cli.main(["describe", *argv, "--json"])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines()]


def test_lists_every_table_with_its_partitions_and_row_meaning(capsys):
    code, rows = run(capsys)
    assert code == 0
    assert [r["table"] for r in rows] == list(TABLES)
    by_name = {r["table"]: r for r in rows}
    assert by_name["commitlog"]["partitioned_by"] == "segment"
    assert by_name["consumequeue"]["partitioned_by"] == ", ".join(TABLES["consumequeue"].partition_by)
    assert all(r["row"] for r in rows), "every table says what a row is"


def test_a_table_lists_every_column_with_type_and_meaning(capsys):
    for name, spec in TABLES.items():
        code, rows = run(capsys, name)
        assert code == 0
        assert [r["column"] for r in rows] == spec.columns
        assert all(r["meaning"] for r in rows), f"{name}: a column without a meaning"
        assert {r["column"] for r in rows if r["partition"] == "yes"} == set(spec.partition_by)
    code, rows = run(capsys, "indexfile")
    assert {
        "column": "key_hash",
        "type": "int",
        "partition": "",
        "meaning": "abs(String.hashCode) of topic#key",
    } in rows


def test_an_unknown_table_is_a_usage_error_naming_the_tables(capsys):
    assert cli.main(["describe", "commitlogs"]) == 2
    err = capsys.readouterr().err
    assert "no table 'commitlogs'" in err and "consumequeue" in err


def test_the_text_form_wraps_meanings_instead_of_shortening_them(capsys):
    assert cli.main(["describe", "consumequeue"]) == 0
    out = capsys.readouterr().out
    assert "..." not in out and "20 digits" in out


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path):
    """``rmqlake describe | head -1``: stdout is a pipe nobody reads any more. The process exits 141, as one
    that SIGPIPE ends, without a traceback (Python ignores SIGPIPE, so the write raises)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first write
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "rmqlake"), "describe", "commitlog"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""
