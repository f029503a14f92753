"""The ``rmqlake`` command line.

Every subcommand takes the global options ``--conf``, ``--env``, ``--lake``,
``--set`` (repeatable), ``--json`` and ``--log-level``, before or after the
subcommand; every subcommand's ``--help`` has a description and examples. Exit codes: 0 success, 1 failed
checks or refused work, 2 usage or configuration errors. User errors print
one clear message, no traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from rich_argparse import RawDescriptionRichHelpFormatter

from rmqlake.errors import RmqlakeError, UsageError
from rmqlake.logs import configure_logging, log_context

log = logging.getLogger("rmqlake.cli")
COMMANDS: dict[str, Callable] = {}


def integer(text: str) -> int:
    """An integer option: ASCII digits with an optional sign (``int()`` alone also takes ``٨٠`` and ``1_000``)."""
    if not re.fullmatch(r"-?[0-9]{1,19}", text.strip()):
        raise argparse.ArgumentTypeError(f"expected an integer of ASCII digits, got {text!r:.40}")
    return int(text)


def fraction(text: str) -> float:
    """A fraction option: a plain decimal in [0, 1] (``float()`` alone also takes ``nan``, ``inf`` and ``1e9``)."""
    if not re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,9})?|\.[0-9]{1,9}", text.strip()) or not 0 <= float(text) <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1 such as 0.001, got {text!r:.40}")
    return float(text)


def _global_defaults() -> dict:
    """The global options' values when given in neither position (read when a command runs)."""
    return {
        "conf": os.environ.get("RMQLAKE_CONF", "conf"),
        "env": os.environ.get("RMQLAKE_ENV"),
        "lake": os.environ.get("RMQLAKE_LAKE"),
        "overrides": [],
        "json": False,
        "log_level": "INFO",
    }


GLOBAL_BEFORE = "before_"  # dest prefix of the global options given before the subcommand


def _global_options(*, dest_prefix: str = "") -> argparse.ArgumentParser:
    """The global options, accepted before the subcommand (``dest_prefix`` set) and after it.

    Defaults are suppressed in both places so that a value given before the
    subcommand is not overwritten by the subcommand's default; ``merge_global_options``
    applies the defaults afterwards.
    """
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("global options", "Accepted before or after the subcommand.")
    options = {"default": argparse.SUPPRESS}
    group.add_argument(
        "--conf",
        dest=f"{dest_prefix}conf",
        metavar="DIR",
        help="configuration folder (default: $RMQLAKE_CONF, else conf)",
        **options,
    )
    group.add_argument(
        "--env",
        dest=f"{dest_prefix}env",
        metavar="NAME",
        help="overlay conf/env/NAME.yaml (default: $RMQLAKE_ENV)",
        **options,
    )
    group.add_argument(
        "--lake",
        dest=f"{dest_prefix}lake",
        metavar="PATH",
        help="table root: local path or object-store URI (default: $RMQLAKE_LAKE, else lake.root from conf)",
        **options,
    )
    group.add_argument(
        "--set",
        dest=f"{dest_prefix}overrides",
        action="append",
        metavar="KEY=VALUE",
        help="override a conf key, e.g. --set store.index_slots=5000000 (repeatable)",
        **options,
    )
    group.add_argument(
        "--json",
        dest=f"{dest_prefix}json",
        action="store_true",
        help="print results as JSON lines on stdout (logs go to stderr)",
        **options,
    )
    group.add_argument(
        "--log-level",
        dest=f"{dest_prefix}log_level",
        metavar="LEVEL",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="rmqlake log level on stderr: DEBUG, INFO, WARNING or ERROR (default: INFO)",
        **options,
    )
    return common


def merge_global_options(args: argparse.Namespace) -> argparse.Namespace:
    """One value per global option: given after the subcommand, else before it, else the default.

    ``--set`` collects both positions, those before the subcommand first (a later one wins a conflict).
    """
    values = vars(args)
    for name, default in _global_defaults().items():
        before = values.pop(f"{GLOBAL_BEFORE}{name}", None)
        after = values.get(name)
        if name == "overrides":
            values[name] = [*(before or []), *(after or [])]
        else:
            values[name] = after if after is not None else before if before is not None else default
    return args


