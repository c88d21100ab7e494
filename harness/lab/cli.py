"""`python -m harness.lab SWEEP [options] [-- harness.train flags]`.

Exit codes: 0 every runnable row measured; 1 some row failed (the others are still measured and
reported); 2 a bad option or a harness.train flag that no row would accept (nothing ran);
130 interrupted (the rows finished so far are written).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from tqdm import tqdm

from harness.atomic import write_text_atomic
from harness.lab.results import FAILED, OK, SKIPPED, RowResult, csv_text, derive, summary_markdown
from harness.lab.runner import run_name, run_row, train_args
from harness.lab.sweeps import SWEEPS, Host, Row, Sweep
from harness.oneline_argparse import OneLineArgumentParser
from harness.oneline_argparse import fail as exit_with
from harness.paths import DEFAULT_LOG_DIR, LAB_DIR, LAB_RUNS_DIR, LAB_SUMMARY, LAB_TIMINGS, lab_dir
from harness.run.settings import ConfigError
from harness.train.cli import parse_config

PROG = "harness.lab"
EXIT_FAILED_ROWS = 1
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG,
        description="Run a classic experiment matrix, one torchrun job per row; "
        "flags after -- go to every row's harness.train (and win over the sweep's own).",
    )
    p.add_argument("sweep", choices=sorted(SWEEPS), help="; ".join(f"{s.name}: {s.title}" for s in SWEEPS.values()))
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="ranks per row (default: 2, or 1 on a machine with one core/GPU; scaling sets its own)",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        default=Path(DEFAULT_LOG_DIR),
        help=f"root of the output (default: {DEFAULT_LOG_DIR}; the sweep goes to <log-dir>/{LAB_DIR}/)",
    )
    p.add_argument("--only", default=None, help="comma-separated row keys to run (see --list)")
    p.add_argument("--list", action="store_true", help="print the sweep's rows on this machine and exit")
    p.add_argument(
        "--profile",
        action="store_true",
        help="record torch.profiler traces in every row (default off: timings without profiler overhead)",
    )
    p.add_argument(
        "--row-timeout-s", type=float, default=1800.0, help="kill a row's job after this long (default 1800)"
    )
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def select_rows(sweep: Sweep, host: Host, nproc: int, only: str | None) -> list[Row]:
    rows = sweep.build(host, nproc)
    if only is None:
        return rows
    wanted = [k.strip() for k in only.split(",") if k.strip()]
    keys = [r.key for r in rows]
    unknown = [k for k in wanted if k not in keys]
    if unknown or not wanted:
        raise ValueError(
            f"--only: no row {', '.join(unknown) or '(empty)'} in sweep {sweep.name}; rows: {', '.join(keys)}"
        )
    return [r for r in rows if r.key in wanted]


def check_rows(rows: list[Row], extra: list[str], out: Path) -> None:
    """Every runnable row's full flag list must parse as a valid harness.train config, so a typo
    fails here, once, instead of in every job."""
    for i, row in enumerate(rows):
        if row.skip is None:
            parse_config(train_args(row, out, run_name(i, row), extra))


def new_sweep_dir(log_dir: Path, sweep: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = lab_dir(log_dir, sweep, stamp), 1
    while path.exists():
        n += 1
        path = lab_dir(log_dir, sweep, f"{stamp}-{n}")
    path.mkdir(parents=True)
    return path


def write_outputs(
    sweep: Sweep, results: list[RowResult], out: Path, context: dict[str, str], charts: bool
) -> list[str]:
    derive(results)
    write_text_atomic(out / LAB_TIMINGS, csv_text(sweep, results))
    names: list[str] = []
    if charts:
        from harness.lab.charts import draw  # matplotlib only once there is something to draw

        names = draw(sweep, results, out)
    write_text_atomic(out / LAB_SUMMARY, summary_markdown(sweep, results, context, names))
    return names


def main(argv: list[str] | None = None) -> None:
    own, extra = split_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    sweep = SWEEPS[args.sweep]

    def fail(message: str) -> NoReturn:
        exit_with(PROG, message)

    if args.nproc is not None and args.nproc < 1:
        fail(f"--nproc {args.nproc} must be >= 1")
    if args.row_timeout_s <= 0:
        fail("--row-timeout-s must be > 0")
    host = Host.detect()
    nproc = args.nproc or min(2, host.max_ranks)
    try:
        rows = select_rows(sweep, host, nproc, args.only)
    except ValueError as exc:
        fail(str(exc))
    if args.list:
        for r in rows:
            print(f"{r.key:24s} {r.nproc} rank(s)  {r.label}" + (f"  [skipped: {r.skip}]" if r.skip else ""))
        return
    row_flags = [*extra] if args.profile else ["--no-profile", *extra]
    try:
        check_rows(rows, row_flags, args.log_dir)
    except ConfigError as exc:
        fail(f"invalid harness.train flags: {exc}")
    try:
        out = new_sweep_dir(args.log_dir, sweep.name)
    except OSError as exc:
        fail(f"cannot create the sweep folder under {args.log_dir} ({exc.strerror}); pass a writable --log-dir")
    runs = out / LAB_RUNS_DIR
    runs.mkdir()
    import torch

    context = {
        "command": " ".join(["python -m harness.lab", *(sys.argv[1:] if argv is None else argv)]),
        "machine": f"{host.cores} CPU cores, {host.gpus} CUDA device(s), torch {torch.__version__}",
        "profiler": (
            "on (traces in each run folder)"
            if args.profile
            else "off (timings without its overhead; --profile to record traces)"
        ),
        "runs": f"{LAB_RUNS_DIR}/<NN-row>/ (harness run folders) and {LAB_RUNS_DIR}/<NN-row>.log",
    }
    results: list[RowResult] = []
    bar = tqdm(rows, desc=sweep.name, unit="row", file=sys.stderr, dynamic_ncols=True)
    try:
        for i, row in enumerate(bar):
            bar.set_postfix_str(row.label[:40])
            results.append(run_row(row, i, runs, row_flags, args.row_timeout_s))
            write_outputs(sweep, results, out, context, charts=False)  # each finished row is on disk at once
    except KeyboardInterrupt:
        bar.close()
        write_outputs(sweep, results, out, context, charts=True)
        print(
            f"{PROG}: interrupted after {len(results)} of {len(rows)} rows; written: {out / LAB_SUMMARY}",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_INTERRUPTED) from None
    bar.close()
    charts = write_outputs(sweep, results, out, context, charts=True)
    counts = {s: sum(r.status == s for r in results) for s in (OK, SKIPPED, FAILED)}
    print(f"{PROG}: {sweep.name}: {counts[OK]} measured, {counts[SKIPPED]} skipped, {counts[FAILED]} failed")
    for res in results:
        mean, thr = res.figures.get("mean_step_ms"), res.figures.get("throughput_samples_s")
        fig = f"{mean:.2f} ms/step, {thr:.1f} samples/s" if mean is not None and thr is not None else res.note
        print(f"  {res.row.label:48s} {res.status:8s} {fig}")
    print(f"timings: {out / LAB_TIMINGS}\nsummary: {out / LAB_SUMMARY}\ncharts:  {', '.join(charts) or 'none'}")
    if counts[FAILED]:
        print(f"{PROG}: {counts[FAILED]} row(s) failed; their logs are in {runs}", file=sys.stderr)
        raise SystemExit(EXIT_FAILED_ROWS)
