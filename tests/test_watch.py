"""The live straggler watch: its verdict on hand-built step timings (exact), triggered trace windows,
the collector's --window, and real 4-rank jobs (a straggler appearing at step 40, a clean run)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from watch_stub import GrouplessWatch

from harness.paths import watch_path
from harness.run.profiling import TraceRecorder
from harness.run.settings import ProfilerConfig
from harness.run.timing import StepClock
from harness.traces.analyse.noise import GPU, SHARED_CPU
from harness.traces.analyse.stragglers import Thresholds, run_jitter_ms, straggler_bounds
from harness.traces.read.discover import InputError
from harness.traces.read.watch_log import CaptureRecord, WatchFlagRecord, WatchRecord, read_watch, watch_line
from harness.traces.read.windows import pick_window, trace_window
from harness.watch.arrivals import HeldArrivals
from harness.watch.rule import (
    COLLECTIVE_PHASES,
    WATCH_PHASES,
    WatchJudge,
    jitter_ms,
    median,
    own_work_phases,
    pack_rows,
    step_row,
    watch_thresholds,
)
from harness.watch.rule import judge_interval as judge_tables
from harness.write_faults import AppendOnlyFile

from jobs import REPO, run_harness, said

pytestmark = pytest.mark.timing

DDP_OWN = own_work_phases("ddp")


def steps(
    rank_phases: dict[str, float],
    *,
    first: int = 10,
    n: int = 4,
    step_ms: float = 100.0,
    bump: dict[int, dict[str, float]] | None = None,
) -> list[dict]:
    """`n` step records with the same phase times, plus per-step extra time (`bump`: step -> phase -> ms)."""
    out = []
    for s in range(first, first + n):
        phases = dict(rank_phases)
        for phase, ms in (bump or {}).get(s, {}).items():
            phases[phase] = phases.get(phase, 0.0) + ms
        out.append({"step": s, "step_ms": step_ms, "phases_ms": phases})
    return out


def judge_interval(times: dict[int, list[dict]], hosts: dict[int, str], own: tuple[str, ...], **kwargs):
    """judge_interval over the tables each rank would send with these step records."""
    rows = max(len(t) for t in times.values())
    return judge_tables(
        torch.stack([pack_rows([step_row(rec) for rec in times[r]], rows) for r in sorted(times)]), hosts, own, **kwargs
    )


BASE = {"data": 1.0, "h2d": 0.0, "forward": 20.0, "loss": 1.0, "backward": 60.0, "optimizer": 10.0}


def test_own_work_phases_leave_out_the_phases_that_hold_collectives() -> None:
    assert own_work_phases("ddp") == ("data", "h2d", "forward", "loss", "optimizer")
    assert own_work_phases("fsdp") == ("data", "h2d", "loss", "optimizer")
    assert own_work_phases("none") == ("data", "h2d", "forward", "loss", "backward", "optimizer", "forward_backward")


def test_a_slow_data_phase_is_flagged_and_its_victims_waiting_in_backward_are_not() -> None:
    # Rank 2 spends 50 ms more in data every step; ranks 0, 1, 3 wait for it inside backward
    # (DDP's all-reduce), so their backward is 50 ms longer and rank 2's is not.
    slow = {**BASE, "data": 51.0}
    victim = {**BASE, "backward": 110.0}
    times = {
        0: steps(victim, step_ms=150.0),
        1: steps(victim, step_ms=150.0),
        2: steps(slow, step_ms=150.0),
        3: steps(victim, step_ms=150.0),
    }
    v = judge_interval(times, {0: "a", 1: "a", 2: "b", 3: "b"}, DDP_OWN, noise=GPU, th=Thresholds())
    assert v.steps == [10, 11, 12, 13]
    # own work: 32 ms on ranks 0, 1, 3 and 82 ms on rank 2; punctual (lower quartile) = 32 ms
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 0.0, 50.0, 0.0]
    # relative: 0.08 x 150 ms; jitter 0 (every step the same); outlier: lower half [0, 0] -> 0
    assert v.bounds_ms == {
        "min_late": 0.0,
        "clock_noise": 0.0,
        "jitter": 0.0,
        "late_jitter": 0.0,
        "relative": 12.0,
        "outlier": 0.0,
    }
    assert v.threshold_ms == 12.0
    [s] = v.stragglers
    assert (s.rank, s.host, s.phase, s.excess_ms, s.steps_late) == (2, "b", "data", 50.0, 4)


def test_the_flag_says_when_the_straggler_s_gpu_ran_a_lower_clock() -> None:
    # Rank 2 computes twice as long in forward, its GPU at 1.41 GHz and throttled for temperature;
    # rank 0, power-capped as every other rank is, and at its peers' clock, is not the cause.
    def read(recs: list[dict], clock: int, throttle: list[str]) -> list[dict]:
        return [{**r, "gpu_sm_clock_mhz": clock, "gpu_throttle": throttle} for r in recs]

    slow = {**BASE, "forward": 40.0}
    times = {r: read(steps(BASE), 1980, ["power"]) for r in (0, 1, 3)}
    times[2] = read(steps(slow), 1410, ["power", "temperature"])
    v = judge_interval(times, {}, DDP_OWN, noise=GPU, th=Thresholds())
    [s] = v.stragglers
    assert (s.rank, s.phase) == (2, "forward")
    assert s.gpu == "its GPU ran at 1.41 GHz against 1.98 GHz on its peers: throttled for temperature"
    assert step_row(times[2][0])[-2:] == [1410, 9]  # the clock, and power (1) + temperature (8)
    # no readings, or the same clock on every rank: the flag says nothing of the GPU
    plain = {r: steps(slow if r == 2 else BASE) for r in range(4)}
    assert [x.gpu for x in judge_interval(plain, {}, DDP_OWN, noise=GPU, th=Thresholds()).stragglers] == [None]
    even = {r: read(steps(slow if r == 2 else BASE), 1980, []) for r in range(4)}
    assert [x.gpu for x in judge_interval(even, {}, DDP_OWN, noise=GPU, th=Thresholds()).stragglers] == [None]


def test_on_gpu_the_watch_judges_the_data_phase_the_device_saw() -> None:
    """GPU records carry each phase's device time (timing.py's phases_device_ms) beside the host's
    time blocked on the loader (phases_ms' data). Rank 2's host spends 50 ms more in data every
    step, but its GPU is still busy with earlier steps (its device saw no data phase at all), and
    rank 1's device runs a 30 ms input transform launched in data that its host time does not
    show: the watch judges what the devices saw, so rank 1 is the straggler and rank 2 is not."""

    def gpu(data_host: float, data_device: float) -> list[dict]:
        out = steps({**BASE, "data": data_host}, step_ms=150.0)
        for rec in out:
            rec["phases_device_ms"] = {**rec["phases_ms"], "data": data_device}
        return out

    times = {0: gpu(1.0, 1.0), 1: gpu(1.0, 31.0), 2: gpu(51.0, 0.0), 3: gpu(1.0, 1.0)}
    v = judge_interval(times, {r: "a" for r in times}, DDP_OWN, noise=GPU, th=Thresholds())
    assert [s.rank for s in v.stragglers] == [1] and v.stragglers[0].phase == "data"
    assert step_row(times[2][0])[2 + WATCH_PHASES.index("data")] == 0.0


def test_on_gpu_a_rank_computing_longer_inside_backward_is_seen_by_its_work_before_its_last_gradient() -> None:
    """DDP on GPU: every rank's backward lasts 60 ms on its device (rank 1 computes 50 ms of it,
    the others 20 ms and then wait for its last bucket), so backward's device time tells nothing.
    The event at each rank's last gradient (timing.py's phases_own_device_ms) does: rank 1's own
    work is 32 + 50 ms against 32 + 20, 30 ms late each step, flagged in backward. Without the
    event (a loop that did not call `Run.watch_gradients`) no rank is."""

    def gpu(own_backward_ms: float | None) -> list[dict]:
        out = steps(BASE, step_ms=100.0)
        for rec in out:
            rec["phases_device_ms"] = dict(rec["phases_ms"])
            if own_backward_ms is not None:
                rec["phases_own_device_ms"] = {"backward": own_backward_ms}
        return out

    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    times = {0: gpu(20.0), 1: gpu(50.0), 2: gpu(20.0), 3: gpu(20.0)}
    v = judge_interval(times, hosts, DDP_OWN, noise=GPU, th=Thresholds(), held_phases=("backward",))
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 30.0, 0.0, 0.0]
    [s] = v.stragglers
    assert (s.rank, s.phase, s.excess_ms, s.steps_late) == (1, "backward", 30.0, 4)
    assert step_row(times[1][0])[2 + len(WATCH_PHASES) + WATCH_PHASES.index("backward")] == 50.0
    blind = {r: gpu(None) for r in hosts}
    assert judge_interval(blind, hosts, DDP_OWN, noise=GPU, th=Thresholds(), held_phases=("backward",)).stragglers == []
    # one rank without the event in step 11 (a step its hook did not mark): that step's backward
    # counts for no rank, rather than making that rank the punctual mark and the others late
    times = {0: gpu(20.0), 1: gpu(20.0), 2: gpu(20.0), 3: gpu(20.0)}
    del times[3][1]["phases_own_device_ms"]
    v = judge_interval(times, hosts, DDP_OWN, noise=GPU, th=Thresholds(), held_phases=("backward",))
    assert v.stragglers == [] and [r.late_ms for r in v.ranks] == [0.0] * 4


def test_a_rank_computing_longer_inside_backward_is_seen_by_its_cpu_time() -> None:
    # DDP on CPU: every rank's backward lasts 60 ms (the slow one computes, the others wait for it
    # in the all-reduce), but rank 1 spends 50 ms of it on its core and the others 20 ms: its own
    # work is 32 + 50 ms against 32 + 20. The same tables without CPU times (a GPU rank's) see
    # nothing.
    def with_cpu(records: list[dict], backward_cpu_ms: float) -> list[dict]:
        return [r | {"phases_cpu_ms": {**{p: 0.0 for p in BASE}, "backward": backward_cpu_ms}} for r in records]

    times = {r: with_cpu(steps(BASE), 50.0 if r == 1 else 20.0) for r in range(3)}
    v = judge_interval(times, {}, DDP_OWN, noise=GPU, th=Thresholds(), held_phases=("backward",))
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 30.0, 0.0]
    [s] = v.stragglers
    assert (s.rank, s.phase, s.excess_ms, s.beyond_peers_ms, s.steps_late) == (1, "backward", 30.0, 30.0, 4)
    assert judge_interval(times, {}, DDP_OWN, noise=GPU, th=Thresholds()).stragglers == []  # not read


def test_a_rank_waiting_for_a_core_in_its_own_work_is_late() -> None:
    # Rank 1's forward lasts 50 ms more every step, all of it waiting for a core (runq_ms says
    # so): other work keeps it off its cores, and its peers wait for it as for any straggler.
    longer = {**BASE, "forward": 70.0}
    times = {
        0: [r | {"runq_ms": 0.0} for r in steps(BASE)],
        1: [r | {"runq_ms": 50.0} for r in steps(longer)],
        2: [r | {"runq_ms": 0.0} for r in steps(BASE)],
    }
    v = judge_interval(times, {}, DDP_OWN, noise=SHARED_CPU, th=Thresholds())
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 50.0, 0.0]
    [s] = v.stragglers
    assert (s.rank, s.phase, s.excess_ms) == (1, "forward", 50.0)


def test_a_rank_slower_on_its_core_is_late_by_what_that_costs() -> None:
    # Rank 1 takes 1.5x the time of ranks 0 and 2 in every phase (a slower core, the same code):
    # the others wait for it as for any straggler, so it is late by what the slowness costs in
    # its own-work phases (data, forward, optimizer: 1 + 20 + 5 ms, half of it again). Rank 2
    # takes 30 ms more CPU time in backward only. Both are named; no speed is taken out.
    def with_cpu(records: list[dict], scale: float, extra_backward_ms: float = 0.0) -> list[dict]:
        out = []
        for r in records:
            cpu = {p: ms * scale for p, ms in r["phases_ms"].items()}
            cpu["backward"] = 20.0 * scale + extra_backward_ms
            out.append(r | {"phases_ms": {p: ms * scale for p, ms in r["phases_ms"].items()}, "phases_cpu_ms": cpu})
        return out

    times = {0: with_cpu(steps(BASE), 1.0), 1: with_cpu(steps(BASE), 1.5), 2: with_cpu(steps(BASE), 1.0, 30.0)}
    v = judge_interval(times, {}, DDP_OWN, noise=SHARED_CPU, th=Thresholds(), held_phases=("backward",))
    own_ms = sum(BASE[p] for p in DDP_OWN if p in BASE)
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, round(0.5 * (own_ms + 20.0), 6), 30.0]
    assert {s.rank for s in v.stragglers} == {1, 2}


def test_the_step_clock_takes_the_thread_s_cpu_time_per_phase() -> None:
    clock = StepClock(cuda=False, thread_time=True)
    clock.start(0)
    deadline = time.thread_time() + 0.03
    while time.thread_time() < deadline:  # 30 ms on the core, however long a busy machine takes to give them
        pass
    clock.mark("forward")
    time.sleep(0.03)  # 30 ms off it
    clock.mark("backward")
    clock.finish()
    [rec] = clock.poll()
    cpu = rec["phases_cpu_ms"]
    assert set(cpu) == {"forward", "backward"}
    # the spin holds 30 ms of this thread's CPU time whatever the load; the sleep holds none
    assert cpu["forward"] > 25.0 and cpu["backward"] < 10.0
    assert "phases_cpu_ms" not in _one_step(StepClock(cuda=False))


class ScriptedEvent:
    """torch.cuda.Event standing in: each record() completes at the next scripted device time (ms)."""

    times: Iterator[float] = iter(())

    def __init__(self, enable_timing: bool = False) -> None:
        self.at_ms = 0.0

    def record(self) -> None:
        self.at_ms = next(ScriptedEvent.times)

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: ScriptedEvent) -> float:
        return other.at_ms - self.at_ms


def scripted_events(monkeypatch: pytest.MonkeyPatch, device_ms: list[float]) -> list[int]:
    """CUDA events whose records complete at `device_ms`, in record order, on CUDA device 0; the
    current device is the returned list's only item (set it to another to switch)."""
    current = [0]
    monkeypatch.setattr(ScriptedEvent, "times", iter(device_ms))
    monkeypatch.setattr(torch.cuda, "Event", ScriptedEvent)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    return current


