"""Collective matching across ranks: which ops of different ranks are one collective instance."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from harness.traces.model import CommOp, RankTrace
from harness.traces.read.comm_kernels import POINT_TO_POINT, UNMATCHED

# How far apart two ranks' sequences of one group may start (in collectives) for `sequence_shift`
# to find it: profiler windows that open tens of milliseconds apart hold 1 to 8 collectives that
# their peers' windows do not (real H100 and V100 jobs with `tensorboard_trace_handler`); 32 is
# four times the most seen, and bounds the search at 65 candidate shifts.
MAX_SHIFT = 32


@dataclass(kw_only=True)
class Instance:
    """One collective instance, matched across the ranks that took part."""

    key: tuple
    name: str
    pg: str
    step: int | None
    ops: dict[int, CommOp]  # rank -> that rank's op


@dataclass(kw_only=True)
class _Left:
    """What matching left out, for its warnings."""

    p2p: int = 0
    mismatched: int = 0
    edge: int = 0  # instances at a window's edge that only some of their group's ranks hold
    before_window: dict[int, int] | None = None  # rank -> kernels launched before its window opened

    def warnings(self) -> list[str]:
        out: list[str] = []
        if self.before_window:
            ranks = sorted(self.before_window)
            counts = sorted(set(self.before_window.values()))
            n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
            out.append(
                f"rank(s) {', '.join(map(str, ranks))}: {n} collective kernel(s) each whose launch is not in the "
                "trace (launched before the trace's window opened, or its record lost): not matched across "
                "ranks, as which call they belong to is unknown; their device time still counts as communication"
            )
        if self.edge:
            out.append(
                f"{self.edge} collective instance(s) at the edges of the ranks' profiler windows are held by only "
                "some ranks of their process group (the windows opened or closed a few collectives apart): left out"
            )
        if self.mismatched:
            out.append(
                f"{self.mismatched} collective instance(s) differ between ranks (name or size) and were left out"
            )
        if self.p2p:
            out.append(
                f"{self.p2p} point-to-point op(s) (send, recv) not matched across ranks: each goes to one peer; "
                "their time counts as communication, and a rank's waiting at them is taken out of its lateness "
                "at the next collective (runup.p2p_wait)"
            )
        return out


def _same(a: CommOp, b: CommOp) -> bool:
    """Whether two ranks' ops can be one collective: the same name, and the same element count
    where both know it."""
    return a.name == b.name and (a.nelems is None or b.nelems is None or a.nelems == b.nelems)


def _end_scatter_us(pairs: list[tuple[CommOp, CommOp]]) -> float:
    """How far the pairs' end-time differences scatter: the median absolute deviation from
    their median (a clock offset moves every difference alike and scatters none); with two
    pairs, half their distance; with one, nothing tells (infinite)."""
    diffs = [b.end_us - a.end_us for a, b in pairs]
    if len(diffs) < 2:
        return float("inf")
    if len(diffs) == 2:
        return abs(diffs[1] - diffs[0]) / 2
    med = statistics.median(diffs)
    return statistics.median(abs(d - med) for d in diffs)


def sequence_shift(ref: Sequence[CommOp], ops: Sequence[CommOp], *, by_steps: bool) -> int:
    """The shift k that pairs `ops[j]` with `ref[j - k]`: where one group's sequences on two
    ranks line up.

    One collective's instances end together on every rank that took part (within the clock's
    noise; a clock offset moves every end alike), and have the same name and size. So:
    1. when the two sequences are as long and every pair at k = 0 agrees in name and size (and
       step, `by_steps`), k = 0 (the common case, one pass);
    2. else every k with |k| <= MAX_SHIFT whose pairs all agree in name and size (and step) is a
       candidate, scored by how its pairs' end-time differences scatter (`_end_scatter_us`);
    3. the candidate of least scatter wins, the smaller |k| on ties; none: k = 0 (the pairs
       that disagree are then left out by `match_collectives`, 3)."""

    def agree(a: CommOp, b: CommOp) -> bool:
        return _same(a, b) and (not by_steps or a.step == b.step)

    if len(ref) == len(ops) and all(agree(a, b) for a, b in zip(ref, ops)):
        return 0
    best: tuple[float, int, int] | None = None
    for k in range(-min(MAX_SHIFT, len(ref) - 1), min(MAX_SHIFT, len(ops) - 1) + 1):
        pairs = [(ref[j - k], ops[j]) for j in range(max(0, k), min(len(ops), len(ref) + k))]
        if not pairs or not all(agree(a, b) for a, b in pairs):
            continue
        score = (_end_scatter_us(pairs), abs(k), k)
        if best is None or score < best:
            best = score
    return 0 if best is None else best[2]


def _sequenced(by_rank: dict[int, list[CommOp]]) -> bool:
    """Whether a group's ops carry the trace's own sequence numbers (`CommOp.coll_seq`, Kineto's
    `Seq`) that can be trusted: on every rank, every op has one, they grow, and inside each step
    they run consecutively (a backend that counted per process, not per group, skips numbers
    where another group's collectives came between)."""
    for ops in by_rank.values():
        seqs = [c.coll_seq for c in ops]
        if any(s is None for s in seqs):
            return False
        for a, b in zip(ops, ops[1:]):
            assert a.coll_seq is not None and b.coll_seq is not None
            if b.coll_seq <= a.coll_seq or (a.step == b.step and b.coll_seq != a.coll_seq + 1):
                return False
    return True


def _keyed(by_rank: dict[int, list[CommOp]], base: tuple, *, by_steps: bool) -> dict[tuple, dict[int, CommOp]]:
    """Each op of one group (and step) keyed by its position in the reference rank's sequence
    (the rank holding the most ops, lowest on ties), the other ranks lined up with it by
    `sequence_shift`."""
    ref_rank = max(sorted(by_rank), key=lambda r: len(by_rank[r]))
    ref = by_rank[ref_rank]
    table: dict[tuple, dict[int, CommOp]] = defaultdict(dict)
    for r, ops in by_rank.items():
        k = 0 if r == ref_rank else sequence_shift(ref, ops, by_steps=by_steps)
        for j, c in enumerate(ops):
            table[(*base, j - k)][r] = c
    return table


def _matchable(traces: list[RankTrace], per_step: bool, left: _Left) -> dict[str, dict[int, list[CommOp]]]:
    """`match_collectives`' step 1: the ops that can be matched, per group and rank in time order;
    what is left out is counted in `left`."""
    groups: dict[str, dict[int, list[CommOp]]] = defaultdict(lambda: defaultdict(list))
    before = left.before_window = {}
    for t in traces:
        if t.unnamed_groups:
            continue  # its collectives carry no group in a job of several: none can be matched
        for c in t.comms:
            if c.pg in UNMATCHED:  # no group args: which ranks it works with is unknown
                continue
            if c.name in POINT_TO_POINT:
                left.p2p += 1
            elif not c.launched:
                before[t.rank] = before.get(t.rank, 0) + 1
            elif c.step is not None or not per_step:
                groups[c.pg][t.rank].append(c)
    return groups


def _group_keys(
    pg: str, by_rank: dict[int, list[CommOp]], per_step: bool
) -> tuple[dict[tuple, dict[int, CommOp]], dict[tuple, frozenset[int]]]:
    """`match_collectives`' step 2 for one group: its ops by key, and each key's holders (the
    ranks that hold ops of its group, in its step where keys are per step)."""
    if _sequenced(by_rank):
        table: dict[tuple, dict[int, CommOp]] = defaultdict(dict)
        for r, ops in by_rank.items():
            for c in ops:
                table[(pg, "seq", c.coll_seq)][r] = c
        return table, dict.fromkeys(table, frozenset(by_rank))
    if not per_step:
        keyed = _keyed(by_rank, (pg,), by_steps=False)
        return keyed, dict.fromkeys(keyed, frozenset(by_rank))
    by_step: dict[int | None, dict[int, list[CommOp]]] = defaultdict(dict)
    for r, ops in by_rank.items():
        for c in ops:
            by_step[c.step].setdefault(r, []).append(c)
    table, holders = {}, {}
    for st, seqs in by_step.items():
        keyed = _keyed(seqs, (pg, st), by_steps=True)
        table.update(keyed)
        holders.update(dict.fromkeys(keyed, frozenset(seqs)))
    return table, holders


def match_collectives(traces: list[RankTrace]) -> tuple[list[Instance], list[str]]:
    """Match each collective instance across ranks.

    1. the ops that can be matched, per process group and rank in time order: not those of
       libraries whose kernels carry no group (comm_kernels.UNMATCHED), not point-to-point ones
       (`POINT_TO_POINT`: each goes to one peer), not those of a rank whose collectives carry no
       group in a job of several groups (`RankTrace.unnamed_groups`), and not kernels launched
       before the rank's profiler window opened (`CommOp.launched` False: the tail of a step the
       window holds only in part);
    2. keys: where a group's ops carry the trace's sequence numbers (`_sequenced`), (group,
       `Seq`); else, when every trace has ProfilerStep markers, per (group, step of the op's
       launch) the ranks' sequences lined up by `sequence_shift` (names, sizes and end times
       agree), keyed (group, step, position); else the same over each group's whole sequence;
    3. an instance is the ops sharing a key, on at least two ranks; one that a rank holding ops
       of that group (in that step) lacks is at a window's edge and is left out, counted;
    4. instances whose ranks disagree on the collective's name (or element count, where known)
       are left out and counted in a warning: the order has diverged there.
    """
    per_step = all(t.steps_source == "ProfilerStep" for t in traces)
    left = _Left()
    instances: list[Instance] = []
    for pg, by_rank in _matchable(traces, per_step, left).items():
        table, holders = _group_keys(pg, by_rank, per_step)
        for key, members in table.items():
            held = len(holders.get(key, ()))
            if len(members) < 2 or len(members) < held:
                left.edge += held > 1
                continue
            if (
                len({c.name for c in members.values()}) > 1
                or len({c.nelems for c in members.values() if c.nelems is not None}) > 1
            ):
                left.mismatched += 1
                continue
            first = members[min(members)]
            step = key[1] if per_step and key[1] != "seq" else first.step
            instances.append(Instance(key=key, name=first.name, pg=first.pg, step=step, ops=members))
    instances.sort(key=lambda i: min(c.start_us for c in i.ops.values()))
    return instances, left.warnings()
