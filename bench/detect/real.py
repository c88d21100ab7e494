"""The real-run half of the detection campaign: torchrun jobs of the lab on this machine with a
fault injected (harness.train's --straggler-*, --hang-*, --leak-* flags), the collector run on
each as a user runs it, scored against what was injected.

A campaign draws job configurations (`draw_config`: 2 or 4 ranks, or two torchrun agents on
loopback with a host name each; DDP or FSDP2; a lab mode; or, one in PP_EVERY, the 4-rank
pipeline of examples/pipeline_parallel.py, two stages of two data-parallel ranks) and, per
configuration:
1. a clean run (nothing injected): a false-alarm case, and its mean step (the median over the
   ranks of run.json's mean_step_ms) is the clean step the injections are sized from;
2. injected cases drawn for it (`draw_fault`): a straggler (sleep or compute, in data, forward,
   backward or optimizer, 5% to 100% of the clean step, on every step or every 2nd/3rd, from
   ONSET_STEP on, one or two ranks), a hang, or a leak.
Every straggler run traces steps after its onset and runs the live watch every WATCH_EVERY
steps, so one run scores both the collector and the watch. The truth is the injection: the
delay per slowed step / the slowing period is its cost per step (a sleep or a busy loop on a
CPU rank adds its own length to the phase).
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from detect.score import Seen, Truth, case_row, score
from harness.paths import REPORT_JSON, WINDOW_REPORT_TEMPLATE, WINDOWS_JSON

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from jobs import free_port, job_env  # noqa: E402  (the tests' own: the environment every job runs in)

MODES = ("baseline", "torch", "kernel", "comm", "data")
PARALLELS = ("ddp", "fsdp", "pp")
# The pipeline configuration: the example's job (the lab has no stage split), its stragglers in
# the phases a stage's neighbours wait for it in (it injects no hang or leak).
PP_EXAMPLE = REPO / "examples" / "pipeline_parallel.py"
PP_PHASES = ("forward", "backward")
PP_EVERY = 6  # about one configuration in this many, where pp is among the parallels drawn
MODE_WEIGHTS = (3, 3, 2, 2, 1)  # data's steps are ~20x the others' (its loader sleeps): drawn least
PHASES = ("data", "forward", "backward", "optimizer")
STEPS = 30
WARMUP_STEPS = 4
ONSET_STEP = 8  # the first slowed step: mid-run, after the watch's first interval
WATCH_EVERY = 5
# The profiler traces 8 steps from step 11 (wait 10, warm-up 1): after the onset, so the window
# sees the straggler's pattern whole (an every-3rd straggler is slow in 2 or 3 of them). The
# harness's own default is 3 (`--window-steps 3` measures what a user gets with it).
WINDOW_STEPS = 8


def base_args(window_steps: int = WINDOW_STEPS, windows: int = 1) -> list[str]:
    """A straggler or clean case's flags: the run's length and its profiler window; with
    `windows` > 1 that window as many times (each cycle waits its 10 steps again), in a run long
    enough to hold them."""
    profile = ["--wait", "10", "--warmup", "1", "--active", str(window_steps)]
    steps = STEPS
    if windows > 1:
        profile += ["--repeat", str(windows)]
        steps = max(STEPS, windows * (11 + window_steps))
    return ["--steps", str(steps), "--warmup-steps", str(WARMUP_STEPS), "--batch-size", "16", *profile]


HANG_TIMEOUT_S = 20
JOB_TIMEOUT_S = 420


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    nproc: int  # ranks per agent
    nodes: int  # torchrun agents (2: on loopback, each with its own host name where possible)
    parallel: str
    mode: str

    @property
    def world(self) -> int:
        return self.nproc * self.nodes

    def label(self) -> str:
        where = f"{self.nodes}x{self.nproc}" if self.nodes > 1 else str(self.nproc)
        return f"{self.mode}/{self.parallel}/{where}"


@dataclass(frozen=True, kw_only=True)
class Fault:
    kind: str  # clean, sleep, compute, hang or leak
    ranks: tuple[int, ...] = ()
    phase: str | None = None
    size: float = 0.0  # the delay per slowed step / the clean step
    every: int = 1
    hang_step: int | None = None


def draw_config(rng: random.Random, two_hosts: bool, parallels: tuple[str, ...] = PARALLELS) -> JobConfig:
    """A configuration of `parallels` (without pp the draws are those of a seed before pp was
    added: ddp and fsdp are drawn as they were; pp alone: every one a pipeline, on one host)."""
    lab = tuple(p for p in parallels if p != "pp")
    if "pp" in parallels and (not lab or (not two_hosts and rng.random() < 1 / PP_EVERY)):
        return JobConfig(nproc=4, nodes=1, parallel="pp", mode="pipeline")
    mode = rng.choices(MODES, MODE_WEIGHTS)[0]
    if two_hosts:
        return JobConfig(nproc=1, nodes=2, parallel=rng.choice(lab), mode=mode)
    return JobConfig(nproc=rng.choice((2, 2, 4)), nodes=1, parallel=rng.choice(lab), mode=mode)


def draw_fault(rng: random.Random, cfg: JobConfig) -> Fault:
    """A straggler most often; a hang or a leak one case in eight each (a pipeline: stragglers
    only, in forward or backward)."""
    if cfg.parallel == "pp":
        return Fault(
            kind=rng.choice(("sleep", "compute")),
            ranks=(rng.randrange(cfg.world),),
            phase=rng.choice(PP_PHASES),
            size=round(rng.uniform(0.05, 1.0), 3),
            every=1 if rng.random() < 0.6 else rng.choice((2, 3)),
        )
    u = rng.random()
    if u < 0.125 and cfg.nodes == 1:
        return Fault(kind="hang", ranks=(rng.randrange(cfg.world),), phase=rng.choice(PHASES), hang_step=20)
    if u < 0.25:
        return Fault(kind="leak", ranks=(rng.randrange(cfg.world),))
    n_slow = 2 if cfg.world >= 4 and rng.random() < 0.3 else 1
    return Fault(
        kind=rng.choice(("sleep", "compute")),
        ranks=tuple(sorted(rng.sample(range(cfg.world), n_slow))),
        phase=rng.choice(PHASES),
        size=round(rng.uniform(0.05, 1.0), 3),
        every=1 if rng.random() < 0.6 else rng.choice((2, 3)),
    )


def _can_unshare() -> bool:
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


# The pipeline example's own flags; harness.train's others reach its harness.Run as HARNESS_*
# variables (run_config.py: a variable is named after the flag).
EXAMPLE_FLAGS = ("--steps", "--batch-size", "--watch-every", "--log-dir", "--run-name")


def example_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """harness.train's flags for a job (flag, value pairs) as the pipeline example takes them: its
    own and its --slow-* flags as they are, the profiler's and the warm-up as variables."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for flag, value in zip(args[::2], args[1::2]):
        if flag in EXAMPLE_FLAGS or flag.startswith("--slow-"):
            argv += [flag, value]
        else:
            env["HARNESS_" + flag[2:].upper().replace("-", "_")] = value
    return argv, env


