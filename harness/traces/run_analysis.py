"""The collector's pipeline over one run's parsed traces: align, match, stragglers, overlap."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from harness.traces.align.clocks import ClockOffset, HostClock, clock_domain, disagreeing_clocks, estimate_offsets
from harness.traces.align.matching import Instance, match_collectives
from harness.traces.align.waits import InstanceWaits, instance_waits, instances_by_rank, op_waits
from harness.traces.analyse.gpu_health import GpuReading, gpu_findings
from harness.traces.analyse.noise import noise_model
from harness.traces.analyse.overlap import Gap, LongestGaps, StepOverlap, rank_overlap
from harness.traces.analyse.runq import RunQueueLog
from harness.traces.analyse.stragglers import StragglerResult, Thresholds, analyze_stragglers
from harness.traces.model import CommOp, RankTrace
from harness.traces.read.compact import EMPTY
from harness.traces.read.discover import RunSet, number_ranges
from harness.traces.read.parse import NO_KERNELS, STUB_NOTE


class NoStepsError(ValueError):
    """--steps named no step the traces hold."""


@dataclass
class Analysis:
    runset: RunSet
    traces: list[RankTrace]  # on aligned clocks
    offsets: dict[int, ClockOffset]
    host_clocks: list[HostClock]
    aligned: bool
    instances: list[Instance]  # their ops on aligned clocks
    waits: list[InstanceWaits]  # one per instance, same order
    stragglers: StragglerResult
    overlap: list[StepOverlap]
    gaps: list[Gap]  # the longest (overlap.LONGEST_GAPS) over all ranks, longest first
    gaps_total: int  # the gaps of all ranks, listed or not
    warnings: list[str] = field(default_factory=list)


def select_steps(trace: RankTrace, keep: set[int]) -> RankTrace:
    """Only the steps in `keep` (their compute folded into them), with the communication they
    launched; a collective another step launched that runs inside a kept step's span stays
    too, with no step (the span's busy time holds it: its parts add up only with it), so that it
    is matched with nothing."""
    spans = [(s.cover.lo_us, s.cover.hi_us) for s in trace.steps if s.number in keep and s.cover is not None]

    def inside(c: CommOp) -> bool:
        return any(c.start_us < hi and c.end_us > lo for lo, hi in spans)

    comms = [c if c.step in keep else replace(c, step=None) for c in trace.comms if c.step in keep or inside(c)]
    return replace(trace, steps=[s for s in trace.steps if s.number in keep], comms=comms)


def trace_warnings(traces: list[RankTrace]) -> list[str]:
    """Every trace's warnings, in rank order; those a whole run gets at once in one line naming
    its ranks: the no-GPU-kernels warning (parse.NO_KERNELS) and each stub step left out
    (parse.STUB_NOTE)."""
    out: list[str] = []
    ranks: list[int] = []
    stubs: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for t in sorted(traces, key=lambda t: t.rank):
        for w in t.warnings:
            if w.endswith(NO_KERNELS):
                ranks.append(t.rank)
            elif w.endswith(STUB_NOTE):
                stubs[int(w.split()[1])].append((t.rank, w))
            else:
                out.append(w)
    if len(ranks) > 1:
        out.insert(0, f"rank(s) {number_ranges(ranks)}: {NO_KERNELS}")
    elif ranks:
        out.insert(0, next(w for t in traces for w in t.warnings if w.endswith(NO_KERNELS)))
    for number, held in sorted(stubs.items()):
        out.append(
            f"rank {held[0][0]}: {held[0][1]}"
            if len(held) == 1
            else f"rank(s) {number_ranges([r for r, _ in held])}: step {number} {STUB_NOTE}"
        )
    return out


@dataclass
class Alignment:
    """The first half of `analyze`: the ranks on one clock, before anything is measured on it."""

    traces: list[RankTrace]  # on aligned clocks, the requested steps only
    offsets: dict[int, ClockOffset]  # what each rank was shifted by after the common epoch
    host_clocks: list[HostClock]
    aligned: bool  # False: no alignment asked for, or no collective to align on
    warnings: list[str]


def align_ranks(runset: RunSet, *, align: bool = True, steps: set[int] | None = None) -> Alignment:
    """1. put every rank on the earliest rank's time origin (baseTimeNanoseconds may differ);
    2. keep the requested steps (NoStepsError when none of them is in the traces); 3. match
    collectives across ranks; 4. estimate one clock offset per host (or zeros with
    `align=False`) and shift every rank by its host's; a rank whose collectives cannot have
    happened on its host-mates' clock (clocks.disagreeing_clocks) gets its own, said in a warning."""
    warnings = list(runset.warnings)
    base = min(t.base_us for t in runset.ranks)
    traces = [t.shifted(base - t.base_us) if t.base_us != base else t for t in runset.ranks]
    if steps is not None:
        held = sorted({s.number for t in traces for s in t.steps})
        if not set(held) & steps:
            raise NoStepsError(
                f"none of the requested steps ({number_ranges(list(steps))}) is in the traces, which hold "
                f"steps {number_ranges(held) or 'none'}: pick steps from those"
            )
        traces = [select_steps(t, steps) for t in traces]
    warnings.extend(trace_warnings(traces))
    instances, match_warnings = match_collectives(traces)
    warnings.extend(match_warnings)
    if align and instances:
        off = disagreeing_clocks(instances, traces, noise_model(t.device for t in traces))
        for r, gap in off.items():
            host = next(t.host for t in traces if t.rank == r)
            warnings.append(
                f"rank {r} on {host}: its collectives end a steady {abs(gap) / 1e3:.3f} ms "
                f"{'after' if gap > 0 else 'before'} its host-mates', which on one clock they cannot (a "
                "collective ends together on every rank): aligned on a clock of its own"
            )
        offsets, clocks = estimate_offsets(instances, traces, frozenset(off))
        for c in clocks[1:]:
            if c.samples == 0:
                warnings.append(
                    f"host {c.host} (rank(s) {', '.join(map(str, c.ranks))}) shares no collective with "
                    f"the reference host {clocks[0].host}, directly or through other hosts: its clock, and "
                    "those of the hosts aligned to it, are not aligned with the reference's (their ranks "
                    "are compared only with each other)"
                )
    else:
        _, clocks = estimate_offsets([], traces)
        offsets = {
            t.rank: ClockOffset(rank=t.rank, offset_us=0.0, spread_us=0.0, samples=0, clock=clock_domain(t))
            for t in traces
        }
    aligned = [t.shifted(offsets[t.rank].offset_us) if offsets[t.rank].offset_us else t for t in traces]
    return Alignment(
        traces=aligned, offsets=offsets, host_clocks=clocks, aligned=align and bool(instances), warnings=warnings
    )


def analyze_aligned(
    runset: RunSet,
    alignment: Alignment,
    thresholds: Thresholds | None = None,
    *,
    release: bool = False,
    runq: Mapping[int, RunQueueLog] | None = None,
    gpu: Mapping[int, Mapping[int, GpuReading]] | None = None,
) -> Analysis:
    """The second half of `analyze`, on `align_ranks`' traces: 5. match collectives again on the
    aligned clocks (matching keys hold no time, so the instances are the same as in step 3, their
    ops now on aligned clocks) and each one's waits; 6. overlap per rank/step, exposed
    communication split into waiting and transfer, of its gaps only the longest kept;
    7. stragglers (on CPU with each rank's wait for a core beside it, where `runq` has it from the step
    logs: memory.RankLog.runq); on GPU, where `gpu` has NVML readings (memory.RankLog.gpu), each
    straggler's GPU against its peers' over the analysed steps (gpu_health.gpu_findings).

    With `release`, what only this function reads goes as soon as it is read: each rank's step
    covers after its step 6, the collectives' run-ups after step 7 (the most a parsed rank
    holds; the report, timeline and merged trace read neither)."""
    aligned, offsets, warnings = alignment.traces, alignment.offsets, list(alignment.warnings)
    instances, _ = match_collectives(aligned)
    waits = instance_waits(instances)
    taking_part = instances_by_rank(waits)
    rows: list[StepOverlap] = []
    gaps = LongestGaps()
    # each step's length on its device's own timeline, read before `release` drops the covers
    step_span_ms = {
        t.rank: [(s.cover.window_us if s.cover is not None else s.dur_us) / 1e3 for s in t.steps] for t in aligned
    }
    # and its bounds there, which the replay starts and ends each rank's step at
    step_bounds_us = {
        t.rank: {s.number: (s.cover.lo_us, s.cover.hi_us) for s in t.steps if s.cover is not None} for t in aligned
    }
    for t in aligned:
        r, g = rank_overlap(t, op_waits(t.rank, taking_part.get(t.rank, [])))
        rows.extend(r)
        gaps.add(g)
        if release:
            for s in t.steps:
                s.cover = None
    result = analyze_stragglers(aligned, waits, offsets, step_span_ms, thresholds, runq, step_bounds_us)
    if gpu:
        analysed = {t.rank: {s.number for s in t.steps if s.number is not None} for t in aligned}
        found = gpu_findings([b.rank for b in result.stragglers], gpu, analysed)
        for b in result.ranks:
            b.gpu = found.get(b.rank)
    if result.reason and len(aligned) > 1:
        warnings.append(f"no straggler analysis: {result.reason}")
    warnings.extend(result.notes)
    if release:
        for t in aligned:
            for c in t.comms:
                c.run_up_us = EMPTY
    return Analysis(
        runset=runset,
        traces=aligned,
        offsets=offsets,
        host_clocks=alignment.host_clocks,
        aligned=alignment.aligned,
        instances=instances,
        waits=waits,
        stragglers=result,
        overlap=rows,
        gaps=gaps.gaps,
        gaps_total=gaps.total,
        warnings=warnings,
    )


def analyze(
    runset: RunSet,
    *,
    align: bool = True,
    thresholds: Thresholds | None = None,
    steps: set[int] | None = None,
    runq: Mapping[int, RunQueueLog] | None = None,
) -> Analysis:
    """`align_ranks` (steps 1-4: common epoch, requested steps, matching, clock offsets) then
    `analyze_aligned` (steps 5-7: waits, overlap, stragglers); the collector's command runs the
    two apart: the merged trace is started between them and written while the second runs."""
    return analyze_aligned(runset, align_ranks(runset, align=align, steps=steps), thresholds, runq=runq)
