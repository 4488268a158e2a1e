"""findings/: the shipped result tables of the runs the docs cite, read as a user would (`cem-bench table`, the
report's loader, the hypotheses' tests), and what the docs say of each checked against them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cem_bench.analysis.hypotheses import evaluate
from cem_bench.analysis.report import load_results

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "findings"
FOLDERS = sorted(p.name for p in FINDINGS.iterdir() if p.is_dir() and p.name != "report")
FILES = {"trials.parquet", "epochs.parquet", "configs.parquet", "search_space.json", "cem_bench_files.json"}


def doc_says(path: str, *quotes: str) -> None:
    """Each quote stands in the doc ``path`` (whitespace as wrapped there does not matter): the numbers a test
    computes from a folder are the numbers the doc prints, so a doc edited alone fails here."""
    text = " ".join((ROOT / path).read_text().split())
    missing = [q for q in quotes if " ".join(q.split()) not in text]
    assert not missing, f"{path} no longer says: {missing}"


def hypothesis_line(name: str, r) -> str:
    """A tested hypothesis as the report prints its numbers (and the docs quote them)."""
    return (f"{name}: … a - b = {r['diff']:.4g} (two-sided 95 %: {r['ci_low']:.4g} to {r['ci_high']:.4g}), "
            f"adjusted p {r['p_adjusted']:.2g}: {r['verdict']}")


def test_every_folder_is_complete_listed_and_reads_as_a_search(capsys):
    from cem_bench import cli
    listed = re.findall(r"^\| `([\w-]+)` \|", (FINDINGS / "README.md").read_text(), re.M)
    assert FOLDERS and sorted(listed) == FOLDERS, (listed, FOLDERS)
    for name in FOLDERS:
        assert {p.name for p in (FINDINGS / name).iterdir() if p.is_file()} == FILES, name
        assert cli.main(["table", str(FINDINGS / name), "--metrics", "test_acc", "attack_ssim"]) == 0
        out = capsys.readouterr().out
        assert "**attack_ssim**" in out and "| σ=" in out, out[:500]


def test_the_readme_counts_the_folders():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"the result tables of {len(FOLDERS)} runs are in [findings/]" in text, len(FOLDERS)


def test_every_folder_is_the_run_its_row_names():
    """findings/README.md's row names the commit each run's trials recorded (the first `commit X` in the row) and
    its date: a folder replaced by another run without its row changed fails here."""
    import pandas as pd
    rows = dict(re.findall(r"^\| `([\w-]+)` \|(.*)$", (FINDINGS / "README.md").read_text(), re.M))
    for name in FOLDERS:
        commit = re.search(r"commit ([0-9a-f]{7,})", rows[name]).group(1)
        day = re.search(r"(\d{4}-\d{2}-\d{2}) \d{2}:\d{2}", rows[name]).group(1)
        t = pd.read_parquet(FINDINGS / name / "trials.parquet",
                            columns=["git_sha", "started_at", "finished_at", "status"])
        done = t[t["status"] == "ok"]   # a trial a signal interrupted (a pilot stopped early) recorded nothing
        assert set(done["git_sha"].str[:len(commit)]) == {commit}, (name, set(t["git_sha"]))
        # the row's window holds the trials (the driver starts before the first and writes after the last: up
        # to 3 minutes); a row once said 08:03–08:13 of trials run 08:02:17–08:11:43. A window whose end is
        # before its start ran past midnight (23:57–00:25), into the next day
        first, last = re.search(r"\d{4}-\d{2}-\d{2} (\d{2}:\d{2})[–-](\d{2}:\d{2}) UTC", rows[name]).groups()
        t0 = pd.Timestamp(f"{day} {first}", tz="UTC")
        t1 = pd.Timestamp(f"{day} {last}", tz="UTC") + pd.Timedelta(days=int(last < first))
        start = pd.to_datetime(t["started_at"], utc=True).min()
        end = pd.to_datetime(t["finished_at"], utc=True).max()
        assert start.strftime("%Y-%m-%d") == day, (name, start)
        assert t0 <= start.floor("min") and end.floor("min") <= t1, (name, first, last, start, end)
        assert t1 - end < pd.Timedelta(minutes=3), (name, last, end)


def lambda_sigma_cells(t) -> dict:
    """Each (λ, σ) cell's accuracy mean and std, worst-case SSIM mean and std, rmle's SSIM and the feature spread,
    rounded as the docs' tables print them."""
    return {(lam, sig): (round(g["test_acc"].mean(), 3), round(g["test_acc"].std(), 3),
                         round(g["attack_ssim"].mean(), 3), round(g["attack_ssim"].std(), 3),
                         round(g["attack_ssim__rmle"].mean(), 3), round(g["feature_spread"].mean(), 4))
            for (lam, sig), g in t.groupby(["config.cem.lambd", "config.defense.noise_std"])}


def paired_cells(t, metric: str, a: tuple, b: tuple) -> tuple[float, float, float]:
    """a − b of ``metric`` between two (λ, σ) cells, paired by seed: its mean and 95 % t interval."""
    from scipy import stats
    p = t.pivot_table(index="config.seed", columns=["config.cem.lambd", "config.defense.noise_std"], values=metric)
    d = p[a] - p[b]
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=d.sem())
    return d.mean(), lo, hi


def paired_by_seed(trials, metric: str, a: str, b: str = "none", lambd_a=None, lambd_b=None):
    """a − b of ``metric`` paired by seed (surrogates a and b; "none" is λ = 0) with its 95 % t interval, rounded."""
    from scipy import stats
    t = trials[trials["status"] == "ok"]

    def side(sur, lam):
        s = t[t["config.cem.surrogate"] == sur]
        s = s if lam is None else s[s["config.cem.lambd"] == lam]
        return s.set_index("config.seed")[metric]
    d = (side(a, lambd_a) - side(b, lambd_b)).dropna()
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    return round(d.mean(), 3), round(lo, 3), round(hi, 3)


def surrogate_cells(trials) -> dict:
    """{surrogate: [test_acc mean, std, worst-case SSIM mean, std, rmle's SSIM mean, std]}, rounded as printed."""
    return {s: [round(g[m].agg(f), 3) for m in ("test_acc", "attack_ssim", "attack_ssim__rmle") for f in ("mean", "std")]
            for s, g in trials.groupby("config.cem.surrogate")}


def cells(res) -> dict:
    """{(λ, surrogate): (n, test_acc mean, worst-case SSIM mean, its std)} of the ok trials."""
    t = res.trials[res.trials["status"] == "ok"]
    out = {}
    for (lam, sur), g in t.groupby(["config.cem.lambd", "config.cem.surrogate"], dropna=False):
        out[(float(lam), str(sur))] = (len(g), round(g["test_acc"].mean(), 3), round(g["attack_ssim"].mean(), 3),
                                       round(g["attack_ssim"].std(), 3))
    return out


@pytest.mark.skipif("decoder_digits" not in FOLDERS, reason="not shipped")
def test_decoder_digits_says_what_the_docs_say():
    """docs/estimators.md "On `digits`, against a decoder trained 96 epochs" and README's first row: E1–E3 hold
    (Holm over 3: adjusted p 4e−5, 7e−8, 3e−7), gmm −0.012 (−0.015 to −0.008), attention_centroid −0.043 and
    0.031 beyond gmm; the cells' means and spreads as printed."""
    res = load_results(FINDINGS / "decoder_digits")
    assert len(res.trials) == 24 and (res.trials["status"] == "ok").all()
    assert cells(res) == {(0.0, "none"): (8, 0.939, 0.959, 0.001), (16.0, "gmm"): (8, 0.933, 0.947, 0.004),
                          (16.0, "attention_centroid"): (8, 0.877, 0.917, 0.005)}
    tested = evaluate(res.trials, res.hypotheses).set_index("name")
    assert list(tested.index) == ["E1", "E2", "E3"] and (tested["verdict"] == "holds").all(), tested
    assert tested["diff"].round(3).tolist() == [-0.012, -0.043, -0.031]
    assert (tested.loc["E1", "ci_low"].round(3), tested.loc["E1", "ci_high"].round(3)) == (-0.015, -0.008)
    assert [f"{p:.0e}" for p in tested["p_adjusted"]] == ["4e-05", "7e-08", "3e-07"]
    # what estimators.md reads beside E1-E3 (not tests): accuracy, rmle, the drops' share and ratio, the report's
    # own Welch comparison of accuracy, the matched scale, the attack that set the worst case
    t = res.trials
    assert (t["attack_ssim_by"] == "decoder").all()
    assert {s: (round(g["test_acc"].std(), 3), round(g["attack_ssim__rmle"].mean(), 3),
                round(g["attack_ssim__rmle"].std(), 3)) for s, g in t.groupby("config.cem.surrogate")} == \
        {"none": (0.037, 0.576, 0.050), "gmm": (0.028, 0.384, 0.079), "attention_centroid": (0.069, 0.120, 0.052)}
    assert paired_by_seed(t, "test_acc", "gmm") == (-0.006, -0.025, 0.014)
    assert paired_by_seed(t, "test_acc", "attention_centroid") == (-0.061, -0.129, 0.006)
    assert paired_by_seed(t, "attack_ssim", "attention_centroid") == (-0.043, -0.047, -0.039)
    assert paired_by_seed(t, "attack_ssim", "attention_centroid", "gmm") == (-0.031, -0.035, -0.027)
    assert paired_by_seed(t, "attack_ssim__rmle", "gmm")[0] == -0.192
    assert paired_by_seed(t, "attack_ssim__rmle", "attention_centroid")[0] == -0.457
    drops = -tested["diff"].to_numpy()[:2] / t.loc[t["config.cem.surrogate"] == "none", "attack_ssim"].mean()
    assert [f"{100 * x:.1f}" for x in drops] == ["1.2", "4.5"] and f"{drops[1] / drops[0]:.1f}" == "3.6"
    c = res.configs.set_index("config.cem.surrogate")
    assert [round(c.loc["attention_centroid", k], 3) for k in ("test_acc_p", "test_acc_q", "test_acc_dof",
                                                                "test_acc_delta_lo", "test_acc_delta_hi")] == \
        [0.062, 0.124, 7.0, -0.127, 0.004]
    doc_says("docs/estimators.md", "p 0.062 on Hsu's 7 degrees of freedom, q 0.124; interval", "−0.127 to +0.004")
    ac = t.loc[t["config.cem.surrogate"] == "attention_centroid", "cem_loss_scale"]
    assert (round(ac.min(), 4), round(ac.max(), 4)) == (0.0083, 0.0089)


