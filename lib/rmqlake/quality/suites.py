"""The quality suites, built in code: ``<table>.<severity>``, each a frame builder and its expectations.

A critical expectation is an invariant of the store: when it fails the
tables are not what a broker would hold, and ``rmqlake quality`` exits
non-zero. A warning is reported and kept, and does not fail the run.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqlake.config import Settings
from rmqlake.formats.record import END_FILE_MIN_BLANK_LENGTH, MAGIC_V1, MAGIC_V2, RECORD_OVERHEAD_ALLOWANCE, record_size
from rmqlake.quality import frames

if TYPE_CHECKING:
    import great_expectations.expectations as gxe

GX_EXPECTATIONS = "great_expectations.expectations"

CRITICAL, WARNING = "critical", "warning"


def _gxe():
    """Great Expectations' expectation classes. Imported when the first suite's expectations are built, not
    with this module: importing GX takes seconds, and the command line checks suite names before Spark starts
    (see `import_gx_in_background`)."""
    return importlib.import_module(GX_EXPECTATIONS)


def import_gx_in_background() -> threading.Thread:
    """Start importing Great Expectations in a thread, so that it overlaps what the caller does next (starting
    Spark: a JVM launch and a wait). A later import of it waits for this one; one that failed here is tried
    again there, and raises there."""

    def load() -> None:
        with contextlib.suppress(Exception):  # the caller's own import raises it, with its traceback
            importlib.import_module(GX_EXPECTATIONS)

    thread = threading.Thread(target=load, name="import-great-expectations", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Suite:
    """``name`` = ``<table>.<severity>``; ``tables``: what ``frame`` reads (their versions are recorded)."""

    name: str
    tables: tuple[str, ...]
    frame: Callable  # (tables: dict[str, DataFrame], settings) -> DataFrame
    expectations: Callable  # (settings) -> list[gxe.Expectation]

    @property
    def table(self) -> str:
        """The table checked (its version goes to ``dq_results``); the others are read for cross-table facts."""
        return self.tables[0]

    @property
    def topic(self) -> str:
        """What the suite is about: the name before the severity (``expiry`` checks the ``segments`` table)."""
        return self.name.split(".", 1)[0]

    @property
    def severity(self) -> str:
        return self.name.split(".", 1)[1]


def _true(column: str, description: str) -> gxe.Expectation:
    """Every applicable row (not null) has ``column`` true."""
    return _gxe().ExpectColumnValuesToBeInSet(column=column, value_set=[True], description=description)


def record_size_bounds(settings: Settings) -> tuple[int, int]:
    """Smallest possible record (empty body, 1-byte topic, IPv4 hosts) and the largest the store accepts."""
    smallest = record_size(
        body_length=0, topic_length=1, properties_length=0, born_v6=False, store_v6=False, magic=MAGIC_V1
    )
    largest = min(
        settings.store.max_message_size + RECORD_OVERHEAD_ALLOWANCE,
        settings.store.commitlog_segment_size - END_FILE_MIN_BLANK_LENGTH,
    )
    return smallest, largest


def _commitlog_critical(settings: Settings) -> list:
    smallest, largest = record_size_bounds(settings)
    return [
        _gxe().ExpectColumnValuesToBeInSet(
            column="magic", value_set=[MAGIC_V1, MAGIC_V2], description="magic code is V1 or V2"
        ),
        _gxe().ExpectColumnValuesToBeBetween(
            column="total_size",
            min_value=smallest,
            max_value=largest,
            description="record size within the smallest record and what the store accepts",
        ),
        _true("size_matches_formula", "TOTALSIZE equals the size formula of the record's fields"),
        _true("crc_matches", "body CRC equals CRC32 of the body recomputed"),
        _true("msg_id_matches", "msg_id is the offsetMsgId of store host + physical offset"),
        _true("times_match", "store_time and born_time are store_timestamp and born_timestamp as timestamps"),
        _true("follows_previous", "each record starts where the previous record of its segment ends"),
        _true("segment_end_matches", "last record's end + recorded padding = the segment's end offset"),
        _true("queue_offset_follows", "queue offsets of dispatchable messages are contiguous per queue"),
        _gxe().ExpectColumnValuesToBeUnique(
            column="queue_slot", description="no two dispatchable messages share (topic, queue, queue offset)"
        ),
        _gxe().ExpectColumnValuesToNotBeNull(column="segment", description="every message belongs to a segment"),
    ]


def _segments_critical(settings: Settings) -> list:
    return [
        _true("follows_previous", "each segment starts where the previous one ends"),
        _gxe().ExpectColumnValuesToBeBetween(
            column="size_bytes",
            min_value=0,
            max_value=settings.store.commitlog_segment_size,
            description="segment sizes are at most store.commitlog_segment_size",
        ),
        _gxe().ExpectColumnValuesToBeInSet(
            column="status", value_set=["active", "sealed", "deleted"], description="status is known"
        ),
        _gxe().ExpectColumnValuesToBeUnique(column="active_marker", description="at most one active segment"),
        _gxe().ExpectColumnDistinctValuesToContainSet(
            column="active_marker", value_set=["active"], description="an active segment exists"
        ),
    ]


def _expiry_critical(settings: Settings) -> list:
    return [
        _true(
            "kept_explained",
            "no live segment older than retention (as of the last expiry run) unless its row explains why it is kept",
        ),
        _true("deletion_explained", "every deleted segment has a known reason and a deletion time"),
    ]


def _rejected_critical(settings: Settings) -> list:
    return [
        _gxe().ExpectColumnValuesToNotBeNull(column="reason", description="every rejected line has a reason"),
        _gxe().ExpectColumnValueLengthsToBeBetween(column="reason", min_value=1, description="reasons are not empty"),
        _gxe().ExpectColumnValuesToNotBeNull(column="source_file", description="every rejected line names its file"),
        _gxe().ExpectColumnValuesToBeBetween(
            column="source_line", min_value=1, description="every rejected line has its (1-based) line number"
        ),
    ]


def _consumequeue_critical(settings: Settings) -> list:
    return [
        _true(
            "points_to_message", "every unit at or above its queue's min offset points to a live message of its size"
        ),
        _true("tags_code_matches", "tags_code is the dispatcher's tagsCode of the message (TAGS hash, delay rule)"),
        _true("follows_previous", "queue offsets are contiguous per queue from the queue's min offset"),
        _gxe().ExpectCompoundColumnsToBeUnique(
            column_list=["topic", "queue_id", "queue_offset"], description="one unit per queue offset"
        ),
    ]


def _indexfile_critical(settings: Settings) -> list:
    return [
        _gxe().ExpectColumnValuesToBeBetween(
            column="slot",
            min_value=0,
            max_value=settings.store.index_slots - 1,
            description="slot within store.index_slots",
        ),
        _true("chain_points_back", "hash chains point back to an earlier entry of the same slot and file (no cycle)"),
        _true("header_counts_match", "header index_count = entries + 1 and hash_slot_count = slots in use"),
        _true(
            "points_to_key", "every entry at or above the min physical offset points to a live message with that key"
        ),
    ]


def _compaction_critical(settings: Settings) -> list:
    return [
        _gxe().ExpectCompoundColumnsToBeUnique(
            column_list=["topic", "queue_id", "kept_key"],
            ignore_row_if="any_value_is_missing",
            description="one compacted message per key and queue",
        ),
        _true(
            "kept_is_latest",
            "each kept message is its key's latest (none after a tombstone, no key missing)",
        ),
    ]


def _null(column: str, description: str) -> gxe.Expectation:
    """Every row has ``column`` null; a value is what is wrong, naming the record (GX lists the first ones)."""
    return _gxe().ExpectColumnValuesToBeNull(column=column, description=description)


def _schedule_critical(settings: Settings) -> list:
    return [
        _null(
            "due_delivery_problem",
            "every delay or timer record due by the lake's delivery clock has exactly one delivery on its real "
            "topic and queue, stored at its due time",
        ),
        _null("early_delivery_problem", "no delay or timer record due after the lake's delivery clock is delivered"),
        _null(
            "pending_problem",
            "the records not yet due, per delay level or timer and real topic, are the lake state's pending "
            "deliveries (count and first due time)",
        ),
    ]


def _transactions_critical(settings: Settings) -> list:
    return [
        _null(
            "commit_problem",
            "every commit re-put (COMMIT type, TRAN_MSG=true, REAL_TOPIC) points with its prepared_transaction_offset "
            "to a record on the half topic with the same UNIQ_KEY (unless expiry deleted it)",
        ),
        _null(
            "op_entry_problem",
            "every op record entry names the queue offset of a record on the half topic (unless expiry deleted it)",
        ),
    ]


def _transactions_warning(settings: Settings) -> list:
    return [
        _null(
            "repeated_end_problem",
            "each half message is ended at most once (a broker stores a second end when a producer retries its "
            "end or the check-back ends the half too)",
        ),
    ]


def _commitlog_warning(settings: Settings) -> list:
    return [
        _gxe().ExpectColumnValuesToBeUnique(
            column="resend_key",
            description="no UNIQ_KEY stored twice in a topic (a producer resent a message it thought lost)",
        ),
        _true("born_before_store", "producer clocks are not ahead of the broker's (born <= store timestamp)"),
    ]


def _rejected_warning(settings: Settings) -> list:
    return [
        _gxe().ExpectColumnValuesToBeBetween(
            column="reject_ratio",
            max_value=settings.quality.max_reject_ratio,
            description=f"each ingest batch rejects at most quality.max_reject_ratio "
            f"({settings.quality.max_reject_ratio:g}) of its lines",
        )
    ]


def _consumer_offsets_warning(settings: Settings) -> list:
    return [
        _true(
            "above_min",
            "no group's offset is below its queue's min offset (expiry removed messages it never consumed)",
        ),
        _true("within_max", "no group's offset is beyond its queue's max offset"),
    ]


SUITES: dict[str, Suite] = {
    suite.name: suite
    for suite in (
        Suite(
            "commitlog.critical",
            ("commitlog", "segments"),
            lambda t, settings: frames.commitlog_frame(t["commitlog"], t["segments"]),
            _commitlog_critical,
        ),
        Suite(
            "segments.critical",
            ("segments",),
            lambda t, settings: frames.segments_frame(t["segments"]),
            _segments_critical,
        ),
        Suite(
            "expiry.critical",
            ("segments",),
            lambda t, settings: frames.expiry_frame(
                t["segments"], as_of=t["expire_as_of"], reserved_hours=settings.retention.file_reserved_hours
            ),
            _expiry_critical,
        ),
        Suite("rejected.critical", ("rejected",), lambda t, settings: t["rejected"], _rejected_critical),
        Suite(
            "compaction_log.critical",
            ("compaction_log", "commitlog"),
            lambda t, settings: frames.compaction_frame(
                t["compaction_log"],
                t["commitlog"],
                positions=t["compaction_positions"],
                min_physical_offset=t["min_physical_offset"],
            ),
            _compaction_critical,
        ),
        Suite(
            "consumequeue.critical",
            ("consumequeue", "commitlog"),
            lambda t, settings: frames.consumequeue_frame(
                t["consumequeue"],
                t["commitlog"],
                t["queue_min_offsets"],
                delay_levels=settings.schedule_rules().delay_levels,
            ),
            _consumequeue_critical,
        ),
        Suite(
            "indexfile.critical",
            ("indexfile", "indexfile_header", "commitlog"),
            lambda t, settings: frames.indexfile_frame(
                t["indexfile"], t["indexfile_header"], t["commitlog"], t["min_physical_offset"]
            ),
            _indexfile_critical,
        ),
        Suite(
            "schedule.critical",
            ("commitlog",),
            lambda t, settings: frames.schedule_frame(
                t["commitlog"], schedule=t["schedule"], rules=settings.schedule_rules()
            ),
            _schedule_critical,
        ),
        Suite(
            "transactions.critical",
            ("commitlog",),
            lambda t, settings: frames.transaction_frame(t["commitlog"], min_physical_offset=t["min_physical_offset"]),
            _transactions_critical,
        ),
        Suite(
            "commitlog.warning",
            ("commitlog",),
            lambda t, settings: frames.producer_frame(t["commitlog"]),
            _commitlog_warning,
        ),
        Suite(
            "rejected.warning",
            ("rejected", "ingest_files"),
            lambda t, settings: frames.reject_ratio_frame(t["rejected"], t["ingest_files"]),
            _rejected_warning,
        ),
        Suite(
            "transactions.warning",
            ("commitlog",),
            lambda t, settings: frames.transaction_frame(t["commitlog"], min_physical_offset=t["min_physical_offset"]),
            _transactions_warning,
        ),
        Suite(
            "consumer_offsets.warning",
            ("consumer_offsets", "consumequeue"),
            lambda t, settings: frames.consumer_offsets_frame(t["consumer_offsets"], t["queue_bounds"]),
            _consumer_offsets_warning,
        ),
    )
}


def select_suites(names: list[str] | None) -> list[Suite]:
    """The suites to run: all, or those named (a table name selects all its suites).

    Raises:
        KeyError: a name that is neither a suite nor a table with suites, with the allowed names.
    """
    if not names:
        return list(SUITES.values())
    chosen: list[Suite] = []
    for name in names:
        matches = [s for s in SUITES.values() if name in (s.name, s.name.split(".")[0], s.table)]
        if not matches:
            allowed = ", ".join(
                sorted({*SUITES, *(n for s in SUITES.values() for n in (s.table, s.name.split(".")[0]))})
            )
            raise KeyError(f"--suite {name!r} is not a quality suite; allowed: {allowed}")
        chosen += [s for s in matches if s not in chosen]
    return chosen
