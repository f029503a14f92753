"""The broker's lookups over the lake: by key, queue offset, message id, time and time range, and whether
the consumer groups consumed a message.

Lookups read little: the index by slot (files are sorted by slot, so
Parquet statistics skip most row groups), then only the commitlog segments
holding the offsets found. They use pyarrow directly (no Spark), so a query
answers in well under a second.
"""

from __future__ import annotations

import base64
import functools
import logging
import time
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds

from rmqlake.errors import UsageError
from rmqlake.formats.consumequeue import files_for_time_search, store_offset_by_time, tags_code
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.indexfile import (
    MAX_QUERY_RESULTS,
    IndexEntry,
    IndexHeader,
    is_time_matched,
    select_phy_offsets,
)
from rmqlake.formats.javahash import index_key, index_key_hash
from rmqlake.formats.msgid import decode_offset_msg_id, offset_msg_id_prefix, offset_msg_id_with_prefix
from rmqlake.formats.properties import parse_properties, property_columns, split_keys
from rmqlake.formats.segment import segment_file_name, segment_start
from rmqlake.lake import Lake, lookup
from rmqlake.lake.lake import holds_any
from rmqlake.lake.state import QueueId
from rmqlake.lake.tables import COMMITLOG
from rmqlake.timeutil import epoch_ms, iso

log = logging.getLogger(__name__)

LONG_MAX = 2**63 - 1
MAX_FILTER_MESSAGE_SIZE = 16000  # maxFilterMessageSize: bytes of CQ a pull scans at least
DEFAULT_PULL_BATCH = 32
RANGE_MAX = 2000  # the dashboard's cap on a query by topic and time range
# mqadmin's TrackType values that a lake can tell apart (DefaultMQAdminExtImpl.messageTrackDetail)
CONSUMED, NOT_CONSUME_YET = "CONSUMED", "NOT_CONSUME_YET"
# What a query shows of a message, in this order (the rows' key order in the output).
MESSAGE_VIEW_COLUMNS = COMMITLOG.schema.select(
    [
        "physical_offset",
        "total_size",
        "topic",
        "queue_id",
        "queue_offset",
        "sys_flag",
        "store_timestamp",
        "born_timestamp",
        "born_host",
        "store_host",
        "keys",
        "tags",
        "uniq_key",
        "msg_id",
        "body",
        "properties",
        "reconsume_times",
        "flag",
        "body_crc",
        "magic",
    ]
).names


# What a lookup reads, the reference route aside: the view's record fields and the stored properties bytes.
# It derives ``properties``, ``keys``, ``tags``, ``uniq_key`` and ``msg_id`` from them as a client decodes a
# record (``MessageDecoder``) instead of reading them: every writer derives those columns by the same rules, and
# the reference route reads them as stored. Nested columns decode per value and per level, and every column
# costs per page: a key's hits lie on ~64 pages a column.
DERIVED_VIEW_COLUMNS = ("properties", "keys", "tags", "uniq_key", "msg_id")
RECORD_VIEW_COLUMNS = [c for c in MESSAGE_VIEW_COLUMNS if c not in DERIVED_VIEW_COLUMNS] + ["properties_bytes"]


@functools.lru_cache(maxsize=1024)
def _msg_id_prefix(store_host: str) -> str:
    return offset_msg_id_prefix(parse_host(store_host))


def view_from_record(row: dict) -> dict:
    """A message as the view shows it, from a row of ``RECORD_VIEW_COLUMNS``.

    Raises:
        ValueError: properties bytes that are not UTF-8, or a store host that is no address: bytes no writer
            of rmqlake stores.
    """
    derived = property_columns(parse_properties(row["properties_bytes"] or b""))
    derived["msg_id"] = offset_msg_id_with_prefix(_msg_id_prefix(row["store_host"]), row["physical_offset"])
    return {name: derived[name] if name in derived else row[name] for name in MESSAGE_VIEW_COLUMNS}


