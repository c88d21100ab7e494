"""The GPU paths, run for real (marker `gpu`: skipped without CUDA; `pytest -m gpu` on a GPU
machine): the self-check's CUDA checks (harness/selfcheck/checks.py) under pytest, each its own
test, so a GPU session shows which path works and which does not. The two-GPU checks need two."""

from __future__ import annotations

import pytest
import torch

from harness.selfcheck.checks import CHECKS, Check, Context

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
GPU_CHECKS = [c for c in CHECKS if c.needs in ("cuda", "2 gpus")]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Context:
    return Context(work=tmp_path_factory.mktemp("gpu"), cuda=GPUS > 0, gpus=GPUS)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(GPUS == 0, reason="no CUDA device")
@pytest.mark.parametrize("check", GPU_CHECKS, ids=[c.name for c in GPU_CHECKS])
def test_gpu_path(check: Check, ctx: Context) -> None:
    if check.needs == "2 gpus" and GPUS < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {GPUS}")
    evidence = check.run(ctx)
    assert evidence


def test_every_gpu_path_of_the_issue_is_checked() -> None:
    """The paths a GPU session must run (issue 38) each have a check here."""
    names = {c.name for c in CHECKS}
    for needed in (
        "CUDA activity",
        "NVTX ranges",
        "step timing",
        "GPU memory",
        "AMP bf16",
        "AMP fp16 + GradScaler",
        "torch.compile",
        "two ranks over gloo",
        "slow rank named",
        "NCCL across GPUs",
        "Flight Recorder on NCCL timeout",
        "lab modes",
        "Nsight",
    ):
        assert needed in names, needed
