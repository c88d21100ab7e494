"""What `Run.watch_gradients`' hooks cost a backward pass (harness/run/grads_ready.py): the same
model's backward timed with and without them, side by side, alternating, on this machine's CPU.

    python bench/grads_hook.py                       # 200 small layers (400 parameters)
    python bench/grads_hook.py --layers 50 --reps 30

The hooks run on the host (autograd's thread) whatever the device, one Python call per parameter
per pass and one `_will_engine_execute_node` sweep on its first; tiny layers make the backward
itself short, so the difference is the hooks' own time. Prints the median backward with and
without, their difference per pass and per parameter.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.run.grads_ready import GradientsReady  # noqa: E402


def backward_s(model: nn.Module, x: torch.Tensor, passes: int) -> float:
    """Seconds per backward pass over `passes` passes (forward not timed)."""
    total = 0.0
    for _ in range(passes):
        loss = model(x).sum()
        t0 = time.perf_counter()
        loss.backward()
        total += time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
    return total / passes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=200, help="Linear(8, 8) layers (2 parameters each)")
    p.add_argument("--reps", type=int, default=20, help="alternating repetitions of each variant")
    p.add_argument("--passes", type=int, default=20, help="backward passes per repetition")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(args.layers)))
    x = torch.randn(4, 8)
    params = sum(1 for _ in model.parameters())
    calls = 0

    def ready() -> None:
        nonlocal calls
        calls += 1

    hooks = GradientsReady(ready)
    off: list[float] = []
    on: list[float] = []
    backward_s(model, x, args.passes)  # warm-up
    for _ in range(args.reps):
        off.append(backward_s(model, x, args.passes))
        hooks.attach(model)
        on.append(backward_s(model, x, args.passes))
        hooks.detach()
    assert calls == args.reps * args.passes, calls  # one call per pass
    base, hooked = statistics.median(off), statistics.median(on)
    print(f"{args.layers} layers, {params} parameters, {args.reps} x {args.passes} passes each")
    print(f"backward without hooks {base * 1e3:8.3f} ms, with {hooked * 1e3:8.3f} ms (median)")
    print(f"hooks: {(hooked - base) * 1e6:8.1f} us a pass, {(hooked - base) / params * 1e6:.2f} us a parameter")


if __name__ == "__main__":
    main()
