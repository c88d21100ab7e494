"""Benchmark (not a test): what the harness and its profiler cost per training step.

Measured side by side in one process, on the same model and data, the variants' order rotated
every repetition (A B C D S W, B C D S W A, ...) and garbage collected before each, so drift, noise and
the leftovers of the previous variant hit every variant alike:

  A  minimal hand-written loop: next(batch) -> forward -> loss -> backward -> step -> zero_grad
  B  the harness loop (Trainer.run on harness.Run) with --no-profile: ranges, timing, JSONL,
     psutil sampling, TensorBoard scalars
  C  the harness loop with the profiler on but every timed step outside its window (wait)
  D  the harness loop with every timed step inside the profiler's active window
  S  B without TensorBoard scalars (--no-scalars)
  P  B with the Prometheus metrics on (--metrics-port and --metrics-file): updated every step,
     served by prometheus_client's HTTP thread, the textfile rewritten once a second
  H  variant A's loop on harness.Run (profiler and watch off), its phases marked by hand
     (data, forward, backward, optimizer)
  Q  the same loop with its phases found by themselves (`Run(model=, optimizer=)`, auto_phases.py)
  V  B with the debug server on (--debug-server: torch's frontend process and this rank's worker
     server, harness/debug/) and its state route read once a second, as an open page or a
     dashboard would: the ring append per step, and the worker's answers on its own thread
  W  B with the live straggler watch at its default interval (--watch-every 100) over 8 simulated
     ranks: a real gloo all-gather on a 1-rank group whose result is copied 8 times (8 equal
     ranks: the verdict's healthy path, the common one), then the verdict, its log line and
     scalars; the host's whole cost of an interval, not the network's
     (8 numbers per step and rank: 12.8 KB per rank every 100 steps)

Each variant's figure per repetition is (time of N steps) / N, warm-up steps run first and not
timed, in two clocks: wall time, and this process's CPU time (user + system), which does not
count time the process spent descheduled by other tenants of a shared machine. Ratios are taken
within each repetition (paired) and their median reported: B/A (target <= 1.02), C/B (target
<= 1.02), D/B (the profiler's cost while recording), B/S (the scalars' cost), W/B (the watch's
cost, target <= 1.005), P/B (the metrics' cost, target <= 1.005), Q/H (phases found by
themselves against marked by hand), V/B (the debug server's cost, target <= 1.005); and the watch's and the
metrics' own time, timed inside their calls (add, after_step; step), as a share of the loop's:
what (e) and (g) measure, without the noise of two separate runs; and the same for the harness
itself in B (inside Run's begin/end_step and begin/end_phase): what (a) measures.

    python bench/overhead.py --mode torch --steps 200 --reps 7
    python bench/overhead.py --mode torch --device cuda   # on a GPU: the same figures, CUDA-event timing
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.run.auto_phases import AutoPhases
from harness.run.run import Run
from harness.run.run_config import RunConfig
from harness.run.settings import LaunchEnv
from harness.train.cli import parse_config
from harness.train.config import TrainConfig, resolve_environment
from harness.train.parallel import build_optimizer, wrap_model
from harness.train.trainer import Trainer, _endless, build_loader
from harness.train.workloads import build_workload
from harness.watch.exchange import Watch

SIMULATED_RANKS = 8


class SimulatedWatch(Watch):
    """The watch of rank 0 of SIMULATED_RANKS: its all-gather runs for real on a 1-rank gloo group
    and its result is copied to every simulated rank (the network's time is not in it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spent_s = 0.0  # time inside add() and after_step(): the watch's own cost, timed directly

    def _connect(self, host: str, arrivals: bool, timeout: datetime.timedelta) -> tuple[dict[int, str], bool]:
        self.group = dist.new_group(backend="gloo", timeout=timeout)
        return dict.fromkeys(range(self.world_size), host), arrivals

    def _all_gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        one = [torch.empty_like(rows)]
        dist.all_gather(one, rows, group=self.group)
        return one * self.world_size

    def add(self, record: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        super().add(record)
        self.spent_s += time.perf_counter() - t0

    def after_step(self, step: int) -> None:
        t0 = time.perf_counter()
        super().after_step(step)
        self.spent_s += time.perf_counter() - t0


WATCH_SHARES: list[float] = []  # per W run: the watch's own time / the whole loop's time
METRICS_SHARES: list[float] = []  # per P run: the metrics' own time / the whole loop's time
DEBUG_SHARES: list[
    float
] = []  # per V run: the debug server's own time (the step's ring append, the answers) / the loop's
OWN_SHARES: list[float] = []  # per B run: the harness's own time in Run's step/phase calls / the loop's
# Run's per-step entry points: all the harness does for a step happens inside them (the clock and
# its phase marks, the RSS/heap/schedstat sample, the JSONL line, the scalars, the profiler's step)
OWN_CALLS = ("begin_step", "end_step", "begin_phase", "end_phase")
# H and Q: the harness's own time in Run's calls, and Q's in the automatic phases' hooks too
# (backward's wrapper is timed through the Run calls it makes: the wrapper's frame is the rest)
LOOP_SHARES: dict[bool, list[float]] = {False: [], True: []}
AUTO_HOOKS = ("_forward_pre", "_forward_post", "_optimizer_pre", "_optimizer_post")
AUTO_CALLS = ("auto_ready", "auto_begin", "auto_end")


DEVICE = torch.device("cpu")  # --device: every variant runs on it
# V: how often its state route is read (a page refreshed, a dashboard polling)
DEBUG_POLL_S = 1.0


def _sync() -> None:
    """Wait for the device's queued work, so a clock read after it counts that work (CUDA runs
    asynchronously: without it the last steps' kernels would still be running)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def make_trainer(cfg: TrainConfig) -> Trainer:
    workload = build_workload(cfg.workload, cfg.data, rank=0)
    device = DEVICE
    model = wrap_model(workload.model, cfg.parallel, cfg.speed, device)
    optimizer = build_optimizer(model, cfg.workload.optimizer, cfg.speed)
    return Trainer(
        cfg=cfg,
        model=model,
        optimizer=optimizer,
        workload=workload,
        loader=build_loader(workload, cfg, device),
        device=device,
        rank=0,
    )


def time_minimal(trainer: Trainer, steps: int, warmup: int) -> tuple[float, float]:
    """Variant A: the loop a person would write by hand, same model, data and optimizer."""
    model, opt, loss_fn = trainer.model, trainer.optimizer, trainer.workload.loss
    batches = _endless(trainer.loader)
    total = torch.zeros((), device=DEVICE)
    t0 = c0 = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            _sync()
            t0, c0 = time.perf_counter(), time.process_time()
        x, y = next(batches)
        x, y = x.to(DEVICE), y.to(DEVICE)  # as Trainer.train_step copies them (a no-op on CPU)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total += loss.detach()
    _sync()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    total.item()
    return elapsed / steps * 1e3, cpu / steps * 1e3


def time_harness(
    base: TrainConfig,
    steps: int,
    warmup: int,
    profiler: str,
    out: Path,
    scalars: bool = True,
    watch: bool = False,
    metrics: bool = False,
    own: bool = False,
    debug: bool = False,
) -> tuple[float, float]:
    """Variants B-D: Trainer.run for warmup + steps, timing only the last `steps` steps.
    `own`: also time the harness's own work inside Run's step and phase calls (OWN_SHARES).

    profiler: "off" (B), "wait" (C: window placed after the run) or "record" (D: the timed steps
    are all inside the active window).
    """
    total = warmup + steps
    prof = dataclasses.replace(base.profiler, profile=profiler != "off")
    if profiler == "wait":
        prof = dataclasses.replace(prof, wait=total + 10, warmup=0, active=1, repeat=1)
    elif profiler == "record":
        prof = dataclasses.replace(prof, wait=0, warmup=max(warmup - 1, 1), active=total, repeat=1)
    tag = f"{profiler}-{time.monotonic_ns()}"
    debug_port = _free_port()
    cfg = dataclasses.replace(
        base,
        profiler=prof,
        debug=dataclasses.replace(base.debug, debug_server=debug, debug_port=debug_port),
        workload=dataclasses.replace(base.workload, steps=total, warmup_steps=warmup),
        output=dataclasses.replace(
            base.output,
            log_dir=str(out),
            run_name=tag,
            scalars=scalars,
            metrics_port=_free_port() if metrics else None,
            metrics_addr="127.0.0.1",
            metrics_file=str(out / f"{tag}.prom") if metrics else None,
        ),
    )  # scalars on as in a real run
    trainer = make_trainer(cfg)
    stamps: list[tuple[float, float]] = []
    original = trainer.train_step

    def timed_step(*args, **kwargs):  # both clocks at each step start, plus the run's end
        if len(stamps) == warmup:  # the timed steps start with the device idle
            _sync()
        stamps.append((time.perf_counter(), time.process_time()))
        return original(*args, **kwargs)

    trainer.train_step = timed_step  # type: ignore[method-assign]
    run = Run(settings=RunConfig.from_lab(cfg), device=DEVICE, record=cfg.to_dict(), quiet=True)
    with run:
        watcher = None
        if watch:  # the run's own watch is off in a world of one: 8 simulated ranks instead
            watcher = run.watch = SimulatedWatch(
                cfg.watch,
                steps=total,
                warmup_steps=warmup,
                parallel="ddp",
                collective_timeout_s=600.0,
                rank=0,
                world_size=SIMULATED_RANKS,
                host="bench",
                cpu=DEVICE.type == "cpu",
                run_dir=out / tag,
                recorder=run.recorder,
                scalars=run.scalars,
                faults=run.faults,
            )
        assert sum((metrics, own, debug)) <= 1, "one share per run: the metrics', the harness's or the debug server's"
        spent = [0.0, 0]  # seconds inside the timed calls; how deep (end_step calls end_phase)
        answering = [0.0, 0]  # V: the same on the worker server's thread
        if metrics:  # the metrics' own time, timed inside their per-step call
            assert run.metrics is not None
            run.metrics.step = _timed_call(run.metrics.step, spent)  # type: ignore[method-assign]
        if own:
            for name in OWN_CALLS:
                setattr(run, name, _timed_call(getattr(run, name), spent))
        done = threading.Event()
        reader = threading.Thread(target=_read_state, args=(debug_port, done), daemon=True)
        if debug:  # its own time: the loop's append, and the worker thread's answers (which hold the GIL)
            live = run._live
            assert live is not None, "the debug server did not start"
            live.add = _timed_call(live.add, spent)  # type: ignore[method-assign]
            live.snapshot = _timed_call(live.snapshot, answering)  # type: ignore[method-assign]
            reader.start()
        trainer.run(run)
        done.set()
        _sync()
        stamps.append((time.perf_counter(), time.process_time()))  # before the profiler's exit exports the trace
        if metrics:
            METRICS_SHARES.append(spent[0] / (stamps[-1][0] - stamps[0][0]))
        if debug:
            DEBUG_SHARES.append((spent[0] + answering[0]) / (stamps[-1][0] - stamps[0][0]))
        if own:
            OWN_SHARES.append(spent[0] / (stamps[-1][0] - stamps[0][0]))
    if watcher:
        if watcher.intervals == 0:
            sys.exit(
                f"overhead.py: error: the watch judged no interval in {total} steps; give --steps + --warmup "
                f"at least --watch-every ({cfg.watch.every}), or a smaller --watch-every"
            )
        # Both over the whole run, warm-up steps included: the watch's calls start at step 0 too.
        WATCH_SHARES.append(watcher.spent_s / (stamps[-1][0] - stamps[0][0]))
    (w0, c0), (w1, c1) = stamps[warmup], stamps[-1]
    return (w1 - w0) / steps * 1e3, (c1 - c0) / steps * 1e3


def time_own_loop(base: TrainConfig, steps: int, warmup: int, out: Path, auto: bool) -> tuple[float, float]:
    """Variants H and Q: variant A's loop on harness.Run with no profiler and no watch, its phases
    marked by hand (H) or found from hooks on the model, backward and the optimizer (Q)."""
    trainer = make_trainer(base)
    model, opt, loss_fn = trainer.model, trainer.optimizer, trainer.workload.loss
    batches = _endless(trainer.loader)
    total = warmup + steps
    found = {"model": model, "optimizer": opt} if auto else {}
    options = {"steps": total, "warmup_steps": warmup, "profile": False, "watch_every": 0}
    tag = f"{'auto' if auto else 'marked'}-{time.monotonic_ns()}"
    t0 = c0 = 0.0
    spent = [0.0, 0]
    hooks = {name: getattr(AutoPhases, name) for name in AUTO_HOOKS}
    if auto:  # timed where they are registered: the class's functions, while this run starts
        for name, hook in hooks.items():
            setattr(AutoPhases, name, _timed_call(hook, spent))
    run = Run(log_dir=str(out), run_name=tag, device=DEVICE, quiet=True, **found, **options)
    for name in OWN_CALLS + (AUTO_CALLS if auto else ()):
        setattr(run, name, _timed_call(getattr(run, name), spent))
    try:
        run.start()
    finally:
        for name, hook in hooks.items():
            setattr(AutoPhases, name, hook)
    try:
        for step in range(total):
            if step == warmup:
                _sync()
                t0, c0 = time.perf_counter(), time.process_time()
                spent[0] = 0.0  # the timed steps' share only
            with run.step():
                if auto:
                    x, y = next(batches)
                    x, y = x.to(DEVICE), y.to(DEVICE)
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    continue
                with run.phase("data"):
                    x, y = next(batches)
                    x, y = x.to(DEVICE), y.to(DEVICE)
                with run.phase("forward"):
                    loss = loss_fn(model(x), y)
                with run.phase("backward"):
                    loss.backward()
                with run.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        _sync()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        run.close()
    LOOP_SHARES[auto].append(spent[0] / elapsed)
    return elapsed / steps * 1e3, cpu / steps * 1e3


def _read_state(port: int, done: threading.Event) -> None:
    """Variant V's reader: the debug server's state route once every DEBUG_POLL_S until `done`."""
    while not done.wait(DEBUG_POLL_S):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/harness/state", timeout=10) as resp:
                resp.read()
        except OSError:
            pass  # the frontend still starting: the next read finds it


def _timed_call(call: Any, inside: list) -> Any:
    """`call`, adding the time spent in it to inside[0] unless called from another timed call."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        inside[1] += 1
        t = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            inside[1] -= 1
            if inside[1] == 0:
                inside[0] += time.perf_counter() - t

    return timed


def init_one_rank() -> None:
    """A gloo process group of one rank, env:// with the launcher's variables as torchrun sets
    them: torch's debug server (V) reaches the job's store through them."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", rank=0, world_size=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="torch")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument(
        "--record-steps", type=int, default=40, help="timed steps of variant D (recording holds every event in memory)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = least noise)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs (cuda: GPU 0)")
    args, extra = ap.parse_known_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("overhead.py: error: --device cuda but torch sees no CUDA device; use --device cpu")
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(args.threads)
    cuda = DEVICE.type == "cuda"
    env = LaunchEnv.from_environ({}, cuda=cuda, device_count=1 if cuda else None)
    base = resolve_environment(parse_config(["--mode", args.mode, *extra]), env)
    names = (
        "A minimal",
        "B harness off",
        "C outside window",
        "D inside window",
        "S no scalars",
        "W watch on",
        "P metrics on",
        "H marked by hand",
        "Q found by hooks",
        "V debug server on",
    )
    init_one_rank()
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        runs = {
            names[0]: lambda: time_minimal(make_trainer(base), args.steps, args.warmup),
            names[1]: lambda: time_harness(base, args.steps, args.warmup, "off", out, own=True),
            names[2]: lambda: time_harness(base, args.steps, args.warmup, "wait", out),
            names[3]: lambda: time_harness(base, args.record_steps, args.warmup, "record", out),
            names[4]: lambda: time_harness(base, args.steps, args.warmup, "off", out, scalars=False),
            names[5]: lambda: time_harness(base, args.steps, args.warmup, "off", out, watch=True),
            names[6]: lambda: time_harness(base, args.steps, args.warmup, "off", out, metrics=True),
            names[7]: lambda: time_own_loop(base, args.steps, args.warmup, out, auto=False),
            names[8]: lambda: time_own_loop(base, args.steps, args.warmup, out, auto=True),
            names[9]: lambda: time_harness(base, args.steps, args.warmup, "off", out, debug=True),
        }
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                gc.collect()
                results[name].append(runs[name]())
            print(
                f"rep {rep + 1}/{args.reps} wall/cpu ms: "
                + ", ".join(f"{k.split()[0]}={v[-1][0]:.3f}/{v[-1][1]:.3f}" for k, v in results.items()),
                flush=True,
            )
    print(
        f"\nmode={args.mode} device={args.device} steps={args.steps} (D: {args.record_steps}) reps={args.reps} "
        f"threads={args.threads} torch={torch.__version__}"
    )
    print(f"{'variant':<20}{'wall ms/step':>14}{'min':>9}{'max':>9}{'cpu ms/step':>14}{'min':>9}{'max':>9}")
    for k, v in results.items():
        wall, cpu = [x[0] for x in v], [x[1] for x in v]
        print(
            f"{k:<20}{statistics.median(wall):>14.3f}{min(wall):>9.3f}{max(wall):>9.3f}"
            f"{statistics.median(cpu):>14.3f}{min(cpu):>9.3f}{max(cpu):>9.3f}"
        )

    def paired(num: str, den: str, clock: int) -> float:
        return statistics.median(n[clock] / d[clock] for n, d in zip(results[num], results[den]))

    print("\nmedian of per-repetition ratios        wall     cpu")
    for label, num, den, target in (
        ("(a) harness off / minimal loop", names[1], names[0], "target <= 1.02"),
        ("(b) outside window / profiling off", names[2], names[1], "target <= 1.02"),
        ("(c) inside window / profiling off", names[3], names[1], "the profiler's cost"),
        ("(d) harness off / same, no scalars", names[1], names[4], "TensorBoard scalars' cost"),
        ("(e) watch on / harness off", names[5], names[1], "target <= 1.005"),
        ("(g) metrics on / harness off", names[6], names[1], "target <= 1.005"),
        ("(j) found by hooks / marked by hand", names[8], names[7], "automatic phases' cost"),
        ("(l) debug server on / harness off", names[9], names[1], "target <= 1.005"),
    ):
        print(f"{label:<38}{paired(num, den, 0):>7.4f}{paired(num, den, 1):>8.4f}  ({target})")
    print(
        f"(f) the watch's own time / the loop's: median {statistics.median(WATCH_SHARES) * 100:.3f}%, max "
        f"{max(WATCH_SHARES) * 100:.3f}% (timed inside its calls: exact where (e) is within the noise)"
    )
    print(
        f"(i) the harness's own time / the loop's (B): median {statistics.median(OWN_SHARES) * 100:.3f}%, max "
        f"{max(OWN_SHARES) * 100:.3f}% (timed inside Run's step and phase calls: what (a) measures, less the noise)"
    )
    print(
        f"(k) the harness's own time / the loop's, marked by hand (H): median "
        f"{statistics.median(LOOP_SHARES[False]) * 100:.3f}%; found by hooks (Q): median "
        f"{statistics.median(LOOP_SHARES[True]) * 100:.3f}% (timed inside Run's calls and the hooks)"
    )
    print(
        f"(m) the debug server's own time / the loop's (V): median {statistics.median(DEBUG_SHARES) * 100:.4f}%, max "
        f"{max(DEBUG_SHARES) * 100:.4f}% (the step's append and the answers to a read a second, timed inside them)"
    )
    print(
        f"(h) the metrics' own time / the loop's: median {statistics.median(METRICS_SHARES) * 100:.3f}%, max "
        f"{max(METRICS_SHARES) * 100:.3f}% (served on a port and filed, updated every step; target <= 0.5%)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
