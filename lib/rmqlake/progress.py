"""Stage timing and progress lines for long jobs."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager


class Stages:
    """Times named stages of a run; ``seconds`` goes into the run's metrics.

    Example:
        >>> stages = Stages(logging.getLogger("x"))
        >>> with stages("parse") as note:
        ...     note["rows"] = 10
    """

    def __init__(self, logger: logging.Logger):
        self.log = logger
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        started = time.monotonic()
        note: dict = {}
        yield note
        elapsed = time.monotonic() - started
        self.seconds[name] = round(self.seconds.get(name, 0.0) + elapsed, 3)
        details = ", ".join(f"{k} {v}" for k, v in note.items())
        rows = note.get("rows")
        rate = f", {rows / elapsed:,.0f} rows/s" if rows and elapsed > 0 else ""
        self.log.info("%s done in %.1fs%s%s", name, elapsed, f" ({details})" if details else "", rate)
