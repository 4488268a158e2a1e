"""Replicates aggregated per configuration (configs.parquet) and the paper-style table (cem-bench table)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cem_bench.analysis.aggregate import build_configs, config_ids
from cem_bench.analysis.table import paper_table
from cem_bench.cli import main

OBJ = [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}]


def runs() -> pd.DataFrame:
    """Three configurations x three seeds: the baseline at two sigmas and gmm at one; one gmm run errored."""
    rng = np.random.default_rng(0)
    rows = []
    for sigma, lam, surr in ((0.1, 0.0, "gmm"), (0.01, 0.0, "gmm"), (0.1, 16.0, "gmm")):
        for seed in (0, 1, 2):
            ok = not (lam == 16 and seed == 2)
            rows.append({"trial_id": f"t{len(rows)}", "status": "ok" if ok else "error",
                         "test_acc": rng.uniform(0.6, 0.9) if ok else np.nan,
                         "attack_ssim": rng.uniform(0.2, 0.7) if ok else np.nan,
                         "config.seed": seed, "config.defense.noise_std": sigma, "config.cem.lambd": lam,
                         "config.cem.surrogate": surr, "config.train.milestones": np.array([0.5])})
    return pd.DataFrame(rows)


def test_how_a_run_ran_does_not_make_another_configuration():
    """A resumed search may read its data from another folder or run on another device (search/run.py allows
    those keys to change): its runs of one configuration stay one configuration, with all their seeds, as a
    baseline differing only in them stays a baseline (schema.EXECUTION_KEYS). Any other key still splits."""
    t = runs()
    t["config.data.root"] = np.where(t["config.seed"] == 2, "/elsewhere", "~/data")
    t["config.train.device"] = np.where(t["config.seed"] == 0, "cuda", "cpu")
    assert config_ids(t).nunique() == 3
    c = build_configs(t, OBJ)
    assert sorted(c["runs"]) == [3, 3, 3]
    t["config.train.epochs"] = np.where(t["config.seed"] == 2, 10, 8)   # what the runs compute: split
    assert config_ids(t).nunique() == 6


def test_configs_aggregate_the_runs_of_each_configuration():
    t = runs()
    ids = config_ids(t)
    assert ids.nunique() == 3 and (ids.groupby(t["config.defense.noise_std"].astype(str)
                                               + t["config.cem.lambd"].astype(str)).nunique() == 1).all()
    c = build_configs(t, OBJ).set_index("config_id")
    for cid, group in t.assign(config_id=ids).groupby("config_id"):
        ok = group[group["status"] == "ok"]
        row = c.loc[cid]
        assert row["runs"] == len(group) and row["runs_ok"] == len(ok)
        assert list(row["seeds"]) == sorted(ok["config.seed"])   # the seeds of the runs the statistics use
        for m in ("test_acc", "attack_ssim"):
            v = ok[m].to_numpy()
            assert row[f"{m}_mean"] == pytest.approx(v.mean())
            assert row[f"{m}_std"] == pytest.approx(np.std(v, ddof=1))
            half = stats.t.ppf(0.975, len(v) - 1) * np.std(v, ddof=1) / math.sqrt(len(v))
            assert row[f"{m}_ci95"] == pytest.approx(half)
    # the front is computed on the means
    means = c[["test_acc_mean", "attack_ssim_mean"]].to_numpy()
    on_front = [i for i in range(3) if not any((means[j, 0] >= means[i, 0]) and (means[j, 1] <= means[i, 1])
                                               and (means[j] != means[i]).any() for j in range(3))]
    assert sorted(np.flatnonzero(c["pareto_rank"].to_numpy() == 0).tolist()) == on_front


def test_a_single_run_has_no_spread():
    t = runs().iloc[[0]]
    c = build_configs(t, OBJ)
    assert c.loc[0, "runs"] == 1 and math.isnan(c.loc[0, "test_acc_std"]) and math.isnan(c.loc[0, "test_acc_ci95"])


def test_paper_table_rows_sigma_columns_lambda_by_surrogate():
    table = paper_table(build_configs(runs(), OBJ), "test_acc")
    assert list(table.index) == ["σ=0.01", "σ=0.1"]
    assert list(table.columns) == ["λ=0", "λ=16 gmm"]
    assert table.loc["σ=0.01", "λ=16 gmm"] == ""                    # that cell was not run
    assert table.loc["σ=0.1", "λ=16 gmm"].endswith("(2)")           # two ok runs of three
    assert " ± " in table.loc["σ=0.1", "λ=0"]


def test_a_cell_several_configurations_share_labels_each_part():
    """Two configurations in one σ × λ × surrogate cell (they differ in cem.num_clusters) printed as
    "0.x ± … / 0.y ± …" with nothing saying which was which; each part now names the keys it differs in."""
    t = runs()
    t["config.cem.num_clusters"] = np.where(t["config.seed"] == 1, 16, 8)
    t.loc[t["config.cem.lambd"] == 0, "config.cem.num_clusters"] = np.nan
    table = paper_table(build_configs(t, OBJ), "test_acc")
    cell = table.loc["σ=0.1", "λ=16 gmm"]
    parts = cell.split(" / ")
    assert len(parts) == 2 and parts[0].startswith("cem.num_clusters=8: ") and parts[1].startswith("cem.num_clusters=16: ")
    assert "cem.num_clusters" not in table.loc["σ=0.1", "λ=0"]       # one configuration: no label


def test_table_command(tmp_path, capsys):
    t = runs()
    t["config.train.milestones"] = [[0.5]] * len(t)
    t.to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| test_acc | λ=0 | λ=16 gmm |" in out and "**attack_ssim**" in out
    assert main(["table", str(tmp_path), "--csv", "--metrics", "attack_ssim"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# attack_ssim") and "σ=0.1," in out
    assert main(["table", str(tmp_path), "--metrics", "nope", "test_acc"]) == 2
    err = capsys.readouterr().err
    # the user's word is named, and the table is not blamed (its advice would delete a good configs.parquet)
    assert "--metrics nope: not in the results" in err and "known: test_acc" in err and "delete" not in err
    assert main(["table", str(tmp_path), "--metrics", "test_acc", "test_acc"]) == 0   # once, not twice
    assert capsys.readouterr().out.count("**test_acc**") == 1
    assert main(["table", str(tmp_path / "missing")]) == 2
    assert "missing: no such folder" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("x")
    assert main(["table", str(tmp_path / "a_file")]) == 2
    assert "a_file is a file, not a folder" in capsys.readouterr().err


def test_table_latex_prints_the_same_cells_as_compilable_ascii(tmp_path, capsys):
    import re

    from cem_bench.analysis.table import latex_text, load_configs
    t = runs()
    t.to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path), "--latex", "--metrics", "test_acc", "attack_ssim"]) == 0
    out = capsys.readouterr().out
    assert out.isascii(), [c for c in out if not c.isascii()]
    floats = out.split("\\end{table}")[:-1]
    assert len(floats) >= 2 and all(f.strip().startswith("\\begin{table}") for f in floats)
    labels = re.findall(r"\\label\{(.*)\}", out)          # tab:<experiment>-<metric>, in what \ref takes
    assert labels[0] == "tab:" + re.sub(r"_+", "-", tmp_path.name) + "-test-acc"
    assert all(re.fullmatch(r"tab:[A-Za-z0-9:.-]+", label) for label in labels) and len(set(labels)) == len(labels)
    configs = load_configs(tmp_path)
    for metric, body in zip(("test_acc", "attack_ssim"), floats):
        table = paper_table(configs, metric)
        rows = [r for r in body.splitlines() if r.endswith(" \\\\")]
        assert len(rows) == len(table) + 1                      # the header, then one row per σ
        for r in rows:                                          # as many cells as the table has columns
            assert len(re.findall(r"(?<!\\)&", r)) == len(table.columns)
        for label, row in table.iterrows():                     # every number the Markdown table prints
            assert " & ".join([latex_text(label)] + [latex_text(v) for v in row]) + " \\\\" in rows
        # braces balance once the escaped ones are set aside
        bare = re.sub(r"\\[{}]", "", body)
        assert bare.count("{") == bare.count("}")
    with pytest.raises(SystemExit) as e:   # one format at a time
        main(["table", str(tmp_path), "--latex", "--csv"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_latex_text_escapes_what_latex_reads_as_commands():
    from cem_bench.analysis.table import latex_text
    assert latex_text("a_b & 50% $#{}~^\\") == \
        r"a\_b \& 50\% \$\#\{\}\textasciitilde{}\textasciicircum{}\textbackslash{}"
    assert latex_text("λ=16 σ=0.1: 0.9 ± 0.1 [−]") == r"$\lambda$=16 $\sigma$=0.1: 0.9 $\pm$ 0.1 [$-$]"
    assert latex_text("run `cem-bench report` then") == r"run \texttt{cem-bench report} then"


def test_the_baseline_is_its_own_row_and_each_configuration_meets_its_own():
    """λ = 0 rows: surrogate "none", the other cem keys null, one configuration per σ whatever surrogate keys
    they recorded; every configuration is compared with the baseline of its σ, even where a key resolved per
    trial differs between the two (train.cuda_graph here); a confirmed configuration is summarised over its
    confirmation runs only, and the same seed twice counts once."""
    rows = []
    for sigma, shift in ((0.05, 0.0), (0.1, 0.1)):
        for seed, surrogate in ((0, "gmm"), (1, "slot_cross"), (2, "gmm"), (2, "gmm")):   # seed 2 twice
            rows.append({"status": "ok", "role": "baseline", "config.seed": seed, "config.defense.noise_std": sigma,
                         "config.cem.lambd": 0.0, "config.cem.surrogate": surrogate, "config.cem.num_clusters": 2,
                         "config.train.cuda_graph": "off", "test_acc": 0.9 + 0.01 * seed,
                         "attack_ssim": 0.7 + shift + 0.01 * seed})
        rows.append({"status": "ok", "role": "search", "config.seed": 0, "config.defense.noise_std": sigma,
                     "config.cem.lambd": 16.0, "config.cem.surrogate": "gmm", "config.cem.num_clusters": 4,
                     "config.train.cuda_graph": "on", "test_acc": 0.95, "attack_ssim": 0.2})   # the lucky run
        for seed in (3, 4, 5):
            rows.append({"status": "ok", "role": "confirm", "config.seed": seed, "config.defense.noise_std": sigma,
                         "config.cem.lambd": 16.0, "config.cem.surrogate": "gmm", "config.cem.num_clusters": 4,
                         "config.train.cuda_graph": "on", "test_acc": 0.9 + 0.01 * (seed - 3),
                         "attack_ssim": 0.5 + shift + 0.01 * (seed - 3)})
    t = pd.DataFrame(rows)
    c = build_configs(t, OBJ).set_index(["role", "config.defense.noise_std"])
    assert sorted(c.index) == [("baseline", 0.05), ("baseline", 0.1), ("confirmed", 0.05), ("confirmed", 0.1)]
    base = c.loc[("baseline", 0.1)]
    assert base["config.cem.surrogate"] == "none" and pd.isna(base["config.cem.num_clusters"])
    # seed 2 once: a repeated seed is one run, never two replicates (issue 39 item 7; this said runs == 4)
    assert base["runs"] == 3 and base["repeats"] == 1 and list(base["seeds"]) == [0, 1, 2]
    assert base["attack_ssim_mean"] == pytest.approx(0.81)
    conf = c.loc[("confirmed", 0.1)]
    assert conf["baseline_id"] == base["config_id"] and conf["runs"] == 4 and list(conf["seeds"]) == [3, 4, 5]
    assert conf["attack_ssim_mean"] == pytest.approx(0.61)                    # not the lucky 0.2
    assert conf["attack_ssim_delta"] == pytest.approx(-0.2) and conf["attack_ssim_verdict"] == "better"
    assert conf["attack_ssim_noise"] == pytest.approx(0.01)
    assert conf["test_acc_verdict"] == "within noise"
    assert bool(c.loc[("confirmed", 0.05), "final_front"]) and not bool(conf["final_front"])   # σ 0.05 dominates it
    assert c.loc[("confirmed", 0.05), "baseline_id"] == c.loc[("baseline", 0.05), "config_id"]


def test_a_configuration_whose_runs_ran_on_several_devices_keeps_its_baseline():
    """An execution key (schema.EXECUTION_KEYS) that varies among the runs does not split a configuration, so it
    must not pick the baseline either: the baseline ran on the CPU, the configuration's runs on the GPU and,
    after a resume, the CPU; it is still compared with that baseline (it had none)."""
    t = runs()
    t = t[t["config.defense.noise_std"] == 0.1].copy()
    t["status"] = "ok"
    t["test_acc"], t["attack_ssim"] = t["test_acc"].fillna(0.7), t["attack_ssim"].fillna(0.4)
    base = t["config.cem.lambd"] == 0
    t["config.train.device"] = np.where(base, "cpu", np.where(t["config.seed"] < 2, "cuda", "cpu"))
    c = build_configs(t, OBJ).set_index("role")
    assert c.loc["search", "baseline_id"] == c.loc["baseline", "config_id"]
    assert np.isfinite(c.loc["search", "test_acc_p"])
    t["config.train.epochs"] = np.where(base, 10, 8)       # a key that changes what runs compute still splits
    c = build_configs(t, OBJ).set_index("role")
    assert pd.isna(c.loc["search", "baseline_id"])


def test_a_trials_table_without_an_objective_column_is_tabled_without_a_traceback(tmp_path, capsys):
    """An older or hand-made trials.parquet without an objective's column: no value of it (NaN), the other
    metrics tabled, and the legend says why that table claims nothing."""
    t = runs().drop(columns=["test_acc"])
    c = build_configs(t, OBJ)
    assert c["test_acc_mean"].isna().all() and (c["pareto_rank"] == -1).all()
    t["config.train.milestones"] = [[0.5]] * len(t)
    t.to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "No run has a value of test_acc" in out and "**attack_ssim**" in out


def test_a_table_error_names_the_file_it_read(tmp_path, capsys):
    """A trials.parquet without σ, and no configs.parquet: the message names trials.parquet and says what is
    missing, not "delete configs.parquet" (there is none)."""
    t = runs().drop(columns=["config.defense.noise_std"])
    t["config.train.milestones"] = [[0.5]] * len(t)
    t.to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "trials.parquet" in err and "config.defense.noise_std" in err
    assert "configs.parquet" not in err and "delete" not in err


def test_the_table_rebuilds_a_configs_table_that_is_not_about_the_trials_beside_it(tmp_path, capsys):
    """configs.parquet written before the search went on (or before trials.parquet was filtered): the table
    prints the trials' numbers, as the report does, not the stale ones."""
    t = runs()
    t["config.train.milestones"] = [[0.5]] * len(t)
    t["config_id"] = config_ids(t)
    build_configs(t, OBJ).to_parquet(tmp_path / "configs.parquet")
    more = t[(t["config.cem.lambd"] == 16.0) & (t["status"] == "ok")].copy()
    more["config.seed"] += 10
    more["attack_ssim"] = 0.05
    t = pd.concat([t, more], ignore_index=True)
    t.to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path), "--csv", "--metrics", "attack_ssim"]) == 0
    out = capsys.readouterr().out
    fresh = build_configs(t, OBJ).set_index("config.cem.lambd").loc[16.0]
    assert f"({int(fresh['attack_ssim_n'])})" in out and fresh["attack_ssim_n"] == 4
    assert f"{fresh['attack_ssim_mean']:.3f}" in out


