"""A block of consecutive lines → one Arrow batch of ``PARSED_SCHEMA``: column-wise where ``blocks`` decides,
line by line (``lines``) for the rest."""

from __future__ import annotations

import gc
from contextlib import contextmanager

import numpy as np
import pyarrow as pa

from rmqlake.ingest.blocks import BlockColumns, parse_block
from rmqlake.ingest.lines import EndTransaction, ParseOptions, Rejection, line_parser
from rmqlake.ingest.message import MESSAGE_FIELDS, MESSAGE_TYPES

# A line is a message (its fields), a rejected line (``raw`` and ``reject_reason``), or the end of a transaction
# (``end_transaction`` and the ``end_*`` columns, with ``uniq_key``, ``store_timestamp``, ``topic`` and ``raw``).
END_FIELDS = [("end_transaction", pa.string()), ("end_producer_group", pa.string()), ("end_from_check", pa.bool_())]
PARSED_SCHEMA = pa.schema(
    [
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
        ("raw", pa.string()),
        ("reject_reason", pa.string()),
        *MESSAGE_FIELDS,
        *END_FIELDS,
    ]
)

_NO_MESSAGE = (None,) * len(MESSAGE_FIELDS)
_NO_END = (None,) * len(END_FIELDS)
_MESSAGE_POSITION = {name: index for index, name in enumerate(MESSAGE_TYPES)}


def parse_lines(
    lines: list[bytes],
    *,
    source_file: str,
    first_line: int,
    file_hash32: int,
    options: ParseOptions,
) -> pa.RecordBatch:
    """Parse consecutive lines of one file into one Arrow batch of ``PARSED_SCHEMA`` (in line order).

    Lines are accepted column-wise where possible (``blocks``);
    the others go through the per-line parser, which rejects them with a
    reason or accepts what the column-wise route does not handle.
    """
    parser = line_parser(options)
    with gc_paused():
        block = parse_block(parser, lines, first_line=first_line, file_hash32=file_hash32)
        accepted = _accepted_batch(source_file, first_line, block)
        if not len(block.undecided):
            return accepted
        positions = block.undecided.tolist()
        numbers = [first_line + position for position in positions]
        texts, reasons, rows = [], [], []
        _parse_into(numbers, file_hash32, [lines[p] for p in positions], parser, texts, reasons, rows)
        per_line = _parsed_batch(source_file, numbers, texts, reasons, rows)
        if not accepted.num_rows:
            return per_line
        in_line_order = np.argsort(np.concatenate([block.accepted, block.undecided]), kind="stable")
        merged = pa.Table.from_batches([accepted, per_line]).take(pa.array(in_line_order))
        return merged.combine_chunks().to_batches()[0]


def parse_numbered_lines(
    lines: list[bytes],
    numbers: list[int],
    *,
    source_file: str,
    file_hash32: int,
    options: ParseOptions,
) -> pa.RecordBatch:
    """Parse lines of one file that need not be consecutive (``numbers``: each line's number) by the per-line
    parser alone, into one batch of ``PARSED_SCHEMA`` (in the order given): the lines the JVM parser leaves."""
    parser = line_parser(options)
    texts, reasons, rows = [], [], []
    with gc_paused():
        _parse_into(numbers, file_hash32, lines, parser, texts, reasons, rows)
        return _parsed_batch(source_file, numbers, texts, reasons, rows)


def _accepted_batch(source_file: str, first_line: int, block: BlockColumns) -> pa.RecordBatch:
    count = len(block.accepted)
    nothing = pa.nulls(count, pa.string())
    arrays = [
        pa.repeat(pa.scalar(source_file, pa.string()), count),
        pa.array(block.accepted + first_line, pa.int64()),
        nothing,
        nothing,
    ]
    arrays += [block.columns[name] if count else pa.array([], t) for name, t in MESSAGE_FIELDS]
    arrays += [pa.nulls(count, t) for _, t in END_FIELDS]
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED_SCHEMA)


def _parsed_batch(source_file: str, numbers: range, texts: list, reasons: list, rows: list) -> pa.RecordBatch:
    count = len(numbers)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in (*MESSAGE_FIELDS, *END_FIELDS)]
    arrays = [
        pa.array([source_file] * count, pa.string()),
        pa.array(numbers, pa.int64()),
        pa.array(texts, pa.string()),
        pa.array(reasons, pa.string()),
    ]
    arrays += [
        pa.array(column, field_type)
        for column, (_, field_type) in zip(columns, (*MESSAGE_FIELDS, *END_FIELDS), strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED_SCHEMA)


def _parse_into(numbers, hash32, raws, parser, texts, reasons, rows) -> None:
    parse = parser.parse
    for source_line, raw in zip(numbers, raws, strict=True):
        try:
            message = parse(raw, source_line=source_line, file_hash32=hash32)
        except Rejection as exc:
            texts.append(raw.decode("utf-8", "replace"))
            reasons.append(str(exc))
            rows.append(_NO_MESSAGE + _NO_END)
            continue
        if type(message) is EndTransaction:
            texts.append(raw.decode("utf-8", "replace"))  # quoted if the end is rejected once its half is looked up
            reasons.append(None)
            rows.append(_end_row(message))
            continue
        texts.append(None)
        reasons.append(None)
        rows.append(message + _NO_END)


def _end_row(end: EndTransaction) -> tuple:
    row = list(_NO_MESSAGE)
    row[_MESSAGE_POSITION["topic"]] = end.topic
    row[_MESSAGE_POSITION["uniq_key"]] = end.uniq_key
    row[_MESSAGE_POSITION["store_timestamp"]] = end.store_timestamp
    return (*row, end.kind, end.producer_group, end.from_transaction_check)


@contextmanager
def gc_paused():
    """Parsing allocates many short-lived objects and no cycles: the cycle collector would only cost time (a
    third of the parse when it runs while a batch's rows are alive). They are freed by reference counting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
