"""Each rank's side of the debug server: two handlers on torch's worker server (one per rank).

`harness_state` answers the rank's live state (`LiveState.snapshot`); `harness_arm` books a
capture whose plan the frontend put in the job's c10d store, or cancels one that has not started.
Both run on the worker server's own thread, never in the training loop: they read the loop's
state (plain attribute reads) and book a window into the profiler's list of triggered windows,
which the loop's profiler reads at its next step boundary. A request without the job's secret
(kept in the c10d store: only the job's processes read it) gets 403; a handler never raises.
"""

from __future__ import annotations

import hmac
import json
import shutil
import statistics
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.debug.plan import MIN_LEAD_STEPS, CapturePlan

if TYPE_CHECKING:
    import torch.distributed as dist

    from harness.run.run import Run

STATE_HANDLER = "harness_state"
ARM_HANDLER = "harness_arm"
# The c10d store's keys, under STORE_PREFIX: the job's secret, and each capture's plan.
STORE_PREFIX = "harness_debug"
SECRET_KEY = "secret"
PLAN_KEY = "capture/{id}"
# The latest step records a rank keeps for the page (a screen's worth; a fixed ring, so nothing
# grows with the run's length).
RECENT_STEPS = 8
WHY = "debug server"  # a captured window's trace metadata says it was asked for here

_current: LiveState | None = None  # the rank's open run: the handlers are registered once per process
_registered = threading.Lock()
_handlers_in = False


class LiveState:
    """What a rank tells the debug server about its run (the loop adds each step record)."""

    def __init__(self, run: Run, secret: str, store: dist.Store) -> None:
        self.run = run
        self.secret = secret
        self.store = store
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_STEPS)
        self.captures: list[dict[str, Any]] = []  # the captures booked here (run.json's record)

    @property
    def debug_captures(self) -> int:
        return len(self.captures)

    def summary(self) -> dict[str, Any]:
        """run.json's `debug_server`: the captures it started ({first, last, start, id, requested_at_step})."""
        return {"captures": list(self.captures)}

    def add(self, rec: dict[str, Any]) -> None:
        """A finished step's record (the loop's thread: one append to a fixed ring)."""
        self.recent.append(rec)

    def snapshot(self) -> dict[str, Any]:
        """The rank's state as `plan.RankState.from_doc` reads it."""
        run = self.run
        recorder = run.recorder
        step = run.step_number
        recent: list[dict[str, Any]] = [
            {"step": r.get("step"), "step_ms": r.get("step_ms"), "phases_ms": r.get("phases_ms") or {}}
            for r in tuple(self.recent)
        ]
        times = [float(r["step_ms"]) for r in recent if r["step_ms"] is not None]
        cfg = recorder.cfg
        on = recorder.state != "off"
        watch = run.watch
        return {
            "rank": run.env.rank,
            "host": run.host,
            "step": step,
            "in_step": run.in_step,
            "last_step": None if run.cfg.job.steps is None else run.cfg.job.steps - 1,
            "step_ms": statistics.median(times) if times else None,
            "profiler": recorder.state,
            "schedule": (
                {"wait": cfg.wait, "warmup": cfg.warmup, "active": cfg.active, "repeat": cfg.repeat} if on else None
            ),
            "booked": [[c.start, c.last] for c in tuple(recorder.captures) if c.last >= step],
            "windows_written": len(recorder.written),
            "debug_captures": self.debug_captures,
            "free_bytes": _free_bytes(run.ident.dir),
            "trace_bytes_per_step": recorder.largest_window_bytes / cfg.active
            if recorder.largest_window_bytes
            else None,
            "recent": recent,
            "watch": watch.latest if watch is not None else None,
        }

    def arm(self, plan_id: str, cancel: bool) -> tuple[int, dict[str, Any]]:
        """Book the plan stored under `plan_id` (or cancel it where it has not started): the HTTP
        status and the answer. Refused (409) where the rank is too close to the plan's start, its
        profiler is off, or its own schedule traces those steps."""
        run = self.run
        recorder = run.recorder
        rank = run.env.rank
        step = run.step_number
        if cancel:
            kept = [c for c in recorder.captures if not (c.why.get("id") == plan_id and c.start > step + 1)]
            dropped = len(recorder.captures) - len(kept)
            recorder.captures = kept
            if dropped:
                self.captures = [c for c in self.captures if c["id"] != plan_id]
            return 200, {"rank": rank, "cancelled": bool(dropped), "step": step}
        key = PLAN_KEY.format(id=plan_id)
        if not self.store.check([key]):
            return 404, {"rank": rank, "error": f"no capture plan {plan_id!r} in the job's store"}
        plan = CapturePlan.from_doc(json.loads(self.store.get(key)))
        if recorder.state == "off":
            return 409, {"rank": rank, "error": "the profiler is off on this rank"}
        if plan.start - step < MIN_LEAD_STEPS:
            return 409, {"rank": rank, "error": f"rank {rank} is at step {step}, too close to the start {plan.start}"}
        busy = [s for s in range(plan.start, plan.last + 1) if recorder.traces(s)]
        if busy:
            return 409, {"rank": rank, "error": f"rank {rank} traces step {busy[0]} already (its schedule differs)"}
        recorder.book_capture(plan.start, {"requested_by": WHY, "id": plan.id}, active=plan.last - plan.first + 1)
        self.captures.append({**plan.to_doc(), "requested_by": WHY})
        return 200, {"rank": rank, "armed": [plan.first, plan.last], "step": step}


def open_state(state: LiveState | None) -> None:
    """Make `state` the one the handlers answer for (None: the run closed; they say so)."""
    global _current
    _current = state
    if state is not None:
        _register()


def _register() -> None:
    """Register the two handlers with torch's worker server, once per process (torch refuses a
    second registration of a name)."""
    global _handlers_in
    with _registered:
        if _handlers_in:
            return
        from torch._C._distributed_c10d import _register_handler

        # module-level functions: torch's registry holds its handlers until the process exits and
        # drops them without the GIL; a closure whose only reference it holds then aborts the exit
        _register_handler(STATE_HANDLER, _state_handler)
        _register_handler(ARM_HANDLER, _arm_handler)
        _handlers_in = True


def _state_handler(req: Any, resp: Any) -> None:
    _answer(req, resp, lambda live: (200, live.snapshot()))


def _arm_handler(req: Any, resp: Any) -> None:
    _answer(req, resp, lambda live: live.arm(req.get_param("id"), req.get_param("cancel") == "1"))


def _answer(req: Any, resp: Any, body: Callable[[LiveState], tuple[int, dict[str, Any]]]) -> None:
    """Answer a worker request with `body`: the secret checked, JSON out, never an exception out."""
    live = _current
    try:
        if live is None:
            status, doc = 503, {"error": "no harness run is open in this process"}
        elif not hmac.compare_digest(req.get_param("secret").encode(), live.secret.encode()):
            status, doc = 403, {"error": "the job's secret is missing or wrong"}
        else:
            status, doc = body(live)
    except Exception as exc:  # noqa: BLE001 - a handler answers, never raises into torch's server
        status, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
    resp.set_content(json.dumps(doc).encode(), "application/json")
    resp.set_status(status)


def _free_bytes(path: Any) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None
