"""Is a difference beyond the noise? The test behind every claim the report and ``cem-bench table`` make.

A configuration is compared with its λ = 0 baseline metric by metric, on their runs (one value per seed):

* the difference of the means, oriented so that a positive value is better (``mode``: "max" or "min");
* its 95 % interval: a percentile bootstrap of the two groups resampled independently (scipy's percentile
  method, resampled here for all configurations at once: 2000 resamples, a fixed generator so that a table
  is rebuilt identically; ``tests/test_noise.py`` holds it to ``scipy.stats.bootstrap``), widened to
  Welch's t interval where that is wider (it is at the few seeds a search affords, where the percentile
  bootstrap alone is far too narrow: measured in docs/protocol.md §9). A
  comparison needs ``MIN_RUNS`` (3) runs a side: with fewer there is no interval, no p-value and no verdict
  (``few`` says so), only the difference. One run judged with the baseline's spread, or two under Welch's
  test, named a winner on pure noise in 14-79 % of reports when the configuration's runs spread 3-8x more than
  the baseline's, as a defended configuration's do (docs/protocol.md §9);
* the probability of improvement, P(X > Y) + P(X = Y)/2 for one run X of the configuration and one run Y
  of the baseline (the Mann-Whitney U statistic over n·m, as in Agarwal et al. 2021 and Bouthillier et al.
  2021).

The verdict is "better" when the interval lies above zero and the probability of improvement is at least
``P_MIN`` (0.75), "worse" when the interval lies below zero and the probability is at most 1 - ``P_MIN``,
else "within noise". Both conditions, because each alone fails at the few seeds a search affords: the
interval says whether the difference of the means is resolved, the probability of improvement whether a
single run of the configuration usually beats one of the baseline (a mean moved by one outlier fails it).
docs/protocol.md §9 explains the choice and gives the false-claim rates. With fewer than ``MIN_RUNS`` runs on
either side there is no verdict (""); nor where every run on both sides is equal, to within ``FLAT`` of the
values' size (no spread at all: a difference there is the metric's rounding, not a measurement against noise).

Each comparison also has a p-value, Welch's two-sided t-test: p <= 0.05 exactly where Welch's interval
excludes 0, so it speaks for the same interval. A search's own comparisons (``conservative``; every
configuration but a confirmed one) take Hsu's degrees of freedom, the smaller side's runs less one, for the
interval and p alike: Welch's are estimated from the same few runs' spreads, and the page's best-looking
configurations are those whose runs happened to spread little, whose estimated degrees of freedom are then
high too, so at 3 runs spreading 5-8x the baseline's Holm's correction passed pure noise in 7-14 % of reports
(docs/protocol.md §9). Hsu's are no higher than the truth's whatever the spreads; a confirmed configuration's
runs are new, not chosen on their spread, and keep Welch's. One page makes many comparisons, and the best-looking of many
single tests at 5 % is a winner on pure noise; ``holm`` and ``bh`` adjust a family of p-values (the report's
summary claim is held to Holm's family-wise rate, the tables' marks to Benjamini-Hochberg's false-discovery
rate; docs/protocol.md §9).

Imports numpy and scipy only (a foundation module).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95           # the intervals' confidence level
P_MIN = 0.75           # probability of improvement a claim needs
MIN_RUNS = 3           # runs a side a comparison needs (module docstring)
# A side whose runs spread less than this fraction of the values' size has no spread: that is float rounding
# ([0.1] * 3 has a computed variance of 3e-34, and against [0.2] * 3 was "worse", p 1.8e-46, until 2026-12-06)
FLAT = 1e-12
ALPHA = 1 - LEVEL      # the adjusted p-value (Holm) a summary claim and the q-value (BH) a mark need
N_RESAMPLES = 2000     # bootstrap resamples: interval ends stable to ~1 % of the spread at n = 3
BETTER, WORSE, WITHIN, NO_FLOOR = "better", "worse", "within noise", ""
VERDICTS = (BETTER, WORSE, WITHIN)


@dataclass(frozen=True)
class Comparison:
    diff: float            # mean(config) - mean(baseline), oriented: > 0 is better
    lo: float              # the 95 % interval of the oriented difference
    hi: float
    p_better: float        # probability of improvement of one run over one baseline run
    verdict: str           # BETTER, WORSE, WITHIN or NO_FLOOR (fewer than MIN_RUNS runs a side, or no spread)
    few: bool              # the configuration has fewer than MIN_RUNS runs: no interval, p-value or verdict
    p: float = math.nan    # Welch's two-sided p-value

    @property
    def claim(self) -> bool:
        return self.verdict in (BETTER, WORSE)


def no_spread(spread, size):
    """Where a spread of runs (a std, or their range) is float rounding: at most ``FLAT`` of the values' size. One
    rule for the report's comparisons and the space's hypotheses."""
    return np.asarray(spread) <= FLAT * np.asarray(size)


def _clean(values) -> np.ndarray:
    v = np.asarray(values, dtype=float).ravel()
    return v[np.isfinite(v)]


def t_quantile(q, dof):
    """Student's t quantile, ``scipy.stats.t.ppf(q, dof)``, computed by the function behind it
    (``scipy.special.stdtrit``: the same values, tests/test_noise.py; NaN where dof <= 0 or NaN). Importing
    ``scipy.stats`` parses every distribution's docstring, 1.5 s, which each ``cem-bench report`` and search paid
    for three t-functions (docs/performance.md)."""
    from scipy.special import stdtrit
    return stdtrit(dof, q)


def t_sf(x, dof):
    """Student's t survival function, ``scipy.stats.t.sf(x, dof)``, as ``scipy.special.stdtr(dof, -x)`` (the
    distribution is symmetric; see ``t_quantile`` for why not scipy.stats)."""
    from scipy.special import stdtr
    return stdtr(dof, -np.asarray(x, dtype=float))


def _t(df: int) -> float:
    return float(t_quantile(0.5 + LEVEL / 2, df))




def packed(groups, width: int | None = None) -> np.ndarray:
    """Runs of several configurations as one (k, width) array: each row's finite values first, NaN after."""
    groups = [_clean(g) for g in groups]
    width = max([1, *(len(g) for g in groups)]) if width is None else width
    out = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        out[i, : len(g)] = g
    return out


