"""Training configuration: validated dataclasses, one per TOML table.

Precedence: field defaults < `--config FILE` (TOML) < command-line flags. Every field is a knob
with one definition here; `harness.cli` builds its flags from the field metadata. Validation runs
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


def knob(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None) -> Any:
    """A config field with its command-line flag, help text and allowed values."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


def _check_choice(section: str, name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{section}.{name}", f"{value!r} is not allowed; use one of {', '.join(map(str, choices))}")


def _check_min(section: str, name: str, value: float | None, minimum: float) -> None:
    if value is not None and value < minimum:
        raise ConfigError(f"{section}.{name}", f"{value!r} must be >= {minimum}")


def _check_types(obj: Any, section: str) -> None:
    """Reject values whose type does not match the annotation (TOML and CLI both feed in)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        expected = hints[f.name]
        allowed = typing.get_args(expected) or (expected,)
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


TRACE_SUMMARY_MODES = ("off", "alongside", "only")
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
    hidden: int | None = knob(None, "hidden width (default per mode: baseline 512, data 256, torch 256, kernel 2048, comm 64)")
    micro_ops: int = knob(60, "torch mode: repeats of the 3-op elementwise chain per forward")
    pointwise_depth: int = knob(8, "kernel mode: pointwise blocks (gate, gelu, layer_norm, add)")
    num_tables: int = knob(4, "comm mode: embedding tables with dense gradients")
    table_rows: int = knob(50_000, "comm mode: rows per embedding table")
    optimizer: str | None = knob(None, "optimizer (default per mode: sgd in comm mode, adamw otherwise)", choices=OPTIMIZERS)

    def __post_init__(self) -> None:
        _check_types(self, "workload")
        for name in ("batch_size", "steps", "hidden", "micro_ops", "pointwise_depth", "num_tables", "table_rows"):
            _check_min("workload", name, getattr(self, name), 1)
        _check_min("workload", "warmup_steps", self.warmup_steps, 0)
        if self.hidden is None:
            self.hidden = MODE_HIDDEN[self.mode]
        if self.optimizer is None:
            self.optimizer = MODE_OPTIMIZER.get(self.mode, "adamw")
        if self.warmup_steps >= self.steps:
            raise ConfigError("workload.warmup_steps", f"{self.warmup_steps} leaves no measured step; must be < steps ({self.steps})")


@dataclass(kw_only=True)
class DataConfig:
    """The input pipeline (DataLoader) knobs; `data` mode makes them matter."""

    num_workers: int = knob(0, "DataLoader worker processes")
    pin_memory: bool = knob(False, "page-locked host batches (only with CUDA)")
    prefetch_factor: int | None = knob(None, "batches prefetched per worker (needs --num-workers > 0)")
    persistent_workers: bool = knob(False, "keep workers alive between epochs (needs --num-workers > 0)")
    sample_cost: int = knob(40, "data mode: preprocessing passes per sample in Dataset.__getitem__")

    def __post_init__(self) -> None:
        _check_types(self, "data")
        _check_min("data", "num_workers", self.num_workers, 0)
        _check_min("data", "prefetch_factor", self.prefetch_factor, 1)
        _check_min("data", "sample_cost", self.sample_cost, 0)
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

    def __post_init__(self) -> None:
        _check_types(self, "parallel")
        if self.bucket_cap_mb <= 0:
            raise ConfigError("parallel.bucket_cap_mb", f"{self.bucket_cap_mb!r} must be > 0")


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
        _check_types(self, "speed")


@dataclass(kw_only=True)
class ProfilerConfig:
    """torch.profiler schedule and options; `--no-profile` runs with no profiler at all."""

    profile: bool = knob(True, "run torch.profiler (--no-profile: no profiler at all)")
    wait: int = knob(5, "profiler schedule: steps skipped before each window")
    warmup: int = knob(2, "profiler schedule: steps traced but discarded before each window")
    active: int = knob(3, "profiler schedule: steps recorded per window")
    repeat: int = knob(1, "profiler schedule: windows (0 = until the run ends)")
    record_shapes: bool = knob(False, "record operator input shapes")
    profile_memory: bool = knob(False, "record tensor allocations")
    with_stack: bool = knob(False, "record Python stacks")
    trace_summary: str = knob("off", "in-job summaries for very large jobs: each rank condenses its window's trace "
                              "into <trace>.summary.json as soon as it is written, and the collector reads those: "
                              "alongside (keep the trace too) or only (delete the trace once condensed)",
                              choices=TRACE_SUMMARY_MODES)

    def __post_init__(self) -> None:
        _check_types(self, "profiler")
        for name in ("wait", "warmup", "repeat"):
            _check_min("profiler", name, getattr(self, name), 0)
        _check_min("profiler", "active", self.active, 1)


@dataclass(kw_only=True)
class StragglerConfig:
    """Fault injection: slow one phase on one rank by a fixed delay, reproducibly."""

    rank: int | None = knob(None, "rank to slow down", flag="--straggler-rank")
    ms: float = knob(0.0, "delay added to the phase, per affected step", flag="--straggler-ms")
    phase: str = knob("data", "phase that is slowed", flag="--straggler-phase", choices=PHASES)
    every: int = knob(1, "slow every N-th step only", flag="--straggler-every")

    def __post_init__(self) -> None:
        _check_types(self, "straggler")
        _check_min("straggler", "rank", self.rank, 0)
        _check_min("straggler", "ms", self.ms, 0)
        _check_min("straggler", "every", self.every, 1)
        if self.rank is None and self.ms > 0:
            raise ConfigError("straggler.rank", "--straggler-ms needs --straggler-rank")


@dataclass(kw_only=True)
class OutputConfig:
    """Where the run's traces, statistics and summary go."""

    log_dir: str = knob("profiler_logs", "root folder of all runs")
    run_name: str | None = knob(None, "run folder name (default: mode-parallel-wsN-time)")
    scalars: bool = knob(True, "write per-rank TensorBoard scalars (step time, data wait, throughput, memory) to <run>/tb/")

    def __post_init__(self) -> None:
        _check_types(self, "output")
        if self.run_name is not None and (not self.run_name or "/" in self.run_name or self.run_name in (".", "..")):
            raise ConfigError("output.run_name", f"{self.run_name!r} must be a plain folder name")


SECTIONS: dict[str, type] = {
    "workload": WorkloadConfig,
    "data": DataConfig,
    "parallel": ParallelConfig,
    "speed": SpeedConfig,
    "profiler": ProfilerConfig,
    "straggler": StragglerConfig,
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
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def flag_of(section: str, f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def load_toml(path: Path) -> dict[str, dict[str, Any]]:
    """Read a TOML preset; unknown tables or keys are errors, not silently ignored."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("config", f"file {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("config", f"{path} is not valid TOML ({exc})") from None
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(section, f"unknown table in {path}; use one of {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(section, f"must be a table in {path}")
        known = {f.name for f in dataclasses.fields(SECTIONS[section])}
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

    @classmethod
    def from_environ(cls, environ: typing.Mapping[str, str] | None = None, *, cuda: bool | None = None) -> "LaunchEnv":
        env = os.environ if environ is None else environ
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        distributed = "WORLD_SIZE" in env and "RANK" in env
        return cls(
            rank=int(env.get("RANK", 0)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            distributed=distributed,
            cuda=cuda,
            accelerate_fsdp=env.get("ACCELERATE_USE_FSDP", "").lower() == "true",
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
        raise ConfigError("parallel.parallel", f"{parallel} needs a process group: launch with torchrun (or use --parallel none)")
    backend = par.backend
    if backend == "auto":
        backend = "nccl" if env.cuda else "gloo"
    if backend == "nccl" and not env.cuda:
        raise ConfigError("parallel.backend", "nccl needs CUDA, which this machine lacks; use gloo or auto")
    strag = cfg.straggler
    if strag.rank is not None and strag.rank >= env.world_size:
        raise ConfigError("straggler.rank", f"{strag.rank} must be < world size ({env.world_size})")
    if cfg.speed.amp == "fp16" and parallel == "fsdp":
        # FSDP2 with fp16 params would need a sharded grad scaler; keep the supported path only.
        raise ConfigError("speed.amp", "fp16 with fsdp is not supported; use bf16 or none")
    return dataclasses.replace(
        cfg, parallel=dataclasses.replace(par, parallel=parallel, backend=backend)
    )
