"""gloo's collectives given their process groups from the Flight Recorder entries the training
job writes beside each trace window (harness/traces/read/gloo_groups.py): exact answers on
hand-built entries and traces; the real 4-rank job is tests/test_api.py's tensor-parallel test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.paths import groups_path
from harness.traces.read.discover import find_trace_files, group_ranks
from harness.traces.read.gloo_groups import Issued, Ran, collective, sidecar_doc, thread_groups
from harness.traces.read.parse import parse_trace
from harness.traces.read.runup import IDLE
from harness.traces.run_analysis import analyze

from tracebuild import document, gpu_docs, shift_doc, step, write, x


def test_a_thread_s_group_is_the_one_most_of_its_ranges_were_issued_by() -> None:
    """Group "1" (tensor parallel) runs on threads a and b, group "2" (data parallel) on c and
    d. Group 2's third all-reduce, issued at 20, queues behind its two running ones and starts
    at 60, after group 1's issued at 50: its nearest earlier entry is group 1's, a wrong vote
    for thread c, which its other two ranges outvote."""
    issued = [
        Issued(0.0, "allreduce", "2", "dp"),
        Issued(10.0, "allreduce", "2", "dp"),
        Issued(20.0, "allreduce", "2", "dp"),
        Issued(50.0, "allreduce", "1", "tp"),
        Issued(100.0, "allreduce", "1", "tp"),
        Issued(200.0, "allreduce", "2", "dp"),
        Issued(300.0, "allreduce", "1", "tp"),
    ]
    ran = [
        Ran("c", 1.0, "allreduce"),
        Ran("d", 11.0, "allreduce"),
        Ran("a", 51.0, "allreduce"),
        Ran("c", 60.0, "allreduce"),  # group 2's third, queued: votes for group 1
        Ran("b", 101.0, "allreduce"),
        Ran("c", 201.0, "allreduce"),
        Ran("a", 301.0, "allreduce"),
    ]
    found = thread_groups(ran, issued)
    assert not isinstance(found, str), found
    assert {t: e.group for t, e in found.items()} == {"a": "1", "b": "1", "c": "2", "d": "2"}


def test_a_tie_and_a_thread_without_entries_are_refused_not_guessed() -> None:
    issued = [Issued(0.0, "allreduce", "1", "tp"), Issued(10.0, "allreduce", "2", "dp")]
    tie = thread_groups([Ran("a", 5.0, "allreduce"), Ran("a", 15.0, "allreduce")], issued)
    assert tie == "the gloo ranges of thread a are as near to group 1's entries as to group 2's"
    none = thread_groups([Ran("a", 5.0, "allgather")], issued)
    assert none == "no Flight Recorder entry precedes the gloo ranges of thread a"


def test_a_mapping_that_leaves_a_group_s_collectives_without_ranges_is_refused() -> None:
    """Both of thread a's ranges vote for group 2 (its entry at 10 is the nearest to each), so
    group 1's all-reduce issued at 0, after which the trace's first range starts, has no range
    to have run as. Issued before that first range (a window's first step's entries are
    written from the step before), it would not count."""
    issued = [Issued(0.0, "allreduce", "1", "tp"), Issued(10.0, "allreduce", "2", "dp")]
    found = thread_groups(
        [Ran("a", -5.0, "allreduce"), Ran("a", 20.0, "allreduce"), Ran("a", 30.0, "allreduce")], issued
    )
    assert found == "group 1's allreduce issued at 0 us has no range left to have run as"
    assert not isinstance(thread_groups([Ran("a", 20.0, "allreduce"), Ran("a", 30.0, "allreduce")], issued), str)


def test_the_sidecar_keeps_the_window_s_entries_as_the_join_reads_them() -> None:
    entries: list[dict[str, Any]] = [
        {"time_created_ns": 5, "profiling_name": "gloo:all_reduce", "process_group": ("1", "tp")},
        {"time_created_ns": 20, "profiling_name": "gloo:all_gather", "process_group": ["0", "default_pg"]},
        {"time_created_ns": 30, "profiling_name": "gloo:send", "process_group": None},
    ]
    doc = sidecar_doc(10, entries)
    assert doc["entries"] == [[20, "gloo:all_gather", "0", "default_pg"]] and doc["from_ns"] == 10
    assert collective("gloo:all_reduce") == "allreduce" and collective("gloo:reduce_scatter") == "reducescatter"


BASE_NS = 1_700_000_000_000_000_000
TP = {0: ("1", (0, 1)), 1: ("1", (0, 1)), 2: ("2", (2, 3)), 3: ("2", (2, 3))}  # a host's two ranks
DP = {0: ("3", (0, 2)), 1: ("4", (1, 3)), 2: ("3", (0, 2)), 3: ("4", (1, 3))}  # a place on each host
ISSUE_US = 200.0  # a gloo range starts this long after its entry was made (measured: ~0.2 ms)


def tp_dp_gloo_job(slow_rank: int, sleep_us: float, steps: int = 6) -> tuple[list[dict], list[list[list]]]:
    """Four CPU ranks on two hosts, each step on each rank: forward's ops (2000 us, plus
    `sleep_us` of sleep on `slow_rank`) then an all-reduce over its host's ranks (process group
    TP, on gloo threads of that group); backward's ops (3000 us) then the gradients' all-reduce
    over the ranks at its place on both hosts (group DP, its own threads). Each all-reduce ends
    200 us after its last rank arrives; the step ends with the data-parallel one, so steps end
    together. Between steps the harness watch's all-gather (its own group and thread, inside the
    main thread's harness:watch range). Each
    rank's recorder entries are made ISSUE_US before each range starts. Returns the traces and
    each rank's entries [time_created_ns, profiling name, group, desc]."""
    events: list[list[dict[str, Any]]] = [[] for _ in range(4)]
    entries: list[list[list]] = [[] for _ in range(4)]

    def gloo(r: int, name: str, group: str, desc: str, tid: int, a: float, b: float) -> None:
        events[r].append(x(f"gloo:{name}", "user_annotation", a, b - a, (100, tid)))
        entries[r].append([BASE_NS + int((a - ISSUE_US) * 1000), f"gloo:{name}", group, desc])

    t = 1000.0
    for n in range(1, steps + 1):
        fwd = {r: t + 2000.0 + (sleep_us if r == slow_rank else 0.0) for r in range(4)}
        tp_end = {r: max(fwd[q] for q in TP[r][1]) + 200.0 for r in range(4)}
        bwd = {r: tp_end[r] + 3000.0 for r in range(4)}
        dp_end = {r: max(bwd[q] for q in DP[r][1]) + 200.0 for r in range(4)}
        for r in range(4):
            ev = events[r]
            ev += [
                step(n, t, dp_end[r] - t),
                x("harness:forward", "user_annotation", t, fwd[r] - t),
                x("aten::mm", "cpu_op", t, 2000.0),
                x("harness:backward", "user_annotation", tp_end[r], bwd[r] - tp_end[r]),
                x("aten::mm", "cpu_op", tp_end[r], 3000.0),
            ]
            gloo(r, "all_reduce", TP[r][0], "tp", 201 + n % 2, fwd[r], tp_end[r])
            gloo(r, "all_reduce", DP[r][0], "dp", 301 + n % 2, bwd[r], dp_end[r])
            if n < steps:
                gloo(r, "all_gather", "5", "harness_watch", 401, dp_end[r] + 10.0, dp_end[r] + 60.0)
                ev.append(x("harness:watch", "user_annotation", dp_end[r] + 5.0, 60.0))
        t = max(dp_end.values()) + 100.0
    docs = []
    for r in range(4):
        doc = document(events[r], r, world_size=4, base_ns=BASE_NS)
        doc["distributedInfo"]["pg_config"] = [
            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
            {"pg_name": TP[r][0], "pg_desc": "tp", "pg_size": 2, "ranks": list(TP[r][1])},
            {"pg_name": DP[r][0], "pg_desc": "dp", "pg_size": 2, "ranks": list(DP[r][1])},
            {"pg_name": "5", "pg_desc": "harness_watch", "pg_size": 4, "ranks": [0, 1, 2, 3]},
        ]
        docs.append(doc)
    return docs, entries


