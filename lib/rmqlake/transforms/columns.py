"""Byte rules of ``rmqlake.formats`` as Spark column expressions, for filters on the commitlog."""

from __future__ import annotations

from pyspark.sql import functions as F

from rmqlake.formats.record import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK


def dispatchable():
    """NOT_TYPE and COMMIT messages take a queue offset and a CQ unit (``formats.record.consumes_queue_offset``)."""
    return F.col("sys_flag").bitwiseAND(TRANSACTION_TYPE_MASK).isin(TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
