"""The report's claims on simulated searches whose truth is known (issue 34): the summary names no winner on
pure noise more often than 5 % of reports, whatever the number of configurations; a real effect is found;
a trade-off is called one; the summary and the tables tell one story. The rates themselves are in
docs/protocol.md §9 (``python -m cem_bench.analysis.report.claims``); the slow test re-measures them on more tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cem_bench.analysis import noise
from cem_bench.analysis.aggregate import build_configs
from cem_bench.analysis.report import load_results, summary_sentence
from cem_bench.analysis.report.claims import SSIM, judge, rates, simulated_trials
from cem_bench.analysis.report.load import results_of
from cem_bench.analysis.report.summary import AT, TRADE_OFF, UNRESOLVED, claim, utility_states
from cem_bench.cli import main
from cem_bench.spaces import parse_space
from cem_bench.storage import jsonable

OBJ = [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}]


def most_false(tables: int, rate: float = noise.ALPHA) -> int:
    """The most false claims ``tables`` reports may hold when each is false with probability ``rate``: the
    binomial 99.9 % quantile, so a test passes at a true rate of 5 % and fails at the 15-30 % of issue 34."""
    return int(stats.binom.ppf(0.999, tables, rate))


# ---------------------------------------------------------------- the corrections themselves
def test_p_values_are_welchs_and_the_adjustments_are_holm_and_benjamini_hochberg():
    rng = np.random.default_rng(3)
    xs, ys = [rng.normal(0, 1, 3) for _ in range(40)], [rng.normal(0.5, 2, 4) for _ in range(40)]
    r = noise.compare_many(noise.packed(xs), noise.packed(ys), "max")
    assert r["p"] == pytest.approx([stats.ttest_ind(x, y, equal_var=False).pvalue for x, y in zip(xs, ys)])
    # p <= 0.05 exactly where Welch's interval excludes 0 (the bootstrap only ever widens it)
    welch = [stats.ttest_ind(x, y, equal_var=False).confidence_interval() for x, y in zip(xs, ys)]
    assert [p <= 0.05 for p in r["p"]] == [ci.low > 0 or ci.high < 0 for ci in welch]
    p = rng.random(25) ** 3
    p[4] = np.nan                                    # not a member of the family
    keep = np.isfinite(p)
    assert noise.bh(p)[keep] == pytest.approx(stats.false_discovery_control(p[keep]))
    assert np.isnan(noise.bh(p)[4]) and np.isnan(noise.holm(p)[4])
    assert noise.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert (noise.holm(p)[keep] >= noise.bh(p)[keep] - 1e-12).all()   # a Holm claim is always a BH mark
    # one or two runs: no interval, no p (so no family member), no verdict, however far
    for runs in ([25.0], [25.0, 26.0]):
        few = noise.compare(runs, [0.0, 1.0, 2.0], "max")
        assert few.few and few.verdict == noise.NO_FLOOR and np.isnan(few.p) and np.isnan(few.lo)
        assert few.diff == pytest.approx(np.mean(runs) - 1.0)
    assert noise.compare([25.0, 26.0, 27.0], [0.0, 1.0], "max").verdict == noise.NO_FLOOR   # 2 baseline runs


def test_the_search_s_own_comparisons_take_hsu_s_degrees_of_freedom_and_confirmed_ones_welch_s():
    """Welch's degrees of freedom are estimated from the spreads the test weighs: among many configurations
    spreading more than the baseline, the best-looking have both a small spread and high degrees of freedom,
    and Holm passed pure noise in 5.8-12.2 % of reports (docs/protocol.md §9). The search's own comparisons now
    take Hsu's, the smaller side's runs less one (interval and p alike, so p <= 0.05 still exactly where the
    interval excludes 0); a confirmed configuration's, on new runs, keep Welch's."""
    rng = np.random.default_rng(4)
    xs, ys = [rng.normal(0, 8, 3) for _ in range(40)], [rng.normal(0, 1, 4) for _ in range(40)]
    r = noise.compare_many(noise.packed(xs), noise.packed(ys), "max", conservative=True)
    assert (r["dof"] == 2.0).all()
    t = [stats.ttest_ind(x, y, equal_var=False).statistic for x, y in zip(xs, ys)]
    assert r["p"] == pytest.approx([2 * stats.t.sf(abs(v), 2) for v in t])
    welch = noise.compare_many(noise.packed(xs), noise.packed(ys), "max")
    assert (r["p"] >= welch["p"] - 1e-12).all() and (welch["dof"] >= 2.0).all()
    half = [stats.t.ppf(0.975, 2) * np.sqrt(np.var(x, ddof=1) / 3 + np.var(y, ddof=1) / 4) for x, y in zip(xs, ys)]
    assert [p <= 0.05 for p in r["p"]] == [abs(np.mean(x) - np.mean(y)) > h for x, y, h in zip(xs, ys, half)]
    # in the tables: the search's configurations on Hsu's, the confirmed ones on Welch's
    c = build_configs(simulated_trials(np.random.default_rng(11), 12, spread=8.0, confirm=3), OBJ)
    search, conf = c[c["role"] == "search"], c[c["role"] == "confirmed"]
    n = search["attack_ssim_n"].to_numpy(float)
    assert search["attack_ssim_dof"].to_numpy(float) == pytest.approx(np.minimum(n, 4) - 1)
    assert (conf["attack_ssim_dof"] > np.minimum(conf["attack_ssim_n"], 4) - 1).all()


def test_pure_noise_at_8x_the_baseline_s_spread_is_claimed_no_more_than_5_percent():
    """The design that passed Holm's correction on Welch's degrees of freedom (5.8 % at 12 configurations, 12.2 %
    at 100, on 400 reports; docs/protocol.md §9): configurations of 3 runs spreading 8x the baseline's 4."""
    rng = np.random.default_rng(8)
    judged = [judge(simulated_trials(rng, 100, spread=8.0)) for _ in range(40)]
    assert sum(j.named is not None for j in judged) <= most_false(40, 0.01), [j.named for j in judged]
    assert all(j.consistent for j in judged)


