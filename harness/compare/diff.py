"""What differs between two runs, and what explains it: the comparison as one dict (compare.json's
content, schema in docs/compare.md). Pure: sides in, dict out."""

from __future__ import annotations

import statistics
from typing import Any

from harness.compare.load import Side
from harness.compare.stats import NOISE_FLOOR, Difference, median_difference

# An explanation line is kept when its change is at least this share of the step's change
# (smaller ones are in the tables, not in the story), or for a count, this relative change.
EXPLAINS_SHARE = 0.25
COUNT_CHANGE = 0.10


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _describe(side: Side) -> dict[str, Any]:
    report = side.report or {}
    return {
        "label": side.label,
        "path": str(side.path),
        "source": side.source,
        "steps": len(side.step_series()),
        "ranks": sorted(side.steps),
        "world_size": side.world_size(),
        "workload": side.workload(),
        "verdict": report.get("verdict"),
        "headline": report.get("headline"),
    }


def _phases(base: Side, new: Side) -> list[dict[str, Any]]:
    """Per phase: the median over the ranks both runs have of each rank's median time in it,
    BASE and NEW, their difference, and the rank whose phase changed most."""
    bp, np_ = base.phase_medians(), new.phase_medians()
    ranks = sorted(set(bp) & set(np_))
    names = sorted({p for r in ranks for p in (*bp[r], *np_[r])})
    rows = []
    for name in names:
        diffs = {r: np_[r].get(name, 0.0) - bp[r].get(name, 0.0) for r in ranks}
        if not diffs:
            continue
        most = max(diffs, key=lambda r: abs(diffs[r]))
        b = _median([bp[r].get(name, 0.0) for r in ranks])
        n = _median([np_[r].get(name, 0.0) for r in ranks])
        rows.append(
            {
                "phase": name,
                "base_ms": b,
                "new_ms": n,
                "diff_ms": n - b,
                "rank_most": most,
                "rank_most_diff_ms": diffs[most],
            }
        )
    return sorted(rows, key=lambda row: -abs(row["diff_ms"]))


def _ranks(base: Side, new: Side) -> list[dict[str, Any]]:
    """Per rank in both: its median step, BASE and NEW (across world sizes: the ranks in both)."""
    rows = []
    for r in sorted(set(base.steps) & set(new.steps)):
        b = _median([ms for ms, _ in base.steps[r].values()])
        n = _median([ms for ms, _ in new.steps[r].values()])
        rows.append({"rank": r, "base_step_ms": b, "new_step_ms": n, "diff_ms": n - b})
    return rows


