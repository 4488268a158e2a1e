"""The trade-off over λ: one curve per surrogate of a replicated λ sweep, starting from the λ = 0 baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .formatting import better
from .frontier_plot import stats_runs
from .load import BASELINE_LABEL, LAMBD_COL, Results, numeric
from .plots import bars, lambda_axis, new_figure, save, wrapped


def lambda_curves(res: Results) -> pd.DataFrame | None:
    """The configurations of a λ sweep with replicates, one per (surrogate, λ) and one λ = 0 baseline, or None
    when the results are not one: no replicates, fewer than two λ > 0, or another searched key that varies
    among them (the curve would average over it)."""
    if not res.replicated or res.configs is None:
        return None
    cfg = res.configs[res.configs["_ok"]]
    lam = numeric(cfg[LAMBD_COL]) if LAMBD_COL in cfg else None
    if lam is None or lam.gt(0).sum() == 0 or lam[lam > 0].nunique() < 2:
        return None
    keys = cfg.assign(_lam=lam)[["_surrogate", "_lam"]]
    if keys.duplicated().any() or not (lam == 0).any():
        return None
    return cfg.assign(_lam=lam)


def plot_lambda_curves(res: Results, path: Path) -> Path | None:
    """One curve per surrogate over λ (symlog; λ = 0 is the baseline every curve starts from): the first
    objective, the within-class feature spread and each privacy objective, mean ± std over the seeds."""
    cfg = lambda_curves(res)
    if cfg is None:
        return None
    metrics = [res.objectives[0]["metric"], "feature_spread",
               *[o["metric"] for o in res.objectives[1:] if o["metric"] != "feature_spread"]]
    metrics = [m for m in dict.fromkeys(metrics) if f"{m}_mean" in cfg]
    fig = new_figure(4.0 * len(metrics), 3.4, top_in=0.5)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    base = cfg[cfg["_lam"] == 0].iloc[0]
    for ax, m in zip(axes, metrics):
        mean, std = f"{m}_mean", f"{m}_std"
        for s in res.surrogates:
            sub = cfg[(cfg["_surrogate"] == s) & (cfg["_lam"] > 0)].sort_values("_lam")
            if sub.empty:
                continue
            x = np.concatenate([[0.0], sub["_lam"].to_numpy(dtype=float)])
            y = np.concatenate([[float(base[mean])], numeric(sub[mean]).to_numpy()])
            err = np.nan_to_num(np.concatenate([[float(base.get(std, np.nan))], numeric(sub[std]).to_numpy()]))
            ax.errorbar(x, y, yerr=bars(y, err, m, cfg[mean]), marker="o", ms=4, lw=1.3, capsize=2.5,
                        color=res.colors[s], label=s)
        b = np.array([float(base[mean])])
        ax.errorbar([0.0], b, yerr=bars(b, np.nan_to_num([float(base.get(std, np.nan))]), m, cfg[mean]),
                    marker="X", ms=7, color="black", linestyle="none", capsize=2.5, label=BASELINE_LABEL)
        lambda_axis(ax, cfg["_lam"])
        ax.set_xlabel("cem.lambd (log; 0 = the baseline)")
        mode = next((o["mode"] for o in res.objectives if o["metric"] == m), None)
        ax.set_ylabel(wrapped(better(m, mode) if mode else m), fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    lo, hi = stats_runs(cfg, metrics)
    n = str(lo) if lo == hi else f"{lo}–{hi}"
    fig.suptitle(f"trade-off over λ per surrogate: mean ± std over {n} seed{'s' * (hi != 1)}", fontsize=10)
    return save(fig, path)
