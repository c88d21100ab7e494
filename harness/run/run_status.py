"""Each rank's state on disk, so a run that ended badly says which rank stopped and how.

`<run>/status/rank<R>.json` = {rank, host, pid, attempt, state, last_step, error, tracing, updated}:
"running" from the start, then "finished", "failed" (with the exception), "hung" (a collective
timed out: a peer never entered it) or "terminated" (with the signal: torchrun stopping the
other ranks after one failed, or SIGINT); `where` = {step, phase} the rank was in when it ended
badly, `flight` its Flight Recorder dump (harness/run/flight.py), if written; `tracing` says how its
profiler output ended ({state: complete|degraded, skipped_windows, write_failures}). A rank killed without a chance
to write (SIGKILL, the OOM killer, a lost node) stays "running": the collector reports it so.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.atomic import write_text_atomic
from harness.paths import status_path
from harness.write_faults import FaultLog


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM, so the rank records why it stops and closes files."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def raise_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)


@contextmanager
def sigterm_deferred() -> Iterator[list[int]]:
    """Inside the block a SIGTERM is recorded (in the yielded list), not raised; the handler that
    was there is back after it. For a failing rank's last words: torchrun SIGTERMs the other ranks
    as soon as one fails, which would otherwise raise in the middle of closing the files and
    writing the status (then left at "running", as if the rank had been SIGKILLed). Only local
    writes run inside, so deferring cannot keep a rank alive past torchrun's grace period."""
    came: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGTERM, before)


class RankStatus:
    """The status file; a disk that refuses it does not stop training (said once, retried at the
    next change)."""

    def __init__(self, run_dir: Path, *, rank: int, host: str, attempt: int, faults: FaultLog | None = None) -> None:
        self.path = status_path(run_dir, rank)
        self.faults = faults or FaultLog(rank=rank)
        self.doc: dict[str, Any] = {
            "rank": rank,
            "host": host,
            "pid": os.getpid(),
            "attempt": attempt,
            "state": "running",
            "last_step": None,
            "error": None,
            "tracing": None,
        }
        self._write()

    def end(
        self,
        state: str,
        last_step: int | None,
        error: BaseException | None = None,
        tracing: dict[str, Any] | None = None,
        **extra: Any,
    ) -> bool:
        """Record how the rank ended (and how its tracing ended, and `extra` fields such as where
        it was); False if the file could not be written."""
        self.doc.update(extra)
        if isinstance(error, Terminated):
            state, message = "terminated", f"signal {error.signum} ({signal.Signals(error.signum).name})"
        elif isinstance(error, KeyboardInterrupt):
            state, message = "terminated", f"signal {int(signal.SIGINT)} (SIGINT)"
        elif error is not None:
            message = f"{type(error).__name__}: {error}".strip().splitlines()[0][:500]
        else:
            message = None
        self.doc.update(state=state, last_step=last_step, error=message, tracing=tracing)
        return self._write()

    def _write(self) -> bool:
        self.doc["updated"] = time.time()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(self.doc))
        except OSError as exc:
            self.faults.report("status file", exc, "training goes on; retried when the rank's state changes", self.path)
            return False
        return True