def test_configs_carry_the_single_test_and_the_adjusted_values_per_family():
    """Twelve pure-noise configurations and one clearly better one: p, q and Holm side by side; a single-test
    verdict that does not survive the correction is "within noise" in ``<m>_verdict``; the confirmed
    configurations are a family of their own."""
    rng = np.random.default_rng(11)
    trials = simulated_trials(rng, 12, effect={0: (0.0, -0.2)}, confirm=3)
    c = build_configs(trials, OBJ)
    for col in ("attack_ssim_p", "attack_ssim_q", "attack_ssim_holm", "attack_ssim_verdict_single",
                "test_acc_q", "test_acc_holm"):
        assert col in c, col
    search, conf = c[c["role"] == "search"], c[c["role"] == "confirmed"]
    assert len(conf) == 3 and len(search) == 9      # the three confirmed left the search's family
    assert search["attack_ssim_q"].to_numpy() == pytest.approx(noise.bh(search["attack_ssim_p"].to_numpy()))
    assert conf["attack_ssim_holm"].to_numpy() == pytest.approx(noise.holm(conf["attack_ssim_p"].to_numpy()))
    strong = conf[conf["config.cem.lambd"] == 1.0].iloc[0]
    assert strong["attack_ssim_verdict"] == "better" and strong["attack_ssim_holm"] <= 0.05
    survived = c["attack_ssim_q"] <= 0.05
    single = c["attack_ssim_verdict_single"].isin(["better", "worse"])
    assert (c.loc[single & ~survived, "attack_ssim_verdict"] == "within noise").all()
    assert (c.loc[single & survived, "attack_ssim_verdict"] == c.loc[single & survived, "attack_ssim_verdict_single"]).all()


# ---------------------------------------------------------------- the rates (fast tier: bounded)
@pytest.mark.parametrize("configs,tables", [(12, 120), (100, 40)])
def test_pure_noise_names_no_winner_in_more_than_5_percent_of_reports(configs, tables):
    """Every configuration is drawn from the baseline's distribution (baseline 4 runs, configurations 3,
    accuracy N(0.90, 0.03), SSIM N(0.75, 0.01)): the summary's false claims stay within the binomial margin
    of 5 % of reports, and no page contradicts itself."""
    rng = np.random.default_rng(configs)
    judged = [judge(simulated_trials(rng, configs)) for _ in range(tables)]
    false = sum(j.named is not None for j in judged)
    assert false <= most_false(tables), f"{false} of {tables} reports name a winner on pure noise"
    assert all(j.consistent for j in judged)
    marks, compared = sum(j.marks for j in judged), sum(j.compared for j in judged)
    assert marks <= most_false(compared), f"{marks} of {compared} comparisons marked on pure noise"


def test_a_real_drop_is_found_once_confirmed_and_only_hinted_at_before():
    """One configuration lowers SSIM by 5 baseline spreads among 11 null ones, 3 seeds each: with the top 3
    confirmed on 4 new seeds the summary claims it in >= 80 % of reports (docs/protocol.md §9: 99 %); without
    confirmation the conservative test over 12 seldom claims it (3.5 %) and never another, and a report that
    claims nothing says how many confirmation seeds would resolve it."""
    rng = np.random.default_rng(5)
    effect = {0: (0.0, -5 * SSIM[1])}
    confirmed = [judge(simulated_trials(rng, 12, effect=effect, confirm=3)) for _ in range(40)]
    assert sum(j.named == 0 for j in confirmed) >= 0.8 * 40
    assert sum(j.named not in (None, 0) for j in confirmed) <= 2
    assert all(j.consistent for j in confirmed)
    alone = [judge(simulated_trials(rng, 12, effect=effect)) for _ in range(30)]
    assert sum(j.named not in (None, 0) for j in alone) <= 2
    assert all(j.consistent for j in alone)
    silent = [j.sentence for j in alone if j.named is None]
    assert silent and all("new seeds would resolve a difference of this size" in s for s in silent)
    # truly unchanged accuracy is never called "a trade-off" more often than the single test's 2.5 %
    assert sum(j.utility == TRADE_OFF for j in confirmed + alone) <= most_false(70, 0.025)


