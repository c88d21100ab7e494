"""The collector's pipeline: from run folders to a written report folder, as one function that
returns what it made (`Collected`) or raises one `CollectError` saying in a line what is wrong
with the input. The command (collect/command.py) turns options into `CollectOptions` and prints.

1. the restart attempt to read, chosen once for every input (`run_state.choose_attempt`);
2. the trace files of one profiler window (in-job summaries where present), parsed in parallel;
3. no readable trace: a report from the Flight Recorder dumps alone where there are some,
   else the error, with what the step logs still say about memory;
4. clocks aligned, collectives matched, the analysis; the merged trace written on the pool
   meanwhile;
5. report.json built from the analysis, memory, Flight Recorder dumps, the window and the watch
   (whose flags join the verdict: watch_verdict.py),
   then every file of the report folder written (`report_folder`: one rule for where).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from harness.paths import FLIGHT_DIR, is_summary, trace_of_summary
from harness.report.document import build_report, collective_rows
from harness.report.files import write_report, write_view
from harness.report.hang_report import attach, flight_only
from harness.report.merged import MergedChoice, MergedResult, MergedWriting, finish_merged, merged_entry, start_merged
from harness.report.merged import window_for as merged_window_for
from harness.report.records import Report
from harness.report.tb_scalars import write_scalars
from harness.report.timeline import build_timeline
from harness.report.watch_verdict import attach_watch
from harness.traces.analyse.flight import analyze, find_dumps, read_dumps
from harness.traces.analyse.flight_records import FlightResult
from harness.traces.analyse.memory import (
    analyze_memory,
    find_memory_timelines,
    finding_text,
    memory_from_dirs,
    read_step_logs,
)
from harness.traces.analyse.stragglers import Thresholds
from harness.traces.model import RankTrace, Shared, compact
from harness.traces.progress import Progress
from harness.traces.read.discover import InputError, RunSet, find_trace_files, group_ranks
from harness.traces.read.parse import TraceError, parse_trace
from harness.traces.read.run_state import choose_attempt, ending_notes, skipped_note, skipped_windows
from harness.traces.read.summary import read_summary
from harness.traces.read.watch_log import read_watch
from harness.traces.read.windows import WindowPick, pick_window, read_requested, window_entry
from harness.traces.run_analysis import Alignment, NoStepsError, align_ranks, analyze_aligned


class CollectError(InputError):
    """Nothing can be analysed from the input (or an option does not fit it): the message says
    what to do. `memory_lines`: what the step logs still say about memory, when there is no
    trace to report on (a --no-profile run)."""

    def __init__(self, message: str, memory_lines: list[str] | None = None) -> None:
        super().__init__(message)
        self.memory_lines = memory_lines or []


@dataclass(frozen=True, kw_only=True)
class CollectOptions:
    """What the collector is asked for (the command's flags, by the same names)."""

    inputs: list[str]  # run folders, trace files or globs (several folders: one per node)
    output: Path | None = None  # the report folder (None: `report_folder`)
    steps: set[int] | None = None  # the steps to analyse (None: all)
    align: bool = True  # align the ranks' clocks
    merged: MergedChoice = field(default_factory=MergedChoice)  # what the merged trace holds
    window: str = "latest"  # the profiler window: latest, all or its number
    attempt: int | None = None  # the restart attempt (None: the latest)
    run: int | None = None  # which of several runs in the inputs (1 = the oldest; None: the only one)
    comm_kernel: re.Pattern[str] | None = None  # more GPU kernels that are communication
    from_traces: bool = False  # parse traces even where in-job summaries are next to them
    thresholds: Thresholds = field(default_factory=Thresholds)  # the straggler rule's bounds
    unpickle_nccl_dumps: bool = False  # read NCCL's pickled watchdog dumps too
    progress: bool = True  # a progress bar while parsing several files


@dataclass(kw_only=True)
class Collected:
    """What the pipeline made: the report and where it was written."""

    report: Report  # report.json's content, as records
    out: Path  # the report folder
    warnings: list[str]  # the analysis's warnings (the trace report; the dumps' for a flight-only one)
    merged: MergedResult | None = None  # the merged trace written, if any
    window: WindowPick | None = None  # the profiler window analysed
    flight_only: bool = False  # the report comes from Flight Recorder dumps alone (no trace)


def report_folder(inputs: list[str], first_file: Path) -> Path:
    """Where the report goes unless -o says: `report/` in the first input folder (in the run
    folder when that is its Flight Recorder folder), else beside the first file read."""
    first = Path(inputs[0])
    if first.is_dir():
        return (first.parent if first.name == FLIGHT_DIR else first) / "report"
    return first_file.parent / "report"


def _parse_one(path: Path, comm_kernel: re.Pattern[str] | None = None) -> RankTrace | str:
    """The file's RankTrace (from its summary, if it is one), or the one-line reason it has none.
    An unreadable summary whose trace is still there falls back to the trace, with a warning."""
    try:
        if not is_summary(path):
            return parse_trace(path, comm_kernel)
        try:
            return read_summary(path)
        except TraceError as exc:
            trace_file = trace_of_summary(path)
            if not trace_file.is_file():
                raise
            parsed = parse_trace(trace_file, comm_kernel)
            parsed.warnings.append(f"{exc}: parsed {trace_file.name} instead")
            return parsed
    except TraceError as exc:
        return str(exc)


def parse_all(
    files: list[Path],
    pool: Executor | None,
    progress: bool,
    reporter: Progress | None = None,
    comm_kernel: re.Pattern[str] | None = None,
) -> tuple[list[RankTrace], list[str]]:
    """Parse the traces, in parallel on `pool` when there is one; bad files become warnings."""
    reporter = reporter or Progress(None)
    reporter.stage("parsing traces", total=len(files))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), desc="parsing traces", unit="rank", file=sys.stderr, disable=None)
    results: list[RankTrace | str] = []
    shared = Shared()
    one = functools.partial(_parse_one, comm_kernel=comm_kernel)
    for r in pool.map(one, files) if pool is not None and len(files) > 1 else map(one, files):
        results.append(compact(r, shared) if isinstance(r, RankTrace) else r)
        bar and bar.update()
        reporter.advance(len(results))
    if bar:
        bar.close()
    traces = [r for r in results if isinstance(r, RankTrace)]
    errors = [r for r in results if isinstance(r, str)]
    return traces, errors


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


