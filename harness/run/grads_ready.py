"""A call when a backward pass has produced every gradient of a model: where a DDP rank's own work
in backward ends and its wait for the all-reduce begins.

DDP all-reduces each bucket of gradients on its own stream as the bucket fills, beside backward's
kernels, and only the end of backward (the reducer's finalize) makes the compute stream wait for
those all-reduces. On the compute stream, then, everything up to the last gradient is the rank's
own work, and everything after it is waiting for the slowest rank's last bucket (and its
transfer). A CUDA event recorded when the last gradient is ready (timing.py's `mark_own_end`)
splits backward there, which the live watch needs on a GPU: backward's device time alone ends
together on every rank, the late one working and the others waiting.

`GradientsReady.attach` hooks each parameter that needs a gradient with a post-accumulate-grad
hook, which runs once the gradient is in `.grad` (where DDP's reducer takes it from) and is
handed the parameter, not the gradient. Algorithm, per backward pass (autograd's graph task):
1. on the pass's first hook call, expected = the parameters whose gradient accumulator the engine
   will run in this pass (a loss of part of the model, `inputs=`, unused parameters: fewer);
2. each hook call counts one; the call that reaches `expected` is the pass's last gradient:
   `on_ready()`.
With gradient accumulation every pass calls it, and the last call in a step counts. A pass that
raised before its last gradient leaves a count behind: `new_step` drops them.
Hooks run on autograd's thread for the device (on CUDA not the loop's), on the stream of the
parameter's gradient accumulator (the stream current when it was made: the loop's own, unless
the model was wrapped under another, as Lightning does). Either way the event cannot end after
backward's: autograd makes the caller's stream wait for the accumulators' streams before
`backward()` returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

# autograd's own: the running backward pass's id, and whether it will run a node
_graph_task = torch._C._current_graph_task_id
_will_run = torch._C._will_engine_execute_node


def _accumulator(param: torch.Tensor) -> Any:
    """The autograd node that accumulates `param`'s gradient (the engine runs it when the pass
    reaches the parameter)."""
    return param.view_as(param).grad_fn.next_functions[0][0]  # type: ignore[union-attr]


class GradientsReady:
    """Calls `on_ready` once a backward pass has accumulated every gradient it will (module
    docstring); `detach()` removes the hooks."""

    def __init__(self, on_ready: Callable[[], None]) -> None:
        self.on_ready = on_ready
        self._handles: list[Any] = []
        self._accumulators: list[Any] = []  # held: a parameter keeps only a weak reference to its node
        # graph task -> (the gradients it will accumulate, a counter of those it has)
        self._passes: dict[int, tuple[int, Iterator[int]]] = {}

    def attach(self, model: nn.Module) -> int:
        """Hook `model`'s parameters that need gradients; how many (0: nothing to watch)."""
        params = [p for p in model.parameters() if p.requires_grad]
        with torch.enable_grad():
            self._accumulators = [_accumulator(p) for p in params]
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in params]
        return len(params)

    def new_step(self) -> None:
        """Forget passes that never reached their last gradient (one that raised): a pass does
        not outlive its step."""
        self._passes.clear()

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._accumulators = [], []
        self._passes.clear()

    def _hook(self, _param: torch.Tensor) -> None:
        # No lock (one costs as much as the rest of the hook): each step below is one call into C
        # under the GIL, so hooks of one pass on two threads (parameters on two devices) still
        # count each gradient once and call once.
        task = _graph_task()
        state = self._passes.get(task)
        if state is None:  # the pass's first gradient: how many it will accumulate
            state = self._passes.setdefault(task, (sum(map(_will_run, self._accumulators)), itertools.count(1)))
        expected, seen = state
        if next(seen) == expected:
            self._passes.pop(task, None)
            self.on_ready()
