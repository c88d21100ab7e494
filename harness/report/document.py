"""Turn an `Analysis` into report.json's records (records.py `Report`): the verdict, its headline
and the next steps in words.

`build_report` is pure (Analysis -> Report); the pipeline completes the report with the Flight
Recorder's findings (hang_report.py), the merged trace, the window and the live watch
(watch_verdict.py), and the writers only format it. Every part and field of report.json is a
record field with its docstring (docs/report-schema.md).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.report.floor import TELL_BY_WINDOWS, floor_record, floor_step
from harness.report.records import (
    SCHEMA_VERSION,
    ClockHostRecord,
    ClockRecord,
    CollectivesRecord,
    CollectiveStatRecord,
    GpuRecord,
    HostRecord,
    NextStepRecord,
    ProcessGroupRecord,
    RankRecord,
    Report,
    RunRecord,
    SkippedWindowRecord,
    StepRecord,
    StragglerRecord,
)
from harness.traces.analyse.advisor import Diagnosis, advice_for, diagnose, diagnosis_line
from harness.traces.analyse.collective_stats import collective_stats, process_groups
from harness.traces.analyse.gpu_health import GpuFinding
from harness.traces.analyse.memory import MemoryResult, MemoryTimeline, finding_text
from harness.traces.analyse.rank_list import ranks_listed, ranks_phrase
from harness.traces.analyse.replay import REPLAY_FIDELITY
from harness.traces.analyse.stragglers import OUTSIDE_RANGES, UNNAMED_GROUPS_REASON
from harness.traces.read.phases import is_data
from harness.traces.run_analysis import Analysis

ADVICE = {
    "data": "its input pipeline is slow: more DataLoader workers (num_workers; the lab: --num-workers), "
    "persistent workers, pinned memory, or move preprocessing offline; check its disk/network for input files",
    "h2d": "its host-to-device copies are slow: pin memory and copy with non_blocking=True; "
    "check the PCIe/NUMA placement of that GPU",
    "forward": "its forward pass is slow: compare its hardware (clocks, thermals, other tenants), "
    "and its input sizes if they vary",
    "loss": "its loss computation is slow: look for host syncs or data-dependent work in the loss",
    "backward": "its backward pass is slow: compare its hardware (clocks, thermals, other tenants), "
    "and activation checkpointing settings",
    "optimizer": "its optimizer step is slow: use a fused/foreach optimizer; check for per-parameter host work",
}


def _ms(us: float) -> float:
    return round(us / 1e3, 6)


def bytes_to_mb(b: float | None) -> float | None:
    """Bytes as MB (10^6), 3 decimals; None stays None."""
    return None if b is None else round(b / 1e6, 3)


MEMORY_RANK_KEYS = (
    "peak_rss_bytes",
    "rss_growth_bytes_per_step",
    "peak_gpu_allocated_bytes",
    "peak_gpu_reserved_bytes",
    "gpu_growth_bytes_per_step",
)


def build_report(
    a: Analysis,
    inputs: list[str],
    memory: MemoryResult | None = None,
    memory_timelines: list[MemoryTimeline] | None = None,
) -> Report:
    """report.json's document as records; `memory` (memory.py, from the step logs) adds the memory
    findings and columns, `memory_timelines` the links to torch's memory timelines."""
    res = a.stragglers
    mem_ranks = memory.ranks if memory else {}
    mem_logs = memory.logs.ranks if memory else {}
    by_rank = {t.rank: t for t in a.traces}
    agg: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in a.overlap:
        for k in (
            "compute_us",
            "comm_us",
            "overlapped_comm_us",
            "exposed_comm_us",
            "exposed_wait_us",
            "exposed_transfer_us",
            "memcpy_us",
            "idle_us",
        ):
            agg[row.rank][k] += getattr(row, k)
    blames = {r.rank: r for r in res.ranks}
    ranks: list[RankRecord] = []
    for t in a.traces:
        o, b, g = a.offsets[t.rank], blames[t.rank], agg[t.rank]
        mem = mem_ranks.get(t.rank, {})
        ranks.append(
            RankRecord(
                rank=t.rank,
                host=t.host,
                steps=len(t.steps),
                mean_step_ms=b.mean_step_ms,
                compute_ms=_ms(g["compute_us"]),
                comm_ms=_ms(g["comm_us"]),
                overlapped_comm_ms=_ms(g["overlapped_comm_us"]),
                exposed_comm_ms=_ms(g["exposed_comm_us"]),
                exposed_wait_ms=_ms(g["exposed_wait_us"]),
                exposed_transfer_ms=_ms(g["exposed_transfer_us"]),
                memcpy_ms=_ms(g["memcpy_us"]),
                idle_ms=_ms(g["idle_us"]),
                wait_ms=b.wait_ms,
                blame_ms=b.blame_ms,
                late_ms=round(b.late_ms, 6),
                beyond_peers_ms=round(b.beyond_peers_ms, 6),
                core_wait_ms=None if b.core_wait_ms is None else round(b.core_wait_ms, 6),
                cost_ms=round(b.cost_ms, 6),
                late_fraction=b.late_fraction,
                last_fraction=b.last_fraction,
                waits_for=b.waits_for,
                clock_offset_ms=_ms(o.offset_us),
                clock_spread_ms=_ms(o.spread_us),
                clock_samples=o.samples,
                **{k: mem.get(k) for k in MEMORY_RANK_KEYS},
            )
        )
    stragglers = [
        StragglerRecord(
            rank=s.rank,
            host=s.host,
            phase=s.phase,
            phase_excess_ms=s.phase_excess_ms,
            late_ms=round(s.late_ms, 6),
            beyond_peers_ms=round(s.beyond_peers_ms, 6),
            core_wait_ms=None if s.core_wait_ms is None else round(s.core_wait_ms, 6),
            cost_ms=round(s.cost_ms, 6),
            blame_ms=s.blame_ms,
            wait_ms=s.wait_ms,
            late_fraction=round(s.late_fraction, 4),
            steps_late=s.steps_late,
            steps=s.steps,
            pattern=s.pattern,
            last_fraction=s.last_fraction,
            whatif_step_ms=s.whatif_step_ms,
            mean_step_ms=s.mean_step_ms,
            syncs=s.syncs,
            gpu=None if s.gpu is None else _gpu_record(s.gpu),
        )
        for s in res.stragglers
    ]
    hosts: dict[str, HostRecord] = {}
    for r in res.ranks:
        h = hosts.setdefault(r.host, HostRecord(host=r.host, ranks=[], blame_ms=0.0, wait_ms=0.0, stragglers=[]))
        h.ranks.append(r.rank)
        h.blame_ms += r.blame_ms
        h.wait_ms += r.wait_ms
        if r.straggler:
            h.stragglers.append(r.rank)
    step_rows = []
    step_dur = {(t.rank, s.number): s.dur_us for t in a.traces for s in t.steps}
    for row in sorted(a.overlap, key=lambda r: (r.rank, r.step)):
        logged = mem_logs[row.rank].steps.get(row.step, {}) if row.rank in mem_logs else {}
        step_rows.append(
            StepRecord(
                rank=row.rank,
                step=row.step,
                step_ms=_ms(row.window_us),
                host_step_ms=_ms(step_dur.get((row.rank, row.step), row.window_us)),
                wait_ms=_ms(res.step_wait.get(row.step, {}).get(row.rank, 0.0)),
                blame_ms=_ms(res.step_blame.get(row.step, {}).get(row.rank, 0.0)),
                exposed_comm_ms=_ms(row.exposed_comm_us),
                exposed_wait_ms=_ms(row.exposed_wait_us),
                exposed_transfer_ms=_ms(row.exposed_transfer_us),
                compute_ms=_ms(row.compute_us),
                comm_ms=_ms(row.comm_us),
                memcpy_ms=_ms(row.memcpy_us),
                idle_ms=_ms(row.idle_us),
                last_arriver=res.step_last.get(row.step) == row.rank,
                rss_mb=bytes_to_mb(logged.get("rss_bytes")),
                gpu_allocated_mb=bytes_to_mb(logged.get("gpu_peak_allocated_bytes")),
            )
        )
    present = sorted(by_rank)
    diagnoses = diagnose(a)
    all_steps = sorted({s.number for t in a.traces for s in t.steps})
    timed = [r.mean_step_ms for r in ranks if r.mean_step_ms is not None]
    report = Report(
        schema_version=SCHEMA_VERSION,
        inputs=inputs,
        input_dirs=sorted({str(Path(p).parent.resolve()) for t in a.runset.ranks for p in t.paths}),
        verdict=res.verdict,
        verdict_reason=res.reason,
        headline=headline(res.verdict, stragglers, a.runset.missing, a.runset.ending, res.reason),
        run=RunRecord(
            run_id=a.runset.run_id,
            world_size=a.runset.world_size,
            ranks_present=present,
            ranks_missing=a.runset.missing,
            complete=not a.runset.missing and not a.runset.ending,
            ending=a.runset.ending,
            skipped_windows=[SkippedWindowRecord(**w) for w in a.runset.skipped_windows],
            hosts=sorted(hosts),
            device="gpu" if any(t.device == "gpu" for t in a.traces) else "cpu",
            steps_source=sorted({t.steps_source for t in a.traces}),
            steps=all_steps,
            median_step_ms=statistics.median(timed) if timed else None,
            replayed_step_ms=res.replayed_step_ms,
            measured_step_ms=res.measured_step_ms,
            replay_faithful=res.replay_faithful,
            whatif_all_fixed_step_ms=res.whatif_all_fixed_step_ms,
        ),
        stragglers=stragglers,
        diagnosis=diagnoses,
        diagnosis_summary=diagnosis_line(diagnoses),
        ranks=ranks,
        hosts=list(hosts.values()),
        steps=step_rows,
        gaps=a.gaps,
        gaps_total=a.gaps_total,
        process_groups=[ProcessGroupRecord(**g) for g in process_groups(a.waits, a.overlap)],
        collective_stats=[CollectiveStatRecord(**c) for c in collective_stats(a.waits)],
        collectives=CollectivesRecord(matched=len(a.instances), by_name=dict(Counter(i.name for i in a.instances))),
        clock=ClockRecord(
            aligned=a.aligned,
            reference_rank=min(present) if present else None,
            reference_host=a.host_clocks[0].host if a.host_clocks else None,
            hosts=[
                ClockHostRecord(
                    host=c.host,
                    ranks=c.ranks,
                    offset_ms=_ms(c.offset_us),
                    spread_ms=_ms(c.spread_us),
                    samples=c.samples,
                    via=c.via,
                )
                for c in a.host_clocks
            ],
        ),
        memory_findings=memory.findings if memory else [],
        memory_steps=memory.steps if memory else [],
        memory_timelines=memory_timelines or [],
        threshold_ms=res.threshold_ms,
        bounds_ms=res.bounds_ms,
        noise_floor=floor_record(res),
        warnings=a.warnings,
        next_steps=[],
    )
    report.next_steps = next_steps(report)
    return report


