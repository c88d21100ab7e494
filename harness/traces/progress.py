"""`--progress-file PATH`: where the collector is, for whoever started it (TensorBoard's
"Analyse now"), as one small JSON object replaced atomically at every stage:
`{"state": "running"|"done"|"failed", "stage": str, "done": int, "total": int, "message": str,
"stages_s": [[stage, seconds], ...]}` (the stages finished so far, in order, wall seconds each; the
benchmark reads them to say where the command's time goes).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.atomic import write_text_atomic


class Progress:
    """Writes the progress file (does nothing without a path). A failed write is ignored: the
    collector's own work never depends on it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.stage_name = ""
        self.total = 0
        self.stages_s: list[list] = []
        self._since = time.perf_counter()

    def _write(self, state: str, done: int, message: str = "") -> None:
        if self.path is None:
            return
        doc = {
            "state": state,
            "stage": self.stage_name,
            "done": done,
            "total": self.total,
            "message": message,
            "stages_s": self.stages_s,
        }
        try:
            write_text_atomic(self.path, json.dumps(doc))
        except OSError:
            pass

    def _close_stage(self) -> None:
        now = time.perf_counter()
        if self.stage_name:
            self.stages_s.append([self.stage_name, round(now - self._since, 3)])
        self._since = now

    def stage(self, name: str, total: int = 0) -> None:
        self._close_stage()
        self.stage_name, self.total = name, total
        self._write("running", 0)

    def advance(self, done: int) -> None:
        self._write("running", done)

    def finish(self, ok: bool, message: str) -> None:
        self._close_stage()
        self._write("done" if ok else "failed", self.total, message)
