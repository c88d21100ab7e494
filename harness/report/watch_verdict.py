"""The run's straggler verdict from both of its judges: the traced window's and the live watch's. Pure.

The collector judges the steps of one profiler window (3 by default, 8 in the detection
campaign). The live watch judges every interval of the whole run with the collector's rule
(harness/train/watch_rule.py), and flags a rank only over the bound in one interval or over the
material share of the step in two running. Where the hosts are noisy, a few steps cannot tell a
straggler of a tenth of the step from the noise, and more of them can: on 2 shared CPU cores the
watch flagged material stragglers the window missed. With its flags in the verdict, recall is
higher than the windows' alone, and the watch adds about as many false alarms as the windows
make (bench/RESULTS.md, "Detection"). A report that says "balanced" after the watch printed
"straggler" during the same run leaves the user to choose between them; so the report carries
both, and its verdict is the run's.

report.json (added to the schema in document.py):
- `watch_stragglers`: [{rank, host, phase, steps}], the ranks the watch flagged that the
  window's verdict did not name (`steps`: the exchanges it flagged them at), empty when it
  flagged none or was off;
- where the window's verdict was balanced or inconclusive and that list is not empty, `verdict`
  becomes straggler and `headline` says by whom; the window's verdict is kept in
  `trace_verdict` (as a hang keeps it: hang_report.py). A hang or a mismatch still leads;
- `unconfirmed_stragglers`: the window's stragglers set aside (`set_aside`): on CPU-only traces,
  those the watch judged in every one of the window's steps and never flagged over the run. They
  leave `stragglers` and their next steps; where none is left the verdict becomes balanced, the
  window's kept in `trace_verdict`. On 2 shared cores the window named some ranks that were not
  slow (in clean runs, and innocent pipeline stage peers): the watch had flagged every slow rank
  the window named and none of those (bench/RESULTS.md, "Detection");
- any other straggler the window named and the watch, having judged the run, never flagged keeps
  the window's verdict, with a next step saying so (`unconfirmed_step`).
"""

from __future__ import annotations

from typing import Any

from harness.collect.analyse.advisor import advice_for, bottleneck_line, classify
from harness.collect.analyse.rank_list import ranks_phrase
from harness.report.document import LISTED
from harness.report.floor import TELL_BY_WINDOWS, floor_step

# The window's verdicts the watch's flags override: neither names a rank. A hang or a mismatch
# (hang_report.py) is about a job that stopped, which leads whatever was slow before it.
OVERRIDDEN = ("balanced", "inconclusive")
# What to do to see a watch-flagged straggler in a trace: the window that traces the steps after a
# flag (harness.train's flag; harness.Run's watch option of the same name).
CAPTURE_HINT = (
    "to see it in a trace, let the watch trace the steps after a flag (--capture-on-straggler; "
    "harness.Run(capture_on_straggler=True))"
)


# The watch names a rank only over the noise model's min_late_steps (noise.py); where it judged
# fewer intervals than this, its silence refutes nothing.
MIN_INTERVALS = 2


def set_aside(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The window's stragglers (report entries) the live watch refutes:
    1. none unless every rank ran on CPU (`run.device`), the watch judged MIN_INTERVALS or more
       intervals, and its judged steps hold every step of the window (`watch.judged_steps`,
       `window.steps`);
    2. of the window's stragglers, those the watch never flagged over the run.
    Both judged the same steps with one rule, the window on wall-clock arrivals and the watch on
    each phase's CPU time (wall time less waits where it sleeps or waits). Ranks that time-share
    cores are preempted in turn, which a few steps of wall time cannot average out (the window's
    noise: stragglers.py) and CPU time does not hold; a straggler's own delay shows in both. On
    GPU the window's device times have no such noise and the watch reads NCCL's timing late,
    so there the window's names stand."""
    watch = doc.get("watch") or {}
    judged = watch.get("judged_steps")
    steps = (doc.get("window") or {}).get("steps")
    if (doc.get("run") or {}).get("device") != "cpu" or not judged or not steps:
        return []
    if watch.get("intervals", 0) < MIN_INTERVALS:
        return []
    if not judged[0] <= steps[0] or not steps[-1] <= judged[1]:
        return []
    flagged = {f["rank"] for f in watch.get("flags", [])}
    return [s for s in doc.get("stragglers", []) if s["rank"] not in flagged]


def watch_stragglers(watch: dict[str, Any] | None, named: set[int]) -> list[dict[str, Any]]:
    """The ranks the live watch flagged that the window did not name:
    1. the watch's flags ({step, rank, host, phase}, in the order it raised them) grouped by
       rank, ranks in the order first flagged (a rank flagged again after it recovered has a
       flag each time);
    2. ranks in `named` left out;
    3. per rank: its host and phase at its first flag, and the steps of all its flags."""
    out: dict[int, dict[str, Any]] = {}
    for f in (watch or {}).get("flags", []):
        rank = f["rank"]
        if rank in named:
            continue
        entry = out.setdefault(rank, {"rank": rank, "host": f.get("host"), "phase": f.get("phase"), "steps": []})
        entry["steps"].append(f["step"])
    return list(out.values())


def _steps_words(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))


