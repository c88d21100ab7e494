"""The live watch on the generated GPU jobs (detect/sim.py): the step records timing.py would
write on each rank's GPU, exchanged and judged every WATCH_EVERY steps as the watch judges them
(harness/train/watch_rule.WatchJudge), scored like the real runs' watch.

Step records, as timing.py's StepClock makes them on GPU:
1. each phase boundary records a CUDA event on the compute stream at the host's mark; a stream
   runs its work in order, so the event completes once the stream has done everything launched
   before the mark and the event itself has reached the device (the simulator's launch latency):
   E(T) = max(T + latency, the end of the last compute-stream op launched before T), and no
   earlier than the event before it;
2. backward ends by making the compute stream wait for the gradients' collectives (DDP: the
   reducer's finalize waits on each bucket's all-reduce; FSDP2: its final callback waits on the
   last reduce-scatter), so the backward mark's event, and every one after it, also waits for
   the step's last all-reduce or reduce-scatter launched before it (a pipeline's stage
   launches its gradients' all-reduce after its last backward pass: none);
3. phases_device_ms: each phase = the difference of consecutive events (the data phase's, the
   time the stream idled for the host's loader or ran work launched there), summed over a
   phase's occurrences in the step (a pipeline's passes, one mark at each's end); phases_ms the same
   with the data phase as the host's time in it (timing.py: blocked on the loader); step_ms =
   the end event less the start event; phases_own_device_ms: backward's own work, from its
   start event to the event the gradients-ready hook records when the host has launched the
   last gradient's kernels (harness/run/grads_ready.py), i.e. at the all-reduce's launch (DDP
   only: the watch hooks gradients under DDP);
5. FSDP: the ranks' arrivals at the collectives of forward and backward, as the watch reads them
   from NCCL's recorder (harness/watch/arrivals.py): one entry per collective, issued at its
   launch on the host, its `duration_ms` its kernel's time (its start on that rank to the end
   every rank shares), filled in once the watchdog saw it complete, WATCHDOG_POLL_US after its
   end at most (taken at that worst); a step with a collective not yet timed has its own work
   judged at once and the whole of it at a later exchange (`untimed_steps`, a group with none
   timed yet awaited for its first second, `TimingPatience`; `WatchJudge`, 2), as the live
   watch does; sends and receives are entries too, marked point-to-point (`is_p2p`);
6. a pipeline's receives and its stage's gradient all-reduce (harness/run/comm_wait.py on
   GPU): the host waits on each right after launching it, between two CUDA events on the
   compute stream: `python_waits`.
4. the host polls its clock at each step's end, right after recording the step's end event,
   then exchanges when due: a record reaches the watch at the first exchange after its end event
   completed, on its own clock. A step is never complete at its own end (its end event is still
   on its way to the device), so each exchange judges up to the step before it, as the live
   watch on a GPU does; a host running ahead of its GPU is judged later still.
Steps carry the harness's numbers (the simulator's step n is the harness's n - 1), the first
WARMUP_STEPS are not judged (`Watch.add`), and an exchange follows step s when (s + 1) %
WATCH_EVERY == 0 (`Watch.due`), all as in the real runs (detect/real.py). The exchange's
all-gather, which holds every host until the last arrives, is not simulated: it is host time at
an interval's end, of the order of the hosts' own step-to-step scatter.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from detect.real import ONSET_STEP, WARMUP_STEPS, WATCH_EVERY
from detect.score import Seen, Truth, score
from harness.traces.analyse.noise import GPU
from harness.watch.arrivals import HeldArrivals, TimingPatience, my_arrivals, untimed_steps
from harness.watch.rule import (
    COLLECTIVE_PHASES,
    WatchJudge,
    own_work_phases,
    pack_rows,
    step_row,
    table_rows,
    watch_thresholds,
)

from devicesim import RankTruth, Sim

# 25 steps (the harness's 0-24) leave three intervals after the real runs' onset.
WATCH_STEPS = 25
PHASES = ("data", "forward", "backward", "optimizer")
# ProcessGroupNCCL's watchdog looks for completed collectives every 100 ms
# (kWatchdogThreadSleepMillis) and times them then: a duration appears at most this long after
# the collective's end.
WATCHDOG_POLL_US = 100_000.0
# The watch's `parallel` for a generated job's: tensor and expert parallelism hold collectives in
# forward and backward, as FSDP does (harness/integrations/lightning.py gives Lightning's ModelParallelStrategy "fsdp").
WATCH_PARALLEL = {"ddp": "ddp", "fsdp": "fsdp", "tp": "fsdp", "hsdp": "fsdp", "ep": "fsdp", "pp": "fsdp"}
# The collectives a generated job's loop waits on from Python, which comm_wait.py times (module
# docstring, 6): a pipeline stage's gradient all-reduce after its passes (`dist.all_reduce`, as
# examples/pipeline_parallel.py and Megatron's finalize_model_grads do). DDP's all-reduces are
# its reducer's (C++) and FSDP2's collectives are waited on by stream events: none timed.
PYTHON_WAITED = {"pp": ("allreduce",)}
# what backward's end waits for (module docstring, 2): EP's last all-to-all on one host
REDUCTIONS = ("allreduce", "reduce_scatter", "alltoall")


def step_records(
    truth: RankTruth, compute_stream: int, latency_us: float, parallel: str = "ddp", waited: tuple[str, ...] = ()
) -> list[tuple[float, dict[str, Any]]]:
    """One rank's (when its end event completed, its step record) per step, under the harness's
    step number (module docstring, 1-3), from the simulator's truth (one clock for host and
    device; `latency_us`: its launch latency, an event's way to the device)."""
    compute = [op for op in truth.ops if op.stream == compute_stream]
    launched = [op.launch_us for op in compute]
    ends = [op.end_us for op in compute]

    def event_us(mark_us: float, after_us: float) -> float:
        i = bisect.bisect_left(launched, mark_us)  # a launch at the mark itself comes after it
        return max(mark_us + latency_us, ends[i - 1] if i else 0.0, after_us)

    reductions: dict[int, list[tuple[float, float]]] = {}  # step -> its reductions' (launch, end)
    for op in truth.ops:
        if op.coll in REDUCTIONS and op.step is not None:
            reductions.setdefault(op.step, []).append((op.launch_us, op.end_us))
    # the step's last reduction's launch: its gradients are all ready
    issued = {n: max(launch_us for launch_us, _ in ops) for n, ops in reductions.items()}
    comm = [op for op in truth.ops if op.coll is not None and op.pg is not None]  # in launch order
    comm_launched = [op.launch_us for op in comm]
    ranges = sorted((r for r in truth.ranges if r.name in PHASES), key=lambda r: r.start_us)
    out = []
    for step in truth.steps:
        # a phase may come back within a step (a pipeline's passes): one mark at each one's end
        inside = [r for r in ranges if step.start_us <= r.start_us and r.end_us <= step.end_us]
        marks = [event_us(step.start_us, 0.0)]
        for r in inside:
            # backward's end waits for the step's reductions launched by then (2)
            waits = max(
                (end_us for launch_us, end_us in reductions.get(step.number, ()) if launch_us < r.end_us),
                default=0.0,
            )
            marks.append(event_us(r.end_us, max(marks[-1], waits if r.name == "backward" else 0.0)))
        end = event_us(step.end_us, marks[-1])
        device_ms: dict[str, float] = {}
        phases_ms: dict[str, float] = {}
        spans: dict[str, list[int]] = {}
        for r, a, b in zip(inside, marks[:-1], marks[1:]):
            device_ms[r.name] = device_ms.get(r.name, 0.0) + (b - a) / 1e3
            host_ms = (r.end_us - r.start_us) / 1e3 if r.name == "data" else (b - a) / 1e3
            phases_ms[r.name] = phases_ms.get(r.name, 0.0) + host_ms
            spans.setdefault(r.name, []).extend((int(r.start_us * 1e3), int(r.end_us * 1e3)))
        record = {"step": step.number - 1, "step_ms": (end - marks[0]) / 1e3, "phases_ms": phases_ms}
        record["phases_device_ms"] = device_ms
        record["phases_span_ns"] = spans
        if inside:
            i, j = (bisect.bisect_left(comm_launched, t) for t in (inside[0].start_us, inside[-1].end_us))
            p2p, collective, sources, first = python_waits(truth.rank, comm[i:j], inside, event_us, waited)
        else:
            p2p, collective, sources, first = {}, {}, {}, None
        if p2p:
            record["phases_p2p_ms"] = p2p
        if collective:
            record["phases_collective_wait_ms"] = collective
        if sources:
            record["phases_recv_from"] = sources
        if first is not None:
            record["first_recv_from"] = first
        if parallel == "ddp":
            backward_at = marks[next(i for i, r in enumerate(inside) if r.name == "backward")]  # opens backward
            ready = event_us(issued[step.number], backward_at)
            record["phases_own_device_ms"] = {"backward": (ready - backward_at) / 1e3}
        out.append((end, record))
    return out


