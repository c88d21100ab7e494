"""The library behind `harness.Run`: every in-job feature for any training loop, the lab's
included (run.py). Its settings (settings.py, run_config.py), the step's clocks and phases
(timing.py, auto_phases.py, ranges.py, comm_wait.py, grads_ready.py), the profiler's windows
(profiling.py), per-step records and samples (stats.py, heap.py, schedstat.py, procfile.py,
gpu_health.py), the run's files (run_info.py, run_status.py), metrics (metrics.py) and the
Flight Recorder (flight.py). The live watch is harness/watch/, the lab harness/train/.

Importing this package imports no torch; its modules do.
"""
