"""Stragglers: which ranks make the others wait, how often, in which phase. Pure functions.

Reads the matched collectives' waits (`waits.py`) on aligned clocks.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness.sourced import threshold
from harness.traces.align.clocks import ClockOffset, mad
from harness.traces.align.waits import InstanceWaits
from harness.traces.analyse.gpu_health import GpuFinding
from harness.traces.analyse.noise import NoiseModel, noise_model
from harness.traces.analyse.rank_list import groups_text
from harness.traces.analyse.replay import Replay
from harness.traces.analyse.runq import RunQueueLog, core_waits_of
from harness.traces.model import RankTrace
from harness.traces.read.runup import HANDOVER_US, NO_PHASE, PHASE_PREFIX

# A straggler is "persistent" when it is over the bound in at least this share of the analysed
# steps (two in three: a majority that survives one noisy step in three), else "intermittent".
PERSISTENT_SHARE = 2 / 3
# waits_for looks at most this many candidate causes per rank (the costliest), which keeps the
# pairwise attribution O(ranks x candidates) per collective on 1000-rank jobs.
MAX_CAUSES = 16


@dataclass(kw_only=True)
class Thresholds:
    """When a rank counts as a straggler: its lateness per step (how much later than the punctual
    ranks it arrives at collectives, see `punctual_arrival`) beyond its peers' own
    (`peer_baseline`) exceeds every bound below, on every device alike.
    There is no absolute floor unless asked for (--min-late-ms): short steps (inference, small
    models) are a few ms."""

    min_late_ms: float = threshold(
        0.0,
        kind="definition",
        source="no absolute floor unless asked for (--min-late-ms): short steps (inference, small models) are a few ms",
    )
    # ... share of the clean step (the punctual ranks' own work per step, see `analyze_stragglers`)
    rel_late: float = threshold(
        0.08,
        kind="definition",
        source="material is 10% of the clean step (bench/detect/score.py: what a straggler must cost to be worth "
        "naming); the bound sits a fifth below it so that a material straggler measured a little short (its "
        "lateness taken against the punctual quarter of the ranks, whose own arrivals jitter) is still named",
    )
    # ... this many times the collectives' end scatter on other clocks than the reference's
    # (clock noise; where the noise model has wake-up noise, on every rank) ...
    noise_factor: float = threshold(
        3.0, kind="statistic", source="three median absolute deviations of the collectives' end scatter"
    )
    # ... this many times the run's step-to-step jitter ...
    jitter_factor: float = threshold(
        3.0, kind="statistic", source="three median absolute deviations of the run's step-to-step jitter"
    )
    # ... and on 3+ ranks: this many MADs of the lower half of the ranks' lateness (the lower
    # half: up to half of the ranks can be stragglers and still stand out).
    mad_factor: float = threshold(
        3.0, kind="statistic", source="three median absolute deviations of the lower half of the ranks' lateness"
    )


@dataclass(kw_only=True)
class RankBlame:
    rank: int
    host: str
    late_ms: float  # mean per step of its arrivals' lateness after the punctual ranks
    # what the rule judges: its lateness per step beyond its peers' own (`analyze_stragglers`,
    # 4-5), its waits at point-to-point ops taken out
    beyond_peers_ms: float
    cost_ms: float  # mean per step of its share of the delay of the collectives' starts
    blame_ms: float  # total time the other ranks waited because of it (its share)
    wait_ms: float  # total time this rank waited for others
    late_fraction: float  # share of its collectives at which it was late beyond the noise
    steps_late: int  # steps whose excess exceeded the bound
    steps: int  # steps with matched collectives
    last_fraction: float  # share of steps in which it cost the most
    mean_step_ms: float | None  # mean ProfilerStep (or fallback step) duration
    # CPU-only traces with step logs: its main thread's wait for a core (runnable, another thread
    # on it) per step (runq.py): what the host's other work cost it, said beside its lateness (not
    # taken out of it); None without
    core_wait_ms: float | None = None
    # GPU runs with NVML readings in their step logs: its GPU's clock and throttling against its
    # peers' where it ran slower (gpu_health.gpu_findings); None otherwise
    gpu: GpuFinding | None = None
    waits_for: list[list] = field(default_factory=list)  # [[rank, ms per step]], most first
    pattern: str | None = None  # "persistent" or "intermittent" (stragglers only)
    phase: str | None = None
    phase_excess_ms: float | None = None
    whatif_step_ms: float | None = None
    straggler: bool = False
    # its blocking syncs, when they are what made it late (`late_syncs`): caller -> [syncs per
    # step, ms of device idle they cause per step]
    syncs: dict[str, list[float]] = field(default_factory=dict)

    @property
    def wait_per_step_ms(self) -> float:
        return self.wait_ms / self.steps if self.steps else 0.0


@dataclass(kw_only=True)
class StragglerResult:
    verdict: str  # "straggler", "balanced" or "inconclusive"
    ranks: list[RankBlame]
    reason: str | None = None  # why inconclusive
    step_wait: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> own wait_us
    step_blame: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> others' wait on it, us
    step_cost: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> delay share, us
    step_late: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> lateness, us
    step_last: dict[int, int] = field(default_factory=dict)  # step -> rank that cost the most
    threshold_ms: float = 0.0
    bounds_ms: dict[str, float] = field(default_factory=dict)  # each bound that made the threshold
    waits: list[InstanceWaits] = field(default_factory=list)
    replayed_step_ms: float | None = None  # the replay with nothing changed (the model's fidelity)
    measured_step_ms: float | None = None  # what that reproduces, measured (replay.Replay.measured_ms)
    # whether the two agree within replay.REPLAY_FIDELITY: where not, the what-ifs are shares only
    replay_faithful: bool = False
    whatif_all_fixed_step_ms: float | None = None
    notes: list[str] = field(default_factory=list)  # what the bounds could not be estimated from
    clean_step_ms: float = 0.0  # the punctual ranks' own work per step (what the relative bound is a share of)
    jitter_measured: bool = True  # False: too few steps for the run's jitter (the jitter bound is then 0)
    noise: str = ""  # the noise model's name (noise.NoiseModel.name)

    @property
    def stragglers(self) -> list[RankBlame]:
        """The flagged ranks, latest first by what the rule judged (`beyond_peers_ms`): a rank held
        at point-to-point ops by another arrives late by that hold (`late_ms`), which is not its own."""
        return sorted((r for r in self.ranks if r.straggler), key=lambda r: (-r.beyond_peers_ms, r.rank))


NOISE_BOUNDS = ("min_late", "clock_noise", "jitter", "late_jitter")
# The phase of a straggler slow in time its ranges do not cover (a loop that marks some phases only).
OUTSIDE_RANGES = NO_PHASE  # the bounds that are about noise, not about the ranks


# The fewest full steps a rank's step-to-step jitter is estimated from: the median absolute
# deviation of two values is half their difference, so one odd step (a stub, a one-off stall)
# sets the bound by itself; from three on, the median of the deviations ignores one.
MIN_JITTER_STEPS = 3


def common_part_ms(step_ms_by_rank: list[list[float]]) -> list[float] | None:
    """Each step's part that every rank shares: the median over the ranks of their own work in
    that step; None where the ranks do not hold the same number of steps (nothing pairs them) or
    there are fewer than two ranks."""
    if len(step_ms_by_rank) < 2 or len({len(steps) for steps in step_ms_by_rank}) != 1:
        return None
    return [statistics.median(column) for column in zip(*step_ms_by_rank)]


def common_stalls(
    step_ms_by_rank: list[list[float]], numbers: list[int], factor: float, material_ms: float
) -> list[str]:
    """The steps every rank was slow in together, each said in a line (a finding, not noise):
    1. each step's common part (`common_part_ms`: the median over the ranks of their own work);
    2. a step is a common stall where its common part exceeds the median step's by more than
       `factor` median absolute deviations of the common parts (the jitter bound's statistic,
       over the steps instead of the ranks) and by `material_ms` (the straggler rule's material
       share of the clean step: what is worth naming);
    3. none with fewer than MIN_JITTER_STEPS steps, where the median does not stand for a
       typical step."""
    common = common_part_ms(step_ms_by_rank)
    if common is None or len(common) < MIN_JITTER_STEPS or len(numbers) != len(common):
        return []
    typical = statistics.median(common)
    bound = max(factor * mad(common), material_ms)
    return [
        f"step {n} was {c - typical:.2f} ms longer than the median step on every rank alike: a stall "
        "they all shared (a checkpoint, a garbage collection, the file system or the network), which "
        "makes no rank late against another and is left out of the straggler rule's noise"
        for n, c in zip(numbers, common)
        if c - typical > bound
    ]


def run_jitter_ms(step_ms_by_rank: list[list[float]]) -> float:
    """The run's step-to-step jitter, of each rank against its peers:
    1. per step, the part every rank shares (`common_part_ms`) is taken out of each rank's own
       work per step (its step less its waiting for others), where the ranks hold the same steps;
    2. per rank with MIN_JITTER_STEPS+ steps, the median absolute deviation of what is left, or
       of its own work as it is where that is smaller: with few ranks the per-step median holds
       the other ranks' own swings too (on two ranks it is their mean, and a straggler's swing
       would land half on its peer), and taking it out must not add swing a rank did not have;
    3. the median of the lower half of those (at least one): up to half of the ranks can be
       intermittent stragglers, whose own work swings by their delay, and still stand out;
    4. 0 (not estimated) when no rank has that many steps.
    Against its peers, because who is late is a question about ranks relative to each other: a
    stall every rank shares in one step (a checkpoint, a collection, a file system's hiccup)
    moves no rank ahead of another, and would otherwise widen the bound by its own length (a
    4-rank job with one step 230 ms longer on every rank had a bound of half its step);
    step to step on one rank, because the ranks' differences in one step are what waiting
    makes, not noise; without the waiting, because an intermittent straggler lengthens every
    rank's step on the steps it is slow; and over the lower half, because its own swing is its
    signal, not the run's noise (with either in, a rank slow every other step set its own bound:
    half its steps long, half short, a MAD of half its delay, which three MADs exceed)."""
    common = common_part_ms(step_ms_by_rank)
    jitter = sorted(
        min(mad(steps), mad([v - c for v, c in zip(steps, common)])) if common is not None else mad(steps)
        for steps in step_ms_by_rank
        if len(steps) >= MIN_JITTER_STEPS
    )
    return statistics.median(jitter[: max(len(jitter) // 2, 1)]) if jitter else 0.0


def peer_baseline(late_ms: list[float]) -> float:
    """The lateness a rank's peers show without straggling: the median of the lower half of the
    ranks' lateness (at least one value). Time-slicing and clock noise make every rank late at
    some collectives; a straggler is late beyond that. The lower half, because up to half of
    the ranks can be stragglers and still stand out; on 2 ranks, the punctual one's."""
    values = sorted(late_ms)
    return statistics.median(values[: max(len(values) // 2, 1)]) if values else 0.0


def late_jitter_ms(late_by_step_ms: Mapping[int, list[float]]) -> float | None:
    """How much the peers' lateness swings from step to step:
    1. per rank with MIN_JITTER_STEPS+ steps, the median absolute deviation of its lateness per
       step;
    2. the median of those of the lower half of the ranks by mean lateness (at least one): the
       ranks `peer_baseline` takes, whose lateness is what the ranks show without straggling (a
       straggler's own swing is its signal, and an intermittent one's victims arrive first on
       the steps it is late);
    3. None (not estimated) when no rank has that many steps.
    The run's jitter (`run_jitter_ms`) measures the ranks' own work; this measures their
    arrivals, which swing more where ranks time-share cores: a rank held up for a few steps
    (on 2 shared cores, bursts of 150-300 ms in a 460 ms step, its own work hardly moved)."""
    timed = sorted((statistics.mean(v), mad(v)) for v in late_by_step_ms.values() if len(v) >= MIN_JITTER_STEPS)
    if not timed:
        return None
    return statistics.median(m for _, m in timed[: max(len(timed) // 2, 1)])


def straggler_bounds(
    late_ms: dict[int, float],
    *,
    median_step_ms: float,
    clock_noise_ms: float,
    jitter_ms: float | None,
    th: Thresholds,
    late_jitter_ms: float | None = None,
) -> dict[str, float]:
    """The straggler rule: the bounds a rank's lateness per step beyond its peers' (`late_ms` less
    `peer_baseline` of them) must all exceed (a straggler's excess > max of them). Shared by the
    collector (lateness at collectives, from traces) and the live watch
    (harness/watch/rule.py: lateness of the work between collectives, from the step
    timings).

    1. min_late = --min-late-ms (no absolute floor by default);
    2. clock_noise = noise_factor x the clocks' noise (0 where no clocks are compared);
    3. jitter = jitter_factor x the run's step-to-step jitter (`run_jitter_ms`; 0 where None:
       too few steps to measure it, which the report says); late_jitter = jitter_factor x the
       peers' lateness jitter (`late_jitter_ms`, 0 where not estimated);
    4. relative = rel_late x `median_step_ms`: the collector gives the clean step, the punctual
       ranks' own work per step
       (`analyze_stragglers`), the watch the median rank's mean step;
    5. on 3+ ranks, outlier = mad_factor x the median absolute deviation of the lower half of the
       ranks' late_ms (the half `peer_baseline` is the median of): how far apart the peers are.
    """
    bounds = {
        "min_late": th.min_late_ms,
        "clock_noise": th.noise_factor * clock_noise_ms,
        "jitter": th.jitter_factor * (jitter_ms or 0.0),
        "late_jitter": th.jitter_factor * (late_jitter_ms or 0.0),
        "relative": th.rel_late * median_step_ms,
    }
    if len(late_ms) >= 3:
        values = sorted(late_ms.values())
        bounds["outlier"] = th.mad_factor * mad(values[: max(len(values) // 2, 1)])
    return bounds


def _judged_arrival(run_up_start_us: float | None, arrival_us: float, p2p_wait_us: float = 0.0) -> float:
    """When a rank would have arrived without waiting at point-to-point ops: its run-up (since
    `run_up_start_us`, when its previous collective ended) less `p2p_wait_us` (runup.p2p_wait: a
    pipeline stage waiting for its neighbour's activations or gradients waits for that
    neighbour, which is where a delay is the neighbour's own); as it arrived where the run-up is
    not known. A rank's wait for a core is not taken out: a rank held off its cores by other work
    is late, and its wait is reported beside its lateness (`core_wait_ms`)."""
    if run_up_start_us is None or not p2p_wait_us:
        return arrival_us
    return arrival_us - p2p_wait_us


def punctual_arrival(arrival_us: Mapping[int, float]) -> float:
    """When the punctual ranks arrived at one collective: the lower-quartile arrival (the
    earliest of 2-4 ranks, the 2nd of 5-8, ...). Up to three quarters of the ranks can be late
    and still be measured against the punctual ones, and one early outlier does not set the
    mark on a large job."""
    order = sorted(arrival_us.values())
    return order[punctual_index(len(order))]


def punctual_index(n: int) -> int:
    """Where the punctual ranks' mark lies among `n` sorted values: the lower quartile."""
    return (n - 1) // 4


# The start of the inconclusive reason for collectives without groups in a job of several (it says
# what to do itself: the report adds no generic advice to it).
UNNAMED_GROUPS_REASON = "the traces do not say which process group each collective ran on"


def inconclusive_reason(traces: list[RankTrace], waits: list[InstanceWaits]) -> str | None:
    """Why no straggler analysis can be trusted, or None: one rank only; no step to analyse;
    collectives that carry no group in a job of several groups (`RankTrace.unnamed_groups`); no
    collective matched across ranks (or none inside the analysed steps)."""
    if len(traces) < 2:
        return "one rank only: there is no peer to compare it with"
    if not any(t.steps for t in traces):
        return "no step to analyse"
    unnamed = next((t for t in traces if t.unnamed_groups), None)
    if unnamed is not None:
        return (
            f"{UNNAMED_GROUPS_REASON} (gloo's do not), and rank "
            f"{unnamed.rank} is in groups of fewer ranks than the world ({groups_text(unnamed.unnamed_groups)}): "
            "collectives cannot be matched across ranks; turn the Flight Recorder on in the job "
            "(harness.enable_flight_recorder() before init_process_group), whose entries the harness writes "
            "beside each trace window to name the groups (the warnings say why a window's could not), "
            "or profile on GPUs with NCCL, whose kernels name theirs"
        )
    if not waits:
        return "no collective matched across ranks: nothing says who waited for whom"
    if not any(w.step is not None for w in waits) and any(t.steps_source == "ProfilerStep" for t in traces):
        return "no matched collective lies inside the analysed steps"
    return None


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of intervals (start, end)."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _clusters(members: list[int], waits: list[InstanceWaits]) -> list[list[int]]:
    """The instances `members` (indexes into `waits`) in groups in flight at the same time: by
    first arrival, an instance joins the group before it when it starts before the latest end
    seen in that group (chained)."""
    order = sorted(members, key=lambda k: min(waits[k].arrival_us.values()))
    groups: list[list[int]] = []
    reach = -math.inf
    for k in order:
        w = waits[k]
        if groups and min(w.arrival_us.values()) < reach:
            groups[-1].append(k)
        else:
            groups.append([k])
            reach = -math.inf
        reach = max(reach, max(w.end_us.values()))
    return groups


@dataclass
class Tallies:
    """Per step and rank, what a rank's collectives in that step add up to, each stretch of
    time counted once (`tally_once`); and per clustered instance the factor its waits are
    scaled by (`wait_factor`)."""

    late: dict[int, dict[int, float]]
    wait: dict[int, dict[int, float]]
    cost: dict[int, dict[int, float]]
    blame: dict[int, dict[int, float]]
    wait_factor: dict[int, dict[int, float]]  # instance index -> rank -> union / sum of its waits


def tally_once(
    waits: list[InstanceWaits],
    lateness: list[dict[int, float]],
    steps: list[int],
    step_us: dict[tuple[int, int], float],
    arrivals: Sequence[Mapping[int, float]] | None = None,
) -> Tallies:
    """A rank's lateness, waiting and shares per step, counting each stretch of time once.

    DDP with several gradient buckets (and any overlapping collectives) has several
    collectives in flight at once: one late arrival delays all of them, and summing its
    lateness over them counts the same milliseconds once per collective.
    1. per step, the instances in flight at the same time are grouped (`_clusters`); a group
       of one adds its figures as they are;
    2. in a larger group, per rank: late = |union of [own arrival - its lateness, own arrival]|
       over the instances where it is late (its lateness reaches back to the punctual arrival,
       or to where its run-up would have ended at the punctual ranks' pace: `fresh_lateness`);
       wait = |union of [own arrival, last arrival]|; its delay and blame shares (each a
       weight over [first arrival, own arrival], waits.attribute) are summed and scaled by
       |union of those stretches| / their summed length (exact where the instances' arrivals
       coincide, as buckets of one backward pass do);
    3. late, wait and cost are each at most the rank's step (`step_us`: its span on the
       device's timeline, where the step is one of its own); blame is the others' waiting, not
       capped.
    `steps[k]` is instance k's step key (an instance outside any step: a key of its own),
    `lateness[k]` each rank's lateness at it, measured from `arrivals[k]` (default: the
    arrivals as they happened, `waits[k].arrival_us`)."""
    members: dict[int, list[int]] = defaultdict(list)
    for k, s in enumerate(steps):
        members[s].append(k)
    late: dict[int, dict[int, float]] = {}
    wait: dict[int, dict[int, float]] = {}
    cost: dict[int, dict[int, float]] = {}
    blame: dict[int, dict[int, float]] = {}
    factors: dict[int, dict[int, float]] = {}
    for s, ks in members.items():
        L, W, C, B = (
            late.setdefault(s, defaultdict(float)),
            wait.setdefault(s, defaultdict(float)),
            cost.setdefault(s, defaultdict(float)),
            blame.setdefault(s, defaultdict(float)),
        )
        for group in _clusters(ks, waits) if len(ks) > 1 else [ks]:
            if len(group) == 1:
                w, lt = waits[group[0]], lateness[group[0]]
                for r in w.arrival_us:
                    L[r] += lt[r]
                    W[r] += w.wait_us[r]
                    C[r] += w.delay_us[r]
                    B[r] += w.blame_us[r]
                continue
            pieces: dict[int, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
            sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
            for k in group:
                w, lt = waits[k], lateness[k]
                judged = w.arrival_us if arrivals is None else arrivals[k]
                first, last = min(w.arrival_us.values()), w.last_arrival_us
                for r, a in w.arrival_us.items():
                    late_p, wait_p, share_p = pieces[r]
                    if lt[r] > 0:
                        late_p.append((judged[r] - lt[r], judged[r]))
                    wait_p.append((a, last))
                    share_p.append((first, a))
                    acc = sums[r]
                    acc[0] += a - first
                    acc[1] += w.delay_us[r]
                    acc[2] += w.blame_us[r]
                    acc[3] += w.wait_us[r]
            for r, (late_p, wait_p, share_p) in pieces.items():
                spread, delay, blamed, waited = sums[r]
                scale = union_length(share_p) / spread if spread > 0 else 1.0
                once_wait = union_length(wait_p)
                L[r] += union_length(late_p)
                W[r] += once_wait
                C[r] += delay * scale
                B[r] += blamed * scale
                factor = once_wait / waited if waited > 0 else 1.0
                for k in group:
                    factors.setdefault(k, {})[r] = factor
    for table in (late, wait, cost):  # blame is the others' waiting: many ranks can wait a step each
        for s, per_rank in table.items():
            for r, v in per_rank.items():
                cap = step_us.get((r, s))
                if cap is not None and v > cap:
                    per_rank[r] = cap
    return Tallies(late=late, wait=wait, cost=cost, blame=blame, wait_factor=factors)


def last_syncs(waits: list[InstanceWaits]) -> list[dict[int, int] | None]:
    """Per instance, where each of its ranks was last released, or None where they left together:
    each rank's latest instance that ended (on its clock) by its arrival here (within
    HANDOVER_US); None when every
    rank has one and it is the same, or each is of this instance's process group (the ranks
    left that group's previous collective together), or some rank has none (its first), else
    {rank: that instance}.

    A process group's ranks leave each of its collectives together, so their lateness at the
    next one is what each did since. Where ranks come from different groups' collectives
    (tensor parallelism inside a host and data parallelism across hosts, HSDP's shard and
    replicate groups) each left its own at its own time: a rank held at its tensor-parallel
    all-reduce by a slow peer reaches the data-parallel all-reduce late by that hold, which is
    the peer's lateness, not its own (`fresh_lateness`)."""
    ends: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for k, w in enumerate(waits):
        for r, e in w.end_us.items():
            ends[r].append((e, k))
    for v in ends.values():
        v.sort()
    times = {r: [e for e, _ in v] for r, v in ends.items()}
    out: list[dict[int, int] | None] = []
    for w in waits:
        pg = w.instance.pg
        last: dict[int, int] = {}
        other_group = False
        for r, a in w.arrival_us.items():
            i = bisect.bisect_right(times[r], a + HANDOVER_US)
            if i:
                last[r] = j = ends[r][i - 1][1]
                other_group = other_group or waits[j].instance.pg != pg
        apart = other_group and len(last) == len(w.arrival_us) and len(set(last.values())) > 1
        out.append(last if apart else None)
    return out


def fresh_lateness(
    arrival_us: Mapping[int, float], since: Mapping[int, int] | None, waits: list[InstanceWaits]
) -> dict[int, float]:
    """Each rank's lateness at one collective from its arrival (`arrival_us`, as it happened or
    judged without its waits at point-to-point ops):
    1. ranks that left their last collective together (`since` None, `last_syncs`): its arrival
       - the punctual ranks' (`punctual_arrival`), at least 0;
    2. else its run-up, from the end of its last collective (`since[r]`, on its own clock) to its
       arrival here, less the punctual ranks' run-up (the lower quartile of the run-ups), at
       least 0: what it did since it was last released, beyond what the punctual ranks did. A
       rank whose arrival waits for that end (an all-reduce whose input the one before it
       produced) has a run-up of the hand-over alone whatever it was held there; the one that
       held it was late at that collective and is counted there."""
    if since is None:
        mark = punctual_arrival(arrival_us)
        return {r: max(a - mark, 0.0) for r, a in arrival_us.items()}
    run_up = {r: a - waits[since[r]].end_us[r] for r, a in arrival_us.items()}
    mark = punctual_arrival(run_up)
    return {r: max(u - mark, 0.0) for r, u in run_up.items()}


def analyze_stragglers(  # noqa: C901
    traces: list[RankTrace],
    waits: list[InstanceWaits],
    offsets: dict[int, ClockOffset],
    step_span_ms: Mapping[int, list[float]],
    th: Thresholds | None = None,
    runq: Mapping[int, RunQueueLog] | None = None,
    step_bounds_us: Mapping[int, Mapping[int, tuple[float, float]]] | None = None,
    noise: NoiseModel | None = None,
) -> StragglerResult:
    """Who everybody waits for, on aligned clocks (`traces` already shifted by `offsets`).

    1. per collective (waits.py): each rank's wait, and its share of the delay of the start
       (`delay`) and of the others' waiting (`blame`);
    2. per collective and rank: lateness = its arrival - the punctual ranks' (`punctual_arrival`),
       at least 0, or where its ranks come from different process groups' collectives, its
       run-up since the last less theirs (`last_syncs`, `fresh_lateness`); judged lateness the
       same over its arrival without its waiting at point-to-point ops
       (`_judged_arrival`; the run-up: since its previous collective ended, runup.py);
    3. per step and rank: late = its lateness; cost = its delay shares (how much later the
       collectives started because of it: what fixing it alone buys is less when another rank
       is as late), wait and blame likewise, each stretch of time counted once where
       collectives are in flight together (`tally_once`), at most the step; judged late the
       same over the judged lateness; the step's costliest rank;
    4. per rank: late_ms, cost_ms and judged = means over the steps with matched collectives
       (an instance without a step counts as one more step of its own);
    5. beyond_peers_ms = judged - `peer_baseline` of the ranks' judged: what it is late beyond the
       lateness its peers show without straggling (on a host whose cores the ranks time-share,
       every rank is late at some collectives: a 4-rank comm run on 2 cores had each rank 28-37%
       of the clean step behind the earliest);
    6. the bounds (`straggler_bounds`), with the clocks' noise = the median end scatter of
       matched collectives over the ranks on another clock than the reference rank's (0 where
       every rank reads one clock: nothing to be off), over every rank but the reference where
       the noise model has wake-up noise (noise.py: a rank's wake-up delay after a collective,
       which its next arrival carries), the peers' lateness jitter over the judged lateness of
       each step (`late_jitter_ms`), and over each rank's own work per step (its step span on
       its device's timeline, `step_span_ms`, less its waiting for later peers)
       the run's jitter (`run_jitter_ms`) and the clean step the relative bound is a share of:
       the punctual ranks' (the lower quartile of the ranks' means, as `punctual_arrival` takes
       arrivals). A host that runs ahead of its GPU only launches in its ProfilerStep, and the
       lateness at collectives is in the device's time; a straggler lengthens every rank's step
       by what it costs, so a bound over the whole step grew with the very lateness it judges (a
       straggler costing c of the clean step is late by c / (1 + c) of the step it makes);
    7. a straggler's beyond_peers_ms exceeds the bound, in at least the noise model's
       min_late_steps of its steps too (all of them in a shorter window: noise.py); any number
       of ranks can be stragglers;
    8. late_fraction = share of its collectives where its lateness exceeds noise_factor x the
       clock noise (any lateness on exact clocks); steps_late = steps whose judged lateness
       beyond that step's `peer_baseline` exceeds the bound; pattern = persistent when
       steps_late >= 2/3 of the steps, else intermittent;
    9. waits_for (every rank): the stragglers whose share of its waiting (waits.InstanceWaits
       .waited_on_us, scaled like its waiting in step 3), per step, exceeds the noise (the bound
       of 6 without its relative and outlier parts), most first: the ranks it waited on beyond
       the noise;
    10. the phase (`_slow_phases`) and the what-if (`replay.py`) of each straggler.
    Verdict: inconclusive (with a reason) when nothing can be analysed, else straggler or
    balanced. `noise` defaults to the model of the traces' devices (`noise.noise_model`).
    """
    th = th or Thresholds()
    by_rank = {t.rank: t for t in traces}
    ranks = sorted(by_rank)
    reason = inconclusive_reason(traces, waits)
    noise = noise or noise_model(t.device for t in traces)
    judged_apart = any(op.p2p_wait_us for w in waits for op in w.instance.ops.values())
    lateness: list[dict[int, float]] = []
    judged_arrivals: list[dict[int, float]] = []
    judged_lateness: list[dict[int, float]] = []
    step_keys: list[int] = []
    taken_part: dict[int, int] = defaultdict(int)
    orphan = -1  # instances outside any step count as steps of their own, numbered below 0
    for w, since in zip(waits, last_syncs(waits)):
        step = w.step
        if step is None:
            step, orphan = orphan, orphan - 1
        step_keys.append(step)
        lateness.append(fresh_lateness(w.arrival_us, since, waits))
        if judged_apart:
            judged = {
                r: _judged_arrival(w.instance.ops[r].run_up_start_us, a, w.instance.ops[r].p2p_wait_us)
                for r, a in w.arrival_us.items()
            }
            judged_arrivals.append(judged)
            judged_lateness.append(fresh_lateness(judged, since, waits))
        for r in w.arrival_us:
            taken_part[r] += 1
    step_us = {(r, s.number): ms * 1e3 for r in ranks for s, ms in zip(by_rank[r].steps, step_span_ms[r])}
    tallies = tally_once(waits, lateness, step_keys, step_us)
    step_late, step_wait, step_cost, step_blame = tallies.late, tallies.wait, tallies.cost, tallies.blame
    step_judged = (
        tally_once(waits, judged_lateness, step_keys, step_us, judged_arrivals).late if judged_apart else step_late
    )
    wait_total: dict[int, float] = defaultdict(float)
    blame_total: dict[int, float] = defaultdict(float)
    for s in step_wait:
        for r, v in step_wait[s].items():
            wait_total[r] += v
        for r, v in step_blame[s].items():
            blame_total[r] += v
    n_steps = len(step_cost)
    step_last = {s: max(sorted(c), key=c.__getitem__) for s, c in step_cost.items() if c and max(c.values()) > 0}
    mean_step_ms = {
        r: statistics.mean([s.dur_us for s in by_rank[r].steps]) / 1e3 if by_rank[r].steps else None for r in ranks
    }
    core_wait_ms = core_waits_of(traces, runq) or {}  # each CPU rank's wait for a core: reported, not taken out
    # each rank's own work per step: its step less its waiting for later peers (at collectives,
    # and at point-to-point ops in the collectives' run-ups); a wait for a core stays in it, as
    # the run's noise the jitter bound measures
    p2p_ms: dict[tuple[int, int | None], float] = defaultdict(float)
    for t in traces:
        for c in t.comms:
            if c.p2p_wait_us:
                p2p_ms[(t.rank, c.step)] += c.p2p_wait_us / 1e3
    own_ms = {
        r: [
            ms - step_wait.get(st.number, {}).get(r, 0.0) / 1e3 - p2p_ms.get((r, st.number), 0.0)
            for st, ms in zip(by_rank[r].steps, step_span_ms[r])
        ]
        for r in ranks
    }
    timed = sorted(statistics.mean(v) for v in own_ms.values() if v)
    clean_step_ms = timed[punctual_index(len(timed))] if timed else 0.0
    most = max((len(t.steps) for t in traces), default=0)
    # Clock noise is the error of comparing two clocks: it counts for ranks on another clock than
    # the reference rank's, and for every rank where the noise model has wake-up noise (noise.py)
    ref_clock = offsets[min(ranks)].clock if min(ranks) in offsets else None
    spreads = [
        o.spread_us
        for r, o in offsets.items()
        if o.samples and r != min(ranks) and (noise.wakeup_noise or o.clock != ref_clock)
    ]
    noise_us = statistics.median(spreads) if spreads else 0.0

    def per_step_mean(table: dict[int, dict[int, float]], r: int) -> float:
        return sum(c.get(r, 0.0) for c in table.values()) / 1e3 / n_steps if n_steps else 0.0

    cost_ms = {r: per_step_mean(step_cost, r) for r in ranks}
    late_ms = {r: per_step_mean(step_late, r) for r in ranks}
    judged_ms = {r: per_step_mean(step_judged, r) for r in ranks}
    baseline_ms = peer_baseline(list(judged_ms.values()))
    beyond_peers_ms = {r: judged_ms[r] - baseline_ms for r in ranks}
    jitter_measured = most >= MIN_JITTER_STEPS
    bounds = straggler_bounds(
        judged_ms,
        median_step_ms=clean_step_ms,
        clock_noise_ms=noise_us / 1e3,
        jitter_ms=run_jitter_ms([own_ms[r] for r in ranks]) if jitter_measured else None,
        th=th,
        late_jitter_ms=late_jitter_ms(
            {r: [c.get(r, 0.0) / 1e3 for s, c in step_judged.items() if s >= 0] for r in ranks}
        ),
    )
    notes = []
    if reason is None and not jitter_measured:
        notes.append(
            f"step-to-step jitter not estimated: {most} full step(s) per rank, {MIN_JITTER_STEPS} needed; "
            f"a straggler is late beyond its peers by more than {th.rel_late:.0%} of the clean step and "
            f"{th.noise_factor:g}x the clocks' noise, which do not hold the run's own noise (profile more steps)"
        )
    if reason is None:
        notes.extend(
            common_stalls(
                [own_ms[r] for r in ranks],
                [s.number for s in by_rank[ranks[0]].steps],
                th.jitter_factor,
                th.rel_late * clean_step_ms,
            )
        )
    noise_ms = max(bounds[k] for k in NOISE_BOUNDS)
    threshold = max(bounds.values())
    late_floor_us = th.noise_factor * noise_us
    late_at: dict[int, int] = defaultdict(int)
    for per_rank in lateness:
        for r, d in per_rank.items():
            if d > late_floor_us:
                late_at[r] += 1
    step_baseline_us = {s: peer_baseline([c.get(r, 0.0) for r in ranks]) for s, c in step_judged.items()}
    steps_late = {
        r: sum(1 for s, c in step_judged.items() if (c.get(r, 0.0) - step_baseline_us[s]) / 1e3 > threshold)
        for r in ranks
    }
    flagged = [
        r
        for r in ranks
        if reason is None and beyond_peers_ms[r] > threshold and steps_late[r] >= min(noise.min_late_steps, n_steps)
    ]
    causes = sorted(flagged, key=lambda r: -cost_ms[r])[:MAX_CAUSES]
    owed: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for k, w in enumerate(waits):
        scale = tallies.wait_factor.get(k, {})
        for j in causes:
            if j in w.delay_us:
                for i in w.arrival_us:
                    if i != j:
                        owed[i][j] += w.waited_on_us(i, j) * scale.get(i, 1.0)
    result = []
    phases = _slow_phases(flagged, waits, lateness, late_floor_us, by_rank, n_steps)
    sync_costs = SyncCosts(by_rank) if flagged else None
    for r in ranks:
        is_straggler = r in flagged
        waits_for = sorted(
            ([j, round(v / 1e3 / n_steps, 4)] for j, v in owed[r].items() if n_steps and v / 1e3 / n_steps > noise_ms),
            key=lambda x: (-x[1], x[0]),
        )
        rb = RankBlame(
            rank=r,
            host=by_rank[r].host,
            late_ms=late_ms[r],
            beyond_peers_ms=beyond_peers_ms[r],
            cost_ms=cost_ms[r],
            blame_ms=blame_total[r] / 1e3,
            wait_ms=wait_total[r] / 1e3,
            late_fraction=late_at[r] / taken_part[r] if taken_part[r] else 0.0,
            steps_late=steps_late[r],
            steps=n_steps,
            last_fraction=sum(1 for s in step_last.values() if s == r) / n_steps if n_steps else 0.0,
            mean_step_ms=mean_step_ms[r],
            core_wait_ms=statistics.mean(core_wait_ms[r]) if core_wait_ms.get(r) else None,
            waits_for=[] if reason else waits_for,
            straggler=is_straggler,
        )
        if is_straggler:
            rb.pattern = "persistent" if steps_late[r] >= math.ceil(PERSISTENT_SHARE * n_steps) else "intermittent"
            rb.phase, rb.phase_excess_ms = phases[r]
            assert sync_costs is not None  # made whenever a rank is flagged
            rb.syncs = sync_costs.late_syncs(r, beyond_peers_ms[r])
        result.append(rb)
    replay = Replay(traces, waits, step_bounds_us)
    replayed = replay.step_ms(set())
    for rb in result:
        if rb.straggler:
            rb.whatif_step_ms = replay.step_ms({rb.rank})
    verdict = "inconclusive" if reason else ("straggler" if flagged else "balanced")
    return StragglerResult(
        verdict=verdict,
        reason=reason,
        ranks=result,
        step_wait={s: dict(v) for s, v in step_wait.items()},
        step_blame={s: dict(v) for s, v in step_blame.items()},
        step_cost={s: dict(v) for s, v in step_cost.items()},
        step_late={s: dict(v) for s, v in step_late.items()},
        step_last=step_last,
        threshold_ms=threshold,
        bounds_ms=bounds,
        noise=noise.name,
        waits=waits,
        replayed_step_ms=replayed,
        measured_step_ms=replay.measured_ms,
        replay_faithful=replay.faithful(),
        whatif_all_fixed_step_ms=replay.step_ms(set(flagged)) if flagged else None,
        notes=notes,
        clean_step_ms=clean_step_ms,
        jitter_measured=jitter_measured,
    )


# A straggler's syncs are named as its cause when the device idle they cause exceeds its peers'
# by at least this share of its lateness: then they are most of why it is late, not one part
# beside a phase's work. Of them, the callers that make up at least SYNC_CALLER_SHARE of that
# excess are named (the one or two that matter, not every sync the rank makes).
SYNC_CAUSE_SHARE = 0.5
SYNC_CALLER_SHARE = 0.1


def sync_cost_ms(trace: RankTrace) -> tuple[float, dict[str, list[float]]]:
    """A rank's syncs per step: the device idle they cause (ms, host_ops.sync_costs), and by caller
    [syncs, ms of device idle], means over its steps."""
    n = max(len(trace.steps), 1)
    by: dict[str, list[float]] = {}
    for s in trace.steps:
        for k, c in s.syncs_by_caller.items():
            acc = by.setdefault(k, [0.0, 0.0])
            acc[0] += c / n
            acc[1] += s.sync_cost_us_by_caller.get(k, 0.0) / n / 1e3
    return sum(s.sync_cost_us for s in trace.steps) / n / 1e3, by


class SyncCosts:
    """Every rank's `sync_cost_ms`, read once, and per caller the sorted costs over all ranks
    (the peers' medians of `late_syncs` leave one rank out of them)."""

    def __init__(self, by_rank: dict[int, RankTrace]) -> None:
        self.of = {r: sync_cost_ms(t) for r, t in by_rank.items()}
        self.totals = sorted(total for total, _ in self.of.values())
        callers = {k for _, by in self.of.values() for k in by}
        self.by_caller = {k: sorted(by.get(k, [0.0, 0.0])[1] for _, by in self.of.values()) for k in callers}

    def late_syncs(self, rank: int, late_ms: float) -> dict[str, list[float]]:
        """The straggler's syncs by caller, costliest first, when their device idle per step
        exceeds the median of the other ranks' by SYNC_CAUSE_SHARE of its lateness; of them, the
        callers that make up at least SYNC_CALLER_SHARE of that excess (beyond the peers' median
        for each);
        else {}."""
        own, by = self.of[rank]
        if late_ms <= 0 or len(self.of) < 2:
            return {}
        excess = own - _median_without(self.totals, own)
        if excess < SYNC_CAUSE_SHARE * late_ms:
            return {}
        return {
            k: [round(c, 2), round(ms, 3)]
            for k, (c, ms) in sorted(by.items(), key=lambda kv: -kv[1][1])
            if ms - _median_without(self.by_caller[k], ms) >= SYNC_CALLER_SHARE * excess
        }


class _PhaseSpans:
    """A rank's phase spans (phase, start_us, end_us) by start; `overlap` reads only those from
    the first that ends after lo (a rank's phases are top-level ranges: they do not overlap, so
    their ends are in order too) to the first that starts at or after hi."""

    def __init__(self, spans: list[tuple[str, float, float]]) -> None:
        self.spans = sorted(spans, key=lambda sp: sp[1])
        self.reach = list(itertools.accumulate((b for _, _, b in self.spans), max))

    def overlap(self, lo: float, hi: float) -> dict[str, float]:
        """The time each phase overlaps [lo, hi]."""
        out: dict[str, float] = defaultdict(float)
        for k in range(bisect.bisect_right(self.reach, lo), len(self.spans)):
            name, a, b = self.spans[k]
            if a >= hi:
                break
            if b > lo:
                out[name] += min(b, hi) - max(a, lo)
        return out


def _run_ups_at(
    w: InstanceWaits, spans: dict[int, _PhaseSpans] | None
) -> tuple[dict[int, Mapping[str, float]], dict[str, list[float]]]:
    """Every rank's run-up time by name at one instance (by harness phase from `spans`, each
    rank's phase spans, else its run-up as parsed), and per name the sorted values over the
    instance's ranks (0.0 for a rank without that name)."""
    times: dict[int, Mapping[str, float]] = {}
    for r, op in w.instance.ops.items():
        by_launch = {k[len(PHASE_PREFIX) :]: v for k, v in op.run_up_us.items() if k.startswith(PHASE_PREFIX)}
        if spans is not None and by_launch:  # a GPU rank's: by the phase that launched the work (runup.py, 4)
            times[r] = by_launch
        elif spans is not None:
            lo = op.start_us if op.run_up_start_us is None else op.run_up_start_us
            by_phase = spans[r].overlap(lo, op.start_us)
            outside = (op.start_us - lo) - sum(by_phase.values())
            if outside > 0:  # its step's time in no range: a delay there is named, not pinned on a phase
                by_phase[OUTSIDE_RANGES] = outside
            times[r] = by_phase
        else:
            times[r] = {k: v for k, v in op.run_up_us.items() if not k.startswith(PHASE_PREFIX)}
    columns: dict[str, list[float]] = defaultdict(list)
    for t in times.values():
        for name, v in t.items():
            columns[name].append(v)
    for vals in columns.values():
        vals.extend([0.0] * (len(times) - len(vals)))
        vals.sort()
    return times, columns


def _median_without(values: list[float], v: float) -> float:
    """The median of sorted `values` with one occurrence of `v` (one of them) left out."""
    i = bisect.bisect_left(values, v)
    m = len(values) - 1
    if m <= 0:
        raise statistics.StatisticsError("no median for empty data")

    def get(k: int) -> float:
        return values[k] if k < i else values[k + 1]

    return get(m // 2) if m % 2 else (get(m // 2 - 1) + get(m // 2)) / 2


def _slow_phases(
    slow: list[int],
    waits: list[InstanceWaits],
    lateness: list[dict[int, float]],
    late_floor_us: float,
    by_rank: dict[int, RankTrace],
    n_steps: int,
) -> dict[int, tuple[str | None, float | None]]:
    """The phase each straggler in `slow` is slow in, from its run-up to the collectives it was
    late for (its lateness at them, `lateness`, above `late_floor_us`).

    After a collective every rank is in step, so at each such instance each rank's run-up is
    the stretch from the end of its previous collective to its arrival (own clock; the waiting
    comes after arrival and is excluded):
    1. per phase (phases.py: the loop's top-level ranges), the straggler's time inside its
       run-up minus the median of the other ranks' is its excess; the run-up's time in no
       range counts as one more phase (OUTSIDE_RANGES); on a GPU rank the run-up is the
       device's, so a phase's time in it is its launches' kernel time and the device idle
       while the host was in it (runup.set_run_ups, 4), not the host's ranges at those times;
    2. without harness ranges, the same comparison over device compute by kernel (or, on CPU,
       aten op) name, prefixed "op:", and over device idle time, named "idle (waiting on the
       host)": a rank whose device sat idle longer before arriving was held up on its host;
    3. the excesses summed over those instances (of several sharing one run-up, as collectives
       in flight together do, only the one it arrives at last) and divided by the steps; the
       largest positive one names the phase.
    One pass over the instances for all stragglers, each instance's run-ups gathered once and
    dropped (kept for every instance, 128 stragglers of 1024 ranks held them all at once)."""
    use_phases = {r: any(st.phase_spans for st in by_rank[r].steps) for r in slow}
    spans = (
        {r: _PhaseSpans([sp for st in t.steps for sp in st.phase_spans]) for r, t in by_rank.items()}
        if any(use_phases.values())
        else None
    )
    # Collectives in flight together (DDP's buckets) share one run-up: of those a straggler is
    # late for, only the one it arrives at last is read (its run-up holds the others').
    latest: dict[tuple[int, float], tuple[float, int]] = {}
    for k, (w, late) in enumerate(zip(waits, lateness)):
        for r in slow:
            if late.get(r, 0.0) > late_floor_us:
                op = w.instance.ops[r]
                key = (r, op.start_us if op.run_up_start_us is None else op.run_up_start_us)
                if key not in latest or op.start_us > latest[key][0]:
                    latest[key] = (op.start_us, k)
    read: dict[int, list[int]] = defaultdict(list)
    for (r, _), (_, k) in latest.items():
        read[k].append(r)
    excess: dict[int, dict[str, float]] = {r: defaultdict(float) for r in slow}
    for k in sorted(read):
        w, here = waits[k], sorted(read[k])
        for by_phase in sorted({use_phases[r] for r in here}):
            times, columns = _run_ups_at(w, spans if by_phase else None)
            for r in here:
                if use_phases[r] == by_phase:
                    mine = dict(times[r].items())  # a Named's lookups are linear: hundreds of CPU op names
                    for name, vals in columns.items():
                        own = mine.get(name, 0.0)
                        excess[r][name] += own - _median_without(vals, own)
    out: dict[int, tuple[str | None, float | None]] = {}
    for r in slow:
        slowest = max(sorted(excess[r]), key=excess[r].__getitem__) if excess[r] else None
        worst = excess[r][slowest] if slowest is not None else 0.0
        out[r] = (slowest, worst / max(n_steps, 1) / 1e3) if slowest is not None and worst > 0 else (None, None)
    return out