def _standalone(nproc: int, target: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """`torchrun --standalone --nproc_per_node NPROC TARGET...` in the tests' job environment
    (with `env` on top): its exit code and output tail."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(
        [*cmd, *target],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        env={**job_env(), **(env or {})},
        cwd=REPO,
    )
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def launch(cfg: JobConfig, args: list[str], log_dir: Path, run_name: str) -> tuple[int, str]:
    """Run harness.train (the pipeline example for pp) as `cfg` says; (exit code of the first
    agent that failed, else 0, its output tail)."""
    if cfg.parallel == "pp":
        argv, env = example_command([*args, "--log-dir", str(log_dir), "--run-name", run_name])
        return _standalone(cfg.nproc, [str(PP_EXAMPLE), *argv], env)
    harness_args = ["--parallel", cfg.parallel, "--mode", cfg.mode, *args, "--log-dir", str(log_dir)]
    harness_args += ["--run-name", run_name]
    if cfg.nodes == 1:
        return _standalone(cfg.nproc, ["-m", "harness.train", *harness_args])
    port = free_port()
    hosts = ["nodea", "nodeb"] if _can_unshare() else [socket.gethostname()] * 2
    procs = []
    for node_rank, host in enumerate(hosts):
        env = dict(
            job_env(),
            NNODES="2",
            NODE_RANK=str(node_rank),
            NPROC_PER_NODE=str(cfg.nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            LOCAL_ADDR="127.0.0.1",
            RDZV_ID=f"detect-{port}",
            TORCHRUN=str(Path(sys.executable).with_name("torchrun")),
        )
        cmd = ["bash", "launch/multinode.sh", *harness_args]
        if hosts[0] != hosts[1]:
            cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *cmd]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outs = [p.communicate(timeout=JOB_TIMEOUT_S)[0] for p in procs]
    failed = [(p.returncode, o) for p, o in zip(procs, outs) if p.returncode != 0]
    return (failed[0][0], failed[0][1][-3000:]) if failed else (0, outs[0][-3000:])


def collect(run_dir: Path, windows: int = 1) -> tuple[dict[str, Any] | None, str]:
    """`python -m harness.collect RUN -q --no-merged`, as a user runs it: (report.json or None,
    stderr). With `windows` > 1, `--window each`: the latest window's report.json, its verdict
    and stragglers replaced by windows.json's (the ranks that recur across the windows)."""
    each = ["--window", "each"] if windows > 1 else []
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(run_dir), "-q", "--no-merged", *each],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        cwd=REPO,
    )
    report = run_dir / "report"
    path = report / WINDOW_REPORT_TEMPLATE.format(window=windows) / REPORT_JSON if each else report / REPORT_JSON
    if proc.returncode != 0 or not path.exists():
        return None, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    doc = json.loads(path.read_text())
    if each:
        across = json.loads((report / WINDOWS_JSON).read_text())
        doc["verdict"] = across["verdict"]
        doc["stragglers"] = [{"rank": r["rank"], "phase": r["phase"]} for r in across["ranks"] if r["recurs"]]
        doc["watch_stragglers"] = across.get("watch_stragglers", [])
        doc.pop("trace_verdict", None)
        if across.get("windows_verdict"):
            doc["trace_verdict"] = across["windows_verdict"]
    return doc, ""


