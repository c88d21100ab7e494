"""The settings every harness.Run has, the lab's and any loop's: validated dataclasses, one per
TOML table, each field a `knob` (its flag, help and allowed values), and what the launcher says
(`LaunchEnv`).

Validation runs in `__post_init__`, so a settings object that exists is a valid one.
harness.run.run_config layers them for `harness.Run`; the lab (harness/train/config.py) adds
its own tables beside them.
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


TRACE_SUMMARY_MODES = ("off", "alongside", "only")


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
class WatchConfig:
    """The live straggler watch (harness/watch/exchange.py): every N steps the ranks exchange their step
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


def load_toml(path: Path, sections: dict[str, type]) -> dict[str, dict[str, Any]]:
    """Read a TOML preset of the `sections` (table name -> settings class); unknown tables or keys
    are errors, not silently ignored."""
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
