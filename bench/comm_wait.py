"""What timing the waits on communication costs (harness/run/comm_wait.py): `Work.wait` with
and without the harness's wrapper, side by side, alternating, on two gloo ranks of this machine.

    python bench/comm_wait.py                  # starts 2 ranks itself (torch.distributed.run)
    python bench/comm_wait.py --reps 20 --waits 50000

Two figures: the wrapper's own cost per wait (a `wait()` on a Work already complete, timed in a
loop: no communication in it, so the difference is the wrapper's Python call, its thread check
and its op-type read), and a small blocking all-reduce, whose wait the wrapper times (a
collective's: no point-to-point op), per call with and without it. Prints the medians over the
repetitions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.run.comm_wait import CommWaitTimer  # noqa: E402


def per_wait_us(work: dist.Work, waits: int) -> float:
    t0 = time.perf_counter()
    for _ in range(waits):
        work.wait()
    return (time.perf_counter() - t0) / waits * 1e6


def per_all_reduce_us(x: torch.Tensor, calls: int) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) / calls * 1e6


def measure(reps: int, waits: int, calls: int) -> None:
    dist.init_process_group("gloo")
    x = torch.ones(16)
    done = dist.all_reduce(x, async_op=True)
    done.wait()
    waited: list[float] = []
    timer = CommWaitTimer(cuda=False, on_wait=lambda ms, p2p: waited.append(ms))
    rows: dict[str, list[float]] = {"wait off": [], "wait on": [], "all_reduce off": [], "all_reduce on": []}
    for _ in range(reps):
        rows["wait off"].append(per_wait_us(done, waits))
        rows["all_reduce off"].append(per_all_reduce_us(x, calls))
        timer.install()
        rows["wait on"].append(per_wait_us(done, waits))
        rows["all_reduce on"].append(per_all_reduce_us(x, calls))
        timer.uninstall()
    if dist.get_rank() == 0:
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"wait() on a completed Work: {med['wait off']:.2f} us, wrapped {med['wait on']:.2f} us", end="")
        print(f" (+{med['wait on'] - med['wait off']:.2f} us a wait)")
        print(f"blocking all_reduce of 16 floats, 2 gloo ranks: {med['all_reduce off']:.1f} us a call,", end="")
        print(f" wrapped {med['all_reduce on']:.1f} us ({reps} repetitions, alternating)")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--waits", type=int, default=20000, help="waits on a completed Work per repetition")
    p.add_argument("--calls", type=int, default=500, help="all-reduces per repetition")
    args = p.parse_args()
    if "RANK" not in os.environ:  # start the two ranks
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__]
        cmd += ["--reps", str(args.reps), "--waits", str(args.waits), "--calls", str(args.calls)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        sys.exit(subprocess.run(cmd, env=env).returncode)
    measure(args.reps, args.waits, args.calls)


if __name__ == "__main__":
    main()
