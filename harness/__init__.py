"""Distributed-training profiler harness for PyTorch.

In any training loop (`harness.Run`: docs/own-job.md):

    import harness
    with harness.Run(run_name="mine", log_dir="profiler_logs", model=model, optimizer=opt) as run:
        for batch in loader:
            with run.step():
                ...  # the phases found from hooks; or name them: `with run.phase("data"): ...`

`python -m harness.train` runs the lab workloads on the same class; `python -m harness.collect`
reads what either wrote; `harness.load(run_folder)` gives its report as typed records, pandas
DataFrames and plotly figures for a notebook, and `harness.summary(run_folder)` as one flat dict for
experiment trackers (W&B, MLflow). Importing this package imports no torch: `Run` loads it when first used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["ConfigError", "Run", "enable_flight_recorder", "load", "summary"]


def __getattr__(name: str) -> Any:
    if name == "Run":
        from harness.run.run import Run

        return Run
    if name == "ConfigError":
        from harness.run.settings import ConfigError

        return ConfigError
    if name == "summary":
        from harness.report.summary import summary

        return summary
    if name == "load":
        from harness.report.notebook import load

        return load
    if name == "enable_flight_recorder":
        from harness.run.run import enable_flight_recorder

        return enable_flight_recorder
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
