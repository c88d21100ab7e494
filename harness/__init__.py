"""Distributed-training profiler harness for PyTorch.

`harness.train` runs the lab workloads under torchrun and writes per-rank traces and step
statistics; the file layout both the writer and any reader use lives in `harness.paths`.
"""

__version__ = "0.1.0"
