"""``export-store`` and ``import-store``: the tables as the files a broker keeps on disk, and back.

Export writes a broker store directory (spec, store layout): ``commitlog/``
segments, ``consumequeue/{topic}/{queueId}/`` files, ``index/`` files, the
compaction store of COMPACTION topics (``compaction/compactionLog`` and
``compaction/compactionCq``, from ``compaction_log`` and ``compaction_cq``:
the broker serves those topics from it), the ``checkpoint`` and ``config/``
JSON, no ``abort`` file (a clean shutdown). Scheduled messages go on where
the lake left them: ``config/delayOffset.json`` holds each delay level's
progress, ``config/timercheck`` the timer queue offset a broker's (empty)
timer wheel starts from; no ``timerlog``/``timerwheel`` files.
Every file is written by a Spark task straight from the Parquet files the
Delta log lists for it (one task per commitlog segment), never assembled
on the driver, and gets the modification time the broker's file would
have: when the broker last wrote it (``formats.retention.segment_files``
for segments; the store time of the last unit of a CQ file and of the last
entry of an index file). The directory appears whole: it is written next to the
target and renamed into place at the end.

Import walks a broker's commitlog files, one Spark task per file, into
``commitlog`` and ``segments`` of an empty lake (corrupt records go to
``rejected`` with their file and offset); ``reput`` then rebuilds the
consume queues and index files. The lake's schedule state comes from the
records: what has its delivery is delivered, the rest pending.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pyarrow as pa
from pyspark.rdd import RDD
from pyspark.serializers import UTF8Deserializer
from pyspark.sql import functions as F

from rmqlake.config import Settings
from rmqlake.errors import ConfigError, InputError, LakeStateError, UsageError
from rmqlake.formats import retention as R
from rmqlake.formats import store as S
from rmqlake.formats.compaction import compaction_log_file_size, sparse_cq_file_size
from rmqlake.formats.consumequeue import SCHEDULE_TOPIC, cq_file_size
from rmqlake.formats.indexfile import index_file_size
from rmqlake.formats.schedule import TIMER_TOPIC
from rmqlake.formats.topic import topic_error
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table, stage_dataframe
from rmqlake.lake.state import (
    CommitlogState,
    ImportStoreState,
    QueueId,
    ReputState,
    SegmentHole,
    TopicTotals,
)
from rmqlake.lake.tables import COMMITLOG, SEGMENTS
from rmqlake.progress import Stages, in_another_thread
from rmqlake.session import require_jvm_jar, use_jvm_job
from rmqlake.steps.runner import StepRun, run_step
from rmqlake.store import (
    IMPORTED,
    write_compaction_queue,
    write_cq_file,
    write_index_file,
    write_segment,
)
from rmqlake.store.imports import (
    DECODE_JOB,
    ImportTarget,
    import_decoded,
    import_files,
    import_task,
    jvm_can_decode,
    numbered_decode_line,
)
from rmqlake.store.schedule import schedule_progress
from rmqlake.timeutil import parse_timestamp, to_datetime
from rmqlake.transforms.segments import DELETED, update_segments

log = logging.getLogger(__name__)


def export_store(spark, settings: Settings, *, out: str, as_of: str | None = None, overwrite: bool = False) -> dict:
    """Write the lake (as of run ``as_of``: a ledger seq or a timestamp) as a broker store directory at ``out``.

    Returns:
        Metrics: ``out``, ``as_of_seq``, files and bytes per kind
        (``commitlog``, ``consumequeue``, ``index``), ``records``,
        ``compaction_queues``, ``compaction_files``, ``compaction_records``,
        ``seconds``, ``commitlog_mb_per_s``.
    """
    target = Path(out).resolve()
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise UsageError(f"{target} exists and is not empty; choose another --out or pass --overwrite")
    lake = Lake.from_settings(settings, read_only=True)
    entry = _travel(lake, as_of) if as_of else lake.ledger()
    if entry.seq == 0:
        raise LakeStateError(f"the lake at {lake.root} is empty: nothing to export")
    started = time.monotonic()
    stages = Stages(log)
    work = target.parent / f".{target.name}.partial-{secrets.token_hex(4)}"
    work.mkdir(parents=True)
    try:
        with stages("plan the files") as note:
            holes = entry.state.import_store.holes if entry.state.import_store else None
            segment_tasks = _segment_tasks(lake, settings, str(work), holes=holes)
            cq_tasks = _cq_tasks(lake, settings, str(work))
            index_tasks = _index_tasks(lake, settings, str(work))
            compaction_tasks = _compaction_tasks(lake, settings, str(work))
            note.update(segments=len(segment_tasks), cq_files=len(cq_tasks), index_files=len(index_tasks),
                        compaction_queues=len(compaction_tasks))  # fmt: skip
        with stages("write the files") as note:
            written, compacted, cq_written, index_written = _run_writers(
                spark,
                [
                    _Writers(write_segment, segment_tasks, one_per_task=True),
                    _Writers(write_compaction_queue, compaction_tasks, one_per_task=True),
                    _Writers(write_cq_file, cq_tasks),
                    _Writers(write_index_file, index_tasks),
                ],
            )
            note.update(segments=len(written), records=sum(w["records"] for w in written),
                        cq_files=len(cq_written), units=sum(w["units"] for w in cq_written),
                        index_files=len(index_written), entries=sum(w["entries"] for w in index_written),
                        compaction_files=sum(w["files"] for w in compacted))  # fmt: skip
        last_message = max((w["last_offset"] for w in written if w["last_offset"] is not None), default=0)
        with stages("scheduled-message progress") as note:
            scheduled = _schedule_files(spark, lake, settings, entry)
            note.update(levels=len(scheduled.delay_offsets), timer_queue_offset=scheduled.timer_queue_offset)
        _write_metadata(lake, settings, entry, work, last_message_offset=last_message, scheduled=scheduled)
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    seconds = time.monotonic() - started
    data_bytes = sum(w["bytes"] for w in written)
    return {
        "status": "exported",
        "out": str(target),
        "as_of_seq": entry.seq,
        "as_of_run": f"{entry.job} {entry.run_id}",
        "commitlog_files": len(written),
        "commitlog_data_bytes": data_bytes,
        "commitlog_file_bytes": len(written) * settings.store.commitlog_segment_size,
        "records": sum(w["records"] for w in written),
        "consumequeue_files": len(cq_written),
        "index_files": len(index_written),
        "compaction_queues": len(compacted),
        "compaction_files": sum(w["files"] for w in compacted),
        "compaction_records": sum(w["records"] for w in compacted),
        "delay_offsets": {str(level): offset for level, offset in sorted(scheduled.delay_offsets.items())},
        "timer_queue_offset": scheduled.timer_queue_offset,
        "timer_redelivered": scheduled.timer_redelivered,
        "seconds": round(seconds, 3),
        "commitlog_mb_per_s": round(data_bytes / 2**20 / seconds, 2) if seconds else None,
        "stage_seconds": stages.seconds,
    }


def parse_as_of(as_of: str) -> tuple[int | None, int | None]:
    """``--as-of`` as ``(run seq, None)`` or ``(None, epoch ms)``; checked before Spark starts.

    Raises:
        UsageError: neither a run number nor a timestamp.
    """
    text = str(as_of).strip()
    if text.isascii() and text.isdigit() and len(text) < 12:  # a ledger seq; epoch milliseconds have 13 digits
        return int(text), None
    try:
        return None, parse_timestamp(text, option="--as-of")
    except UsageError as exc:
        raise UsageError(f"{exc}; or a run number (its seq in rmqlake status)") from None


def _travel(lake: Lake, as_of: str):
    seq, moment = parse_as_of(as_of)
    return lake.travel_to(seq=seq) if seq is not None else lake.travel_to(at=to_datetime(moment))


def _files_by(lake: Lake, table: str, key) -> dict:
    """The table's data files (URIs) grouped by ``key(DataFile)``."""
    groups: dict = defaultdict(list)
    for data_file in lake.engine.active_files(table):
        groups[key(data_file)].append(f"{lake.uri(table)}/{data_file.path}")
    return groups


