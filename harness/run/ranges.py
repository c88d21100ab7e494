"""Named ranges around each phase of a step: record_function and, on CUDA, NVTX.

The record_function range shows in torch.profiler traces (and so in the collector); the NVTX
range shows in Nsight Systems timelines. Both carry the same name, `harness:<phase>`.

record_function costs ~10 us even when no profiler listens (a dispatcher op), so the trainer asks
for it only in steps the profiler records; NVTX is near free and stays on whenever CUDA is
present, because Nsight may be tracing without torch.profiler.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.profiler import record_function

from harness.paths import RANGE_PREFIX


@contextlib.contextmanager
def phase_range(phase: str, *, annotate: bool, nvtx: bool) -> Iterator[None]:
    name = RANGE_PREFIX + phase
    with record_function(name) if annotate else contextlib.nullcontext():
        if nvtx:
            torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()
        else:
            yield
