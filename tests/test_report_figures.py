"""The report's figures on the shapes that broke them: a σ grid's many noise bands and a long experiment name (the
legend and the margins), a confirmed front (what the plot, frontier.csv, the galleries and the training curves
call the front), a λ curve along which another key varies, an infinite metric, three objectives, and a noise
band of a metric that cannot be negative."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imsave
from test_report import THREE_OBJECTIVES, write_results

from cem_bench.analysis.report import build_report, frontier_figure, load_results
from cem_bench.analysis.report.formatting import format_value
from cem_bench.analysis.report.frontier_plot import baseline_bands
from cem_bench.analysis.report.load import BASELINE_LABEL, numeric
from cem_bench.analysis.report.plots import fit_margins
from cem_bench.schema import rank_table

SURROGATES5 = ["gmm", "gated_attention", "slot_cross", "attention_centroid", "serial_enhanced"]
SIGMAS = [0.01, 0.025, 0.05, 0.1, 0.15]


def _rows_to(root: Path, rows: list[dict], objectives=None, name: str = "fig") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(root / "trials.parquet")
    spec = {"name": name, **({"objectives": objectives} if objectives else {})}
    (root / "search_space.json").write_text(json.dumps(spec))
    return root


def paper_grid(root: Path) -> Path:
    """cifar10_paper.yaml's shape: 5 σ x 3 seeds x (λ=0, and λ 8 and 16 for 5 surrogates)."""
    rng = np.random.default_rng(0)
    rows = []
    for sigma in SIGMAS:
        for seed in (125, 126, 127):
            for sur, lam in [(None, 0.0)] + [(s, lam) for s in SURROGATES5 for lam in (8.0, 16.0)]:
                st = np.log1p(lam) / np.log(65)
                rows.append({"trial_id": f"t{len(rows):03d}", "status": "ok", "config.seed": seed,
                             "config.defense.noise_std": sigma, "config.cem.lambd": lam, "config.cem.surrogate": sur,
                             "test_acc": 0.92 - 0.08 * st - 0.5 * sigma + rng.normal(0, 0.01),
                             "attack_ssim": 0.85 - 0.5 * st - 2 * sigma + rng.normal(0, 0.02),
                             "attack_mse": 0.01 + 0.05 * st + rng.normal(0, 0.003)})
    return _rows_to(root, rows, name="cifar10_paper")


def _legend(fig) -> tuple[list[str], object]:
    leg = fig.axes[0].get_legend()
    return [t.get_text().replace("\n", " ") for t in leg.get_texts()], leg


def _inside_and_clear(fig) -> None:
    """The legend lies inside the image and under the axes (never over a point), the axes keep a usable size."""
    fit_margins(fig)
    r = fig.canvas.get_renderer()
    (_, leg), ax = _legend(fig), fig.axes[0]
    box, axes_box = leg.get_window_extent(r), ax.get_window_extent(r)
    assert leg.get_gid() == "legend-below"   # plots.BELOW
    assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
    assert box.y1 < axes_box.y0                     # below the axes: it covers no data
    assert axes_box.width > 0.3 * fig.bbox.width and axes_box.height > 0.3 * (fig.bbox.height - box.height)


def test_a_sigma_grid_renders_one_legend_entry_per_band_named_by_its_sigma(tmp_path):
    """The paper grid's 5 λ=0 baselines with replicates made one legend line of every band's range, wider than
    the figure: fit_margins set left >= right and `cem-bench report` stopped with a ValueError. Each band is now
    its own entry, named by its σ, under the axes."""
    root = paper_grid(tmp_path / "grid")
    index = build_report(root)
    assert (index.parent / "frontier_attack_ssim.png").is_file()
    res = load_results(root)
    for metric, mode in (("attack_ssim", "min"), ("attack_mse", "max")):
        fig = frontier_figure(res, metric, mode)
        texts, _ = _legend(fig)
        bands = [t for t in texts if t.startswith("λ=0 baseline σ=")]
        assert len(bands) == len(SIGMAS)
        for sigma, text in zip(SIGMAS, bands):
            assert text.startswith(f"λ=0 baseline σ={sigma:g}: test_acc ") and f", {metric} " in text, text
        _inside_and_clear(fig)


