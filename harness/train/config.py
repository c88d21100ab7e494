"""Training configuration: validated dataclasses, one per TOML table.

Precedence: field defaults < `--config FILE` (TOML) < command-line flags. Every field is a knob
with one definition here; `harness.train.cli` builds its flags from the field metadata. Validation runs
in `__post_init__`, so a config that exists is a valid one, and `resolve_environment` checks what
depends on the launcher (world size, CUDA) before any process group starts.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.paths import DEFAULT_LOG_DIR

MODES = ("baseline", "data", "torch", "kernel", "comm")
ARCHS = ("mlp", "cnn")
PARALLELS = ("auto", "none", "ddp", "fsdp")
BACKENDS = ("auto", "gloo", "nccl")
AMPS = ("none", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PHASES = ("data", "forward", "backward", "optimizer")
OPTIMIZERS = ("adamw", "sgd")


class ConfigError(ValueError):
    """A configuration value is invalid; `field` names it as `section.name`."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def knob(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None) -> Any:
    """A config field with its command-line flag, help text and allowed values."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


def _check_choice(section: str, name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{section}.{name}", f"{value!r} is not allowed; use one of {', '.join(map(str, choices))}")


def check_min(section: str, name: str, value: float | None, minimum: float) -> None:
    if value is not None and value < minimum:
        raise ConfigError(f"{section}.{name}", f"{value!r} must be >= {minimum}")


def check_types(obj: Any, section: str) -> None:
    """Reject values whose type does not match the annotation (TOML and CLI both feed in).

    A parameterised annotation (`tuple[int, ...]`) is checked against its origin (`tuple`) only;
    the field's own normaliser checks the items.
    """
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        expected = hints[f.name]
        allowed = tuple(typing.get_origin(t) or t for t in typing.get_args(expected)) or (expected,)
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            setattr(obj, f.name, float(value))
            continue
        ok = any(
            isinstance(value, t) and not (t is int and isinstance(value, bool))
            for t in allowed
            if isinstance(t, type) and t is not type(None)
        )
        if not ok:
            names = " or ".join(t.__name__ for t in allowed if isinstance(t, type))
            raise ConfigError(f"{section}.{f.name}", f"{value!r} is not a {names}")
        if f.metadata.get("choices"):
            _check_choice(section, f.name, value, f.metadata["choices"])


def _as_int_tuple(section: str, name: str, value: Any) -> Any:
    """`3`, `[1, 3]` (TOML) or `"1,3"` (command line) as `(1, 3)`; None stays None."""
    where = f"{section}.{name}"
    if isinstance(value, str):
        try:
            return tuple(int(part) for part in value.split(","))
        except ValueError:
            raise ConfigError(where, f"{value!r} is not a comma-separated list of integers (e.g. 1,3)") from None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(where, f"{value!r} must be a non-empty list of integers")
        return tuple(value)
    if value is not None:
        raise ConfigError(where, f"{value!r} is not an integer or a list of integers")
    return value


TRACE_SUMMARY_MODES = ("off", "alongside", "only")
SLOW_KINDS = ("sleep", "compute")
MODE_HIDDEN = {"baseline": 512, "data": 256, "torch": 256, "kernel": 2048, "comm": 64}
# Plain SGD for the embedding tables, as DLRM trains them: AdamW's per-parameter state would
# make the comm workload optimizer-bound (measured: 60% of its CPU step) instead of comm-bound.
MODE_OPTIMIZER = {"comm": "sgd"}


@dataclass(kw_only=True)
class WorkloadConfig:
    """Which lab workload runs, its size, and the step budget."""

    mode: str = knob("baseline", "lab workload: which bottleneck it forces", choices=MODES)
    arch: str = knob("mlp", "baseline model: mlp, or cnn (where --channels-last applies)", choices=ARCHS)
    batch_size: int = knob(64, "samples per rank per step")
    steps: int = knob(30, "training steps in total, warm-up included")
    warmup_steps: int = knob(5, "first steps left out of the statistics")
    seed: int = knob(0, "seed for model weights and synthetic data (data differs per rank)")
    hidden: int | None = knob(
        None, "hidden width (default per mode: baseline 512, data 256, torch 256, kernel 2048, comm 64)"
    )
    micro_ops: int = knob(60, "torch mode: repeats of the 3-op elementwise chain per forward")
    pointwise_depth: int = knob(8, "kernel mode: pointwise blocks (gate, gelu, layer_norm, add)")
    num_tables: int = knob(4, "comm mode: embedding tables with dense gradients")
    table_rows: int = knob(50_000, "comm mode: rows per embedding table")
    optimizer: str | None = knob(
        None, "optimizer (default per mode: sgd in comm mode, adamw otherwise)", choices=OPTIMIZERS
    )

    def __post_init__(self) -> None:
        check_types(self, "workload")
        for name in ("batch_size", "steps", "hidden", "micro_ops", "pointwise_depth", "num_tables", "table_rows"):
            check_min("workload", name, getattr(self, name), 1)
        check_min("workload", "warmup_steps", self.warmup_steps, 0)
        if self.hidden is None:
            self.hidden = MODE_HIDDEN[self.mode]
        if self.optimizer is None:
            self.optimizer = MODE_OPTIMIZER.get(self.mode, "adamw")
        if self.warmup_steps >= self.steps:
            raise ConfigError(
                "workload.warmup_steps", f"{self.warmup_steps} leaves no measured step; must be < steps ({self.steps})"
            )


@dataclass(kw_only=True)
class DataConfig:
    """The input pipeline (DataLoader) knobs; `data` mode makes them matter."""

    num_workers: int = knob(0, "DataLoader worker processes")
    pin_memory: bool = knob(False, "page-locked host batches (only with CUDA)")
    prefetch_factor: int | None = knob(None, "batches prefetched per worker (needs --num-workers > 0)")
    persistent_workers: bool = knob(False, "keep workers alive between epochs (needs --num-workers > 0)")
    sample_cost: int = knob(40, "data mode: preprocessing passes per sample in Dataset.__getitem__")

    def __post_init__(self) -> None:
        check_types(self, "data")
        check_min("data", "num_workers", self.num_workers, 0)
        check_min("data", "prefetch_factor", self.prefetch_factor, 1)
        check_min("data", "sample_cost", self.sample_cost, 0)
        if self.num_workers == 0 and self.prefetch_factor is not None:
            raise ConfigError("data.prefetch_factor", "needs --num-workers > 0")
        if self.num_workers == 0 and self.persistent_workers:
            raise ConfigError("data.persistent_workers", "needs --num-workers > 0")


@dataclass(kw_only=True)
class ParallelConfig:
    """How the model is spread over ranks and which collective backend carries it."""

    parallel: str = knob("auto", "auto = ddp under torchrun, none in a single process", choices=PARALLELS)
    backend: str = knob("auto", "auto = nccl when CUDA is present, gloo otherwise", choices=BACKENDS)
    bucket_cap_mb: float = knob(25.0, "DDP gradient bucket size")
    gradient_as_bucket_view: bool = knob(False, "DDP: gradients alias the buckets (saves a copy)")
    static_graph: bool = knob(False, "DDP: the graph is the same every step")
    reshard_after_forward: bool = knob(True, "FSDP: free gathered parameters after forward")
    collective_timeout: float = knob(
        600.0,
        "seconds a collective may wait for its peers before it fails (the process "
        "group's timeout): a rank that stops entering collectives ends the job after "
        "this long, with Flight Recorder dumps in <run>/flight/",
        flag="--collective-timeout",
    )
    flight_recorder: int = knob(
        2000,
        "Flight Recorder entries kept per rank (TORCH_FR_BUFFER_SIZE, unless set in the environment); 0 turns it off",
        flag="--flight-recorder",
    )

    def __post_init__(self) -> None:
        check_types(self, "parallel")
        if self.bucket_cap_mb <= 0:
            raise ConfigError("parallel.bucket_cap_mb", f"{self.bucket_cap_mb!r} must be > 0")
        if self.collective_timeout <= 0:
            raise ConfigError("parallel.collective_timeout", f"{self.collective_timeout!r} must be > 0 seconds")
        check_min("parallel", "flight_recorder", self.flight_recorder, 0)


@dataclass(kw_only=True)
class SpeedConfig:
    """Precision and speed knobs from the classic optimisation ladder."""

    amp: str = knob("none", "autocast dtype (GradScaler only for fp16)", choices=AMPS)
    compile: bool = knob(False, "torch.compile the model")
    compile_mode: str = knob("default", "torch.compile mode", choices=COMPILE_MODES)
    channels_last: bool = knob(False, "channels_last memory format (cnn arch)")
    cudnn_benchmark: bool = knob(False, "torch.backends.cudnn.benchmark")
    fused_optimizer: bool = knob(False, "fused optimizer kernel (AdamW or SGD)")
    non_blocking: bool = knob(False, "asynchronous host-to-device copies")
    sync_loss: bool = knob(False, "read loss.item() every step (the host-sync anti-pattern)")

    def __post_init__(self) -> None:
        check_types(self, "speed")


@dataclass(kw_only=True)
class ProfilerConfig:
    """torch.profiler schedule and options; `--no-profile` runs with no profiler at all."""

    profile: bool = knob(True, "run torch.profiler (--no-profile: no profiler at all)")
    # DDP's runtime logger waits on its CUDA timing events at the start of forward in
    # iterations 1-10 and every 100th (kDDPRuntimeLoggingSampleRate): a window inside steps 1-10
    # records those host syncs on every step. The default window (steps 11-13) starts after them.
    wait: int = knob(
        9,
        "profiler schedule: steps skipped before each window (9 with --warmup 2: recording starts at "
        "step 11, after the host syncs of DDP's runtime logger in steps 1-10)",
    )
    warmup: int = knob(2, "profiler schedule: steps traced but discarded before each window")
    active: int = knob(3, "profiler schedule: steps recorded per window")
    repeat: int = knob(1, "profiler schedule: windows (0 = until the run ends)")
    record_shapes: bool = knob(False, "record operator input shapes")
    profile_memory: bool = knob(
        False,
        "record tensor allocations, and write each window's memory timeline next to "
        "its trace (<worker>.<window>.memory_timeline.json.gz; turns on --record-shapes and "
        "--with-stack while it records, which torch's memory timeline needs)",
    )
    with_stack: bool = knob(False, "record Python stacks")
    trace_summary: str = knob(
        "off",
        "in-job summaries for very large jobs: each rank condenses its window's trace "
        "into <trace>.summary.json as soon as it is written, and the collector reads those: "
        "alongside (keep the trace too) or only (delete the trace once condensed)",
        choices=TRACE_SUMMARY_MODES,
    )
    cuda_profiler_api: bool = knob(
        False,
        "call cudaProfilerStart as the first measured step (after --warmup-steps) "
        "begins and cudaProfilerStop after the last, so Nsight started with "
        "--profile-from-start off (ncu) or --capture-range=cudaProfilerApi (nsys) "
        "skips start-up and warm-up (CUDA only)",
    )

    def __post_init__(self) -> None:
        check_types(self, "profiler")
        for name in ("wait", "warmup", "repeat"):
            check_min("profiler", name, getattr(self, name), 0)
        check_min("profiler", "active", self.active, 1)


@dataclass(kw_only=True)
class SlowConfig:
    """Fault injection: slow one phase on some ranks by a fixed delay, reproducibly."""

    rank: tuple[int, ...] | None = knob(
        None, "ranks to slow down: one rank or a comma-separated list (1,3)", flag="--slow-rank"
    )
    ms: float = knob(0.0, "delay added to the phase, per affected step", flag="--slow-ms")
    phase: str = knob("data", "phase that is slowed", flag="--slow-phase", choices=PHASES)
    every: int = knob(1, "slow every N-th step only (counted from --slow-from)", flag="--slow-every")
    kind: str = knob(
        "sleep",
        "sleep: the host idles (a slow input or Python step); compute: extra matmuls on the "
        "rank's device for about the delay (a slow GPU: longer kernels, the host not blocked)",
        flag="--slow-kind",
        choices=SLOW_KINDS,
    )
    from_step: int = knob(0, "first step slowed (earlier steps run normally)", flag="--slow-from")

    def __post_init__(self) -> None:
        self.rank = _as_int_tuple("slow", "rank", self.rank)
        check_types(self, "slow")
        for rank in self.rank or ():
            check_min("slow", "rank", rank, 0)
        if self.rank is not None and len(set(self.rank)) < len(self.rank):
            twice = sorted({r for r in self.rank if self.rank.count(r) > 1})
            raise ConfigError(
                "slow.rank", f"rank {', '.join(map(str, twice))} listed more than once; list each rank once"
            )
        check_min("slow", "ms", self.ms, 0)
        check_min("slow", "every", self.every, 1)
        check_min("slow", "from_step", self.from_step, 0)
        if self.rank is None and self.ms > 0:
            raise ConfigError("slow.rank", "--slow-ms needs --slow-rank")

    def slows(self, rank: int, phase: str, step: int) -> bool:
        """Whether `rank` is delayed in `phase` of `step`."""
        return (
            self.rank is not None
            and rank in self.rank
            and self.ms > 0
            and phase == self.phase
            and step >= self.from_step
            and (step - self.from_step) % self.every == 0
        )


@dataclass(kw_only=True)
class WatchConfig:
    """The live straggler watch (harness/train/watch.py): every N steps the ranks exchange their step
    timings in one all-gather and apply the collector's straggler rule to them."""

    # 100: on the lab's CPU workload (steps shorter than a real job's) the watch's own time is
    # within its 0.5% target at 100 steps and over it at 50 (bench/RESULTS.md, "Harness and
    # profiler overhead"). On steps of 50 ms or more (GPU training) either costs under 0.1%.
    every: int = knob(
        100,
        "every N steps, the ranks exchange their last steps' phase times and the watch names the stragglers (0 = off)",
        flag="--watch-every",
    )
    capture_on_straggler: bool = knob(
        False,
        "when the watch flags a new straggler, every rank traces a profiler "
        "window (--warmup + --active steps) from the first free step at least two "
        "steps later",
        flag="--capture-on-straggler",
    )
    max_captures: int = knob(1, "at most this many triggered trace windows per run", flag="--max-captures")
    min_late_ms: float = knob(
        0.0,
        "watch: least lateness per step, ms, for a straggler (as the collector's "
        "--min-late-ms; default: no absolute floor)",
        flag="--watch-min-late-ms",
    )

    def __post_init__(self) -> None:
        check_types(self, "watch")
        check_min("watch", "every", self.every, 0)
        check_min("watch", "max_captures", self.max_captures, 1)
        check_min("watch", "min_late_ms", self.min_late_ms, 0)
        if self.capture_on_straggler and self.every == 0:
            raise ConfigError(
                "watch.capture_on_straggler", "--capture-on-straggler needs the watch; drop --watch-every 0"
            )


