"""A Lightning job profiled with the harness's callback (one line: `callbacks=`): a small MLP on
random data, DDP. Runs under torchrun on CPU (gloo) or on GPUs unchanged.

    torchrun --nproc_per_node 2 examples/lightning_module.py --log-dir profiler_logs --run-name pl --steps 30 \\
        --slow-rank 1 --slow-ms 30
    python -m harness.collect profiler_logs/pl        # names rank 1, slow in its data phase

--slow-rank R --slow-ms MS: rank R's collate sleeps that long per batch (a slow input pipeline).
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from harness.integrations.lightning import HarnessCallback


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
        self.loss = nn.CrossEntropyLoss()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log-dir", default="profiler_logs")
    p.add_argument("--run-name", default=None)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--watch-every", type=int, default=None)
    p.add_argument(
        "--report-to",
        default="",
        help="comma-separated trackers to log to (wandb, mlflow): the callback logs the run's summary to them",
    )
    args = p.parse_args()
    rank = int(os.environ.get("RANK", 0))

    def collate(items: list) -> list:
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1e3)
        return default_collate(items)

    torch.manual_seed(0)
    n = args.batch_size * args.steps * int(os.environ.get("WORLD_SIZE", 1)) * 2
    data = TensorDataset(torch.randn(n, 128), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, collate_fn=collate)
    options = {"watch_every": args.watch_every} if args.watch_every is not None else {}
    cuda = torch.cuda.is_available()
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="gpu" if cuda else "cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        num_nodes=int(os.environ.get("WORLD_SIZE", 1)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        strategy="ddp",
        logger=loggers(args.report_to.split(",") if args.report_to else []) or False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            HarnessCallback(run_name=args.run_name, log_dir=args.log_dir, samples_per_step=args.batch_size, **options)
        ],
    )
    trainer.fit(Model(), loader)


def loggers(names: list[str]) -> list:
    """Lightning's W&B logger (offline where WANDB_MODE says so) and MLflow logger (at
    MLFLOW_TRACKING_URI), as `--report-to` names them."""
    out: list = []
    if "wandb" in names:
        from lightning.pytorch.loggers import WandbLogger

        offline = os.environ.get("WANDB_MODE") == "offline"
        # (its save_dir, "." by default, overrides WANDB_DIR)
        out.append(WandbLogger(project="harness-example", offline=offline, save_dir=os.environ.get("WANDB_DIR", ".")))
    if "mlflow" in names:
        from lightning.pytorch.loggers import MLFlowLogger

        out.append(MLFlowLogger(experiment_name="harness-example", tracking_uri=os.environ.get("MLFLOW_TRACKING_URI")))
    return out


if __name__ == "__main__":
    main()
