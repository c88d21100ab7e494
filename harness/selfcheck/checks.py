"""The self-check's checks: each runs a real part of the harness the way a user does (a
`harness.train` job, the collector on its traces) and says pass or fail with the evidence in one
line. A check needs CPU only, CUDA, two GPUs or Nsight; the runner skips what this machine lacks.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.paths import REPORT_DIR, REPORT_JSON, RUN_FILE, STEPS_DIR

# Shares of a step that a report's parts must add up to (compute + exposed communication +
# copies + idle = the step's device window): rounding of the report's ms to 3 decimals only.
IDENTITY_TOLERANCE = 0.01
# Step timing: the step log's median step against the trace's median step. The step clock and
# the profiler time the same steps from different marks (CUDA events around the step against the
# device's step spans; on CPU perf_counter against ProfilerStep ranges), and the profiler's own
# work lengthens its traced steps a little: 25% tells a clock that measures something else (a
# host time on a GPU, a step off by one) from the two views of one step.
TIMING_TOLERANCE = 0.25
# Backward's own work (to the last gradient's event) against the phase (to backward's end event):
# two events on one stream in that order, so never longer, but for the events' resolution (CUDA
# documents about 0.5 us).
OWN_TOLERANCE_MS = 0.01


class CheckFailed(Exception):
    """A check's failure, in one line."""


@dataclass(frozen=True)
class Check:
    name: str
    needs: str  # cpu | cuda | 2 gpus | nsys
    what: str
    run: Callable[[Context], str]  # the evidence line; raises CheckFailed