def test_on_gpu_the_step_clock_writes_each_phase_as_its_device_saw_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """StepClock on GPU with torch.cuda.Event standing in: each mark's event completes at the
    device time scripted for it (ms). The host spends 20 ms in data while its device, still busy,
    reaches the start and data events at the same 10 ms: phases_device_ms' data is 0 (what the
    watch judges), phases_ms' data and data_ms the host's time blocked on the loader; the other
    phases are the device's in both."""
    scripted_events(monkeypatch, [10.0, 10.0, 30.0, 31.0])  # start, data, forward, end
    clock = StepClock(cuda=True)
    clock.start(0)
    time.sleep(0.02)
    clock.mark("data")
    clock.mark("forward")
    clock.finish()
    [rec] = clock.poll()
    assert rec["phases_device_ms"] == {"data": 0.0, "forward": 20.0}
    assert rec["phases_ms"]["forward"] == 20.0 and rec["step_ms"] == 21.0
    assert rec["phases_ms"]["data"] == rec["data_ms"] > 10.0  # wide margin: a 20 ms sleep
    assert step_row(rec)[2 + WATCH_PHASES.index("data")] == 0.0
    assert "phases_device_ms" not in _one_step(StepClock(cuda=False))


def test_on_gpu_the_step_clock_ends_a_phases_own_work_where_it_is_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    """StepClock on GPU with torch.cuda.Event standing in (device times in ms, in record order):
    backward opens at 10 ms, the last gradient's event (`mark_own_end`, twice: the last counts)
    completes at 25 ms and backward's end at 40 ms: its own work is 15 ms of its 30. A mark
    outside a step, one from another GPU, one outside any phase and one on CPU record nothing."""
    # start, forward, own end x2, backward, end; step 1: start, own end, end
    device = scripted_events(monkeypatch, [0.0, 10.0, 20.0, 25.0, 40.0, 41.0, 50.0, 55.0, 60.0])
    clock = StepClock(cuda=True)
    clock.mark_own_end()  # no step open: nothing recorded
    clock.start(0)
    clock.mark("forward")
    clock.mark_own_end()
    clock.mark_own_end()
    device[0] = 1
    clock.mark_own_end()  # a gradient on another GPU: nothing recorded
    device[0] = 0
    clock.mark("backward")
    clock.finish()
    clock.start(1)
    clock.mark_own_end()  # outside any phase: the step's end takes no own work
    clock.finish()
    rec, outside = clock.poll()
    assert rec["phases_device_ms"] == {"forward": 10.0, "backward": 30.0}
    assert rec["phases_own_device_ms"] == {"backward": 15.0}
    assert "phases_own_device_ms" not in outside
    cpu_clock = StepClock(cuda=False)
    cpu_clock.start(0)
    cpu_clock.mark_own_end()
    cpu_clock.mark("backward")
    cpu_clock.finish()
    assert "phases_own_device_ms" not in cpu_clock.poll()[0]