def write_job(folder: Path, docs: list[dict], entries: list[list[list]] | None, skew_us: float = 0.0) -> list[Path]:
    """The traces (and with `entries` their groups files) as the harness names them; ranks 2 and
    3 (the second host) with their clock `skew_us` ahead, in the trace and the entries alike."""
    paths = []
    for r, doc in enumerate(docs):
        skew = skew_us if r >= 2 else 0.0
        path = write(folder / f"rank{r:05d}-host{r // 2}.0001.pt.trace.json.gz", shift_doc(doc, skew))
        if entries is not None:
            shifted = [[t + int(skew * 1000), *rest] for t, *rest in entries[r]]
            groups_path(path).write_text(json.dumps({**sidecar_doc(BASE_NS, []), "entries": shifted}))
        paths.append(path)
    return paths


def test_gloo_collectives_take_their_groups_from_the_recorder_and_the_slow_rank_is_named(tmp_path: Path) -> None:
    """Rank 1 sleeps 600 us in forward each step (the clean step: 5400 us). Rank 0 waits for it
    at their tensor-parallel all-reduce, then reaches its data-parallel one with rank 2 600 us
    after it: held, not late. Given its groups, every collective is matched with its own
    group's (not rank 0's tensor-parallel all-reduce with rank 2's), rank 1 alone is named, in
    forward, 600 us late a step; the watch's all-gathers are not the job's communication. The
    second host's clock runs 5 ms ahead (trace and recorder alike)."""
    docs, entries = tp_dp_gloo_job(1, 600.0)
    paths = write_job(tmp_path, docs, entries, skew_us=5000.0)
    assert find_trace_files([str(tmp_path)]) == paths  # the groups files are not traces
    traces = [parse_trace(p) for p in paths]
    assert all(not t.unnamed_groups for t in traces), [t.warnings for t in traces]
    assert [sorted({c.pg for c in t.comms}) for t in traces] == [["1", "3"], ["1", "4"], ["2", "3"], ["2", "4"]]
    assert all(len(t.comms) == 12 for t in traces)  # two all-reduces a step; no watch all-gather
    s = analyze(group_ranks(traces)).stragglers
    assert s.verdict == "straggler"
    assert [(r.rank, r.phase) for r in s.stragglers] == [(1, "forward")]
    late = {r.rank: r.late_ms for r in s.ranks}
    assert late[1] == pytest.approx(0.6, abs=0.005)
    assert late[0] == pytest.approx(0.0, abs=0.005) and late[2] == late[3] == pytest.approx(0.0, abs=0.005)