@dataclass
class Context:
    """Where the checks work, what this machine has, and what earlier checks left."""

    work: Path
    cuda: bool
    gpus: int
    python: str = sys.executable
    quick: bool = False
    runs: dict[str, Path] | None = None

    def __post_init__(self) -> None:
        self.runs = {}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def train(
    ctx: Context, name: str, args: list[str], nproc: int | None = 2, timeout: float = 300, check: bool = True
) -> Path:
    """A `harness.train` run (under torchrun with `nproc` ranks, or one process); its folder.
    CheckFailed with the run's last error line when it fails (unless `check` is off: a run that
    fails by design)."""
    log_dir = ctx.work / "runs"
    base = ["--log-dir", str(log_dir), "--run-name", name, *args]
    if nproc is None:
        cmd = [ctx.python, "-m", "harness.train", *base]
    else:
        cmd = [ctx.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd += ["-m", "harness.train", *base]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"harness.train {' '.join(args)} ran past {timeout:.0f} s") from None
    (ctx.work / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if check and proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error:" in ln] or proc.stderr.splitlines()
        raise CheckFailed(f"harness.train {' '.join(args)} failed: {(lines or ['?'])[-1][-300:]} ({name}.log)")
    assert ctx.runs is not None
    ctx.runs[name] = log_dir / name
    return log_dir / name


def collect(ctx: Context, run: Path) -> dict[str, Any]:
    """`python -m harness.collect RUN -q --no-merged`; its report.json."""
    proc = subprocess.run(
        [ctx.python, "-m", "harness.collect", str(run), "-q", "--no-merged"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    if proc.returncode != 0:
        raise CheckFailed(f"the collector failed on {run.name}: {proc.stderr.strip().splitlines()[-1:]}")
    doc: dict[str, Any] = json.loads((run / REPORT_DIR / REPORT_JSON).read_text())
    return doc


def step_records(run: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((run / STEPS_DIR).glob("rank*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2 if n else math.nan


def identities(report: dict[str, Any]) -> str:
    """Every rank's step: compute + exposed communication + copies + idle = its window (the
    step's device span), within IDENTITY_TOLERANCE of it."""
    rows = report.get("steps") or []
    if not rows:
        raise CheckFailed("the report has no steps")
    worst = 0.0
    for r in rows:
        window = r["step_ms"]
        parts = r["compute_ms"] + r["exposed_comm_ms"] + r["memcpy_ms"] + r["idle_ms"]
        if window > 0:
            worst = max(worst, abs(parts - window) / window)
    if worst > IDENTITY_TOLERANCE:
        raise CheckFailed(f"a step's parts miss its span by {worst:.1%} (compute + exposed + copies + idle)")
    return f"{len(rows)} rank-steps: compute + exposed + copies + idle = the step within {worst:.2%}"


# -- the checks ------------------------------------------------------------------------------

# A short traced run: the default profiler window (steps 11-13) inside 16 steps.
TRACED = ["--mode", "torch", "--steps", "16", "--warmup-steps", "5"]


def traced_step(ctx: Context) -> str:
    """One process, traced: the trace holds its steps and our phase ranges."""
    from harness.traces.read.parse import parse_trace

    run = train(ctx, "traced", TRACED, nproc=None)
    traces = sorted(run.glob("*.pt.trace.json*"))
    if not traces:
        raise CheckFailed("no trace written (profiler window: steps 11-13)")
    rank = parse_trace(traces[0])
    phases = sorted({p for s in rank.steps for p in s.phases_us})
    if len(rank.steps) < 3 or not {"forward", "backward"} <= set(phases):
        raise CheckFailed(f"the trace holds {len(rank.steps)} steps and phases {phases}")
    return f"{traces[0].name}: {len(rank.steps)} steps, ranges {', '.join(phases)}"


def cuda_activity(ctx: Context) -> str:
    """The traced run on CUDA: kernels in the trace, launched from our steps."""
    from harness.traces.read.decode import decode_trace

    run = (ctx.runs or {}).get("traced") or train(ctx, "traced", TRACED, nproc=None)
    trace = decode_trace(sorted(run.glob("*.pt.trace.json*"))[0])
    if len(trace.kernels) == 0:
        raise CheckFailed("no CUDA kernel in the trace: the profiler did not record CUDA activity (CUPTI)")
    return f"{len(trace.kernels)} kernels, {len(trace.launches)} runtime calls, {trace.gpus} GPU(s) in deviceProperties"


def step_timing(ctx: Context) -> str:
    """The step log's step times (CUDA events on GPU, perf_counter on CPU) against the trace's
    step spans (the device's on GPU)."""
    run = (ctx.runs or {}).get("traced") or train(ctx, "traced", TRACED, nproc=None)
    report = collect(ctx, run)
    traced = {r["step"]: r["step_ms"] for r in report.get("steps") or []}
    logged = {r["step"]: r["step_ms"] for r in step_records(run) if r["step"] in traced}
    if not traced or not logged:
        raise CheckFailed("no step both in the step log and in the trace")
    ours, theirs = _median(list(logged.values())), _median(list(traced.values()))
    gap = abs(ours - theirs) / theirs
    if gap > TIMING_TOLERANCE:
        raise CheckFailed(f"step log {ours:.2f} ms against the trace's {theirs:.2f} ms per step ({gap:.0%} apart)")
    clock = "CUDA events" if ctx.cuda else "perf_counter"
    return f"{clock} {ours:.2f} ms against the trace's {theirs:.2f} ms per step ({gap:.0%} apart)"


def gpu_memory(ctx: Context) -> str:
    run = (ctx.runs or {}).get("traced") or train(ctx, "traced", TRACED, nproc=None)
    peaks = [r.get("gpu_peak_allocated_bytes") or 0 for r in step_records(run)]
    if not peaks or max(peaks) <= 0:
        raise CheckFailed("no gpu_peak_allocated_bytes in the step log")
    return f"peak allocated {max(peaks) / 2**20:.0f} MiB per step (step log)"


def gpu_health(ctx: Context) -> str:
    """NVML's readings of the GPU in the step log (harness/run/gpu_health.py: nvidia-ml-py)."""
    run = (ctx.runs or {}).get("traced") or train(ctx, "traced", TRACED, nproc=None)
    clocks = [r["gpu_sm_clock_mhz"] for r in step_records(run) if r.get("gpu_sm_clock_mhz") is not None]
    if not clocks:
        import torch

        from harness.run.gpu_health import GpuHealth

        why = GpuHealth.open(torch.device("cuda", 0)).why_off
        raise CheckFailed(f"no gpu_sm_clock_mhz in the step log ({why or 'NVML read nothing'}; the `gpu` extra)")
    last = step_records(run)[-1]
    return (
        f"SM clock {min(clocks)}-{max(clocks)} MHz over {len(clocks)} steps; last: {last.get('gpu_power_w')} W, "
        f"{last.get('gpu_temp_c')} C, {last.get('gpu_util_pct')}% busy, throttle {last.get('gpu_throttle')}"
    )


def nvtx(ctx: Context) -> str:
    """Our phase ranges as NVTX: the calls the ranges make work here (seeing them needs Nsight)."""
    import torch

    torch.cuda.nvtx.range_push("harness:selfcheck")
    torch.cuda.nvtx.range_pop()
    return "torch.cuda.nvtx ranges push and pop (Nsight shows them: launch/nsys.sh)"


def _amp(ctx: Context, dtype: str) -> str:
    run = train(
        ctx,
        f"amp-{dtype}",
        [
            "--mode",
            "kernel",
            "--steps",
            "12",
            "--warmup-steps",
            "3",
            "--amp",
            dtype,
            "--no-profile",
            *_two_rank_backend(ctx),
        ],
    )
    times = [r["step_ms"] for r in step_records(run) if not r.get("warmup")]
    if not times:
        raise CheckFailed(f"{dtype}: no measured step")
    scaler = " with GradScaler" if dtype == "fp16" else ""
    return f"kernel mode under autocast {dtype}{scaler}: {len(times)} steps, median {_median(times):.2f} ms"


def amp_bf16(ctx: Context) -> str:
    return _amp(ctx, "bf16")


def amp_fp16(ctx: Context) -> str:
    return _amp(ctx, "fp16")


def compiled(ctx: Context) -> str:
    run = train(
        ctx,
        "compile",
        [
            "--mode",
            "kernel",
            "--steps",
            "12",
            "--warmup-steps",
            "4",
            "--compile",
            "--no-profile",
            *_two_rank_backend(ctx),
        ],
        timeout=600,
    )
    times = [r["step_ms"] for r in step_records(run) if not r.get("warmup")]
    return f"torch.compile: {len(times)} steps, median {_median(times):.2f} ms"


def traced_ranks(ctx: Context, name: str, backend: str, nproc: int) -> str:
    """`nproc` ranks over `backend`, traced and collected: collectives matched across them, the
    report's identities hold; the evidence line."""
    report = collect(ctx, train(ctx, name, [*TRACED, "--backend", backend], nproc=nproc))
    matched = (report.get("collectives") or {}).get("matched", 0)
    if not matched:
        raise CheckFailed(f"no {backend} collective matched across the {nproc} ranks")
    return f"{nproc} ranks: {matched} collectives matched; {identities(report)}; verdict {report['verdict']}"


def _two_rank_backend(ctx: Context) -> list[str]:
    """Two ranks on fewer than two GPUs share one over gloo (NCCL refuses two ranks on a GPU)."""
    return ["--backend", "gloo"] if ctx.cuda and ctx.gpus < 2 else []


def slow_rank_named(ctx: Context) -> str:
    """Two ranks (over NCCL with a GPU each, else gloo sharing one), rank 1's backward 30 ms
    slower (its host sleeps inside the phase), traced and collected: the collector's verdict is
    straggler and it names rank 1 in backward, late by about the delay."""
    delay_ms = 30.0
    args = [*TRACED, *_two_rank_backend(ctx), "--slow-rank", "1", "--slow-phase", "backward"]
    args += ["--slow-ms", f"{delay_ms:g}"]
    report = collect(ctx, train(ctx, "slow-rank", args, nproc=2))
    named = [(s["rank"], s.get("phase"), s.get("late_ms")) for s in report.get("stragglers") or []]
    if report.get("verdict") != "straggler" or not named or named[0][:2] != (1, "backward"):
        raise CheckFailed(f"verdict {report.get('verdict')}, stragglers {named or 'none'}: not rank 1 in backward")
    late = named[0][2] or 0.0
    return f"rank 1 named in backward, late {late:.1f} ms a step for a {delay_ms:g} ms delay"


def two_ranks(ctx: Context) -> str:
    """Two ranks over gloo (on one GPU when there is one: two ranks sharing a device)."""
    return traced_ranks(ctx, "two-ranks-gloo", "gloo", 2)


def nccl(ctx: Context) -> str:
    """One rank per GPU over NCCL (NCCL kernels in the traces)."""
    return traced_ranks(ctx, "nccl", "nccl", min(ctx.gpus, 8))


def flight_on_timeout(ctx: Context) -> str:
    """Rank 1 hangs before the all-reduce of step 6 under NCCL with a 30 s timeout: every rank
    dumps its Flight Recorder, and the collector names the rank and the collective."""
    args = ["--mode", "torch", "--steps", "12", "--warmup-steps", "2", "--no-profile", "--backend", "nccl"]
    args += ["--hang-rank", "1", "--hang-step", "6", "--collective-timeout", "30"]
    run = train(ctx, "flight", args, nproc=2, check=False)  # it fails by design
    dumps = sorted((run / "flight").glob("*")) if (run / "flight").is_dir() else []
    if not dumps:
        raise CheckFailed("no Flight Recorder dump after the timeout")
    proc = subprocess.run(
        [ctx.python, "-m", "harness.collect", str(run), "-q", "--no-merged", "--unpickle-nccl-dumps"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    hang = json.loads((run / REPORT_DIR / REPORT_JSON).read_text()).get("hang") if proc.returncode == 0 else None
    if not hang or hang.get("rank") != 1:
        raise CheckFailed(f"the collector did not name rank 1's hang ({len(dumps)} dumps)")
    return f"{len(dumps)} dumps; {hang.get('headline') or 'rank 1 never entered the collective'}"


def backward_own_work(ctx: Context) -> str:
    """The live watch on GPU inside DDP's backward (Run.watch_gradients): every step record
    carries backward's own work, the device time to the last gradient, within the phase; with a
    GPU per rank (NCCL), rank 1's extra 20 ms of backward matmuls from step 10 is flagged in
    backward. Two ranks sharing one GPU (gloo) time-slice it, so there the slower rank's kernels
    hold up its peer's too and the flag is reported, not required."""
    nproc = 2
    args = ["--mode", "torch", "--steps", "30", "--warmup-steps", "5", "--no-profile", "--watch-every", "5"]
    args += ["--backend", "nccl" if ctx.gpus >= nproc else "gloo"]
    args += ["--slow-rank", "1", "--slow-phase", "backward", "--slow-kind", "compute"]
    args += ["--slow-ms", "20", "--slow-from", "10"]
    run = train(ctx, "backward-own", args, nproc=nproc)
    timed = [r for r in step_records(run) if not r.get("warmup") and "phases_device_ms" in r]
    own = [r for r in timed if "backward" in (r.get("phases_own_device_ms") or {})]
    if not timed or len(own) < len(timed):
        raise CheckFailed(f"{len(own)} of {len(timed)} timed steps carry backward's own work (phases_own_device_ms)")
    worst = max(r["phases_own_device_ms"]["backward"] - r["phases_device_ms"]["backward"] for r in own)
    if worst > OWN_TOLERANCE_MS:
        raise CheckFailed(f"backward's own work exceeds the phase by up to {worst:.3f} ms")
    flags = (json.loads((run / RUN_FILE).read_text()).get("watch") or {}).get("flags") or []
    named = sorted({(f["rank"], f.get("phase")) for f in flags})
    said = f"{len(own)} rank-steps with backward's own work within the phase; watch flagged {named or 'nobody'}"
    if ctx.gpus >= nproc and (1, "backward") not in named:
        raise CheckFailed(f"rank 1's slower backward was not flagged: {said}")
    return said


# A 1-rank NCCL group times its collectives (flight.enable's TORCH_NCCL_ENABLE_TIMING) and the
# recorder gives the watch their durations (arrivals.py), once NCCL's watchdog has seen them
# complete: it looks every ~100 ms, so the probe waits a second for it.
NCCL_TIMING_PROBE = """
import os, sys, time, torch, torch.distributed as dist
from harness.run import flight
from harness.watch.arrivals import recorder_entries
flight.enable(2000, "nccl")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
time.sleep(1.0)
entries = recorder_entries("nccl") or []
timed = [e["duration_ms"] for e in entries if isinstance(e.get("duration_ms"), (int, float))]
print(len(entries), len(timed), max(timed, default=-1.0))
dist.destroy_process_group()
"""


def nccl_timing(ctx: Context) -> str:
    """NCCL's collectives timed in the Flight Recorder, as the live watch reads them under FSDP on
    GPU (arrivals.py): a 1-rank NCCL group's all-reduces each carry a `duration_ms`."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        [ctx.python, "-c", NCCL_TIMING_PROBE, str(port)], capture_output=True, text=True, timeout=120, env=_env()
    )
    words = (proc.stdout.strip().splitlines() or [""])[-1].split()
    if proc.returncode != 0 or len(words) != 3:
        raise CheckFailed(f"the NCCL timing probe failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][-300:]}")
    entries, timed, longest = int(words[0]), int(words[1]), float(words[2])
    if timed < 5:
        raise CheckFailed(f"{timed} of {entries} recorder entries carry duration_ms (5 all-reduces ran)")
    return f"{timed} of {entries} recorder entries timed, the longest {longest:.3f} ms"


def fsdp_arrivals(ctx: Context) -> str:
    """The live watch inside FSDP's forward on GPUs (NCCL's durations, arrivals.py): rank 1's
    extra 20 ms of forward matmuls from step 10 is flagged in forward."""
    args = ["--mode", "torch", "--parallel", "fsdp", "--backend", "nccl", "--steps", "40", "--warmup-steps", "5"]
    args += ["--no-profile", "--watch-every", "5", "--slow-rank", "1", "--slow-phase", "forward"]
    args += ["--slow-kind", "compute", "--slow-ms", "20", "--slow-from", "10"]
    run = train(ctx, "fsdp-arrivals", args, nproc=2)
    flags = (json.loads((run / RUN_FILE).read_text()).get("watch") or {}).get("flags") or []
    named = sorted({(f["rank"], f.get("phase")) for f in flags})
    if (1, "forward") not in named:
        raise CheckFailed(f"rank 1's slower forward was not flagged: the watch flagged {named or 'nobody'}")
    first = min(f["step"] for f in flags if (f["rank"], f.get("phase")) == (1, "forward"))
    return f"rank 1 flagged in forward at step {first}; all flags {named}"


# What each lab mode is built to be bound by, and what the collector should say of it on CPU
# (docs/lab.md); on GPU the same, which is what this check is for on a new cluster.
EXPECTED_BOTTLENECK = {"data": "data-bound", "torch": "launch-bound", "comm": "comm-exposed"}


def lab_modes(ctx: Context) -> str:
    """The lab modes the collector tells apart, classified as designed (the rank most affected)."""
    said = []
    for mode, expected in EXPECTED_BOTTLENECK.items():
        args = ["--mode", mode, "--steps", "16", "--warmup-steps", "5", *_two_rank_backend(ctx)]
        run = train(ctx, f"mode-{mode}", args, nproc=2)
        report = collect(ctx, run)
        got = {d.get("bottleneck") for d in report.get("diagnosis") or []}
        if expected not in got:
            raise CheckFailed(f"{mode} mode diagnosed {sorted(got)}, not {expected}")
        said.append(f"{mode}: {expected}")
    return "; ".join(said)


def nsight(ctx: Context) -> str:
    exe = shutil.which("nsys")
    assert exe is not None
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise CheckFailed(f"nsys --version failed: {proc.stderr.strip()[:200]}")
    return f"{proc.stdout.strip()} (launch/nsys.sh traces cuda,nvtx,osrt)"


CHECKS = (
    Check("traced step", "cpu", "a traced step: its steps and our phase ranges in the trace", traced_step),
    Check("step timing", "cpu", "step-log times against the trace's step spans", step_timing),
    Check(
        "two ranks over gloo", "cpu", "2 ranks over gloo (sharing one GPU if any): matched, identities hold", two_ranks
    ),
    Check("lab modes", "cpu", "the data, torch and comm modes classified as designed", lab_modes),
    Check("CUDA activity", "cuda", "CUDA kernels and runtime calls in the traced step", cuda_activity),
    Check("NVTX ranges", "cuda", "our ranges as NVTX", nvtx),
    Check("GPU memory", "cuda", "GPU memory fields in the step log", gpu_memory),
    Check("GPU health", "cuda", "NVML's clock, power, temperature and throttling in the step log", gpu_health),
    Check("AMP bf16", "cuda", "autocast bf16", amp_bf16),
    Check("AMP fp16 + GradScaler", "cuda", "autocast fp16 with GradScaler", amp_fp16),
    Check("torch.compile", "cuda", "torch.compile on the GPU", compiled),
    Check("NCCL across GPUs", "2 gpus", "one rank per GPU over NCCL, matched", nccl),
    Check("slow rank named", "cuda", "2 ranks, rank 1's backward slower: the collector names it", slow_rank_named),
    Check("watch in DDP backward", "cuda", "backward's own work on the GPU, a slower rank flagged", backward_own_work),
    Check("NCCL timing", "cuda", "NCCL's collectives timed in the Flight Recorder", nccl_timing),
    Check("watch in FSDP forward", "2 gpus", "a slower rank in FSDP's forward flagged", fsdp_arrivals),
    Check("Flight Recorder on NCCL timeout", "2 gpus", "dumps on a timeout, the hang named", flight_on_timeout),
    Check("Nsight", "nsys", "Nsight Systems installed", nsight),
)