def test_a_phase_that_comes_back_within_a_step_is_timed_over_all_its_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradient accumulation marks forward and backward once per micro-batch. Host clocks scripted
    (ms; CPU time and epoch ns alike): start 0, data 2, forward 12, backward 30, forward 40,
    backward 58, end 60. Each phase is the sum of its passes (forward 10 + 10, backward 18 + 18),
    so the phases add up to the step less its 2 ms tail; each span is one pair per pass."""
    marks = iter([0.0, 2.0, 12.0, 30.0, 40.0, 58.0, 60.0])
    now = [0.0]

    def tick() -> float:
        now[0] = next(marks)
        return now[0] / 1e3

    monkeypatch.setattr(time, "perf_counter", tick)
    monkeypatch.setattr(time, "thread_time", lambda: now[0] / 1e3)
    monkeypatch.setattr(time, "time_ns", lambda: int(now[0] * 1e6))
    clock = StepClock(cuda=False, thread_time=True)
    clock._runq = None  # no run queue read: the scripted clocks are the only ones
    clock.start(0)
    for label in ("data", "forward", "backward", "forward", "backward"):
        clock.mark(label)
    clock.finish()
    [rec] = clock.poll()
    assert rec["phases_ms"] == {"data": 2.0, "forward": 20.0, "backward": 36.0}
    assert rec["phases_cpu_ms"] == {"data": 2.0, "forward": 20.0, "backward": 36.0}
    assert rec["step_ms"] == 60.0 == sum(rec["phases_ms"].values()) + 2.0
    ms = 1_000_000
    assert rec["phases_span_ns"] == {
        "data": [0, 2 * ms],
        "forward": [2 * ms, 12 * ms, 30 * ms, 40 * ms],
        "backward": [12 * ms, 30 * ms, 40 * ms, 58 * ms],
    }


def test_on_gpu_each_pass_of_a_phase_adds_its_device_time_and_own_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two micro-batches (device ms in record order): start 0, forward 10, own end 15, backward
    20, forward 30, own end 36, backward 40, end 41: forward 10 + 10, backward 10 + 10 with own
    work 5 + 6."""
    scripted_events(monkeypatch, [0.0, 10.0, 15.0, 20.0, 30.0, 36.0, 40.0, 41.0])
    clock = StepClock(cuda=True)
    clock.start(0)
    for _ in range(2):
        clock.mark("forward")
        clock.mark_own_end()
        clock.mark("backward")
    clock.finish()
    [rec] = clock.poll()
    assert rec["phases_device_ms"] == {"forward": 20.0, "backward": 20.0}
    assert rec["phases_own_device_ms"] == {"backward": 11.0}
    assert rec["step_ms"] == 41.0


