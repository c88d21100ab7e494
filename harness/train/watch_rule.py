"""The live watch's verdict on one interval of step timings: who is a straggler, in which phase.
Pure functions, no torch; the exchange between ranks is harness/train/watch.py.

Why phase times, and which ones. In synchronous training every rank leaves a collective at the
same moment, so what makes the others wait is the work a rank does between collectives: a rank
that spends longer there arrives later at the next collective, and the others wait for it inside
the phase that holds the collective. That phase (backward under DDP; forward and backward under
FSDP) lasts about as long on every rank (the slow one works, the others wait), so it tells a
cause from a victim by nothing; the phases that hold no collective do ("own work"). A rank's
lateness at the next collective is then how much longer its own work took than the punctual
ranks' (the collector's `punctual_arrival`, the lower quartile), and the collector's rule
(`straggler_bounds`) decides. What this cannot see: a rank that is slow *inside* the phase that
holds the collectives (a slow backward under DDP): every rank's phase ends together. The traces
see it (the collector's lateness at each collective); a scheduled or triggered window captures it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from harness.collect.stragglers import Thresholds, punctual_arrival, run_jitter_ms, straggler_bounds
from harness.paths import STEP_PHASES

# Phases that hold collectives, per parallel wrapper (harness/train/parallel.py): DDP all-reduces
# gradients during backward; FSDP2 all-gathers parameters in forward and backward and
# reduce-scatters gradients in backward. "none" holds none.
COLLECTIVE_PHASES = {"ddp": ("backward",), "fsdp": ("forward", "backward"), "none": ()}


def own_work_phases(parallel: str) -> tuple[str, ...]:
    """The step phases that hold no collective under `parallel` (ddp, fsdp or none)."""
    held = COLLECTIVE_PHASES.get(parallel, ("forward", "backward"))
    return tuple(p for p in STEP_PHASES if p not in held)


@dataclass(frozen=True)
class StepTimes:
    """One rank's timings of one step, from its step record (harness/train/timing.py)."""

    step: int
    step_ms: float
    phases_ms: dict[str, float]


@dataclass(kw_only=True)
class RankLateness:
    rank: int
    host: str
    late_ms: float  # mean per step of its own work's excess over the punctual ranks'
    steps_late: int  # steps in which that excess was over the threshold
    phase: str | None  # the own-work phase with the largest excess over the other ranks' median
    excess_ms: float | None  # that excess, per step
    straggler: bool = False


@dataclass(kw_only=True)
class IntervalVerdict:
    steps: list[int]  # the steps judged (common to every rank)
    ranks: list[RankLateness]
    threshold_ms: float = 0.0
    bounds_ms: dict[str, float] = field(default_factory=dict)

    @property
    def stragglers(self) -> list[RankLateness]:
        return sorted((r for r in self.ranks if r.straggler), key=lambda r: (-r.late_ms, r.rank))


def judge_interval(times: dict[int, list[StepTimes]], hosts: dict[int, str], own_phases: tuple[str, ...], *,
                   cpu: bool, th: Thresholds) -> IntervalVerdict:
    """Who straggled over an interval of steps, from every rank's step timings.

    1. the steps judged are those every rank timed;
    2. per step and rank: own = the sum of its own-work phases (`own_work_phases`); lateness =
       own - the punctual ranks' own (`punctual_arrival`: the lower quartile), at least 0;
    3. per rank: late_ms = the mean lateness per step;
    4. the collector's rule (`straggler_bounds`): the median rank's mean step time, the run's
       jitter over each rank's step times, no clock noise (each rank times itself: no clocks are
       compared); a straggler's late_ms exceeds every bound; steps_late = steps whose lateness
       exceeds the threshold;
    5. per rank and own-work phase: excess = the mean per step of its time minus the median of
       the other ranks' time; the largest positive excess names the phase.
    """
    ranks = sorted(times)
    by_step = [{t.step: t for t in times[r]} for r in ranks]
    steps = sorted(set.intersection(*(set(d) for d in by_step))) if by_step else []
    if not steps or len(ranks) < 2:
        return IntervalVerdict(steps=steps, ranks=[])
    own = {s: {r: sum(d[s].phases_ms.get(p, 0.0) for p in own_phases) for r, d in zip(ranks, by_step)} for s in steps}
    late = {s: _lateness(per_rank) for s, per_rank in own.items()}
    late_ms = {r: statistics.fmean(late[s][r] for s in steps) for r in ranks}
    step_ms = {r: [d[s].step_ms for s in steps] for r, d in zip(ranks, by_step)}
    bounds = straggler_bounds(late_ms, median_step_ms=statistics.median(statistics.fmean(v) for v in step_ms.values()),
                              clock_noise_ms=0.0, jitter_ms=run_jitter_ms(list(step_ms.values())), cpu=cpu, th=th)
    threshold = max(bounds.values())
    out = []
    for r in ranks:
        phase, excess = _slowest_phase(r, ranks, by_step, steps, own_phases)
        out.append(RankLateness(rank=r, host=hosts.get(r, "?"), late_ms=late_ms[r],
                                steps_late=sum(1 for s in steps if late[s][r] > threshold),
                                phase=phase, excess_ms=excess, straggler=late_ms[r] > threshold))
    return IntervalVerdict(steps=steps, ranks=out, threshold_ms=threshold, bounds_ms=bounds)


def _lateness(own_ms: dict[int, float]) -> dict[int, float]:
    mark = punctual_arrival(own_ms)
    return {r: max(v - mark, 0.0) for r, v in own_ms.items()}


def _slowest_phase(rank: int, ranks: list[int], by_step: list[dict[int, StepTimes]], steps: list[int],
                   own_phases: tuple[str, ...]) -> tuple[str | None, float | None]:
    mine = by_step[ranks.index(rank)]
    others = [d for r, d in zip(ranks, by_step) if r != rank]
    excess = {p: statistics.fmean(mine[s].phases_ms.get(p, 0.0)
                                  - statistics.median(d[s].phases_ms.get(p, 0.0) for d in others) for s in steps)
              for p in own_phases}
    best = max(sorted(excess), key=excess.get, default=None)
    if best is None or excess[best] <= 0:
        return None, None
    return best, excess[best]
