"""What the C heap holds: glibc's malloc statistics (`mallinfo2`), read once a step.

RSS counts the pages malloc keeps free for reuse as well as the live ones. A process that frees
large buffers every step (gloo's and DDP's communication buffers) keeps tens of MB of free,
resident heap and takes it back in and out as pages are trimmed, so its RSS swings by more than a
leak adds a step, and a leak fills that free space before it grows RSS at all. Measured on a
4-rank comm-mode DDP run on 2 cores with 2 MB a step leaked on rank 0: its RSS rose -0.59 +- 0.29
MB a step over 35 steps (no finding), RSS less malloc's free bytes 2.01 +- 0.00, its peers' 0.01.

`mallinfo2` (glibc >= 2.33) walks every free chunk of every arena under its lock: 58-91 us a
call in the lab's 1-rank torch, baseline and comm runs here (13-46 ms steps). So the sampler
(stats.py) reads memory within a TimeBudget of BUDGET_SHARE of the run's time: after a reading
that took c seconds of CPU, the next waits until c / BUDGET_SHARE seconds have passed. Other
allocators (musl, macOS) have no `mallinfo2`; one preloaded in place of malloc (jemalloc,
tcmalloc) leaves glibc's counts near zero, so RSS less the free bytes falls back to RSS itself.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

# A sixth of the harness's own-time target (1.2% of a step: bench/RESULTS.md, "Harness and
# profiler overhead", (i)): every step from ~50 ms steps up, at ~100 us a reading of RSS and heap
BUDGET_SHARE = 0.002

# struct mallinfo2, glibc's malloc.h: every field a size_t, in this order
_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _load() -> Any:
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, TypeError, AttributeError):  # no C library by that handle (Windows), no mallinfo2
        return None
    fn.restype, fn.argtypes = _MallInfo2, []
    return fn


class TimeBudget:
    """At most `share` of the run's time spent on a read: after a read that cost c seconds of this
    thread's CPU time, the next is due once c / share seconds have passed. `due()` before the
    read, `spent()` after it. The cost is CPU time, not wall time: a read descheduled halfway (a
    busy host) would otherwise charge the time another process ran, and one 2 ms wait would put
    the next reading a second away, past the end of a short run."""

    def __init__(self, share: float = BUDGET_SHARE) -> None:
        self.share = share
        self._next_at = -float("inf")
        self._start = 0.0
        self._cpu_start = 0.0

    def due(self) -> bool:
        """Whether a read is due now; a read that follows is charged from here."""
        now = time.perf_counter()
        if now < self._next_at:
            return False
        self._start = now
        self._cpu_start = time.thread_time()
        return True

    def spent(self) -> None:
        """The read is done: the next waits its CPU time / share."""
        self._next_at = self._start + (time.thread_time() - self._cpu_start) / self.share


class HeapStats:
    """`read()`: {"heap_in_use_bytes", "heap_free_bytes"}, or {} without glibc's mallinfo2.

    - heap_in_use_bytes: bytes handed out by malloc and not freed (uordblks, in the arenas, plus
      hblkhd, the chunks too large for an arena that malloc maps one by one): where tensors on
      the CPU, NumPy arrays and large Python buffers live.
    - heap_free_bytes: bytes free in the arenas (fordblks), held for reuse and, once touched,
      resident: the part of RSS that is not live.
    """

    def __init__(self) -> None:
        self._fn = _load()

    @property
    def available(self) -> bool:
        return self._fn is not None

    def read(self) -> dict[str, int]:
        if self._fn is None:
            return {}
        info = self._fn()
        return {"heap_in_use_bytes": info.uordblks + info.hblkhd, "heap_free_bytes": info.fordblks}
