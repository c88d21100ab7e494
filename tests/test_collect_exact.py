"""The collector's analyses on hand-built traces whose answers are known exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report.document import build_report
from harness.report.records import as_document
from harness.traces.analyse.overlap import intersect, subtract, union
from harness.traces.read.discover import group_ranks
from harness.traces.read.parse import parse_trace
from harness.traces.read.runup import IDLE

from jobs import REAL_TRACES, REPO
from tracebuild import (
    GLOO,
    GpuRank,
    cpu_ring_docs,
    document,
    gpu_docs,
    ring_docs,
    run_analysis,
    shift_doc,
    step,
    write,
    x,
)


def test_interval_algebra() -> None:
    assert union([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    assert intersect([(0, 3), (5, 6)], [(2, 5.5)]) == [(2, 3), (5, 5.5)]
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert subtract([(0, 3)], [(0, 3)]) == []


def test_gpu_overlap_and_gaps_exact(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, gpu_docs())
    r0 = [o for o in a.overlap if o.rank == 0]
    assert len(r0) == 2
    # spans from each step's first device work: [100, 1100] and [1100, 1900] (the last ends
    # with its work); in each: C = 300 + 100; M = 400; C∩M = [300, 400]; idle [700, 800], and
    # in step 1 also [900, 1100]: between the steps' work, the device's time, counted once
    for o, (window, idle) in zip(r0, [(1000, 300), (800, 100)]):
        assert (o.window_us, o.compute_us, o.comm_us, o.overlapped_comm_us, o.exposed_comm_us, o.idle_us) == (
            window,
            400,
            400,
            100,
            300,
            idle,
        )
        assert o.compute_us + o.exposed_comm_us + o.memcpy_us + o.idle_us == o.window_us
    r1 = [o for o in a.overlap if o.rank == 1][0]
    # M = [500, 700] does not touch C: all 200 exposed; idle = [400, 500] + [700, 800] + [900, 1100]
    assert (r1.comm_us, r1.overlapped_comm_us, r1.exposed_comm_us, r1.idle_us) == (200, 0, 200, 400)
    # rank 0 arrives at 300, rank 1 at 500: rank 0 waits [300, 500], transfers [500, 700];
    # compute covers [100, 400], so exposed = [400, 500] waiting + [500, 700] transfer
    assert (r0[0].exposed_wait_us, r0[0].exposed_transfer_us) == (100, 200)
    assert (r1.exposed_wait_us, r1.exposed_transfer_us) == (0, 200)
    g0 = sorted((g.kind, g.start_us % 1000, g.dur_us, g.collective) for g in a.gaps if g.rank == 0 and g.step == 1)
    assert g0 == [
        ("exposed_transfer", 500, 200, "allreduce"),
        ("exposed_wait", 400, 100, "allreduce"),
        ("idle", 700, 100, "allreduce"),
        ("idle", 900, 200, "allreduce"),
    ]


def test_gpu_waits_blame_and_offsets_exact(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, gpu_docs())
    assert len(a.instances) == 2 and {i.name for i in a.instances} == {"allreduce"}
    assert all(o.offset_us == 0 and o.spread_us == 0 for o in a.offsets.values())
    res = a.stragglers
    by = {r.rank: r for r in res.ranks}
    # rank 0 arrives at 300, rank 1 at 500, twice: rank 0 waits 2 x 200 us for rank 1
    assert (by[0].wait_ms, by[0].blame_ms) == (0.4, 0.0)
    assert (by[1].wait_ms, by[1].blame_ms, by[1].last_fraction) == (0.0, 0.4, 1.0)
    assert res.step_last == {1: 1, 2: 1}
    assert res.step_wait == {1: {0: 200.0, 1: 0.0}, 2: {0: 200.0, 1: 0.0}}
    assert [w.transfer_us for w in a.waits] == [200.0, 200.0]
    assert {r: b.cost_ms for r, b in by.items()} == {0: 0.0, 1: 0.2}
    # 0.2 ms late in 1 ms steps is 20% of the step: there is no absolute floor to hide it. The
    # bound is 8% of the clean step, the punctual rank's own work on its device's timeline: spans
    # of 1000 us (first kernel to the next step's) and 800 (the last: to its compute's end at
    # 1900), less rank 0's 200 us wait in each: 700 us
    assert res.threshold_ms == pytest.approx(0.056) and res.verdict == "straggler"


def test_gpu_straggler_above_threshold(tmp_path: Path) -> None:
    # rank 1 arrives 1.7 ms after rank 0 in each 3 ms step; both finish at t+2200
    a = run_analysis(tmp_path, gpu_docs(arrive1_us=2000.0, end_us=2200.0, period_us=3000.0))
    assert all(abs(o.offset_us) < 1e-9 for o in a.offsets.values())
    s = a.stragglers.stragglers
    assert [r.rank for r in s] == [1]
    assert s[0].blame_ms == pytest.approx(2 * 1.7)
    assert s[0].last_fraction == 1.0
    # its device sat idle from 400 to 2000 before arriving, rank 0's from 400 to 300 (none)
    assert s[0].phase == "idle (waiting on the host)"
    assert s[0].phase_excess_ms == pytest.approx(1.6)
    # the replay counts steps on the device's spans, 100..3100 then 3100..5900 (its last kernel's end):
    # 2.9 ms on average, measured and replayed alike, less rank 0's 1.7 ms of waiting per step when fixed
    assert a.stragglers.measured_step_ms == pytest.approx(2.9)
    assert a.stragglers.replayed_step_ms == pytest.approx(2.9)
    assert a.stragglers.replay_faithful
    assert s[0].whatif_step_ms == pytest.approx(2.9 - 1.7)
    report = as_document(build_report(a, ["x"]))
    assert report["verdict"] == "straggler"
    assert report["stragglers"][0]["rank"] == 1
    assert "rank 1" in report["headline"]


def test_skewed_clock_is_recovered_and_verdict_unchanged(tmp_path: Path) -> None:
    base = run_analysis(tmp_path / "a", gpu_docs())
    docs = gpu_docs()
    docs[1] = shift_doc(docs[1], 50_000.0)  # rank 1's clock runs 50 ms ahead
    skewed = run_analysis(tmp_path / "b", docs)
    assert skewed.offsets[1].offset_us - base.offsets[1].offset_us == pytest.approx(50_000.0, abs=500)
    assert skewed.stragglers.verdict == base.stragglers.verdict
    assert [r.blame_ms for r in skewed.stragglers.ranks] == pytest.approx([r.blame_ms for r in base.stragglers.ranks])
    unaligned = run_analysis(tmp_path / "c", docs, align=False)
    # without alignment rank 1 looks 50 ms late at both collectives and rank 0 seems to wait for it
    assert unaligned.stragglers.ranks[1].blame_ms == pytest.approx(2 * 50.2)
    assert unaligned.stragglers.verdict == "straggler"


def test_gpu_clock_noise_counts_across_clocks_only(tmp_path: Path) -> None:
    # rank 1 arrives 1.5 ms after rank 0 in each 10 ms step; its all-reduce ends with rank 0's in
    # even steps and 1.2 ms after in odd ones (woken late): its ends scatter by 0.6 ms (MAD)
    def late(r: int, s: int) -> float:
        return 5000.0 + (1500.0 if r == 1 else 0.0)

    def woken_late(r: int, s: int) -> float:
        return 1200.0 if r == 1 and s % 2 else 0.0

    docs = ring_docs(late, 2, 10, period_us=10_000.0, hosts=["h", "h"], end_scatter_us=woken_late)
    one = run_analysis(tmp_path / "one", docs)
    # one host, one clock: nothing to be off, so no clock noise bound; the 1.5 ms is a straggler
    assert one.offsets[1].spread_us == pytest.approx(600.0)
    assert one.stragglers.bounds_ms["clock_noise"] == 0.0
    assert [r.rank for r in one.stragglers.stragglers] == [1]
    # the same on two hosts: rank 1's clock is estimated 0.6 ms ahead (the median end gap), its
    # lateness is 0.9 ms on it, and 3x the scatter of its ends (1.8 ms) bounds what it can mean
    docs = ring_docs(late, 2, 10, period_us=10_000.0, hosts=["a", "b"], end_scatter_us=woken_late)
    two = run_analysis(tmp_path / "two", docs)
    assert two.offsets[1].offset_us == pytest.approx(600.0)
    assert two.stragglers.bounds_ms["clock_noise"] == pytest.approx(1.8)
    assert two.stragglers.verdict == "balanced"


def test_cpu_end_scatter_bounds_lateness_on_one_clock(tmp_path: Path) -> None:
    # two CPU ranks on one host; rank 1 sleeps 0.3 ms a step (2.4 ms of work: 12.5%, over the
    # 8% bound) ...
    def sleep(r: int, s: int) -> float:
        return 300.0 if r == 1 else 0.0

    def one_host(docs: list[dict]) -> list[dict]:
        for r, d in enumerate(docs):
            d["harness"] = {"host": "h", "rank": r}
        return docs

    quiet = run_analysis(tmp_path / "quiet", one_host(cpu_ring_docs(2, 10, sleep_us=sleep)))
    assert quiet.stragglers.bounds_ms["clock_noise"] == 0.0
    assert [r.rank for r in quiet.stragglers.stragglers] == [1]

    # ... and is woken 0.9 ms after its all-reduce ends in odd steps, which its next arrival
    # carries: late 0.3 ms in odd steps, 1.2 in even ones, 0.75 a step. Its ends trail rank 0's
    # by 0.9 ms or 0 (MAD 0.45): on one clock that scatter is how noisy its arrivals are, and
    # 3x of it (1.35 ms) bounds what its lateness can mean
    def woken_late(r: int, s: int) -> float:
        return 900.0 if r == 1 and s % 2 else 0.0

    noisy = run_analysis(tmp_path / "noisy", one_host(cpu_ring_docs(2, 10, sleep_us=sleep, wake_us=woken_late)))
    assert noisy.offsets[1].offset_us == 0.0
    assert noisy.offsets[1].spread_us == pytest.approx(450.0)
    assert noisy.stragglers.bounds_ms["clock_noise"] == pytest.approx(1.35)
    rank1 = noisy.stragglers.ranks[1]
    assert rank1.late_ms == pytest.approx(0.75)
    assert rank1.steps_late == 0
    assert noisy.stragglers.verdict == "balanced"


def cpu_doc(rank: int, gloo_start: float) -> dict:
    """One step [0, 1000] on the main thread: aten::mm [0, 300], aten::add [600, 650];
    gloo:all_reduce on a worker thread from gloo_start to 500."""
    events = [
        step(0, 0, 1000),
        x("aten::mm", "cpu_op", 0, 300),
        x("aten::add", "cpu_op", 600, 50),
        x("gloo:all_reduce", "user_annotation", gloo_start, 500 - gloo_start, GLOO),
    ]
    return document(events, rank, base_ns=None)


def test_cpu_gloo_overlap_exact(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, [cpu_doc(0, 200.0), cpu_doc(1, 400.0)])
    o = {r.rank: r for r in a.overlap}
    # rank 0: C = [0,300]+[600,650] = 350; M = [200,500] = 300; overlap 100; exposed 200; idle 450
    assert (
        o[0].window_us,
        o[0].compute_us,
        o[0].comm_us,
        o[0].overlapped_comm_us,
        o[0].exposed_comm_us,
        o[0].idle_us,
    ) == (1000, 350, 300, 100, 200, 450)
    # rank 1: M = [400,500], no overlap; idle = [300,400] + [500,600] + [650,1000]
    assert (o[1].comm_us, o[1].exposed_comm_us, o[1].idle_us) == (100, 100, 550)
    idle0 = sorted((g.start_us, g.dur_us, g.collective) for g in a.gaps if g.rank == 0 and g.kind == "idle")
    assert idle0 == [(500, 100, "allreduce"), (650, 350, "allreduce")]
    assert {r.rank: r.wait_ms for r in a.stragglers.ranks} == {0: 0.2, 1: 0.0}


def test_collectives_in_flight_together_count_a_late_rank_once(tmp_path: Path) -> None:
    """DDP with two gradient buckets on gloo: both all-reduces run at once on two worker
    threads. Rank 1 arrives 30 ms late at both (at 30100 and 30110 against 100 and 110):
    its lateness per step is the union [100, 30100] + [110, 30110] = 30.01 ms, not the sum
    60 ms; its cost (each instance's delay share 30 ms, scaled by the union of the stretches
    its shares lie in over their sum, 30.01 / 60) too; rank 0 waits 30.01 ms, all owed to
    rank 1. Steps are 40 ms: nothing is capped."""
    gloo2 = (GLOO[0], GLOO[1] + 1)
    docs = []
    for rank, late in ((0, 0.0), (1, 30_000.0)):
        ev = []
        for n in (1, 2, 3):
            t = (n - 1) * 40_000.0
            end = t + 30_110.0 + 500.0
            ev += [
                step(n, t, 40_000.0),
                x("aten::mm", "cpu_op", t, 100.0 + late),
                x("gloo:all_reduce", "user_annotation", t + 100.0 + late, end - (t + 100.0 + late), GLOO),
                x("gloo:all_reduce", "user_annotation", t + 110.0 + late, end + 10 - (t + 110.0 + late), gloo2),
            ]
        docs.append(document(ev, rank, base_ns=None))
    a = run_analysis(tmp_path, docs)
    by = {r.rank: r for r in a.stragglers.ranks}
    assert by[1].late_ms == pytest.approx(30.01) and by[1].cost_ms == pytest.approx(30.01)
    assert a.stragglers.step_late[1][1] == pytest.approx(30_010.0)
    assert a.stragglers.step_wait[1][0] == pytest.approx(30_010.0)  # rank 0's wait, once
    assert by[0].waits_for == [[1, 30.01]]
    assert by[1].late_ms <= by[1].mean_step_ms and a.stragglers.verdict == "straggler"


def test_a_stub_step_is_left_out_and_no_jitter_is_made_of_it(tmp_path: Path) -> None:
    """`--steps 12` with the window at steps 11-13 (or a loop that breaks, then stops the
    profiler) leaves the last ProfilerStep a 0.15 ms stub. Rank 1 is 33 ms late in a 45 ms step:
    from steps of 45 and 0.15 ms the jitter bound was 3 x 22.4 ms and the run read balanced.
    The stub (1 op against 20) is left out and said; with one full step no jitter is estimated
    (said), and 33 ms beyond rank 0 exceeds 8% of the clean step (rank 0's own work, its 45 ms
    step less its 33 ms wait)."""
    docs = []
    for rank, arrive in ((0, 5_000.0), (1, 38_000.0)):
        ev = [
            step(11, 0.0, 45_000.0),
            *(x("aten::mm", "cpu_op", 100.0 + 200.0 * i, 150.0) for i in range(20)),
            x("aten::add", "cpu_op", arrive - 100.0, 90.0),
            x("gloo:all_reduce", "user_annotation", arrive, 38_500.0 - arrive, GLOO),
            step(12, 45_000.0, 150.0),
            x("aten::zeros", "cpu_op", 45_010.0, 20.0),
        ]
        docs.append(document(ev, rank, base_ns=None))
    a = run_analysis(tmp_path, docs)
    assert [[s.number for s in t.steps] for t in a.traces] == [[11], [11]]
    assert any(
        w.startswith("rank(s) 0-1: step 12 left out: cut short by the end of its profiler window") for w in a.warnings
    ), a.warnings
    assert any(
        w.startswith("step-to-step jitter not estimated: 1 full step(s) per rank, 3 needed") for w in a.warnings
    ), a.warnings
    res = a.stragglers
    assert res.bounds_ms["jitter"] == 0.0
    assert res.bounds_ms["relative"] == pytest.approx(0.08 * 12.0)
    assert res.verdict == "straggler" and [r.rank for r in res.stragglers] == [1]
    assert res.stragglers[0].late_ms == pytest.approx(33.0) and res.stragglers[0].beyond_peers_ms == pytest.approx(33.0)


def test_host_from_a_trace_handler_file_name(tmp_path: Path) -> None:
    # tensorboard_trace_handler writes <host>_<pid>.<time>.pt.trace.json: where the trace names
    # no host, the file does, when that pid is the trace's own (its main thread's process, 100)
    doc = document([step(1, 0, 1000), x("aten::mm", "cpu_op", 0, 100)], 0)
    assert parse_trace(write(tmp_path / "node7_100.1700000000123.pt.trace.json", doc)).host == "node7"
    assert parse_trace(write(tmp_path / "worker0_step_12.1700000000123.pt.trace.json", doc)).host == "unknown"
    doc["harness"] = {"host": "named", "rank": 0}
    assert parse_trace(write(tmp_path / "a" / "node7_100.1700000000123.pt.trace.json", doc)).host == "named"


def test_rank_from_file_name_when_distributed_info_is_missing(tmp_path: Path) -> None:
    doc = cpu_doc(0, 200.0)
    del doc["distributedInfo"]
    t = parse_trace(write(tmp_path / "worker3.pt.trace.json", doc))
    assert t.rank == 3 and t.rank_source == "file name"
    assert any("rank 3 taken from the file name" in w for w in t.warnings)


def test_steps_fall_back_to_one_window(tmp_path: Path) -> None:
    doc = cpu_doc(0, 200.0)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    t = parse_trace(write(tmp_path / "rank0.json", doc))
    assert t.steps_source == "whole trace" and len(t.steps) == 1
    assert any("whole trace is one step" in w for w in t.warnings)


def test_missing_and_duplicate_ranks_are_reported(tmp_path: Path) -> None:
    d0 = cpu_doc(0, 200.0)
    for doc in (d0,):
        doc["distributedInfo"]["world_size"] = 3
    paths = [write(tmp_path / "a" / "rank0.json", d0), write(tmp_path / "b" / "rank0.json", d0)]
    rs = group_ranks([parse_trace(p) for p in paths])
    assert rs.missing == [1, 2]
    assert len(rs.duplicates) == 1 and "duplicates" in rs.duplicates[0]


def test_traces_of_two_runs_are_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    for rank, run_id in ((0, "aaa"), (1, "bbb")):
        write(
            tmp_path / f"rank{rank}.pt.trace.json", cpu_doc(rank, 200.0) | {"harness": {"run_id": run_id, "rank": rank}}
        )
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 2
    assert "2 different runs are mixed" in proc.stderr and "collect one run at a time" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_c10d_ops_stand_in_when_there_are_no_gloo_ranges(tmp_path: Path) -> None:
    docs = []
    for rank, start in ((0, 200.0), (1, 400.0)):
        events = [
            step(0, 0, 1000),
            x("aten::mm", "cpu_op", 0, 300),
            x("c10d::allreduce_", "cpu_op", start, 500 - start),
        ]
        docs.append(document(events, rank, base_ns=None))
    a = run_analysis(tmp_path, docs)
    assert [i.name for i in a.instances] == ["allreduce"]
    assert {r.rank: r.wait_ms for r in a.stragglers.ranks} == {0: 0.2, 1: 0.0}
    assert any("c10d ops" in w for w in a.warnings)


def test_collectives_csv_rows(tmp_path: Path) -> None:
    from harness.report.document import collective_rows

    rows = list(collective_rows(run_analysis(tmp_path, gpu_docs())))
    assert [(r["instance"], r["rank"], r["wait_us"], r["transfer_us"], r["last_rank"]) for r in rows] == [
        (0, 0, 200.0, 200.0, 1),
        (0, 1, 0.0, 200.0, 1),
        (1, 0, 200.0, 200.0, 1),
        (1, 1, 0.0, 200.0, 1),
    ]
    assert rows[0]["arrival_us"] == 300.0 and rows[1]["arrival_us"] == 500.0


def test_collector_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, harness.collect.command, harness.report.merged; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_identical_kernel_intervals_inside_and_outside_a_step(tmp_path: Path) -> None:
    # Same start and duration, one launched inside step 1, one launched before any step: the
    # step's span starts with its own kernel, the two together are 50 us of its compute (busy
    # is whatever runs in the span); both count in the collective's run-up.
    g = GpuRank()
    g.kernel("k_in_step", 10, 100, 50)
    g.kernel("k_before_steps", -500, 100, 50)
    g.allreduce(20, 300, 100)
    doc = document([step(1, 0, 1000), *g.events], 0)
    trace = parse_trace(write(tmp_path / "rank0.pt.trace.json", doc))
    cover = trace.steps[0].cover  # window: the kernel's start to the all-reduce's end
    assert (cover.lo_us, cover.hi_us, cover.compute_us, cover.work_end_us) == (100.0, 400.0, 50.0, 150.0)
    assert trace.comms[0].run_up_start_us == 0.0
    assert trace.comms[0].run_up_us == {"op:k_in_step": 50.0, "op:k_before_steps": 50.0, IDLE: 250.0}
    windows = [write(tmp_path / f"w{i}" / f"rank0.{i}.pt.trace.json", doc) for i in (1, 2)]
    from harness.traces.read.discover import _merge_windows

    merged = _merge_windows([parse_trace(p) for p in windows])
    assert [s.cover.compute_us for s in merged.steps] == [50.0, 50.0]  # each window's step keeps its own


def test_odd_events_decode_or_are_left_out_with_a_warning(tmp_path: Path) -> None:
    """Producers that stray from the format: string timestamps, numeric names, args that are
    not objects, events that are not objects. What can be placed in time is kept."""
    events = [
        step(1, 0, 1000),
        x("aten::mm", "cpu_op", 100, 200),
        {**x("aten::sub", "cpu_op", 0, 0), "name": 7, "ts": "300.5", "dur": "10"},
        {**x("aten::add", "cpu_op", 400, 5), "args": "odd"},
        42,
        "not an event",
        x("aten::neg", "cpu_op", 500, -1),
        {**x("aten::abs", "cpu_op", 0, 1), "ts": True},
        {**x("aten::exp", "cpu_op", 0, 1), "dur": [1]},
    ]
    t = parse_trace(write(tmp_path / "rank0.pt.trace.json", document(events, 0)))
    cover = t.steps[0].cover  # compute: mm and add, in the step [0, 1000]
    assert (cover.compute_us, cover.idle) == (205.0, [(0.0, 100.0), (300.0, 400.0), (405.0, 1000.0)])
    assert t.steps[0].host_ops == 2  # mm and add; "7" is not an aten op; neg has no valid duration
    assert any("2 malformed event(s) left out" in w for w in t.warnings)


def _real_and_built_traces(tmp_path: Path) -> list[Path]:
    events = [
        step(1, 0, 1000),
        x("aten::mm", "cpu_op", 100, 200, shapes=[{"a": 1}, {"b": 2}]),
        x('odd }, { name "quoted"', "cpu_op", 300, 10),
        {"ph": "i", "name": "instant", "ts": 5, "pid": 1, "tid": 1},
        x("aten::add", "cpu_op", 400, 5),
    ]
    built = [
        write(tmp_path / "compact.pt.trace.json", document(events, 0)),
        write(tmp_path / "compact.pt.trace.json.gz", document(events, 1)),
        write(tmp_path / "empty.pt.trace.json", document([], 0)),
    ]
    indented = tmp_path / "indented.pt.trace.json"
    indented.write_text(json.dumps(document(events, 0, harness={"host": "h"}), indent=2))
    real = sorted(REAL_TRACES.glob("*/*.json.gz"))
    return built + [indented] + real


@pytest.mark.parametrize("block_bytes", [64, 4096, 1 << 20])
def test_streamed_decode_equals_whole_decode(tmp_path: Path, block_bytes: int) -> None:
    """Blocks cut at every size, between events and inside strings and nested arrays: the
    streamed events and top-level fields are exactly the whole-file decode's."""
    from harness.traces.read.decode import _decode_whole, _stream, decode_trace, open_trace

    for path in _real_and_built_traces(tmp_path):
        if block_bytes < 1024 and path.stat().st_size > 1 << 20:
            continue  # tiny blocks over the large real files only slow the suite down
        with open_trace(path) as fh:
            _stream(fh, block_bytes)  # the streamed path itself, not the whole-file fallback
        assert decode_trace(path, block_bytes) == _decode_whole(path), path.name


