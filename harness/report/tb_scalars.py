"""The collector's TensorBoard scalars: per rank and step, what the traces say about waiting.

One TensorBoard run per rank under `<report>/tb/rank<R>/` (the same layout as the training
job's `<run>/tb/`), rewritten on every collection so a re-run does not draw points twice.
"""

from __future__ import annotations

from pathlib import Path

from harness.paths import SCALARS_DIR, scalars_dir
from harness.report.records import RankRecord, Report, StepRecord
from harness.scalars import ScalarWriter, clear_event_files
from harness.write_faults import FaultLog

# StepRecord field -> tag
STEP_TAGS = {
    "host_step_ms": "collector/step_ms",
    "step_ms": "collector/device_span_ms",
    "wait_ms": "collector/wait_for_others_ms",
    "blame_ms": "collector/blame_ms",
    "exposed_comm_ms": "collector/exposed_comm_ms",
    "exposed_wait_ms": "collector/exposed_wait_ms",
    "exposed_transfer_ms": "collector/exposed_transfer_ms",
    "memcpy_ms": "collector/memcpy_ms",
    "idle_ms": "collector/idle_ms",
}
# RankRecord field -> tag, written once at step 0: the rank totals over the analysed steps
RANK_TAGS = {
    "mean_step_ms": "collector_total/mean_step_ms",
    "wait_ms": "collector_total/wait_for_others_ms",
    "blame_ms": "collector_total/blame_ms",
    "exposed_comm_ms": "collector_total/exposed_comm_ms",
    "exposed_wait_ms": "collector_total/exposed_wait_ms",
    "exposed_transfer_ms": "collector_total/exposed_transfer_ms",
    "cost_ms": "collector_total/straggler_cost_ms_per_step",
    "overlapped_comm_ms": "collector_total/overlapped_comm_ms",
}


def write_scalars(report: Report, out: Path) -> Path:
    """1. clear the event files of a previous collection under out/tb/; 2. per rank, one event
    per analysed step with the `STEP_TAGS` fields of report.json's steps table (lag = the time
    the others waited for this rank in that step); 3. the rank's totals at step 0."""
    faults = FaultLog(prog="harness.collect")
    root = out / SCALARS_DIR
    if root.is_dir():
        for d in root.iterdir():
            clear_event_files(d)
    by_rank: dict[int, list[StepRecord]] = {}
    for row in report.steps:
        by_rank.setdefault(row.rank, []).append(row)
    for r in report.ranks:
        w = ScalarWriter(scalars_dir(out, r.rank), faults=faults)
        try:
            for row in by_rank.get(r.rank, []):
                w.add(row.step, _values(row, STEP_TAGS))
            w.add(0, _values(r, RANK_TAGS))
        finally:
            w.close()
    return root


def _values(record: StepRecord | RankRecord, tags: dict[str, str]) -> dict[str, float]:
    """The record's fields named in `tags` that hold a value, by tag."""
    return {tag: float(v) for k, tag in tags.items() if (v := getattr(record, k)) is not None}
