"""How long the calling thread waited for a CPU: Linux's per-thread scheduler statistics.

`/proc/self/task/<tid>/schedstat` holds three numbers: ns on a CPU, ns runnable but waiting in
a run queue, time slices. The second is time-sharing made visible: where ranks share cores, a
rank that wanted to run and could not is late by that much, through no work of its own. A
blocked thread (asleep, waiting in a gloo collective, on the loader) is not runnable and adds
nothing. One `pread` of the open file per reading (~2 us); the file is reopened when another
thread reads.
"""

from __future__ import annotations

import os
import threading


class RunQueueClock:
    """The calling thread's total run-queue wait so far, in ms; None where the kernel keeps no
    schedstat (not Linux, CONFIG_SCHED_INFO off) or the file cannot be read."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None
        self._broken = False

    def read_ms(self) -> float | None:
        if self._broken:
            return None
        tid = threading.get_native_id()
        try:
            if tid != self._tid:
                self.close()
                self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                self._tid = tid
            assert self._fd is not None
            fields = os.pread(self._fd, 96, 0).split()
            return int(fields[1]) / 1e6
        except (OSError, IndexError, ValueError):
            self._broken = True
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._tid = None, None
