"""A plain DDP (or FSDP2) training loop profiled with `harness.Run`: the lines a user adds to their
own loop are marked `# harness`. Runs under torchrun on CPU (gloo) or on GPUs (NCCL) unchanged.

    torchrun --nproc_per_node 2 examples/plain_loop.py --log-dir profiler_logs --run-name mine --steps 40 \\
        --slow-rank 1 --slow-ms 30
    python -m harness.collect profiler_logs/mine      # names rank 1, slow in its data phase

--slow-rank R --slow-ms MS makes rank R slow by MS a step: in its input pipeline (its dataset
sleeps for each batch), or with --slow-phase forward|backward|optimizer in that phase;
--hang-rank R --hang-step S stops rank R for good in step S (the others' all-reduce times out
after --timeout seconds, and the collector's hang report names it from the Flight Recorder).

--auto-phases: the two-line form. `harness.Run(model=..., optimizer=...)` finds the phases itself
(data, forward, loss, backward, optimizer) and the loop marks only its steps. --compile runs the
model under torch.compile, --accumulate N takes N micro-batches a step.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import harness  # harness


class Pause(nn.Module):
    """Identity whose forward sleeps `forward_s` and whose backward sleeps `backward_s`: a rank
    slow in forward or in backward."""

    def __init__(self, forward_s: float = 0.0, backward_s: float = 0.0) -> None:
        super().__init__()
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_s:
            time.sleep(self.forward_s)
        return SleepInBackward.apply(x, self.backward_s) if self.backward_s else x


class SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class SlowSGD(torch.optim.SGD):
    """SGD whose step sleeps `pause_s` first: a rank slow in its optimizer step."""

    def __init__(self, params: Any, lr: float, pause_s: float) -> None:
        super().__init__(params, lr=lr)
        self.pause_s = pause_s

    def step(self, closure: Any = None) -> Any:
        if self.pause_s:
            time.sleep(self.pause_s)
        return super().step(closure)


class RandomTokens(Dataset):
    """Random inputs and labels; `delay_s` per sample: a slow input pipeline."""

    def __init__(self, n: int, width: int, delay_s: float) -> None:
        self.x, self.y = torch.randn(n, width), torch.randint(0, 10, (n,))
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log-dir", default="profiler_logs")
    p.add_argument("--run-name", default=None)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-phase", choices=["data", "forward", "backward", "optimizer"], default="data")
    p.add_argument("--auto-phases", action="store_true", help="Run(model=, optimizer=) finds the phases")
    p.add_argument("--compile", action="store_true", help="the model under torch.compile")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches a step (gradient accumulation)")
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a collective may wait for its peers")
    p.add_argument("--watch-every", type=int, default=None)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    harness.enable_flight_recorder()  # harness: before the process group, so a hang can be reported
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    slow_s = args.slow_ms / 1e3 if rank == args.slow_rank else 0.0
    passes = args.accumulate
    pause = Pause(
        forward_s=slow_s / passes if args.slow_phase == "forward" else 0.0,
        backward_s=slow_s / passes if args.slow_phase == "backward" else 0.0,
    )
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), pause, nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(
        device
    )
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model = fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    if args.compile:
        model = torch.compile(model)
    opt = SlowSGD(model.parameters(), lr=0.01, pause_s=slow_s if args.slow_phase == "optimizer" else 0.0)
    loss_fn = nn.CrossEntropyLoss()
    delay = slow_s / args.batch_size / passes if args.slow_phase == "data" else 0.0
    loader = DataLoader(RandomTokens(args.batch_size * args.steps * passes, 128, delay), batch_size=args.batch_size)

    options: dict[str, Any] = {"watch_every": args.watch_every} if args.watch_every is not None else {}
    if args.auto_phases:
        options.update(model=model, optimizer=opt)  # harness (the two-line form): the phases found by hooks
    with harness.Run(
        run_name=args.run_name,
        log_dir=args.log_dir,
        steps=args.steps,  # harness
        warmup_steps=2,  # the first steps' one-off costs (lazy init, torch.compile) stay out of the figures
        samples_per_step=args.batch_size,
        parallel="fsdp" if args.fsdp else "ddp",
        job_name="plain-fsdp" if args.fsdp else "plain-ddp",
        **options,
    ) as run:
        run.watch_gradients(model)  # harness: on a GPU under DDP, the watch sees a rank slow in backward

        def phase(name: str) -> Any:  # by hand, unless the phases are found by themselves
            return nullcontext() if args.auto_phases else run.phase(name)  # harness

        batches = iter(loader)
        for step in range(args.steps):
            with run.step():  # harness
                for k in range(passes):
                    # DDP reduces the gradients at the last micro-batch only (a forward under
                    # no_sync makes its backward reduce nothing)
                    sync = nullcontext() if args.fsdp or k == passes - 1 else model.no_sync()
                    with phase("data"):
                        x, y = next(batches)
                        x, y = x.to(device), y.to(device)
                    with phase("forward"):
                        if rank == args.hang_rank and step == args.hang_step:
                            time.sleep(10 * args.timeout)  # never enters this step's all-reduce
                        with sync:
                            loss = loss_fn(model(x), y) / passes
                    with phase("backward"):
                        loss.backward()
                with phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    # every rank done before any tears gloo down: a peer's last collective may still talk to it
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
