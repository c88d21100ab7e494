"""Stragglers across a run's profiler windows (`harness.collect RUN --window each`). Pure.

One window is one sample of a run's noise. On shared cores a healthy rank is now and then late
beyond the bound in two of a short window's steps, on whichever rank the noise hits; a
straggler's cause is the rank's own and is late in every window it lasts, in the same phase. So
windows judged apart, then compared, tell the two apart where one window cannot: in the tests'
short-step CPU DDP job, noise seldom flagged one rank in two windows and never in one phase
(bench/RESULTS.md, "Detection").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from harness.report.records import Report, WatchStragglerRecord
from harness.report.watch_verdict import OVERRIDDEN, watch_stragglers
from harness.traces.read.watch_log import WatchRecord

JUDGED = ("straggler", "balanced")


@dataclass(kw_only=True)
class WindowVerdict:
    """One window's report, as the comparison needs it."""

    window: int
    verdict: str  # the window's own: straggler, balanced, inconclusive (or hang)
    steps: list[int] | None  # [first, last] analysed
    stragglers: dict[int, str | None]  # rank -> phase
    report: str  # the window's report folder


@dataclass(kw_only=True)
class RankRecurrence:
    rank: int
    windows: list[int]  # the windows it was a straggler in
    judged: int  # windows whose verdict was straggler or balanced
    phases: list[str | None]  # its phase in each of `windows`
    phase: str | None  # the phase it was a straggler in most often (the first of a tie)
    recurs: bool


@dataclass(kw_only=True)
class AcrossWindows:
    verdict: str  # straggler (a rank recurs, or the live watch flagged one), balanced, or inconclusive
    windows: list[WindowVerdict]
    ranks: list[RankRecurrence] = field(default_factory=list)
    # ranks the live watch flagged over the whole run that recur in no window (watch_verdict.py)
    watch_stragglers: list[WatchStragglerRecord] = field(default_factory=list)
    windows_verdict: str | None = None  # the windows' own verdict, where the watch's flags override it

    def to_dict(self) -> dict[str, Any]:
        """windows.json: this, with each window's stragglers as [{rank, phase}] (JSON keys are strings)."""
        doc = asdict(self)
        for w in doc["windows"]:
            w["stragglers"] = [{"rank": r, "phase": p} for r, p in sorted(w["stragglers"].items())]
        return doc


def window_verdict(window: int, report: Report, folder: str) -> WindowVerdict:
    """A window's report, reduced to what the comparison reads: its own verdict and stragglers,
    the trace's where the live watch's flags made it a straggler (watch_verdict.py; a hang's
    stays: it judged no one)."""
    verdict = report.verdict
    own = (report.trace_verdict or verdict) if verdict in ("straggler", "balanced") else verdict
    return WindowVerdict(
        window=window,
        verdict=own,
        steps=report.window.steps if report.window else None,
        stragglers={s.rank: s.phase for s in report.stragglers},
        report=folder,
    )


def recurs(flagged: int, judged: int) -> bool:
    """A rank recurs when it is a straggler in one phase in more than half of the judged windows
    (`flagged` of them; 2 of 2, 2 of 3, 3 of 4, ...): noise that flags a healthy rank in a
    fraction p of windows, on either of 2 ranks and in any phase, flags the same one in two of
    three about 3p^2/2 of the time (p = 1/8: 2%) and in the same phase less often, while a
    straggler is flagged in each window with the single window's recall, in its phase (the phase
    was right in every straggler the campaigns found: bench/RESULTS.md, "Detection")."""
    return judged >= 2 and 2 * flagged > judged