def _one_step(clock: StepClock) -> dict:
    clock.start(0)
    clock.mark("forward")
    clock.finish()
    return clock.poll()[0]


def test_the_bound_is_the_collectors_rule() -> None:
    # Same late_ms, the bounds straggler_bounds gives, on CPU as on GPU, and with a floor.
    times = {r: steps(BASE, step_ms=100.0) for r in range(3)}
    times[1] = steps({**BASE, "optimizer": 30.0}, step_ms=100.0)
    th = watch_thresholds(min_late_ms=25.0)
    v = judge_interval(times, {}, DDP_OWN, noise=SHARED_CPU, th=th)
    assert v.bounds_ms == straggler_bounds(
        {0: 0.0, 1: 20.0, 2: 0.0}, median_step_ms=100.0, clock_noise_ms=0.0, jitter_ms=0.0, th=th
    )
    assert v.threshold_ms == 25.0  # the floor, over 0.08 x 100 ms
    assert v.stragglers == []  # 20 ms late is under both
    assert (v.ranks[1].late_ms, v.ranks[1].phase) == (20.0, None)  # a phase is named for stragglers only


def test_lateness_is_a_mean_over_the_interval_and_steps_late_counts_steps() -> None:
    # Rank 1 is 80 ms late in 2 of 4 steps: 40 ms per step, over an 8 ms bound; late in 2 steps.
    # Its own work swings by 80 ms (a MAD of 40): the jitter is the lower half of the ranks'
    # MADs (rank 0's, 0), or its own swing would set its bound (3 x 20 = 60 ms: missed).
    times = {0: steps(BASE), 1: steps(BASE, bump={10: {"forward": 80.0}, 12: {"forward": 80.0}})}
    v = judge_interval(times, {}, DDP_OWN, noise=GPU, th=Thresholds())
    assert v.threshold_ms == 8.0 and v.bounds_ms["jitter"] == 0.0
    assert [(r.rank, r.late_ms, r.steps_late) for r in v.stragglers] == [(1, 40.0, 2)]


def test_only_steps_every_rank_timed_are_judged() -> None:
    times = {0: steps(BASE, first=10, n=5), 1: steps(BASE, first=11, n=5)}
    assert judge_interval(times, {}, DDP_OWN, noise=GPU, th=Thresholds()).steps == [11, 12, 13, 14]
    # a rank that lacks a step in the middle, and the late rank's step 15 beyond the others'
    times[1] = [t for t in times[1] if t["step"] != 12]
    times[1][0] = {**times[1][0], "phases_ms": {**BASE, "data": 41.0}}  # its step 11: 40 ms late
    v = judge_interval(times, {}, DDP_OWN, noise=GPU, th=Thresholds())
    assert v.steps == [11, 13, 14]
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, round(40 / 3, 6)]
    assert judge_interval({0: steps(BASE)}, {}, DDP_OWN, noise=GPU, th=Thresholds()).ranks == []