def _noise_alone_lines(fig) -> list[np.ndarray]:
    return [np.column_stack(line.get_data()) for line in fig.axes[0].get_lines() if line.get_gid() == "noise-alone"]


def test_noise_alone_is_drawn_through_the_lambda_0_means_in_sigma_order(tmp_path):
    """The comparison a defense has to win (docs/estimators.md, "beyond noise alone"): the λ = 0 configurations'
    means joined in σ order, one curve per set of the other keys outside cem. (here two data sets), each cross
    named by its σ; a key that σ alone decides (attack.rmle_tv_weight's default) splits nothing; one σ draws
    none."""
    rows = pd.read_parquet(paper_grid(tmp_path / "grid") / "trials.parquet").to_dict("records")
    for r in rows:
        r["config.attack.rmle_tv_weight"] = 1.0 / r["config.defense.noise_std"]    # follows σ, as the default does
    other = [{**r, "trial_id": "d" + r["trial_id"], "config.data.dataset": "digits",
              "test_acc": r["test_acc"] - 0.2} for r in rows]
    for r in rows:
        r["config.data.dataset"] = "photos"
    root = _rows_to(tmp_path / "two", rows + other)
    res = load_results(root)
    fig = frontier_figure(res, "attack_ssim", "min")
    lines = _noise_alone_lines(fig)
    assert len(lines) == 2
    means = res.configs[res.configs["config.cem.lambd"] == 0].groupby(
        ["config.data.dataset", "config.defense.noise_std"])[["test_acc", "attack_ssim"]].mean()
    for data_set in ("digits", "photos"):
        want = means.loc[data_set].sort_index().to_numpy()
        assert any(line.shape == want.shape and np.allclose(line, want) for line in lines), data_set
    texts, _ = _legend(fig)
    assert texts.count("noise alone: λ=0 over σ (its means, joined in σ order)") == 1
    named = sorted(t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("σ="))
    assert named == sorted(f"σ={format_value(s)}" for s in SIGMAS for _ in range(2))
    _inside_and_clear(fig)
    one_sigma = _rows_to(tmp_path / "one", [r for r in rows if r["config.defense.noise_std"] == 0.05])
    assert _noise_alone_lines(frontier_figure(load_results(one_sigma), "attack_ssim", "min")) == []


def test_a_long_experiment_name_renders_with_its_title_inside_the_image(tmp_path):
    """An experiment name of 90 characters or more stopped the report (the title alone was wider than the
    figure): the name is cut, the title wrapped, and the axes keep their width."""
    root = write_results(tmp_path / "long", n=5, baseline=1, errors=0, vary_params=False, epochs=False, recon=False)
    spec = json.loads((root / "search_space.json").read_text())
    spec["name"] = "x" * 120
    (root / "search_space.json").write_text(json.dumps(spec))
    assert (build_report(root).parent / "frontier_attack_ssim.png").is_file()
    fig = frontier_figure(load_results(root), "attack_ssim", "min")
    _inside_and_clear(fig)
    r, ax = fig.canvas.get_renderer(), fig.axes[0]
    title = ax.title.get_window_extent(r)
    assert title.x0 >= 0 and title.x1 <= fig.bbox.width and "…" in ax.get_title()


def test_fit_margins_keeps_the_axes_when_a_label_is_wider_than_the_figure():
    """A label no margin can hold: the panel keeps a share of the figure instead of a ValueError."""
    from cem_bench.analysis.report.plots import new_figure
    fig = new_figure(4.0, 3.0)
    ax = fig.add_subplot()
    ax.set_ylabel("y" * 400)
    ax.set_xlabel("x" * 400)
    fit_margins(fig)
    sp = fig.subplotpars
    assert sp.right - sp.left >= 0.29 and sp.top - sp.bottom >= 0.29


