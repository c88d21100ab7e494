"""What `harness.Run` is configured with: the in-job features' sections of the lab's config
(profiler, watch, debug, output) and what the harness needs to know of the job itself (`JobConfig`).

Sources, later wins: the defaults; a TOML file (`config=`, or HARNESS_CONFIG) with tables
[job], [profiler], [watch], [debug], [output]; keyword arguments; HARNESS_* environment variables (the
launch script has the last word, so a job is tuned without touching its code). A keyword
argument or a variable is named after the setting's command-line flag of `harness.train`:
`watch_every=10` / HARNESS_WATCH_EVERY=10 is `--watch-every 10`, `active=6` / HARNESS_ACTIVE=6
is `--active 6`; a section's name takes a dict (`profiler={"wait": 2}`). A bad value or an
unknown name raises `ConfigError` in one line, before the first step.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.run.settings import (
    ConfigError,
    DebugConfig,
    OutputConfig,
    ProfilerConfig,
    WatchConfig,
    check_min,
    check_types,
    flag_of,
    knob,
    load_toml,
    windows_fit,
)

if typing.TYPE_CHECKING:  # the lab's config, read by from_lab; the lab imports this module
    from harness.train.config import TrainConfig

ENV_PREFIX = "HARNESS_"
CONFIG_VARIABLE = "HARNESS_CONFIG"
# HARNESS_* variables of the harness's other parts, not settings of a run
OTHER_VARIABLES = frozenset(
    {"HARNESS_NATIVE_SCAN", "HARNESS_SKIP_BROWSER", "HARNESS_TEST_ARTIFACTS", "HARNESS_DEBUG_TOKEN"}
)
PARALLEL_KINDS = ("ddp", "fsdp", "none")


@dataclass(kw_only=True)
class JobConfig:
    """What the harness knows of the job that runs it."""

    steps: int | None = knob(
        None,
        "steps the loop will run (None: not known; then the profiler window and the "
        "watch are not checked against the run's length)",
        flag="--steps",
    )
    warmup_steps: int = knob(0, "first steps left out of the statistics and the watch", flag="--warmup-steps")
    samples_per_step: int | None = knob(
        None, "samples a rank takes per step, for throughput (None: not logged)", flag="--samples-per-step"
    )
    parallel: str = knob(
        "ddp",
        "how the model is wrapped: which phases hold collectives for the watch (ddp: "
        "backward; fsdp: forward and backward; none)",
        flag="--parallel",
        choices=PARALLEL_KINDS,
    )
    collective_timeout: float = knob(
        600.0, "seconds the watch's own exchange may wait for its peers", flag="--collective-timeout"
    )
    name: str = knob("run", "the run folder's name before its time stamp, when no run_name is given", flag="--job-name")

    def __post_init__(self) -> None:
        check_types(self, "job")
        check_min("job", "steps", self.steps, 1)
        check_min("job", "warmup_steps", self.warmup_steps, 0)
        check_min("job", "samples_per_step", self.samples_per_step, 1)
        check_min("job", "collective_timeout", self.collective_timeout, 1)


RUN_SECTIONS: dict[str, type] = {
    "job": JobConfig,
    "profiler": ProfilerConfig,
    "watch": WatchConfig,
    "debug": DebugConfig,
    "output": OutputConfig,
}


@dataclass(kw_only=True)
class RunConfig:
    job: JobConfig = field(default_factory=JobConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        if self.watch.capture_on_straggler and not self.profiler.profile:
            raise ConfigError(
                "watch.capture_on_straggler", "capture_on_straggler traces with the profiler; drop profile=False"
            )
        if self.job.steps is not None and self.job.warmup_steps >= self.job.steps:
            raise ConfigError(
                "job.warmup_steps",
                f"{self.job.warmup_steps} leaves no measured step; must be < steps ({self.job.steps})",
            )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    @classmethod
    def from_lab(cls, cfg: TrainConfig) -> RunConfig:
        """The settings of the `harness.Run` the lab's loop runs on: the lab config's profiler,
        watch and output sections, and the job as its workload and parallel sections describe it."""
        wl, par = cfg.workload, cfg.parallel
        job = JobConfig(
            steps=wl.steps,
            warmup_steps=wl.warmup_steps,
            samples_per_step=wl.batch_size,
            parallel=par.parallel if par.parallel in ("ddp", "fsdp") else "none",
            collective_timeout=par.collective_timeout,
            name=f"{wl.mode}-{par.parallel}",
        )
        return cls(job=job, profiler=cfg.profiler, watch=cfg.watch, debug=cfg.debug, output=cfg.output)


def _names() -> dict[str, tuple[str, str]]:
    """keyword / variable stem (the flag without dashes, `_` for `-`) -> (section, field)."""
    out = {}
    for section, cls in RUN_SECTIONS.items():
        for f in dataclasses.fields(cls):
            out[flag_of(section, f).lstrip("-").replace("-", "_")] = (section, f.name)
    return out


NAMES = _names()
TRUE, FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


def _from_text(section: str, name: str, text: str) -> Any:
    """An environment variable's text as the field's type (bool, int, float, str, or None)."""
    cls = RUN_SECTIONS[section]
    hint = typing.get_type_hints(cls)[name]
    kinds = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    if type(None) in typing.get_args(hint) and text.strip().lower() in ("", "none"):
        return None
    kind = kinds[0]
    word = text.strip().lower()
    if kind is bool:
        if word in TRUE or word in FALSE:
            return word in TRUE
        raise ConfigError(f"{section}.{name}", f"{text!r} is not a boolean (1/0, true/false, yes/no, on/off)")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(
                f"{section}.{name}", f"{text!r} is not a{'n' if kind is int else ''} {kind.__name__}"
            ) from None
    return text


def _layer_of(options: Mapping[str, Any], origin: str) -> dict[str, dict[str, Any]]:
    """Keyword-style options (flag names, or a section's name with a dict) as {section: {field: value}}."""
    layer: dict[str, dict[str, Any]] = {}
    for key, value in options.items():
        if key in RUN_SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(key, f"{origin}: {key}= takes a dict of that section's settings")
            fields = {f.name for f in dataclasses.fields(RUN_SECTIONS[key])}
            for k, v in value.items():
                if k not in fields:
                    raise ConfigError(
                        f"{key}.{k}", f"{origin}: no such setting; use one of {', '.join(sorted(fields))}"
                    )
                layer.setdefault(key, {})[k] = v
        elif key in NAMES:
            section, name = NAMES[key]
            layer.setdefault(section, {})[name] = value
        else:
            raise ConfigError(key, f"{origin}: no such setting; use one of {', '.join(sorted(NAMES))}")
    return layer


def _toml_layer(path: Path) -> dict[str, dict[str, Any]]:
    return load_toml(path, RUN_SECTIONS)


def env_layer(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """HARNESS_<FLAG> variables (HARNESS_CONFIG aside) as a layer; an unknown one is an error
    (a misspelt variable must not be silently ignored)."""
    layer: dict[str, dict[str, Any]] = {}
    for var, text in environ.items():
        if not var.startswith(ENV_PREFIX) or var == CONFIG_VARIABLE or var in OTHER_VARIABLES:
            continue
        stem = var[len(ENV_PREFIX) :].lower()
        if stem not in NAMES:
            raise ConfigError(
                var, f"no such setting; use one of {', '.join(ENV_PREFIX + n.upper() for n in sorted(NAMES))}"
            )
        section, name = NAMES[stem]
        layer.setdefault(section, {})[name] = _from_text(section, name, text)
    return layer


def load_run_config(
    config: str | Path | None = None, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> RunConfig:
    """Merge the sources (module docstring) into a validated RunConfig."""
    import os

    env = os.environ if environ is None else environ
    layers = []
    path = config if config is not None else env.get(CONFIG_VARIABLE) or None
    if path is not None:
        layers.append(_toml_layer(Path(path)))
    layers.append(_layer_of(options or {}, "keyword argument"))
    layers.append(env_layer(env))
    merged: dict[str, dict[str, Any]] = {name: {} for name in RUN_SECTIONS}
    for layer in layers:
        for section, values in layer.items():
            merged[section].update(values)
    try:
        cfg = RunConfig(**{name: cls(**merged[name]) for name, cls in RUN_SECTIONS.items()})
    except TypeError as exc:  # a dataclass refusing a value's shape
        raise ConfigError("config", str(exc)) from None
    if cfg.job.steps is not None:  # a window past the run's end writes no trace (or one cut short)
        windows_fit(cfg.profiler, cfg.job.steps)
    return cfg
