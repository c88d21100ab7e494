"""Waiting vs transfer, every straggler, victims, what-if, verdicts and clocks on hand-built
traces whose answers are known exactly (issue: diagnosis you can act on)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.document import build_report
from harness.report.records import as_document
from harness.traces.align.waits import attribute
from harness.traces.analyse.collective_stats import bus_factor, collective_stats, message_bytes

from jobs import REPO, said
from tracebuild import cpu_ring_docs, ring_docs, run_analysis, shift_doc, write


def test_shares_of_one_collective() -> None:
    # ranks 0, 1 at 0; rank 2 at 400; rank 3 at 402: the 400 us gap is shared by 2 and 3, the
    # last 2 us belong to rank 3 alone
    delay, blame = attribute({0: 0.0, 1: 0.0, 2: 400.0, 3: 402.0})
    assert delay == {0: 0.0, 1: 0.0, 2: 200.0, 3: 202.0}
    # waits: 402 + 402 + 2 + 0 = 806 = 400 (2 waiters x 400 / 2) + 406 (400 + 3 waiters x 2)
    assert blame == {0: 0.0, 1: 0.0, 2: 400.0, 3: 406.0}
    assert attribute({5: 10.0}) == ({5: 0.0}, {5: 0.0})


def late_ranks(late: dict[int, float], on_time: float = 300.0):
    return lambda r, s: late.get(r, on_time)


def test_two_stragglers_on_eight_ranks(tmp_path: Path) -> None:
    # ranks 1 and 3 arrive at 700 us, the other six at 300 us, in each of three 1 ms steps
    a = run_analysis(tmp_path, ring_docs(late_ranks({1: 700.0, 3: 700.0}), 8, 3))
    res = a.stragglers
    assert res.verdict == "straggler"
    # each arrives 0.4 ms after the punctual ranks, and half of the 0.4 ms delay is owed to each
    assert [(s.rank, s.late_ms, s.cost_ms, s.pattern, s.steps_late, s.late_fraction) for s in res.stragglers] == [
        (1, pytest.approx(0.4), pytest.approx(0.2), "persistent", 3, 1.0),
        (3, pytest.approx(0.4), pytest.approx(0.2), "persistent", 3, 1.0),
    ]
    by = {r.rank: r for r in res.ranks}
    # each victim waits 400 us a step, half of it on each straggler
    for victim in (0, 2, 4, 5, 6, 7):
        assert by[victim].waits_for == [[1, 0.2], [3, 0.2]]
        assert by[victim].wait_ms == pytest.approx(1.2)
    # what-if by replay, on the device's step spans (1000, 1000, then 800 us: the last ends at its
    # all-reduce's end): run-up to the all-reduce, 100 us transfer, the rest of the span; either
    # straggler alone changes nothing (the other is still late), both: 300 + 100 + 200 (0 in the last)
    assert res.measured_step_ms == pytest.approx(2.8 / 3)
    assert res.replayed_step_ms == pytest.approx(2.8 / 3)
    assert [s.whatif_step_ms for s in res.stragglers] == [pytest.approx(2.8 / 3), pytest.approx(2.8 / 3)]
    assert res.whatif_all_fixed_step_ms == pytest.approx(1.6 / 3)
    doc = as_document(build_report(a, ["x"]))
    assert [s["rank"] for s in doc["stragglers"]] == [1, 3]
    assert "rank 1" in doc["headline"] and "rank 3" in doc["headline"]
    assert doc["run"]["whatif_all_fixed_step_ms"] == pytest.approx(1.6 / 3)
    d0 = doc["diagnosis"][0]
    # its own work: the device idle 25% of it (the step's tail after the all-reduce), beyond the
    # material share, with compute the largest part
    assert d0["bottleneck"] == "host-bound" and d0["waits_for"] == [[1, 0.2], [3, 0.2]]
    assert "waiting on rank 1 (0.20 ms), rank 3 (0.20 ms)" in d0["reason"]
    assert [n["about"] for n in doc["next_steps"]][:3] == ["straggler", "straggler", "straggler"]
    assert doc["next_steps"][2]["ranks"] == [1, 3] and "~0.53 ms" in doc["next_steps"][2]["text"]


def test_intermittent_straggler(tmp_path: Path) -> None:
    # rank 1 arrives 600 us late in step 2 only
    a = run_analysis(tmp_path, ring_docs(lambda r, s: 900.0 if (r, s) == (1, 2) else 300.0, 2, 3))
    [s] = a.stragglers.stragglers
    assert (s.rank, s.pattern, s.steps_late, s.steps, s.cost_ms) == (1, "intermittent", 1, 3, pytest.approx(0.2))
    assert s.late_fraction == pytest.approx(1 / 3)
    doc = as_document(build_report(a, ["x"]))
    assert "late in 1 of 3 steps" in doc["headline"]
    assert "late in 1 of 3 steps only" in doc["next_steps"][0]["text"]
    assert "collect them with --window each" in doc["next_steps"][0]["text"]  # how to tell it from noise


def test_short_steps_lag_is_not_hidden_by_a_floor(tmp_path: Path) -> None:
    # 1 ms steps, rank 0 arrives 0.3 ms after rank 1 at every all-reduce, clocks exact
    a = run_analysis(tmp_path, ring_docs(lambda r, s: 600.0 if r == 0 else 300.0, 2, 4))
    assert all(o.offset_us == 0 for o in a.offsets.values())
    [s] = a.stragglers.stragglers
    assert (s.rank, s.cost_ms, s.pattern) == (0, pytest.approx(0.3), "persistent")
    # 8% of the clean step, the punctual rank 1's own work on the device: spans of 1000 us but the
    # last (700: to the all-reduce's end), less its 300 us wait in each: 625 us
    assert a.stragglers.threshold_ms == pytest.approx(0.08 * 0.625)


def test_victim_waiting_is_not_exposed_transfer(tmp_path: Path) -> None:
    # rank 0 arrives at 100 us, rank 1 at 1000 us of a 1.2 ms step; 100 us transfer: rank 0's
    # exposed communication is 900 us waiting + 100 us transfer; its device spans are 1.2 ms
    # (to the next step's first kernel: 100 us idle at its end) and 1.1 ms (the last ends with
    # its work), 0.5 ms of them its own: exposed transfer is 40% of that
    a = run_analysis(tmp_path, ring_docs(lambda r, s: 100.0 if r == 0 else 1000.0, 2, 2, period_us=1200.0))
    doc = as_document(build_report(a, ["x"]))
    r0 = doc["ranks"][0]
    assert (r0["exposed_comm_ms"], r0["exposed_wait_ms"], r0["exposed_transfer_ms"]) == (2.0, 1.8, 0.2)
    assert r0["exposed_wait_ms"] + r0["exposed_transfer_ms"] == pytest.approx(r0["exposed_comm_ms"], abs=0.01)
    step_row = doc["steps"][0]
    assert (step_row["exposed_wait_ms"], step_row["exposed_transfer_ms"]) == (0.9, 0.1)
    assert {g["kind"] for g in doc["gaps"] if g["rank"] == 0} == {"exposed_wait", "exposed_transfer", "idle"}
    d0 = doc["diagnosis"][0]
    # the waiting is not transfer: 40% of its own device time is, not the 90% the waiting would add
    assert d0["waits_for"] == [[1, 0.9]]
    assert d0["evidence"]["waiting_share"] == 0.75 and d0["evidence"]["exposed_transfer_share"] == 0.4
    assert "75% of its step is waiting on rank 1" in d0["reason"] and "rank(s) 1" in d0["advice"]
    assert doc["process_groups"] == [
        {
            "pg": "0",
            "ranks": [0, 1],
            "collectives": 2,
            "comm_ms": 2.2,
            "exposed_wait_ms": 1.8,
            "exposed_transfer_ms": 0.4,
            "wait_ms": 1.8,
            "transfer_ms": 0.2,
        }
    ]


def test_no_matched_collective_is_inconclusive(tmp_path: Path) -> None:
    # the ranks disagree on the all-reduce's size: nothing matches
    a = run_analysis(tmp_path, ring_docs(late_ranks({1: 700.0}), 2, 2, nelems=[1000, 2000]))
    doc = as_document(build_report(a, ["x"]))
    assert doc["verdict"] == "inconclusive" and doc["stragglers"] == []
    assert doc["verdict_reason"].startswith("no collective matched")
    assert doc["headline"].startswith("inconclusive: no collective matched")
    assert all(d["waits_for"] == [] for d in doc["diagnosis"])
    assert doc["next_steps"][0]["about"] == "inconclusive"


def test_one_rank_is_inconclusive(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, ring_docs(late_ranks({}), 2, 2)[:1])
    assert (a.stragglers.verdict, a.stragglers.reason) == (
        "inconclusive",
        "one rank only: there is no peer to compare it with",
    )


def test_ranks_on_one_host_share_its_clock(tmp_path: Path) -> None:
    # hosts h0 (ranks 0, 1) and h1 (ranks 2, 3, clock 5 ms ahead); ranks 1 and 3 complete each
    # collective 30 us after their host peer: per rank that would read as a 30 us clock offset
    docs = ring_docs(
        late_ranks({}), 4, 3, hosts=["h0", "h0", "h1", "h1"], clock_us=[0, 0, 5000, 5000], end_scatter_us=[0, 30, 0, 30]
    )
    a = run_analysis(tmp_path, docs)
    assert {r: o.offset_us for r, o in a.offsets.items()} == {0: 0.0, 1: 0.0, 2: 5000.0, 3: 5000.0}
    assert [(c.host, c.ranks, c.offset_us, c.samples) for c in a.host_clocks] == [
        ("h0", [0, 1], 0.0, 0),
        ("h1", [2, 3], 5000.0, 3),
    ]
    doc = as_document(build_report(a, ["x"]))
    assert [(h["host"], h["offset_ms"]) for h in doc["clock"]["hosts"]] == [("h0", 0.0), ("h1", 5.0)]
    assert doc["verdict"] == "balanced"


def test_a_rank_whose_clock_disagrees_with_its_hosts_gets_its_own(tmp_path: Path) -> None:
    # hosts h0 (ranks 0, 1) and h1 (ranks 2, 3, 4, clock 5 ms ahead); rank 4's clock is 23 ms
    # ahead of its host-mates' (its own container): its all-reduces start after theirs end,
    # impossible on one clock. Trusting the host name, rank 4 read 23 ms late (a straggler) and
    # shifted h1's offset; checked, it is aligned on its own clock and the run is balanced.
    docs = ring_docs(late_ranks({}), 5, 3, hosts=["h0", "h0", "h1", "h1", "h1"], clock_us=[0, 0, 5000, 5000, 28000])
    a = run_analysis(tmp_path, docs)
    assert {r: o.offset_us for r, o in a.offsets.items()} == {0: 0.0, 1: 0.0, 2: 5000.0, 3: 5000.0, 4: 28000.0}
    assert a.warnings == [
        "rank 4 on h1: its collectives end a steady 23.000 ms after its host-mates', which on one clock "
        "they cannot (a collective ends together on every rank): aligned on a clock of its own"
    ]
    assert a.stragglers.verdict == "balanced"
    # two ranks on a host that disagree: neither can be told right, each gets its own clock
    docs = ring_docs(late_ranks({}), 2, 3, hosts=["h0", "h0"], clock_us=[0, 23000])
    a = run_analysis(tmp_path / "two", docs)
    assert {r: o.offset_us for r, o in a.offsets.items()} == {0: 0.0, 1: 23000.0}
    assert len(a.warnings) == 2 and a.stragglers.verdict == "balanced"


def test_a_clock_off_by_less_than_the_waits_is_still_its_own(tmp_path: Path) -> None:
    # 4 CPU ranks on one host name, rank 3 sleeping 40 ms a step before each all-reduce; rank 2's
    # trace is 23.4 ms ahead. Its all-reduces still overlap its peers' (they wait 40 ms), so no
    # op is impossible on one clock, but they end a steady 23.4 ms after everyone's: its own clock.
    # Read on the host's clock, rank 2 was a 23 ms straggler beside rank 3.
    docs = cpu_ring_docs(4, 6, sleep_us=lambda r, s: 40000.0 if r == 3 else 0.0)
    for r, d in enumerate(docs):
        d["harness"] = {"host": "h0", "rank": r}
    docs[2] = shift_doc(docs[2], 23400.0)
    a = run_analysis(tmp_path, docs)
    assert a.offsets[2].offset_us == pytest.approx(23400.0)
    assert [r for r, o in a.offsets.items() if o.offset_us] == [2]
    assert any(w.startswith("rank 2 on h0: its collectives end a steady 23.400 ms after") for w in a.warnings)
    assert [s.rank for s in a.stragglers.stragglers] == [3]


def test_collective_table_bus_bandwidth(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, ring_docs(late_ranks({}), 8, 3))
    [row] = collective_stats(a.waits)
    # 1000 floats = 4000 bytes, 3 all-reduces of 100 us: algbw = 12000 B / 300 us = 0.04 GB/s,
    # busbw = algbw x 2 x 7 / 8
    assert (row["name"], row["ranks"], row["bytes"], row["count"], row["transfer_ms"]) == ("allreduce", 8, 4000, 3, 0.3)
    assert (row["algbw_gbps"], row["busbw_gbps"]) == (0.04, 0.07)
    assert bus_factor("allgather", 4) == 0.75 and bus_factor("broadcast", 4) == 1.0
    assert message_bytes("allgather", 10, "c10::BFloat16", 4) == 80 and message_bytes("allreduce", 10, None, 4) is None


def test_steps_not_in_the_traces_exit_2(tmp_path: Path) -> None:
    for r, d in enumerate(ring_docs(late_ranks({}), 2, 3)):
        write(tmp_path / f"rank{r}.pt.trace.json", d)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(tmp_path), "--steps", "40-45", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "harness.collect: error: none of the requested steps (40-45) is in the traces, "
        "which hold steps 1-3: pick steps from those"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(tmp_path), "-q", "--no-merged"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert doc["verdict"] == "balanced"
    assert said(proc.stdout, "next") == [n["text"] for n in doc["next_steps"]]


def test_the_clock_check_reads_only_steady_symmetric_collectives() -> None:
    from harness.traces.align.clocks import disagreeing_clocks
    from harness.traces.align.matching import Instance
    from harness.traces.model import CommOp, RankTrace

    traces = [
        RankTrace(rank=r, world_size=3, host="h0", run_id=None, device="gpu", steps=[], comms=[]) for r in range(3)
    ]

    def inst(name: str, k: int, spans: dict[int, tuple[float, float]]) -> Instance:
        ops = {r: CommOp(name=name, pg="0", start_us=a, end_us=b) for r, (a, b) in spans.items()}
        return Instance(key=("0", k), name=name, pg="0", step=None, ops=ops)

    # a broadcast root finishes before its peers arrive, on one clock: no clock is blamed
    bcast = [
        inst(
            "broadcast",
            k,
            {0: (1e4 * k, 1e4 * k + 10), 1: (1e4 * k + 500, 1e4 * k + 900), 2: (1e4 * k + 600, 1e4 * k + 900)},
        )
        for k in range(6)
    ]
    assert disagreeing_clocks(bcast, traces) == {}
    # all-reduces whose rank 2 is 5 ms off every time: its own clock
    steady = [
        inst(
            "allreduce",
            k,
            {0: (1e4 * k, 1e4 * k + 300), 1: (1e4 * k + 50, 1e4 * k + 300), 2: (1e4 * k + 5100, 1e4 * k + 5300)},
        )
        for k in range(6)
    ]
    assert disagreeing_clocks(steady, traces) == {2: 5000.0}
    # rank 2 off by 1 ms, then 5 ms, then 9 ms...: collectives matched wrongly, not a clock
    drifting = [
        inst(
            "allreduce",
            k,
            {
                0: (1e4 * k, 1e4 * k + 300),
                1: (1e4 * k + 50, 1e4 * k + 300),
                2: (1e4 * k + 1000 + 4000 * k, 1e4 * k + 1300 + 4000 * k),
            },
        )
        for k in range(6)
    ]
    assert disagreeing_clocks(drifting, traces) == {}


def test_on_cpu_a_waiters_late_wake_up_is_no_clock_but_an_offset_in_both_roles_is() -> None:
    """Two ranks of one host (the gap test alone: with two, the higher rank is the one named).
    Rank 1 always arrives last (a straggler) and rank 0, which waited, ends 2.3 ms after it every
    time: a gloo thread woken late on a busy core. On GPU devices that gap reads as a clock; on
    shared CPU cores it does not. A true offset of 5 ms on rank 1, with the arrival order
    alternating (each waiting at half the instances, waking 0.3 ms late), is a clock on both."""
    from harness.traces.align.clocks import disagreeing_clocks
    from harness.traces.align.matching import Instance
    from harness.traces.analyse.noise import GPU, SHARED_CPU
    from harness.traces.model import CommOp, RankTrace

    traces = [
        RankTrace(rank=r, world_size=2, host="h0", run_id=None, device="cpu", steps=[], comms=[]) for r in range(2)
    ]

    def inst(k: int, spans: dict[int, tuple[float, float]]) -> Instance:
        ops = {r: CommOp(name="allreduce", pg="0", start_us=a, end_us=b) for r, (a, b) in spans.items()}
        return Instance(key=("0", k), name="allreduce", pg="0", step=None, ops=ops)

    woken_late = [inst(k, {0: (1e5 * k, 1e5 * k + 62_600), 1: (1e5 * k + 60_000, 1e5 * k + 60_300)}) for k in range(8)]
    assert disagreeing_clocks(woken_late, traces, GPU) == {1: -2300.0}
    assert disagreeing_clocks(woken_late, traces, SHARED_CPU) == {}

    def offset(k: int) -> Instance:
        t, first, last = 1e5 * k, k % 2, 1 - k % 2  # the rank arriving first alternates
        spans = {first: (t, t + 20_600), last: (t + 20_000, t + 20_300)}
        return inst(k, {r: (a + 5000, b + 5000) if r == 1 else (a, b) for r, (a, b) in spans.items()})

    shifted = [offset(k) for k in range(8)]
    assert set(disagreeing_clocks(shifted, traces, SHARED_CPU)) == {1}
    assert set(disagreeing_clocks(shifted, traces, GPU)) == {1}