def test_without_the_groups_files_the_collector_says_it_cannot_match(tmp_path: Path) -> None:
    docs, _ = tp_dp_gloo_job(1, 600.0)
    traces = [parse_trace(p) for p in write_job(tmp_path, docs, None)]
    assert traces[0].unnamed_groups == [[0, 1], [0, 2]]
    assert any("no rank00000-host0.0001.pt.trace.json.gz.groups.json beside it" in w for w in traces[0].warnings)
    s = analyze(group_ranks(traces)).stragglers
    assert s.verdict == "inconclusive"


def test_a_clean_gloo_job_of_two_groups_is_balanced(tmp_path: Path) -> None:
    docs, entries = tp_dp_gloo_job(1, 0.0)
    traces = [parse_trace(p) for p in write_job(tmp_path, docs, entries, skew_us=5000.0)]
    assert analyze(group_ranks(traces)).stragglers.verdict == "balanced"


def split_windows(doc: dict, at_us: float) -> list[dict]:
    """The trace as two profiler windows: the events starting before `at_us`, and the rest."""
    events = doc["traceEvents"]
    return [
        {**doc, "traceEvents": [e for e in events if e["ts"] < at_us]},
        {**doc, "traceEvents": [e for e in events if e["ts"] >= at_us]},
    ]


def test_a_rank_s_windows_merged_keep_its_groups_and_its_op_floor(tmp_path: Path) -> None:
    """Two windows a rank (steps 1-3, 4-6). Without groups files each window's collectives are
    unmatchable and so is the merged rank's (it was matched by position once merged, pairing
    rank 0's tensor-parallel all-reduces with rank 2's); with them, rank 1 is named as from one
    window. A bare op's cost (RankTrace.op_floor_us) is the median of the windows'."""
    docs, entries = tp_dp_gloo_job(1, 600.0)
    cut = 1000.0 + 3 * 6100.0 - 50.0  # a slow step is 6000 us, and 100 us lie between steps
    for with_groups in (False, True):
        folder = tmp_path / str(with_groups)
        paths = []
        for r, doc in enumerate(docs):
            for w, part in enumerate(split_windows(doc, cut), start=1):
                if r == 0:  # 20 bare ops of 0.5 us (window 1) and 0.7 us (window 2)
                    t0 = part["traceEvents"][0]["ts"]
                    dur = 0.5 if w == 1 else 0.7
                    part["traceEvents"] += [x("aten::as_strided", "cpu_op", t0 + 3000 + i, dur) for i in range(20)]
                path = write(folder / f"rank{r:05d}-host{r // 2}.{w:04d}.pt.trace.json.gz", part)
                if with_groups:  # as the job writes them: up to the window's end, from the step before its first
                    lo_us, hi_us = (0.0, cut) if w == 1 else (cut - 6100.0, float("inf"))
                    kept = [e for e in entries[r] if lo_us <= (e[0] - BASE_NS) / 1000 < hi_us]
                    groups_path(path).write_text(json.dumps({**sidecar_doc(BASE_NS, []), "entries": kept}))
                paths.append(path)
        runset = group_ranks([parse_trace(p) for p in paths])
        rank0 = runset.ranks[0]
        assert len(rank0.paths) == 2 and rank0.op_floor_us == pytest.approx(0.6)
        s = analyze(runset).stragglers
        if with_groups:
            assert [(r.rank, r.phase) for r in s.stragglers] == [(1, "forward")]
        else:
            assert rank0.unnamed_groups == [[0, 1], [0, 2]] and s.verdict == "inconclusive"


