"""Find the trace files of one run among folders and globs, and group them by rank."""

from __future__ import annotations

import datetime
import glob
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from harness.paths import (
    ATTEMPT_PATTERN,
    FLIGHT_DIR,
    REPORT_JSON,
    RUN_FILE,
    STATUS_DIR,
    TRACE_PATTERN,
    is_groups,
    is_summary,
    trace_of_summary,
)
from harness.traces.model import RankTrace, number_by_group

REPORT_DIR = "report"
TRACE_SUFFIXES = (".json", ".json.gz")
NOT_TRACES = {RUN_FILE, REPORT_JSON}


class InputError(ValueError):
    """The inputs cannot be analysed (nothing there, runs mixed, ...); the message says what to do."""


def find_trace_files(inputs: list[str], summaries: bool = True) -> list[Path]:
    """Trace files (or their summaries) under the given folders, files and globs.

    1. a glob is expanded; a file is taken as it is; a folder is searched recursively;
    2. in a folder, files named like profiler traces (`*.pt.trace.json[.gz]`) are taken; if
       there are none, any `*.json[.gz]` (third-party traces keep other names);
    3. the collector's own output (`report/` folders, run.json) is never taken;
    4. with `summaries`, a trace's summary (`<trace>.summary.json`, see summary.py) replaces
       the trace, and a summary whose trace is gone stands for it; without, summaries are
       ignored.
    """
    files: list[Path] = []
    for item in inputs:
        matches = [Path(m) for m in sorted(glob.glob(item))] if glob.has_magic(item) else [Path(item)]
        if not matches or not any(m.exists() for m in matches):
            raise InputError(f"{item}: no such file or folder")
        for m in matches:
            if m.is_dir():
                files.extend(_traces_in(m))
            elif m.is_file():
                files.append(m)
    unique = sorted({f.resolve(): f for f in files}.values(), key=lambda p: str(p))
    if summaries:
        condensed = {trace_of_summary(f).resolve() for f in unique if is_summary(f)}
        unique = [f for f in unique if f.resolve() not in condensed]
    else:
        unique = [f for f in unique if not is_summary(f)]
    if not unique:
        raise InputError(
            f"no trace files (*.pt.trace.json[.gz] or *.json[.gz]) under {', '.join(inputs)}; "
            "point at a run folder such as profiler_logs/<run>"
        )
    return unique


def _traces_in(folder: Path) -> list[Path]:
    # Not the report's files, Flight Recorder dumps, status files or a window's groups file
    # (paths.GROUPS_SUFFIX), and not a later elastic attempt's (restart-N/: run_state.py picks one).
    candidates = [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.name not in NOT_TRACES
        and p.name.endswith(TRACE_SUFFIXES)
        and not is_groups(p)
        and not any(
            d in (REPORT_DIR, FLIGHT_DIR, STATUS_DIR) or ATTEMPT_PATTERN.match(d)
            for d in p.relative_to(folder).parts[:-1]
        )
    ]
    condensed = [p for p in candidates if is_summary(p)]
    candidates = [p for p in candidates if not is_summary(p)]
    named = [p for p in candidates if TRACE_PATTERN.match(p.name)]
    return (named or candidates) + condensed


@dataclass
class RunSet:
    """The ranks of one run: traces grouped by rank (several windows of a rank merged). The
    collector's command lets their intervals go once the ranks are aligned (`Analysis.traces`
    holds them on the aligned clocks); their identity, paths and steps stay."""

    ranks: list[RankTrace]
    world_size: int | None
    missing: list[int] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run_id: str | None = None
    ending: list[str] = field(default_factory=list)  # how the job ended when it did not finish (run_state.py)
    skipped_windows: list[dict] = field(default_factory=list)  # [{rank, first, last, reason}] (run_state.py)


def split_runs(traces: list[RankTrace]) -> list[list[RankTrace]]:
    """The runs of one job among the traces, oldest first (one run: all of them).

    1. a rank's traces are grouped by the process that wrote them (`RankTrace.pid`): a rank's
       profiler windows all come from its one process, so two processes of one rank are two runs;
    2. n = the most processes any rank has; with n = 1 there is one run;
    3. each run's start = the median over the ranks with n processes of their i-th process's
       first event (`started_ns`, processes ordered by it);
    4. every process goes to the run whose start is nearest its own first event (a rank that
       one run lacks has fewer processes than n)."""
    by_rank: dict[int, dict[int | None, list[RankTrace]]] = {}
    for t in traces:
        by_rank.setdefault(t.rank, {}).setdefault(t.pid, []).append(t)
    n = max((len(p) for p in by_rank.values()), default=1)
    if n == 1:
        return [traces]

    def first_ns(ts: list[RankTrace]) -> float:
        return min((t.started_ns for t in ts if t.started_ns is not None), default=math.inf)

    full = [sorted(p.values(), key=first_ns) for p in by_rank.values() if len(p) == n]
    starts = [statistics.median(first_ns(procs[i]) for procs in full) for i in range(n)]
    runs: list[list[RankTrace]] = [[] for _ in range(n)]
    for procs in by_rank.values():
        for ts in procs.values():
            runs[min(range(n), key=lambda i: abs(first_ns(ts) - starts[i]))].extend(ts)
    return [r for r in runs if r]