def read_messages(lake: Lake, offsets: Iterable[int], *, segment_size: int, cached: bool = True) -> dict[int, dict]:
    """Commitlog rows starting at ``offsets``, reading only the segments they fall in.

    Offsets whose segment is gone (expired) or that are not a record start are absent from the result.
    ``cached``: from the file lists and footers a warm process keeps (``rmqlake.lake.lookup``), the record's
    fields decoded as a client does (``view_from_record``); else everything is read again from the Delta log and the
    footers, and the derived columns as stored (the reference route).
    """
    wanted = sorted(set(offsets))
    if not wanted:
        return {}
    segments = {segment_file_name(segment_start(o, segment_size)) for o in wanted}
    if cached:
        table = lookup.read_rows(
            lake,
            "commitlog",
            column="physical_offset",
            values=wanted,
            columns=RECORD_VIEW_COLUMNS,
            partitions=lambda values: str(values.get("segment")) in segments,
        )
        try:
            return {row["physical_offset"]: view_from_record(row) for row in table.to_pylist()}
        except ValueError as exc:  # no writer of rmqlake stores such bytes; another may have
            log.warning("a commitlog record cannot be decoded (%s): reading the stored columns instead", exc)
    files = [
        stats["path"]
        for stats in lake.file_stats("commitlog", ["physical_offset"])
        if str(stats["partition"].get("segment")) in segments
        and holds_any(wanted, stats["min"]["physical_offset"], stats["max"]["physical_offset"])
    ]
    table = lake.lookup("commitlog", column="physical_offset", values=wanted, columns=MESSAGE_VIEW_COLUMNS, files=files)
    return {row["physical_offset"]: row for row in table.to_pylist()}


ENTRY_COLUMNS = ("index_no", "key_hash", "phy_offset", "time_diff", "prev_index")


class SlotEntries(Mapping):
    """The entries of one slot of one index file, entry number → entry, read lazily from columns.

    A hot key's slot can hold hundreds of thousands of entries while a
    lookup walks at most ~64 of them: the columns stay Arrow/NumPy arrays
    sorted by entry number, and an entry becomes an ``IndexEntry`` only when
    the chain walk reaches it.
    """

    def __init__(self, table):
        table = table.sort_by("index_no")
        self._numbers = table.column("index_no").to_numpy()
        self._columns = [table.column(c).to_numpy() for c in ENTRY_COLUMNS[1:]]

    @property
    def newest(self) -> int:
        """The slot's value: the newest entry number of the chain (0 for an empty slot)."""
        return int(self._numbers[-1]) if len(self._numbers) else 0

    def __getitem__(self, number: int) -> IndexEntry:
        position = int(np.searchsorted(self._numbers, number))
        if position >= len(self._numbers) or self._numbers[position] != number:
            raise KeyError(number)
        return IndexEntry(*(int(column[position]) for column in self._columns))

    def __iter__(self):
        return (int(n) for n in self._numbers)

    def __len__(self) -> int:
        return len(self._numbers)


class IndexReader:
    """Index files of the lake, read one slot at a time (and cached for the query).

    ``cached``: headers and slots read through the file lists and footers a warm process keeps
    (``rmqlake.lake.lookup``); else with a dataset scan each time (the reference route).
    """

    def __init__(self, lake: Lake, *, slots: int, cached: bool = True):
        self.lake = lake
        self.slots = slots
        self.cached = cached
        if cached and lake.exists("indexfile_header"):
            rows = lookup.snapshot_value(
                lake, "indexfile_header", "rows", lambda: lake.read_arrow("indexfile_header").to_pylist()
            )
        else:
            rows = lake.read_arrow("indexfile_header").to_pylist()
        self.files = sorted(rows, key=lambda h: h["index_file"])
        self._slot_cache: dict[tuple[str, int], SlotEntries] = {}
        self._used: set[tuple[str, int]] = set()
        self.files_read = 0

    def slot_entries(self, file: str, slot: int) -> SlotEntries:
        cache_key = (file, slot)
        if cache_key not in self._used:
            self._used.add(cache_key)
            self.files_read += 1
        if cache_key not in self._slot_cache:
            if self.cached:
                table = lookup.read_rows(
                    self.lake,
                    "indexfile",
                    column="slot",
                    values=[slot],
                    columns=list(ENTRY_COLUMNS),
                    partitions=lambda values: str(values.get("index_file")) == file,
                )
                self._slot_cache[cache_key] = SlotEntries(table)
            else:
                self._scan_slot(slot)
        return self._slot_cache[cache_key]

    def _scan_slot(self, slot: int) -> None:
        """The reference route: one dataset scan for the slot across every index file, split by file (a scan
        per file lists the table's files each time: ~30 listings for one key); a file without entries in the
        slot gets none."""
        table = self.lake.scan("indexfile", columns=["index_file", *ENTRY_COLUMNS], filter=ds.field("slot") == slot)
        for header in self.files:
            name = header["index_file"]
            self._slot_cache[(name, slot)] = SlotEntries(table.filter(pc.equal(table.column("index_file"), name)))

    def query_offsets(self, key: str, *, max_num: int, begin: int, end: int) -> list[int]:
        """``IndexService.queryOffset``: newest file first; stop once a file begins before ``begin``."""
        max_num = min(max_num, MAX_QUERY_RESULTS)
        slot = index_key_hash(key) % self.slots
        results: list[int] = []
        for row in reversed(self.files):
            header = IndexHeader(
                row["begin_timestamp"],
                row["end_timestamp"],
                row["begin_phy_offset"],
                row["end_phy_offset"],
                row["hash_slot_count"],
                row["index_count"],
            )
            if is_time_matched(begin, end, header):
                entries = self.slot_entries(row["index_file"], slot)
                select_phy_offsets(
                    results,
                    key=key,
                    slot_value=entries.newest,
                    entries=entries,
                    header=header,
                    max_num=max_num,
                    begin=begin,
                    end=end,
                )
            if header.begin_timestamp < begin or len(results) >= max_num:
                break
        return results


