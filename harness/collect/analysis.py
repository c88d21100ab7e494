"""The collector's pipeline over one run's parsed traces: align, match, stragglers, overlap."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.collect.discover import RunSet
from harness.collect.model import RankTrace
from harness.collect.overlap import Gap, StepOverlap, rank_overlap
from harness.collect.stragglers import (ClockOffset, Instance, StragglerResult, Thresholds, analyze_stragglers,
                                        estimate_offsets, match_collectives)


@dataclass
class Analysis:
    runset: RunSet
    traces: list[RankTrace]  # on aligned clocks
    offsets: dict[int, ClockOffset]
    aligned: bool
    instances: list[Instance]
    stragglers: StragglerResult
    overlap: list[StepOverlap]
    gaps: list[Gap]
    warnings: list[str] = field(default_factory=list)


def select_steps(trace: RankTrace, keep: set[int]) -> RankTrace:
    """Only the steps in `keep`, with the communication and compute that belong to them."""
    return replace(trace, steps=[s for s in trace.steps if s.number in keep],
                   comms=[c for c in trace.comms if c.step in keep], compute=[b for b in trace.compute if b[2] in keep])


def analyze(runset: RunSet, *, align: bool = True, thresholds: Thresholds | None = None,
            steps: set[int] | None = None) -> Analysis:
    """1. put every rank on the earliest rank's time origin (baseTimeNanoseconds may differ);
    2. keep the requested steps; 3. match collectives across ranks; 4. estimate clock offsets
    (or zeros with `align=False`); 5. stragglers on aligned arrivals; 6. overlap per rank/step
    on aligned clocks."""
    warnings = list(runset.warnings)
    base = min(t.base_us for t in runset.ranks)
    traces = [t.shifted(base - t.base_us) if t.base_us != base else t for t in runset.ranks]
    if steps is not None:
        traces = [select_steps(t, steps) for t in traces]
        if not any(t.steps for t in traces):
            warnings.append(f"none of the requested steps {sorted(steps)} are in the traces")
    for t in traces:
        warnings.extend(t.warnings)
    instances, match_warnings = match_collectives(traces)
    warnings.extend(match_warnings)
    ranks = [t.rank for t in traces]
    if align and instances:
        offsets = estimate_offsets(instances, ranks)
        for r, o in offsets.items():
            if o.samples == 0 and r != min(ranks):
                warnings.append(f"rank {r} shares no collective with rank {min(ranks)}: its clock is not aligned")
    else:
        offsets = {r: ClockOffset(rank=r, offset_us=0.0, spread_us=0.0, samples=0) for r in ranks}
        if align and len(ranks) > 1:
            warnings.append("no collective matched across ranks: clocks not aligned, no straggler analysis possible")
    result = analyze_stragglers(traces, instances, offsets, thresholds)
    aligned = [t.shifted(offsets[t.rank].offset_us) for t in traces]
    rows: list[StepOverlap] = []
    gaps: list[Gap] = []
    for t in aligned:
        r, g = rank_overlap(t)
        rows.extend(r)
        gaps.extend(g)
    return Analysis(runset=runset, traces=aligned, offsets=offsets, aligned=align and bool(instances),
                    instances=instances, stragglers=result, overlap=rows, gaps=gaps, warnings=warnings)
