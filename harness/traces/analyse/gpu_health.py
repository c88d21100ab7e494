"""Whether a straggler's GPU ran slower than its peers': its SM clock and throttle reasons, from
the step logs' NVML readings (harness/run/gpu_health.py).

A rank whose code is its peers' but whose GPU runs a lower clock (throttled for temperature or
power, or held low) is slow for its hardware, not for its work: the report says so beside its
lateness, with the figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from harness.sourced import threshold


@dataclass(frozen=True)
class GpuReading:
    """The NVML reading a step record carries (None: not read on that GPU)."""

    sm_clock_mhz: float | None
    throttle: tuple[str, ...]
    temp_c: float | None


@dataclass(kw_only=True)
class GpuThresholds:
    clock_drop: float = threshold(
        0.05,
        kind="definition",
        source="a compute-bound kernel's time scales with 1/SM clock: a clock 5% under its peers' makes its "
        "compute 5% slower, the size the straggler bound (8% of the step) starts to hold; a smaller gap is "
        "boost-clock wander (NVML steps SM clocks by 15 MHz, under 1% of a 1.5-2 GHz part)",
    )
    reason_share: float = threshold(
        0.5,
        kind="definition",
        source="a throttle reason counts for a rank when set in at least half of its analysed steps (a "
        "majority of them: one reading a second lands on a step now and then)",
    )


@dataclass(frozen=True, kw_only=True)
class GpuFinding:
    """What a straggler's GPU did against its peers' over the analysed steps."""

    rank: int
    sm_clock_mhz: float  # the median of its readings
    peer_sm_clock_mhz: float  # the median of its peers' medians
    throttle: tuple[str, ...]  # reasons it had (in reason_share of its steps) that no peer had
    temp_c: float | None  # its highest temperature
    peer_temp_c: float | None  # its peers' highest
    text: str  # "its GPU ran at ... on its peers: throttled for ..." (the report puts the rank before it)


def gpu_findings(
    stragglers: Collection[int],
    readings: Mapping[int, Mapping[int, GpuReading]],
    steps: Mapping[int, Collection[int]] | None = None,
    th: GpuThresholds | None = None,
) -> dict[int, GpuFinding]:
    """Each straggler whose GPU ran slower than its peers':

    1. each rank's readings of the analysed steps (`steps`: rank -> step numbers; all its
       readings where None or where none of them is read);
    2. its SM clock = the median of its readings'; the peers' = the median of the other ranks'
       own medians; its throttle reasons = those set in at least `reason_share` of its readings;
    3. a finding where its clock is under the peers' by more than `clock_drop`, or it had a
       throttle reason no peer had.
    """
    th = th or GpuThresholds()

    def kept(rank: int) -> list[GpuReading]:
        mine = readings.get(rank, {})
        wanted = steps.get(rank) if steps else None
        picked = [r for s, r in mine.items() if wanted is None or s in wanted]
        return picked or list(mine.values())

    clock: dict[int, float] = {}
    reasons: dict[int, set[str]] = {}
    temp: dict[int, float] = {}
    for rank in readings:
        rs = kept(rank)
        clocks = [r.sm_clock_mhz for r in rs if r.sm_clock_mhz is not None]
        if clocks:
            clock[rank] = statistics.median(clocks)
        counts: dict[str, int] = {}
        for r in rs:
            for word in set(r.throttle):
                counts[word] = counts.get(word, 0) + 1
        reasons[rank] = {w for w, n in counts.items() if rs and n >= th.reason_share * len(rs)}
        temps = [r.temp_c for r in rs if r.temp_c is not None]
        if temps:
            temp[rank] = max(temps)
    out: dict[int, GpuFinding] = {}
    for rank in stragglers:
        peers = [r for r in clock if r != rank]
        if rank not in clock or not peers:
            continue
        peer_clock = statistics.median(clock[r] for r in peers)
        peer_reasons = set().union(*(reasons.get(r, set()) for r in peers))
        own = tuple(sorted(reasons.get(rank, set()) - peer_reasons))
        lower = clock[rank] < (1 - th.clock_drop) * peer_clock
        if not lower and not own:
            continue
        peer_temps = [temp[r] for r in peers if r in temp]
        peer_temp = max(peer_temps) if peer_temps else None
        out[rank] = GpuFinding(
            rank=rank,
            sm_clock_mhz=clock[rank],
            peer_sm_clock_mhz=peer_clock,
            throttle=own,
            temp_c=temp.get(rank),
            peer_temp_c=peer_temp,
            text=_text(clock[rank], peer_clock, own, temp.get(rank), peer_temp),
        )
    return out


def _text(mine: float, peers: float, own: tuple[str, ...], temp: float | None, peer_temp: float | None) -> str:
    """What the report says of a straggler's GPU (after "Rank N: ")."""
    ran = f"its GPU ran at {mine / 1e3:.2f} GHz against {peers / 1e3:.2f} GHz on its peers"
    if own:
        why = f"throttled for {' and '.join(own)}"
        if "temperature" in own and temp is not None and peer_temp is not None:
            why += f" ({temp:.0f} C, its peers at most {peer_temp:.0f} C)"
        return f"{ran}: {why}"
    return f"{ran}, with no throttle reason set (a lower clock setting, or a slower part)"