def test_on_cpu_an_interval_of_fewer_steps_than_a_straggler_needs_late_waits_for_the_next() -> None:
    """A warm-up that ends one step before an exchange leaves that exchange one step (7) to
    judge; on CPU a straggler must be late in 2 steps (one stall is not one where ranks
    time-share cores), so that step waits and is judged with the next interval's (7-11). Rank 1
    stalls 50 ms in step 7 alone (over the 8 ms bound of its 100 ms step): never flagged. A rank
    50 ms late in every step from 7 is flagged at the next exchange, over steps 7-11."""

    def tables(last: int, bump: dict[int, dict[str, float]]) -> torch.Tensor:
        recs = [steps(BASE, first=7, n=last - 6), steps(BASE, first=7, n=last - 6, bump=bump)]
        return torch.stack([pack_rows([step_row(r) for r in rec], 8) for rec in recs])

    for bump, flagged in (({7: {"data": 50.0}}, []), ({s: {"data": 50.0} for s in range(7, 12)}, [1])):
        judge = WatchJudge(
            own_phases=DDP_OWN, held_phases=COLLECTIVE_PHASES["ddp"], noise=SHARED_CPU, th=watch_thresholds()
        )
        assert judge.judge(tables(7, bump), {0: "a", 1: "b"}) is None and judge.judged_through == -1
        judged = judge.judge(tables(11, bump), {0: "a", 1: "b"})
        assert judged is not None and judged.verdict.steps == [7, 8, 9, 10, 11]
        assert [r.rank for r in judged.new] == flagged
    # on GPU one step is judged as it comes (the two-late-steps rule is CPU's)
    judge = WatchJudge(own_phases=DDP_OWN, held_phases=COLLECTIVE_PHASES["ddp"], noise=GPU, th=watch_thresholds())
    judged = judge.judge(tables(7, {7: {"data": 50.0}}), {0: "a", 1: "b"})
    assert judged is not None and judged.verdict.steps == [7] and [r.rank for r in judged.new] == [1]


def test_trace_window_numbers_come_from_harness_names_only() -> None:
    assert trace_window(Path("rank00002-vm.0003.pt.trace.json.gz")) == 3
    assert trace_window(Path("rank00002-vm.0003.pt.trace.json.gz.summary.json")) == 3
    # torch's tensorboard_trace_handler: a timestamp where the window goes
    assert trace_window(Path("worker0.1700000000123.pt.trace.json")) is None
    files = [Path(f"rank0000{r}-vm.000{w}.pt.trace.json.gz") for r in (0, 1) for w in (1, 2)]
    kept, pick = pick_window(files, "latest")
    assert [f.name for f in kept] == ["rank00000-vm.0002.pt.trace.json.gz", "rank00001-vm.0002.pt.trace.json.gz"]
    assert (pick.window, pick.windows) == (2, (1, 2))
    assert len(pick_window(files, "1")[0]) == 2 and pick_window(files, "all")[0] == files
    with pytest.raises(InputError, match="windows present: 1, 2"):
        pick_window(files, "3")
    # rank 1 could not write window 2 (a full disk): the latest window every rank holds is 1
    kept, pick = pick_window(files[:3], "latest")
    assert (pick.window, [f.name for f in kept]) == (
        1,
        ["rank00000-vm.0001.pt.trace.json.gz", "rank00001-vm.0001.pt.trace.json.gz"],
    )
    assert pick.note == (
        "window 2 lacks rank(s) 1; analysing window 1, the latest every rank wrote (--window 2 for that one)"
    )
    assert trace_window(Path("rank00001-vm.1700000000123.pt.trace.json")) is None  # a timestamp, not a window
    other = [Path("worker0.1700000000123.pt.trace.json")]
    assert pick_window(other, "latest")[0] == other
    with pytest.raises(InputError, match="use --window all"):
        pick_window(other, "2")


def test_capture_options_are_checked(log_dir: Path) -> None:
    for args, message in (
        (["--capture-on-straggler", "--watch-every", "0"], "needs the watch"),
        (["--capture-on-straggler", "--no-profile"], "drop --no-profile"),
        (["--max-captures", "0"], "must be >= 1"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "harness.train", "--log-dir", str(log_dir), *args],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr


def watch_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in watch_path(run_dir).read_text().splitlines()]


# 4 ranks share 2 cores here: a descheduled rank runs late by a time slice or more, so both real
# runs set a 25 ms floor (--watch-min-late-ms); the injected straggler is 150 ms a step, 6x over it.
REAL = [
    "--mode",
    "baseline",
    "--hidden",
    "128",
    "--batch-size",
    "16",
    "--steps",
    "50",
    "--warmup-steps",
    "5",
    "--watch-every",
    "10",
    "--watch-min-late-ms",
    "25",
]