def python_waits(
    rank: int,
    comm: list[Any],
    inside: list[Any],
    event_us: Callable[[float, float], float],
    waited: tuple[str, ...] = (),
) -> tuple[dict[str, float], dict[str, float], dict[str, list[int]], int | None]:
    """A step's waits on communication per phase as comm_wait.py times them on GPU (module
    docstring, 6): at its receives and at the collectives named in `waited`; its receives'
    sources per phase; the source of its first point-to-point op where that was a receive
    (first_recv_from; None where it sent first or had none). `comm`: `rank`'s communication ops
    launched in the step's phase ranges (`inside`, not empty), in launch order; each waited on
    at once: the event before the wait completes at
    E(its launch) (`event_us`), the one after it once the op has ended too, so the stall is
    max(0, the op's end - E(its launch)); it belongs to the range open at its launch, or to the
    next one where it falls between two (the step clock counts a gap in the phase whose mark
    ends it); a receive's source from its group key ("pg:src->dst")."""
    p2p: dict[str, float] = {}
    collective: dict[str, float] = {}
    sources: dict[str, list[int]] = {}
    first: int | None = None
    seen_p2p = False
    for op in comm:
        if op.coll == "p2p":
            src, dst = (int(x) for x in op.pg.rsplit(":", 1)[1].split("->"))
            if not seen_p2p:
                seen_p2p = True
                first = src if dst == rank else None
            if dst != rank:
                continue  # a send: the compute stream does not wait for it
            into = p2p
        elif op.coll in waited:
            into, src = collective, -1
        else:
            continue
        phase = next(r.name for r in inside if op.launch_us < r.end_us)
        into[phase] = into.get(phase, 0.0) + max(op.end_us - event_us(op.launch_us, 0.0), 0.0) / 1e3
        if into is p2p and src not in sources.setdefault(phase, []):
            sources[phase].append(src)
    return p2p, collective, {phase: sorted(ranks) for phase, ranks in sources.items()}, first


