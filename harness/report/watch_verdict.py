"""The run's straggler verdict from both of its judges: the traced window's and the live watch's. Pure.

The collector judges the steps of one profiler window (3 by default). The live watch judges
every interval of the whole run with the collector's rule (harness/watch/rule.py). Where
the hosts are noisy a few steps cannot tell a small straggler from the noise, and more of them
can; a slowdown in the window's steps alone is the window's to find. A report that says
"balanced" after the watch printed "straggler" during the same run leaves the user to choose
between them; so the report carries both, and its verdict is the run's.

In report.json (records.py `Report`):
- `watch_stragglers`: the ranks the watch flagged that the window's verdict did not name;
- where the window's verdict was balanced or inconclusive and that list is not empty, `verdict`
  becomes straggler and `headline` says by whom; the window's verdict is kept in
  `trace_verdict` (as a hang keeps it: hang_report.py). A hang or a mismatch still leads;
- a straggler the window named and the watch, having judged the run, never flagged keeps the
  window's verdict, with a next step saying so and how to tell (`unconfirmed_step`), on every
  device alike: the watch's silence is evidence, not a veto.
"""

from __future__ import annotations

from harness.report.document import LISTED
from harness.report.floor import TELL_BY_WINDOWS, floor_step
from harness.report.records import NextStepRecord, Report, WatchRecord, WatchStragglerRecord
from harness.traces.analyse.rank_list import ranks_phrase

# The window's verdicts the watch's flags override: neither names a rank. A hang or a mismatch
# (hang_report.py) is about a job that stopped, which leads whatever was slow before it.
OVERRIDDEN = ("balanced", "inconclusive")
# What to do to see a watch-flagged straggler in a trace: the window that traces the steps after a
# flag (harness.train's flag; harness.Run's watch option of the same name).
CAPTURE_HINT = (
    "to see it in a trace, let the watch trace the steps after a flag (--capture-on-straggler; "
    "harness.Run(capture_on_straggler=True))"
)


def watch_stragglers(watch: WatchRecord | None, named: set[int]) -> list[WatchStragglerRecord]:
    """The ranks the live watch flagged that the window did not name:
    1. the watch's flags (in the order it raised them) grouped by rank, ranks in the order first
       flagged (a rank flagged again after it recovered has a flag each time);
    2. ranks in `named` left out;
    3. per rank: its host and phase at its first flag, and the steps of all its flags."""
    out: dict[int, WatchStragglerRecord] = {}
    for f in watch.flags if watch else []:
        if f.rank in named:
            continue
        entry = out.setdefault(f.rank, WatchStragglerRecord(rank=f.rank, host=f.host, phase=f.phase, steps=[]))
        entry.steps.append(f.step)
    return list(out.values())


def _steps_words(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))


def _one(s: WatchStragglerRecord, flagged: str = ", flagged") -> str:
    where = f" on {s.host}" if s.host else ""
    phase = f" in its {s.phase} phase" if s.phase else ""
    return f"rank {s.rank}{where}{phase}{flagged} at {_steps_words(s.steps)}"


def _window_words(report: Report, trace_verdict: str) -> str:
    """What the window's own verdict said, for the headline."""
    if trace_verdict == "inconclusive":
        return f"the traces could not be compared: {report.verdict_reason}"
    return f"{_span(report)} alone {'kept it within its noise' if _noise_limited(report) else 'did not name it'}"


def _span(report: Report) -> str:
    steps = report.window.steps if report.window else None
    return "the traced window" + (f" (steps {steps[0]}-{steps[-1]})" if steps else "")


def _noise_limited(report: Report) -> bool:
    """Whether the window's bound was its noise (floor.py), not the material share of the step:
    then what it passed over may be a straggler under that noise; else one not late in its steps."""
    return bool(report.noise_floor and report.noise_floor.noise_limited)


