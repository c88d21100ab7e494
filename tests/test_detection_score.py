"""The detection campaign's scoring (bench/detect/score.py) on hand-made outcomes."""

from __future__ import annotations

import random
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jobs import REPO

sys.path.insert(0, str(REPO / "bench"))

from detect.real import seen_of  # noqa: E402
from detect.score import Seen, Truth, case_row, score, summarize, summarize_watch  # noqa: E402


def row(run: str, truth: Truth, seen: Seen, clean_step_ms: float = 100.0) -> dict[str, Any]:
    outcome = score(truth, seen, onset_step=8 if truth.kind == "straggler" else None)
    return {
        "run": run,
        "clean_step_ms": clean_step_ms,
        "truth": asdict(truth),
        "seen": asdict(seen),
        "outcome": asdict(outcome),
        "error": seen.error,
    }


def test_recall_above_noise_counts_the_cases_their_clean_run_could_show() -> None:
    # Configuration c001's clean run was judged against 15 ms per step, c002's against 5 ms.
    rows = [
        row("c001-clean", Truth(kind="clean"), Seen(verdict="balanced", threshold_ms=15.0)),
        # 12 ms per step: material (12% of 100 ms) but under c001's 15 ms: missed, and not counted above noise
        row(
            "c001-0-sleep", Truth(kind="straggler", ranks=[1], phase="data", cost_share=0.12), Seen(verdict="balanced")
        ),
        # 30 ms: above it, found with its phase
        row(
            "c001-1-sleep",
            Truth(kind="straggler", ranks=[1], phase="data", cost_share=0.3),
            Seen(verdict="straggler", stragglers={1: "data"}, watch_flags=[(9, 1)]),
        ),
        row("c002-clean", Truth(kind="clean"), Seen(verdict="straggler", stragglers={0: "data"}, threshold_ms=5.0)),
        # 10 ms: above c002's 5 ms, missed
        row(
            "c002-0-compute",
            Truth(kind="straggler", ranks=[0], phase="forward", cost_share=0.1),
            Seen(verdict="balanced"),
        ),
        # below material: not counted either way
        row(
            "c002-1-compute",
            Truth(kind="straggler", ranks=[0], phase="forward", cost_share=0.04),
            Seen(verdict="balanced"),
        ),
    ]
    s = summarize(rows)
    assert (s["recall"], s["material_cases"]) == (round(1 / 3, 4), 3)
    assert (s["recall_above_noise"], s["material_above_noise"]) == (0.5, 2)
    assert (s["false_alarms"], s["clean_runs"]) == (1, 2)
    assert (s["below_material_recall"], s["below_material_cases"]) == (0.0, 1)
    assert s["watch_latency_steps_median"] == 1 and s["phase_right"] == 1.0


def test_a_named_innocent_rank_is_found_but_not_rank_right() -> None:
    truth = Truth(kind="straggler", ranks=[2], phase="backward", cost_share=0.2)
    o = score(truth, Seen(verdict="straggler", stragglers={2: "backward", 3: "backward"}))
    assert (o.found, o.rank_right, o.phase_right, o.material) == (True, False, False, True)


def test_a_miss_is_disclosed_when_the_report_said_a_straggler_of_its_size_passes_for_noise() -> None:
    def missed(cost: float, seen: Seen) -> dict[str, Any]:
        return row("c003-0-sleep", Truth(kind="straggler", ranks=[1], phase="data", cost_share=cost), seen)

    rows = [
        # 12% against a floor of 30% the report gave, rank 1 its latest: disclosed, latest right
        missed(0.12, Seen(verdict="balanced", floor_share=0.3, latest_rank=1)),
        # 40% against the same floor: the report's floor was below its cost, so not disclosed
        missed(0.4, Seen(verdict="balanced", floor_share=0.3, latest_rank=0)),
        # no noise step said (the material bound set the floor): not disclosed
        missed(0.12, Seen(verdict="balanced", latest_rank=1)),
        # found: neither counted
        missed(0.2, Seen(verdict="straggler", stragglers={1: "data"}, floor_share=0.5, latest_rank=1)),
    ]
    s = summarize(rows)
    assert (s["misses"], s["misses_disclosed"], s["misses_latest_right"]) == (3, 1, 2)
    assert [r["outcome"]["miss_disclosed"] for r in rows] == [True, False, False, None]


def test_the_watch_on_generated_jobs_is_summarized_from_its_own_runs() -> None:
    """Four watch runs: a material straggler flagged 1 step after onset with an innocent rank
    beside it, a material one never judged after its onset (the last judged step 7 < onset 8),
    one below material it did not flag, and a clean job it flagged."""

    def watch(kind: str, material: bool, latency: int | None, judged: int, innocent: list[int]) -> dict[str, Any]:
        truth = {"kind": kind, "ranks": [3] if kind == "straggler" else [], "phase": "data", "cost_share": 0.2}
        return {
            "watch": {
                "truth": truth,
                "material": material,
                "latency_steps": latency,
                "false_alarm": kind == "clean",  # the clean job below was flagged
                "innocent_flagged": innocent,
                "judged_through": judged,
                "onset": 8,
                "flags": [[9, 3, "forward"], [14, 3, "data"]] if latency is not None else [],
            }
        }

    rows = [
        watch("straggler", True, 1, 24, [5]),
        watch("straggler", True, None, 7, []),
        watch("straggler", False, None, 24, []),
        watch("clean", False, None, 24, []),
    ]
    s = summarize_watch(rows)
    assert s == {
        "watch_recall": 0.5,
        "watch_material_cases": 2,
        "watch_missed": 1,
        "watch_latency_steps_median": 1,
        "watch_false_alarms": 1,
        "watch_clean_runs": 1,
        "watch_innocent_flagged": 1,
        "watch_unjudged": 1,
        "watch_phase_right": 0.0,  # the first flag of rank 3 named forward, not data
    }


