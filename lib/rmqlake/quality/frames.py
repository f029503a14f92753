"""What the quality suites validate: each table with the facts its invariants need, computed in Spark.

Great Expectations checks columns of one DataFrame. Invariants that span
rows (contiguous offsets) or tables (padding recorded in ``segments``) are
turned into columns here first: a value that must hold, or ``null`` where
the invariant does not apply (GX's column expectations skip nulls). The
byte rules come from ``rmqlake.formats`` (one module owns each), recomputed
from the stored fields, never copied from the stored results.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from rmqlake.formats.crc import body_crc
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    STOREHOST_V6_FLAG,
    consumes_queue_offset,
    record_size,
)

RECOMPUTED_DDL = (
    "physical_offset bigint, expected_size int, expected_crc int, expected_msg_id string, dispatchable boolean"
)


def _recompute(batches):
    """Per message: size by the formula, body CRC, offsetMsgId and whether it takes a queue offset."""
    for batch in batches:
        columns = batch.to_pydict()
        sizes, crcs, msg_ids, dispatchable = [], [], [], []
        for body, topic, props, magic, sys_flag, store_host, offset in zip(
            columns["body"],
            columns["topic"],
            columns["properties_bytes"],
            columns["magic"],
            columns["sys_flag"],
            columns["store_host"],
            columns["physical_offset"],
            strict=True,
        ):
            body = body or b""
            try:
                sizes.append(
                    record_size(
                        body_length=len(body),
                        topic_length=len(topic.encode()),
                        properties_length=len(props or b""),
                        born_v6=bool(sys_flag & BORNHOST_V6_FLAG),
                        store_v6=bool(sys_flag & STOREHOST_V6_FLAG),
                        magic=magic,
                    )
                )
            except ValueError:  # not a message magic: the magic expectation reports it
                sizes.append(None)
            crcs.append(body_crc(body))
            try:
                msg_ids.append(offset_msg_id(parse_host(store_host), offset))
            except ValueError:
                msg_ids.append(None)
            dispatchable.append(consumes_queue_offset(sys_flag))
        yield pa.RecordBatch.from_pydict(
            {
                "physical_offset": columns["physical_offset"],
                "expected_size": pa.array(sizes, pa.int32()),
                "expected_crc": pa.array(crcs, pa.int32()),
                "expected_msg_id": pa.array(msg_ids, pa.string()),
                "dispatchable": pa.array(dispatchable, pa.bool_()),
            }
        )


def commitlog_frame(commitlog: DataFrame, segments: DataFrame) -> DataFrame:
    """One row per stored message with the facts its invariants need.

    Columns added (``null``: does not apply to the row):

    * ``size_matches_formula``, ``crc_matches``, ``msg_id_matches``: the stored
      value equals the one recomputed from the record's fields;
    * ``follows_previous``: the record starts where the previous record of its
      segment ends (the first at the segment's start offset);
    * ``segment_end_matches`` (last record of each segment): its end plus the
      padding recorded in ``segments`` is the segment's end offset;
    * ``queue_offset_follows`` (dispatchable messages): one more than the
      previous dispatchable message of its queue (the first: any, expiry
      removes the oldest);
    * ``queue_slot``: ``topic/queue/offset`` of dispatchable messages, unique.
    """
    stored = commitlog.select(
        "segment",
        "physical_offset",
        "total_size",
        "magic",
        "body_crc",
        "msg_id",
        "topic",
        "queue_id",
        "queue_offset",
        "sys_flag",
        "store_timestamp",
    )
    recomputed = commitlog.select(
        "physical_offset", "body", "topic", "properties_bytes", "magic", "sys_flag", "store_host"
    ).mapInArrow(_recompute, RECOMPUTED_DDL)
    rows = stored.join(recomputed, "physical_offset")
    in_segment = Window.partitionBy("segment").orderBy("physical_offset")
    previous_end = F.lag(F.col("physical_offset") + F.col("total_size")).over(in_segment)
    is_last = F.lead("physical_offset").over(in_segment).isNull()
    ends = segments.select(
        F.col("segment"), F.col("end_offset").alias("segment_end"), F.col("padding_bytes").alias("segment_padding")
    )
    rows = rows.join(F.broadcast(ends), "segment", "left")
    rows = rows.select(
        "*",
        (F.col("total_size") == F.col("expected_size")).alias("size_matches_formula"),
        (F.col("body_crc") == F.col("expected_crc")).alias("crc_matches"),
        (F.col("msg_id") == F.col("expected_msg_id")).alias("msg_id_matches"),
        (F.col("physical_offset") == F.coalesce(previous_end, F.col("segment").cast("bigint"))).alias(
            "follows_previous"
        ),
        F.when(
            is_last,
            F.coalesce(
                F.col("physical_offset") + F.col("total_size") + F.col("segment_padding") == F.col("segment_end"),
                F.lit(False),  # a segment the segments table does not know
            ),
        ).alias("segment_end_matches"),
    )
    in_queue = Window.partitionBy("topic", "queue_id", "dispatchable").orderBy("queue_offset", "physical_offset")
    return rows.select(
        "*",
        F.when(
            F.col("dispatchable"),
            F.coalesce(F.col("queue_offset") == F.lag("queue_offset").over(in_queue) + 1, F.lit(True)),
        ).alias("queue_offset_follows"),
        F.when(
            F.col("dispatchable"), F.concat_ws("/", "topic", F.col("queue_id").cast("string"), "queue_offset")
        ).alias("queue_slot"),
    )


def segments_frame(segments: DataFrame) -> DataFrame:
    """Segment rows with ``follows_previous`` (starts where the previous one ends) and ``active_marker``
    (``"active"`` on the active segment, else null: unique and present means exactly one)."""
    in_order = Window.orderBy("start_offset")
    return segments.select(
        "*",
        F.coalesce(F.col("start_offset") == F.lag("end_offset").over(in_order), F.lit(True)).alias("follows_previous"),
        F.when(F.col("status") == "active", F.lit("active")).alias("active_marker"),
    )