def version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    try:
        return distribution_version("rmqlake")
    except PackageNotFoundError:
        import rmqlake

        return getattr(rmqlake, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    common = _global_options()
    parser = argparse.ArgumentParser(
        prog="rmqlake",
        description="RocketMQ broker storage rebuilt as Delta Lake tables. Run rmqlake COMMAND --help for a command's\n"
        "options and examples.",
        epilog="examples:\n  rmqlake generate --out data --messages 10000\n  rmqlake ingest --input data/landing\n"
        "  rmqlake reput\n  rmqlake query key --topic OrderEvents --key order-000042\n  rmqlake --json status",
        parents=[_global_options(dest_prefix=GLOBAL_BEFORE)],
    )
    parser.add_argument("--version", action="version", version=f"rmqlake {version()}", help="print the version")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    generate = commands.add_parser("generate", parents=[common], help="write realistic raw producer logs")
    generate.add_argument("--out", required=True, help="output folder (landing files go to OUT/landing/)")
    generate.add_argument("--messages", type=integer, required=True, help="valid messages to write")
    generate.add_argument("--topics", help="comma-separated topics (default: the topics of topics.yaml)")
    generate.add_argument("--hours", type=integer, default=3, help="hours of traffic (default 3)")
    generate.add_argument("--bad-rate", type=fraction, default=0.0, help="extra bad lines as a fraction of messages")
    generate.add_argument("--seed", type=integer, default=42, help="random seed: same seed, same files")
    generate.add_argument(
        "--start", help="first hour (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS; default 2026-11-21T00:00Z)"
    )
    generate.add_argument("--gzip", action="store_true", help="write .jsonl.gz files")
    generate.add_argument(
        "--body-size", type=integer, help="bodies of about this many bytes (default: empty to 48 KiB)"
    )
    generate.add_argument(
        "--schedule-share",
        type=fraction,
        default=0.01,
        help="fraction of plain messages sent with a delayLevel, deliverTimeMs or TIMER_DELAY_SEC, within the "
        "configured delay levels and max timer delay (default 0.01; 0 for none)",
    )
    generate.add_argument(
        "--transaction-share",
        type=fraction,
        default=0.01,
        help="fraction of plain messages sent as transactional half messages, each followed by an endTransaction "
        "line (most COMMIT, some ROLLBACK, some left open) (default 0.01; 0 for none)",
    )

    ingest = commands.add_parser("ingest", parents=[common], help="raw logs -> commitlog, segments, rejected")
    add_ingest_arguments(ingest)

    commands.add_parser(
        "reput", parents=[common], help="dispatch new commitlog messages -> consumequeue, indexfile, indexfile_header"
    )
    compact = commands.add_parser(
        "compact", parents=[common], help="latest message per key of COMPACTION topics -> compaction_log, compaction_cq"
    )
    compact.add_argument("--topic", help="compact only this COMPACTION topic (default: all of them)")
    compact.add_argument(
        "--now", help="time recorded for the run (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS; default: now)"
    )
    expire = commands.add_parser("expire", parents=[common], help="apply the broker's file-deletion rules as of --now")
    expire.add_argument(
        "--now",
        required=True,
        help="the run's time (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS); Airflow passes its logical date",
    )
    expire.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    expire.add_argument(
        "--manual", action="store_true", help="executeDeleteFilesManually: the next 20 runs delete at any hour"
    )
    vacuum = commands.add_parser(
        "vacuum", parents=[common], help="delete data files removed from the tables longer ago than the retention"
    )
    vacuum.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    export = commands.add_parser(
        "export-store", parents=[common], help="write the tables as a broker store directory (commitlog, CQ, index)"
    )
    export.add_argument("--out", required=True, help="the store directory to write (must be empty or absent)")
    export.add_argument("--as-of", help="the lake as of a run (its seq, see rmqlake status) or a timestamp")
    export.add_argument("--overwrite", action="store_true", help="replace --out if it holds files")
    import_store = commands.add_parser(
        "import-store", parents=[common], help="read a broker store's commitlog files into an empty lake"
    )
    import_store.add_argument("store_dir", help="the broker's store directory (holding commitlog/)")
    offsets = commands.add_parser("offsets", parents=[common], help="consumer offset snapshots -> consumer_offsets")
    offsets.add_argument("--input", required=True, help="a consumerOffset.json file or a folder of them")
    offsets.add_argument(
        "--as-of", help="snapshot time (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS; default: from the file name)"
    )
    lag = commands.add_parser("lag", parents=[common], help="consumer lag per group, topic and queue")
    lag.add_argument("--group", help="only this consumer group")
    quality = commands.add_parser(
        "quality", parents=[common], help="data-quality suites -> dq_results, Data Docs; exit 1 on a critical failure"
    )
    quality.add_argument(
        "--suite",
        action="append",
        dest="suites",
        help="a suite (commitlog.critical) or a table's suites (commitlog); repeatable; default: all",
    )
    quality.add_argument(
        "--now", help="time recorded for the results (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS; default: now)"
    )
    pipeline = commands.add_parser("pipeline", help="run a pipeline spec locally, in order, as Airflow would")
    pipeline_commands = pipeline.add_subparsers(dest="pipeline_command", metavar="ACTION", required=True)
    pipeline_run = pipeline_commands.add_parser("run", parents=[common], help="run every task of one logical date")
    pipeline_run.add_argument("name", help="pipeline name (pipelines/NAME.yaml)")
    pipeline_run.add_argument(
        "--logical-date", required=True, help="the run's logical date (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS)"
    )
    pipeline_run.add_argument(
        "--pipelines", default=os.environ.get("RMQLAKE_PIPELINES", "pipelines"), help="folder of the specs"
    )
    pipeline_run.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a param of the spec (repeatable), as Airflow's trigger conf does",
    )
    commands.add_parser("status", parents=[common], help="store state: offsets, segments, checkpoints, disk use")
    sql = commands.add_parser(
        "sql",
        parents=[common],
        help="DuckDB SQL over the tables as of the last fully applied run",
    )
    sql.add_argument("statement", metavar="SQL", help="one statement; SHOW TABLES lists the tables and views")
    describe = commands.add_parser(
        "describe", parents=[common], help="the lake's tables, or one table's columns, types and meanings"
    )
    describe.add_argument("table", nargs="?", metavar="TABLE", help="a table name (default: list the tables)")

    query = commands.add_parser("query", help="look messages up as the broker does")
    kinds = query.add_subparsers(dest="query_kind", metavar="KIND", required=True)
    by_key = kinds.add_parser("key", parents=[common], help="messages by key (index lookup, key re-checked)")
    by_key.add_argument("--topic", required=True, help="topic of the messages")
    by_key.add_argument("--key", required=True, help="one KEYS token")
    by_key.add_argument(
        "--begin", help="earliest store time (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS; default: any)"
    )
    by_key.add_argument("--end", help="latest store time (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS; default: any)")
    by_key.add_argument("--max", type=integer, default=64, help="at most this many (default and cap 64, as the broker)")
    by_key.add_argument("--full", action="store_true", help="show every field and the whole body")
    by_offset = kinds.add_parser("offset", parents=[common], help="messages from a queue offset, with tag filtering")
    by_offset.add_argument("--topic", required=True, help="topic of the queue")
    by_offset.add_argument("--queue", type=integer, required=True, help="queue id")
    by_offset.add_argument("--offset", type=integer, required=True, help="first queue offset")
    by_offset.add_argument("--max", type=integer, default=32, help="at most this many (default 32, a pull batch)")
    by_offset.add_argument("--tags", default="*", help="subscription: '*' or 'TagA || TagB'")
    by_offset.add_argument("--full", action="store_true", help="show every field and the whole body")
    by_offset.add_argument(
        "--compacted", action="store_true", help="read the compacted queue (compaction_cq) of a COMPACTION topic"
    )
    by_id = kinds.add_parser("msgid", parents=[common], help="a message by offsetMsgId or UNIQ_KEY")
    by_id.add_argument("id", help="offsetMsgId (32/56 hex) or UNIQ_KEY")
    by_id.add_argument("--topic", help="topic, to look a UNIQ_KEY up in one topic only")
    by_id.add_argument("--full", action="store_true", help="show every field and the whole body")
    by_time = kinds.add_parser("time", parents=[common], help="queue offset of the first message at a time")
    by_time.add_argument("--topic", required=True, help="topic of the queue")
    by_time.add_argument("--queue", type=integer, required=True, help="queue id")
    by_time.add_argument("--at", required=True, help="store time (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS)")
    by_time.add_argument(
        "--boundary",
        choices=["lower", "upper"],
        default="lower",
        help="lower: first offset stored at or after; upper: last offset stored at or before",
    )
    by_range = kinds.add_parser("range", parents=[common], help="messages of a topic stored in a time range")
    by_range.add_argument("--topic", required=True, help="topic of the messages")
    by_range.add_argument("--queue", type=integer, help="only this queue id (default: every queue of the topic)")
    by_range.add_argument("--begin", required=True, help="store time from, inclusive (epoch ms, ISO-8601 or mqadmin's)")
    by_range.add_argument("--end", required=True, help="store time until, exclusive (epoch ms, ISO-8601 or mqadmin's)")
    by_range.add_argument(
        "--max", type=integer, default=2000, help="at most this many messages (default 2000, as the dashboard)"
    )
    by_range.add_argument("--full", action="store_true", help="show every field and the whole body")
    explain(parser)
    return parser


