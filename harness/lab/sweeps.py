"""The classic experiment matrices, as rows of `harness.train` flags.

A sweep is a list of `Row`s, each one real torchrun job. Rows that need hardware this machine
lacks (a GPU, enough cores) carry the reason they are skipped instead of running something that
would measure the wrong thing; where a CPU equivalent exists (bf16 autocast, torch.compile,
channels_last) the row runs it and the device column says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Host:
    """What this machine offers the sweeps: CPU cores and CUDA devices."""

    cores: int
    gpus: int

    @property
    def cuda(self) -> bool:
        return self.gpus > 0

    @property
    def max_ranks(self) -> int:
        """Ranks that do not share a device: one per GPU, else one per core."""
        return self.gpus if self.cuda else self.cores

    @classmethod
    def detect(cls) -> Host:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return cls(cores=cores, gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)


@dataclass(frozen=True)
class Row:
    """One configuration: its key (for --only and file names), label, flags and world size."""

    key: str
    label: str
    args: tuple[str, ...]
    nproc: int
    group: str = ""  # rows compared with each other (scaling: one line per parallel kind)
    skip: str | None = None  # why it cannot run on this machine


@dataclass(frozen=True)
class Sweep:
    name: str
    title: str
    reading: str  # the classic rule for reading the result
    build: Callable[[Host, int], list[Row]] = field(repr=False)  # (host, ranks per row) -> rows
    charts: tuple[str, ...] = ("throughput", "step_ms")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _no_ranks(host: Host, nproc: int) -> str | None:
    if nproc > host.max_ranks:
        unit = "GPUs" if host.cuda else "cores"
        return f"{nproc} ranks need {nproc} {unit}; this machine has {host.max_ranks}"
    return None


def _data(host: Host, nproc: int) -> list[Row]:
    rows = []
    for workers in (0, 2, 4):
        skip = _no_ranks(host, nproc)
        if skip is None and workers > host.cores:
            skip = f"{workers} DataLoader workers per rank need {workers} cores; this machine has {host.cores}"
        rows.append(
            Row(
                f"workers-{workers}",
                f"{workers} workers",
                ("--mode", "data", "--num-workers", str(workers)),
                nproc,
                skip=skip,
            )
        )
    return rows


def _torch(host: Host, nproc: int) -> list[Row]:
    return [
        Row(f"batch-{b}", f"batch {b}", ("--mode", "torch", "--batch-size", str(b)), nproc, skip=_no_ranks(host, nproc))
        for b in (256, 1024)
    ]


def _kernel(host: Host, nproc: int) -> list[Row]:
    return [
        Row("fp32", "fp32", ("--mode", "kernel", "--amp", "none"), nproc, skip=_no_ranks(host, nproc)),
        Row("bf16", "bf16 autocast", ("--mode", "kernel", "--amp", "bf16"), nproc, skip=_no_ranks(host, nproc)),
    ]


def _three_run(host: Host, nproc: int) -> list[Row]:
    base = ("--mode", "kernel", "--seed", "0")
    skip = _no_ranks(host, nproc)
    return [
        Row("fp32", "fp32", (*base, "--amp", "none"), nproc, skip=skip),
        Row("bf16", "bf16 autocast", (*base, "--amp", "bf16"), nproc, skip=skip),
        Row("bf16-compile", "bf16 + torch.compile", (*base, "--amp", "bf16", "--compile"), nproc, skip=skip),
    ]


# (key, label, flags it adds, why it needs CUDA or None)
LADDER_RUNGS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (
    ("baseline", "baseline: per-step .item(), synchronous copies", ("--sync-loss",), None),
    ("no-sync", "no per-step sync", (), None),
    (
        "pinned",
        "+ pinned memory, non_blocking copies",
        ("--pin-memory", "--non-blocking"),
        "there is no host-to-device copy without CUDA",
    ),
    ("cudnn", "+ cudnn.benchmark", ("--cudnn-benchmark",), "cuDNN is CUDA-only"),
    ("compile", "+ torch.compile", ("--compile",), None),
    ("max-autotune", "+ max-autotune", ("--compile-mode", "max-autotune"), None),
    ("amp", "+ AMP (bf16)", ("--amp", "bf16"), None),
    ("channels-last", "+ channels_last", ("--channels-last",), None),
)


def _ladder(host: Host, nproc: int) -> list[Row]:
    """Cumulative: each rung keeps the flags of every rung before it that ran (the baseline's
    --sync-loss is the one flag the next rung removes)."""
    base = ("--mode", "baseline", "--arch", "cnn")
    kept: list[str] = []
    rows = []
    for key, label, flags, cuda_only in LADDER_RUNGS:
        skip = _no_ranks(host, nproc) or (f"needs CUDA: {cuda_only}" if cuda_only and not host.cuda else None)
        args = (*base, *kept, *flags)
        rows.append(Row(key, label, args, nproc, skip=skip))
        if skip is None and key != "baseline":
            kept.extend(flags)
    return rows


SCALING_WORLD_SIZES = (1, 2, 4)
SCALING_BUCKETS_MB = (1.0, 100.0)  # besides DDP's default 25 MB


def _scaling(host: Host, nproc: int) -> list[Row]:
    """World size 1/2/4 for DDP and FSDP (ranks capped by the devices present: ranks sharing
    cores measure the scheduler, not scaling); then DDP bucket sizes at the largest world
    size that runs."""
    rows = []
    for par in ("ddp", "fsdp"):
        for ws in SCALING_WORLD_SIZES:
            rows.append(
                Row(
                    f"{par}-ws{ws}",
                    f"{par.upper()} x{ws}",
                    ("--mode", "baseline", "--parallel", par),
                    ws,
                    group=par,
                    skip=_no_ranks(host, ws),
                )
            )
    top = max([ws for ws in SCALING_WORLD_SIZES if _no_ranks(host, ws) is None], default=1)
    alone = "bucket size matters only with 2+ ranks" if top < 2 else None
    for mb in SCALING_BUCKETS_MB:
        rows.append(
            Row(
                f"ddp-ws{top}-bucket{mb:g}mb",
                f"DDP x{top}, bucket {mb:g} MB",
                ("--mode", "baseline", "--parallel", "ddp", "--bucket-cap-mb", f"{mb:g}"),
                top,
                group="bucket",
                skip=alone,
            )
        )
    return rows


SWEEPS: dict[str, Sweep] = {
    s.name: s
    for s in (
        Sweep(
            "data",
            "DataLoader workers (data mode)",
            "A data-bound step is noisy: compare mean with p50 and look at the per-step jitter; the "
            "median alone can hide the stalls when workers fall behind.",
            _data,
            ("throughput", "step_ms", "jitter"),
        ),
        Sweep(
            "torch",
            "Batch size against eager overhead (torch mode)",
            "A larger batch amortises per-op launch overhead: step time goes up while throughput "
            "goes up too; read samples/s, not the step time.",
            _torch,
        ),
        Sweep(
            "kernel",
            "Precision of memory-bound kernels (kernel mode)",
            "bf16 halves the bytes a memory-bound kernel moves; the gain shows how much of the step is bandwidth.",
            _kernel,
        ),
        Sweep(
            "three-run",
            "fp32 / bf16 / bf16 + torch.compile (kernel mode, same seed and data)",
            "A small fp32 -> bf16 gain means the bottleneck is not precision; a large compile "
            "gain on top means it was kernel count and memory traffic (fusion).",
            _three_run,
            ("throughput", "step_ms", "memory"),
        ),
        Sweep(
            "ladder",
            "The optimisation ladder (baseline CNN), cumulative",
            "Each rung keeps every earlier one; the speed-up over the previous rung is what that "
            "rung bought, and a rung below 1.00x is a regression on this machine.",
            _ladder,
        ),
        Sweep(
            "scaling",
            "World size and bucket size (baseline MLP, weak scaling)",
            "Efficiency = throughput at N ranks / (N x throughput at 1 rank); below ~0.9 the "
            "ranks wait on communication or on each other.",
            _scaling,
            ("throughput", "step_ms", "scaling"),
        ),
    )
}