# ---------------------------------------------------------------- the confirmed front
def confirmed_search(root: Path) -> Path:
    """A baseline of 3 seeds; gmm λ=32 and slot_cross λ=8 searched once and confirmed with 3 new seeds each (gmm
    looked better on its search run than on its confirmation); gated_attention λ=4, never confirmed, best on
    its one lucky run. Each trial has a recon.png and epochs."""
    rows, epochs = [], []

    def row(sur, lam, seed, role, acc, ssim):
        tid = f"t{len(rows):03d}"
        rows.append({"trial_id": tid, "status": "ok", "role": role, "config.seed": seed, "trial_dir": f"exp/{tid}",
                     "config.defense.noise_std": 0.1, "config.cem.lambd": lam, "config.cem.surrogate": sur,
                     "test_acc": acc, "attack_ssim": ssim, "wall_s": 10.0,
                     "finished_at": (pd.Timestamp("2026-01-01T00:00:00Z") + pd.Timedelta(minutes=len(rows))
                                     ).isoformat()})
        (root / "exp" / tid).mkdir(parents=True)
        imsave(root / "exp" / tid / "recon.png", np.random.default_rng(len(rows)).random((8, 16, 3)))
        epochs.extend({"trial_id": tid, "epoch": e, "test_acc": acc * e / 2, "feature_spread": 1.0 / e}
                      for e in (1, 2))

    for s, (a, b) in enumerate([(0.90, 0.75), (0.91, 0.76), (0.89, 0.74)]):
        row(None, 0.0, s, "baseline", a, b)
    row("gmm", 32.0, 0, "search", 0.90, 0.40)
    row("slot_cross", 8.0, 0, "search", 0.90, 0.50)
    row("gated_attention", 4.0, 0, "search", 0.895, 0.45)
    for s in (3, 4, 5):
        row("gmm", 32.0, s, "confirm", 0.86 + 0.005 * s, 0.60 + 0.01 * s)
        row("slot_cross", 8.0, s, "confirm", 0.87, 0.62 + 0.01 * s)
    pd.DataFrame(epochs).to_parquet(root / "epochs.parquet")
    return _rows_to(root, rows, THREE_OBJECTIVES[:2], name="conf")


def test_with_confirmation_every_front_on_the_page_is_the_confirmed_one(tmp_path, monkeypatch):
    """The table listed the confirmed front (the baseline and gmm, on the means of their confirmation runs)
    while the plot's front, frontier.csv, the galleries and the training curves showed the front of every
    configuration, led by a lucky run never confirmed (docs/protocol.md §8). All of them now show the confirmed
    front, and the unconfirmed configuration is drawn apart as "not confirmed"."""
    from cem_bench.analysis.report import training_plot

    root = confirmed_search(tmp_path / "conf")
    res = load_results(root)
    assert res.confirmed
    front = res.front_configs
    assert sorted(front["_label"]) == ["gmm", "λ=0 baseline"]
    trials = res.trials.set_index("trial_id")
    # the runs behind the confirmed front: the baseline's and gmm's confirmation runs, not its search run
    want = set(trials[(trials["role"] == "baseline") | ((trials["role"] == "confirm")
                                                         & (trials["config.cem.surrogate"] == "gmm"))].index)

    fig = frontier_figure(res, "attack_ssim", "min")
    ax = fig.axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == "front"]
    drawn = {(round(x, 9), round(y, 9)) for x, y in line.get_xydata()}
    assert drawn == {(round(a, 9), round(s, 9)) for a, s in zip(front["test_acc"], front["attack_ssim"])}
    (ring,) = [c for c in ax.collections if c.get_gid() == "page-front"]
    assert {tuple(np.round(p, 9)) for p in ring.get_offsets()} == drawn
    # the baseline is on this front: its cross is drawn over the front's line and ring, not hidden under them
    cross = [ln for ln in ax.get_lines() if ln.get_gid() == "baseline"]   # its marker and its bars' caps
    assert cross and min(ln.get_zorder() for ln in cross) > max(line.get_zorder(), ring.get_zorder())
    texts, _ = _legend(fig)
    assert "confirmed front (baseline and confirmed means)" in texts
    assert any(t.startswith("not confirmed (1 configuration") for t in texts)
    assert [c.get_label() for c in ax.containers if "not confirmed" in c.get_label()] == [
        "gated_attention (not confirmed)"]

    curves = {}
    real_save = training_plot.save

    def keep(fig, path):
        curves["labels"] = {t.get_text().split(" ")[0] for t in fig.axes[-1].get_legend().get_texts()}
        curves["title"] = fig._suptitle.get_text()
        return real_save(fig, path)

    monkeypatch.setattr(training_plot, "save", keep)
    index = build_report(root)
    text = index.read_text(encoding="utf-8")
    assert set(pd.read_csv(index.parent / "frontier.csv")["trial_id"]) == want
    gallery = text[text.index('id="galleries"'):text.index('id="front-table"')]
    assert {p.stem for p in (index.parent / "galleries").glob("*.png")} == want
    assert all(f"galleries/{t}.png" in gallery for t in want)
    assert curves["labels"] == want and "confirmed front" in curves["title"]
    assert "Training curves of the confirmed front" in text


