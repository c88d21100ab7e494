"""The step clock's run-queue wait per step (harness/run/schedstat.py), on a real contended core."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.run.schedstat import RunQueueClock
from harness.run.timing import StepClock

pytestmark = pytest.mark.skipif(RunQueueClock().read_ms() is None, reason="no schedstat here")


def _busy(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def test_waiting_for_a_shared_core_is_counted_and_sleeping_is_not() -> None:
    """This thread and a busy process pinned to one core: in 200 ms of wall time busy, the
    thread waits about half of it for the core; asleep, it waits for nothing."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    rival = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})  # this thread only
        time.sleep(0.2)  # the rival is pinned and spinning
        clock = StepClock(cuda=False)
        clock.start(0)
        _busy(0.2)
        clock.mark("forward")
        time.sleep(0.1)
        clock.mark("backward")
        clock.finish()
        [rec] = clock.poll()
    finally:
        os.sched_setaffinity(0, before)
        rival.kill()
        rival.wait()
    # wide margins: the core is shared with one rival, so about 100 of the 200 ms busy, none of
    # the sleep (not runnable); read at the step's start and end only, not at each phase
    assert 30.0 < rec["runq_ms"] < 200.0, rec
    assert "phases_runq_ms" not in rec


def test_a_gpu_clock_reads_no_run_queue() -> None:
    assert StepClock(cuda=True)._runq is None


def test_a_step_s_wait_for_a_core_runs_from_the_previous_step_s_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """One schedstat read a step, at its end; the first step also reads at its start: the loop's
    time between steps is in the next step's wait, as it is in its way to the next collective."""
    readings = iter([1.0, 3.0, 4.5, 7.0])  # run-queue totals in ms, one per read
    clock = StepClock(cuda=False)
    assert clock._runq is not None
    monkeypatch.setattr(clock._runq, "read_ms", lambda: next(readings))
    for step in range(3):
        clock.start(step)
        clock.mark("forward")
        clock.finish()
    assert [rec["runq_ms"] for rec in clock.poll()] == [2.0, 1.5, 2.5]
    assert next(readings, None) is None  # four reads for three steps


def test_only_the_steps_asked_read_the_run_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps not traced read no schedstat (`runq=False`: no figure, no read); the first step read
    after them reads at its start, the next ones from the step before's end."""
    readings = iter([10.0, 12.0, 13.0, 20.0, 21.5])
    clock = StepClock(cuda=False)
    assert clock._runq is not None
    monkeypatch.setattr(clock._runq, "read_ms", lambda: next(readings))
    for step, runq in enumerate([False, True, True, False, True]):
        clock.start(step, runq=runq)
        clock.mark("forward")
        clock.finish()
    assert [rec.get("runq_ms") for rec in clock.poll()] == [None, 2.0, 1.0, None, 1.5]
    assert next(readings, None) is None  # five reads for three steps read