def test_a_true_trade_off_is_named_one():
    """SSIM -0.10 and accuracy -0.10 in one configuration among 11 null ones: the summary names the privacy
    gain and calls it a trade-off (docs/protocol.md §9 gives the rates with and without confirmation)."""
    rng = np.random.default_rng(9)
    judged = [judge(simulated_trials(rng, 12, effect={0: (-0.10, -0.10)}, confirm=3)) for _ in range(40)]
    assert sum(j.named == 0 and j.utility == TRADE_OFF for j in judged) >= 0.9 * 40
    assert all(j.sentence.startswith("A trade-off, not free privacy") for j in judged if j.utility == TRADE_OFF)
    assert all(j.consistent for j in judged)


@pytest.mark.slow
def test_the_rates_of_docs_protocol_section_9():
    """The one design of docs/protocol.md §9 that the tests above do not draw, re-measured on 100 simulated
    searches: twelve null configurations whose best three are confirmed on new seeds (the best of many, then
    confirmed). The table itself is `python -m cem_bench.analysis.report.claims --tables 400`. The designs the
    tests above draw (null 12 and 100, the confirmed drop, the confirmed trade-off) are not drawn again here: the
    same bounds on more searches cost minutes of CI (docs/architecture.md 5.5)."""
    n = 100
    r = rates("null 12, top 3 confirmed", n, seed=2)
    assert r["false claim"] <= most_false(n), r
    assert r["inconsistent"] == 0, r
    assert r["marks"] <= most_false(r["compared"]), r


# ---------------------------------------------------------------- the sentences
def _trials(acc_drop: float, acc_spread: float, ssim_drop: float = 0.2, n: int = 4) -> pd.DataFrame:
    """A baseline and one confirmed configuration of ``n`` runs each with fixed offsets (no randomness): the
    configuration lowers SSIM by ``ssim_drop`` and accuracy by ``acc_drop``, both groups spread by
    ``acc_spread`` in accuracy."""
    offsets = np.linspace(-1, 1, n)
    rows = []
    for role, lam, d_acc, d_ssim in (("baseline", 0.0, 0.0, 0.0), ("confirm", 16.0, acc_drop, ssim_drop)):
        for s, k in enumerate(offsets):
            rows.append({"trial_id": f"t{len(rows)}", "status": "ok", "role": role, "config.seed": s + 10 * (lam > 0),
                         "config.defense.noise_std": 0.1, "config.cem.lambd": lam, "config.cem.surrogate": "gmm",
                         "test_acc": 0.9 - d_acc + acc_spread * k, "attack_ssim": 0.75 - d_ssim + 0.01 * k,
                         "wall_s": 1.0})
    return pd.DataFrame(rows)


def test_at_the_baseline_accuracy_needs_an_interval_inside_the_tolerance():
    """The same mean accuracy drop (0.005): 'at the baseline's accuracy' where the interval is narrow, 'not
    resolved' where the runs spread by 0.05 (the rule of the mean alone accepted both); a drop beyond the noise
    is a trade-off; the space's utility_tolerance decides."""
    narrow = results_of(_trials(0.005, 0.002), OBJ)
    wide = results_of(_trials(0.005, 0.05), OBJ)
    assert claim(narrow).utility == AT and claim(wide).utility == UNRESOLVED
    s = summary_sentence(narrow)
    assert s.startswith("Beyond the noise of the λ=0 baseline") and "at the baseline's test_acc" in s, s
    assert "0.02 (the default utility_tolerance)" in s      # the space states none
    stated = summary_sentence(results_of(_trials(0.005, 0.002), OBJ, utility_tolerance=0.03))
    assert "0.03 (the space's utility_tolerance)" in stated
    s = summary_sentence(wide)
    assert s.startswith("Beyond the noise of the λ=0 baseline") and "cost in test_acc is not resolved" in s, s
    assert "confirmation seeds" in s.lower()
    costly = results_of(_trials(0.10, 0.01), OBJ)
    assert claim(costly).utility == TRADE_OFF
    assert summary_sentence(costly).startswith("A trade-off, not free privacy: gmm")
    # a drop of 0.03 with a tight interval: past the default 2 points, inside a stated 0.05
    tight = _trials(0.03, 0.002)
    assert utility_states(results_of(tight, OBJ).configs.query("role == 'confirmed'"),
                          results_of(tight, OBJ)).iloc[0] == TRADE_OFF
    assert claim(results_of(tight, OBJ, utility_tolerance=0.05)).utility == AT


def test_the_most_private_claimed_configuration_is_named_with_its_own_utility():
    """Two confirmed configurations beyond the noise: the more private costs 10 points of accuracy, the other
    none. The summary named the one "at the baseline's accuracy" (the best of several equivalence tests,
    uncorrected); it names the most private and calls it what its one test says, a trade-off."""
    offsets = np.linspace(-1, 1, 4)
    rows = []
    for role, lam, d_acc, d_ssim in (("baseline", 0.0, 0.0, 0.0), ("confirm", 16.0, 0.10, 0.2),
                                     ("confirm", 8.0, 0.0, 0.1)):
        for s, k in enumerate(offsets):
            rows.append({"trial_id": f"t{len(rows)}", "status": "ok", "role": role,
                         "config.seed": s + 10 * int(lam), "config.defense.noise_std": 0.1, "config.cem.lambd": lam,
                         "config.cem.surrogate": "gmm", "test_acc": 0.9 - d_acc + 0.002 * k,
                         "attack_ssim": 0.75 - d_ssim + 0.01 * k, "wall_s": 1.0})
    res = results_of(pd.DataFrame(rows), OBJ)
    c = claim(res)
    assert len(c.claimed) == 2
    assert c.named["config.cem.lambd"] == 16.0 and c.utility == TRADE_OFF
    assert summary_sentence(res).startswith("A trade-off, not free privacy: gmm")


