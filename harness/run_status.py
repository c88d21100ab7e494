"""Each rank's state on disk, so a run that ended badly says which rank stopped and how.

`<run>/status/rank<R>.json` = {rank, host, pid, attempt, state, last_step, error, updated}:
"running" from the start, then "finished", "failed" (with the exception) or "terminated" (with
the signal: torchrun stopping the other ranks after one failed). A rank killed without a chance
to write (SIGKILL, the OOM killer, a lost node) stays "running": the collector reports it so.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from harness.atomic import write_text_atomic
from harness.paths import status_path


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM, so the rank records why it stops and closes files."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def raise_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)


class RankStatus:
    def __init__(self, run_dir: Path, *, rank: int, host: str, attempt: int) -> None:
        self.path = status_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.doc: dict[str, Any] = {"rank": rank, "host": host, "pid": os.getpid(), "attempt": attempt,
                                    "state": "running", "last_step": None, "error": None}
        self._write()

    def end(self, state: str, last_step: int | None, error: BaseException | None = None) -> None:
        if isinstance(error, Terminated):
            state, message = "terminated", f"signal {error.signum} ({signal.Signals(error.signum).name})"
        elif error is not None:
            message = f"{type(error).__name__}: {error}".strip().splitlines()[0][:500]
        else:
            message = None
        self.doc.update(state=state, last_step=last_step, error=message)
        self._write()

    def _write(self) -> None:
        self.doc["updated"] = time.time()
        write_text_atomic(self.path, json.dumps(self.doc))