def test_with_replicates_the_front_s_files_are_the_runs_of_the_front_s_configurations(tmp_path):
    """With replicates and no confirmation, the table and plot state the front of the configurations' means,
    while frontier.csv, the galleries and the training curves took the front of single trials: gated_attention's
    one lucky run (its mean far off the front) was there, and the front's configurations' other runs were not."""
    rows = []

    def row(sur, lam, seed, acc, ssim):
        tid = f"t{len(rows):03d}"
        rows.append({"trial_id": tid, "status": "ok", "role": "baseline" if lam == 0 else "search",
                     "config.seed": seed, "trial_dir": f"exp/{tid}", "config.defense.noise_std": 0.1,
                     "config.cem.lambd": lam, "config.cem.surrogate": sur, "test_acc": acc, "attack_ssim": ssim,
                     "wall_s": 10.0, "finished_at": (pd.Timestamp("2026-01-01T00:00:00Z")
                                                     + pd.Timedelta(minutes=len(rows))).isoformat()})
        (tmp_path / "exp" / tid).mkdir(parents=True)
        imsave(tmp_path / "exp" / tid / "recon.png", np.random.default_rng(len(rows)).random((8, 16, 3)))

    for s, (a, b) in enumerate([(0.90, 0.75), (0.91, 0.76), (0.89, 0.74)]):
        row(None, 0.0, s, a, b)
    for s, (a, b) in enumerate([(0.88, 0.60), (0.87, 0.61), (0.88, 0.62)]):
        row("gmm", 32.0, s, a, b)
    for s, (a, b) in enumerate([(0.905, 0.30), (0.70, 0.80), (0.70, 0.80)]):   # one lucky run, a poor mean
        row("gated_attention", 4.0, s, a, b)
    root = _rows_to(tmp_path, rows, THREE_OBJECTIVES[:2], name="reps")
    res = load_results(root)
    assert res.replicated and not res.confirmed
    assert sorted(res.front_configs["_label"]) == ["gmm", "λ=0 baseline"]
    trials = res.trials.set_index("trial_id")
    want = set(trials[trials["config.cem.surrogate"].fillna("none").isin(["none", "gmm"])].index)
    index = build_report(root)
    assert set(pd.read_csv(index.parent / "frontier.csv")["trial_id"]) == want
    assert {p.stem for p in (index.parent / "galleries").glob("*.png")} == want
    # each configuration's best run first, then the second ones: the curves and galleries show the first rows,
    # which in configuration order were the first configurations' runs alone
    order = res.front_trials["_label"].tolist()
    assert sorted(order[:2]) == ["gmm", "λ=0 baseline"] and sorted(order[2:4]) == ["gmm", "λ=0 baseline"]


