"""The per-run quality report a person reads: one HTML page with plots, next to the Data Docs.

Four views of the store, each computed in Spark down to a few rows per
topic, queue, batch or snapshot (never message rows on the driver), then
drawn with matplotlib:

* disk use per topic over time: bytes of live commitlog records per topic,
  cumulative by store hour;
* consumer lag per group and topic at each consumer-offset snapshot, with
  each queue's max offset as it was at the snapshot time;
* rejected lines per ingest batch, next to the batch's lines;
* the compaction ratio of each COMPACTION topic: messages kept by
  compaction over the topic's live dispatchable messages.
"""

from __future__ import annotations

import html
import logging
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import functions as F

from rmqlake.config import Settings
from rmqlake.formats.retention import HOUR_MS
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table
from rmqlake.timeutil import epoch_ms, iso, to_datetime
from rmqlake.transforms.columns import dispatchable

log = logging.getLogger(__name__)
PLOTS = ("disk_by_topic", "consumer_lag", "rejects_per_batch", "compaction_ratio")


def gather(spark, lake: Lake, settings: Settings) -> dict:
    """The report's figures from the lake's current tables (small aggregates only)."""
    commitlog = read_table(spark, lake, "commitlog")
    hourly = (
        commitlog.groupBy("topic", F.floor(F.col("store_timestamp") / HOUR_MS).alias("hour"))
        .agg(F.sum("total_size").alias("bytes"), F.count(F.lit(1)).alias("messages"))
        .orderBy("hour", "topic")
        .collect()
    )  # topics x hours rows
    disk: dict[str, list[tuple[int, int]]] = defaultdict(list)
    totals: dict[str, int] = defaultdict(int)
    for row in hourly:
        totals[row["topic"]] += row["bytes"]
        disk[row["topic"]].append((row["hour"] * HOUR_MS, totals[row["topic"]]))
    return {
        "disk_by_topic": dict(disk),
        "consumer_lag": _lag_history(spark, lake),
        "rejects_per_batch": _rejects_per_batch(spark, lake),
        "compaction_ratio": _compaction_ratio(spark, lake, settings, commitlog),
    }


def _lag_history(spark, lake: Lake) -> list[dict]:
    """Total lag per (snapshot time, group, topic): each queue's max offset as of the snapshot minus the offset."""
    if not lake.exists("consumer_offsets"):
        return []
    offsets = lake.read_arrow("consumer_offsets", columns=["group", "topic", "queue_id", "offset", "as_of"])
    snapshots = sorted({epoch_ms(t) for t in offsets.column("as_of").to_pylist()})
    if not snapshots:
        return []
    # each unit counts from the first snapshot at or after its store time: the number of snapshots before it
    times = F.array(*[F.lit(t) for t in snapshots])
    index = F.size(F.filter(times, lambda t: t < F.col("store_timestamp")))
    reached = (
        read_table(spark, lake, "consumequeue")
        .groupBy("topic", "queue_id", index.alias("snapshot"))
        .agg((F.max("queue_offset") + 1).alias("max_offset"))
        .collect()
    )  # queues x snapshots rows
    by_queue: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for row in reached:
        by_queue[(row["topic"], row["queue_id"])][row["snapshot"]] = row["max_offset"]
    high_at: dict[tuple[str, int, int], int] = {}
    for queue, reached_at in by_queue.items():
        high = 0
        for position, moment in enumerate(snapshots):
            high = max(high, reached_at.get(position, 0))
            high_at[(*queue, moment)] = high
    lag: dict[tuple[int, str, str], int] = defaultdict(int)
    for row in offsets.to_pylist():
        moment = epoch_ms(row["as_of"])
        high = high_at.get((row["topic"], row["queue_id"], moment), 0)
        lag[(moment, row["group"], row["topic"])] += max(0, high - row["offset"])
    return [{"as_of": m, "group": g, "topic": t, "lag": n} for (m, g, t), n in sorted(lag.items())]


def _rejects_per_batch(spark, lake: Lake) -> list[dict]:
    files = (
        read_table(spark, lake, "ingest_files")
        .groupBy("batch_id")
        .agg(F.sum("lines").alias("lines"), F.min("ingested_at").alias("ingested_at"))
    )
    rejects = read_table(spark, lake, "rejected").groupBy("batch_id").agg(F.count(F.lit(1)).alias("rejected"))
    rows = (
        files.join(rejects, "batch_id", "left")
        .select("batch_id", "lines", "ingested_at", F.coalesce("rejected", F.lit(0)).alias("rejected"))
        .orderBy("ingested_at", "batch_id")
        .collect()
    )  # one row per batch
    return [row.asDict() for row in rows]


def _compaction_ratio(spark, lake: Lake, settings: Settings, commitlog) -> list[dict]:
    topics = settings.compaction_topics()
    if not topics:
        return []
    live = commitlog.where(F.col("topic").isin(topics) & dispatchable()).groupBy("topic").count().collect()
    kept = read_table(spark, lake, "compaction_log").groupBy("topic").count().collect()
    kept_by_topic = {row["topic"]: row["count"] for row in kept}
    return [
        {
            "topic": row["topic"],
            "messages": row["count"],
            "kept": kept_by_topic.get(row["topic"], 0),
            "ratio": kept_by_topic.get(row["topic"], 0) / row["count"] if row["count"] else None,
        }
        for row in sorted(live, key=lambda r: r["topic"])
    ]


