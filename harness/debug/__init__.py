"""Steering a running job through PyTorch's debug server (docs/steer.md).

`torch.distributed.debug.start_debug_server` runs an HTTP frontend on rank 0 and a worker server on
every rank. The harness plugs into it: a page with each rank's live state and the watch's latest
verdict, and an action that traces the next N steps on every rank (`frontend.py`); each rank
answers the frontend through worker handlers (`worker.py`); the capture's start step is chosen by
a pure rule (`plan.py`) and agreed through the job's c10d store.
"""
