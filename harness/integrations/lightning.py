"""`HarnessCallback` for Lightning: every in-job feature of `harness.Run` for a Lightning job
(docs/own-job.md).

    trainer = L.Trainer(..., callbacks=[HarnessCallback(run_name="mine")])

What its hooks map to (Lightning's fit loop, automatic optimisation):
1. on_train_start: the run starts (the strategy made the process group by then), its length
   `max_steps` where set; the first step opens;
2. a step runs from the end of the one before (`on_train_batch_end`) to its own end: `data`
   until `on_train_batch_start` (the batch fetched and moved), `forward` until
   `on_before_backward` (training_step), `backward` until `on_before_optimizer_step`,
   `optimizer` until `on_train_batch_end`;
3. on_train_end: the step opened after the last one (it never ran) is dropped and the run ends;
   where the trainer has a W&B or MLflow logger, rank 0 logs `Run.summary()` to its run
   (trackers.py); on_exception: the run ends with the exception (its status says how and where).
Keyword arguments are `harness.Run`'s settings (names of harness.train's flags); `parallel`, which
tells the watch which phases hold collectives, defaults to the strategy's (`parallel_of`).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from harness.integrations.trackers import log_summary, logger_runs
from harness.run.run import Run

# Strategies that gather parameters inside forward and backward, as FSDP does (ModelParallelStrategy
# is FSDP2 with tensor parallelism; DeepSpeed's ZeRO-3 gathers there too, and for its stages 1-2,
# whose forward holds none, a held forward only hides a straggler there, while taking a phase that
# holds collectives for own work would name its victims). DeepSpeedStrategy subclasses DDPStrategy.
FSDP_LIKE = {"FSDPStrategy", "ModelParallelStrategy", "DeepSpeedStrategy"}


def parallel_of(strategy: Any) -> str:
    """The watch's `parallel` (ddp, fsdp, none) for a Lightning strategy, by its class and bases:
    FSDP-like (FSDP_LIKE) -> fsdp; any other strategy over several processes -> ddp; one device ->
    none."""
    names = {c.__name__ for c in type(strategy).__mro__}
    if names & FSDP_LIKE:
        return "fsdp"
    return "ddp" if "ParallelStrategy" in names else "none"


class HarnessCallback(pl.Callback):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.run: Run | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        settings = {"steps": steps, "job_name": "lightning", "parallel": parallel_of(trainer.strategy), **self.settings}
        self.run = Run(device=pl_module.device, **settings).start()
        self.run.watch_gradients(pl_module)
        self.run.begin_step()
        self.run.begin_phase("data")

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.run is not None:
            self.run.begin_phase("forward")

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        if self.run is not None:
            self.run.begin_phase("backward")

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self.run is not None:
            self.run.begin_phase("optimizer")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.run is not None:
            self.run.end_step()
            self.run.begin_step()
            self.run.begin_phase("data")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.run is not None:
            self.run.discard_step()
            self.run.close()
            if trainer.is_global_zero:
                runs = logger_runs(trainer.loggers)
                if runs:
                    log_summary(runs, self.run.summary())
            self.run = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.run is not None:
            self.run.close(exception)
            self.run = None