def _lookup(
    lake: Lake,
    reader: IndexReader,
    *,
    index_text: str,
    begin: int,
    end: int,
    max_num: int,
    segment_size: int,
) -> tuple[list[dict], int]:
    """``DefaultMessageStore.queryMessage``: up to 3 rounds of index query + message reads."""
    found: list[dict] = []
    hits = 0
    last_query_time = end
    for _ in range(3):
        offsets = reader.query_offsets(index_text, max_num=max_num, begin=begin, end=last_query_time)
        if not offsets:
            break
        hits = len(offsets)
        offsets.sort()
        messages = read_messages(lake, offsets, segment_size=segment_size, cached=reader.cached)
        if offsets[0] in messages:
            last_query_time = messages[offsets[0]]["store_timestamp"]
        found = [messages[o] for o in offsets if o in messages]
        if found or last_query_time < begin:
            break
    return found, hits


def query_key(
    lake: Lake,
    *,
    topic: str,
    key: str,
    begin: int = 0,
    end: int = LONG_MAX,
    max_num: int = MAX_QUERY_RESULTS,
    slots: int,
    segment_size: int,
    cached: bool = True,
) -> dict:
    """Messages of ``topic`` whose KEYS contain ``key`` (``rmqlake query key``).

    Index lookup exactly as the broker does it (at most 64 offsets; store
    times compared at second precision), then the real topic and key are
    re-checked on each message, as the client does, so hash collisions never
    return another key's message. ``cached=False`` reads every file list and
    footer again (the reference route; same answer).

    Returns:
        ``{"rows": [...], "metrics": {index_hits, returned, collisions_removed, index_reads, seconds}}``
    """
    started = time.monotonic()
    reader = IndexReader(lake, slots=slots, cached=cached)
    found, hits = _lookup(
        lake, reader, index_text=index_key(topic, key), begin=begin, end=end, max_num=max_num, segment_size=segment_size
    )
    rows = [m for m in found if m["topic"] == topic and key in split_keys(" ".join(m["keys"] or []))]
    return {
        "rows": rows,
        "metrics": {
            "index_hits": hits,
            "returned": len(rows),
            "collisions_removed": len(found) - len(rows),
            "index_reads": reader.files_read,
            "seconds": round(time.monotonic() - started, 4),
        },
    }


