"""Clock alignment: one offset per host, from the end times of matched blocking collectives.

Ranks on one host read one clock (Kineto stamps events with the host's clock), so they share one
offset; between hosts the clocks differ by NTP/PTP error, which nothing in a trace corrects.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from harness.traces.align.matching import Instance
from harness.traces.analyse.noise import GPU, NoiseModel
from harness.traces.model import CommOp, RankTrace


@dataclass(kw_only=True)
class ClockOffset:
    rank: int
    offset_us: float  # subtract from this rank's timestamps to align it with the reference host
    spread_us: float  # median absolute deviation of (its collectives' ends - the reference rank's)
    samples: int
    clock: str = ""  # its clock domain (`clock_domain`): ranks with the same one read one clock


@dataclass(kw_only=True)
class HostClock:
    host: str
    ranks: list[int]
    offset_us: float
    spread_us: float  # median absolute deviation of the per-collective estimates
    samples: int  # matched collectives the estimate rests on (0: not aligned)
    via: str | None = None  # the host it was aligned against (None for the reference)


def clock_domain(trace: RankTrace, own_clock: frozenset[int] = frozenset()) -> str:
    """The clock a rank's timestamps come from: its host, or the rank alone when the trace does
    not name its host (third-party traces: then nothing says two ranks share a clock) or when
    its collectives say it reads another clock than its host-mates (`own_clock`,
    `disagreeing_clocks`)."""
    if trace.host and trace.host != "unknown" and trace.rank not in own_clock:
        return trace.host
    return f"{trace.host} (rank {trace.rank})"


# Timestamps of one host's processes come from one clock: CPU events to the microsecond, GPU events
# through each process's own conversion of CUPTI's device clock to the host's (microseconds to
# tens of microseconds apart). 100 us is well above both and well below the milliseconds a
# clock of another machine or container is off by.
CAUSALITY_SLACK_US = 100.0
# Collectives (by canonical name prefix) that no rank can finish before every rank has entered.
SYMMETRIC = ("allreduce", "allgather", "reducescatter", "alltoall", "barrier")
# A clock offset moves every collective by the same: gaps scattered by more than a quarter of
# their median are wrong matches (a window's first ops cut differently per rank), not a clock.
STEADY_SHARE = 0.25
# The share of a rank's collectives with its host-mates that must be impossible on one clock
# before its host name is overruled: more than half, so the odd torn timestamp does not.
DISAGREE_SHARE = 0.5
# A blocking collective ends at nearly the same instant on every rank of one clock, so a rank
# whose ends come a steady gap after (or before) its host-mates' by more than this many of their
# own scatters (median absolute deviations of their gaps: the straggler rule's noise_factor,
# three MADs) and by more than CAUSALITY_SLACK_US reads another clock: a long wait lets ops
# overlap, so impossibility alone never shows a clock off by less than the waits.
SCATTER_FACTOR = 3.0
# ... and by more than this: ten times CAUSALITY_SLACK_US, above the ends' scatter on one clock
# (GPU kernels 20-90 us apart on the real traces in ../shared/traces), below the milliseconds a
# container's or machine's clock is off by. A gloo thread's wake-up on a busy core can take
# longer (a steady 2.3 ms measured beside a busy loop): `ROLE_SAMPLES` handles that.
STEADY_FLOOR_US = 1000.0
# Where ranks wake up after a collective (NoiseModel.wakeup_noise), a rank that waited ends when
# its thread is scheduled again, after the last arriver, which was running. A steady gap shows a
# clock only against host-mates of the same role at the instance (waiters against waiters, woken
# by one event), or where it holds with one sign both where the rank waited and where it arrived
# last (a wake-up delay changes sign between the two, an offset does not). A median of three, the
# fewest that one outlier cannot move: three ranks of one role, and three gaps in each role.
ROLE_SAMPLES = 3


@dataclass
class _EndGaps:
    """`disagreeing_clocks`' samples per rank, over the instances it shares with host-mates;
    `roles`: also its gaps by role (`same_role`, `cross_role`: step 4, wake-up noise only)."""

    roles: bool = False
    impossible: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    shared: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    gaps: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))  # its end - the others' median
    apart: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))  # its end - the host's median
    same_role: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))  # - its role's median
    cross_role: dict[tuple[int, bool], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )  # (rank, waited) -> apart, where too few ranks share its role

    def add(self, ranks: list[int], ops: list[CommOp]) -> None:
        """One instance's ops of one host's ranks (two or more)."""
        starts = sorted(op.start_us for op in ops)
        ends = sorted(op.end_us for op in ops)
        waited = [op.start_us < starts[-1] - CAUSALITY_SLACK_US for op in ops]
        # each role's median end, where at least ROLE_SAMPLES ranks share it (None: too few)
        role_median: dict[bool, float | None] = {}
        if self.roles:
            for w in (True, False):
                role_ends = [op.end_us for op, v in zip(ops, waited) if v == w]
                role_median[w] = statistics.median(role_ends) if len(role_ends) >= ROLE_SAMPLES else None
        for r, op, w in zip(ranks, ops, waited):
            # mates that ended before it started, and that started after it ended (itself
            # is in neither: its own start is not after its own end)
            before = bisect.bisect_left(ends, op.start_us - CAUSALITY_SLACK_US)
            after = len(starts) - bisect.bisect_right(starts, op.end_us + CAUSALITY_SLACK_US)
            self.shared[r] += 1
            self.gaps[r].append(op.end_us - _median_of_others(ends, op.end_us))
            # against the host's median end (its own in) from three ranks on, which one rank
            # off cannot move; with two, the other's
            gap_us = op.end_us - (statistics.median(ends) if len(ends) >= 3 else _median_of_others(ends, op.end_us))
            self.apart[r].append(gap_us)
            if self.roles:
                mid = role_median[w]
                if mid is not None:
                    self.same_role[r].append(op.end_us - mid)
                else:
                    self.cross_role[r, w].append(gap_us)
            if before + after > (len(ranks) - 1) / 2:
                self.impossible[r] += 1


def disagreeing_clocks(instances: list[Instance], traces: list[RankTrace], noise: NoiseModel = GPU) -> dict[int, float]:
    """The ranks whose timestamps cannot share their host-mates' clock, and by how much their
    collectives' ends differ from their host-mates' (median, us): a host name is a hint.

    A blocking collective cannot end on one rank before every rank has arrived, so on one clock
    the ops of two participants overlap (both run at the moment the last one arrives), and they
    end at nearly the same instant. At each matched instance, for each pair of ranks of one host:
    1. the pair is impossible on one clock when one's op starts after the other's ends, or ends
       before the other's starts, by more than CAUSALITY_SLACK_US;
    2. a rank is impossible at the instance when it is so with more than half of its host-mates
       there (with one host-mate, with that one: then both ranks are);
    3. a rank impossible at more than DISAGREE_SHARE of its instances with host-mates, or whose
       ends come a steady gap from its host-mates' (the median of its end minus the median of
       theirs, per instance) beyond SCATTER_FACTOR of their own gaps' scatter and beyond
       STEADY_FLOOR_US, reads a clock of its own (a container with its own clock, a
       mislabelled host, a rewritten trace), and is aligned on its own; where a host's ranks
       split in two, each reads its own;
    4. where the noise model has wake-up noise, a rank's role at an instance is waiter (it
       arrived more than CAUSALITY_SLACK_US before the host's last) or last; a waiter's late
       wake-up reads as a gap of one sign against the last arriver. A steady gap counts there
       only (`_wakeup_free_gap`) against the host-mates of its role where at least ROLE_SAMPLES
       ranks share it (the median of their ends, its own in), or where the medians of its
       gaps as a waiter and as the last, each of at least ROLE_SAMPLES, have one sign and are
       both beyond the bounds. Two ranks of which one always waits (a straggler) show no
       clock by their gap.
    Only collectives every rank must enter before any can finish are read (`SYMMETRIC`): a
    broadcast's root, a reduce's senders or a p2p send can finish before a peer arrives. A clock
    off by an offset is off by the same at every collective: the rank's gaps to its host-mates'
    ends must be steady (their MAD at most STEADY_SHARE of their median), or what looks
    impossible is collectives matched wrongly, not a clock.
    Per host and instance, two sorted lists and binary searches: O(k log k) for k ranks."""
    host = {t.rank: t.host for t in traces if t.host and t.host != "unknown"}
    e = _EndGaps(roles=noise.wakeup_noise)
    for inst in instances:
        if not inst.name.startswith(SYMMETRIC):
            continue
        by_host: dict[str, list[int]] = defaultdict(list)
        for r in inst.ops:
            if r in host:
                by_host[host[r]].append(r)
        for ranks in by_host.values():
            if len(ranks) >= 2:
                e.add(ranks, [inst.ops[r] for r in ranks])
    gaps, apart = e.gaps, e.apart
    out: dict[int, float] = {}
    by_gap: dict[int, float] = {}
    scatter = {r: mad(g) for r, g in apart.items()}
    compared_on: dict[str | None, list[int]] = defaultdict(list)
    for m in gaps:
        compared_on[host.get(m)].append(m)
    for r in sorted(gaps):
        gap, steady = statistics.median(gaps[r]), statistics.median(apart[r])
        mates = [scatter[m] for m in compared_on[host.get(r)] if m != r]
        if e.impossible[r] > DISAGREE_SHARE * e.shared[r] and mad(gaps[r]) <= STEADY_SHARE * abs(gap):
            out[r] = gap
        else:
            floor_us = max(STEADY_FLOOR_US, SCATTER_FACTOR * statistics.median(mates) if mates else 0.0)
            if not noise.wakeup_noise:
                if _steady_beyond(apart[r], floor_us):
                    by_gap[r] = steady
            elif (
                found := _wakeup_free_gap(e.same_role[r], e.cross_role[r, True], e.cross_role[r, False], floor_us)
            ) is not None:
                by_gap[r] = found
    # where every rank of a host is apart from the others by its gap alone (two ranks), nothing
    # tells which clock is off: its lowest rank keeps the host's
    for h in {host[r] for r in by_gap}:
        on_host = [r for r in gaps if host.get(r) == h]
        if all(r in out or r in by_gap for r in on_host):
            by_gap.pop(min(r for r in on_host if r in by_gap))
    return dict(sorted({**out, **by_gap}.items()))


def _steady_beyond(gaps_us: list[float], floor_us: float) -> bool:
    """Gaps whose median is beyond `floor_us` and whose MAD is at most STEADY_SHARE of it."""
    med = statistics.median(gaps_us)
    return abs(med) > floor_us and mad(gaps_us) <= STEADY_SHARE * abs(med)


def _wakeup_free_gap(
    same_role_us: list[float], waited_us: list[float], last_us: list[float], floor_us: float
) -> float | None:
    """A rank's steady gap where waiters wake late (`disagreeing_clocks` step 4), or None:
    1. against the host-mates of its role: at least ROLE_SAMPLES gaps, steady beyond `floor_us`;
    2. else against the host's ends, as a waiter and as the last arriver: each at least
       ROLE_SAMPLES gaps, steady beyond `floor_us`, with one sign (the smaller median)."""
    if len(same_role_us) >= ROLE_SAMPLES and _steady_beyond(same_role_us, floor_us):
        return statistics.median(same_role_us)
    if len(waited_us) < ROLE_SAMPLES or len(last_us) < ROLE_SAMPLES:
        return None
    if not (_steady_beyond(waited_us, floor_us) and _steady_beyond(last_us, floor_us)):
        return None
    a, b = statistics.median(waited_us), statistics.median(last_us)
    return min(a, b, key=abs) if a * b > 0 else None


def _median_of_others(ordered: list[float], v: float) -> float:
    """The median of sorted `ordered` with one occurrence of `v` left out (2+ values)."""
    i = bisect.bisect_left(ordered, v)
    rest = ordered[:i] + ordered[i + 1 :]
    return statistics.median(rest)


def mad(xs: list[float]) -> float:
    """Median absolute deviation from the median: the spread measure of clocks and stragglers."""
    med = statistics.median(xs)
    return statistics.median(abs(x - med) for x in xs)


def _align_component(
    ref: str,
    per_host: list[tuple[dict[str, list[float]], dict[str, float]]],
    offset: dict[str, float],
    clocks: dict[str, HostClock],
    ranks_of: dict[str, list[int]],
    component_rank: dict[str, int],
) -> None:
    """`estimate_offsets`' step 2 from the host `ref` (already placed): aligns, in `offset` and
    `clocks`, every host that reaches it through shared instances."""
    aligned: list[list[float]] = [list(ends.get(ref, [])) for ends, _ in per_host]
    anchors = [statistics.median(a) if a else None for a in aligned]
    while True:
        diffs: dict[str, list[float]] = defaultdict(list)
        for (ends, median_end), anchor in zip(per_host, anchors):
            if anchor is None:
                continue
            for h in ends:
                if h not in offset:
                    diffs[h].append(median_end[h] - anchor)
        if not diffs:
            return
        h = max(sorted(diffs), key=lambda k: len(diffs[k]))
        med = statistics.median(diffs[h])
        offset[h] = med
        component_rank[h] = component_rank[ref]
        via = {
            g
            for (ends, _), anchor in zip(per_host, anchors)
            if anchor is not None and h in ends
            for g in ends
            if g in offset and g != h
        }
        clocks[h] = HostClock(
            host=h,
            ranks=ranks_of[h],
            offset_us=med,
            spread_us=mad(diffs[h]),
            samples=len(diffs[h]),
            via=", ".join(sorted(via)),
        )
        for k, (ends, _) in enumerate(per_host):
            if h in ends:
                aligned[k].extend(e - med for e in ends[h])
                anchors[k] = statistics.median(aligned[k])


def estimate_offsets(
    instances: list[Instance], traces: list[RankTrace], own_clock: frozenset[int] = frozenset()
) -> tuple[dict[int, ClockOffset], list[HostClock]]:
    """Per-host clock offsets, and each rank's end-time scatter (the timing noise at collectives).

    A blocking collective ends at nearly the same instant on every participant, so (a rank in
    `own_clock` is a host of its own, `disagreeing_clocks`):
    1. reference host = the host of the lowest rank; its offset is 0;
    2. repeat until no host is added: for each host h not yet aligned, over every instance that
       has ranks of h and of an aligned host A: d = median(ends on h) - median(ends on A - offset_A);
       offset_h = median(d) (robust to the odd late completion), spread_h = median |d - offset_h|;
       the host with the most such instances is aligned next (ties: by name);
    3. hosts left share no instance with an aligned one, directly or through others: the host
       of the lowest rank left is the reference of its own component (offset 0, samples 0), and
       2 aligns the hosts that reach it; and so on until every host is placed. The components'
       clocks stay apart, which nothing compares: no collective spans two (a pipeline's stages
       on hosts of their own, whose point-to-point ops are not matched, share no collective);
    4. every rank takes its host's offset; its own spread is the median absolute deviation of
       (its end - its component reference's lowest rank's end) over the instances they share,
       after offsets.
    """
    domain = {t.rank: clock_domain(t, own_clock) for t in traces}
    ranks_of: dict[str, list[int]] = defaultdict(list)
    for r in sorted(domain):
        ranks_of[domain[r]].append(r)
    # Per instance, once: each host's ends and their median; the aligned ends (end - offset of
    # the aligned hosts) grow as hosts are aligned, and their median is the instance's anchor.
    # (Recomputing these for every host added would multiply their cost by the hosts.)
    per_host = []
    for inst in instances:
        ends: dict[str, list[float]] = defaultdict(list)
        for r, op in inst.ops.items():
            ends[domain[r]].append(op.end_us)
        per_host.append((ends, {h: statistics.median(e) for h, e in ends.items()}))
    offset: dict[str, float] = {}
    clocks: dict[str, HostClock] = {}
    component_rank: dict[str, int] = {}  # host -> the lowest rank of its component's reference host
    for first in sorted(domain):
        ref = domain[first]
        if ref in offset:
            continue
        offset[ref] = 0.0
        clocks[ref] = HostClock(host=ref, ranks=ranks_of[ref], offset_us=0.0, spread_us=0.0, samples=0)
        component_rank[ref] = first
        _align_component(ref, per_host, offset, clocks, ranks_of, component_rank)
    rank_diffs: dict[int, list[float]] = defaultdict(list)
    for inst in instances:
        by_ref: dict[int, float] = {}
        for r, op in inst.ops.items():
            ref_r = component_rank[domain[r]]
            if ref_r not in by_ref and ref_r in inst.ops:
                by_ref[ref_r] = inst.ops[ref_r].end_us
            if ref_r in by_ref:
                rank_diffs[r].append(op.end_us - clocks[domain[r]].offset_us - by_ref[ref_r])
    out = {}
    for r in sorted(domain):
        d = rank_diffs.get(r, [])
        own_ref = r == component_rank[domain[r]]
        spread = mad(d) if d and not own_ref else 0.0
        # a component's reference is measured against nothing (its 0 is no sample), as its host's
        # clock is not; the whole job's reference keeps its count, as before
        samples = 0 if own_ref and r != min(domain) else len(d)
        out[r] = ClockOffset(
            rank=r, offset_us=clocks[domain[r]].offset_us, spread_us=spread, samples=samples, clock=domain[r]
        )
    return out, [clocks[h] for h in sorted(clocks, key=lambda k: min(ranks_of[k]))]