def _mean_over_ranks(report: dict[str, Any], key: str) -> float | None:
    values = [r[key] for r in report.get("ranks") or [] if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _evidence_mean(report: dict[str, Any], key: str) -> float | None:
    values = [
        d["evidence"][key]
        for d in report.get("diagnosis") or []
        if isinstance(d.get("evidence"), dict) and isinstance(d["evidence"].get(key), (int, float))
    ]
    return sum(values) / len(values) if values else None


def _families(report: dict[str, Any]) -> dict[str, float]:
    """Compute time per step (ms) by kernel or op family, summed over the ranks' diagnoses'
    top families (share of compute x compute share x own step), averaged over those ranks."""
    out: dict[str, float] = {}
    diagnoses = [d for d in report.get("diagnosis") or [] if isinstance(d.get("evidence"), dict)]
    for d in diagnoses:
        ev = d["evidence"]
        compute_ms = float(ev.get("compute_share") or 0.0) * float(ev.get("own_step_ms") or 0.0)
        for name, share in ev.get("top_compute") or []:
            out[str(name)] = out.get(str(name), 0.0) + float(share) * compute_ms / len(diagnoses)
    return out


def _stragglers(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(s["rank"]): s for s in report.get("stragglers") or [] if isinstance(s.get("rank"), int)}


def _report_diff(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What the collector's two reports say apart: verdicts, stragglers that appeared or went
    away, communication (exposed waiting vs transfer), host ops and syncs, compute by family,
    memory."""
    bs, ns = _stragglers(base), _stragglers(new)

    def straggler(s: dict[str, Any]) -> dict[str, Any]:
        return {"rank": s.get("rank"), "host": s.get("host"), "phase": s.get("phase"), "cost_ms": s.get("cost_ms")}

    def kept(s: dict[str, Any]) -> dict[str, Any]:
        was = bs[int(s["rank"])]
        return {**straggler(s), "base_phase": was.get("phase"), "base_cost_ms": was.get("cost_ms")}

    comm = {
        key: [_mean_over_ranks(base, key), _mean_over_ranks(new, key)]
        for key in ("compute_ms", "comm_ms", "exposed_wait_ms", "exposed_transfer_ms", "memcpy_ms", "idle_ms")
    }
    host = {
        key: [_evidence_mean(base, key), _evidence_mean(new, key)]
        for key in ("host_ops_per_step", "launches_per_step", "syncs_per_step")
    }
    bf, nf = _families(base), _families(new)
    names = sorted(set(bf) | set(nf), key=lambda k: -abs(nf.get(k, 0.0) - bf.get(k, 0.0)))
    families = [{"name": k, "base_ms": bf.get(k, 0.0), "new_ms": nf.get(k, 0.0)} for k in names]

    def peak(report: dict[str, Any], key: str) -> float | None:
        values = [r[key] for r in report.get("ranks") or [] if isinstance(r.get(key), (int, float))]
        return max(values) if values else None

    memory = {key: [peak(base, key), peak(new, key)] for key in ("peak_rss_bytes", "peak_gpu_allocated_bytes")}
    return {
        "verdict": [base.get("verdict"), new.get("verdict")],
        "stragglers_appeared": [straggler(s) for r, s in sorted(ns.items()) if r not in bs],
        "stragglers_gone": [straggler(s) for r, s in sorted(bs.items()) if r not in ns],
        "stragglers_kept": [kept(s) for r, s in sorted(ns.items()) if r in bs],
        "communication_ms": comm,
        "host_per_step": host,
        "compute_families_ms": families[:10],
        "memory_peak_bytes": memory,
    }


def _cannot(base: Side, new: Side) -> list[str]:
    """What the comparison cannot vouch for, said plainly."""
    notes = []
    bw, nw = base.workload(), new.workload()
    changed = sorted(k for k in set(bw) & set(nw) if k not in ("steps", "warmup_steps") and bw[k] != nw[k])
    if changed:
        what = ", ".join(f"{k} {bw[k]} -> {nw[k]}" for k in changed)
        notes.append(f"different workloads ({what}): the step times are compared as they are, not like for like")
    b, n = base.world_size(), new.world_size()
    if b and n and b != n:
        notes.append(f"world sizes differ ({b} -> {n}): per-rank rows only for the ranks both runs have")
    if base.source != new.source:
        notes.append(f"step times from different sources (BASE: {base.source}, NEW: {new.source})")
    if (base.report is None) != (new.report is None) or base.report is None:
        missing = [s.label for s in (base, new) if s.report is None]
        notes.append(
            f"no collector report for {' and '.join(missing)}: stragglers, communication, host ops and memory are "
            "not compared (python -m harness.collect RUN first)"
        )
    for s in (base, new):
        if s.skipped_lines:
            notes.append(f"{s.label}: {s.skipped_lines} unreadable step-log line(s) left out")
    return notes


def _explain(step: Difference, phases: list[dict[str, Any]], report: dict[str, Any] | None) -> list[str]:
    """The differences that explain the step's change, largest first: stragglers that
    appeared or went away, then phases, communication, host work and memory that moved by at
    least EXPLAINS_SHARE of the step's change (or COUNT_CHANGE for counts)."""
    lines = []
    change_ms = step.new_median - step.base_median
    floor = max(abs(change_ms) * EXPLAINS_SHARE, 1e-9)
    if report:
        for s in report["stragglers_appeared"]:
            lines.append(
                f"straggler appeared: rank {s['rank']} ({s.get('host') or '?'}) in {s.get('phase') or '?'}, "
                f"costing the others {s.get('cost_ms') or 0:.1f} ms/step"
            )
        lines += _kept_lines(report["stragglers_kept"], floor, change_ms)
        for s in report["stragglers_gone"]:
            lines.append(f"straggler gone: rank {s['rank']} (was slow in {s.get('phase') or '?'})")
    for row in phases:
        if abs(row["diff_ms"]) >= floor and (change_ms == 0 or row["diff_ms"] * change_ms > 0):
            lines.append(
                f"phase {row['phase']}: {row['base_ms']:.2f} -> {row['new_ms']:.2f} ms "
                f"({row['diff_ms']:+.2f} ms; most on rank {row['rank_most']}, {row['rank_most_diff_ms']:+.2f} ms)"
            )
    if report:
        for key, (b, n) in report["communication_ms"].items():
            if key != "comm_ms" and b is not None and n is not None and abs(n - b) >= floor:
                lines.append(f"{key.removesuffix('_ms').replace('_', ' ')}: {b:.2f} -> {n:.2f} ms/step ({n - b:+.2f})")
        for key, (b, n) in report["host_per_step"].items():
            if b is not None and n is not None and abs(n - b) > COUNT_CHANGE * max(abs(b), 1.0):
                lines.append(f"{key.replace('_', ' ')}: {b:.1f} -> {n:.1f}")
        for key, (b, n) in report["memory_peak_bytes"].items():
            if b and n and abs(n - b) > COUNT_CHANGE * b:
                lines.append(f"{key.replace('_', ' ')}: {b / 2**20:.0f} -> {n / 2**20:.0f} MiB")
        bv, nv = report["verdict"]
        if bv != nv:
            lines.append(f"verdict: {bv} -> {nv}")
    return lines


def _kept_lines(kept: list[dict[str, Any]], floor_ms: float, change_ms: float) -> list[str]:
    """A straggler both runs name is a change when its cost moved by at least the explanation's
    floor in the step's direction and by more than COUNT_CHANGE of what it was, or when it is
    late in another phase: the largest move first."""
    moved = []
    for s in kept:
        base_ms, new_ms = float(s.get("base_cost_ms") or 0.0), float(s.get("cost_ms") or 0.0)
        diff_ms = new_ms - base_ms
        grew = abs(diff_ms) >= max(floor_ms, COUNT_CHANGE * base_ms) and (change_ms == 0 or diff_ms * change_ms > 0)
        if grew or s.get("phase") != s.get("base_phase"):
            word = "worse" if diff_ms > 0 else "better"
            moved.append(
                (
                    -abs(diff_ms),
                    f"straggler {word}: rank {s['rank']} ({s.get('host') or '?'}) in {s.get('phase') or '?'} "
                    f"(was {s.get('base_phase') or '?'}), costing the others {base_ms:.1f} -> {new_ms:.1f} ms/step",
                )
            )
    return [line for _, line in sorted(moved)]


def compare_sides(
    base: Side, new: Side, *, noise: float = NOISE_FLOOR, fail_if_slower_pct: float | None = None
) -> dict[str, Any]:
    """The comparison (module docstring): sides, the step-time test, phases, ranks, the reports'
    differences, the explanation, what cannot be compared, and the gate."""
    b, n = base.step_series(), new.step_series()
    step = median_difference(b, n, noise=noise)
    phases = _phases(base, new)
    report = _report_diff(base.report, new.report) if base.report and new.report else None
    gate = None
    if fail_if_slower_pct is not None:
        gate = {"fail_if_slower_pct": fail_if_slower_pct, "failed": step.slower_than(fail_if_slower_pct / 100)}
    return {
        "schema_version": 1,
        "base": _describe(base),
        "new": _describe(new),
        "step": {
            "base_median_ms": step.base_median,
            "new_median_ms": step.new_median,
            "relative": step.relative,
            "ci": [step.low, step.high],
            "confidence": step.confidence,
            "noise": step.noise,
            "verdict": step.verdict,
            "base_steps": step.base_n,
            "new_steps": step.new_n,
            "base_p90_ms": float(_quantile(b, 0.9)),
            "new_p90_ms": float(_quantile(n, 0.9)),
        },
        "phases": phases,
        "ranks": _ranks(base, new),
        "report": report,
        "explanation": _explain(step, phases, report),
        "cannot_compare": _cannot(base, new),
        "gate": gate,
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
