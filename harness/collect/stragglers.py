"""Collective matching across ranks, clock alignment, and straggler attribution. Pure functions."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from harness.collect.model import CommOp, RankTrace



@dataclass(kw_only=True)
class Instance:
    """One collective instance, matched across the ranks that took part."""

    key: tuple
    name: str
    step: int | None
    ops: dict[int, CommOp]  # rank -> that rank's op


def match_collectives(traces: list[RankTrace]) -> tuple[list[Instance], list[str]]:
    """Match each collective instance across ranks.

    1. key every op by (process group, step, position among that group's ops in that step) when
       every trace has ProfilerStep markers, else by (process group, position in the trace):
       per-step keys survive profiler windows that start a few ops apart on different ranks;
    2. an instance is the ops sharing a key, on at least two ranks;
    3. instances whose ranks disagree on the collective's name (or element count, where known)
       are dropped and counted in a warning: the order has diverged there.
    """
    per_step = all(t.steps_source == "ProfilerStep" for t in traces)
    table: dict[tuple, dict[int, CommOp]] = defaultdict(dict)
    for t in traces:
        pos: dict[tuple, int] = defaultdict(int)
        for c in t.comms:
            if per_step:
                if c.step is None:
                    continue
                base = (c.pg, c.step)
                key = (*base, pos[base])
                pos[base] += 1
            else:
                key = (c.pg, c.seq)
            table[key][t.rank] = c
    instances: list[Instance] = []
    mismatched = 0
    for key, ops in table.items():
        if len(ops) < 2:
            continue
        names = {c.name for c in ops.values()}
        sizes = {c.nelems for c in ops.values() if c.nelems is not None}
        if len(names) > 1 or len(sizes) > 1:
            mismatched += 1
            continue
        any_op = next(iter(ops.values()))
        instances.append(Instance(key=key, name=any_op.name, step=key[1] if per_step else any_op.step, ops=ops))
    instances.sort(key=lambda i: min(c.start_us for c in i.ops.values()))
    warnings = [f"{mismatched} collective instance(s) differ between ranks (name or size) and were left out"] if mismatched else []
    return instances, warnings


@dataclass(kw_only=True)
class ClockOffset:
    rank: int
    offset_us: float  # subtract from this rank's timestamps to align it with the reference rank
    spread_us: float  # median absolute deviation of the per-collective estimates
    samples: int


def estimate_offsets(instances: list[Instance], ranks: list[int]) -> dict[int, ClockOffset]:
    """Per-rank clock offset from the end times of matched blocking collectives.

    A blocking collective ends at nearly the same instant on every participant, so:
    1. reference = the lowest rank present (rank 0 in a complete run);
    2. for every instance with rank r and the reference: d = end_r - end_ref;
    3. offset_r = median(d) (robust to the odd late completion); spread_r = median |d - offset_r|;
    4. a rank sharing no instance with the reference gets offset 0 and spread 0 with samples 0.
    """
    ref = min(ranks)
    diffs: dict[int, list[float]] = defaultdict(list)
    for inst in instances:
        if ref not in inst.ops:
            continue
        end_ref = inst.ops[ref].end_us
        for r, op in inst.ops.items():
            diffs[r].append(op.end_us - end_ref)
    out = {}
    for r in ranks:
        d = diffs.get(r, [])
        if r == ref or not d:
            out[r] = ClockOffset(rank=r, offset_us=0.0, spread_us=0.0, samples=len(d))
            continue
        med = statistics.median(d)
        out[r] = ClockOffset(rank=r, offset_us=med, spread_us=statistics.median(abs(x - med) for x in d), samples=len(d))
    return out


@dataclass(kw_only=True)
class Thresholds:
    """When a rank counts as a straggler (all must hold)."""

    min_lag_ms: float = 1.0  # its per-step blame exceeds this ...
    rel_lag: float = 0.10  # ... and this fraction of the median step time (GPU traces) ...
    # CPU traces: ranks share host cores, gloo threads and the launcher, so a healthy rank can
    # trail its peers by a quarter of a step (measured on 2 cores over 6 steps: up to 23% on the
    # baseline, 25.5% on the comm workload, where gloo's threads compete with backward).
    rel_lag_cpu: float = 0.35
    noise_factor: float = 3.0  # ... and this many times the clock-alignment spread ...
    jitter_factor: float = 3.0  # ... and this many times the MAD of the run's step durations ...
    mad_factor: float = 3.0  # ... and the median blame + this many MADs (3+ ranks)
    min_last_fraction: float = 0.5  # and it was the step's last arriver in at least this share


@dataclass(kw_only=True)
class RankBlame:
    rank: int
    host: str
    blame_ms: float  # total time the other ranks waited for this rank
    wait_ms: float  # total time this rank waited for others
    last_fraction: float  # share of steps in which this rank was the last to arrive
    steps: int
    mean_step_ms: float | None  # mean ProfilerStep (or fallback step) duration
    phase: str | None = None
    phase_excess_ms: float | None = None
    whatif_step_ms: float | None = None
    straggler: bool = False


@dataclass(kw_only=True)
class StragglerResult:
    verdict: str  # "straggler" or "balanced"
    ranks: list[RankBlame]
    per_step: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> wait_us
    step_blame: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> last rank -> others' wait_us
    step_last: dict[int, int] = field(default_factory=dict)  # step -> rank others waited for most
    threshold_ms: float = 0.0
    instance_rows: list[dict] = field(default_factory=list)

    @property
    def stragglers(self) -> list[RankBlame]:
        return sorted((r for r in self.ranks if r.straggler), key=lambda r: -r.blame_ms)


def _mad(xs: list[float]) -> float:
    med = statistics.median(xs)
    return statistics.median(abs(x - med) for x in xs)


def analyze_stragglers(traces: list[RankTrace], instances: list[Instance], offsets: dict[int, ClockOffset],
                       th: Thresholds | None = None) -> StragglerResult:
    """Who everybody waits for, on aligned clocks.

    Per collective instance (ranks aligned by `offsets`):
    1. arrival_r = the op's start on rank r; last = max arrival; wait_r = last - arrival_r;
       transfer = the minimum duration across ranks (the rest of each duration is waiting);
    2. the last arriver is blamed for sum over r of wait_r.
    Per step: wait and blame summed over its instances; the step's last arriver is the rank with
    the most blame in it. Per rank: blame_ms, wait_ms, last_fraction = share of steps it was last.
    Straggler: per-step blame above every bound in `Thresholds` (absolute; relative to the median
    step, a larger share on CPU-only traces; the clock-alignment spread; the run's own step-time
    jitter, i.e. the median absolute deviation of all ranks' step durations, which on ranks
    sharing CPU cores is several ms; on 3+ ranks the median + k MAD of the ranks' blames) and
    last in enough steps.
    Phase: after a collective every rank is in step, so at each instance the straggler arrived
    last at, each rank's run-up is the stretch from the end of its previous collective to its
    arrival (own clock; the waiting comes after arrival and is excluded). Per harness phase, the
    straggler's time inside its run-up minus the median of the other ranks' is its excess;
    summed over those instances and divided by the steps, the largest names the phase. Without
    harness ranges the same run-up comparison is made over device compute by kernel (or, on
    CPU, aten op) name, prefixed "op:", and over device idle time, named "idle (waiting on the
    host)": a rank whose device sat idle longer before arriving was held up on the host.
    What-if: the median rank's mean step time minus the mean wait per step it spent on this rank
    (blame per step / (ranks - 1)).
    """
    th = th or Thresholds()
    by_rank = {t.rank: t for t in traces}
    ranks = sorted(by_rank)
    blame = defaultdict(float)
    wait = defaultdict(float)
    caused: dict[int, list[Instance]] = defaultdict(list)  # rank -> instances it arrived last at
    per_step: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    step_blame: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    rows = []
    for inst in instances:
        arrival = {r: op.start_us - offsets[r].offset_us for r, op in inst.ops.items()}
        last_rank = max(arrival, key=arrival.get)
        last = arrival[last_rank]
        transfer = min(op.dur_us for op in inst.ops.values())
        waits = {r: last - a for r, a in arrival.items()}
        total_wait = sum(waits.values())
        for r, w in waits.items():
            wait[r] += w
            if inst.step is not None:
                per_step[inst.step][r] += w
        blame[last_rank] += total_wait
        if total_wait > 0:
            caused[last_rank].append(inst)
        if inst.step is not None:
            step_blame[inst.step][last_rank] += total_wait
        rows.append({"key": list(inst.key), "name": inst.name, "step": inst.step, "last_rank": last_rank,
                     "wait_us": waits, "transfer_us": transfer})
    step_last = {s: max(b, key=b.get) for s, b in step_blame.items() if b and max(b.values()) > 0}
    n_steps = max(len(step_blame), 1)
    mean_step_ms = {r: statistics.mean([s.dur_us for s in by_rank[r].steps]) / 1e3 if by_rank[r].steps else None
                    for r in ranks}
    timed = [m for m in mean_step_ms.values() if m is not None]
    median_step_ms = statistics.median(timed) if timed else 0.0
    # Noise: how far matched collectives' ends scatter once aligned (the reference rank's own
    # spread is 0 by construction and is left out).
    spreads = [o.spread_us for o in offsets.values() if o.samples and o.rank != min(ranks)]
    noise_ms = statistics.median(spreads) / 1e3 if spreads else 0.0
    per_step_blame = {r: blame[r] / 1e3 / n_steps for r in ranks}
    durations_ms = [s.dur_us / 1e3 for t in traces for s in t.steps]
    jitter_ms = _mad(durations_ms) if durations_ms else 0.0
    rel_lag = th.rel_lag_cpu if all(t.device == "cpu" for t in traces) else th.rel_lag
    threshold = max(th.min_lag_ms, rel_lag * median_step_ms, th.noise_factor * noise_ms, th.jitter_factor * jitter_ms)
    if len(ranks) >= 3:
        values = list(per_step_blame.values())
        threshold = max(threshold, statistics.median(values) + th.mad_factor * _mad(values))
    result = []
    for r in ranks:
        last_fraction = sum(1 for s in step_last.values() if s == r) / n_steps if step_last else 0.0
        is_straggler = per_step_blame[r] > threshold and last_fraction >= th.min_last_fraction and len(ranks) > 1
        rb = RankBlame(rank=r, host=by_rank[r].host, blame_ms=blame[r] / 1e3, wait_ms=wait[r] / 1e3,
                       last_fraction=last_fraction, steps=len(by_rank[r].steps), mean_step_ms=mean_step_ms[r],
                       straggler=is_straggler)
        if is_straggler:
            rb.phase, rb.phase_excess_ms = _slow_phase(r, caused[r], by_rank, n_steps)
            rb.whatif_step_ms = max(median_step_ms - per_step_blame[r] / (len(ranks) - 1), 0.0)
        result.append(rb)
    verdict = "straggler" if any(r.straggler for r in result) else "balanced"
    return StragglerResult(verdict=verdict, ranks=result, per_step={s: dict(v) for s, v in per_step.items()},
                           step_blame={s: dict(v) for s, v in step_blame.items()},
                           step_last=step_last, threshold_ms=threshold, instance_rows=rows)


def _overlap_by_name(spans: list[tuple[str, float, float]], lo: float, hi: float) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, a, b in spans:
        if b > lo and a < hi:
            out[name] += min(b, hi) - max(a, lo)
    return out


def _slow_phase(slow: int, caused: list[Instance], by_rank: dict[int, RankTrace], n_steps: int) -> tuple[str | None, float | None]:
    """The phase with the largest run-up excess (see analyze_stragglers)."""
    use_phases = any(st.phase_spans for st in by_rank[slow].steps)
    spans = {r: [sp for st in t.steps for sp in st.phase_spans] for r, t in by_rank.items()} if use_phases else {}
    excess: dict[str, float] = defaultdict(float)
    for inst in caused:
        times = {}
        for r, op in inst.ops.items():
            if use_phases:
                lo = op.start_us if op.run_up_start_us is None else op.run_up_start_us
                times[r] = _overlap_by_name(spans[r], lo, op.start_us)
            else:
                times[r] = op.run_up_us
        peers = [r for r in inst.ops if r != slow]
        for name in set().union(*times.values()):
            excess[name] += times[slow].get(name, 0.0) - statistics.median([times[r].get(name, 0.0) for r in peers])
    if not excess:
        return None, None
    name = max(excess, key=excess.get)
    if excess[name] <= 0:
        return None, None
    return name, excess[name] / n_steps / 1e3
