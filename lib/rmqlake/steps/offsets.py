"""Consumer offsets: load snapshots into ``consumer_offsets``; lag per group, topic and queue.

Neither needs Spark: snapshots are small (groups × queues), and queue
bounds come from the consumequeue table's file statistics.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from rmqlake.config import Settings
from rmqlake.consumer_offsets import parse_snapshot, snapshot_time
from rmqlake.errors import InputError, UsageError
from rmqlake.lake import Lake
from rmqlake.lake.state import LakeState
from rmqlake.lake.tables import CONSUMER_OFFSETS
from rmqlake.query import store_times
from rmqlake.steps.runner import StepRun, run_step
from rmqlake.timeutil import epoch_ms, iso

log = logging.getLogger(__name__)


def load_offsets(settings: Settings, *, input_path: str, as_of: int | None = None) -> dict:
    """Append the snapshots at ``input_path`` (a file or a folder of ``*.json``) to ``consumer_offsets``.

    Rows already present for the same snapshot time, group, topic and queue
    are skipped, so loading a snapshot twice changes nothing.

    Returns:
        Metrics: the stable ones (``rows_in`` snapshot rows read, ``rows_out``
        rows appended), ``files``, ``rows``, ``rows_skipped``, ``status``.
    """
    started = time.monotonic()
    snapshots = []
    for path in snapshot_files(input_path):
        moment = as_of if as_of is not None else snapshot_time(path)
        if moment is None:
            raise UsageError(
                f"{path}: no snapshot time in the file name (e.g. consumerOffset-20261121T040000Z.json); pass --as-of"
            )
        with open(path, "rb") as handle:
            rows = parse_snapshot(handle.read(), path=path)
        snapshots.append((path, moment, rows))

    def work(step: StepRun) -> dict:
        return _append(step, snapshots)

    return run_step("offsets", settings, work, started=started)


def snapshot_files(input_path: str) -> list[str]:
    """The snapshot files at ``input_path`` (a file, or the ``*.json`` files under a folder), each readable.

    Raises:
        InputError: nothing there, or a file that cannot be read (a dangling link, no permission).
    """
    if os.path.isdir(input_path):
        found = sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(input_path)
            for name in names
            if name.endswith(".json")
        )
        if not found:
            raise InputError(f"{input_path}: no .json consumer offset snapshots in this folder")
    elif os.path.isfile(input_path) or os.path.islink(input_path):
        found = [input_path]
    else:
        raise InputError(f"{input_path}: no such file or folder")
    for path in found:
        if os.path.islink(path) and not os.path.exists(path):
            raise InputError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist")
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise InputError(f"{path} is not a readable file")
    return found


def _append(step: StepRun, snapshots) -> dict:
    lake, run, started = step.lake, step.run, step.started
    existing = lake.read_arrow("consumer_offsets", columns=["topic", "group", "queue_id", "as_of"]).to_pylist()
    seen = {(r["topic"], r["group"], r["queue_id"], epoch_ms(r["as_of"])) for r in existing}
    rows = []
    for path, moment, snapshot in snapshots:
        for row in snapshot:
            key = (row.topic, row.group, row.queue_id, moment)
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                {
                    "topic": row.topic,
                    "group": row.group,
                    "queue_id": row.queue_id,
                    "offset": row.offset,
                    "as_of": datetime.fromtimestamp(moment / 1000, tz=UTC),
                    "source_file": path,
                }
            )
    metrics = {
        "files": len(snapshots),
        "rows": len(rows),
        "rows_skipped": sum(len(s[2]) for s in snapshots) - len(rows),
        "rows_in": sum(len(s[2]) for s in snapshots),
        "rows_out": len(rows),
    }
    if not rows:
        log.info("nothing to load: every row of %d snapshot files is already in consumer_offsets", len(snapshots))
        return {**metrics, "status": "already_loaded", "seconds": round(time.monotonic() - started, 3)}
    run.stage_arrow("consumer_offsets", pa.Table.from_pylist(rows, schema=CONSUMER_OFFSETS.arrow_schema), mode="append")
    versions = step.commit(run.state, record=metrics)
    log.info("loaded %d consumer offsets from %d snapshot files", len(rows), len(snapshots))
    return {**metrics, "status": "loaded", "table_versions": versions, "seconds": round(time.monotonic() - started, 3)}


def lag(settings: Settings, *, group: str | None = None, lake: Lake | None = None) -> dict:
    """Lag per group, topic and queue at the latest snapshot, and total lag per group and topic per snapshot.

    ``lag`` = queue max offset − consumer offset (messages not consumed yet);
    ``expired_unconsumed`` = how many of them expiry already removed (the
    consumer offset is below the queue's min offset). History uses each
    queue's max offset as it was at the snapshot time.

    In time, as mqadmin ``consumerProgress`` and the broker's lag metrics:
    ``last_time`` is the store time of the last message consumed (at consumer
    offset − 1; mqadmin's LastTime, None where it prints N/A: nothing
    consumed, or that message expired); ``next_time`` the store time of the
    oldest message not consumed yet still stored (at the consumer offset, or
    the queue's min offset when expiry removed it); ``lag_ms`` = the
    snapshot's time − ``next_time`` (the broker's lag latency, measured at the
    snapshot instead of now; 0 when nothing is left to consume).
    """
    lake = lake if lake is not None else Lake.from_settings(settings, read_only=True)
    state = lake.state()
    bounds = queue_bounds(lake, state)
    offsets = lake.read_arrow("consumer_offsets").to_pylist()
    if group:
        offsets = [r for r in offsets if r["group"] == group]
    if not offsets:
        return {"latest": [], "history": []}
    by_time: dict[int, list[dict]] = defaultdict(list)
    for row in offsets:
        by_time[epoch_ms(row["as_of"])].append(row)
    latest_time = max(by_time)
    latest_rows = sorted(by_time[latest_time], key=lambda r: (r["group"], r["topic"], r["queue_id"]))
    wanted: dict[tuple[str, int], set[int]] = defaultdict(set)
    for row in latest_rows:
        low, _ = bounds.get((row["topic"], row["queue_id"]), (0, 0))
        wanted[(row["topic"], row["queue_id"])] |= {row["offset"] - 1, max(row["offset"], low)}
    times = store_times(lake, wanted, min_phy_offset=lake.min_physical_offset())
    latest = []
    for row in latest_rows:
        low, high = bounds.get((row["topic"], row["queue_id"]), (0, 0))
        next_time = (
            times.get((row["topic"], row["queue_id"], max(row["offset"], low))) if high > row["offset"] else None
        )
        latest.append(
            {
                "group": row["group"],
                "topic": row["topic"],
                "queue_id": row["queue_id"],
                "consumer_offset": row["offset"],
                "min_offset": low,
                "max_offset": high,
                "lag": max(0, high - row["offset"]),
                "expired_unconsumed": max(0, low - row["offset"]),
                "as_of": iso(latest_time),
                "last_time": iso(times.get((row["topic"], row["queue_id"], row["offset"] - 1))),
                "next_time": iso(next_time),
                "lag_ms": max(0, latest_time - next_time) if next_time is not None else 0,
            }
        )
    history = []
    highs: dict[tuple[str, int, int], int] = {}  # one scan per queue and snapshot, whatever the groups
    for moment in sorted(by_time):
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for row in by_time[moment]:
            queue = (row["topic"], row["queue_id"], moment)
            if queue not in highs:
                highs[queue] = max_offset_at(lake, row["topic"], row["queue_id"], moment)
            high = highs[queue]
            totals[(row["group"], row["topic"])] += max(0, high - row["offset"])
        history += [{"as_of": iso(moment), "group": g, "topic": t, "lag": n} for (g, t), n in sorted(totals.items())]
    return {"latest": latest, "history": history}


def queue_bounds(lake: Lake, state: LakeState) -> dict[tuple[str, int], tuple[int, int]]:
    """(min offset as corrected by expiry, max offset) of every queue, from file statistics."""
    bounds: dict[tuple[str, int], list[int]] = {}
    for stats in lake.file_stats("consumequeue", ["queue_offset"]):
        key = (stats["partition"]["topic"], int(stats["partition"]["queue_id"]))
        low, high = stats["min"]["queue_offset"], stats["max"]["queue_offset"]
        if low is None:
            continue
        current = bounds.setdefault(key, [low, high])
        current[0], current[1] = min(current[0], low), max(current[1], high)
    corrected = state.queue_min_offsets
    return {key: (corrected.get(key, low), high + 1) for key, (low, high) in sorted(bounds.items())}


def max_offset_at(lake: Lake, topic: str, queue: int, moment: int) -> int:
    """The queue's max offset as it was at ``moment``: one past the last unit stored by then."""
    units = lake.scan(
        "consumequeue",
        columns=["queue_offset"],
        partitions=[("topic", "=", topic), ("queue_id", "=", queue)],
        filter=ds.field("store_timestamp") <= moment,
    ).column("queue_offset")
    return pc.max(units).as_py() + 1 if len(units) else 0
