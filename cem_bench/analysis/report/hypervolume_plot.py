"""The hypervolume figure: the hypervolume after each completed trial, overall and per surrogate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cem_bench.frontier import hypervolume_curve

from .formatting import format_value
from .load import Results
from .plots import legend_below, new_figure, no_data, save


def _hv_curve(df: pd.DataFrame, res: Results) -> np.ndarray:
    df = df.sort_values("_order")
    values = np.column_stack([df[m].to_numpy(dtype=float) for m in res.metrics])
    values[~df["_ok"].to_numpy()] = np.nan  # errored trials complete but add nothing
    return hypervolume_curve(values, res.modes, [o["ref"] for o in res.objectives])


def plot_hypervolume(res: Results, path: Path) -> tuple[Path, float]:
    """Hypervolume after each completed trial, overall and per surrogate; returns (path, final hv)."""
    fig, final = hypervolume_figure(res)
    return save(fig, path), final


def hypervolume_figure(res: Results):
    """``plot_hypervolume``'s figure (unsaved) and the final hypervolume."""
    trials = res.trials.sort_values("_order")
    fig = new_figure(7.5, 4.2)
    ax = fig.add_subplot()
    final = 0.0
    if len(trials):
        n_done = np.arange(1, len(trials) + 1)
        curve = _hv_curve(trials, res)
        final = float(curve[-1])
        ax.step(n_done, curve, where="post", color="black", lw=2.2, label="all trials")
        started = res.confirm_started
        if started is not None:   # the confirmation's runs add no new configuration, only new seeds
            ax.axvline(started + 0.5, color="0.3", ls=":", lw=1.2)
            ax.text(started + 0.6, 0.02, "confirmation begins", transform=ax.get_xaxis_transform(),
                    fontsize=8, color="0.3", rotation=90, va="bottom")
        position = pd.Series(n_done, index=trials.index)
        for s in res.surrogates:
            sub = trials[(trials["_surrogate"] == s) & ~trials["_baseline"]]
            if sub.empty:
                continue
            # a marker too: a surrogate of one trial is a one-point step, which draws nothing beside its legend entry
            ax.step(position[sub.index], _hv_curve(sub, res), where="post", color=res.colors[s], lw=1.3, label=s,
                    marker="." if len(sub) == 1 else None)
        # under the axes, as the other figures': "lower right" sat on the curves of a search whose hypervolume
        # is still rising at its end (every search's)
        legend_below(fig, ax, ax.get_legend_handles_labels()[0], max_cols=6)
    else:
        no_data(ax, "no trials")
    refs = ", ".join(f"{o['metric']} {o['mode']} ref {format_value(o['ref'])}" for o in res.objectives)
    ax.set_xlabel("completed trials (all surrogates, finish order)")
    ax.set_ylabel("hypervolume (higher is better)")
    ax.set_title(f"hypervolume: {refs}", fontsize=9)
    ax.grid(alpha=0.3)
    return fig, final
