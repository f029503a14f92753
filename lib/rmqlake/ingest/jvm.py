"""The parse options as the JVM line parser (``rmqlake.jvm.CommonLineParser``, built by ``make jars``) takes them.

The JVM parser accepts the lines of the common shape and leaves every other line to the per-line parser
(``lines``), the reference; ``tests/unit/test_jvm_lines.py`` holds the two to the same fields line by line.
``rmqlake.jvm.IngestParse`` is the ingest's parse stage in the JVM: a Spark job (started here, from the driver)
whose task per split runs ``rmqlake.jvm.SplitScratch`` over it and writes the split's scratch and narrow files of
the messages the JVM parser accepts, and the lines it leaves, which ``ingest.tasks.parse_remainder`` then parses
in Python. ``tests/spark/test_ingest_jvm.py`` holds the two routes to the same files.

What the JVM parser cannot work out the same way by itself comes from here, computed by the reference's own code:
the month starts a generated UNIQ_KEY counts from, in the broker's zone (Python's zone database, not the JVM's,
which may be of another release).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from rmqlake.formats.msgid import month_start_millis
from rmqlake.ingest.lines import ParseOptions

# Months of the table: a line born outside them is left to the per-line parser.
FIRST_YEAR, END_YEAR = 1970, 2200
_DAY = timedelta(days=1)


def month_table(zone: str, *, first_year: int = FIRST_YEAR, end_year: int = END_YEAR) -> list[tuple[int, bool]]:
    """(start in epoch ms, plain) of each month from ``first_year`` to ``end_year`` (exclusive) in ``zone``.

    The start is ``month_start_millis`` of an instant inside the month. A month is plain when its start is a
    whole minute and the zone's offset is the same a day before and a day after it: every instant from it to the
    next month's start then has that month's start (no zone change moves the local date across the 1st).
    """
    tz = ZoneInfo(zone)
    table = []
    for year in range(first_year, end_year):
        for month in range(1, 13):
            inside = datetime(year, month, 15, 12, tzinfo=tz)
            start = month_start_millis(int(inside.timestamp() * 1000), zone)
            moment = datetime.fromtimestamp(start / 1000, UTC)
            plain = (
                start % 60_000 == 0
                and (moment - _DAY).astimezone(tz).utcoffset() == (moment + _DAY).astimezone(tz).utcoffset()
                and moment.astimezone(tz).month == month
                and (moment - timedelta(milliseconds=1)).astimezone(tz).month != month
            )
            table.append((start, plain))
    return table


def options_text(options: ParseOptions) -> str:
    """``options`` in the JVM parser's format: tab-separated lines (``ParseLinesTool.readOptions``)."""
    lines = [
        f"default_queue_count\t{options.default_queue_count if options.default_queue_count is not None else ''}",
        f"max_message_size\t{options.max_message_size}",
        f"segment_size\t{options.segment_size}",
        f"cluster_name\t{options.cluster_name}",
        f"default_store_host\t{options.default_store_host}",
        f"default_born_host\t{options.default_born_host}",
    ]
    # A topic with a tab or line break is not a valid topic (no line of it is accepted): it is left out.
    lines += [f"queue\t{topic}\t{count}" for topic, count in sorted(options.queue_counts.items()) if _plain(topic)]
    lines += [f"compaction\t{topic}" for topic in sorted(options.compaction_topics) if _plain(topic)]
    for value in (options.cluster_name, options.default_store_host, options.default_born_host):
        _check_field(value)
    lines += [f"month\t{start}\t{int(plain)}" for start, plain in month_table(options.timezone)]
    return "\n".join(lines) + "\n"


def _plain(value: str) -> bool:
    return not any(c in value for c in "\t\n\r")


def _check_field(value: str) -> None:
    if not _plain(value):
        raise ValueError(f"a tab or line break in {value!r} cannot be passed to the JVM line parser")


JOB_CLASS = "rmqlake.jvm.IngestParse"


@dataclass(frozen=True)
class JvmSplit:
    """A split for the JVM parse job: the input's local path and the local paths of the files it writes."""

    split: int
    file_rank: int
    path: str
    start: int
    end: int
    first_line: int
    hash32: int
    scratch: str
    narrow: str
    undecided: str

    def line(self) -> str:
        fields = [self.split, self.file_rank, self.path, self.start, self.end, self.first_line, self.hash32,
                  self.scratch, self.narrow, self.undecided]  # fmt: skip
        return "\t".join(str(field) for field in fields)


def passable(path: str) -> bool:
    """Whether ``path`` can be given to the JVM job: UTF-8 text without tabs or line breaks (its separators)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a file name of undecodable bytes (surrogate escapes)
        return False
    return _plain(path)


@dataclass(frozen=True)
class JvmSplitCounts:
    """What the JVM found in a split: its lines, the messages it accepted (``halves`` of them transactional halves)
    and the lines it left undecided; or, ``gave_up``, why it left the whole split to the Python route (it wrote no
    file of it)."""

    split: int
    lines: int
    accepted: int
    undecided: int
    last_store_timestamp: int | None
    halves: int = 0
    gave_up: str | None = None


def parse_in_jvm(spark, splits: list[JvmSplit], *, options: ParseOptions) -> list[JvmSplitCounts]:
    """Run the JVM parse job over ``splits`` (a Spark task each); their counts, in the order of ``splits``."""
    if not splits:
        return []
    job = spark._jvm.rmqlake.jvm.IngestParse
    answer = job.run(spark._jsc, options_text(options), "\n".join(split.line() for split in splits))
    counts = []
    for line in answer.split("\n"):
        fields = line.split("\t")
        if fields[1] == "gave up":
            counts.append(JvmSplitCounts(int(fields[0]), 0, 0, 0, None, gave_up=fields[2]))
            continue
        split, lines, accepted, undecided, halves, latest = fields
        counts.append(
            JvmSplitCounts(
                int(split), int(lines), int(accepted), int(undecided), int(latest) if latest else None, int(halves)
            )
        )
    if [c.split for c in counts] != [s.split for s in splits]:
        raise AssertionError("the JVM parse job did not answer for every split, in order")
    return counts