def test_the_watch_s_exchange_is_not_the_job_s_communication(tmp_path: Path) -> None:
    """The watch exchanges between steps, inside the main thread's `harness:watch` range, on its
    own group's gloo thread (tid 150): its all-gathers are left out, and the range is no phase.
    The job's own all-reduce that starts there (a bucket of its thread 101, whose other
    all-reduce is outside) is kept."""
    events = [
        step(1, 0.0, 1000.0),
        x("harness:forward", "user_annotation", 0.0, 400.0),
        x("gloo:all_reduce", "user_annotation", 500.0, 300.0, (100, 101)),
        step(2, 1000.0, 1000.0),
        x("harness:watch", "user_annotation", 1000.0, 300.0),
        x("gloo:all_gather", "user_annotation", 1010.0, 100.0, (100, 150)),
        x("gloo:all_gather", "user_annotation", 1150.0, 100.0, (100, 150)),
        x("gloo:all_reduce", "user_annotation", 1200.0, 50.0, (100, 101)),
        x("harness:forward", "user_annotation", 1300.0, 400.0),
    ]
    trace = parse_trace(write(tmp_path / "rank0.pt.trace.json.gz", document(events, 0)))
    assert [(c.name, c.start_us) for c in trace.comms] == [("allreduce", 500.0), ("allreduce", 1200.0)]
    assert [sorted(s.phases_us) for s in trace.steps] == [["forward"], ["forward"]]


def test_the_watch_s_exchange_ends_a_cpu_run_up_as_a_collective_does(tmp_path: Path) -> None:
    """Every rank leaves the watch's all-gather together, so what a rank did before it is not its
    run-up to the next collective: here it waited 550 us in the exchange for a later peer (in
    the main thread's harness:watch range, 1000-1600), then ran 200 us of ops and arrived at its
    all-reduce at 1900. The run-up starts at 1600: 200 us of aten::mm and 100 us idle, not the
    wait (from the all-reduce's end at 500 it would be 1400 us with 1200 idle). On a GPU the host
    runs ahead of its device, whose run-ups a host-side wait does not bound: there the run-up
    still starts at the previous all-reduce's end."""
    events = [
        step(1, 0.0, 1000.0),
        x("aten::mm", "cpu_op", 0.0, 300.0),
        x("gloo:all_reduce", "user_annotation", 400.0, 100.0, (100, 101)),
        step(2, 1000.0, 1000.0),
        x("harness:watch", "user_annotation", 1000.0, 600.0),
        x("gloo:all_gather", "user_annotation", 1550.0, 40.0, (100, 150)),
        x("aten::mm", "cpu_op", 1650.0, 200.0),
        x("gloo:all_reduce", "user_annotation", 1900.0, 50.0, (100, 101)),
    ]
    trace = parse_trace(write(tmp_path / "rank0.pt.trace.json.gz", document(events, 0)))
    last = trace.comms[-1]
    assert [c.start_us for c in trace.comms] == [400.0, 1900.0]
    assert last.run_up_start_us == 1600.0 and dict(last.run_up_us) == {"op:aten::mm": 200.0, IDLE: 100.0}
    gpu = gpu_docs()[0]
    gpu["traceEvents"].append(x("harness:watch", "user_annotation", 1005.0, 100.0))
    trace = parse_trace(write(tmp_path / "gpu0.pt.trace.json.gz", gpu))
    assert [(c.start_us, c.run_up_start_us) for c in trace.comms] == [(300.0, 0.0), (1300.0, 700.0)]
