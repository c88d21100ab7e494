"""Detection you can quote: a fault-injection campaign that measures the straggler rules' recall,
false alarms, rank and phase localisation, the live watch's latency, and the hang and leak reports.

    python bench/detection.py --seed 7 --runs 40 --json detection.json        # ~15 min on 2 cores
    python bench/detection.py --seed 7 --runs 0 --generated 2000              # generated traces only
    python bench/detection.py --seed 7 --runs 0 --generated 20 --generated-ranks 1024
    python bench/detection.py --smoke                                         # 1 real + 1 generated case

Two campaigns, scored alike (detect/score.py):
- real (detect/real.py): `--runs` torchrun jobs of the lab on this machine (CPU, gloo), each
  configuration's clean run first (a false-alarm case that sizes the injections), then drawn
  faults: stragglers (sleep or compute, any phase, 5-100% of the clean step, persistent or every
  k-th step, mid-run onset, one or two ranks), hangs and leaks; about one configuration in five
  is two torchrun agents on loopback with a host name each, about one in six the 4-rank
  pipeline of examples/pipeline_parallel.py (`--parallels`; its stragglers sleep or compute in
  forward or backward);
- generated (detect/sim.py): `--generated` GPU-shaped jobs from the device-queue simulator at
  8 to 1024 ranks (`--generated-ranks` fixes the count), with per-kernel jitter and per-host clock
  skew, whose truth is exact (each case simulated with and without its injection); each case's
  job is also run 25 steps long for the live watch (detect/gpu_watch.py: the step timings
  timing.py would record on each GPU, judged every 5 steps as the watch does).
Everything is drawn from `--seed`: the same seed gives the same cases.

Output: a table per case kind and the summary on stdout; with `--json FILE`, `{recall,
false_alarms, clean_runs, rank_right, phase_right, watch_latency_steps_median, hang_right,
leak_right, ..., cases: [...]}` over the real runs and the same keys under "generated".
Figures and their command: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from detect import real
from detect import sim as gen
from detect.real import WATCH_EVERY
from detect.score import MATERIAL_SHARE, summarize, summarize_watch

# One configuration in this many is two torchrun agents with a host name each.
TWO_HOST_EVERY = 5
# Injected cases per configuration after its clean run (a new configuration's clean run costs a
# job too; a few cases share it).
CASES_PER_CONFIG = 4


def real_campaign(
    seed: int,
    runs: int,
    work: Path,
    say: Any,
    keep: bool = False,
    window_steps: int = real.WINDOW_STEPS,
    windows: int = 1,
    parallels: tuple[str, ...] = real.PARALLELS,
) -> list[dict[str, Any]]:
    """`runs` real jobs of `parallels`: per configuration its clean run, then up to
    CASES_PER_CONFIG faults; the clean and straggler jobs record `windows` profiler windows,
    judged across them."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    n_cfg = 0
    while len(rows) < runs:
        cfg = real.draw_config(rng, two_hosts=n_cfg % TWO_HOST_EVERY == TWO_HOST_EVERY - 1, parallels=parallels)
        n_cfg += 1
        name = f"c{n_cfg:03d}-clean"
        row, clean_ms = real.run_case(cfg, real.Fault(kind="clean"), None, work, name, keep, window_steps, windows)
        rows.append(row)
        say(_line(row))
        if clean_ms is None:
            continue
        for k in range(min(CASES_PER_CONFIG, runs - len(rows))):
            fault = real.draw_fault(rng, cfg)
            name = f"c{n_cfg:03d}-{k}-{fault.kind}"
            row, _ = real.run_case(cfg, fault, clean_ms, work, name, keep, window_steps, windows)
            rows.append(row)
            say(_line(row))
    return rows


