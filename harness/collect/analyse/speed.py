"""How fast each CPU rank runs the same ops: the speed factor the straggler rule judges CPU ranks
net of. Pure.

Ranks of a CPU-only job time-share their hosts' cores: which rank lands on the busier or slower
core (another rank's threads on it, gloo's, a virtual CPU whose sibling is loaded) is the
scheduler's choice, not the rank's doing, and it slows every op that rank runs alike. A
straggler's own cause is different: extra work (an op it repeats, in a few names) or time off
its core (a sleep, input, I/O: no op at all). So the median over op names of a rank's time
against its peers' measures the first and ignores the second.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping

from harness.collect.analyse.runq import RunQueue
from harness.collect.model import RankTrace
from harness.collect.read.runup import OP_PREFIX

# An op name votes only where every rank spent at least this long in it over the analysed
# collectives' run-ups: CPU op times come in whole microseconds in older traces, so a name with
# 1 ms has a rounding error of a few per cent at most even over hundreds of short calls.
MIN_NAME_US = 1000.0
# The fewest names the factor is taken over: with three, one name a straggler repeats (its extra
# work) cannot be the median.
MIN_NAMES = 3


def op_time_by_name(trace: RankTrace, queue: RunQueue | None = None) -> dict[int | None, dict[str, float]]:
    """The rank's op time by step and name (us) over its collectives' run-ups (the collective's
    step; None: outside any); with its wait for a core (`queue`), net of it: in each run-up the
    ops keep the share of the logged phases' time it did not wait (`RunQueue.share`: preemption
    falls anywhere, in ops and between them alike, so each op waited its phase's share of its
    time)."""
    out: dict[int | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in trace.comms:
        kept = 1.0
        if queue is not None and c.run_up_start_us is not None:
            kept = 1.0 - queue.share(c.run_up_start_us, c.start_us)
        for name, us in c.run_up_us.items():
            if name.startswith(OP_PREFIX):
                out[c.step][name] += us * kept
    return out


def op_speed(traces: list[RankTrace], queues: Mapping[int, RunQueue] | None = None) -> dict[int, float]:
    """Each rank's speed factor: how much longer it takes for the same ops than the median rank
    (1.25: a quarter longer). 1.0 for every rank unless every rank ran on CPU (a GPU is its
    rank's own: a slower one is that rank's straggling) and the factor can be estimated.

    1. per rank, its op time by step and name over its collectives' run-ups (`op_time_by_name`:
       what it ran between collectives, the stretches its lateness is measured over), net of its
       wait for a core where `queues` has it (that wait is taken out of its run-ups apart:
       runq.py; what is left is how fast it runs once on a core);
    2. the names every rank spent at least MIN_NAME_US in over the steps;
    3. per name and step that every rank ran it in: each rank's time / the median over the
       ranks; per rank and name, the median of those over the steps. A slower or busier core
       slows a rank's ops step after step; one preempted call is one step's: on 2 shared cores
       ops of 50-150 us come to 1-2 ms per name over a 3-step window, and one call preempted
       for 1.3 ms doubled a rank's total of its name, and of the name around it (aten::linear
       holds aten::addmm: nested ops share their spikes), which made a rank that only waited at
       its receives 1.9 times as slow as its stage peer;
    4. the factor is the median of those, one vote per name: a slower or busier core slows
       every name alike, a straggler's extra work is in the few names it repeats;
    5. 1.0 for every rank with fewer than MIN_NAMES names (too little to tell)."""
    ones = {t.rank: 1.0 for t in traces}
    if len(traces) < 2 or any(t.device != "cpu" for t in traces):
        return ones
    by_rank = {t.rank: op_time_by_name(t, queues.get(t.rank) if queues else None) for t in traces}
    first = by_rank[traces[0].rank]
    order = list(dict.fromkeys(n for step in first.values() for n in step))
    names = [
        n
        for n in order
        if all(sum(step.get(n, 0.0) for step in steps.values()) >= MIN_NAME_US for steps in by_rank.values())
    ]
    if len(names) < MIN_NAMES:
        return ones
    votes: dict[int, list[float]] = defaultdict(list)
    for n in names:
        per_step: dict[int, list[float]] = defaultdict(list)
        for key in first:
            times = {r: steps.get(key, {}).get(n, 0.0) for r, steps in by_rank.items()}
            if min(times.values()) > 0.0:
                mid = statistics.median(times.values())
                for r, us in times.items():
                    per_step[r].append(us / mid)
        if per_step:
            for r in by_rank:
                votes[r].append(statistics.median(per_step[r]))
    if len(votes[traces[0].rank]) < MIN_NAMES:
        return ones
    return {r: statistics.median(votes[r]) for r in by_rank}