@pytest.mark.slow
def test_a_straggler_from_step_20_is_flagged_traced_and_named_by_the_collector(log_dir: Path) -> None:
    run = run_harness(
        [*REAL, "--slow-rank", "2", "--slow-ms", "150", "--slow-from", "20", "--capture-on-straggler"],
        log_dir,
        nproc=4,
        timeout=600,
    )
    lines = watch_lines(run.dir)
    assert [line["step"] for line in lines] == [9, 19, 29, 39, 49]
    assert all(line["stragglers"] == [] for line in lines if line["step"] < 20)
    flagged = next(line for line in lines if line["stragglers"])
    assert flagged["step"] <= 39
    assert [(s["rank"], s["phase"]) for s in flagged["stragglers"]] == [(2, "data")]
    assert all(s["rank"] == 2 for line in lines for s in line["stragglers"])
    assert flagged["capture"]["ranks"] == [2]
    assert f"watch: step {flagged['step']}: rank 2 (" in run.proc.stdout and "is a straggler: data +" in run.proc.stdout
    watch = run.run_json["watch"]
    assert watch["captures"] == [flagged["capture"]]
    first, last = flagged["capture"]["first"], flagged["capture"]["last"]
    assert first == flagged["step"] + 4  # two steps to agree and start, two warm-up steps (--warmup 2)
    # The scheduled window and the captured one on every rank.
    for rank in range(4):
        assert sorted(p.name.split(".")[1] for p in run.dir.glob(f"rank0000{rank}-*.pt.trace.json.gz")) == [
            "0001",
            "0002",
        ]
    tags = EventAccumulator(str(run.dir / "tb" / "rank00002"))
    tags.Reload()
    assert {"watch/late_ms", "watch/straggler", "watch/threshold_ms"} <= set(tags.Tags()["scalars"])
    assert [e.value for e in tags.Scalars("watch/straggler")][:2] == [0.0] * 2

    out = log_dir / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(run.dir), "-o", str(out), "--no-merged"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "report.json").read_text())
    # the capture as the watch logged it, the debug server's fields of its record null
    debug_fields = {"start": None, "id": None, "requested_at_step": None, "requested_by": None}
    captured = {**flagged["capture"], **debug_fields}
    assert doc["window"] == {"window": 2, "windows": [1, 2], "steps": [first, last], "captured": captured}
    line = f"window 2 of 1, 2 (steps {first}-{last}), traced when the live watch flagged rank(s) 2"
    assert said(proc.stdout, "window")[0].startswith(line), proc.stdout
    assert doc["verdict"] == "straggler"
    top = doc["stragglers"][0]
    assert (top["rank"], top["phase"]) == (2, "data"), proc.stdout
    # 4 ranks share 2 cores here: a peer kept off its core may be late too (its wait for a core
    # said beside it), but the injected 150 ms stands far above any such rank
    assert all(o["beyond_peers_ms"] < top["beyond_peers_ms"] / 4 for o in doc["stragglers"][1:]), proc.stdout
    named = flagged["stragglers"][0]
    assert doc["watch"]["flags"] == [
        {
            "step": flagged["step"],
            "rank": 2,
            "host": named["host"],
            "phase": "data",
            "late_ms": named["late_ms"],
            "gpu": None,
        }
    ]
    assert (
        "Live straggler watch during the run: every 10 steps, 5 interval(s) judged; straggler(s): rank 2 at step"
        in (out / "report.md").read_text()
    )


@pytest.mark.slow
def test_a_clean_run_raises_no_flag(log_dir: Path) -> None:
    run = run_harness([*REAL, "--steps", "40", "--capture-on-straggler"], log_dir, nproc=4, timeout=600)
    lines = watch_lines(run.dir)
    assert [line["step"] for line in lines] == [9, 19, 29, 39]
    assert all(line["stragglers"] == [] for line in lines)
    assert run.run_json["watch"] == {
        "every": 10,
        "intervals": 4,
        "judged_steps": [lines[0]["steps"][0], 39],
        "flags": [],
        "captures": [],
    }
    assert "watch:   every 10 steps, 4 interval(s) judged, no straggler" in run.proc.stdout
    assert len(list(run.dir.glob("*.pt.trace.json.gz"))) == 4  # the scheduled window only


@pytest.mark.slow
@pytest.mark.parametrize(("parallel", "phase"), [("ddp", "backward"), ("fsdp", "forward")])
def test_a_rank_sleeping_inside_a_phase_that_holds_collectives_is_flagged_there(
    log_dir: Path, parallel: str, phase: str
) -> None:
    # Its phase ends with its peers' at their collective and its CPU time does not grow: the
    # watch sees it by its arrivals (the Flight Recorder's, on in the lab). 60 ms a step against
    # a 35%-of-the-step bound of 10-25 ms on these jobs.
    run = run_harness(
        f"--mode baseline --parallel {parallel} --steps 40 --watch-every 10 --no-profile --slow-rank 1 "
        f"--slow-ms 60 --slow-phase {phase} --slow-kind sleep".split(),
        log_dir,
        nproc=2,
    )
    flagged = [(s["rank"], s["phase"]) for line in watch_lines(run.dir) for s in line["stragglers"]]
    assert flagged and set(flagged) == {(1, phase)}


class TwoRankWatch(GrouplessWatch):
    """Rank 0's watch in a 2-rank job without a process group: the all-gather hands back this
    rank's table and a copy whose data phase is `slow_ms` longer (rank 1's)."""

    def __init__(self, tmp_path: Path, *, slow_ms: float, capture: bool = False, cpu: bool = False) -> None:
        super().__init__(tmp_path, hosts={0: "a", 1: "b"}, cpu=cpu, capture=capture)
        self.slow_ms = slow_ms
        self._log = AppendOnlyFile(watch_path(tmp_path), self.faults, "watch log")

    def _all_gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        other = rows.clone()
        other[:, 2 + WATCH_PHASES.index("data")] += self.slow_ms
        return [rows, other]

    def _broadcast(self, message: torch.Tensor) -> None:
        pass  # rank 0 is the source: the message stays as it is

    def run(self, first: int, last: int) -> None:
        for s in range(first, last + 1):
            self.add({"step": s, "step_ms": 100.0, "phases_ms": dict(BASE)})
            self.after_step(s)