def compare_many(x: np.ndarray, y: np.ndarray, mode: str = "max", seed: int = 0,
                 conservative=False) -> dict[str, np.ndarray]:
    """``compare`` for k configurations at once: ``x`` (k, a) and ``y`` (k, b) hold each configuration's runs
    and its baseline's, finite values first and NaN after (``packed``). Returns arrays of length k: ``diff``,
    ``lo``, ``hi``, ``p_better``, ``verdict``, ``few``, ``p`` (Welch's two-sided p-value; NaN without
    an interval), ``dof`` (its degrees of freedom; NaN without an interval). ``conservative`` (a bool, or one
    per row): Welch's statistic on Hsu's degrees of freedom, the smaller side's runs less one, for the interval
    and p alike (module docstring: the search's own comparisons). Vectorised because a search of 100,000
    trials holds tens of thousands of configurations and one scipy call each took minutes; the bootstrap is
    scipy's percentile method, resampled here for all rows at once."""
    if mode not in ("max", "min"):     # anything else would silently read as "min" and flip every verdict
        raise ValueError(f"mode {mode!r}; allowed: max, min")
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    k = len(x)
    sign = 1.0 if mode == "max" else -1.0
    nx, ny = np.isfinite(x).sum(axis=1), np.isfinite(y).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx, my = np.nansum(x, axis=1) / nx, np.nansum(y, axis=1) / ny
        vx = np.nansum((x - mx[:, None]) ** 2, axis=1) / (nx - 1)
        vy = np.nansum((y - my[:, None]) ** 2, axis=1) / (ny - 1)
        size = np.fmax(np.where(np.isfinite(x), np.abs(x), 0.0).max(axis=1, initial=0.0),
                       np.where(np.isfinite(y), np.abs(y), 0.0).max(axis=1, initial=0.0))
        vx = np.where(no_spread(np.sqrt(vx), size), 0.0, vx)
        vy = np.where(no_spread(np.sqrt(vy), size), 0.0, vy)
        diff = sign * (mx - my)
        lo = np.full(k, np.nan)
        hi = np.full(k, np.nan)
        # fewer than MIN_RUNS runs: no interval, no p, no verdict. One run has no spread of its own (the
        # baseline's is no stand-in: a defended configuration's runs vary 2-10x more), and Welch's test on two
        # rests on one degree of freedom of it (§9)
        few = (nx >= 1) & (nx < MIN_RUNS) & (ny >= 2)
        p = np.full(k, np.nan)
        se2 = vx / nx + vy / ny
        # MIN_RUNS or more a side with some spread: Welch's interval, widened to the percentile bootstrap's
        # where that is wider. No spread on either side (every run equal) is no noise to measure against
        both = (nx >= MIN_RUNS) & (ny >= MIN_RUNS) & (se2 > 0)
        dof = se2 ** 2 / ((vx / nx) ** 2 / (nx - 1) + (vy / ny) ** 2 / (ny - 1))
        dof = np.where(np.broadcast_to(np.asarray(conservative, dtype=bool), (k,)),
                       np.minimum(nx, ny) - 1.0, dof)
        w_half = t_quantile(0.5 + LEVEL / 2, dof) * np.sqrt(se2)
        lo[both], hi[both] = (diff - w_half)[both], (diff + w_half)[both]
        p[both] = _two_sided(diff[both], np.sqrt(se2[both]), dof[both])
        rows = np.flatnonzero(both)
        if len(rows):
            b_lo, b_hi = _bootstrap(x[rows], y[rows], nx[rows], ny[rows], sign, seed)
            lo[rows], hi[rows] = np.minimum(lo[rows], b_lo), np.maximum(hi[rows], b_hi)
        # the probability of improvement: every pair of runs, ties counted half
        xs, ys = sign * x, sign * y
        pair = np.isfinite(xs)[:, :, None] & np.isfinite(ys)[:, None, :]
        gt = (xs[:, :, None] > ys[:, None, :]) & pair
        eq = (xs[:, :, None] == ys[:, None, :]) & pair
        p_better = (gt.sum(axis=(1, 2)) + 0.5 * eq.sum(axis=(1, 2))) / (nx * ny)
    verdict = np.full(k, NO_FLOOR, dtype=object)
    floor = np.isfinite(lo) & np.isfinite(hi)
    verdict[floor] = WITHIN
    verdict[floor & (lo > 0) & (p_better >= P_MIN)] = BETTER
    verdict[floor & (hi < 0) & (p_better <= 1 - P_MIN)] = WORSE
    return {"diff": diff, "lo": lo, "hi": hi, "p_better": p_better, "verdict": verdict, "few": few,
            "p": p, "dof": np.where(both, dof, np.nan)}