def recorder(truth: RankTruth, now_us: float) -> list[dict[str, Any]]:
    """One rank's Flight Recorder entries as NCCL's recorder holds them at host time `now_us`
    (module docstring, 5): every collective it launched by then, timed once WATCHDOG_POLL_US
    after its end; its group by name, as every rank names it, and by pg_id, this rank's own
    number for it."""
    local: dict[str, int] = {}  # torch numbers only the groups this rank is in, in the order it made them
    return [
        {
            "pg_id": local.setdefault(op.pg or "0", len(local)),
            "process_group": (op.pg or "0", "undefined"),
            "collective_seq_id": op.seq,
            # NCCL stamps the entry inside the launching call, after any phase mark the host made
            # before the call: 1 ns on, where the simulator has the two at one time
            "time_created_ns": int(op.launch_us * 1e3) + 1,
            "is_p2p": op.coll == "p2p",  # NCCL's recorder marks sends and receives so
            "duration_ms": (op.end_us - op.start_us) / 1e3 if op.end_us + WATCHDOG_POLL_US <= now_us else None,
        }
        for op in truth.ops
        if op.coll is not None and op.launch_us <= now_us
    ]


def watch_flags(
    sim: Sim, hosts: dict[int, str], compute_stream: int, parallel: str = "ddp", waited: tuple[str, ...] = ()
) -> tuple[list[tuple[int, int, str | None]], int]:
    """(exchange step, rank, phase) each time the watch flags a rank anew (module docstring, 4), and the
    last step it judged (-1: none): per exchange after step s, every rank's table of its latest
    `table_rows` records past the warm-up complete by its host's end of step s, judged
    together; under FSDP with every rank's arrivals in their held phases (module docstring, 5)."""
    truths = sim.truth()
    records = [
        [
            (done, rec)
            for done, rec in step_records(t, compute_stream, sim.launch_latency_us, parallel, waited)
            if rec["step"] >= WARMUP_STEPS
        ]
        for t in truths
    ]
    held_phases = COLLECTIVE_PHASES[parallel]
    rows = table_rows(WATCH_EVERY, parallel == "fsdp")  # FSDP: steps wait for NCCL's timing
    step_end = [{s.number - 1: s.end_us for s in t.steps} for t in truths]
    judge = WatchJudge(own_phases=own_work_phases(parallel), held_phases=held_phases, noise=GPU, th=watch_thresholds())
    numbers = sorted({s for ends in step_end for s in ends})
    patience = [TimingPatience() for _ in truths]
    flags: list[tuple[int, int, str | None]] = []
    for s in numbers:
        if (s + 1) % WATCH_EVERY:
            continue
        tables, spans, arrived, waiting = [], [], [], []
        for r, mine in enumerate(records):
            now_us = step_end[r].get(s, float("inf"))
            recent = [rec for done_us, rec in mine if done_us <= now_us][-rows:]
            tables.append(pack_rows([step_row(rec) for rec in recent], rows))
            if parallel == "fsdp":
                mine_spans = {
                    rec["step"]: {p: rec["phases_span_ns"][p] for p in held_phases if p in rec["phases_span_ns"]}
                    for rec in recent
                    if rec["step"] > judge.judged_through
                }
                entries = recorder(truths[r], now_us)
                spans.append(mine_spans)
                arrived.append(my_arrivals(entries, mine_spans, held_phases, device=True))
                expected = patience[r].expected(entries, int(now_us * 1e3))
                waiting.extend(untimed_steps(entries, mine_spans, held_phases, expected)[:1])
        arrivals = None
        if parallel == "fsdp":
            arrivals = HeldArrivals(
                spans_ns=spans,
                arrivals=arrived,
                offsets_ns=[0.0] * len(truths),
                device=True,
                timed_through=min(waiting) - 1 if waiting else None,
            )
        judged = judge.judge(torch.stack(tables), hosts, arrivals)
        if judged is not None:
            flags.extend((s, x.rank, x.phase) for x in judged.new)
    return flags, judge.judged_through


