"""Writing the report folder: report.json, report.md, steps.csv, collectives.csv
(`write_report`), timeline.json and report.html (`write_view`)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.atomic import atomic_file, write_text_atomic
from harness.paths import COLLECTIVES_CSV, REPORT_HTML, REPORT_JSON, REPORT_MD, STEPS_CSV, TIMELINE_JSON
from harness.report.markdown import render_markdown
from harness.report.page import page_parts
from harness.report.records import Report, as_document

COLLECTIVE_COLUMNS = [
    "instance",
    "name",
    "pg",
    "step",
    "rank",
    "arrival_us",
    "wait_us",
    "transfer_us",
    "delay_share_us",
    "last_rank",
]


STEP_COLUMNS = [
    "rank",
    "step",
    "step_ms",
    "host_step_ms",
    "wait_ms",
    "blame_ms",
    "exposed_comm_ms",
    "exposed_wait_ms",
    "exposed_transfer_ms",
    "compute_ms",
    "comm_ms",
    "memcpy_ms",
    "idle_ms",
    "last_arriver",
    "rss_mb",
    "gpu_allocated_mb",
]


PART_CHARS = 1 << 16  # what write_json_in_parts holds before writing: 64 k characters (in pieces of a few
# characters each with indent, ~50 bytes of object apiece: 1 M characters held 8.5 MB at 1024 ranks)


def write_json_in_parts(path: Path, data: Any, **options: Any) -> None:
    """`json.dumps(data, **options) + "\n"` written to `path` (atomically), the encoder's pieces
    gathered up to PART_CHARS and written a part at a time: the same bytes without the whole
    text and its encoded copy in memory at once (report.json is several MB at 1024 ranks; with
    indent the json module encodes in Python either way)."""
    with atomic_file(path) as fh:
        parts: list[str] = []
        held = 0
        for piece in json.JSONEncoder(**options).iterencode(data):
            parts.append(piece)
            held += len(piece)
            if held >= PART_CHARS:
                fh.write("".join(parts).encode("utf-8"))
                parts, held = [], 0
        parts.append("\n")
        fh.write("".join(parts).encode("utf-8"))


def write_report(report: Report, out: Path, collectives: Iterable[dict[str, Any]] = ()) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = as_document(report)
    write_json_in_parts(out / REPORT_JSON, doc, indent=1, allow_nan=False)
    write_text_atomic(out / REPORT_MD, render_markdown(report))
    with (out / STEPS_CSV).open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=STEP_COLUMNS)
        w.writeheader()
        w.writerows(doc["steps"])
    with (out / COLLECTIVES_CSV).open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLLECTIVE_COLUMNS)
        w.writeheader()
        w.writerows(collectives)


def view_title(run_name: str) -> str:
    return f"Distributed view: {run_name}"


def write_view(report: Report, timeline: dict[str, Any] | None, out: Path) -> Path:
    """Write timeline.json and report.html (Plotly and the view's script inlined) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / TIMELINE_JSON, json.dumps(timeline, separators=(",", ":"), allow_nan=False) + "\n")
    name = report.run.run_id or out.resolve().parent.name
    path = out / REPORT_HTML
    with atomic_file(path) as fh:
        for part in page_parts(report, timeline, title=view_title(name), assets="inline"):
            fh.write(part if isinstance(part, bytes) else part.encode("utf-8"))
    return path