@dataclass(kw_only=True)
class DebugConfig:
    """Steering the running job through PyTorch's debug server (harness/debug/, docs/steer.md)."""

    debug_server: bool = knob(
        False,
        "start torch's debug server with the harness's page (each rank's state, the watch's verdict) and its "
        "action: trace the next N steps on every rank",
        flag="--debug-server",
    )
    debug_port: int = knob(25999, "the debug server's port, on rank 0 (torch's default)", flag="--debug-port")
    debug_addr: str = knob(
        "127.0.0.1",
        "the address the debug server binds to: loopback by default; any other asks every request for a token "
        "($HARNESS_DEBUG_TOKEN, or one written to <run>/debug_token)",
        flag="--debug-addr",
    )
    max_debug_captures: int = knob(
        3, "at most this many captures the debug server starts per run", flag="--max-debug-captures"
    )

    def __post_init__(self) -> None:
        check_types(self, "debug")
        if not 1 <= self.debug_port <= 65535:
            raise ConfigError("debug.debug_port", f"{self.debug_port} is not a TCP port (1-65535)")
        check_min("debug", "max_debug_captures", self.max_debug_captures, 1)
        if not self.debug_addr:
            raise ConfigError(
                "debug.debug_addr", "empty: give an address (127.0.0.1 for loopback, 0.0.0.0 for every one)"
            )


