"""The live watch's verdict on one interval of step timings: who is a straggler, in which phase.
Pure functions over the gathered table (a tensor: every rank judges thousands of ranks' steps in
milliseconds); the exchange between ranks is harness/watch/exchange.py.

Why phase times, and which ones. In synchronous training every rank leaves a collective at the
same moment, so what makes the others wait is the work a rank does between collectives: a rank
that spends longer there arrives later at the next collective, and the others wait for it inside
the phase that holds the collective. That phase (backward under DDP; forward and backward under
FSDP) lasts about as long on every rank (the slow one works, the others wait), so it tells a
cause from a victim by nothing; the phases that hold no collective do ("own work"). A rank's
lateness at the next collective is then how much longer its own work took than the punctual
ranks' (the collector's punctual mark, the lower quartile), and the collector's rule
(`straggler_bounds`) decides. Inside a phase that holds collectives a CPU rank's lateness is read
from its arrivals at those collectives (the Flight Recorder's, arrivals.py), so a rank that
computes, sleeps or blocks longer there is seen; where they are not known (the recorder off), its
CPU time there (timing.py: waiting in a gloo collective blocks it off its core), which sees one
that computes longer and not one that sleeps. A GPU host issues collectives ahead of its device,
so its issue times are no arrivals; under DDP a GPU rank's own work in backward is its device's
time there until its last gradient (`Run.watch_gradients`, grads_ready.py): DDP's all-reduces run
beside backward on their own stream, and the compute stream waits for them only at backward's
end. Under FSDP no one event splits work from waiting on a GPU (its all-gathers hold the
compute stream between the phase's layers); there a rank's arrivals come from NCCL's durations
(arrivals.py: the kernel ends on every rank together, so the shorter its duration the later it
arrived). What this cannot see: a GPU rank slow inside a DDP backward that waits for peers
before its last gradient (SyncBatchNorm, tensor- or expert-parallel collectives), inside DDP's
backward in a loop that did not hook its gradients, or inside FSDP's phases without the Flight
Recorder. The traces see it (the collector's lateness at each collective); a scheduled or
triggered window captures it.

Pipelines. A stage waits at its receives for its neighbour (comm_wait.py times that per phase),
longer for a slow one, and its stages do different work by design. So: waiting at point-to-point
ops is no phase's own work; a phase that held such waits and no collective (a pipeline's
forward, with the Flight Recorder saying which phases held collectives) is judged by its wall
time less them, as a phase of own work is; a rank held at its receives reaches its stage's
all-reduce late by that hold, which is taken out of its arrivals there; and each rank is
compared with the ranks of its own stage (`stages`, from where each step's first receive came,
before any send), as the collector compares a stage's data-parallel ranks at their all-reduce.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

import torch

from harness.paths import STEP_PHASES
from harness.run.gpu_health import THROTTLE_REASONS
from harness.traces.analyse.gpu_health import GpuReading, gpu_findings
from harness.traces.analyse.noise import NoiseModel
from harness.traces.analyse.stragglers import (
    MIN_JITTER_STEPS,
    Thresholds,
    peer_baseline,
    straggler_bounds,
)
from harness.watch.arrivals import HeldArrivals, held_lateness_ms, punctual_of

# The phases the watch judges: the harness's, and `forward_backward`, which Hugging Face's Trainer
# callback marks for forward and backward together (its hooks do not split them,
# harness/integrations/hf.py); like backward it holds DDP's and FSDP's collectives.
WATCH_PHASES = (*STEP_PHASES, "forward_backward")
# The table one rank sends: a row per step, [step, step_ms, one column per WATCH_PHASES (wall time),
# one per WATCH_PHASES (its own work there: on CPU its CPU time, timing.py's phases_cpu_ms; on GPU,
# in a phase that holds DDP's all-reduce, its device's time there until its last gradient,
# phases_own_device_ms), one per WATCH_PHASES (time held at point-to-point ops, phases_p2p_ms, 0 where
# none), one per WATCH_PHASES (time held at collectives waited on from Python,
# phases_collective_wait_ms, 0 where none), the source of the step's first point-to-point op
# where that was a receive (first_recv_from: its place in a pipeline, `stages`), its GPU's SM
# clock and throttle reasons as a bit mask (the latest NVML reading: gpu_health.py)]; NaN pads the
# rows a rank has not timed yet (on GPU a step is timed once its CUDA events complete), the
# phases a step did not have, the times a rank did not take, a step that received nothing
# before it sent and a GPU not read.
PHASES = len(WATCH_PHASES)
COLUMNS = 2 + 4 * PHASES + 3
SOURCE_COLUMN = 2 + 4 * PHASES
GPU_CLOCK_COLUMN = SOURCE_COLUMN + 1
GPU_THROTTLE_COLUMN = SOURCE_COLUMN + 2
# The throttle reasons' words as bits of the exchanged mask, one bit a word.
THROTTLE_BITS = {w: 1 << i for i, w in enumerate(dict.fromkeys(THROTTLE_REASONS.values()))}
# At most this many stragglers get a phase per interval (the most late): each phase compares a rank
# with every other rank (at 1024 ranks most of the verdict's time: bench/RESULTS.md, "Harness and
# profiler overhead"), so 16, two 8-GPU nodes' worth like the collector's MAX_CAUSES, bounds it;
# the rest are flagged unnamed.
MAX_PHASED = 16

# Phases that hold collectives, per parallel wrapper (harness/train/parallel.py): DDP all-reduces
# gradients during backward; FSDP2 all-gathers parameters in forward and backward and
# reduce-scatters gradients in backward. "none" holds none.
COLLECTIVE_PHASES = {
    "ddp": ("backward", "forward_backward"),
    "fsdp": ("forward", "backward", "forward_backward"),
    "none": (),
}


def table_rows(every: int, timed_by_nccl: bool) -> int:
    """How many of its latest steps a rank sends at each exchange: twice the interval, so that
    steps a GPU rank timed late (its events completed after an exchange) are still there at the
    next; four times where the steps wait for NCCL's timing of their collectives (GPU arrivals,
    arrivals.untimed_steps), which comes up to ~100 ms after them: steps shorter than that over
    an interval shorter than that are held back over more than one exchange."""
    return (4 if timed_by_nccl else 2) * max(every, 1)


def watch_thresholds(min_late_ms: float = 0.0) -> Thresholds:
    """The collector's rule as the watch applies it: the same bounds, with --watch-min-late-ms."""
    return Thresholds(min_late_ms=min_late_ms)