def test_the_watch_flags_a_rank_says_when_it_recovers_and_logs_each_interval(tmp_path: Path, capsys) -> None:
    w = TwoRankWatch(tmp_path, slow_ms=50.0)
    w.run(0, 11)  # warm-up steps 0-4 are not judged: intervals end at steps 7 (5-7) and 11 (8-11)
    w.slow_ms = 0.0
    w.run(12, 15)
    w.close()
    assert capsys.readouterr().out.splitlines() == [
        "watch: step 7: rank 1 (b) is a straggler: data +50.0 ms/step over the other ranks' median, 50.0 ms/step "
        "late, 50.0 beyond its peers (bound 8.0 ms), late in 3/3 steps 5-7",
        "watch: step 15: rank 1 (b) is no longer a straggler (steps 12-15)",
    ]
    flagged = [
        {"rank": 1, "host": "b", "phase": "data", "excess_ms": 50.0, "late_ms": 50.0, "beyond_peers_ms": 50.0}
        | {"steps_late": n}
        for n in (3, 4)
    ]
    # 2 ranks: no outlier bound; the peers' lateness (rank 0's) never moves
    bounds = {"min_late": 0.0, "clock_noise": 0.0, "jitter": 0.0, "late_jitter": 0.0, "relative": 8.0}
    assert watch_lines(tmp_path) == [
        {"step": 7, "steps": [5, 7], "threshold_ms": 8.0, "bounds_ms": bounds, "stragglers": [flagged[0]]},
        {"step": 11, "steps": [8, 11], "threshold_ms": 8.0, "bounds_ms": bounds, "stragglers": [flagged[1]]},
        {"step": 15, "steps": [12, 15], "threshold_ms": 8.0, "bounds_ms": bounds, "stragglers": []},
    ]
    assert w.summary() == {
        "every": 4,
        "intervals": 3,
        "judged_steps": [5, 15],
        "captures": [],
        "flags": [{"step": 7, "rank": 1, "host": "b", "phase": "data", "late_ms": 50.0}],
    }


class UntimedWatch(TwoRankWatch):
    """TwoRankWatch on GPU reading arrivals, NCCL having timed the collectives only up to three
    steps before each exchange's (the last three wait for its watchdog)."""

    def __init__(self, tmp_path: Path, *, slow_ms: float) -> None:
        super().__init__(tmp_path, slow_ms=slow_ms, cpu=False)
        self.read_arrivals = True

    def _arrivals(self, left_ns: int) -> HeldArrivals | None:
        last = max((int(row[0]) for row in self._recent), default=None)
        untimed = None if last is None else last - 3
        return HeldArrivals(spans_ns=[{}, {}], arrivals=[[], []], offsets_ns=[0.0, 0.0], timed_through=untimed)


def test_on_gpu_the_watch_flags_own_work_of_steps_nccl_has_not_timed_and_logs_them_apart(
    tmp_path: Path, capsys
) -> None:
    w = UntimedWatch(tmp_path, slow_ms=50.0)
    w.run(0, 11)  # intervals end at 7 (steps 5-7: none timed) and 11 (5-8 timed, 9-11 not)
    w.close()
    assert capsys.readouterr().out.splitlines() == [
        "watch: step 7: rank 1 (b) is a straggler: data +50.0 ms/step over the other ranks' median, 50.0 ms/step "
        "late, 50.0 beyond its peers (bound 8.0 ms), late in 3/3 steps 5-7, by own work alone: NCCL has not "
        "timed their collectives yet",
    ]
    first, second = watch_lines(tmp_path)
    assert first["steps"] == [5, 7] and first["own_work_only"] is True and "ahead" not in first
    assert (
        second["steps"] == [5, 8] and "own_work_only" not in second and [s["rank"] for s in second["stragglers"]] == [1]
    )
    assert second["ahead"]["steps"] == [9, 11] and second["ahead"]["own_work_only"] is True
    assert w.flags == [{"step": 7, "rank": 1, "host": "b", "phase": "data", "late_ms": 50.0}]
    assert w.bound_ms == pytest.approx(8.0)


def test_on_cpu_the_watch_applies_the_collectors_bound(tmp_path: Path, capsys) -> None:
    # One rule on every device: on CPU too the bound is the collector's 8% of the 100 ms step.
    # Rank 1's data phase 20 ms longer is over it in its first interval, and gone once it is not.
    w = TwoRankWatch(tmp_path, slow_ms=20.0, cpu=True)
    w.run(0, 7)
    w.slow_ms = 0.0
    w.run(8, 11)
    w.close()
    assert capsys.readouterr().out.splitlines() == [
        "watch: step 7: rank 1 (b) is a straggler: data +20.0 ms/step over the other ranks' median, 20.0 ms/step "
        "late, 20.0 beyond its peers (bound 8.0 ms), late in 3/3 steps 5-7",
        "watch: step 11: rank 1 (b) is no longer a straggler (steps 8-11)",
    ]
    lines = watch_lines(tmp_path)
    assert [(line["step"], line["threshold_ms"]) for line in lines] == [(7, 8.0), (11, 8.0)]
    assert "material_threshold_ms" not in lines[0] and "sustained" not in lines[0]["stragglers"][0]
    assert [(f["step"], f["rank"]) for f in w.summary()["flags"]] == [(7, 1)]


def test_a_new_straggler_books_one_window_after_the_scheduled_one(tmp_path: Path, capsys) -> None:
    w = TwoRankWatch(tmp_path, slow_ms=50.0, capture=True)
    with w.recorder:
        w.run(0, 11)
    # flagged after step 7; steps 9-13 are the scheduled window's warm-up and record (defaults)
    assert w.captures == [{"first": 16, "last": 18, "watch_step": 7, "ranks": [1]}]
    assert [(c.start, c.first, c.last) for c in w.recorder.captures] == [(14, 16, 18)]
    assert "watch: step 7: tracing steps 16-18 on every rank (capture 1 of at most 1)" in capsys.readouterr().out