def collect(
    options: CollectOptions,
    pool: Executor | None = None,
    reporter: Progress | None = None,
    warn: Callable[[str], None] = _warn,
) -> Collected:
    """The whole collection (the module docstring's steps); `warn` gets each skipped file's
    line as it is found. Raises CollectError."""
    reporter = reporter or Progress(None)
    try:
        inputs, attempt_notes = choose_attempt(options.inputs, options.attempt)
    except ValueError as exc:
        raise CollectError(str(exc)) from None
    dumps = find_dumps(inputs)  # once: telling a dump from a trace can mean opening the file
    try:
        dump_files = set(dumps)
        files = [f for f in find_trace_files(inputs, summaries=not options.from_traces) if f not in dump_files]
        if not files:
            raise InputError(f"no trace files under {', '.join(inputs)}, only Flight Recorder dumps")
        try:
            files, window = pick_window(files, options.window)
        except InputError as exc:  # a bad --window, not a run without traces
            raise CollectError(str(exc)) from None
        traces, errors = parse_all(
            files,
            pool,
            progress=options.progress and len(files) > 1,
            reporter=reporter,
            comm_kernel=options.comm_kernel,
        )
        from_summaries = sum(1 for f in files if is_summary(f))
        if options.comm_kernel is not None and from_summaries:
            errors.append(
                f"--comm-kernel: {from_summaries} rank(s) read from in-job summaries, which were parsed "
                "with the built-in communication kernels only; --from-traces to apply it to their traces"
            )
        for e in errors:
            warn(f"harness.collect: warning: skipped {e}")
        if not traces:
            raise InputError(f"none of the {len(files)} file(s) is a readable profiler trace (see the warnings above)")
        runset = group_ranks(traces, options.run)
        del traces  # the run set holds them now (and lets their intervals go once they are aligned)
    except CollectError:
        raise
    except InputError as exc:
        flight = _flight_only(options, inputs, dumps, attempt_notes, str(exc))
        if flight is not None:
            return flight
        raise CollectError(str(exc), memory_lines=_memory_only_lines(inputs)) from None
    runset.ending = [n for d in inputs if Path(d).is_dir() for n in ending_notes(Path(d))]
    runset.skipped_windows = [w for d in inputs if Path(d).is_dir() for w in skipped_windows(Path(d))]
    runset.warnings[:0] = (
        attempt_notes
        + runset.ending
        + [skipped_note(w) for w in runset.skipped_windows]
        + [f"skipped {e}" for e in errors]
        + ([window.note] if window.note else [])
    )
    reporter.stage("aligning clocks, matching collectives, finding stragglers")
    try:
        alignment = align_ranks(runset, align=options.align, steps=options.steps)
    except NoStepsError as exc:
        other = len(window.windows) > 1 and window.window is not None
        hint = f" (in profiler window {window.window}; --window N or all for the others)" if other else ""
        raise CollectError(f"{exc}{hint}") from None
    # the merged trace needs only the parsed ranks and the clock offsets: its rank jobs run on the
    # pool while this process goes on with the analysis and the report
    writing = _start_merged_trace(runset, alignment, options.merged, pool)
    # From here on the ranks as parsed (own clocks) are read only for their identity, paths and
    # steps: their intervals go, or every shifted rank's would be held twice (as parsed and aligned)
    runset.ranks = [t.without_intervals() for t in runset.ranks]
    dirs = [Path(d) for d in inputs if Path(d).is_dir()]
    logs = read_step_logs(dirs)
    runq = {r: log.runq for r, log in logs.ranks.items() if log.runq}
    gpu = {r: log.gpu for r, log in logs.ranks.items() if log.gpu}
    analysis = analyze_aligned(runset, alignment, options.thresholds, release=True, runq=runq, gpu=gpu)
    memory = analyze_memory(logs)
    analysis.warnings.extend(memory.warnings)
    report = build_report(analysis, inputs, memory, find_memory_timelines(dirs))
    attach(report, read_flight(dumps, inputs, options.unpickle_nccl_dumps, report.warnings))
    out = options.output or report_folder(inputs, files[0])
    reporter.stage("writing the merged trace")
    merged = None
    if writing is not None:
        out.mkdir(parents=True, exist_ok=True)
        merged = finish_merged(writing, analysis.waits, out)
    reporter.stage("writing the report")
    report.merged = merged_entry(merged) if merged else None
    report.watch = read_watch(dirs)
    report.window = window_entry(window, runset, report.watch, read_requested(dirs))
    attach_watch(report)
    write_report(report, out, collective_rows(analysis))
    write_view(report, build_timeline(analysis), out)
    write_scalars(report, out)
    return Collected(report=report, out=out, warnings=analysis.warnings, merged=merged, window=window)


