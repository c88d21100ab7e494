"""torch.profiler as a context manager that does nothing when profiling is off.

The training loop reads the same either way: `with TraceRecorder(...) as rec: ... rec.step()`.
Each finished window is exported to a temporary name and renamed, so a crash mid-export never
leaves a half-written file under a name a reader would pick up. A window whose export fails
(full disk, read-only or removed folder, an error inside the profiler library) is skipped, said
once, and recorded; training goes on. After a full disk, tracing pauses until there is room.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

from harness.atomic import write_text_atomic
from harness.debug.plan import first_free_start
from harness.paths import (
    TRACE_METADATA_KEY,
    groups_path,
    memory_timeline_path,
    partial_path,
    summary_path,
    trace_path,
)
from harness.run.settings import ProfilerConfig
from harness.write_faults import FaultLog, is_disk_full

# After a full disk, the next window is exported only once this much is free again: the start-up
# minimum (run_info.MIN_FREE_BYTES), or twice the largest window written so far if larger, so
# one more window cannot fill the disk again at once.
RESUME_MIN_FREE_BYTES = 64 * 2**20

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


@dataclass(frozen=True)
class Capture:
    """A triggered trace window (the live watch's --capture-on-straggler): warm-up steps from
    `start`, then steps `first`..`last` recorded; `why` goes into the window's trace metadata."""

    start: int
    first: int
    last: int
    why: dict[str, Any]

    def action(self, step: int) -> ProfilerAction | None:
        if step < self.start or step > self.last:
            return None
        if step < self.first:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if step == self.last else ProfilerAction.RECORD


class TraceRecorder:
    """Runs torch.profiler on a wait/warmup/active/repeat schedule and writes one file per window.

    `metadata` is stored under the top-level trace key `harness` in every window's trace (run id,
    rank, host, ...), so a reader can tell runs apart without trusting file names.
    """

    def __init__(
        self,
        cfg: ProfilerConfig,
        *,
        run_dir: Path,
        rank: int,
        host: str,
        cuda: bool,
        metadata: dict[str, Any],
        faults: FaultLog | None = None,
        collective_groups: bool = False,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.rank = rank
        self.host = host
        self.cuda = cuda
        self.metadata = metadata
        self.written: list[Path] = []
        self.summaries: list[Path] = []
        self.memory_timelines: list[Path] = []
        self.summary_s = 0.0  # time spent condensing traces into summaries
        self.on_summary: Callable[[Any], None] | None = None  # handed each summarized window's RankTrace
        self.skipped: list[dict[str, Any]] = []  # [{first, last, reason}]: runs of windows not written
        self.faults = faults or FaultLog(rank=rank)
        self._windows = 0  # windows handed over by the profiler so far
        self._resume_free_bytes: int | None = None  # set while paused after a full disk
        self._largest_bytes = 0
        self._leftovers: set[Path] = set()  # temporary files that could not be removed yet
        self._prof: profile | None = None
        self._stamped_window = 0
        # the wait/warmup/active/repeat schedule, made as the profiler starts
        self._scheduled: Callable[[int], ProfilerAction] | None = None
        self.captures: list[Capture] = []
        # gloo with the Flight Recorder on: each window's recorder entries go beside its trace
        # (paths.groups_path), from the start of the step before its first recorded one
        self.collective_groups = collective_groups
        self._boundaries_ns = (time.time_ns(), time.time_ns())  # the last two step boundaries
        self._groups_from_ns = self._boundaries_ns[0]

    @property
    def enabled(self) -> bool:
        return self.cfg.profile

    def __enter__(self) -> TraceRecorder:
        if not self.enabled:
            return self
        cfg = self.cfg
        self._scheduled = schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat)
        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=self._action,
            on_trace_ready=self._write_window,
            # torch's memory timeline needs shapes and stacks besides the allocations
            record_shapes=self.cfg.record_shapes or self.cfg.profile_memory,
            profile_memory=self.cfg.profile_memory,
            with_stack=self.cfg.with_stack or self.cfg.profile_memory,
        )
        self._prof.__enter__()
        self._stamp()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prof is not None:
            self._prof.__exit__(*exc)
            self._prof = None
        self._sweep()

    @property
    def state(self) -> str:
        """What the profiler does in the step about to run: off, wait, warmup or record."""
        if self._prof is None:
            return "off"
        action = self._prof.current_action
        if action in _RECORDING:
            return "record"
        return "warmup" if action == ProfilerAction.WARMUP else "wait"

    def _action(self, step: int) -> ProfilerAction:
        """What the profiler does in `step`: a triggered window's action there, else the schedule's."""
        for c in self.captures:
            action = c.action(step)
            if action is not None:
                return action
        assert self._scheduled is not None, "made in __enter__, before the profiler asks"
        return self._scheduled(step)

    def plan_capture(self, earliest: int, last_step: int | None, why: dict[str, Any]) -> Capture | None:
        """Book a triggered window (--warmup steps, then --active recorded) at the first step from
        `earliest` where neither the schedule nor another triggered window traces, ending by
        `last_step` (None: the run's length is not known; then within the next few windows'
        worth of steps); None when the profiler is off or no such room is left."""
        if self._prof is None:
            return None
        span = self.cfg.warmup + self.cfg.active
        horizon = last_step if last_step is not None else earliest + 10 * (span + self.cfg.wait) + span
        start = first_free_start(earliest, span, self.traces, horizon)
        return None if start is None else self.book_capture(start, why)

    def book_capture(self, start: int, why: dict[str, Any], active: int | None = None) -> Capture:
        """Book a triggered window from `start` (found by `plan_capture`, here or on rank 0; or by
        the debug server's plan): --warmup steps, then `active` recorded (default --active). The
        debug server's handler books from its own thread: one append, which the profiler reads at
        its next step boundary."""
        span = self.cfg.warmup + (self.cfg.active if active is None else active)
        capture = Capture(start=start, first=start + self.cfg.warmup, last=start + span - 1, why=why)
        self.captures.append(capture)
        return capture

    def traces(self, step: int) -> bool:
        """Whether the profiler warms up or records `step`: its schedule or a triggered window."""
        if self._prof is None or self._scheduled is None:
            return False
        return self._scheduled(step) != ProfilerAction.NONE or any(c.action(step) for c in tuple(self.captures))

    @property
    def largest_window_bytes(self) -> int:
        """The largest window file written so far (0 before the first)."""
        return self._largest_bytes

    def step(self) -> None:
        """Mark a step boundary (closes `ProfilerStep#N`, may finish a window)."""
        if self._prof is None:
            return
        self._boundaries_ns = (self._boundaries_ns[1], time.time_ns())
        with warnings.catch_warnings():
            # torch says once, as a second window starts, that each window holds its own events:
            # what the harness wants (one file per window), so not worth a line in the job's log.
            warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")
            self._prof.step()
        self._stamp()

    def _stamp(self) -> None:
        # Metadata only sticks while Kineto is recording, so add it once per window, on its
        # first recorded step.
        assert self._prof is not None
        window = self._windows + 1
        if self._prof.current_action in _RECORDING and self._stamped_window != window:
            self._groups_from_ns = self._boundaries_ns[0]
            meta = {**self.metadata, "window": window}
            step = self._prof.step_num
            trigger = next((c for c in self.captures if c.start <= step <= c.last), None)
            if trigger is not None:
                meta["captured"] = {"steps": [trigger.first, trigger.last], **trigger.why}
            self._prof.add_metadata_json(TRACE_METADATA_KEY, json.dumps(meta))
            self._stamped_window = window

    @property
    def tracing(self) -> dict[str, Any]:
        """How this rank's tracing went, for its status file and run.json."""
        return {
            "state": "degraded" if self.skipped or self._resume_free_bytes else "complete",
            "windows": self._windows,
            "written": len(self.written),
            "skipped_windows": self.skipped,
        }

    def _discard(self, tmp: Path) -> None:
        """Remove a failed window's temporary file, or remember it for later when the disk does
        not let it go now (a read-only disk keeps what was half-written when it turned so)."""
        if not _remove(tmp):
            self._leftovers.add(tmp)

    def _sweep(self) -> None:
        """Retry removing the temporary files a read-only disk kept (at each window and at the end)."""
        self._leftovers = {p for p in self._leftovers if not _remove(p)}

    def _write_window(self, prof: profile) -> None:
        """Export the window the profiler hands over; never raise into the training loop."""
        self._sweep()
        self._windows += 1
        window = self._windows
        final = trace_path(self.run_dir, self.rank, self.host, window)
        if self._resume_free_bytes is not None:
            free = _free_bytes(self.run_dir)
            if free is not None and free < self._resume_free_bytes:
                self._skip(
                    window, f"tracing paused after a full disk until {self._resume_free_bytes // 2**20} MiB are free"
                )
                return
            self.faults.note(f"tracing resumes with trace window {window}: {free // 2**20 if free else '?'} MiB free")
            self._resume_free_bytes = None
        tmp = partial_path(final)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)  # the run folder may have been removed mid-run
            prof.export_chrome_trace(str(tmp))  # gzip-compressed because the name ends in .gz
            os.replace(tmp, final)
        except Exception as exc:  # an OSError, or whatever the profiler library raises
            self._discard(tmp)
            action = f"trace window {window} skipped"
            if is_disk_full(exc):
                self._resume_free_bytes = max(RESUME_MIN_FREE_BYTES, 2 * self._largest_bytes)
                action += f"; tracing paused until {self._resume_free_bytes // 2**20} MiB are free"
            else:
                action += "; the next window is tried as usual"
            reason = self.faults.report("trace export", exc, action + "; training goes on", tmp, window=window)
            self._skip(window, reason)
            return
        self.written.append(final)
        if self.collective_groups:
            self._write_groups(final, window)
        if self.cfg.profile_memory:
            self._write_memory_timeline(prof, window)
        try:
            self._largest_bytes = max(self._largest_bytes, final.stat().st_size)
        except OSError:
            pass
        if self.cfg.trace_summary != "off":
            # Condensed here, on the rank's own node, while the profiler has handed the window
            # over (training waits for it, as it already waits for the export above).
            from harness.traces.read.summary import summarize

            started = time.perf_counter()
            try:
                self.summaries.append(
                    summarize(final, drop_trace=self.cfg.trace_summary == "only", seen=self.on_summary)
                )
            except Exception as exc:
                self._discard(partial_path(summary_path(final)))
                self.faults.report(
                    "trace summary",
                    exc,
                    f"window {window} keeps its trace, without a summary; training goes on",
                    summary_path(final),
                    window=window,
                )
            self.summary_s += time.perf_counter() - started

    def _write_groups(self, trace: Path, window: int) -> None:
        """The Flight Recorder's entries issued in the window (gloo_groups.sidecar_doc) beside its
        trace, which name the process group of each of its gloo collectives (the trace's ranges
        name none); nothing where the recorder cannot be read or holds no entry of the window,
        nor where the job has no group of fewer ranks than the world but the watch's
        (`gloo_groups.unnamed_groups` over torch's pg_config_info, which the trace's
        distributedInfo holds too: the collector reads the file only then). Never raises into
        the training loop. Its cost: bench/RESULTS.md, "Flight Recorder's cost"."""
        from harness.traces.read.gloo_groups import sidecar_doc, unnamed_groups
        from harness.watch.arrivals import recorder_entries

        path = groups_path(trace)
        try:
            c10d = torch.distributed.distributed_c10d
            groups = {"pg_config": c10d._world.pg_config_info}
            if not unnamed_groups(groups, c10d.get_world_size()):
                return
        except Exception:  # noqa: BLE001 - torch's private registry moved: write the file, as before
            pass
        try:
            doc = sidecar_doc(self._groups_from_ns, recorder_entries() or [])
            if doc["entries"]:
                write_text_atomic(path, json.dumps(doc))
        except Exception as exc:  # noqa: BLE001 - without the file the collector says it cannot match
            self.faults.report("collective groups", exc, f"window {window} has no groups file; training goes on", path)

    def _write_memory_timeline(self, prof: profile, window: int) -> None:
        """torch's memory timeline of the window ([times, sizes by category], gzip JSON) next to its
        trace, under a temporary name then renamed; never raises into the training loop.

        torch (2.x) builds it from the window's allocation events, which need record_shapes,
        profile_memory and with_stack (all on with --profile-memory). It works for CUDA devices
        and, in torch 2.13, for the CPU too (host tensors' allocations). Where this torch cannot
        build it (an older or newer torch that dropped the deprecated export, another device),
        the window has no timeline and nothing is said: the trace, which holds the same
        allocations as memory events, is unaffected.
        """
        final = memory_timeline_path(self.run_dir, self.rank, self.host, window)
        tmp = partial_path(final)
        device = f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # FutureWarning: deprecated in favour of CUDA-only snapshots
                # note: builds the window's memory profile in Python over every event: seconds for a large window
                prof.export_memory_timeline(str(tmp), device)
            os.replace(tmp, final)
        except (AttributeError, NotImplementedError, ValueError, AssertionError, KeyError):
            self._discard(tmp)  # not supported by this torch or on this device: no timeline, said in the docstring
        except Exception as exc:
            self._discard(tmp)
            self.faults.report(
                "memory timeline", exc, f"window {window} has no memory timeline; training goes on", tmp, window=window
            )
        else:
            self.memory_timelines.append(final)

    def _skip(self, window: int, reason: str) -> None:
        """Record a skipped window, joining it to the previous run of skipped windows when the
        reason is the same."""
        last = self.skipped[-1] if self.skipped else None
        if last and last["reason"] == reason and last["last"] == window - 1:
            last["last"] = window
        else:
            self.skipped.append({"first": window, "last": window, "reason": reason})


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path if path.exists() else path.parent).free
    except OSError:
        return None


def _remove(path: Path) -> bool:
    """Remove a temporary file; False when it cannot be removed now (a read-only disk)."""
    try:
        path.unlink(missing_ok=True)
        return True
    except OSError:
        return False
