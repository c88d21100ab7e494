"""Hand-built Kineto-shaped traces with exactly known answers, for the collector's tests."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.traces.read.discover import group_ranks
from harness.traces.read.parse import parse_trace
from harness.traces.run_analysis import Analysis, analyze

MAIN = (100, 100)  # pid, tid of the host main thread
GLOO = (100, 101)  # a gloo worker thread
STREAM = (0, 7)  # GPU 0, stream 7


def x(name: str, cat: str, ts: float, dur: float, where: tuple[int, int] = MAIN, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": where[0], "tid": where[1], "ts": ts, "dur": dur, "args": args}


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return x(f"ProfilerStep#{n}", "user_annotation", ts, dur)


class GpuRank:
    """Kernels are launched from the host at `launch_ts` (inside a step) and run on a stream."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def kernel(self, name: str, launch_ts: float, ts: float, dur: float, **args: Any) -> None:
        self.corr += 1
        self.events.append(x("cudaLaunchKernel", "cuda_runtime", launch_ts, 5, correlation=self.corr))
        self.events.append(x(name, "kernel", ts, dur, STREAM, correlation=self.corr, device=0, stream=7, **args))

    def allreduce(self, launch_ts: float, ts: float, dur: float, nelems: int = 1000) -> None:
        self.kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            launch_ts,
            ts,
            dur,
            **{
                "Collective name": "allreduce",
                "Process Group Name": "0",
                "In msg nelems": nelems,
                "Out msg nelems": nelems,
                "dtype": "Float",
                "Group size": 2,
            },
        )


def document(
    events: list[dict[str, Any]],
    rank: int | None,
    world_size: int = 2,
    base_ns: int | None = 1_700_000_000_000_000_000,
    **extra: Any,
) -> dict[str, Any]:
    doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events, **extra}
    if rank is not None:
        gpu = any(isinstance(e, dict) and e.get("cat") == "kernel" for e in events)
        doc["distributedInfo"] = {"backend": "nccl" if gpu else "gloo", "rank": rank, "world_size": world_size}
    if base_ns is not None:
        doc["baseTimeNanoseconds"] = base_ns
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def shift_doc(doc: dict[str, Any], us: float) -> dict[str, Any]:
    """The same trace with every timestamp moved by `us` (a skewed clock)."""
    events = [dict(e, ts=e["ts"] + us) if isinstance(e.get("ts"), (int, float)) else e for e in doc["traceEvents"]]
    return {**doc, "traceEvents": events}


def gpu_docs(arrive1_us: float = 500.0, end_us: float = 700.0, period_us: float = 1000.0) -> list[dict]:
    """Two ranks, two steps. Per step on each rank (times relative to the step's base t):
    compute [t+100, t+400] and [t+period-200, t+period-100]; an allreduce from t+300 (rank 0)
    or t+arrive1 (rank 1) to t+end on both (a blocking collective ends together)."""
    docs = []
    for rank, arrive in ((0, 300.0), (1, arrive1_us)):
        g = GpuRank()
        events = []
        for n, t in ((1, 0.0), (2, period_us)):
            events.append(step(n, t, period_us))
            g.kernel("volta_sgemm_128x64_nn", t + 10, t + 100, 300)
            g.allreduce(t + 20, t + arrive, end_us - arrive)
            g.kernel("vectorized_elementwise_kernel", t + 30, t + period_us - 200, 100)
        docs.append(document(events + g.events, rank))
    return docs


def run_analysis(tmp_path: Path, docs: list[dict], **kw: Any) -> Analysis:
    paths = [write(tmp_path / f"rank{r}.pt.trace.json.gz", d) for r, d in enumerate(docs)]
    return analyze(group_ranks([parse_trace(p) for p in paths]), **kw)