@pytest.mark.skipif("demo" not in FOLDERS, reason="not shipped")
def test_the_demo_says_what_the_readme_says():
    """README "The summary sentence" and docs/protocol.md §10, S = 0 at 1 thread: gmm at λ 16 confirmed with 4 new
    seeds, more private than the baseline beyond its noise (Δ −0.048, −0.071 to −0.025; Holm over the 1 confirmed
    configuration, p 0.0031), its accuracy cost not resolved (Δ −0.022, −0.065 to +0.021)."""
    res = load_results(FINDINGS / "demo")
    assert len(res.trials) == 12 and (res.trials["status"] == "ok").all()
    confirmed = res.configs[res.configs["role"] == "confirmed"]
    assert len(confirmed) == 1
    r = confirmed.iloc[0]
    assert (r["config.cem.surrogate"], r["config.cem.lambd"]) == ("gmm", 16.0)
    assert (round(r["attack_ssim_mean"], 3), round(r["attack_ssim_std"], 3)) == (0.703, 0.015)
    assert [round(r[f"attack_ssim_{k}"], 3) for k in ("delta", "delta_lo", "delta_hi")] == [-0.048, -0.071, -0.025]
    assert r["attack_ssim_verdict"] == "better" and f"{r['attack_ssim_holm']:.2g}" == "0.0031"
    assert [round(r[f"test_acc_{k}"], 3) for k in ("delta", "delta_lo", "delta_hi")] == [-0.022, -0.065, 0.021]
    assert r["test_acc_verdict"] == "within noise"
    base = res.configs[res.configs["role"] == "baseline"].iloc[0]
    assert [round(base[k], 3) for k in ("test_acc_mean", "test_acc_std", "attack_ssim_mean", "attack_ssim_std")] \
        == [0.963, 0.010, 0.750, 0.010]


@pytest.mark.skipif("decoder_surrogates_digits" not in FOLDERS, reason="not shipped")
def test_decoder_surrogates_digits_says_what_the_docs_say():
    """docs/estimators.md "All five at one matched strength" and README's second row (converged decoder): F1–F9
    hold (paired one-sided, Holm over 9); the cells' means and spreads as printed."""
    res = load_results(FINDINGS / "decoder_surrogates_digits")
    assert len(res.trials) == 48 and (res.trials["status"] == "ok").all()
    assert cells(res) == {(0.0, "none"): (8, 0.947, 0.961, 0.001), (16.0, "gmm"): (8, 0.941, 0.949, 0.004),
                          (16.0, "gated_attention"): (8, 0.911, 0.945, 0.002),
                          (16.0, "slot_cross"): (8, 0.919, 0.945, 0.004),
                          (16.0, "attention_centroid"): (8, 0.914, 0.915, 0.009),
                          (16.0, "serial_enhanced"): (8, 0.867, 0.929, 0.008)}
    tested = evaluate(res.trials, res.hypotheses).set_index("name")
    assert list(tested.index) == [f"F{i}" for i in range(1, 10)] and (tested["verdict"] == "holds").all(), tested
    assert tested["diff"].round(3).tolist() == [-0.012, -0.016, -0.017, -0.046, -0.032, -0.003, -0.004, -0.034,
                                                -0.019]
    assert [f"{p:.0e}" for p in tested["p_adjusted"]] == ["7e-05", "3e-06", "3e-05", "9e-06", "2e-05", "1e-02",
                                                          "2e-02", "1e-05", "8e-05"]
    # beside F1-F9 (not tests): accuracy against λ = 0 and gmm, paired; the report's Welch comparison over its 5
    # (Benjamini-Hochberg's q); the drops' share of λ = 0's SSIM; the decoder set every worst case
    t = res.trials
    assert (t["attack_ssim_by"] == "decoder").all()
    assert paired_by_seed(t, "test_acc", "serial_enhanced") == (-0.080, -0.121, -0.039)
    assert paired_by_seed(t, "test_acc", "serial_enhanced", "gmm") == (-0.074, -0.115, -0.033)
    assert paired_by_seed(t, "test_acc", "attention_centroid") == (-0.034, -0.055, -0.012)
    assert paired_by_seed(t, "test_acc", "slot_cross") == (-0.028, -0.040, -0.017)
    c = res.configs.set_index("config.cem.surrogate").drop("none")
    assert [round(c.loc["serial_enhanced", k], 3) for k in ("test_acc_delta", "test_acc_delta_lo", "test_acc_delta_hi",
                                                            "test_acc_q")] == [-0.080, -0.129, -0.030, 0.033]
    others = c.drop("serial_enhanced")["test_acc_q"]
    assert (round(others.min(), 2), round(others.max(), 2)) == (0.19, 0.73)
    doc_says("docs/estimators.md", "(−0.080, −0.129 to −0.030, q 0.033)", "(q 0.19–0.73)")
    base = t.loc[t["config.cem.surrogate"] == "none", "attack_ssim"].mean()
    drops = -tested["diff"].to_numpy()[:5] / base
    assert (f"{100 * drops.min():.1f}", f"{100 * drops.max():.1f}") == ("1.3", "4.8")


@pytest.mark.skipif("tradeoff_matched_digits" not in FOLDERS, reason="not shipped")
def test_tradeoff_matched_digits_rerun_says_what_the_docs_say():
    """docs/estimators.md "At matched accuracy on seeds 144–167" and README's third row: the rerun of 2026-12-06
    (the same code and seeds, another box) gives H1 (a − b = −0.0418, −0.0695 to −0.0142, adjusted p 0.0042: holds)
    and not H2 (−0.0045, −0.0241 to +0.0151, adjusted p 0.059: not shown), where the first run of 2026-11-28 had
    both hold (−0.0359; +0.0061, adjusted p 0.029)."""
    res = load_results(FINDINGS / "tradeoff_matched_digits")
    assert len(res.trials) == 48 and (res.trials["status"] == "ok").all()
    assert cells(res) == {(48.0, "gmm"): (24, 0.928, 0.640, 0.029),
                          (16.0, "attention_centroid"): (24, 0.923, 0.598, 0.060)}
    tested = evaluate(res.trials, res.hypotheses).set_index("name")
    assert list(tested.index) == ["H1", "H2"] and tested["verdict"].tolist() == ["holds", "not shown"], tested
    assert tested["diff"].round(4).tolist() == [-0.0418, -0.0045]
    assert [round(tested.loc["H2", k], 4) for k in ("ci_low", "ci_high")] == [-0.0241, 0.0151]
    assert [round(tested.loc["H1", k], 5) for k in ("ci_low", "ci_high")] == [-0.06947, -0.01419]
    t = res.trials
    assert (t["attack_ssim_by"] == "decoder").all()
    assert {s: round(g["test_acc"].std(), 3) for s, g in t.groupby("config.cem.surrogate")} == \
        {"gmm": 0.028, "attention_centroid": 0.039}
    ac = t.loc[t["config.cem.surrogate"] == "attention_centroid", "cem_loss_scale"]
    assert (round(ac.min(), 4), round(ac.max(), 4)) == (0.0080, 0.0093)
    # estimators.md's accuracy reading for these seeds on the rerun: Welch (the test's) and paired
    assert paired_by_seed(t, "test_acc", "attention_centroid", "gmm") == (-0.005, -0.020, 0.011)
    assert [f"{p:.2g}" for p in tested["p_adjusted"]] == ["0.0042", "0.059"]
    doc_says("docs/estimators.md", *(hypothesis_line(n, r)
                                     for n, r in tested.iterrows()))


@pytest.mark.skipif("surrogates_digits_confirm" not in FOLDERS, reason="not shipped")
def test_surrogates_digits_confirm_says_what_the_docs_say():
    """docs/estimators.md "Confirmed on 16 new seeds" and README's second row (4-epoch decoder): at one matched
    strength attention_centroid and serial_enhanced lower the worst-case SSIM more than gmm, −0.113 ± 0.032 and
    −0.078 ± 0.053 paired by seed (one-sided Welch, Holm over the 2: 1e−10 and 7e−6); the cells as printed. The
    space wrote its tests in comments (before `hypotheses:` existed), so they are computed here as written."""
    from scipy import stats
    res = load_results(FINDINGS / "surrogates_digits_confirm")
    t = res.trials
    assert len(t) == 80 and (t["status"] == "ok").all()
    t = t.assign(every=t["config.cem.strength_every"].fillna(0).astype(int))
    by = {k: g.sort_values("config.seed") for k, g in t.groupby(["config.cem.lambd", "config.cem.surrogate", "every"],
                                                                   dropna=False)}
    got = {(float(k[0]), str(k[1]), k[2]): (len(g), round(g["test_acc"].mean(), 3), round(g["test_acc"].std(), 3),
                                            round(g["attack_ssim"].mean(), 3), round(g["attack_ssim"].std(), 3))
           for k, g in by.items()}
    assert got == {(0.0, "none", 0): (16, 0.957, 0.021, 0.764, 0.007), (16.0, "gmm", 0): (16, 0.943, 0.021, 0.708, 0.013),
                   (16.0, "attention_centroid", 0): (16, 0.919, 0.034, 0.594, 0.034),
                   (16.0, "attention_centroid", 1): (16, 0.924, 0.032, 0.610, 0.033),
                   (16.0, "serial_enhanced", 0): (16, 0.917, 0.053, 0.630, 0.050)}
    gmm = by[(16.0, "gmm", 0)]["attack_ssim"].to_numpy()
    ps = []
    for sur, mean, std in (("attention_centroid", -0.113, 0.032), ("serial_enhanced", -0.078, 0.053)):
        a = by[(16.0, sur, 0)]["attack_ssim"].to_numpy()
        assert (round((a - gmm).mean(), 3), round((a - gmm).std(ddof=1), 3)) == (mean, std), sur
        ps.append(stats.ttest_ind(a, gmm, equal_var=False, alternative="less").pvalue)
    # docs/protocol.md §10: gmm λ 16 against λ = 0 on these seeds, paired
    assert paired_by_seed(res.trials, "test_acc", "gmm") == (-0.014, -0.027, -0.002)
    low, high = sorted(ps)   # Holm over 2: the smaller p times 2, the larger at least that
    adjusted = {low: min(1.0, 2 * low), high: max(min(1.0, 2 * low), high)}
    assert [f"{adjusted[p]:.0e}" for p in ps] == ["1e-10", "7e-06"], ps
    # E2 as written in the space: attention_centroid's accuracy differs from gmm's (Welch two-sided, paired
    # beside); E3: re-matched every epoch it still lowers SSIM more than gmm (one-sided Welch); once against
    # every epoch, paired
    ac, ac1, g = (by[k] for k in ((16.0, "attention_centroid", 0), (16.0, "attention_centroid", 1), (16.0, "gmm", 0)))
    d_acc = ac["test_acc"].to_numpy() - g["test_acc"].to_numpy()
    e2 = (stats.ttest_ind(ac["test_acc"], g["test_acc"], equal_var=False).pvalue,
          stats.ttest_rel(ac["test_acc"], g["test_acc"]).pvalue)
    d_e3 = ac1["attack_ssim"].to_numpy() - g["attack_ssim"].to_numpy()
    e3 = stats.ttest_ind(ac1["attack_ssim"], g["attack_ssim"], equal_var=False, alternative="less").pvalue
    d_once = ac1["attack_ssim"].to_numpy() - ac["attack_ssim"].to_numpy()
    once = stats.ttest_rel(ac1["attack_ssim"], ac["attack_ssim"]).pvalue

    def pm(d):   # as the doc prints a paired difference: its sign, mean and sd, with a true minus sign
        return f"{d.mean():+.3f} ± {d.std(ddof=1):.3f}".replace("-", "−")
    doc_says("docs/estimators.md",
             f"**{pm(d_acc).lstrip('+')}** ({e2[0]:.2g}; {e2[1]:.1g})",
             f"{pm(d_e3).lstrip('+')} ({e3:.0e}, E3)".replace("e-", "e−"),
             f"attention_centroid loses {-100 * d_acc.mean():.1f} points more than gmm (Welch p {e2[0]:.2g}, paired p "
             f"{e2[1]:.1g}",
             f"(every vs once: {pm(d_once)}, paired p {once:.2g})")