def query_msgid(
    lake: Lake, *, msg_id: str, topic: str | None = None, slots: int, segment_size: int, topics: Iterable[str] = ()
) -> dict:
    """A message by offsetMsgId (store host + physical offset), else by UNIQ_KEY through the index.

    A UNIQ_KEY has the same length as an IPv4 offsetMsgId, so the id is first
    tried as an offsetMsgId and kept only if a message starts at that offset
    with that store host (as the admin tools do).
    """
    started = time.monotonic()
    try:
        host, offset = decode_offset_msg_id(msg_id)
    except ValueError:
        host, offset = None, None
    if host is not None and offset is not None and offset >= 0:
        message = read_messages(lake, [offset], segment_size=segment_size).get(offset)
        if message is not None and message["msg_id"] == msg_id.upper():
            return {
                "rows": [message],
                "metrics": {"found_by": "offsetMsgId", "seconds": round(time.monotonic() - started, 4)},
            }
    reader = IndexReader(lake, slots=slots)
    rows = []
    for name in [topic] if topic else sorted(set(topics)):
        found, _ = _lookup(
            lake,
            reader,
            index_text=index_key(name, msg_id),
            begin=0,
            end=LONG_MAX,
            max_num=MAX_QUERY_RESULTS,
            segment_size=segment_size,
        )
        rows += [m for m in found if m["topic"] == name and m["uniq_key"] == msg_id]
    return {
        "rows": rows,
        "metrics": {
            "found_by": "UNIQ_KEY" if rows else None,
            "returned": len(rows),
            "seconds": round(time.monotonic() - started, 4),
        },
    }


def queue_units(lake: Lake, *, topic: str, queue: int, columns: list[str], filter=None):
    return lake.scan(
        "consumequeue",
        columns=columns,
        partitions=[("topic", "=", topic), ("queue_id", "=", queue)],
        filter=filter,
    ).sort_by("queue_offset")


def queue_bounds(
    lake: Lake, *, topic: str, queue: int, min_offsets: Mapping[QueueId, int] | None = None
) -> tuple[int, int]:
    """(min offset, max offset) of a queue: max is one past the last unit; min as corrected after expiry."""
    offsets = queue_units(lake, topic=topic, queue=queue, columns=["queue_offset"]).column("queue_offset")
    if len(offsets) == 0:
        return 0, 0
    maximum = pc.max(offsets).as_py() + 1
    minimum = (min_offsets or {}).get(QueueId(topic, queue), pc.min(offsets).as_py())
    return minimum, maximum


def parse_tag_expression(expression: str | None) -> set[str] | None:
    """``TagA || TagB`` → {"TagA", "TagB"}; ``*`` or empty → None (everything)."""
    if expression is None or expression.strip() in ("", "*"):
        return None
    tags = {part.strip() for part in expression.split("||") if part.strip()}
    if not tags:
        raise UsageError(f"--tags {expression!r}: expected '*' or 'TagA || TagB'")
    return tags


def query_offset(
    lake: Lake,
    *,
    topic: str,
    queue: int,
    offset: int,
    max_num: int = DEFAULT_PULL_BATCH,
    tags: str | None = "*",
    segment_size: int,
    min_offsets: Mapping[QueueId, int] | None = None,
) -> dict:
    """Messages from a queue offset (``DefaultMessageStore.getMessage`` + the client's tag check).

    Tags are filtered first by tagsCode (the broker's step, hash collisions
    pass), then by the real TAGS string (the client's step). Status and
    ``next_begin_offset`` follow the broker: NO_MESSAGE_IN_QUEUE,
    OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE, OFFSET_OVERFLOW_BADLY,
    NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING or FOUND.
    """
    started = time.monotonic()
    minimum, maximum = queue_bounds(lake, topic=topic, queue=queue, min_offsets=min_offsets)
    status, next_begin = None, offset
    if maximum == 0:
        status, next_begin = "NO_MESSAGE_IN_QUEUE", 0
    elif offset < minimum:
        status, next_begin = "OFFSET_TOO_SMALL", minimum
    elif offset == maximum:
        status = "OFFSET_OVERFLOW_ONE"
    elif offset > maximum:
        status, next_begin = "OFFSET_OVERFLOW_BADLY", maximum
    if status:
        return {
            "status": status,
            "rows": [],
            "next_begin_offset": next_begin,
            "min_offset": minimum,
            "max_offset": maximum,
            "metrics": {"seconds": round(time.monotonic() - started, 4)},
        }
    wanted = parse_tag_expression(tags)
    codes = {tags_code(t) for t in wanted} if wanted is not None else None
    scan_units = max(MAX_FILTER_MESSAGE_SIZE, max_num * 20) // 20
    units = queue_units(
        lake,
        topic=topic,
        queue=queue,
        columns=["queue_offset", "commitlog_offset", "size", "tags_code"],
        filter=(ds.field("queue_offset") >= offset) & (ds.field("queue_offset") < offset + scan_units),
    ).to_pylist()
    selected = []
    status = "NO_MATCHED_MESSAGE"
    for unit in units:
        if len(selected) >= max_num:
            break
        next_begin = unit["queue_offset"] + 1
        if codes is not None and unit["tags_code"] not in codes:
            continue
        selected.append(unit)
    messages = read_messages(lake, [u["commitlog_offset"] for u in selected], segment_size=segment_size)
    rows, filtered_by_tag = [], 0
    for unit in selected:
        message = messages.get(unit["commitlog_offset"])
        if message is None:
            if not rows:
                status = "MESSAGE_WAS_REMOVING"
            continue
        if wanted is not None and message["tags"] not in wanted:
            filtered_by_tag += 1  # same tagsCode, other tag: the client drops it
            continue
        rows.append(message)
        status = "FOUND"
    return {
        "status": status,
        "rows": rows,
        "next_begin_offset": next_begin,
        "min_offset": minimum,
        "max_offset": maximum,
        "metrics": {
            "scanned_units": len(units),
            "tag_collisions_removed": filtered_by_tag,
            "seconds": round(time.monotonic() - started, 4),
        },
    }


