"""How long the calling thread waited for a CPU: Linux's per-thread scheduler statistics.

`/proc/self/task/<tid>/schedstat` holds three numbers: ns on a CPU, ns runnable but waiting in
a run queue, time slices. The second is time-sharing made visible: where ranks share cores, a
rank that wanted to run and could not is late by that much, through no work of its own. A
blocked thread (asleep, waiting in a gloo collective, on the loader) is not runnable and adds
nothing. One `pread` of the open file per reading (~2 us); the file is reopened when another
thread reads.
"""

from __future__ import annotations

import threading

from harness.run.procfile import KeptProcFile


class RunQueueClock:
    """The calling thread's total run-queue wait so far, in ms; None where the kernel keeps no
    schedstat (not Linux, CONFIG_SCHED_INFO off) or the file cannot be read."""

    def __init__(self) -> None:
        self._file = KeptProcFile(lambda: f"/proc/self/task/{threading.get_native_id()}/schedstat", 96)

    def read_ms(self) -> float | None:
        return self._file.read(lambda text: int(text.split()[1]) / 1e6)

    def close(self) -> None:
        self._file.close()
