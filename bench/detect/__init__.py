"""The detection campaign's parts (bench/detection.py runs them): real torchrun jobs (real.py),
generated GPU-shaped traces (sim.py), and the scoring both share (score.py)."""
