"""Many ranks in a few words (rank_list.py) and stragglers alike named together beyond four
(document.headline, next_steps): exact texts, on a hand-built 1024-rank report with one slow rank
per host of eight."""

from __future__ import annotations

from dataclasses import replace

from reportbuild import report_of, run_record, straggler_record

from harness.report.document import headline, next_steps
from harness.report.records import StragglerRecord
from harness.traces.analyse.rank_list import rank_runs, ranks_phrase


def test_few_ranks_are_listed_in_the_order_given_and_many_as_runs() -> None:
    assert ranks_phrase([3]) == "rank 3"
    assert ranks_phrase([1, 7, 5, 7]) == "ranks 1, 7, 5"
    assert ranks_phrase(range(16)) == "ranks " + ", ".join(map(str, range(16)))
    assert rank_runs([0, 1, 2, 5, 7, 9, 11, 20]) == [(0, 2, 1), (5, 11, 2), (20, 20, 1)]
    assert rank_runs([0, 10, 11]) == [(0, 0, 1), (10, 10, 1), (11, 11, 1)]
    slow = range(7, 1024, 8)
    assert ranks_phrase(slow, range(1024)) == "128 ranks [7-1023 every 8th]"
    others = [r for r in range(1024) if r % 8 != 7]
    assert ranks_phrase(others, range(1024)) == "896 ranks [all but 7-1023 every 8th]"
    assert ranks_phrase(others) == "896 ranks [0-6, 8-14, 16-22, 24-30, 32-38, 40-46, 48-54, 56-62 and 840 more]"
    squares = [i * i for i in range(20)]
    assert ranks_phrase(squares) == "20 ranks [0, 1, 4, 9, 16, 25, 36, 49 and 12 more]"
    assert ranks_phrase(list(range(0, 40, 2)) + list(range(100, 133, 3)) + [211, 312, 413]) == (
        "34 ranks [0-38 every 2nd, 100-130 every 3rd, 211-413 every 101st]"
    )
    assert ranks_phrase(range(0, 260, 13)) == "20 ranks [0-247 every 13th]"


def _straggler(rank: int, late_ms: float, phase: str | None, whatif_ms: float) -> StragglerRecord:
    return straggler_record(
        rank,
        host=f"node{rank // 8:04d}",
        late_ms=late_ms,
        beyond_peers_ms=late_ms,
        phase=phase,
        whatif_step_ms=whatif_ms,
    )


def test_stragglers_alike_are_named_together_beyond_four() -> None:
    stragglers = [_straggler(r, 8.0 + (r % 3) / 100, "idle (waiting on the host)", 14.0) for r in range(7, 1024, 8)]
    stragglers.append(_straggler(1000, 9.5, "op:gemm", 13.5))
    stragglers.sort(key=lambda s: (-s.late_ms, s.rank))
    assert headline("straggler", stragglers, []) == (
        "straggler: rank 1000 on node0125 is late (spends longer in gemm), 9.50 ms per step; "
        "128 ranks [7-1023 every 8th] on 128 hosts are late (their devices sit idle waiting on their hosts), "
        "8.00-8.02 ms per step"
    )
    run = run_record(
        replayed_step_ms=14.0,
        measured_step_ms=14.5,
        replay_faithful=True,
        median_step_ms=16.0,
        whatif_all_fixed_step_ms=12.5,
        ranks_present=list(range(1024)),
    )
    doc = report_of(verdict="straggler", stragglers=stragglers, run=run)
    texts = [n.text for n in next_steps(doc)]
    assert texts == [
        "Rank 1000: it spends longer in `gemm` than its peers: check its inputs (uneven shapes/load) and its hardware. "
        "Fixed, the step would take ~13.50 ms instead of ~14.00 ms (both replayed; measured 14.50 ms).",
        "128 ranks [7-1023 every 8th], each: its device idles before collectives while its host is busy: look at that "
        "rank's host side (input pipeline, Python overhead, CPU contention, syncs). Fixing one of them alone leaves "
        "the step at ~14.00 ms (replayed; measured 14.50 ms).",
        "Fixing 129 ranks [7-999 every 8th, 1000, 1007-1023 every 8th] together would bring the step from ~14.00 ms to "
        "~12.50 ms (replayed).",
    ]
    assert sorted(next_steps(doc)[1].ranks) == list(range(7, 1024, 8))  # all of them in report.json
    assert headline("balanced", [], list(range(100, 140))) == (
        "balanced: no rank keeps the others waiting beyond the noise (incomplete: 40 ranks [100-139] missing)"
    )
    some = [replace(s, whatif_step_ms=13.9 if s.rank == 15 else 14.0) for s in stragglers]
    assert (
        "Fixed one at a time, the step would take ~13.90-14.00 ms instead of ~14.00 ms"
        in next_steps(replace(doc, stragglers=some))[1].text
    )
    four = stragglers[:4]
    assert headline("straggler", four, []).count("; ") == 3  # four or fewer: one by one, as before
    assert len(next_steps(replace(doc, stragglers=four))) == 5