def query_compacted_offset(
    lake: Lake, *, topic: str, queue: int, offset: int, max_num: int = DEFAULT_PULL_BATCH, tags: str | None = "*"
) -> dict:
    """Messages of a compacted queue from ``offset`` (``CompactionLog.getMessage`` + the client's tag check).

    The compacted queue keeps original queue offsets and has gaps; reading
    from an offset in a gap starts at the next kept one
    (``iterateFromOrNext``). As in the broker there is no OFFSET_TOO_SMALL
    here and no tagsCode filter; the client still drops other tags.
    """
    started = time.monotonic()
    partition = [("topic", "=", topic), ("queue_id", "=", queue)]
    offsets = lake.scan("compaction_cq", columns=["queue_offset"], partitions=partition).column("queue_offset")
    minimum = pc.min(offsets).as_py() if len(offsets) else 0
    maximum = pc.max(offsets).as_py() + 1 if len(offsets) else 0
    status, next_begin, rows = None, offset, []
    if maximum == 0:
        status, next_begin = "NO_MESSAGE_IN_QUEUE", 0
    elif offset == maximum:
        status = "OFFSET_OVERFLOW_ONE"
    elif offset > maximum:
        status, next_begin = "OFFSET_OVERFLOW_BADLY", minimum if minimum == 0 else maximum
    else:
        units = (
            lake.scan(
                "compaction_cq",
                columns=["queue_offset", "commitlog_offset"],
                partitions=partition,
                filter=ds.field("queue_offset") >= offset,
            )
            .sort_by("queue_offset")
            .slice(0, max_num)
            .to_pylist()
        )
        wanted = parse_tag_expression(tags)
        found = lake.scan(
            "compaction_log",
            columns=MESSAGE_VIEW_COLUMNS,
            partitions=partition,
            filter=ds.field("physical_offset").isin([u["commitlog_offset"] for u in units]),
        ).to_pylist()
        by_offset = {m["physical_offset"]: m for m in found}
        status = "NO_MATCHED_MESSAGE"
        for unit in units:
            next_begin = unit["queue_offset"] + 1
            message = by_offset.get(unit["commitlog_offset"])
            if message is None:
                status = "MESSAGE_WAS_REMOVING" if not rows else status
                continue
            status = "FOUND"
            if wanted is None or message["tags"] in wanted:
                rows.append(message)
    return {
        "status": status,
        "rows": rows,
        "next_begin_offset": next_begin,
        "min_offset": minimum,
        "max_offset": maximum,
        "compacted": True,
        "metrics": {"seconds": round(time.monotonic() - started, 4)},
    }


def time_search_files(
    lake: Lake,
    *,
    topic: str,
    queue: int,
    units_per_file: int,
    min_phy_offset: int = 0,
    min_offsets: Mapping[QueueId, int] | None = None,
) -> tuple[list[dict], list, int]:
    """A queue's units, its CQ files as ``getOffsetInQueueByTime`` searches them, and its min offset.

    A unit whose message expiry deleted (before ``min_phy_offset``) has an
    unreadable store time (-1), as in the broker.
    """
    units = queue_units(
        lake, topic=topic, queue=queue, columns=["queue_offset", "commitlog_offset", "store_timestamp"]
    ).to_pylist()
    ordered = files_for_time_search(
        (
            (
                u["queue_offset"],
                u["commitlog_offset"],
                u["store_timestamp"] if u["commitlog_offset"] >= min_phy_offset else -1,
            )
            for u in units
        ),
        units_per_file=units_per_file,
    )
    minimum = (min_offsets or {}).get(QueueId(topic, queue), units[0]["queue_offset"] if units else 0)
    return units, ordered, minimum


