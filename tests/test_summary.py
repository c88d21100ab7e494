"""`harness.summary`: a report as one flat dict for experiment trackers, from a hand-built run whose
answers are known (tests/tracebuild.py), through what the collector writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness.report.document import build_report
from harness.report.records import as_document
from harness.report.summary import SummaryError
from harness.tracker_summary import SummaryRecord

from jobs import REPO
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
    doc = as_document(build_report(run_analysis(tmp_path, ring_docs(lambda r, s: late.get(r, 300.0), 4, 4)), ["x"]))
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


def test_a_runs_own_summary_has_the_same_keys(tmp_path: Path) -> None:
    # one process, 6 steps of a 10 ms data phase in a 20 ms step, the watch off: no verdict to
    # give, the step statistics and the data share the job measured itself
    code = (
        "import json, sys, time, harness\n"
        f"run = harness.Run(log_dir={str(tmp_path)!r}, run_name='own', profile=False, steps=6, warmup_steps=1)\n"
        "try:\n"
        "    run.summary()\n"
        "except RuntimeError as exc:\n"
        "    print('before close:', exc)\n"
        "with run:\n"
        "    for _ in range(6):\n"
        "        with run.step():\n"
        "            with run.phase('data'):\n"
        "                time.sleep(0.01)\n"
        "            with run.phase('forward'):\n"
        "                time.sleep(0.01)\n"
        "print(json.dumps(run.summary()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "before close: Run.summary() reads the finished run" in out.stdout
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert list(s) == KEYS
    assert (s["verdict"], s["stragglers"], s["straggler_rank"], s["ranks"]) == ("inconclusive", 0, None, 1)
    assert 18.0 < s["step_ms_p50"] <= s["step_ms_p90"] < 200.0  # two 10 ms sleeps a step, a loaded machine's margin
    assert 0.3 < s["data_share"] < 0.7 and s["exposed_comm_share"] is None and s["peak_rss_bytes"] > 0