def _two_sided(diff: np.ndarray, scale: np.ndarray, dof: np.ndarray) -> np.ndarray:
    """2 P(T_dof > |diff| / scale), for a positive scale (``compare_many`` gives no p without spread)."""
    return np.clip(2 * t_sf(np.abs(diff) / scale, dof), 0.0, 1.0)


def p_digits(value: float) -> str:
    """A p- or q-value in two significant digits, or more where two would read as ``ALPHA`` itself (0.0504 is
    "0.05" at two: beside "not shown" at α 0.05 it read as a value that should have passed)."""
    v = float(value)
    alpha = round(ALPHA, 12)   # 1 - 0.95 is 0.050000000000000044
    for digits in (2, 3, 4, 6):
        text = f"{v:.{digits}g}"
        if float(text) != alpha or round(v, 12) == alpha:
            return text
    return text


def _over_members(p, adjust) -> np.ndarray:
    """``adjust`` applied to the finite entries of ``p``, one family; a NaN entry is not a member and stays NaN."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    keep = np.isfinite(p)
    if keep.any():
        out[keep] = adjust(p[keep])
    return out


def _holm(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p, kind="stable")
    m = len(order)
    out = np.empty(m)
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values of one family (NaN entries are not members and stay NaN): the
    i-th smallest of m is max over j <= i of (m - j + 1) p_(j), at most 1. Rejecting where the adjusted value
    is <= alpha keeps the probability of any false claim in the family at most alpha, under any dependence.
    Written here: scipy has no Holm, and statsmodels is not a dependency for one line."""
    return _over_members(p, _holm)