def _phase_words(p: str | None, many: bool = False) -> str:
    """What a straggler (`many`: several alike) is slow in, in words."""
    if not p:
        return ""
    if p.startswith("op:"):
        return f"{'spend' if many else 'spends'} longer in {p[3:]}"
    if p.startswith("idle"):
        return "their devices sit idle waiting on their hosts" if many else "its device sits idle waiting on its host"
    if p == OUTSIDE_RANGES:
        return f"in code outside {'their' if many else 'its'} profiler ranges"
    return f"in {'their' if many else 'its'} {p} phase"


def _straggler_words(s: StragglerRecord) -> str:
    """One straggler in the headline: its rank, host, pattern, phase and lateness beyond its peers
    (what the rule judged: a hold at point-to-point ops by another rank taken out)."""
    words = _phase_words(s.phase)
    return (
        f"rank {s.rank} on {s.host} is {_late_words(s)}"
        + (f" ({words})" if words else "")
        + f", {s.beyond_peers_ms:.2f} ms per step"
    )


def headline(
    verdict: str,
    stragglers: list[StragglerRecord],
    missing: list[int],
    ending: list[str] | None = None,
    reason: str | None = None,
) -> str:
    tail = f" (incomplete: {ranks_listed(missing)} missing)" if missing else ""
    if ending:
        tail += f" (the run did not finish: {ending[1] if len(ending) > 1 else ending[0]})"
    if verdict == "inconclusive":
        return f"inconclusive: {reason}" + tail
    if verdict == "balanced":
        return "balanced: no rank keeps the others waiting beyond the noise" + tail
    if len(stragglers) <= LISTED:
        return "straggler: " + "; ".join(_straggler_words(s) for s in stragglers) + tail
    parts = []
    for group in _straggler_groups(stragglers, lambda s: (_late_words(s), s.phase or "")):
        if len(group) == 1:
            parts.append(_straggler_words(group[0]))
            continue
        words = _phase_words(group[0].phase, many=True)
        hosts = len({s.host for s in group})
        figures = sorted(s.beyond_peers_ms for s in group)
        parts.append(
            f"{ranks_phrase([s.rank for s in group])} on {hosts} host{'s' if hosts > 1 else ''} are "
            f"{_late_words(group[0])}" + (f" ({words})" if words else "") + f", {_range_ms(figures)} ms per step"
        )
    return "straggler: " + "; ".join(parts) + tail