def test_a_configuration_with_no_finished_run_makes_no_row(tmp_path, capsys):
    """An interrupted search's in-flight sample (no result, no σ of its own) made a row "σ=?" and a column of
    dashes in `table` and the report's paper-style table (2026-12-06 audit)."""
    t = runs()
    t["config.train.milestones"] = [[0.5]] * len(t)
    lone = t.iloc[[0]].copy()
    lone["status"], lone["trial_id"], lone["config.cem.lambd"] = "interrupted", "lone", 31.3325
    lone["config.defense.noise_std"] = None
    for m in ("test_acc", "attack_ssim", "attack_psnr", "attack_mse"):
        lone[m] = None
    pd.concat([t, lone], ignore_index=True).to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "σ=?" not in out and "31.3" not in out, out
    c = build_configs(pd.concat([t, lone], ignore_index=True), OBJ)
    assert len(c) == len(build_configs(t, OBJ)) + 1          # configs.parquet keeps it (runs_ok 0)
    assert "λ=31.3325 gmm" not in paper_table(c, "test_acc").columns


@pytest.mark.skipif(__import__("shutil").which("pdflatex") is None, reason="no pdflatex on this machine")
def test_table_latex_compiles(tmp_path, capsys):
    import subprocess
    t = runs()
    t.to_parquet(tmp_path / "trials.parquet")
    assert main(["table", str(tmp_path), "--latex"]) == 0
    (tmp_path / "t.tex").write_text(capsys.readouterr().out)
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\\input{t.tex}"
                                      "\\clearpage\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 0


def test_one_attacks_own_column_prints_its_metrics_decimals():
    """The paper's decimals (PSNR 2, MSE 4, the rest 3; docs/protocol.md) for one attack's own column too: the
    README's table "in the paper's conventions" (attack_psnr_batch__decoder) printed 3 until 2026-12-07."""
    from cem_bench.analysis.table import _digits
    assert [_digits(m) for m in ("attack_psnr", "attack_psnr__decoder", "attack_psnr_batch",
                                 "attack_psnr_batch__decoder")] == [2, 2, 2, 2]
    assert [_digits(m) for m in ("attack_mse", "attack_mse__rmle")] == [4, 4]
    assert [_digits(m) for m in ("attack_ssim", "attack_ssim_paper__decoder", "test_acc")] == [3, 3, 3]
