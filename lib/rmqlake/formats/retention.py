"""The broker's file-deletion rules, as pure functions over file metadata.

Sources: DefaultMessageStore.java (CleanCommitLogService.deleteExpiredFiles,
isSpaceToDelete, isTimeToDelete), MappedFileQueue.java
(deleteExpiredFileByTime, deleteExpiredFileByOffset), ConsumeQueue.java
(correctMinOffset), IndexService.java (deleteExpiredFile), UtilAll.isItTimeToDo.

The broker measures disk usage of a real partition. rmqlake measures what
the broker's disk would hold: every live file at its
preallocated size plus ``disk_other_used_bytes``, over
``disk_capacity_bytes``. CommitLog and ConsumeQueue share that one disk,
so the broker's two checks (physic and logics) see the same ratio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from rmqlake.formats.consumequeue import cq_file_size
from rmqlake.formats.indexfile import index_file_size

HOUR_MS = 3_600_000
MAX_MANUAL_DELETE_RUNS = 20  # CleanCommitLogService.MAX_MANUAL_DELETE_FILE_TIMES
CLEAN_FORCIBLY_BOUNDS = (0.30, 0.85)
WARNING_BOUNDS = (0.35, 0.90)

EXPIRED = "expired"
DISK_PRESSURE = "disk pressure"
FORCED = "forced"
MANUAL = "manual"


def clean_forcibly_ratio(configured: float) -> float:
    """``getDiskSpaceCleanForciblyRatio``: clamped to [0.30, 0.85]."""
    return min(max(configured, CLEAN_FORCIBLY_BOUNDS[0]), CLEAN_FORCIBLY_BOUNDS[1])


def warning_ratio(configured: float) -> float:
    """``getDiskSpaceWarningLevelRatio``: clamped to [0.35, 0.90]."""
    return min(max(configured, WARNING_BOUNDS[0]), WARNING_BOUNDS[1])


def is_time_to_delete(now_ms: int, delete_when: str, zone: str) -> bool:
    """``UtilAll.isItTimeToDo``: the hour of ``now`` in the broker's zone is one of ``delete_when``."""
    hour = datetime.fromtimestamp(now_ms / 1000, tz=UTC).astimezone(ZoneInfo(zone)).hour
    return any(int(part) == hour for part in delete_when.split(";") if part.strip())


def disk_usage_bytes(
    *,
    live_segments: int,
    segment_size: int,
    cq_files: int,
    cq_units_per_file: int,
    index_files: int,
    index_slots: int,
    index_max_entries: int,
    other_used_bytes: int,
) -> int:
    """Bytes the broker's disk would hold: every live file at its preallocated size."""
    return (
        other_used_bytes
        + live_segments * segment_size
        + cq_files * cq_file_size(cq_units_per_file)
        + index_files * index_file_size(index_slots, index_max_entries)
    )


@dataclass(frozen=True)
class DiskCheck:
    """Outcome of ``isSpaceToDelete`` for one usage ratio."""

    usage: float
    space_to_delete: bool  # the return value: delete even outside the deletion hours
    clean_immediately: bool  # delete files that have not expired yet (with cleanFileForciblyEnable)
    disk_full: bool  # the DISK_FULL running flag after the check (writes rejected while set)


def check_disk(
    usage: float, *, was_full: bool, max_used_ratio: float, clean_forcibly: float, warning: float
) -> DiskCheck:
    """``isSpaceToDelete`` with the commitlog and CQ on one disk.

    Above the warning ratio the disk-full flag is set and files go at once;
    above the clean-forcibly ratio files go at once and the flag is left as
    it was; otherwise the flag is cleared and expired files may go (at any
    hour) if usage is above ``max_used_ratio``. Comparisons are strict.
    """
    if usage > warning_ratio(warning):
        return DiskCheck(usage, True, True, True)
    if usage > clean_forcibly_ratio(clean_forcibly):
        return DiskCheck(usage, True, True, was_full)
    return DiskCheck(usage, usage < 0 or usage > max_used_ratio, False, False)


@dataclass(frozen=True)
class Trigger:
    """Whether this run deletes (``deleteExpiredFiles``) and how."""

    time_up: bool
    disk: DiskCheck
    manual: bool
    manual_runs_left: int  # after this run
    clean_at_once: bool

    @property
    def deletes(self) -> bool:
        return self.time_up or self.disk.space_to_delete or self.manual


def decide(
    *, now_ms: int, delete_when: str, zone: str, disk: DiskCheck, manual_runs_left: int, clean_forcibly_enable: bool
) -> Trigger:
    """One run of CleanCommitLogService: deletion hour, disk pressure or a pending manual request."""
    time_up = is_time_to_delete(now_ms, delete_when, zone)
    manual = manual_runs_left > 0
    deletes = time_up or disk.space_to_delete or manual
    return Trigger(
        time_up=time_up,
        disk=disk,
        manual=manual,
        manual_runs_left=manual_runs_left - 1 if deletes and manual else manual_runs_left,
        clean_at_once=clean_forcibly_enable and disk.clean_immediately,
    )


@dataclass(frozen=True)
class SegmentFile:
    """A commitlog segment as the deletion rule sees it: its name, start and last write."""

    segment: str
    start_offset: int
    last_modified: int  # ms: when the broker last wrote the file (see ``segment_files``)