def _one(s: dict[str, Any], flagged: str = ", flagged") -> str:
    where = f" on {s['host']}" if s.get("host") else ""
    phase = f" in its {s['phase']} phase" if s.get("phase") else ""
    return f"rank {s['rank']}{where}{phase}{flagged} at {_steps_words(s['steps'])}"


def _window_words(doc: dict[str, Any], trace_verdict: str) -> str:
    """What the window's own verdict said, for the headline."""
    if trace_verdict == "inconclusive":
        return f"the traces could not be compared: {doc.get('verdict_reason')}"
    if trace_verdict == "straggler":  # all it named were set aside
        return f"{_span(doc)} named {_ranks(doc['unconfirmed_stragglers'])} alone, which the watch never flagged"
    return f"{_span(doc)} alone {'kept it within its noise' if _noise_limited(doc) else 'did not name it'}"


def _span(doc: dict[str, Any]) -> str:
    steps = (doc.get("window") or {}).get("steps")
    return "the traced window" + (f" (steps {steps[0]}-{steps[-1]})" if steps else "")


def _ranks(entries: list[dict[str, Any]]) -> str:
    return ranks_phrase([s["rank"] for s in entries])


def _noise_limited(doc: dict[str, Any]) -> bool:
    """Whether the window's bound was its noise (floor.py), not the material share of the step:
    then what it passed over may be a straggler under that noise; else one not late in its steps."""
    return bool((doc.get("noise_floor") or {}).get("noise_limited"))


def watch_headline(doc: dict[str, Any], found: list[dict[str, Any]], trace_verdict: str) -> str:
    """The verdict in one sentence when the watch's flags override the window's."""
    who = (
        "; ".join(_one(s) for s in found)
        if len(found) <= LISTED
        else f"{ranks_phrase([s['rank'] for s in found])}, first flagged at step {min(s['steps'][0] for s in found)}"
    )
    return f"straggler, by the live watch over the whole run: {who}; {_window_words(doc, trace_verdict)}"


def watch_step(doc: dict[str, Any], found: list[dict[str, Any]], overridden: bool) -> dict[str, Any]:
    """The next step for the watch's stragglers: who, when, why the window did not name them,
    and how to trace them."""
    ranks = [s["rank"] for s in found]
    many = len(found) > 1
    them = "them" if many else "it"
    who = "; ".join(_one(s, "") for s in found) if len(found) <= LISTED else ranks_phrase(ranks)
    if overridden and _noise_limited(doc):
        why = (
            f"the traced window's steps alone did not tell {them} from the noise (the watch judged every interval "
            "of the run with the same rule)"
        )
    else:
        why = f"the traced window did not name {them} (it holds a few of the run's steps)"
    text = (
        f"The live watch flagged {who}: {why}. Compare {'their' if many else 'its'} hardware and inputs with "
        f"the peers'; {CAPTURE_HINT}."
    )
    return {"about": "straggler", "ranks": ranks, "text": text[:1].upper() + text[1:]}


