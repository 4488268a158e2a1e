"""The trade-off over λ: one curve per surrogate of a replicated λ sweep, starting from the λ = 0 baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cem_bench.analysis.aggregate import CONFIG_ID, config_columns
from cem_bench.schema import EXECUTION_KEYS

from .formatting import better, short, varies
from .frontier_plot import band_names, stats_runs
from .load import BASELINE_LABEL, LAMBD_COL, SURROGATE_COL, Results, numeric
from .plots import bars, lambda_axis, legend_below, new_figure, save, wrapped

# distinct λ > 0 of one surrogate beyond which its λ values are not a grid (a random search's draws: one
# configuration per λ, a curve of single runs zigzagging over the other keys) and it gets no curve
MAX_CURVE_LAMBDAS = 20


def _curves(res: Results) -> tuple[pd.DataFrame | None, dict[str, str]]:
    """``lambda_curves`` and, per surrogate of the sweep left without a curve, why."""
    if not res.replicated or res.configs is None:
        return None, {}
    cfg = res.configs[res.configs["_ok"]]
    lam = numeric(cfg[LAMBD_COL]) if LAMBD_COL in cfg else None
    if lam is None or lam.gt(0).sum() == 0 or lam[lam > 0].nunique() < 2 or not (lam == 0).any():
        return None, {}
    cfg = cfg.assign(_lam=lam)
    # the keys a curve must hold fixed: every config key but λ and the surrogate, and those that only say how a
    # trial ran (a baseline that differs from its configurations only in these is still theirs)
    fixed = [c for c in config_columns(cfg)
             if c not in (LAMBD_COL, SURROGATE_COL) and c.removeprefix("config.") not in EXECUTION_KEYS]
    bases = cfg[cfg["_lam"] == 0]
    keep, gaps = [], {}
    for s in res.surrogates:
        sub = cfg[(cfg["_surrogate"] == s) & (cfg["_lam"] > 0)]
        if sub.empty:
            continue
        n_lam = sub["_lam"].nunique()
        moving = [c for c in fixed if varies(sub[c]) or (sub[c].isna().any() and sub[c].notna().any())]
        if moving:
            gaps[s] = f"{', '.join(short(c) for c in moving)} also var{'y' if len(moving) > 1 else 'ies'} along its λ values"
        elif n_lam > MAX_CURVE_LAMBDAS:
            gaps[s] = f"its {n_lam} λ values are not a grid (more than {MAX_CURVE_LAMBDAS})"
        elif sub["_lam"].duplicated().any():
            gaps[s] = "two configurations share a λ"
        else:
            base = _baseline_of(sub, bases)
            if base is None:
                gaps[s] = "no λ=0 baseline with its other keys"
            else:
                keep += [base, *sub[CONFIG_ID]]
    if not keep:
        return None, gaps
    return cfg[cfg[CONFIG_ID].isin(set(keep))], gaps


def _baseline_of(sub: pd.DataFrame, bases: pd.DataFrame) -> str | None:
    """The id of the λ = 0 baseline a curve starts from: the one its configurations are compared with
    (``baseline_id``), or the only one; None when they name none or several."""
    named = sub["baseline_id"].dropna().astype(str).unique() if "baseline_id" in sub else []
    if len(named) == 1 and named[0] in set(bases[CONFIG_ID]):
        return str(named[0])
    if len(named) == 0 and len(bases) == 1:
        return str(bases[CONFIG_ID].iloc[0])
    return None


def lambda_curves(res: Results) -> pd.DataFrame | None:
    """The configurations of a λ sweep with replicates that its curves draw: per surrogate, one configuration
    per λ > 0 with every other key fixed, and the λ = 0 baseline they are compared with; None when the results
    are not one (no replicates, fewer than two λ > 0, no baseline) or no surrogate has such a curve. A
    surrogate along whose λ values another key varies (``num_slots`` 2 at λ 2, 8 at λ 8: the line would join
    them as if λ alone moved), or with more than ``MAX_CURVE_LAMBDAS`` λ values, gets none
    (``lambda_curves_note`` says which and why)."""
    return _curves(res)[0]


def lambda_curves_note(res: Results) -> str | None:
    """What the page says under the λ curves about the surrogates it drew none for (None: none left out)."""
    cfg, gaps = _curves(res)
    if cfg is None or not gaps:
        return None
    return "No curve for " + "; ".join(f"{s}: {why}" for s, why in gaps.items()) + "."


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
    bases = cfg[cfg["_lam"] == 0].set_index(CONFIG_ID, drop=False)
    names = band_names(res, list(bases.index)) if len(bases) > 1 else {}
    for ax, m in zip(axes, metrics):
        mean, std = f"{m}_mean", f"{m}_std"
        for s in res.surrogates:
            sub = cfg[(cfg["_surrogate"] == s) & (cfg["_lam"] > 0)].sort_values("_lam")
            if sub.empty:
                continue
            base = bases.loc[_baseline_of(sub, bases)]
            x = np.concatenate([[0.0], sub["_lam"].to_numpy(dtype=float)])
            y = np.concatenate([[float(base[mean])], numeric(sub[mean]).to_numpy()])
            err = np.nan_to_num(np.concatenate([[float(base.get(std, np.nan))], numeric(sub[std]).to_numpy()]))
            ax.errorbar(x, y, yerr=bars(y, err, m, cfg[mean]), marker="o", ms=4, lw=1.3, capsize=2.5,
                        color=res.colors[s], label=s)
        for cid, base in bases.iterrows():
            b = np.array([float(base[mean])])
            ax.errorbar([0.0], b, yerr=bars(b, np.nan_to_num([float(base.get(std, np.nan))]), m, cfg[mean]),
                        marker="X", ms=7, color="black", linestyle="none", capsize=2.5,
                        label=f"{BASELINE_LABEL} {names[cid]}" if names else BASELINE_LABEL)
        lambda_axis(ax, cfg["_lam"])
        ax.set_xlabel("cem.lambd (log; 0 = the baseline)")
        mode = next((o["mode"] for o in res.objectives if o["metric"] == m), None)
        ax.set_ylabel(wrapped(better(m, mode) if mode else m), fontsize=8)
        ax.grid(alpha=0.3)
    legend_below(fig, axes[0], axes[0].get_legend_handles_labels()[0], fontsize=7, max_cols=6)
    lo, hi = stats_runs(cfg, metrics)
    n = str(lo) if lo == hi else f"{lo}–{hi}"
    fig.suptitle(f"trade-off over λ per surrogate: mean ± std over {n} seed{'s' * (hi != 1)}", fontsize=10)
    return save(fig, path)