# ---------------------------------------------------------------- λ curves
def _sweep(root: Path, extra_rows=()) -> Path:
    """gmm over λ 2, 8 with everything else fixed; slot_cross at λ 2 with 2 slots and λ 8 with 8 slots."""
    rows = []

    def run(sur, lam, slots, s, acc, ssim):
        rows.append({"trial_id": f"t{len(rows):03d}", "status": "ok", "config.seed": s,
                     "config.defense.noise_std": 0.1, "config.cem.lambd": lam, "config.cem.surrogate": sur,
                     "config.cem.num_slots": slots, "test_acc": acc, "attack_ssim": ssim, "feature_spread": 0.1})
    for s in range(3):
        run(None, 0.0, None, s, 0.9, 0.8)
        run("gmm", 2.0, None, s, 0.88, 0.6)
        run("gmm", 8.0, None, s, 0.86, 0.5)
        run("slot_cross", 2.0, 2.0, s, 0.85, 0.5)
        run("slot_cross", 8.0, 8.0, s, 0.89, 0.7)
        for lam, acc, ssim in extra_rows:
            run("gated_attention", lam, None, s, acc, ssim)
    return _rows_to(root, rows, name="sweep")


def test_a_lambda_curve_is_drawn_only_where_lambda_alone_varies(tmp_path):
    """slot_cross's num_slots changes with λ: its "curve" joined λ=2 with 2 slots to λ=8 with 8 slots as if λ
    alone moved. It gets no curve and the page says why; gmm's, and the page's figure, stay. A surrogate with
    more λ values than a grid has (a random search's draws) gets none either."""
    from cem_bench.analysis.report.lambda_plot import lambda_curves

    many = [(float(2 ** (k / 3)), 0.87, 0.6) for k in range(21)]   # lambda_plot.MAX_CURVE_LAMBDAS + 1
    root = _sweep(tmp_path / "sweep", many)
    res = load_results(root)
    cfg = lambda_curves(res)
    assert cfg is not None
    assert sorted(set(cfg["_label"])) == ["gmm", "λ=0 baseline"]
    from cem_bench.analysis.report.lambda_plot import MAX_CURVE_LAMBDAS, lambda_curves_note
    assert MAX_CURVE_LAMBDAS == 20
    note = lambda_curves_note(res)
    assert "slot_cross: cem.num_slots also varies along its λ values" in note
    assert "gated_attention: its 21 λ values are not a grid" in note
    text = build_report(root).read_text(encoding="utf-8")
    assert 'src="lambda_curves.png"' in text and "cem.num_slots also varies" in text
    # slot_cross alone: no curve at all
    alone = _sweep(tmp_path / "alone")
    pd.read_parquet(alone / "trials.parquet").query("`config.cem.surrogate` != 'gmm'").to_parquet(
        alone / "trials.parquet")
    assert lambda_curves(load_results(alone)) is None