@pytest.mark.skipif("decoder_tradeoff_digits" not in FOLDERS, reason="not shipped")
def test_decoder_tradeoff_digits_says_what_the_docs_say():
    """docs/estimators.md "The accuracy-matched trade-off shrinks the same way" and README's third row (converged
    decoder): G1 holds, attention_centroid λ 16 more private than gmm λ 48 by 0.007 (−0.013 to −0.001 paired,
    p 0.012); accuracy −0.011 (−0.040 to +0.017), not resolved; the cells as printed, the decoder the worst case in
    all 16."""
    from scipy import stats
    res = load_results(FINDINGS / "decoder_tradeoff_digits")
    t = res.trials
    assert len(t) == 16 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert cells(res) == {(16.0, "attention_centroid"): (8, 0.909, 0.916, 0.006), (48.0, "gmm"): (8, 0.921, 0.923, 0.006)}
    assert {s: round(g["test_acc"].std(), 3) for s, g in t.groupby("config.cem.surrogate")} == \
        {"attention_centroid": 0.073, "gmm": 0.055}
    tested = evaluate(t, res.hypotheses).set_index("name")
    assert list(tested.index) == ["G1"] and tested.loc["G1", "verdict"] == "holds", tested
    assert [round(tested.loc["G1", k], 3) for k in ("diff", "ci_low", "ci_high", "p_adjusted")] == \
        [-0.007, -0.013, -0.001, 0.012]
    a, b = (t[t["config.cem.surrogate"] == s].sort_values("config.seed")["test_acc"].to_numpy()
            for s in ("attention_centroid", "gmm"))
    d = a - b
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert [round(x, 3) for x in (d.mean(), lo, hi)] == [-0.011, -0.040, 0.017]


@pytest.mark.skipif("decoder_matched_digits" not in FOLDERS, reason="not shipped")
def test_decoder_matched_digits_says_what_the_docs_say():
    """docs/estimators.md "On 24 more new seeds the edge holds and the accuracy match is not shown" and README's
    third row (converged decoder): M1 holds (−0.008369, −0.01144 to −0.005299, adjusted p 9.7e−6), M2 is not shown
    (−0.01748, −0.04659 to +0.01164, adjusted p 0.43); the cells and rmle's SSIM as printed, the decoder the worst
    case in all 48."""
    import pandas as pd
    res = load_results(FINDINGS / "decoder_matched_digits")
    t = res.trials
    assert len(t) == 48 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    got = surrogate_cells(t)
    assert got == {"attention_centroid": [0.902, 0.069, 0.916, 0.007, 0.089, 0.036],
                   "gmm": [0.920, 0.040, 0.924, 0.005, 0.183, 0.076]}, got
    tested = evaluate(t, res.hypotheses).set_index("name")
    assert list(tested.index) == ["M1", "M2"] and tested["verdict"].tolist() == ["holds", "not shown"], tested
    assert [f"{tested.loc['M1', k]:.4g}" for k in ("diff", "ci_low", "ci_high")] == ["-0.008369", "-0.01144", "-0.005299"]
    assert [f"{tested.loc['M2', k]:.4g}" for k in ("diff", "ci_low", "ci_high")] == ["-0.01748", "-0.04659", "0.01164"]
    assert [f"{p:.2g}" for p in tested["p_adjusted"]] == ["9.7e-06", "0.43"]
    # what the docs read beside M2 (not tests): the paired spread and median, the low tail, the 32 seeds pooled with
    # decoder_tradeoff_digits' 8 (320-327), and rmle's paired difference
    from scipy import stats

    def paired(tr, metric):
        p = tr.pivot(index="config.seed", columns="config.cem.surrogate", values=metric)
        return p["attention_centroid"] - p["gmm"]
    d = paired(t, "test_acc")
    assert [round(x, 3) for x in (d.std(), d.median(), paired(t, "attack_ssim__rmle").mean())] == [0.069, -0.024, -0.094]
    assert sorted(t.loc[t["config.cem.surrogate"] == "attention_centroid", "test_acc"].round(2))[:3] == [0.69, 0.72, 0.85]
    assert round(t.loc[t["config.cem.surrogate"] == "gmm", "test_acc"].min(), 2) == 0.82
    if "decoder_tradeoff_digits" in FOLDERS:
        both = pd.concat([d, paired(load_results(FINDINGS / "decoder_tradeoff_digits").trials, "test_acc")])
        lo, hi = stats.t.interval(0.95, len(both) - 1, loc=both.mean(), scale=stats.sem(both))
        assert len(both) == 32 and [round(x, 3) for x in (both.mean(), lo, hi, both.median())] == \
            [-0.016, -0.038, 0.006, -0.011]


# The two converged-decoder runs of README's fourth row: λ = 0, gmm at a larger λ and attention_centroid at λ 16,
# 4 hypotheses each (the pair's privacy and accuracy, each estimator's drop from λ = 0), as docs/estimators.md prints
# them: "At the paper's σ 0.1 attention_centroid is on gmm's curve against the converged decoder too" (D1-D4) and
# "At twice the width and epochs gmm at λ 96 is more private than attention_centroid" (W1-W4).
FOURTH_ROW = {
    # the rerun of 2026-12-06 on an AVX-512 box (the first run's, on an AVX2 box, is in the docs beside it: the
    # same verdicts, other digits)
    "decoder_sigma_digits": dict(
        trials=72,
        cells={"none": [0.951, 0.024, 0.951, 0.002, 0.495, 0.070], "gmm": [0.898, 0.035, 0.874, 0.009, 0.124, 0.055],
               "attention_centroid": [0.908, 0.033, 0.887, 0.011, 0.133, 0.035]},
        from_zero={("test_acc", "gmm"): (-0.053, -0.065, -0.041), ("test_acc", "attention_centroid"): (-0.043, -0.054, -0.033),
                   ("attack_ssim", "gmm"): (-0.077, -0.080, -0.073),
                   ("attack_ssim", "attention_centroid"): (-0.064, -0.068, -0.060)},
        scale=(0.0083, 0.0094),
        walls="trials of {none} (λ = 0), {gmm} (gmm) and {attention_centroid} (attention_centroid)",
        tests={"D1": ("not shown", "0.01282", "0.009584", "0.01606", "1"),
               "D2": ("holds", "0.009838", "-0.003858", "0.02353", "0.00016"),
               "D3": ("holds", "-0.07657", "-0.07997", "-0.07316", "5.8e-24"),
               "D4": ("holds", "-0.06374", "-0.06795", "-0.05954", "3.4e-20")}),
    "decoder_budget_digits": dict(   # the same: rerun on 2026-12-06 on an AVX-512 box, first run on an AVX2 one
        trials=48,
        cells={"none": [0.991, 0.004, 0.962, 0.002, 0.659, 0.042], "gmm": [0.964, 0.020, 0.887, 0.007, 0.087, 0.037],
               "attention_centroid": [0.972, 0.024, 0.909, 0.007, 0.097, 0.038]},
        from_zero={("test_acc", "gmm"): (-0.026, -0.037, -0.016), ("test_acc", "attention_centroid"): (-0.018, -0.031, -0.006),
                   ("attack_ssim", "gmm"): (-0.075, -0.078, -0.071),
                   ("attack_ssim", "attention_centroid"): (-0.052, -0.056, -0.049)},
        scale=(0.0087, 0.0093),
        walls="trials of {none} (λ = 0), {gmm} (gmm), {attention_centroid} (attention_centroid)",
        tests={"W1": ("not shown", "0.02213", "0.01655", "0.02772", "1"),
               "W2": ("holds", "0.007986", "-0.008837", "0.02481", "0.0029"),
               "W3": ("holds", "-0.07456", "-0.07839", "-0.07074", "1.3e-16"),
               "W4": ("holds", "-0.05243", "-0.05619", "-0.04867", "1.4e-14")}),
}


@pytest.mark.parametrize("name", sorted(FOURTH_ROW))
def test_the_fourth_rows_converged_runs_say_what_the_docs_say(name):
    if name not in FOLDERS:
        pytest.skip("not shipped")
    want = FOURTH_ROW[name]
    res = load_results(FINDINGS / name)
    t = res.trials
    assert len(t) == want["trials"] and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    got = surrogate_cells(t)
    assert got == want["cells"], got
    assert {k: paired_by_seed(t, *k) for k in want["from_zero"]} == want["from_zero"]
    ac = t.loc[t["config.cem.surrogate"] == "attention_centroid", "cem_loss_scale"]
    assert (round(ac.min(), 4), round(ac.max(), 4)) == want["scale"]
    tested = evaluate(t, res.hypotheses).set_index("name")
    assert {n: (r["verdict"], *(f"{r[k]:.4g}" for k in ("diff", "ci_low", "ci_high")), f"{r['p_adjusted']:.2g}")
            for n, r in tested.iterrows()} == want["tests"]
    doc_says("docs/estimators.md", *(hypothesis_line(n, r) for n, r in tested.iterrows()))
    # the SSIM drops as shares of λ = 0's mean, as estimators.md prints them
    zero = t.loc[t["config.cem.surrogate"] == "none", "attack_ssim"].mean()
    drops = [f"{100 * (zero - t.loc[t['config.cem.surrogate'] == s, 'attack_ssim'].mean()) / zero:.1f} %"
             for s in ("gmm", "attention_centroid")]
    doc_says("docs/estimators.md", f"the drops are {drops[0]} and {drops[1]} of λ = 0's {zero:.3f}")
    # the trials' wall times per cell, as performance.md prints them
    walls = {s: f"{g['wall_s'].min():.0f}–{g['wall_s'].max():.0f} s" for s, g in t.groupby("config.cem.surrogate")}
    assert want["walls"].format(**walls) in " ".join((ROOT / "docs/performance.md").read_text().split()), walls


