"""The deletion rules (formats/retention.py) at their boundaries and against the reference in tests/."""

from __future__ import annotations

import random

import pytest

from rmqlake.formats import retention as R
from rmqlake.timeutil import parse_timestamp
from tests.reference_expiry import RefCleaner, RefFile, ref_index_cleanup

H = R.HOUR_MS


def at(text: str) -> int:
    return parse_timestamp(text)


@pytest.mark.parametrize(
    ("now", "when", "zone", "expected"),
    [
        ("2026-11-22T03:59:59.999Z", "04", "UTC", False),
        ("2026-11-22T04:00:00Z", "04", "UTC", True),
        ("2026-11-22T04:59:59.999Z", "04", "UTC", True),
        ("2026-11-22T05:00:00Z", "04", "UTC", False),
        ("2026-11-22T16:30:00Z", "04;16", "UTC", True),
        ("2026-11-21T20:00:00Z", "04", "Asia/Shanghai", True),  # 04:00 in UTC+8
        ("2026-11-22T04:00:00Z", "04", "Asia/Shanghai", False),
        ("2026-11-22T04:00:00Z", "4", "UTC", True),  # Integer.parseInt("4")
    ],
)
def test_deletion_hour_in_the_broker_zone(now, when, zone, expected):
    assert R.is_time_to_delete(at(now), when, zone) is expected


def check(usage, was_full=False):
    return R.check_disk(usage, was_full=was_full, max_used_ratio=0.75, clean_forcibly=0.85, warning=0.90)


def test_disk_thresholds_are_strict_and_act_as_the_broker():
    assert check(0.75) == R.DiskCheck(0.75, False, False, False)
    assert check(0.7500001).space_to_delete and not check(0.7500001).clean_immediately
    assert not check(0.85).clean_immediately
    assert check(0.8500001).clean_immediately and not check(0.8500001).disk_full
    assert not check(0.90).disk_full
    assert check(0.9000001) == R.DiskCheck(0.9000001, True, True, True)
    # between clean-forcibly and warning the flag is left as it was; at or below clean-forcibly it is cleared
    assert check(0.87, was_full=True).disk_full and not check(0.87, was_full=False).disk_full
    assert not check(0.85, was_full=True).disk_full
    assert check(-1).space_to_delete  # unknown usage: reclaim


def test_ratios_are_clamped_as_the_broker_clamps_them():
    assert R.clean_forcibly_ratio(0.95) == 0.85 and R.clean_forcibly_ratio(0.1) == 0.30
    assert R.warning_ratio(0.99) == 0.90 and R.warning_ratio(0.2) == 0.35
    configured = R.check_disk(0.92, was_full=False, max_used_ratio=0.75, clean_forcibly=0.95, warning=0.99)
    assert configured.disk_full  # 0.99 is clamped to 0.90


def trigger(*, time_up=True, usage=0.5, manual_left=0, enable=True, now="2026-11-22T04:00:00Z"):
    disk = check(usage)
    return R.decide(
        now_ms=at(now) if time_up else at("2026-11-22T05:00:00Z"),
        delete_when="04",
        zone="UTC",
        disk=disk,
        manual_runs_left=manual_left,
        clean_forcibly_enable=enable,
    )


def files(last_writes: list[int]) -> list[R.SegmentFile]:
    return [R.SegmentFile(f"{i:020d}", i, t) for i, t in enumerate(last_writes)]


def names(chosen):
    return [(s.segment[-2:], reason) for s, reason in chosen]


def test_72_hour_boundary_and_the_active_segment():
    now = at("2026-11-22T04:00:00Z")
    segments = files([now - 72 * H, now - 72 * H + 1, now - 100 * H])
    chosen = R.segments_to_delete(segments, trigger=trigger(), now_ms=now, reserved_hours=72, batch_max=10)
    assert names(chosen) == [("00", "expired")]  # exactly 72 h goes; 1 ms less stops the walk
    old = files([now - 100 * H] * 3)
    chosen = R.segments_to_delete(old, trigger=trigger(), now_ms=now, reserved_hours=72, batch_max=10)
    assert [s.segment[-2:] for s, _ in chosen] == ["00", "01"]  # never the last (active) one