HANG_PHASES = ("data", "forward", "backward", "optimizer")


@dataclass(kw_only=True)
class HangConfig:
    """Fault injection: one rank stops inside a phase of one step and never enters the next collective."""

    rank: int | None = knob(None, "rank that stops (sleeps until it is killed)", flag="--hang-rank")
    step: int | None = knob(None, "step at which it stops", flag="--hang-step")
    phase: str = knob(
        "forward",
        "phase in which it stops (before that phase's work, so before the collective that follows)",
        flag="--hang-phase",
        choices=HANG_PHASES,
    )

    def __post_init__(self) -> None:
        check_types(self, "hang")
        check_min("hang", "rank", self.rank, 0)
        check_min("hang", "step", self.step, 0)
        if (self.rank is None) != (self.step is None):
            raise ConfigError(
                "hang.rank" if self.rank is None else "hang.step", "--hang-rank and --hang-step go together"
            )

    def stops(self, rank: int, phase: str, step: int) -> bool:
        """Whether `rank` stops for good in `phase` of `step`."""
        return self.rank == rank and self.step == step and self.phase == phase


@dataclass(kw_only=True)
class LeakConfig:
    """Fault injection: a memory leak on one rank, as an undetached loss history makes one."""

    rank: int | None = knob(None, "rank that leaks memory", flag="--leak-rank")
    mb: float = knob(
        0.0,
        "MB kept alive per step on that rank (a tensor of that size appended to a list that "
        "is never cleared, like losses.append(loss) without .item()): host RSS grows on CPU, "
        "allocated GPU memory on CUDA",
        flag="--leak-mb",
    )

    def __post_init__(self) -> None:
        check_types(self, "leak")
        check_min("leak", "rank", self.rank, 0)
        check_min("leak", "mb", self.mb, 0)
        if self.rank is None and self.mb > 0:
            raise ConfigError("leak.rank", "--leak-mb needs --leak-rank")


