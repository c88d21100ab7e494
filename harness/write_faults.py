"""The profiler never takes training down: how a rank's outputs survive write failures.

A full disk, a log folder turned read-only or removed, a trace export that raises: each is
caught where it happens, said once in one warning line (what failed, why, what the harness does
about it), remembered for the status file and run.json, and training goes on.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROG = "harness.train"
# Pending lines a file keeps while its disk refuses them (a step record is ~400 bytes: ~40 MB at
# most); older ones are dropped first and counted.
MAX_PENDING = 100_000
# A refused file is retried at most this often: a failing write costs a system call or two,
# and a full disk is not freed within milliseconds.
RETRY_S = 1.0
# How often an open file is checked for having been removed (its folder deleted mid-run).
LINK_CHECK_S = 1.0


def describe(exc: BaseException, path: Path | str | None = None) -> str:
    """What went wrong, in words: 'no space left on /x', '/x is read-only', ..."""
    where = str(getattr(exc, "filename", None) or path or "the log folder")
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"no space left on {Path(where).parent if Path(where).suffix else where}"
        if exc.errno == errno.EROFS:
            return f"{where} is on a read-only file system"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"permission denied on {where}"
        if exc.errno == errno.ENOENT:
            return f"{where} was removed"
        return f"{where}: {exc.strerror or exc}"
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


@dataclass
class FaultLog:
    """One rank's write failures: each (what, reason) is printed once to stderr and kept."""

    rank: int | None = None
    prog: str = PROG
    events: list[dict[str, Any]] = field(default_factory=list)
    _said: set[tuple[str, str]] = field(default_factory=set)

    def _say(self, message: str) -> None:
        who = f"rank {self.rank}: " if self.rank is not None else ""
        print(f"{self.prog}: warning: {who}{message}", file=sys.stderr, flush=True)

    def report(self, what: str, exc: BaseException, action: str, path: Path | str | None = None, **fields: Any) -> str:
        """Record one failure of `what` and say it once: '<what> failed (<why>): <action>'."""
        reason = describe(exc, path)
        self.events.append({"what": what, "reason": reason, "action": action, **fields})
        if (what, reason) not in self._said:
            self._said.add((what, reason))
            self._say(f"{what} failed ({reason}): {action}")
        return reason

    def note(self, message: str) -> None:
        self._say(message)


class AppendOnlyFile:
    """A file written by appending whole chunks, which survives its disk refusing them.

    1. each `append` queues its bytes, then writes the queue as one chunk when the file is
       writable (at most every RETRY_S after a refusal);
    2. a chunk that fails or lands only in part is cut back off the file (ftruncate to the last
       whole chunk), so a reader never sees half a record; the queue keeps it for the next try;
    3. the queue holds at most MAX_PENDING chunks: older ones are dropped and counted;
    4. a file that was removed (its folder deleted mid-run) is created again, starting with what
       it held: read back through the descriptor still open on it (a removed file lives on while
       it is open), so the owner keeps nothing of what it wrote.
    """

    def __init__(self, path: Path, faults: FaultLog, what: str) -> None:
        self.path = path
        self.faults = faults
        self.what = what
        self.pending: deque[bytes] = deque()
        self.dropped = 0
        self._fd: int | None = None
        self._good = 0
        self._retry_at = 0.0
        self._link_check_at = 0.0
        try:
            self._open()
        except OSError as exc:
            self._retry_at = time.monotonic() + RETRY_S
            faults.report(what, exc, "its records are kept in memory until the file can be created", path)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # read and write: a file removed mid-run is read back from this descriptor (`_reopen`)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._good = os.fstat(self._fd).st_size

    def append(self, data: bytes) -> None:
        self.extend((data,))

    def extend(self, chunks: Iterable[bytes]) -> None:
        """Queue several chunks, then write the queue once."""
        for data in chunks:
            if len(self.pending) >= MAX_PENDING:
                self.pending.popleft()
                self.dropped += 1
            self.pending.append(data)
        if time.monotonic() >= self._retry_at:
            self.flush()

    def flush(self) -> bool:
        """Write what is queued; False (and queued still) when the disk refuses it."""
        if not self.pending:
            return True
        try:
            if self._fd is None:
                self._open()
            elif time.monotonic() >= self._link_check_at:
                # a removed file is looked for once a LINK_CHECK_S, not at every write (a system call
                # each): what was written to it meanwhile is read back with the rest (`_reopen`)
                self._link_check_at = time.monotonic() + LINK_CHECK_S
                if os.fstat(self._fd).st_nlink == 0:
                    self._reopen()
            chunk = b"".join(self.pending)
            fd = self._fd
            assert fd is not None  # _open and _reopen leave one open or raise OSError
            written = os.write(fd, chunk)
            if written != len(chunk):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        except OSError as exc:
            self._cut_back()
            self._retry_at = time.monotonic() + RETRY_S
            self.faults.report(
                self.what,
                exc,
                f"{len(self.pending)} record(s) kept in memory and written when the disk takes them again",
                self.path,
            )
            return False
        self._good += written
        if self._retry_at:
            self.faults.note(f"{self.what} writes again ({self.path}); {len(self.pending)} record(s) caught up")
            self._retry_at = 0.0
        self.pending.clear()
        return True

    def _reopen(self) -> None:
        head = b""
        if self._fd is not None:
            try:
                head = os.pread(self._fd, self._good, 0)  # what it held, whole chunks only
            except OSError:
                head = b""
            os.close(self._fd)
        self._fd = None
        self._open()
        if head and self._good == 0:
            self.pending.appendleft(head)
        self.faults.note(
            f"{self.what}: {self.path} was removed; created again" + (" with what was written before" if head else "")
        )

    def _cut_back(self) -> None:
        if self._fd is None:
            return
        try:
            if os.fstat(self._fd).st_size > self._good:
                os.ftruncate(self._fd, self._good)
        except OSError:
            pass  # the file itself is gone or read-only: nothing half-written can be read either

    def close(self) -> bool:
        self._link_check_at = 0.0  # a file removed since the last look is created again, whole
        if self._fd is not None and not self.pending:
            try:
                if os.fstat(self._fd).st_nlink == 0:
                    self._reopen()
            except OSError:
                pass  # flush says what cannot be written
        ok = self.flush()
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        return ok