def clean_step_ms(run_dir: Path) -> float:
    """The median over the ranks of run.json's mean_step_ms (the upper middle of an even count)."""
    steps = sorted(float(r["mean_step_ms"]) for r in json.loads((run_dir / "run.json").read_text())["ranks"])
    return steps[len(steps) // 2]


def fault_args(fault: Fault, clean_ms: float, pp: bool = False) -> list[str]:
    """harness.train's flags for `fault` in a job whose clean step is `clean_ms` (`pp`: the
    pipeline example's, one slow rank)."""
    if fault.kind in ("sleep", "compute") and pp:
        return [
            *("--slow-rank", str(fault.ranks[0]), "--slow-ms", f"{fault.size * clean_ms:.2f}"),
            *("--slow-phase", str(fault.phase), "--slow-kind", fault.kind, "--slow-every", str(fault.every)),
            *("--slow-from", str(ONSET_STEP), "--watch-every", str(WATCH_EVERY)),
        ]
    if fault.kind in ("sleep", "compute"):
        return [
            "--slow-rank",
            ",".join(map(str, fault.ranks)),
            "--slow-ms",
            f"{fault.size * clean_ms:.2f}",
            "--slow-phase",
            str(fault.phase),
            "--slow-kind",
            fault.kind,
            "--slow-every",
            str(fault.every),
            "--slow-from",
            str(ONSET_STEP),
            "--watch-every",
            str(WATCH_EVERY),
        ]
    if fault.kind == "hang":  # after the traced window: the collector has traces and the dumps
        return [
            "--hang-rank",
            str(fault.ranks[0]),
            "--hang-step",
            str(fault.hang_step),
            "--hang-phase",
            str(fault.phase),
            "--collective-timeout",
            str(HANG_TIMEOUT_S),
        ]
    if fault.kind == "leak":
        return ["--leak-rank", str(fault.ranks[0]), "--leak-mb", "2"]
    return ["--watch-every", str(WATCH_EVERY)]


def seen_of(doc: dict[str, Any] | None, error: str) -> Seen:
    if doc is None:
        return Seen(verdict="error", error=error or "no report")
    hang = doc.get("hang") or {}
    flags = (doc.get("watch") or {}).get("flags") or []
    floor = doc.get("noise_floor") or {}
    disclosed = any(n["about"] == "noise" for n in doc.get("next_steps", []))
    trace = {s["rank"]: s["phase"] for s in doc["stragglers"]}
    watched = {s["rank"]: s["phase"] for s in doc.get("watch_stragglers", [])}
    return Seen(
        verdict=doc["verdict"],
        stragglers=trace | watched,
        trace_verdict=doc.get("trace_verdict") if doc["verdict"] in ("straggler", "balanced") else None,
        trace_stragglers=trace if watched else None,
        watch_flags=[(int(f["step"]), int(f["rank"])) for f in flags],
        hang_missing=hang.get("missing_ranks"),
        hang_step=hang.get("step"),
        leak_ranks=sorted({f["rank"] for f in doc.get("memory_findings", []) if f["kind"] == "growth"}),
        late_ms={r["rank"]: r["late_ms"] for r in doc.get("ranks", [])},
        threshold_ms=doc.get("threshold_ms"),
        step_ms=(doc.get("run") or {}).get("median_step_ms"),
        floor_share=floor.get("share") if disclosed else None,
        latest_rank=floor.get("latest_rank"),
    )


def run_case(
    cfg: JobConfig,
    fault: Fault,
    clean_ms: float | None,
    work: Path,
    name: str,
    keep: bool = False,
    window_steps: int = WINDOW_STEPS,
    windows: int = 1,
) -> tuple[dict[str, Any], float | None]:
    """One job with `fault` (kind "clean": none), collected and scored: its row for the
    campaign's JSON, and for a clean job its clean step (None when the job failed; `clean_ms` is
    then not needed, else it sizes the fault). The run's folder is removed unless `keep` or the
    case failed. A straggler or clean case records `windows` windows and is judged across them
    (`--window each`); hangs and leaks keep their one window."""
    windows = windows if fault.kind in ("clean", "sleep", "compute") else 1
    args = [*base_args(window_steps, windows), *fault_args(fault, clean_ms or 0.0, pp=cfg.parallel == "pp")]
    if fault.kind == "leak":  # the memory rule reads the step logs' RSS over many steps
        args = ["--steps", "40", "--warmup-steps", "5", "--batch-size", "16", "--wait", "1", "--warmup", "1"]
        args += ["--active", "2", *fault_args(fault, 0.0)]
    code, tail = launch(cfg, args, work, name)
    run_dir = work / name
    doc, error = collect(run_dir, windows) if run_dir.exists() else (None, "no run folder")
    if code != 0 and fault.kind != "hang" and not error:
        error = f"job exited {code}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
        doc = None
    if fault.kind == "clean":
        clean_ms = clean_step_ms(run_dir) if not error else None
    kind = {"sleep": "straggler", "compute": "straggler"}.get(fault.kind, fault.kind)
    truth = Truth(
        kind=kind,
        ranks=list(fault.ranks),
        phase=fault.phase if kind == "straggler" else None,
        cost_share=round(fault.size / fault.every, 4) if kind == "straggler" else 0.0,
        # the collective it never enters: its step's, or after the optimizer the next step's first
        step=None if fault.hang_step is None else fault.hang_step + (fault.phase == "optimizer"),
    )
    seen = seen_of(doc, error)
    row = case_row(
        {"campaign": "real", "config": asdict(cfg), "label": cfg.label(), "fault": asdict(fault), "run": name}
        | {
            "clean_step_ms": round(clean_ms or 0.0, 3),
            "watch_every": WATCH_EVERY if kind in ("straggler", "clean") else 0,
        },
        truth,
        seen,
        score(truth, seen, onset_step=ONSET_STEP if kind == "straggler" else None),
    )
    if not error and not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return row, clean_ms
