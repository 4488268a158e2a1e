"""Every figure of the report, built on ``matplotlib.figure.Figure`` objects (rendered by the Agg canvas)
rather than through pyplot, so the report never touches the process-wide backend or pyplot's figure
registry and no figure outlives its function.

This module holds what the figures share: which parameters each trial's surrogate uses (``uses_param``), a
new figure, its legend under the axes and its margins (``new_figure``, ``legend_below``, ``fit_margins``,
``save``), a title of bounded length (``title_text``), the range of a bounded metric (``metric_bounds``,
``clip_interval``, ``bars``), the λ axis and a small panel's label (``wrapped``). Each
family of figures is one module beside it (a new plot is one file plus its test):
``frontier_plot`` (the frontier plots and the baseline's noise bands), ``hypervolume_plot``, ``param_plot``
(each objective against one parameter), ``lambda_plot`` (the trade-off over λ) and ``training_plot`` (the
front's training curves)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from cem_bench.schema import METRIC_RANGES, base_metric

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
# The least share of the figure's width (height) the panels keep, whatever the labels ask: margins that would
# leave less are shrunk in proportion (a label may then be cut at the edge), never past each other.
MIN_AXES_FRACTION = 0.3
BELOW = "legend-below"   # the gid of a legend that ``legend_below`` put under the axes
MIN_LEGEND_WRAP = 45   # characters of a legend line: narrower columns cut a band's range into three lines


def legend_below(fig: Figure, ax, handles: list, fontsize: float = 8, max_cols: int = 3) -> None:
    """``ax``'s legend under the panels, centred on the figure: of 1 to ``max_cols`` columns, each label
    wrapped to its column's width (``MIN_LEGEND_WRAP`` characters at least), the layout that fits the
    figure's width in the fewest lines; the figure is made taller by the legend's height, so the panels keep
    their size however many entries there are (one per surrogate, per noise band, ...) and the legend never
    covers a point. ``fit_margins`` keeps the axes' labels above it."""
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    room = fig.bbox.width - 2 * MARGIN_PX
    char_px = 0.62 * fontsize * fig.dpi / 72     # a wide character of the legend's font
    best = None
    for ncol in range(1, min(max_cols, len(handles)) + 1):
        wrap = int(room / ncol / char_px) - 6   # less the handle and the space between columns
        if ncol > 1 and wrap < MIN_LEGEND_WRAP:
            break
        labels = ["\n".join(textwrap.fill(line, wrap) for line in h.get_label().split("\n")) for h in handles]
        leg = ax.legend(handles=handles, labels=labels, loc="lower center", bbox_to_anchor=(0.5, 0.0),
                        bbox_transform=fig.transFigure, ncol=ncol, fontsize=fontsize, frameon=False)
        box = leg.get_window_extent(renderer)
        if best is None or (box.width <= room and box.height < best[1]):
            best = (ncol, box.height, labels)
    ncol, _, labels = best
    leg = ax.legend(handles=handles, labels=labels, loc="lower center", bbox_to_anchor=(0.5, 0.0),
                    bbox_transform=fig.transFigure, ncol=ncol, fontsize=fontsize, frameon=False)
    leg.set_gid(BELOW)
    extra = (leg.get_window_extent(renderer).height + MARGIN_PX) / fig.dpi
    w, h = fig.get_size_inches()
    sp = fig.subplotpars
    bottom_in, top_in = sp.bottom * h, (1 - sp.top) * h
    fig.set_size_inches(w, h + extra)
    fig.subplots_adjust(bottom=(bottom_in + extra) / (h + extra), top=1 - top_in / (h + extra))


def _measure(ax, renderer):
    """The box of ``ax``'s labels, tick labels, title and other artists, less a ``legend_below`` legend (which
    has its own strip under the panels), and the top of that legend's strip in pixels (0 without one)."""
    leg = ax.get_legend()
    if leg is None or leg.get_gid() != BELOW:
        return ax.get_tightbbox(renderer), 0.0
    extra = [a for a in ax.get_default_bbox_extra_artists() if a is not leg]
    return ax.get_tightbbox(renderer, bbox_extra_artists=extra), leg.get_window_extent(renderer).y1


def _kept(lo: float, hi: float) -> tuple[float, float]:
    """Margins ``lo`` (from 0) and ``hi`` (from 1) shrunk in proportion where they would leave the panels less
    than ``MIN_AXES_FRACTION``: ``subplots_adjust`` refuses left >= right, and a panel of no width shows nothing."""
    if hi - lo >= MIN_AXES_FRACTION:
        return lo, hi
    scale = (1 - MIN_AXES_FRACTION) / max(lo + (1 - hi), 1e-9)
    return lo * scale, 1 - (1 - hi) * scale


def _cell(ax, k: int) -> tuple[int, int]:
    """``ax``'s row and column in its figure's grid (a lone axes, or one added without a grid: row 0, column k)."""
    spec = ax.get_subplotspec()
    return (spec.rowspan.start, spec.colspan.start) if spec is not None else (0, k)