def _bh(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p, kind="stable")
    m = len(order)
    scaled = m * p[order] / np.arange(1, m + 1)
    out = np.empty(m)
    out[order] = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    return out


def bh(p) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values) of one family, NaN entries not members: the i-th
    smallest of m is min over j >= i of m p_(j) / j, at most 1. Marking where q <= alpha keeps the expected
    share of false marks among the marks at most alpha. Written here, not ``scipy.stats.false_discovery_control``:
    importing scipy.stats takes 1.5 s, which the report avoids (tests/test_report.py); tests/test_claims.py holds
    this one to scipy's."""
    return _over_members(p, _bh)


def _bootstrap(x, y, nx, ny, sign: float, seed: int, budget: int = 2_000_000) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap of the oriented difference of means, every row resampled independently with its
    own number of runs; rows in chunks of about ``budget`` draws."""
    rng = np.random.default_rng(seed)
    width = max(x.shape[1], y.shape[1])
    chunk = max(1, budget // (N_RESAMPLES * width))
    lo, hi = np.empty(len(x)), np.empty(len(x))
    q = [(1 - LEVEL) / 2, (1 + LEVEL) / 2]
    for s in range(0, len(x), chunk):
        sl = slice(s, s + chunk)
        means = []
        for v, n in ((x[sl], nx[sl]), (y[sl], ny[sl])):
            idx = (rng.random((len(v), N_RESAMPLES, v.shape[1])) * n[:, None, None]).astype(np.int64)
            draws = np.take_along_axis(np.broadcast_to(v[:, None, :], idx.shape), idx, axis=2)
            keep = np.arange(v.shape[1])[None, None, :] < n[:, None, None]
            means.append(np.where(keep, draws, 0.0).sum(axis=2) / n[:, None])
        stat = sign * (means[0] - means[1])
        lo[sl], hi[sl] = np.quantile(stat, q, axis=1)
    return lo, hi


def compare(x, y, mode: str = "max", seed: int = 0, conservative: bool = False) -> Comparison:
    """The configuration's runs ``x`` against the baseline's ``y`` on one metric (module docstring)."""
    r = compare_many(packed([x]), packed([y]), mode, seed, conservative)
    return Comparison(float(r["diff"][0]), float(r["lo"][0]), float(r["hi"][0]), float(r["p_better"][0]),
                      str(r["verdict"][0]), bool(r["few"][0]), float(r["p"][0]))




def band_of(mean: float, std: float, n: int) -> tuple[float, float, float]:
    """(mean, lo, hi): where one more run of a configuration of ``n`` runs with this mean and sample standard
    deviation falls with 95 % probability (a prediction interval, ``mean ± t(n - 1) · s · sqrt(1 + 1/n)``);
    NaN ends below two runs. The report draws the baseline's band: a single-seed point inside it cannot be
    told from the baseline."""
    if n < 2 or not math.isfinite(std) or not math.isfinite(mean):
        return float(mean), float("nan"), float("nan")
    half = _t(n - 1) * std * math.sqrt(1 + 1 / n)
    return float(mean), float(mean - half), float(mean + half)
