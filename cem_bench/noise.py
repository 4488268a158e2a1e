"""Is a difference beyond the noise? The test behind every claim the report and ``cem-bench table`` make.

A configuration is compared with its λ = 0 baseline metric by metric, on their runs (one value per seed):

* the difference of the means, oriented so that a positive value is better (``mode``: "max" or "min");
* its 95 % interval: a percentile bootstrap of the two groups resampled independently (scipy's
  ``stats.bootstrap``, 2000 resamples, a fixed generator so that a table is rebuilt identically), widened to
  Welch's t interval where that is wider (it is at the few seeds a search affords, where the percentile
  bootstrap alone is far too narrow: measured in docs/protocol.md §9). A
  configuration with a single run has nothing to resample; its spread is taken from the baseline's: the
  interval is ``diff ± t(n_b - 1) · s_b · sqrt(1 + 1/n_b)``, the prediction interval of one more baseline
  run, and ``borrowed`` says so;
* the probability of improvement, P(X > Y) + P(X = Y)/2 for one run X of the configuration and one run Y
  of the baseline (the Mann-Whitney U statistic over n·m, as in Agarwal et al. 2021 and Bouthillier et al.
  2021).

The verdict is "better" when the interval lies above zero and the probability of improvement is at least
``P_MIN`` (0.75), "worse" when the interval lies below zero and the probability is at most 1 - ``P_MIN``,
else "within noise". Both conditions, because each alone fails at the few seeds a search affords: the
interval says whether the difference of the means is resolved, the probability of improvement whether a
single run of the configuration usually beats one of the baseline (a mean moved by one outlier fails it).
docs/protocol.md §9 explains the choice and gives the false-claim rates. With fewer than two baseline runs
there is no noise floor and no verdict ("").

Imports numpy and scipy only (a foundation module).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95           # the intervals' confidence level
P_MIN = 0.75           # probability of improvement a claim needs
N_RESAMPLES = 2000     # bootstrap resamples: interval ends stable to ~1 % of the spread at n = 3
BETTER, WORSE, WITHIN, NO_FLOOR = "better", "worse", "within noise", ""
VERDICTS = (BETTER, WORSE, WITHIN)


@dataclass(frozen=True)
class Comparison:
    diff: float            # mean(config) - mean(baseline), oriented: > 0 is better
    lo: float              # the 95 % interval of the oriented difference
    hi: float
    p_better: float        # probability of improvement of one run over one baseline run
    verdict: str           # BETTER, WORSE, WITHIN or NO_FLOOR (fewer than two baseline runs)
    borrowed: bool         # a single-run configuration: its spread is the baseline's

    @property
    def claim(self) -> bool:
        return self.verdict in (BETTER, WORSE)


def _clean(values) -> np.ndarray:
    v = np.asarray(values, dtype=float).ravel()
    return v[np.isfinite(v)]


def _t(df: int) -> float:
    from scipy.stats import t
    return float(t.ppf(0.5 + LEVEL / 2, df))


def prob_improvement(x, y, mode: str = "max") -> float:
    """P(one run of ``x`` is better than one of ``y``) + half the ties: the Mann-Whitney U over n·m."""
    x, y = _clean(x), _clean(y)
    if not len(x) or not len(y):
        return float("nan")
    if mode == "min":
        x, y = -x, -y
    from scipy.stats import mannwhitneyu
    return float(mannwhitneyu(x, y).statistic) / (len(x) * len(y))


def difference_interval(x, y, mode: str = "max", seed: int = 0) -> tuple[float, float, float, bool]:
    """(diff, lo, hi, borrowed): the oriented difference of the means and its 95 % interval (module docstring).
    NaN interval with fewer than two baseline runs."""
    x, y = _clean(x), _clean(y)
    nan = float("nan")
    if not len(x) or not len(y):
        return nan, nan, nan, False
    sign = 1.0 if mode == "max" else -1.0
    diff = sign * (x.mean() - y.mean())
    if len(y) < 2:
        return float(diff), nan, nan, False
    if len(x) < 2:
        half = _t(len(y) - 1) * y.std(ddof=1) * math.sqrt(1 + 1 / len(y))
        return float(diff), float(diff - half), float(diff + half), True
    if np.ptp(x) == 0 and np.ptp(y) == 0:   # no spread at all: the bootstrap distribution is a point
        return float(diff), float(diff), float(diff), False
    from scipy.stats import bootstrap

    def stat(a, b, axis=-1):
        return sign * (a.mean(axis=axis) - b.mean(axis=axis))
    res = bootstrap((x, y), stat, n_resamples=N_RESAMPLES, vectorized=True, method="percentile",
                    confidence_level=LEVEL, rng=np.random.default_rng(seed))
    lo, hi = res.confidence_interval.low, res.confidence_interval.high
    # Welch's t interval too, and the wider ends of the two: at 3 runs a side the percentile interval alone
    # claimed a difference in 20 % of pure-noise comparisons, with Welch's in 4 % (docs/protocol.md §9)
    from scipy.stats import ttest_ind
    welch = ttest_ind(x, y, equal_var=False).confidence_interval(LEVEL)
    w_lo, w_hi = sorted((sign * welch.low, sign * welch.high))
    if np.isfinite(w_lo) and np.isfinite(w_hi):
        lo, hi = min(lo, w_lo), max(hi, w_hi)
    return float(diff), float(lo), float(hi), False


def compare(x, y, mode: str = "max", seed: int = 0) -> Comparison:
    """The configuration's runs ``x`` against the baseline's ``y`` on one metric (module docstring)."""
    diff, lo, hi, borrowed = difference_interval(x, y, mode, seed)
    p = prob_improvement(x, y, mode)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        verdict = NO_FLOOR
    elif lo > 0 and p >= P_MIN:
        verdict = BETTER
    elif hi < 0 and p <= 1 - P_MIN:
        verdict = WORSE
    else:
        verdict = WITHIN
    return Comparison(diff, lo, hi, p, verdict, borrowed)


def band(values) -> tuple[float, float, float]:
    """(mean, lo, hi): where one more run of a configuration falls with 95 % probability (a prediction
    interval, ``mean ± t(n - 1) · s · sqrt(1 + 1/n)``); NaN ends below two runs. The report draws the
    baseline's band: a single-seed point inside it cannot be told from the baseline."""
    v = _clean(values)
    if not len(v):
        return float("nan"), float("nan"), float("nan")
    return band_of(float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else float("nan"), len(v))


def band_of(mean: float, std: float, n: int) -> tuple[float, float, float]:
    """``band`` from a configuration's mean, sample standard deviation and number of runs."""
    if n < 2 or not math.isfinite(std) or not math.isfinite(mean):
        return float(mean), float("nan"), float("nan")
    half = _t(n - 1) * std * math.sqrt(1 + 1 / n)
    return float(mean), float(mean - half), float(mean + half)