def _start_merged_trace(
    runset: RunSet, alignment: Alignment, choice: MergedChoice, pool: Executor | None
) -> MergedWriting | None:
    """The merged trace `choice` asks for, started (None: not asked for, or no trace file left
    to copy from: only in-job summaries)."""
    window = merged_window_for(choice, runset.ranks) if _traces_present(runset) else None
    if window is None:
        return None
    return start_merged(runset.ranks, alignment.offsets, window, pool)


def _memory_only_lines(inputs: list[str]) -> list[str]:
    """With no trace to analyse (a --no-profile run), the step logs' memory findings still: for
    stdout, since there is no report to hold them."""
    memory = memory_from_dirs([Path(d) for d in inputs if Path(d).is_dir()])
    if not memory.ranks:
        return []
    lines = [f"memory (from the step logs of {len(memory.ranks)} rank(s); no trace, so no report):"]
    for f in memory.findings:
        lines += [f"memory: rank {f.rank} {f.kind}: {f.reason}", f"next: {finding_text(f)}"]
    if not memory.findings:
        lines.append("memory: no finding")
    return lines + [f"warning: {w}" for w in memory.warnings]


def read_flight(paths: list[Path], inputs: list[str], unpickle: bool, warnings: list[str]) -> FlightResult | None:
    """The Flight Recorder dumps found among the inputs (`paths`, flight.find_dumps) analysed
    (flight.analyze), None when there are none; files that cannot be read become `warnings`."""
    if not paths:
        return None
    dumps, problems = read_dumps(paths, unpickle=unpickle)
    warnings.extend(problems)
    if not dumps:
        return None
    run_dir = next((Path(d) for d in inputs if Path(d).is_dir()), None)
    if run_dir is not None and run_dir.name == FLIGHT_DIR:
        run_dir = run_dir.parent
    return analyze(dumps, run_dir=run_dir)


def _flight_only(
    options: CollectOptions, inputs: list[str], dumps: list[Path], notes: list[str], no_traces: str
) -> Collected | None:
    """A run with Flight Recorder dumps and no readable trace (a hung job whose profiler window
    was never exported, a --no-profile run, another job's dump folder): its report from the dumps
    alone. None when there are no dumps (the caller then says why nothing can be analysed);
    CollectError when every dump is unreadable."""
    if not dumps:
        return None
    warnings: list[str] = list(notes)
    result = read_flight(dumps, inputs, options.unpickle_nccl_dumps, warnings)
    if result is None:
        raise CollectError(f"no readable trace and no readable Flight Recorder dump: {warnings[-1]}")
    ending = [n for d in inputs if Path(d).is_dir() for n in ending_notes(Path(d))]
    warnings[:0] = ending + [f"no profiler trace ({no_traces}); the report comes from the Flight Recorder dumps alone"]
    report = flight_only(inputs, result, ending, warnings)
    out = options.output or report_folder(inputs, dumps[0])
    write_report(report, out)
    write_view(report, None, out)
    return Collected(report=report, out=out, warnings=warnings, flight_only=True)


def _traces_present(runset: RunSet) -> bool:
    return all(Path(p).is_file() for t in runset.ranks for p in t.paths)
