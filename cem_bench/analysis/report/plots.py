"""Every figure of the report, built on ``matplotlib.figure.Figure`` objects (rendered by the Agg canvas)
rather than through pyplot, so the report never touches the process-wide backend or pyplot's figure
registry and no figure outlives its function.

This module holds what the figures share: which parameters each trial's surrogate uses (``uses_param``), a
new figure and its margins (``new_figure``, ``fit_margins``, ``save``), the range of a bounded metric
(``metric_bounds``, ``clip_interval``, ``bars``), the λ axis and a small panel's label (``wrapped``). Each
family of figures is one module beside it (a new plot is one file plus its test):
``frontier_plot`` (the frontier plots and the baseline's noise bands), ``hypervolume_plot``, ``param_plot``
(each objective against one parameter), ``lambda_plot`` (the trade-off over λ) and ``training_plot`` (the
front's training curves)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from .formatting import format_value
from .load import LAMBD_COL, NOISE_COL, Results

# parameters of every trial, λ = 0 baselines included (they have no surrogate)
EVERY_TRIAL_PARAMS = frozenset({LAMBD_COL, NOISE_COL})


def _config_column(key: str) -> str:
    """``num_slots``, ``cem.num_slots`` or ``config.cem.num_slots`` -> ``config.cem.num_slots``."""
    if key.startswith("config."):
        return key
    return f"config.{key}" if "." in key else f"config.cem.{key}"


def surrogate_keys(name: str) -> frozenset[str] | None:
    """The config columns surrogate ``name`` reads, as the surrogate registry declares them
    (``surrogates.get(name).keys``; importing the registry loads torch, so only older tables ask it:
    ``uses_param``); None for a surrogate the registry does not know (its trials are drawn for every key)."""
    from cem_bench import surrogates
    try:
        keys = surrogates.get(name).keys
    except Exception:  # noqa: BLE001 - unknown name (ConfigError)
        return None
    return frozenset(_config_column(k) for k in keys)


def uses_param(res: Results, param: str) -> pd.Series:
    """Per trial: does the trial's surrogate use ``param``? λ and σ apply to every trial; the other
    parameters only to non-baseline trials whose config holds them. A trial records its resolved config,
    which holds only the keys its surrogate reads (``results.write_tables`` keeps it so), so a key that
    applies is a key that is set: nothing here is kept per surrogate. An older table
    (``Results.final_table`` False) may hold every surrogate's defaults in every row: there the surrogate
    registry says which keys a surrogate reads (``surrogate_keys``; unknown surrogates: all)."""
    trials = res.trials
    if param in EVERY_TRIAL_PARAMS:
        return pd.Series(True, index=trials.index)
    if param not in trials:
        return pd.Series(False, index=trials.index)
    used = trials[param].notna() & ~trials["_baseline"]
    if not res.final_table and used.any():
        keys = {s: surrogate_keys(s) for s in trials.loc[used, "_surrogate"].unique()}
        used &= trials["_surrogate"].map(lambda s: s not in keys or keys[s] is None or param in keys[s]).astype(bool)
    return used


def new_figure(width: float, height: float, top_in: float = 0.45) -> Figure:
    """A figure with margins in inches (a layout engine would double the drawing time); ``fit_margins``
    widens them, before saving, where a label or a tick label would leave the image."""
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.2 / width, bottom=0.6 / height, top=1 - top_in / height,
                        wspace=0.45)  # fmt: skip
    return fig


MARGIN_PX = 4  # the blank strip every label keeps from the image's edge


def fit_margins(fig: Figure) -> None:
    """Widen the figure's margins (and the space between its panels) until every axes' labels, tick labels
    and title lie inside the image: the extents of their text are measured, no drawing is done. A
    two-line y label or a long tick label (0.0001) no longer runs off the left edge."""
    axes = [ax for ax in fig.axes if ax.get_visible()]
    if not axes:
        return
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    sp = fig.subplotpars
    for _ in range(3):   # a wider margin narrows the panels, which may move their labels again
        by_axes = [ax.get_tightbbox(renderer) for ax in axes]   # one measurement serves margins and gaps
        boxes = [b for b in by_axes if b is not None]
        if not boxes:
            return
        x0, y0 = min(b.x0 for b in boxes), min(b.y0 for b in boxes)
        x1, y1 = max(b.x1 for b in boxes), max(b.y1 for b in boxes)
        left = sp.left + max(0.0, MARGIN_PX - x0) / width
        right = sp.right - max(0.0, x1 - (width - MARGIN_PX)) / width
        bottom = sp.bottom + max(0.0, MARGIN_PX - y0) / height
        top = sp.top - max(0.0, y1 - (height - MARGIN_PX - _suptitle_px(fig, renderer))) / height
        wspace = sp.wspace
        if len(axes) > 1:    # a panel's y label must not run into its left neighbour
            for ba, bb in zip(by_axes, by_axes[1:]):
                gap = bb.x0 - ba.x1 if ba is not None and bb is not None else 1.0
                if gap < MARGIN_PX:
                    panel = (sp.right - sp.left) * width / (len(axes) + (len(axes) - 1) * sp.wspace)
                    wspace = max(wspace, sp.wspace + (MARGIN_PX - gap) / panel)
        if (left, right, bottom, top, wspace) == (sp.left, sp.right, sp.bottom, sp.top, sp.wspace):
            return
        fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top, wspace=wspace)


def _suptitle_px(fig: Figure, renderer) -> float:
    """The height the figure's suptitle takes at the top (0 without one)."""
    title = fig._suptitle
    if title is None or not title.get_text():
        return 0.0
    return title.get_window_extent(renderer).height + MARGIN_PX


