"""Collective matching across ranks: which ops of different ranks are one collective instance."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from harness.collect.model import CommOp, RankTrace
from harness.collect.read.comm_kernels import POINT_TO_POINT, UNMATCHED


@dataclass(kw_only=True)
class Instance:
    """One collective instance, matched across the ranks that took part."""

    key: tuple
    name: str
    pg: str
    step: int | None
    ops: dict[int, CommOp]  # rank -> that rank's op


def match_collectives(traces: list[RankTrace]) -> tuple[list[Instance], list[str]]:
    """Match each collective instance across ranks.

    1. key every op (but those of libraries whose kernels carry no group, comm_kernels.UNMATCHED,
       point-to-point ones, `POINT_TO_POINT`, and those of a rank whose collectives carry none
       in a job of several groups, `RankTrace.unnamed_groups`)
       by (process group, step, position among that group's ops in that step) when
       every trace has ProfilerStep markers, else by (process group, position in the trace):
       per-step keys survive profiler windows that start a few ops apart on different ranks;
    2. an instance is the ops sharing a key, on at least two ranks;
    3. instances whose ranks disagree on the collective's name (or element count, where known)
       are dropped and counted in a warning: the order has diverged there.
    """
    per_step = all(t.steps_source == "ProfilerStep" for t in traces)
    table: dict[tuple, dict[int, CommOp]] = defaultdict(dict)
    p2p = 0
    for t in traces:
        if t.unnamed_groups:
            continue  # its collectives carry no group in a job of several: none can be matched
        pos: dict[tuple, int] = defaultdict(int)
        for c in t.comms:
            if c.pg in UNMATCHED:  # no group args: which ranks it works with is unknown
                continue
            if c.name in POINT_TO_POINT:
                p2p += 1
                continue
            key: tuple
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
        instances.append(
            Instance(key=key, name=any_op.name, pg=any_op.pg, step=key[1] if per_step else any_op.step, ops=ops)
        )
    instances.sort(key=lambda i: min(c.start_us for c in i.ops.values()))
    warnings = (
        [f"{mismatched} collective instance(s) differ between ranks (name or size) and were left out"]
        if mismatched
        else []
    )
    if p2p:
        warnings.append(
            f"{p2p} point-to-point op(s) (send, recv) not matched across ranks: each goes to one peer; "
            "their time counts as communication, and a rank's waiting at them is taken out of its lateness "
            "at the next collective (runup.p2p_wait)"
        )
    return instances, warnings