def test_an_unconfirmed_claim_is_exploratory_and_counts_its_comparisons():
    rng = np.random.default_rng(2)
    s = summary_sentence(results_of(simulated_trials(rng, 12, effect={0: (0.0, -0.2)}), OBJ))
    assert s.startswith("Beyond the noise of the λ=0 baseline"), s
    assert "exploratory until confirmed with new seeds" in s and "over the 12 configurations compared" in s
    s = summary_sentence(results_of(simulated_trials(rng, 12, effect={0: (0.0, -0.2)}, confirm=3), OBJ))
    assert "confirmed with new seeds" in s and "over the 3 confirmed configurations compared" in s
    assert "exploratory" not in s


def test_the_tolerance_is_a_key_of_the_space_and_reaches_the_report(tmp_path):
    doc = {"name": "t", "objectives": [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}],
           "num_samples": 2, "params": {"cem.lambd": {"choice": [8, 16]}}}
    # a space that states none saves none: its report calls the tolerance the default, not the space's (the
    # parser once saved 0.02, so every report said "the space's utility_tolerance")
    assert parse_space(doc).to_dict()["utility_tolerance"] is None
    assert parse_space({**doc, "utility_tolerance": 0.05}).to_dict()["utility_tolerance"] == 0.05
    for bad in (-0.1, "two points", True):
        with pytest.raises(Exception, match="utility_tolerance"):
            parse_space({**doc, "utility_tolerance": bad})
    _trials(0.03, 0.002).to_parquet(tmp_path / "trials.parquet")
    (tmp_path / "search_space.json").write_text(json.dumps({"name": "t", "objectives": OBJ, "utility_tolerance": 0.05}))
    res = load_results(tmp_path)
    assert res.utility_tolerance == 0.05 and claim(res).utility == AT
    (tmp_path / "search_space.json").write_text(json.dumps(jsonable(parse_space(doc).to_dict())))
    res = load_results(tmp_path)
    assert res.utility_tolerance is None and claim(res).utility == TRADE_OFF   # the default's 0.02, not 0.05


def test_the_table_marks_only_what_survives_and_prints_p_and_q(tmp_path, capsys):
    rng = np.random.default_rng(4)
    simulated_trials(rng, 12, effect={0: (0.0, -0.2)}).to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path), "--metrics", "attack_ssim"]) == 0
    out = capsys.readouterr().out
    assert "[+]" in out.split("attack_ssim: p (single test)")[0]
    assert "attack_ssim p / q" in out and "Benjamini-Hochberg" in out and "(n confirmed)" in out
    # a configs.parquet written before the adjustment is rebuilt from the trials
    old = build_configs(pd.read_parquet(tmp_path / "trials.parquet"), OBJ)
    old = old.drop(columns=[c for c in old.columns if c.endswith(("_q", "_holm", "_verdict_single"))])
    old.to_parquet(tmp_path / "configs.parquet")
    assert main(["table", str(tmp_path), "--metrics", "attack_ssim"]) == 0
    assert "attack_ssim p / q" in capsys.readouterr().out