@pytest.mark.skipif("confirm_lambda16_photos" not in FOLDERS, reason="not shipped")
def test_confirm_lambda16_photos_says_what_the_docs_say():
    """docs/estimators.md "Confirmed on 10 new seeds: at λ 16 on `photos` attention_centroid lowers the worst-case
    SSIM 0.016 beyond gmm" and README's photos row at λ 16 (converged decoder): C1 holds, −0.016 (−0.033 to
    +0.002), one-sided p 0.038, the paired sd 0.025; the decoder alone −0.020 (one-sided p 0.033), rmle −0.003;
    accuracy −1.0 point (−3.2 to +1.2); the cells and worst-case counts as printed."""
    from scipy import stats
    res = load_results(FINDINGS / "confirm_lambda16_photos")
    t = res.trials
    assert len(t) == 20 and (t["status"] == "ok").all() and set(t["config.cem.lambd"]) == {16.0}
    got = {s: [round(g[m].agg(f), 3) for m in ("test_acc", "attack_ssim__decoder", "attack_ssim__rmle",
                                               "attack_ssim") for f in ("mean", "std")]
           + [int((g["attack_ssim_by"] == "decoder").sum())] for s, g in t.groupby("config.cem.surrogate")}
    assert got == {"gmm": [0.816, 0.026, 0.405, 0.018, 0.386, 0.024, 0.409, 0.016, 7],
                   "attention_centroid": [0.806, 0.015, 0.385, 0.021, 0.383, 0.007, 0.394, 0.014, 4]}, got
    tested = evaluate(t, res.hypotheses).set_index("name")
    assert list(tested.index) == ["C1"] and tested.loc["C1", "verdict"] == "holds", tested
    assert [round(tested.loc["C1", k], 3) for k in ("diff", "ci_low", "ci_high", "p_adjusted")] == \
        [-0.016, -0.033, 0.002, 0.038]
    pairs = {m: paired_by_seed(t, m, "attention_centroid", "gmm")
             for m in ("attack_ssim", "attack_ssim__decoder", "attack_ssim__rmle", "test_acc")}
    assert pairs == {"attack_ssim": (-0.016, -0.033, 0.002), "attack_ssim__decoder": (-0.020, -0.042, 0.002),
                     "attack_ssim__rmle": (-0.003, -0.021, 0.015), "test_acc": (-0.010, -0.032, 0.012)}, pairs
    a, b = (t[t["config.cem.surrogate"] == s].sort_values("config.seed") for s in ("attention_centroid", "gmm"))
    d = a["attack_ssim"].to_numpy() - b["attack_ssim"].to_numpy()
    assert round(d.std(ddof=1), 3) == 0.025
    dec = stats.ttest_rel(a["attack_ssim__decoder"], b["attack_ssim__decoder"], alternative="less").pvalue
    assert round(dec, 3) == 0.033
    ac = a["cem_loss_scale"]
    assert (round(ac.min(), 4), round(ac.max(), 4)) == (0.0035, 0.0040)


def onecell_labelled(trials):
    """decoder_onecell_*'s trials with their cell's name (``cell``): gmm, gmm K5 (fused), gmm K1 isotropic / diag
    (fused), ``a99`` at cem.shrink 1000, ``batch_mean`` about the batch's class mean, attention_centroid,
    serial_enhanced."""
    def label(r):
        if r["config.cem.surrogate"] != "gmm":
            return r["config.cem.surrogate"]
        if r["config.cem.grad_mode"] == "inject":
            return "gmm"
        k, shrink = int(r["config.cem.num_clusters"]), r["config.cem.shrink"]
        about = " batch_mean" if r.get("config.cem.spread_about") == "batch_mean" else ""
        return (f"gmm K{k}" + (f" {r['config.cem.entropy']}" if k == 1 else "") + (" a99" if shrink == 1000 else "")
                + about)
    return trials.assign(cell=trials.apply(label, axis=1))


def onecell_cells(trials) -> dict:
    """{cell: (n, test_acc mean, std, worst-case SSIM mean, std, feature spread mean)} of decoder_onecell_*'s cells."""
    t = onecell_labelled(trials)
    return {c: (len(g), round(g["test_acc"].mean(), 3), round(g["test_acc"].std(), 3), round(g["attack_ssim"].mean(), 3),
                round(g["attack_ssim"].std(), 3), round(g["feature_spread"].mean(), 4)) for c, g in t.groupby("cell")}


def test_the_attention_cells_stayed_uniform_in_every_shipped_run():
    """docs/surrogates.md "Common contract", docs/estimators.md and the README: in every attention_centroid and
    serial_enhanced run of findings/ the cells' mass-weighted variance over the class's stayed near uniform at the
    last epoch, and their feature spreads were as printed. Counted over every folder, so a run shipped without the
    docs' ranges updated fails here (the docs once said 154 runs, 0.953–0.995, after 40 more had shipped)."""
    import pandas as pd
    ratio, spread = {"attention_centroid": [], "serial_enhanced": []}, []
    for name in FOLDERS:
        t = load_results(FINDINGS / name).trials
        t = t[(t["status"] == "ok") & t["config.cem.surrogate"].isin(list(ratio))]
        if t.empty:
            continue
        spread += t["feature_spread"].tolist()
        e = pd.read_parquet(FINDINGS / name / "epochs.parquet").merge(
            t[["trial_id", "config.cem.surrogate"]], on="trial_id")
        last = e.sort_values("epoch").groupby("trial_id").tail(1)
        assert len(last) == len(t), name                     # every such run logged its cells
        for s, g in last.groupby("config.cem.surrogate"):
            ratio[s] += (g["surr_cluster_var"] / g["surr_intra_mse"]).tolist()
    ac, se = ratio["attention_centroid"], ratio["serial_enhanced"]
    n_ac, lo, hi = len(ac), f"{min(ac):.3f}", f"{max(ac):.3f}"
    assert (n_ac, lo, hi) == (206, "0.933", "1.007")
    assert len(se) == 72 and f"{min(se):.3f}" == "1.000"
    assert (f"{min(spread):.4f}", f"{max(spread):.4f}") == ("0.0008", "0.0071")
    doc_says("docs/surrogates.md", "(last-epoch feature spreads of the test images 0.0008–0.0071, against",
             "0.933–1.007 in all 206 attention_centroid runs and 1.000 in all 72 serial_enhanced runs")
    doc_says("docs/estimators.md", "stayed near uniform to the end (the cells' mass-weighted variance 0.93–1.01 of")
    doc_says("README.md", "(the cells' mass-weighted variance 0.93–1.01 of the class's;")


@pytest.mark.skipif("decoder_onecell_digits" not in FOLDERS, reason="not shipped")
def test_decoder_onecell_runs_say_what_the_docs_say():
    """docs/estimators.md "Taken apart" and the README's paragraph after the findings table: K1 and K4, K6 hold,
    K2, K3, K5 not shown; S3 holds, S1, S2 not shown; C1-C3 hold (about the batch's class mean the one cell is
    attention_centroid); the cells as printed; repeated cells equal the run before's to every digit; gmm fused at
    the matched scale trains as gmm injected."""
    one = load_results(FINDINGS / "decoder_onecell_digits")
    two = load_results(FINDINGS / "decoder_onecell_shrink_digits")
    assert len(one.trials) == 48 and len(two.trials) == 24
    assert (one.trials["status"] == "ok").all() and (two.trials["status"] == "ok").all()
    c1, c2 = onecell_cells(one.trials), onecell_cells(two.trials)
    assert c1 == {"gmm": (8, 0.933, 0.028, 0.946, 0.003, 0.0058), "gmm K5": (8, 0.933, 0.028, 0.946, 0.003, 0.0058),
                  "gmm K1 isotropic": (8, 0.913, 0.036, 0.935, 0.003, 0.0028),
                  "gmm K1 diag": (8, 0.926, 0.031, 0.945, 0.002, 0.0049),
                  "attention_centroid": (8, 0.92, 0.044, 0.913, 0.008, 0.0014),
                  "serial_enhanced": (8, 0.873, 0.06, 0.922, 0.011, 0.0029)}
    assert c2 == {"gmm K1 isotropic": c1["gmm K1 isotropic"], "gmm K1 isotropic a99": (8, 0.922, 0.035, 0.936, 0.005, 0.0027),
                  "attention_centroid": c1["attention_centroid"]}
    cols = ["test_acc", "attack_ssim", "attack_ssim__rmle", "cem_loss_scale"]
    a, b = onecell_labelled(one.trials), onecell_labelled(two.trials)
    for cell in ("attention_centroid", "gmm K1 isotropic"):   # the repeated cells, to every digit
        same = [x[x["cell"] == cell].set_index("config.seed")[cols].sort_index() for x in (a, b)]
        assert len(same[0]) == 8 and same[0].equals(same[1]), cell
    t = one.trials
    fused = t[(t["config.cem.surrogate"] == "gmm") & (t["config.cem.grad_mode"] == "fused")
              & (t["config.cem.num_clusters"] == 5)].set_index("config.seed").sort_index()
    inject = t[(t["config.cem.surrogate"] == "gmm") & (t["config.cem.grad_mode"] == "inject")].set_index(
        "config.seed").sort_index()
    assert (fused["cem_loss_scale"].round(6) == 0.02).all() and (fused["test_acc"] == inject["test_acc"]).all()
    assert round((fused["attack_ssim"] - inject["attack_ssim"]).abs().max(), 4) == 0.0003
    k = evaluate(one.trials, one.hypotheses).set_index("name")
    assert k["verdict"].to_dict() == {"K1": "holds", "K2": "not shown", "K3": "not shown", "K4": "holds",
                                      "K5": "not shown", "K6": "holds"}
    assert [round(v, 3) for v in k["diff"]] == [-0.010, -0.001, -0.022, -0.022, -0.022, -0.022]
    assert (round(k.loc["K1", "ci_low"], 3), round(k.loc["K1", "ci_high"], 3)) == (-0.014, -0.007)
    assert f"{k.loc['K1', 'p_adjusted']:.0e}" == "3e-04" and round(k.loc["K2", "p_adjusted"], 2) == 0.62
    sh = evaluate(two.trials, two.hypotheses).set_index("name")
    assert sh["verdict"].to_dict() == {"S1": "not shown", "S2": "not shown", "S3": "holds"}
    assert [round(v, 3) for v in sh["diff"]] == [0.001, -0.023, -0.023]
    ac = t[t["config.cem.surrogate"] == "attention_centroid"].set_index("config.seed").sort_index()
    d = ac["attack_ssim"] - inject["attack_ssim"]          # attention_centroid's lead over gmm, paired by seed
    assert round(d.mean(), 3) == -0.032
    doc_says("docs/estimators.md", "| gmm, 1 cell, isotropic, fused, matched | 0.018 | 0.913 ± 0.036 | 0.935 ± 0.003 |",
             "−0.010 (−0.014 to −0.007): K1 holds, p 3e−4", "−0.001 (−0.005 to +0.002): K2 not shown, p 0.62",
             "| attention_centroid | 0.0084–0.0091 | 0.920 ± 0.044 | 0.913 ± 0.008 |",
             "| the same at α 0.99 (`cem.shrink` 1000) | 0.0082–0.0092 | 0.922 ± 0.035 | 0.936 ± 0.005 |",
             "(S1 +0.001, −0.004 to +0.006, not shown)")
    # the third run: about the batch's class mean the one cell is attention_centroid (C1, C2, C3 hold)
    three = load_results(FINDINGS / "decoder_onecell_centre_digits")
    assert len(three.trials) == 24 and (three.trials["status"] == "ok").all()
    c3 = onecell_cells(three.trials)
    assert c3 == {"gmm K1 isotropic a99": c2["gmm K1 isotropic a99"], "attention_centroid": c1["attention_centroid"],
                  "gmm K1 isotropic a99 batch_mean": (8, 0.908, 0.036, 0.913, 0.005, 0.0014)}
    c = evaluate(three.trials, three.hypotheses).set_index("name")
    assert (c["verdict"] == "holds").all() and [round(v, 3) for v in c["diff"]] == [-0.023, 0.001, 0.001]
    assert (round(c.loc["C2", "ci_low"], 3), round(c.loc["C2", "ci_high"], 3)) == (-0.005, 0.007)
    doc_says("docs/estimators.md",
             "| the same about the batch's class mean (`cem.spread_about: batch_mean`) | 0.0085–0.0092 | 0.908 ± 0.036 "
             "| 0.913 ± 0.005 | | −0.001 (−0.007 to +0.005) | 0.0014 |",
             "(C1 holds: −0.023, −0.028 to −0.018, p 1.5e−5)", "(C2 and C3 hold: +0.001, −0.005 to +0.007)")
    assert f"{c.loc['C1', 'p_adjusted']:.1e}" == "1.5e-05"
    # the fourth: serial_enhanced against the per-dimension cell about the batch's class mean (P1, P3 hold, P2 not)
    four = load_results(FINDINGS / "decoder_onecell_diag_digits")
    assert len(four.trials) == 24 and (four.trials["status"] == "ok").all()
    c4 = onecell_cells(four.trials)
    assert c4 == {"gmm K1 diag a99": (8, 0.928, 0.03, 0.942, 0.004, 0.0045),
                  "gmm K1 diag a99 batch_mean": (8, 0.912, 0.052, 0.926, 0.009, 0.0027),
                  "serial_enhanced": c1["serial_enhanced"]}
    p = evaluate(four.trials, four.hypotheses).set_index("name")
    assert p["verdict"].to_dict() == {"P1": "holds", "P2": "not shown", "P3": "holds"}
    assert [round(v, 3) for v in p["diff"]] == [-0.016, -0.004, -0.004]
    assert (round(p.loc["P2", "ci_low"], 3), round(p.loc["P2", "ci_high"], 3)) == (-0.015, 0.007)
    doc_says("docs/estimators.md", "(P1 holds: −0.016, −0.025 to −0.007, p 0.005)",
             "| the same about the batch's class mean | 0.0104–0.0113 | 0.912 ± 0.052 | 0.926 ± 0.009 | | | 0.0027 |")
    # the fifth, at σ 0.1 on new seeds: the batch-mean cell is attention_centroid again (Q1, Q2 hold)
    five = load_results(FINDINGS / "decoder_onecell_sigma_digits")
    assert len(five.trials) == 16 and (five.trials["status"] == "ok").all()
    assert (five.trials["config.defense.noise_std"] == 0.1).all()
    assert onecell_cells(five.trials) == {"gmm K1 isotropic a99 batch_mean": (8, 0.917, 0.04, 0.887, 0.009, 0.0025),
                                          "attention_centroid": (8, 0.924, 0.035, 0.887, 0.006, 0.0025)}
    q = evaluate(five.trials, five.hypotheses).set_index("name")
    assert (q["verdict"] == "holds").all() and round(q.loc["Q1", "diff"], 3) == 0.0
    assert (round(q.loc["Q1", "ci_low"], 3), round(q.loc["Q1", "ci_high"], 3)) == (-0.004, 0.004)
    doc_says("docs/estimators.md", "+0.000 (−0.004 to +0.004): within 0.01 (Q1 and Q2 hold, adjusted p 5e−4)")
    assert f"{q.loc['Q1', 'p_adjusted']:.0e}" == "5e-04"
    doc_says("README.md", "at σ 0.1 on 8 more new seeds +0.000, −0.004 to +0.004, holds")
    doc_says("README.md", "over gmm (−0.032) is gmm with one isotropic cell per class",
             "(to within 0.01, the tests' margin: +0.001, −0.005 to +0.007, holds;", "gives a third (−0.010)")


