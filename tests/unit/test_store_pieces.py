"""A commitlog file imported in pieces against the whole file read record by record: the same staged rows.

The pieces are written as an import task writes them (commitlog Parquet files, corrupt rows apart) and read
back; the reference is ``read_segment_file`` over the whole file with the per-record reader. Clean files, odd
records, damage at and next to the cut points, damage the planning walk steps over (the file is then read
again as one piece, and what its pieces wrote is gone), and the fuzzer's mutated segments.
"""

from __future__ import annotations

import itertools
import random
import struct
from concurrent.futures import Future

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.record import MAGIC_V2, encode_blank, encode_record
from rmqlake.ingest.plan import COMMITLOG_FILE
from rmqlake.store import IMPORTED_SCHEMA, read_segment_file, record_runs
from rmqlake.store.imports import FilePiece, ImportTarget, import_files, import_task, plan_pieces
from tests.unit.test_store_fuzz import FUZZ, mutated
from tests.unit.test_store_import import record

RUN = "run-1"


@pytest.fixture(autouse=True)
def _runs_of_any_length(monkeypatch):
    """The files here are small: let the column-wise reader take runs of one record on."""
    monkeypatch.setattr(record_runs, "MIN_RUN_RECORDS", 1)


def _records(start: int, count: int, *, seed: int = 3) -> bytes:
    """``count`` records from physical offset ``start``: odd sizes, V1 and V2, IPv6 hosts, empty bodies, every
    transaction type, three queues."""
    rng = random.Random(seed)
    v6 = parse_host("[2001:db8::7]:50200")
    data = bytearray()
    for number in range(count):
        changes = {}
        if number % 5 == 1:
            changes = {"born_host": v6, "sys_flag": 0x10}
        elif number % 5 == 3:
            changes = {"topic": "%RETRY%cg_" + "settlement_" * 12, "magic": MAGIC_V2}
        transaction = (0, 0x4, 0x8, 0xC)[number % 4]  # NOT_TYPE, PREPARED, COMMIT, ROLLBACK
        changes["sys_flag"] = changes.get("sys_flag", 0) | transaction
        body = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 37, 300, 1500])))
        data += encode_record(record(start + len(data), number, body=body, queue_id=number % 3, **changes))
    return bytes(data)


def list_pieces(path: str, **options) -> list[FilePiece]:
    return list(plan_pieces(path, **options))


def _done(results: list[dict]) -> Future:
    future = Future()
    future.set_result(results)
    return future


def _target(tmp_path) -> ImportTarget:
    return ImportTarget(
        lake_root=str(tmp_path / "lake"),
        storage_options={},
        commitlog_dir=f"commitlog/_staging/{RUN}",
        corrupt_dir=f"commitlog/_staging/{RUN}/_corrupt",
        batch_id=RUN,
    )


def _in_pieces(path, start: int, *, last: bool, piece_bytes: int, target: ImportTarget) -> tuple[list, list, bool]:
    """(messages, corrupt rows, whether the blank was read) as the import tasks stage them, and the reads."""
    read = import_files(
        [(str(path), start, last)],
        target=target,
        piece_bytes=piece_bytes,
        submit=lambda tasks: _done([import_task(task, target=target) for task in tasks]),
    )
    root = target.lake_root

    def rows(kind: str) -> list[dict]:
        return [row for r in read if r[kind] for row in pq.read_table(f"{root}/{r[kind]}").to_pylist()]

    return rows("message_file"), rows("corrupt_file"), any(r["blank"] for r in read), read


def _whole(path, start: int, *, last: bool) -> tuple[list, list, bool]:
    batches = list(read_segment_file(str(path), start_offset=start, last=last, columnar=False))
    table = pa.Table.from_batches(batches, schema=IMPORTED_SCHEMA)
    is_blank = table.column("blank_end").to_pylist()
    corrupt = [r is not None for r in table.column("corrupt_reason").to_pylist()]
    messages = table.filter(pa.array([not b and not c for b, c in zip(is_blank, corrupt, strict=True)], pa.bool_()))
    stored = COMMITLOG_FILE.stored
    arrays = [
        pa.repeat(pa.scalar(RUN, pa.string()), messages.num_rows) if n == "batch_id" else messages.column(n)
        for n in stored.names
    ]
    messages = COMMITLOG_FILE.complete(pa.Table.from_arrays(arrays, schema=stored.arrow_schema))
    return messages.to_pylist(), table.filter(pa.array(corrupt, pa.bool_())).to_pylist(), any(is_blank)


