"""Our collector against Holistic Trace Analysis and its successor, side by side, per trace shape.

    python bench/collector_vs_hta.py --anchor hta=/venvs/hta/bin/python --anchor traceinsight=/venvs/ti/bin/python \
        --shape dlrm --shape long-args                  # 8 ranks x 90 MB of each shape
    python bench/collector_vs_hta.py --profile --no-compare --shape long-args  # where our time goes
    python bench/collector_vs_hta.py --scale 8,16,32,64 --scale-mb 20   # ours only: ranks vs seconds
    python bench/collector_vs_hta.py --no-compare --stream-mb 2000     # ours only: one 2 GB trace
    python bench/collector_vs_hta.py --no-compare --layouts            # ours only: key order, Kineto's vs events first
    python bench/collector_vs_hta.py --no-compare --summaries 10,20,85 # ours only: in-job summaries
    python bench/collector_vs_hta.py --no-compare --summary-ranks 1024 # ours only: a 1024-rank job's summaries
    python bench/collector_vs_hta.py --no-compare --summary-ranks 1024 --summary-steps 10  # ... of 10 steps

Shapes (`--shape`, repeatable): `dlrm` replicates the real DLRM traces in tests/data/traces (GPU
kernels, NCCL, short args); `long-args` replicates a harness run made with `--record-shapes
--with-stack` (every cpu_op carries shapes, strides and concrete inputs: about half the bytes
are args), made once under --work; `tp` a generated tensor-parallel job (`tp_source`: 80 all-reduces a
step, 25 steps, host ops with recorded shapes); `--source DIR` adds any other folder of per-rank traces.

Each tool runs as its own process, in rotated order every repetition; wall time is the
process's, peak memory the largest sum of RSS over the process and all its children, sampled
every 20 ms. Ours is the default command a user types, `python -m harness.collect DIR` (parse,
align, overlap, stragglers, advisor, every report file and the merged trace); an anchor's is
`TraceAnalysis(trace_dir=DIR)` then `get_comm_comp_overlap()`, run by the interpreter given with
`--anchor NAME=PYTHON` (HolisticTraceAnalysis 0.5.0 and traceinsight 0.6.1, which installs the
same `hta` package, each in its own venv: neither is a harness dependency). Without --anchor,
this interpreter is the one anchor, `hta`. Both report, per rank, the share of communication
time overlapped by computation; the script prints the largest difference in percentage points
(CPU-only traces have no kernels: the anchors say NaN there and are not compared).

Large sets repeat each source rank's events with shifted times, step numbers and correlation ids
(so kernel-launch links stay unique); rank r of a bigger world copies source rank r mod the
source's ranks. They are cached under --work (uncompressed JSON). Tiny sizes (`--rank-mb 0.05
--reps 1`) make a smoke run of a few seconds (tests/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "data" / "traces" / "dlrm_8rank_v100"
SHIFTED_ARGS = ("correlation", "External id", "Ev Idx")

HTA_SCRIPT = """
import json, math, sys
from hta.trace_analysis import TraceAnalysis
df = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)
json.dump({int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"]) if not math.isnan(float(p))},
          open(sys.argv[2], "w"))
"""
TARGET_SPEED, TARGET_MEMORY = 15.0, 1 / 6  # issue 14: the faster anchor's wall / ours, ours / its peak memory
LONG_ARGS_RUN = ["--mode", "torch", "--record-shapes", "--with-stack", "--steps", "20", "--batch-size", "16"]


def load(path: Path) -> dict[str, Any]:
    import gzip

    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def replicate(doc: dict[str, Any], copies: int, rank: int, world_size: int) -> dict[str, Any]:
    """`copies` back-to-back repetitions of the trace's timed events (metadata events once)."""
    events = doc["traceEvents"]
    timed = [e for e in events if isinstance(e, dict) and e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    meta = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t0 + 1000.0
    top_id = 1 + max(
        (e.get("args", {}).get(k, 0) for e in timed for k in SHIFTED_ARGS if isinstance(e.get("args", {}).get(k), int)),
        default=0,
    )
    top_flow = 1 + max((e["id"] for e in timed if isinstance(e.get("id"), int)), default=0)
    numbers = [int(e["name"].split("#")[1]) for e in timed if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_span = (max(numbers) - min(numbers) + 1) if numbers else 1  # copies get step numbers of their own
    out = list(meta)
    for k in range(copies):
        for e in timed:
            c = dict(e)
            c["ts"] = e["ts"] + k * span
            name = c.get("name", "")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * step_span}"
            if isinstance(c.get("args"), dict) and k:
                c["args"] = {
                    a: (v + k * top_id if a in SHIFTED_ARGS and isinstance(v, int) else v) for a, v in c["args"].items()
                }
            if isinstance(c.get("id"), int) and k:
                c["id"] = c["id"] + k * top_flow
            out.append(c)
    info = dict(doc.get("distributedInfo") or {})
    info.update(rank=rank, world_size=world_size)
    return {**{k: v for k, v in doc.items() if k != "traceEvents"}, "distributedInfo": info, "traceEvents": out}


def source_traces(source: Path) -> list[Path]:
    """The per-rank traces of a source set (gzip or not); SystemExit when it has none."""
    found = sorted(p for p in source.glob("*.json*") if p.name.endswith((".json", ".json.gz")))
    if not found:
        raise SystemExit(f"no traces (*.json, *.json.gz) in {source}: pass --source DIR")
    return found


def make_set(work: Path, ranks: int, rank_mb: float, source: Path = SOURCE, events_first: bool = False) -> Path:
    """`ranks` files of about `rank_mb` MB each (uncompressed JSON), cached by source and size.
    `events_first`: the same documents with traceEvents as the first top-level key (what a
    script re-exporting a trace with json.dump of its own dict writes), not the last (Kineto's)."""
    base = "dlrm" if source == SOURCE else source.name
    folder = work / f"{base}-{ranks}r-{rank_mb:g}mb{'-events-first' if events_first else ''}"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    sources = source_traces(source)
    for r in range(ranks):
        doc = load(sources[r % len(sources)])
        one = len(json.dumps(doc["traceEvents"]))
        copies = max(1, round(rank_mb * 1e6 / one))
        out = replicate(doc, copies, r, ranks)
        if events_first:
            out = {"traceEvents": out.pop("traceEvents"), **out}
        text = json.dumps(out)
        (folder / f"rank{r}.pt.trace.json").write_text(text)
        print(f"  made {folder.name}/rank{r}: {len(text) / 1e6:.0f} MB ({copies} copies)", file=sys.stderr)
    done.touch()
    return folder


def measured(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and the peak RSS (bytes) of the process tree, sampled every 20 ms."""
    peak = 0
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        try:
            root = psutil.Process(proc.pid)
            while not stop.is_set():
                total = 0
                for p in [root, *root.children(recursive=True)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                peak = max(peak, total)
                time.sleep(0.02)
        except psutil.Error:
            pass

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    stop.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return wall, peak


def ours_cmd(folder: Path, out: Path) -> list[str]:
    """The analysis alone (report files, no merged trace): what the scaling curves time."""
    return [sys.executable, "-m", "harness.collect", str(folder), "-q", "--no-merged", "-o", str(out)]


def default_cmd(folder: Path, out: Path) -> list[str]:
    """The command a user types: every report file, the merged trace included."""
    return [sys.executable, "-m", "harness.collect", str(folder), "-o", str(out)]


def our_overlap(out: Path) -> dict[int, float]:
    doc = json.loads((out / "report.json").read_text())
    return {r["rank"]: 100 * r["overlapped_comm_ms"] / r["comm_ms"] for r in doc["ranks"] if r["comm_ms"]}


def compare(folder: Path, reps: int, anchors: dict[str, str]) -> dict[str, Any]:
    """Median wall and peak RSS of ours and each anchor over `reps` rotated rounds."""
    tmp = Path(tempfile.mkdtemp(prefix="cvh-"))
    tools = ["ours", *anchors]
    runs: dict[str, list[tuple[float, int]]] = {t: [] for t in tools}
    for rep in range(reps):
        for tool in tools[rep % len(tools) :] + tools[: rep % len(tools)]:
            if tool == "ours":
                runs[tool].append(measured(default_cmd(folder, tmp / "report")))
            else:
                runs[tool].append(measured([anchors[tool], "-c", HTA_SCRIPT, str(folder), str(tmp / f"{tool}.json")]))
    ours_ov = our_overlap(tmp / "report")
    diffs = {}
    for tool in anchors:
        theirs = {int(k): v for k, v in json.loads((tmp / f"{tool}.json").read_text()).items()}
        diffs[tool] = max((abs(ours_ov.get(r, 0.0) - v) for r, v in theirs.items()), default=None)
    merged = json.loads((tmp / "report" / "report.json").read_text()).get("merged") or {}
    size = sum(p.stat().st_size for p in folder.glob("*.json*")) / 1e6
    med = {k: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) for k, v in runs.items()}
    walls = {k: [w for w, _ in v] for k, v in runs.items()}  # in the order run
    return {"set": folder.name, "mb": size, "med": med, "walls": walls, "overlap_diff_pp": diffs, "merged": merged}


def print_comparison(rows: list[dict[str, Any]], anchors: dict[str, str], decode_mb_s: float) -> None:
    """One line per set and tool, then the ratios against the faster anchor and the throughput."""
    print(f"{'set':28} {'MB':>6} {'tool':>13} {'wall s':>8} {'peak MB':>8} {'overlap diff pp':>16}  each run's wall s")
    for r in rows:
        for tool, (wall, peak) in r["med"].items():
            diff = r["overlap_diff_pp"].get(tool)
            print(
                f"{r['set']:28} {r['mb']:>6.0f} {tool:>13} {wall:>8.2f} {peak / 1e6:>8.0f} "
                f"{'-' if diff is None else f'{diff:.2f}':>16}  {' '.join(f'{w:.2f}' for w in r['walls'][tool])}"
            )
    print(
        f"\n{'set':28} {'faster anchor':>13} {'speed x':>8} {'memory x':>9} {'ours MB/s':>10} "
        f"{'of decoder limit':>17} {'merged MB (JSON)':>17}"
    )
    for r in rows:
        fastest = min(anchors, key=lambda t: r["med"][t][0])
        wall, peak = r["med"]["ours"]
        speed, memory = r["med"][fastest][0] / wall, r["med"][fastest][1] / peak
        ok = "meets" if speed >= TARGET_SPEED and memory >= 1 / TARGET_MEMORY else "short of"
        merged = r["merged"]
        print(
            f"{r['set']:28} {fastest:>13} {speed:>8.1f} {memory:>9.1f} {r['mb'] / wall:>10.0f} "
            f"{r['mb'] / wall / decode_mb_s:>16.0%} "
            f"{(merged.get('gz_bytes', 0) / 1e6):>6.1f} ({merged.get('json_bytes', 0) / 1e6:.0f})   {ok} the target"
        )
    print(
        f"targets: >= {TARGET_SPEED:g}x faster and >= {1 / TARGET_MEMORY:g}x less peak memory "
        "than the faster anchor; "
        f"decoder limit: msgspec alone, {decode_mb_s:.0f} MB/s on {psutil.cpu_count()} cores"
    )


def decoder_limit(folder: Path) -> float:
    """MB/s of msgspec decoding one rank's trace into the collector's event structs, times the
    cores: what the parse could reach if it did nothing but decode."""
    from harness.traces.read.decode import _DECODER

    raw = next(iter(sorted(folder.glob("*.json")))).read_bytes()
    best = min(_time(lambda: _DECODER.decode(raw)) for _ in range(3))
    return len(raw) / 1e6 / best * (psutil.cpu_count() or 1)


def _time(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def profile(folder: Path) -> None:
    """Where the default command's time goes: the command itself, run once, with the stage
    timings it writes to its --progress-file; the rest of its wall time is start-up and finding
    the traces."""
    tmp = Path(tempfile.mkdtemp(prefix="cvh-prof-"))
    wall, _ = measured(default_cmd(folder, tmp / "report") + ["--progress-file", str(tmp / "progress.json")])
    stages = [(name, seconds) for name, seconds in json.loads((tmp / "progress.json").read_text())["stages_s"]]
    stages.append(("start-up, finding traces", max(wall - sum(d for _, d in stages), 0.0)))
    print(f"\nprofile of {folder.name} (the default command, {wall:.2f} s wall):")
    for name, d in stages:
        print(f"  {name:58} {d:>7.2f} s {d / wall:>5.0%}")


def scale(work: Path, sizes: list[int], rank_mb: float, reps: int, source: Path = SOURCE) -> None:
    print(f"\nscale: ours only, {rank_mb:g} MB per rank, median of {reps}, {psutil.cpu_count()} cores")
    print(f"{'ranks':>6} {'seconds':>9} {'s/rank':>8} {'peak MB':>9}")
    for n in sizes:
        folder = make_set(work, n, rank_mb, source)
        tmp = Path(tempfile.mkdtemp(prefix="cvh-scale-"))
        got = [measured(ours_cmd(folder, tmp / "report")) for _ in range(reps)]
        wall = statistics.median(w for w, _ in got)
        print(f"{n:>6} {wall:>9.2f} {wall / n:>8.3f} {statistics.median(m for _, m in got) / 1e6:>9.0f}")


LAYOUT_TARGET = 1.10  # issue 35: the events-first layout within 10% of Kineto's


def layouts(work: Path, ranks: int, rank_mb: float, reps: int, source: Path = SOURCE) -> None:
    """Ours only: the default command on the same set in Kineto's key order and with traceEvents
    first, median of `reps` rounds in alternating order; the ratio and whether both streamed."""
    sets = {
        "kineto": make_set(work, ranks, rank_mb, source),
        "events first": make_set(work, ranks, rank_mb, source, events_first=True),
    }
    tmp = Path(tempfile.mkdtemp(prefix="cvh-layout-"))
    got: dict[str, list[tuple[float, int]]] = {k: [] for k in sets}
    for rep in range(reps):
        for name in list(sets)[rep % 2 :] + list(sets)[: rep % 2]:
            got[name].append(measured(default_cmd(sets[name], tmp / name)))
    print(f"\nlayouts: ours only, {ranks} ranks x {rank_mb:g} MB, median of {reps} alternating runs")
    print(f"{'layout':14} {'wall s':>8} {'peak MB':>8} {'decoded whole':>14}")
    wall = {}
    for name, runs in got.items():
        wall[name] = statistics.median(w for w, _ in runs)
        notes = json.loads((tmp / name / "report.json").read_text()).get("warnings", [])
        whole = sum("decoded whole" in str(n) for n in notes)
        print(f"{name:14} {wall[name]:>8.2f} {statistics.median(m for _, m in runs) / 1e6:>8.0f} {whole:>14}")
    ratio = wall["events first"] / wall["kineto"]
    print(f"events first / kineto: {ratio:.2f} ({'within' if ratio <= LAYOUT_TARGET else 'beyond'} the 10% target)")


def one_big_trace(work: Path, rank_mb: float, source: Path = SOURCE) -> None:
    folder = make_set(work, 1, rank_mb, source)
    size = sum(p.stat().st_size for p in folder.glob("*.json")) / 1e6
    wall, peak = measured(ours_cmd(folder, Path(tempfile.mkdtemp(prefix="cvh-big-")) / "report"))
    print(
        f"\none trace of {size:.0f} MB (uncompressed): ours {wall:.1f} s, peak RSS {peak / 1e6:.0f} MB "
        f"(target < 1000 MB)"
    )


def summaries(work: Path, ranks: int, sizes_mb: list[float], reps: int, source: Path = SOURCE) -> None:
    """In-job summaries: per rank, condensing its trace (what each rank does at the end of a
    window, all ranks at once in a real job); then the collector over the summaries against
    the collector over the traces. The summaries go into a folder of links to the cached traces,
    so the cached sets stay trace-only."""
    print(f"\nin-job summaries: ours only, {ranks} ranks, median of {reps}, {psutil.cpu_count()} cores")
    print(
        f"{'MB/rank':>8} {'condense s/rank':>16} {'summary MB/rank':>16} {'from traces s':>14} "
        f"{'from summaries s':>17} {'peak MB':>8}"
    )
    for mb in sizes_mb:
        made = make_set(work, ranks, mb, source)
        folder = Path(tempfile.mkdtemp(prefix="cvh-summ-"))
        for f in sorted(made.glob("*.json")):
            (folder / f.name).symlink_to(f)
        condense = [
            measured([sys.executable, "-m", "harness.traces.read.summary", str(f)])[0]
            for f in sorted(folder.glob("*.pt.trace.json"))
        ]
        summary_mb = statistics.mean(f.stat().st_size for f in folder.glob("*.summary.json")) / 1e6
        tmp = folder / "out"
        full = [measured(ours_cmd(folder, tmp / "full") + ["--from-traces"]) for _ in range(reps)]
        cond = [measured(ours_cmd(folder, tmp / "summ")) for _ in range(reps)]
        same = json.loads((tmp / "full" / "report.json").read_text()) == json.loads(
            (tmp / "summ" / "report.json").read_text()
        )
        print(
            f"{mb:>8g} {statistics.median(condense):>16.2f} {summary_mb:>16.2f} "
            f"{statistics.median(w for w, _ in full):>14.2f} {statistics.median(w for w, _ in cond):>17.2f} "
            f"{statistics.median(m for _, m in cond) / 1e6:>8.0f}   report identical: {same}"
        )


def step_period_us(rank_traces: list[dict]) -> float:
    """How far apart `repeated_steps` puts the copies of every rank's steps (one period for all ranks,
    or they drift apart): the longest span of a rank's steps, collectives, run-ups and covers,
    rounded up to whole ms, plus 1 ms."""

    def starts(t: dict) -> list[float]:
        return (
            [s["start_us"] for s in t["steps"]]
            + [op["start_us"] for op in t["comms"]]
            + [op["run_up_start_us"] for op in t["comms"] if op["run_up_start_us"] is not None]
            + [s["cover"]["lo_us"] for s in t["steps"] if s["cover"]]
        )

    spans = [
        max([s["end_us"] for s in t["steps"]] + [op["end_us"] for op in t["comms"]]) - min(starts(t))
        for t in rank_traces
        if t["steps"]
    ]
    return math.ceil(max(spans, default=0.0) / 1000) * 1000 + 1000


def repeated_steps(rank_trace: dict, times: int, period_us: float) -> None:
    """Make a summary's rank hold its profiled steps `times` over, as a job that profiled that many
    steps would: each copy shifted by `period_us` (`step_period_us`) and renumbered after the last,
    its collectives with it (their per-group positions renumbered)."""
    steps, comms = rank_trace["steps"], rank_trace["comms"]
    if times <= 1 or not steps:
        return
    numbers = max(s["number"] for s in steps) - min(s["number"] for s in steps) + 1

    def moved(d: float | None, by: float) -> float | None:
        return None if d is None else d + by

    out_steps, out_comms = [], []
    for i in range(times):
        by = i * period_us
        for s in steps:
            s = json.loads(json.dumps(s))
            s.update(
                number=s["number"] + i * numbers,
                start_us=s["start_us"] + by,
                end_us=s["end_us"] + by,
                phase_spans=[[p, a + by, b + by] for p, a, b in s["phase_spans"]],
            )
            if s["cover"]:
                c = s["cover"]
                c.update(
                    lo_us=c["lo_us"] + by,
                    hi_us=c["hi_us"] + by,
                    work_end_us=moved(c["work_end_us"], by),
                    compute_in_comm=[[a + by, b + by] for a, b in c["compute_in_comm"]],
                    idle=[[a + by, b + by] for a, b in c["idle"]],
                )
            out_steps.append(s)
        for op in comms:
            op = json.loads(json.dumps(op))
            op.update(
                start_us=op["start_us"] + by,
                end_us=op["end_us"] + by,
                step=None if op["step"] is None else op["step"] + i * numbers,
                run_up_start_us=moved(op["run_up_start_us"], by),
            )
            out_comms.append(op)
    seq: dict[str, int] = {}
    for op in out_comms:
        op["seq"] = seq.get(op["pg"], 0)
        seq[op["pg"]] = op["seq"] + 1
    rank_trace.update(steps=out_steps, comms=out_comms)


def summary_scale(work: Path, ranks: int, source: Path = SOURCE, per_host: int = 8, steps: int = 1) -> None:
    """A job of `ranks` ranks that wrote in-job summaries (`per_host` ranks per host): each
    source rank condensed once, then copied as rank r (of source rank r mod the source's ranks)
    with its world size and host rewritten, its steps repeated `steps` times (`repeated_steps`);
    the collector over the summaries alone (the traces stay on the cluster), wall and peak
    memory."""
    from harness.traces.read.summary import VERSION, summarize

    # a new summary version: a new set
    folder = work / (f"summaries-v{VERSION}-{source.name}-{ranks}r" + ("" if steps == 1 else f"-x{steps}"))
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="cvh-cond-"))
        condensed = []
        for f in source_traces(source):
            (staging / f.name).symlink_to(f.resolve())
            condensed.append(json.loads(summarize(staging / f.name).read_bytes()))
        period_us = step_period_us([doc["rank_trace"] for doc in condensed])
        for doc in condensed:  # once per source rank, not per copy
            repeated_steps(doc["rank_trace"], steps, period_us)
        for r in range(ranks):
            doc = json.loads(json.dumps(condensed[r % len(condensed)]))
            doc["rank_trace"].update(rank=r, world_size=ranks, host=f"node{r // per_host:04d}")
            (folder / f"rank{r:05d}.pt.trace.json.summary.json").write_text(json.dumps(doc))
        (folder / ".complete").touch()
    size = sum(p.stat().st_size for p in folder.glob("*.summary.json")) / 1e6
    wall, peak = measured(ours_cmd(folder, Path(tempfile.mkdtemp(prefix="cvh-sumscale-")) / "report"))
    held = f"{steps} x the source's steps" if steps > 1 else "the source's steps"
    print(
        f"\n{ranks} ranks of in-job summaries ({size:.0f} MB, {ranks // per_host} hosts, {held}): ours {wall:.1f} s, "
        f"peak RSS {peak / 1e6:.0f} MB (target < 30 s)"
    )


def long_args_source(work: Path) -> Path:
    """The long-args shape's source: a 2-rank harness run with --record-shapes --with-stack,
    made once under `work` (its traces copied into a folder of their own)."""
    folder = work / "long-args-src"
    if (folder / ".complete").exists():
        return folder
    runs = work / "runs"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "-m",
            "harness.train",
            *LONG_ARGS_RUN,
            "--log-dir",
            str(runs),
            "--run-name",
            "long-args",
        ],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted((runs / "long-args").glob("*.pt.trace.json.gz")):
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / ".complete").touch()
    return folder


# 2 all-reduces per layer forward and 2 backward: 80 a step; 5 steps, which make_set repeats to
# 25 in 90 MB a rank (3.6 MB a step, mostly host ops: what real tensor-parallel traces hold)
TP_LAYERS, TP_STEPS, TP_HOST_OPS = 20, 5, 200


def tp_source(work: Path, ranks: int = 8) -> Path:
    """The tensor-parallel shape's source, generated once under `work` by the device-queue
    simulator (tests/devicesim.py): `ranks` ranks of TP_STEPS steps, each layer's forward a GEMM
    then an all-reduce on the comm stream that the next layer waits for, its backward two GEMMs and
    two all-reduces (Megatron's row and column parallel layers): 4 * TP_LAYERS = 80 collectives a
    step, ~2000 a rank. Each GEMM's launch sits under TP_HOST_OPS nested and sibling cpu ops with
    recorded shapes, as with record_shapes=True, so the bytes are mostly host ops as in real TP
    traces; `make_set` then repeats the steps up to the size asked."""
    folder = work / f"tp-{ranks}r"
    if (folder / ".complete").exists():
        return folder
    sys.path.insert(0, str(REPO / "tests"))
    from devicesim import Sim, write_all

    sim = Sim(world_size=ranks)
    ids = itertools.count()

    def shapes() -> dict[str, Any]:
        """A cpu op's args as torch.profiler records them with record_shapes=True (~450 bytes)."""
        n = next(ids)
        return {
            "External id": n,
            "Record function id": 0,
            "Ev Idx": n,
            "Sequence number": n // 4,
            "Fwd thread id": 0,
            "Input Dims": [[8, 4096, 8192], [8192, 2048], [2048]],
            "Input Strides": [[33554432, 8192, 1], [1, 8192], [1]],
            "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"],
            "Concrete Inputs": ["", "", ""],
        }

    for r in range(ranks):
        h = sim.rank(r)
        last = None
        for step in range(TP_STEPS):
            with h.step(step):
                with h.range("data"):
                    h.cpu(400.0 + 10 * r, "aten::copy_")
                for phase, gemms, colls in (("forward", 1, 2), ("backward", 2, 2)):
                    with h.range(phase):
                        for _layer in range(TP_LAYERS):
                            for _g in range(gemms):
                                with h.op("aten::linear", shapes()):
                                    for k in range(TP_HOST_OPS // gemms - 1):
                                        h.cpu(2.0, "aten::view" if k % 2 else "aten::_reshape_alias", shapes())
                                    with h.op("aten::addmm", shapes()):
                                        last = h.launch(
                                            "sm90_xmma_gemm_bf16bf16_bf16f32", 120.0 + 5 * (r % 3), after=last
                                        )
                            for _c in range(colls):
                                last = h.collective("allreduce", 40.0, nelems=4096 * 2048, dtype="BFloat16", after=last)
                with h.range("optimizer"):
                    h.launch("multi_tensor_apply_kernel", 300.0, after=last)
                    h.sync()
    folder.mkdir(parents=True, exist_ok=True)
    write_all(sim.run(), folder)
    (folder / ".complete").touch()
    return folder


def check_anchors(anchors: dict[str, str]) -> None:
    """SystemExit before any set is made when an anchor's interpreter cannot import HTA."""
    for name, python in anchors.items():
        if python == sys.executable:
            ok = importlib.util.find_spec("hta") is not None
        else:
            ok = subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True).returncode == 0
        if not ok:
            raise SystemExit(
                f"{name}: {python} cannot import hta: pip install HolisticTraceAnalysis (or traceinsight) "
                "in that interpreter's venv and pass --anchor NAME=PYTHON, "
                "or pass --no-compare (ours only)"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--shape",
        action="append",
        choices=["dlrm", "long-args", "tp"],
        default=[],
        help="trace shape to replicate and compare (repeatable; default: dlrm)",
    )
    p.add_argument(
        "--source",
        type=Path,
        action="append",
        default=[],
        help="another folder of per-rank traces to replicate and compare (repeatable)",
    )
    p.add_argument(
        "--anchor",
        action="append",
        default=[],
        metavar="NAME=PYTHON",
        help="a tool to compare with: a name and the interpreter whose `hta` package it runs (repeatable; "
        "default: hta=this interpreter)",
    )
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rank-mb", type=float, default=90.0, help="size of each replicated rank trace (uncompressed)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "collector-bench")
    p.add_argument("--profile", action="store_true", help="time our stages on each replicated set")
    p.add_argument("--scale", default="", help="comma-separated rank counts for the ours-only scaling curve")
    p.add_argument("--scale-mb", type=float, default=20.0)
    p.add_argument("--stream-mb", type=float, default=0.0, help="also time one trace of this size (ours only)")
    p.add_argument("--no-compare", action="store_true", help="skip the comparison with the anchors")
    p.add_argument(
        "--layouts", action="store_true", help="ours only: the first shape in Kineto's key order against events first"
    )
    p.add_argument("--summaries", default="", help="comma-separated MB per rank: in-job summaries against full traces")
    p.add_argument(
        "--summary-ranks", type=int, default=0, help="collect this many ranks of in-job summaries (ours only)"
    )
    p.add_argument(
        "--summary-steps",
        type=int,
        default=1,
        help="with --summary-ranks: each rank's profiled steps this many times over (a longer profile)",
    )
    args = p.parse_args()
    anchors = dict(a.split("=", 1) for a in args.anchor) or {"hta": sys.executable}
    if not args.no_compare:
        check_anchors(anchors)
    shapes = args.shape or ([] if args.source else ["dlrm"])
    makers = {
        "dlrm": lambda: SOURCE,
        "long-args": lambda: long_args_source(args.work),
        "tp": lambda: tp_source(args.work),
    }
    sources = [makers[s]() for s in shapes] + args.source
    sets = [make_set(args.work, args.ranks, args.rank_mb, src) for src in sources]
    if not args.no_compare:
        print(
            f"collector vs HTA and its successor ({', '.join(anchors)}): median of {args.reps} rotated runs, "
            f"{psutil.cpu_count()} cores, python {sys.version.split()[0]}; ours = the default command"
        )
        rows = [compare(folder, args.reps, anchors) for folder in sets]
        print_comparison(rows, anchors, decoder_limit(sets[0]))
    if args.profile:
        for folder in sets:
            profile(folder)
    if args.layouts:
        layouts(args.work, args.ranks, args.rank_mb, args.reps, sources[0])
    if args.stream_mb:
        one_big_trace(args.work, args.stream_mb, sources[0])
    if args.summaries:
        summaries(args.work, args.ranks, [float(x) for x in args.summaries.split(",")], args.reps, sources[0])
    if args.summary_ranks:
        summary_scale(args.work, args.summary_ranks, sources[0], steps=args.summary_steps)
    if args.scale:
        reps = max(1, args.reps // 2) if args.reps > 1 else 1
        scale(args.work, [int(x) for x in args.scale.split(",")], args.scale_mb, reps, sources[0])


if __name__ == "__main__":
    main()