class HelpFormatter(RawDescriptionRichHelpFormatter):
    """rich-argparse help; descriptions and examples keep their line breaks, and text is never read as markup
    (option syntax such as ``[--queue Q]`` would otherwise be taken for a style)."""

    help_markup = False
    text_markup = False


TIMES = "Times: epoch milliseconds, ISO-8601 (UTC unless a zone is given) or mqadmin's yyyy-MM-dd#HH:mm:ss:SSS (UTC)."
# Per subcommand (its words after "rmqlake"): what it does, then examples. build_parser's explain() attaches
# them, and a test fails for any subcommand missing here.
EXPLAINED: dict[str, tuple[str, list[str]]] = {
    "generate": (
        "Write realistic raw producer logs (JSON Lines, hour folders under OUT/landing/) and consumer offset\n"
        "snapshots, for trying the pipeline out. The same --seed writes the same files. A small share of the\n"
        "messages (--schedule-share) are delay-level and timer messages, stored on SCHEDULE_TOPIC_XXXX or\n"
        "rmq_sys_wheel_timer by ingest and delivered to their topic when due. Another small share\n"
        "(--transaction-share) are a transactional producer's half messages, each followed by its end line\n"
        "(endTransaction COMMIT or ROLLBACK, some in the next hour's file) or left open.",
        [
            "rmqlake generate --out data --messages 100000 --hours 6 --bad-rate 0.001 --seed 1",
            "rmqlake generate --out data --messages 10000 --schedule-share 0.05",
            "rmqlake generate --out data --messages 10000 --transaction-share 0.05 --schedule-share 0",
        ],
    ),
    "ingest": (
        "Append raw producer logs to the commitlog as a broker would: physical offsets, queue offsets, CRCs,\n"
        "offsetMsgIds, end-of-segment blanks. Bad lines go to the rejected table with the reason; a file\n"
        "already ingested is skipped.",
        [
            "rmqlake ingest --input 'data/landing/dt=2026-11-21/hour=04'",
            "rmqlake ingest --input data/landing --fail-on-reject --json",
        ],
    ),
    "reput": (
        "Dispatch the commitlog messages not dispatched yet into the consumequeue, indexfile and\n"
        "indexfile_header tables, as the broker's ReputMessageService does.",
        ["rmqlake reput", "rmqlake reput --lake s3://bucket/lake --json"],
    ),
    "compact": (
        "Keep the latest message per key of COMPACTION topics in compaction_log and compaction_cq\n"
        "(the broker's CompactionLog).",
        ["rmqlake compact", "rmqlake compact --topic UserProfile --now 2026-11-22T04:00:00Z"],
    ),
    "expire": (
        "Apply the broker's file-deletion rules as of --now: expired commitlog segments, then the\n"
        "consumequeue and index entries pointing into them. Unconsumed messages deleted are reported.\n" + TIMES,
        [
            "rmqlake expire --now 2026-11-24T04:00:00Z --dry-run",
            "rmqlake expire --now 2026-11-24#04:00:00:000 --manual",
        ],
    ),
    "vacuum": (
        "Delete the data files that runs removed from the tables longer ago than lake.vacuum_retention_hours\n"
        "(Delta VACUUM); time travel before that point is no longer possible.",
        ["rmqlake vacuum --dry-run", "rmqlake vacuum"],
    ),
    "export-store": (
        "Write the tables as a broker store directory (commitlog, consumequeue, index, checkpoint) that a\n"
        "RocketMQ broker can start on, optionally as of an earlier run.",
        ["rmqlake export-store --out /data/store", "rmqlake export-store --out /data/store --as-of 12 --overwrite"],
    ),
    "import-store": (
        "Read a broker store's commitlog files into an empty lake (then run reput).",
        ["rmqlake import-store /data/broker/store --lake /data/lake2"],
    ),
    "offsets": (
        "Load consumer offset snapshots (the broker's consumerOffset.json) into consumer_offsets; loading\n"
        "a snapshot twice changes nothing. " + TIMES,
        [
            "rmqlake offsets --input data/offsets",
            "rmqlake offsets --input consumerOffset.json --as-of 2026-11-21T04:00:00Z",
        ],
    ),
    "lag": (
        "Consumer lag per group, topic and queue at the latest snapshot (as mqadmin consumerProgress),\n"
        "then the total lag per group and topic for every snapshot.",
        ["rmqlake lag", "rmqlake lag --group cg_billing --json"],
    ),
    "quality": (
        "Run the data-quality suites, write dq_results and the Data Docs; exit 1 when a critical\n"
        "expectation fails. Suites whose tables did not change since they ran are not run again.",
        ["rmqlake quality", "rmqlake quality --suite commitlog.critical --suite consumequeue"],
    ),
    "pipeline": (
        "Run a pipeline spec (pipelines/NAME.yaml) locally, task by task in order, as Airflow would.",
        ["rmqlake pipeline run hourly --logical-date 2026-11-21T04:00:00Z"],
    ),
    "pipeline run": (
        "Run every task of one pipeline spec for one logical date; a failed task stops its downstream tasks.",
        [
            "rmqlake pipeline run hourly --logical-date 2026-11-21T04:00:00Z",
            "rmqlake pipeline run daily --logical-date 2026-11-22 --param now=2026-11-22T04:00:00Z",
        ],
    ),
    "status": (
        "The store's state: commitlog and dispatch offsets, checkpoints, segments, queues, topics, disk\n"
        "use and the disk-full flag, compaction positions, the last run of every job, the delay-level\n"
        "and timer deliveries not yet due (count and next due time per level and real topic), and the open\n"
        "transactions: half messages no commit or rollback ended yet (count and oldest per real topic).",
        ["rmqlake status", "rmqlake status --json"],
    ),
    "sql": (
        "Run one SQL statement (DuckDB) over every table at the version of the last fully applied run, and\n"
        "the views messages and compacted_messages (ISO-8601 UTC times, body_text where the body is UTF-8).",
        [
            'rmqlake sql "SELECT topic, count(*) AS messages FROM messages GROUP BY topic"',
            'rmqlake sql "SHOW TABLES"',
            'rmqlake sql --json "SELECT msg_id, store_time, body_text FROM messages LIMIT 5"',
        ],
    ),
    "describe": (
        "What the lake's tables hold: without TABLE, every table with its partition columns and what a row\n"
        "is; with TABLE, its columns, their types and what each means (the same comments the Delta schemas\n"
        "carry). Reads no lake.",
        ["rmqlake describe", "rmqlake describe consumequeue", "rmqlake describe commitlog --json"],
    ),
    "query": (
        "Look messages up as the broker does: by key, queue offset, message id, time or time range.\n"
        "Reads the tables directly (no Spark): answers come in well under a second.",
        [
            "rmqlake query key --topic OrderEvents --key order-000042",
            "rmqlake query msgid 7F00000100002A9F0000000000000000",
        ],
    ),
    "query key": (
        "Messages of a topic whose KEYS hold the key: the index lookup of the broker (at most 64, store\n"
        "times compared at second precision), then the topic and key re-checked as the client does.\n" + TIMES,
        [
            "rmqlake query key --topic OrderEvents --key order-000042",
            "rmqlake query key --topic OrderEvents --key order-7 --begin 2026-11-21T00:00:00Z --max 10 --full",
        ],
    ),
    "query offset": (
        "Messages of one queue from a queue offset, as a pull returns them: status (FOUND,\n"
        "OFFSET_TOO_SMALL, ...) and the next offset to pull from; tags filtered as broker and client do.",
        [
            "rmqlake query offset --topic OrderEvents --queue 3 --offset 100 --max 5 --tags 'TagA || TagB'",
            "rmqlake query offset --topic UserProfile --queue 0 --offset 0 --compacted",
        ],
    ),
    "query msgid": (
        "A message by offsetMsgId (store host + physical offset) or by UNIQ_KEY (through the index), and for\n"
        "every consumer group with offsets for its topic in consumer_offsets (latest snapshot) whether it\n"
        "consumed it, as mqadmin queryMsgById: CONSUMED when the group's offset in the message's queue is\n"
        "past the message's queue offset, else NOT_CONSUME_YET.",
        [
            "rmqlake query msgid 7F00000100002A9F0000000000000000",
            "rmqlake query msgid 0A0000050E5A18B4AAC27E5F3AD10000 --topic OrderEvents --full",
        ],
    ),
    "query time": (
        "The queue offset of the first message stored at or after a time (lower), or the last one stored\n"
        "at or before it (upper), as the broker's getOffsetInQueueByTime. " + TIMES,
        [
            "rmqlake query time --topic OrderEvents --queue 3 --at 2026-11-21T01:30:00Z",
            "rmqlake query time --topic OrderEvents --queue 3 --at 2026-11-21#01:30:00:000 --boundary upper",
        ],
    ),
    "query range": (
        "Messages of a topic stored from --begin (inclusive) until --end (exclusive), queue by queue in\n"
        "queue-offset order, as mqadmin printMsg: per queue, the offsets from the one found for --begin up\n"
        "to the one found for --end (getOffsetInQueueByTime, lower boundary). " + TIMES,
        [
            "rmqlake query range --topic OrderEvents --begin 2026-11-21T01:00:00Z --end 2026-11-21T01:05:00Z",
            "rmqlake query range --topic OrderEvents --queue 3 --begin 2026-11-21#01:00:00:000 "
            "--end 2026-11-21#01:00:10:000 --full",
        ],
    ),
}