def own_work_phases(parallel: str) -> tuple[str, ...]:
    """The step phases that hold no collective under `parallel` (ddp, fsdp or none)."""
    held = COLLECTIVE_PHASES[parallel]
    return tuple(p for p in WATCH_PHASES if p not in held)


@dataclass(kw_only=True)
class RankLateness:
    rank: int
    host: str
    late_ms: float  # mean per step of its own work's excess over the punctual ranks'
    beyond_peers_ms: float  # late_ms less its peers' (stragglers.peer_baseline): what is judged
    steps_late: int  # steps in which its lateness beyond its peers' was over the threshold
    phase: str | None  # the own-work phase with the largest excess over the other ranks' median
    excess_ms: float | None  # that excess, per step
    straggler: bool = False
    gpu: str | None = None  # its GPU against its peers' where it ran slower (gpu_health.gpu_findings)


@dataclass(kw_only=True)
class IntervalVerdict:
    steps: list[int]  # the steps judged (common to every rank)
    ranks: list[RankLateness]
    threshold_ms: float = 0.0
    bounds_ms: dict[str, float] = field(default_factory=dict)
    own_work_only: bool = False  # steps whose collectives NCCL has not timed yet: their own work judged alone

    @property
    def stragglers(self) -> list[RankLateness]:
        return sorted((r for r in self.ranks if r.straggler), key=lambda r: (-r.late_ms, r.rank))