def _segment_tasks(
    lake: Lake, settings: Settings, out: str, *, holes: Mapping[str, SegmentHole] | None = None
) -> list[dict]:
    size = settings.store.commitlog_segment_size
    files = _files_by(lake, "commitlog", lambda f: f.partition_values["segment"])
    tasks = []
    holes = holes or {}
    live = [row for row in lake.read_arrow("segments").to_pylist() if row["status"] != DELETED]
    written = {segment.segment: segment.last_modified for segment in R.segment_files(live)}
    for row in live:
        if row["segment"] in holes:
            hole = holes[row["segment"]]
            raise LakeStateError(
                f"segment {row['segment']} has a hole: import-store rejected {hole.ranges} byte range(s) of it, the "
                f"first at offset {hole.first_rejected_offset}, before its last message (see the rejected table); "
                "a broker's commitlog file cannot skip bytes, so it cannot be exported until expiry deletes it"
            )
        if row["end_offset"] - row["start_offset"] > size or (row["status"] != "active" and row["size_bytes"] != size):
            raise ConfigError(
                f"segment {row['segment']} is {row['size_bytes']} bytes but store.commitlog_segment_size is {size}; "
                "export with the segment size the lake was written with"
            )
        tasks.append(
            {
                "segment": row["segment"],
                "start_offset": row["start_offset"],
                "data_end": row["end_offset"] - row["padding_bytes"],
                "sealed": row["status"] != "active",
                "file_size": size,
                "mtime_ms": written[row["segment"]],
                "files": files.get(row["segment"], []),
                "out": out,
            }
        )
    return tasks


