"""Hypotheses written into a space before its run: the parser's checks, the tests on the trials
(``analysis/hypotheses.py``) against Welch's and the paired t computed by hand, the family's correction, the
report's section, and ``--resume`` refusing a changed family."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student

from cem_bench.analysis.hypotheses import evaluate, read_hypotheses
from cem_bench.analysis.report import build_report
from cem_bench.errors import SpaceError
from cem_bench.spaces.parse import parse_space

SPACE = {
    "name": "hyp",
    "objectives": [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}],
    "sampler": {"name": "grid"},
    "replicates": 4,
    "fixed": {"data.dataset": "digits"},
    "params": {"cem.surrogate": {"choice": ["gmm", "attention_centroid"]},
               "cem.lambd": {"choice": [32], "when": {"cem.surrogate": ["gmm"]}}},
    "hypotheses": {"correction": "holm", "tests": [
        {"name": "H1", "metric": "test_acc", "a": {"cem.surrogate": "attention_centroid", "cem.lambd": 16},
         "b": {"cem.surrogate": "gmm"}, "a_is": "not_lower", "margin": 0.02},
        {"name": "H2", "metric": "attack_ssim", "a": {"cem.surrogate": "attention_centroid"},
         "b": {"cem.lambd": 0}, "a_is": "lower"}]},
}


def _space(**change) -> dict:
    doc = json.loads(json.dumps(SPACE))
    doc["hypotheses"]["tests"][0].update(change)
    return doc


def _errors(doc) -> str:
    with pytest.raises(SpaceError) as e:
        parse_space(doc)
    return str(e.value)


def test_a_space_s_hypotheses_are_parsed_with_each_side_naming_one_cell():
    spec = parse_space(json.loads(json.dumps(SPACE)))
    saved = spec.to_dict()["hypotheses"]
    assert saved["alpha"] == 0.05 and saved["correction"] == "holm"
    h1, h2 = saved["tests"]
    assert h1["a"] == {"cem.surrogate": "attention_centroid", "cem.lambd": 16.0} and h1["margin"] == 0.02
    assert h2["b"] == {"cem.lambd": 0.0} and h2["paired"] is False
    assert read_hypotheses(saved) == (saved, None)
    assert parse_space({k: v for k, v in SPACE.items() if k != "hypotheses"}).to_dict()["hypotheses"] is None


@pytest.mark.parametrize("change, words", [
    ({"margn": 0.02}, "hypotheses.tests[0].margn: unknown field (did you mean margin?)"),
    ({"metric": "attack_sim"}, "unknown metric 'attack_sim' (did you mean attack_ssim?)"),
    ({"a_is": "smaller"}, "hypotheses.tests[0].a_is: 'smaller'; allowed: lower, higher, not_lower, not_higher"),
    ({"margin": 0}, "not_lower needs a margin > 0"),
    ({"margin": -1}, "hypotheses.tests[0].margin: -1 must be a number >= 0"),
    # a difference of accuracies is below 1: margin 5 (points meant) made not_lower hold whatever the runs measured
    ({"margin": 5}, "hypotheses.tests[0].margin: 5 is not below the widest difference test_acc can show (1: its "
                    "values lie in [0, 1])"),
    ({"metric": "attack_ssim", "margin": 2}, "2 is not below the widest difference attack_ssim can show (2"),
    ({"paired": "yes"}, "hypotheses.tests[0].paired: 'yes' must be true or false"),
    ({"a": {"seed": 3}}, "hypotheses.tests[0].a.seed: a side is a configuration over all its seeds"),
    ({"a": {"cem.lamd": 3}}, "hypotheses.tests[0].a.cem.lamd: unknown config key 'cem.lamd' (did you mean cem.lambd?)"),
    ({"a": {"cem.surrogate": "slot_cross"}}, "hypotheses.tests[0].a: {cem.surrogate: 'slot_cross'} matches no cell"),
    ({"a": {"data.dataset": "digits"}}, "matches 3 cells"),
    ({"a": {"cem.surrogate": "gmm", "cem.lambd": 32}}, "hypotheses.tests[0]: a and b name the same configuration"),
    ({"a": {"cem.surrogate": "gmm", "cem.lambd": 0}}, "matches no cell"),   # λ = 0 runs hold no surrogate
    ({"name": "H2"}, "'H2' is used twice"),
    ({"a": {"cem.surrogate": "attention_centroid", "cem.warmup_epochs": None}}, "not an empty one"),
    # a key whose default each surrogate resolves: named only where the space fixes or searches it
    ({"a": {"cem.surrogate": "attention_centroid", "cem.warmup_epochs": 1}}, "default each surrogate sets, only where"),
])
def test_a_bad_hypothesis_is_refused_naming_its_field_and_what_is_allowed(change, words):
    assert words in _errors(_space(**change))


def test_hypotheses_need_a_grid_and_three_runs_a_side_and_every_problem_is_listed_at_once():
    doc = _space(metric="attack_sim")
    doc.update(sampler={"name": "tpe"}, num_samples=4, replicates=2)
    doc["params"]["cem.lambd"] = {"choice": [16, 32]}
    text = _errors(doc)
    assert "hypotheses: need sampler grid" in text
    assert "hypotheses: need at least 3 runs a side: give replicates: 3 or more" in text
    assert "unknown metric 'attack_sim'" in text
    assert "alpha" in _errors({**SPACE, "hypotheses": {**SPACE["hypotheses"], "alpha": 1.5}})
    many = {**SPACE, "hypotheses": {"tests": SPACE["hypotheses"]["tests"] * 51}}
    assert "hypotheses.tests: 102 hypotheses; at most 100 in one family" in _errors(many)


# ------------------------------------------------------------------------------------------------ the tests
def _trials(a_values, b_values, a_seeds=None, b_seeds=None) -> pd.DataFrame:
    rows = []
    for side, values, seeds in (("attention_centroid", a_values, a_seeds), ("gmm", b_values, b_seeds)):
        for k, v in enumerate(values):
            rows.append({"trial_id": f"{side}{k}", "status": "ok", "config_id": side, "config.cem.surrogate": side,
                         "config.cem.lambd": 16.0 if side != "gmm" else 32.0,
                         "config.seed": (seeds or range(100))[k], "test_acc": v, "attack_ssim": v})
    rows.append({"trial_id": "bad", "status": "error", "config_id": "gmm", "config.cem.surrogate": "gmm",
                 "config.cem.lambd": 32.0, "config.seed": 99, "test_acc": -5.0, "attack_ssim": -5.0})
    return pd.DataFrame(rows)


def _family(*tests, correction="holm", alpha=0.05) -> dict:
    return {"alpha": alpha, "correction": correction, "tests": [
        {"name": f"H{i + 1}", "metric": "test_acc", "a": {"cem.surrogate": "attention_centroid"},
         "b": {"cem.surrogate": "gmm", "cem.lambd": 32}, "margin": 0.0, "paired": False, **t}
        for i, t in enumerate(tests)]}


def _welch_by_hand(x, y, shift):
    """One-sided p that mean(x) - mean(y) + shift > 0, from the Welch statistic and its degrees of freedom."""
    vx, vy = np.var(x, ddof=1) / len(x), np.var(y, ddof=1) / len(y)
    dof = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    return student.sf((np.mean(x) - np.mean(y) + shift) / np.sqrt(vx + vy), dof), dof


def test_each_claim_is_the_one_sided_welch_test_of_the_shifted_difference():
    rng = np.random.default_rng(3)
    a, b = 0.90 + 0.03 * rng.standard_normal(12), 0.905 + 0.03 * rng.standard_normal(9)
    table = evaluate(_trials(a, b), _family({"a_is": "not_lower", "margin": 0.02}, {"a_is": "lower"},
                                            {"a_is": "higher", "margin": 0.01}, {"a_is": "not_higher", "margin": 0.02},
                                            correction="bonferroni"))
    p_nl, dof = _welch_by_hand(a, b, 0.02)            # d > -0.02
    p_lo = 1 - _welch_by_hand(a, b, 0.0)[0]           # d < 0
    p_hi = _welch_by_hand(a, b, -0.01)[0]             # d > 0.01
    p_nh = 1 - _welch_by_hand(a, b, -0.02)[0]         # d < 0.02
    np.testing.assert_allclose(table["p"], [p_nl, p_lo, p_hi, p_nh], rtol=1e-9)
    np.testing.assert_allclose(table["p_adjusted"], np.minimum(1, 4 * table["p"]), rtol=1e-12)
    assert (table["n_a"] == 12).all() and (table["n_b"] == 9).all()   # the errored run is no run
    half = student.ppf(0.975, dof) * np.sqrt(np.var(a, ddof=1) / 12 + np.var(b, ddof=1) / 9)
    d = a.mean() - b.mean()
    np.testing.assert_allclose(table[["diff", "ci_low", "ci_high"]].iloc[0], [d, d - half, d + half], rtol=1e-9)
    assert table["verdict"].tolist() == ["holds" if q <= 0.05 else "not shown" for q in table["p_adjusted"]]


def test_an_equivalence_the_runs_resolve_holds_and_one_they_do_not_is_not_shown():
    rng = np.random.default_rng(0)
    b = 0.90 + 0.01 * rng.standard_normal(40)
    close, far = b.mean() - 0.002 + 0.01 * rng.standard_normal(40), b.mean() - 0.03 + 0.01 * rng.standard_normal(40)
    claim = {"a_is": "not_lower", "margin": 0.02}
    assert evaluate(_trials(close, b), _family(claim))["verdict"].tolist() == ["holds"]
    assert evaluate(_trials(far, b), _family(claim))["verdict"].tolist() == ["not shown"]


def test_paired_pairs_the_seeds_both_sides_ran_once():
    rng = np.random.default_rng(1)
    seed_effect = rng.standard_normal(12)                      # what a seed does to both sides alike
    a_seeds, b_seeds = list(range(10)), list(range(2, 12))     # seeds 2..9 are shared
    a = 0.904 + 0.05 * seed_effect[a_seeds] + 0.002 * rng.standard_normal(10)
    b = 0.9 + 0.05 * seed_effect[b_seeds] + 0.002 * rng.standard_normal(10)
    paired = evaluate(_trials(a, b, a_seeds, b_seeds), _family({"a_is": "higher", "paired": True}))
    x, y = a[2:10], b[0:8]
    d = x - y
    p = student.sf(d.mean() / (d.std(ddof=1) / np.sqrt(len(d))), len(d) - 1)
    assert paired["n_a"].iloc[0] == 8 and paired["n_b"].iloc[0] == 8
    np.testing.assert_allclose(paired["p"].iloc[0], p, rtol=1e-9)
    welch = evaluate(_trials(a, b, a_seeds, b_seeds), _family({"a_is": "higher"}))
    # the seeds' spread; a's seeds 0, 1 and b's 10, 11 have no partner, and the verdict says so
    assert paired["unpaired"].iloc[0] == 4 and welch["unpaired"].iloc[0] == 0
    assert paired["verdict"].iloc[0] == "holds (4 runs without a partner seed left out)"
    assert welch["verdict"].iloc[0] == "not shown"


def test_runs_that_do_not_vary_are_not_tested():
    """A t-test divides by the spread: runs equal to float rounding (a tiny search at chance accuracy, 0.1 on every
    run, once "held" with p 5e-35), or paired seeds whose differences are one constant (1e-12 here), are not tested
    and count in the family with p = 1; one side with a spread is still Welch's test."""
    flat = np.full(3, 0.1)
    table = evaluate(_trials(flat, flat + 0.1), _family({"a_is": "lower"}, {"a_is": "not_lower", "margin": 1.0},
                                                       {"a_is": "lower", "paired": True}))
    assert table["verdict"].tolist() == ["not tested: the runs do not vary"] * 3
    assert np.isnan(table["p"]).all() and (table["p_adjusted"] == 1.0).all()
    np.testing.assert_allclose(table["diff"], -0.1)                       # the means are still shown
    assert (table[["std_a", "std_b"]] == 0.0).all().all()                # and no spread, not float rounding
    b = np.array([0.31, 0.35, 0.29])
    table = evaluate(_trials(b - 1e-12, b), _family({"a_is": "lower", "paired": True}, {"a_is": "lower"}))
    assert table["verdict"].tolist() == ["not tested: the runs do not vary", "not shown"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                       # and no scipy warning of rounding
        table = evaluate(_trials(flat, b), _family({"a_is": "lower"}))       # one side varies: Welch's test
    assert table["verdict"].tolist() == ["holds"] and table["p"].iloc[0] < 0.05


def test_a_hypothesis_without_enough_runs_still_counts_in_the_family():
    rng = np.random.default_rng(2)
    b = 0.9 + 0.01 * rng.standard_normal(8)
    family = _family({"a_is": "lower"}, {"a_is": "lower", "b": {"cem.surrogate": "gmm", "cem.lambd": 64}})
    table = evaluate(_trials(b - 0.02, b), family)
    assert table["verdict"].iloc[1] == "not tested: 0 runs on one side (needs 3)"
    family["tests"][1]["metric"] = "attack_ssim__rmle"
    assert evaluate(_trials(b - 0.02, b), family)["verdict"].iloc[1] == "not tested: the trials record no attack_ssim__rmle"
    assert np.isnan(table["p"].iloc[1]) and table["p_adjusted"].iloc[1] == 1.0
    # Holm over 2 with the untested member at p = 1: the tested one's p is doubled, not kept
    np.testing.assert_allclose(table["p_adjusted"].iloc[0], min(1.0, 2 * table["p"].iloc[0]))


def test_each_seed_is_one_run_and_only_the_planned_runs_count():
    """A λ = 0 cell per surrogate (one configuration, each seed run twice), a confirmation's runs and an ok run
    without the metric: the λ = 0 side has one value per seed, the confirmation is left out, the gap is said."""
    rng = np.random.default_rng(6)
    rows = []
    for seed in range(5):
        base = 0.76 + 0.01 * rng.standard_normal()
        for _twin in ("gmm", "attention_centroid"):    # two grid cells that are the same λ = 0 configuration
            rows.append({"status": "ok", "role": "search", "config_id": "zero", "config.cem.surrogate": "none",
                         "config.cem.lambd": 0.0, "config.seed": seed, "attack_ssim": base})
        rows.append({"status": "ok", "role": "search", "config_id": "gmm", "config.cem.surrogate": "gmm",
                     "config.cem.lambd": 16.0, "config.seed": seed,
                     "attack_ssim": np.nan if seed == 4 else base - 0.05 + 0.002 * rng.standard_normal()})
    for seed in (5, 6, 7):   # the confirmation re-ran gmm: not part of the plan
        rows.append({"status": "ok", "role": "confirm", "config_id": "gmm", "config.cem.surrogate": "gmm",
                     "config.cem.lambd": 16.0, "config.seed": seed, "attack_ssim": 5.0})
    family = {"alpha": 0.05, "correction": "holm", "tests": [
        {"name": "H1", "metric": "attack_ssim", "a": {"cem.surrogate": "gmm"}, "b": {"cem.lambd": 0},
         "a_is": "lower", "margin": 0.0, "paired": paired} for paired in (False, True)]}
    family["tests"][1]["name"] = "H2"
    table = evaluate(pd.DataFrame(rows), family)
    assert table["n_a"].tolist() == [4, 4] and table["n_b"].tolist() == [5, 4]
    assert table["mean_a"].iloc[0] < 0.8 and (table["left_out"] == 1).all()
    # paired, λ = 0's seed 4 has no partner: gmm's seed 4 has no value
    assert table["verdict"].tolist() == ["holds (1 ok run without attack_ssim left out)",
                                         "holds (1 run without a partner seed left out) (1 ok run without "
                                         "attack_ssim left out)"]


@pytest.mark.parametrize("saved, words", [
    ([1], "not a mapping"),
    ({"alpha": 0.05, "correction": "none", "tests": []}, "correction 'none'"),
    ({"alpha": 0.05, "correction": "holm", "tests": [{"name": "H1"}]}, "tests[0] lacks"),
    ({"alpha": 0.05, "correction": "holm", "tests": [{"name": "H1", "metric": "test_acc", "a_is": "lower",
                                                      "a": {"cem.lambd": [1, 2]}, "b": {"cem.lambd": 0}}]},
     "config keys with one value each"),
    ({"alpha": 0.05, "correction": "holm", "tests": [{}] * 101}, "tests is not a list of 1 to 100"),
])
def test_a_damaged_saved_family_is_named_not_tested(saved, words):
    hyp, problem = read_hypotheses(saved)
    assert hyp is None and words in problem


# ------------------------------------------------------------------------------------------------ the report
def _folder(root: Path, hypotheses) -> Path:
    rng = np.random.default_rng(4)
    rows = []
    for surrogate, lambd, acc, ssim in (("none", 0.0, 0.95, 0.76), ("gmm", 32.0, 0.92, 0.66),
                                        ("attention_centroid", 16.0, 0.915, 0.59)):
        for seed in range(6):
            rows.append({"experiment": "hyp", "trial_id": f"t{len(rows)}", "status": "ok",
                         "role": "baseline" if lambd == 0 else "search", "config.seed": seed,
                         "config.cem.surrogate": surrogate, "config.cem.lambd": lambd,
                         "config.defense.noise_std": 0.05, "test_acc": acc + 0.01 * rng.standard_normal(),
                         "attack_ssim": ssim + 0.01 * rng.standard_normal(), "wall_s": 1.0})
    from cem_bench.integrity import write_recorded_json, write_table
    root.mkdir(parents=True)
    # written as a search writes them, with their checksums (a folder without them is read unverified)
    write_table(str(root), "trials.parquet", pd.DataFrame(rows), "trials")
    spec = parse_space(json.loads(json.dumps(SPACE))).to_dict()
    spec["hypotheses"] = hypotheses(spec["hypotheses"])
    write_recorded_json(str(root), "search_space.json", spec)
    return root


def test_the_report_leads_with_the_space_s_hypotheses(tmp_path, capsys):
    from cem_bench.cli import main
    assert main(["report", str(_folder(tmp_path / "r", lambda h: h))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("hypothesis H1: test_acc, a not lower than b by more than 0.02; a - b = ")
    assert lines[1].endswith(": holds") and lines[2].startswith("hypothesis H2: attack_ssim, a lower than b; ")
    assert "(two-sided 95 %: " in lines[1]     # not to be read as the one-sided test's bound
    index = tmp_path / "r" / "report" / "index.html"
    html = index.read_text()
    assert 'id="hypotheses"' in html
    assert "The space wrote down 2 hypotheses before the run (Holm over 2 at α 0.05)" in html
    tested = pd.read_csv(index.parent / "hypotheses.csv")
    assert tested["name"].tolist() == ["H1", "H2"] and (tested["n_a"] == 6).all()
    assert '<a href="hypotheses.csv">hypotheses.csv</a>' in html    # the file the page cites is in its list
    # H1: 0.915 vs 0.92 within 0.02 at spread 0.01 over 6 runs; H2: SSIM 0.59 vs the baseline's 0.76
    assert tested["verdict"].tolist() == ["holds", "holds"]



def test_without_a_baseline_the_summary_does_not_deny_what_a_hypothesis_found(tmp_path):
    folder = _folder(tmp_path / "r", lambda h: {**h, "tests": h["tests"][:1]})
    trials = pd.read_parquet(folder / "trials.parquet")
    from cem_bench.integrity import write_table
    write_table(str(folder), "trials.parquet", trials[trials["config.cem.lambd"] > 0], "trials")   # no λ = 0 runs
    html = build_report(folder).read_text()
    # no "what follows is the report's own comparison with the λ=0 baseline" where there is none
    assert "H1: holds. No λ=0 baseline ran, so there is no noise floor and no reference " \
           "accuracy: beyond the space&#39;s hypotheses, this report claims no difference between configurations." \
           in html


def test_a_report_of_a_damaged_family_says_so_and_tests_nothing(tmp_path, capsys):
    from cem_bench.cli import main
    folder = _folder(tmp_path / "r", lambda h: h)
    assert main(["report", str(folder)]) == 0 and "hypothesis H1" in capsys.readouterr().out
    spec = json.loads((folder / "search_space.json").read_text())
    spec["hypotheses"]["correction"] = "none"     # damaged (its checksum recorded, as a bug of a writer would)
    from cem_bench.integrity import write_recorded_json
    write_recorded_json(str(folder), "search_space.json", spec)
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "hypotheses: the saved space's hypotheses cannot be tested (correction 'none'" in out
    assert "hypothesis H1" not in out               # the first report's verdicts are not printed again
    html = (folder / "report" / "index.html").read_text()
    assert 'id="hypotheses"' not in html and "cannot be tested (correction &#39;none&#39;" in html
    assert pd.read_csv(folder / "report" / "hypotheses.csv").empty


def test_resume_refuses_a_changed_family():
    from cem_bench.search.run import space_changes
    saved = json.loads(json.dumps(parse_space(json.loads(json.dumps(SPACE))).to_dict()))
    assert space_changes(parse_space(json.loads(json.dumps(SPACE))), saved) == ([], [])
    refused, _ = space_changes(parse_space(_space(margin=0.05)), saved)
    assert refused == ["hypotheses"]


def test_the_summary_lists_a_few_verdicts_and_counts_many():
    from cem_bench.analysis.hypotheses import summary_text
    rng = np.random.default_rng(5)
    b = 0.9 + 0.01 * rng.standard_normal(8)
    few = _family({"a_is": "lower"}, {"a_is": "higher"})
    text = summary_text(evaluate(_trials(b - 0.05, b), few), few)
    assert text == "The space wrote down 2 hypotheses before the run (Holm over 2 at α 0.05). H1: holds; H2: not shown."
    many = _family(*[{"a_is": "lower"}] * 3, *[{"a_is": "higher"}] * 3, correction="bonferroni")
    text = summary_text(evaluate(_trials(b - 0.05, b), many), many)
    assert text.endswith("(Bonferroni over 6 at α 0.05). 3 of 6 hold: H1, H2, H3 (the table below has each).")


def test_the_search_s_first_line_names_the_family():
    from cem_bench.search import run
    line = run.banner(parse_space(json.loads(json.dumps(SPACE))), None)
    assert line.endswith("objectives test_acc (max), attack_ssim (min), hypotheses H1, H2 (holm at 0.05; the report "
                         "tests them)")



def test_a_seed_run_twice_is_the_same_run_in_the_hypotheses_and_the_configurations_table():
    """The baseline's seeds 0–2 and a λ = 0 grid cell at seed 0 with another value: one configuration, seed 0
    twice. The configurations table keeps the first; the hypotheses took the mean until 2026-12-06 and printed
    another λ = 0 mean (0.727 against 0.710) on the same page."""
    from cem_bench.analysis.aggregate import build_configs, config_ids
    rows = []

    def add(role, lam, seed, v):
        rows.append({"trial_id": f"t{len(rows)}", "status": "ok", "role": role, "config.seed": seed,
                     "config.defense.noise_std": 0.1, "config.cem.lambd": lam, "config.cem.surrogate": "gmm",
                     "test_acc": 0.9, "attack_ssim": v})
    for s, v in zip([0, 1, 2], [0.70, 0.72, 0.71]):
        add("baseline", 0.0, s, v)
    add("search", 0.0, 0, 0.80)
    for s, v in zip([0, 1, 2], [0.60, 0.62, 0.61]):
        add("search", 1.0, s, v)
    trials = pd.DataFrame(rows)
    configs = build_configs(trials, [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}])
    base = configs[configs["role"] == "baseline"].iloc[0]
    trials["config_id"] = config_ids(trials)
    tested = evaluate(trials, {"alpha": 0.05, "correction": "holm", "tests": [
        {"name": "h", "metric": "attack_ssim", "a": {"cem.lambd": 1}, "b": {"cem.lambd": 0}, "a_is": "lower",
         "margin": 0.0, "paired": False}]}).iloc[0]
    assert tested["n_b"] == base["attack_ssim_n"] == 3
    assert tested["mean_b"] == pytest.approx(base["attack_ssim_mean"]) == pytest.approx(0.71)
    assert tested["std_b"] == pytest.approx(base["attack_ssim_std"])


def test_a_paired_test_says_how_many_runs_had_no_partner_seed():
    """a ran seeds 0–5, b seeds 0, 1, 2, 7, 8: the paired test uses seeds 0–2 and says that 5 of the 11 runs
    had no partner, 3 of a's and 2 of b's (before 2026-12-06 pm it said nothing, and n_a = 3 read as a's whole configuration)."""
    rows = [{"status": "ok", "role": "search", "config.cem.surrogate": sur, "config.cem.lambd": 16.0,
             "config.seed": seed, "attack_ssim": v}
            for sur, runs in (("attention_centroid", {0: 0.70, 1: 0.71, 2: 0.69, 3: 0.7, 4: 0.7, 5: 0.7}),
                              ("gmm", {0: 0.76, 1: 0.755, 2: 0.75, 7: 0.7, 8: 0.7}))
            for seed, v in runs.items()]
    family = {"alpha": 0.05, "correction": "holm", "tests": [
        {"name": "P", "metric": "attack_ssim", "a": {"cem.surrogate": "attention_centroid"},
         "b": {"cem.surrogate": "gmm"}, "a_is": "lower", "margin": 0.0, "paired": paired} for paired in (True, False)]}
    family["tests"][1]["name"] = "W"
    table = evaluate(pd.DataFrame(rows), family).set_index("name")
    assert (table.loc["P", "n_a"], table.loc["P", "n_b"], table.loc["P", "unpaired"]) == (3, 3, 5)
    assert table.loc["P", "verdict"] == "holds (5 runs without a partner seed left out)"
    assert (table.loc["W", "n_a"], table.loc["W", "n_b"], table.loc["W", "unpaired"]) == (6, 5, 0)
    assert table.loc["W", "verdict"] == "holds"


def test_a_seed_run_twice_is_its_first_run_even_where_that_run_has_no_value():
    """The configurations table keeps a seed's first run (and its missing value); the hypotheses dropped the
    missing value first and took the later copy's: two tables, two different runs of one seed."""
    from cem_bench.analysis.hypotheses import per_seed
    rows = pd.DataFrame({"config.seed": [0, 0, 1, 2, 3], "attack_ssim": [np.nan, 0.99, 0.71, 0.72, 0.73]})
    frame, left_out = per_seed(rows, "attack_ssim")
    assert sorted(frame["_v"]) == [0.71, 0.72, 0.73] and left_out == 1


def test_hypotheses_of_a_folder_without_its_checksums_are_not_said_to_predate_the_run(tmp_path):
    """An edited search_space.json is refused while cem_bench_files.json lists it; the refusal says to delete that
    file to read the folder unverified, and then the edited family was tested and the page said "The space wrote
    down 3 hypotheses before the run". Without the checksums it says they are unverified."""
    import shutil

    from cem_bench.analysis.report import load_results, summary_sentence
    root = Path(__file__).resolve().parent.parent / "findings" / "decoder_digits"
    if not root.is_dir():
        pytest.skip("findings/decoder_digits is not shipped")
    copy = tmp_path / "decoder_digits"
    shutil.copytree(root, copy)
    from cem_bench.analysis.hypotheses import evaluate as tested_by

    def text_of(folder):
        res = load_results(folder)
        return summary_sentence(res, tested_by(res.trials, res.hypotheses))

    assert "wrote down 3 hypotheses before the run" in text_of(copy)
    (copy / "cem_bench_files.json").unlink()
    text = text_of(copy)
    assert "holds 3 hypotheses (Holm over 3 at α 0.05), unverified: this folder has no cem_bench_files.json" in text
    assert "wrote down 3 hypotheses before the run" not in text
    index = build_report(copy)
    assert "The hypotheses search_space.json holds (unverified)" in index.read_text(encoding="utf-8")
