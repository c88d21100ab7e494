"""The run's summary (`Run.summary()`, tracker_summary.py) logged to the experiment trackers a
trainer reports to: W&B and MLflow, under `harness/<key>`.

A trainer's own tracker callbacks start their runs before training and may end them at its end
(Hugging Face's MLflowCallback ends the MLflow run it started in its own on_train_end, which comes
before a user callback's), so the runs are found when training begins (`active_runs`) and written
to by id at its end (`log_summary`), whether or not they are still active:
- W&B: the run's summary (`run.summary.update`): figures of the whole run, strings and None
  included, not a point of a history;
- MLflow: the numbers as metrics and the strings as tags, through `MlflowClient` by run id.
Neither package is imported here unless the trainer has imported it already (`sys.modules`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

PREFIX = "harness/"


@dataclass
class TrackerRuns:
    """The tracker runs a trainer reports to, as found when training began."""

    wandb_run: Any = None  # wandb's Run
    mlflow_run_id: str | None = None
    mlflow_tracking_uri: str | None = None  # None: MLflow's current one

    def __bool__(self) -> bool:
        return self.wandb_run is not None or self.mlflow_run_id is not None


def active_runs(wandb_on: bool = True, mlflow_on: bool = True) -> TrackerRuns:
    """The W&B run and the MLflow run active now, where the trainer reports to them and has
    imported the package."""
    runs = TrackerRuns()
    wandb = sys.modules.get("wandb")
    if wandb_on and wandb is not None and getattr(wandb, "run", None) is not None:
        runs.wandb_run = wandb.run
    mlflow = sys.modules.get("mlflow")
    if mlflow_on and mlflow is not None:
        active = mlflow.active_run()
        if active is not None:
            runs.mlflow_run_id, runs.mlflow_tracking_uri = active.info.run_id, mlflow.get_tracking_uri()
    return runs


def logger_runs(loggers: list[Any]) -> TrackerRuns:
    """The runs of a Lightning trainer's W&B and MLflow loggers (`trainer.loggers`), by class name
    (lightning's WandbLogger and MLFlowLogger), without importing either."""
    runs = TrackerRuns()
    for lg in loggers:
        kind = type(lg).__name__
        if kind == "WandbLogger":
            runs.wandb_run = lg.experiment
        elif kind == "MLFlowLogger":
            runs.mlflow_run_id, runs.mlflow_tracking_uri = lg.run_id, getattr(lg, "_tracking_uri", None)
    return runs


def log_summary(runs: TrackerRuns, summary: dict[str, Any]) -> None:
    """Write `summary` (a flat dict: tracker_summary.flat) to each of `runs`, keys under PREFIX."""
    keyed = {PREFIX + k: v for k, v in summary.items()}
    if runs.wandb_run is not None:
        runs.wandb_run.summary.update(keyed)
    if runs.mlflow_run_id is not None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=runs.mlflow_tracking_uri)
        for k, v in keyed.items():
            if isinstance(v, bool) or v is None:
                continue
            if isinstance(v, int | float):
                client.log_metric(runs.mlflow_run_id, k, float(v))
            else:
                client.set_tag(runs.mlflow_run_id, k, str(v))
