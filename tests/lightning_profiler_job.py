"""Lightning's own PyTorchProfiler in a 2-rank CPU DDP job, rank 1's collate slow: the traces it
writes (<stage>-<filename>-<local rank>-<action>.<time>.pt.trace.json) for
tests/test_framework_traces.py.

    torchrun --nproc_per_node 2 tests/lightning_profiler_job.py OUT_DIR
"""

from __future__ import annotations

import os
import sys
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from jobs import FINISHED  # tests/ is this script's folder, first on sys.path

RANK = int(os.environ.get("RANK", 0))


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def training_step(self, batch: list, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def collate(items: list) -> list:
    if RANK == 1:
        time.sleep(0.02)
    return default_collate(items)


def main() -> None:
    n = 16 * 40
    loader = DataLoader(
        TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))), batch_size=16, collate_fn=collate
    )
    profiler = PyTorchProfiler(
        dirpath=sys.argv[1], filename="perf", schedule=torch.profiler.schedule(wait=1, warmup=1, active=4, repeat=1)
    )
    trainer = pl.Trainer(
        max_steps=12,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=profiler,
    )
    trainer.fit(Model(), loader)
    print(f"{FINISHED} {trainer.global_rank}", flush=True)  # the profiler wrote its traces in fit's teardown


if __name__ == "__main__":
    main()
