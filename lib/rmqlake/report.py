"""Tables for terminal output (results on stdout), drawn with rich.

Nested dicts become ``parent.child`` columns, numbers are right-aligned and
long cells wrap to the terminal's width. Without ``full`` a cell longer than
``MAX_CELL`` keeps both ends (``--json`` and ``--full`` show everything).
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Mapping, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

MAX_CELL = 60
DEFAULT_WIDTH = 120  # when the output is not a terminal and $COLUMNS is unset


def flatten(row: Mapping, prefix: str = "") -> dict:
    """``{"disk": {"used": 1}}`` → ``{"disk.used": 1}``, at any depth; an empty dict stays one cell."""
    flat = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value, *, full: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    text = json.dumps(value, default=str) if isinstance(value, (dict, list, tuple)) else str(value)
    if not full and len(text) > MAX_CELL:  # long topics and bodies: keep both ends
        half = (MAX_CELL - 3) // 2
        text = text[:half] + "..." + text[-half:]
    return text


def render_table(rows: Sequence[Mapping], *, full: bool = False, width: int | None = None) -> str:
    """One row: a two-column key/value listing. Several rows: columns with a header.

    Args:
        rows: the rows; nested dicts are flattened into ``a.b`` columns.
        full: never shorten a cell (long values wrap instead).
        width: the width to wrap to (default: the terminal's, else ``$COLUMNS``, else 120).
    """
    if not rows:
        return "(no rows)"
    rows = [flatten(row) for row in rows]
    width = width or shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    if len(rows) == 1:
        table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        table.add_column("key", no_wrap=True)
        table.add_column("value", overflow="fold")
        for key, value in rows[0].items():
            table.add_row(key, _cell(value, full=full))
    else:
        columns = list(dict.fromkeys(key for row in rows for key in row))
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for column in columns:
            values = [row[column] for row in rows if row.get(column) is not None]
            numeric = bool(values) and all(_is_number(v) for v in values)
            table.add_column(column, justify="right" if numeric else "left", overflow="fold")
        for row in rows:
            table.add_row(*(_cell(row.get(c), full=full) for c in columns))
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False, markup=False, emoji=False)
    console.print(table, soft_wrap=False)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())
