"""A small /proc file read every step: kept open and read with one `pread` from offset 0.

Opening, reading and closing a /proc file each time costs several times one `pread` of a file
kept open, between a training step's kernels too (bench/RESULTS.md, "Harness and profiler
overhead"). The kernel regenerates the file's text on every read from offset 0, so the open
file always reads the current values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class KeptProcFile:
    """The file at `path_of()`, kept open while that path stays the same and reopened when it
    changes: the path names its reader (the calling thread's /proc/self/task/<tid>/..., or the
    process's /proc/<pid>/... after a fork), so a thread or a forked child never reads another's
    file. After one failed open, read or parse it is given up for good (`read` then returns
    None): a kernel without the file, or a sandbox that hides /proc, fails the same way every
    time."""

    def __init__(self, path_of: Callable[[], str], max_bytes: int = 128) -> None:
        self._path_of = path_of
        self._max_bytes = max_bytes
        self._fd: int | None = None
        self._path: str | None = None
        self.broken = False

    def read(self, parse: Callable[[bytes], T]) -> T | None:
        """`parse` of the file's current text, or None where it cannot be read or parsed."""
        if self.broken:
            return None
        try:
            path = self._path_of()
            if path != self._path:
                self.close()
                self._fd, self._path = os.open(path, os.O_RDONLY), path
            assert self._fd is not None
            return parse(os.pread(self._fd, self._max_bytes, 0))
        except (OSError, IndexError, ValueError):
            self.broken = True
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = self._path = None
