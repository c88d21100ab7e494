"""The lab's configuration (`python -m harness.train`): its own tables (workload, data, parallel,
speed, and the injected faults) beside the settings every harness.Run has (harness/run/settings.py).

Precedence: field defaults < `--config FILE` (TOML) < command-line flags. Every field is a knob
with one definition; `harness.train.cli` builds its flags from the field metadata. Validation runs
in `__post_init__`, so a config that exists is a valid one, and `resolve_environment` checks what
depends on the launcher (world size, CUDA) before any process group starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from harness.run.settings import (
    ConfigError,
    DebugConfig,
    LaunchEnv,
    OutputConfig,
    ProfilerConfig,
    WatchConfig,
    check_min,
    check_types,
    knob,
    windows_fit,
)

MODES = ("baseline", "data", "torch", "kernel", "comm")
ARCHS = ("mlp", "cnn")
PARALLELS = ("auto", "none", "ddp", "fsdp")
BACKENDS = ("auto", "gloo", "nccl")
AMPS = ("none", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PHASES = ("data", "forward", "backward", "optimizer")
OPTIMIZERS = ("adamw", "sgd")


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


def build_config(layers: list[dict[str, dict[str, Any]]]) -> TrainConfig:
    """Merge layers of `{section: {field: value}}` (later wins) into a validated TrainConfig."""
    merged: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for layer in layers:
        for section, values in layer.items():
            merged[section].update(values)
    return TrainConfig(**{name: cls(**merged[name]) for name, cls in SECTIONS.items()})


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