def ring_docs(
    arrive_us: Any,
    n_ranks: int,
    n_steps: int,
    period_us: float = 1000.0,
    transfer_us: float = 100.0,
    hosts: list[str] | None = None,
    clock_us: list[float] | None = None,
    end_scatter_us: list[float] | Callable[[int, int], float] | None = None,
    nelems: list[int] | None = None,
) -> list[dict]:
    """n_ranks GPU ranks, steps 1..n_steps of `period_us` each (step s starts at t = (s-1) x
    period). In each step, rank r computes ("ampere_sgemm_128x64_nn") from t to t + a, where
    a = arrive_us(r, s), then enters one all-reduce at t + a, which ends on every rank at
    t + max arrival + transfer_us (+ end_scatter_us[r], or end_scatter_us(r, s): a rank's late
    completion).
    Optional: hosts[r] (the harness metadata's host), clock_us[r] added to every timestamp of
    rank r (its clock's error), nelems[r] (the all-reduce's element count)."""
    docs = []
    for r in range(n_ranks):
        g = GpuRank()
        events = []
        for s in range(1, n_steps + 1):
            t = (s - 1) * period_us
            last = max(arrive_us(q, s) for q in range(n_ranks))
            a = arrive_us(r, s)
            events.append(step(s, t, period_us))
            g.kernel("ampere_sgemm_128x64_nn", t + 1, t, a)
            scatter = end_scatter_us(r, s) if callable(end_scatter_us) else end_scatter_us[r] if end_scatter_us else 0.0
            end = t + last + transfer_us + scatter
            g.allreduce(t + 2, t + a, end - t - a, nelems=nelems[r] if nelems else 1000)
        doc = document(events + g.events, r, world_size=n_ranks)
        if hosts:
            doc["harness"] = {"host": hosts[r], "rank": r}
        docs.append(shift_doc(doc, clock_us[r]) if clock_us else doc)
    return docs


# The ops of one CPU step in cpu_ring_docs, at a speed of 1: (name, us); 100 us between two.
CPU_OPS = (("aten::linear", 900.0), ("aten::relu", 300.0), ("aten::mul", 400.0), ("aten::add", 400.0))
CPU_GAP_US = 100.0


def cpu_ring_docs(
    n_ranks: int,
    n_steps: int,
    speed: list[float] | None = None,
    sleep_us: Any = None,
    extra_mm_us: Any = None,
    transfer_us: float = 200.0,
    forward_range: bool = False,
    core_wait_us: Any = None,
    wake_us: Any = None,
) -> list[dict]:
    """n_ranks CPU (gloo) ranks, steps 1..n_steps. Rank r's step s starts where its all-reduce of
    step s-1 ended (the first at 0). In it rank r runs CPU_OPS from there, each op and each
    CPU_GAP_US after it taking speed[r] times as long (a busier core), and longer still by
    core_wait_us(r, s) spread over them in proportion (time the rank waited for a core:
    preempted anywhere, in ops and between them alike), then an "aten::mm" of extra_mm_us(r, s)
    (extra work, at any speed), then sleeps sleep_us(r, s) (no op), and arrives at one
    all-reduce (gloo:all_reduce on a gloo thread), which ends at the last arrival + transfer_us,
    on rank r wake_us(r, s) later still (its thread scheduled again late), its step's end. So a
    rank's run-up to each all-reduce is its own work of that step, and a late wake-up delays
    its next arrival. With `forward_range`, a harness:forward range spans its CPU_OPS and their
    gaps."""
    base_us = sum(us + CPU_GAP_US for _, us in CPU_OPS)

    def k(r: int, s: int) -> float:
        wait = core_wait_us(r, s) if core_wait_us else 0.0
        return (speed[r] if speed else 1.0) * (1.0 + wait / base_us)

    def arrival(r: int, s: int) -> float:
        work = base_us * k(r, s)
        return work + (extra_mm_us(r, s) if extra_mm_us else 0.0) + (sleep_us(r, s) if sleep_us else 0.0)

    events: list[list[dict[str, Any]]] = [[] for _ in range(n_ranks)]
    start = [0.0] * n_ranks
    for s in range(1, n_steps + 1):
        done = max(start[q] + arrival(q, s) for q in range(n_ranks)) + transfer_us
        for r in range(n_ranks):
            ev = events[r]
            t = start[r]
            end = done + (wake_us(r, s) if wake_us else 0.0)
            ev.append(step(s, t, end - t))
            at = t
            for name, us in CPU_OPS:
                ev.append(x(name, "cpu_op", at, us * k(r, s)))
                at += (us + CPU_GAP_US) * k(r, s)
            if forward_range:
                ev.append(x("harness:forward", "user_annotation", t, at - t))
            if extra_mm_us and extra_mm_us(r, s):
                ev.append(x("aten::mm", "cpu_op", at, extra_mm_us(r, s)))
            a = t + arrival(r, s)
            ev.append(x("gloo:all_reduce", "user_annotation", a, end - a, GLOO))
            start[r] = end
    return [document(ev, r, world_size=n_ranks, base_ns=None) for r, ev in enumerate(events)]