def step_row(record: dict) -> list[float]:
    """A step record (harness/run/timing.py) as a row of the exchanged table: its phase times
    on the device where timed there (GPU: the data phase too, as its device waited for it or
    worked in it, not the host's time blocked on the loader, which a host running ahead of its
    GPU hides), else its phase times; its own work per phase: its CPU time (CPU) or, in a phase
    that holds collectives, its device's time there until its last gradient (GPU, where marked:
    timing.py's phases_own_device_ms); its waits at point-to-point ops and at collectives per
    phase; where its first point-to-point op received from."""
    phases = record.get("phases_device_ms") or record.get("phases_ms") or {}
    cpu = record.get("phases_cpu_ms") or record.get("phases_own_device_ms") or {}
    p2p = record.get("phases_p2p_ms") or {}
    held = record.get("phases_collective_wait_ms") or {}
    source = record.get("first_recv_from")
    clock = record.get("gpu_sm_clock_mhz")
    throttle = record.get("gpu_throttle")
    return [
        record["step"],
        record["step_ms"],
        *(phases.get(p, math.nan) for p in WATCH_PHASES),
        *(cpu.get(p, math.nan) for p in WATCH_PHASES),
        *(p2p.get(p, 0.0) for p in WATCH_PHASES),
        *(held.get(p, 0.0) for p in WATCH_PHASES),
        math.nan if source is None else source,
        math.nan if clock is None else clock,
        math.nan if throttle is None else sum(THROTTLE_BITS.get(w, 0) for w in throttle),
    ]


def pack_rows(rows: list[list[float]], n: int) -> torch.Tensor:
    """One rank's table for the exchange: its latest `n` rows (`step_row`), NaN-padded."""
    rows = rows[-n:]
    return torch.tensor(rows + [[math.nan] * COLUMNS] * (n - len(rows)), dtype=torch.float64)