@pytest.mark.slow
def test_the_independent_check_finds_no_winner_on_pure_noise(tmp_path):
    """scripts/independent_claims.py writes pure-noise folders without claims.py and reads them through
    `cem-bench report` and `cem-bench table` (docs/protocol.md §9 gives its rates on 40 tables per design)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import independent_claims as ic
    rng = np.random.default_rng(11)
    results = [ic.judge(ic.write_folder(tmp_path / f"t{i}", rng, 12)) for i in range(6)]
    assert sum(claimed for claimed, _, _ in results) <= 1, results    # binomial(6, 0.05): P(>= 2) = 3 %
    assert sum(m for _, m, _ in results) <= 0.05 * sum(k for _, _, k in results) + 2, results


# ---------------------------------------------------------------- the audit of 2026-11-27 (valid, adversarial tables)
@pytest.mark.parametrize("runs,spread", [(1, 8.0), (2, 3.0)])
def test_no_claim_from_one_or_two_runs_of_a_noisier_configuration(runs, spread):
    """A defended configuration's runs vary 2-10x more than the baseline's (docs/protocol.md §10). One run judged
    with the baseline's spread named a winner on such pure noise in 79 % of reports, two runs under Welch's test
    in 14 % (and its tables marked 2.8 % of the comparisons): a comparison needs 3 runs a side."""
    rng = np.random.default_rng(runs)
    judged = [judge(simulated_trials(rng, 12, runs=runs, spread=spread)) for _ in range(40)]
    assert sum(j.named is not None for j in judged) == 0 and sum(j.marks for j in judged) == 0
    assert all(j.consistent for j in judged)
    assert sum(j.compared for j in judged) == 0            # no p-value: not a member of any family
    assert all("could be compared" in j.sentence and "3 or more runs a side" in j.sentence for j in judged), \
        judged[0].sentence
    from cem_bench.analysis.table import legend
    text = legend(results_of(simulated_trials(rng, 12, runs=runs, spread=spread), OBJ).configs, "attack_ssim")
    assert "No cell of 3 or more runs" in text and "spread from the baseline" not in text, text


def test_no_spread_on_either_side_is_no_verdict_and_a_misspelt_mode_is_refused():
    same = noise.compare([0.1 + 0.2] * 3, [0.3] * 3, "max")        # 5.6e-17 apart: rounding, not a finding
    assert same.verdict == noise.NO_FLOOR and np.isnan(same.p)
    # every run equal on each side, the sides apart: [0.1] * 3 has a computed variance of 3e-34 (its mean is
    # rounded), and was "worse", p 1.8e-46, until 2026-12-06
    for x, y in (([0.1] * 3, [0.2] * 3), ([0.1] * 4, [0.1] * 3), ([0.7] * 3, [0.7000001] * 3)):
        c = noise.compare(x, y, "max")
        assert c.verdict == noise.NO_FLOOR and np.isnan(c.p), (x, y, c)
    assert noise.compare([0.1, 0.11, 0.12], [0.2] * 3, "max").verdict == noise.WORSE   # one side varies
    with pytest.raises(ValueError, match="allowed: max, min"):
        noise.compare([0.9, 0.91, 0.92], [0.8, 0.81, 0.82], "Max")


def test_the_seeds_a_difference_needs_follow_the_same_rule_for_no_spread():
    """Where neither side's runs vary, the comparison gives no verdict (above), so the summary promises no
    number of confirmation seeds either (it said 2 before 2026-12-06); one side with a spread is a Welch test."""
    from cem_bench.analysis.report.summary import _flat, equivalence_seeds, seeds_needed

    def row(mean, std, n=3):
        return pd.Series({"attack_ssim": mean, "attack_ssim_std": std, "attack_ssim_n": n,
                          "attack_ssim_delta": mean - 0.8})
    base_flat, base = row(0.8, np.std([0.8] * 3, ddof=1) + 1.7e-17), row(0.8, 0.02)
    flat = row(0.7, 1.7e-17)
    assert seeds_needed(flat, base_flat, "attack_ssim") is None and _flat(flat, base_flat, "attack_ssim")
    assert equivalence_seeds(flat, base_flat, "attack_ssim", 0.2, "min") is None
    # 3, not 2: a side of 2 runs gets no test (noise.MIN_RUNS), so 2 seeds would resolve nothing (said 2 before
    # 2026-12-06 pm); nor does a baseline of 2 runs lead to a number of seeds
    assert seeds_needed(flat, base, "attack_ssim") == 3 and not _flat(flat, base, "attack_ssim")
    assert seeds_needed(flat, row(0.8, 0.02, n=2), "attack_ssim") is None
    assert equivalence_seeds(row(0.8, 0.001), base, "attack_ssim", 0.2, "max") == 3
    assert [seeds_needed(row(m, 0.02), base, "attack_ssim") for m in (0.77, 0.74, 0.72)] == [None, 4, 3]
    # a baseline of 3 runs at 0.02 limits it: no number of seeds gives an interval inside 0.05 80 % of the time
    assert equivalence_seeds(row(0.79, 0.02), base, "attack_ssim", 0.05, "max") is None
    assert equivalence_seeds(row(0.79, 0.02), row(0.8, 0.02, n=10), "attack_ssim", 0.05, "max") == 5


def test_a_drop_past_the_tolerance_is_not_sent_to_the_baseline_s_seeds():
    """An unresolved accuracy cost whose drop seen is already past the tolerance: no number of seeds shows it at
    the baseline's accuracy, and the page said the baseline's spread needed more seeds."""
    s = summary_sentence(results_of(_trials(0.05, 0.05), OBJ))
    assert "cost in test_acc is not resolved" in s, s
    assert "The drop seen already reaches the tolerance: no number of seeds would show it" in s
    assert "The baseline's own test_acc spread needs more seeds too" not in s


def test_the_seeds_said_to_fit_the_tolerance_fit_it_80_percent_of_the_time():
    """The accuracy advice gave the seeds at which the *expected* half-width fits: such confirmations showed the
    configuration at the baseline's accuracy 53-59 % of the time (a review, 2026-12-06). It now gives the seeds
    at which its interval lies inside the tolerance with the privacy advice's probability (80 %)."""
    from cem_bench.analysis.report.summary import POWER, equivalence_seeds
    rng = np.random.default_rng(0)
    z = rng.normal(size=10)
    base_runs = 0.8 + 0.02 * (z - z.mean()) / z.std(ddof=1)      # the baseline's runs as they are
    base = pd.Series({"attack_ssim": 0.8, "attack_ssim_std": 0.02, "attack_ssim_n": 10, "attack_ssim_delta": 0.0})
    row = pd.Series({"attack_ssim": 0.79, "attack_ssim_std": 0.02, "attack_ssim_n": 3, "attack_ssim_delta": -0.01})
    n = equivalence_seeds(row, base, "attack_ssim", 0.05, "max")

    def inside(k: int) -> float:   # the share of k-seed confirmations whose Welch interval lies above -0.05
        runs = rng.normal(0.79, 0.02, (4000, k))
        a, b = runs.var(axis=1, ddof=1) / k, base_runs.var(ddof=1) / 10
        dof = (a + b) ** 2 / (a ** 2 / (k - 1) + b ** 2 / 9)
        lo = runs.mean(axis=1) - base_runs.mean() - stats.t.ppf(0.975, dof) * np.sqrt(a + b)
        return float((lo > -0.05).mean())

    assert inside(n) >= POWER - 0.03 and inside(n - 1) < POWER, (n, inside(n), inside(n - 1))


