"""A plain DDP (or FSDP2) training loop profiled with `harness.Run`: the lines a user adds to their
own loop are marked `# harness`. Runs under torchrun on CPU (gloo) or on GPUs (NCCL) unchanged.

    torchrun --nproc_per_node 2 examples/plain_loop.py --log-dir profiler_logs --run-name mine --steps 40 \\
        --slow-rank 1 --slow-ms 30
    python -m harness.collect profiler_logs/mine      # names rank 1, slow in its data phase

--slow-rank R --slow-ms MS makes rank R's input pipeline slow (its dataset sleeps for each batch);
--hang-rank R --hang-step S stops rank R for good in step S (the others' all-reduce times out
after --timeout seconds, and the collector's hang report names it from the Flight Recorder).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import harness  # harness


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
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model = fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    delay = args.slow_ms / 1e3 / args.batch_size if rank == args.slow_rank else 0.0
    loader = DataLoader(RandomTokens(args.batch_size * args.steps, 128, delay), batch_size=args.batch_size)

    options = {"watch_every": args.watch_every} if args.watch_every is not None else {}
    with harness.Run(
        run_name=args.run_name,
        log_dir=args.log_dir,
        steps=args.steps,  # harness
        samples_per_step=args.batch_size,
        parallel="fsdp" if args.fsdp else "ddp",
        job_name="plain-fsdp" if args.fsdp else "plain-ddp",
        **options,
    ) as run:
        run.watch_gradients(model)  # harness: on a GPU under DDP, the watch sees a rank slow in backward
        batches = iter(loader)
        for step in range(args.steps):
            with run.step():  # harness
                with run.phase("data"):  # harness
                    x, y = next(batches)
                    x, y = x.to(device), y.to(device)
                with run.phase("forward"):  # harness
                    if rank == args.hang_rank and step == args.hang_step:
                        time.sleep(10 * args.timeout)  # never enters this step's all-reduce
                    loss = loss_fn(model(x), y)
                with run.phase("backward"):  # harness
                    loss.backward()
                with run.phase("optimizer"):  # harness
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
