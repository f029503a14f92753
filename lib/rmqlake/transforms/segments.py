"""The ``segments`` table after a batch: one row per commitlog segment ever opened (driver side, small)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rmqlake.formats.segment import segment_start

ACTIVE, SEALED, DELETED = "active", "sealed", "deleted"


def update_segments(
    existing: Iterable[Mapping], batch: Iterable[Mapping], *, segment_size: int, end_offset: int
) -> list[dict]:
    """Merge a batch's per-segment aggregates into the segment rows.

    Args:
        existing: current ``segments`` rows.
        batch: one mapping per segment the batch wrote to: ``segment``,
            ``message_count``, ``data_end`` (end of its last record),
            ``first_store_timestamp``, ``last_store_timestamp`` (of its
            first and last record by offset).
        end_offset: commitlog write position after the batch.

    Returns:
        All rows, ordered by start offset. The segment holding ``end_offset``
        is active; every other segment that was active or written by the
        batch is sealed: its end is the segment end and its padding the bytes
        after its last record (8-byte blank + zeros).
    """
    rows = {row["segment"]: dict(row) for row in existing}
    data_end: dict[str, int] = {}
    for aggregate in batch:
        name = aggregate["segment"]
        row = rows.get(name)
        if row is None:
            row = rows[name] = {
                "segment": name,
                "start_offset": int(name),
                "message_count": 0,
                "first_store_timestamp": aggregate["first_store_timestamp"],
                "status": ACTIVE,
                "deleted_at": None,
                "deleted_reason": None,
                "retained_reason": None,
                "retained_at": None,
            }
        elif row["status"] != ACTIVE:
            raise ValueError(f"batch wrote to segment {name}, which is {row['status']}")
        row["message_count"] += aggregate["message_count"]
        row["last_store_timestamp"] = aggregate["last_store_timestamp"]
        data_end[name] = aggregate["data_end"]
    active_start = segment_start(end_offset, segment_size)
    for name, row in rows.items():
        if row["status"] != ACTIVE:
            continue
        end_of_data = data_end.get(name, row.get("end_offset", row["start_offset"]))
        if row["start_offset"] == active_start:
            row.update(end_offset=end_offset, padding_bytes=0)
        else:
            row.update(status=SEALED, end_offset=row["start_offset"] + segment_size)
            row["padding_bytes"] = row["end_offset"] - end_of_data
        row["size_bytes"] = row["end_offset"] - row["start_offset"]
    return sorted(rows.values(), key=lambda r: r["start_offset"])


def segment_size_problem(
    rows: Iterable[Mapping], *, segment_size: int, next_offset: int, recorded: int | None = None
) -> str | None:
    """Why a lake's commitlog cannot take a batch placed with ``segment_size``, or ``None`` when it can.

    Segment files have one size for a store's life: a batch placed with
    another size would write into sealed segments or leave gaps. The lake's
    size is the one recorded by earlier runs (``recorded``), else what its
    ``segments`` rows show: sealed and deleted segments span exactly one
    segment, every segment starts at a multiple of it, and the write
    position ``next_offset`` lies inside the active one.
    """

    def refuse(found: str) -> str:
        return (
            f"store.commitlog_segment_size is {segment_size}, but {found}. Segment files cannot change size "
            "in a store: run with the lake's segment size, or start a new lake"
        )

    if recorded is not None and recorded != segment_size:
        return refuse(f"the lake's commitlog was written with segments of {recorded} bytes")
    for row in rows:
        start, end = int(row["start_offset"]), row.get("end_offset")
        if row["status"] in (SEALED, DELETED) and end is not None and end - start != segment_size:
            return refuse(f"the lake's segment {row['segment']} spans {end - start} bytes")
        if start % segment_size:
            return refuse(f"the lake's segment {row['segment']} starts at {start}, not a multiple of it")
        if row["status"] == ACTIVE and not start <= next_offset < start + segment_size:
            return refuse(f"the lake's write position {next_offset} lies past the end of its active segment")
    return None


def segment_aggregates(commitlog) -> list[dict]:
    """Per segment of a commitlog DataFrame: ``message_count``, ``data_end`` (end of its last record) and the
    ``first_store_timestamp``/``last_store_timestamp`` of its first and last record by offset (the input of
    ``update_segments``; one small row per segment reaches the driver)."""
    from pyspark.sql import functions as F

    rows = (
        commitlog.groupBy("segment")
        .agg(
            F.count(F.lit(1)).alias("message_count"),
            F.max(F.col("physical_offset") + F.col("total_size")).alias("data_end"),
            F.min_by("store_timestamp", "physical_offset").alias("first_store_timestamp"),
            F.max_by("store_timestamp", "physical_offset").alias("last_store_timestamp"),
        )
        .collect()
    )
    return [r.asDict() for r in rows]
