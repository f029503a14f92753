"""``make demo``: generate data, run every job that exists on it, print where to look.

Runs in one process with one local SparkSession; the lake is ``./lake``
(recreated each time) and the generated producer logs are ``./demo-data``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rmqlake.config import load_settings
from rmqlake.formats.store import ROCKETMQ_VERIFIED_VERSION
from rmqlake.generate import TopicPlan, generate
from rmqlake.lake import Lake
from rmqlake.logs import configure_logging
from rmqlake.report import render_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rmqlake.demo", description=__doc__)
    parser.add_argument("--conf", default="conf")
    parser.add_argument("--env", default="local")
    parser.add_argument("--data", default="demo-data", help="where the generated producer logs go")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    configure_logging("INFO")
    settings = load_settings(args.conf, env=args.env)
    lake_root = Path(settings.lake.root)
    for folder in (lake_root, Path(args.data)):
        if folder.exists():
            shutil.rmtree(folder)

    plans = [TopicPlan(n, t.queues, t.cleanup_policy == "COMPACTION") for n, t in settings.topics.items()]
    summary = generate(
        args.data,
        messages=args.messages,
        topics=plans,
        hours=3,
        bad_rate=0.002,
        seed=args.seed,
        schedule_share=0.01,
        transaction_share=0.01,
        delay_levels=settings.schedule_rules().max_delay_level,
        timer_max_delay_sec=settings.store.timer_max_delay_sec,
    )
    sent = summary["transactions"]
    print(
        f"generated {summary['messages']} messages ({summary['scheduled']['delay']} with a delay level, "
        f"{summary['scheduled']['timer']} timers, {sent['sent']} transactional: {sent['committed']} committed, "
        f"{sent['rolled_back']} rolled back, {sent['open']} left open) and {summary['bad_lines']} bad lines in "
        f"{args.data}/landing"
    )

    from rmqlake.session import get_spark
    from rmqlake.steps.compact import compact
    from rmqlake.steps.ingest import ingest
    from rmqlake.steps.reput import reput

    delta = settings.lake.engine == "delta-spark"
    spark = get_spark(settings.spark, conf_dir=args.conf, app_name="rmqlake-demo", delta_extension=delta)
    landing = Path(args.data) / "landing"
    hours = sorted(p for p in landing.glob("dt=*/hour=*"))
    runs = []
    delayed = None
    batches = {}  # ingest batch id -> the landing hour it ingested
    for hour in hours:  # one batch per landing hour, each followed by reput, as the hourly pipeline does
        ingested = ingest(spark, settings, input_path=str(hour))
        dispatched = reput(spark, settings)
        compacted = compact(spark, settings)
        batch = f"{hour.parent.name}/{hour.name}"
        batches[ingested["batch_id"]] = batch
        if delayed is None:
            delayed = _a_pending_delivery(settings, batch=batch)
        elif not delayed.get("delivered"):
            delayed["delivered"] = _its_delivery(settings, delayed, batch=batch)
        runs.append(
            {
                "batch": batch,
                "messages": ingested["rows_out"],
                "rejected": ingested["rejected"],
                "commitlog MB": round(ingested["commitlog_bytes"] / 1e6, 1),
                "ingest s": ingested["seconds"],
                "ingest msg/s": round(ingested["rows_per_second"] or 0),
                "CQ units": dispatched["cq_units"],
                "index entries": dispatched["index_entries"],
                "reput s": dispatched["seconds"],
                "compacted keys": compacted["messages_kept"],
                "tombstones": compacted["tombstones_applied"],
                "compact s": compacted["seconds"],
            }
        )
    print()
    print(render_table(runs))
    if delayed:
        print(f"\n{delayed['stored']}\n{delayed.get('delivered') or '  still pending after the last batch'}")
    followed = None
    if sent["sent"]:
        from rmqlake.lake.spark_io import read_table

        commitlog = read_table(spark, Lake.from_settings(settings), "commitlog")
        followed = _a_committed_transaction(commitlog, batches=batches)
        print(f"\n{followed['text'] if followed else 'no committed transaction in the lake'}")
        from rmqlake.steps.status import status

        still_open = [
            {key: row[key] for key in ("topic", "open", "oldest_store_time", "oldest_uniq_key")}
            for row in status(settings)["transactions"]
        ]
        print(
            f"\nopen transactions after the last batch, from rmqlake status (the generator left {sent['open']} open):"
        )
        print(textwrap.indent(render_table(still_open), "  ") if still_open else "  none")

    from rmqlake.steps.expire import expire
    from rmqlake.steps.offsets import lag, load_offsets

    load_offsets(settings, input_path=str(Path(args.data) / "offsets"))
    # retention as of 04:00 three days later: the first hours are past 72 h, the last one is not
    end = datetime.fromtimestamp(summary["end_ms"] / 1000, tz=UTC)
    expire_at = (end + timedelta(days=3)).replace(hour=4, minute=0, second=0, microsecond=0)
    plan = expire(spark, settings, now=expire_at, dry_run=True)
    expired = expire(spark, settings, now=expire_at)
    print(
        f"\nexpire as of {expire_at:%Y-%m-%dT%H:%MZ} (dry run first: {len(plan['segments'])} segments): "
        f"deleted {expired['segments_deleted']} segments, {expired['cq_files_deleted']} CQ files, "
        f"{expired['index_files_deleted']} index files; disk usage {expired['disk']['usage']:.4%}; "
        f"unconsumed messages deleted: {expired['unconsumed_messages_deleted']}"
    )
    from rmqlake.steps.quality import quality

    checked = quality(spark, settings, now=expire_at)
    print("\nquality suites (Great Expectations) after expiry:")
    print(
        render_table(
            [
                {k: s[k] for k in ("suite", "severity", "rows", "expectations", "failed", "seconds")}
                for s in checked["suites"]
            ]
        )
    )
    from rmqlake.steps.store import export_store

    exported = export_store(spark, settings, out=str(Path(args.data) / "store"), overwrite=True)
    print(
        f"\nexport-store: {exported['commitlog_files']} commitlog segment files ({exported['records']:,} records), "
        f"{exported['consumequeue_files']} CQ files, {exported['index_files']} index files, checkpoint and config "
        f"in {exported['out']} ({exported['seconds']:.1f}s)"
    )
    print("\nconsumer lag at the last snapshot (first queues):")
    print(render_table(lag(settings)["latest"][:8]))
    lake = Lake.from_settings(settings)
    segments = lake.read_arrow("segments").to_pylist()
    print(
        f"\n{len(segments)} segments of {settings.store.commitlog_segment_size:,} bytes; "
        f"{sum(s['padding_bytes'] for s in segments):,} bytes of end-of-segment padding"
    )
    key, topic = _a_key(lake)
    compacted_topic = next(iter(settings.compaction_topics()), topic)
    root = Path(settings.lake.root).resolve()
    transaction_queries = ""
    if followed and followed["half_offset"] >= lake.min_physical_offset():  # expiry may have deleted it
        transaction_queries = (
            f"  .venv/bin/rmqlake query msgid --env local {followed['half_msg_id']}   # the half (offsetMsgId)\n"
            f"  .venv/bin/rmqlake query msgid --env local {followed['uniq_key']} --topic {followed['topic']}"
            "   # the committed message\n"
        )
    print(
        f"""