def render(data: dict, out_dir: Path, *, run_id: str, suites: list[dict], data_docs: str) -> Path:
    """Write ``out_dir/index.html`` and one PNG per view; returns the page."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = {}
    for name in PLOTS:
        figure, axes = plt.subplots(figsize=(8, 3.6), layout="constrained")
        if _DRAW[name](axes, data[name]):
            figure.savefig(out_dir / f"{name}.png", dpi=96)
            drawn[name] = f"{name}.png"
        plt.close(figure)
    page = out_dir / "index.html"
    page.write_text(_page(data, drawn, run_id=run_id, suites=suites, data_docs=data_docs))
    log.info("quality report: %s (%d plots)", page, len(drawn))
    return page


def _draw_disk(axes, disk: dict) -> bool:
    if not disk:
        return False
    hours = sorted({t for points in disk.values() for t, _ in points})
    topics = sorted(disk)
    stacked = []
    for topic in topics:  # cumulative bytes carried over the hours a topic had no message
        reached, total, column = dict(disk[topic]), 0, []
        for hour in hours:
            total = reached.get(hour, total)
            column.append(total / 2**20)
        stacked.append(column + column[-1:])  # the last hour drawn to its end
    edges = [to_datetime(h) for h in [*hours, hours[-1] + HOUR_MS]]
    axes.stackplot(edges, *stacked, labels=[_short(t) for t in topics], step="post")
    axes.set(title="live commitlog bytes per topic (cumulative by store hour)", ylabel="MiB")
    _legend_and_dates(axes)
    return True


def _draw_lag(axes, lag: list[dict]) -> bool:
    if not lag:
        return False
    series: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in lag:
        series[f"{row['group']} / {row['topic']}"].append((row["as_of"], row["lag"]))
    for label, points in sorted(series.items()):
        axes.plot([to_datetime(t) for t, _ in points], [n for _, n in points], marker="o", label=_short(label))
    axes.set(title="consumer lag at each offset snapshot", ylabel="messages")
    _legend_and_dates(axes)
    return True


def _draw_rejects(axes, batches: list[dict]) -> bool:
    if not batches:
        return False
    positions = range(len(batches))
    axes.bar(positions, [b["rejected"] for b in batches], color="tab:red")
    axes.set_xticks(list(positions), [b["batch_id"][:8] for b in batches], rotation=60, fontsize="x-small")
    axes.set(title="rejected lines per ingest batch", ylabel="lines")
    return True


def _draw_compaction(axes, topics: list[dict]) -> bool:
    if not topics:
        return False
    names = [_short(t["topic"]) for t in topics]
    axes.barh(names, [t["messages"] for t in topics], color="lightgray", label="live messages")
    axes.barh(names, [t["kept"] for t in topics], color="tab:green", label="kept by compaction")
    axes.set(title="compaction ratio (kept / live messages)", xlabel="messages")
    axes.legend(fontsize="small")
    return True


def _legend_and_dates(axes) -> None:
    from matplotlib import dates

    locator = dates.AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator))
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _short(label: str, width: int = 32) -> str:
    """Long names (a %RETRY% topic may have hundreds of characters) keep both ends in legends."""
    return label if len(label) <= width else label[: width // 2 - 1] + "..." + label[-(width // 2 - 2) :]


_DRAW = {
    "disk_by_topic": _draw_disk,
    "consumer_lag": _draw_lag,
    "rejects_per_batch": _draw_rejects,
    "compaction_ratio": _draw_compaction,
}


def _page(data: dict, drawn: dict, *, run_id: str, suites: list[dict], data_docs: str) -> str:
    def table(rows: list[dict], columns: list[str]) -> str:
        if not rows:
            return "<p>(no rows)</p>"
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_text(row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    def plot(name: str, title: str) -> str:
        image = f'<img src="{drawn[name]}" alt="{html.escape(title)}">' if name in drawn else "<p>(no data)</p>"
        return f"<h2>{html.escape(title)}</h2>{image}"

    failed = sum(s["failed"] for s in suites)
    lag_rows = [{**row, "as_of": iso(row["as_of"])} for row in data["consumer_lag"]]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>rmqlake quality run {html.escape(run_id)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:60em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}} th{{background:#eee}}</style></head>
<body><h1>rmqlake quality run {html.escape(run_id)}</h1>
<p>Generated {html.escape(datetime.now(UTC).isoformat(timespec="seconds"))};
{failed} failed expectation(s). Full results: <a href="{html.escape(data_docs)}">Data Docs</a>.</p>
<h2>suites</h2>{table(suites, ["suite", "severity", "expectations", "failed", "rows"])}
{plot("disk_by_topic", "disk use per topic over time")}
{plot("consumer_lag", "consumer lag")}
{table(lag_rows, ["as_of", "group", "topic", "lag"])}
{plot("rejects_per_batch", "rejects per batch")}
{table(data["rejects_per_batch"], ["batch_id", "ingested_at", "lines", "rejected"])}
{plot("compaction_ratio", "compaction ratio")}
{table(data["compaction_ratio"], ["topic", "messages", "kept", "ratio"])}
</body></html>
"""


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def link_latest(reports: Path, page: Path) -> Path:
    """``reports/latest.html``: a redirect to the newest run's page (one bookmark for the newest report)."""
    latest = reports / "latest.html"
    target = html.escape(page.relative_to(reports).as_posix())
    latest.write_text(
        f'<!doctype html><meta http-equiv="refresh" content="0; url={target}"><a href="{target}">latest</a>'
    )
    return latest
