"""accelerate's own profiler (ProfileKwargs) in a 2-rank CPU job, rank 1 slow in its data phase:
the traces it writes (profile_<process index>.json) for tests/test_framework_traces.py.

    torchrun --nproc_per_node 2 tests/accelerate_job.py OUT_DIR
"""

from __future__ import annotations

import sys
import time

import torch
from accelerate import Accelerator, ProfileKwargs
from torch import nn
from torch.profiler import record_function

from jobs import FINISHED  # tests/ is this script's folder, first on sys.path


def main() -> None:
    schedule = {"wait": 1, "warmup": 1, "active": 3, "repeat": 1}
    acc = Accelerator(
        kwargs_handlers=[ProfileKwargs(activities=["cpu"], output_trace_dir=sys.argv[1], schedule_option=schedule)],
        cpu=True,
    )
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with acc.profile() as prof:
        for step in range(8):
            with record_function("data"):
                if acc.process_index == 1:
                    time.sleep(0.02)
                xb = x + step
            with record_function("forward"):
                loss = nn.functional.cross_entropy(model(xb), y)
            with record_function("backward"):
                acc.backward(loss)
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
        # The loop is done: say so here, since the exit below (profiler stop, accelerate's export
        # of profile_<index>.json, a barrier) can abort a rank after its export ("terminate called
        # without an active exception"). A missing or cut trace still fails the test's collect.
        print(f"{FINISHED} {acc.process_index}", flush=True)


if __name__ == "__main__":
    main()
