"""Every straggler named, victims diagnosed on their own work, and the what-if against a measured
clean run: real torchrun jobs on CPU/gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.traces.analyse.advisor import classify

from identities import check_report
from jobs import LAB_SIZE, REPO, run_harness, said

pytestmark = [pytest.mark.slow, pytest.mark.timing]

STEPS = ["--steps", "12", "--warmup-steps", "2", "--wait", "3", "--warmup", "1", "--active", "6"]
# The demo's job (Makefile DEMO_ARGS) at test size: torch mode at the tests' batch (jobs.LAB_SIZE:
# its ops stay clear of the launch bound with another process beside it), DDP, rank 1 slow in its
# data phase; 10 recorded steps for a steadier mean. The delay is STRAGGLER_SHARE of the clean run's
# step (at least 15 ms) rather than fixed: a straggler must be late by more than the run's bound
# (stragglers.straggler_bounds: its jitter and clock noise, 8% of the step at least), and a
# slower machine both lengthens the step and absorbs part of a sleep in its peers' contention.
DEMO = [
    "--mode",
    "torch",
    "--parallel",
    "ddp",
    "--steps",
    "16",
    "--warmup-steps",
    "2",
    "--wait",
    "3",
    "--warmup",
    "1",
    "--active",
    "10",
    *LAB_SIZE.get("torch", []),
]
STRAGGLER_SHARE = 1.25


def demo_straggler(clean_step_ms: float) -> list[str]:
    delay_ms = max(15, round(STRAGGLER_SHARE * clean_step_ms))
    return ["--slow-rank", "1", "--slow-ms", str(delay_ms), "--slow-phase", "data"]


def collected(run_dir: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(run_dir), "--no-merged"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((run_dir / "report" / "report.json").read_text())
    check_report(doc)  # the accounting identities hold on every real run
    doc["_stdout"] = proc.stdout
    return doc


def test_two_stragglers_on_four_ranks_are_both_named(log_dir: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "baseline",
            "--hidden",
            "128",
            "--batch-size",
            "16",
            *STEPS,
            "--slow-rank",
            "1,3",
            "--slow-ms",
            "60",
            "--slow-phase",
            "data",
        ],
        log_dir,
        nproc=4,
    )
    doc = collected(run.dir)
    assert doc["verdict"] == "straggler", doc["_stdout"]
    assert sorted((s["rank"], s["phase"], s["pattern"]) for s in doc["stragglers"]) == [
        (1, "data", "persistent"),
        (3, "data", "persistent"),
    ], doc["_stdout"]
    # both are ~60 ms late each step; the delay they cause together is shared between them
    for s in doc["stragglers"]:
        assert s["late_ms"] > 30 and 0 < s["cost_ms"] < s["late_ms"], s
    for d in doc["diagnosis"]:
        if d["rank"] in (0, 2):
            assert d["bottleneck"] != "straggler" and sorted(r for r, _ in d["waits_for"]) == [1, 3], d
    assert "rank 1" in doc["headline"] and "rank 3" in doc["headline"]
    assert doc["run"]["whatif_all_fixed_step_ms"] < doc["run"]["replayed_step_ms"]


def test_demo_victim_is_diagnosed_as_the_clean_run_and_the_whatif_matches_it(log_dir: Path) -> None:
    """The clean run and the straggler, measured back to back once. The victim's own work is
    classified as the clean run's. The what-if lands nearer the clean run's step than the slow
    run's: two clean runs on two shared cores land up to 30% apart (test_compare.py,
    MACHINE_SPREAD_PCT), so a separate clean run is no finer yardstick than that, while a
    what-if that failed to take out the straggler's 125% of a step would land at the slow step."""
    clean = collected(run_harness(DEMO, log_dir, run_name="clean").dir)
    straggler = demo_straggler(clean["run"]["median_step_ms"])
    slow = collected(run_harness([*DEMO, *straggler], log_dir, run_name="slow").dir)
    victim, clean0 = slow["diagnosis"][0], clean["diagnosis"][0]
    stragglers = [s["rank"] for s in slow["stragglers"]]
    assert slow["verdict"] == "straggler" and stragglers == [1], (straggler, slow["_stdout"])
    assert classify(victim["evidence"])[0] == classify(clean0["evidence"])[0], (victim, clean0)
    assert [r for r, _ in victim["waits_for"]] == [1], victim
    whatif, clean_ms, slow_ms = (
        slow["stragglers"][0]["whatif_step_ms"],
        clean["run"]["median_step_ms"],
        slow["run"]["median_step_ms"],
    )
    assert 0.5 * clean_ms <= whatif < (clean_ms + slow_ms) / 2, (whatif, clean_ms, slow_ms, slow["run"])
    assert "waiting on rank 1" in victim["reason"]
    # the story in a few lines: verdict, diagnosis, what to do
    assert said(slow["_stdout"], "verdict")[0].startswith("straggler: rank 1")
    assert len(said(slow["_stdout"], "next")) == len(slow["next_steps"]) >= 2
