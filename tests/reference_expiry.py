"""An independent reference of the broker's deletion rules, written from the Java sources as a stateful
service (CleanCommitLogService + MappedFileQueue + CleanConsumeQueueService), for the tests to compare with.

It works on plain file lists, the way the broker holds its MappedFiles, and
shares no code with rmqlake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from zoneinfo import ZoneInfo


@dataclass
class RefFile:
    name: str
    last_modified: int


@dataclass
class RefCleaner:
    """One broker's CleanCommitLogService: holds the manual counter and the DISK_FULL flag between runs."""

    reserved_hours: int = 72
    delete_when: str = "04"
    zone: str = "UTC"
    max_used_percent: float = 75  # diskMaxUsedSpaceRatio, in percent as the broker keeps it
    forcibly: float = 0.85
    warning: float = 0.90
    clean_forcibly_enable: bool = True
    batch_max: int = 10
    manual_times: int = 0
    disk_full: bool = False
    log: list = field(default_factory=list)

    def run(self, files: list[RefFile], *, now: int, usage: float) -> list[str]:
        """One ``deleteExpiredFiles``: returns the names deleted (the caller removes them from ``files``)."""
        hour = datetime.fromtimestamp(now / 1000, tz=UTC).astimezone(ZoneInfo(self.zone)).hour
        time_up = str(hour) in [str(int(w)) for w in self.delete_when.split(";")]
        space, clean_now = self._space(usage)
        manual = self.manual_times > 0
        if not (time_up or space or manual):
            return []
        if manual:
            self.manual_times -= 1
        at_once = self.clean_forcibly_enable and clean_now
        deleted = []
        for f in files[: len(files) - 1]:
            if now >= f.last_modified + self.reserved_hours * 60 * 60 * 1000 or at_once:
                deleted.append(f.name)
                if len(deleted) >= self.batch_max:
                    break
            else:
                break
        return deleted

    def _space(self, usage: float) -> tuple[bool, bool]:
        warning = min(0.90, max(0.35, self.warning))
        forcibly = min(0.85, max(0.30, self.forcibly))
        if usage > warning:
            self.disk_full = True
            return True, True
        if usage > forcibly:
            return True, True
        self.disk_full = False
        return usage < 0 or usage > self.max_used_percent / 100.0, False


def ref_cq_cleanup(cq_files: list[tuple[str, list[int]]], min_offset: int) -> list[str]:
    """``deleteExpiredFileByOffset``: cq_files = (name, commitlog offsets of its units) in order; names kept."""
    kept = [name for name, _ in cq_files]
    for name, units in cq_files[:-1]:
        if units[-1] < min_offset:
            kept.remove(name)
        else:
            break
    return kept


def ref_min_offset(units: list[tuple[int, int]], min_offset: int) -> int:
    """``correctMinOffset`` over a queue's kept units [(queue offset, commitlog offset)]: first live, else max."""
    for queue_offset, commitlog_offset in units:
        if commitlog_offset >= min_offset:
            return queue_offset
    return units[-1][0] + 1 if units else 0


def ref_index_cleanup(files: list[tuple[str, int]], min_offset: int) -> list[str]:
    """``IndexService.deleteExpiredFile``: files = (name, endPhyOffset) in order; names kept."""
    if not files or files[0][1] >= min_offset:
        return [name for name, _ in files]
    kept = [name for name, _ in files]
    for name, end in files[:-1]:
        if end < min_offset:
            kept.remove(name)
        else:
            break
    return kept