def watch_case(
    case: Any,
    noise_seed: int,
    simulate: Callable[[Any, int, int], tuple[Sim, Truth, float]],
    hosts: dict[int, str],
    compute_stream: int,
) -> dict[str, Any]:
    """The watch's run of a generated case (a detect/sim.py SimCase): the same job WATCH_STEPS
    long, slowed from the real runs' ONSET_STEP on, simulated with and without the injection
    (the truth: its cost per step from the onset on, over the clean step), judged and scored
    (`score`: latency from the onset, a clean case's flag a false alarm). A host that never
    waits for its GPU (no loss read) can run the whole job's launches ahead of it, so that no
    step after the onset is complete at any exchange: `judged_through` says so.
    `simulate(case, seed, cost_steps)` is detect/sim.py's `simulate_with_truth`."""
    long = replace(case, steps=WATCH_STEPS, onset=ONSET_STEP + 1)  # the simulator counts from 1
    sim, truth, _ = simulate(long, noise_seed, long.steps - long.onset + 1)
    flags, judged_through = watch_flags(
        sim, hosts, compute_stream, WATCH_PARALLEL[long.parallel], PYTHON_WAITED.get(long.parallel, ())
    )
    seen = Seen(verdict="", watch_flags=[(step, rank) for step, rank, _ in flags])
    outcome = score(truth, seen, onset_step=ONSET_STEP)
    injected = set(long.slow)
    return {
        "steps": WATCH_STEPS,
        "onset": ONSET_STEP,
        "parallel": long.parallel,
        "truth": {"kind": truth.kind, "ranks": truth.ranks, "phase": truth.phase, "cost_share": truth.cost_share},
        "flags": [list(f) for f in flags],
        "judged_through": judged_through,  # the last step the watch judged before the job ended
        "material": outcome.material,
        "latency_steps": outcome.watch_latency_steps,
        "false_alarm": outcome.watch_false_alarm,
        "innocent_flagged": sorted({r for _, r, _ in flags if r not in injected}) if truth.kind == "straggler" else [],
    }