@dataclass(kw_only=True)
class OutputConfig:
    """Where the run's traces, statistics and summary go."""

    log_dir: str = knob(DEFAULT_LOG_DIR, "root folder of all runs")
    run_name: str | None = knob(None, "run folder name (default: mode-parallel-wsN-time)")
    scalars: bool = knob(
        True, "write per-rank TensorBoard scalars (step time, data wait, throughput, memory) to <run>/tb/"
    )
    metrics_port: int | None = knob(
        None,
        "serve Prometheus metrics (step, phases, memory, watch, tracing) on PORT + local rank, at /metrics "
        "(docs/metrics.md; default: off)",
        flag="--metrics-port",
    )
    # 0.0.0.0, not "": prometheus_client looks the address up, and an empty name fails the lookup
    # on some machines ("Name or service not known"), so the default served nothing there
    metrics_addr: str = knob("0.0.0.0", "the address the metrics endpoints bind to (default 0.0.0.0: every interface)")
    metrics_file: str | None = knob(
        None,
        "write the metrics in the node exporter's textfile format to this file, one per rank ({rank} in it, "
        "else .rank<R> before its suffix), rewritten atomically at most once a second (default: off)",
        flag="--metrics-file",
    )

    def __post_init__(self) -> None:
        check_types(self, "output")
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError("output.metrics_port", f"{self.metrics_port} is not a TCP port (1-65535)")
        if self.run_name is not None and (not self.run_name or "/" in self.run_name or self.run_name in (".", "..")):
            raise ConfigError("output.run_name", f"{self.run_name!r} must be a plain folder name")


