"""A training loop written the way torch.profiler's tutorials show, with nothing of the harness in
it: `record_function` phases, `tensorboard_trace_handler`, a schedule, and a loop that `break`s
and stops the profiler mid-window. Run under torchrun (gloo on CPU); rank SLOW_RANK sleeps
SLOW_MS in its forward phase every step.

    torchrun --nproc_per_node 2 tests/user_loop.py OUT_DIR [SLOW_RANK SLOW_MS]
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler


def main() -> None:
    out = sys.argv[1]
    slow_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    slow_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    # two gradient buckets (about 0.5 and 0.6 MB): two all-reduces in flight at once on gloo
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.5)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    prof = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=6),
        on_trace_ready=tensorboard_trace_handler(out),
    )
    prof.start()
    for step in range(100):
        if step == 6:  # the loop ends inside the profiler's window: the open step is cut short
            break
        with record_function("data"):
            batch, target = x + 0.01 * step, y
        with record_function("forward"):
            if rank == slow_rank:
                time.sleep(slow_ms / 1e3)
            out_t = ddp(batch)
        with record_function("loss"):
            loss = loss_fn(out_t, target)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad()
        prof.step()
    prof.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
