"""Waiting at point-to-point ops, per phase (harness/train/p2p_wait.py and the step clock's
phases_p2p_ms): exact figures with scripted clocks and events; the real gloo waits are checked
on the pipeline example (tests/test_api.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from harness.train import p2p_wait
from harness.train.p2p_wait import P2PWaitTimer
from harness.train.timing import StepClock

SEND = int(torch._C._distributed_c10d.OpType.SEND)
ALLREDUCE = int(torch._C._distributed_c10d.OpType.ALLREDUCE)
COALESCED = int(torch._C._distributed_c10d.OpType.COALESCED)


class FakeWork:
    def __init__(self, op_type: int) -> None:
        self.op_type = op_type

    def _get_op_type(self) -> int:
        return self.op_type


def test_each_phase_adds_up_the_waits_made_in_it() -> None:
    # CPU: forward twice (5 + 2 ms of waits, then 3), backward once (4); a wait after the last
    # phase and one outside any step count nowhere.
    clock = StepClock(cuda=False)
    clock.add_p2p_wait(9.0)  # no step open
    clock.start(0)
    clock.add_p2p_wait(5.0)
    clock.add_p2p_wait(2.0)
    clock.mark("forward")
    clock.add_p2p_wait(4.0)
    clock.mark("backward")
    clock.add_p2p_wait(3.0)
    clock.mark("forward")
    clock.add_p2p_wait(7.0)  # the step's tail, after its last phase
    clock.finish()
    clock.start(1)
    clock.mark("forward")
    clock.finish()
    rec, quiet = clock.poll()
    assert rec["phases_p2p_ms"] == {"forward": 10.0, "backward": 4.0}
    assert "phases_p2p_ms" not in quiet


def test_on_gpu_a_wait_is_the_stall_between_its_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer records an event before and after the wait; the step clock resolves them with
    the step's (device ms, record order: step start 0, wait 2 -> 9, forward's end 10, end 11)."""
    from test_watch import scripted_events

    scripted_events(monkeypatch, [0.0, 2.0, 9.0, 10.0, 11.0])
    clock = StepClock(cuda=True)
    timer = P2PWaitTimer(cuda=True, on_wait=clock.add_p2p_wait)
    clock.start(0)
    waited: list[Any] = []
    assert timer._timed(lambda work: waited.append(work), "work", (), {}) is None
    clock.mark("forward")
    clock.finish()
    [rec] = clock.poll()
    assert waited == ["work"]
    assert rec["phases_p2p_ms"] == {"forward": 7.0}


def test_only_point_to_point_works_are_timed_and_a_batch_only_where_noted() -> None:
    timer = P2PWaitTimer(cuda=False, on_wait=lambda ms: None)
    assert timer._counts(FakeWork(SEND))
    assert not timer._counts(FakeWork(ALLREDUCE))
    batch = FakeWork(COALESCED)
    assert not timer._counts(batch)  # a coalesced collective, say
    timer._note_batch([batch, FakeWork(SEND)])
    assert list(timer._batches.values()) == [batch]
    assert timer._counts(batch) and not timer._batches
    assert not timer._counts(object())  # no op type


def test_a_cpu_wait_is_its_wall_time() -> None:
    waits: list[float] = []
    timer = P2PWaitTimer(cuda=False, on_wait=waits.append)
    timer._timed(lambda work: time.sleep(0.02), FakeWork(SEND), (), {})
    assert len(waits) == 1 and waits[0] >= 19.0  # at least the sleep


def test_install_wraps_torch_s_wait_once_and_uninstall_puts_it_back() -> None:
    own_wait, own_batch = dist.Work.wait, dist.batch_isend_irecv
    first = P2PWaitTimer(cuda=False, on_wait=lambda ms: None)
    second = P2PWaitTimer(cuda=False, on_wait=lambda ms: None)
    try:
        assert first.install()
        assert dist.Work.wait is not own_wait and dist.batch_isend_irecv is not own_batch
        assert not second.install()  # one at a time
        first.uninstall()
        assert dist.Work.wait is own_wait and dist.batch_isend_irecv is own_batch
        assert p2p_wait._active is None
        assert second.install()
    finally:
        first.uninstall()
        second.uninstall()
    assert dist.Work.wait is own_wait and dist.batch_isend_irecv is own_batch
