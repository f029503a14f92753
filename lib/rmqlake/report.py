"""Plain-text tables for terminal output (results on stdout)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

MAX_CELL = 60


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    text = json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
    if len(text) > MAX_CELL:  # long topics and bodies: keep both ends (--json shows everything)
        half = (MAX_CELL - 3) // 2
        text = text[:half] + "..." + text[-half:]
    return text


def render_table(rows: Sequence[Mapping]) -> str:
    """One row: a two-column key/value listing. Several rows: columns with a header."""
    if not rows:
        return "(no rows)"
    if len(rows) == 1:
        width = max(len(k) for k in rows[0])
        return "\n".join(f"{key.ljust(width)}  {_cell(value)}" for key, value in rows[0].items())
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
