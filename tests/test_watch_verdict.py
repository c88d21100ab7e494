"""The run's verdict from the traced window and the live watch together
(harness/report/watch_verdict.py): exact documents, the windows' comparison, and
`python -m harness.collect` on hand-built traces with the watch's record in run.json."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
from reportbuild import (
    flag,
    next_step,
    noise_floor,
    report_of,
    run_record,
    straggler_record,
    watch_of,
    window_of,
)

from harness.paths import trace_path
from harness.report.across_windows import WindowVerdict, across_windows, summary_lines, window_verdict
from harness.report.document import build_report
from harness.report.records import Report, WatchStragglerRecord, as_document
from harness.report.watch_verdict import attach_watch, watch_stragglers
from harness.traces.read.watch_log import WatchFlagRecord, WatchRecord

from jobs import collect_quietly, said
from tracebuild import cpu_ring_docs, run_analysis, write


def doc_of(verdict: str, stragglers: list[int], watch: WatchRecord | None, **more: Any) -> Report:
    """The fields attach_watch reads, as build_report and hang_report leave them."""
    steps = [next_step("straggler", [r], f"Rank {r}: ...") for r in stragglers]
    steps.append(next_step("noise", [1], "Balanced within this run's noise: ..."))
    floor = noise_floor(noise_limited=more.pop("noise_limited", True), share=0.21)
    return report_of(
        verdict=verdict,
        noise_floor=floor,
        headline=f"{verdict}: ...",
        verdict_reason=more.pop("reason", None),
        stragglers=[straggler_record(r, phase="data", beyond_peers_ms=1.5) for r in stragglers],
        next_steps=steps,
        watch=watch,
        window=window_of(11, 18),
        **more,
    )


def watched(report: Report) -> dict[str, Any]:
    """The report attach_watch makes of `report`, as report.json holds it."""
    return as_document(attach_watch(report))


def test_the_watch_s_flags_are_grouped_by_rank_without_the_window_s_stragglers() -> None:
    watch = watch_of(flag(14, 1, "backward"), flag(19, 3, None, "b"), flag(29, 1, "forward"), flag(14, 0))
    assert watch_stragglers(watch, {0}) == [
        WatchStragglerRecord(rank=1, host="a", phase="backward", steps=[14, 29]),  # its phase at its first flag
        WatchStragglerRecord(rank=3, host="b", phase=None, steps=[19]),
    ]
    assert watch_stragglers(None, set()) == [] and watch_stragglers(watch_of(), set()) == []


def test_a_balanced_window_becomes_a_straggler_the_watch_flagged() -> None:
    doc = watched(doc_of("balanced", [], watch_of(flag(14, 1, "backward"))))
    assert doc["verdict"] == "straggler" and doc["trace_verdict"] == "balanced"
    assert doc["watch_stragglers"] == [{"rank": 1, "host": "a", "phase": "backward", "steps": [14]}]
    assert doc["headline"] == (
        "straggler, by the live watch over the whole run: rank 1 on a in its backward phase, flagged at step 14; "
        "the traced window (steps 11-18) alone kept it within its noise"
    )
    first, noise = doc["next_steps"]
    assert first["about"] == "straggler" and first["ranks"] == [1]
    assert first["text"].startswith("The live watch flagged rank 1 on a in its backward phase at step 14: ")
    assert "did not tell it from the noise" in first["text"] and "--capture-on-straggler" in first["text"]
    assert noise["about"] == "noise"  # why the window alone did not name it stays, as the window's
    assert noise["text"].startswith("The traced window alone is balanced within this run's noise: a straggler costing")


def test_a_window_whose_bound_the_material_share_set_did_not_name_it_and_says_no_more() -> None:
    doc = watched(doc_of("balanced", [], watch_of(flag(24, 1, "data")), noise_limited=False))
    assert doc["headline"].endswith("flagged at step 24; the traced window (steps 11-18) alone did not name it")
    assert "the traced window did not name it (it holds a few of the run's steps)" in doc["next_steps"][0]["text"]


def test_an_inconclusive_window_says_why_beside_the_watch_s_straggler() -> None:
    doc = watched(doc_of("inconclusive", [], watch_of(flag(9, 2, None)), reason="one rank"))
    assert doc["verdict"] == "straggler" and doc["trace_verdict"] == "inconclusive"
    assert doc["headline"].endswith("rank 2 on a, flagged at step 9; the traces could not be compared: one rank")


def test_a_window_that_named_a_straggler_keeps_its_verdict_and_the_watch_s_others_follow() -> None:
    doc = watched(doc_of("straggler", [0], watch_of(flag(14, 0), flag(14, 3, "data"), flag(24, 3, "data"))))
    assert doc["verdict"] == "straggler" and doc["trace_verdict"] is None and doc["headline"] == "straggler: ..."
    assert doc["watch_stragglers"] == [{"rank": 3, "host": "a", "phase": "data", "steps": [14, 24]}]
    assert [n["ranks"] for n in doc["next_steps"]] == [[0], [3], [1]]
    assert "the traced window did not name it" in doc["next_steps"][1]["text"]


def test_a_hang_leads_and_the_watch_s_straggler_follows_it() -> None:
    report = doc_of("hang", [], watch_of(flag(14, 1)), trace_verdict="balanced")
    report.next_steps.insert(0, next_step("hang", [1], "Rank 1 never entered ..."))
    doc = watched(report)
    assert doc["verdict"] == "hang" and doc["trace_verdict"] == "balanced"
    assert [n["about"] for n in doc["next_steps"]] == ["hang", "straggler", "noise"]


def test_without_the_watch_or_its_flags_nothing_changes() -> None:
    for watch, verdict, named in (
        (None, "straggler", [0]),
        (watch_of(), "balanced", []),
        (watch_of(flag(14, 0)), "straggler", [0]),
    ):
        before = doc_of(verdict, named, watch)
        after = attach_watch(copy.deepcopy(before))
        assert after == replace(before, watch_stragglers=[])


def test_a_window_s_straggler_the_watch_judged_and_never_flagged_is_said_to_be_unconfirmed() -> None:
    doc = watched(doc_of("straggler", [0, 2], watch_of(flag(14, 2))))
    assert doc["verdict"] == "straggler" and doc["watch_stragglers"] == []
    assert [(n["about"], n["ranks"]) for n in doc["next_steps"]] == [
        ("straggler", [0]),
        ("straggler", [2]),
        ("noise", [0]),
        ("noise", [1]),
    ]
    assert doc["next_steps"][2]["text"].startswith(
        "The live watch judged 5 interval(s) of 5 steps over the run and did not flag rank 0: it is slow in this "
        "window only, or this window's noise. To tell, profile several windows (--repeat 3)"
    )
    # a watch that judged no interval says nothing of anyone
    quiet = watched(doc_of("straggler", [0], watch_of(intervals=0)))
    assert [n["about"] for n in quiet["next_steps"]] == ["straggler", "noise"]


def judged(*flags: WatchFlagRecord, steps: list[int] | None = None) -> WatchRecord:
    """A watch that judged steps 5-39 (or `steps`) and raised `flags`."""
    return replace(watch_of(*flags), judged_steps=steps or [5, 39])


def test_a_window_s_straggler_the_watch_never_flagged_stands_on_every_device() -> None:
    """The watch's silence is evidence, not a veto: the window's straggler keeps its name and
    its next step on CPU as on GPU, and a next step says the watch did not flag it."""
    for device in ("cpu", "cuda"):
        doc = watched(doc_of("straggler", [2], judged(), run=run_record(device=device), threshold_ms=1.1))
        assert doc["verdict"] == "straggler" and doc["trace_verdict"] is None, device
        assert [s["rank"] for s in doc["stragglers"]] == [2] and "unconfirmed_stragglers" not in doc
        assert [(n["about"], n["ranks"]) for n in doc["next_steps"]] == [
            ("straggler", [2]),
            ("noise", [2]),
            ("noise", [1]),
        ]
        assert doc["next_steps"][1]["text"].startswith("The live watch judged 5 interval(s) of 5 steps")


def test_the_watch_s_straggler_leads_where_the_window_named_only_ranks_it_never_flagged() -> None:
    doc = watched(doc_of("straggler", [2], judged(flag(14, 3, "backward")), run=run_record(device="cpu")))
    assert doc["verdict"] == "straggler" and doc["trace_verdict"] is None
    assert [s["rank"] for s in doc["stragglers"]] == [2]
    assert [w["rank"] for w in doc["watch_stragglers"]] == [3]
    assert [(n["about"], n["ranks"]) for n in doc["next_steps"]] == [
        ("straggler", [2]),
        ("straggler", [3]),
        ("noise", [2]),
        ("noise", [1]),
    ]


def _window_doc(window: int, verdict: str, stragglers: list[int], watch: WatchRecord) -> Report:
    return attach_watch(replace(doc_of(verdict, stragglers, watch), window=window_of(window * 10, window * 10 + 7)))


def test_across_windows_the_watch_names_a_straggler_the_windows_left_balanced() -> None:
    watch = watch_of(flag(14, 1, "backward"))
    docs = [
        _window_doc(w, v, s, watch) for w, v, s in ((1, "balanced", []), (2, "straggler", [0]), (3, "balanced", []))
    ]
    verdicts = [window_verdict(w, d, f"r/window-{w}") for w, d in enumerate(docs, 1)]
    # each window is compared by the trace's own verdict, not the one the watch gave its report
    assert [v.verdict for v in verdicts] == ["balanced", "straggler", "balanced"]
    res = across_windows(verdicts, watch)
    assert res.verdict == "straggler" and res.windows_verdict == "balanced"
    assert res.watch_stragglers == [WatchStragglerRecord(rank=1, host="a", phase="backward", steps=[14])]
    lines = summary_lines(res)
    assert (
        lines[3] == "across windows: balanced: no rank is a straggler in one phase in more than half of the 3 windows"
    )
    assert (
        lines[-1] == "live watch: straggler over the whole run: rank 1 (backward) at step 14 (recurring in no window)"
    )


def test_across_windows_a_recurring_rank_the_watch_flagged_too_is_named_once() -> None:
    watch = watch_of(flag(14, 1, "data"))

    def wv(window: int) -> WindowVerdict:
        return WindowVerdict(window=window, verdict="straggler", steps=None, stragglers={1: "data"}, report="r")

    res = across_windows([wv(1), wv(2)], watch)
    assert res.verdict == "straggler" and res.windows_verdict is None and res.watch_stragglers == []
    assert across_windows([wv(1), wv(2)]).to_dict()["watch_stragglers"] == []


def test_the_collector_names_the_straggler_the_watch_flagged_in_a_window_it_found_balanced(tmp_path: Path) -> None:
    """test_noise_floor's jittery window (rank 1 0.3 ms late a step against a 0.6 ms noise
    bound: balanced), with a run.json whose watch flagged rank 1 in forward at step 14: the
    report's verdict is the watch's straggler, the window's kept beside it, on every output."""
    docs = cpu_ring_docs(2, 6, extra_mm_us=lambda r, s: 400.0 * ((s + r) % 2), sleep_us=lambda r, s: 300.0 * r)
    assert build_report(run_analysis(tmp_path, docs), ["x"]).verdict == "balanced"
    (tmp_path / "run.json").write_text(
        json.dumps({"watch": msgspec.to_builtins(watch_of(flag(14, 1, "forward", "node1")))})
    )
    out = collect_quietly(tmp_path)
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert doc["verdict"] == "straggler" and doc["trace_verdict"] == "balanced" and doc["stragglers"] == []
    assert doc["watch_stragglers"] == [{"rank": 1, "host": "node1", "phase": "forward", "steps": [14]}]
    assert [n["about"] for n in doc["next_steps"]][:1] == ["straggler"]
    assert "noise" in [n["about"] for n in doc["next_steps"]]
    assert (
        "straggler, by the live watch over the whole run: rank 1 on node1 in its forward phase"
        in said(out.stdout, "verdict")[0]
    )
    md = (tmp_path / "report" / "report.md").read_text()
    assert (
        "Flagged by the live watch over the whole run, not named in the traced window: rank 1 on node1 (forward) "
        "at step 14." in md
    )
    assert 'id="watch-stragglers"' in (tmp_path / "report" / "report.html").read_text()


