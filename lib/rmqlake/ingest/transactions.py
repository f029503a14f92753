"""Transactional messages: the ends of halves, turned into the records a broker appends for them.

A half send is re-routed at parse time (``lines``: the half topic, queue 0). An ``endTransaction`` line names
its half by UNIQ_KEY; what it stores depends on that half, which may be in this batch or in the lake:

* a parse task writes, per split, its end lines (``END_LINES``) and its halves (``HALVES``) to small files;
* ``resolve_ends`` (Spark, on executors) gathers per UNIQ_KEY the lake's halves (those an op record already
  ended marked), the batch's halves and the batch's ends in append order, and decides each end in turn: the
  latest half before it, unless there is none or it was ended already, or the broker refuses the end
  (``formats.transaction.end_refusal``); then, per split of end lines, it writes the records as an extra
  split: for a COMMIT the re-put on the real topic (``formats.transaction.commit``) and the op record, for a
  ROLLBACK the op record alone; refused ends go to the ``rejected`` staging folder.

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
from rmqlake.formats.record import BORNHOST_V6_FLAG, STOREHOST_V6_FLAG, magic_for_topic, record_size
from rmqlake.formats.transaction import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    HALF_TOPIC,
    OP_TOPIC,
    PGROUP,
    REAL_TOPIC,
    REMOVE_TAG,
    EndRefused,
    commit,
    end_refusal,
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
        reason = None
        if latest is None:
            reason = f"no half message with UNIQ_KEY {event['uniq_key']!r} was stored before this end"
        elif latest.ended:
            reason = f"the half message with UNIQ_KEY {event['uniq_key']!r} was already ended"
        else:
            half_event = latest.event
            pairs = [(PGROUP, half_event["half_group"])] if half_event["half_group"] is not None else []
            if half_event["check_immunity"] is not None:
                pairs.append((CHECK_IMMUNITY_TIME_IN_SECONDS, half_event["check_immunity"]))
            reason = end_refusal(
                pairs,
                born_timestamp=half_event["born_timestamp"],
                now_ms=event["at"],
                producer_group=event["producer_group"],
                from_transaction_check=bool(event["from_check"]),
                transaction_timeout_ms=transaction_timeout_ms,
            )
            if reason is not None:
                reason = f"the broker refuses this end: {reason}"
            elif event["topic"] is not None and event["topic"] != half_event["real_topic"]:
                real = half_event["real_topic"]
                reason = f"the end names topic {event['topic']!r}; the half's real topic is {real!r}"
        decided = {**event, "reason": reason, "half": None if reason else latest.event}
        if reason is None:
            latest.ended = True
        yield decided


# -- the records of the ends (executors, one split of end lines per task) -------------------


@dataclass
class EndRecords:
    """What one split's ends store: scratch rows and narrow rows (``None``: nothing), and the refused ends."""

    scratch: pa.Table | None
    narrow: pa.RecordBatch | None
    refused: list[dict]
    commits: int
    rollbacks: int


# what ``end_records`` reads of a decided end, and of the half it ends (the lake's halves have ``lake_record``, the
# batch's the ``half_*`` columns)
DECIDED_END_COLUMNS = ("split", "line", "raw", "end", "at")
DECIDED_HALF_COLUMNS = ("source", "at", "rank", "line", "half_queue_offset", "half_split", "half_batch", "half_row",
                        "lake_record")  # fmt: skip


def batch_halves_of(decided) -> Iterator[tuple[int, int, int]]:
    """The scratch positions ``(split, batch, row)`` of the batch's halves that ``decided`` ends end: what
    ``end_records`` reads with its ``scratch_row``."""
    for end in decided:
        half = end["half"]
        if end["reason"] is None and half["source"] != EVENT_SOURCE_LAKE:
            yield half["half_split"], half["half_batch"], half["half_row"]


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
