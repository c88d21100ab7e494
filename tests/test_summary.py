"""`harness.summary`: a report as one flat dict for experiment trackers, from a hand-built run whose
answers are known (tests/tracebuild.py), through what the collector writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness
from harness.report.document import build_report
from harness.report.summary import SummaryError, SummaryRecord

from tracebuild import ring_docs, run_analysis

KEYS = [
    "verdict",
    "stragglers",
    "straggler_rank",
    "straggler_host",
    "straggler_phase",
    "straggler_late_ms",
    "step_ms_p50",
    "step_ms_p90",
    "exposed_comm_share",
    "data_share",
    "peak_gpu_allocated_bytes",
    "peak_rss_bytes",
    "noise_bound_ms",
    "ranks",
]


def test_the_keys_are_stable() -> None:
    assert list(SummaryRecord.__dataclass_fields__) == KEYS


def test_a_straggler_run_in_figures(tmp_path: Path) -> None:
    # 4 GPU ranks, 4 steps of 1 ms; rank 2 arrives at its all-reduce at 700 us, the others at
    # 300: 0.4 ms late a step; the device spans are 1000 us (the last 800: its all-reduce's end)
    late = {2: 700.0}
    doc = build_report(run_analysis(tmp_path, ring_docs(lambda r, s: late.get(r, 300.0), 4, 4)), ["x"])
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.json").write_text(json.dumps(doc))
    s = harness.summary(tmp_path)  # the run folder: its report/report.json
    assert list(s) == KEYS
    assert (s["verdict"], s["stragglers"], s["straggler_rank"], s["ranks"]) == ("straggler", 1, 2, 4)
    assert s["straggler_late_ms"] == pytest.approx(0.4)
    assert s["step_ms_p50"] == pytest.approx(1.0) and s["step_ms_p90"] == pytest.approx(1.0)
    # the victims wait 400 us a step exposed, rank 2 none: 3 x 0.4 ms of 4 ranks' steps (3.8 ms each)
    assert s["exposed_comm_share"] == pytest.approx(
        sum(r["exposed_comm_ms"] for r in doc["ranks"]) / sum(r["mean_step_ms"] * r["steps"] for r in doc["ranks"])
    )
    assert s["peak_gpu_allocated_bytes"] is None and s["noise_bound_ms"] == doc["noise_floor"]["bound_ms"]
    assert harness.summary(tmp_path / "report") == s == harness.summary(doc)
    numbers = harness.summary(tmp_path / "report" / "report.json", numbers_only=True)
    assert "verdict" not in numbers and "peak_rss_bytes" not in numbers
    assert all(isinstance(v, int | float) for v in numbers.values())


def test_no_report_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(SummaryError, match=r"no report.json there nor in report/; run `python -m harness.collect"):
        harness.summary(tmp_path)
    (tmp_path / "report.json").write_text("{")
    with pytest.raises(SummaryError, match="not a readable report.json"):
        harness.summary(tmp_path)
