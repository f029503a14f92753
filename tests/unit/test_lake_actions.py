"""The Delta statistics of a data file, from its Parquet footer."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from rmqlake.lake.actions import _json_value, parquet_stats


def _stats_value_by_value(metadata: pq.FileMetaData) -> dict:
    """The reference: every row group's min and max converted to JSON values, then compared."""
    minimum, maximum, nulls = {}, {}, {}
    for index in range(metadata.num_columns):
        path = metadata.schema.column(index).path
        if "." in path:
            continue
        chunks = [metadata.row_group(group).column(index).statistics for group in range(metadata.num_row_groups)]
        if any(stats is None for stats in chunks):
            continue
        nulls[path] = sum(stats.null_count or 0 for stats in chunks)
        lows = [_json_value(stats.min) for stats in chunks if stats.has_min_max]
        highs = [_json_value(stats.max) for stats in chunks if stats.has_min_max]
        if len(lows) == len(chunks) and None not in lows and None not in highs:
            minimum[path], maximum[path] = min(lows), max(highs)
    return {"numRecords": metadata.num_rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls}


def _footer(tmp_path, table: pa.Table, *, row_group_size: int) -> pq.FileMetaData:
    path = tmp_path / "part.parquet"
    pq.write_table(table, path, row_group_size=row_group_size)
    return pq.read_metadata(path)


def test_stats_compare_raw_values_only_where_they_order_as_the_values_do(tmp_path):
    """Signed integers, timestamps (with and without a zone) and UTF-8 strings are compared raw; an unsigned 64-bit
    column (raw values above 2**63 read as negative), dates, doubles, booleans and binaries are converted first;
    row groups of nulls only leave min and max out; nested columns have none."""
    late = datetime(2026, 11, 28, 12, 0, 1, 5, tzinfo=UTC)
    early = datetime(1999, 1, 1, tzinfo=UTC)
    table = pa.table(
        {
            "offset": pa.array([5, -3, None, 7, 2**40, 0], pa.int64()),
            "queue": pa.array([3, 1, 2, -4, 0, 9], pa.int32()),
            "small": pa.array([3, -1, 2, 4, 0, 9], pa.int8()),
            "stored": pa.array([late, early, None, late, late, late], pa.timestamp("us", "UTC")),
            "local": pa.array([datetime(2026, 1, 2), None, datetime(2025, 5, 6), None, None, None], pa.timestamp("ms")),
            "topic": ["é", "z", "A", None, "Zürich", "日本"],
            "unsigned": pa.array([1, 2**63 + 5, 3, 2**64 - 1, 0, 7], pa.uint64()),
            "day": pa.array([1, 2, 3, 4, 5, 6], pa.date32()),
            "ratio": [0.5, -1.5, 2.0, None, 1.0, 0.0],
            "flag": [True, False, True, True, None, False],
            "body": [b"\xff", b"\x00", b"a", b"b", b"c", b"d"],
            "empty": pa.array([None, None, None, None, 1, 2], pa.int64()),
            "keys": [["a"], [], None, ["b", "c"], ["d"], ["e"]],
        }
    )
    metadata = _footer(tmp_path, table, row_group_size=2)
    num_records, text = parquet_stats(metadata)
    stats = json.loads(text)

    assert num_records == 6
    assert stats == _stats_value_by_value(metadata)
    assert stats["minValues"]["offset"] == -3 and stats["maxValues"]["offset"] == 2**40
    assert stats["minValues"]["small"] == -1 and stats["maxValues"]["small"] == 9
    assert stats["minValues"]["stored"] == "1999-01-01T00:00:00.000000Z"
    assert stats["maxValues"]["stored"] == "2026-11-28T12:00:01.000005Z"
    assert stats["minValues"]["topic"] == "A" and stats["maxValues"]["topic"] == "日本"
    assert stats["minValues"]["unsigned"] == 0 and stats["maxValues"]["unsigned"] == 2**64 - 1
    assert "local" not in stats["minValues"]  # two of its row groups hold nulls only
    assert "empty" not in stats["minValues"] and stats["nullCount"]["empty"] == 4
    assert "day" not in stats["minValues"] and "body" not in stats["minValues"]
    assert stats["minValues"]["flag"] is False and stats["maxValues"]["flag"] is True
    assert stats["nullCount"]["offset"] == 1 and "keys" not in stats["nullCount"]


def test_stats_of_a_file_without_rows_or_statistics(tmp_path):
    empty = _footer(tmp_path, pa.table({"offset": pa.array([], pa.int64())}), row_group_size=10)
    assert parquet_stats(empty) == (0, json.dumps(_stats_value_by_value(empty), separators=(",", ":")))

    path = tmp_path / "bare.parquet"
    pq.write_table(pa.table({"offset": [1, 2]}), path, write_statistics=False)
    assert json.loads(parquet_stats(pq.read_metadata(path))[1]) == {
        "numRecords": 2,
        "minValues": {},
        "maxValues": {},
        "nullCount": {},
    }


def test_timestamps_before_the_year_1000_are_four_digit_years_and_compared_as_instants(tmp_path):
    """A producer's bornTimestamp may be any instant from the year 1 on; its statistics stay ISO 8601, and the
    earliest row group gives the minimum (as text, "999-..." once sorted after "2026-...")."""
    instants = [
        datetime(2026, 1, 2, tzinfo=UTC),
        datetime(999, 3, 4, 5, 6, 7, 8, tzinfo=UTC),
        datetime(5, 1, 1, tzinfo=UTC),
    ]
    metadata = _footer(
        tmp_path, pa.table({"born_time": pa.array(instants, pa.timestamp("us", "UTC"))}), row_group_size=1
    )
    stats = json.loads(parquet_stats(metadata)[1])
    assert stats["minValues"]["born_time"] == "0005-01-01T00:00:00.000000Z"
    assert stats["maxValues"]["born_time"] == "2026-01-02T00:00:00.000000Z"
    assert _json_value(instants[1]) == "0999-03-04T05:06:07.000008Z"
