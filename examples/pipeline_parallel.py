"""Pipeline parallelism (two stages, GPipe over microbatches) with data parallelism across the
pipelines, profiled with `harness.Run`: the lines a user adds are marked `# harness`. Runs under
torchrun on CPU (gloo) or on GPUs (NCCL) unchanged.

    torchrun --nproc_per_node 4 examples/pipeline_parallel.py --log-dir profiler_logs --run-name pp \\
        --steps 30 --slow-rank 0 --slow-ms 40
    python -m harness.collect profiler_logs/pp     # names rank 0 in forward, not rank 2 it held up

The first half of the ranks are stage 0, the second half stage 1; rank r of stage 0 and rank
r + world/2 of stage 1 are one pipeline. Each step, stage 0 runs its layers on each microbatch
and sends the activations to its stage-1 peer, which receives them, finishes the forward pass
and its loss, runs backward and sends the activations' gradients back; stage 0 receives them
and runs its own backward. Each stage's ranks then all-reduce their gradients (data
parallelism) and step their optimizer. --slow-rank R --slow-ms MS makes rank R's host sleep MS
(--slow-kind compute: run matmuls on its device for MS instead) at the start of its --slow-phase
(forward or backward) each step from --slow-from (every --slow-every-th step): its pipeline
peer waits for it at the receives (a slow stage 0 holds stage 1's forward, a slow stage 1 holds
stage 0's backward) and reaches its stage's all-reduce late by that wait.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import harness  # harness
from harness.train.faults import ComputeDelay  # the lab's injected compute: matmuls on a device


def stage_layers(stage: int, width: int, depth: int) -> nn.Sequential:
    """A stage's layers: `depth` Linear + GELU blocks; the last stage ends in a 10-way head."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    if stage == 1:
        layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def all_reduce_grads(params: list[nn.Parameter], group: object) -> None:
    """One all-reduce of every gradient over the stage's data-parallel group, averaged."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log-dir", default="profiler_logs")
    p.add_argument("--run-name", default=None)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4, help="blocks per stage")
    p.add_argument("--batch-size", type=int, default=64, help="samples per step, split into the microbatches")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-from", type=int, default=0, help="the first slowed step")
    p.add_argument("--slow-phase", choices=("forward", "backward"), default="forward")
    p.add_argument("--slow-kind", choices=("sleep", "compute"), default="sleep")
    p.add_argument("--slow-every", type=int, default=1, help="slow every k-th step from --slow-from")
    p.add_argument("--watch-every", type=int, default=None)
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", 1))
    if world < 2 or world % 2:
        p.error(f"two stages need an even world size of 2 or more, got {world}: run 2, 4, ... ranks")
    if args.slow_every < 1:
        p.error(f"--slow-every must be 1 or more, got {args.slow_every}")
    if args.microbatches < 1 or args.batch_size % args.microbatches:
        p.error(f"--microbatches {args.microbatches} must divide --batch-size {args.batch_size}")
    cuda = torch.cuda.is_available()
    harness.enable_flight_recorder()  # harness: names gloo's process groups for the collector
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    half = world // 2
    stage, place = divmod(rank, half)
    peer = rank + half if stage == 0 else rank - half
    # every rank makes every group, in one order (new_group's contract)
    dp_groups = [dist.new_group(list(range(s * half, (s + 1) * half))) for s in range(2)]
    dp_group = dp_groups[stage]

    torch.manual_seed(stage)  # a stage's weights, alike across its data-parallel group
    model = stage_layers(stage, args.width, args.depth).to(device)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(place)  # a pipeline's two stages read the same batch
    micro = args.batch_size // args.microbatches
    slow_ms = args.slow_ms if rank == args.slow_rank else 0.0
    compute = ComputeDelay(device) if args.slow_kind == "compute" else None

    def slow_down(step: int, phase: str) -> None:
        """The injected slowness, where this rank, step and phase have it."""
        due = step >= args.slow_from and (step - args.slow_from) % args.slow_every == 0
        if not slow_ms or phase != args.slow_phase or not due:
            return
        if compute is not None:
            compute.spend(slow_ms)
        else:
            time.sleep(slow_ms / 1e3)

    options = {"watch_every": args.watch_every} if args.watch_every is not None else {}
    with harness.Run(
        run_name=args.run_name,
        log_dir=args.log_dir,
        steps=args.steps,  # harness
        warmup_steps=2,  # the first steps' one-off costs (lazy init, first allocations) stay out of the figures
        samples_per_step=args.batch_size,
        parallel="fsdp",  # harness: communication inside forward and backward
        job_name="pipeline-parallel",
        **options,
    ) as run:
        for step in range(args.steps):
            with run.step():  # harness
                with run.phase("data"):  # harness
                    x = torch.randn(args.batch_size, args.width, generator=data).to(device)
                    y = torch.randint(0, 10, (args.batch_size,), generator=data).to(device)
                kept: list[tuple[torch.Tensor, torch.Tensor]] = []
                with run.phase("forward"):  # harness
                    slow_down(step, "forward")
                    for m in range(args.microbatches):
                        if stage == 0:
                            out = model(x[m * micro : (m + 1) * micro])
                            dist.send(out.detach().contiguous(), peer)
                            kept.append((out, out))
                        else:
                            act = torch.empty(micro, args.width, device=device)
                            dist.recv(act, peer)
                            act.requires_grad_(True)
                            loss = loss_fn(model(act), y[m * micro : (m + 1) * micro])
                            kept.append((act, loss))
                with run.phase("backward"):  # harness
                    slow_down(step, "backward")
                    for inp, out in kept:
                        if stage == 0:
                            grad = torch.empty_like(out)
                            dist.recv(grad, peer)
                            out.backward(grad)
                        else:
                            out.backward()
                            dist.send(inp.grad.contiguous(), peer)
                    all_reduce_grads(params, dp_group)
                with run.phase("optimizer"):  # harness
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
