"""Named ranges around each phase of a step: record_function always, NVTX too on CUDA.

The record_function range shows in torch.profiler traces (and so in the collector); the NVTX
range shows in Nsight Systems timelines. Both carry the same name, `harness:<phase>`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.profiler import record_function

from harness.paths import RANGE_PREFIX


@contextlib.contextmanager
def phase_range(phase: str, nvtx: bool) -> Iterator[None]:
    name = RANGE_PREFIX + phase
    with record_function(name):
        if nvtx:
            torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()
        else:
            yield
