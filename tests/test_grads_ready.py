"""The call at a backward pass's last gradient (harness/run/grads_ready.py), where a DDP rank's
own work in backward ends: once per pass, whatever part of the model the pass reaches, after every
gradient it computes is in `.grad`, also under DDP's reducer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness.run.grads_ready import GradientsReady

from jobs import free_port


def three_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))


class Watcher:
    """Records, at each call, which parameters already hold a gradient."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls: list[list[bool]] = []
        self.ready = GradientsReady(self.on_ready)
        self.hooked = self.ready.attach(model)

    def on_ready(self) -> None:
        self.calls.append([p.grad is not None for p in self.model.parameters()])


def test_it_calls_once_per_backward_after_every_gradient_is_accumulated() -> None:
    m = three_layers()
    w = Watcher(m)
    assert w.hooked == 6
    x = torch.randn(2, 4)
    m(x).sum().backward()
    assert w.calls == [[True] * 6]
    m(x).sum().backward()  # gradient accumulation: each pass is a pass
    assert len(w.calls) == 2


def test_a_pass_that_reaches_part_of_the_model_calls_at_its_own_last_gradient() -> None:
    m = three_layers()
    w = Watcher(m)
    x = torch.randn(2, 4)
    m[1](m[0](x)).sum().backward()  # the last layer is not in the graph
    assert w.calls == [[True, True, True, True, False, False]]
    m.zero_grad(set_to_none=True)
    m(x).sum().backward(inputs=[m[2].weight])  # only one gradient asked for
    assert w.calls[-1] == [False, False, False, False, True, False]
    with torch.no_grad():
        m(x)  # no pass: no call
    assert len(w.calls) == 2
    m(x).sum().backward()  # the counts of the partial passes did not carry over
    assert len(w.calls) == 3 and w.calls[-1] == [True] * 6


@pytest.mark.parametrize("reentrant", [True, False])
def test_under_activation_checkpointing_the_last_call_has_every_gradient(reentrant: bool) -> None:
    """A reentrant checkpoint runs its segment's backward as a pass of its own, inside the outer
    one: each pass calls at its own last gradient, and the last call (the one the step clock
    keeps) comes once every gradient is in."""
    from torch.utils.checkpoint import checkpoint

    m = three_layers()
    w = Watcher(m)
    x = torch.randn(2, 4, requires_grad=True)
    m[2](checkpoint(m[1], m[0](x), use_reentrant=reentrant)).sum().backward()
    assert len(w.calls) == (2 if reentrant else 1)
    assert w.calls[-1] == [True] * 6
    assert w.ready._passes == {}


def test_frozen_parameters_are_not_waited_for_and_detach_removes_the_hooks() -> None:
    m = three_layers()
    m[0].requires_grad_(False)
    w = Watcher(m)
    assert w.hooked == 4
    m(torch.randn(2, 4)).sum().backward()
    assert len(w.calls) == 1
    w.ready.detach()
    m(torch.randn(2, 4)).sum().backward()
    assert len(w.calls) == 1


class FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("out of memory (a batch the loop skips)")


def test_a_pass_that_raised_leaves_a_count_that_the_next_step_drops() -> None:
    m = three_layers()
    w = Watcher(m)
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="out of memory"):
        m[2](FailingBackward.apply(m[1](m[0](x)))).sum().backward()  # the last layer's gradients only
    assert w.calls == [] and len(w.ready._passes) == 1
    w.ready.new_step()
    assert w.ready._passes == {}
    m(x).sum().backward()
    assert len(w.calls) == 1 and w.ready._passes == {}


def test_under_ddp_it_calls_once_per_backward_beside_the_reducers_hooks() -> None:
    """A one-rank gloo group: DDP's reducer hooks the same gradient accumulators; the pass still
    calls once, with every gradient in place, and DDP's all-reduce still averages them."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = DDP(three_layers(), bucket_cap_mb=1e-5)  # one bucket per parameter: many all-reduces
        w = Watcher(ddp)
        ddp(torch.randn(2, 4)).sum().backward()
        ddp(torch.randn(2, 4)).sum().backward()
        assert w.calls == [[True] * 6, [True] * 6]
    finally:
        dist.destroy_process_group()


def test_run_hooks_gradients_only_where_the_gpu_watch_reads_them(tmp_path: Path) -> None:
    """`Run.watch_gradients` before start() is a mistake said in one line; on CPU (the watch reads
    CPU time and arrivals there) it hooks nothing."""
    from harness.run.run import Run

    run = Run(log_dir=str(tmp_path), run_name="grads", profile=False, quiet=True)
    with pytest.raises(RuntimeError, match="after start"):
        run.watch_gradients(three_layers())
    with run:
        assert run.watch_gradients(three_layers()) is False