def _rows(lam, seeds, acc, ssim, **config):
    return [{"trial_id": f"t{lam}-{s}-{config.get('config.defense.noise_std', 0.1)}", "status": "ok",
             "role": "baseline" if lam == 0 else "search", "config.seed": s, "config.defense.noise_std": 0.1,
             "config.cem.lambd": float(lam), "config.cem.surrogate": "gmm", "test_acc": acc + 0.002 * s,
             "attack_ssim": ssim + 0.003 * s, "wall_s": 1.0, **config} for s in seeds]


def test_a_baseline_on_another_data_set_is_no_baseline():
    """The only λ = 0 baseline ran on another data set than the configurations: they have no baseline (they
    were compared with it, and the page called a 50 % SSIM drop beyond its noise); a key that only says how the
    trials ran (the device) still lets them share one."""
    rows = _rows(0, range(4), 0.90, 0.75, **{"config.data.dataset": "cifar10"})
    rows += [r for lam in (1, 2, 4) for r in _rows(lam, range(3), 0.99, 0.40, **{"config.data.dataset": "digits"})]
    c = build_configs(pd.DataFrame(rows), OBJ)
    assert c.loc[c["role"] != "baseline", "baseline_id"].isna().all()
    s = summary_sentence(results_of(pd.DataFrame(rows), OBJ))
    assert "beyond the noise" not in s.split(".")[0] and "compared with none" in s, s
    rows = _rows(0, range(4), 0.90, 0.75, **{"config.train.device": "cuda"})
    rows += [r for lam in (1, 2) for r in _rows(lam, range(3), 0.90, 0.70, **{"config.train.device": "cpu"})]
    c = build_configs(pd.DataFrame(rows), OBJ)
    assert c.loc[c["role"] != "baseline", "baseline_id"].notna().all()


def test_the_summary_names_the_baseline_it_compared_with():
    """Two σ, each with its baseline: the sentence after the claim gives the claimed configuration's own
    baseline (it gave the one with the most runs, of the other σ)."""
    rows = _rows(0, range(4), 0.95, 0.90, **{"config.defense.noise_std": 0.01})
    rows += _rows(0, range(3), 0.80, 0.60)
    rows += _rows(8, range(100, 104), 0.95, 0.89, **{"config.defense.noise_std": 0.01})
    rows += _rows(8, range(100, 104), 0.80, 0.45)
    for r in rows:
        r["role"] = "confirm" if r["config.cem.lambd"] else "baseline"
    s = summary_sentence(results_of(pd.DataFrame(rows), OBJ))
    assert "The λ=0 baseline (σ 0.1) has attack_ssim 0.60" in s, s


def test_a_baseline_whose_attack_ran_once_is_no_noise_floor():
    """Two baseline runs, one with the attack skipped by the utility gate: one value of the privacy metric is
    no noise floor (the page called a 50 % drop "within the noise" and asked for "more than 30" seeds)."""
    rows = _rows(0, range(2), 0.90, 0.75)
    rows[1]["attack_ssim"] = np.nan
    rows += [r for lam in (1, 2, 4) for r in _rows(lam, range(3), 0.90, 0.75 - 0.1 * lam)]
    res = results_of(pd.DataFrame(rows), OBJ)
    assert not res.has_floor
    s = summary_sentence(res)
    assert "no noise floor" in s and "within the noise" not in s and "more than 30" not in s, s


def test_an_infinite_metric_is_missing_everywhere():
    """An ok trial with SSIM −inf: the mean, n and the comparison all leave it out (the mean was −inf over '3
    runs' while the comparison used 2)."""
    rows = _rows(0, range(3), 0.90, 0.75) + _rows(4, range(3), 0.90, 0.70)
    rows[4]["attack_ssim"] = -np.inf
    c = build_configs(pd.DataFrame(rows), OBJ).set_index("role")
    assert c.loc["search", "attack_ssim_n"] == 2 and np.isfinite(c.loc["search", "attack_ssim_mean"])
    res = results_of(pd.DataFrame(rows), OBJ)
    assert np.isfinite(res.trials["attack_ssim"]).sum() == 5