def generated_campaign(
    seed: int, n: int, ranks: int | None, work: Path, say: Any, jobs: int = 1, shapes: tuple[str, ...] = gen.SHAPES
) -> list[dict[str, Any]]:
    """`n` generated cases of the parallelisms `shapes`, drawn in order from `seed`, each simulated
    with its own noise seed, so that the rows are the same whatever `jobs` (worker processes)
    runs them."""
    rng = random.Random(seed)
    cases = [gen.draw_case(rng, ranks, shapes) for _ in range(n)]
    seeds = [seed * 100_003 + i for i in range(n)]
    rows = []
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            # spawn, not fork: the parent has imported torch, whose thread pools do not survive a fork
            pool = stack.enter_context(ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")))
            done = pool.map(gen.run_case, cases, seeds, [work] * n)
        else:
            done = map(gen.run_case, cases, seeds, [work] * n)
        for row in done:
            rows.append(row)
            if ranks and ranks >= 256:
                say(_line(row))
    return rows


# A generated case's peak memory per rank, rounded up (bench/RESULTS.md, "Detection"): what each
# worker may need at the campaign's largest rank count.
CASE_BYTES_PER_RANK = 4 << 20


def default_jobs(max_ranks: int) -> int:
    """Worker processes for the generated campaign: one per usable core, as many as the
    available memory holds at CASE_BYTES_PER_RANK x `max_ranks` each (at least one)."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 1
    return max(1, min(cores, avail_kb * 1024 // (CASE_BYTES_PER_RANK * max_ranks)))


def _line(row: dict[str, Any]) -> str:
    t, o, s = row["truth"], row["outcome"], row["seen"]
    what = row.get("label") or f"{row['ranks']} ranks"
    if t["kind"] == "straggler":
        truth = f"{t['kind']} {t['ranks']} {t['phase']} cost {t['cost_share']:.0%}"
    else:
        truth = f"{t['kind']} {t['ranks'] or ''}".strip()
    mark = "ok" if _right(row) else "MISS"
    got = row["error"] or f"{s['verdict']} {s['stragglers'] or ''}".strip()
    latency = o["watch_latency_steps"] if "watch" not in row else row["watch"]["latency_steps"]
    return f"  {mark:4} {what:24} {truth:44} -> {got}" + (f" (watch +{latency} steps)" if latency is not None else "")


def _right(row: dict[str, Any]) -> bool:
    t, o = row["truth"], row["outcome"]
    if t["kind"] == "clean":
        return not o["false_alarm"] and not row["error"]
    if t["kind"] == "hang":
        return bool(o["hang_right"])
    if t["kind"] == "leak":
        return bool(o["leak_right"])
    return o["phase_right"] if o["material"] else not (o["found"] and not o["rank_right"])


def case_kind(row: dict[str, Any]) -> str:
    t = row["truth"]
    if t["kind"] != "straggler":
        return t["kind"]
    kind = row.get("fault", {}).get("kind") or row.get("kind")
    every = row.get("fault", {}).get("every") or row.get("every")
    size = "material" if row["outcome"]["material"] else "below material"
    return f"straggler {kind}, {'persistent' if every == 1 else 'intermittent'}, {size}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per case kind: cases, and of them found / rank right / phase right / right."""
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_kind[case_kind(r)].append(r)
    out = [f"  {'case kind':52} {'cases':>5} {'found':>6} {'rank':>6} {'phase':>6} {'right':>6}"]
    for kind in sorted(by_kind):
        group = by_kind[kind]
        found = sum(r["outcome"]["found"] for r in group)
        out.append(
            f"  {kind:52} {len(group):5d} {found:6d} {sum(r['outcome']['rank_right'] for r in group):6d} "
            f"{sum(r['outcome']['phase_right'] for r in group):6d} {sum(_right(r) for r in group):6d}"
        )
    return out


def watch_table(rows: list[dict[str, Any]]) -> list[str]:
    """The watch's run of each generated case, one line per injection and phase: material cases
    and of them flagged (on the injected rank), and the cases below material it flagged."""
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        w = r.get("watch")
        if w and w["truth"]["kind"] == "straggler":
            by_kind[f"{r['kind']} in {w['truth']['phase']}, {w.get('parallel', 'ddp')}"].append(w)
    out = [f"  {'watch: injected':52} {'material':>8} {'flagged':>8} {'below':>6} {'flagged':>8}"]
    for kind in sorted(by_kind):
        big = [w for w in by_kind[kind] if w["material"]]
        small = [w for w in by_kind[kind] if not w["material"]]
        out.append(
            f"  {kind:52} {len(big):8d} {sum(w['latency_steps'] is not None for w in big):8d} "
            f"{len(small):6d} {sum(w['latency_steps'] is not None for w in small):8d}"
        )
    return out


def shape_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The generated cases per parallelism: material stragglers found, and of them with the rank
    and the phase right; clean jobs with a false alarm; the watch's material cases flagged
    within two intervals of the onset."""
    out = []
    for shape in gen.SHAPES:
        group = [r for r in rows if r.get("parallel") == shape]
        if not group:
            continue
        material = [r for r in group if r["outcome"]["material"]]
        clean = [r for r in group if r["truth"]["kind"] == "clean"]
        watched = [r["watch"] for r in group if r["watch"]["material"]]
        soon = sum(w["latency_steps"] is not None and w["latency_steps"] <= 2 * WATCH_EVERY for w in watched)
        out.append(
            f"  {shape:5} {len(group):5d} cases: found {sum(r['outcome']['found'] for r in material)} of "
            f"{len(material)} material, rank right {sum(r['outcome']['rank_right'] for r in material)}, phase right "
            f"{sum(r['outcome']['phase_right'] for r in material)}; false alarms "
            f"{sum(r['outcome']['false_alarm'] for r in clean)} of {len(clean)} clean; watch within two "
            f"intervals {soon} of {len(watched)} material"
        )
    return out


def summary_lines(name: str, s: dict[str, Any]) -> list[str]:
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    lines = [
        f"{name}: recall {pct(s['recall'])} of {s['material_cases']} material stragglers (cost >= "
        f"{MATERIAL_SHARE:.0%} of the clean step); below that {pct(s['below_material_recall'])} of "
        f"{s['below_material_cases']}"
        + (
            f"; by the traced window alone {pct(s['recall_trace_alone'])}, false alarms {s['false_alarms_trace_alone']}"
            if s.get("recall_trace_alone") is not None and s["recall_trace_alone"] != s["recall"]
            else ""
        ),
        f"{name}: false alarms {s['false_alarms']} of {s['clean_runs']} clean runs; rank right "
        f"{pct(s['rank_right'])}, phase right {pct(s['phase_right'])} of the found",
        f"{name}: watch latency median {s['watch_latency_steps_median']} steps after onset "
        f"(missed {s['watch_missed']}, false alarms {s['watch_false_alarms']}); hangs right "
        f"{pct(s['hang_right'])} of {s['hang_cases']}, leaks right {pct(s['leak_right'])} of {s['leak_cases']}; "
        f"errors {s['errors']}",
    ]
    if s.get("watch_material_cases") or s.get("watch_clean_runs"):  # generated: the watch's own runs
        lines[-1] = (
            f"{name}: watch flagged {pct(s['watch_recall'])} of {s['watch_material_cases']} material stragglers "
            f"({s['watch_unjudged']} missed judged no step after the onset: a host ahead of its GPU), "
            f"latency median {s['watch_latency_steps_median']} steps after onset, phase right "
            f"{pct(s.get('watch_phase_right'))} of the flagged; false alarms "
            f"{s['watch_false_alarms']} of {s['watch_clean_runs']} clean runs; an innocent rank flagged beside "
            f"in {s['watch_innocent_flagged']}"
        )
    if s.get("misses"):
        lines.insert(
            1,
            f"{name}: of the {s['misses']} missed, the report said one of that size passes for noise there in "
            f"{s['misses_disclosed']}, and named its rank the latest in {s['misses_latest_right']}",
        )
    if s.get("material_above_noise"):  # real runs: each configuration's clean run sets its noise floor
        lines.insert(
            1,
            f"{name}: of them above the bound their configuration's clean run was judged against: recall "
            f"{pct(s['recall_above_noise'])} of {s['material_above_noise']}",
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1, help="draws every case (default 1)")
    p.add_argument("--runs", type=int, default=40, help="real torchrun jobs (default 40, ~15 min on 2 cores)")
    p.add_argument("--generated", type=int, default=1000, help="generated GPU-shaped cases (default 1000)")
    p.add_argument("--generated-ranks", type=int, default=None, help="every generated case's ranks (default: drawn)")
    p.add_argument(
        "--shapes",
        default=",".join(gen.SHAPES),
        help="the generated jobs' parallelisms, comma-separated (default all: ddp,fsdp,tp,hsdp,ep,pp; "
        "ddp,fsdp,tp,hsdp,ep draws what a seed drew before pp was added, ddp,fsdp,tp,hsdp before ep, "
        "ddp,fsdp,tp before hsdp, ddp,fsdp before tp)",
    )
    p.add_argument(
        "--parallels",
        default=",".join(real.PARALLELS),
        help="the real jobs' parallelisms, comma-separated (default ddp,fsdp,pp; ddp,fsdp draws what a seed "
        "drew before pp was added)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures and every case here")
    p.add_argument("--work", type=Path, default=None, help="where the jobs write (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep every real run's folder under --work (to re-collect them)")
    p.add_argument(
        "--window-steps",
        type=int,
        default=real.WINDOW_STEPS,
        help=f"steps each real run's profiler window records, from step 11 (default {real.WINDOW_STEPS}; "
        "the harness's default is 3)",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=1,
        help="profiler windows each clean and straggler run records, judged across them with the "
        "collector's --window each (default 1: one window, its own verdict)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes for the generated cases (default: one per core, as many as memory holds; "
        "the figures do not depend on it)",
    )
    p.add_argument("--smoke", action="store_true", help="one real and one generated case (CI)")
    p.add_argument("-q", "--quiet", action="store_true", help="no line per real case")
    args = p.parse_args(argv)
    for name in ("runs", "generated"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be >= 0")
    if args.generated_ranks is not None and args.generated_ranks < 2:
        p.error("--generated-ranks must be >= 2")
    if args.jobs is not None and args.jobs < 1:
        p.error("--jobs must be >= 1")
    if not 1 <= args.window_steps <= real.STEPS - 11:
        p.error(f"--window-steps must be 1 to {real.STEPS - 11} (the runs are {real.STEPS} steps, traced from step 11)")
    if not 1 <= args.windows <= 5:
        p.error("--windows must be 1 to 5")
    shapes = tuple(x.strip() for x in args.shapes.split(",") if x.strip())
    if not shapes or any(x not in gen.SHAPES for x in shapes):
        p.error(f"--shapes must be some of {','.join(gen.SHAPES)}, comma-separated (got {args.shapes!r})")
    parallels = tuple(x.strip() for x in args.parallels.split(",") if x.strip())
    if not parallels or any(x not in real.PARALLELS for x in parallels):
        p.error(f"--parallels must be some of {','.join(real.PARALLELS)}, comma-separated (got {args.parallels!r})")
    runs, generated = (1, 1) if args.smoke else (args.runs, args.generated)
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    work = args.work or Path(tempfile.mkdtemp(prefix="detection-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"seed": args.seed, "window_steps": args.window_steps, "windows": args.windows}
    t0 = time.perf_counter()
    real_rows = (
        real_campaign(args.seed, runs, work, say, args.keep, args.window_steps, args.windows, parallels) if runs else []
    )
    real_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    jobs = args.jobs or min(default_jobs(args.generated_ranks or max(gen.RANK_CHOICES)), max(generated, 1))
    gen_rows = (
        generated_campaign(args.seed, generated, args.generated_ranks, work, say, jobs, shapes) if generated else []
    )
    gen_s = time.perf_counter() - t0
    if real_rows:
        print(f"real runs ({len(real_rows)} cases, {real_s:.0f} s):")
        print("\n".join(table(real_rows)))
        result.update(summarize(real_rows), seconds=round(real_s, 1), cases=real_rows)
        print("\n".join(summary_lines("real", result)))
    if gen_rows:
        ranks = sorted({r["ranks"] for r in gen_rows})
        print(f"generated ({len(gen_rows)} cases at {ranks[0]}-{ranks[-1]} ranks, {gen_s:.0f} s, {jobs} jobs):")
        print("\n".join(table(gen_rows)))
        g = {**summarize(gen_rows), **summarize_watch(gen_rows)}
        result["generated"] = {
            **g,
            "seconds": round(gen_s, 1),
            "jobs": jobs,
            "ranks": ranks,
            "shapes": list(shapes),
            "cases": gen_rows,
        }
        print("\n".join(summary_lines("generated", g)))
        print("\n".join(shape_lines(gen_rows)))
        print("\n".join(watch_table(gen_rows)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
