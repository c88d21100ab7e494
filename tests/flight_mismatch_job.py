"""A tiny torchrun job for tests/test_flight.py: two ranks all-reduce tensors of different shapes
(12 floats as [12] on rank 0, as [3, 4] on rank 1) at their 3rd collective, then each writes its
Flight Recorder dump through the harness's own code path (harness.run.flight), as a harness rank
does when a collective fails. Same bytes, so gloo completes it (different byte counts make gloo
abort the process from its own thread, before Python can dump); the recorder sees the shapes.

Usage: torchrun --nproc_per_node 2 tests/flight_mismatch_job.py RUN_DIR
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from harness.run import flight
from harness.write_faults import FaultLog


def main() -> None:
    run_dir = Path(sys.argv[1])
    flight.enable(2000, "gloo")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    progress = flight.Progress(step=0, phase="backward")
    reason = "end of test"
    try:
        for _ in range(2):
            dist.all_reduce(torch.ones(10))
        dist.all_reduce(torch.ones(12) if rank == 0 else torch.ones(3, 4))  # the mismatch
        dist.all_reduce(torch.ones(10))
    except RuntimeError as exc:
        reason = "hung" if flight.is_timeout(exc) else f"failed: {type(exc).__name__}"
    path = flight.write_dump(
        run_dir,
        rank=rank,
        world_size=world,
        backend="gloo",
        reason=reason,
        progress=progress,
        host="test",
        faults=FaultLog(rank=rank),
    )
    print(f"rank {rank}: {reason}: {path}", flush=True)
    os._exit(0)  # a gloo group left after a failed collective can block in its destructor


if __name__ == "__main__":
    main()
