"""Tensor parallelism inside a host and data parallelism across hosts, written out as Megatron-LM
does it (column- then row-parallel linear layers, an all-reduce over the tensor-parallel group
ending each block's forward and another its backward; DDP over the data-parallel group), profiled
with `harness.Run`: the lines a user adds are marked `# harness`. Runs under torchrun on CPU
(gloo) or on GPUs (NCCL) unchanged.

    torchrun --nproc_per_node 4 examples/tensor_parallel.py --tp 2 --log-dir profiler_logs --run-name tp \\
        --steps 30 --slow-rank 1 --slow-ms 40 --slow-phase forward
    python -m harness.collect profiler_logs/tp     # names rank 1 in forward, not rank 0 it held

Ranks r and r + 1 (for --tp 2) are one tensor-parallel group, as the GPUs of one host would be;
the ranks at one place in every group are one data-parallel group. --slow-rank R --slow-ms MS
--slow-phase P makes rank R's host sleep MS in the middle of its forward or backward pass each
step from --slow-from: its tensor-parallel peers wait for it at the next all-reduce, and then
reach their data-parallel all-reduce late by that wait.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import harness  # harness


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over the tensor-parallel group in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    """All-reduce over the tensor-parallel group forward; identity in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _SleepInBackward(torch.autograd.Function):
    """Identity; sleeps `seconds` when its gradient passes (a slow backward on one rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class ParallelBlock(nn.Module):
    """x + RowParallel(gelu(ColumnParallel(x))): each rank holds 1/tp of the hidden units."""

    def __init__(self, width: int, tp: int, group: Any) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width // tp)
        self.down = nn.Linear(4 * width // tp, width, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.up(_CopyToGroup.apply(x, self.group)))
        return x + _ReduceFromGroup.apply(self.down(h), self.group)


class Model(nn.Module):
    def __init__(self, width: int, blocks: int, tp: int, group: Any) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ParallelBlock(width, tp, group) for _ in range(blocks))
        self.head = nn.Linear(width, 10)
        self.forward_sleep_s = 0.0
        self.backward_sleep_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if i == len(self.blocks) // 2:
                if self.forward_sleep_s:
                    time.sleep(self.forward_sleep_s)
                if self.backward_sleep_s:
                    x = _SleepInBackward.apply(x, self.backward_sleep_s)
            x = block(x)
        return self.head(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log-dir", default="profiler_logs")
    p.add_argument("--run-name", default=None)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tp", type=int, default=2, help="ranks per tensor-parallel group (divides the world)")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-phase", choices=("forward", "backward"), default="forward")
    p.add_argument("--slow-from", type=int, default=0, help="the first slowed step")
    p.add_argument("--watch-every", type=int, default=None)
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.tp < 1 or world % args.tp:
        p.error(f"--tp {args.tp} does not divide the world size {world}: give a divisor of it")
    cuda = torch.cuda.is_available()
    harness.enable_flight_recorder()  # harness: the watch reads each rank's arrivals at collectives from it
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # every rank makes every group, in one order (new_group's contract)
    tp_groups = [dist.new_group(list(range(g, g + args.tp))) for g in range(0, world, args.tp)]
    dp_groups = [dist.new_group(list(range(place, world, args.tp))) for place in range(args.tp)]
    tp_group, dp_group = tp_groups[rank // args.tp], dp_groups[rank % args.tp]
    dp_index = rank // args.tp

    torch.manual_seed(rank % args.tp)  # a shard's weights, alike across the data-parallel group
    model = Model(args.width, args.blocks, args.tp, tp_group)
    torch.manual_seed(0)
    model.head.reset_parameters()  # the head is replicated: alike on every rank
    model = model.to(device)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=dp_group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(dp_index)  # a tensor-parallel group's ranks read the same batch
    slow_s = args.slow_ms / 1e3 if rank == args.slow_rank else 0.0

    options = {"watch_every": args.watch_every} if args.watch_every is not None else {}
    with harness.Run(
        run_name=args.run_name,
        log_dir=args.log_dir,
        steps=args.steps,  # harness
        warmup_steps=2,  # the first steps' one-off costs (lazy init, first allocations) stay out of the figures
        samples_per_step=args.batch_size,
        parallel="fsdp",  # harness: collectives in forward and backward, as under FSDP
        job_name="tensor-parallel",
        **options,
    ) as run:
        for step in range(args.steps):
            slowed = step >= args.slow_from
            model.forward_sleep_s = slow_s if slowed and args.slow_phase == "forward" else 0.0
            model.backward_sleep_s = slow_s if slowed and args.slow_phase == "backward" else 0.0
            with run.step():  # harness
                with run.phase("data"):  # harness
                    x = torch.randn(args.batch_size, args.width, generator=data).to(device)
                    y = torch.randint(0, 10, (args.batch_size,), generator=data).to(device)
                with run.phase("forward"):  # harness
                    loss = loss_fn(ddp(x), y)
                with run.phase("backward"):  # harness
                    loss.backward()
                with run.phase("optimizer"):  # harness
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