def test_the_collector_keeps_a_straggler_the_watch_judged_and_never_flagged(tmp_path: Path) -> None:
    """Rank 1 sleeps 1 ms a step in the traced window (steps 1-6, window 1 of the run): the window
    names it. The run's watch judged steps 1-30 and flagged nobody: the window's straggler stands
    (CPU-only traces, as on GPU), and the next steps say the watch did not flag it."""
    docs = cpu_ring_docs(2, 6, sleep_us=lambda r, s: 1000.0 * r)
    for r, d in enumerate(docs):
        write(trace_path(tmp_path, r, "vm", 1), d)
    (tmp_path / "run.json").write_text(json.dumps({"watch": msgspec.to_builtins(judged(steps=[1, 30]))}))
    collect_quietly(tmp_path)
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert doc["window"]["steps"] == [1, 6] and doc["run"]["device"] == "cpu"
    assert doc["verdict"] == "straggler" and [s["rank"] for s in doc["stragglers"]] == [1]
    assert "unconfirmed_stragglers" not in doc and doc["trace_verdict"] is None
    told = [n for n in doc["next_steps"] if n["about"] == "noise" and n["ranks"] == [1]]
    assert told and told[0]["text"].startswith(
        "The live watch judged 5 interval(s) of 5 steps over the run and did not flag rank 1"
    )
