"""The lake state a run commits with its ledger row: one frozen dataclass per job section.

The ledger stores the state as JSON (``json.dumps(..., sort_keys=True)``);
each class here reads and writes exactly its section's JSON layout, so lakes
written before these classes load unchanged. A section a lake never had
(a fresh lake, a job that never committed) is ``None`` and stays absent
from the JSON; optional values inside a section likewise.

Adding a section is one dataclass with ``to_json``/``from_json`` and one
field of ``LakeState`` (and one entry in ``_SECTIONS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple


class QueueId(NamedTuple):
    """A message queue: (topic, queue id)."""

    topic: str
    queue_id: int

    def key(self) -> str:
        """The queue as a JSON object key: ``"<topic>\\t<queue id>"`` (topics never contain a tab)."""
        return f"{self.topic}\t{self.queue_id}"

    @classmethod
    def parse(cls, key: str) -> QueueId:
        """The inverse of ``key``."""
        topic, _, queue = key.rpartition("\t")
        return cls(topic, int(queue))


def _queue_map_from_json(data: Mapping[str, Any]) -> dict[QueueId, int]:
    return {QueueId.parse(key): int(value) for key, value in data.items()}


def _queue_map_to_json(values: Mapping[QueueId, int]) -> dict[str, int]:
    return {QueueId(*queue).key(): value for queue, value in values.items()}


def _optional(data: Mapping[str, Any], **values: Any) -> dict[str, Any]:
    """``data`` plus the ``values`` that are set (an unset optional value is absent from the JSON)."""
    return {**data, **{k: v for k, v in values.items() if v is not None}}


@dataclass(frozen=True)
class TopicTotals:
    """Messages and commitlog bytes a topic has had written (never decreases: expiry does not count)."""

    messages: int = 0
    bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {"messages": self.messages, "bytes": self.bytes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopicTotals:
        return cls(messages=data["messages"], bytes=data["bytes"])


@dataclass(frozen=True)
class CommitlogState:
    """Where the commitlog ends and what the next batch continues from (ingest, import-store).

    ``queue_heads``: next queue offset of each queue; ``rr_counters``: the
    round-robin position per topic for messages without queue id or keys;
    ``segment_size``: the size the commitlog was written with (absent after
    an import until the first ingest); ``physic_msg_timestamp``: the
    checkpoint's store time of the last message written.
    """

    next_offset: int = 0
    queue_heads: Mapping[QueueId, int] = field(default_factory=dict)
    rr_counters: Mapping[str, int] = field(default_factory=dict)
    topics: Mapping[str, TopicTotals] = field(default_factory=dict)
    segment_size: int | None = None
    physic_msg_timestamp: int | None = None

    def to_json(self) -> dict[str, Any]:
        heads: dict[str, dict[str, int]] = {}
        for (topic, queue), head in sorted(self.queue_heads.items()):
            heads.setdefault(topic, {})[str(queue)] = head
        return _optional(
            {
                "next_offset": self.next_offset,
                "queue_heads": heads,
                "rr_counters": dict(self.rr_counters),
                "topics": {name: totals.to_json() for name, totals in self.topics.items()},
            },
            segment_size=self.segment_size,
            physic_msg_timestamp=self.physic_msg_timestamp,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommitlogState:
        return cls(
            next_offset=int(data.get("next_offset", 0)),
            queue_heads={
                QueueId(topic, int(queue)): int(head)
                for topic, queues in data.get("queue_heads", {}).items()
                for queue, head in queues.items()
            },
            rr_counters=dict(data.get("rr_counters", {})),
            topics={name: TopicTotals.from_json(totals) for name, totals in data.get("topics", {}).items()},
            segment_size=data.get("segment_size"),
            physic_msg_timestamp=data.get("physic_msg_timestamp"),
        )


@dataclass(frozen=True)
class ReputState:
    """How far reput dispatched the commitlog, and the checkpoint's CQ and index times."""

    dispatched_offset: int = 0
    logics_msg_timestamp: int | None = None
    index_msg_timestamp: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _optional(
            {"dispatched_offset": self.dispatched_offset},
            logics_msg_timestamp=self.logics_msg_timestamp,
            index_msg_timestamp=self.index_msg_timestamp,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReputState:
        return cls(
            dispatched_offset=int(data.get("dispatched_offset", 0)),
            logics_msg_timestamp=data.get("logics_msg_timestamp"),
            index_msg_timestamp=data.get("index_msg_timestamp"),
        )


@dataclass(frozen=True)
class CompactionState:
    """The commitlog offset each COMPACTION topic is compacted up to."""

    positions: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"positions": dict(self.positions)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompactionState:
        return cls(positions={name: int(p) for name, p in data.get("positions", {}).items()})


@dataclass(frozen=True)
class ExpireState:
    """What the last applied expire run decided.

    ``applied``: the inputs of that run (a run with the same inputs changes
    nothing; absent in lakes that only recorded ``last_now``);
    ``queue_min_offsets``: each queue's min offset as corrected by expiry
    (``correctMinOffset``); ``manual_runs_left``: manual deletes still due.
    """

    last_now: int | None = None
    disk_full: bool = False
    disk_usage: float | None = None
    manual_runs_left: int = 0
    queue_min_offsets: Mapping[QueueId, int] = field(default_factory=dict)
    applied: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return _optional(
            {
                "disk_full": self.disk_full,
                "manual_runs_left": self.manual_runs_left,
                "queue_min_offsets": _queue_map_to_json(self.queue_min_offsets),
            },
            last_now=self.last_now,
            disk_usage=self.disk_usage,
            applied=None if self.applied is None else dict(self.applied),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExpireState:
        return cls(
            last_now=data.get("last_now"),
            disk_full=bool(data.get("disk_full", False)),
            disk_usage=data.get("disk_usage"),
            manual_runs_left=int(data.get("manual_runs_left", 0)),
            queue_min_offsets=_queue_map_from_json(data.get("queue_min_offsets", {})),
            applied=data.get("applied"),
        )


class SegmentHole(NamedTuple):
    """Bytes import-store rejected before a segment's last message (no broker file can skip bytes)."""

    first_rejected_offset: int
    ranges: int


@dataclass(frozen=True)
class ImportStoreState:
    """The broker store an empty lake was imported from.

    ``files``: (size, modification time in ns) per commitlog file name, so the
    same store imported again changes nothing; ``holes`` per segment name.
    """

    source: str
    files: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    corrupt_records: int = 0
    holes: Mapping[str, SegmentHole] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "files": {name: list(fingerprint) for name, fingerprint in self.files.items()},
            "corrupt_records": self.corrupt_records,
            "holes": {name: hole._asdict() for name, hole in self.holes.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImportStoreState:
        return cls(
            source=data["source"],
            files={name: (int(size), int(mtime)) for name, (size, mtime) in data.get("files", {}).items()},
            corrupt_records=int(data.get("corrupt_records", 0)),
            holes={name: SegmentHole(**hole) for name, hole in data.get("holes", {}).items()},
        )


@dataclass(frozen=True)
class SuiteCheck:
    """The outcome of a quality suite on the table versions it checked."""

    suite: str
    severity: str
    expectations: int
    failed: int
    rows: int | None
    table_versions: Mapping[str, int | None]
    run_id: str

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "severity": self.severity,
            "expectations": self.expectations,
            "failed": self.failed,
            "rows": self.rows,
            "table_versions": dict(self.table_versions),
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SuiteCheck:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class QualityState:
    """The last outcome of each suite (a suite whose tables did not change is not checked again)."""

    checked: Mapping[str, SuiteCheck] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"checked": {name: check.to_json() for name, check in self.checked.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QualityState:
        return cls(checked={name: SuiteCheck.from_json(check) for name, check in data.get("checked", {}).items()})


@dataclass(frozen=True)
class RunRecord:
    """The last committed run of a job: its ledger seq, run id, time and headline metrics."""

    seq: int
    run_id: str
    at: str
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.metrics, "seq": self.seq, "run_id": self.run_id, "at": self.at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        metrics = {k: v for k, v in data.items() if k not in ("seq", "run_id", "at")}
        return cls(seq=data["seq"], run_id=data["run_id"], at=data["at"], metrics=metrics)


def _runs_to_json(runs: Mapping[str, RunRecord]) -> dict[str, Any]:
    return {job: record.to_json() for job, record in runs.items()}


def _runs_from_json(data: Mapping[str, Any]) -> dict[str, RunRecord]:
    return {job: RunRecord.from_json(record) for job, record in data.items()}


# How each section (a ``LakeState`` field, named as its JSON key) is read and written.
class PendingKey(NamedTuple):
    """A group of pending deliveries: a delay level (0: the timer wheel) and the real topic they go to."""

    level: int
    topic: str


@dataclass(frozen=True)
class PendingGroup:
    """How many deliveries of a group are not yet due, and when the first of them is."""

    count: int
    next_due: int


@dataclass(frozen=True)
class ScheduleState:
    """Delay-level and timer deliveries (ingest): what is delivered and what is pending.

    ``delivered_until``: the last ingest's clock (epoch ms); every record on
    ``SCHEDULE_TOPIC_XXXX`` or the timer topic due at or before it has had its
    delivery appended, and none due after it has. ``pending_from``: a
    physical offset at or below every pending record (no segment before it
    holds one); ``None`` when nothing is pending. ``pending``: the pending
    deliveries per (level, real topic). ``delay_offsets``: per delay level,
    the ``SCHEDULE_TOPIC_XXXX`` queue offset of its next delivery (the
    broker's ``delayOffset.json``; the queue's head when none is pending).
    """

    delivered_until: int | None = None
    pending_from: int | None = None
    pending: Mapping[PendingKey, PendingGroup] = field(default_factory=dict)
    delay_offsets: Mapping[int, int] = field(default_factory=dict)

    @property
    def pending_count(self) -> int:
        return sum(group.count for group in self.pending.values())

    def to_json(self) -> dict[str, Any]:
        return _optional(
            {
                "pending": [
                    {"level": key.level, "topic": key.topic, "count": group.count, "next_due": group.next_due}
                    for key, group in sorted(self.pending.items())
                ],
                "delay_offsets": {str(level): offset for level, offset in sorted(self.delay_offsets.items())},
            },
            delivered_until=self.delivered_until,
            pending_from=self.pending_from,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleState:
        return cls(
            delivered_until=data.get("delivered_until"),
            pending_from=data.get("pending_from"),
            pending={
                PendingKey(int(row["level"]), row["topic"]): PendingGroup(int(row["count"]), int(row["next_due"]))
                for row in data.get("pending", [])
            },
            delay_offsets={int(level): int(offset) for level, offset in data.get("delay_offsets", {}).items()},
        )


_SECTIONS: dict[str, tuple[Any, Any]] = {
    "commitlog": (CommitlogState.from_json, CommitlogState.to_json),
    "reput": (ReputState.from_json, ReputState.to_json),
    "compaction": (CompactionState.from_json, CompactionState.to_json),
    "expire": (ExpireState.from_json, ExpireState.to_json),
    "import_store": (ImportStoreState.from_json, ImportStoreState.to_json),
    "schedule": (ScheduleState.from_json, ScheduleState.to_json),
    "quality": (QualityState.from_json, QualityState.to_json),
    "runs": (_runs_from_json, _runs_to_json),
}


@dataclass(frozen=True)
class LakeState:
    """The whole lake state; ``None`` (or no runs) where a lake has no such section."""

    commitlog: CommitlogState | None = None
    reput: ReputState | None = None
    compaction: CompactionState | None = None
    expire: ExpireState | None = None
    import_store: ImportStoreState | None = None
    schedule: ScheduleState | None = None
    quality: QualityState | None = None
    runs: Mapping[str, RunRecord] = field(default_factory=dict)

    @property
    def next_offset(self) -> int:
        """The commitlog's end (0 for an empty lake)."""
        return self.commitlog.next_offset if self.commitlog else 0

    @property
    def dispatched_offset(self) -> int:
        """How far reput dispatched (0 before the first reput)."""
        return self.reput.dispatched_offset if self.reput else 0

    @property
    def queue_min_offsets(self) -> Mapping[QueueId, int]:
        """Queue min offsets as corrected by expiry (empty before the first expiry)."""
        return self.expire.queue_min_offsets if self.expire else {}

    def with_run(self, job: str, record: RunRecord) -> LakeState:
        """This state with ``record`` as the last run of ``job``."""
        return replace(self, runs={**self.runs, job: record})

    def to_json(self) -> dict[str, Any]:
        out = {}
        for name, (_, write) in _SECTIONS.items():
            value = getattr(self, name)
            if value:  # an absent section, or no runs yet
                out[name] = write(value)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LakeState:
        return cls(**{name: read(data[name]) for name, (read, _) in _SECTIONS.items() if name in data})