def test_a_capture_is_booked_where_the_schedule_leaves_room(tmp_path: Path) -> None:
    # Scheduled window: wait 9, warm-up 2, record steps 11-13 (the defaults).
    rec = TraceRecorder(ProfilerConfig(), run_dir=tmp_path, rank=0, host="a", cuda=False, metadata={})
    assert rec.plan_capture(5, 40, {}) is None  # the profiler is not running
    with rec:
        first = rec.plan_capture(3, 40, {"ranks": [1]})
        assert (first.start, first.first, first.last) == (3, 5, 7)  # warm-up 3-4, recorded 5-7: before step 9
        second = rec.plan_capture(8, 40, {})
        assert (second.start, second.first, second.last) == (14, 16, 18)  # after the scheduled window
        assert rec.plan_capture(37, 40, {}) is None  # 5 steps do not fit in 37-40
        assert [rec._action(s).name for s in (2, 3, 5, 7, 8, 9, 11, 13, 14, 18)] == [
            "NONE",
            "WARMUP",
            "RECORD",
            "RECORD_AND_SAVE",
            "NONE",
            "WARMUP",
            "RECORD",
            "RECORD_AND_SAVE",
            "WARMUP",
            "RECORD_AND_SAVE",
        ]


def test_the_watch_jitter_is_the_collectors_jitter() -> None:
    assert float(median(torch.tensor([3.0, 1.0, 2.0, 10.0]), dim=0)) == 2.5  # statistics.median's, not torch's 2.0
    gen = torch.Generator().manual_seed(3)
    for ranks, n in ((2, 2), (3, 7), (5, 10), (4, 1)):
        step_ms = torch.rand((ranks, n), generator=gen, dtype=torch.float64) * 100
        assert jitter_ms(step_ms) == pytest.approx(run_jitter_ms(step_ms.tolist()), abs=1e-9)


def test_the_collector_reads_the_watch_record_from_run_json_and_skips_what_is_malformed(tmp_path: Path) -> None:
    assert read_watch([tmp_path]) is None  # no run.json
    (tmp_path / "run.json").write_text(
        json.dumps(
            {
                "watch": {
                    "every": 10,
                    "intervals": 4,
                    "judged_steps": [10, 49],
                    "flags": [{"step": 49, "rank": 2, "host": "a", "phase": "data"}, {"step": "x"}, 7],
                    "captures": [{"first": 53, "last": 55, "watch_step": 49, "ranks": [2]}, {"first": 1}],
                }
            }
        )
    )
    watch = read_watch([tmp_path])
    assert watch == WatchRecord(
        every=10,
        intervals=4,
        judged_steps=[10, 49],
        flags=[WatchFlagRecord(step=49, rank=2, host="a", phase="data")],
        captures=[CaptureRecord(first=53, last=55, watch_step=49, ranks=[2])],
    )
    assert watch_line(watch) == (
        "every 10 steps, 4 interval(s) judged; straggler(s): rank 2 at step 49 (data); traced steps 53-55"
    )
    for odd in ([49, 10], [10], "10-49"):  # a hand-edited range reads as none
        (tmp_path / "run.json").write_text(json.dumps({"watch": {"every": 10, "judged_steps": odd}}))
        odd_watch = read_watch([tmp_path])
        assert odd_watch is not None and odd_watch.judged_steps is None
    (tmp_path / "run.json").write_text(json.dumps({"watch": {"every": 0, "intervals": 0, "flags": [], "captures": []}}))
    assert read_watch([tmp_path]) is None  # the watch was off


def test_hf_s_forward_backward_phase_holds_ddps_collectives_and_is_judged_by_own_work() -> None:
    # A Trainer's steps: data, forward_backward (forward and backward together, holding DDP's
    # all-reduce), optimizer. Every rank's forward_backward lasts 80 ms (the punctual ones wait
    # in it); rank 1 spends 40 ms of CPU time there against the others' 10.
    rows = []
    for r in range(3):
        cpu = {"data": 5.0, "forward_backward": 40.0 if r == 1 else 10.0, "optimizer": 5.0}
        recs = [
            {
                "step": s,
                "step_ms": 100.0,
                "phases_ms": {"data": 10.0, "forward_backward": 80.0, "optimizer": 10.0},
                "phases_cpu_ms": cpu,
            }
            for s in range(10, 18)
        ]
        rows.append(pack_rows([step_row(rec) for rec in recs], 8))
    own = own_work_phases("ddp")
    assert "forward_backward" not in own
    v = judge_tables(
        torch.stack(rows), {}, own, noise=SHARED_CPU, th=Thresholds(), held_phases=COLLECTIVE_PHASES["ddp"]
    )
    [s] = v.stragglers
    assert (s.rank, s.phase, round(s.late_ms, 6)) == (1, "forward_backward", 30.0)


@pytest.mark.slow
def test_the_watch_s_exchange_in_a_trace_window_is_marked_and_not_counted_as_the_job_s(log_dir: Path) -> None:
    """The window traces steps 11-18; the watch exchanges after step 14, in step 15's span. Its
    all-gathers run inside the main thread's harness:watch range, and the collector leaves them
    out of the job's collectives (DDP's all-reduces only) and the range out of the phases. The
    recorder is on (the watch reads it), but the job has no group smaller than the world but the
    watch's, so no window has a groups file beside it: the collector would not read one."""
    import gzip

    from harness.paths import WATCH_RANGE, groups_path, list_traces
    from harness.traces.read.parse import parse_trace

    args = ["--mode", "torch", "--steps", "20", "--watch-every", "5", "--wait", "10", "--warmup", "1"]
    run = run_harness([*args, "--active", "8"], log_dir)
    for path in list_traces(run.dir):
        events = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
        watch = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == WATCH_RANGE]
        gathers = [e["ts"] for e in events if e["name"] == "gloo:all_gather"]
        assert len(watch) == 1 and gathers and all(watch[0][0] <= t <= watch[0][1] for t in gathers)
        trace = parse_trace(path)
        assert {c.name for c in trace.comms} == {"allreduce"}
        assert all("watch" not in s.phases_us for s in trace.steps)
        assert not groups_path(path).exists()