def watch_headline(report: Report, found: list[WatchStragglerRecord], trace_verdict: str) -> str:
    """The verdict in one sentence when the watch's flags override the window's."""
    who = (
        "; ".join(_one(s) for s in found)
        if len(found) <= LISTED
        else f"{ranks_phrase([s.rank for s in found])}, first flagged at step {min(s.steps[0] for s in found)}"
    )
    return f"straggler, by the live watch over the whole run: {who}; {_window_words(report, trace_verdict)}"


def watch_step(report: Report, found: list[WatchStragglerRecord], overridden: bool) -> NextStepRecord:
    """The next step for the watch's stragglers: who, when, why the window did not name them,
    and how to trace them."""
    ranks = [s.rank for s in found]
    many = len(found) > 1
    them = "them" if many else "it"
    who = "; ".join(_one(s, "") for s in found) if len(found) <= LISTED else ranks_phrase(ranks)
    if overridden and _noise_limited(report):
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
    return NextStepRecord(about="straggler", ranks=ranks, text=text[:1].upper() + text[1:])


def unconfirmed_step(report: Report) -> NextStepRecord | None:
    """The next step for the window's stragglers the watch never flagged, where it judged any
    interval of the run (None otherwise): a straggler whose cause lasts is flagged by the watch
    too (it judges every step with the same rule), so one it passed over is slow in this window
    only, or this window's noise, and more windows tell which. The window's names stand."""
    watch = report.watch
    if not watch or not watch.intervals:
        return None
    flagged = {f.rank for f in watch.flags}
    ranks = [s.rank for s in report.stragglers if s.rank not in flagged]
    if not ranks:
        return None
    many = len(ranks) > 1
    text = (
        f"The live watch judged {watch.intervals} interval(s) of {watch.every} steps over the run and did "
        f"not flag {ranks_phrase(ranks)}: {'they are' if many else 'it is'} slow in this window only, or this "
        f"window's noise. To tell, {TELL_BY_WINDOWS}"
    )
    return NextStepRecord(about="noise", ranks=ranks, text=text)


def attach_watch(report: Report) -> Report:
    """Add the watch's stragglers to a report (its `watch` already read, its next steps already
    made):
    1. `watch_stragglers` (`watch_stragglers`, the window's stragglers left out);
    2. no watch straggler: nothing else changes;
    3. the verdict balanced or inconclusive: it moves to `trace_verdict`, the verdict becomes
       straggler, the headline says by whom, their next step comes first, and the noise step
       (floor.py) says it is the window's;
    4. else (the window named others, or a hang leads): their next step comes after the
       window's straggler steps;
    5. the window's stragglers the watch never flagged get a next step saying so
       (`unconfirmed_step`), after the steps about stragglers."""
    found = watch_stragglers(report.watch, {s.rank for s in report.stragglers})
    report.watch_stragglers = found
    if found and report.verdict in OVERRIDDEN:
        report.trace_verdict = report.trace_verdict or report.verdict
        report.verdict = "straggler"
        report.headline = watch_headline(report, found, report.trace_verdict)
        noise = [
            floor_step(report.noise_floor, report.verdict, report.trace_verdict) or n if n.about == "noise" else n
            for n in report.next_steps
        ]
        report.next_steps = [watch_step(report, found, overridden=True), *noise]
    elif found:
        _insert_after_stragglers(report, watch_step(report, found, overridden=False))
    unconfirmed = unconfirmed_step(report)
    if unconfirmed:
        _insert_after_stragglers(report, unconfirmed)
    return report


def _insert_after_stragglers(report: Report, step: NextStepRecord) -> None:
    """A next step about stragglers goes after those already there (the window's stragglers', and
    a hang's or mismatch's, which lead)."""
    steps = report.next_steps
    at = max((i + 1 for i, n in enumerate(steps) if n.about in ("straggler", "hang", "mismatch")), default=0)
    report.next_steps = [*steps[:at], step, *steps[at:]]