def test_a_sigma_grid_draws_a_row_of_lambda_curves_per_sigma_from_its_own_baseline(tmp_path, monkeypatch):
    """cifar10_paper.yaml's grid (σ x λ x surrogate) drew no λ curve at all: σ "also varied along its λ
    values". Each σ's curves now start from that σ's baseline, a row of panels per σ; a σ with one λ > 0 gets
    no curve and the note says where."""
    from cem_bench.analysis.report.lambda_plot import lambda_curves, lambda_curves_note, plot_lambda_curves

    root = paper_grid(tmp_path / "grid")
    res = load_results(root)
    cfg = lambda_curves(res)
    assert cfg is not None
    assert lambda_curves_note(res) is None
    configs = res.configs.set_index("config_id")
    drawn = cfg[cfg["_lam"] > 0]
    assert len(drawn) == len(SIGMAS) * len(SURROGATES5) * 2
    sigma_of = numeric(configs["config.defense.noise_std"])
    # every curve starts from the baseline of its own σ
    for cid, base in zip(drawn["config_id"], drawn["_base"]):
        assert numeric(configs["config.cem.lambd"])[base] == 0
        assert sigma_of[base] == sigma_of[cid]
    fig_path = plot_lambda_curves(res, tmp_path / "curves.png")
    assert fig_path.is_file()
    text = build_report(root).read_text(encoding="utf-8")
    assert 'src="lambda_curves.png"' in text

    # the figure: a row per σ, titled by it; gmm's attack_ssim line on each row starts at its σ's baseline mean
    from cem_bench.analysis.report import lambda_plot
    drawn_figs = []
    monkeypatch.setattr(lambda_plot, "save", lambda fig, path: drawn_figs.append(fig) or path)
    lambda_plot.plot_lambda_curves(res, tmp_path / "again.png")
    (fig,) = drawn_figs
    # the rows stay apart: a row's x label above the next row's title, the first row's titles under the figure's
    fit_margins(fig)
    r = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(r) for ax in fig.axes]
    n_cols = fig.axes[0].get_subplotspec().get_gridspec().ncols
    for above, below in zip(boxes, boxes[n_cols:]):
        assert above.y0 > below.y1
    assert max(b.y1 for b in boxes[:n_cols]) < fig._suptitle.get_window_extent(r).y0
    # and keep their width: the panels of one row were once taken for neighbours of the next row's
    assert all(ax.get_position().width > 0.5 / n_cols for ax in fig.axes)
    panels = [ax for ax in fig.axes if ax.get_xlabel()]
    n_metrics = len(panels) // len(SIGMAS)
    assert len(panels) == len(SIGMAS) * n_metrics and n_metrics >= 2
    base_ssim = {float(sigma_of[b]): float(configs.loc[b, "attack_ssim_mean"]) for b in set(drawn["_base"])}
    for r, sigma in enumerate(sorted(SIGMAS)):
        row = panels[r * n_metrics:(r + 1) * n_metrics]
        assert {ax.get_title() for ax in row} == {f"σ={format_value(sigma)}"}
        ssim_ax = next(ax for ax in row if ax.get_ylabel().startswith("attack_ssim"))
        (gmm,) = [c for c in ssim_ax.containers if c.get_label() == "gmm"]
        xs, ys = gmm.lines[0].get_data()
        assert xs[0] == 0 and ys[0] == pytest.approx(base_ssim[sigma])

    # the largest σ with λ 16 only: its curves are left out, the others stay, and the note says where
    t = pd.read_parquet(root / "trials.parquet")
    top = max(SIGMAS)
    t = t[~((t["config.defense.noise_std"] == top) & (t["config.cem.lambd"] == 8.0))]
    part = _rows_to(tmp_path / "part", t.to_dict("records"), name="part")
    res = load_results(part)
    cfg = lambda_curves(res)
    assert set(numeric(cfg["config.defense.noise_std"])) == set(SIGMAS) - {top}
    note = lambda_curves_note(res)
    assert f"gmm: one λ only at defense.noise_std={format_value(top)}" in note

    # σ drawn, not gridded (25 values along gmm's two λ): no curve for it, and no pass over each value
    from cem_bench.analysis.report.lambda_plot import MAX_CURVES
    rows = []
    for seed in (0, 1):
        for sur, lam, sigma in [(None, 0.0, 0.1), ("slot_cross", 2.0, 0.1), ("slot_cross", 8.0, 0.1),
                                *[("gmm", lam, 0.01 * (k + 1)) for k in range(MAX_CURVES + 1) for lam in (2.0, 8.0)]]:
            rows.append({"trial_id": f"t{len(rows):03d}", "status": "ok", "config.seed": seed,
                         "config.defense.noise_std": sigma, "config.cem.lambd": lam, "config.cem.surrogate": sur,
                         "test_acc": 0.9 - 0.01 * lam, "attack_ssim": 0.8 - 0.01 * lam + 0.01 * seed})
    res = load_results(_rows_to(tmp_path / "drawn", rows, name="drawn"))
    assert set(lambda_curves(res)["_label"]) == {"slot_cross", "λ=0 baseline"}
    assert (f"gmm: defense.noise_std takes {MAX_CURVES + 1} values along its λ values (a curve each: more than "
            f"{MAX_CURVES})") in lambda_curves_note(res)


