"""How long each CPU rank waited for a core in each traced step: what other work on its cores cost
it, said beside its lateness (stragglers.py never takes it out: a rank kept off its cores is
late). Pure.

The step logs hold, per step, the main thread's time runnable but waiting in a run queue
(`runq_ms`, harness/run/schedstat.py), since the previous step's end. A step's log is laid
over the trace's step of that number only where their phases last the same.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.traces.model import RankTrace

# A step's log is laid over the trace's step only when their phases last the same: the clock's
# mark and the range's end are taken microseconds apart in the same thread, so the two differ
# by far less than this share of the phases (or MATCH_FLOOR_MS where they are short), while a
# step paired with another (a loop whose profiler numbers its steps differently) differs by the
# run's own step-to-step change, which is at least this at any share worth telling.
MATCH_SHARE = 0.1
MATCH_FLOOR_MS = 0.5

# step -> (its phases' ms in all, of its step the ms waited for a core), as the step log has them
RunQueueLog = Mapping[int, tuple[float, float]]


def core_waits(trace: RankTrace, log: RunQueueLog) -> list[float]:
    """The rank's wait for a core in each of its traced steps whose log matches (module
    docstring), in step order; the steps without a matching log left out."""
    out = []
    for st in trace.steps:
        logged = log.get(st.number)
        if logged is None or not st.phases_us:
            continue
        traced_ms = sum(st.phases_us.values()) / 1e3
        if abs(logged[0] - traced_ms) <= max(MATCH_SHARE * traced_ms, MATCH_FLOOR_MS):
            out.append(max(logged[1], 0.0))
    return out


def core_waits_of(traces: list[RankTrace], logs: Mapping[int, RunQueueLog] | None) -> dict[int, list[float]] | None:
    """Every rank's `core_waits`, or None unless every rank ran on CPU and has its wait for a core
    for at least one traced step (a job's ranks said alike or not at all)."""
    if not logs or len(traces) < 2 or any(t.device != "cpu" for t in traces):
        return None
    waits = {t.rank: core_waits(t, logs.get(t.rank, {})) for t in traces}
    return waits if all(waits.values()) else None