def unconfirmed_step(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The next step for the window's stragglers the watch never flagged, where it judged any
    interval of the run (None otherwise): a straggler whose cause lasts is flagged by the watch
    too (it judges every step with the same rule), so one it passed over is slow in this window
    only, or this window's noise, and more windows tell which. Those `set_aside` are not named
    (their figures are said); the others keep the window's verdict: on GPU, or where the watch
    did not judge the window's steps, a slowdown at under the watch's bound in the window alone
    is the window's to find."""
    watch = doc.get("watch") or {}
    if not watch.get("intervals"):
        return None
    aside = doc.get("unconfirmed_stragglers") or []
    if aside:
        many = len(aside) > 1
        figures = "; ".join(f"rank {s['rank']} {s['beyond_peers_ms']:.2f} ms" for s in aside)
        bound = f" against a bound of {doc['threshold_ms']:.2f} ms" if doc.get("threshold_ms") is not None else ""
        text = (
            f"The traced window alone named {_ranks(aside)} ({figures} a step beyond the peers{bound}); the live "
            f"watch judged those steps and the whole run ({watch['intervals']} interval(s) of {watch['every']} "
            f"steps) and never flagged {'them' if many else 'it'}, so {'they are' if many else 'it is'} not named: "
            "ranks that time-share CPU cores are preempted in turn, which a few steps of wall time do not "
            f"average out. To check, {TELL_BY_WINDOWS}"
        )
        return {"about": "noise", "ranks": [s["rank"] for s in aside], "text": text}
    flagged = {f["rank"] for f in watch.get("flags", [])}
    ranks = [s["rank"] for s in doc.get("stragglers", []) if s["rank"] not in flagged]
    if not ranks:
        return None
    many = len(ranks) > 1
    text = (
        f"The live watch judged {watch['intervals']} interval(s) of {watch['every']} steps over the run and did "
        f"not flag {ranks_phrase(ranks)}: {'they are' if many else 'it is'} slow in this window only, or this "
        f"window's noise. To tell, {TELL_BY_WINDOWS}"
    )
    return {"about": "noise", "ranks": ranks, "text": text}


def rediagnose(doc: dict[str, Any], ranks: set[int]) -> None:
    """The diagnosis rows of `ranks`, set aside, judged on their own work as any other rank's
    (advisor.classify over the same evidence: a straggler's row holds it too), and the summary
    line again."""
    rows = doc.get("diagnosis") or []
    for d in rows:
        if d["rank"] in ranks and d["bottleneck"] == "straggler":
            kind, reason = classify(d["evidence"])
            d["bottleneck"], d["reason"], d["advice"] = kind, reason, advice_for(kind, d["evidence"])
    if rows:
        doc["diagnosis_summary"] = bottleneck_line([(d["rank"], d["bottleneck"]) for d in rows])


def aside_headline(doc: dict[str, Any]) -> str:
    """The verdict in one sentence when every straggler the window named was set aside."""
    return (
        f"balanced, by the live watch over the whole run: {_span(doc)} alone named "
        f"{_ranks(doc['unconfirmed_stragglers'])}, which the watch judged in those steps and never flagged"
    )


def attach_watch(doc: dict[str, Any]) -> dict[str, Any]:
    """Add the watch's stragglers to a report document (its `watch` already read, its next steps
    already made):
    1. `watch_stragglers` (`watch_stragglers`, the window's stragglers left out);
    2. `unconfirmed_stragglers` (`set_aside`): they leave `stragglers` and the next steps about
       them, their diagnosis is their own work's (`rediagnose`); where the window's verdict was
       straggler and none is left, it moves to
       `trace_verdict`, the verdict becomes balanced and the headline says why;
    3. no watch straggler: nothing else changes;
    4. the verdict balanced or inconclusive: it moves to `trace_verdict` (unless step 2 put the
       window's there), the verdict becomes straggler, the headline says by whom, their next
       step comes first, and the noise step (floor.py) says it is the window's;
    5. else (the window named others, or a hang leads): their next step comes after the
       window's straggler steps;
    6. the window's stragglers the watch never flagged get a next step saying so
       (`unconfirmed_step`), after the steps about stragglers."""
    found = watch_stragglers(doc.get("watch"), {s["rank"] for s in doc.get("stragglers", [])})
    doc["watch_stragglers"] = found
    aside = set_aside(doc)
    doc["unconfirmed_stragglers"] = aside
    if aside:
        out = {s["rank"] for s in aside}
        doc["stragglers"] = [s for s in doc["stragglers"] if s["rank"] not in out]
        doc["next_steps"] = [n for n in doc["next_steps"] if not (n["about"] == "straggler" and out & set(n["ranks"]))]
        rediagnose(doc, out)
        if not doc["stragglers"] and doc["verdict"] == "straggler":
            doc["trace_verdict"] = doc["verdict"]
            doc["verdict"] = "balanced"
            doc["headline"] = aside_headline(doc)
    if found and doc["verdict"] in OVERRIDDEN:
        doc["trace_verdict"] = doc.get("trace_verdict", doc["verdict"])
        doc["verdict"] = "straggler"
        doc["headline"] = watch_headline(doc, found, doc["trace_verdict"])
        noise = [floor_step(doc) or n if n["about"] == "noise" else n for n in doc["next_steps"]]
        doc["next_steps"] = [watch_step(doc, found, overridden=True), *noise]
    elif found:
        _insert_after_stragglers(doc, watch_step(doc, found, overridden=False))
    unconfirmed = unconfirmed_step(doc)
    if unconfirmed:
        _insert_after_stragglers(doc, unconfirmed)
    return doc


def _insert_after_stragglers(doc: dict[str, Any], step: dict[str, Any]) -> None:
    """A next step about stragglers goes after those already there (the window's stragglers', and
    a hang's or mismatch's, which lead)."""
    steps = doc["next_steps"]
    at = max((i + 1 for i, n in enumerate(steps) if n["about"] in ("straggler", "hang", "mismatch")), default=0)
    doc["next_steps"] = [*steps[:at], step, *steps[at:]]
