"""Compaction: the latest message per key, per topic and queue (rules in formats/compaction.py).

The broker copies each dispatched record of a COMPACTION topic into a
per-queue compaction log and periodically rewrites it, keeping a record
only if it is the latest of its key and has a body. Here a run takes the
compacted rows of the queues that received messages since the last run,
adds those messages, and keeps, per (topic, queue, key), the row with the
highest queue offset unless its body is empty. Because every kept row was
already the latest non-empty one, this equals one compaction over all
messages (a tombstone among the new rows removes the key; an old key with
no new rows keeps its row).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Window
from pyspark.sql import functions as F

from rmqlake.formats.compaction import JAVA_WHITESPACE_REGEX, SPARSE_CQ_UNIT_SIZE, sparse_cq_file_size
from rmqlake.transforms.columns import dispatchable

KEY = "compaction_key"


def compaction_key():
    """The whole KEYS property, null when blank (``StringUtils.isBlank``), as a column expression."""
    keys = F.element_at("properties", F.lit("KEYS"))
    return F.when(F.regexp_replace(keys, JAVA_WHITESPACE_REGEX, "") != "", keys)


def dispatched_messages(commitlog, *, positions: Mapping[str, int], end: int):
    """Messages of the given topics dispatched since each topic's position and before ``end``.

    Only records that took a queue offset (NOT_TYPE and COMMIT) reach a
    queue, so only they are compacted; records without a non-blank key are
    never copied (``CompactionLog.asyncPutMessage``).
    """
    if not positions:
        return commitlog.limit(0).withColumn(KEY, F.lit(None).cast("string"))
    since = F.lit(None).cast("bigint")
    for topic, position in positions.items():
        since = F.when(F.col("topic") == topic, F.lit(position)).otherwise(since)
    frame = commitlog.filter(
        F.col("topic").isin(list(positions))
        & (F.col("physical_offset") >= since)
        & (F.col("physical_offset") < end)
        & dispatchable()
    )
    return frame.withColumn(KEY, compaction_key())


def latest_per_key(messages):
    """Flag each row: ``is_latest`` of its (topic, queue, key); ``keep`` when latest with a body.

    Rows without a key are flagged neither (they are dropped).
    """
    by_key = Window.partitionBy("topic", "queue_id", KEY).orderBy(F.col("queue_offset").desc())
    latest = F.col(KEY).isNotNull() & (F.row_number().over(by_key) == 1)
    flagged = messages.withColumn("is_latest", latest)
    length = F.col("body_length") if "body_length" in messages.columns else F.length("body")
    return flagged.withColumn("keep", F.col("is_latest") & (F.coalesce(length, F.lit(0)) > 0))


def key_columns(messages):
    """What compaction decides on, without the bodies: the stats pass reads only these."""
    return messages.select(
        "topic", "queue_id", KEY, "queue_offset", "total_size", "is_new", F.length("body").alias("body_length")
    )


def compaction_stats(flagged, *, new_rows: str = "is_new"):
    """One row of counts over the flagged rows (messages read, keys, kept, tombstones, bytes before/after)."""
    new = F.col(new_rows)
    return flagged.agg(
        F.count(F.when(new, 1)).alias("messages_read"),
        F.coalesce(F.sum(F.when(new, F.col("total_size"))), F.lit(0)).alias("bytes_read"),
        F.count(F.when(new & F.col(KEY).isNull(), 1)).alias("messages_without_key"),
        F.count(F.when(F.col("is_latest"), 1)).alias("keys"),
        F.count(F.when(F.col("keep"), 1)).alias("messages_kept"),
        F.count(F.when(F.col("is_latest") & ~F.col("keep"), 1)).alias("tombstones_applied"),
        F.coalesce(F.sum("total_size"), F.lit(0)).alias("bytes_before"),
        F.coalesce(F.sum(F.when(F.col("keep"), F.col("total_size"))), F.lit(0)).alias("bytes_after"),
    )


def compacted_units(compacted_log, *, cq_file_size: int):
    """Units of the compacted queues: original queue offsets, dense positions (SparseConsumeQueue).

    ``commitlog_offset`` is the message's offset in the commitlog; ``cq_file``
    is the sparse queue file holding the unit, from the unit's position in the
    compacted queue (``cq_file_size`` is ``compactionCqMappedFileSize``).
    """
    size = sparse_cq_file_size(cq_file_size)
    ordinal = F.row_number().over(Window.partitionBy("topic", "queue_id").orderBy("queue_offset")) - 1
    start = F.floor(ordinal * F.lit(SPARSE_CQ_UNIT_SIZE) / F.lit(size)) * F.lit(size)
    return compacted_log.select(
        "topic",
        "queue_id",
        "queue_offset",
        F.col("physical_offset").alias("commitlog_offset"),
        F.col("total_size").alias("size"),
        _tags_code("tags").alias("tags_code"),
        "store_timestamp",
        F.lpad(start.cast("bigint").cast("string"), 20, "0").alias("cq_file"),
    )


def _tags_code(column: str):
    """``String.hashCode`` of the tags (0 without tags), computed in Spark.

    Java's hashCode runs over UTF-16 code units, which no Spark function
    does; the rule itself lives in formats/consumequeue.py.
    """
    from pyspark.sql.types import LongType

    from rmqlake.formats.consumequeue import tags_code

    return F.udf(lambda tags: tags_code(tags), LongType())(F.col(column))  # a lambda: no type hints to infer from