# Stragglers are named one by one (verdict, next steps) up to this many; beyond, those alike (the
# same phase, the same pattern) are named together (a 1024-rank job with one slow rank per host
# has 128, which would be 128 lines of the same advice): four ranks with their host and figure are
# about two terminal lines.
LISTED = 4


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _late_words(s: StragglerRecord) -> str:
    return f"late in {s.steps_late} of {s.steps} steps" if s.pattern == "intermittent" else "late"


def _range_ms(sorted_ms: list[float]) -> str:
    lo, hi = f"{sorted_ms[0]:.2f}", f"{sorted_ms[-1]:.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _straggler_groups(stragglers: list[StragglerRecord], key: Any) -> list[list[StragglerRecord]]:
    """The stragglers grouped by `key`, groups in the order of their first member (stragglers
    come latest first), members in that order."""
    groups: dict[Any, list[StragglerRecord]] = {}
    for s in stragglers:
        groups.setdefault(key(s), []).append(s)
    return list(groups.values())


def _gpu_record(g: GpuFinding) -> GpuRecord:
    return GpuRecord(
        sm_clock_mhz=g.sm_clock_mhz,
        peer_sm_clock_mhz=g.peer_sm_clock_mhz,
        throttle=list(g.throttle),
        temp_c=g.temp_c,
        peer_temp_c=g.peer_temp_c,
        text=g.text,
    )


