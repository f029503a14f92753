"""Transactional messages: the ends of halves, turned into the records a broker appends for them.

A half send is re-routed at parse time (``lines``, and the JVM parser alike: the half topic, queue 0). An
``endTransaction`` line names its half by UNIQ_KEY; what it stores depends on that half, which may be in this
batch or in the lake:

* a parse task writes, per split, its end lines (``END_LINES``) and its halves (``HALVES``) to small files;
* ``resolve_ends`` (Spark, on executors) gathers per UNIQ_KEY the lake's halves (those an op record already
  ended marked), the batch's halves and the batch's ends in append order, and decides each end in turn: the
  latest half before it, unless there is none or it was ended already, or the broker refuses the end
  (``formats.transaction.end_refusal``); then, per split of end lines, it writes the records as an extra
  split: for a COMMIT the re-put on the real topic (``formats.transaction.commit``) and the op record, for a
  ROLLBACK the op record alone; refused ends go to the ``rejected`` staging folder. Spark's tasks decide and
  write column by column (``decide_ends_columns``, ``end_records_columns``); ``decide_ends`` and ``end_records``,
  a row at a time, are the references the tests hold them to.

The op record names the half by its queue offset on the half topic. A half of the batch gets its queue offset
from its rank among the batch's halves (every record of the half topic is a half: sends to it are refused),
so the op's body, and its size, are known before the append is planned. A commit of a half of this batch
takes the half's round-robin turn (``parent_*`` columns, like a delivery) and learns the half's physical
offset when its partition is written (``ingest.tasks.write_partition``).

Op records are written one per end, right after the commit: a broker batches the ends of about three seconds
(``transactionOpBatchInterval``) into one op record written a little later; the halves named are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqlake.formats.crc import body_crc
from rmqlake.formats.properties import parse_properties, serialize_properties
from rmqlake.formats.record import (
    BORNHOST_V6_FLAG,
    STOREHOST_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    magic_for_topic,
    record_size,
    record_sizes,
)
from rmqlake.formats.transaction import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    HALF_TOPIC,
    OP_TOPIC,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    REMOVE_TAG,
    EndRefused,
    commit,
    end_refusal,
    java_int,
    op_properties,
)
from rmqlake.ingest.deliveries import scratch_rows_of_commitlog
from rmqlake.ingest.message import MESSAGE_TYPES
from rmqlake.ingest.scratch import SCRATCH_BATCH_ROWS, SCRATCH_COLUMNS, appended_narrow_rows
from rmqlake.lake.tables import columns

MESSAGE_ROW, OP_ROW = 0, 2  # narrow row kinds (``ingest.plan``): an op record sorts after its end's commit

# An end line, as its parse task saves it.
END_LINES = columns(
    ("split", "int", "the split the line was read in"),
    ("file_rank", "int", "its file's position in path order"),
    ("source_line", "bigint", "its line number"),
    ("raw", "string", "the line, quoted if the end is refused"),
    ("end", "string", "COMMIT or ROLLBACK"),
    ("uniq_key", "string", "the UNIQ_KEY of the half it ends"),
    ("store_timestamp", "bigint", "when the broker ends it: the store time of what it appends"),
    ("topic", "string", "the real topic the producer names (null: not named)"),
    ("producer_group", "string", "the producer group ending it (null: not named)"),
    ("from_check", "boolean", "the end answers the broker's transaction check"),
)

# A half message of the batch, as its parse task saves it.
HALVES = columns(
    ("split", "int", "the split the half was read in"),
    ("file_rank", "int", "its file's position in path order"),
    ("source_line", "bigint", "its line number"),
    ("store_timestamp", "bigint", "its store time"),
    ("scratch_batch", "int", "where its record is in the split's scratch file: batch"),
    ("scratch_row", "int", "and row in the batch"),
    ("uniq_key", "string", "its UNIQ_KEY"),
    ("born_timestamp", "bigint", "its born time (the check immunity time counts from it)"),
    ("real_topic", "string", "its REAL_TOPIC"),
    ("producer_group", "string", "its PGROUP"),
    ("check_immunity", "string", "its CHECK_IMMUNITY_TIME_IN_SECONDS"),
)


def end_lines(parsed: pa.RecordBatch | pa.Table, *, split: int, file_rank: int) -> pa.Table:
    """The ``END_LINES`` rows of the end lines among parsed lines (``ingest.parse.PARSED_SCHEMA``)."""
    count = parsed.num_rows
    return pa.table(
        [
            pa.array(np.full(count, split, np.int32)),
            pa.array(np.full(count, file_rank, np.int32)),
            parsed.column("source_line"),
            parsed.column("raw"),
            parsed.column("end_transaction"),
            parsed.column("uniq_key"),
            parsed.column("store_timestamp"),
            parsed.column("topic"),
            parsed.column("end_producer_group"),
            parsed.column("end_from_check"),
        ],
        schema=END_LINES.arrow_schema,
    )


def halves_of(records: pa.Table, *, split: int, file_rank: int, first_batch: int) -> pa.Table | None:
    """The ``HALVES`` rows of the halves among a split's records (scratch columns, written from ``first_batch``)."""
    on_half = pc.fill_null(pc.equal(records.column("topic"), HALF_TOPIC), False).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(on_half)
    if not len(rows):
        return None
    picked = records.take(pa.array(rows))
    named = [dict(pairs) for pairs in picked.column("properties").to_pylist()]
    count = len(rows)
    return pa.table(
        [
            pa.array(np.full(count, split, np.int32)),
            pa.array(np.full(count, file_rank, np.int32)),
            picked.column("source_line"),
            picked.column("store_timestamp"),
            pa.array(first_batch + rows // SCRATCH_BATCH_ROWS, pa.int32()),
            pa.array(rows % SCRATCH_BATCH_ROWS, pa.int32()),
            picked.column("uniq_key"),
            picked.column("born_timestamp"),
            pa.array([pairs.get(REAL_TOPIC) for pairs in named], pa.string()),
            pa.array([pairs.get(PGROUP) for pairs in named], pa.string()),
            pa.array([pairs.get(CHECK_IMMUNITY_TIME_IN_SECONDS) for pairs in named], pa.string()),
        ],
        schema=HALVES.arrow_schema,
    )


# -- deciding each end (executors, one UNIQ_KEY after another) ----------------------------

# The lake's half records an end may need: the commitlog columns of a scratch row (the placement's own columns
# and the message's fields but those the parse computes for the placement).
LAKE_HALF_COLUMNS = [
    "physical_offset",
    "queue_offset",
    *(name for name in MESSAGE_TYPES if name not in ("store_host_prefix", "real_queue_round_robin")),
]

# One event of a UNIQ_KEY: a half of the lake (``source`` 0), a half of the batch (1) or an end line (2), in
# append order (``at``, ``rank``, ``line``; the lake's halves first, by offset).
EVENT_SOURCE_LAKE, EVENT_SOURCE_BATCH, EVENT_SOURCE_END = 0, 1, 2
LAKE_EVENT_AT = -(1 << 63)  # a half of the lake sorts before every event of the batch


@dataclass
class _Half:
    """The half an end may end."""

    event: dict
    ended: bool


def decide_ends(rows: Iterator[dict], *, transaction_timeout_ms: int) -> Iterator[dict]:
    """Decide the ends among one UNIQ_KEY's events (in append order): each ends the latest half before it.

    Refused: no half before it; that half already ended (by an op record of the lake, or an earlier end); a
    producer group other than the half's, or an end past the check immunity time (``end_refusal``); a named
    topic other than the half's real topic. A refused end stores nothing and leaves the half as it was.
    """
    latest: _Half | None = None
    for event in rows:
        source = event["source"]
        if source != EVENT_SOURCE_END:
            latest = _Half(event, bool(event.get("lake_ended")))
            continue
        if latest is None:
            reason = _NO_HALF.format(key=event["uniq_key"])
        elif latest.ended:
            reason = _ENDED.format(key=event["uniq_key"])
        else:
            reason = _refusal(event, latest.event, transaction_timeout_ms=transaction_timeout_ms)
        decided = {**event, "reason": reason, "half": None if reason else latest.event}
        if reason is None:
            latest.ended = True
        yield decided


_NO_HALF = "no half message with UNIQ_KEY {key!r} was stored before this end"
_ENDED = "the half message with UNIQ_KEY {key!r} was already ended"


def _refusal(end: dict, half: dict, *, transaction_timeout_ms: int) -> str | None:
    """Why the broker refuses ``end`` of an open ``half`` (events, or their columns), or ``None``."""
    pairs = [(PGROUP, half["half_group"])] if half["half_group"] is not None else []
    if half["check_immunity"] is not None:
        pairs.append((CHECK_IMMUNITY_TIME_IN_SECONDS, half["check_immunity"]))
    reason = end_refusal(
        pairs,
        born_timestamp=half["born_timestamp"],
        now_ms=end["at"],
        producer_group=end["producer_group"],
        from_transaction_check=bool(end["from_check"]),
        transaction_timeout_ms=transaction_timeout_ms,
    )
    if reason is not None:
        return f"the broker refuses this end: {reason}"
    if end["topic"] is not None and end["topic"] != half["real_topic"]:
        return f"the end names topic {end['topic']!r}; the half's real topic is {half['real_topic']!r}"
    return None


# what ``end_records`` reads of a decided end, and of the half it ends (the lake's halves have ``lake_record``, the
# batch's the ``half_*`` columns)
DECIDED_END_COLUMNS = ("split", "line", "raw", "end", "at")
DECIDED_HALF_COLUMNS = ("source", "at", "rank", "line", "half_queue_offset", "half_split", "half_batch", "half_row",
                        "lake_record")  # fmt: skip


# what ``_refusal`` reads of an end and of its half
_END_REFUSAL_COLUMNS = ("at", "producer_group", "from_check", "topic")
_HALF_REFUSAL_COLUMNS = ("half_group", "check_immunity", "born_timestamp", "real_topic")


def decide_ends_columns(events: pa.Table, *, transaction_timeout_ms: int, half_columns: list[str]) -> pa.Table:
    """``decide_ends`` over many UNIQ_KEYs at once: ``events`` sorted by UNIQ_KEY, each key's in append order and
    all of them. Returns the ends in that order, with ``DECIDED_END_COLUMNS``, ``reason`` and ``half`` (the
    ``half_columns`` of the half it ends, null where refused). ``decide_ends`` is the reference; a test holds the
    two to the same decisions.

    The latest half before each end is found for all of them at once; what stays per end is the broker's own
    refusal (``_refusal``) and whether an earlier end of the same half was accepted.
    """
    count = events.num_rows
    keys = events.column("uniq_key").to_numpy(zero_copy_only=False)
    is_end = events.column("source").to_numpy() == EVENT_SOURCE_END
    rows = np.arange(count)
    key_starts = np.ones(count, bool)
    key_starts[1:] = keys[1:] != keys[:-1]
    key_start = np.maximum.accumulate(np.where(key_starts, rows, 0))
    latest_half = np.maximum.accumulate(np.where(is_end, -1, rows))
    end_rows = np.flatnonzero(is_end)
    half_rows = latest_half[end_rows]
    has_half = half_rows >= key_start[end_rows]
    half_rows = np.where(has_half, half_rows, 0)

    ends = events.take(end_rows)
    halves = events.take(half_rows)
    end_values = {name: ends.column(name).to_pylist() for name in _END_REFUSAL_COLUMNS}
    half_values = {  # a batch without halves, whose lake has none of the keys, has no half columns
        name: halves.column(name).to_pylist() if name in events.column_names else [None] * len(end_rows)
        for name in _HALF_REFUSAL_COLUMNS
    }
    lake_ended = (
        pc.fill_null(halves.column("lake_ended"), False).to_numpy(zero_copy_only=False)
        if "lake_ended" in events.column_names
        else np.zeros(len(end_rows), bool)
    )
    end_keys = keys[end_rows]
    reasons: list[str | None] = []
    ended: set[int] = set()
    for at, half_row in enumerate(half_rows.tolist()):
        if not has_half[at]:
            reason = _NO_HALF.format(key=end_keys[at])
        elif lake_ended[at] or half_row in ended:
            reason = _ENDED.format(key=end_keys[at])
        else:
            reason = _refusal(
                {name: values[at] for name, values in end_values.items()},
                {name: values[at] for name, values in half_values.items()},
                transaction_timeout_ms=transaction_timeout_ms,
            )
            if reason is None:
                ended.add(half_row)
        reasons.append(reason)
    reason_array = pa.array(reasons, pa.string())
    half = pa.StructArray.from_arrays(
        [halves.column(name).combine_chunks() for name in half_columns],
        fields=[events.schema.field(name) for name in half_columns],
        mask=reason_array.is_valid(),
    )
    return pa.table(
        [*(ends.column(name) for name in DECIDED_END_COLUMNS), reason_array, half],
        names=[*DECIDED_END_COLUMNS, "reason", "half"],
    )


# -- the records of the ends (executors, one split of end lines per task) -------------------


@dataclass
class EndRecords:
    """What one split's ends store: scratch rows and narrow rows (``None``: nothing), and the refused ends."""

    scratch: pa.Table | None
    narrow: pa.RecordBatch | None
    refused: list[dict]
    commits: int
    rollbacks: int


def end_records(decided: list[dict], *, split: int, file_rank: int, scratch_row) -> EndRecords:
    """The records of one split's decided ends, in line order: scratch rows, narrow rows, and the refused ends.

    ``decided``: the split's ``decide_ends`` results, each with its ``half``: a lake half carries its commitlog
    columns (``lake_record``), a batch half its scratch position, read with ``scratch_row(split, batch, row)``.
    """
    records, parents, kinds, refused = [], [], [], []
    commits = rollbacks = 0
    for end in sorted(decided, key=lambda row: row["line"]):
        if end["reason"] is not None:
            refused.append(end)
            continue
        half = end["half"]
        if half["source"] == EVENT_SOURCE_LAKE:
            record = _lake_scratch_row(half["lake_record"])
            physical_offset, parent = half["lake_record"]["physical_offset"], None
        else:
            record = scratch_row(half["half_split"], half["half_batch"], half["half_row"])
            physical_offset, parent = 0, (half["at"], half["rank"], half["line"])  # the offset: when placed
        if end["end"] == "COMMIT":
            try:
                reput = _commit_record(record, physical_offset, end)
            except EndRefused as refusal:
                refused.append({**end, "reason": f"the broker refuses this end: {refusal}"})
                continue
            records.append(reput)
            parents.append(parent)
            kinds.append(MESSAGE_ROW)
            commits += 1
        else:
            rollbacks += 1
        records.append(_op_record(record, end, half_queue_offset=half["half_queue_offset"]))
        parents.append(None)
        kinds.append(OP_ROW)
    if not records:
        return EndRecords(None, None, refused, commits, rollbacks)
    table = pa.table({name: pa.array([r[name] for r in records], _SCRATCH_TYPES[name]) for name in SCRATCH_COLUMNS})
    narrow = _narrow(table, split=split, file_rank=file_rank, kinds=kinds, parents=parents)
    return EndRecords(table, narrow, refused, commits, rollbacks)


_SCRATCH_TYPES = {"source_line": pa.int64(), **MESSAGE_TYPES}
_SCRATCH_SCHEMA = pa.schema(list(_SCRATCH_TYPES.items()))


def end_records_columns(decided: pa.Table, *, split: int, file_rank: int, scratch_rows) -> EndRecords:
    """``end_records`` column by column: the same records, narrow rows and refused ends (``refused`` as ``line``,
    ``raw`` and ``reason`` only), from one split's decided ends as a table (``DECIDED_END_COLUMNS``, ``reason``,
    ``half``). ``end_records`` is the reference, and a test holds the two to the same output.

    ``scratch_rows(splits, batches, rows)``: the scratch rows of the batch's halves at those positions (NumPy
    arrays), as a table in that order.
    """
    decided = decided.sort_by("line")
    refused_at = pc.is_valid(decided.column("reason")).to_numpy(zero_copy_only=False)
    refused = [dict(row) for row in decided.filter(refused_at).select(["line", "raw", "reason"]).to_pylist()]
    ends = decided.filter(~refused_at)
    if not ends.num_rows:
        return EndRecords(None, None, refused, 0, 0)
    halves = ends.column("half").combine_chunks()
    records = _half_records(halves, scratch_rows)
    lines = ends.column("line").to_numpy()
    stamps = ends.column("at").to_numpy()
    is_commit = pc.equal(ends.column("end"), "COMMIT").to_numpy(zero_copy_only=False)

    # a commit whose half names no real topic and queue fails in the processor: refused, and no op record
    real_topics, real_queue_ids = _real_queues(records, from_lake=_from_lake(halves))
    kept = np.ones(len(ends), bool)
    for row in np.flatnonzero(is_commit).tolist():
        if real_topics[row] and real_queue_ids[row] is not None:
            continue
        try:  # the reference says why
            pairs = parse_properties(records.column("properties_bytes")[row].as_py()).items()
            commit(list(pairs), half_sys_flag=0, half_physical_offset=0)
        except EndRefused as refusal:
            reason = f"the broker refuses this end: {refusal}"
        else:
            raise AssertionError(f"the reference commits the half of line {lines[row]}; its real queue did not parse")
        refused.append({"line": int(lines[row]), "raw": ends.column("raw")[row].as_py(), "reason": reason})
        kept[row] = False
    refused.sort(key=lambda row: row["line"])
    commit_at = np.flatnonzero(is_commit & kept)
    op_at = np.flatnonzero(kept)
    if not len(op_at):
        return EndRecords(None, None, refused, 0, 0)

    commits = _commit_columns(
        records.take(commit_at),
        lines=lines[commit_at],
        stamps=stamps[commit_at],
        topics=[real_topics[row] for row in commit_at],
        queue_ids=np.array([real_queue_ids[row] for row in commit_at], np.int32),
        physical_offsets=_half_physical_offsets(halves)[commit_at],
    )
    ops = _op_columns(
        records.take(op_at),
        lines=lines[op_at],
        stamps=stamps[op_at],
        half_queue_offsets=halves.field("half_queue_offset").take(op_at).to_pylist(),
    )
    # each end's commit, then its op record, in line order
    kinds = np.r_[np.full(len(commit_at), MESSAGE_ROW, np.int8), np.full(len(op_at), OP_ROW, np.int8)]
    order = np.lexsort((kinds, np.r_[lines[commit_at], lines[op_at]]))
    table = pa.concat_tables([commits, ops]).take(order)
    has_parent = np.r_[~_from_lake(halves)[commit_at], np.zeros(len(op_at), bool)][order]
    parent_rows = np.r_[commit_at, np.zeros(len(op_at), np.int64)][order]
    parents = tuple(
        pa.array(halves.field(name).to_numpy(zero_copy_only=False)[parent_rows].astype(kind), mask=~has_parent)
        for name, kind in (("at", np.int64), ("rank", np.int32), ("line", np.int64))
    )
    narrow = appended_narrow_rows(
        table,
        split=split,
        file_rank=file_rank,
        first_batch=0,
        kinds=pa.array(kinds[order]),
        origin_timestamps=table.column("store_timestamp").combine_chunks(),
        parents=parents,
    )
    return EndRecords(table, narrow, refused, len(commit_at), len(op_at) - len(commit_at))


def _from_lake(halves: pa.StructArray) -> np.ndarray:
    return halves.field("source").to_numpy(zero_copy_only=False) == EVENT_SOURCE_LAKE


def _real_queues(records: pa.Table, *, from_lake: np.ndarray) -> tuple[list, list]:
    """Each half's REAL_TOPIC and REAL_QID (``None``: not an int), as the processor reads them: from the stored
    properties string. The parse built a batch half's map column from the same pairs; a half of the lake may come
    from anywhere, so its string is parsed."""
    properties = records.column("properties")
    topics = pc.map_lookup(properties, REAL_TOPIC, "last").to_pylist()
    queues = pc.map_lookup(properties, REAL_QID, "last").to_pylist()
    for row in np.flatnonzero(from_lake).tolist():
        named = parse_properties(records.column("properties_bytes")[row].as_py())
        topics[row], queues[row] = named.get(REAL_TOPIC), named.get(REAL_QID)
    return topics, [java_int(text) for text in queues]


def _half_records(halves: pa.StructArray, scratch_rows) -> pa.Table:
    """The scratch row of each end's half: read for the batch's halves, from ``lake_record`` for the lake's."""
    from_lake = _from_lake(halves)
    parts, positions = [], []
    batch_at = np.flatnonzero(~from_lake)
    if len(batch_at):
        where = [halves.field(name).take(batch_at).to_numpy() for name in ("half_split", "half_batch", "half_row")]
        parts.append(scratch_rows(*where).select(SCRATCH_COLUMNS).cast(_SCRATCH_SCHEMA))
        positions.append(batch_at)
    lake_at = np.flatnonzero(from_lake)
    if len(lake_at):
        lake = halves.field("lake_record").take(lake_at)
        rows = pa.Table.from_arrays(lake.flatten(), names=[field.name for field in lake.type])
        parts.append(scratch_rows_of_commitlog(rows).cast(_SCRATCH_SCHEMA))
        positions.append(lake_at)
    order = np.concatenate(positions)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return pa.concat_tables(parts).take(inverse)


def _half_physical_offsets(halves: pa.StructArray) -> np.ndarray:
    """The commitlog offset of each end's half: a lake half's own, 0 for the batch's (known when placed)."""
    from_lake = _from_lake(halves)
    offsets = np.zeros(len(halves), np.int64)
    lake_at = np.flatnonzero(from_lake)
    if len(lake_at):
        offsets[lake_at] = halves.field("lake_record").field("physical_offset").take(lake_at).to_numpy()
    return offsets


def _commit_columns(halves: pa.Table, *, lines, stamps, topics, queue_ids, physical_offsets) -> pa.Table:
    """``_commit_record`` of many halves (scratch rows) whose real topic and queue parse."""
    sys_flags = halves.column("sys_flag").to_numpy()
    flags = (sys_flags & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE
    magics = _magics(topics)
    topic_array = pa.array(topics, pa.string())
    round_robin = pc.fill_null(halves.column("real_queue_round_robin"), False).to_numpy(zero_copy_only=False)
    changed = {
        "source_line": pa.array(lines, pa.int64()),
        "topic": topic_array,
        "queue_id": pa.array(queue_ids, pa.int32(), mask=round_robin),
        "sys_flag": pa.array(flags, pa.int32()),
        "magic": pa.array(magics, pa.int32()),
        "store_timestamp": pa.array(stamps, pa.int64()),
        "prepared_transaction_offset": pa.array(physical_offsets, pa.int64()),
        "total_size": pa.array(
            record_sizes(
                body_lengths=_lengths(halves.column("body")),
                topic_lengths=_lengths(topic_array),
                properties_lengths=_lengths(halves.column("properties_bytes")),
                born_v6=(flags & BORNHOST_V6_FLAG) != 0,
                store_v6=(flags & STOREHOST_V6_FLAG) != 0,
                magics=magics,
            ),
            pa.int32(),
        ),
    }
    return pa.table({name: changed.get(name, halves.column(name)) for name in SCRATCH_COLUMNS}, schema=_SCRATCH_SCHEMA)


def _op_columns(halves: pa.Table, *, lines, stamps, half_queue_offsets) -> pa.Table:
    """``_op_record`` of many halves (scratch rows)."""
    count = halves.num_rows
    bodies = [f"{offset},".encode() for offset in half_queue_offsets]
    store_v6 = (halves.column("sys_flag").to_numpy() & STOREHOST_V6_FLAG) != 0
    magic = magic_for_topic(OP_TOPIC)
    on_half_topic = pc.fill_null(pc.equal(halves.column("topic"), HALF_TOPIC), False)
    store_hosts = halves.column("store_host")
    stamp_array = pa.array(stamps, pa.int64())
    zeros = np.zeros(count, np.int32)
    columns = {
        "source_line": pa.array(lines, pa.int64()),
        "topic": pa.array([OP_TOPIC] * count, pa.string()),
        "queue_id": pc.if_else(on_half_topic, halves.column("queue_id"), pa.scalar(0, pa.int32())),
        "flag": pa.array(zeros),
        "sys_flag": pa.array(np.where(store_v6, BORNHOST_V6_FLAG | STOREHOST_V6_FLAG, 0).astype(np.int32)),
        "magic": pa.array(np.full(count, magic, np.int32)),
        "born_timestamp": stamp_array,
        "born_host": store_hosts,
        "store_timestamp": stamp_array,
        "store_host": store_hosts,
        "store_host_prefix": halves.column("store_host_prefix"),
        "reconsume_times": pa.array(zeros),
        "prepared_transaction_offset": pa.array(np.zeros(count, np.int64)),
        "body": pa.array(bodies, pa.binary()),
        "body_crc": pa.array([body_crc(body) for body in bodies], pa.int32()),
        "properties": pa.array([_OP_PAIRS] * count, MESSAGE_TYPES["properties"]),
        "properties_bytes": pa.array([_OP_PROPERTIES] * count, pa.binary()),
        "keys": pa.array([[]] * count, MESSAGE_TYPES["keys"]),
        "tags": pa.array([REMOVE_TAG] * count, pa.string()),
        "uniq_key": pa.nulls(count, pa.string()),
        "total_size": pa.array(
            record_sizes(
                body_lengths=np.fromiter(map(len, bodies), np.int64, count),
                topic_lengths=np.full(count, len(OP_TOPIC)),
                properties_lengths=np.full(count, len(_OP_PROPERTIES)),
                born_v6=store_v6,
                store_v6=store_v6,
                magics=np.full(count, magic),
            ),
            pa.int32(),
        ),
        "real_queue_round_robin": pa.array(np.zeros(count, bool)),
    }
    return pa.table(columns, schema=_SCRATCH_SCHEMA)


def _magics(topics: list[str]) -> np.ndarray:
    by_topic = {topic: magic_for_topic(topic) for topic in set(topics)}
    return np.array([by_topic[topic] for topic in topics], np.int32)


def _lengths(values) -> np.ndarray:
    return pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.int64)


def _lake_scratch_row(lake_record: dict) -> dict:
    """A half of the lake (its commitlog columns, ``properties`` as pairs) as a scratch row."""
    types = {"physical_offset": pa.int64(), "queue_offset": pa.int64(), **MESSAGE_TYPES}
    rows = pa.table({name: pa.array([lake_record[name]], types[name]) for name in LAKE_HALF_COLUMNS})
    return scratch_rows_of_commitlog(rows).to_pylist()[0]


def _commit_record(half: dict, physical_offset: int, end: dict) -> dict:
    """The commit re-put of a half (a scratch row) at the end's time; ``queue_id`` null when the half's REAL_QID is
    the round-robin turn it takes at the append."""
    pairs = list(parse_properties(half["properties_bytes"]).items())
    stored = commit(pairs, half_sys_flag=half["sys_flag"], half_physical_offset=physical_offset)
    magic = magic_for_topic(stored.topic)
    flag = stored.sys_flag
    return {
        **half,
        "source_line": end["line"],
        "topic": stored.topic,
        "queue_id": None if half["real_queue_round_robin"] else stored.queue_id,
        "sys_flag": flag,
        "magic": magic,
        "store_timestamp": end["at"],
        "prepared_transaction_offset": physical_offset,
        "total_size": record_size(
            body_length=len(half["body"]),
            topic_length=len(stored.topic.encode("utf-8")),
            properties_length=len(half["properties_bytes"]),
            born_v6=bool(flag & BORNHOST_V6_FLAG),
            store_v6=bool(flag & STOREHOST_V6_FLAG),
            magic=magic,
        ),
    }


# every op record's properties: the same pairs in the same order (ordering them took a sixth of the ends' write)
_OP_PAIRS = op_properties()
_OP_PROPERTIES = serialize_properties(_OP_PAIRS)


def _op_record(half: dict, end: dict, *, half_queue_offset: int) -> dict:
    """The op record naming the half (a scratch row) by its queue offset: written by the broker, whose address is
    the half's store host, born and stored at the end's time."""
    body = f"{half_queue_offset},".encode()
    pairs, serialised = list(_OP_PAIRS), _OP_PROPERTIES
    store_v6 = bool(half["sys_flag"] & STOREHOST_V6_FLAG)
    flag = (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG) if store_v6 else 0
    magic = magic_for_topic(OP_TOPIC)
    return {
        "source_line": end["line"],
        "topic": OP_TOPIC,
        "queue_id": half["queue_id"] if half["topic"] == HALF_TOPIC else 0,
        "flag": 0,
        "sys_flag": flag,
        "magic": magic,
        "born_timestamp": end["at"],
        "born_host": half["store_host"],
        "store_timestamp": end["at"],
        "store_host": half["store_host"],
        "store_host_prefix": half["store_host_prefix"],
        "reconsume_times": 0,
        "prepared_transaction_offset": 0,
        "body": body,
        "body_crc": body_crc(body),
        "properties": pairs,
        "properties_bytes": serialised,
        "keys": [],
        "tags": REMOVE_TAG,
        "uniq_key": None,
        "total_size": record_size(
            body_length=len(body),
            topic_length=len(OP_TOPIC),
            properties_length=len(serialised),
            born_v6=store_v6,
            store_v6=store_v6,
            magic=magic,
        ),
        "real_queue_round_robin": False,
    }


def _narrow(table: pa.Table, *, split: int, file_rank: int, kinds: list[int], parents: list) -> pa.RecordBatch:
    has_parent = np.array([parent is not None for parent in parents], bool)
    stamps, ranks, lines = (np.array([p[i] if p else 0 for p in parents], np.int64) for i in range(3))
    return appended_narrow_rows(
        table,
        split=split,
        file_rank=file_rank,
        first_batch=0,
        kinds=pa.array(kinds, pa.int8()),
        origin_timestamps=table.column("store_timestamp").combine_chunks(),
        parents=(
            pa.array(stamps, pa.int64(), mask=~has_parent),
            pa.array(ranks.astype(np.int32), pa.int32(), mask=~has_parent),
            pa.array(lines, pa.int64(), mask=~has_parent),
        ),
    )