def explain(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
    """Give every parser the rich help formatter and every subcommand its description and examples."""
    parser.formatter_class = HelpFormatter
    if path and " ".join(path) in EXPLAINED:
        description, examples = EXPLAINED[" ".join(path)]
        parser.description = parser.description or description
        parser.epilog = "examples:\n" + "\n".join(f"  {example}" for example in examples)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                explain(child, (*path, name))


def add_ingest_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="a file, a folder or a glob of .jsonl / .jsonl.gz files")
    parser.add_argument("--batch-id", help="name of the batch (default: derived from the input files' hashes)")
    parser.add_argument(
        "--now",
        help="time of the run (epoch ms, ISO-8601 or yyyy-MM-dd#HH:mm:ss:SSS; default: now): rejected_at and "
        "ingested_at, and, when given, the delivery clock of delay-level and timer messages (deliveries due by "
        "it, or by the batch's last store time if later, are appended)",
    )
    parser.add_argument("--fail-on-reject", action="store_true", help="exit 1 when any line was rejected")


def _settings(args):
    from rmqlake.config import load_settings

    return load_settings(args.conf, env=args.env, overrides=args.overrides, lake=args.lake)


def _spark(settings, args, app: str):
    from rmqlake.session import get_spark

    delta = settings.lake.engine == "delta-spark"
    spark = get_spark(settings.spark, conf_dir=args.conf, app_name=f"rmqlake-{app}", delta_extension=delta)
    if delta:  # before anything is read or written
        from rmqlake.lake.deltaspark import require_delta_extension

        require_delta_extension(spark)
    return spark