def save(fig: Figure, path: Path) -> Path:
    fit_margins(fig)
    fig.savefig(path, format="png")
    fig.clear()
    return path


# ================================================================= bounded metrics
def metric_bounds(metric: str, values=None) -> tuple[float, float] | None:
    """The range a metric cannot leave, where it has one: accuracy in [0, 1] (in [0, 100] when the values are
    percentages), SSIM in [-1, 1] (docs/results.md §3.2: "≤ 1"); None for MSE, PSNR and the rest. An interval
    or a band of a bounded metric is drawn and printed clipped to it."""
    if metric.startswith("test_acc"):
        v = pd.to_numeric(pd.Series(values), errors="coerce").abs() if values is not None else pd.Series(dtype=float)
        return (0.0, 100.0) if len(v.dropna()) and v.max() > 1.0 else (0.0, 1.0)
    if metric.startswith(("attack_ssim", "probe_ssim")):
        return (-1.0, 1.0)
    return None


def clip_interval(metric: str, lo, hi, values=None):
    """``lo``, ``hi`` (scalars or arrays) clipped to ``metric_bounds``, unchanged for an unbounded metric."""
    bounds = metric_bounds(metric, values)
    if bounds is None:
        return lo, hi
    return np.clip(lo, *bounds), np.clip(hi, *bounds)


def bars(values: np.ndarray, half: np.ndarray, metric: str, every) -> np.ndarray:
    """(2, n) error-bar lengths below and above ``values``: the CI's half-width, cut where it would leave the
    metric's range (``metric_bounds``: no accuracy interval past 1, none below 0)."""
    lo, hi = clip_interval(metric, values - half, values + half, every)
    return np.nan_to_num(np.vstack([values - lo, hi - values]), nan=0.0).clip(min=0.0)


# ================================================================= the λ axis
MAX_LAMBDA_TICKS = 10   # distinct λ values beyond which the λ axis gets round ticks instead of every value


def lambda_axis(ax, values) -> None:
    """A symlog λ axis (linear below the smallest positive λ, so λ = 0 shows) whose ticks are the λ values
    used, labelled plainly (0, 1, 4, 16, 64), not 10⁰ and 10¹; more than ``MAX_LAMBDA_TICKS`` values: 0 and
    the powers of two between the smallest and the largest."""
    lam = np.unique(pd.to_numeric(pd.Series(values), errors="coerce").dropna().to_numpy(dtype=float))
    positive = lam[lam > 0]
    if not len(positive):
        return
    ax.set_xscale("symlog", linthresh=float(positive.min()))
    ticks = lam
    if len(lam) > MAX_LAMBDA_TICKS:
        lo, hi = np.floor(np.log2(positive.min())), np.ceil(np.log2(positive.max()))
        step = max(1, int(np.ceil((hi - lo + 1) / MAX_LAMBDA_TICKS)))
        ticks = np.concatenate([[0.0] if (lam == 0).any() else [], 2.0 ** np.arange(lo, hi + 1, step)])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [format_value(float(t)) for t in ticks])


def no_data(ax, text: str = "no completed trials with these metrics") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777")


def wrapped(label: str, width: int = 28) -> str:
    """A y label of a small panel on two lines when long: ``attack_ssim_paper\n(lower = more private)``."""
    if len(label) <= width or " (" not in label:
        return label
    head, rest = label.split(" (", 1)
    return f"{head}\n({rest}"