def test_releasing_what_the_analysis_read_changes_no_result(tmp_path: Path) -> None:
    """The collector's command lets the run-ups and the covers go once read (analyze_aligned's
    `release`): the same stragglers, phase included, overlap and gaps as keeping them. Four ranks
    on two hosts (the second's clock 300 us ahead, so the ranks are shifted copies), rank 2
    computing 300 us longer in every step."""
    from harness.traces.run_analysis import align_ranks, analyze_aligned

    docs = ring_docs(
        lambda r, s: 400.0 if r == 2 else 100.0, 4, 4, hosts=["a", "a", "b", "b"], clock_us=[0.0, 0.0, 300.0, 300.0]
    )
    paths = [write(tmp_path / f"rank{r}.pt.trace.json", d) for r, d in enumerate(docs)]
    results = []
    for release in (False, True):
        runset = group_ranks([parse_trace(p) for p in paths])
        results.append(analyze_aligned(runset, align_ranks(runset), release=release))
    kept, released = results
    [slow] = [b for b in kept.stragglers.ranks if b.straggler]
    assert slow.rank == 2 and slow.phase == "op:ampere_sgemm_128x64_nn"  # read from the run-ups
    assert kept.offsets[2].offset_us != 0.0
    for name in ("overlap", "gaps", "gaps_total", "offsets"):
        assert repr(getattr(released, name)) == repr(getattr(kept, name)), name
    assert repr(released.stragglers.ranks) == repr(kept.stragglers.ranks)
    assert all(s.cover is not None for t in kept.traces for s in t.steps)
    assert all(s.cover is None for t in released.traces for s in t.steps)
    assert not any(c.run_up_us for t in released.traces for c in t.comms)
