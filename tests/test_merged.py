"""The merged trace: gzip from parallel pieces, the window of steps it holds, --merged choices."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from harness.paths import MERGED_TRACE
from harness.report.gzip_pieces import PieceWriter, crc32_combine, write_gzip
from harness.report.merged import MERGED_BUDGET_BYTES, MergedChoice, choose_window, step_bytes, window_for
from harness.traces.model import RankTrace, Step
from harness.traces.read import decode
from harness.traces.read.parse import parse_trace

from jobs import REAL_TRACES, REPO, said
from tracebuild import ring_docs, write


def test_crc32_combine_matches_zlib_on_random_splits() -> None:
    rng = random.Random(7)
    for _ in range(50):
        a = rng.randbytes(rng.randrange(0, 3000))
        b = rng.randbytes(rng.choice([0, 1, 7, 1000, 70_000]))
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_pieces_make_one_gzip_member_every_reader_takes(tmp_path: Path) -> None:
    rng = random.Random(3)
    parts = [
        b"".join(rng.choice([b'{"ph":"X"}', b",\n", rng.randbytes(50)]) for _ in range(rng.randrange(0, 4000)))
        for _ in range(6)
    ]
    pieces = []
    for part in parts:
        w = PieceWriter(level=3)
        for k in range(0, len(part), 997):
            w.write(part[k : k + 997])
        pieces.append(w.finish())
    path = tmp_path / "x.gz"
    with path.open("wb") as fh:
        assert write_gzip(fh, pieces) == sum(map(len, parts))
    whole = b"".join(parts)
    assert gzip.decompress(path.read_bytes()) == whole
    d = zlib.decompressobj(wbits=31)  # one member: nothing left over after it
    assert d.decompress(path.read_bytes()) == whole and d.eof and d.unused_data == b""
    if shutil.which("gzip"):
        assert subprocess.run(["gzip", "-t", str(path)]).returncode == 0  # checks the CRC and size too


def _rank(rank: int, step_events: dict[int, int], json_bytes: int, dur_us: dict[int, float] | None = None) -> RankTrace:
    steps, t = [], 0.0
    for n, ev in step_events.items():
        d = (dur_us or {}).get(n, 100.0)
        steps.append(Step(number=n, start_us=t, end_us=t + d, events=ev))
        t += d
    return RankTrace(
        rank=rank,
        world_size=2,
        host="h",
        paths=["p"],
        run_id=None,
        device="cpu",
        steps=steps,
        comms=[],
        json_bytes=json_bytes,
        events=sum(step_events.values()),
    )


def test_step_bytes_shares_each_trace_by_its_counted_events() -> None:
    # rank 0: 1000 bytes over 10 events (100 a step-event); rank 1: 4000 over 20 (200 each)
    traces = [_rank(0, {1: 4, 2: 6}, 1000), _rank(1, {1: 10, 2: 10}, 4000)]
    assert step_bytes(traces) == {1: 4 * 100 + 10 * 200, 2: 6 * 100 + 10 * 200}


def test_window_grows_around_the_median_step_until_the_budget() -> None:
    # ten steps of 100 bytes each (one event per step, 100 bytes per event); step 6 is the
    # median-length one (durations rise with the step number, except 6 is the 5th longest)
    durs = {n: 100.0 + n for n in range(1, 11)}
    traces = [_rank(0, {n: 1 for n in range(1, 11)}, 1000, durs)]
    w = choose_window(traces, budget_bytes=350)
    assert w.steps == [4, 5, 6]  # centre 5 (lower median of 10 durations), then 6, then 4; 7 would be 400
    assert w.estimated_bytes == 300
    assert "step(s) 4-6 of 1-10" in w.note
    assert choose_window(traces, budget_bytes=10_000).steps == list(range(1, 11))
    one = choose_window(traces, budget_bytes=50)
    assert one.steps == [5] and "over the" in one.note  # a step larger than the budget is still written


def test_window_grows_across_gaps_between_profiler_windows_over_common_steps() -> None:
    # rank 1 lacks step 7; steps 1-3 and 8 (two profiler windows) are neighbours in the order
    traces = [_rank(0, {1: 1, 2: 1, 3: 1, 7: 1, 8: 1}, 500), _rank(1, {1: 1, 2: 1, 3: 1, 8: 1}, 400)]
    w = choose_window(traces, budget_bytes=10_000)
    assert w.steps == [1, 2, 3, 8] and "step(s) 1-3, 8 of 1-3, 8" in w.note
    # 200 bytes a step (100 per rank): centre 2 (lower median of four equal durations), then 3, then 1
    assert choose_window(traces, budget_bytes=650).steps == [1, 2, 3]


def test_window_for_each_choice() -> None:
    traces = [_rank(0, {1: 1, 2: 1, 3: 1}, 300)]
    assert window_for(MergedChoice(mode="none"), traces) is None
    assert window_for(MergedChoice(mode="all"), traces).steps is None
    assert window_for(MergedChoice(mode="steps", steps=frozenset({2, 3, 9})), traces).steps == [2, 3]
    assert window_for(MergedChoice(), traces).steps == [1, 2, 3]
    assert MergedChoice().budget_bytes == MERGED_BUDGET_BYTES


def collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.collect", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


def _ring(tmp_path: Path, n_steps: int = 10) -> Path:
    # rank 0 arrives at t+300, rank 1 at t+500 in every 1000 us step; all-reduce ends at t+600
    docs = ring_docs(lambda r, s: 300.0 if r == 0 else 500.0, n_ranks=2, n_steps=n_steps)
    for r, d in enumerate(docs):
        d["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "main"}})
        write(tmp_path / "run" / f"rank{r}.pt.trace.json", d)
    return tmp_path / "run"


def _merged(out: Path) -> dict:
    return json.loads(gzip.decompress((out / "merged.pt.trace.json.gz").read_bytes()))


def _merged_steps(tmp_path: Path, steps: str) -> tuple[dict, dict[int, tuple[list[dict], list[str]]]]:
    """The merged trace of `--merged STEPS` over the 10-step ring, and per rank its own slices
    (not the synthetic waits) and the ProfilerStep names among them."""
    proc = collect(str(_ring(tmp_path)), "-q", "--merged", steps, "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    doc = _merged(tmp_path / "out")
    per_rank = {}
    for r in (0, 1):
        mine = [e for e in doc["traceEvents"] if e["pid"] == r and e["ph"] == "X" and e.get("cat") != "collective_wait"]
        per_rank[r] = mine, sorted(e["name"] for e in mine if e["name"].startswith("ProfilerStep#"))
    return doc, per_rank


def test_merged_steps_hold_exactly_those_steps_events(tmp_path: Path) -> None:
    doc, per_rank = _merged_steps(tmp_path, "3-4")
    assert doc["harness_merged"]["steps"] == [3, 4]
    for r, (mine, marks) in per_rank.items():
        # per step: its ProfilerStep, two launches, two kernels (steps 2 and 5 only touch the window's edges)
        assert marks == ["ProfilerStep#3", "ProfilerStep#4"]
        assert len(mine) == 2 * 5
        assert all(2000 <= e["ts"] < 4000 for e in mine)  # one host, one time base: not shifted
        labels = {e["args"]["name"] for e in doc["traceEvents"] if e["pid"] == r and e["name"] == "thread_name"}
        assert labels == {"collective waits", "pid 100 / main", "pid 0 / tid 7"}
    waits = [e for e in doc["traceEvents"] if e.get("cat") == "collective_wait"]
    assert [(e["pid"], e["dur"], e["args"]["step"]) for e in waits] == [(0, 200.0, 3), (0, 200.0, 4)]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["merged"]["steps"] == [3, 4] and report["merged"]["events"] == 2 * (2 * 5 + 2)


def test_merged_steps_apart_hold_only_their_own_time(tmp_path: Path) -> None:
    """Steps 2 and 5 are two spans: nothing of steps 3-4 between them is copied."""
    doc, per_rank = _merged_steps(tmp_path, "2,5")
    assert doc["harness_merged"]["steps"] == [2, 5]
    for mine, marks in per_rank.values():
        assert marks == ["ProfilerStep#2", "ProfilerStep#5"]
        assert len(mine) == 2 * 5
        assert all(1000 <= e["ts"] < 2000 or 4000 <= e["ts"] < 5000 for e in mine)


def test_merged_all_none_and_default(tmp_path: Path) -> None:
    run = _ring(tmp_path, n_steps=6)
    assert collect(str(run), "-q", "--merged", "none", "-o", str(tmp_path / "none")).returncode == 0
    assert not (tmp_path / "none" / "merged.pt.trace.json.gz").exists()
    assert json.loads((tmp_path / "none" / "report.json").read_text())["merged"] is None
    assert collect(str(run), "-q", "--merged", "all", "-o", str(tmp_path / "all")).returncode == 0
    every = _merged(tmp_path / "all")
    assert every["harness_merged"]["steps"] is None
    assert sum(1 for e in every["traceEvents"] if e["ph"] == "X" and e["pid"] == 0) == 6 * 5 + 6  # + waits
    proc = collect(str(run), "-o", str(tmp_path / "auto"))
    assert proc.returncode == 0
    assert _merged(tmp_path / "auto")["harness_merged"]["steps"] == [1, 2, 3, 4, 5, 6]  # small: all of it
    assert "step(s) 1-6 of 1-6" in said(proc.stdout, "merged")[0]


def test_merged_trace_written_beside_the_analysis_is_the_same(tmp_path: Path) -> None:
    """With a pool (-j 2) the rank jobs start right after the clock offsets are estimated and run
    while the analysis goes on; with -j 1 they run after it, in the collector's process. Two
    hosts, rank 1's clock 250 us ahead: both files are the same to the byte, with rank 1 moved
    back onto rank 0's clock."""
    docs = ring_docs(
        lambda r, s: 300.0 if r == 0 else 500.0, n_ranks=2, n_steps=6, hosts=["a", "b"], clock_us=[0.0, 250.0]
    )
    for r, d in enumerate(docs):
        write(tmp_path / "run" / f"rank{r}.pt.trace.json", d)
    for jobs in ("1", "2"):
        proc = collect(str(tmp_path / "run"), "-q", "--merged", "all", "-j", jobs, "-o", str(tmp_path / jobs))
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "1" / MERGED_TRACE).read_bytes() == (tmp_path / "2" / MERGED_TRACE).read_bytes()
    doc = _merged(tmp_path / "2")
    starts = {e["pid"]: e["ts"] for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#1"}
    assert starts == {0: 0.0, 1: 0.0}
    entries = [json.loads((tmp_path / j / "report.json").read_text())["merged"] for j in ("1", "2")]
    # per rank: 6 steps x 5 slices and the names of its two threads (main, GPU stream)
    assert entries[0] == entries[1] and entries[0]["events"] == 2 * (6 * 5 + 2)


def test_bad_merged_choice_is_one_line(tmp_path: Path) -> None:
    proc = collect(str(_ring(tmp_path)), "--merged", "latest")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--merged 'latest'" in proc.stderr


def test_block_index_covers_every_event_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each recorded block's bytes decode to whole events, and the blocks together hold every
    event of the file once (gzip or not, small and real traces)."""
    monkeypatch.setattr(decode, "BLOCK_BYTES", 3000)
    files = [
        write(tmp_path / "a.pt.trace.json", ring_docs(lambda r, s: 10.0 * r, 2, 30)[0]),
        write(tmp_path / "b.pt.trace.json.gz", ring_docs(lambda r, s: 10.0 * r, 2, 30)[1]),
    ]
    files += sorted(REAL_TRACES.glob("*/*.json*"))[:3]
    for f in files:
        t = decode.decode_trace(f)
        assert t.blocks, f
        events = json.loads(decode.read_bytes(f))["traceEvents"]
        with decode.open_trace(f) as fh:
            data = fh.read()
        got = []
        for b in t.blocks:
            got.extend(json.loads(b"[" + data[b.start : b.end] + b"]"))
        assert got == events, f
        assert t.json_bytes == len(data)
        timed = [e for e in events if e.get("ph") == "X"]
        assert min(b.first_ts for b in t.blocks if b.first_ts is not None) == min(e["ts"] for e in timed)
        assert any(b.meta for b in t.blocks) == any(e.get("ph") == "M" for e in events)


def test_summaries_carry_what_the_window_needs(tmp_path: Path) -> None:
    from harness.traces.read.summary import read_summary, summarize

    f = write(tmp_path / "rank0.pt.trace.json", ring_docs(lambda r, s: 10.0 * r, 2, 5)[0])
    direct = parse_trace(f)
    again = read_summary(summarize(f))
    assert again.blocks == direct.blocks and again.json_bytes == direct.json_bytes > 0
    assert [s.events for s in again.steps] == [s.events for s in direct.steps] == [5] * 5


def test_a_path_with_a_comma_and_space_is_one_path(tmp_path: Path) -> None:
    """RankTrace.paths is a list: a folder named "a, b" once broke the ", "-joined path."""
    docs = ring_docs(lambda r, s: 300.0 if r == 0 else 500.0, n_ranks=2, n_steps=3)
    run = tmp_path / "a, b"
    for r, d in enumerate(docs):
        write(run / f"rank{r}.pt.trace.json", d)
    proc = collect(str(run), "-q", "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert _merged(tmp_path / "out")["harness_merged"]["steps"] == [1, 2, 3]
    assert "no merged" not in proc.stdout