def _slower_gpu(s: StragglerRecord) -> str:
    """'' unless the straggler's GPU ran slower than its peers' (`gpu`): then that sentence, and
    what to do about it, before its phase's advice."""
    gpu = s.gpu
    if not gpu:
        return ""
    act = (
        "check its cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER)"
        if gpu.throttle
        else "check its clock settings (nvidia-smi -q -d CLOCK) and whether its part is its peers'"
    )
    return f"{gpu.text}: {act}. Besides, "


def _held_off_cores(s: StragglerRecord, peers_core_ms: float | None) -> str:
    """'' unless the straggler's wait for a core (CPU ranks with step logs: runq.py) beyond its
    peers' is at least half its lateness beyond theirs: then the words that say other work on its
    cores made it late (the report names it either way: a rank held off its cores is late)."""
    core, beyond = s.core_wait_ms, s.beyond_peers_ms or 0.0
    if core is None or peers_core_ms is None or beyond <= 0 or core - peers_core_ms < beyond / 2:
        return ""
    return (
        f"it waited {core:.2f} ms a step for a core ({core - peers_core_ms:.2f} ms more than its peers): other "
        "work shares its cores (other ranks, data-loader workers, other jobs on the host); give each rank cores "
        "of its own (fewer ranks or workers per host, taskset or numactl). Besides, "
    )


