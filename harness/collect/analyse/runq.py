"""How long each CPU rank waited for a core, laid over its trace: the time-sharing the straggler
rule takes out of a rank's lateness. Pure.

The step logs hold, per step and phase, the main thread's time runnable but waiting in a run
queue (`phases_runq_ms`, harness/train/schedstat.py). Where ranks share cores that wait is the
scheduler's choice, not the rank's work: a rank that waited 10 ms for a core in its forward
arrives 10 ms late at the collective after it through no fault of its own. A straggler's own
cause is not in it: extra work runs on the core, and a sleep or a slow input blocks (not
runnable: not waiting in a run queue). The trace says where each phase ran (Step.phase_spans);
the log says how much of it was waiting for a core, spread evenly over the phase's span (where
in the phase the wait fell is not recorded).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from harness.collect.model import RankTrace

# A step's log is laid over the trace's step only when their phases last the same: the clock's
# mark and the range's end are taken microseconds apart in the same thread, so the two differ
# by far less than this share of the phases (or MATCH_FLOOR_MS where they are short), while a
# step paired with another (a loop whose profiler numbers its steps differently) differs by the
# run's own step-to-step change, which is at least this at any share worth correcting.
MATCH_SHARE = 0.1
MATCH_FLOOR_MS = 0.5

# step -> phase -> (its ms, of them the ms waited for a core), as the step log has them
RunQueueLog = Mapping[int, Mapping[str, tuple[float, float]]]


class RunQueue:
    """A rank's wait for a core as a function of time on its (aligned) trace clock: each phase
    span of a logged step carries its phase's wait spread evenly over it."""

    def __init__(self, trace: RankTrace, log: RunQueueLog) -> None:
        spans: list[tuple[float, float, float]] = []  # (start_us, end_us, wait_us per us)
        self.steps_laid = 0
        for st in trace.steps:
            logged = log.get(st.number)
            if not logged or not st.phase_spans:
                continue
            traced_ms = {p: us / 1e3 for p, us in st.phases_us.items() if p in logged}
            if not traced_ms:
                continue
            total_ms = sum(traced_ms.values())
            logged_ms = sum(logged[p][0] for p in traced_ms)
            if abs(logged_ms - total_ms) > max(MATCH_SHARE * total_ms, MATCH_FLOOR_MS):
                continue
            self.steps_laid += 1
            for p, a, b in st.phase_spans:
                if p in traced_ms and b > a and traced_ms[p] > 0:
                    # a phase in several ranges shares its wait among them by length
                    spans.append((a, b, min(max(logged[p][1], 0.0) / traced_ms[p], 1.0)))
        spans.sort()
        self._starts = [a for a, _, _ in spans]
        self._spans = spans
        self._before: list[float] = []  # the wait in the spans before each, us
        self._covered_before: list[float] = []  # the spans' length before each, us
        total = covered = 0.0
        for a, b, d in spans:
            self._before.append(total)
            self._covered_before.append(covered)
            total += (b - a) * d
            covered += b - a

    def _upto(self, at_us: float) -> tuple[float, float]:
        """(the wait, the length of the logged spans) up to `at_us`."""
        i = bisect.bisect_right(self._starts, at_us) - 1
        if i < 0:
            return 0.0, 0.0
        a, b, d = self._spans[i]
        inside = max(min(at_us, b) - a, 0.0)
        return self._before[i] + inside * d, self._covered_before[i] + inside

    def between_us(self, lo_us: float, hi_us: float) -> float:
        """The wait for a core in [lo_us, hi_us] (0 where nothing was logged)."""
        return max(self._upto(hi_us)[0] - self._upto(lo_us)[0], 0.0) if hi_us > lo_us else 0.0

    def share(self, lo_us: float, hi_us: float) -> float:
        """The share of the logged time in [lo_us, hi_us] spent waiting for a core: what each op
        run in it waited, the wait being spread evenly over its phase (0 where nothing was
        logged)."""
        if hi_us <= lo_us:
            return 0.0
        (w0, c0), (w1, c1) = self._upto(lo_us), self._upto(hi_us)
        return min(max((w1 - w0) / (c1 - c0), 0.0), 1.0) if c1 > c0 else 0.0


def run_queues(traces: list[RankTrace], logs: Mapping[int, RunQueueLog] | None) -> dict[int, RunQueue] | None:
    """Every rank's `RunQueue`, or None unless every rank ran on CPU and has its wait for a core
    laid over at least one traced step: a rank corrected beside one that is not would be judged
    early by its own wait."""
    if not logs or len(traces) < 2 or any(t.device != "cpu" for t in traces):
        return None
    queues = {t.rank: RunQueue(t, logs.get(t.rank, {})) for t in traces}
    return queues if all(q.steps_laid for q in queues.values()) else None