def test_unexpired_segment_blocks_expired_ones_behind_it_and_the_batch_limit():
    now = at("2026-11-22T04:00:00Z")
    segments = files([now - 100 * H, now - 10 * H, now - 100 * H, now])
    chosen = R.segments_to_delete(segments, trigger=trigger(), now_ms=now, reserved_hours=72, batch_max=10)
    assert names(chosen) == [("00", "expired")]
    many = files([now - 100 * H] * 16)
    chosen = R.segments_to_delete(many, trigger=trigger(), now_ms=now, reserved_hours=72, batch_max=10)
    assert len(chosen) == 10 and chosen[-1][0].segment.endswith("09")


def test_reasons_outside_the_hour_forced_and_manual():
    now = at("2026-11-22T05:00:00Z")
    segments = files([now - 100 * H, now - 1 * H, now])
    off_hours = R.segments_to_delete(
        segments, trigger=trigger(time_up=False), now_ms=now, reserved_hours=72, batch_max=10
    )
    assert off_hours == []
    pressure = trigger(time_up=False, usage=0.8)
    chosen = R.segments_to_delete(segments, trigger=pressure, now_ms=now, reserved_hours=72, batch_max=10)
    assert names(chosen) == [("00", "disk pressure")]
    forced = trigger(time_up=False, usage=0.86)
    chosen = R.segments_to_delete(segments, trigger=forced, now_ms=now, reserved_hours=72, batch_max=10)
    assert names(chosen) == [("00", "disk pressure"), ("01", "forced")]
    assert R.segments_to_delete(
        segments, trigger=trigger(time_up=False, usage=0.86, enable=False), now_ms=now, reserved_hours=72, batch_max=10
    ) == [(segments[0], "disk pressure")]  # cleanFileForciblyEnable=false: expired files only
    manual = trigger(time_up=False, manual_left=20)
    assert manual.manual_runs_left == 19
    chosen = R.segments_to_delete(segments, trigger=manual, now_ms=now, reserved_hours=72, batch_max=10)
    assert names(chosen) == [("00", "manual")]


def test_every_expired_segment_kept_gets_the_reason_the_walk_stopped():
    now = at("2026-11-22T04:00:00Z")

    def kept(ages, **kwargs):
        segments = files([now - age * H for age in ages])
        rule = dict(trigger=kwargs.pop("trigger", trigger()), now_ms=now, reserved_hours=72, **kwargs)
        chosen = R.segments_to_delete(segments, **rule)
        return {k[-2:]: v for k, v in R.retained_reasons(segments, chosen, **rule).items()}

    assert kept([100] * 14, batch_max=10) == {
        **{f"{n:02d}": R.KEPT_BATCH_CAP for n in range(10, 13)},
        "13": R.KEPT_ACTIVE,  # idle for 100 h, still the file being written
    }
    assert kept([100, 100, 1], batch_max=10) == {}  # both expired ones went; the active one is young
    assert kept([100, 100, 1], batch_max=10, trigger=trigger(time_up=False)) == {
        "00": R.KEPT_NOT_TRIGGERED,
        "01": R.KEPT_NOT_TRIGGERED,
    }
    # store times only grow with offsets, but a segment restored out of order must still be explained
    assert kept([100, 10, 100, 1], batch_max=10) == {"02": R.KEPT_OLDER_KEPT}


def test_cq_and_index_cascades():
    assert R.cq_files_to_delete([("a", 10), ("b", 20), ("c", 5)], min_physical_offset=100) == ["a", "b"]  # not last
    assert R.cq_files_to_delete([("a", 10), ("b", 200), ("c", 5)], min_physical_offset=100) == ["a"]
    assert R.cq_files_to_delete([("a", 100)], min_physical_offset=100) == []
    index = [("1", 50), ("2", 90), ("3", 150), ("4", 80)]
    for minimum in (40, 60, 100, 200):
        kept = [n for n, _ in index if n not in R.index_files_to_delete(index, min_physical_offset=minimum)]
        assert kept == ref_index_cleanup(index, minimum)
    assert R.index_files_to_delete([("1", 10)], min_physical_offset=100) == []  # never the newest