# Commands that only read the lake: on a folder that holds no lake they would show nothing and succeed.
READ_ONLY = frozenset({"status", "query", "lag", "export-store", "sql"})
# Timestamp options, checked before any work (export-store's --as-of also takes a run number: its job checks it).
_TIMESTAMP_OPTIONS = {"now": "--now", "at": "--at", "begin": "--begin", "end": "--end"}


def preflight(args, settings) -> None:
    """Check what needs neither Spark nor a table scan, before a session starts (a JVM start costs seconds).

    Raises:
        UsageError: an unreadable timestamp, a lake root that is a file, or a read-only command on a
            folder that holds no lake.
        InputError: ingest or offsets input that is missing or unreadable.
        ConfigError: ingest with a segment size other than the lake's.
    """
    from rmqlake.timeutil import parse_timestamp

    for name, option in _TIMESTAMP_OPTIONS.items():
        if getattr(args, name, None) is not None:
            parse_timestamp(getattr(args, name), option=option)
    if args.command == "offsets" and args.as_of is not None:
        parse_timestamp(args.as_of, option="--as-of")
    if args.command in ("generate", "pipeline"):
        return
    _check_lake_root(settings.lake.root, read_only=args.command in READ_ONLY, given=args.lake is not None)
    if args.command == "ingest":
        from rmqlake.steps.ingest import check_ingest

        check_ingest(settings, input_path=args.input)
    elif args.command == "offsets":
        from rmqlake.steps.offsets import snapshot_files

        snapshot_files(args.input)
    elif args.command == "import-store":
        from rmqlake.steps.store import check_import_store

        check_import_store(settings, store_dir=args.store_dir)
    elif args.command == "export-store" and args.as_of is not None:
        from rmqlake.steps.store import parse_as_of

        parse_as_of(args.as_of)


def _check_lake_root(root: str, *, read_only: bool, given: bool) -> None:
    from rmqlake.lake.ledger import LEDGER_TABLE
    from rmqlake.lake.storage import is_local, normalize_root

    if not is_local(root):
        return  # an object store: its access is the lake's to check, with the storage options
    where = f"--lake {root}" if given else f"lake.root {root}"
    path = normalize_root(root)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{where} is a file; the lake root must be a folder")
    if read_only and not os.path.isdir(os.path.join(path, LEDGER_TABLE, "_delta_log")):
        found = "does not exist" if not os.path.exists(path) else "holds no lake (no run has committed there)"
        raise UsageError(f"{where} {found}: check the path, or run rmqlake ingest first")


