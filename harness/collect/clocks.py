"""Clock alignment: one offset per host, from the end times of matched blocking collectives.

Ranks on one host read one clock (Kineto stamps events with the host's clock), so they share one
offset; between hosts the clocks differ by NTP/PTP error, which nothing in a trace corrects.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from harness.collect.matching import Instance
from harness.collect.model import RankTrace


@dataclass(kw_only=True)
class ClockOffset:
    rank: int
    offset_us: float  # subtract from this rank's timestamps to align it with the reference host
    spread_us: float  # median absolute deviation of (its collectives' ends - the reference rank's)
    samples: int


@dataclass(kw_only=True)
class HostClock:
    host: str
    ranks: list[int]
    offset_us: float
    spread_us: float  # median absolute deviation of the per-collective estimates
    samples: int  # matched collectives the estimate rests on (0: not aligned)
    via: str | None = None  # the host it was aligned against (None for the reference)


def clock_domain(trace: RankTrace) -> str:
    """The clock a rank's timestamps come from: its host, or the rank alone when the trace does
    not name its host (third-party traces): then nothing says two ranks share a clock."""
    return trace.host if trace.host and trace.host != "unknown" else f"{trace.host} (rank {trace.rank})"


def mad(xs: list[float]) -> float:
    """Median absolute deviation from the median: the spread measure of clocks and stragglers."""
    med = statistics.median(xs)
    return statistics.median(abs(x - med) for x in xs)


def estimate_offsets(instances: list[Instance],
                     traces: list[RankTrace]) -> tuple[dict[int, ClockOffset], list[HostClock]]:
    """Per-host clock offsets, and each rank's end-time scatter (the timing noise at collectives).

    A blocking collective ends at nearly the same instant on every participant, so:
    1. reference host = the host of the lowest rank; its offset is 0;
    2. repeat until no host is added: for each host h not yet aligned, over every instance that
       has ranks of h and of an aligned host A: d = median(ends on h) - median(ends on A - offset_A);
       offset_h = median(d) (robust to the odd late completion), spread_h = median |d - offset_h|;
       the host with the most such instances is aligned next (ties: by name);
    3. a host sharing no instance with an aligned host keeps offset 0 with samples 0;
    4. every rank takes its host's offset; its own spread is the median absolute deviation of
       (its end - the lowest rank's end) over the instances they share, after offsets.
    """
    domain = {t.rank: clock_domain(t) for t in traces}
    ranks_of: dict[str, list[int]] = defaultdict(list)
    for r in sorted(domain):
        ranks_of[domain[r]].append(r)
    ref_rank = min(domain)
    ref = domain[ref_rank]
    offset: dict[str, float] = {ref: 0.0}
    clocks: dict[str, HostClock] = {ref: HostClock(host=ref, ranks=ranks_of[ref], offset_us=0.0, spread_us=0.0,
                                                   samples=0)}
    # Per instance, once: each host's ends and their median; the aligned ends (end - offset of
    # the aligned hosts) grow as hosts are aligned, and their median is the instance's anchor.
    # (Recomputing these for every host added made 128 hosts x 1024 ranks take seconds.)
    per_host = []
    for inst in instances:
        ends: dict[str, list[float]] = defaultdict(list)
        for r, op in inst.ops.items():
            ends[domain[r]].append(op.end_us)
        per_host.append((ends, {h: statistics.median(e) for h, e in ends.items()}))
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
            break
        h = max(sorted(diffs), key=lambda k: len(diffs[k]))
        med = statistics.median(diffs[h])
        offset[h] = med
        via = {g for (ends, _), anchor in zip(per_host, anchors) if anchor is not None and h in ends
               for g in ends if g in offset and g != h}
        clocks[h] = HostClock(host=h, ranks=ranks_of[h], offset_us=med, spread_us=mad(diffs[h]),
                              samples=len(diffs[h]), via=", ".join(sorted(via)))
        for k, (ends, _) in enumerate(per_host):
            if h in ends:
                aligned[k].extend(e - med for e in ends[h])
                anchors[k] = statistics.median(aligned[k])
    for h, rs in ranks_of.items():
        clocks.setdefault(h, HostClock(host=h, ranks=rs, offset_us=0.0, spread_us=0.0, samples=0))
    rank_diffs: dict[int, list[float]] = defaultdict(list)
    for inst in instances:
        if ref_rank not in inst.ops:
            continue
        end_ref = inst.ops[ref_rank].end_us
        for r, op in inst.ops.items():
            rank_diffs[r].append(op.end_us - clocks[domain[r]].offset_us - end_ref)
    out = {}
    for r in sorted(domain):
        d = rank_diffs.get(r, [])
        spread = mad(d) if d and r != ref_rank else 0.0
        out[r] = ClockOffset(rank=r, offset_us=clocks[domain[r]].offset_us, spread_us=spread, samples=len(d))
    return out, [clocks[h] for h in sorted(clocks, key=lambda k: min(ranks_of[k]))]