def test_random_runs_equal_the_reference_service():
    rng = random.Random(5)
    for _ in range(300):
        start = at("2026-11-20T00:00:00Z")
        count = rng.randint(1, 25)
        last_writes = sorted(start + rng.randint(0, 120) * H for _ in range(count))
        ref = RefCleaner(
            delete_when=rng.choice(["04", "04;16", "1;2;3"]),
            batch_max=rng.randint(1, 12),
            clean_forcibly_enable=rng.random() < 0.8,
            manual_times=rng.choice([0, 0, 3]),
        )
        live = [RefFile(f"{i:020d}", t) for i, t in enumerate(last_writes)]
        segments = files(last_writes)
        disk_full, manual_left = False, ref.manual_times
        for step in range(6):
            now = start + rng.randint(60, 200) * H + rng.randint(0, H)
            usage = rng.choice([0.5, 0.76, 0.86, 0.95, 0.85, 0.75])
            expected = ref.run(live, now=now, usage=usage)
            disk = R.check_disk(
                usage, was_full=disk_full, max_used_ratio=0.75, clean_forcibly=ref.forcibly, warning=ref.warning
            )
            decision = R.decide(
                now_ms=now,
                delete_when=ref.delete_when,
                zone="UTC",
                disk=disk,
                manual_runs_left=manual_left,
                clean_forcibly_enable=ref.clean_forcibly_enable,
            )
            chosen = R.segments_to_delete(
                segments, trigger=decision, now_ms=now, reserved_hours=72, batch_max=ref.batch_max
            )
            assert [s.segment for s, _ in chosen] == expected, (step, usage, now)
            assert disk.disk_full == ref.disk_full and decision.manual_runs_left == ref.manual_times
            disk_full, manual_left = disk.disk_full, decision.manual_runs_left
            gone = set(expected)
            live = [f for f in live if f.name not in gone]
            segments = [s for s in segments if s.segment not in gone]


def test_a_sealed_segment_was_last_written_when_the_next_segment_was_opened():
    rows = [
        # sealed: its last message at 10:00, the next segment's first message (which wrote its blank) at 10:05
        {"segment": "00000000000000000000", "start_offset": 0, "status": "sealed",
         "first_store_timestamp": at("2026-11-22T09:00:00Z"), "last_store_timestamp": at("2026-11-22T10:00:00Z")},
        # the active segment: last written by its last message
        {"segment": "00000000000000001024", "start_offset": 1024, "status": "active",
         "first_store_timestamp": at("2026-11-22T10:05:00Z"), "last_store_timestamp": at("2026-11-22T11:00:00Z")},
    ]  # fmt: skip
    assert R.segment_files(list(reversed(rows))) == [
        R.SegmentFile("00000000000000000000", 0, at("2026-11-22T10:05:00Z")),
        R.SegmentFile("00000000000000001024", 1024, at("2026-11-22T11:00:00Z")),
    ]
    # a sealed segment with no segment after it (its next file was never written): its last message
    assert R.segment_files(rows[:1]) == [R.SegmentFile("00000000000000000000", 0, at("2026-11-22T10:00:00Z"))]
    # the 72 h run from the blank's write, not from the last message's
    files = R.segment_files(rows)
    deletion_hour = R.Trigger(time_up=True, disk=check(0.1), manual=False, manual_runs_left=0, clean_at_once=False)

    def doomed(now: str) -> list:
        return R.segments_to_delete(files, trigger=deletion_hour, now_ms=at(now), reserved_hours=72, batch_max=10)

    assert doomed("2026-11-25T10:04:59.999Z") == []  # 72 h after its last message, not yet after its last write
    assert doomed("2026-11-25T10:05:00Z") == [(files[0], R.EXPIRED)]