def fit_margins(fig: Figure) -> None:
    """Widen the figure's margins (and the space between its panels) until every axes' labels, tick labels
    and title lie inside the image, above a ``legend_below`` legend: the extents of their text are measured,
    no drawing is done. A two-line y label or a long tick label (0.0001) no longer runs off the left edge.
    The panels keep at least ``MIN_AXES_FRACTION`` of the figure either way (``_kept``). Panels in rows (the λ
    curves of a σ grid) are kept apart across and down: a row's x labels from the next row's titles."""
    axes = [ax for ax in fig.axes if ax.get_visible()]
    if not axes:
        return
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    sp = fig.subplotpars
    cells = [_cell(ax, k) for k, ax in enumerate(axes)]
    ncols = max(c for _, c in cells) + 1
    nrows = max(r for r, _ in cells) + 1
    for _ in range(3):   # a wider margin narrows the panels, which may move their labels again
        measured = [_measure(ax, renderer) for ax in axes]   # one measurement serves margins and gaps
        by_axes = [b for b, _ in measured]
        floor = max(y for _, y in measured) + MARGIN_PX
        boxes = [b for b in by_axes if b is not None]
        if not boxes:
            return
        x0, y0 = min(b.x0 for b in boxes), min(b.y0 for b in boxes)
        x1, y1 = max(b.x1 for b in boxes), max(b.y1 for b in boxes)
        left, right = _kept(sp.left + max(0.0, MARGIN_PX - x0) / width,
                            sp.right - max(0.0, x1 - (width - MARGIN_PX)) / width)
        bottom, top = _kept(sp.bottom + max(0.0, floor - y0) / height,
                            sp.top - max(0.0, y1 - (height - MARGIN_PX - _suptitle_px(fig, renderer))) / height)
        wspace, hspace = sp.wspace, sp.hspace
        box_at = {cell: b for cell, b in zip(cells, by_axes) if b is not None}
        panel_w = (sp.right - sp.left) * width / (ncols + (ncols - 1) * sp.wspace)
        panel_h = (sp.top - sp.bottom) * height / (nrows + (nrows - 1) * sp.hspace)
        for (r, c), ba in box_at.items():
            # a panel's y label must not run into its left neighbour, nor its x label into the title below
            bb = box_at.get((r, c + 1))
            if bb is not None and bb.x0 - ba.x1 < MARGIN_PX:
                wspace = max(wspace, sp.wspace + (MARGIN_PX - (bb.x0 - ba.x1)) / panel_w)
            bb = box_at.get((r + 1, c))
            if bb is not None and ba.y0 - bb.y1 < MARGIN_PX:
                hspace = max(hspace, sp.hspace + (MARGIN_PX - (ba.y0 - bb.y1)) / panel_h)
        if (left, right, bottom, top, wspace, hspace) == (sp.left, sp.right, sp.bottom, sp.top, sp.wspace,
                                                          sp.hspace):
            return
        fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top, wspace=wspace, hspace=hspace)


def _suptitle_px(fig: Figure, renderer) -> float:
    """The height the figure's suptitle takes at the top, from the image's top edge to below the title (0
    without one): it sits at a fraction of the height, so a tall figure's title starts lower."""
    title = fig._suptitle
    if title is None or not title.get_text():
        return 0.0
    return fig.bbox.height - title.get_window_extent(renderer).y0


def title_text(text: str, width: int = 95, max_name: int = 60, name: str | None = None) -> str:
    """``text`` wrapped at ``width`` characters, at most three lines; ``name`` (an experiment's name, which
    the user chose and may be any length) is first cut to ``max_name`` characters with an ellipsis."""
    if name is not None and len(name) > max_name:
        text = text.replace(name, name[: max_name - 1] + "…", 1)
    return textwrap.fill(text, width, max_lines=3, placeholder=" …")


def save(fig: Figure, path: Path) -> Path:
    fit_margins(fig)
    fig.savefig(path, format="png")
    fig.clear()
    return path


# ================================================================= bounded metrics
def metric_bounds(metric: str, values=None) -> tuple[float, float] | None:
    """The range a metric cannot leave, where it has one: accuracy in [0, 1] (in [0, 100] when the values are
    percentages), SSIM in [-1, 1] (docs/results.md §3.2: "≤ 1"), MSE and PSNR at or above 0
    (``schema.METRIC_RANGES``: the attack's images are clamped to [0, 1]); None for the rest. An interval or a
    band of a bounded metric is drawn and printed clipped to it: a baseline's MSE band of one run otherwise
    printed a negative lower end."""
    if metric.startswith("test_acc"):
        v = pd.to_numeric(pd.Series(values), errors="coerce").abs() if values is not None else pd.Series(dtype=float)
        return (0.0, 100.0) if len(v.dropna()) and v.max() > 1.0 else (0.0, 1.0)
    if metric.startswith("probe_ssim"):
        return (-1.0, 1.0)
    return METRIC_RANGES.get(base_metric(metric))


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