SECTIONS: dict[str, type] = {
    "workload": WorkloadConfig,
    "data": DataConfig,
    "parallel": ParallelConfig,
    "speed": SpeedConfig,
    "profiler": ProfilerConfig,
    "slow": SlowConfig,
    "leak": LeakConfig,
    "hang": HangConfig,
    "watch": WatchConfig,
    "debug": DebugConfig,
    "output": OutputConfig,
}


@dataclass(kw_only=True)
class TrainConfig:
    """The whole resolved configuration of one training run."""

    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    slow: SlowConfig = field(default_factory=SlowConfig)
    leak: LeakConfig = field(default_factory=LeakConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        strag = self.slow
        if strag.rank is not None and strag.ms > 0 and strag.from_step >= self.workload.steps:
            raise ConfigError(
                "slow.from_step",
                f"{strag.from_step} is past the last step; must be < steps ({self.workload.steps})",
            )
        if self.watch.capture_on_straggler and not self.profiler.profile:
            raise ConfigError(
                "watch.capture_on_straggler", "--capture-on-straggler traces with the profiler; drop --no-profile"
            )
        if self.hang.step is not None and self.hang.step >= self.workload.steps:
            raise ConfigError(
                "hang.step", f"{self.hang.step} is past the last step; must be < steps ({self.workload.steps})"
            )

    def check_windows_fit(self) -> None:
        """Every profiler window lies inside the run (`windows_fit`), checked on what a user typed
        (`cli.parse_config`); a program may place a window past the run on purpose, as the
        overhead benchmark's variant without recording does."""
        windows_fit(self.profiler, self.workload.steps)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def windows_fit(prof: ProfilerConfig, steps: int) -> None:
    """Raise ConfigError unless every profiler window the schedule asks for lies inside a run of
    `steps` steps. torch's schedule records steps wait+warmup .. wait+warmup+active-1 of each
    cycle (steps count from 0), and saves a window when the step after its last one begins; a
    run that ends before (or inside) a window writes no trace or one cut short, which reads as a
    run without traces or with a stub step. `repeat 0` (windows until the run ends) may cut its
    last one."""
    if not prof.profile or prof.repeat == 0:
        return
    cycle = prof.wait + prof.warmup + prof.active
    need = prof.repeat * cycle
    if steps < need:
        first = (prof.repeat - 1) * cycle + prof.wait + prof.warmup
        which = "its window" if prof.repeat == 1 else f"window {prof.repeat} of {prof.repeat}"
        raise ConfigError(
            "profiler.active",
            f"the profiler records steps {first}-{first + prof.active - 1} in {which} (after "
            f"--wait {prof.wait} and --warmup {prof.warmup}; steps count from 0), but --steps "
            f"{steps} ends at step {steps - 1}: use --steps {need} or more, or a shorter --wait, "
            "--warmup, --active or --repeat",
        )


def flag_of(section: str, f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def load_toml(path: Path, sections: dict[str, type] | None = None) -> dict[str, dict[str, Any]]:
    """Read a TOML preset of the `sections` (default: the lab's); unknown tables or keys are
    errors, not silently ignored."""
    sections = SECTIONS if sections is None else sections
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("config", f"file {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("config", f"{path} is not valid TOML ({exc})") from None
    for section, values in raw.items():
        if section not in sections:
            raise ConfigError(section, f"unknown table in {path}; use one of {', '.join(sections)}")
        if not isinstance(values, dict):
            raise ConfigError(section, f"must be a table in {path}")
        known = {f.name for f in dataclasses.fields(sections[section])}
        for key in values:
            if key not in known:
                raise ConfigError(f"{section}.{key}", f"unknown key in {path}; use one of {', '.join(sorted(known))}")
    return raw


def build_config(layers: list[dict[str, dict[str, Any]]]) -> TrainConfig:
    """Merge layers of `{section: {field: value}}` (later wins) into a validated TrainConfig."""
    merged: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for layer in layers:
        for section, values in layer.items():
            merged[section].update(values)
    return TrainConfig(**{name: cls(**merged[name]) for name, cls in SECTIONS.items()})


@dataclass(frozen=True, kw_only=True)
class LaunchEnv:
    """What the launcher (torchrun, accelerate, SLURM via torchrun) tells this process."""

    rank: int
    local_rank: int
    world_size: int
    distributed: bool
    cuda: bool
    accelerate_fsdp: bool
    local_world_size: int = 1
    device_count: int | None = None  # GPUs this process sees (None: not known)

    @classmethod
    def from_environ(
        cls,
        environ: typing.Mapping[str, str] | None = None,
        *,
        cuda: bool | None = None,
        device_count: int | None = None,
    ) -> LaunchEnv:
        env = os.environ if environ is None else environ
        if cuda is None or (cuda and device_count is None):
            import torch

            cuda = torch.cuda.is_available() if cuda is None else cuda
            if cuda and device_count is None:
                device_count = torch.cuda.device_count()
        distributed = "WORLD_SIZE" in env and "RANK" in env
        local_rank = int(env.get("LOCAL_RANK", 0))
        return cls(
            rank=int(env.get("RANK", 0)),
            local_rank=local_rank,
            world_size=int(env.get("WORLD_SIZE", 1)),
            distributed=distributed,
            cuda=cuda,
            accelerate_fsdp=env.get("ACCELERATE_USE_FSDP", "").lower() == "true",
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", local_rank + 1)),
            device_count=device_count if cuda else None,
        )


def resolve_environment(cfg: TrainConfig, env: LaunchEnv) -> TrainConfig:
    """Replace the `auto` choices and check what depends on the launcher.

    Runs before any process group exists, so a bad combination fails in every rank at once with
    the same message instead of hanging the others.
    """
    par = cfg.parallel
    parallel = par.parallel
    if parallel == "auto":
        parallel = ("fsdp" if env.accelerate_fsdp else "ddp") if env.distributed else "none"
    if parallel in ("ddp", "fsdp") and not env.distributed:
        raise ConfigError(
            "parallel.parallel", f"{parallel} needs a process group: launch with torchrun (or use --parallel none)"
        )
    backend = par.backend
    if backend == "auto":
        backend = "nccl" if env.cuda else "gloo"
    if backend == "nccl" and not env.cuda:
        raise ConfigError("parallel.backend", "nccl needs CUDA, which this machine lacks; use gloo or auto")
    if env.cuda and env.device_count is not None:
        # pick_device gives each LOCAL_RANK its own GPU; with more processes than GPUs two ranks
        # would share one, which NCCL refuses at its first collective (gloo does not: with
        # --backend gloo the ranks share the GPUs round-robin, as the self-check's two ranks on
        # one GPU do). Every rank of the node checks the node's process count, so all of them
        # stop here with the same line.
        procs = max(env.local_world_size, env.local_rank + 1)
        if procs > env.device_count and (backend == "nccl" or env.device_count == 0):
            raise ConfigError(
                "launch.nproc_per_node",
                f"{procs} processes on this node but {env.device_count} GPU(s) "
                "visible; start at most one process per GPU "
                "(torchrun --nproc-per-node, CUDA_VISIBLE_DEVICES)",
            )
    strag = cfg.slow
    for rank in strag.rank or ():
        if rank >= env.world_size:
            raise ConfigError("slow.rank", f"{rank} must be < world size ({env.world_size})")
    if cfg.hang.rank is not None and (env.world_size < 2 or cfg.hang.rank >= env.world_size):
        raise ConfigError(
            "hang.rank",
            f"{cfg.hang.rank} must be < world size ({env.world_size}) and the job needs "
            "2 or more ranks (a hang is one rank missing from a collective)",
        )
    if cfg.leak.rank is not None and cfg.leak.rank >= env.world_size:
        raise ConfigError("leak.rank", f"{cfg.leak.rank} must be < world size ({env.world_size})")
    if cfg.speed.amp == "fp16" and parallel == "fsdp":
        # FSDP2 with fp16 params would need a sharded grad scaler; keep the supported path only.
        raise ConfigError("speed.amp", "fp16 with fsdp is not supported; use bf16 or none")
    if cfg.speed.fused_optimizer and cfg.workload.optimizer == "sgd" and parallel == "fsdp":
        # DTensor has no sharding rule for aten._fused_sgd_: the first optimizer step would raise
        # NotImplementedError. Fused AdamW has one.
        raise ConfigError(
            "speed.fused_optimizer",
            "fused SGD does not run on FSDP2's sharded parameters; "
            "drop --fused-optimizer (SGD then uses foreach) or use --optimizer adamw",
        )
    return dataclasses.replace(cfg, parallel=dataclasses.replace(par, parallel=parallel, backend=backend))