def _now(text: str | None) -> datetime:
    from rmqlake.timeutil import parse_timestamp, to_datetime

    return to_datetime(parse_timestamp(text, option="--now")) if text else datetime.now(UTC)


def cmd_generate(args, settings) -> int:
    from rmqlake.generate import TopicPlan, generate
    from rmqlake.timeutil import parse_timestamp

    names = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else list(settings.topics)
    if not names:
        raise UsageError("no topics: pass --topics or list topics in topics.yaml")
    plans = []
    for name in names:
        queues = settings.queue_count(name)
        if queues is None:
            raise UsageError(f"topic {name} is not in topics.yaml and auto-creation is off")
        policy = settings.topics[name].cleanup_policy if name in settings.topics else "DELETE"
        plans.append(TopicPlan(name, queues, policy == "COMPACTION"))
    options = {"start_ms": parse_timestamp(args.start, option="--start")} if args.start else {}
    summary = generate(
        args.out,
        messages=args.messages,
        topics=plans,
        hours=args.hours,
        bad_rate=args.bad_rate,
        seed=args.seed,
        gzip_files=args.gzip,
        body_size=args.body_size,
        max_message_size=settings.store.max_message_size,
        schedule_share=args.schedule_share,
        transaction_share=args.transaction_share,
        delay_levels=settings.schedule_rules().max_delay_level,
        timer_max_delay_sec=settings.store.timer_max_delay_sec,
        **options,
    )
    _emit(
        args,
        {k: v for k, v in summary.items() if k != "files"} | {"files": len(summary["files"]), "out": str(args.out)},
    )
    return 0


def cmd_ingest(args, settings) -> int:
    from rmqlake.steps.ingest import ingest

    spark = _spark(settings, args, "ingest")
    now = _now(args.now) if args.now else None  # the wall clock is not a delivery clock: only a given time is
    metrics = ingest(spark, settings, input_path=args.input, batch_id=args.batch_id, now=now)
    _emit(args, metrics)
    return 1 if args.fail_on_reject and metrics.get("rejected") else 0


def cmd_reput(args, settings) -> int:
    from rmqlake.steps.reput import reput

    _emit(args, reput(_spark(settings, args, "reput"), settings))
    return 0


def cmd_compact(args, settings) -> int:
    from rmqlake.steps.compact import compact

    _emit(args, compact(_spark(settings, args, "compact"), settings, topic=args.topic, now=_now(args.now)))
    return 0


def cmd_expire(args, settings) -> int:
    from rmqlake.steps.expire import expire

    spark = _spark(settings, args, "expire")
    result = expire(spark, settings, now=_now(args.now), dry_run=args.dry_run, manual=args.manual)
    if args.json:
        _emit(args, result)
        return 0
    summary = {k: v for k, v in result.items() if k not in ("segments", "data_loss", "trigger", "disk")}
    _emit(args, {**summary, **{f"disk_{k}": v for k, v in result.get("disk", {}).items()}})
    if result.get("segments"):
        sys.stdout.write("\n")
        _emit(args, [{k: v for k, v in s.items() if k != "topics"} for s in result["segments"]])
    if result.get("data_loss"):
        sys.stdout.write("\nunconsumed messages deleted:\n")
        _emit(args, result["data_loss"])
    return 0


def cmd_vacuum(args, settings) -> int:
    from rmqlake.steps.vacuum import vacuum

    _emit(args, vacuum(settings, dry_run=args.dry_run))
    return 0


def cmd_export_store(args, settings) -> int:
    from rmqlake.progress import spark_progress
    from rmqlake.steps.store import export_store

    spark = _spark(settings, args, "export-store")
    with spark_progress("export-store", interval=settings.spark.progress_seconds):  # a read: no run_step
        result = export_store(spark, settings, out=args.out, as_of=args.as_of, overwrite=args.overwrite)
    _emit(args, result)
    return 0


def cmd_import_store(args, settings) -> int:
    from rmqlake.steps.store import import_store

    metrics = import_store(_spark(settings, args, "import-store"), settings, store_dir=args.store_dir)
    _emit(args, metrics)
    return 0


def cmd_offsets(args, settings) -> int:
    from rmqlake.steps.offsets import load_offsets
    from rmqlake.timeutil import parse_timestamp

    as_of = parse_timestamp(args.as_of, option="--as-of") if args.as_of else None
    _emit(args, load_offsets(settings, input_path=args.input, as_of=as_of))
    return 0


def cmd_lag(args, settings) -> int:
    from rmqlake.steps.offsets import lag

    report = lag(settings, group=args.group)
    if args.json:
        _emit(
            args,
            [
                *({"kind": "queue", **r} for r in report["latest"]),
                *({"kind": "history", **r} for r in report["history"]),
            ],
        )
        return 0
    _emit(args, report["latest"] or [{"consumer_offsets": 0}])
    if report["history"]:
        sys.stdout.write("\nlag per snapshot:\n")
        _emit(args, report["history"])
    return 0