def judge_interval(
    tables: torch.Tensor,
    hosts: dict[int, str],
    own_phases: tuple[str, ...],
    *,
    noise: NoiseModel,
    th: Thresholds,
    after_step: int = -1,
    held_phases: tuple[str, ...] = (),
    arrivals: HeldArrivals | None = None,
    until_step: int | None = None,
) -> IntervalVerdict:
    """Who straggled over an interval of steps, from every rank's table ([ranks, rows, COLUMNS],
    rank r's table at index r, see `pack_rows`).

    1. the steps judged are those after `after_step` (and up to `until_step`, where given: on GPU
       the last step whose collectives NCCL has timed on every rank, `arrivals.untimed_steps`)
       that every rank timed;
    2. per step and rank: own = the sum of its own-work phases (`own_work_phases`; less its
       waits at point-to-point ops and collectives, phases_p2p_ms and
       phases_collective_wait_ms: a pipeline neighbour's, a slow peer's; a wait for a core stays:
       a rank other work keeps off its cores is late) and, per phase that
       holds collectives (`held_phases`), of its own work there (`step_row`: CPU time on CPU; on
       GPU its device's time until its last gradient; none in a step where some rank lacks it)
       or, where every rank's arrivals at those collectives are known (`arrivals`), the larger
       of its CPU time beyond its stage's punctual ranks' mean there and the lateness its
       arrivals show it added there (arrivals.held_lateness_ms: a rank that sleeps or blocks
       there) less its waits at point-to-point ops there beyond its stage's punctual ranks' (a
       stage held at its receives of a slow neighbour's gradients), or, in a held phase that
       waited at point-to-point ops and held no collective (`point_to_point_phases`), its wall
       time as in an own-work phase; lateness = own - the punctual ranks' own among the ranks
       of its pipeline stage (the lower quartile: `punctual_index`; `stages`: all ranks where there is no pipeline),
       at least 0;
    3. per rank: late_ms = the mean lateness per step; beyond_peers_ms = late_ms less
       `peer_baseline` of the ranks' late_ms;
    4. the collector's rule (`straggler_bounds`): the median rank's mean step time, the run's
       jitter over each rank's own work per step (`jitter_ms`: the collector's too takes the
       waiting out, which an intermittent straggler puts in every rank's step), no clock noise
       (each rank times itself: no clocks are compared); steps_late = steps whose lateness beyond that step's
       `peer_baseline` exceeds the threshold; a straggler's beyond_peers_ms exceeds every bound,
       and its steps_late is at least the noise model's min_late_steps (all the steps where
       fewer: noise.py);
    5. per straggler (the MAX_PHASED with the largest beyond_peers_ms) and phase of step 2
       (own-work by wall time, held by CPU time): excess = the mean per step of its time minus
       the median of its stage's other ranks' time; the
       largest positive one names the phase;
    6. per straggler, where the ranks sent their GPUs' NVML readings: the collector's rule on
       them over the judged steps (gpu_health.gpu_findings: a lower clock, a throttle reason its
       peers did not have).
    """
    n_ranks = tables.shape[0]
    step_col = tables[..., 0]
    valid = ~torch.isnan(step_col) & (step_col > after_step)
    if until_step is not None:
        valid &= step_col <= until_step
    filled = torch.where(valid, step_col, -1.0)
    if bool((filled == filled[0]).all()):  # every rank timed the same steps (always on CPU): no alignment
        table = tables[:, valid[0]]
        steps = [int(s) for s in table[0, :, 0].tolist()]
    else:  # on GPU ranks resolve their steps' CUDA events at different times
        keyed = torch.where(valid, step_col, math.inf)
        held, counts = torch.unique(keyed[valid], return_counts=True)  # a rank holds each step once
        common = held[counts == n_ranks]
        steps = [int(s) for s in common.tolist()]
        ordered, perm = keyed.sort(dim=1)
        rows = perm.gather(1, torch.searchsorted(ordered, common.expand(n_ranks, -1).contiguous()))
        table = torch.gather(tables, 1, rows.unsqueeze(-1).expand(-1, -1, COLUMNS))  # [ranks, steps, COLUMNS]
    if not steps or n_ranks < 2:
        return IntervalVerdict(steps=steps, ranks=[])
    walls = torch.nan_to_num(table[..., 2 : 2 + PHASES], nan=0.0)
    cpus = table[..., 2 + PHASES : 2 + 2 * PHASES]
    # own work in a phase counts in a step only where every rank has it: a rank without it (a
    # GPU step its gradient hook did not mark) would be the punctual mark and make the rest late
    cpus = torch.where(torch.isnan(cpus).any(dim=0, keepdim=True), 0.0, cpus)
    p2p = torch.nan_to_num(table[..., 2 + 2 * PHASES : 2 + 3 * PHASES], nan=0.0)
    collective = torch.nan_to_num(table[..., 2 + 3 * PHASES : 2 + 4 * PHASES], nan=0.0)
    # the time it waited for a pipeline neighbour or for the peers of a collective it waited on
    # is not its work (a wait for a core is: a rank other work keeps off its cores is late)
    walls = (walls - p2p - collective).clamp(min=0.0)
    groups = stages(table[..., SOURCE_COLUMN])
    names = own_phases + held_phases
    own_cols = [WATCH_PHASES.index(p) for p in own_phases]
    held_cols = [WATCH_PHASES.index(p) for p in held_phases]
    held = cpus[..., held_cols]
    if arrivals is not None and held_cols:
        late_held = held_lateness_ms(
            arrivals.spans_ns,
            arrivals.arrivals,
            steps,
            held_phases,
            arrivals.offsets_ns,
            device=arrivals.device,
            groups=groups,
        )
        if late_held is not None:
            # a rank held at its receives (a pipeline stage waiting for a slow neighbour's
            # gradients) reaches the collective after them late by that hold: its waiting there
            # beyond its stage's punctual ranks' is taken out (the collector's runup.p2p_wait,
            # `_judged_arrival`)
            waited = p2p[..., held_cols]
            late_held = (late_held - (waited - punctual_of(waited, groups)).clamp(min=0.0)).clamp(min=0.0)
            # each is a lower bound of the time a rank added there: its CPU time beyond the
            # punctual ranks' (a constant per phase over the interval, which moves no rank's
            # lateness or jitter) misses its sleeps, its arrivals miss all but one stretch of a
            # slowness spread between blocking collectives (arrivals.held_lateness_ms)
            ref = punctual_of(held.mean(dim=1), groups)  # [ranks, held phases]
            held = torch.maximum(held - ref[:, None, :], late_held)
        for k in point_to_point_phases(held_phases, p2p[..., held_cols], arrivals, steps):
            held[..., k] = walls[..., held_cols[k]]
    work = torch.cat([walls[..., own_cols], held], dim=-1)  # [ranks, steps, names]
    own = work.sum(-1)  # [ranks, steps]
    late = (own - punctual_of(own, groups)).clamp(min=0.0)
    late_ms = dict(enumerate(late.mean(dim=1).tolist()))
    baseline = peer_baseline(list(late_ms.values()))
    beyond = {r: v - baseline for r, v in late_ms.items()}
    median_step_ms = statistics.median(table[..., 1].mean(dim=1).tolist())
    bounds = straggler_bounds(
        late_ms,
        median_step_ms=median_step_ms,
        clock_noise_ms=0.0,
        jitter_ms=jitter_ms(own) if own.shape[1] >= MIN_JITTER_STEPS else None,
        th=th,
        late_jitter_ms=late_jitter_of(late),
    )
    threshold = max(bounds.values())
    lower = late.sort(dim=0).values[: max(n_ranks // 2, 1)]  # per step, the lower half's median: peer_baseline
    beyond_step = late - median(lower, dim=0)

    need = min(noise.min_late_steps, len(steps))
    steps_late = (beyond_step > threshold).sum(dim=1).tolist()
    over = {r for r in range(n_ranks) if beyond[r] > threshold and steps_late[r] >= need}
    flagged = sorted(over, key=lambda r: (-beyond[r], r))
    phased = {r: _slowest_phase(r, work, names, groups) for r in flagged[:MAX_PHASED]}
    gpu = _gpu_texts(flagged[:MAX_PHASED], table, steps)
    out = [
        RankLateness(
            rank=r,
            host=hosts.get(r, "?"),
            late_ms=late_ms[r],
            beyond_peers_ms=beyond[r],
            steps_late=int(steps_late[r]),
            phase=phased.get(r, (None, None))[0],
            excess_ms=phased.get(r, (None, None))[1],
            straggler=r in over,
            gpu=gpu.get(r),
        )
        for r in range(n_ranks)
    ]
    return IntervalVerdict(steps=steps, ranks=out, threshold_ms=threshold, bounds_ms=bounds)


def _gpu_texts(ranks: list[int], table: torch.Tensor, steps: list[int]) -> dict[int, str]:
    """Step 6 of `judge_interval`: what the collector's rule says of each rank's GPU, from the
    readings the ranks sent (none where no rank sent one)."""
    clocks = table[..., GPU_CLOCK_COLUMN]
    if not ranks or bool(torch.isnan(clocks).all()):
        return {}
    masks = torch.nan_to_num(table[..., GPU_THROTTLE_COLUMN], nan=0.0).to(torch.int64).tolist()
    readings = {
        r: {
            s: GpuReading(
                sm_clock_mhz=None if math.isnan(c) else c,
                throttle=tuple(w for w, bit in THROTTLE_BITS.items() if m & bit),
                temp_c=None,
            )
            for s, c, m in zip(steps, clocks[r].tolist(), masks[r])
        }
        for r in range(table.shape[0])
    }
    return {r: f.text for r, f in gpu_findings(ranks, readings).items()}


@dataclass(kw_only=True)
class Judgement:
    verdict: IntervalVerdict  # the timed steps' (the ahead verdict where none was timed)
    new: list[RankLateness]  # the stragglers not flagged in the interval before
    gone: list[int]  # the ranks flagged then and not now
    # the own work of the steps NCCL has not timed yet (`WatchJudge`, 2), where some were not
    ahead: IntervalVerdict | None = None

    def verdict_of(self, rank: RankLateness) -> IntervalVerdict:
        """The verdict that named `rank` (one of `new`)."""
        return self.ahead if self.ahead is not None and any(r is rank for r in self.ahead.ranks) else self.verdict


@dataclass(kw_only=True)
class WatchJudge:
    """What the watch carries from one interval to the next, and the judging of each: the live
    watch's (watch.py) and the detection campaign's on generated GPU jobs
    (bench/detect/gpu_watch.py), which judges the tables a simulated run's ranks would exchange.

    1. `judge_interval` over the steps after the last one judged (up to the arrivals'
       `timed_through`: on GPU a step whose collectives NCCL has not timed on every rank yet
       waits for the next interval); fewer than the noise model's min_late_steps steps wait too
       (a straggler must be late in that many, noise.py; such an interval is the first after a
       warm-up that ends one step before an exchange);
    2. where steps wait so, `judge_interval` of their own-work phases alone (the ahead
       verdict): those phases' times are the step's CUDA events, complete at its end, and
       only the phases holding collectives need NCCL's durations (its watchdog times them up to
       100 ms after they end, several intervals of short steps); its stragglers are flagged
       now, and the steps are judged whole once timed;
    3. new = the stragglers of both not flagged in the interval before, gone = those flagged
       then and in neither now (a rank flagged ahead stays flagged until a verdict over timed
       steps leaves it out). An interval without a step every rank has timed (on GPU, events
       not yet complete) judges nothing and changes nothing."""

    own_phases: tuple[str, ...]
    held_phases: tuple[str, ...]
    noise: NoiseModel
    th: Thresholds
    judged_through: int = -1
    flagged: set[int] = field(default_factory=set)

    def judge(
        self, tables: torch.Tensor, hosts: dict[int, str], arrivals: HeldArrivals | None = None
    ) -> Judgement | None:
        timed_through = None if arrivals is None else arrivals.timed_through
        verdict = judge_interval(
            tables,
            hosts,
            self.own_phases,
            noise=self.noise,
            th=self.th,
            after_step=self.judged_through,
            held_phases=self.held_phases,
            arrivals=arrivals,
            until_step=timed_through,
        )
        if len(verdict.steps) < self.noise.min_late_steps:
            verdict = IntervalVerdict(steps=[], ranks=[])  # the tables hold them for the next (`table_rows`)
        ahead = None
        if timed_through is not None and self.own_phases:
            ahead = judge_interval(
                tables,
                hosts,
                self.own_phases,
                noise=self.noise,
                th=self.th,
                after_step=max(self.judged_through, timed_through),
            )
            ahead = replace(ahead, own_work_only=True) if ahead.steps else None
        if not verdict.steps and ahead is None:
            return None
        now = set(self.flagged)  # no step timed: the flags stand until one is
        if verdict.steps:
            self.judged_through = verdict.steps[-1]
            now = {r.rank for r in verdict.stragglers}
        named = {r.rank for r in verdict.stragglers}  # none where no step was timed
        early = [r for r in ahead.stragglers if r.rank not in named] if ahead else []
        now |= {r.rank for r in early}
        new = [r for r in verdict.stragglers + early if r.rank not in self.flagged]
        gone = sorted(self.flagged - now)
        self.flagged = now
        return Judgement(verdict=verdict if verdict.steps or ahead is None else ahead, new=new, gone=gone, ahead=ahead)


def stages(sources: torch.Tensor) -> list[int]:
    """Each rank's place in a pipeline, from the source of each step's first point-to-point op
    where that was a receive ([ranks, steps], global ranks, NaN where none; `step_row`): a stage
    begins a step by receiving its activations from the stage before it, a first stage by
    sending. A pipeline's stages do different work by design (the last one's loss and head,
    say), so a rank is judged against its own stage's ranks (its data-parallel peers), not the
    whole job's.
    1. a rank's source: its last step's that has one (none: it sends before it receives, a first
       stage, or a job with no pipeline);
    2. its place: 0 without a source, else its source's place + 1, following the chain;
    3. ranks on a cycle of sources (an interleaved schedule: the last stage feeds the first's
       next chunk) or with a source that is not a rank here share one place, -1.
    A job with no pipeline: every rank in place 0, one group, as before stages were told apart."""
    n = sources.shape[0]
    steps = torch.arange(sources.shape[1]).expand_as(sources)
    last = torch.where(torch.isnan(sources), -1, steps).max(dim=1).values  # each rank's last step with one
    latest = sources.gather(1, last.clamp(min=0)[:, None]).squeeze(1).tolist()
    source = [int(v) if i >= 0 else None for i, v in zip(last.tolist(), latest)]
    places = []
    for r in range(n):
        place, at, seen = 0, r, {r}
        while (up := source[at]) is not None:
            if not 0 <= up < n or up in seen:
                place = -1
                break
            seen.add(up)
            place, at = place + 1, up
        places.append(place)
    return places


def point_to_point_phases(
    held_phases: tuple[str, ...], p2p: torch.Tensor, arrivals: HeldArrivals | None, steps: list[int]
) -> list[int]:
    """The indices of `held_phases` that held point-to-point waits (`p2p`: [ranks, steps, held
    phases], phases_p2p_ms) over these steps and no collective on any rank (a pipeline's forward:
    sends and receives alone, which the recorder's arrivals leave out). There a rank's wall time
    less its waits is its own work, as in a phase that holds nothing; the waits are what its
    neighbours cost it. Only where the arrivals say which phases held collectives (the recorder
    on): without them a phase with waits may hold a collective too, whose wait its wall time
    would keep."""
    if arrivals is None:
        return []
    judged = set(steps)
    held_collectives = {a[1] for mine in arrivals.arrivals for a in mine if a[0] in judged}
    waited = (p2p > 0).flatten(0, 1).any(dim=0).tolist()
    return [k for k, phase in enumerate(held_phases) if waited[k] and phase not in held_collectives]


def jitter_ms(step_ms: torch.Tensor) -> float:
    """`run_jitter_ms` (the collector's jitter) of a [ranks, steps] tensor of own work: per rank
    the median absolute deviation of its own work, or of it less each step's part every rank
    shares (the median over the ranks, with two ranks or more) where that is smaller; the median
    of the lower half of those (`median`); 0 under MIN_JITTER_STEPS steps."""
    if step_ms.shape[1] < MIN_JITTER_STEPS:
        return 0.0

    def mads(x: torch.Tensor) -> torch.Tensor:
        return median((x - median(x, dim=1).unsqueeze(1)).abs(), dim=1)

    per_rank = mads(step_ms)
    if step_ms.shape[0] >= 2:
        per_rank = torch.minimum(per_rank, mads(step_ms - median(step_ms, dim=0).unsqueeze(0)))
    per_rank = per_rank.sort().values
    return float(median(per_rank[: max(len(per_rank) // 2, 1)], dim=0))


def late_jitter_of(late: torch.Tensor) -> float | None:
    """`late_jitter_ms` (the collector's) of a [ranks, steps] tensor of lateness per step: the
    median over the lower half of the ranks by mean lateness of their median absolute
    deviations; None under MIN_JITTER_STEPS steps."""
    if late.shape[1] < MIN_JITTER_STEPS:
        return None
    med = median(late, dim=1).unsqueeze(1)
    spread = median((late - med).abs(), dim=1)
    lower = spread[late.mean(dim=1).argsort()[: max(late.shape[0] // 2, 1)]]
    return float(median(lower.sort().values, dim=0))


def median(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The median along `dim`, the two middle values averaged for an even count as
    `statistics.median` does (torch.median takes the lower one; torch.quantile refuses more than
    2^24 values)."""
    ordered = x.sort(dim=dim).values
    n = x.shape[dim]
    upper = ordered.narrow(dim, n // 2, 1).squeeze(dim)
    return upper if n % 2 else (ordered.narrow(dim, n // 2 - 1, 1).squeeze(dim) + upper) / 2


def _slowest_phase(
    rank: int, work: torch.Tensor, names: tuple[str, ...], groups: list[int]
) -> tuple[str | None, float | None]:
    """Of `work` ([ranks, steps, names]), the name where `rank` spends most over its peers'
    median: the other ranks of its place in the pipeline (`stages`), every other rank where it
    is alone there."""
    peers = [r for r, g in enumerate(groups) if g == groups[rank] and r != rank]
    if not peers:
        peers = [r for r in range(len(groups)) if r != rank]
    others = work[peers]  # [peers, steps, names]
    excess = (work[rank] - median(others, dim=0)).mean(dim=0).tolist()
    best = max(range(len(names)), key=lambda i: (excess[i], -i))
    if excess[best] <= 0:
        return None, None
    return names[best], excess[best]
