"""Waiting for communication, per phase (harness/run/comm_wait.py and the step clock's
phases_p2p_ms and phases_collective_wait_ms): exact figures with scripted clocks and events; the
real gloo waits are checked on the pipeline example (tests/test_api.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from harness.run import comm_wait
from harness.run.comm_wait import CommWaitTimer
from harness.run.timing import StepClock

SEND = int(torch._C._distributed_c10d.OpType.SEND)
ALLREDUCE = int(torch._C._distributed_c10d.OpType.ALLREDUCE)
COALESCED = int(torch._C._distributed_c10d.OpType.COALESCED)


class FakeWork:
    def __init__(self, op_type: int) -> None:
        self.op_type = op_type

    def _get_op_type(self) -> int:
        return self.op_type


def test_each_phase_adds_up_the_waits_made_in_it() -> None:
    # CPU: forward twice (5 + 2 ms at point-to-point ops, then 3), backward once (4, and 6 at a
    # collective); a wait after the last phase and one outside any step count nowhere.
    clock = StepClock(cuda=False)
    clock.add_comm_wait(9.0, True)  # no step open
    clock.start(0)
    clock.add_comm_wait(5.0, True)
    clock.add_comm_wait(2.0, True)
    clock.mark("forward")
    clock.add_comm_wait(4.0, True)
    clock.add_comm_wait(6.0, False)
    clock.mark("backward")
    clock.add_comm_wait(3.0, True)
    clock.mark("forward")
    clock.add_comm_wait(7.0, True)  # the step's tail, after its last phase
    clock.finish()
    clock.start(1)
    clock.mark("forward")
    clock.finish()
    rec, quiet = clock.poll()
    assert rec["phases_p2p_ms"] == {"forward": 10.0, "backward": 4.0}
    assert rec["phases_collective_wait_ms"] == {"backward": 6.0}
    assert "phases_p2p_ms" not in quiet and "phases_collective_wait_ms" not in quiet


def test_each_phase_says_whom_it_received_from_and_the_step_where_it_began() -> None:
    clock = StepClock(cuda=False)
    clock.start(0)
    clock.add_p2p_op(3)
    clock.add_p2p_op(1)
    clock.add_p2p_op(None)  # a send
    clock.add_p2p_op(3)
    clock.mark("forward")
    clock.add_p2p_op(-1)  # a receive whose source torch could not map
    clock.mark("backward")
    clock.finish()
    clock.start(1)  # a first stage: it sends before it receives
    clock.add_p2p_op(None)
    clock.add_p2p_op(2)
    clock.mark("forward")
    clock.finish()
    first, sender = clock.poll()
    assert first["phases_recv_from"] == {"forward": [1, 3]} and first["first_recv_from"] == 3
    assert sender["phases_recv_from"] == {"forward": [2]} and "first_recv_from" not in sender


def test_on_gpu_a_wait_is_the_stall_between_its_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer records an event before and after the wait; the step clock resolves them with
    the step's (device ms, record order: step start 0, wait 2 -> 9, forward's end 10, end 11)."""
    from test_watch import scripted_events

    scripted_events(monkeypatch, [0.0, 2.0, 9.0, 10.0, 11.0])
    clock = StepClock(cuda=True)
    timer = CommWaitTimer(cuda=True, on_wait=clock.add_comm_wait)
    clock.start(0)
    waited: list[Any] = []
    assert timer._timed(lambda work: waited.append(work), "work", (), {}, True) is None
    clock.mark("forward")
    clock.finish()
    [rec] = clock.poll()
    assert waited == ["work"]
    assert rec["phases_p2p_ms"] == {"forward": 7.0}


def test_point_to_point_works_are_told_from_collectives_and_a_batch_only_where_noted() -> None:
    timer = CommWaitTimer(cuda=False, on_wait=lambda ms, p2p: None)
    assert timer._is_p2p(FakeWork(SEND)) is True
    assert timer._is_p2p(FakeWork(ALLREDUCE)) is False
    batch = FakeWork(COALESCED)
    assert timer._is_p2p(batch) is False  # a coalesced collective, say
    timer._note_batch([batch, FakeWork(SEND)])
    assert list(timer._batches.values()) == [batch]
    assert timer._is_p2p(batch) is True and not timer._batches
    assert timer._is_p2p(object()) is None  # no op type: not timed


def test_a_cpu_wait_is_its_wall_time() -> None:
    waits: list[tuple[Any, bool]] = []
    timer = CommWaitTimer(cuda=False, on_wait=lambda ms, p2p: waits.append((ms, p2p)))
    timer._timed(lambda work: time.sleep(0.02), FakeWork(ALLREDUCE), (), {}, False)
    assert len(waits) == 1 and waits[0][0] >= 19.0 and waits[0][1] is False  # at least the sleep


def test_install_wraps_torch_s_wait_once_and_uninstall_puts_it_back() -> None:
    def current() -> tuple:
        return (dist.Work.wait, dist.batch_isend_irecv, dist.ProcessGroup.send, dist.ProcessGroup.recv)

    own = current()

    first = CommWaitTimer(cuda=False, on_wait=lambda ms, p2p: None)
    second = CommWaitTimer(cuda=False, on_wait=lambda ms, p2p: None)
    try:
        assert first.install()
        assert all(a is not b for a, b in zip(current(), own))
        assert not second.install()  # one at a time
        first.uninstall()
        assert all(a is b for a, b in zip(current(), own))
        assert comm_wait._active is None
        assert second.install()
    finally:
        first.uninstall()
        second.uninstall()
    assert all(a is b for a, b in zip(current(), own))