def test_objectives_the_report_would_read_backwards_are_refused(tmp_path):
    """An attack metric first (the report's utility axis) or with the mode that is less private: refused by
    the space parser and, in a search_space.json written by hand, by the report."""
    doc = {"name": "t", "num_samples": 2, "params": {"cem.lambd": {"choice": [8, 16]}}}
    with pytest.raises(Exception, match="first objective is the utility axis"):
        parse_space({**doc, "objectives": [OBJ[1], OBJ[0]]})
    with pytest.raises(Exception, match="more private when lower: its mode is min, not max"):
        parse_space({**doc, "objectives": [OBJ[0], {"metric": "attack_ssim", "mode": "max"}]})
    parse_space({**doc, "objectives": [OBJ[0], {"metric": "attack_mse", "mode": "max"}]})
    # accuracy minimised: the search looked for the worst classifier (accepted until 2026-12-06)
    with pytest.raises(Exception, match="test_acc is better when higher: its mode is max, not min"):
        parse_space({**doc, "objectives": [{"metric": "test_acc", "mode": "min"}, OBJ[1]]})
    _trials(0.0, 0.002).to_parquet(tmp_path / "trials.parquet")
    (tmp_path / "search_space.json").write_text(json.dumps({"name": "t", "objectives": [OBJ[1], OBJ[0]]}))
    with pytest.raises(Exception, match="first objective is the utility axis"):
        load_results(tmp_path)


def test_a_stored_table_that_judged_one_run_by_the_baselines_spread_is_rebuilt(tmp_path):
    """configs.parquet written before one run lost its verdict holds ``spread_borrowed``: `table` and the
    report rebuild it from the trials instead of showing its marks."""
    from cem_bench.analysis import table
    from cem_bench.integrity import table_bytes
    rows = _rows(0, range(3), 0.90, 0.75) + _rows(4, [0], 0.90, 0.60)
    pd.DataFrame(rows).to_parquet(tmp_path / "trials.parquet")
    old = build_configs(pd.DataFrame(rows), OBJ).drop(columns="few_runs")
    old["spread_borrowed"] = old["role"] == "search"
    old["attack_ssim_verdict"] = np.where(old["role"] == "search", noise.BETTER, "")
    (tmp_path / "configs.parquet").write_bytes(table_bytes(old, "configs"))
    rebuilt = table.load_configs(tmp_path)
    assert "spread_borrowed" not in rebuilt and (rebuilt["attack_ssim_verdict"] != noise.BETTER).all()
    assert "[+]" not in table.paper_table(rebuilt, "attack_ssim").to_string()
    (tmp_path / "trials.parquet").unlink()                   # nothing to rebuild from: shown without marks
    shown = table.load_configs(tmp_path)
    assert "[+]" not in table.paper_table(shown, "attack_ssim").to_string()
    assert "predate" in table.legend(shown, "attack_ssim")


def test_a_dollar_in_a_name_is_text_not_mathtext(tmp_path):
    """An experiment or surrogate named with `$` (matplotlib's mathtext marker) stopped the report with a
    parse error; it is drawn as text."""
    from cem_bench.analysis.report import build_report
    rows = _rows(0, range(3), 0.90, 0.75) + _rows(4, range(3), 0.90, 0.70)
    for r in rows[3:]:
        r["config.cem.surrogate"] = "$x^$"
    pd.DataFrame(rows).to_parquet(tmp_path / "trials.parquet")
    (tmp_path / "search_space.json").write_text(json.dumps({"name": "$x^$", "objectives": OBJ}))
    page = build_report(tmp_path, tmp_path / "out")
    assert "$x^$" in page.read_text()


def test_a_difference_below_float_precision_is_not_printed_as_zeros():
    """A spread of 1e-10 printed "0.75000000 ± 0.00000000" and "Δ -0.00000000": three significant digits
    instead, so the page shows how small the numbers are."""
    from cem_bench.analysis.report.formatting import round_to
    assert round_to(-2e-9, 1e-10, signed=True) == "-2e-09"
    assert round_to(0.75, 1e-10) == "0.75" and round_to(1e-10, 1e-10) == "1e-10"
    assert round_to(0.9054, 0.01851) == "0.905"


def test_a_baseline_whose_attacks_were_skipped_is_not_said_to_have_run_once():
    """Three baseline runs at chance accuracy, every attack skipped by the utility gate: the summary said "The
    λ=0 baseline ran once (attack_ssim — over 0 runs, test_acc … over 3 runs)" (2026-12-06 audit)."""
    rows = _rows(0, range(3), 0.10, 0.75) + _rows(16, range(3), 0.10, 0.70)
    for r in rows:
        if r["config.cem.lambd"] == 0:
            r["attack_ssim"], r["attack_skipped"] = float("nan"), "test accuracy within the margin of chance"
    text = summary_sentence(results_of(pd.DataFrame(rows), OBJ))
    assert "ran once" not in text and "has 3 runs but attack_ssim from none of them" in text, text
    assert "claims no difference" in text


