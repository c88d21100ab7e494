"""The view's files in a report folder: timeline.json and the self-contained report.html."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.atomic import write_text_atomic
from harness.paths import REPORT_HTML, TIMELINE_JSON
from harness.view.render import render_page


def view_title(run_name: str) -> str:
    return f"Distributed view: {run_name}"


def write_view(doc: dict[str, Any], timeline: dict[str, Any], out: Path) -> Path:
    """Write timeline.json and report.html (Plotly and the view's script inlined) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / TIMELINE_JSON, json.dumps(timeline, separators=(",", ":"), allow_nan=False) + "\n")
    name = doc["run"]["run_id"] or out.resolve().parent.name
    path = out / REPORT_HTML
    write_text_atomic(path, render_page(doc, timeline, title=view_title(name), assets="inline"))
    return path
