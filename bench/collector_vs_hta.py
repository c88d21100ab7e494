"""Our collector against Holistic Trace Analysis on the same trace sets, side by side.

    python bench/collector_vs_hta.py                      # real 8-rank set + 8 ranks x 85 MB
    python bench/collector_vs_hta.py --rank-mb 200 --reps 3
    python bench/collector_vs_hta.py --scale 8,16,32,64 --scale-mb 20   # ours only: ranks vs seconds
    python bench/collector_vs_hta.py --no-compare --stream-mb 2000     # ours only: one 2 GB trace
    python bench/collector_vs_hta.py --no-compare --summaries 10,20,85 # ours only: in-job summaries
    python bench/collector_vs_hta.py --source DIR ...                  # another trace set as the base

Each tool runs as its own process, alternating (ours first on even repetitions, HTA first on
odd ones); wall time is the process's, peak memory the largest sum of RSS over the process and
all its children, sampled every 20 ms. Ours is the whole command a user types
(`python -m harness.collect DIR -q --no-merged`: parse, align, overlap, stragglers, advisor, and
writing the report); HTA's is `TraceAnalysis(trace_dir=DIR)` then `get_comm_comp_overlap()`.
Both report, per rank, the share of communication time overlapped by computation; the script
prints the largest difference in percentage points.

Large sets are made from the real DLRM traces in ../shared/traces (or the traces in --source) by
repeating each rank's events with shifted times, step numbers and correlation ids (so kernel-launch
links stay unique); rank r of a bigger world copies source rank r mod the source's ranks. They are
cached under --work (uncompressed JSON). Tiny sizes (`--rank-mb 0.05 --reps 1`) make a smoke run
of a few seconds (tests/test_bench_smoke.py).

Needs `pip install HolisticTraceAnalysis psutil` in the interpreter that runs it (HTA is not a
dependency of the harness).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
SOURCE = REPO.parent / "shared" / "traces" / "dlrm_8rank_v100"
SHIFTED_ARGS = ("correlation", "External id", "Ev Idx")

HTA_SCRIPT = """
import json, sys
from hta.trace_analysis import TraceAnalysis
df = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)
json.dump({int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"])}, open(sys.argv[2], "w"))
"""


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
    top_id = 1 + max((e.get("args", {}).get(k, 0) for e in timed for k in SHIFTED_ARGS
                      if isinstance(e.get("args", {}).get(k), int)), default=0)
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
                c["args"] = {a: (v + k * top_id if a in SHIFTED_ARGS and isinstance(v, int) else v)
                             for a, v in c["args"].items()}
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


def make_set(work: Path, ranks: int, rank_mb: float, source: Path = SOURCE) -> Path:
    """`ranks` files of about `rank_mb` MB each (uncompressed JSON), cached by source and size."""
    base = "dlrm" if source == SOURCE else source.name
    folder = work / f"{base}-{ranks}r-{rank_mb:g}mb"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    sources = source_traces(source)
    for r in range(ranks):
        doc = load(sources[r % len(sources)])
        one = len(json.dumps(doc["traceEvents"]))
        copies = max(1, round(rank_mb * 1e6 / one))
        text = json.dumps(replicate(doc, copies, r, ranks))
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
    return [sys.executable, "-m", "harness.collect", str(folder), "-q", "--no-merged", "-o", str(out)]


def our_overlap(out: Path) -> dict[int, float]:
    doc = json.loads((out / "report.json").read_text())
    return {r["rank"]: 100 * r["overlapped_comm_ms"] / r["comm_ms"] for r in doc["ranks"] if r["comm_ms"]}


def compare(folder: Path, reps: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="cvh-"))
    runs: dict[str, list[tuple[float, int]]] = {"ours": [], "hta": []}
    for rep in range(reps):
        order = ["ours", "hta"] if rep % 2 == 0 else ["hta", "ours"]
        for tool in order:
            if tool == "ours":
                runs[tool].append(measured(ours_cmd(folder, tmp / "report")))
            else:
                runs[tool].append(measured([sys.executable, "-c", HTA_SCRIPT, str(folder), str(tmp / "hta.json")]))
    ours_ov = our_overlap(tmp / "report")
    hta_ov = {int(k): v for k, v in json.loads((tmp / "hta.json").read_text()).items()}
    diffs = [abs(ours_ov.get(r, 0.0) - v) for r, v in hta_ov.items()]
    size = sum(p.stat().st_size for p in folder.glob("*.json*")) / 1e6
    med = {k: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) for k, v in runs.items()}
    return {"set": folder.name, "mb": size, "ours": med["ours"], "hta": med["hta"],
            "wall_ratio": med["hta"][0] / med["ours"][0], "mem_ratio": med["ours"][1] / med["hta"][1],
            "overlap_max_diff_pp": max(diffs) if diffs else None, "ranks": len(hta_ov)}


def scale(work: Path, sizes: list[int], rank_mb: float, reps: int, source: Path = SOURCE) -> None:
    print(f"\nscale: ours only, {rank_mb:g} MB per rank, median of {reps}, {psutil.cpu_count()} cores")
    print(f"{'ranks':>6} {'seconds':>9} {'s/rank':>8} {'peak MB':>9}")
    for n in sizes:
        folder = make_set(work, n, rank_mb, source)
        tmp = Path(tempfile.mkdtemp(prefix="cvh-scale-"))
        got = [measured(ours_cmd(folder, tmp / "report")) for _ in range(reps)]
        wall = statistics.median(w for w, _ in got)
        print(f"{n:>6} {wall:>9.2f} {wall / n:>8.3f} {statistics.median(m for _, m in got) / 1e6:>9.0f}")


def one_big_trace(work: Path, rank_mb: float, source: Path = SOURCE) -> None:
    folder = make_set(work, 1, rank_mb, source)
    size = sum(p.stat().st_size for p in folder.glob("*.json")) / 1e6
    wall, peak = measured(ours_cmd(folder, Path(tempfile.mkdtemp(prefix="cvh-big-")) / "report"))
    print(f"\none trace of {size:.0f} MB (uncompressed): ours {wall:.1f} s, peak RSS {peak / 1e6:.0f} MB "
          f"(target < 1000 MB)")


def summaries(work: Path, ranks: int, sizes_mb: list[float], reps: int, source: Path = SOURCE) -> None:
    """In-job summaries: per rank, condensing its trace (what each rank does at the end of a
    window, all ranks at once in a real job); then the collector over the summaries against
    the collector over the traces. The summaries go into a folder of links to the cached traces,
    so the cached sets stay trace-only."""
    print(f"\nin-job summaries: ours only, {ranks} ranks, median of {reps}, {psutil.cpu_count()} cores")
    print(f"{'MB/rank':>8} {'condense s/rank':>16} {'summary MB/rank':>16} {'from traces s':>14} "
          f"{'from summaries s':>17} {'peak MB':>8}")
    for mb in sizes_mb:
        made = make_set(work, ranks, mb, source)
        folder = Path(tempfile.mkdtemp(prefix="cvh-summ-"))
        for f in sorted(made.glob("*.json")):
            (folder / f.name).symlink_to(f)
        condense = [measured([sys.executable, "-m", "harness.collect.summary", str(f)])[0]
                    for f in sorted(folder.glob("*.pt.trace.json"))]
        summary_mb = statistics.mean(f.stat().st_size for f in folder.glob("*.summary.json")) / 1e6
        tmp = folder / "out"
        full = [measured(ours_cmd(folder, tmp / "full") + ["--from-traces"]) for _ in range(reps)]
        cond = [measured(ours_cmd(folder, tmp / "summ")) for _ in range(reps)]
        same = json.loads((tmp / "full" / "report.json").read_text()) == json.loads((tmp / "summ" / "report.json").read_text())
        print(f"{mb:>8g} {statistics.median(condense):>16.2f} {summary_mb:>16.2f} "
              f"{statistics.median(w for w, _ in full):>14.2f} {statistics.median(w for w, _ in cond):>17.2f} "
              f"{statistics.median(m for _, m in cond) / 1e6:>8.0f}   report identical: {same}")


def check_hta() -> None:
    """SystemExit before any set is made when HTA cannot be imported by this interpreter."""
    if importlib.util.find_spec("hta") is None:
        raise SystemExit("HolisticTraceAnalysis is not installed in this interpreter: "
                         "pip install HolisticTraceAnalysis, or pass --no-compare (ours only)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", type=Path, default=SOURCE,
                   help="folder of per-rank traces: the real set compared, and the base of the replicated sets")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rank-mb", type=float, default=85.0, help="size of each replicated rank trace (uncompressed)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "collector-bench")
    p.add_argument("--scale", default="", help="comma-separated rank counts for the ours-only scaling curve")
    p.add_argument("--scale-mb", type=float, default=20.0)
    p.add_argument("--stream-mb", type=float, default=0.0, help="also time one trace of this size (ours only)")
    p.add_argument("--no-compare", action="store_true", help="skip the comparison with HTA")
    p.add_argument("--summaries", default="", help="comma-separated MB per rank: in-job summaries against full traces")
    args = p.parse_args()
    if not args.no_compare:
        check_hta()
        sets = [args.source, make_set(args.work, args.ranks, args.rank_mb, args.source)]
        print(f"collector vs HTA: median of {args.reps} alternated runs, {psutil.cpu_count()} cores, python {sys.version.split()[0]}")
        print(f"{'set':24} {'MB':>7} {'ours s':>8} {'HTA s':>8} {'HTA/ours':>9} {'ours MB':>8} {'HTA MB':>8} "
              f"{'ours/HTA mem':>13} {'overlap diff pp':>16}")
        for folder in sets:
            r = compare(folder, args.reps)
            print(f"{r['set']:24} {r['mb']:>7.0f} {r['ours'][0]:>8.2f} {r['hta'][0]:>8.2f} {r['wall_ratio']:>9.1f} "
                  f"{r['ours'][1] / 1e6:>8.0f} {r['hta'][1] / 1e6:>8.0f} {r['mem_ratio']:>13.3f} "
                  f"{r['overlap_max_diff_pp']:>16.2f}")
        print("targets: HTA/ours >= 10, ours/HTA mem <= 0.25, overlap diff <= 1 pp")
    if args.stream_mb:
        one_big_trace(args.work, args.stream_mb, args.source)
    if args.summaries:
        summaries(args.work, args.ranks, [float(x) for x in args.summaries.split(",")], args.reps, args.source)
    if args.scale:
        reps = max(1, args.reps // 2) if args.reps > 1 else 1
        scale(args.work, [int(x) for x in args.scale.split(",")], args.scale_mb, reps, args.source)


if __name__ == "__main__":
    main()
