"""Stragglers across profiler windows (harness/report/across_windows.py, `--window each`): exact
verdicts on hand-made window verdicts, and a real 3-window run collected window by window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.across_windows import WindowVerdict, across_windows, recurs, summary_lines

from jobs import REPO, collect_quietly, run_harness

pytestmark = pytest.mark.timing


def wv(window: int, verdict: str, stragglers: dict[int, str | None] | None = None) -> WindowVerdict:
    return WindowVerdict(
        window=window,
        verdict=verdict,
        steps=[10 * window, 10 * window + 5],
        stragglers=stragglers or {},
        report=f"r/window-{window}",
    )


def test_more_than_half_of_the_judged_windows_recur() -> None:
    assert [recurs(f, 3) for f in (0, 1, 2, 3)] == [False, False, True, True]
    assert [recurs(f, 2) for f in (1, 2)] == [False, True]
    assert [recurs(f, 4) for f in (2, 3)] == [False, True]
    assert not recurs(1, 1)  # one window compares with nothing


def test_a_rank_flagged_once_in_three_windows_is_noise() -> None:
    res = across_windows([wv(3, "straggler", {0: "backward"}), wv(1, "balanced"), wv(2, "balanced")])
    assert res.verdict == "balanced"
    assert [v.window for v in res.windows] == [1, 2, 3]
    [r] = res.ranks
    assert (r.rank, r.windows, r.judged, r.phases, r.phase, r.recurs) == (0, [3], 3, ["backward"], "backward", False)
    lines = summary_lines(res)
    assert lines[2] == "window 3 (steps 30-35): straggler: rank 0 (backward); report in r/window-3"
    assert lines[3] == (
        "across windows: balanced: no rank is a straggler in one phase in more than half of the 3 windows"
    )
    assert lines[4].startswith("across windows: flagged without recurring (rank 0 in 1 of 3 (backward))")


def test_a_rank_in_two_of_three_windows_is_a_straggler_and_a_one_off_beside_it_is_not() -> None:
    res = across_windows(
        [wv(1, "straggler", {1: "data"}), wv(2, "straggler", {0: "forward"}), wv(3, "straggler", {1: "data"})]
    )
    assert res.verdict == "straggler"
    assert [(r.rank, r.windows, r.recurs) for r in res.ranks] == [(1, [1, 3], True), (0, [2], False)]
    lines = summary_lines(res)
    assert lines[3] == "across windows: straggler: rank 1 is a straggler in 2 of 3 windows (data)"
    assert "rank 0 in 1 of 3 (forward)" in lines[4]


def test_a_rank_in_two_windows_in_two_phases_does_not_recur() -> None:
    # a clean 2.5 ms-step CPU DDP run: rank 0 flagged in backward, then in forward (noise hits
    # any phase); a straggler's cause stays in its phase
    res = across_windows([wv(1, "straggler", {0: "backward"}), wv(2, "balanced"), wv(3, "straggler", {0: "forward"})])
    assert res.verdict == "balanced"
    [r] = res.ranks
    assert (r.windows, r.phases, r.phase, r.recurs) == ([1, 3], ["backward", "forward"], "backward", False)
    assert "(rank 0 in 2 of 3 (backward, forward))" in summary_lines(res)[-1]
    # in one phase in two windows of three it does, beside a third window's other phase
    res = across_windows(
        [wv(1, "straggler", {0: "data"}), wv(2, "straggler", {0: "forward"}), wv(3, "straggler", {0: "data"})]
    )
    assert res.verdict == "straggler" and res.ranks[0].phase == "data"
    assert summary_lines(res)[3] == "across windows: straggler: rank 0 is a straggler in 2 of 3 windows (data)"


def test_windows_that_judge_nothing_do_not_count() -> None:
    # a hang and an inconclusive window leave one judged window: nothing to compare it with
    res = across_windows([wv(1, "straggler", {1: "data"}), wv(2, "inconclusive"), wv(3, "hang")])
    assert res.verdict == "inconclusive" and res.ranks[0].judged == 1 and not res.ranks[0].recurs
    assert summary_lines(res)[-1].startswith("across windows: inconclusive: 1 window(s) judged, 2 needed")
    # two judged windows of three: rank 1 in both recurs
    res = across_windows([wv(1, "straggler", {1: "data"}), wv(2, "inconclusive"), wv(3, "straggler", {1: "data"})])
    assert res.verdict == "straggler" and res.ranks[0].judged == 2


@pytest.mark.slow
def test_each_window_of_a_run_is_collected_and_compared(tmp_path: Path) -> None:
    """A 3-window run with a 30 ms straggler in rank 1's data phase: each window's report in its
    own folder, the straggler in every window, and windows.json saying it recurs."""
    steps = ["--steps", "32", "--warmup-steps", "2", "--wait", "3", "--warmup", "1", "--active", "6", "--repeat", "3"]
    args = ["--mode", "baseline", *steps, "--batch-size", "16", "--hidden", "128"]
    run = run_harness([*args, "--slow-rank", "1", "--slow-ms", "30", "--slow-phase", "data"], tmp_path)
    proc = collect_quietly(run.dir, "--window", "each")
    out = run.dir / "report"
    doc = json.loads((out / "windows.json").read_text())
    assert doc["verdict"] == "straggler"
    assert [w["window"] for w in doc["windows"]] == [1, 2, 3]
    assert [w["stragglers"] for w in doc["windows"]] == [[{"rank": 1, "phase": "data"}]] * 3
    assert doc["ranks"] == [
        {"rank": 1, "windows": [1, 2, 3], "judged": 3, "phases": ["data"] * 3, "phase": "data", "recurs": True}
    ]
    for w in (1, 2, 3):
        report = json.loads((out / f"window-{w}" / "report.json").read_text())
        assert report["window"]["window"] == w and report["verdict"] == "straggler"
    assert "across windows: straggler: rank 1 is a straggler in 3 of 3 windows (data)" in proc.stdout


def test_each_window_of_a_run_with_one_window_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank00000-vm.0001.pt.trace.json").write_text(json.dumps({"traceEvents": []}))
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(run), "--window", "each"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "--window each" in line and "1 profiler window" in line and "--repeat" in line
