"""Per-step statistics: the JSONL log (written as the records come), system samples and the steady-state statistics."""

from __future__ import annotations

import math
import os
import sys
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import psutil
import torch

from harness import text_table
from harness.run.gpu_health import GpuHealth
from harness.run.heap import HeapStats, TimeBudget
from harness.run.procfile import KeptProcFile
from harness.write_faults import AppendOnlyFile, FaultLog


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100].

    1. sort the values;
    2. position = q/100 * (n - 1);
    3. interpolate between the two values around that position.
    """
    if not values:
        return None
    xs = sorted(values)
    pos = q / 100 * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# Step times kept exactly, the first EXACT_STEPS steady ones (8 bytes each); beyond them the
# percentiles come from log-spaced bins of BIN_RATIO (a bin's middle is within half its width of any
# time in it), so what a rank holds does not grow with the run's length.
EXACT_STEPS = 65_536
BIN_RATIO = 1.01


class StepTotals:
    """What `step_statistics` reports, kept step by step as a run goes (`add`), in memory that
    does not grow with the run's length.

    1. steady steps (not `warmup`): their count, the sums of step_ms, data_ms and samples (and
       whether every one said its samples), the largest step, the sum and count over the steps
       the profiler was not recording or warming up in;
    2. every step, warm-up included: the peaks of `rss_bytes` and `gpu_peak_allocated_bytes`;
    3. the steady steps' times: each of the first EXACT_STEPS exactly, and every one in its
       log-spaced bin of BIN_RATIO; percentiles from the exact times while all are kept, else
       from the bins (each bin read as its geometric middle, within 0.5% of any time in it);
    4. the last step number logged."""

    def __init__(self) -> None:
        self.steps = 0
        self.step_ms = self.data_ms = 0.0
        self.samples: float | None = 0.0
        self.max_step_ms: float | None = None
        self.unprofiled = [0.0, 0]
        self.peak_rss_bytes: Any = None
        self.peak_gpu_bytes: Any = None
        self.exact = array("d")
        self.bins: dict[int, int] = {}
        self.last_step: int | None = None

    def add(self, r: dict[str, Any]) -> None:
        self.last_step = r.get("step", self.last_step)
        for key, attr in (("rss_bytes", "peak_rss_bytes"), ("gpu_peak_allocated_bytes", "peak_gpu_bytes")):
            v = r.get(key)
            if v is not None and (getattr(self, attr) is None or v > getattr(self, attr)):
                setattr(self, attr, v)
        if r.get("warmup") or r.get("step_ms") is None:
            return
        ms = float(r["step_ms"])
        self.steps += 1
        self.step_ms += ms
        self.data_ms += float(r.get("data_ms") or 0.0)
        n = r.get("samples")
        self.samples = None if n is None or self.samples is None else self.samples + n
        self.max_step_ms = ms if self.max_step_ms is None else max(self.max_step_ms, ms)
        if r.get("profiler", "off") in ("off", "wait"):
            self.unprofiled[0] += ms
            self.unprofiled[1] += 1
        if len(self.exact) < EXACT_STEPS:
            self.exact.append(ms)
        k = math.floor(math.log(ms, BIN_RATIO)) if ms > 0 else -(10**6)
        self.bins[k] = self.bins.get(k, 0) + 1

    def percentile(self, q: float) -> float | None:
        if not self.steps:
            return None
        if self.steps <= len(self.exact):
            return percentile(list(self.exact), q)
        target = q / 100 * (self.steps - 1)
        seen = 0
        for k in sorted(self.bins):
            seen += self.bins[k]
            if seen > target:
                return BIN_RATIO ** (k + 0.5) if k > -(10**6) else 0.0
        return self.max_step_ms

    def statistics(self) -> dict[str, float | int | None]:
        """The figures (step_statistics' docstring); over no steps, null (JSON has no NaN)."""
        n = self.steps
        total_s = self.step_ms / 1e3
        return {
            "steps": n,
            "mean_step_ms": self.step_ms / n if n else None,
            "p50_step_ms": self.percentile(50),
            "p90_step_ms": self.percentile(90),
            "p99_step_ms": self.percentile(99),
            "max_step_ms": self.max_step_ms,
            "mean_data_ms": self.data_ms / n if n else None,
            "unprofiled_mean_step_ms": self.unprofiled[0] / self.unprofiled[1] if self.unprofiled[1] else None,
            "throughput_samples_s": self.samples / total_s if n and self.samples is not None and total_s > 0 else None,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_gpu_allocated_bytes": self.peak_gpu_bytes,
        }


def step_statistics(records: list[dict[str, Any]]) -> dict[str, float | int | None]:
    """Steady-state statistics of one rank's step records (warm-up steps excluded), as
    `StepTotals` keeps them while a run goes:

    1. keep the records not marked `warmup`;
    2. mean, p50, p90, p99 and max of their `step_ms` (percentiles linear-interpolated between
       the sorted times, `percentile`; past EXACT_STEPS steady steps, from log-spaced bins);
    3. throughput = samples in those steps / their summed step time in seconds;
    4. `unprofiled_mean_step_ms`: the mean over steady steps the profiler was not recording or
       warming up in (null when every steady step was profiled), to show the profiler's cost;
    5. peaks over every step, warm-up included (memory high-water marks are often set there):
       `peak_rss_bytes` (process RSS), `peak_gpu_allocated_bytes` (null without CUDA).
    Figures over no steps are null (JSON has no NaN).
    """
    totals = StepTotals()
    for r in records:
        totals.add(r)
    return totals.statistics()


# cgroup memory limits (v2, then v1): a container's limit, not the host's RAM, is what the OOM
# killer enforces. v1 reports "no limit" as a huge number, which min() below then ignores.
CGROUP_LIMIT_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def host_memory_limit() -> int | None:
    """Memory this process's host (or container) has: psutil's total RAM, or the cgroup limit
    when that is lower; None when neither can be read."""
    limits: list[int] = []
    try:
        limits.append(psutil.virtual_memory().total)
    except (psutil.Error, OSError):
        pass
    for path in CGROUP_LIMIT_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
        break
    return min(limits) if limits else None


class ResidentBytes:
    """This process's RSS in bytes, or None where it cannot be read. On Linux the second field
    (resident pages) of its statm, kept open (`KeptProcFile`); psutil's `memory_info` opens,
    reads and closes the file and builds a named tuple each time, several times one read's cost
    between a training step's kernels (bench/RESULTS.md, "Harness and profiler overhead").
    Elsewhere, psutil's reading."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        page_bytes = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._parse = lambda text: int(text.split()[1]) * page_bytes
        # /proc/<pid>: a forked child reads its own file, not its parent's
        self._statm = KeptProcFile(lambda: f"/proc/{os.getpid()}/statm")
        if not sys.platform.startswith("linux"):
            self._statm.broken = True

    def read(self) -> int | None:
        rss = self._statm.read(self._parse)
        if rss is not None:
            return rss
        try:
            return self.proc.memory_info().rss
        except (psutil.Error, OSError):  # /proc unreadable (containers, hardened kernels)
            return None

    def close(self) -> None:
        self._statm.close()


class SystemSampler:
    """Memory and CPU utilisation at the end of each step.

    Memory: process RSS and, with glibc, the C heap's live and free bytes right after it (heap.py:
    RSS less the free bytes is the series a leak shows in), read together within heap.py's
    BUDGET_SHARE of the run's time (heap.TimeBudget: after a reading that cost c seconds of CPU the
    next waits c / BUDGET_SHARE seconds; every step from steps of ~50 ms up, at ~100 us a
    reading right after a step's kernels: bench/RESULTS.md, "Harness and profiler overhead",
    (i)'s parts; a step not read carries neither); on GPU also the peak
    allocated/reserved bytes since the previous step (the caching allocator counts at enqueue
    time on the host, so no sync). The limits they run against, read once: `host_mem_total_bytes`
    (`host_memory_limit`) and on GPU `gpu_mem_total_bytes` (the device's total memory), so the
    collector can project growth to them even when the run is killed before run.json is written.
    CPU utilisation (host, all cores; and this process) is a rate over a window: it is re-read
    only once `cpu_window_s` has passed (reading /proc/stat and the process's stat are two file
    reads), and each step carries the latest completed window's value: a utilisation is a rate,
    which a one-second window states as well as a shorter one.
    On GPU with nvidia-ml-py, each step also carries its GPU's latest NVML reading (gpu_*: SM
    clock, power, temperature, utilisation, throttle reasons, ECC errors), read once a second on
    a thread of its own (gpu_health.py).
    """

    def __init__(self, device: torch.device, cpu_window_s: float = 1.0) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.proc = psutil.Process()
        self.cpu_window_s = cpu_window_s
        psutil.cpu_percent(interval=None)  # first call only primes the counters
        self.proc.cpu_percent(interval=None)
        self._cpu_read_at = time.monotonic()
        self._cpu: dict[str, float | None] = {"host_cpu_util_pct": None, "proc_cpu_pct": None}  # no window yet
        self._limits: dict[str, int | None] = {"host_mem_total_bytes": host_memory_limit()}
        self.heap = HeapStats()
        self.rss = ResidentBytes(self.proc)
        self._memory_budget = TimeBudget()
        self.gpu_health = GpuHealth.open(device)  # NVML's readings, on a thread of its own (gpu_health.py)
        if self.cuda:
            self._limits["gpu_mem_total_bytes"] = torch.cuda.get_device_properties(device).total_memory

    def sample(self) -> dict[str, float | int | None]:
        now = time.monotonic()
        try:
            if now - self._cpu_read_at >= self.cpu_window_s:
                self._cpu = {
                    "host_cpu_util_pct": psutil.cpu_percent(interval=None),
                    "proc_cpu_pct": self.proc.cpu_percent(interval=None),
                }
                self._cpu_read_at = now
        except (psutil.Error, OSError):  # /proc unreadable (containers, hardened kernels): no samples
            self._cpu = {"host_cpu_util_pct": None, "proc_cpu_pct": None}
        out: dict[str, float | int | None] = {**self._cpu, **self._limits}
        if self._memory_budget.due():
            out["rss_bytes"] = self.rss.read()
            out.update(self.heap.read())  # RSS less the heap's free bytes needs both of one moment
            self._memory_budget.spent()
        if self.cuda:
            out["gpu_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
            out["gpu_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            out.update(self.gpu_health.latest)  # the latest reading, as it is: no NVML call here
        return out

    def close(self) -> None:
        self.rss.close()
        self.gpu_health.close()


def _line(record: dict[str, Any]) -> bytes:
    # msgspec: a tenth of json.dumps' time, and a NaN written as null (valid JSON)
    return msgspec.json.encode(record) + b"\n"


class StepLog:
    """Appends one JSON object per step to `steps/rank<R>.jsonl`, written as each is logged.

    Writing as the records come (every RECORDS_EVERY_S, run.py) means a rank killed mid-run
    leaves every step finished by then on disk. A disk that refuses a record (full, read-only,
    the folder removed) does not stop training: the records wait in memory and are written when
    it takes them again, or at `close` (write_faults.AppendOnlyFile).
    """

    def __init__(self, path: Path, faults: FaultLog | None = None) -> None:
        self.path = path
        self.totals = StepTotals()  # the run's statistics so far; no record is kept
        self._file = AppendOnlyFile(path, faults or FaultLog(), "step log")

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        """Records in step order, queued a line each and written in one go."""
        for record in records:
            self.totals.add(record)
        self._file.extend([_line(record) for record in records])

    @property
    def unwritten(self) -> int:
        """Records not on disk (yet)."""
        return len(self._file.pending) + self._file.dropped

    def close(self) -> bool:
        """Write what waits; False when some records could not be written."""
        return self._file.close()


def format_rank_table(rows: list[dict[str, Any]]) -> str:
    """Plain-text table of per-rank summaries, the longest mean step marked.

    The mark is not blame: in a synchronous job the rank that waits has the longest steps, and
    the one it waits for is found by the collector.
    """
    cols = [
        ("rank", "rank", "{}"),
        ("host", "host", "{}"),
        ("mean_step_ms", "mean ms", "{:.2f}"),
        ("p50_step_ms", "p50 ms", "{:.2f}"),
        ("p90_step_ms", "p90 ms", "{:.2f}"),
        ("p99_step_ms", "p99 ms", "{:.2f}"),
        ("max_step_ms", "max ms", "{:.2f}"),
        ("mean_data_ms", "data ms", "{:.2f}"),
        ("throughput_samples_s", "samples/s", "{:.1f}"),
    ]
    timed = [r for r in rows if r["mean_step_ms"] is not None]
    longest = max(timed, key=lambda r: r["mean_step_ms"]) if len(timed) > 1 else None
    return text_table.render(rows, cols, lambda r: "  <- longest steps" if r is longest else "")