def _same_both_ways(path, start: int, *, last: bool, piece_bytes: int, tmp_path) -> list[dict]:
    target = _target(tmp_path)
    *pieces, read = _in_pieces(path, start, last=last, piece_bytes=piece_bytes, target=target)
    whole = _whole(path, start, last=last)
    assert tuple(pieces) == whole
    assert _queue_totals(read) == _queue_totals_of_rows(whole[0])
    staged = {p.relative_to(tmp_path / "lake").as_posix() for p in (tmp_path / "lake").rglob("*") if p.is_file()}
    assert staged == {r[kind] for r in read for kind in ("message_file", "corrupt_file") if r[kind]}
    return read


def test_a_clean_file_is_cut_at_record_starts_and_reads_the_same(tmp_path):
    start = 1 << 20
    data = _records(start, 120)
    path = tmp_path / f"{start:020d}"
    path.write_bytes(data + encode_blank(8))
    pieces = list_pieces(str(path), start_offset=start, last=False, piece_bytes=len(data) // 7)
    assert len(pieces) >= 5 and pieces[0].start == 0 and pieces[-1].stop is None
    assert all(
        a.stop == b.start and b.first_ordinal == a.first_ordinal + a.records for a, b in itertools.pairwise(pieces)
    )
    read = _same_both_ways(path, start, last=False, piece_bytes=len(data) // 7, tmp_path=tmp_path)
    assert len(read) == len(pieces) and read[-1]["blank"]  # read as planned: no piece read again


def test_a_small_file_is_one_piece(tmp_path):
    path = tmp_path / f"{0:020d}"
    path.write_bytes(_records(0, 10) + bytes(100))
    assert len(list_pieces(str(path), start_offset=0, last=True, piece_bytes=1 << 20)) == 1
    _same_both_ways(path, 0, last=True, piece_bytes=1 << 20, tmp_path=tmp_path)


@pytest.mark.parametrize(
    ("at", "patch"),
    [
        (8, b"\x00\x00\x00\x01"),  # BODYCRC: a corrupt range of trusted size, the walk goes on
        (28, b"\x00\x00\x00\x00\x00\x00\x00\x09"),  # PHYSICALOFFSET
        (0, b"\x00\x00\x00\x10"),  # TOTALSIZE too small: the planning walk stops, the last piece takes the rest
        (4, b"\x12\x34\x56\x78"),  # magic
        (0, bytes(64)),  # zeros
    ],
)
@pytest.mark.parametrize("where", ["first", "before a cut", "at a cut", "after a cut", "last"])
def test_damage_near_the_cuts_reads_the_same(at, patch, where, tmp_path):
    start = 0
    data = bytearray(_records(start, 80))
    piece_bytes = len(data) // 5
    path = tmp_path / f"{start:020d}"
    path.write_bytes(bytes(data) + encode_blank(64) + bytes(56))
    cuts = [p.start for p in list_pieces(str(path), start_offset=start, last=False, piece_bytes=piece_bytes)][1:]
    heads = _heads(bytes(data))
    index = {"first": 0, "last": len(heads) - 1}.get(where)
    if index is None:
        index = heads.index(cuts[1]) + {"before a cut": -1, "at a cut": 0, "after a cut": 1}[where]
    position = heads[index] + at
    data[position : position + len(patch)] = patch
    path.write_bytes(bytes(data) + encode_blank(64) + bytes(56))
    _same_both_ways(path, start, last=False, piece_bytes=piece_bytes, tmp_path=tmp_path)


def test_damage_the_planning_walk_steps_over_reads_the_file_again_as_one_piece(tmp_path):
    start = 0
    data = bytearray(_records(start, 80))
    piece_bytes = len(data) // 5
    heads = _heads(bytes(data))
    # a V1 topic length one short: TOTALSIZE no longer agrees with the fields, so the record walk looks for the
    # next record passing every check, and the next one has a wrong body CRC: one corrupt range over two
    # records, where the planning walk (TOTALSIZE and magic only) stepped over two records
    victim = heads[2]
    body_length = struct.unpack_from(">i", data, victim + 84)[0]
    data[victim + 88 + body_length] -= 1
    data[heads[3] + 8] ^= 1
    path = tmp_path / f"{start:020d}"
    path.write_bytes(bytes(data) + encode_blank(64) + bytes(56))
    pieces = list_pieces(str(path), start_offset=start, last=False, piece_bytes=piece_bytes)
    assert len(pieces) > 2 and pieces[0].stop > heads[4]
    read = _same_both_ways(path, start, last=False, piece_bytes=piece_bytes, tmp_path=tmp_path)
    assert [r["number"] for r in read] == [len(pieces)]  # the file read again as one piece
    _, corrupt, _ = _whole(path, start, last=False)
    assert [(r["physical_offset"], r["total_size"]) for r in corrupt] == [(victim, heads[4] - victim)]


def test_a_record_crossing_a_cut_after_a_resync_reads_the_same(tmp_path):
    start = 0
    data = bytearray(_records(start, 80))
    piece_bytes = len(data) // 5
    heads = _heads(bytes(data))
    path = tmp_path / f"{start:020d}"
    path.write_bytes(bytes(data) + encode_blank(64) + bytes(56))
    cut = list_pieces(str(path), start_offset=start, last=False, piece_bytes=piece_bytes)[1].start
    before = heads[heads.index(cut) - 1]
    data[before + 4 : before + 8] = b"\0\0\0\0"  # the planning walk now stops here: one piece and the rest
    path.write_bytes(bytes(data) + encode_blank(64) + bytes(56))
    _same_both_ways(path, start, last=False, piece_bytes=piece_bytes, tmp_path=tmp_path)


@settings(FUZZ, max_examples=40)
@given(case=mutated())
def test_mutated_segments_read_the_same_in_pieces(case, tmp_path_factory):
    start, data, last = case
    folder = tmp_path_factory.mktemp("pieces")
    path = folder / f"{start:020d}"
    path.write_bytes(data)
    _same_both_ways(path, start, last=last, piece_bytes=512, tmp_path=folder)


def _queue_totals(read: list[dict]) -> dict:
    """The tasks' per-queue totals of a file, its pieces' added up."""
    totals = {}
    for row in (queue for r in read for queue in r["queues"]):
        key = (row["topic"], row["queue_id"])
        first, last = (
            (row["first_offset"], row["first_store_timestamp"]),
            (row["last_offset"], row["last_store_timestamp"]),
        )
        seen = totals.setdefault(key, [0, 0, 0, first, last, None])
        seen[0] += row["n"]
        seen[1] += row["b"]
        seen[2] = max(seen[2], row["data_end"])
        seen[3], seen[4] = min(seen[3], first), max(seen[4], last)
        dispatched = [d for d in (seen[5], row["last_dispatched"]) if d is not None]
        seen[5] = max(dispatched, default=None)
    return totals


def _queue_totals_of_rows(messages: list[dict]) -> dict:
    """The same, row by row: NOT_TYPE and COMMIT messages (sysFlag bits 2-3 0 or 8) are dispatched."""
    totals = {}
    for m in messages:
        key = (m["topic"], m["queue_id"])
        at = (m["physical_offset"], m["store_timestamp"])
        seen = totals.setdefault(key, [0, 0, 0, at, at, None])
        seen[0] += 1
        seen[1] += m["total_size"]
        seen[2] = max(seen[2], m["physical_offset"] + m["total_size"])
        seen[3], seen[4] = min(seen[3], at), max(seen[4], at)
        if m["sys_flag"] & 0xC in (0, 8):
            seen[5] = m["queue_offset"] if seen[5] is None else max(seen[5], m["queue_offset"])
    return totals


def _heads(data: bytes) -> list[int]:
    heads, at = [], 0
    while at + 8 <= len(data) and struct.unpack_from(">i", data, at)[0] > 0:
        heads.append(at)
        at += struct.unpack_from(">i", data, at)[0]
    return heads


def test_pieces_number_rows_as_the_whole_file(tmp_path):
    start = 0
    data = _records(start, 60)
    path = tmp_path / f"{start:020d}"
    path.write_bytes(data + bytes(500))
    pieces = list_pieces(str(path), start_offset=start, last=True, piece_bytes=len(data) // 4)
    target = _target(tmp_path)
    messages, *_ = _in_pieces(path, start, last=True, piece_bytes=len(data) // 4, target=target)
    assert [m["source_line"] for m in messages] == list(range(1, 61)) and len(pieces) > 2