def _cq_tasks(lake: Lake, settings: Settings, out: str) -> list[dict]:
    def key(data_file):
        values = data_file.partition_values
        return values["topic"], int(values["queue_id"]), values["cq_file"]

    groups = _files_by(lake, "consumequeue", key)
    for topic in sorted({topic for topic, _, _ in groups}):
        problem = topic_error(topic)
        if problem:  # the topic names a folder of the store: never one outside it
            raise LakeStateError(f"consumequeue of the lake at {lake.root} holds a topic that breaks the topic rules: "
                                 f"{problem}; nothing was exported")  # fmt: skip
    first = {}
    for topic, queue, name in groups:
        first[(topic, queue)] = min(first.get((topic, queue), name), name)
    return [
        {
            "topic": topic,
            "queue_id": queue,
            "cq_file": name,
            "file_size": cq_file_size(settings.store.cq_units_per_file),
            "first_in_queue": first[(topic, queue)] == name,
            "files": uris,
            "out": out,
        }
        for (topic, queue, name), uris in sorted(groups.items())
    ]


def _index_tasks(lake: Lake, settings: Settings, out: str) -> list[dict]:
    store = settings.store
    files = _files_by(lake, "indexfile", lambda f: f.partition_values["index_file"])
    return [
        {
            "index_file": header["index_file"],
            "header": header,
            "slots": store.index_slots,
            "file_size": index_file_size(store.index_slots, store.index_max_entries),
            "files": files.get(header["index_file"], []),
            "out": out,
        }
        for header in lake.read_arrow("indexfile_header").to_pylist()
    ]


def _compaction_tasks(lake: Lake, settings: Settings, out: str) -> list[dict]:
    """One task per compacted queue (``compaction_log`` partition): its compaction log and sparse CQ files."""
    if not (lake.exists("compaction_log") and lake.exists("compaction_cq")):
        return []

    def key(data_file):
        return data_file.partition_values["topic"], int(data_file.partition_values["queue_id"])

    logs, units = _files_by(lake, "compaction_log", key), _files_by(lake, "compaction_cq", key)
    for topic in sorted({topic for topic, _ in logs}):
        problem = topic_error(topic)
        if problem:  # the topic names a folder of the store: never one outside it
            raise LakeStateError(f"compaction_log of the lake at {lake.root} holds a topic that breaks the topic "
                                 f"rules: {problem}; nothing was exported")  # fmt: skip
    cq_size = sparse_cq_file_size(settings.store.compaction_cq_file_size)
    return [
        {
            "topic": topic,
            "queue_id": queue,
            "log_files": uris,
            "cq_files": units.get((topic, queue), []),
            "log_file_size": compaction_log_file_size(settings.store.compaction_cq_file_size),
            "cq_file_size": cq_size,
            "out": out,
        }
        for (topic, queue), uris in sorted(logs.items())
    ]


@dataclass(frozen=True)
class _Writers:
    """Tasks of one kind of store file for ``_run_writers``: ``write(task)`` writes a task's file(s) on an executor.
    ``one_per_task``: each task is a Spark task of its own (a commitlog segment); otherwise the tasks are cut into
    a few Spark tasks."""

    write: Callable[[dict], dict]
    tasks: list[dict]
    one_per_task: bool = False


def _run_writers(spark, kinds: list[_Writers]) -> list[list[dict]]:
    """Run every kind's tasks in one Spark job, the Spark tasks of the first kind first; the results of each kind
    in its tasks' order.

    The files of an export do not depend on one another. In one job, a core whose segment is written (a lake's
    newest segment is small) goes on with the consume queue and index files while the other still writes a 1 GiB
    segment, instead of waiting for it: a job per kind left one core idle for a second of every export.
    """
    context = spark.sparkContext
    groups = _writer_groups(kinds, slices=_writer_slices(spark))
    results: list[list[dict]] = [[] for _ in kinds]
    if not groups:
        return results
    # a group a Spark task: a job's tasks start in partition order, so the first kind's start first
    for number, result in context.parallelize(groups, len(groups)).flatMap(_write_group).collect():
        results[number].append(result)
    return results


def _writer_slices(spark) -> int:
    """Spark tasks a kind of many small tasks is cut into: a few per core, so that uneven runs even out."""
    return max(4 * spark.sparkContext.defaultParallelism, 1)


_WriterGroup = tuple[int, Callable[[dict], dict], list[dict]]  # (kind number, write, tasks): one Spark task


