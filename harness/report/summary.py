"""A report in one flat record for experiment trackers: `harness.summary(report)`.

    import harness, wandb
    wandb.log(harness.summary("profiler_logs/mine"))                       # W&B takes any values
    mlflow.log_metrics(harness.summary("profiler_logs/mine", numbers_only=True))   # MLflow: numbers

The keys (`SummaryRecord`'s fields, in order) are stable: a new one may be added, none is renamed
or dropped. A figure the report does not hold (no straggler, no step logs, no GPU) is None, and
left out with `numbers_only`. Torch-free: it reads report.json, what the collector wrote.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.paths import REPORT_DIR, REPORT_JSON
from harness.tracker_summary import SummaryRecord, flat


class SummaryError(ValueError):
    """No report where one was given; the message says what to run."""


def read_report(path: Path) -> tuple[dict[str, Any], Path]:
    """report.json's content and where it is: `path` itself, `path`/report.json (a report folder)
    or `path`/report/report.json (a run folder)."""
    for candidate in (path, path / REPORT_JSON, path / REPORT_DIR / REPORT_JSON):
        if candidate.is_file():
            try:
                doc = json.loads(candidate.read_text())
            except (OSError, ValueError) as exc:
                raise SummaryError(f"{candidate}: not a readable report.json ({exc}); collect the run again") from None
            if not isinstance(doc, dict) or "verdict" not in doc:
                raise SummaryError(f"{candidate}: not the collector's report.json; collect the run again")
            return doc, candidate
    raise SummaryError(
        f"{path}: no {REPORT_JSON} there nor in {REPORT_DIR}/; run `python -m harness.collect {path}` first"
    )


def _read(report: str | Path | dict[str, Any]) -> dict[str, Any]:
    """report.json's content from the content itself, report.json, a report folder or a run folder."""
    if isinstance(report, dict):
        return report
    return read_report(Path(report))[0]


def _percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary_record(report: str | Path | dict[str, Any]) -> SummaryRecord:
    """The report's `SummaryRecord`:
    1. the straggler is the report's first (the latest); the verdict is the report's;
    2. per step, the median over the ranks of their step (steps[].step_ms), then p50 and p90
       over the steps;
    3. exposed_comm_share = the ranks' exposed communication over their step time, totals;
    4. data_share = the mean of the diagnosis rows' data_share; peaks = the largest over ranks."""
    doc = _read(report)
    stragglers = doc.get("stragglers") or []
    first = stragglers[0] if stragglers else None
    by_step: dict[int, list[float]] = defaultdict(list)
    for row in doc.get("steps") or []:
        by_step[row["step"]].append(row["step_ms"])
    steps = sorted(statistics.median(v) for v in by_step.values())
    ranks = doc.get("ranks") or []
    step_total = sum((r.get("mean_step_ms") or 0.0) * r.get("steps", 0) for r in ranks)
    exposed = sum(r.get("exposed_comm_ms", 0.0) for r in ranks)
    data = [d["evidence"]["data_share"] for d in doc.get("diagnosis") or [] if "data_share" in d.get("evidence", {})]

    def peak(key: str) -> float | None:
        values = [r[key] for r in ranks if r.get(key) is not None]
        return max(values) if values else None

    floor = doc.get("noise_floor") or {}
    return SummaryRecord(
        verdict=doc["verdict"],
        stragglers=len(stragglers),
        straggler_rank=first["rank"] if first else None,
        straggler_host=first.get("host") if first else None,
        straggler_phase=first.get("phase") if first else None,
        straggler_late_ms=first.get("late_ms") if first else None,
        step_ms_p50=_percentile(steps, 50),
        step_ms_p90=_percentile(steps, 90),
        exposed_comm_share=exposed / step_total if step_total > 0 else None,
        data_share=statistics.mean(data) if data else None,
        peak_gpu_allocated_bytes=peak("peak_gpu_allocated_bytes"),
        peak_rss_bytes=peak("peak_rss_bytes"),
        noise_bound_ms=floor.get("bound_ms"),
        ranks=len(ranks),
    )


def summary(report: str | Path | dict[str, Any], *, numbers_only: bool = False) -> dict[str, Any]:
    """`summary_record(report)` as a flat dict, keys in `SummaryRecord`'s order; with
    `numbers_only`, only its numbers (what MLflow's log_metrics takes)."""
    return flat(summary_record(report), numbers_only)
