"""Scoring a straggler detector against injected ground truth: one case's outcome, and the
campaign's summary. Shared by the real-run campaign (detect/real.py) and the generated one
(detect/sim.py); pure functions over plain values.

Definitions (bench/detection.py's docstring says how each campaign sets the truth):
- a case's *cost* is the time the injection adds to the job's step, per step, on average over
  the analysed steps; it is *material* when the cost is at least MATERIAL_SHARE of the clean step
  (recall counts those; smaller ones are reported apart, as "below material");
- *found*: the collector's verdict is straggler and it names at least one injected rank (the
  report's verdict: the traced window's with the live watch's flags, harness/report/
  watch_verdict.py; *found by the trace alone*: the same over the window's own verdict);
- *rank right*: found, and every rank it names was injected (no innocent rank named);
- *phase right*: rank right, and each named injected rank's phase is the injected phase;
- *false alarm*: a clean case (nothing injected) with a straggler verdict;
- a missed material straggler is *disclosed* when the balanced report said that a straggler of
  its cost passes for noise in that run (its noise next step, harness/report/floor.py: "a
  straggler costing under S% of the step would pass for noise here", with S above its cost),
  and *latest right* when that report's latest rank is one it injected.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

# Recall counts the stragglers a user must be told about: a rank that costs the job a tenth of
# its step is worth an investigation (the definition of material); below that a miss is
# reported but not counted against recall.
MATERIAL_SHARE = 0.10


@dataclass(kw_only=True)
class Truth:
    """What was injected."""

    kind: str  # "clean", "straggler", "hang" or "leak"
    ranks: list[int] = field(default_factory=list)  # the injected ranks
    phase: str | None = None  # the slowed phase (stragglers)
    cost_share: float = 0.0  # the injection's cost per step / the clean step (stragglers)
    step: int | None = None  # the hang's step


@dataclass(kw_only=True)
class Seen:
    """What the collector (and the live watch) said."""

    verdict: str
    stragglers: dict[int, str | None] = field(default_factory=dict)  # rank -> its phase
    watch_flags: list[tuple[int, int]] = field(default_factory=list)  # (step, rank), in order
    hang_missing: list[int] | None = None
    hang_step: int | None = None
    leak_ranks: list[int] = field(default_factory=list)
    error: str | None = None  # the job or the collector failed: the case counts as missed
    late_ms: dict[int, float] = field(default_factory=dict)  # each rank's lateness per step (what the rule reads)
    threshold_ms: float | None = None  # the bound it must exceed
    step_ms: float | None = None  # the median step
    # the share of the step under which the balanced report said a straggler passes for noise
    # (None: it said no such thing), and its latest rank (the one furthest beyond its peers)
    floor_share: float | None = None
    latest_rank: int | None = None
    # the traced window's own verdict and stragglers where the live watch's flags joined the
    # report's (None: the report's are the window's)
    trace_verdict: str | None = None
    trace_stragglers: dict[int, str | None] | None = None


@dataclass(kw_only=True)
class Outcome:
    material: bool
    found: bool
    rank_right: bool
    phase_right: bool
    false_alarm: bool
    watch_false_alarm: bool  # a clean case the live watch flagged
    watch_latency_steps: int | None  # steps from the onset to the watch's first flag of an injected rank
    hang_right: bool | None
    leak_right: bool | None
    # a missed material straggler (None otherwise): disclosed, latest rank right (module docstring)
    miss_disclosed: bool | None = None
    miss_latest_right: bool | None = None
    found_by_trace: bool = False  # found by the traced window's own verdict
    false_alarm_by_trace: bool = False


def score(truth: Truth, seen: Seen, *, onset_step: int | None = None) -> Outcome:
    """One case: the definitions in the module docstring."""
    named = set(seen.stragglers)
    injected = set(truth.ranks)
    found = truth.kind == "straggler" and seen.verdict == "straggler" and bool(named & injected)
    trace_verdict = seen.trace_verdict or seen.verdict
    trace_named = set(seen.stragglers if seen.trace_stragglers is None else seen.trace_stragglers)
    found_by_trace = truth.kind == "straggler" and trace_verdict == "straggler" and bool(trace_named & injected)
    rank_right = found and named <= injected
    phase_right = rank_right and all(seen.stragglers[r] == truth.phase for r in named)
    latency = None
    if truth.kind == "straggler" and onset_step is not None:
        latency = next((max(step - onset_step, 0) for step, r in seen.watch_flags if r in injected), None)
    hang_right = None
    if truth.kind == "hang":
        hang_right = seen.verdict == "hang" and seen.hang_missing == truth.ranks and seen.hang_step == truth.step
    leak_right = None
    if truth.kind == "leak":
        leak_right = seen.leak_ranks == truth.ranks
    material = truth.kind == "straggler" and truth.cost_share >= MATERIAL_SHARE
    missed = material and not found
    return Outcome(
        material=material,
        found=found,
        rank_right=rank_right,
        phase_right=phase_right,
        false_alarm=truth.kind == "clean" and seen.verdict == "straggler",
        watch_false_alarm=truth.kind == "clean" and bool(seen.watch_flags),
        watch_latency_steps=latency,
        hang_right=hang_right,
        leak_right=leak_right,
        miss_disclosed=(seen.floor_share is not None and truth.cost_share < seen.floor_share) if missed else None,
        miss_latest_right=(seen.latest_rank in injected) if missed else None,
        found_by_trace=found_by_trace,
        false_alarm_by_trace=truth.kind == "clean" and trace_verdict == "straggler",
    )


def _share(hits: int, n: int) -> float | None:
    return round(hits / n, 4) if n else None


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The campaign's figures over case rows ({"truth": ..., "outcome": ...}, as `case_row` makes):
    1. recall = found / material straggler cases; below_material_recall the same below MATERIAL_SHARE;
    2. rank_right, phase_right = shares of the found material cases;
    3. false_alarms = clean cases with a straggler verdict (a count), over clean_runs;
    4. watch_latency_steps_median over the cases the watch flagged; watch_missed, the material
       cases it ran in and did not flag; watch_false_alarms, clean cases it flagged;
    5. hang_right, leak_right = shares of those cases right;
    6. errors = cases whose job or collector failed (counted as misses above);
    7. recall_above_noise = found / material stragglers whose cost per step exceeds the bound the
       clean run of their configuration was judged against (`noise_floors`): what the rule can
       see at all on that configuration on this machine, apart from what its noise hides;
    8. misses = material cases not found; misses_disclosed, misses_latest_right = of them, the
       disclosed ones and those whose report's latest rank was injected (module docstring);
    9. recall_trace_alone, false_alarms_trace_alone: 1 and 3 over the traced window's own verdict."""
    outs = [c["outcome"] for c in cases]
    material = [o for o in outs if o["material"]]
    small = [o for c, o in zip(cases, outs) if c["truth"]["kind"] == "straggler" and not o["material"]]
    found = [o for o in material if o["found"]]
    clean = [c for c in cases if c["truth"]["kind"] == "clean"]
    latencies = [o["watch_latency_steps"] for o in outs if o["watch_latency_steps"] is not None]
    watched = [
        c for c in cases if c.get("watch_every") and c["truth"]["kind"] == "straggler" and c["outcome"]["material"]
    ]
    floors = noise_floors(cases)
    visible = [
        c["outcome"]
        for c in cases
        if c["outcome"]["material"]
        and (floor := floors.get(config_key(c))) is not None
        and c["truth"]["cost_share"] * c.get("clean_step_ms", 0.0) > floor
    ]
    hangs = [o["hang_right"] for o in outs if o["hang_right"] is not None]
    leaks = [o["leak_right"] for o in outs if o["leak_right"] is not None]
    return {
        "recall": _share(len(found), len(material)),
        "material_cases": len(material),
        "below_material_recall": _share(sum(o["found"] for o in small), len(small)),
        "below_material_cases": len(small),
        "false_alarms": sum(o["false_alarm"] for o in outs),
        "clean_runs": len(clean),
        "rank_right": _share(sum(o["rank_right"] for o in found), len(found)),
        "phase_right": _share(sum(o["phase_right"] for o in found), len(found)),
        "watch_latency_steps_median": statistics.median(latencies) if latencies else None,
        "watch_missed": sum(1 for c in watched if c["outcome"]["watch_latency_steps"] is None),
        "watch_false_alarms": sum(o["watch_false_alarm"] for o in outs),
        "hang_right": _share(sum(hangs), len(hangs)),
        "hang_cases": len(hangs),
        "leak_right": _share(sum(leaks), len(leaks)),
        "leak_cases": len(leaks),
        "errors": sum(1 for c in cases if c.get("error")),
        "recall_above_noise": _share(sum(o["found"] for o in visible), len(visible)),
        "material_above_noise": len(visible),
        "misses": len(material) - len(found),
        "misses_disclosed": sum(1 for o in material if o.get("miss_disclosed")),
        "misses_latest_right": sum(1 for o in material if o.get("miss_latest_right")),
        "recall_trace_alone": _share(sum(o.get("found_by_trace", False) for o in material), len(material)),
        "false_alarms_trace_alone": sum(o.get("false_alarm_by_trace", False) for o in outs),
    }


