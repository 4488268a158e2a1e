"""The parameter figures: each objective against one parameter, drawn for the trials whose surrogate uses it.
The parameters are the main ones (``MAIN_PARAMS``: λ, σ and the attention keys the mission names) and every
other key the space searched (``Results.searched``): a number on its axis (log where the space searched it
on a log scale), a choice of words or booleans on a categorical one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .formatting import better, short
from .load import BASELINE_LABEL, LAMBD_COL, MAIN_PARAMS, SURROGATE_COL, Results, numeric
from .plots import lambda_axis, legend_below, new_figure, save, uses_param, wrapped


def param_columns(res: Results) -> list[str]:
    """The main parameters, then the space's other searched keys in its order, that take two or more values
    among the ok trials that use them (the surrogate is the figures' colour, not a parameter)."""
    ok = res.ok
    out = []
    for c in dict.fromkeys([*MAIN_PARAMS, *res.searched]):
        if c != SURROGATE_COL and c in ok and _values(ok.loc[uses_param(res, c)[ok.index], c]).nunique() >= 2:
            out.append(c)
    return out


def _values(col: pd.Series) -> pd.Series:
    """A column's set values, numbers as numbers, anything else (a word, a boolean, a list) as its text."""
    col = col.dropna()
    if _is_numeric(col):
        return numeric(col).dropna()
    return col.map(str)


def _is_numeric(col: pd.Series) -> bool:
    """Every set value a number (a boolean is a choice, not a number)."""
    if pd.api.types.is_numeric_dtype(col.dtype):     # the usual column: no pass over its values
        return not pd.api.types.is_bool_dtype(col.dtype)
    return all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
               for v in col.dropna())


def plot_param_effects(res: Results, param: str, path: Path) -> Path:
    """Each objective against one parameter (small multiples), coloured by surrogate; only the trials whose
    surrogate uses ``param`` (λ = 0 baselines only for λ and σ)."""
    ok = res.ok[uses_param(res, param)[res.ok.index]]
    ok = ok[ok[param].notna()]
    categories: list[str] | None = None
    if not _is_numeric(ok[param]):    # a choice of words: each at its place on a categorical axis, in order
        text = ok[param].map(str)
        categories = sorted(text.unique())
        ok = ok.assign(**{param: text.map({c: i for i, c in enumerate(categories)}).astype(float)})
    else:
        ok = ok.assign(**{param: numeric(ok[param])})
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
        log = False
        if param == LAMBD_COL and len(positive):
            # log scale, but keep λ = 0 visible: linear within the smallest positive λ
            lambda_axis(ax, ok[param])
            log = True
        elif categories is not None:
            ax.set_xticks(range(len(categories)), categories, fontsize=8)
            ax.set_xlim(-0.5, len(categories) - 0.5)
        elif res.searched.get(param) and len(positive) == len(ok):
            ax.set_xscale("log")
            log = True
        ax.set_xlabel(short(param) + (" (log)" if log else ""))
        ax.set_ylabel(wrapped(better(obj["metric"], obj["mode"])), fontsize=8)
        ax.grid(alpha=0.3)
    legend_below(fig, axes[0], axes[0].get_legend_handles_labels()[0], fontsize=7, max_cols=6)
    fig.suptitle(f"effect of {short(param)}", fontsize=10)
    return save(fig, path)