def _writer_groups(kinds: list[_Writers], *, slices: int) -> list[_WriterGroup]:
    """The Spark tasks of ``_run_writers``, in its kinds' order: a task each of a kind ``one_per_task``, at most
    ``slices`` runs of consecutive tasks of any other kind."""
    groups: list[_WriterGroup] = []
    for number, kind in enumerate(kinds):
        count = len(kind.tasks)
        parts = count if kind.one_per_task else min(count, slices)
        for part in range(parts):  # the cut ``parallelize`` makes of a list
            groups.append((number, kind.write, kind.tasks[part * count // parts : (part + 1) * count // parts]))
    return groups


def _write_group(group: _WriterGroup) -> list[tuple[int, dict]]:
    number, write, tasks = group
    return [(number, write(task)) for task in tasks]


def _run_tasks(spark, write, tasks: list[dict], *, one_per_task: bool = False) -> list[dict]:
    """Run ``write`` on every task on the executors; the results (one small dict each) come back."""
    (results,) = _run_writers(spark, [_Writers(write, tasks, one_per_task=one_per_task)])
    return results


@dataclass(frozen=True)
class ScheduleFiles:
    """What a broker reads to go on delivering the exported scheduled messages.

    ``delay_offsets``: per delay level with a ``SCHEDULE_TOPIC_XXXX`` queue,
    the queue offset its delivery goes on from (``config/delayOffset.json``).
    ``timer_queue_offset``: where its timer wheel takes the timer topic's
    records from (``config/timercheck``), ``None`` without a timer queue;
    ``timer_redelivered``: timer records already delivered at or after it.
    """

    delay_offsets: Mapping[int, int]
    timer_queue_offset: int | None = None
    timer_redelivered: int = 0


def _schedule_files(spark, lake: Lake, settings: Settings, entry) -> ScheduleFiles:
    """The delivery progress of the exported run, as a broker keeps it.

    Pending means due after the run's schedule state's ``delivered_until``.
    The delay offsets are in that state when its ingest delivered scheduled
    messages. A lake without that state (its ingest predates deliveries, or
    an import that did not compute it) gets them from the records of the
    exported version: the first record of each level without its delivery,
    so that a broker delivers what the lake did not and nothing twice. The
    timer queue offset always comes from the records (the first pending
    timer's queue offset): a broker's wheel takes that queue in order, so
    delivered timers stored after the first pending one are delivered again.
    """
    heads = entry.state.commitlog.queue_heads if entry.state.commitlog else {}
    levels = {queue.queue_id + 1 for queue in heads if queue.topic == SCHEDULE_TOPIC}
    schedule = entry.state.schedule
    known = schedule.delay_offsets if schedule else {}
    timers = QueueId(TIMER_TOPIC, 0) in heads
    if levels <= set(known) and not timers:
        return ScheduleFiles({level: known[level] for level in sorted(levels)})
    clock = schedule.delivered_until if schedule else entry.state.commitlog.physic_msg_timestamp
    progress = schedule_progress(
        read_table(spark, lake, "commitlog"), rules=settings.schedule_rules(), clock=clock, queue_heads=heads
    )
    offsets = (
        {level: known[level] for level in sorted(levels)} if levels <= set(known) else progress.state.delay_offsets
    )
    if progress.timer_redelivered:
        log.warning(
            "%d timer message(s) delivered in the lake are stored after a pending one: a broker started on the "
            "export takes the timer queue from the first pending one on and delivers them again",
            progress.timer_redelivered,
        )
    return ScheduleFiles(dict(offsets), progress.timer_queue_offset, progress.timer_redelivered)


def _write_metadata(
    lake: Lake, settings: Settings, entry, out: Path, *, last_message_offset: int, scheduled: ScheduleFiles
) -> None:
    """``checkpoint`` and ``config/``: small, from the ledger state and small tables (driver side).

    The checkpoint is what a master (not in controller mode) holds after it
    started on these files: recovery sets ``confirmPhyOffset`` to the offset
    of the last valid message (``CommitLog.recoverNormally``:
    ``setConfirmOffset(lastValidMsgPhyOffset)``, the record's start), and
    ``masterFlushedOffset`` is only written by a slave.
    """
    commitlog = entry.state.commitlog or CommitlogState()
    reput = entry.state.reput or ReputState()
    checkpoint = S.Checkpoint(
        physic_msg_timestamp=int(commitlog.physic_msg_timestamp or 0),
        logics_msg_timestamp=int(reput.logics_msg_timestamp or 0),
        index_msg_timestamp=int(reput.index_msg_timestamp or 0),
        master_flushed_offset=0,
        confirm_phy_offset=last_message_offset,
    )
    (out / "checkpoint").write_bytes(checkpoint.encode())
    config = out / "config"
    config.mkdir()
    stamp = int(entry.committed_at.timestamp() * 1000) if entry.committed_at else 0
    topics = {name: (t.queues, t.cleanup_policy) for name, t in settings.topics.items()}
    for name in commitlog.topics:
        if name not in topics:  # auto-created by the first message, as the broker does
            topics[name] = (settings.broker.default_topic_queue_nums, "DELETE")
    (config / "topics.json").write_text(S.topics_json(topics, data_version=entry.seq, timestamp=stamp))
    latest: dict[tuple[str, str, int], tuple] = {}
    if lake.exists("consumer_offsets"):
        for row in lake.read_arrow("consumer_offsets").to_pylist():
            key = (row["topic"], row["group"], row["queue_id"])
            if key not in latest or row["as_of"] > latest[key][0]:
                latest[key] = (row["as_of"], row["offset"])
    offsets: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    for (topic, group, queue), (_, offset) in latest.items():
        offsets[(topic, group)][queue] = offset
    (config / "consumerOffset.json").write_text(
        S.consumer_offsets_json(offsets, data_version=entry.seq, timestamp=stamp)
    )
    # a broker with autoCreateSubscriptionGroup=false serves only the groups it knows
    groups = {group for _, group in offsets}
    (config / "subscriptionGroup.json").write_text(
        S.subscription_groups_json(groups, data_version=entry.seq, timestamp=stamp)
    )
    (config / "delayOffset.json").write_text(
        S.delay_offsets_json(scheduled.delay_offsets, data_version=entry.seq, timestamp=stamp)
    )
    if scheduled.timer_queue_offset is not None:  # without it a broker's wheel takes every timer record again
        (config / "timercheck").write_bytes(S.timer_checkpoint(scheduled.timer_queue_offset, data_version=entry.seq))


# -- import ------------------------------------------------------------------------------------

# A commitlog file is read by tasks of about this many bytes: a broker's 1 GiB file is most of a store, and one
# task for it would leave every other core idle. (Smaller pieces would pay ~50 ms of task start each.)
IMPORT_PIECE_BYTES = 64 << 20
_IMPORT_JOBS = 8
_CORRUPT_DIR = "_corrupt"  # hidden from the staged files that are committed
_DECODED_DIR = "_decoded"  # likewise


def store_segment_names(store_dir: str, *, segment_size: int) -> list[str]:
    """The commitlog file names of the broker store at ``store_dir``, checked without Spark.

    Raises:
        InputError: no ``commitlog/`` folder, or no segment file in it.
        ConfigError: a segment file whose size or name does not fit ``segment_size``.
    """
    root = Path(store_dir).resolve()
    folder = root / "commitlog"
    if not folder.is_dir():
        raise InputError(f"{root}: no commitlog/ folder; is this a broker store directory?")
    names = sorted(n for n in os.listdir(folder) if n.isascii() and n.isdigit() and len(n) == 20)
    if not names:
        raise InputError(f"{folder}: no commitlog segment files (20-digit names)")
    for name in names:
        actual = os.path.getsize(folder / name)
        if actual != segment_size or int(name) % segment_size:
            raise ConfigError(
                f"{folder / name} is {actual} bytes but store.commitlog_segment_size is {segment_size}; "
                f"pass --set store.commitlog_segment_size={actual}"
            )
    return names


def check_import_store(settings: Settings, *, store_dir: str) -> None:
    """What import-store can check without Spark: the store's commitlog files and delay offsets, and the JVM
    decoder's jar when ``import_store.reader`` is "jvm".

    Raises:
        InputError, ConfigError: as ``store_segment_names`` and ``read_delay_offsets`` raise them, or without
            the jar.
    """
    store_segment_names(store_dir, segment_size=settings.store.commitlog_segment_size)
    read_delay_offsets(store_dir)
    if settings.import_store.reader == "jvm":
        require_jvm_jar(settings.spark, setting="import_store.reader")


def use_jvm_reader(spark, settings: Settings) -> bool:
    """Whether the JVM decoder reads the store's clean records (``import_store.reader``): "auto" uses it where its
    class is loaded.

    Raises:
        ConfigError: ``import_store.reader`` is "jvm" but the session lacks the class (spark-submit without the jar).
    """
    return use_jvm_job(spark, settings.spark, setting="import_store.reader", choice=settings.import_store.reader,
                       job_class=DECODE_JOB, otherwise="records are read in Python")  # fmt: skip


def import_store(spark, settings: Settings, *, store_dir: str) -> dict:
    """Read the commitlog files of a broker store at ``store_dir`` into an empty lake.

    Returns:
        Metrics: ``files``, ``messages``, ``corrupt_records`` (also in
        ``rejected``: file, offset, reason), ``start_offset``, ``end_offset``,
        ``status`` (``imported``, or ``already_imported`` for the same store),
        ``records_decoded_in_jvm`` (``import_store.reader``); and the stable
        ones (``rows_in`` records read, ``rows_out`` messages imported,
        ``rejected`` corrupt records).
    """
    root = Path(store_dir).resolve()
    folder = root / "commitlog"
    names = store_segment_names(store_dir, segment_size=settings.store.commitlog_segment_size)
    delay_offsets = read_delay_offsets(store_dir)
    # size and modification time: every segment file has the segment size, so a rewrite shows in its mtime
    fingerprint = {name: (os.stat(folder / name).st_size, os.stat(folder / name).st_mtime_ns) for name in names}

    def work(step: StepRun) -> dict:
        return _import(spark, settings, step, root, names, fingerprint, delay_offsets)

    return run_step("import-store", settings, work)


def read_delay_offsets(store_dir: str) -> dict[int, int] | None:
    """The broker's ``config/delayOffset.json`` of the store at ``store_dir``; ``None`` when it has none.

    An empty file counts as none (a broker then reads ``delayOffset.json.bak``,
    which is read here the same way).

    Raises:
        InputError: a file that is not a delay offset table, naming the file and what is wrong.
    """
    for path in (Path(store_dir).resolve() / "config" / name for name in ("delayOffset.json", "delayOffset.json.bak")):
        if not path.is_file() or path.stat().st_size == 0:
            continue
        if path.stat().st_size > S.MAX_CONFIG_BYTES:
            raise InputError(f"{path}: {path.stat().st_size} bytes, more than any delay offset table needs")
        try:
            return S.parse_delay_offsets(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except ValueError as exc:
            raise InputError(f"{path}: not a delay offset table: {exc}") from None
    return None


def _import(spark, settings: Settings, step: StepRun, root: Path, names, fingerprint, delay_offsets) -> dict:
    run = step.run
    previous = run.state.import_store
    if previous is not None and previous.source == str(root) and previous.files == fingerprint:
        return {"status": "already_imported", "source": str(root), "table_versions": {}}
    if run.state.next_offset > 0:
        raise LakeStateError(
            f"the lake at {run.lake.root} already holds a commitlog; import-store needs an empty lake (--lake)"
        )
    stages = Stages(log)
    files = [(str(root / "commitlog" / name), int(name), name == names[-1]) for name in names]
    with stages("read commitlog files") as note:
        commitlog_dir = run.staging_dir("commitlog")
        target = ImportTarget(
            lake_root=run.lake.root,
            storage_options=dict(settings.lake.storage_options),
            commitlog_dir=commitlog_dir,
            corrupt_dir=f"{commitlog_dir}/{_CORRUPT_DIR}",
            batch_id=run.run_id,
            decoded_dir=f"{commitlog_dir}/{_DECODED_DIR}",
        )
        in_jvm = use_jvm_reader(spark, settings) and jvm_can_decode(files, target)
        run_pieces = in_another_thread(partial(_read_pieces, spark, target=target, jvm=in_jvm))
        with ThreadPoolExecutor(max_workers=_IMPORT_JOBS) as jobs:  # a Spark job per submission, several at once
            read = import_files(
                files,
                target=target,
                piece_bytes=IMPORT_PIECE_BYTES,
                submit=lambda tasks: jobs.submit(run_pieces, tasks),
            )
        run.collect_staged("commitlog")
        run.lake.storage.delete_dir(target.decoded_dir)  # what a failed Python task left
        corrupt_count = sum(r["corrupt"] for r in read)
        blanks = {os.path.basename(r["path"]) for r in read if r["blank"]}
        decoded = sum(r["decoded"] for r in read)
        note.update(files=len(files), pieces=len(read), corrupt=corrupt_count, decoded_in_jvm=decoded)
    with stages("totals") as note:  # from the tasks' per-queue totals: the staged messages are not read back
        totals = _fold_totals([queue for r in read for queue in r["queues"]])
        note.update(messages=totals["messages"])
    first_rejected: dict[str, tuple[int, int]] = {}
    if corrupt_count:
        with stages("corrupt ranges"):  # only a store with damaged bytes has them
            corrupt = spark.read.schema(IMPORTED.spark_schema).parquet(
                run.staging_uri("commitlog") + f"/{_CORRUPT_DIR}"
            )
            for row in corrupt.select("corrupt_reason").limit(20).collect():  # a sample for the log
                log.error("corrupt record: %s", row["corrupt_reason"])
            stage_dataframe(
                run,
                corrupt.select(
                    F.lit(run.run_id).alias("batch_id"),
                    "source_file",
                    "source_line",
                    F.concat(
                        F.lit("bytes "),
                        F.col("physical_offset").cast("string"),
                        F.lit("-"),
                        (F.col("physical_offset") + F.col("total_size")).cast("string"),
                    ).alias("raw"),
                    F.col("corrupt_reason").alias("reason"),
                    F.current_timestamp().alias("rejected_at"),
                ),
                "rejected",
            )
            first_rejected = {
                r["segment"]: (r["first"], r["ranges"])
                for r in corrupt.groupBy("segment")
                .agg(F.min("physical_offset").alias("first"), F.count(F.lit(1)).alias("ranges"))
                .collect()
            }  # one row per damaged segment
    with stages("schedule state"):
        schedule = _imported_schedule(lambda: _staged_messages(spark, run), settings, totals, delay_offsets)
    if not totals["messages"]:
        raise InputError(f"{root}/commitlog holds no readable message")
    size = settings.store.commitlog_segment_size
    per_segment = totals["segments"]
    last = max(per_segment, key=lambda s: s["data_end"])
    end_offset = last["data_end"]
    if last["segment"] in blanks:  # the newest file ends with its blank: writing goes on in the next file
        end_offset = int(last["segment"]) + size
    segment_rows = update_segments([], per_segment, segment_size=size, end_offset=end_offset)
    run.stage_arrow("segments", pa.Table.from_pylist(segment_rows, schema=SEGMENTS.arrow_schema), mode="overwrite")
    commitlog = replace(
        run.state.commitlog or CommitlogState(),
        next_offset=end_offset,
        queue_heads=totals["queue_heads"],
        rr_counters={},
        topics=totals["topics"],
        physic_msg_timestamp=last["last_store_timestamp"],
    )
    # rejected bytes before a segment's last message: a hole no broker file can have (export refuses it)
    holes = {
        s["segment"]: SegmentHole(
            first_rejected_offset=first_rejected[s["segment"]][0], ranges=first_rejected[s["segment"]][1]
        )
        for s in per_segment
        if s["segment"] in first_rejected and first_rejected[s["segment"]][0] < s["data_end"]
    }
    imported = ImportStoreState(source=str(root), files=fingerprint, corrupt_records=corrupt_count, holes=holes)
    metrics = {
        "status": "imported",
        "source": str(root),
        "files": len(files),
        "messages": totals["messages"],
        "corrupt_records": corrupt_count,
        "start_offset": int(names[0]),
        "end_offset": end_offset,
        "segments": len(segment_rows),
        "rows_in": totals["messages"] + corrupt_count,
        "rows_out": totals["messages"],
        "rejected": corrupt_count,
        "records_decoded_in_jvm": decoded,  # the others went through the Python reader
        **schedule["metrics"],
    }
    state = replace(run.state, commitlog=commitlog, import_store=imported, schedule=schedule["state"])
    versions = step.commit(state, record=metrics)
    return {**metrics, "table_versions": versions, "seconds": step.seconds(), "stage_seconds": stages.seconds}


def _read_pieces(spark, tasks: list[dict], *, target: ImportTarget, jvm: bool) -> list[dict]:
    """Import the pieces of ``tasks``: with ``jvm``, the JVM decoder reads each piece's run of clean records and
    Python writes the piece, in the same Spark task (``_import_decoded_in_jvm``).

    A submission of many pieces (the small files of a store) is cut into a few runs of pieces, a Spark task each:
    a Spark task costs ~10-25 ms however little it does, which a 4 MiB file paid.
    """
    if not jvm:
        return _run_tasks(spark, partial(import_task, target=target), tasks)
    results = _import_decoded_in_jvm(spark, tasks, target=target, slices=min(len(tasks), _writer_slices(spark)))
    for result in results:
        if result.get("jvm_gave_up"):
            where = f"{result['path']} (piece {result['number']})"
            log.warning("the JVM decoder left %s to Python: %s", where, result["jvm_gave_up"])
    return results


def _import_decoded_in_jvm(spark, tasks: list[dict], *, target: ImportTarget, slices: int) -> list[dict]:
    """``import_decoded`` over ``tasks`` of ``import_files``: one job of ``slices`` Spark tasks, each decoding a
    run of the pieces in the JVM (``StoreRecords.decoding``) and handing each piece's answer to Python, which
    writes the piece.

    One job, not a decoder job then a writer job: a piece is written as soon as its records are decoded, on the
    core that decoded them while they are in its cache, and a retried task decodes its pieces again.
    """
    lines = "\n".join(numbered_decode_line(task, target) for task in tasks)
    answers = RDD(spark._jvm.rmqlake.jvm.StoreRecords.decoding(spark._jsc, lines, slices), spark.sparkContext,
                  UTF8Deserializer())  # fmt: skip
    by_number = {task["number"]: task for task in tasks}
    return answers.map(partial(import_decoded, tasks=by_number, target=target)).collect()


def _staged_messages(spark, run):
    """The messages this run staged, as a Spark frame."""
    return (
        spark.read.schema(COMMITLOG.spark_schema)
        .option("basePath", run.staging_uri("commitlog"))
        .parquet(run.staging_uri("commitlog"))
    )


def _imported_schedule(staged_messages, settings: Settings, totals: dict, delay_offsets: dict[int, int] | None) -> dict:
    """The schedule state of an imported store (``None`` without scheduled messages) and its metrics.

    ``staged_messages()`` gives the imported messages as a Spark frame (called only when there are scheduled
    messages).

    The records decide (``store.schedule.schedule_progress``): what has its
    delivery was delivered, the rest is pending and the next ingest delivers
    it when due. The broker's ``delayOffset.json`` says the same per level
    unless the broker stopped before it wrote its last progress (it then
    delivers those records again after a restart) or skipped a record it
    could not deliver; a level where the file differs is logged and counted.
    """
    clock = max((s["last_store_timestamp"] for s in totals["segments"]), default=None)
    if not any(queue.topic in (SCHEDULE_TOPIC, TIMER_TOPIC) for queue in totals["queue_heads"]):
        return {"state": None, "metrics": {"schedule_pending": 0}}
    progress = schedule_progress(
        staged_messages(), rules=settings.schedule_rules(), clock=clock, queue_heads=totals["queue_heads"]
    )
    computed = progress.state.delay_offsets
    differing = sorted(
        level for level in computed if delay_offsets is not None and delay_offsets.get(level, 0) != computed[level]
    )
    for level in differing:
        log.warning(
            "delay level %d: the broker's delayOffset.json says queue offset %d, the records %d (the first "
            "without its delivery); the records are kept",
            level,
            delay_offsets.get(level, 0),
            computed[level],
        )
    if progress.redelivered:
        log.warning(
            "%d scheduled message(s) the broker delivered are due after one it had not delivered: the next "
            "ingest delivers them again, so that the undelivered one is not lost",
            progress.redelivered,
        )
    if progress.unreadable:
        log.warning(
            "%d scheduled message(s) carry no deliverable REAL_TOPIC/REAL_QID or TIMER_OUT_MS: never delivered",
            progress.unreadable,
        )
    metrics = {
        "schedule_delivered": progress.delivered,
        "schedule_pending": progress.state.pending_count,
        "schedule_redelivered": progress.redelivered,
        "schedule_unreadable": progress.unreadable,
        "delay_offsets_file": delay_offsets is not None,
        "delay_offsets_differing": differing,
    }
    return {"state": progress.state, "metrics": metrics}


def _fold_totals(groups) -> dict:
    """Per segment (count, end of data, first/last store time: ``segment_aggregates``' rows), per queue head
    and per topic totals, from totals per segment and queue (several rows of one segment and queue add up)."""
    segments: dict[str, dict] = {}
    queues: dict[QueueId, list] = {}
    for g in sorted(groups, key=lambda r: (r["segment"], r["topic"], r["queue_id"])):
        s = segments.setdefault(g["segment"], {"segment": g["segment"], "message_count": 0, "data_end": 0,
                                               "first": None, "last": None})  # fmt: skip
        s["message_count"] += g["n"]
        s["data_end"] = max(s["data_end"], g["data_end"])
        if s["first"] is None or g["first_offset"] < s["first"][0]:
            s["first"] = (g["first_offset"], g["first_store_timestamp"])
        if s["last"] is None or g["last_offset"] > s["last"][0]:
            s["last"] = (g["last_offset"], g["last_store_timestamp"])
        queue = queues.setdefault(QueueId(g["topic"], g["queue_id"]), [None, 0, 0])
        if g["last_dispatched"] is not None:
            queue[0] = g["last_dispatched"] if queue[0] is None else max(queue[0], g["last_dispatched"])
        queue[1] += g["n"]
        queue[2] += g["b"]
    topics: dict[str, TopicTotals] = {}
    for queue, (_, count, size) in queues.items():
        seen = topics.get(queue.topic, TopicTotals(messages=0, bytes=0))
        topics[queue.topic] = TopicTotals(messages=seen.messages + count, bytes=seen.bytes + size)
    per_segment = [
        {"segment": s["segment"], "message_count": s["message_count"], "data_end": s["data_end"],
         "first_store_timestamp": s["first"][1], "last_store_timestamp": s["last"][1]}
        for s in segments.values()
    ]  # fmt: skip
    return {
        "messages": sum(s["message_count"] for s in per_segment),
        "segments": per_segment,
        "queue_heads": {queue: last + 1 for queue, (last, _, _) in queues.items() if last is not None},
        "topics": topics,
    }
