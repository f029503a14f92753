"""Shared helpers of the benchmark scripts: data generation (cached), machine facts, output."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
sys.path.insert(0, str(REPO / "lib"))
# What the writers' layout of a lake's files is: a lake a benchmark keeps under bench/out and built with another
# layout is built again (a benchmark reads what the writers write now, not what they wrote then).
LAKE_LAYOUT = "commitlog: row groups of 4 MiB, pages of 256 rows with an offset index, integers as deltas"
# the bench topic plan: (name, queues, COMPACTION), as conf/topics.yaml declares them
TOPIC_PLAN = (("OrderEvents", 8, False), ("UserProfile", 4, True), ("Clickstream", 4, False))


def machine() -> dict:
    import deltalake
    import pyarrow
    import pyspark

    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "deltalake": deltalake.__version__,
        "pyarrow": pyarrow.__version__,
        "platform": platform.platform(),
    }


def dataset(
    name: str, *, messages: int, body_size: int, hours: int = 6, seed: int = 1, transaction_share: float = 0.0
) -> Path:
    """Generated producer logs under bench/out/<name>, reused while the parameters are the same.

    ``transaction_share``: the share of plain messages sent as a transactional producer's halves, each with its
    end line (``rmqlake.generate``)."""
    from rmqlake.generate import TopicPlan, generate

    root = OUT / name
    wanted = {"messages": messages, "body_size": body_size, "hours": hours, "seed": seed}
    if transaction_share:
        wanted["transaction_share"] = transaction_share
    marker = root / "PARAMS.json"
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return root / "landing"
    shutil.rmtree(root, ignore_errors=True)
    topics = [TopicPlan(*plan) for plan in TOPIC_PLAN]
    started = time.monotonic()
    generate(root, messages=messages, topics=topics, hours=hours, seed=seed, body_size=body_size,
             transaction_share=transaction_share)  # fmt: skip
    marker.write_text(json.dumps(wanted))
    print(f"generated {messages:,} messages in {time.monotonic() - started:.0f}s into {root}", file=sys.stderr)
    return root / "landing"


def warmup_input(*, body_size: int = 1024) -> Path:
    """The sample a benchmark ingests (and reputs) before it measures, in the same session: ~120 MB, enough that
    the JIT has compiled the JVM parser's loops (a cold process pays a few seconds more, see RESULTS.md)."""
    return dataset("ingest-warmup-100k", messages=100_000, body_size=body_size, hours=2, seed=2)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@contextmanager
def timed():
    result = {}
    started = time.monotonic()
    yield result
    result["seconds"] = time.monotonic() - started


def report(title: str, rows: list[dict], summary: dict, *, as_json: bool) -> None:
    from rmqlake.report import render_table

    if as_json:
        print(json.dumps({"benchmark": title, **summary, "rows": rows, "machine": machine()}))
        return
    print(f"\n== {title} ==")
    print(render_table(rows))
    print()
    print(render_table([summary]))
    print()
    print(render_table([machine()]))