def test_the_generated_campaign_gives_the_same_rows_with_worker_processes(tmp_path: Path) -> None:
    # Each case carries its own noise seed, drawn in order: the workers change the wall time only.
    from detection import generated_campaign

    alone = generated_campaign(5, 3, 8, tmp_path, print, jobs=1)
    pooled = generated_campaign(5, 3, 8, tmp_path, print, jobs=2)
    assert pooled == alone
    assert [r["seed"] for r in alone] == [500_015, 500_016, 500_017]


def test_the_campaign_counts_the_report_s_verdict_and_the_window_s_alone_apart() -> None:
    truth = Truth(kind="straggler", ranks=[1], phase="backward", cost_share=0.2)
    by_watch = Seen(verdict="straggler", stragglers={1: "backward"}, trace_verdict="balanced", trace_stragglers={})
    by_both = Seen(verdict="straggler", stragglers={1: "backward"})
    clean = Truth(kind="clean")
    watch_false = Seen(verdict="straggler", stragglers={0: "data"}, trace_verdict="balanced", trace_stragglers={})
    outs = [score(truth, by_watch), score(truth, by_both), score(clean, watch_false)]
    assert [(o.found, o.found_by_trace) for o in outs[:2]] == [(True, False), (True, True)]
    assert outs[2].false_alarm and not outs[2].false_alarm_by_trace
    rows = [case_row({}, t, s, o) for t, s, o in zip((truth, truth, clean), (by_watch, by_both, watch_false), outs)]
    s = summarize(rows)
    assert (s["recall"], s["recall_trace_alone"], s["false_alarms"], s["false_alarms_trace_alone"]) == (1.0, 0.5, 1, 0)


def test_a_rank_the_watch_alone_flagged_is_the_report_s_and_not_the_window_s() -> None:
    report = {
        "verdict": "straggler",
        "trace_verdict": "balanced",
        "stragglers": [],
        "watch_stragglers": [{"rank": 2, "phase": "backward"}],
    }
    seen = seen_of(report, "")
    assert (seen.verdict, seen.stragglers, seen.trace_verdict, seen.trace_stragglers) == (
        "straggler",
        {2: "backward"},
        "balanced",
        {},
    )


def test_the_real_campaign_draws_pipelines_apart_and_without_them_as_before() -> None:
    """`draw_config` with ddp,fsdp draws what a seed drew before pp was added (the lab's
    configurations, drawn from the same calls); with pp about one configuration in PP_EVERY is
    the pipeline example's 4-rank job, whose faults are one slow rank in forward or backward; its
    flags go to the example as its own and harness.Run's HARNESS_* variables."""
    from detect import real

    def before(rng: random.Random, two_hosts: bool) -> tuple[int, int, str, str]:
        mode = rng.choices(real.MODES, real.MODE_WEIGHTS)[0]
        if two_hosts:
            return 1, 2, rng.choice(("ddp", "fsdp")), mode
        return rng.choice((2, 2, 4)), 1, rng.choice(("ddp", "fsdp")), mode

    a, b = random.Random(5), random.Random(5)
    for i in range(60):
        c = real.draw_config(a, i % 5 == 4, ("ddp", "fsdp"))
        assert (c.nproc, c.nodes, c.parallel, c.mode) == before(b, i % 5 == 4)
    rng = random.Random(6001)
    drawn = [real.draw_config(rng, i % 5 == 4) for i in range(60)]
    pp = [c for c in drawn if c.parallel == "pp"]
    assert pp and all(c.label() == "pipeline/pp/4" for c in pp) and all(c.nodes == 1 for c in pp)
    assert {real.draw_config(rng, i % 5 == 4, ("pp",)).label() for i in range(10)} == {"pipeline/pp/4"}
    faults = [real.draw_fault(rng, pp[0]) for _ in range(40)]
    assert {f.kind for f in faults} == {"sleep", "compute"} and {f.phase for f in faults} == {"forward", "backward"}
    assert all(len(f.ranks) == 1 and 0 <= f.ranks[0] < 4 for f in faults)
    fault = real.Fault(kind="compute", ranks=(2,), phase="backward", size=0.3, every=2)
    argv, env = real.example_command([*real.base_args(), *real.fault_args(fault, 50.0, pp=True)])
    assert argv == [
        *("--steps", "30", "--batch-size", "16", "--slow-rank", "2", "--slow-ms", "15.00"),
        *("--slow-phase", "backward", "--slow-kind", "compute", "--slow-every", "2", "--slow-from", "8"),
        *("--watch-every", "5"),
    ]
    assert env == {"HARNESS_WARMUP_STEPS": "4", "HARNESS_WAIT": "10", "HARNESS_WARMUP": "1", "HARNESS_ACTIVE": "8"}
