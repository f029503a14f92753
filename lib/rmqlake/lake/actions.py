"""Files a run adds to or removes from a table, with the statistics Delta readers prune on."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from urllib.parse import unquote

import pyarrow.parquet as pq


@dataclass(frozen=True)
class DataFile:
    """A Parquet file of a table: on-disk path relative to the table folder."""

    path: str
    size: int
    partition_values: dict[str, str | None] = field(default_factory=dict)
    modification_time: int = 0
    stats: str = "{}"
    num_records: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> DataFile:
        return cls(**data)


def partition_values_from_path(relative: str) -> dict[str, str]:
    """``col=value`` folders of a relative path (Spark escapes values with %XX)."""
    values = {}
    for part in relative.split("/")[:-1]:
        name, sep, value = part.partition("=")
        if sep:
            values[name] = None if value == "__HIVE_DEFAULT_PARTITION__" else unquote(value)
    return values


def _json_value(value):
    if isinstance(value, bytes):
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, (int, float, str, bool)):
        return value
    return None


def parquet_stats(metadata: pq.FileMetaData) -> tuple[int, str]:
    """(numRecords, Delta stats JSON) from a Parquet footer, without reading data.

    min/max/nullCount are given for top-level primitive columns whose every
    row group has statistics; binary columns get no min/max.
    """
    num_records = metadata.num_rows
    minimum, maximum, nulls = {}, {}, {}
    schema = metadata.schema
    for index in range(metadata.num_columns):
        column_path = schema.column(index).path
        if "." in column_path:
            continue
        lows, highs, null_total, complete = [], [], 0, True
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(index).statistics
            if stats is None:
                complete = False
                break
            null_total += stats.null_count or 0
            if stats.has_min_max:
                lows.append(_json_value(stats.min))
                highs.append(_json_value(stats.max))
        if not complete:
            continue
        nulls[column_path] = null_total
        lows = [v for v in lows if v is not None]
        highs = [v for v in highs if v is not None]
        if lows and highs and len(lows) == metadata.num_row_groups:
            minimum[column_path] = min(lows)
            maximum[column_path] = max(highs)
    stats = {"numRecords": num_records, "minValues": minimum, "maxValues": maximum, "nullCount": nulls}
    return num_records, json.dumps(stats, separators=(",", ":"))
