"""The statistics of a comparison: how much NEW's median step differs from BASE's, and with what
confidence, from each run's own steps. Pure functions.

Steps of one run are not independent draws: a machine's load drifts, a data loader warms up, a
straggler comes and goes, so neighbouring steps are alike. A plain bootstrap over steps would
ignore that and give a confidence interval too narrow; the moving-block bootstrap resamples runs
of consecutive steps instead, so slow drift inside a run widens the interval as it should.

What one pair of runs cannot measure is the spread between runs of the same configuration (a
different node, another tenant, the clock of the day): `NOISE_FLOOR` stands for it, and a change
is called only when its whole confidence interval lies beyond it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000
# The run-to-run spread of one configuration: how far the median steps of two clean runs of the
# same job land apart. A pair of runs cannot measure it (each interval only covers its own run's
# steps), so it is stated: a change is called only when its whole interval lies beyond it.
# 5% is the default: the smallest regression worth failing a build over, for machines whose
# runs repeat that well (a dedicated GPU node). Shared machines spread more; measured here (2
# shared cores), 6 two-rank runs of `--mode torch` landed 6% apart and 6 one-process runs 14%,
# 4 of `--mode baseline` 30% (docs/compare.md): there, set --noise-pct from two runs of one config.
NOISE_FLOOR = 0.05


@dataclass(frozen=True)
class Difference:
    """NEW against BASE: medians, the relative difference of the medians (new / base - 1) and
    its confidence interval, and the verdict against the noise floor."""

    base_median: float
    new_median: float
    relative: float
    low: float
    high: float
    confidence: float
    noise: float
    base_n: int
    new_n: int

    @property
    def verdict(self) -> str:
        """slower / faster: the whole interval beyond the noise floor on that side; else none."""
        if self.low > self.noise:
            return "slower"
        if self.high < -self.noise:
            return "faster"
        return "none"

    def slower_than(self, fraction: float) -> bool:
        """Whether NEW is slower by more than `fraction` with the interval's confidence: its
        lower bound is past it (the gate of --fail-if-slower)."""
        return self.low > fraction


def block_length(n: int) -> int:
    """Steps per resampled block: n^(1/3), the order of block length that minimises the error
    of a block bootstrap's variance estimate (Hall, Horowitz & Jing 1995); at least 1."""
    return max(1, round(n ** (1 / 3)))


def _block_medians(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of `resamples` moving-block bootstrap samples of `x` (block_length(n) steps each,
    start drawn uniformly among the n - L + 1 possible, joined and cut to n)."""
    n = len(x)
    length = min(block_length(n), n)
    blocks = math.ceil(n / length)
    starts = rng.integers(0, n - length + 1, size=(resamples, blocks))
    index = (starts[:, :, None] + np.arange(length)[None, None, :]).reshape(resamples, -1)[:, :n]
    return np.median(x[index], axis=1)


def median_difference(
    base: list[float] | np.ndarray,
    new: list[float] | np.ndarray,
    *,
    noise: float = NOISE_FLOOR,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Difference:
    """The relative difference of NEW's median step from BASE's and its interval.

    1. d = median(new) / median(base) - 1;
    2. each run is resampled `resamples` times by moving blocks (`_block_medians`), each side
       on its own (the runs are independent of each other);
    3. the interval is the (1 - confidence) / 2 and (1 + confidence) / 2 percentiles of
       median(new*) / median(base*) - 1 (a percentile interval); the seed is fixed, so the same
       runs always give the same answer (a gate must not flip on a re-run of itself)."""
    b, w = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    if len(b) == 0 or len(w) == 0:
        raise ValueError("no steps to compare on one side")
    mb, mw = float(np.median(b)), float(np.median(w))
    rng = np.random.default_rng(seed)
    ratios = _block_medians(w, rng, resamples) / _block_medians(b, rng, resamples) - 1.0
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return Difference(
        base_median=mb,
        new_median=mw,
        relative=mw / mb - 1.0,
        low=float(low),
        high=float(high),
        confidence=confidence,
        noise=noise,
        base_n=len(b),
        new_n=len(w),
    )
