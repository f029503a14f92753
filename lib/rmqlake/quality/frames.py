"""What the quality suites validate: each table with the facts its invariants need, computed in Spark.

Great Expectations checks columns of one DataFrame. Invariants that span
rows (contiguous offsets) or tables (padding recorded in ``segments``) are
turned into columns here first: a value that must hold, or ``null`` where
the invariant does not apply (GX's column expectations skip nulls). The
byte rules come from ``rmqlake.formats`` (one module owns each), recomputed
from the stored fields, never copied from the stored results.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial, reduce
from operator import and_

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from rmqlake.formats.consumequeue import DEFAULT_DELAY_TABLE, SCHEDULE_TOPIC, delay_level, dispatch_tags_code
from rmqlake.formats.crc import body_crc
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.indexfile import message_index_keys
from rmqlake.formats.javahash import index_key_hash
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    STOREHOST_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    consumes_queue_offset,
    record_size,
)
from rmqlake.formats.retention import DISK_PRESSURE, EXPIRED, FORCED, HOUR_MS, MANUAL
from rmqlake.formats.schedule import REAL_QID, REAL_TOPIC, TIMER_TOPIC, ScheduleRules, due_ms, java_long
from rmqlake.formats.transaction import HALF_TOPIC, OFFSET_SEPARATOR, OP_TOPIC, TRAN_MSG
from rmqlake.lake.spark_io import derived_column
from rmqlake.lake.state import ScheduleState
from rmqlake.lake.tables import COMMITLOG, Schema, columns
from rmqlake.transforms.columns import dispatchable
from rmqlake.transforms.compaction import compaction_key
from rmqlake.transforms.segments import DELETED

# stored columns the checks compare with, carried through the one Python pass (no self-join on the offset)
CHECKED = ("segment", "physical_offset", "total_size", "magic", "body_crc", "msg_id", "topic", "queue_id")
CHECKED += ("queue_offset", "sys_flag", "store_timestamp", "store_time", "born_timestamp", "born_time")
RECOMPUTED = columns(
    ("expected_size", "int", "the record's size by the broker's formula (null: not a message magic)"),
    ("expected_crc", "int", "the CRC32 of the stored body"),
    ("expected_msg_id", "string", "the offsetMsgId of the store host and physical offset (null: bad host)"),
    ("dispatchable", "boolean", "whether the message takes a queue offset (not a prepared or rollback half)"),
)
FACTS = ("physical_offset", "total_size", "topic", "queue_id", "queue_offset")
EXPECTED = columns(
    ("expected_tags_code", "bigint", "the tags code the dispatch rules give (null: a DELAY the broker refuses)"),
    ("key_hashes", "array<int>", "the IndexFile hash of each of the message's index keys, in key order"),
)


def _frame(carried: tuple[str, ...], computed: Schema) -> Schema:
    """The commitlog's ``carried`` columns (table order), then ``computed``."""
    return COMMITLOG.schema.select(name for name in COMMITLOG.columns if name in carried) + computed