def describe_run(number: int, traces: list[RankTrace]) -> str:
    """`run 2: ranks 0-3, pids 26699-26701, 26703, started 2023-11-02 20:07:08 UTC`."""
    ranks = sorted({t.rank for t in traces})
    pids = sorted({t.pid for t in traces if t.pid is not None})
    started = [t.started_ns for t in traces if t.started_ns is not None]
    text = f"run {number}: rank(s) {number_ranges(ranks)}"
    if pids:
        text += f", pid(s) {number_ranges(pids)}"
    if started and min(started) > 0:
        when = datetime.datetime.fromtimestamp(min(started) / 1e9, tz=datetime.UTC)
        text += f", started {when:%Y-%m-%d %H:%M:%S} UTC"
    return text + f" ({len(traces)} file(s), e.g. {Path(min(traces, key=lambda t: t.rank).paths[0]).name})"


def number_ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10'."""
    out: list[list[int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def pick_run(traces: list[RankTrace], run: int | None) -> tuple[list[RankTrace], list[str]]:
    """The traces of the run asked for (`run`, 1 = the oldest; None: the only one), and a note
    saying which was picked where there were several; InputError naming every run where there
    are several and none was asked for, or the one asked for is not there."""
    runs = split_runs(traces)
    listed = "; ".join(describe_run(i + 1, r) for i, r in enumerate(runs))
    if run is None and len(runs) > 1:
        raise InputError(
            f"the inputs hold {len(runs)} runs of one job ({listed}); pick one with --run N (1 = the oldest), "
            "or put each run's files in a folder of its own"
        )
    if run is not None and not 1 <= run <= len(runs):
        raise InputError(f"--run {run}: the inputs hold {len(runs)} run(s) ({listed}); pick one of 1-{len(runs)}")
    if run is None or len(runs) == 1:
        return traces, []
    return runs[run - 1], [f"{len(runs)} runs in the inputs; analysing {describe_run(run, runs[run - 1])} (--run)"]


def group_ranks(traces: list[RankTrace], run: int | None = None) -> RunSet:
    """One RankTrace per rank.

    1. traces naming different harness run ids, or different world sizes, are refused (two runs
       in one folder); so are traces of one job written by several runs of its processes
       (`split_runs`) unless `run` picks one (`pick_run`);
    2. several traces of one rank from the same run are its profiler windows: merged in time
       order; two traces of one rank with the same first step are duplicates: the first (by path)
       is kept and the others are reported;
    3. missing ranks = 0..world_size-1 (from distributedInfo) minus the ranks present.
    """
    run_ids = {t.run_id for t in traces if t.run_id}
    if len(run_ids) > 1:
        by_run = {
            rid: sorted(Path(t.paths[0]).parent.name + "/" + Path(t.paths[0]).name for t in traces if t.run_id == rid)[
                :2
            ]
            for rid in sorted(run_ids)
        }
        detail = "; ".join(f"run {rid}: {', '.join(files)}" for rid, files in by_run.items())
        raise InputError(f"traces of {len(run_ids)} different runs are mixed ({detail}); collect one run at a time")
    sizes = {t.world_size for t in traces if t.world_size}
    if len(sizes) > 1:
        examples = {ws: next(Path(t.paths[0]).name for t in traces if t.world_size == ws) for ws in sorted(sizes)}
        detail = ", ".join(f"world size {ws} ({name})" for ws, name in examples.items())
        raise InputError(f"traces of different runs are mixed: {detail}; collect one run at a time")
    traces, run_notes = pick_run(traces, run)
    by_rank: dict[int, list[RankTrace]] = {}
    for t in sorted(traces, key=lambda t: t.paths):
        by_rank.setdefault(t.rank, []).append(t)
    ranks: list[RankTrace] = []
    duplicates: list[str] = []
    warnings: list[str] = []
    for rank in sorted(by_rank):
        parts = by_rank[rank]
        kept: list[RankTrace] = []
        seen_first_steps: dict[int | None, str] = {}
        for t in parts:
            first = t.steps[0].number if t.steps else None
            if first in seen_first_steps:
                duplicates.append(f"rank {rank}: {t.paths[0]} duplicates {seen_first_steps[first]} (ignored)")
                continue
            seen_first_steps[first] = t.paths[0]
            kept.append(t)
        ranks.append(_merge_windows(kept))
    world_size = next(iter(sizes), None)
    missing = sorted(set(range(world_size)) - set(by_rank)) if world_size else []
    return RunSet(
        ranks=ranks,
        world_size=world_size,
        missing=missing,
        duplicates=duplicates,
        warnings=run_notes + warnings + duplicates,
        run_id=next(iter(run_ids), None),
    )


def _merge_windows(parts: list[RankTrace]) -> RankTrace:
    if len(parts) == 1:
        return parts[0]
    base = parts[0].base_us
    parts = sorted((p.shifted(base - p.base_us) for p in parts), key=lambda t: t.steps[0].start_us if t.steps else 0.0)
    first = parts[0]
    merged = RankTrace(
        rank=first.rank,
        world_size=first.world_size,
        host=first.host,
        paths=[f for p in parts for f in p.paths],
        run_id=first.run_id,
        device="gpu" if any(p.device == "gpu" for p in parts) else "cpu",
        steps=[s for p in parts for s in p.steps],
        comms=[c for p in parts for c in p.comms],
        warnings=[w for p in parts for w in p.warnings],
        steps_source=first.steps_source,
        rank_source=first.rank_source,
        base_us=first.base_us,
        json_bytes=sum(p.json_bytes for p in parts),
        events=sum(p.events for p in parts),
        blocks={k: v for p in parts for k, v in p.blocks.items()},
        op_floor_us=statistics.median(floors) if (floors := [p.op_floor_us for p in parts if p.op_floor_us]) else None,
        unnamed_groups=sorted({tuple(g): list(g) for p in parts for g in p.unnamed_groups}.values()),
        pid=first.pid,
        started_ns=first.started_ns,
        practices=[x for x in dict.fromkeys(x for p in parts for x in p.practices)],
    )
    number_by_group(merged.comms)
    return merged