def summarize_watch(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The watch's figures over generated case rows that carry its run ("watch", as
    detect/gpu_watch.py's `watch_case` makes it): `summarize`'s watch keys, which it replaces
    for the generated campaign, and keys of its own:
    1. watch_recall = material cases (by the watch run's own cost) whose injected rank it
       flagged / material cases; watch_missed, those it did not flag;
    2. watch_latency_steps_median over the flagged ones (steps from the onset to the first flag);
    3. watch_false_alarms = clean cases it flagged; watch_innocent_flagged = straggler cases
       where it also flagged a rank nothing was injected into;
    4. watch_unjudged = missed material cases where it judged no step from the onset on before
       the job ended (a host running ahead of its GPU: no such step was complete at an exchange);
    5. watch_phase_right = flagged material cases whose first flag of an injected rank named
       the injected phase / flagged material cases."""
    runs = [c["watch"] for c in cases if c.get("watch")]
    material = [w for w in runs if w["material"]]
    flagged = [w for w in material if w["latency_steps"] is not None]

    def first_phase(w: dict[str, Any]) -> str | None:
        return next((f[2] for f in w["flags"] if f[1] in w["truth"]["ranks"] and len(f) > 2), None)

    latencies = [w["latency_steps"] for w in runs if w["latency_steps"] is not None]
    return {
        "watch_recall": _share(len(flagged), len(material)),
        "watch_material_cases": len(material),
        "watch_missed": len(material) - len(flagged),
        "watch_latency_steps_median": statistics.median(latencies) if latencies else None,
        "watch_false_alarms": sum(1 for w in runs if w["false_alarm"]),
        "watch_clean_runs": sum(1 for w in runs if w["truth"]["kind"] == "clean"),
        "watch_innocent_flagged": sum(1 for w in runs if w["innocent_flagged"]),
        "watch_unjudged": sum(1 for w in material if w["latency_steps"] is None and w["judged_through"] < w["onset"]),
        "watch_phase_right": _share(sum(first_phase(w) == w["truth"]["phase"] for w in flagged), len(flagged)),
    }


def config_key(case: dict[str, Any]) -> str | None:
    """The configuration a real case ran in: its run name's first part (c003-2-sleep -> c003)."""
    run = case.get("run")
    return run.split("-")[0] if isinstance(run, str) else None


def noise_floors(cases: list[dict[str, Any]]) -> dict[str, float]:
    """Per configuration, the bound (ms per step) its clean run's lateness was judged against."""
    return {
        key: float(c["seen"]["threshold_ms"])
        for c in cases
        if c["truth"]["kind"] == "clean"
        and c["seen"].get("threshold_ms") is not None
        and (key := config_key(c)) is not None
    }


def case_row(case: dict[str, Any], truth: Truth, seen: Seen, outcome: Outcome) -> dict[str, Any]:
    """One case as the JSON file holds it: its parameters, the truth, what was seen, the outcome."""
    seen_row = asdict(seen)
    seen_row["stragglers"] = {str(r): p for r, p in seen.stragglers.items()}
    seen_row["late_ms"] = {str(r): round(v, 3) for r, v in seen.late_ms.items()}
    if seen.trace_stragglers is not None:
        seen_row["trace_stragglers"] = {str(r): p for r, p in seen.trace_stragglers.items()}
    return {**case, "truth": asdict(truth), "seen": seen_row, "outcome": asdict(outcome), "error": seen.error}