def query_time(
    lake: Lake,
    *,
    topic: str,
    queue: int,
    at: int,
    boundary: str = "lower",
    units_per_file: int,
    min_phy_offset: int = 0,
    min_offsets: Mapping[QueueId, int] | None = None,
) -> dict:
    """Queue offset of the first message stored at or after ``at`` (``getOffsetInQueueByTime``)."""
    _, ordered, minimum = time_search_files(
        lake,
        topic=topic,
        queue=queue,
        units_per_file=units_per_file,
        min_phy_offset=min_phy_offset,
        min_offsets=min_offsets,
    )
    offset = store_offset_by_time(
        ordered, timestamp=at, boundary=boundary, min_logic_offset=minimum, min_phy_offset=min_phy_offset
    )
    return {"topic": topic, "queue_id": queue, "at": at, "boundary": boundary, "queue_offset": offset}


def topic_queues(lake: Lake, topic: str) -> list[int]:
    """The queue ids of ``topic`` that have consume queue files (from the Delta log, no data read)."""
    return sorted(
        {
            int(stats["partition"]["queue_id"])
            for stats in lake.file_stats("consumequeue", ["queue_offset"])
            if stats["partition"]["topic"] == topic
        }
    )


def query_range(
    lake: Lake,
    *,
    topic: str,
    queue: int | None = None,
    begin: int,
    end: int,
    max_num: int = RANGE_MAX,
    units_per_file: int,
    segment_size: int,
    min_phy_offset: int = 0,
    min_offsets: Mapping[QueueId, int] | None = None,
) -> dict:
    """Messages of ``topic`` (one queue, or each of its queues) stored from ``begin`` until ``end``.

    As mqadmin ``printMsg`` does it per queue: the offsets from
    ``searchOffset(begin)`` up to, not including, ``searchOffset(end)``, both
    ``getOffsetInQueueByTime`` with the lower boundary. So ``begin`` is
    inclusive and ``end`` exclusive: a message stored exactly at ``end`` is not
    listed. Only the queue's consume queue units and the commitlog segments of
    the offsets found are read. Rows come per queue, in queue-offset order;
    at most ``max_num`` (``truncated`` says when more were in range).
    """
    started = time.monotonic()
    if end < begin:
        raise UsageError(f"--end ({iso(end)}) is before --begin ({iso(begin)})")
    queues = [queue] if queue is not None else topic_queues(lake, topic)
    selected, windows = [], {}
    for queue_id in queues:
        units, ordered, minimum = time_search_files(
            lake,
            topic=topic,
            queue=queue_id,
            units_per_file=units_per_file,
            min_phy_offset=min_phy_offset,
            min_offsets=min_offsets,
        )
        if not units:
            windows[queue_id] = (0, 0)
            continue
        low, high = (
            store_offset_by_time(
                ordered, timestamp=at, boundary="lower", min_logic_offset=minimum, min_phy_offset=min_phy_offset
            )
            for at in (begin, end)
        )
        windows[queue_id] = (low, high)
        selected += [u for u in units if low <= u["queue_offset"] < high]
    truncated = len(selected) > max_num
    selected = selected[:max_num]
    messages = read_messages(lake, [u["commitlog_offset"] for u in selected], segment_size=segment_size)
    rows = [messages[u["commitlog_offset"]] for u in selected if u["commitlog_offset"] in messages]
    return {
        "topic": topic,
        "begin": iso(begin),
        "end": iso(end),
        "rows": rows,
        "metrics": {
            "queues": len(queues),
            "in_range": sum(high - low for low, high in windows.values()),
            "returned": len(rows),
            "truncated": truncated,
            "seconds": round(time.monotonic() - started, 4),
        },
    }


