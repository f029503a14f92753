"""The typed lake state reads and writes the ledger's JSON exactly as lakes hold it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rmqlake.lake.state import (
    CommitlogState,
    ExpireState,
    ImportStoreState,
    LakeState,
    QueueId,
    RunRecord,
    SegmentHole,
)

# Ledger states written by the jobs (ingest, import-store, reput, compact, offsets, expire with corrected queue
# min offsets, quality), verbatim from the ledger's state column.
STATES = Path(__file__).resolve().parents[1] / "data" / "lake_state"


def _dump(data: dict) -> str:
    return json.dumps(data, sort_keys=True)  # as the ledger writes it


@pytest.mark.parametrize("name", ["full", "ingest_only"])
def test_a_written_state_round_trips_byte_for_byte(name):
    raw = (STATES / f"{name}.json").read_text()
    state = LakeState.from_json(json.loads(raw))
    assert _dump(state.to_json()) == raw
    assert LakeState.from_json(state.to_json()) == state


def test_every_section_of_the_full_state_is_typed():
    state = LakeState.from_json(json.loads((STATES / "full.json").read_text()))
    assert state.commitlog.segment_size == 65536 and state.commitlog.physic_msg_timestamp
    assert state.reput.dispatched_offset == state.commitlog.next_offset == state.next_offset
    assert state.compaction.positions
    assert state.expire.applied and state.expire.queue_min_offsets
    assert all(isinstance(queue, QueueId) for queue in state.expire.queue_min_offsets)
    assert state.queue_min_offsets[QueueId("Clickstream", 0)] == 67
    assert state.import_store.files and state.quality.checked
    assert set(state.runs) == {"ingest", "compact", "expire", "quality"}
    assert state.runs["ingest"].metrics["rows_out"] > 0


@pytest.mark.parametrize(
    "data",
    [
        {},  # a fresh lake
        {"commitlog": {"next_offset": 10, "queue_heads": {"T": {"0": 1}}, "rr_counters": {}, "topics": {}}},
        # imported, not ingested since: no segment size yet
        {
            "commitlog": {
                "next_offset": 10,
                "physic_msg_timestamp": 5,
                "queue_heads": {},
                "rr_counters": {},
                "topics": {"T": {"bytes": 10, "messages": 1}},
            },
            "import_store": {
                "corrupt_records": 2,
                "files": {"00000000000000000000": [65536, 7]},
                "holes": {"00000000000000000000": {"first_rejected_offset": 3, "ranges": 2}},
                "source": "/store",
            },
        },
        {"reput": {"dispatched_offset": 0}},  # reput before any index file was sealed
        # expire before it recorded its inputs
        {
            "expire": {
                "disk_full": True,
                "disk_usage": 0.95,
                "last_now": 1,
                "manual_runs_left": 0,
                "queue_min_offsets": {},
            }
        },
    ],
)
def test_states_with_sections_missing_round_trip(data):
    state = LakeState.from_json(data)
    assert _dump(state.to_json()) == _dump(data)


def test_missing_sections_read_as_their_empty_values():
    state = LakeState.from_json({})
    assert state == LakeState()
    assert (state.next_offset, state.dispatched_offset, dict(state.queue_min_offsets), dict(state.runs)) == (
        0,
        0,
        {},
        {},
    )
    assert state.commitlog is None and state.expire is None and state.import_store is None


def test_queue_key_format_round_trips():
    queue = QueueId("%RETRY%cg_a", 12)
    assert queue.key() == "%RETRY%cg_a\t12"
    assert QueueId.parse(queue.key()) == queue == ("%RETRY%cg_a", 12)


def test_sections_are_replaced_not_mutated():
    state = LakeState(commitlog=CommitlogState(next_offset=5))
    after = replace(state, expire=ExpireState(queue_min_offsets={QueueId("T", 1): 3})).with_run(
        "expire", RunRecord(seq=2, run_id="r", at="2026-11-21T00:00:00+00:00", metrics={"rows_in": 0})
    )
    assert state.expire is None and not state.runs
    assert after.to_json()["expire"]["queue_min_offsets"] == {"T\t1": 3}
    assert after.to_json()["runs"] == {
        "expire": {"at": "2026-11-21T00:00:00+00:00", "rows_in": 0, "run_id": "r", "seq": 2}
    }
    imported = ImportStoreState(source="/s", holes={"1": SegmentHole(first_rejected_offset=1, ranges=1)})
    assert ImportStoreState.from_json(imported.to_json()) == imported