def segment_files(segments: Sequence[Mapping]) -> list[SegmentFile]:
    """The live ``segments`` rows as the deletion rule sees them, by start offset, with their last-modified time.

    A file's last-modified time is when the broker last wrote it. A sealed
    segment was last written when the message that opened the next segment
    arrived (it wrote the 8-byte blank record at the end of the full one):
    the next segment's ``first_store_timestamp``. The last segment was last
    written by its last message (``last_store_timestamp``), as is a sealed
    segment with no segment after it. ``export-store`` gives each file this
    modification time.
    """
    ordered = sorted(segments, key=lambda s: s["start_offset"])
    files = []
    for row, after in zip(ordered, [*ordered[1:], None], strict=True):
        opened_next = after["first_store_timestamp"] if after is not None and row["status"] != "active" else None
        written = opened_next if opened_next is not None else row["last_store_timestamp"]
        files.append(SegmentFile(row["segment"], row["start_offset"], int(written or 0)))
    return files


def segments_to_delete(
    segments: Sequence[SegmentFile], *, trigger: Trigger, now_ms: int, reserved_hours: int, batch_max: int
) -> list[tuple[SegmentFile, str]]:
    """``deleteExpiredFileByTime``: oldest first, never the last (active) file, no holes.

    A segment may go when ``now >= last write + reserved hours`` or when the
    disk forces a clean; the walk stops at the first segment that may not
    go, and after ``batch_max`` deletions. Each deleted segment gets its
    reason: ``expired`` (deletion hour), ``disk pressure`` (expired, deleted
    outside the hours because the disk is above ``disk_max_used_ratio``),
    ``manual`` (expired, a manual request), or ``forced`` (not expired yet:
    clean-forcibly or warning ratio exceeded).
    """
    if not trigger.deletes:
        return []
    ordered = sorted(segments, key=lambda s: s.start_offset)
    reserved_ms = reserved_hours * HOUR_MS
    chosen: list[tuple[SegmentFile, str]] = []
    for segment in ordered[:-1]:
        expired = now_ms >= segment.last_modified + reserved_ms
        if not (expired or trigger.clean_at_once):
            break
        chosen.append((segment, _reason(expired, trigger)))
        if len(chosen) >= batch_max:
            break
    return chosen


KEPT_ACTIVE = "the active segment: the broker never deletes the file it writes to"
KEPT_NOT_TRIGGERED = (
    "no deletion trigger: outside retention.delete_when hours, disk not above the ratios, no manual request"
)
KEPT_BATCH_CAP = "retention.max_segments_per_run reached; it goes in a following run"
KEPT_OLDER_KEPT = "an older segment is kept and the broker deletes oldest first, without holes"


def retained_reasons(
    segments: Sequence[SegmentFile],
    deleted: Sequence[tuple[SegmentFile, str]],
    *,
    trigger: Trigger,
    now_ms: int,
    reserved_hours: int,
    batch_max: int,
) -> dict[str, str]:
    """Why each live segment past its reserved time was kept by ``segments_to_delete`` (segment -> reason).

    Segments not expired yet are not in the result. The reasons are stable
    texts (no times or ratios), so an unchanged explanation is not rewritten.
    """
    reserved_ms = reserved_hours * HOUR_MS
    gone = {segment.segment for segment, _ in deleted}
    ordered = sorted(segments, key=lambda s: s.start_offset)
    reasons = {}
    for position, segment in enumerate(ordered):
        if segment.segment in gone or now_ms < segment.last_modified + reserved_ms:
            continue
        if position == len(ordered) - 1:
            reasons[segment.segment] = KEPT_ACTIVE
        elif not trigger.deletes:
            reasons[segment.segment] = KEPT_NOT_TRIGGERED
        elif len(gone) >= batch_max:
            reasons[segment.segment] = KEPT_BATCH_CAP
        else:
            reasons[segment.segment] = KEPT_OLDER_KEPT
    return reasons


def _reason(expired: bool, trigger: Trigger) -> str:
    if not expired:
        return FORCED
    if trigger.time_up:
        return EXPIRED
    if trigger.disk.space_to_delete:
        return DISK_PRESSURE
    return MANUAL


def cq_files_to_delete(files: Sequence[tuple[str, int]], *, min_physical_offset: int) -> list[str]:
    """``deleteExpiredFileByOffset(minOffset, 20)`` for one queue.

    ``files`` are (CQ file name, commitlog offset of the file's last unit)
    in name order. Every file but the last goes, oldest first, while its last
    unit points below the new commitlog minimum.
    """
    doomed = []
    for name, last_unit_offset in sorted(files)[:-1]:
        if last_unit_offset >= min_physical_offset:
            break
        doomed.append(name)
    return doomed


def index_files_to_delete(files: Sequence[tuple[str, int]], *, min_physical_offset: int) -> list[str]:
    """``IndexService.deleteExpiredFile``: (name, endPhyOffset) in name order; never the newest file."""
    ordered = sorted(files)
    if not ordered or ordered[0][1] >= min_physical_offset:
        return []
    doomed = []
    for name, end_phy_offset in ordered[:-1]:
        if end_phy_offset >= min_physical_offset:
            break
        doomed.append(name)
    return doomed


def corrected_min_offset(first_live_unit: int | None, *, max_offset: int) -> int:
    """``correctMinOffset``: the first unit still pointing at or above the commitlog minimum, else max.

    ``first_live_unit`` is the queue offset of the first unit (in the queue's
    first kept file) whose commitlog offset is at or above the new minimum,
    None when even the queue's last unit is below it: the queue is then
    empty but keeps its numbering (min = max).
    """
    return max_offset if first_live_unit is None else first_live_unit
