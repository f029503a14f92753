"""getOffsetInQueueByTime, case by case (ConsumeQueue.binarySearchInQueueByTime)."""

from __future__ import annotations

import pytest

from rmqlake.formats.consumequeue import files_for_time_search, offset_in_queue_by_time, store_offset_by_time

# one file starting at queue offset 0: (commitlog offset, store time)
FILE = [(0, 100), (10, 100), (20, 200), (30, 300), (40, 300), (50, 300), (60, 500)]


@pytest.mark.parametrize(
    ("timestamp", "boundary", "expected"),
    [
        (300, "lower", 3),  # equal times widen to the first equal unit
        (300, "upper", 5),  # ... or to the last
        (100, "lower", 0),
        (250, "lower", 3),  # no unit at 250: the unit after it
        (250, "upper", 2),  # ... or before it
        (600, "lower", 7),  # every unit is earlier: one past the last
        (600, "upper", 6),
        (50, "lower", 0),  # every unit is later: the file's first offset
        (50, "upper", 0),  # ... and 0 for upper
    ],
)
def test_single_file(timestamp, boundary, expected):
    assert offset_in_queue_by_time([(0, FILE)], timestamp=timestamp, boundary=boundary) == expected


def test_file_chosen_by_its_last_unit_and_min_offsets_respected():
    files = [(0, [(0, 10), (1, 20)]), (2, [(2, 30), (3, 40)]), (4, [(4, 50)])]
    assert offset_in_queue_by_time(files, timestamp=35, boundary="lower") == 3
    assert offset_in_queue_by_time(files, timestamp=45, boundary="lower") == 4  # last file
    assert offset_in_queue_by_time(files, timestamp=45, boundary="upper") == 3
    # units whose message is gone (below the commitlog min offset) count as too old
    assert offset_in_queue_by_time([(0, FILE)], timestamp=100, boundary="lower", min_phy_offset=25) == 3
    # the first unit at or above the min offset is later than the time: the broker answers the file's first
    # offset, even though it is below the queue's min offset
    assert offset_in_queue_by_time([(0, FILE)], timestamp=100, boundary="lower", min_logic_offset=2) == 0
    assert offset_in_queue_by_time([(0, FILE)], timestamp=250, boundary="lower", min_logic_offset=2) == 3


def test_the_store_keeps_the_answer_within_the_queues_min_and_max_offsets():
    # RocketMQ 5.3.3 (ConsumeQueueStore.getOffsetInQueueByTime) clamps the queue's answer; seen on an export
    # after expiry, where a time before every live message gave 32 (lower) and 0 (upper) instead of 37
    expired = [(0, FILE)]  # units 0-1 are below the corrected min offset 2
    assert offset_in_queue_by_time(expired, timestamp=100, boundary="lower", min_logic_offset=2) == 0
    assert store_offset_by_time(expired, timestamp=100, boundary="lower", min_logic_offset=2) == 2
    assert store_offset_by_time(expired, timestamp=50, boundary="upper", min_logic_offset=2) == 2
    assert store_offset_by_time(expired, timestamp=250, boundary="lower", min_logic_offset=2) == 3  # inside: as is
    assert store_offset_by_time(expired, timestamp=600, boundary="lower", min_logic_offset=2) == 7  # the max offset
    assert store_offset_by_time([(0, FILE)], timestamp=50, boundary="upper") == 0


def test_a_queue_starting_inside_its_first_file_is_searched_from_the_files_first_slot():
    # a lake imported from a store whose first segments were deleted: queue 0 starts at offset 5 of a
    # 16-unit file, where the broker's CQ file holds pre-blank units (offset 0, store time unknown)
    units = [(5 + n, 1000 + 10 * n, 500 + 100 * n) for n in range(14)]  # offsets 5..18, times 500..1800
    files = files_for_time_search(units, units_per_file=16)
    assert [(first, len(units)) for first, units in files] == [(0, 16), (16, 3)]
    assert files[0][1][:5] == [(0, -1)] * 5 and files[0][1][5] == (1000, 500)
    search = {"min_logic_offset": 5, "min_phy_offset": 1000}
    assert store_offset_by_time(files, timestamp=800, boundary="lower", **search) == 8
    assert store_offset_by_time(files, timestamp=850, boundary="upper", **search) == 8
    assert store_offset_by_time(files, timestamp=100, boundary="lower", **search) == 5
    assert store_offset_by_time(files, timestamp=100, boundary="upper", **search) == 5
    assert store_offset_by_time(files, timestamp=1700, boundary="lower", **search) == 17
    assert store_offset_by_time(files, timestamp=9999, boundary="lower", **search) == 19
