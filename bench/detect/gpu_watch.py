"""The live watch on the generated GPU jobs (detect/sim.py): the step records timing.py would
write on each rank's GPU, exchanged and judged every WATCH_EVERY steps as the watch judges them
(harness/train/watch_rule.WatchJudge), scored like the real runs' watch.

Step records, as timing.py's StepClock makes them on GPU:
1. each phase boundary records a CUDA event on the compute stream at the host's mark; a stream
   runs its work in order, so the event completes once the stream has done everything launched
   before the mark and the event itself has reached the device (the simulator's launch latency):
   E(T) = max(T + latency, the end of the last compute-stream op launched before T), and no
   earlier than the event before it;
2. DDP's backward ends by making the compute stream wait for the gradients' all-reduce (the
   reducer's finalize waits on each bucket's work on the current stream), so the backward mark's
   event, and every one after it, also waits for the step's all-reduce;
3. phases_device_ms: each phase = the difference of consecutive events (the data phase's, the
   time the stream idled for the host's loader or ran work launched there); phases_ms the same
   with the data phase as the host's time in it (timing.py: blocked on the loader); step_ms =
   the end event less the start event; phases_own_device_ms: backward's own work, from its
   start event to the event the gradients-ready hook records when the host has launched the
   last gradient's kernels (harness/train/grads_ready.py), i.e. at the all-reduce's launch;
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
from harness.train.watch_rule import (
    COLLECTIVE_PHASES,
    WatchJudge,
    own_work_phases,
    pack_rows,
    step_row,
    watch_thresholds,
)

from devicesim import RankTruth, Sim

# 25 steps (the harness's 0-24) leave three intervals after the real runs' onset.
WATCH_STEPS = 25
PARALLEL = "ddp"  # the generated jobs all-reduce their gradients after backward (detect/sim.py)
PHASES = ("data", "forward", "backward", "optimizer")


def step_records(truth: RankTruth, compute_stream: int, latency_us: float) -> list[tuple[float, dict[str, Any]]]:
    """One rank's (when its end event completed, its step record) per step, under the harness's
    step number (module docstring, 1-3), from the simulator's truth (one clock for host and
    device; `latency_us`: its launch latency, an event's way to the device)."""
    compute = [op for op in truth.ops if op.stream == compute_stream]
    launched = [op.launch_us for op in compute]
    ends = [op.end_us for op in compute]

    def event_us(mark_us: float, after_us: float) -> float:
        i = bisect.bisect_left(launched, mark_us)  # a launch at the mark itself comes after it
        return max(mark_us + latency_us, ends[i - 1] if i else 0.0, after_us)

    reduced: dict[int, float] = {}
    issued: dict[int, float] = {}  # the step's all-reduce launch: its gradients are all ready
    for op in truth.ops:
        if op.coll == "allreduce" and op.step is not None:
            reduced[op.step] = max(reduced.get(op.step, 0.0), op.end_us)
            issued[op.step] = max(issued.get(op.step, 0.0), op.launch_us)
    ranges = [r for r in truth.ranges if r.name in PHASES]
    out = []
    for step in truth.steps:
        inside = {r.name: r for r in ranges if step.start_us <= r.start_us and r.end_us <= step.end_us}
        marks = [event_us(step.start_us, 0.0)]
        for name in PHASES:
            waits = reduced.get(step.number, 0.0) if name == "backward" else 0.0
            marks.append(event_us(inside[name].end_us, max(marks[-1], waits)))
        end = event_us(step.end_us, marks[-1])
        device_ms = {name: (b - a) / 1e3 for name, a, b in zip(PHASES, marks[:-1], marks[1:])}
        phases_ms = {**device_ms, "data": (inside["data"].end_us - inside["data"].start_us) / 1e3}
        record = {"step": step.number - 1, "step_ms": (end - marks[0]) / 1e3, "phases_ms": phases_ms}
        backward_at = marks[PHASES.index("backward")]  # the event that opens backward
        ready = event_us(issued[step.number], backward_at)
        own = {"backward": (ready - backward_at) / 1e3}
        out.append((end, {**record, "phases_device_ms": device_ms, "phases_own_device_ms": own}))
    return out


def watch_flags(sim: Sim, hosts: dict[int, str], compute_stream: int) -> tuple[list[tuple[int, int]], int]:
    """(exchange step, rank) each time the watch flags a rank anew (module docstring, 4), and the
    last step it judged (-1: none): per exchange after step s, every rank's table of its latest
    2 x WATCH_EVERY records past the warm-up complete by its host's end of step s, judged
    together."""
    truths = sim.truth()
    records = [
        [
            (done, rec)
            for done, rec in step_records(t, compute_stream, sim.launch_latency_us)
            if rec["step"] >= WARMUP_STEPS
        ]
        for t in truths
    ]
    step_end = [{s.number - 1: s.end_us for s in t.steps} for t in truths]
    judge = WatchJudge(
        own_phases=own_work_phases(PARALLEL),
        held_phases=COLLECTIVE_PHASES[PARALLEL],
        cpu=False,
        th=watch_thresholds(),
    )
    numbers = sorted({s for ends in step_end for s in ends})
    flags = []
    for s in numbers:
        if (s + 1) % WATCH_EVERY:
            continue
        tables = []
        for r, mine in enumerate(records):
            now_us = step_end[r].get(s, float("inf"))
            rows = [step_row(rec) for done_us, rec in mine if done_us <= now_us]
            tables.append(pack_rows(rows, 2 * WATCH_EVERY))
        judged = judge.judge(torch.stack(tables), hosts)
        if judged is not None:
            flags.extend((s, x.rank) for x in judged.new)
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
    flags, judged_through = watch_flags(sim, hosts, compute_stream)
    seen = Seen(verdict="", watch_flags=flags)
    outcome = score(truth, seen, onset_step=ONSET_STEP)
    injected = set(long.slow)
    return {
        "steps": WATCH_STEPS,
        "onset": ONSET_STEP,
        "truth": {"kind": truth.kind, "ranks": truth.ranks, "phase": truth.phase, "cost_share": truth.cost_share},
        "flags": [list(f) for f in flags],
        "judged_through": judged_through,  # the last step the watch judged before the job ended
        "material": outcome.material,
        "latency_steps": outcome.watch_latency_steps,
        "false_alarm": outcome.watch_false_alarm,
        "innocent_flagged": sorted({r for _, r in flags if r not in injected}) if truth.kind == "straggler" else [],
    }
