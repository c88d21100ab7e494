"""`HarnessCallback` for Hugging Face's `transformers.Trainer`: every in-job feature of
`harness.Run` for a Trainer job (docs/own-job.md).

    trainer = Trainer(model=..., args=..., train_dataset=..., callbacks=[HarnessCallback(run_name="mine")])

What its hooks map to (the Trainer's loop, transformers/trainer.py):
1. on_train_begin: the run starts (the process group exists by then: accelerate made it), its
   length `max_steps`, its samples per step the per-device batch times the accumulation steps;
   the first step opens;
2. a step runs from the end of the one before (the Trainer's `on_step_end`) to its own end: its
   `data` phase until `on_step_begin` (fetching the batches, with the logging, evaluation and
   saving of the step before), `forward_backward` until `on_pre_optimizer_step` (every
   micro-batch's training_step, and gradient clipping), `optimizer` until `on_step_end`;
3. on_train_end: the step opened after the last one (it never ran) is dropped and the run ends:
   run.json and the table on rank 0; where the Trainer reports to W&B or MLflow (`report_to`),
   rank 0 logs `Run.summary()` to their runs (trackers.py).
Keyword arguments are `harness.Run`'s settings (names of harness.train's flags); `parallel`, which
tells the watch which phases hold collectives (`forward_backward` under DDP and FSDP), defaults
to the Trainer's (`parallel_of`). Under DDP on GPUs the model's gradients are hooked
(`Run.watch_gradients`): forward_backward's own work is then its device time to the last
gradient of the step's last micro-batch, whose backward holds the all-reduce (the others run
under `no_sync`).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from harness.integrations.trackers import TrackerRuns, active_runs, log_summary
from harness.run.run import Run


def parallel_of(args: Any) -> str:
    """The watch's `parallel` (ddp, fsdp, none) for a Trainer's arguments: FSDP or DeepSpeed (which
    gathers parameters inside forward and backward at ZeRO-3; at stages 1-2 a held forward only
    hides a straggler there, while taking a phase that holds collectives for own work would name
    its victims) -> fsdp; any other distributed run -> ddp; else none."""
    if getattr(args, "fsdp", None) or getattr(args, "deepspeed", None):
        return "fsdp"
    mode = getattr(args, "parallel_mode", None)
    return "ddp" if getattr(mode, "value", None) == "distributed" else "none"


class HarnessCallback(TrainerCallback):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.run: Run | None = None
        self.trackers = TrackerRuns()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        settings = {
            "steps": state.max_steps if state.max_steps and state.max_steps > 0 else None,
            "samples_per_step": args.per_device_train_batch_size * args.gradient_accumulation_steps,
            "job_name": "hf-trainer",
            "parallel": parallel_of(args),
            **self.settings,
        }
        self.run = Run(device=args.device, **settings).start()
        report_to = args.report_to or []
        if state.is_world_process_zero:  # (the reporting callbacks, added before a user's, have begun by now)
            self.trackers = active_runs(wandb_on="wandb" in report_to, mlflow_on="mlflow" in report_to)
        if kwargs.get("model") is not None:
            self.run.watch_gradients(kwargs["model"])
        self.run.begin_step()
        self.run.begin_phase("data")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.begin_phase("forward_backward")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.begin_phase("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.end_step()
            self.run.begin_step()
            self.run.begin_phase("data")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.discard_step()
            self.run.close()
            if self.trackers:
                log_summary(self.trackers, self.run.summary())
