"""noise.py: the test behind every claim of the report (docs/protocol.md §9)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from cem_bench.analysis import noise


def test_probability_of_improvement_is_the_mann_whitney_u():
    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 4, int(rng.integers(1, 7))).astype(float) for _ in range(40)]   # ties on purpose
    ys = [rng.integers(0, 4, int(rng.integers(1, 7))).astype(float) for _ in range(40)]
    for mode in ("max", "min"):
        got = noise.compare_many(noise.packed(xs), noise.packed(ys), mode)["p_better"]
        for x, y, p in zip(xs, ys, got):
            sx, sy = (x, y) if mode == "max" else (-x, -y)
            assert p == pytest.approx(stats.mannwhitneyu(sx, sy).statistic / (len(x) * len(y)))


def test_the_interval_holds_welchs_and_the_scipy_bootstrap():
    """Per row: at least as wide as Welch's t interval and (to the bootstrap's own resampling noise) as
    scipy's percentile bootstrap of the same difference."""
    rng = np.random.default_rng(1)
    for _ in range(10):
        x, y = rng.lognormal(0, 1, 8), rng.lognormal(0.3, 0.2, 6)      # skewed: the bootstrap can be wider
        c = noise.compare(x, y, "max")
        welch = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
        assert c.lo <= welch.low + 1e-12 and c.hi >= welch.high - 1e-12
        ref = stats.bootstrap((x, y), lambda a, b, axis=-1: a.mean(axis=axis) - b.mean(axis=axis),
                              vectorized=True, method="percentile", n_resamples=20000,
                              rng=np.random.default_rng(2)).confidence_interval
        spread = np.std(x) / np.sqrt(8) + np.std(y) / np.sqrt(6)
        assert c.lo <= ref.low + 0.1 * spread and c.hi >= ref.high - 0.1 * spread


def test_rows_at_once_equal_rows_one_by_one():
    rng = np.random.default_rng(3)
    xs = [rng.normal(0.1 * i, 1, int(rng.integers(1, 5))) for i in range(12)]
    ys = [rng.normal(0, 1, int(rng.integers(1, 5))) for _ in range(12)]
    many = noise.compare_many(noise.packed(xs), noise.packed(ys), "min")
    for i, (x, y) in enumerate(zip(xs, ys)):
        one = noise.compare(x, y, "min")
        assert one.verdict == many["verdict"][i] and one.few == many["few"][i]
        assert one.diff == pytest.approx(many["diff"][i]) and one.p_better == pytest.approx(many["p_better"][i])
        if len(x) == 1 or len(y) < 2:     # closed form: identical
            assert one.lo == pytest.approx(many["lo"][i], nan_ok=True)
    assert set(many["verdict"]) <= {*noise.VERDICTS, noise.NO_FLOOR}


def test_pure_noise_is_rarely_claimed_and_a_clear_effect_always():
    """The false-claim rate at 3 runs a side stays near the 5 % of a 95 % interval (the percentile bootstrap
    alone: about 20 %), and a drop of ten spreads is claimed every time."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(0, 1, (2000, 3)), rng.normal(0, 1, (2000, 3))
    null = noise.compare_many(x, y, "max")["verdict"]
    assert np.isin(null, [noise.BETTER, noise.WORSE]).mean() < 0.06
    clear = noise.compare_many(x + 10, y, "max")["verdict"]
    assert (clear == noise.BETTER).all()


def test_the_t_functions_are_scipy_stats_own():
    """``t_quantile`` and ``t_sf`` (scipy.special, so that a report need not import scipy.stats) equal
    scipy.stats' t, and the non-central t the summary's seed count uses equals ``nct.sf``: the same numbers, the
    same NaN where the degrees of freedom are none (0, negative, NaN)."""
    dof = np.array([np.nan, -1.0, 0.0, 0.5, 1.0, 2.3, 5.0, 30.0, 1e6, np.inf])
    for q in (0.025, 0.5, 0.975, 1 - noise.ALPHA / 2):
        np.testing.assert_allclose(noise.t_quantile(q, dof), stats.t.ppf(q, dof), rtol=1e-13, atol=0)
    x = np.array([0.0, 0.1, 1.96, 5.0, 40.0, np.inf, np.nan])
    for d in (1.0, 2.3, 7.0, 1e6, np.nan, np.inf):
        np.testing.assert_allclose(noise.t_sf(x, d), stats.t.sf(x, d), rtol=1e-13, atol=0)
    from scipy.special import nctdtr
    for d, nc, t in [(3, 1.5, 2.5), (10.7, 3.1, 2.2), (2.1, 0.2, 4.3), (50, 6, 2)]:
        assert 1 - nctdtr(d, nc, t) == pytest.approx(stats.nct.sf(t, d, nc), rel=1e-12)


def test_a_p_value_never_prints_as_alpha_unless_it_is():
    """At two significant digits 0.0504 read "0.05" beside "not shown" at α 0.05 (and 0.0496 beside "holds")."""
    from cem_bench.analysis.noise import p_digits
    assert [p_digits(v) for v in (0.0504, 0.0496, 0.05, 0.031, 0.12, 0.050001)] == \
        ["0.0504", "0.0496", "0.05", "0.031", "0.12", "0.050001"]
