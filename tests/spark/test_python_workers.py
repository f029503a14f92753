"""Spark's Python workers as rmqlake's session sets them up: a Unix domain socket to the JVM, and a worker's
long-lived objects frozen after the collection PySpark's daemon runs between tasks."""

from __future__ import annotations

from collections import defaultdict

import pytest

pytestmark = pytest.mark.spark


def test_a_reused_worker_has_its_objects_frozen_after_its_first_task(spark):
    assert spark.sparkContext.getConf().get("spark.python.unix.domain.socket.enabled") == "true"

    def task(rows):
        import gc
        import os

        import rmqlake  # noqa: F401 - what every rmqlake task imports first

        yield os.getpid(), gc.get_freeze_count()

    seen = defaultdict(list)
    for pid, frozen in spark.sparkContext.parallelize(range(12), 12).mapPartitions(task).collect():
        seen[pid].append(frozen)
    # a worker's first task may come before any collection of the daemon; every later one after one
    assert all(sum(1 for frozen in counts if frozen == 0) <= 1 for counts in seen.values())
    assert sum(len(counts) for counts in seen.values()) - len(seen) >= 1
