"""How sure a verdict is: the noise floor of the straggler rule, in figures and in words. Pure.

A "balanced" verdict means no rank was late beyond the bound (stragglers.py), and that bound is
the largest of a material share of the step and the run's measured noise. Where the noise sets
it, a straggler that costs less than the bound passes for noise (how high it stands on shared
CPU cores: bench/RESULTS.md, "Detection"). The latest rank beyond the material share is then a
hint, not a verdict: the report gives the bound as a share of the step, what sets it and the
latest rank's figure, and says how small a straggler passes for noise and how to tell, rather
than a bare "balanced".
"""

from __future__ import annotations

from harness.report.records import NextStepRecord, NoiseFloorRecord
from harness.traces.analyse.stragglers import MIN_JITTER_STEPS, StragglerResult, Thresholds

# The bounds that are not about the run's noise: the material share of the step, and the floor
# a user chose (--min-late-ms).
NOT_NOISE = ("relative", "min_late")
# How a user tells a straggler from noise that one window cannot: more windows, independent samples.
TELL_BY_WINDOWS = (
    "profile several windows (--repeat 3) and collect them with --window each: a rank late in most windows, "
    "in one phase, is a straggler; noise moves from rank to rank."
)


def floor_record(res: StragglerResult) -> NoiseFloorRecord | None:
    """The floor of `res`, None where no straggler analysis ran (inconclusive, no bounds).

    1. bound = the threshold; set_by = the bound that makes it (the largest of bounds_ms; the
       material one, relative, where tied, since then the noise does not raise it);
    2. share = bound / the clean step (the punctual ranks' own work per step);
    3. noise_limited = a noise bound sets it (not relative, not --min-late-ms);
    4. the latest rank = the one with the largest lateness beyond its peers (the lowest rank
       on a tie), with that lateness."""
    if res.verdict == "inconclusive" or not res.bounds_ms or not res.ranks:
        return None
    top = max(res.bounds_ms.values())
    set_by = "relative" if res.bounds_ms.get("relative") == top else max(res.bounds_ms, key=res.bounds_ms.__getitem__)
    latest = max(res.ranks, key=lambda r: (r.beyond_peers_ms, -r.rank))
    return NoiseFloorRecord(
        bound_ms=res.threshold_ms,
        clean_step_ms=res.clean_step_ms,
        share=res.threshold_ms / res.clean_step_ms if res.clean_step_ms > 0 else None,
        set_by=set_by,
        noise_limited=set_by not in NOT_NOISE,
        jitter_measured=res.jitter_measured,
        noise_model=res.noise,
        latest_rank=latest.rank,
        latest_beyond_ms=latest.beyond_peers_ms,
    )


def bound_words(floor: NoiseFloorRecord) -> str:
    """What sets the bound, in words without parentheses (they go inside one); the factors are
    the rule's, stragglers.Thresholds."""
    th = Thresholds()
    return {
        "min_late": "--min-late-ms",
        "clock_noise": f"{th.noise_factor:g}x the scatter of the collectives' ends: the clocks' noise, on "
        "shared CPU cores the ranks' wake-up delays",
        "jitter": f"{th.jitter_factor:g}x the step-to-step jitter of the ranks' own work",
        "late_jitter": f"{th.jitter_factor:g}x the step-to-step swing of the punctual ranks' lateness",
        "relative": "the material bound, the share of the clean step --rel-late sets",
        "outlier": f"{th.mad_factor:g} MADs of the ranks' lateness: how far apart the peers are",
    }.get(floor.set_by, floor.set_by)


def _share_words(floor: NoiseFloorRecord) -> str:
    if floor.share is None:
        return ""
    return f"{floor.share:.0%} of the {floor.clean_step_ms:.2f} ms clean step; "


def floor_line(floor: NoiseFloorRecord) -> str:
    """One line: the bound, its share of the step, what sets it, and the latest rank's figure;
    where the run's jitter was not measured, that the bound leaves it out."""
    unmeasured = (
        f"; the run's step-to-step jitter is not in it: profile {MIN_JITTER_STEPS} or more steps to measure it"
        if not floor.jitter_measured
        else ""
    )
    return (
        f"a straggler must arrive {floor.bound_ms:.2f} ms a step later than its peers here "
        f"({_share_words(floor)}{bound_words(floor)}); the latest, rank {floor.latest_rank}, is "
        f"{floor.latest_beyond_ms:.2f} ms beyond its peers{unmeasured}"
    )


def floor_step(floor: NoiseFloorRecord | None, verdict: str, trace_verdict: str | None = None) -> NextStepRecord | None:
    """The next step of a window judged balanced whose bound the noise sets: how small a straggler
    passes for noise here, and how to tell; None otherwise. The window's verdict is its own
    (`trace_verdict`) where the Flight Recorder or the live watch lead the report's (`verdict`)."""
    if (trace_verdict or verdict) != "balanced" or not floor or not floor.noise_limited:
        return None
    if floor.share is None:
        return None
    balanced = "Balanced" if verdict == "balanced" else "The traced window alone is balanced"
    text = (
        f"{balanced} within this run's noise: a straggler costing under {floor.share:.0%} of the step would "
        f"pass for noise here (the bound is {bound_words(floor)}; the latest, rank {floor.latest_rank}, is "
        f"{floor.latest_beyond_ms:.2f} ms a step beyond its peers)."
    )
    if not floor.jitter_measured:
        text += f" Profile {MIN_JITTER_STEPS} or more steps (--active 8) for a bound that holds the run's own jitter."
    if floor.set_by in ("jitter", "late_jitter"):
        text += (
            " Steadier steps lower it: look for what makes them uneven (the input pipeline, other work on "
            "the hosts, garbage collection)."
        )
    text += f" To tell, {TELL_BY_WINDOWS}"
    return NextStepRecord(about="noise", ranks=[floor.latest_rank], text=text)
