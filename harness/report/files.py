"""Writing the report folder: report.json, report.md, steps.csv, collectives.csv
(`write_report`), timeline.json and report.html (`write_view`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from harness.atomic import atomic_file, write_text_atomic
from harness.paths import COLLECTIVES_CSV, REPORT_HTML, REPORT_JSON, REPORT_MD, STEPS_CSV, TIMELINE_JSON
from harness.report.markdown import render_markdown
from harness.report.page import page_parts

COLLECTIVE_COLUMNS = ["instance", "name", "pg", "step", "rank", "arrival_us", "wait_us", "transfer_us",
                      "delay_share_us", "last_rank"]



STEP_COLUMNS = ["rank", "step", "step_ms", "wait_ms", "lag_ms", "exposed_comm_ms", "exposed_wait_ms",
                "exposed_transfer_ms", "compute_ms", "comm_ms", "memcpy_ms", "idle_ms", "last_arriver", "rss_mb",
                "gpu_allocated_mb"]


def write_report(doc: dict[str, Any], out: Path, collectives: list[dict[str, Any]] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / REPORT_JSON, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    write_text_atomic(out / REPORT_MD, render_markdown(doc))
    with (out / STEPS_CSV).open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=STEP_COLUMNS)
        w.writeheader()
        w.writerows(doc["steps"])
    with (out / COLLECTIVES_CSV).open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLLECTIVE_COLUMNS)
        w.writeheader()
        w.writerows(collectives or [])



def view_title(run_name: str) -> str:
    return f"Distributed view: {run_name}"


def write_view(doc: dict[str, Any], timeline: dict[str, Any], out: Path) -> Path:
    """Write timeline.json and report.html (Plotly and the view's script inlined) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / TIMELINE_JSON, json.dumps(timeline, separators=(",", ":"), allow_nan=False) + "\n")
    name = doc["run"]["run_id"] or out.resolve().parent.name
    path = out / REPORT_HTML
    with atomic_file(path) as fh:
        for part in page_parts(doc, timeline, title=view_title(name), assets="inline"):
            fh.write(part.encode("utf-8"))
    return path
