"""Each matched collective's arrivals, waits and transfer, and who caused the waiting. Pure.

Computed once per instance on aligned clocks and read by the straggler analysis, the overlap
split (exposed waiting vs exposed transfer), the what-if replay, the timeline, the merged trace
and the report's tables.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from harness.traces.align.matching import Instance
from harness.traces.read.compact import RankValues


@dataclass(kw_only=True)
class InstanceWaits:
    """One matched collective instance on aligned clocks (all times in us)."""

    index: int  # position in the analysis' instance list
    instance: Instance
    # rank -> ..., as dicts or (from instance_waits) as RankValues over the instance's ranks
    arrival_us: Mapping[int, float]  # rank -> start of its op, aligned
    end_us: Mapping[int, float]  # rank -> end of its op, aligned
    last_rank: int  # the latest arriver (lowest rank among equals)
    wait_us: Mapping[int, float]  # rank -> last arrival - own arrival
    transfer_us: float  # the instance's transfer time: min over ranks of (duration - wait)
    delay_us: Mapping[int, float]  # rank -> its share of the delay of the collective's start
    blame_us: Mapping[int, float]  # rank -> its share of the others' waiting

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def step(self) -> int | None:
        return self.instance.step

    @property
    def last_arrival_us(self) -> float:
        return self.arrival_us[self.last_rank]

    def waited_on_us(self, waiter: int, cause: int) -> float:
        """The part of `waiter`'s wait caused by `cause` (see `attribute`, step 4)."""
        return max(self.delay_us[cause] - self.delay_us[waiter], 0.0)

    def own_transfer_us(self, rank: int) -> float:
        """The part of this rank's op after the last arrival: moving data."""
        return max(self.end_us[rank] - self.arrival_us[rank] - self.wait_us[rank], 0.0)


def attribute(arrival_us: dict[int, float]) -> tuple[dict[int, float], dict[int, float]]:
    """Who caused the waiting at one collective: each rank's share of the delay of its start and
    of the others' waiting.

    A collective starts when its last participant arrives; making one late rank punctual only
    helps as far as the next-latest rank allows, so the delay is shared the way the Shapley value
    of this cost game shares it (the 'airport game': the cost of a set of latecomers is the
    latest arrival among them):
    1. sort the ranks by arrival a_1 <= ... <= a_n (ties by rank); gap_k = a_(k+1) - a_k;
    2. gap_k is time the k ranks already there wait because ranks k+1..n are not: it is shared
       equally by those n - k later ranks, so a rank's delay share is the sum of gap_k / (n - k)
       over the gaps before its arrival (the shares add up to a_n - a_1);
    3. its share of the others' waiting weighs each gap by the k ranks waiting in it: the sum
       of k * gap_k / (n - k) (the shares add up to the sum of all waits);
    4. waiter i's wait a_n - a_i splits over the later ranks the same way; the part owed to a
       later rank j is the sum of gap_k / (n - k) over the gaps between their arrivals, which is
       delay_j - delay_i (`InstanceWaits.waited_on_us`).
    One late rank gets the whole delay (the 'last arriver' rule); two ranks late by about the same
    time share it, so both stand out. O(n log n) per instance.
    """
    order = sorted(arrival_us, key=lambda r: (arrival_us[r], r))
    n = len(order)
    delay = {order[0]: 0.0}
    blame = {order[0]: 0.0}
    d = b = 0.0
    for k in range(1, n):
        gap = max(arrival_us[order[k]] - arrival_us[order[k - 1]], 0.0)
        d += gap / (n - k)
        b += k * gap / (n - k)
        delay[order[k]] = d
        blame[order[k]] = b
    return delay, blame


def instance_waits(instances: list[Instance]) -> list[InstanceWaits]:
    """Per instance (its ops already on aligned clocks): 1. arrival_r = start of rank r's op, end_r its end;
    2. last = the latest arrival; wait_r = last - arrival_r; 3. transfer = min over ranks of
    (duration_r - wait_r), at least 0 (the ends of a blocking collective coincide, so this is
    about the last arriver's duration); 4. the attribution of `attribute`. Each held as
    `RankValues` over the ranks in the order of the instance's ops (one index for every instance
    of the same ranks)."""
    out = []
    indexes: dict[tuple[int, ...], dict[int, int]] = {}
    for n, inst in enumerate(instances):
        ranks = tuple(inst.ops)
        index = indexes.setdefault(ranks, {r: i for i, r in enumerate(ranks)})
        arrival = {r: op.start_us for r, op in inst.ops.items()}
        end = {r: op.end_us for r, op in inst.ops.items()}
        last_rank = max(sorted(arrival), key=arrival.__getitem__)
        waits = {r: arrival[last_rank] - a for r, a in arrival.items()}
        transfer = max(min(end[r] - arrival[r] - waits[r] for r in arrival), 0.0)
        delay, blame = attribute(arrival)
        out.append(
            InstanceWaits(
                index=n,
                instance=inst,
                arrival_us=RankValues.of(arrival, index),
                end_us=RankValues.of(end, index),
                last_rank=last_rank,
                wait_us=RankValues.of(waits, index),
                transfer_us=transfer,
                delay_us=RankValues.of(delay, index),
                blame_us=RankValues.of(blame, index),
            )
        )
    return out


def instances_by_rank(waits: list[InstanceWaits]) -> dict[int, list[InstanceWaits]]:
    """rank -> the instances it took part in, in order."""
    by_rank: dict[int, list[InstanceWaits]] = defaultdict(list)
    for w in waits:
        for r in w.arrival_us:
            by_rank[r].append(w)
    return by_rank


def op_waits(rank: int, taking_part: list[InstanceWaits]) -> dict[tuple[int, str, int], float]:
    """(rank, process group, seq) -> that op's wait, for one rank's ops in the instances it took
    part in (`instances_by_rank`): how the overlap split finds each op's wait. One rank at a time
    (every rank's at once held a tuple key per op of the job: ~80 k on 1024 ranks x 80
    collectives)."""
    out = {}
    for w in taking_part:
        op = w.instance.ops[rank]
        out[(rank, op.pg, op.seq)] = w.wait_us[rank]
    return out