def test_too_few_runs_is_said_per_metric(tmp_path):
    """λ 64's accuracy collapsed on 2 of its 4 seeds and the utility gate skipped their attacks: 4 accuracies
    (compared: worse beyond the noise, marked [−]) and 2 SSIMs (too few to compare). The page called the
    accuracy "too few runs for a verdict" beside its own p and mark until 2026-12-06 (few_runs is any metric)."""
    from cem_bench.analysis import table
    from cem_bench.analysis.report.tables import versus_baseline
    rows = _rows(0, range(4), 0.90, 0.75) + _rows(64, range(4), 0.20, 0.60)
    for r in rows[4:6]:
        r["test_acc"], r["attack_ssim"] = 0.1, np.nan
    configs = build_configs(pd.DataFrame(rows), OBJ)
    r = configs[configs["role"] == "search"].iloc[0]
    assert (bool(r["test_acc_few"]), bool(r["attack_ssim_few"]), bool(r["few_runs"])) == (False, True, True)
    assert versus_baseline(r, "test_acc").startswith("worse beyond the noise"), versus_baseline(r, "test_acc")
    assert versus_baseline(r, "attack_ssim").startswith("too few runs for a verdict")
    assert "[−]" in table.paper_table(configs, "test_acc").to_string()
    pd.DataFrame(rows).to_parquet(tmp_path / "trials.parquet")
    (tmp_path / "search_space.json").write_text(json.dumps({"name": "few", "objectives": OBJ}))
    summary = summary_sentence(load_results(tmp_path))
    assert "ran fewer than 3 times" in summary or "ran fewer times" in summary, summary
    # a table written before the per-metric columns: few_runs alone, read for every metric as before
    old = configs.drop(columns=["test_acc_few", "attack_ssim_few"])
    assert versus_baseline(old[old["role"] == "search"].iloc[0], "test_acc").startswith("too few runs")


def test_the_paper_table_never_rounds_a_marked_difference_away():
    """Six runs a side with SSIM spreads of 0.00006: the cells read "0.750 ± 0.000 (6)" and "0.750 ± 0.000 (6) [+]"
    until 2026-12-06 (p 0.0002). Where the std would print as 0, two significant digits of it; else the paper's."""
    from cem_bench.analysis import table
    rows = _rows(0, range(6), 0.90, 0.75) + _rows(16, range(6), 0.90, 0.7496)
    for r in rows:
        r["attack_ssim"] = (0.75 if r["config.cem.lambd"] == 0 else 0.7496) + 0.00003 * r["config.seed"]
    configs = build_configs(pd.DataFrame(rows), OBJ)
    text = table.paper_table(configs, "attack_ssim").to_string()
    assert "0.750075 ± 0.000056 (6)" in text and "0.749675 ± 0.000056 (6) [+]" in text, text
    assert "0.905 ± 0.004 (6)" in table.paper_table(configs, "test_acc").to_string()   # the paper's 3 decimals
    # a spread that prints (0.001) but means less than half a unit of the last decimal apart: the marked cell and
    # its baseline take the decimals that tell them apart (both read "0.750 ± 0.001 (40)", one marked)
    rng = np.random.default_rng(1)
    rows = []
    for lam, ssim in ((0, 0.7503), (16, 0.7498)):
        runs = ssim + 0.0006 * rng.standard_normal(40)
        rows += [{**r, "attack_ssim": float(runs[i]), "test_acc": 0.9 + 0.002 * rng.standard_normal()}
                 for i, r in enumerate(_rows(lam, range(40), 0.90, ssim))]
    configs = build_configs(pd.DataFrame(rows), OBJ)
    marked = configs[configs["attack_ssim_verdict"] == "better"]
    assert len(marked) == 1
    cells = table.paper_table(configs, "attack_ssim").iloc[0].tolist()
    means = [c.split(" ± ")[0] for c in cells]
    assert means[0] != means[1] and cells[1].endswith("[+]"), cells


@pytest.mark.parametrize("argv, says", [
    (["--tables", "0"], "argument --tables: '0' is not a whole number >= 1"),     # a ZeroDivisionError (2026-12-07)
    (["--configs", "12", "-1"], "argument --configs: '-1' is not a whole number >= 1"),
    (["--spread", "nan"], "argument --spread: 'nan' is not a finite number > 0"),
    (["--spread", "-1"], "argument --spread: '-1' is not a finite number > 0"),
    (["--seed", "-1"], "argument --seed: '-1': a seed is a whole number >= 0"),    # numpy's ValueError (2026-12-07)
    (["--configs", "1", "1"], "--configs 1 1: each design once"),                # FileExistsError on n1_0
])
def test_the_independent_check_refuses_what_it_cannot_run(argv, says, capsys, monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import independent_claims as ic
    monkeypatch.setattr(ic, "judge", lambda folder: pytest.fail("a report was built"))
    with pytest.raises(SystemExit) as e:
        ic.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_the_independent_checks_draws_stay_in_their_metrics_range(tmp_path):
    """Its accuracies are drawn around 0.90 and were not clipped: a draw above 1, which every reader refuses
    (schema.out_of_range), ended its default run (--configs 12 100 --seed 7) in a traceback after 41 reports
    (2026-12-07 probe). A wide spread draws many such values; none reaches the table."""
    import sys
    from pathlib import Path

    from cem_bench import schema
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import independent_claims as ic
    folder = ic.write_folder(tmp_path / "wide", np.random.default_rng(0), 100, spread=10.0)
    trials = pd.read_parquet(folder / "trials.parquet")
    assert (trials["test_acc"] == 1.0).any() and (trials["test_acc"] <= 1.0).all()   # drawn past 1, and clipped
    assert schema.out_of_range(trials) is None
