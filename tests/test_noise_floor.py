"""How sure a balanced verdict is (harness/report/floor.py): the bound as a share of the clean
step, what sets it, the latest rank, and the next step where the noise sets it; exact figures
on hand-built traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.report.document import build_report
from harness.report.records import as_document

from jobs import collect_quietly, said
from tracebuild import GLOO, cpu_ring_docs, document, ring_docs, run_analysis, step, x


def _noise_steps(doc: dict) -> list[dict]:
    return [n for n in doc["next_steps"] if n["about"] == "noise"]


def test_a_bound_set_by_measured_jitter_is_given_with_the_latest_rank(tmp_path: Path) -> None:
    """2 CPU ranks, 6 steps of 2.4 ms of ops; rank 0 runs 0.4 ms more in odd steps, rank 1 in
    even ones, and rank 1 sleeps 0.3 ms before every all-reduce. Each step's part both ranks
    share (their mean) taken out, their own work swings by +-0.05 ms in odd steps and -+0.35 in
    even ones: a MAD of 0.2 ms each; so the jitter bound is 3 x 0.2 = 0.6 ms, above the material
    8% of the 2.8 ms clean step (0.224 ms): rank 1's 0.3 ms is noise here, and a straggler under
    0.6 / 2.8 = 21% of the step would be too. (Were both ranks 0.4 ms slower in the same steps,
    the swing would be common to them and no noise: run_jitter_ms.)"""
    docs = cpu_ring_docs(2, 6, extra_mm_us=lambda r, s: 400.0 * ((s + r) % 2), sleep_us=lambda r, s: 300.0 * r)
    doc = as_document(build_report(run_analysis(tmp_path, docs), ["x"]))
    assert doc["verdict"] == "balanced"
    floor = doc["noise_floor"]
    assert floor["bound_ms"] == pytest.approx(0.6) and floor["clean_step_ms"] == pytest.approx(2.8)
    assert floor["share"] == pytest.approx(0.6 / 2.8)
    assert floor["set_by"] == "jitter" and floor["noise_limited"] and floor["jitter_measured"]
    assert floor["latest_rank"] == 1 and floor["latest_beyond_ms"] == pytest.approx(0.3)
    [noise] = _noise_steps(doc)
    assert noise["ranks"] == [1]
    assert "a straggler costing under 21% of the step would pass for noise here" in noise["text"]
    assert "3x the step-to-step jitter of the ranks' own work" in noise["text"]
    assert "--repeat 3" in noise["text"] and "--active" not in noise["text"]


def test_a_bound_set_by_the_material_share_needs_no_next_step(tmp_path: Path) -> None:
    """Steady steps, rank 1 sleeping 0.15 ms: no jitter, the bound is 8% of the 2.6 ms clean
    step (0.208 ms); rank 1 is under it and nothing smaller than material passes for noise."""
    docs = cpu_ring_docs(2, 6, sleep_us=lambda r, s: 150.0 * r)
    doc = as_document(build_report(run_analysis(tmp_path, docs), ["x"]))
    floor = doc["noise_floor"]
    assert doc["verdict"] == "balanced" and floor["set_by"] == "relative" and not floor["noise_limited"]
    assert floor["bound_ms"] == pytest.approx(0.208) and floor["share"] == pytest.approx(0.08)
    assert floor["latest_rank"] == 1 and floor["latest_beyond_ms"] == pytest.approx(0.15)
    assert _noise_steps(doc) == []


def _one_step_cpu() -> list[dict]:
    """2 CPU ranks, one 45 ms step: rank 0 arrives at the all-reduce at 5 ms, rank 1 at 12 ms."""
    docs = []
    for rank, arrive in ((0, 5_000.0), (1, 12_000.0)):
        ev = [
            step(11, 0.0, 45_000.0),
            *(x("aten::mm", "cpu_op", 100.0 + 200.0 * i, 150.0) for i in range(20)),
            x("aten::add", "cpu_op", arrive - 100.0, 90.0),
            x("gloo:all_reduce", "user_annotation", arrive, 12_500.0 - arrive, GLOO),
        ]
        docs.append(document(ev, rank, base_ns=None))
    return docs


def test_too_few_cpu_steps_say_so_and_what_to_profile(tmp_path: Path) -> None:
    """One step on CPU: no jitter measured, so no bound stands for it; rank 1 is 7 ms beyond its
    peer, over 8% of the 38 ms clean step (rank 0's 45 ms less its 7 ms wait), and named; the
    warning and the console's noise line say the jitter is not in the bound and what to profile."""
    doc = as_document(build_report(run_analysis(tmp_path, _one_step_cpu()), ["x"]))
    floor = doc["noise_floor"]
    assert doc["verdict"] == "straggler" and [s["rank"] for s in doc["stragglers"]] == [1]
    assert floor["set_by"] == "relative" and not floor["jitter_measured"] and floor["noise_model"] == "shared CPU cores"
    assert floor["bound_ms"] == pytest.approx(0.08 * 38.0) and floor["clean_step_ms"] == pytest.approx(38.0)
    assert floor["latest_rank"] == 1 and floor["latest_beyond_ms"] == pytest.approx(7.0)
    assert doc["bounds_ms"]["jitter"] == 0.0
    assert any(
        w.startswith("step-to-step jitter not estimated: 1 full step(s) per rank, 3 needed") for w in doc["warnings"]
    )
    out = collect_quietly(tmp_path)
    assert (
        "a straggler must arrive 3.04 ms a step later than its peers here (8% of the 38.00 ms clean "
        "step; the material bound, the share of the clean step --rel-late sets); the latest, rank 1, is 7.00 ms "
        "beyond its peers; the run's step-to-step jitter is not in it: profile 3 or more steps to measure it"
    ) in said(out.stdout, "noise"), out.stdout


def test_no_floor_without_an_analysis(tmp_path: Path) -> None:
    docs = ring_docs(lambda r, s: 500.0, 2, 2)[:1]  # one rank: inconclusive
    doc = as_document(build_report(run_analysis(tmp_path, docs), ["x"]))
    assert doc["verdict"] == "inconclusive" and doc["noise_floor"] is None and _noise_steps(doc) == []


def test_a_stall_every_rank_shares_is_a_finding_not_noise(tmp_path: Path) -> None:
    """2 CPU ranks, 5 steps; both run 50 ms more in step 2 and 3 ms more in steps 3 and 4 (what
    every rank shares), rank 1 sleeps 2 ms before every all-reduce. Their own work alone swings
    by a MAD of 3 ms, a 9 ms bound that kept rank 1 balanced; each step's shared part taken out,
    nothing swings, the bound is the material 8% of the clean step (1.15 ms), and rank 1, 2 ms
    late, is named; step 2 is said to be a stall they shared."""
    common = {2: 50_000.0, 3: 3_000.0, 4: 3_000.0}
    docs = cpu_ring_docs(2, 5, extra_mm_us=lambda r, s: common.get(s, 0.0), sleep_us=lambda r, s: 2000.0 * r)
    a = run_analysis(tmp_path, docs)
    assert [(s.rank, round(s.late_ms, 6)) for s in a.stragglers.stragglers] == [(1, 2.0)]
    assert a.stragglers.bounds_ms["jitter"] == pytest.approx(0.0)
    assert a.stragglers.bounds_ms["relative"] == pytest.approx(0.08 * a.stragglers.clean_step_ms)
    [stall] = [w for w in a.warnings if "a stall they all shared" in w]
    assert stall.startswith("step 2 was 47.00 ms longer than the median step on every rank alike")
