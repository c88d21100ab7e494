"""A self-check users run on a new cluster: does the profiler see what it should here?
(`python -m harness.selfcheck`, `make selfcheck`; docs/gpu.md.)"""
