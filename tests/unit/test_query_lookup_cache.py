"""Key lookups through the file lists and footers a warm process keeps give the reference route's answers,
also after runs add, expire or rewrite files under that process (no Spark: files written with pyarrow).

Every test runs twice: with commitlog files written as the commitlog's writers do (read by pages) and with
pyarrow's defaults (read by row groups)."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmqlake import query as Q
from rmqlake.formats.hosts import parse_host
from rmqlake.formats.msgid import offset_msg_id
from rmqlake.formats.properties import serialize_properties
from rmqlake.formats.segment import segment_file_name, segment_start
from rmqlake.ingest.tasks import COMMITLOG_WRITE_OPTIONS
from rmqlake.lake import Lake
from rmqlake.lake import lookup as L
from rmqlake.lake.tables import COMMITLOG, INDEXFILE
from tests.reference import RefIndexFile

SLOTS, ENTRIES, SEGMENT = 4, 400, 4096
T0 = 1_795_219_200_000
SIZE = 100  # every record 100 bytes: offsets 0, 100, 200, ...
# the commitlog's write options with pages of 2 rows in row groups of 5: several pages a group, a short last one
PAGED = {**COMMITLOG_WRITE_OPTIONS, "max_rows_per_page": 2}
ROUTE = {"paged": True}


@pytest.fixture(autouse=True, params=["pages", "row groups"])
def commitlog_layout(request):
    ROUTE["paged"] = request.param == "pages"


def message(offset: int, topic: str, keys: list[str]) -> dict:
    body = f"body-{offset}-é".encode() * (offset % 3)  # empty, multi-byte, longer
    # as every writer stores them: the map's pairs and the bytes they serialize to (no empty value, as the
    # broker's parser drops those)
    pairs = [("KEYS", " ".join(keys))] if keys else []
    pairs += [("UNIQ_KEY", f"U{offset:08d}"), ("TAGS", f"tag-{offset % 2}-ü")] if offset % 5 else []
    store_host = "[2001:db8::5]:10911" if offset % 3 else "10.0.0.5:10911"
    return {c: None for c in COMMITLOG.columns} | {
        "physical_offset": offset,
        "total_size": SIZE,
        "topic": topic,
        "queue_id": 0,
        "queue_offset": offset // SIZE,
        "sys_flag": 0,
        "store_timestamp": T0 + offset * 10,
        "born_timestamp": T0 + offset * 10,
        "keys": keys,
        "body": body,
        "properties": pairs,
        "properties_bytes": serialize_properties(pairs),
        "uniq_key": f"U{offset:08d}" if offset % 5 else None,
        "tags": f"tag-{offset % 2}-ü" if offset % 5 else None,
        "store_host": store_host,
        "msg_id": offset_msg_id(parse_host(store_host), offset),
    }


def write(run, table: str, partition: str, value: str, rows: list[dict], name: str) -> None:
    spec = {"commitlog": COMMITLOG, "indexfile": INDEXFILE}[table]
    schema = spec.arrow_schema
    schema = schema.remove(schema.get_field_index(partition))
    data = pa.Table.from_pylist([{k: v for k, v in r.items() if k != partition} for r in rows], schema=schema)
    path = f"{run.staging_dir(table)}/{partition}={value}/{name}.parquet"
    run.lake.storage.fs.create_dir(run.lake.storage.file_path(path).rsplit("/", 1)[0], recursive=True)
    target = run.lake.storage.file_path(path)
    if table == "commitlog" and ROUTE["paged"]:
        pq.write_table(data, target, filesystem=run.lake.storage.fs, row_group_size=5, **PAGED)
    else:
        pq.write_table(data, target, filesystem=run.lake.storage.fs, row_group_size=3)


def commit(root, messages: list[dict], *, name: str, removes=()) -> None:
    """One run: ``messages`` as commitlog files per segment, their index file, its header; ``removes`` expired."""
    run = Lake(str(root)).begin("test")
    by_segment: dict[str, list[dict]] = {}
    for m in messages:
        by_segment.setdefault(segment_file_name(segment_start(m["physical_offset"], SEGMENT)), []).append(m)
    for segment, rows in by_segment.items():
        write(run, "commitlog", "segment", segment, rows, f"{name}-{segment}")
    index = RefIndexFile(SLOTS, ENTRIES)
    for m in messages:
        for key in m["keys"]:
            assert index.put_key(f"{m['topic']}#{key}", m["physical_offset"], m["store_timestamp"])
    file = f"{name}000"
    entries = [
        {"index_no": n, "key_hash": h, "slot": h % SLOTS, "phy_offset": p, "time_diff": d, "prev_index": prev}
        for n, (h, p, d, prev) in sorted(index.entry_table.items(), key=lambda e: e[1][0] % SLOTS)
    ]
    write(run, "indexfile", "index_file", file, entries, name)
    header = {
        "index_file": file,
        "begin_timestamp": index.begin_timestamp,
        "end_timestamp": index.end_timestamp,
        "begin_phy_offset": index.begin_phy_offset,
        "end_phy_offset": index.end_phy_offset,
        "hash_slot_count": index.hash_slot_count,
        "index_count": index.index_count,
    }
    run.collect_staged("commitlog")
    run.collect_staged("indexfile")
    run.stage_arrow("indexfile_header", pa.Table.from_pylist([header]))
    if removes:
        listed = Lake(str(root)).engine.active_files("commitlog")
        run.remove("commitlog", [f for f in listed if any(r in f.path for r in removes)])
    run.commit()


KEYS = [("OrderEvents", "a"), ("OrderEvents", "b"), ("OrderEvents", "Aa"), ("OrderEvents", "BB"), ("Other", "a")]


def answers(lake: Lake, *, cached: bool, begin: int = 0, end: int = Q.LONG_MAX, max_num: int = 64) -> dict:
    return {
        (topic, key): Q.query_key(
            lake,
            topic=topic,
            key=key,
            slots=SLOTS,
            segment_size=SEGMENT,
            cached=cached,
            begin=begin,
            end=end,
            max_num=max_num,
        )["rows"]
        for topic, key in KEYS
    }


def agree(lake: Lake) -> dict:
    for window in [{}, {"begin": T0 + 5_000, "end": T0 + 40_000, "max_num": 2}]:
        cached, reference = answers(lake, cached=True, **window), answers(lake, cached=False, **window)
        assert cached == reference, window
    reads = L.cache_sizes()
    assert reads["page_fallbacks"] == 0
    # the commitlog's files by pages in the paged layout (index files never are: no page index)
    assert (reads["pages"] > 0) == ROUTE["paged"] and reads["row_groups"] > 0
    return {k: [r["physical_offset"] for r in rows] for k, rows in answers(lake, cached=True).items()}


@pytest.fixture
def root(tmp_path):
    L.clear_caches()
    keys = [["a"], ["b"], ["a", "b"], ["Aa"], ["BB"], []]  # "Aa" and "BB" share a hash: the re-check drops one
    first = [message(o * SIZE, "Other" if o % 7 == 6 else "OrderEvents", keys[o % 6]) for o in range(40)]
    commit(tmp_path / "lake", first, name="r1")
    return tmp_path / "lake"


def test_cached_route_equals_the_reference_after_new_runs_and_expiry_in_a_warm_process(root):
    warm = Lake(str(root))  # not pinned: each lookup reads the latest version, as a long-lived process would
    before = agree(warm)
    assert before[("OrderEvents", "a")] and before[("Other", "a")]
    assert L.cache_sizes()["footers"] > 0

    # a new run with messages in a later segment: the warm process finds them
    later = [message(SEGMENT + o * SIZE, "OrderEvents", ["a", "c"]) for o in range(5)]
    commit(root, later, name="r2")
    after = agree(warm)
    assert after[("OrderEvents", "a")][-5:] == [m["physical_offset"] for m in later]

    # expiry removes the first segment's files: their messages are gone from both routes
    commit(root, [message(2 * SEGMENT, "OrderEvents", ["b"])], name="r3", removes=["segment=" + segment_file_name(0)])
    expired = agree(warm)
    assert all(o >= SEGMENT for rows in expired.values() for o in rows)

    # a pinned reader opened before keeps its run (version-keyed caches do not leak newer files into it)
    pinned = Lake(str(root), read_only=True)
    commit(root, [message(2 * SEGMENT + SIZE, "OrderEvents", ["b"])], name="r4")
    assert agree(pinned) == expired
    assert agree(Lake(str(root)))[("OrderEvents", "b")][-1] == 2 * SEGMENT + SIZE


def test_a_lake_recreated_at_the_same_path_is_not_read_from_the_old_caches(root):
    agree(Lake(str(root)))
    shutil.rmtree(root)
    commit(root, [message(o * SIZE, "OrderEvents", ["z", "a"]) for o in range(10)], name="r1")
    assert agree(Lake(str(root)))[("OrderEvents", "a")] == [o * SIZE for o in range(10)]


def test_footers_beyond_the_byte_bound_are_read_again_with_the_same_answers(root, monkeypatch):
    reference = agree(Lake(str(root)))
    L.clear_caches()
    monkeypatch.setattr(L._footers, "capacity", 1)  # every footer over the bound: only the last one read stays
    warm = Lake(str(root))
    assert agree(warm) == reference
    sizes = L.cache_sizes()
    assert sizes["footers"] == 1 and sizes["footer_bytes"] > 1


def test_the_footer_cache_drops_the_least_recently_used_by_weight():
    cache = L._Lru(10, weight=len)
    cache.get("a", lambda: "aaaa")
    cache.get("b", lambda: "bbbb")
    assert cache.get("a", lambda: "never built") == "aaaa"  # a is now the most recent
    cache.get("c", lambda: "cccc")  # 12 > 10: b, the least recent, goes
    assert cache.held == 8 and cache.get("b", lambda: "b2") == "b2"
    assert cache.get("c", lambda: "never built") == "cccc" and cache.held == 10
    cache.get("huge", lambda: "x" * 50)  # heavier than the bound alone: kept, everything else dropped
    assert len(cache) == 1 and cache.held == 50
    cache.clear()
    assert len(cache) == 0 and cache.held == 0


@pytest.mark.parametrize("threads", [0, 1, 4])
def test_files_read_side_by_side_or_one_after_another_give_the_same_rows(root, monkeypatch, threads):
    commit(root, [message(SEGMENT + o * SIZE, "OrderEvents", ["a", "b"]) for o in range(7)], name="r2")
    monkeypatch.setattr(L, "READ_THREADS", threads)
    assert agree(Lake(str(root)))[("OrderEvents", "a")][-7:] == [SEGMENT + o * SIZE for o in range(7)]


def test_page_maps_are_built_from_a_process_second_lookup_on(root):
    """A one-lookup process (the CLI) reads row groups and builds no page map; later lookups read pages."""
    L.clear_caches()
    lake = Lake(str(root))
    first = Q.query_key(lake, topic="OrderEvents", key="a", slots=SLOTS, segment_size=SEGMENT)["rows"]
    reads = L.cache_sizes()
    assert reads["pages"] == 0 and reads["row_groups"] > 0
    assert not any(layout.mapped for layout in L.table_layout(lake, "commitlog", "physical_offset"))
    again = Q.query_key(lake, topic="OrderEvents", key="a", slots=SLOTS, segment_size=SEGMENT)["rows"]
    assert again == first
    assert (L.cache_sizes()["pages"] > 0) == ROUTE["paged"]
    layouts = L.table_layout(lake, "commitlog", "physical_offset")
    assert all(layout.mapped for layout in layouts)
    assert all((layout.pages is not None) == ROUTE["paged"] for layout in layouts)


@pytest.mark.parametrize(
    "field, value", [("properties_bytes", b"KEYS\x01a\x02TAGS\x01\xff\x02"), ("store_host", "10.0.0.5")]
)
def test_a_record_no_writer_stores_is_shown_from_the_stored_columns(tmp_path, caplog, field, value):
    """A lookup decodes ``properties``, ``keys``, ``tags``, ``uniq_key`` and ``msg_id`` from the record's
    fields; fields it cannot decode (properties bytes that are not UTF-8, a store host without a port) make it
    show the stored columns instead, as the reference route does."""
    L.clear_caches()
    messages = [message(o * SIZE, "OrderEvents", ["a"]) for o in range(6)]
    messages[3][field] = value
    commit(tmp_path / "lake", messages, name="r1")
    lake = Lake(str(tmp_path / "lake"))
    for _ in range(2):  # by row groups, then by pages where the layout has them
        rows = Q.query_key(lake, topic="OrderEvents", key="a", slots=SLOTS, segment_size=SEGMENT)["rows"]
        assert rows == answers(lake, cached=False)[("OrderEvents", "a")]
        assert [rows[3][c] for c in ("properties", "keys", "msg_id")] == [
            messages[3][c] for c in ("properties", "keys", "msg_id")
        ]
    assert "a commitlog record cannot be decoded" in caplog.text
