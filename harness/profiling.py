"""torch.profiler as a context manager that does nothing when profiling is off.

The training loop reads the same either way: `with TraceRecorder(...) as rec: ... rec.step()`.
Each finished window is exported to a temporary name and renamed, so a crash mid-export never
leaves a half-written file under a name a reader would pick up.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

from harness.config import ProfilerConfig
from harness.paths import TRACE_METADATA_KEY, partial_path, trace_path

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class TraceRecorder:
    """Runs torch.profiler on a wait/warmup/active/repeat schedule and writes one file per window.

    `metadata` is stored under the top-level trace key `harness` in every window's trace (run id,
    rank, host, ...), so a reader can tell runs apart without trusting file names.
    """

    def __init__(self, cfg: ProfilerConfig, *, run_dir: Path, rank: int, host: str, cuda: bool, metadata: dict[str, Any]) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.rank = rank
        self.host = host
        self.cuda = cuda
        self.metadata = metadata
        self.written: list[Path] = []
        self.summaries: list[Path] = []
        self.summary_s = 0.0  # time spent condensing traces into summaries
        self._prof: profile | None = None
        self._stamped_window = 0

    @property
    def enabled(self) -> bool:
        return self.cfg.profile

    def __enter__(self) -> "TraceRecorder":
        if not self.enabled:
            return self
        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=self.cfg.wait, warmup=self.cfg.warmup, active=self.cfg.active, repeat=self.cfg.repeat),
            on_trace_ready=self._write_window,
            record_shapes=self.cfg.record_shapes,
            profile_memory=self.cfg.profile_memory,
            with_stack=self.cfg.with_stack,
        )
        self._prof.__enter__()
        self._stamp()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prof is not None:
            self._prof.__exit__(*exc)
            self._prof = None

    @property
    def state(self) -> str:
        """What the profiler does in the step about to run: off, wait, warmup or record."""
        if self._prof is None:
            return "off"
        action = self._prof.current_action
        if action in _RECORDING:
            return "record"
        return "warmup" if action == ProfilerAction.WARMUP else "wait"

    def step(self) -> None:
        """Mark a step boundary (closes `ProfilerStep#N`, may finish a window)."""
        if self._prof is None:
            return
        self._prof.step()
        self._stamp()

    def _stamp(self) -> None:
        # Metadata only sticks while Kineto is recording, so add it once per window, on its
        # first recorded step.
        assert self._prof is not None
        window = len(self.written) + 1
        if self._prof.current_action in _RECORDING and self._stamped_window != window:
            self._prof.add_metadata_json(TRACE_METADATA_KEY, json.dumps({**self.metadata, "window": window}))
            self._stamped_window = window

    def _write_window(self, prof: profile) -> None:
        final = trace_path(self.run_dir, self.rank, self.host, len(self.written) + 1)
        tmp = partial_path(final)
        prof.export_chrome_trace(str(tmp))  # gzip-compressed because the name ends in .gz
        os.replace(tmp, final)
        self.written.append(final)
        if self.cfg.trace_summary != "off":
            # Condensed here, on the rank's own node, while the profiler has handed the window
            # over (training waits for it, as it already waits for the export above).
            from harness.collect.summary import summarize

            started = time.perf_counter()
            self.summaries.append(summarize(final, drop_trace=self.cfg.trace_summary == "only"))
            self.summary_s += time.perf_counter() - started