Tables (Delta Lake) under {root}:
  commitlog         one row per message, partitioned by segment
  segments          one row per commitlog segment
  rejected          bad input lines with file, line and reason
  ingest_files      input files already ingested (re-runs skip them)
  consumequeue      one unit per dispatchable message, partitioned by topic and queue
  indexfile         index entries (hash chains), partitioned by index file
  indexfile_header  one header per index file
  compaction_log    latest message per key of COMPACTION topics ({", ".join(settings.compaction_topics())})
  compaction_cq     the compacted queues (original queue offsets, with gaps)
  consumer_offsets  consumer offset snapshots from {args.data}/offsets
  dq_results        one row per quality expectation per run (success, observed values, table version)

Data Docs (every quality run's results): {checked["data_docs"]}
The same store as a broker keeps it on disk (commitlog/, consumequeue/, index/, checkpoint, config/):
  {exported["out"]}
Quality report of this run (disk use per topic, consumer lag, rejects per batch, compaction ratio):
  {checked.get("report") or "(quality.report is off)"}

Ask it what a broker would answer:
  .venv/bin/rmqlake status --env local
  .venv/bin/rmqlake query key --env local --topic {topic} --key {key}
  .venv/bin/rmqlake query offset --env local --topic {topic} --queue 0 --offset 0 --max 5 --tags 'TagA || TagB'
  .venv/bin/rmqlake query time --env local --topic {topic} --queue 0 --at 2026-11-21T01:30:00Z
  .venv/bin/rmqlake query offset --env local --topic {compacted_topic} --queue 0 --offset 0 --compacted
{transaction_queries}  .venv/bin/rmqlake lag --env local --group cg_audit
  .venv/bin/rmqlake quality --env local --suite commitlog
  .venv/bin/rmqlake export-store --env local --out /tmp/store --as-of 2   # the store right after run 2
  .venv/bin/rmqlake expire --env local --now {(expire_at + timedelta(days=1)):%Y-%m-%dT%H:%M:%SZ} --dry-run

Or read the tables with any Delta reader (Spark and DuckDB examples: README, "Reading the tables"):
  .venv/bin/rmqlake describe commitlog            # every column, its type and meaning
  .venv/bin/rmqlake sql --env local "SELECT topic, count(*), max(store_time) FROM messages GROUP BY topic"
  .venv/bin/python -c "import polars as pl; print(pl.read_delta('{root}/consumequeue').head())"
  .venv/bin/python -c "from deltalake import DeltaTable; print(DeltaTable('{root}/segments').to_pandas())"

The store format is verified against Apache RocketMQ {ROCKETMQ_VERIFIED_VERSION}: its own store classes load
an export, and a real name server and broker started on one serve real consumers exactly the
messages after their groups' committed offsets. See it yourself (after `make jars`): make interop
"""
    )
    spark.stop()
    return 0


def _a_pending_delivery(settings, *, batch: str) -> dict | None:
    """The delay-level message that comes due first after the last ingest's clock (stored on
    SCHEDULE_TOPIC_XXXX, pending): what the demo prints about it, and what finds its delivery later."""
    import pyarrow.dataset as ds

    from rmqlake.formats.consumequeue import SCHEDULE_TOPIC
    from rmqlake.formats.schedule import REAL_QID, REAL_TOPIC
    from rmqlake.steps.status import status
    from rmqlake.timeutil import iso

    lake = Lake.from_settings(settings)
    schedule = lake.state().schedule
    if schedule is None or not schedule.pending:
        return None
    levels = settings.schedule_rules().delay_levels
    rows = lake.scan(  # the schedule topic only: a small share of the messages
        "commitlog",
        columns=["queue_id", "queue_offset", "store_timestamp", "properties", "uniq_key"],
        filter=ds.field("topic") == SCHEDULE_TOPIC,
    ).to_pylist()

    def due(row: dict) -> int:
        return row["store_timestamp"] + levels[row["queue_id"] + 1]  # queue = level - 1

    pending = [row for row in rows if due(row) > schedule.delivered_until]
    if not pending:
        return None
    first = min(pending, key=due)
    properties = dict(first["properties"])
    listed = status(settings, lake=lake)
    groups = listed["pending"]
    stored = (
        f"a delayed message (UNIQ_KEY {first['uniq_key']}, DELAY {properties['DELAY']}, for "
        f"{properties[REAL_TOPIC]} queue {properties[REAL_QID]}):\n"
        f"  stored by batch {batch} on {SCHEDULE_TOPIC} queue {first['queue_id']} offset {first['queue_offset']} "
        f"at {iso(first['store_timestamp'])}, due {iso(due(first))}\n"
        f"  pending after that batch: rmqlake status lists {listed['store']['pending_deliveries']} deliveries in "
        f"{len(groups)} groups{', the first:' if len(groups) > 3 else ':'}\n"
        + textwrap.indent(render_table(groups[:3]), "    ")
    )
    return {"uniq_key": first["uniq_key"], "topic": properties[REAL_TOPIC], "stored": stored}


def _its_delivery(settings, delayed: dict, *, batch: str) -> str | None:
    """Where and when the message of :func:`_a_pending_delivery` was delivered; ``None`` while it waits."""
    import pyarrow.dataset as ds

    from rmqlake.timeutil import iso

    found = (
        Lake.from_settings(settings)
        .scan(
            "commitlog",
            columns=["queue_id", "queue_offset", "store_timestamp"],
            filter=(ds.field("topic") == delayed["topic"]) & (ds.field("uniq_key") == delayed["uniq_key"]),
        )
        .to_pylist()
    )
    if not found:
        return None
    return (
        f"  delivered by batch {batch} to {delayed['topic']} queue {found[0]['queue_id']} offset "
        f"{found[0]['queue_offset']}, stored at {iso(found[0]['store_timestamp'])}: its due time"
    )


def _a_committed_transaction(commitlog, *, batches: dict[str, str]) -> dict | None:
    """One committed transaction followed through the commitlog (a DataFrame): its half, its commit, its op record.

    Prefers a commit stored by a later batch than its half (the end line was in a later hour's
    file), then the latest. ``batches`` names the landing hour of each ingest batch id.
    What the demo prints about it, and the ids to query it by; ``None`` when no commit is stored.
    """
    from pyspark.sql import functions as F

    from rmqlake.formats.record import TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK
    from rmqlake.formats.transaction import HALF_TOPIC, OP_TOPIC, PGROUP, REAL_QID, REAL_TOPIC
    from rmqlake.timeutil import iso

    halves = commitlog.where(F.col("topic") == HALF_TOPIC).select(
        F.col("physical_offset").alias("half_offset"),
        F.col("queue_id").alias("half_queue_id"),
        F.col("queue_offset").alias("half_queue_offset"),
        F.col("batch_id").alias("half_batch"),
        F.col("msg_id").alias("half_msg_id"),
        F.col("store_timestamp").alias("half_stored"),
        F.col("properties")[REAL_TOPIC].alias("real_topic"),
        F.col("properties")[REAL_QID].alias("real_qid"),
        F.col("properties")[PGROUP].alias("group"),
    )
    # a commit re-put keeps the half's properties, REAL_TOPIC included (a store-level COMMIT line has none)
    committed = F.col("sys_flag").bitwiseAND(TRANSACTION_TYPE_MASK) == TRANSACTION_COMMIT_TYPE
    commits = commitlog.where(committed & F.col("properties")[REAL_TOPIC].isNotNull()).select(
        "topic", "queue_id", "queue_offset", "physical_offset", "prepared_transaction_offset", "store_timestamp",
        "batch_id", "uniq_key", "sys_flag",
    )  # fmt: skip
    found = (
        commits.join(halves, commits.prepared_transaction_offset == halves.half_offset)
        .orderBy((F.col("batch_id") != F.col("half_batch")).desc(), F.col("physical_offset").desc())
        .first()
    )
    if found is None:
        return None
    named = F.array_contains(F.split(F.col("body").cast("string"), ","), str(found["half_queue_offset"]))
    op = (
        commitlog.where((F.col("topic") == OP_TOPIC) & named)
        .select("queue_id", "queue_offset", "store_timestamp", "batch_id", "tags", F.col("body").cast("string"))
        .orderBy("physical_offset")
        .first()
    )
    lines = [
        f"a committed transaction (UNIQ_KEY {found['uniq_key']}, producer group {found['group']}):",
        f"  half    stored by batch {batches.get(found['half_batch'], found['half_batch'])} on {HALF_TOPIC} queue "
        f"{found['half_queue_id']} offset {found['half_queue_offset']} at {iso(found['half_stored'])}: physical "
        f"offset {found['half_offset']}, REAL_TOPIC {found['real_topic']}, REAL_QID {found['real_qid']}",
        f"  commit  stored by batch {batches.get(found['batch_id'], found['batch_id'])} on {found['topic']} queue "
        f"{found['queue_id']} offset {found['queue_offset']} at {iso(found['store_timestamp'])}: type COMMIT, "
        f"preparedTransactionOffset {found['prepared_transaction_offset']} (the half's physical offset)",
    ]
    if op is None:
        lines.append(f"  op      no op record on {OP_TOPIC} names half queue offset {found['half_queue_offset']} (!)")
    else:
        body = op["body"] if len(op["body"]) <= 40 else op["body"][:37] + "..."
        lines.append(
            f"  op      stored by batch {batches.get(op['batch_id'], op['batch_id'])} on {OP_TOPIC} queue "
            f"{op['queue_id']} offset {op['queue_offset']} at {iso(op['store_timestamp'])}: tags {op['tags']}, body "
            f"{body!r} names half queue offset {found['half_queue_offset']}: the half is ended"
        )
    return {
        "text": "\n".join(lines),
        "half_offset": found["half_offset"],
        "half_msg_id": found["half_msg_id"],
        "uniq_key": found["uniq_key"],
        "topic": found["topic"],
    }


def _a_key(lake) -> tuple[str, str]:
    """A key that many messages share, to make the example query interesting."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = lake.scan("commitlog", columns=["topic", "keys"], filter=ds.field("topic") == "OrderEvents")
    keys = pc.list_flatten(table.column("keys"))
    if len(keys) == 0:
        return "order-000001", "OrderEvents"
    counts = pc.value_counts(keys).to_pylist()
    best = max(counts, key=lambda c: c["counts"])
    return best["values"], "OrderEvents"


if __name__ == "__main__":
    sys.exit(main())
