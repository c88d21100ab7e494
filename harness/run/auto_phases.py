"""Phases found by themselves: `harness.Run(model=..., optimizer=...)` marks a step's phases from
hooks on the model, on backward and on the optimizer, so a loop needs only `with run.step():`.

The boundaries, each on the loop's thread while a step is open and no phase the user marked is:
1. the step starts: `data`;
2. the model's forward starts (a forward pre-hook on the module given; its outermost call): `forward`;
3. that forward ends (its forward hook, which runs even when forward raises): `loss`;
4. backward is called from the loop's thread (`torch.autograd.backward`, which `Tensor.backward`
   calls; its outermost call): `backward`, until it returns, DDP's and FSDP's waits for their
   reductions at its end included;
5. backward returns: the phase that came after this backward in the previous step, `data` where
   a forward came next (gradient accumulation's next micro-batch), else `optimizer` (clipping,
   unscaling: the optimizer step's preparation); the first step: `optimizer`;
6. the optimizer's step starts (`Optimizer.register_step_pre_hook`): `optimizer`; it ends (the
   post hook): no phase until the next boundary or the step's end.
A phase that comes back within a step (several micro-batches) is timed over all its passes, as a
phase marked twice by hand. A phase the user marks by hand wins inside its range: no boundary
moves while it is open. Forwards inside backward (activation checkpointing's recomputation) and
backwards inside forward are not boundaries.

Cost: each boundary is a Python call that reads the step clock, as a hand-marked phase does: no
device sync, no tensor, nothing kept per step beyond the previous step's order of what followed
each backward. Under torch.compile the hooks run outside the compiled graph
(`torch.compiler.disable`): hooked on the compiled module, they run around it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# The phases the boundaries open (paths.STEP_PHASES' names; no h2d: copies to the device are
# part of data until the model's forward starts).
DATA, FORWARD, LOSS, BACKWARD, OPTIMIZER = "data", "forward", "loss", "backward", "optimizer"


@dataclass
class Sequencer:
    """Which phase each boundary opens (module docstring, 1-6): pure, one per run.

    `followed`: in the previous step, the phase that came after each backward, in order;
    `seen`: the same, so far, in this step."""

    followed: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    after_backward: bool = False  # the open phase is the one a backward's return opened

    def step_starts(self) -> str:
        if self.seen:
            self.followed = self.seen
        self.seen = []
        self.after_backward = False
        return DATA

    def forward_starts(self) -> str:
        self._came(FORWARD)
        return FORWARD

    def optimizer_starts(self) -> str:
        self._came(OPTIMIZER)
        return OPTIMIZER

    def backward_returns(self) -> str:
        """The phase after this step's n-th backward: what followed the n-th in the previous step."""
        n = len(self.seen)
        self.after_backward = True
        return self.followed[n] if n < len(self.followed) else OPTIMIZER

    def _came(self, phase: str) -> None:
        """What came after a backward, recorded once per backward (a forward: data, the next
        micro-batch's loading; the optimizer: its preparation)."""
        if self.after_backward:
            self.seen.append(DATA if phase == FORWARD else OPTIMIZER)
            self.after_backward = False


class PhaseSink:
    """What the boundaries act on (harness.Run): whether one may move now, and the phase to open."""

    def auto_ready(self) -> bool:  # a step is open, on the loop's thread, and no hand-marked phase is
        raise NotImplementedError

    def auto_begin(self, name: str) -> None:  # open `name` (the open automatic phase ends first)
        raise NotImplementedError

    def auto_end(self, name: str) -> None:  # end the open phase if it is the automatic `name`
        raise NotImplementedError


class AutoPhases:
    """The hooks behind the boundaries, on one model and any optimizers; `remove()` takes them off."""

    def __init__(self, sink: PhaseSink) -> None:
        self.sink = sink
        self.order = Sequencer()
        self.thread = threading.get_ident()  # the loop's: only its forwards and backwards count
        self._forward_depth = 0
        self._backward_depth = 0
        self._handles: list[Any] = []
        self._models: list[int] = []
        self._optimizers: list[int] = []
        self._original: Callable[..., Any] | None = None  # torch.autograd.backward before the run
        self._wrapper: Callable[..., Any] | None = None  # what the run put in its place
        self._active = False

    # -- hooks -------------------------------------------------------------------------------

    def attach_model(self, model: torch.nn.Module) -> None:
        if id(model) in self._models:
            return
        self._models.append(id(model))
        self._handles.append(model.register_forward_pre_hook(torch.compiler.disable(self._forward_pre)))
        self._handles.append(model.register_forward_hook(torch.compiler.disable(self._forward_post), always_call=True))
        self._patch_backward()

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._optimizers:
            return
        self._optimizers.append(id(optimizer))
        self._handles.append(optimizer.register_step_pre_hook(self._optimizer_pre))
        self._handles.append(optimizer.register_step_post_hook(self._optimizer_post))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._active = False  # a wrapper someone else's patch keeps calls the original from now on
        if self._original is not None and torch.autograd.backward is self._wrapper:
            torch.autograd.backward = self._original

    def step_starts(self) -> None:
        """A step opened: its data phase; the depths start again (a forward that raised)."""
        self._forward_depth = self._backward_depth = 0
        if self.sink.auto_ready():
            self.sink.auto_begin(self.order.step_starts())

    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._mine():
            return
        self._forward_depth += 1
        if self._forward_depth == 1 and self._backward_depth == 0 and self.sink.auto_ready():
            self.sink.auto_begin(self.order.forward_starts())

    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._mine():
            return
        self._forward_depth = max(self._forward_depth - 1, 0)
        if self._forward_depth == 0 and self._backward_depth == 0 and self.sink.auto_ready():
            self.sink.auto_end(FORWARD)
            if self.sink.auto_ready():
                self.sink.auto_begin(LOSS)

    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._mine() and self.sink.auto_ready():
            self.sink.auto_begin(self.order.optimizer_starts())

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._mine() and self.sink.auto_ready():
            self.sink.auto_end(OPTIMIZER)

    def _patch_backward(self) -> None:
        """`torch.autograd.backward` wrapped for the run (Tensor.backward looks it up at each call)."""
        if self._wrapper is not None:
            return
        self._original, self._wrapper, self._active = torch.autograd.backward, self._backward, True
        torch.autograd.backward = self._wrapper

    def _backward(self, *args: Any, **kwargs: Any) -> Any:
        original = self._original
        assert original is not None
        if not self._active or not self._mine() or self._backward_depth or self._forward_depth:
            return original(*args, **kwargs)
        self._backward_depth = 1
        if self.sink.auto_ready():
            self.sink.auto_begin(BACKWARD)
        try:
            return original(*args, **kwargs)
        finally:
            self._backward_depth = 0
            if self.sink.auto_ready():
                self.sink.auto_end(BACKWARD)
                if self.sink.auto_ready():
                    self.sink.auto_begin(self.order.backward_returns())
