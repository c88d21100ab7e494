"""Tables for the console (right-aligned plain text) and for Markdown reports (torch-free)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Column = tuple[str, str, str]  # (key in the row, title, format string)


def render(rows: list[dict[str, Any]], cols: list[Column], mark: Callable[[dict[str, Any]], str] = lambda r: "") -> str:
    """One line per row; a missing (None) value prints as '-'; `mark(row)` is appended to its line."""
    body = [["-" if r.get(key) is None else fmt.format(r[key]) for key, _, fmt in cols] for r in rows]
    header = [title for _, title, _ in cols]
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    for r, b in zip(rows, body):
        lines.append("  ".join(c.rjust(w) for c, w in zip(b, widths)) + mark(r))
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], cols: list[Column]) -> list[str]:
    """Markdown table lines; numeric columns (any format but '{}') right-aligned, None as '-'."""
    head = "| " + " | ".join(t for _, t, _ in cols) + " |"
    sep = "|" + "|".join("---:" if f != "{}" else "---" for _, _, f in cols) + "|"
    body = ["| " + " | ".join("-" if r.get(k) is None else f.format(r[k]) for k, _, f in cols) + " |" for r in rows]
    return [head, sep, *body]
