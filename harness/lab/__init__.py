"""Lab sweeps: the classic experiment matrices (`python -m harness.lab SWEEP`), one real
torchrun job per row, with timings.csv, charts and summary.md per sweep."""