def _carry(
    batch: pa.RecordBatch, carried: tuple[str, ...], computed: Schema, values: dict[str, list]
) -> pa.RecordBatch:
    names = [name for name in COMMITLOG.columns if name in carried]
    arrays = [pa.array(values[column.name], column.arrow_type) for column in computed.columns]
    return pa.RecordBatch.from_arrays([batch.column(name) for name in names] + arrays, names=names + computed.names)


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
        yield _carry(
            batch,
            CHECKED,
            RECOMPUTED,
            {"expected_size": sizes, "expected_crc": crcs, "expected_msg_id": msg_ids, "dispatchable": dispatchable},
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
    * ``queue_slot``: ``topic/queue/offset`` of dispatchable messages, unique;
    * ``times_match``: ``store_time`` and ``born_time`` are the timestamps of
      the epoch milliseconds beside them.
    """
    inputs = ("body", "properties_bytes", "store_host")
    rows = commitlog.select(*sorted(set(CHECKED) | set(inputs))).mapInArrow(_recompute, _frame(CHECKED, RECOMPUTED).ddl)
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
        # null-safe: a derived time is null where its milliseconds are past the year 9999
        reduce(and_, (derived_column(c).eqNullSafe(F.col(c.name)) for c in COMMITLOG.schema.derived)).alias(
            "times_match"
        ),
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


def expiry_frame(segments: DataFrame, *, as_of: int | None, reserved_hours: int) -> DataFrame:
    """Segment rows with what expiry must explain, as of its last applied run (``as_of``, ms; None: never ran).

    ``kept_explained``: on a live segment whose last write is at least the
    reserved time before ``as_of`` (the broker would have deleted it), true
    when its row says why it was kept; null elsewhere. ``deletion_explained``:
    on a deleted segment, true when it has a known reason and a time.
    """
    reserved_ms = reserved_hours * HOUR_MS
    overdue = (
        (F.col("status") != DELETED) & (F.col("last_store_timestamp") + F.lit(reserved_ms) <= F.lit(as_of))
        if as_of is not None
        else F.lit(False)
    )
    reasons = [EXPIRED, DISK_PRESSURE, FORCED, MANUAL]
    return segments.select(
        "*",
        F.lit(as_of).cast("bigint").alias("expire_as_of"),
        F.when(overdue, F.length(F.coalesce("retained_reason", F.lit(""))) > 0).alias("kept_explained"),
        F.when(
            F.col("status") == DELETED, F.col("deleted_reason").isin(reasons) & F.col("deleted_at").isNotNull()
        ).alias("deletion_explained"),
    )


def _message_facts(batches, *, delay_levels: Mapping[int, int]):
    """Per message: the CQ tagsCode the dispatcher computes and the hashes of its index keys."""
    for batch in batches:
        columns = batch.to_pydict()
        codes, hashes = [], []
        for topic, tags, properties, stored, keys, uniq in zip(
            columns["topic"],
            columns["tags"],
            columns["properties"],
            columns["store_timestamp"],
            columns["keys_property"],
            columns["uniq_key"],
            strict=True,
        ):
            try:
                codes.append(dispatch_tags_code(topic, tags, dict(properties or []), stored, delay_levels=delay_levels))
            except ValueError:  # a DELAY the broker cannot parse: the unit cannot be right
                codes.append(None)
            hashes.append([index_key_hash(key) for key in message_index_keys(topic, uniq, keys)])
        yield _carry(batch, FACTS, EXPECTED, {"expected_tags_code": codes, "key_hashes": hashes})


def message_facts(commitlog: DataFrame, *, delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE) -> DataFrame:
    """``physical_offset``, ``total_size``, ``topic``, ``queue_id``, ``queue_offset`` of each live message,
    with ``expected_tags_code`` (under the broker's ``delay_levels``) and ``key_hashes`` recomputed by the
    formats rules."""
    return commitlog.select(
        *FACTS,
        "tags",
        "properties",
        "store_timestamp",
        "uniq_key",
        F.element_at("properties", F.lit("KEYS")).alias("keys_property"),
    ).mapInArrow(partial(_message_facts, delay_levels=dict(delay_levels)), _frame(FACTS, EXPECTED).ddl)


def consumequeue_frame(
    consumequeue: DataFrame,
    commitlog: DataFrame,
    min_offsets: DataFrame,
    *,
    delay_levels: Mapping[int, int] = DEFAULT_DELAY_TABLE,
) -> DataFrame:
    """CQ units with the facts of the message each points to (``delay_levels``: the broker's
    ``messageDelayLevel`` as {level: ms}, for the delay topic's tagsCode).

    ``min_offsets`` (``topic``, ``queue_id``, ``min_offset``) are the queue
    min offsets expiry corrected; units below a queue's min offset are the
    dead units a kept CQ file still holds, and their columns are null:

    * ``points_to_message``: a live message of the unit's size, topic, queue
      and queue offset is at ``commitlog_offset``;
    * ``tags_code_matches``: the unit's tags_code is the dispatcher's;
    * ``follows_previous``: queue offsets contiguous from the queue's min.
    """
    messages = message_facts(commitlog, delay_levels=delay_levels).select(
        F.col("physical_offset").alias("commitlog_offset"),
        F.col("total_size"),
        F.col("topic").alias("message_topic"),
        F.col("queue_id").alias("message_queue_id"),
        F.col("queue_offset").alias("message_queue_offset"),
        "expected_tags_code",
    )
    # the queue's min offset: as expiry corrected it (dead units in a kept file), else its first unit
    units = consumequeue.join(min_offsets, ["topic", "queue_id"], "left").withColumn(
        "min_offset", F.coalesce("min_offset", F.min("queue_offset").over(Window.partitionBy("topic", "queue_id")))
    )
    live = F.col("queue_offset") >= F.col("min_offset")
    rows = units.join(messages, "commitlog_offset", "left")
    in_queue = Window.partitionBy("topic", "queue_id").orderBy("queue_offset")
    matches = (
        F.col("total_size").isNotNull()
        & (F.col("size") == F.col("total_size"))
        & (F.col("topic") == F.col("message_topic"))
        & (F.col("queue_id") == F.col("message_queue_id"))
        & (F.col("queue_offset") == F.col("message_queue_offset"))
    )
    return rows.select(
        "*",
        F.when(live, F.coalesce(matches, F.lit(False))).alias("points_to_message"),
        F.when(live & F.col("total_size").isNotNull(), F.col("tags_code") == F.col("expected_tags_code")).alias(
            "tags_code_matches"
        ),
        F.when(
            live,
            F.coalesce(
                F.col("queue_offset") == F.lag("queue_offset").over(in_queue) + 1,
                F.col("queue_offset") == F.col("min_offset"),
            ),
        ).alias("follows_previous"),
    )


def indexfile_frame(indexfile: DataFrame, headers: DataFrame, commitlog: DataFrame, min_physical_offset: int):
    """Index entries with the facts of their chains, their file's header and the message they point to.

    * ``chain_points_back``: ``prev_index`` is 0 (end of chain) or an earlier
      entry of the same file in the same slot: chains cannot cycle;
    * ``header_counts_match`` (on each file's first entry): the header's
      ``index_count`` is the entries + 1 (entry 0 is never used) and its
      ``hash_slot_count`` the slots in use;
    * ``points_to_key`` (entries at or above the commitlog's min offset): the
      message at ``phy_offset`` is live and has a key with that hash.
    """
    previous = indexfile.select("index_file", F.col("index_no").alias("prev_index"), F.col("slot").alias("prev_slot"))
    rows = indexfile.join(previous, ["index_file", "prev_index"], "left")
    per_file = indexfile.groupBy("index_file").agg(
        F.count(F.lit(1)).alias("entries"),
        F.countDistinct("slot").alias("slots_used"),
        F.min("index_no").alias("first_index_no"),
    )
    header_facts = headers.select("index_file", "index_count", "hash_slot_count").join(per_file, "index_file", "full")
    rows = rows.join(header_facts, "index_file", "left")
    keys = message_facts(commitlog).select(F.col("physical_offset").alias("phy_offset"), "key_hashes")
    rows = rows.join(keys, "phy_offset", "left")
    return rows.select(
        "*",
        F.coalesce(
            (F.col("prev_index") == 0)
            | ((F.col("prev_index") < F.col("index_no")) & (F.col("prev_slot") == F.col("slot"))),
            F.lit(False),  # points to an entry that does not exist
        ).alias("chain_points_back"),
        F.when(
            F.col("index_no") == F.col("first_index_no"),
            F.coalesce(
                (F.col("index_count") == F.col("entries") + 1) & (F.col("hash_slot_count") == F.col("slots_used")),
                F.lit(False),
            ),
        ).alias("header_counts_match"),
        F.when(
            F.col("phy_offset") >= F.lit(min_physical_offset),
            F.coalesce(F.array_contains("key_hashes", F.col("key_hash")), F.lit(False)),
        ).alias("points_to_key"),
    )


def compaction_frame(
    compaction_log: DataFrame, commitlog: DataFrame, *, positions: dict[str, int], min_physical_offset: int
) -> DataFrame:
    """Compacted rows beside the latest live message of each key, one row per (topic, queue, key).

    ``positions``: each COMPACTION topic's compaction position (messages
    before it are compacted). ``kept_key`` is the key of a compacted row
    (null where the key has none); ``kept_is_latest`` holds when the kept row
    is the latest message of its key before the position, a key whose
    latest is a tombstone (empty body) has no row, and no key is missing; it
    is null for a kept row whose history expiry already removed.
    """
    key = compaction_key()
    kept = compaction_log.select(
        "topic", "queue_id", key.alias("kept_key"), F.col("physical_offset").alias("kept_offset")
    )
    before = F.lit(None).cast("boolean")
    for topic, position in positions.items():
        before = F.when(F.col("topic") == topic, F.col("physical_offset") < position).otherwise(before)
    candidates = commitlog.where(F.coalesce(before, F.lit(False)) & dispatchable()).select(
        "topic", "queue_id", key.alias("key"), "queue_offset", "physical_offset", F.length("body").alias("size")
    )
    newest_first = Window.partitionBy("topic", "queue_id", "key").orderBy(F.col("queue_offset").desc())
    latest = (
        candidates.where(F.col("key").isNotNull())
        .withColumn("rank", F.row_number().over(newest_first))
        .where("rank = 1")
        .select(
            "topic",
            "queue_id",
            F.col("key").alias("kept_key"),
            F.col("physical_offset").alias("latest_offset"),
            (F.coalesce(F.col("size"), F.lit(0)) == 0).alias("latest_is_tombstone"),
        )
    )
    rows = kept.join(latest, ["topic", "queue_id", "kept_key"], "full")
    present, expected = F.col("kept_offset").isNotNull(), F.col("latest_offset").isNotNull()
    return rows.select(
        "*",
        F.when(present & expected, (F.col("kept_offset") == F.col("latest_offset")) & ~F.col("latest_is_tombstone"))
        .when(present, F.when(F.col("kept_offset") >= min_physical_offset, F.lit(False)))  # else: history expired
        .when(~F.col("latest_is_tombstone"), F.lit(False))  # a key without its latest value
        .alias("kept_is_latest"),
    )


def producer_frame(commitlog: DataFrame) -> DataFrame:
    """Messages with what a producer may get wrong without breaking the store.

    ``resend_key``: ``topic/UNIQ_KEY`` of dispatchable messages (a transaction's
    half and its commit share one; a producer's resend of a message it
    believed lost makes a second). ``born_before_store``: the producer's
    clock was not ahead of the broker's.
    """
    return commitlog.select(
        "topic",
        "queue_id",
        "physical_offset",
        "uniq_key",
        # a record without UNIQ_KEY (a transaction's op record, written by the broker itself) resends nothing
        F.when(dispatchable() & F.col("uniq_key").isNotNull(), F.concat_ws("/", "topic", "uniq_key")).alias(
            "resend_key"
        ),
        (F.col("born_timestamp") <= F.col("store_timestamp")).alias("born_before_store"),
    )


def reject_ratio_frame(rejected: DataFrame, ingest_files: DataFrame) -> DataFrame:
    """One row per ingest batch: input lines, rejected lines (from ``rejected``) and their ratio."""
    lines = ingest_files.groupBy("batch_id").agg(F.sum("lines").alias("lines"))
    rejects = rejected.groupBy("batch_id").agg(F.count(F.lit(1)).alias("rejected"))
    return (
        lines.join(rejects, "batch_id", "left")
        .select("batch_id", "lines", F.coalesce("rejected", F.lit(0)).alias("rejected"))
        .withColumn("reject_ratio", F.when(F.col("lines") > 0, F.col("rejected") / F.col("lines")))
    )


def consumer_offsets_frame(offsets: DataFrame, bounds: DataFrame) -> DataFrame:
    """Each group's latest committed offset per queue beside the queue's (min, max) offsets.

    ``above_min``: the offset is not below the queue's min (below it, expiry
    removed messages the group never consumed and the broker answers
    OFFSET_TOO_SMALL). ``within_max``: not beyond the queue's max offset.
    Null for queues the store does not have.
    """
    newest_first = Window.partitionBy("group", "topic", "queue_id").orderBy(F.col("as_of").desc())
    latest = offsets.withColumn("rank", F.row_number().over(newest_first)).where("rank = 1").drop("rank")
    rows = latest.join(bounds, ["topic", "queue_id"], "left")
    known = F.col("max_offset").isNotNull()
    return rows.select(
        "*",
        F.when(known, F.col("offset") >= F.col("min_offset")).alias("above_min"),
        F.when(known, F.col("offset") <= F.col("max_offset")).alias("within_max"),
    )


# A record stored on the delay or timer topic, with where and when the broker delivers it.
SCHEDULED = columns(
    ("physical_offset", "bigint", "the record's physical offset"),
    ("topic", "string", "SCHEDULE_TOPIC_XXXX or the timer topic"),
    ("queue_id", "int", "its queue there"),
    ("queue_offset", "bigint", "its queue offset there"),
    ("uniq_key", "string", "its UNIQ_KEY, which its delivery keeps"),
    ("real_topic", "string", "REAL_TOPIC: the topic it is delivered to"),
    ("real_qid", "int", "REAL_QID: the queue it is delivered to"),
    ("level", "int", "its delay level, capped at the highest (0: a timer)"),
    ("due", "bigint", "when the broker delivers it: its delivery's store time (formats.schedule.due_ms)"),
)
SCHEDULE_PROBLEMS = columns(
    ("record", "string", "the schedule record(s) or the pending group the row is about"),
    ("due_delivery_problem", "string", "what is wrong with the deliveries of a record that is due (null: right)"),
    ("early_delivery_problem", "string", "a delivery of a record not yet due (null: none)"),
    ("pending_problem", "string", "how a pending group differs from the lake state's (null: the same)"),
)
_LINK = ["uniq_key", "real_topic", "real_qid", "due"]


def _scheduled(batches, *, rules: ScheduleRules):
    """The records of the schedule topics the broker delivers (``due_ms`` not null), with their due time."""
    for batch in batches:
        columns = batch.to_pydict()
        out: dict[str, list] = {name: [] for name in SCHEDULED.names}
        for row in range(batch.num_rows):
            topic, properties = columns["topic"][row], dict(columns["properties"][row] or [])
            due = due_ms(topic, properties, columns["store_timestamp"][row], rules)
            if due is None:
                continue
            for name in ("physical_offset", "topic", "queue_id", "queue_offset", "uniq_key"):
                out[name].append(columns[name][row])
            out["real_topic"].append(properties[REAL_TOPIC])
            out["real_qid"].append(java_long(properties[REAL_QID], bits=32))
            level = 0 if topic == TIMER_TOPIC else delay_level(properties, delay_levels=rules.delay_levels)
            out["level"].append(level)
            out["due"].append(due)
        yield pa.RecordBatch.from_pydict(out, schema=SCHEDULED.arrow_schema)


def schedule_frame(commitlog: DataFrame, *, schedule: ScheduleState | None, rules: ScheduleRules) -> DataFrame:
    """Each schedule record's deliveries, and each pending group, against the lake state's ``schedule``.

    A schedule record is a message on ``SCHEDULE_TOPIC_XXXX`` or the timer topic
    that the broker delivers (``due_ms``). Its delivery is a message on its
    ``REAL_TOPIC`` and ``REAL_QID`` with its UNIQ_KEY, stored at its due time;
    records sharing all four are matched by count. One row per such group of
    records (``record`` names the first by topic, queue, queue offset and
    UNIQ_KEY) and one per pending group (level or timer, real topic):

    * ``due_delivery_problem``: due at or before the clock the lake delivered
      up to (``delivered_until``), yet without exactly one delivery each;
    * ``early_delivery_problem``: not yet due, yet delivered;
    * ``pending_problem``: the records not yet due, counted per group with
      the first due time, differ from the state's ``pending``, or one is
      below the state's ``pending_from``.

    Messages are scanned for deliveries only from the first schedule record
    on; a lake without any reads the schedule topics' rows only.
    """
    spark = commitlog.sparkSession
    clock = schedule.delivered_until if schedule else None
    stored = commitlog.filter(F.col("topic").isin(SCHEDULE_TOPIC, TIMER_TOPIC) & dispatchable())
    first_offset = stored.agg(F.min("physical_offset")).first()[0]
    state_groups = spark.createDataFrame(
        [
            (key.level, key.topic, group.count, group.next_due)
            for key, group in (schedule.pending if schedule else {}).items()
        ],
        "level int, real_topic string, state_count bigint, state_next_due bigint",
    )
    if first_offset is None:
        scheduled = spark.createDataFrame([], SCHEDULED.ddl)
    else:
        scheduled = stored.select(
            "physical_offset", "topic", "queue_id", "queue_offset", "uniq_key", "properties", "store_timestamp"
        ).mapInArrow(partial(_scheduled, rules=rules), SCHEDULED.ddl)
    is_due = F.col("due") <= F.lit(clock) if clock is not None else F.lit(False)
    clock_text = F.lit("never" if clock is None else str(clock))

    groups = scheduled.groupBy(*_LINK).agg(
        F.count(F.lit(1)).alias("records"),
        F.min(F.struct("physical_offset", "topic", "queue_id", "queue_offset")).alias("first"),
    )
    if first_offset is None:
        delivered = spark.createDataFrame(
            [], "uniq_key string, real_topic string, real_qid int, due bigint, deliveries bigint"
        )
    else:
        delivered = (
            commitlog.filter(
                (F.col("physical_offset") > F.lit(first_offset))
                & ~F.col("topic").isin(SCHEDULE_TOPIC, TIMER_TOPIC)
                & F.col("uniq_key").isNotNull()
            )
            .select(
                "uniq_key",
                F.col("topic").alias("real_topic"),
                F.col("queue_id").alias("real_qid"),
                F.col("store_timestamp").alias("due"),
            )
            .join(groups.select(*_LINK), _LINK, "left_semi")
            .groupBy(*_LINK)
            .agg(F.count(F.lit(1)).alias("deliveries"))
        )
    rows = groups.join(delivered, _LINK, "left").withColumn("deliveries", F.coalesce("deliveries", F.lit(0)))
    record = F.concat(
        F.format_string(
            "%s queue %d offset %d (uniq key %s)", "first.topic", "first.queue_id", "first.queue_offset", "uniq_key"
        ),
        F.when(
            F.col("records") > 1,
            F.format_string(" and %d more with that uniq key, real queue and due time", F.col("records") - 1),
        ).otherwise(F.lit("")),
    )
    target = F.format_string("%s queue %d stored at %d", "real_topic", "real_qid", "due")
    deliveries = rows.select(
        record.alias("record"),
        F.when(
            is_due & (F.col("deliveries") != F.col("records")),
            F.format_string(
                "%s, due at %d (delivered up to %s): %d delivery record(s) on %s, expected %d",
                record,
                "due",
                clock_text,
                "deliveries",
                target,
                "records",
            ),
        ).alias("due_delivery_problem"),
        F.when(
            ~is_due & (F.col("deliveries") > 0),
            F.format_string(
                "%s, due at %d, after the clock the lake delivered up to (%s): %d delivery record(s) on %s",
                record,
                "due",
                clock_text,
                "deliveries",
                target,
            ),
        ).alias("early_delivery_problem"),
        F.lit(None).cast("string").alias("pending_problem"),
    )

    lake_groups = (
        scheduled.filter(~is_due)
        .groupBy("level", "real_topic")
        .agg(
            F.count(F.lit(1)).alias("lake_count"),
            F.min("due").alias("lake_next_due"),
            F.min("physical_offset").alias("lake_first_offset"),
        )
    )
    pending = lake_groups.join(state_groups, ["level", "real_topic"], "full")
    group = F.format_string(
        "pending %s to %s",
        F.when(F.col("level") == 0, F.lit("timers")).otherwise(F.format_string("delay level %d", "level")),
        "real_topic",
    )
    same = (F.coalesce("lake_count", F.lit(0)) == F.coalesce("state_count", F.lit(0))) & F.col(
        "lake_next_due"
    ).eqNullSafe(F.col("state_next_due"))
    # ingest looks for the records to deliver from pending_from on: one below it would never be delivered
    pending_from = schedule.pending_from if schedule else None
    below = F.col("lake_first_offset") < F.lit(pending_from if pending_from is not None else 2**63 - 1)
    count_problem = F.when(
        ~same,
        F.format_string(
            "%s: %d record(s) not yet due (first due %s) where the lake state has %d (first due %s)",
            group,
            F.coalesce("lake_count", F.lit(0)),
            F.coalesce(F.col("lake_next_due").cast("string"), F.lit("-")),
            F.coalesce("state_count", F.lit(0)),
            F.coalesce(F.col("state_next_due").cast("string"), F.lit("-")),
        ),
    )
    from_problem = F.when(
        below,
        F.format_string(
            "%s: its first record not yet due, at physical offset %d, is below the lake state's pending_from %s",
            group,
            "lake_first_offset",
            F.lit(str(pending_from)),
        ),
    )
    pendings = pending.select(
        group.alias("record"),
        F.lit(None).cast("string").alias("due_delivery_problem"),
        F.lit(None).cast("string").alias("early_delivery_problem"),
        F.when(
            count_problem.isNotNull() | from_problem.isNotNull(), F.concat_ws("; ", count_problem, from_problem)
        ).alias("pending_problem"),
    )
    return deliveries.unionByName(pendings)


TRANSACTION_PROBLEMS = columns(
    ("record", "string", "the commit re-put, or the half queue offset and the op records naming it"),
    ("commit_problem", "string", "what is wrong with a commit re-put's link to its half (null: right)"),
    ("op_entry_problem", "string", "an op entry naming a half that is not on the half topic (null: it is)"),
    ("repeated_end_problem", "string", "a half named by more than one op entry (null: ended at most once)"),
)


def commit_reputs(commitlog: DataFrame) -> DataFrame:
    """The records a broker re-puts when a producer commits a half message.

    A re-put has the COMMIT transaction type and keeps every property of its half, ``TRAN_MSG``
    (true, as ``Boolean.parseBoolean`` reads it) and ``REAL_TOPIC`` included. A store-level COMMIT
    (a ``transaction`` line of the old protocol) carries neither: it has no half and is not one.
    """
    return commitlog.filter(
        (F.col("sys_flag").bitwiseAND(TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE)
        & (F.lower(F.col("properties")[TRAN_MSG]) == "true")
        & F.col("properties")[REAL_TOPIC].isNotNull()
    )


def op_entries(commitlog: DataFrame) -> DataFrame:
    """One row per entry of the op records' bodies: ``queue_id`` (the op record's: its half's queue),
    ``half_queue_offset``, ``op_offset`` (the op record's physical offset) and ``position`` in its body.
    Parts that are not integers are skipped, as the broker's check service skips them."""
    parts = commitlog.filter(F.col("topic") == OP_TOPIC).select(
        "queue_id",
        F.col("physical_offset").alias("op_offset"),
        F.posexplode(F.split(F.decode("body", "UTF-8"), OFFSET_SEPARATOR)).alias("position", "part"),
    )
    return parts.filter(F.col("part").rlike("^[+-]?[0-9]+$")).select(
        "queue_id", F.col("part").cast("bigint").alias("half_queue_offset"), "op_offset", "position"
    )


def transaction_frame(commitlog: DataFrame, *, min_physical_offset: int) -> DataFrame:
    """Each commit re-put against its half, and each half queue offset the op records name.

    One row per commit re-put (:func:`commit_reputs`): ``commit_problem`` when its
    ``prepared_transaction_offset`` is not the physical offset of a record on the half topic with the
    same UNIQ_KEY. One row per (half queue, queue offset) that op entries name: ``op_entry_problem``
    when no record on the half topic has it; ``repeated_end_problem`` when more than one entry names it.

    Halves removed by expiry are not problems: a commit whose ``prepared_transaction_offset`` is below
    ``min_physical_offset``, and an op entry naming a queue offset below the half queue's first live
    one once segments were deleted, point where a broker's would too after it deleted the files.
    """
    halves = commitlog.filter(F.col("topic") == HALF_TOPIC).select(
        F.col("physical_offset").alias("half_offset"),
        F.col("uniq_key").alias("half_uniq_key"),
        "queue_id",
        F.col("queue_offset").alias("half_queue_offset"),
    )
    commits = commit_reputs(commitlog).select(
        "physical_offset", "topic", "queue_id", "queue_offset", "uniq_key", "prepared_transaction_offset"
    )
    linked = commits.join(
        halves.select("half_offset", "half_uniq_key"),
        F.col("prepared_transaction_offset") == F.col("half_offset"),
        "left",
    )
    commit_record = F.format_string(
        "commit %s queue %d offset %d at physical offset %d (uniq key %s)",
        "topic",
        "queue_id",
        "queue_offset",
        "physical_offset",
        F.coalesce("uniq_key", F.lit("-")),
    )
    expired = F.col("prepared_transaction_offset") < F.lit(min_physical_offset)
    commit_rows = linked.select(
        commit_record.alias("record"),
        F.when(
            ~expired & F.col("half_offset").isNull(),
            F.format_string(
                "%s: prepared_transaction_offset %d is not a record on %s",
                commit_record,
                "prepared_transaction_offset",
                F.lit(HALF_TOPIC),
            ),
        )
        .when(
            ~expired & ~F.col("half_uniq_key").eqNullSafe(F.col("uniq_key")),
            F.format_string(
                "%s: the half at prepared_transaction_offset %d has uniq key %s",
                commit_record,
                "prepared_transaction_offset",
                F.coalesce("half_uniq_key", F.lit("-")),
            ),
        )
        .alias("commit_problem"),
        F.lit(None).cast("string").alias("op_entry_problem"),
        F.lit(None).cast("string").alias("repeated_end_problem"),
    )

    named = (
        op_entries(commitlog)
        .groupBy("queue_id", "half_queue_offset")
        .agg(
            F.count(F.lit(1)).alias("entries"),
            F.transform(F.sort_array(F.collect_set("op_offset")), lambda offset: offset.cast("string")).alias(
                "op_offsets"
            ),
        )
    )
    first_live = halves.groupBy("queue_id").agg(F.min("half_queue_offset").alias("first_live"))
    checked = named.join(
        halves.select("queue_id", "half_queue_offset", "half_offset"), ["queue_id", "half_queue_offset"], "left"
    ).join(first_live, "queue_id", "left")
    gone = F.lit(min_physical_offset > 0) & (
        F.col("first_live").isNull() | (F.col("half_queue_offset") < F.col("first_live"))
    )
    half_record = F.format_string(
        "half queue %d offset %d, named by the op record(s) at physical offset %s",
        "queue_id",
        "half_queue_offset",
        F.array_join("op_offsets", ", "),
    )
    op_rows = checked.select(
        half_record.alias("record"),
        F.lit(None).cast("string").alias("commit_problem"),
        F.when(
            F.col("half_offset").isNull() & ~gone,
            F.format_string("%s: no record on %s has that queue offset", half_record, F.lit(HALF_TOPIC)),
        ).alias("op_entry_problem"),
        F.when(
            F.col("entries") > 1,
            F.format_string("%s: ended %d times", half_record, "entries"),
        ).alias("repeated_end_problem"),
    )
    return commit_rows.unionByName(op_rows)
