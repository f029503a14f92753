"""The reference IndexFile model (tests/reference.py) reproduces RocketMQ's own IndexFile, byte for byte."""

from __future__ import annotations

from rmqlake.formats.indexfile import IndexEntry, IndexHeader, entry_position, select_phy_offsets, slot_position
from tests.reference import RefIndexFile, key_hash
from tests.vectors import section


def _file_from(scenario_file, slots, entries, created_with=None):
    created = created_with or {"endPhyOffset": 0, "endTimestamp": 0}
    index = RefIndexFile(
        slots,
        entries,
        begin_timestamp=created["endTimestamp"],
        end_timestamp=created["endTimestamp"],
        begin_phy_offset=created["endPhyOffset"],
        end_phy_offset=created["endPhyOffset"],
    )
    for insertion in scenario_file["insertions"]:
        assert (
            index.put_key(insertion["key"], insertion["phyOffset"], insertion["storeTimestamp"])
            is insertion["putKeyReturned"]
        )
    return index


def _check_bytes(index: RefIndexFile, expected: dict, slots: int) -> None:
    header = IndexHeader(
        index.begin_timestamp,
        index.end_timestamp,
        index.begin_phy_offset,
        index.end_phy_offset,
        index.hash_slot_count,
        index.index_count,
    )
    assert header.encode().hex() == expected["header"]["hex"]
    assert {s: v for s, v in index.slot_table.items()} == {s["slot"]: s["value"] for s in expected["slots"]}
    for s in expected["slots"]:
        assert slot_position(s["slot"]) == s["byteOffset"]
    for entry in expected["entries"]:
        got = IndexEntry(*index.entry_table[entry["index"]])
        assert got.encode().hex() == entry["hex"]
        assert entry_position(entry["index"], slots) == entry["byteOffset"]


def test_reference_index_file_matches_the_index_scenario():
    scenario = section("index_scenario")
    index = _file_from(scenario, scenario["hashSlotNum"], scenario["indexNum"])
    _check_bytes(index, scenario, scenario["hashSlotNum"])
    header = IndexHeader.decode(bytes.fromhex(scenario["header"]["hex"]))
    entries = {n: IndexEntry(*e) for n, e in index.entry_table.items()}
    for query in scenario["queries"]:
        results: list[int] = []
        index.select(results, query["indexKey"], query["maxNum"], query["begin"], query["end"])
        assert results == query["result_phyOffsets"], query
        from_formats: list[int] = []
        slot = key_hash(query["indexKey"]) % scenario["hashSlotNum"]
        select_phy_offsets(
            from_formats,
            key=query["indexKey"],
            slot_value=index.slot_table.get(slot, 0),
            entries=entries,
            header=header,
            max_num=query["maxNum"],
            begin=query["begin"],
            end=query["end"],
        )
        assert from_formats == query["result_phyOffsets"], query


def test_reference_rollover_matches_the_small_capacity_scenario():
    scenario = section("index_small_capacity_and_rollover_scenario")
    slots, entries = scenario["hashSlotNum"], scenario["indexNum"]
    first = _file_from(scenario["file1"], slots, entries)
    _check_bytes(first, scenario["file1"], slots)
    assert first.full()
    second = _file_from(scenario["file2"], slots, entries, scenario["file2"]["createdWith"])
    _check_bytes(second, scenario["file2"], slots)
    results: list[int] = []
    second.select(results, "T#d", 64, 0, (1 << 63) - 1)
    assert results == scenario["file2"]["query_T#d_all"]
