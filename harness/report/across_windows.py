"""Stragglers across a run's profiler windows (`harness.collect RUN --window each`). Pure.

One window is one sample of a run's noise. On shared cores a healthy rank is now and then late
beyond the bound in two of a short window's steps (the tests' 2.5 ms-step CPU DDP job: 23 of 180
windows), on whichever rank the noise hits; a straggler's cause is the rank's own and is late in
every window it lasts, in the same phase. So windows judged apart, then compared, tell the two
apart where one window cannot: of 80 such three-window runs (28 of their 240 windows flagged
a rank) one had a rank flagged in two of its windows, in two phases (backward, then forward),
and none in two windows in one phase.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
    verdict: str  # straggler (a rank recurs), balanced, or inconclusive (fewer than 2 windows judged)
    windows: list[WindowVerdict]
    ranks: list[RankRecurrence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """windows.json: this, with each window's stragglers as [{rank, phase}] (JSON keys are strings)."""
        doc = asdict(self)
        for w in doc["windows"]:
            w["stragglers"] = [{"rank": r, "phase": p} for r, p in sorted(w["stragglers"].items())]
        return doc


def window_verdict(window: int, doc: dict[str, Any], report: str) -> WindowVerdict:
    """A window's report.json, reduced to what the comparison reads."""
    entry = doc.get("window") or {}
    return WindowVerdict(
        window=window,
        verdict=doc["verdict"],
        steps=entry.get("steps"),
        stragglers={s["rank"]: s["phase"] for s in doc.get("stragglers", [])},
        report=report,
    )


def recurs(flagged: int, judged: int) -> bool:
    """A rank recurs when it is a straggler in one phase in more than half of the judged windows
    (`flagged` of them; 2 of 2, 2 of 3, 3 of 4, ...): noise that flags a healthy rank in a
    fraction p of windows, on either of 2 ranks and in any phase, flags the same one in two of
    three about 3p^2/2 of the time (p = 1/8: 2%) and in the same phase less often, while a
    straggler is flagged in each window with the single window's recall, in its phase (the phase
    was right in every straggler the campaigns found: bench/RESULTS.md, "Detection")."""
    return judged >= 2 and 2 * flagged > judged


def across_windows(verdicts: list[WindowVerdict]) -> AcrossWindows:
    """The verdict over several windows:
    1. judged windows: those whose verdict is straggler or balanced (an inconclusive window, or
       a hang, says nothing about who is slow);
    2. per rank flagged in any judged window: the windows it was flagged in, its phases there,
       its most frequent phase, and whether it `recurs` (counting the windows in that phase);
    3. verdict: inconclusive with fewer than 2 judged windows; straggler when a rank recurs;
       else balanced (one-off flags are the noise a single window cannot rule out).
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
    return AcrossWindows(verdict=verdict, windows=ordered, ranks=ranks)


def _phases(phases: list[str | None]) -> str:
    named = list(dict.fromkeys(p for p in phases if p))
    return f" ({', '.join(named)})" if named else ""


def summary_lines(result: AcrossWindows) -> list[str]:
    """The console's account: one line per window, then the verdict across them."""
    lines = []
    for v in result.windows:
        steps = f" (steps {v.steps[0]}-{v.steps[1]})" if v.steps else ""
        who = ", ".join(f"rank {r}" + (f" ({p})" if p else "") for r, p in sorted(v.stragglers.items()))
        lines.append(f"window {v.window}{steps}: {v.verdict}{': ' + who if who else ''}; report in {v.report}")
    n = sum(1 for v in result.windows if v.verdict in JUDGED)
    if result.verdict == "inconclusive":
        lines.append(
            f"across windows: inconclusive: {n} window(s) judged, 2 needed to compare (profile more with --repeat 3)"
        )
        return lines
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