def _straggler_advice(s: StragglerRecord, peers_core_ms: float | None = None) -> str:
    """What to do about one straggler, whichever rank it is: its wait for a core where that made
    it late (`_held_off_cores`), its phase's advice, its pattern's."""
    phase = s.phase or ""
    if s.syncs:
        callers = ", ".join(f"{k} {c:.1f} per step ({ms:.2f} ms of device idle)" for k, (c, ms) in s.syncs.items())
        text = (
            f"its host-device syncs made it late ({callers}): keep values on the device, log them every N "
            "steps, copy with non_blocking=True from pinned memory."
        )
    elif phase in ADVICE or is_data(phase):
        text = f"{ADVICE[phase if phase in ADVICE else 'data']}."
    elif phase == OUTSIDE_RANGES:
        text = (
            "it is slow in code outside its profiler ranges: wrap more of its step in record_function ranges "
            "to see where, and look at its host side (Python overhead, CPU contention, syncs)."
        )
    elif phase.startswith("idle"):
        text = (
            "its device idles before collectives while its host is busy: look at that rank's "
            "host side (input pipeline, Python overhead, CPU contention, syncs)."
        )
    elif phase:
        text = (
            f"it spends longer in `{phase[3:] if phase.startswith('op:') else phase}` than its "
            "peers: check its inputs (uneven shapes/load) and its hardware."
        )
    else:
        text = "the others wait for it; compare its hardware and inputs with its peers'."
    text = _slower_gpu(s) + _held_off_cores(s, peers_core_ms) + text
    if s.pattern == "intermittent":
        text += (
            f" It is late in {s.steps_late} of {s.steps} steps only: look for what those steps do "
            f"differently (periodic work, uneven batches, a neighbour's load). To tell it from noise, {TELL_BY_WINDOWS}"
        )
    return text


def _straggler_step(group: list[StragglerRecord], run: RunRecord, peers_core_ms: float | None = None) -> str:
    """The next step for stragglers alike (one, or several with the same advice): the advice, and
    the step replayed with each one fixed alone."""
    if len(group) == 1:
        text = f"Rank {group[0].rank}: {_straggler_advice(group[0], peers_core_ms)}"
    else:
        text = f"{_cap(ranks_phrase([s.rank for s in group]))}, each: {_straggler_advice(group[0], peers_core_ms)}"
    whatif = sorted(s.whatif_step_ms for s in group if s.whatif_step_ms is not None)
    if whatif and run.replayed_step_ms and not run.replay_faithful:
        base, measured = run.replayed_step_ms, run.measured_step_ms or run.median_step_ms
        shares = sorted(round(100 * (1 - w / base)) for w in whatif)
        share = f"{shares[0]}%" if shares[0] == shares[-1] else f"{shares[0]}-{shares[-1]}%"
        fixed = "Fixed" if len(group) == 1 else "Fixed one at a time"
        text += (
            f" {fixed}, the replayed step would be ~{share} shorter; the replay does not reproduce this "
            f"run's step (~{base:.2f} ms replayed against {measured:.2f} ms measured, more than "
            f"{round(100 * REPLAY_FIDELITY)}% apart), so no step time is given for the fix."
        )
    elif whatif and run.replayed_step_ms:
        now = f"{run.replayed_step_ms:.2f}"
        measured_text = f"{run.measured_step_ms or run.median_step_ms:.2f}"
        if len(group) > 1 and _range_ms(whatif) == now:
            text += f" Fixing one of them alone leaves the step at ~{now} ms (replayed; measured {measured_text} ms)."
        else:
            fixed = "Fixed" if len(group) == 1 else "Fixed one at a time"
            text += (
                f" {fixed}, the step would take ~{_range_ms(whatif)} ms instead of ~{now} "
                f"ms (both replayed; measured {measured_text} ms)."
            )
    return text


