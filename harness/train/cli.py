"""Command line of `harness.train`: flags generated from the config dataclasses.

Each flag maps to one `section.field`; only flags the user typed override the TOML preset, so
`--config configs/data.toml --steps 10` changes the steps and nothing else.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any, NoReturn

from harness.oneline_argparse import EXIT_USAGE, OneLineArgumentParser, fail
from harness.run.settings import ConfigError, flag_of, load_toml
from harness.train.config import SECTIONS, TrainConfig, build_config

EXIT_CONFIG = EXIT_USAGE


def _value_type(annotation: Any) -> type:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def build_parser(prog: str = "harness.train") -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog=prog, description="Run a lab workload under torch.profiler (torchrun for several ranks)."
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="TOML preset (configs/<mode>.toml); flags override it"
    )
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(section, cls.__doc__)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kwargs: dict[str, Any] = {
                "dest": f"{section}.{f.name}",
                "default": argparse.SUPPRESS,
                "help": f"{f.metadata['help']} (default: {f.default})",
            }
            vtype = _value_type(hints[f.name])
            if vtype is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif typing.get_origin(vtype) is tuple:
                kwargs.update(type=str, metavar="N[,N...]")  # the config splits and checks the list
            else:
                kwargs["type"] = vtype
                if f.metadata.get("choices"):
                    kwargs["choices"] = f.metadata["choices"]
            group.add_argument(flag_of(section, f), **kwargs)
    return parser


def parse_config(argv: list[str] | None = None, prog: str = "harness.train") -> TrainConfig:
    """Parse flags (and the `--config` preset) into a validated TrainConfig.

    Raises ConfigError for invalid values; argparse itself exits 2 for unknown flags.
    """
    args = vars(build_parser(prog).parse_args(argv))
    preset = args.pop("config")
    layers: list[dict[str, dict[str, Any]]] = []
    if preset is not None:
        layers.append(load_toml(preset, SECTIONS))
    cli: dict[str, dict[str, Any]] = {}
    for dest, value in args.items():
        section, name = dest.split(".", 1)
        cli.setdefault(section, {})[name] = value
    layers.append(cli)
    cfg = build_config(layers)
    cfg.check_windows_fit()
    return cfg


def fail_config(prog: str, exc: ConfigError) -> NoReturn:
    fail(prog, str(exc), label="invalid config", code=EXIT_CONFIG)