def test_a_sigma_grid_crossed_with_slot_counts_names_each_curve_by_its_slots_once(tmp_path, monkeypatch):
    """σ x λ x num_slots: a curve's label repeated the σ its row's title already names ("slot_cross
    (defense.noise_std=0.05, cem.num_slots=2)"), a legend entry per σ and slot count, and its line style
    came from its rank on that row. The label now names the slot count alone, one legend entry and one
    style per slot count across the rows."""
    from cem_bench.analysis.report import lambda_plot

    rows = []
    for sigma in (0.05, 0.1):
        for seed in (0, 1):
            cells = [(None, 0.0, None)] + [("gmm", lam, None) for lam in (2.0, 8.0)] + [
                ("slot_cross", lam, k) for k in (2, 8) for lam in (2.0, 8.0)]
            for sur, lam, slots in cells:
                rows.append({"trial_id": f"t{len(rows):03d}", "status": "ok", "config.seed": seed,
                             "config.defense.noise_std": sigma, "config.cem.lambd": lam, "config.cem.surrogate": sur,
                             "config.cem.num_slots": slots, "test_acc": 0.9 - 0.01 * lam - sigma,
                             "attack_ssim": 0.8 - 0.01 * lam - 0.001 * (slots or 0) + 0.01 * seed - sigma})
    res = load_results(_rows_to(tmp_path / "slots", rows, name="slots"))
    cfg = lambda_plot.lambda_curves(res)
    assert set(cfg.loc[cfg["_lam"] > 0, "_curve_label"]) == {"", "cem.num_slots=2", "cem.num_slots=8"}
    drawn_figs = []
    monkeypatch.setattr(lambda_plot, "save", lambda fig, path: drawn_figs.append(fig) or path)
    lambda_plot.plot_lambda_curves(res, tmp_path / "curves.png")
    (fig,) = drawn_figs
    (leg,) = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    texts = [t.get_text().replace("\n", " ") for t in leg.get_texts()]
    assert sorted(texts) == sorted(["gmm", "slot_cross (cem.num_slots=2)", "slot_cross (cem.num_slots=8)",
                                    BASELINE_LABEL])
    style: dict[str, set] = {}
    for ax in fig.axes:
        for c in ax.containers:
            style.setdefault(c.get_label(), set()).add(c.lines[0].get_linestyle())
    assert len(style["slot_cross (cem.num_slots=2)"]) == 1 and len(style["slot_cross (cem.num_slots=8)"]) == 1
    assert style["slot_cross (cem.num_slots=2)"] != style["slot_cross (cem.num_slots=8)"]


# ---------------------------------------------------------------- infinite metrics
def test_an_infinite_objective_is_on_no_front(tmp_path):
    """A diverged attack's MSE of inf was ranked as the best MSE: the table's front held a trial that no plot
    drew and no mean counted. rank_table (the writer's, and the report's for an older table) now treats ±inf as
    missing, like build_configs."""
    objectives = [THREE_OBJECTIVES[0], THREE_OBJECTIVES[2]]   # test_acc max, attack_mse max
    table = pd.DataFrame({"status": "ok", "test_acc": [0.9, 0.8, 0.85], "attack_mse": [0.01, 0.02, np.inf]})
    assert rank_table(table, objectives).tolist() == [0, 0, -1]
    assert rank_table(table.assign(attack_mse=[0.01, 0.02, -np.inf]), objectives).tolist() == [0, 0, -1]

    root = write_results(tmp_path / "inf", n=10, baseline=1, errors=0, nan_ok=False, objectives=objectives,
                         vary_params=False, epochs=False, recon=False)
    t = pd.read_parquet(root / "trials.parquet")
    t.loc[3, "attack_mse"] = np.inf
    t.to_parquet(root / "trials.parquet")
    res = load_results(root)
    assert "t003" not in set(res.front["trial_id"])
    fig = frontier_figure(res, "attack_mse", "max")
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "front"]
    front = res.front
    assert {(round(a, 9), round(m, 9)) for a, m in line.get_xydata()} == {
        (round(a, 9), round(m, 9)) for a, m in zip(front["test_acc"], front["attack_mse"])}

    from cem_bench.analysis.results import final_trials  # the search's writer ranks with the same function
    written = final_trials(t.drop(columns="pareto_rank"), objectives).set_index("trial_id")
    assert written.loc["t003", "pareto_rank"] == -1