def across_windows(verdicts: list[WindowVerdict], watch: WatchRecord | None = None) -> AcrossWindows:
    """The verdict over several windows, and over the run where the live watch ran (`watch`,
    report.json's record of it):
    1. judged windows: those whose verdict is straggler or balanced (an inconclusive window, or
       a hang, says nothing about who is slow);
    2. per rank flagged in any judged window: the windows it was flagged in, its phases there,
       its most frequent phase, and whether it `recurs` (counting the windows in that phase);
    3. verdict: inconclusive with fewer than 2 judged windows; straggler when a rank recurs;
       else balanced (one-off flags are the noise a single window cannot rule out);
    4. the ranks the watch flagged that recur in no window; where there are some and the
       windows' verdict is balanced or inconclusive, that moves to `windows_verdict` and the
       verdict is straggler (watch_verdict.py: the watch judged every step of the run).
    Ranks are listed most windows first, then by rank."""
    ordered = sorted(verdicts, key=lambda v: v.window)
    judged = [v for v in ordered if v.verdict in JUDGED]
    by_rank: dict[int, list[WindowVerdict]] = {}
    for v in judged:
        for r in v.stragglers:
            by_rank.setdefault(r, []).append(v)
    ranks = []
    for r, vs in sorted(by_rank.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        phases = [v.stragglers[r] for v in vs]
        phase = max(phases, key=phases.count)  # max keeps the first of a tie
        ranks.append(
            RankRecurrence(
                rank=r,
                windows=[v.window for v in vs],
                judged=len(judged),
                phases=phases,
                phase=phase,
                recurs=recurs(phases.count(phase), len(judged)),
            )
        )
    if len(judged) < 2:
        verdict = "inconclusive"
    else:
        verdict = "straggler" if any(r.recurs for r in ranks) else "balanced"
    found = watch_stragglers(watch, {r.rank for r in ranks if r.recurs})
    overridden = verdict if found and verdict in OVERRIDDEN else None
    return AcrossWindows(
        verdict="straggler" if overridden else verdict,
        windows=ordered,
        ranks=ranks,
        watch_stragglers=found,
        windows_verdict=overridden,
    )


def _phases(phases: list[str | None]) -> str:
    named = list(dict.fromkeys(p for p in phases if p))
    return f" ({', '.join(named)})" if named else ""


def summary_lines(result: AcrossWindows) -> list[str]:
    """The console's account: one line per window, the verdict across them, then the ranks the
    live watch flagged that recur in no window."""
    lines = []
    for v in result.windows:
        steps = f" (steps {v.steps[0]}-{v.steps[1]})" if v.steps else ""
        who = ", ".join(f"rank {r}" + (f" ({p})" if p else "") for r, p in sorted(v.stragglers.items()))
        lines.append(f"window {v.window}{steps}: {v.verdict}{': ' + who if who else ''}; report in {v.report}")
    lines += _windows_lines(result)
    if result.watch_stragglers:
        who = "; ".join(
            f"rank {s.rank}" + (f" ({s.phase})" if s.phase else "") + f" at step {s.steps[0]}"
            for s in result.watch_stragglers
        )
        verdict = "straggler over the whole run" if result.windows_verdict else "also flagged"
        lines.append(f"live watch: {verdict}: {who} (recurring in no window)")
    return lines


def _windows_lines(result: AcrossWindows) -> list[str]:
    """The windows' own verdict across them, and the ranks flagged without recurring."""
    n = sum(1 for v in result.windows if v.verdict in JUDGED)
    if (result.windows_verdict or result.verdict) == "inconclusive":
        return [
            f"across windows: inconclusive: {n} window(s) judged, 2 needed to compare (profile more with --repeat 3)"
        ]
    lines = []
    recurring = [r for r in result.ranks if r.recurs]
    once = [r for r in result.ranks if not r.recurs]
    if recurring:
        text = "; ".join(
            f"rank {r.rank} is a straggler in {r.phases.count(r.phase)} of {n} windows{_phases([r.phase])}"
            for r in recurring
        )
        lines.append(f"across windows: straggler: {text}")
    else:
        lines.append(
            f"across windows: balanced: no rank is a straggler in one phase in more than half of the {n} windows"
        )
    if once:
        text = ", ".join(f"rank {r.rank} in {len(r.windows)} of {n}{_phases(r.phases)}" for r in once)
        lines.append(
            f"across windows: flagged without recurring ({text}): noise moves from rank to rank and phase to "
            "phase; a straggler is late in most windows, in its phase"
        )
    return lines
