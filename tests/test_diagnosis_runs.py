"""Every straggler named, victims diagnosed on their own work, and the what-if against a measured
clean run: real torchrun jobs on CPU/gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from identities import check_report
from jobs import REPO, run_harness, said

pytestmark = pytest.mark.slow

STEPS = ["--steps", "12", "--warmup-steps", "2", "--wait", "3", "--warmup", "1", "--active", "6"]
# The demo's job (Makefile DEMO_ARGS) at test size: torch mode, DDP, rank 1 slow in its data
# phase; 10 recorded steps for a steadier mean. The delay is set from the clean run's step
# (STRAGGLER_SHARE of it, at least 15 ms) rather than fixed: a straggler must be late by more
# than the run's bound (stragglers.straggler_bounds: its jitter and clock noise, 8% of the step
# at least), and a slower machine both lengthens the step and absorbs part of a sleep in its peers' contention (measured
# on a CI machine: a 15 ms sleep read as 10.5 ms late in 38 ms steps, under the 13.4 ms bound).
# Not much more: on this VM a process that sleeps for tens of ms computes ~15-20% slower for a
# while after (measured: forward 5.4 vs 4.0 ms on the victim), which no replay of the measured
# work can know, and the projection is held to 25%.
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
]
STRAGGLER_SHARE = 1.25


def demo_straggler(clean_step_ms: float) -> list[str]:
    delay_ms = max(15, round(STRAGGLER_SHARE * clean_step_ms))
    return ["--straggler-rank", "1", "--straggler-ms", str(delay_ms), "--straggler-phase", "data"]


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
            "--straggler-rank",
            "1,3",
            "--straggler-ms",
            "60",
            "--straggler-phase",
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
    """The clean run and the straggler are measured back to back; on two shared cores a pair
    can be disturbed by the machine's other load (the victim computes faster while the straggler
    sleeps: a fresh-clone CI here saw 12.1 ms projected against 16.5 ms measured, twice), so a
    pair that misses gets fresh pairs, up to three: a projection that is wrong, not unlucky,
    fails all three."""
    for attempt in range(3):
        clean = collected(run_harness(DEMO, log_dir, run_name=f"clean{attempt}").dir)
        straggler = demo_straggler(clean["run"]["median_step_ms"])
        slow = collected(run_harness([*DEMO, *straggler], log_dir, run_name=f"slow{attempt}").dir)
        victim, clean0 = slow["diagnosis"][0], clean["diagnosis"][0]
        whatif, measured = (
            slow["stragglers"][0]["whatif_step_ms"] if slow["stragglers"] else None,
            clean["run"]["median_step_ms"],
        )
        ok = (
            slow["verdict"] == "straggler"
            and [s["rank"] for s in slow["stragglers"]] == [1]
            and victim["bottleneck"] == clean0["bottleneck"]
            and [r for r, _ in victim["waits_for"]] == [1]
            and whatif is not None
            and abs(whatif - measured) <= 0.25 * measured
        )
        if ok:
            break
    stragglers = [s["rank"] for s in slow["stragglers"]]
    assert slow["verdict"] == "straggler" and stragglers == [1], (straggler, slow["_stdout"])
    assert victim["bottleneck"] == clean0["bottleneck"], (victim, clean0)
    assert [r for r, _ in victim["waits_for"]] == [1], victim
    assert abs(whatif - measured) <= 0.25 * measured, (whatif, measured, slow["run"])
    assert "waiting on rank 1" in victim["reason"]
    # the story in a few lines: verdict, diagnosis, what to do
    assert said(slow["_stdout"], "verdict")[0].startswith("straggler: rank 1")
    assert len(said(slow["_stdout"], "next")) == len(slow["next_steps"]) >= 2