# ---------------------------------------------------------------- three objectives
def test_a_plot_of_two_of_three_objectives_names_its_front_and_marks_the_pages(tmp_path):
    """With three objectives each plot drew the front of its two metrics as "front (all trials)", which is not
    the page's front. Its line is now the front of the two metrics alone, so labelled, and the page's front
    (all three objectives) is ringed."""
    root = write_results(tmp_path / "three", baseline=1, objectives=THREE_OBJECTIVES, vary_params=False, seed=3,
                         epochs=False, recon=False)   # one run per configuration: a point per trial
    res = load_results(root)
    assert not res.replicated
    page = res.front
    for metric, mode in (("attack_ssim", "min"), ("attack_mse", "max")):
        fig = frontier_figure(res, metric, mode)
        ax = fig.axes[0]
        texts, _ = _legend(fig)
        assert f"front of test_acc and {metric} alone (all trials)" in texts
        assert "on the front of all objectives (test_acc, attack_ssim, attack_mse)" in texts
        assert not any("front (all trials)" == t for t in texts)
        (ring,) = [c for c in ax.collections if c.get_gid() == "page-front"]
        (cross,) = [c for c in ax.collections if c.get_gid() == "baseline"]   # one point a trial: a scatter
        assert cross.get_zorder() > ring.get_zorder()
        shown = page.dropna(subset=[metric])
        assert {tuple(np.round(p, 9)) for p in ring.get_offsets()} == {
            (round(a, 9), round(m, 9)) for a, m in zip(shown["test_acc"], shown[metric])}


# ---------------------------------------------------------------- bands of a metric that cannot be negative
def test_an_mse_band_is_drawn_and_printed_from_zero(tmp_path):
    """The baseline's band of one run of attack_mse printed "-0.006 to 0.022": an MSE is never negative, so
    the band is drawn and printed clipped at 0 (an SSIM's at -1, an accuracy's at 0 and 1)."""
    root = write_results(tmp_path / "mse", objectives=THREE_OBJECTIVES, vary_params=False, seed=3, epochs=False,
                         recon=False)
    res = load_results(root)
    (mean, lo, hi), = baseline_bands(res, "attack_mse").values()
    assert lo == 0.0 < mean < hi
    texts, _ = _legend(frontier_figure(res, "attack_mse", "max"))
    (band,) = [t for t in texts if t.startswith("λ=0 baseline σ=")]
    assert "attack_mse 0.000 to " in band and "-" not in band and "−" not in band


@pytest.mark.parametrize("metric", ["attack_ssim", "test_acc"])
def test_bounded_metrics_keep_their_own_ranges(metric):
    from cem_bench.analysis.report.plots import metric_bounds
    assert metric_bounds(metric) == {"attack_ssim": (-1.0, 1.0), "test_acc": (0.0, 1.0)}[metric]
    assert metric_bounds("attack_psnr")[0] == 0.0 and metric_bounds("attack_mse__rmle")[0] == 0.0


def test_the_hypervolume_legend_sits_under_its_axes(tmp_path):
    """Its legend sat at the lower right, inside the axes, on the curves of a search still gaining at its end."""
    from cem_bench.analysis.report.hypervolume_plot import hypervolume_figure

    fig, _ = hypervolume_figure(load_results(paper_grid(tmp_path / "grid")))
    texts, _ = _legend(fig)
    assert texts[0] == "all trials" and len(texts) == 1 + len(SURROGATES5)
    _inside_and_clear(fig)
