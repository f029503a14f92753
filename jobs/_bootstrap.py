"""Shared start of every ``jobs/*.py``: find the library, then run one CLI command.

With ``--py-files dist/rmqlake.zip`` the package is already importable;
from a checkout, ``lib/`` is put on the path (for the driver, and for the
executors through ``spark.submit.pyFiles`` when Spark starts).
"""

from __future__ import annotations

import os
import sys


def _ensure_library() -> None:
    try:
        import rmqlake
    except ImportError:
        lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "lib")
        sys.path.insert(0, os.path.abspath(lib))
        import rmqlake  # noqa: F401


def run_job(command: str, argv: list[str]) -> int:
    """Run ``rmqlake <command> <argv>`` in this (spark-submit) process and return its exit code."""
    _ensure_library()
    from rmqlake.cli import main
    from rmqlake.session import separate_stderr

    separate_stderr()  # logs to stderr, results to stdout, as `rmqlake` prints them
    return main([command, *argv])