def cmd_quality(args, settings) -> int:
    from rmqlake.quality.suites import import_gx_in_background, select_suites
    from rmqlake.steps.quality import quality

    try:
        select_suites(args.suites)  # before Spark starts
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    # Great Expectations takes seconds to import, the JVM seconds to start: one waits for the other. Nothing
    # else is imported meanwhile (what starting Spark needs already is), so the two threads' imports never cross.
    gx_import = import_gx_in_background()
    spark = _spark(settings, args, "quality")
    gx_import.join()
    result = quality(spark, settings, suites=args.suites, now=_now(args.now))
    if args.json:
        _emit(args, result)
    else:
        rows = [
            {
                "suite": s["suite"],
                "rows": s["rows"],
                "expectations": s["expectations"],
                "failed": s["failed"],
                "result": "ok" if not s["failed"] else ("FAILED" if s["severity"] == "critical" else "warning"),
                "table_versions": ",".join(f"{t}@{v}" for t, v in s["table_versions"].items()),
            }
            for s in result["suites"]
        ]
        _emit(args, rows)
        if result["status"] == "already_checked":
            sys.stdout.write("no table changed since these suites ran: their last outcome stands\n")
        sys.stdout.write(f"Data Docs: {result['data_docs']}\n")
        if result.get("report"):
            sys.stdout.write(f"report (plots): {result['report']}\n")
    if result["warnings"]:
        sys.stderr.write(f"rmqlake quality: {result['warnings']} warning expectation(s) failed (reported, not fatal)\n")
    if result["critical_failures"]:
        sys.stderr.write(
            f"rmqlake quality: {result['critical_failures']} critical expectation(s) FAILED; see dq_results and the "
            "Data Docs\n"
        )
        return 1
    return 0


def cmd_pipeline(args, settings) -> int:
    from rmqlake.pipelines import job_arguments, load_pipeline, render
    from rmqlake.timeutil import parse_timestamp, to_datetime

    spec = load_pipeline(os.path.join(args.pipelines, f"{args.name}.yaml"))
    for text in args.params:
        name, sep, value = text.partition("=")
        if not sep or name not in spec.params:
            raise UsageError(
                f"--param {text!r}: expected NAME=VALUE with NAME one of {', '.join(spec.params) or '(none)'}"
            )
        spec = spec.model_copy(update={"params": {**spec.params, name: value}})
    logical_date = to_datetime(parse_timestamp(args.logical_date, option="--logical-date"))
    shared = ["--conf", args.conf, "--log-level", args.log_level]
    shared += ["--env", args.env] if args.env else []
    shared += ["--lake", args.lake] if args.lake else []
    for override in args.overrides:
        shared += ["--set", override]
    results, failed = [], None
    for name in spec.order():
        task = spec.tasks[name]
        if failed is not None:
            results.append({"task": name, "job": task.job, "state": "upstream_failed", "seconds": 0})
            continue
        argv = [task.job, *render(job_arguments(task), spec=spec, logical_date=logical_date), *shared]
        log.info("pipeline %s, task %s: rmqlake %s", spec.name, name, " ".join(argv))
        started = time.monotonic()
        code = main(argv)
        state = "success" if code == 0 else "failed"
        results.append({"task": name, "job": task.job, "state": state, "seconds": round(time.monotonic() - started, 1)})
        if code != 0:
            failed = code
    _emit(args, results)
    return 0 if failed is None else 1


def cmd_status(args, settings) -> int:
    from rmqlake.steps.status import status

    report = status(settings)
    if args.json:
        _emit(
            args,
            [
                {"kind": "store", **report["store"]},
                *({"kind": "queue", **q} for q in report["queues"]),
                *({"kind": "topic", **t} for t in report["topics"]),
                *({"kind": "run", **r} for r in report["runs"]),
                *({"kind": "pending", **p} for p in report["pending"]),
                *({"kind": "transaction", **t} for t in report["transactions"]),
            ],
        )
    else:
        _emit(args, report["store"])
        sys.stdout.write("\n")
        _emit(args, report["topics"])
        sys.stdout.write("\n")
        _emit(args, report["queues"])
        if report["pending"]:
            sys.stdout.write("\npending deliveries (delay levels and timers not yet due):\n")
            _emit(args, report["pending"])
        if report["transactions"]:
            sys.stdout.write("\nopen transactions (half messages with no commit or rollback yet):\n")
            _emit(args, report["transactions"])
        for run in report["runs"]:
            details = ", ".join(f"{k}={v}" for k, v in run.items() if k != "job")
            sys.stdout.write(f"\nlast {run['job']}: {details}")
        sys.stdout.write("\n")
    return 0