def next_steps(report: Report) -> list[NextStepRecord]:
    """What to do next, most important first: 1. why nothing could be analysed, if so;
    2. each straggler, with its phase's advice and its what-if; all of them together when
    there are several; 3. each memory finding (memory.py: growth, headroom, imbalance, cache);
    4. each bottleneck class of the other ranks (diagnosed on their own work),
    with how much of their step is waiting and on whom; 5. for a balanced verdict whose bound
    the noise sets, how small a straggler passes for noise and how to tell (floor.py)."""
    out: list[NextStepRecord] = []
    run = report.run
    if report.verdict == "inconclusive":
        reason = report.verdict_reason or ""
        advice = (
            ""
            if reason.startswith(UNNAMED_GROUPS_REASON)
            else " Collect every rank's trace over the same steps (a window that holds collectives) to compare "
            "the ranks."
        )
        out.append(
            NextStepRecord(
                about="inconclusive", ranks=run.ranks_present, text=f"No straggler analysis: {reason}.{advice}"
            )
        )
    stragglers = report.stragglers
    named = {s.rank for s in stragglers}
    peer_cores = [r.core_wait_ms for r in report.ranks if r.rank not in named and r.core_wait_ms is not None]
    peers_core_ms = statistics.median(peer_cores) if peer_cores else None
    alike = (lambda s: s.rank) if len(stragglers) <= LISTED else (lambda s: _straggler_advice(s, peers_core_ms))
    for group in _straggler_groups(stragglers, alike):
        out.append(
            NextStepRecord(
                about="straggler", ranks=[s.rank for s in group], text=_straggler_step(group, run, peers_core_ms)
            )
        )
    fixed = run.whatif_all_fixed_step_ms
    present = run.ranks_present
    if len(stragglers) > 1 and fixed is not None and run.replayed_step_ms and run.replay_faithful:
        ranks = [s.rank for s in stragglers]
        out.append(
            NextStepRecord(
                about="straggler",
                ranks=ranks,
                text=f"Fixing {ranks_phrase(ranks, present)} together would bring the step from "
                f"~{run.replayed_step_ms:.2f} ms to ~{fixed:.2f} ms (replayed).",
            )
        )
    for f in report.memory_findings:
        out.append(NextStepRecord(about="memory", ranks=[f.rank], text=finding_text(f)))
    by_kind: dict[tuple[str, str], list[Diagnosis]] = defaultdict(list)
    for d in report.diagnosis:
        if d.bottleneck != "straggler":
            by_kind[(d.bottleneck, advice_for(d.bottleneck, d.evidence))].append(d)
    for (kind, advice), ds in sorted(by_kind.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ranks = [d.rank for d in ds]
        many = len(ranks) > 1
        text = f"{_cap(ranks_phrase(ranks, present))} ({kind}, on {'their' if many else 'its'} own work): {advice}."
        waiting = sorted({r for d in ds for r, _ in d.waits_for})
        if waiting:
            share = statistics.mean(d.evidence["waiting_share"] for d in ds)
            text += (
                f" {'They spend' if many else 'It spends'} {share:.0%} of the step waiting on "
                f"{ranks_listed(waiting)}; that part goes away when those are fixed, not by tuning "
                "communication."
            )
        out.append(NextStepRecord(about=kind, ranks=ranks, text=text))
    noise = floor_step(report.noise_floor, report.verdict, report.trace_verdict)
    if noise:
        out.append(noise)
    return out


def collective_rows(a: Analysis) -> Iterator[dict[str, Any]]:
    """One row per (collective instance, rank): arrival on the aligned clock, wait, the
    instance's transfer, the rank's share of the delay of its start, the last arriver. Made
    as they are written (collectives.csv has instances x ranks rows)."""
    for w in a.waits:
        for r in sorted(w.arrival_us):
            yield {
                "instance": w.index,
                "name": w.name,
                "pg": w.instance.pg,
                "step": w.step,
                "rank": r,
                "arrival_us": round(w.arrival_us[r], 3),
                "wait_us": round(w.wait_us[r], 3),
                "transfer_us": round(w.transfer_us, 3),
                "delay_share_us": round(w.delay_us[r], 3),
                "last_rank": w.last_rank,
            }
