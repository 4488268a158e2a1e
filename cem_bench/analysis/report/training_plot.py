"""The training curves: test_acc and feature_spread per epoch of the front's trials."""

from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import MaxNLocator

from .load import BASELINE_LABEL, Results, numeric
from .plots import legend_below, new_figure, save

MAX_CURVES = 12  # front trials drawn in the training curves


def plot_training_curves(res: Results, path: Path) -> Path | None:
    """test_acc and feature_spread per epoch for the front's trials (``Results.front_trials``: with
    confirmation, the confirmed front's runs); None without epoch data."""
    if res.epochs is None:
        return None
    everyone = res.front_trials
    front = everyone.head(MAX_CURVES)
    epochs = res.epochs[res.epochs["trial_id"].isin(front["trial_id"])]
    panels = [c for c in ("test_acc", "feature_spread") if c in epochs and epochs[c].notna().any()]
    if epochs.empty or not panels:
        return None
    fig = new_figure(5.0 * len(panels), 3.6, top_in=0.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    surrogate = dict(zip(front["trial_id"], front["_surrogate"]))
    baseline = dict(zip(front["trial_id"], front["_baseline"]))
    for ax, col in zip(axes, panels):
        for tid, sub in epochs.groupby("trial_id", sort=False):
            sub = sub.sort_values("epoch")
            is_base = baseline.get(tid, False)
            color = "black" if is_base else res.colors.get(surrogate.get(tid), "#555")
            label = f"{tid} ({BASELINE_LABEL if is_base else surrogate.get(tid)})"
            ax.plot(sub["epoch"], numeric(sub[col]), marker=".", lw=1.2, color=color, alpha=0.85, label=label,
                    ls="--" if is_base else "-")  # fmt: skip
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(col)
        ax.grid(alpha=0.3)
    legend_below(fig, axes[-1], axes[-1].get_legend_handles_labels()[0], fontsize=7, max_cols=4)
    shown = f" ({len(front)} of {len(everyone)}, each configuration's best first)" if len(everyone) > len(front) else ""
    fig.suptitle(("training curves of the confirmed front's runs" if res.confirmed else
                  "training curves of the front's trials") + shown, fontsize=10)
    return save(fig, path)
