"""A Hugging Face `Trainer` job profiled with the harness's callback (one line: `callbacks=`): a
tiny GPT-2 built from a config (no download), random tokens. Runs under torchrun on CPU (gloo) or
on GPUs (NCCL) unchanged.

    torchrun --nproc_per_node 2 examples/hf_trainer.py --log-dir profiler_logs --run-name hf --steps 30 \\
        --slow-rank 1 --slow-ms 30
    python -m harness.collect profiler_logs/hf        # names rank 1, slow in its data phase

--slow-rank R --slow-ms MS: rank R's collate sleeps that long per batch (a slow input pipeline).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from harness.integrations.hf import HarnessCallback


class RandomTokens(Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log-dir", default="profiler_logs")
    p.add_argument("--run-name", default=None)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--watch-every", type=int, default=None)
    p.add_argument(
        "--report-to",
        default="",
        help="comma-separated trackers the Trainer reports to (wandb, mlflow): the callback logs its summary there",
    )
    args = p.parse_args()
    rank = int(os.environ.get("RANK", 0))

    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1e3)
        return {k: torch.stack([it[k] for it in items]) for k in items[0]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2))
    data = RandomTokens(args.batch_size * args.steps * 2, 32, 256)
    options = {"watch_every": args.watch_every} if args.watch_every is not None else {}
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            report_to=args.report_to.split(",") if args.report_to else [],
            save_strategy="no",
            logging_strategy="no",
            dataloader_num_workers=0,
            use_cpu=not torch.cuda.is_available(),
            ddp_backend="nccl" if torch.cuda.is_available() else "gloo",
        )
        trainer = Trainer(
            model=model,
            args=training,
            train_dataset=data,
            data_collator=collate,
            callbacks=[HarnessCallback(run_name=args.run_name, log_dir=args.log_dir, **options)],
        )
        trainer.train()


if __name__ == "__main__":
    main()
