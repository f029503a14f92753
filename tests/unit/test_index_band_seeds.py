"""The open index file's chain seeds: ``band_slot_heads`` (one pass) against ``last_entry_per_slot`` (a sort)."""

from __future__ import annotations

import numpy as np
import pytest

from rmqlake.transforms.index_bands import band_slot_heads, last_entry_per_slot


def _agree(slot: np.ndarray, index_no: np.ndarray, low: int, high: int) -> None:
    got_slots, got_heads = band_slot_heads(slot, index_no, low, high)
    want_slots, want_heads = last_entry_per_slot(slot, index_no)
    np.testing.assert_array_equal(got_slots, want_slots)
    np.testing.assert_array_equal(got_heads, want_heads)
    assert got_slots.dtype == np.int64 and got_heads.dtype == np.int64


@pytest.mark.parametrize("seed", range(6))
def test_the_heads_equal_the_sorted_reference_in_any_row_order(seed):
    rng = np.random.default_rng(seed)
    low, high = sorted(rng.integers(0, 5_000, 2).tolist())
    high += 1
    count = int(rng.integers(1, 20_000))
    # entry numbers as an index file gives them: unique, from 1, in any order across the band's data files
    index_no = (rng.permutation(count) + 1).astype(np.int32)
    slot = rng.integers(low, high, count).astype(np.int32)  # many entries per slot, and slots without any
    _agree(slot, index_no, low, high)
    order = np.lexsort((index_no, slot))  # as a band task writes its file: by slot, then entry number
    _agree(slot[order], index_no[order], low, high)


def test_edge_slots_values_and_an_empty_band():
    _agree(np.array([0, 0, 9], np.int32), np.array([3, 7, 1], np.int32), 0, 10)  # the band's first and last slot
    # a damaged lake's numbers (zero, negative, repeated) are still taken as they are, as the sort takes them
    _agree(np.array([4, 4, 5, 5], np.int32), np.array([0, -2, -9, -9], np.int32), 4, 6)
    slots, heads = band_slot_heads(np.empty(0, np.int32), np.empty(0, np.int32), 0, 10)
    assert len(slots) == len(heads) == 0


def test_entries_outside_the_band_are_refused():
    with pytest.raises(ValueError, match=r"outside the slots \[2, 5\)"):
        band_slot_heads(np.array([2, 5], np.int32), np.array([1, 2], np.int32), 2, 5)
    with pytest.raises(ValueError, match="outside"):
        band_slot_heads(np.array([1], np.int32), np.array([1], np.int32), 2, 5)