def cmd_query(args, settings) -> int:
    from rmqlake import query as Q
    from rmqlake.lake import Lake
    from rmqlake.timeutil import parse_timestamp

    lake = Lake.from_settings(settings, read_only=True)
    store = settings.store
    state = lake.state()
    min_offsets = state.queue_min_offsets
    if args.query_kind == "time":
        result = Q.query_time(
            lake,
            topic=args.topic,
            queue=args.queue,
            at=parse_timestamp(args.at, option="--at"),
            boundary=args.boundary,
            units_per_file=store.cq_units_per_file,
            min_phy_offset=lake.min_physical_offset(),
            min_offsets=min_offsets,
        )
        _emit(args, result)
        return 0
    if args.query_kind == "range":
        result = Q.query_range(
            lake,
            topic=args.topic,
            queue=args.queue,
            begin=parse_timestamp(args.begin, option="--begin"),
            end=parse_timestamp(args.end, option="--end"),
            max_num=args.max,
            units_per_file=store.cq_units_per_file,
            segment_size=store.commitlog_segment_size,
            min_phy_offset=lake.min_physical_offset(),
            min_offsets=min_offsets,
        )
    elif args.query_kind == "key":
        if args.max < 1:
            raise UsageError("--max must be at least 1")
        result = Q.query_key(
            lake,
            topic=args.topic,
            key=args.key,
            begin=parse_timestamp(args.begin, option="--begin") if args.begin else 0,
            end=parse_timestamp(args.end, option="--end") if args.end else Q.LONG_MAX,
            max_num=args.max,
            slots=store.index_slots,
            segment_size=store.commitlog_segment_size,
        )
    elif args.query_kind == "offset" and args.compacted:
        result = Q.query_compacted_offset(
            lake, topic=args.topic, queue=args.queue, offset=args.offset, max_num=args.max, tags=args.tags
        )
    elif args.query_kind == "offset":
        result = Q.query_offset(
            lake,
            topic=args.topic,
            queue=args.queue,
            offset=args.offset,
            max_num=args.max,
            tags=args.tags,
            segment_size=store.commitlog_segment_size,
            min_offsets=min_offsets,
        )
    else:
        topics = sorted({queue.topic for queue in state.commitlog.queue_heads}) if state.commitlog else []
        result = Q.query_msgid(
            lake,
            msg_id=args.id,
            topic=args.topic,
            slots=store.index_slots,
            segment_size=store.commitlog_segment_size,
            topics=topics,
        )
    rows = [Q.message_view(m, full=args.full or args.json) for m in result["rows"]]
    summary = {k: v for k, v in result.items() if k not in ("rows", "metrics")} | result.get("metrics", {})
    tracks = Q.message_tracks(lake, result["rows"]) if args.query_kind == "msgid" else []
    if args.json:
        _emit(
            args,
            [
                {"kind": "result", **summary},
                *({"kind": "message", **r} for r in rows),
                *({"kind": "track", **t} for t in tracks),
            ],
        )
    else:
        _emit(args, rows if rows else [{"messages": 0}])
        if tracks:
            sys.stdout.write("\nconsumed by the groups with offsets in the lake:\n")
            _emit(args, tracks)
        sys.stderr.write(", ".join(f"{k}={v}" for k, v in summary.items()) + "\n")
    return 0


def cmd_sql(args, settings) -> int:
    from rmqlake.reader import LakeReader
    from rmqlake.sql import printable_rows

    with LakeReader(settings) as reader:
        rows = list(printable_rows(reader.sql(args.statement)))
    _emit(args, rows)  # JSON lines, or a table ("(no rows)" when empty)
    return 0


def cmd_describe(args, settings) -> int:
    from rmqlake.lake.tables import TABLES

    if args.table is None:
        rows = [
            {"table": spec.name, "partitioned_by": ", ".join(spec.partition_by), "row": spec.description}
            for spec in TABLES.values()
        ]
    elif args.table in TABLES:
        spec = TABLES[args.table]
        rows = [
            {
                "column": column.name,
                "type": column.type,
                "partition": "yes" if column.name in spec.partition_by else "",
                "meaning": column.comment,
            }
            for column in spec.schema.columns
        ]
    else:
        raise UsageError(f"no table {args.table!r}; the tables are {', '.join(TABLES)}")
    args.full = True  # the meanings are the point: wrap them rather than shorten them
    _emit(args, rows)
    return 0


COMMANDS.update(
    describe=cmd_describe,
    sql=cmd_sql,
    generate=cmd_generate,
    ingest=cmd_ingest,
    reput=cmd_reput,
    compact=cmd_compact,
    expire=cmd_expire,
    vacuum=cmd_vacuum,
    **{"export-store": cmd_export_store, "import-store": cmd_import_store},
    offsets=cmd_offsets,
    lag=cmd_lag,
    pipeline=cmd_pipeline,
    quality=cmd_quality,
    status=cmd_status,
    query=cmd_query,
)


def _emit(args, result: dict | list[dict]) -> None:
    rows = result if isinstance(result, list) else [result]
    if args.json:
        for row in rows:
            sys.stdout.write(json.dumps(row, default=str, sort_keys=False) + "\n")
    else:
        from rmqlake.report import render_table

        sys.stdout.write(render_table(rows, full=getattr(args, "full", False)) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (never raises for user errors)."""
    parser = build_parser()
    try:
        args = merge_global_options(parser.parse_args(argv))
    except SystemExit as exc:  # argparse already printed the usage error
        return 2 if exc.code not in (0, None) else 0
    configure_logging(args.log_level)
    started = time.monotonic()
    try:
        settings = _settings(args)
        preflight(args, settings)
        with log_context(job=args.command):
            code = COMMANDS[args.command](args, settings)
    except RmqlakeError as exc:
        sys.stderr.write(f"rmqlake {args.command}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        # whoever read stdout stopped reading (`rmqlake status --json | head -1`): the command itself is done;
        # exit as a process that SIGPIPE ends, without a traceback or a second failure at the final flush
        _discard_stdout()
        return 141
    log.debug("%s finished in %.1fs", args.command, time.monotonic() - started)
    return code


def _discard_stdout() -> None:
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing is buffered for a pipe
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)


def console_main() -> None:
    """Console-script entry: exit with ``main``'s code even if a native library aborts at teardown."""
    code = main()
    _stop_spark()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stop_spark() -> None:
    """Stop the JVM's SparkContext (its executors, Python workers and temporary files) before the process exits.

    Not ``SparkSession.stop()``: that also shuts down PySpark's accumulator server, whose handler polls its
    socket once a second, so every command waited ~0.9 s more for a thread ``os._exit`` ends anyway."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None and context._jsc is not None:
        context._jsc.stop()


if __name__ == "__main__":
    console_main()