def latest_offsets(lake: Lake, *, topics: Iterable[str]) -> dict[tuple[str, str], tuple[int, dict[int, int]]]:
    """Per (group, topic) of ``topics``: its latest snapshot time and committed offset per queue then."""
    wanted = set(topics)
    rows = [r for r in lake.read_arrow("consumer_offsets").to_pylist() if r["topic"] in wanted]
    latest: dict[tuple[str, str], tuple[int, dict[int, int]]] = {}
    for row in sorted(rows, key=lambda r: epoch_ms(r["as_of"])):
        moment = epoch_ms(row["as_of"])
        key = (row["group"], row["topic"])
        if key not in latest or latest[key][0] < moment:
            latest[key] = (moment, {})
        latest[key][1][row["queue_id"]] = row["offset"]
    return latest


def message_tracks(lake: Lake, messages: Iterable[Mapping]) -> list[dict]:
    """Whether each consumer group with offsets in the lake consumed each message, as mqadmin tells it.

    ``DefaultMQAdminExtImpl.messageTrackDetail``/``consumed``: CONSUMED when
    the group's committed offset in the message's queue is greater than the
    message's queue offset, else NOT_CONSUME_YET (also when the group has no
    offset for that queue). The groups are those with committed offsets for
    the message's topic in ``consumer_offsets`` (the broker asks
    ``queryTopicConsumeByWho``), each at its latest snapshot. Not modelled,
    for a lake knows no online consumers: PULL, NOT_ONLINE,
    CONSUME_BROADCASTING, CONSUMED_BUT_FILTERED (that needs the online
    consumer's subscription) and the store-host check (a lake is one broker).
    """
    messages = list(messages)
    offsets = latest_offsets(lake, topics={m["topic"] for m in messages})
    tracks = []
    for message in messages:
        for (group, topic), (moment, queues) in sorted(offsets.items()):
            if topic != message["topic"]:
                continue
            committed = queues.get(message["queue_id"])
            consumed = committed is not None and committed > message["queue_offset"]
            tracks.append(
                {
                    "msg_id": message["msg_id"],
                    "group": group,
                    "topic": topic,
                    "queue_id": message["queue_id"],
                    "queue_offset": message["queue_offset"],
                    "consumer_offset": committed,
                    "as_of": iso(moment),
                    "track_type": CONSUMED if consumed else NOT_CONSUME_YET,
                }
            )
    return tracks


def store_times(
    lake: Lake, wanted: Mapping[tuple[str, int], Iterable[int]], *, min_phy_offset: int = 0
) -> dict[tuple[str, int, int], int]:
    """Store time of the message at each wanted (topic, queue) offset, as ``getMessageStoreTimeStamp``.

    Read from the consume queue, one queue's partition at a time; an offset
    with no unit, or whose message expiry deleted (before ``min_phy_offset``),
    has no time (the broker answers -1 there).
    """
    found = {}
    for (topic, queue), offsets in sorted(wanted.items()):
        offsets = sorted({o for o in offsets if o >= 0})
        if not offsets:
            continue
        units = queue_units(
            lake,
            topic=topic,
            queue=queue,
            columns=["queue_offset", "commitlog_offset", "store_timestamp"],
            filter=ds.field("queue_offset").isin(offsets),
        ).to_pylist()
        for unit in units:
            if unit["commitlog_offset"] >= min_phy_offset:
                found[(topic, queue, unit["queue_offset"])] = unit["store_timestamp"]
    return found


def message_view(message: dict, *, full: bool) -> dict:
    """A message as printed: body as text when it is UTF-8, else base64; properties and bytes only in full."""
    body = message["body"] or b""
    try:
        text, encoding = body.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    view = {
        "physical_offset": message["physical_offset"],
        "topic": message["topic"],
        "queue_id": message["queue_id"],
        "queue_offset": message["queue_offset"],
        "store_time": iso(message["store_timestamp"]),
        "keys": " ".join(message["keys"] or []),
        "tags": message["tags"],
        "msg_id": message["msg_id"],
        "uniq_key": message["uniq_key"],
        "size": message["total_size"],
        "body": text if full or len(text) <= 60 else text[:57] + "...",
    }
    if full:
        view.update(
            store_timestamp=message["store_timestamp"],
            body_encoding=encoding,
            properties=dict(message["properties"] or []),
            born_host=message["born_host"],
            store_host=message["store_host"],
            born_timestamp=message["born_timestamp"],
            sys_flag=message["sys_flag"],
            reconsume_times=message["reconsume_times"],
            flag=message["flag"],
            body_crc=message["body_crc"],
        )
    return view
