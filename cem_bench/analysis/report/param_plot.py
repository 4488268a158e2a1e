"""The parameter figures: each objective against one main searched parameter, drawn for the trials whose
surrogate uses it."""

from __future__ import annotations

from pathlib import Path

from .formatting import better, short
from .load import BASELINE_LABEL, LAMBD_COL, MAIN_PARAMS, Results
from .plots import lambda_axis, legend_below, new_figure, save, uses_param, wrapped


def param_columns(res: Results) -> list[str]:
    """The main parameters that take two or more values among the ok trials that use them."""
    ok = res.ok
    out = []
    for c in MAIN_PARAMS:
        if c in ok and ok.loc[uses_param(res, c)[ok.index], c].dropna().nunique() >= 2:
            out.append(c)
    return out


def plot_param_effects(res: Results, param: str, path: Path) -> Path:
    """Each objective against one parameter (small multiples), coloured by surrogate; only the trials whose
    surrogate uses ``param`` (λ = 0 baselines only for λ and σ)."""
    ok = res.ok[uses_param(res, param)[res.ok.index]]
    n = len(res.objectives)
    fig = new_figure(4.0 * n, 3.4, top_in=0.5)
    axes = fig.subplots(1, n, squeeze=False)[0]
    groups = [(s, ok[(ok["_surrogate"] == s) & ~ok["_baseline"]], res.colors[s], "o") for s in res.surrogates]
    groups.append((BASELINE_LABEL, ok[ok["_baseline"]], "black", "X"))
    positive = ok[param][ok[param] > 0]
    for ax, obj in zip(axes, res.objectives):
        for label, sub, color, marker in groups:
            sub = sub.dropna(subset=[param, obj["metric"]])
            if not sub.empty:
                ax.scatter(sub[param], sub[obj["metric"]], s=22, color=color, marker=marker, alpha=0.8, label=label)
        if param == LAMBD_COL and len(positive):
            # log scale, but keep λ = 0 visible: linear within the smallest positive λ
            lambda_axis(ax, ok[param])
        ax.set_xlabel(short(param) + (" (log)" if param == LAMBD_COL else ""))
        ax.set_ylabel(wrapped(better(obj["metric"], obj["mode"])), fontsize=8)
        ax.grid(alpha=0.3)
    legend_below(fig, axes[0], axes[0].get_legend_handles_labels()[0], fontsize=7, max_cols=6)
    fig.suptitle(f"effect of {short(param)}", fontsize=10)
    return save(fig, path)
