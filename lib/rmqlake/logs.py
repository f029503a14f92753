"""Logging: one format for every rmqlake process, prefixed with the job, run and batch.

Logs go to stderr so that ``--json`` results on stdout can be piped.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from contextlib import contextmanager

_context: contextvars.ContextVar[str] = contextvars.ContextVar("rmqlake_log_context", default="")


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.run_context = _context.get()
        return True


def configure_logging(level: str = "INFO") -> None:
    """Send rmqlake's log lines to stderr (idempotent); quiet py4j and third parties."""
    root = logging.getLogger()
    if not any(getattr(h, "_rmqlake", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler._rmqlake = True  # type: ignore[attr-defined]
        handler.addFilter(_ContextFilter())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(run_context)s%(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("rmqlake").setLevel(level)
    for noisy in ("py4j", "pyspark", "great_expectations", "deltalake"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextmanager
def log_context(**fields: str | None):
    """Prefix log lines inside the block with ``[job=... run=... batch=...]``."""
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v)
    token = _context.set(f"[{text}] " if text else "")
    try:
        yield
    finally:
        _context.reset(token)
