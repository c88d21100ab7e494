"""What-if by replay: the step time a run would have with some ranks' excess removed. Pure.

Each step is replayed as its sequence of matched collectives: a collective starts when its last
participant arrives, and each rank's run-up to a collective is its own work, which does not
change when another rank becomes punctual.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from harness.collect.model import RankTrace
from harness.collect.waits import InstanceWaits


def _median_or(values: list[float], default: float) -> float:
    return statistics.median(values) if values else default


def replay_step(step_span_us: dict[int, tuple[float, float]], ws: list[InstanceWaits], fixed: set[int]) -> float:
    """One step's replayed duration (us) with the ranks in `fixed` made as fast as their peers.

    1. order the step's collectives by their measured start (last arrival);
    2. per rank and collective, what its arrival waited on (own clock): the end of its previous
       collective when it arrived after that end (its work resumed after it), else its previous
       arrival (collectives issued back to back, overlapping), the step's start for its first;
       run-up = arrival - that point; transfer = its end - the collective's last arrival;
       tail = the step's end - its last collective's end (the rest of its step);
    3. a fixed rank's run-up and transfer at each collective become the medians of the unfixed
       participants' (its own when all participants are fixed: a late completion is part of a
       slow rank's excess too), its tail the median tail of the unfixed ranks;
    4. replay from 0 on every rank: arrival = point + run-up; start = the latest arrival;
       end = start + transfer; the rank's step = its last end + its tail (a rank without
       collectives in the step: its own step duration, or the unfixed ranks' median if fixed);
    5. the step's replayed duration is the longest rank's (the next step's first collective
       waits for it).
    With `fixed` empty this reproduces the measured step up to the model's assumptions
    (`StragglerResult.replayed_step_ms` reports it next to the measured step)."""
    ws = sorted(ws, key=lambda w: (w.last_arrival_us, w.index))
    prev: dict[int, InstanceWaits] = {}
    kind: dict[tuple[int, int], str] = {}
    run: dict[tuple[int, int], float] = {}
    for w in ws:
        for r, a in w.arrival_us.items():
            p = prev.get(r)
            if p is None:
                kind[w.index, r], base = "start", step_span_us[r][0] if r in step_span_us else a
            elif a >= p.end_us[r]:
                kind[w.index, r], base = "end", p.end_us[r]
            else:
                kind[w.index, r], base = "arrival", p.arrival_us[r]
            run[w.index, r] = max(a - base, 0.0)
            prev[r] = w
    ranks = set(step_span_us) | set(prev)
    tail = {}
    for r in ranks:
        lo, hi = step_span_us.get(r, (0.0, 0.0))
        tail[r] = max(hi - prev[r].end_us[r], 0.0) if r in prev else max(hi - lo, 0.0)
    unfixed_tails = [tail[r] for r in ranks if r not in fixed and r in prev]
    unfixed_solo = [tail[r] for r in ranks if r not in fixed and r not in prev]
    arrived: dict[int, float] = {}
    ended: dict[int, float] = {}
    for w in ws:
        peers = [q for q in w.arrival_us if q not in fixed]
        new_arrival = {}
        for r in w.arrival_us:
            k = kind[w.index, r]
            point = 0.0 if k == "start" else (ended[r] if k == "end" else arrived[r])
            r_run = run[w.index, r]
            if r in fixed:
                r_run = _median_or([run[w.index, q] for q in peers], r_run)
            new_arrival[r] = point + r_run
        start = max(new_arrival.values())
        transfer = {r: max(w.end_us[r] - w.last_arrival_us, 0.0) for r in w.arrival_us}
        for r in w.arrival_us:
            arrived[r] = new_arrival[r]
            t = transfer[r] if r not in fixed else _median_or([transfer[q] for q in peers], transfer[r])
            ended[r] = start + t
    longest = 0.0
    for r in ranks:
        if r in ended:
            t = tail[r] if r not in fixed else _median_or(unfixed_tails, tail[r])
            longest = max(longest, ended[r] + t)
        else:
            longest = max(longest, tail[r] if r not in fixed else _median_or(unfixed_solo, tail[r]))
    return longest


def replay_steps(traces: list[RankTrace], waits: list[InstanceWaits], fixed: set[int]) -> float | None:
    """The mean replayed step (ms) over the steps with matched collectives (`replay_step`), on
    aligned clocks; None when no matched collective lies inside a step."""
    by_step: dict[int, list[InstanceWaits]] = defaultdict(list)
    for w in waits:
        if w.step is not None:
            by_step[w.step].append(w)
    spans: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for t in traces:
        for s in t.steps:
            spans[s.number][t.rank] = (s.start_us, s.end_us)
    steps = [s for s in sorted(by_step) if s in spans]
    if not steps:
        return None
    return statistics.mean(replay_step(spans[s], by_step[s], fixed) for s in steps) / 1e3