@pytest.mark.skipif("decoder_onecell_diag_digits_32seeds" not in FOLDERS, reason="not shipped")
def test_decoder_onecell_diag_digits_32seeds_says_what_the_docs_say():
    """docs/estimators.md "Taken apart" (serial_enhanced, on 32 more seeds) and the README's paragraph after the
    findings table: serial_enhanced is within 0.01 of the per-dimension cell about the batch's class mean (S1, S2
    hold), where its first 8 seeds had not shown the lower side."""
    from scipy import stats
    run = load_results(FINDINGS / "decoder_onecell_diag_digits_32seeds")
    t = run.trials
    assert len(t) == 64 and (t["status"] == "ok").all()
    assert (t["config.data.dataset"] == "digits").all() and (t["config.defense.noise_std"] == 0.05).all()
    assert sorted(t["config.seed"].unique()) == list(range(484, 516))
    assert onecell_cells(t) == {"gmm K1 diag a99 batch_mean": (32, 0.913, 0.031, 0.923, 0.009, 0.0029),
                                "serial_enhanced": (32, 0.909, 0.036, 0.924, 0.011, 0.0026)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert (r["verdict"] == "holds").all() and round(r.loc["S1", "diff"], 3) == 0.001
    assert (round(r.loc["S1", "ci_low"], 3), round(r.loc["S1", "ci_high"], 3)) == (-0.002, 0.004)
    assert [f"{p:.0e}" for p in r["p_adjusted"]] == ["1e-07", "9e-07"]
    lab = onecell_labelled(t)
    ssim = lab.pivot(index="config.seed", columns="cell", values="attack_ssim")
    assert round((ssim["serial_enhanced"] - ssim["gmm K1 diag a99 batch_mean"]).std(), 3) == 0.009
    acc = lab.pivot(index="config.seed", columns="cell", values="test_acc")
    da = acc["serial_enhanced"] - acc["gmm K1 diag a99 batch_mean"]
    lo, hi = stats.t.interval(0.95, len(da) - 1, loc=da.mean(), scale=da.sem())
    assert (round(100 * da.mean(), 1), round(100 * lo, 1), round(100 * hi, 1)) == (-0.3, -1.6, 1.0)
    scale = lab.groupby("cell")["cem_loss_scale"].agg(["min", "max"]).round(4)
    assert scale.loc["serial_enhanced"].tolist() == [0.0091, 0.0115]
    assert scale.loc["gmm K1 diag a99 batch_mean"].tolist() == [0.0102, 0.0114]
    assert (t["attack_ssim_by"] == "decoder").all()
    doc_says("docs/estimators.md", "serial_enhanced 0.924 ± 0.011 (accuracy 0.909 ± 0.036)",
             "against the cell's 0.923 ± 0.009 (0.913 ± 0.031), +0.001 (−0.002 to +0.004; S1 and S2 hold, adjusted p",
             "1e−7 and 9e−7). The paired gap spreads by 0.009 over seeds",
             "Accuracy −0.3 points (−1.6 to +1.0, not a hypothesis),",
             "(0.0091–0.0115 and 0.0102–0.0114) and feature spread (0.0026 and 0.0029)")
    doc_says("README.md", "and on 32 more new seeds is within 0.01 of it (+0.001, −0.002 to +0.004, holds; accuracy "
             "−0.3 points, −1.6 to +1.0; on one machine, not rerun on another)")


@pytest.mark.skipif("decoder_onecell_photos" not in FOLDERS, reason="not shipped")
def test_decoder_onecell_photos_says_what_the_docs_say():
    """docs/estimators.md "Taken apart" (on the photographs) and the README's paragraph after the findings table:
    on `photos` the batch-mean cell and attention_centroid have the same mean worst-case SSIM, and the interval is
    wider than the margin: R1 and R2 are not shown."""
    six = load_results(FINDINGS / "decoder_onecell_photos")
    t = six.trials
    assert len(t) == 16 and (t["status"] == "ok").all()
    assert (t["config.data.dataset"] == "photos").all() and (t["config.defense.noise_std"] == 0.1).all()
    assert sorted(t["config.seed"].unique()) == list(range(448, 456))
    assert onecell_cells(t) == {"gmm K1 isotropic a99 batch_mean": (8, 0.805, 0.021, 0.391, 0.007, 0.0028),
                                "attention_centroid": (8, 0.809, 0.021, 0.391, 0.011, 0.0031)}
    r = evaluate(t, six.hypotheses).set_index("name")
    assert (r["verdict"] == "not shown").all() and round(r.loc["R1", "diff"], 3) == 0.0
    assert (round(r.loc["R1", "ci_low"], 3), round(r.loc["R1", "ci_high"], 3)) == (-0.012, 0.012)
    assert round(r.loc["R1", "p_adjusted"], 3) == 0.086
    lab = onecell_labelled(t)
    gap = lab.pivot(index="config.seed", columns="cell", values="attack_ssim")
    assert round((gap["attention_centroid"] - gap["gmm K1 isotropic a99 batch_mean"]).std(), 3) == 0.014
    scale = lab.groupby("cell")["cem_loss_scale"].agg(["min", "max"]).round(4)
    assert scale.loc["attention_centroid"].tolist() == [0.0033, 0.004]
    assert scale.loc["gmm K1 isotropic a99 batch_mean"].tolist() == [0.0033, 0.0041]
    assert (t.groupby("config.cem.surrogate")["attack_ssim_by"].value_counts() == 4).all()
    e = six.epochs.merge(t[["trial_id", "config.cem.surrogate"]], on="trial_id")
    last = e[e["config.cem.surrogate"] == "attention_centroid"].sort_values("epoch").groupby("trial_id").tail(1)
    ratio = last["surr_cluster_var"] / last["surr_intra_mse"]
    assert (round(ratio.min(), 3), round(ratio.max(), 3)) == (0.933, 0.979)
    doc_says("docs/estimators.md", "attention_centroid 0.391 ± 0.011 (accuracy 0.809 ± 0.021) against the batch-mean",
             "cell's 0.391 ± 0.007 (0.805 ± 0.021), +0.000 (−0.012 to +0.012)", "The paired gap spreads by 0.014",
             "`surr_intra_mse` 0.933–0.979 at the last epoch",
             "(R1, R2 not shown, adjusted p 0.086)")
    doc_says("README.md", "same mean SSIM (+0.000), but their paired gap spreads more there: −0.012 to +0.012, not "
             "shown within 0.01")


@pytest.mark.skipif("decoder_onecell_photos_12seeds" not in FOLDERS, reason="not shipped")
def test_decoder_onecell_photos_12seeds_says_what_the_docs_say():
    """docs/estimators.md "Taken apart" (on the photographs, 12 more seeds) and the README's paragraph after the
    findings table: attention_centroid is not higher than the batch-mean cell by 0.01 (Q2 holds), but may be up
    to 0.020 lower (Q1 not shown): the one-cell account is not shown on `photos`."""
    from scipy import stats
    run = load_results(FINDINGS / "decoder_onecell_photos_12seeds")
    t = run.trials
    assert len(t) == 24 and (t["status"] == "ok").all()
    assert (t["config.data.dataset"] == "photos").all() and (t["config.defense.noise_std"] == 0.1).all()
    assert sorted(t["config.seed"].unique()) == list(range(472, 484))
    assert onecell_cells(t) == {"gmm K1 isotropic a99 batch_mean": (12, 0.806, 0.023, 0.396, 0.015, 0.0036),
                                "attention_centroid": (12, 0.795, 0.024, 0.39, 0.012, 0.003)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert r.loc["Q1", "verdict"] == "not shown" and r.loc["Q2", "verdict"] == "holds"
    assert round(r.loc["Q1", "diff"], 3) == -0.006
    assert (round(r.loc["Q1", "ci_low"], 3), round(r.loc["Q1", "ci_high"], 3)) == (-0.020, 0.008)
    assert (round(r.loc["Q1", "p_adjusted"], 2), round(r.loc["Q2", "p_adjusted"], 3)) == (0.26, 0.028)
    lab = onecell_labelled(t)
    ssim = lab.pivot(index="config.seed", columns="cell", values="attack_ssim")
    assert round((ssim["attention_centroid"] - ssim["gmm K1 isotropic a99 batch_mean"]).std(), 3) == 0.022
    acc = lab.pivot(index="config.seed", columns="cell", values="test_acc")
    da = acc["attention_centroid"] - acc["gmm K1 isotropic a99 batch_mean"]
    lo, hi = stats.t.interval(0.95, len(da) - 1, loc=da.mean(), scale=da.sem())
    assert (round(100 * da.mean(), 1), round(100 * lo, 1), round(100 * hi, 1)) == (-1.1, -2.8, 0.6)
    scale = lab.groupby("cell")["cem_loss_scale"].agg(["min", "max"]).round(4)
    assert scale.loc["attention_centroid"].tolist() == [0.0031, 0.0043]
    assert scale.loc["gmm K1 isotropic a99 batch_mean"].tolist() == [0.0032, 0.0044]
    by = t.groupby("config.cem.surrogate")["attack_ssim_by"].value_counts()
    assert by.to_dict() == {("attention_centroid", "decoder"): 6, ("attention_centroid", "rmle"): 6,
                            ("gmm", "decoder"): 7, ("gmm", "rmle"): 5}
    doc_says("docs/estimators.md", "attention_centroid 0.390 ± 0.012 (accuracy 0.795 ± 0.024) against the batch-mean",
             "cell's 0.396 ± 0.015 (0.806 ± 0.023), −0.006 (−0.020 to +0.008)", "(Q2 holds, adjusted p 0.028; Q1 not",
             "shown, 0.26)", "The paired gap spreads by 0.022", "accuracy −1.1 points (−2.8 to +0.6")
    doc_says("README.md", "on 12 more new seeds attention_centroid is not higher by 0.01 (−0.006, −0.020 to +0.008)")


@pytest.mark.skipif("decoder_gmm_batchmean_digits" not in FOLDERS, reason="not shipped")
def test_decoder_gmm_batchmean_says_what_the_docs_say():
    """docs/estimators.md "Taken apart" (gmm at its own five cells) and the README's paragraph after the findings
    table: gmm's five cells about their batch means are more private than gmm at the same matched pull (B1), and
    one such cell per class more again (B2); the accuracy prices printed beside them."""
    from scipy import stats
    seven = load_results(FINDINGS / "decoder_gmm_batchmean_digits")
    t = seven.trials
    assert len(t) == 24 and (t["status"] == "ok").all()
    assert sorted(t["config.seed"].unique()) == list(range(456, 464))
    assert onecell_cells(t) == {"gmm": (8, 0.955, 0.015, 0.948, 0.003, 0.0059),
                                "gmm K5 batch_mean": (8, 0.942, 0.019, 0.931, 0.005, 0.0025),
                                "gmm K1 isotropic a99 batch_mean": (8, 0.93, 0.024, 0.913, 0.007, 0.0014)}
    b = evaluate(t, seven.hypotheses).set_index("name")
    assert (b["verdict"] == "holds").all()
    assert [round(v, 3) for v in b["diff"]] == [-0.017, -0.018]
    assert (round(b.loc["B1", "ci_low"], 3), round(b.loc["B1", "ci_high"], 3)) == (-0.020, -0.014)
    assert (round(b.loc["B2", "ci_low"], 3), round(b.loc["B2", "ci_high"], 3)) == (-0.024, -0.012)
    assert f"{b.loc['B1', 'p_adjusted']:.1e}" == "4.2e-06" and f"{b.loc['B2', 'p_adjusted']:.1e}" == "9.9e-05"
    lab = onecell_labelled(t)
    scale = lab.groupby("cell")["cem_loss_scale"].agg(["min", "max"]).round(4)
    assert scale.loc["gmm K5 batch_mean"].tolist() == [0.0287, 0.0306] and scale.loc["gmm"].tolist() == [1.0, 1.0]
    assert (t["attack_ssim_by"] == "decoder").all()

    def gap(metric, a, bb):
        p = lab.pivot(index="config.seed", columns="cell", values=metric)
        d = p[a] - p[bb]
        lo, hi = stats.t.interval(0.95, len(d) - 1, d.mean(), d.std(ddof=1) / len(d) ** 0.5)
        return round(d.mean(), 3), round(lo, 3), round(hi, 3)
    assert gap("test_acc", "gmm K5 batch_mean", "gmm") == (-0.013, -0.022, -0.004)
    assert gap("test_acc", "gmm K1 isotropic a99 batch_mean", "gmm") == (-0.025, -0.049, -0.001)
    assert gap("attack_ssim", "gmm K1 isotropic a99 batch_mean", "gmm") == (-0.035, -0.039, -0.031)
    doc_says("docs/estimators.md",
             "0.942 ± 0.019, 0.931 ± 0.005, 0.0025; B1 holds, −0.017 (−0.020 to −0.014), adjusted p 4.2e−6,",
             "for −1.3 points of accuracy (−2.2 to −0.4, not a hypothesis)", "0.930 ± 0.024, 0.913 ± 0.007, 0.0014; B2 holds,",
             "−0.018 (−0.024 to −0.012) below the five, adjusted p 9.9e−5; against gmm −0.035 (−0.039 to −0.031) for −2.5 "
             "points (−4.9 to −0.1)", "scale 0.0287–0.0306")
    doc_says("README.md", "are 0.017 more private at the same matched pull (−0.020 to −0.014, holds), for 1.3 points of "
             "accuracy (−2.2 to −0.4), and one such cell per class 0.018 more again (holds)")


@pytest.mark.skipif("decoder_gmm_batchmean_tradeoff_digits" not in FOLDERS, reason="not shipped")
def test_decoder_gmm_batchmean_tradeoff_says_what_the_docs_say():
    """docs/estimators.md "Taken apart" (not shown to move gmm's front) and the README: gmm at λ 48 is more private
    than the batch-mean change at λ 16 (T1 not shown), the accuracy gap unresolved (T2 not shown)."""
    from scipy import stats
    run = load_results(FINDINGS / "decoder_gmm_batchmean_tradeoff_digits")
    t = run.trials
    assert len(t) == 24 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert sorted(t["config.seed"].unique()) == list(range(464, 472))
    cell = t["config.cem.lambd"].astype(int).astype(str).radd("gmm λ").where(
        t["config.cem.spread_about"] != "batch_mean", "batch_mean λ16")
    t = t.assign(cell=cell)
    got = {c: (round(g["test_acc"].mean(), 3), round(g["test_acc"].std(), 3), round(g["attack_ssim"].mean(), 3),
               round(g["attack_ssim"].std(), 3)) for c, g in t.groupby("cell")}
    assert got == {"batch_mean λ16": (0.921, 0.02, 0.932, 0.007), "gmm λ16": (0.932, 0.036, 0.945, 0.004),
                   "gmm λ48": (0.906, 0.05, 0.924, 0.007)}
    h = evaluate(run.trials, run.hypotheses).set_index("name")
    assert h["verdict"].to_dict() == {"T1": "not shown", "T2": "not shown"}
    assert (round(h.loc["T1", "diff"], 3), round(h.loc["T1", "ci_low"], 3), round(h.loc["T1", "ci_high"], 3)) == (
        0.009, 0.002, 0.016)
    assert (round(h.loc["T2", "diff"], 3), round(h.loc["T2", "ci_low"], 3), round(h.loc["T2", "ci_high"], 3)) == (
        0.015, -0.028, 0.058)
    assert round(h.loc["T1", "p_adjusted"], 2) == 0.99 and round(h.loc["T2", "p_adjusted"], 3) == 0.095
    p = t.pivot(index="config.seed", columns="cell", values="attack_ssim")
    d = p["batch_mean λ16"] - p["gmm λ16"]
    lo, hi = stats.t.interval(0.95, len(d) - 1, d.mean(), d.std(ddof=1) / len(d) ** 0.5)
    assert (round(d.mean(), 3), round(lo, 3), round(hi, 3)) == (-0.013, -0.019, -0.006)
    doc_says("docs/estimators.md", "are 0.009 *less* private (+0.002 to +0.016; T1 not shown, adjusted p 0.99), at +1.5 "
             "points of accuracy (−2.8 to +5.8; T2, not lower by more than 2 points, not shown, adjusted p 0.095)",
             "0.921 ± 0.020, SSIM 0.932 ± 0.007", "(0.906 ± 0.050, 0.924 ± 0.007;", "(0.932 ± 0.036, 0.945 ± 0.004)",
             "−0.013 (−0.019 to −0.006, a reading")
    doc_says("README.md", "gmm at λ 48 is 0.009 more private than that change at λ 16 (+0.002 to +0.016, new seeds; the "
             "accuracy gap unresolved): it is not shown to move gmm's front.")


def test_noise_alone_digits_says_what_the_docs_say():
    """docs/estimators.md "At σ 0.1 CEM is beyond noise alone", the README's row and summary: the pilots' curve and
    choice (σ 0.35, the SSIM nearest gmm λ 64's 0.874), then N1–N3 hold on 16 new seeds."""
    import pandas as pd
    pilots = pd.concat([load_results(FINDINGS / n).trials for n in ("noise_alone_pilot_digits",
                                                                   "noise_alone_pilot2_digits")])
    pilots = pilots[pilots["status"] == "ok"]
    assert (pilots["config.cem.lambd"] == 0).all() and sorted(pilots["config.seed"].unique()) == list(range(516, 522))
    curve = pilots.groupby("config.defense.noise_std")[["test_acc", "attack_ssim"]].mean()
    assert [(round(a, 3), round(s, 3)) for a, s in curve.loc[[0.15, 0.2, 0.25, 0.3, 0.35, 0.5]].to_numpy()] == [
        (0.929, 0.941), (0.941, 0.929), (0.914, 0.919), (0.885, 0.903), (0.875, 0.893), (0.769, 0.853)]
    assert (round(curve.loc[0.75, "test_acc"], 2), round(curve.loc[0.75, "attack_ssim"], 2)) == (0.34, 0.71)
    assert (curve["attack_ssim"] - 0.874).abs().idxmin() == 0.35     # the second pilot's rule
    run = load_results(FINDINGS / "noise_alone_digits")
    t = run.trials
    assert len(t) == 64 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert sorted(t["config.seed"].unique()) == list(range(522, 538))
    cells = {(lam, sig): (round(g["test_acc"].mean(), 3), round(g["test_acc"].std(), 3), round(g["attack_ssim"].mean(), 3),
                          round(g["attack_ssim"].std(), 3))
             for (lam, sig), g in t.groupby(["config.cem.lambd", "config.defense.noise_std"])}
    assert cells == {(0.0, 0.1): (0.945, 0.032, 0.951, 0.003), (0.0, 0.35): (0.868, 0.06, 0.89, 0.01),
                     (64.0, 0.1): (0.899, 0.035, 0.876, 0.007), (64.0, 0.35): (0.847, 0.051, 0.845, 0.013)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert (r["verdict"] == "holds").all()
    doc_says("docs/estimators.md", *(f"`hypothesis {n}: {r.loc[n, 'metric']}, " for n in ("N1", "N2", "N3")),
             hypothesis_line("N1", r.loc["N1"]).split("… ")[1], hypothesis_line("N2", r.loc["N2"]).split("… ")[1],
             hypothesis_line("N3", r.loc["N3"]).split("… ")[1])

    def paired(metric, a, b):
        mean, lo, hi = (100 * v for v in paired_cells(t, metric, a, b))
        return round(mean, 1), round(lo, 2), round(hi, 1)
    assert paired("test_acc", (64.0, 0.35), (0.0, 0.35)) == (-2.1, -4.11, -0.1)
    assert paired("test_acc", (64.0, 0.1), (0.0, 0.1)) == (-4.6, -6.03, -3.2)
    doc_says("docs/estimators.md", "for 2.1 points of accuracy (0.05–4.1, not a hypothesis)",
             "gmm λ 64 0.899 / 0.876 (0.898 / 0.874); CEM's drop −0.075 (−0.079 to −0.071) for 4.6 points of accuracy")
    doc_says("README.md", "yes, on 16 new seeds: 0.015 more private (0.010–0.019) and not less accurate by 2 points "
             "(+3.1, −0.4 to +6.6)", "is less private by 0.015 and not more accurate by 2 points")


@pytest.mark.skipif("noise_alone_demo_digits" not in FOLDERS, reason="not shipped")
def test_noise_alone_demo_digits_says_what_the_docs_say():
    """docs/estimators.md "At the demo's point (σ 0.05, gmm λ 16) CEM is not shown beyond noise alone", the README's
    row and summary: σ† from the earlier tables by the space's rule (0.125), then L1 and L2 not shown, L3 holds."""
    import pandas as pd
    # the rule, on the tables it names: gmm λ 16 at σ 0.05 (24 runs), noise alone at σ 0.1 (40) and 0.15 (6)
    earlier = pd.concat([load_results(FINDINGS / n).trials.assign(folder=n) for n in (
        "decoder_digits", "decoder_gmm_batchmean_digits", "decoder_gmm_batchmean_tradeoff_digits",
        "decoder_sigma_digits", "noise_alone_digits", "noise_alone_pilot_digits")])
    earlier = earlier[earlier["status"] == "ok"]
    gmm = earlier[(earlier["config.cem.lambd"] == 16) & (earlier["config.cem.surrogate"] == "gmm")
                  & (earlier["config.defense.noise_std"] == 0.05)
                  & (earlier["config.cem.spread_about"].fillna("centroid") == "centroid")
                  & (earlier["config.cem.strength"] == "fixed")]
    assert len(gmm) == 24 and round(gmm["attack_ssim"].mean(), 4) == 0.9467 and round(gmm["test_acc"].mean(), 3) == 0.94
    noise = earlier[earlier["config.cem.lambd"] == 0].groupby("config.defense.noise_std")["attack_ssim"]
    s1, s2 = noise.mean()[0.1], noise.mean()[0.15]
    assert (noise.count()[0.1], noise.count()[0.15]) == (40, 6) and (round(s1, 4), round(s2, 4)) == (0.951, 0.9407)
    sigma = 0.1 + 0.05 * (s1 - gmm["attack_ssim"].mean()) / (s1 - s2)
    assert round(sigma, 3) == 0.121 and round(sigma / 0.025) * 0.025 == 0.125
    run = load_results(FINDINGS / "noise_alone_demo_digits")
    t = run.trials
    assert len(t) == 64 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert sorted(t["config.seed"].unique()) == list(range(538, 554))
    cells = {(lam, sig): (round(g["test_acc"].mean(), 3), round(g["test_acc"].std(), 3), round(g["attack_ssim"].mean(), 3),
                          round(g["attack_ssim"].std(), 3))
             for (lam, sig), g in t.groupby(["config.cem.lambd", "config.defense.noise_std"])}
    assert cells == {(0.0, 0.05): (0.957, 0.031, 0.961, 0.002), (0.0, 0.125): (0.939, 0.035, 0.946, 0.003),
                     (16.0, 0.05): (0.931, 0.043, 0.947, 0.003), (16.0, 0.125): (0.907, 0.048, 0.912, 0.006)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert list(r["verdict"]) == ["not shown", "not shown", "holds"]
    doc_says("docs/estimators.md", *(f"`hypothesis {n}: {r.loc[n, 'metric']}, " for n in ("L1", "L2", "L3")),
             *(hypothesis_line(n, r.loc[n]).split("… ")[1] for n in ("L1", "L2", "L3")))

    def paired(metric, a, b):
        return tuple(round(v, 3) for v in paired_cells(t, metric, a, b))
    assert paired("attack_ssim", (16.0, 0.05), (0.0, 0.125)) == (0.001, -0.001, 0.003)
    assert paired("test_acc", (16.0, 0.05), (0.0, 0.125)) == (-0.008, -0.032, 0.017)
    assert paired("test_acc", (16.0, 0.125), (0.0, 0.125)) == (-0.032, -0.047, -0.018)
    assert paired("attack_ssim", (16.0, 0.05), (0.0, 0.05)) == (-0.014, -0.015, -0.013)
    assert paired("test_acc", (16.0, 0.05), (0.0, 0.05)) == (-0.026, -0.044, -0.008)
    doc_says("docs/estimators.md", "for 3.2 points of accuracy (1.8–4.7, not a hypothesis): more than at σ 0.05 "
             "(−0.014, −0.015 to −0.013, for 2.6 points, 0.8–4.4)", "0.9467", "σ† hit gmm's SSIM within 0.001 "
             "(0.946 against 0.947: +0.0008, −0.0013 to +0.0029)")
    doc_says("README.md", "no more private (+0.001, −0.001 to +0.003) and not shown within 2 points of its accuracy "
             "(−0.8, −3.2 to +1.7)", "at σ 0.125 gmm lowers SSIM 0.034 more, for 3.2 points",
             "gmm is no more private than noise alone at σ 0.125 (+0.001, −0.001 to +0.003)")


@pytest.mark.skipif("noise_alone_lambda48_digits" not in FOLDERS, reason="not shipped")
def test_noise_alone_lambda48_digits_says_what_the_docs_say():
    """docs/estimators.md "At σ 0.05 and gmm λ 48 CEM is not shown beyond noise alone either", the README's row and
    summary: σ† from the earlier tables by the space's rule (0.225), then E1 and E2 not shown, E3 holds."""
    import pandas as pd
    # the rule, on the tables it names: gmm λ 48 at σ 0.05 (40 runs), noise alone at σ 0.2 and 0.25 (6 each)
    earlier = pd.concat([load_results(FINDINGS / n).trials for n in (
        "decoder_tradeoff_digits", "decoder_matched_digits", "decoder_gmm_batchmean_tradeoff_digits",
        "noise_alone_pilot_digits")])
    earlier = earlier[earlier["status"] == "ok"]
    gmm = earlier[(earlier["config.cem.lambd"] == 48) & (earlier["config.cem.surrogate"] == "gmm")
                  & (earlier["config.defense.noise_std"] == 0.05)]
    assert len(gmm) == 40 and round(gmm["attack_ssim"].mean(), 4) == 0.9237 and round(gmm["test_acc"].mean(), 3) == 0.917
    noise = earlier[earlier["config.cem.lambd"] == 0].groupby("config.defense.noise_std")["attack_ssim"]
    s1, s2 = noise.mean()[0.2], noise.mean()[0.25]
    assert (noise.count()[0.2], noise.count()[0.25]) == (6, 6) and (round(s1, 4), round(s2, 4)) == (0.9291, 0.9185)
    sigma = 0.2 + 0.05 * (s1 - gmm["attack_ssim"].mean()) / (s1 - s2)
    assert round(sigma, 4) == 0.2255 and round(sigma / 0.025) * 0.025 == pytest.approx(0.225)
    run = load_results(FINDINGS / "noise_alone_lambda48_digits")
    t = run.trials
    assert len(t) == 64 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert sorted(t["config.seed"].unique()) == list(range(554, 570))
    cells = {(lam, sig): (round(g["test_acc"].mean(), 3), round(g["test_acc"].std(), 3), round(g["attack_ssim"].mean(), 3),
                          round(g["attack_ssim"].std(), 3))
             for (lam, sig), g in t.groupby(["config.cem.lambd", "config.defense.noise_std"])}
    assert cells == {(0.0, 0.05): (0.959, 0.02, 0.961, 0.003), (0.0, 0.225): (0.921, 0.033, 0.925, 0.004),
                     (48.0, 0.05): (0.922, 0.041, 0.924, 0.007), (48.0, 0.225): (0.868, 0.045, 0.855, 0.008)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert list(r["verdict"]) == ["not shown", "not shown", "holds"]
    doc_says("docs/estimators.md", *(f"`hypothesis {n}: {r.loc[n, 'metric']}, " for n in ("E1", "E2", "E3")),
             *(hypothesis_line(n, r.loc[n]).split("… ")[1] for n in ("E1", "E2", "E3")))

    def paired(metric, a, b):
        return tuple(round(v, 3) for v in paired_cells(t, metric, a, b))
    assert paired("test_acc", (48.0, 0.225), (0.0, 0.225)) == (-0.053, -0.071, -0.035)
    assert paired("attack_ssim", (48.0, 0.05), (0.0, 0.05)) == (-0.037, -0.041, -0.033)
    assert paired("test_acc", (48.0, 0.05), (0.0, 0.05)) == (-0.037, -0.051, -0.022)
    doc_says("docs/estimators.md", "σ† hit gmm's SSIM (−0.0001, −0.0045 to +0.0042) and its accuracy (+0.1 "
             "points, −2.1 to +2.4", "for 5.3 points of accuracy (3.5–7.1, not a hypothesis)",
             "gmm λ 48 0.922 / 0.924 (0.917 / 0.924 over 40 runs)")
    doc_says("README.md", "no more private (−0.0001, −0.0045 to +0.0042) and not shown within 2 points of its accuracy "
             "(+0.1, −2.1 to +2.4; adjusted p 0.062)", "at σ 0.225 gmm lowers SSIM 0.069 more, for 5.3 points",
             "at σ 0.225 (−0.0001, −0.0045 to +0.0042)")


@pytest.mark.skipif("noise_alone_sigma125_digits" not in FOLDERS, reason="not shipped")
def test_noise_alone_sigma125_digits_says_what_the_docs_say():
    """docs/estimators.md "At σ 0.125 gmm at λ 16 is not shown beyond noise alone either", the README's row and
    summary: σ† from the earlier tables by the space's rule (0.275), then F1 not shown, F2 and F3 hold."""
    # the rule, on the tables it names: gmm λ 16 at σ 0.125 (16 runs), noise alone at σ 0.25 and 0.3 (6 each)
    demo = load_results(FINDINGS / "noise_alone_demo_digits").trials
    gmm = demo[(demo["config.cem.lambd"] == 16) & (demo["config.defense.noise_std"] == 0.125)]
    assert len(gmm) == 16 and round(gmm["attack_ssim"].mean(), 5) == 0.91216 and round(gmm["test_acc"].mean(), 3) == 0.907
    pilot = load_results(FINDINGS / "noise_alone_pilot_digits").trials
    noise = pilot[pilot["status"] == "ok"].groupby("config.defense.noise_std")["attack_ssim"]
    s1, s2 = noise.mean()[0.25], noise.mean()[0.3]
    assert (noise.count()[0.25], noise.count()[0.3]) == (6, 6) and (round(s1, 5), round(s2, 5)) == (0.91852, 0.90262)
    sigma = 0.25 + 0.05 * (s1 - gmm["attack_ssim"].mean()) / (s1 - s2)
    assert round(sigma, 3) == 0.27 and round(sigma / 0.025) * 0.025 == pytest.approx(0.275)
    run = load_results(FINDINGS / "noise_alone_sigma125_digits")
    t = run.trials
    assert len(t) == 64 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert sorted(t["config.seed"].unique()) == list(range(570, 586))
    cells = lambda_sigma_cells(t)
    assert cells == {(0.0, 0.125): (0.945, 0.037, 0.946, 0.002, 0.5, 0.0318),
                     (0.0, 0.275): (0.907, 0.066, 0.914, 0.005, 0.403, 0.0404),
                     (16.0, 0.125): (0.927, 0.034, 0.913, 0.008, 0.308, 0.0077),
                     (16.0, 0.275): (0.877, 0.04, 0.873, 0.007, 0.306, 0.0154)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert list(r["verdict"]) == ["not shown", "holds", "holds"]
    doc_says("docs/estimators.md", *(f"`hypothesis {n}: {r.loc[n, 'metric']}, " for n in ("F1", "F2", "F3")),
             *(hypothesis_line(n, r.loc[n]).split("… ")[1] for n in ("F1", "F2", "F3")))

    def paired(metric, a, b, drop=()):
        return tuple(round(v, 3) for v in paired_cells(t[~t["config.seed"].isin(drop)], metric, a, b))
    assert paired("attack_ssim", (16.0, 0.125), (0.0, 0.275)) == (-0.002, -0.006, 0.003)
    assert paired("test_acc", (16.0, 0.125), (0.0, 0.275)) == (0.02, -0.016, 0.056)
    assert paired("test_acc", (16.0, 0.275), (0.0, 0.275)) == (-0.03, -0.055, -0.006)
    assert paired("attack_ssim", (16.0, 0.125), (0.0, 0.125)) == (-0.033, -0.037, -0.029)
    assert paired("test_acc", (16.0, 0.125), (0.0, 0.125)) == (-0.018, -0.028, -0.008)
    # the seed F2's +2.0 leans on, and the difference without it (a description, not a test)
    low = t[(t["config.cem.lambd"] == 0) & (t["config.defense.noise_std"] == 0.275)].nsmallest(1, "test_acc").iloc[0]
    assert (low["config.seed"], round(low["test_acc"], 3)) == (575, 0.678)
    assert paired("test_acc", (16.0, 0.125), (0.0, 0.275), drop=[575]) == (0.006, -0.016, 0.028)
    p = t.pivot_table(index="config.seed", columns=["config.cem.lambd", "config.defense.noise_std"], values="test_acc")
    assert round((p[(16.0, 0.125)] - p[(0.0, 0.275)]).median(), 3) == 0.006
    doc_says("docs/estimators.md", "σ† hit gmm's SSIM (−0.0016, −0.0064 to\n      +0.0032)",
             "(+2.0 points, −1.6 to +5.6)", "seed 575 at σ 0.275 trained to 0.678; without it +0.6 points (−1.6 to +2.8)",
             "for 3.0 points of accuracy (0.6–5.5, not a hypothesis): more than at σ 0.125 (−0.033, −0.037 to\n"
             "      −0.029, for 1.8 points, 0.8–2.8)", "0.40 of the way from 0.25 (0.270), σ† = 0.275")
    doc_says("README.md", "no more private (−0.0016, −0.0064 to +0.0032), though within 2 points of its accuracy "
             "(+2.0, −1.6 to +5.6; adjusted p 0.032)", "at σ 0.275 gmm lowers SSIM 0.041 more, for 3.0 points",
             "noise alone at σ 0.275 is as private (−0.0016, −0.0064 to +0.0032)")


@pytest.mark.skipif("noise_alone_sigma275_digits" not in FOLDERS, reason="not shipped")
def test_noise_alone_sigma275_digits_says_what_the_docs_say():
    """docs/estimators.md "At σ 0.275 gmm at λ 16 is more private than the noise that meets its accuracy; the match
    is not shown", the README's row and summary: σ* from the earlier tables by the space's rule (0.325), then A1
    and A3 hold, A2 not shown."""
    import pandas as pd
    # the rule, on the tables it names: gmm λ 16 at σ 0.275 (16 runs), noise alone's accuracy at σ 0.3 and 0.35
    earlier = load_results(FINDINGS / "noise_alone_sigma125_digits").trials
    gmm = earlier[(earlier["config.cem.lambd"] == 16) & (earlier["config.defense.noise_std"] == 0.275)]
    assert len(gmm) == 16 and round(gmm["test_acc"].mean(), 5) == 0.87708 and round(gmm["attack_ssim"].mean(), 4) == 0.8728
    curve = pd.concat([load_results(FINDINGS / n).trials for n in ("noise_alone_pilot_digits", "noise_alone_digits")])
    curve = curve[(curve["status"] == "ok") & (curve["config.cem.lambd"] == 0)]
    acc = curve.groupby("config.defense.noise_std")["test_acc"]
    a1, a2 = acc.mean()[0.3], acc.mean()[0.35]
    assert (acc.count()[0.3], acc.count()[0.35]) == (6, 22) and (round(a1, 5), round(a2, 5)) == (0.88472, 0.86957)
    sigma = 0.3 + 0.05 * (a1 - gmm["test_acc"].mean()) / (a1 - a2)
    assert round((sigma - 0.3) / 0.05, 2) == 0.5 and round(sigma / 0.025) * 0.025 == pytest.approx(0.325)
    run = load_results(FINDINGS / "noise_alone_sigma275_digits")
    t = run.trials
    assert len(t) == 64 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert sorted(t["config.seed"].unique()) == list(range(586, 602))
    cells = lambda_sigma_cells(t)
    assert cells == {(0.0, 0.275): (0.894, 0.049, 0.91, 0.008, 0.43, 0.0388),
                     (0.0, 0.325): (0.845, 0.078, 0.898, 0.009, 0.363, 0.04),
                     (16.0, 0.275): (0.852, 0.054, 0.868, 0.009, 0.326, 0.0152),
                     (16.0, 0.325): (0.846, 0.064, 0.866, 0.011, 0.332, 0.0201)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert list(r["verdict"]) == ["holds", "not shown", "holds"]
    doc_says("docs/estimators.md", *(f"`hypothesis {n}: {r.loc[n, 'metric']}, " for n in ("A1", "A2", "A3")),
             *(hypothesis_line(n, r.loc[n]).split("… ")[1] for n in ("A1", "A2", "A3")))

    def paired(metric, a, b):
        return tuple(round(v, 3) for v in paired_cells(t, metric, a, b))
    assert paired("attack_ssim", (16.0, 0.275), (0.0, 0.325)) == (-0.029, -0.035, -0.024)
    assert paired("test_acc", (16.0, 0.275), (0.0, 0.325)) == (0.007, -0.039, 0.052)
    assert paired("test_acc", (16.0, 0.325), (0.0, 0.325)) == (0.001, -0.017, 0.02)
    assert paired("attack_ssim", (16.0, 0.275), (0.0, 0.275)) == (-0.041, -0.044, -0.038)
    assert paired("test_acc", (16.0, 0.275), (0.0, 0.275)) == (-0.042, -0.059, -0.025)
    p = t.pivot_table(index="config.seed", columns=["config.cem.lambd", "config.defense.noise_std"], values="test_acc")
    assert round((p[(16.0, 0.275)] - p[(0.0, 0.325)]).std(), 3) == 0.086
    doc_says("docs/estimators.md", "gmm is 0.029 more private (0.024–0.035)", "(−3.9 to +5.2)",
             "and there its accuracy moves by +0.1 points (−1.7 to +2.0, not a hypothesis)",
             "of 0.041 (0.038–0.044) costs 4.2 points (2.5–5.9)", "the paired difference by 8.6",
             "(0.852 against 0.877 accuracy, 0.868\n      against 0.873 SSIM)",
             "0.50 of the way, σ* = 0.325")
    doc_says("README.md", "0.029 more private (0.024–0.035), but the accuracy match not shown (+0.7, −3.9 to +5.2;",
             "at σ 0.325 gmm lowers SSIM 0.032 more, for +0.1 points of accuracy (−1.7 to +2.0, not a hypothesis)",
             "Its first run, 16 seeds, had left it open")


@pytest.mark.skipif("noise_alone_matched_acc_digits" not in FOLDERS, reason="not shipped")
def test_noise_alone_matched_acc_digits_says_what_the_docs_say():
    """docs/estimators.md "On 48 new seeds the accuracy match holds", the README's row and summary: A2's question
    asked again on its two cells and 48 new seeds, σ* kept from the first run's rule; M1 and M2 hold."""
    run = load_results(FINDINGS / "noise_alone_matched_acc_digits")
    t = run.trials
    assert len(t) == 96 and (t["status"] == "ok").all() and (t["attack_ssim_by"] == "decoder").all()
    assert sorted(t["config.seed"].unique()) == list(range(602, 650))
    first = load_results(FINDINGS / "noise_alone_sigma275_digits").trials
    assert not set(t["config.seed"]) & set(first["config.seed"])      # new seeds, not pooled with the first run's
    cells = lambda_sigma_cells(t)
    assert cells == {(0.0, 0.325): (0.864, 0.061, 0.899, 0.008, 0.394, 0.0411),
                     (16.0, 0.275): (0.872, 0.057, 0.873, 0.009, 0.332, 0.0159)}
    r = evaluate(t, run.hypotheses).set_index("name")
    assert list(r["verdict"]) == ["holds", "holds"]
    doc_says("docs/estimators.md", *(f"`hypothesis {n}: {r.loc[n, 'metric']}, " for n in ("M1", "M2")),
             *(hypothesis_line(n, r.loc[n]).split("… ")[1] for n in ("M1", "M2")))

    def paired(metric):
        return tuple(round(v, 3) for v in paired_cells(t, metric, (16.0, 0.275), (0.0, 0.325)))
    assert paired("attack_ssim") == (-0.026, -0.029, -0.024)
    assert paired("test_acc") == (0.008, -0.007, 0.024)
    p = t.pivot_table(index="config.seed", columns=["config.cem.lambd", "config.defense.noise_std"], values="test_acc")
    d = p[(16.0, 0.275)] - p[(0.0, 0.325)]
    assert (round(d.std(), 3), round(d.min(), 3), round(d.max(), 3)) == (0.054, -0.092, 0.175)
    doc_says("docs/estimators.md", "gmm at λ 16 is 0.026 more private (0.024–0.029)", "(+0.8, −0.7 to +2.4)",
             "The paired accuracy difference spread 5.4 points here** (−9.2 to +17.5 over seeds)",
             "gmm's σ 0.275 cell 0.872 / 0.873", "noise alone at σ 0.325 0.864 / 0.899")
    doc_says("README.md", "yes, on 48 new seeds (asked again, the two cells alone): 0.026 more private (0.024–0.029) and "
             "not less accurate by 2 points (+0.8, −0.7 to +2.4; adjusted p 0.00035)",
             "λ 16 at σ 0.275, which is 0.026 more private (0.024–0.029) than noise alone at the σ of its mean accuracy "
             "and as accurate within 2 points (+0.8, −0.7 to +2.4; 48 new seeds")
