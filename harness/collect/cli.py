"""`python -m harness.collect RUN_DIR [MORE ...]` (also `harness-collect`).

Exit codes: 0 report written (a partial one too, with warnings saying what is missing);
2 nothing could be analysed (no such path, no traces, every trace unreadable, runs mixed)
or a bad option.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

from harness.collect.analysis import Alignment, NoStepsError, align_ranks, analyze_aligned
from harness.collect.discover import InputError, RunSet, find_trace_files, group_ranks
from harness.collect.flight import analyse, find_dumps, read_dumps
from harness.collect.hang_report import attach, flight_only
from harness.collect.memory import find_memory_timelines, finding_text, memory_from_dirs
from harness.collect.merged import (
    MERGED_BUDGET_BYTES,
    MergedChoice,
    MergedWriting,
    finish_merged,
    merged_entry,
    start_merged,
    window_for,
)
from harness.collect.model import RankTrace, Shared, compact
from harness.collect.parse import TraceError, parse_trace
from harness.collect.progress import Progress
from harness.collect.run_state import choose_attempt, ending_notes, skipped_note, skipped_windows
from harness.collect.stragglers import Thresholds
from harness.collect.summary import read_summary
from harness.collect.tb_scalars import write_scalars
from harness.collect.timeline import build_timeline
from harness.collect.watch_log import run_watch
from harness.collect.windows import pick_window, window_entry, window_line
from harness.oneline_argparse import EXIT_USAGE, OneLineArgumentParser, fail
from harness.paths import (
    COLLECTIVES_CSV,
    FLIGHT_DIR,
    MERGED_TRACE,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    STEPS_CSV,
    TIMELINE_JSON,
    is_summary,
    trace_of_summary,
)
from harness.report.console import console_table
from harness.report.document import build_report, collective_rows
from harness.report.files import write_report, write_view

PROG = "harness.collect"
EXIT_INPUT = EXIT_USAGE


def parse_steps(spec: str) -> set[int]:
    """'3-7', '5,6,9' or a mix ('1-3,8') -> a set of step numbers."""
    out: set[int] = set()
    try:
        for part in spec.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise ValueError
                out.update(range(int(lo), int(hi) + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid step list {spec!r}; use e.g. 3-7 or 5,6,9") from None
    return out


def parse_merged(spec: str) -> MergedChoice:
    """'auto', 'all', 'none' or a step list (see parse_steps)."""
    if spec in ("auto", "all", "none"):
        return MergedChoice(mode=spec)
    try:
        return MergedChoice(mode="steps", steps=frozenset(parse_steps(spec)))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"invalid --merged {spec!r}; "
                                         "use auto, all, none or steps such as 5-8") from None


def parse_window(spec: str) -> str:
    """'latest', 'all' or a window number (1, 2, ...)."""
    if spec in ("latest", "all") or (spec.isdigit() and int(spec) >= 1):
        return spec
    raise argparse.ArgumentTypeError(f"invalid --window {spec!r}; use latest, all or a window number such as 2")


def build_parser() -> argparse.ArgumentParser:
    th = Thresholds()
    p = OneLineArgumentParser(prog=PROG, description="Merge per-rank PyTorch profiler traces, align their clocks, find "
                                              "stragglers and communication/computation overlap gaps.")
    p.add_argument("inputs", nargs="+", help="run folders, trace files or globs (several folders: one per node)")
    p.add_argument("-o", "--output", type=Path, help="report folder (default: <first input folder>/report)")
    p.add_argument("--steps", type=parse_steps, help="steps to analyse, e.g. 3-7 or 5,6,9 (default: all)")
    p.add_argument("--no-align", action="store_true", help="do not align rank clocks")
    p.add_argument("--merged", type=parse_merged, default=MergedChoice(),
                   help=f"what {MERGED_TRACE} holds: auto (default: the consecutive steps around a typical step "
                        f"that fit {MERGED_BUDGET_BYTES // 10**6} MB of JSON, what a browser viewer opens), all, "
                        "none, or steps such as 5-8")
    p.add_argument("--no-merged", dest="merged", action="store_const", const=MergedChoice(mode="none"),
                   help="the same as --merged none")
    p.add_argument("--window", type=parse_window, default="latest",
                   help="profiler window to analyse: latest (default), all, or its number (the N in "
                        "<trace>.000N.pt.trace.json.gz): a run's windows, the scheduled ones and those the live watch "
                        "captured, are analysed one at a time")
    p.add_argument("--attempt", type=int, help="after torchrun restarts (--max-restarts), the attempt to analyse: "
                   "0 = the first, N = <run>/restart-N (default: the latest)")
    p.add_argument("--comm-kernel", type=_regex, metavar="REGEX",
                   help="GPU kernels whose names match REGEX (Python re.search) are communication too, beside the "
                        "built-in families (NCCL/RCCL, DeepEP, NVSHMEM, MSCCL++, custom all-reduce: "
                        "docs/collector.md); its first group, if any, names the collective; read from traces, not "
                        "in-job summaries")
    p.add_argument("--from-traces", action="store_true",
                   help="parse the traces even where an in-job summary (<trace>.summary.json) is next to them")
    p.add_argument("--min-lag-ms", type=float, default=th.min_lag_ms,
                   help="straggler: least cost per step, ms (default: no absolute floor)")
    p.add_argument("--rel-lag", type=float, default=th.rel_lag,
                   help="straggler: least cost per step as a share of the median step (GPU traces)")
    p.add_argument("--rel-lag-cpu", type=float, default=th.rel_lag_cpu,
                   help="the same for CPU-only traces, where ranks share cores and drift more")
    p.add_argument("-j", "--jobs", type=int, default=0, help="parallel parsers (default: one per core)")
    p.add_argument("--unpickle-nccl-dumps", action="store_true",
                   help="read NCCL watchdog dumps (pickles) among the Flight Recorder dumps; only for files you trust "
                        "(no class is loaded even then)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no table")
    p.add_argument("--progress-file", type=Path,
                   help="keep a JSON of the stage reached here (harness/collect/progress.py)")
    return p


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({exc})") from None


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


def parse_all(files: list[Path], pool: Executor | None, progress: bool, reporter: Progress | None = None,
              comm_kernel: re.Pattern[str] | None = None) -> tuple[list[RankTrace], list[str]]:
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
    for r in (pool.map(one, files) if pool is not None and len(files) > 1 else map(one, files)):
        results.append(compact(r, shared) if isinstance(r, RankTrace) else r)
        bar and bar.update()
        reporter.advance(len(results))
    if bar:
        bar.close()
    traces = [r for r in results if isinstance(r, RankTrace)]
    errors = [r for r in results if isinstance(r, str)]
    return traces, errors


def default_output(inputs: list[str], files: list[Path]) -> Path:
    first = Path(inputs[0])
    return (first if first.is_dir() else files[0].parent) / "report"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    jobs = args.jobs or os.cpu_count() or 1
    # One pool for parsing and for the merged trace, started while this process is still small
    # (workers are forked: they would otherwise each map the parent's analysis).
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    reporter = Progress(args.progress_file)
    ok, message = False, "stopped"
    try:
        message = collect(args, pool, reporter)
        ok = True
    except SystemExit as exc:
        message = f"exit {exc.code}: see the collector's error"
        raise
    finally:
        reporter.finish(ok, message)
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def collect(args: argparse.Namespace, pool: Executor | None, reporter: Progress) -> str:
    """The whole collection; returns the line naming the verdict."""
    try:
        try:
            inputs, attempt_notes = choose_attempt(args.inputs, args.attempt)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        dump_files = set(find_dumps(inputs))
        files = [f for f in find_trace_files(inputs, summaries=not args.from_traces) if f not in dump_files]
        if not files:
            raise InputError(f"no trace files under {', '.join(inputs)}, only Flight Recorder dumps")
        try:
            files, window = pick_window(files, args.window)
        except InputError as exc:  # a bad --window, not a run without traces
            fail(PROG, str(exc), code=EXIT_INPUT)
        traces, errors = parse_all(files, pool, progress=not args.quiet and len(files) > 1, reporter=reporter,
                                   comm_kernel=args.comm_kernel)
        from_summaries = sum(1 for f in files if is_summary(f))
        if args.comm_kernel is not None and from_summaries:
            errors.append(f"--comm-kernel: {from_summaries} rank(s) read from in-job summaries, which were parsed "
                          "with the built-in communication kernels only; --from-traces to apply it to their traces")
        for e in errors:
            print(f"{PROG}: warning: skipped {e}", file=sys.stderr)
        if not traces:
            raise InputError(f"none of the {len(files)} file(s) is a readable profiler trace (see the warnings above)")
        runset = group_ranks(traces)
        del traces  # the run set holds them now (and lets their intervals go once they are aligned)
    except InputError as exc:
        if flight_only_report(args, str(exc)):
            return "report from the Flight Recorder dumps alone"
        print_memory_only(args.inputs, args.attempt)  # on stdout: what the step logs still tell
        fail(PROG, str(exc), code=EXIT_INPUT)
    runset.ending = [n for d in inputs if Path(d).is_dir() for n in ending_notes(Path(d))]
    runset.skipped_windows = [w for d in inputs if Path(d).is_dir() for w in skipped_windows(Path(d))]
    runset.warnings[:0] = (attempt_notes + runset.ending + [skipped_note(w) for w in runset.skipped_windows]
                           + [f"skipped {e}" for e in errors] + ([window.note] if window.note else []))
    thresholds = Thresholds(min_lag_ms=args.min_lag_ms, rel_lag=args.rel_lag, rel_lag_cpu=args.rel_lag_cpu)
    reporter.stage("aligning clocks, matching collectives, finding stragglers")
    try:
        alignment = align_ranks(runset, align=not args.no_align, steps=args.steps)
    except NoStepsError as exc:
        other = len(window.windows) > 1 and window.window is not None
        hint = f" (in profiler window {window.window}; --window N or all for the others)" if other else ""
        fail(PROG, f"{exc}{hint}", code=EXIT_INPUT)
    # the merged trace needs only the parsed ranks and the clock offsets: its rank jobs run on the
    # pool while this process goes on with the analysis and the report
    writing = start_merged_trace(runset, alignment, args.merged, pool)
    # From here on the ranks as parsed (own clocks) are read only for their identity, paths and
    # steps: their intervals go, or every shifted rank's would be held twice (as parsed and aligned)
    runset.ranks = [t.without_intervals() for t in runset.ranks]
    analysis = analyze_aligned(runset, alignment, thresholds, release=True)
    dirs = [Path(d) for d in inputs if Path(d).is_dir()]
    memory = memory_from_dirs(dirs)
    analysis.warnings.extend(memory.warnings)
    doc = build_report(analysis, inputs, memory, find_memory_timelines(dirs))
    attach(doc, read_flight(inputs, args.unpickle_nccl_dumps, doc["warnings"]))
    out = args.output or default_output(inputs, files)
    reporter.stage("writing the merged trace")
    merged = None
    if writing is not None:
        out.mkdir(parents=True, exist_ok=True)
        merged = finish_merged(writing, analysis.waits, out)
    reporter.stage("writing the report")
    doc["merged"] = merged_entry(merged) if merged else None
    watch = run_watch(dirs)
    doc["window"] = window_entry(window, runset, watch)
    doc["watch"] = watch
    write_report(doc, out, collective_rows(analysis))
    write_view(doc, build_timeline(analysis), out)
    write_scalars(doc, out)

    if doc.get("hang") or doc.get("mismatches"):
        print(doc["headline"])  # first: the rest of the report is about a job that never finished
    if not args.quiet:
        print(console_table(doc))
        for w in analysis.warnings:
            print(f"warning: {w}")
    if doc["window"] and (len(doc["window"]["windows"]) > 1 or not args.quiet):
        print(f"window:  {window_line(doc['window'])}")
    print(f"\nverdict: {doc['headline']}")
    print(f"diagnosis: {doc['diagnosis_summary']}")
    for n in doc["next_steps"]:
        print(f"next: {n['text']}")
    print(f"report:  {out}/{REPORT_MD} (also {REPORT_HTML}, {REPORT_JSON}, {TIMELINE_JSON}, {STEPS_CSV}, "
          f"{COLLECTIVES_CSV}; TensorBoard scalars in {out}/tb/)")
    if merged:
        print(f"merged:  {merged.path} ({merged.gz_bytes / 1e6:.1f} MB, {merged.json_bytes / 1e6:.0f} MB of JSON): "
              f"{merged.window.note}")
    elif args.merged.mode != "none":
        print(f"no {MERGED_TRACE}: only the in-job summaries, not the traces, are here")
    return f"verdict: {doc['headline']}"


def start_merged_trace(runset: RunSet, alignment: Alignment, choice: MergedChoice,
                       pool: Executor | None) -> MergedWriting | None:
    """The merged trace `choice` asks for, started (None: not asked for, or no trace file left
    to copy from: only in-job summaries)."""
    window = window_for(choice, runset.ranks) if _traces_present(runset) else None
    if window is None:
        return None
    return start_merged(runset.ranks, alignment.offsets, window, pool)


def print_memory_only(inputs: list[str], attempt: int | None) -> None:
    """With no trace to analyse (a --no-profile run), the step logs' memory findings still: on
    stdout, since there is no report to hold them."""
    try:
        dirs = [Path(d) for d in choose_attempt(inputs, attempt)[0] if Path(d).is_dir()]
    except (ValueError, OSError):
        return
    memory = memory_from_dirs(dirs)
    if not memory.ranks:
        return
    print(f"memory (from the step logs of {len(memory.ranks)} rank(s); no trace, so no report):")
    for f in memory.findings:
        print(f"memory: rank {f['rank']} {f['kind']}: {f['reason']}")
        print(f"next: {finding_text(f)}")
    if not memory.findings:
        print("memory: no finding")
    for w in memory.warnings:
        print(f"warning: {w}")


def read_flight(inputs: list[str], unpickle: bool, warnings: list[str]) -> dict | None:
    """The Flight Recorder dumps among the inputs analysed (flight.analyse), None when there are
    none; files that cannot be read become `warnings`."""
    paths = find_dumps(inputs)
    if not paths:
        return None
    dumps, problems = read_dumps(paths, unpickle=unpickle)
    warnings.extend(problems)
    if not dumps:
        return None
    run_dir = next((Path(d) for d in inputs if Path(d).is_dir()), None)
    if run_dir is not None and run_dir.name == FLIGHT_DIR:
        run_dir = run_dir.parent
    return analyse(dumps, run_dir=run_dir)


def flight_only_report(args: argparse.Namespace, no_traces: str) -> bool:
    """A run with Flight Recorder dumps and no readable trace (a hung job whose profiler window
    was never exported, a --no-profile run, another job's dump folder): its report from the dumps
    alone. False when there are no dumps (the caller then says why nothing can be analysed);
    exit 2 when every dump is unreadable."""
    try:
        inputs, notes = choose_attempt(args.inputs, args.attempt)
    except ValueError:
        return False
    if not find_dumps(inputs):
        return False
    warnings: list[str] = list(notes)
    result = read_flight(inputs, args.unpickle_nccl_dumps, warnings)
    if result is None:
        fail(PROG, f"no readable trace and no readable Flight Recorder dump: {warnings[-1]}", code=EXIT_INPUT)
    ending = [n for d in inputs if Path(d).is_dir() for n in ending_notes(Path(d))]
    warnings[:0] = ending + [f"no profiler trace ({no_traces}); the report comes from the Flight Recorder dumps alone"]
    doc = flight_only(inputs, result, ending, warnings)
    first = Path(inputs[0])
    out = args.output or ((first.parent if first.name == FLIGHT_DIR else first) if first.is_dir()
                          else first.parent) / "report"
    write_report(doc, out)
    write_view(doc, None, out)
    print(doc["headline"])
    if not args.quiet:
        for w in warnings:
            print(f"warning: {w}")
    for n in doc["next_steps"]:
        print(f"next: {n['text']}")
    print(f"report:  {out}/{REPORT_MD} (also {REPORT_HTML}, {REPORT_JSON}; from Flight Recorder dumps only)")
    return True


def _traces_present(runset: RunSet) -> bool:
    return all(Path(p).is_file() for t in runset.ranks for p in t.paths)
