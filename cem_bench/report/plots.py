"""Every figure of the report, built on ``matplotlib.figure.Figure`` objects (rendered by the Agg canvas)
rather than through pyplot, so the report never touches the process-wide backend or pyplot's figure
registry and no figure outlives its function."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

from cem_bench.aggregate import CONFIG_ID
from cem_bench.frontier import hypervolume_curve
from cem_bench.noise import WITHIN, band_of

from .load import BASELINE_LABEL, LAMBD_COL, MAIN_PARAMS, NOISE_COL, Results, front_of, is_attack_metric, numeric
from .summary import better, format_value, plural, short

MAX_CURVES = 12  # front trials drawn in the training curves

# parameters of every trial, λ = 0 baselines included (they have no surrogate)
EVERY_TRIAL_PARAMS = frozenset({LAMBD_COL, NOISE_COL})
# The keys each surrogate reads, as its registry class declares them (``surrogates.get(name).keys``).
# Copied, not imported: the registry imports torch and every surrogate module, 4.6 s of a 10,000-trial
# report's 10 s; tests/test_report.py checks that this table and the registry agree.
_GATES = ("hidden_dim", "snr_thresh", "snr_sharp", "softplus_beta", "margin", "slot_power", "class_gate_a",
          "class_gate_b", "stats_on")
SURROGATE_KEYS: dict[str, tuple[str, ...]] = {
    "gmm": ("num_clusters", "gmm_fit", "entropy", "shrink", "legacy_prior_indexing", "refit_augmented", "stats_on"),
    "gated_attention": _GATES,
    "slot_cross": _GATES + ("num_slots", "num_iterations", "num_heads", "slot_temp"),
    "attention_centroid": ("num_slots", "num_iterations", "num_heads", "hidden_dim", "reg_strength", "stats_on"),
    "serial_enhanced": ("num_slots", "num_iterations", "num_heads", "hidden_dim", "dropout", "stats_on"),
}


def _config_column(key: str) -> str:
    """``num_slots``, ``cem.num_slots`` or ``config.cem.num_slots`` -> ``config.cem.num_slots``."""
    if key.startswith("config."):
        return key
    return f"config.{key}" if "." in key else f"config.cem.{key}"


def surrogate_keys(name: str) -> frozenset[str] | None:
    """The config columns surrogate ``name`` uses (``SURROGATE_KEYS``; a surrogate registered by a plug-in
    outside the table: its registry class's ``keys``, when the registry is already loaded); None for an
    unknown surrogate (its trials are drawn for every parameter)."""
    keys = SURROGATE_KEYS.get(name)
    if keys is None and "cem_bench.surrogates" in sys.modules:
        try:
            keys = getattr(sys.modules["cem_bench.surrogates"].get(name), "keys", None)
        except Exception:  # noqa: BLE001 - unknown name (ConfigError)
            keys = None
        keys = None if callable(keys) else keys
    return None if keys is None else frozenset(_config_column(k) for k in keys)


def uses_param(res: Results, param: str) -> pd.Series:
    """Per trial: does the trial's surrogate use ``param``? λ and σ apply to every trial; the other
    parameters only to non-baseline trials whose surrogate uses them (unknown surrogates: all)."""
    trials = res.trials
    if param in EVERY_TRIAL_PARAMS:
        return pd.Series(True, index=trials.index)
    keys = {s: surrogate_keys(s) for s in trials["_surrogate"].unique()}
    used = trials["_surrogate"].map(lambda s: keys[s] is None or param in keys[s]).astype(bool)
    return used & ~trials["_baseline"]


def _new_figure(width: float, height: float, top_in: float = 0.45) -> Figure:
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
        boxes = [ax.get_tightbbox(renderer) for ax in axes]
        boxes = [b for b in boxes if b is not None]
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
            for a, b in zip(axes, axes[1:]):
                ba, bb = a.get_tightbbox(renderer), b.get_tightbbox(renderer)
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


def _save(fig: Figure, path: Path) -> Path:
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


def _no_data(ax, text: str = "no completed trials with these metrics") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777")


def _front_line(ax, df: pd.DataFrame, x: str, y: str, x_mode: str, y_mode: str, **kw) -> None:
    front = front_of(df, [x, y], [x_mode, y_mode])
    if front.empty:
        return
    front = front.sort_values([x, y])
    # attainment boundary: with x maximised, the point covering (x_{i-1}, x_i] is point i
    ax.step(front[x], front[y], where="pre" if x_mode == "max" else "post", **kw)


def plot_frontier(res: Results, y_metric: str, y_mode: str, path: Path) -> Path:
    """First objective (x) against ``y_metric`` (``frontier_figure``), saved to ``path``."""
    return _save(frontier_figure(res, y_metric, y_mode), path)


def frontier_figure(res: Results, y_metric: str, y_mode: str) -> Figure:
    """First objective (x) against ``y_metric``: one point per trial, or, when the search has replicates, one
    point per configuration at its means with the 95 % CI as error bars (``configs_drawn``); coloured by
    surrogate, the overall front (black step line, ``gid="front"``) and each surrogate's own front."""
    x_metric, x_mode = res.objectives[0]["metric"], res.objectives[0]["mode"]
    if res.replicated:
        data = configs_drawn(res, y_metric)
        points = lambda ax, df, color, label, base: _errorbar(  # noqa: E731
            ax, df, x_metric, y_metric, marker="X" if base else "o", markersize=9 if base else 7, color=color,
            alpha=1.0 if base else 0.8, zorder=4 if base else 3, label=label)
        front_label, empty = "front (configuration means)", "no configuration with an ok run and these metrics"
        title = f"{plural(len(data), 'configuration')}, {replicate_caption(res, y_metric)}"
    else:
        data = trials_drawn(res, y_metric)
        points = lambda ax, df, color, label, base: ax.scatter(  # noqa: E731
            df[x_metric], df[y_metric], s=80 if base else 28, marker="X" if base else "o", color=color,
            alpha=1.0 if base else 0.75, edgecolors="none", zorder=4 if base else 3)
        front_label, empty, title = "front (all trials)", None, plural(len(data), "ok trial")
    fig = _new_figure(7.5, 5.0)
    ax = fig.add_subplot()
    handles = []
    dense = len(data) > DENSE_POINTS
    if dense:   # thousands of points: their density, and each surrogate's own front drawn on top
        rest = data[~data["_baseline"]]
        ax.hexbin(rest[x_metric].to_numpy(dtype=float), rest[y_metric].to_numpy(dtype=float), gridsize=70,
                  cmap="Greys", bins="log", mincnt=1, linewidths=0, zorder=1)
        handles.append(Patch(facecolor="0.45", label=f"density of all {len(rest):,} points (log)"))
    for s in res.surrogates:
        sub = data[(data["_surrogate"] == s) & ~data["_baseline"]]
        if sub.empty:
            continue
        color = res.colors[s]
        points(ax, front_of(sub, [x_metric, y_metric], [x_mode, y_mode]) if dense else sub, color, s, False)
        _front_line(ax, sub, x_metric, y_metric, x_mode, y_mode, color=color, lw=1.0, alpha=0.8, zorder=2)
        handles.append(Line2D([], [], color=color, marker="o", lw=1.0, label=s))
    base = data[data["_baseline"]]
    if not base.empty:
        points(ax, base, "black", BASELINE_LABEL, True)
        handles.append(Line2D([], [], color="black", marker="X", lw=0, markersize=8, label=BASELINE_LABEL))
    if not data.empty:
        _front_line(ax, data, x_metric, y_metric, x_mode, y_mode, color="black", lw=2.2, alpha=0.9, zorder=5,
                    gid="front")  # fmt: skip
        front = front_of(data, [x_metric, y_metric], [x_mode, y_mode])
        ax.scatter(front[x_metric], front[y_metric], s=90, facecolors="none", edgecolors="black", lw=1.3, zorder=6)
        handles.append(Line2D([], [], color="black", lw=2.2, label=front_label))
    else:
        _no_data(ax, empty) if empty else _no_data(ax)
    inside_x = inside_y = False
    if not data.empty:
        inside_x, inside_y = _draw_noise(ax, res, data, x_metric, y_metric, handles)
    ax.set_xlabel(better(x_metric, x_mode) + (" →" if x_mode == "max" else " ←")
                  + (f"\n{ALL_WITHIN}" if inside_x else ""))
    ax.set_ylabel(better(y_metric, y_mode) + (f"\n{ALL_WITHIN}" if inside_y else ""))
    ax.set_title(f"{res.experiment}: {x_metric} vs {y_metric} ({title})", fontsize=9 if res.replicated else None)
    ax.grid(alpha=0.3)
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="best", framealpha=0.85)
    return fig


ALL_WITHIN = "(every point within the noise of the λ=0 baseline)"


def _widened(lim: tuple[float, float], edges: list[float]) -> tuple[float, float]:
    """Axis limits ``lim`` widened, with a margin, to hold every band edge in ``edges``."""
    lo, hi = min([lim[0], *edges]), max([lim[1], *edges])
    if (lo, hi) == tuple(lim):
        return lim
    pad = 0.04 * (hi - lo)
    return (lo - pad if lo < lim[0] else lim[0], hi + pad if hi > lim[1] else lim[1])


def _band_range(band: tuple[float, float, float]) -> str:
    """``0.72 to 1.00``: a band's edges at the precision its width needs."""
    from .summary import round_to
    lo, hi = round_to(band[1], band[2] - band[1]), round_to(band[2], band[2] - band[1])
    return f"{lo} to {hi}"
DENSE_POINTS = 2000  # beyond this many points a frontier plot draws their density and the fronts only


def baseline_bands(res: Results, metric: str) -> dict[str, tuple[float, float, float]]:
    """Per baseline configuration (its id) with two or more ok runs: (mean, lo, hi), the 95 % band of one
    more run of the baseline on ``metric`` (``noise.band_of``), clipped to the metric's range (``metric_bounds``:
    no accuracy band past 1)."""
    c = res.configs
    if c is None or metric not in c:
        return {}
    out = {}
    for _, r in c[(c["role"] == "baseline") & c["_ok"]].iterrows():
        n = r.get(f"{metric}_n")
        mean, lo, hi = band_of(float(r[metric]), float(r.get(f"{metric}_std", np.nan)), int(n) if pd.notna(n) else 0)
        if np.isfinite(lo):
            lo, hi = clip_interval(metric, lo, hi, c[metric])
            out[str(r[CONFIG_ID])] = (mean, float(lo), float(hi))
    return out


def within_noise(res: Results, df: pd.DataFrame, metric: str) -> np.ndarray:
    """For each row of ``df`` (trials or configurations): is it within the noise of its own baseline on
    ``metric``? The report's test where the configurations table holds it (``<metric>_verdict``: a mean over
    several runs is judged by its own interval, a single run by the baseline's band); elsewhere, whether the
    value lies inside the baseline's band of one run. False where there is no baseline to compare with."""
    c = res.configs
    if c is None or CONFIG_ID not in df or not len(df):
        return np.zeros(len(df), dtype=bool)
    ids = df[CONFIG_ID].astype(str)
    if f"{metric}_verdict" in c:
        verdict = dict(zip(c[CONFIG_ID].astype(str), c[f"{metric}_verdict"].fillna("").astype(str)))
        return ids.map(verdict).fillna("").eq(WITHIN).to_numpy()
    bands = baseline_bands(res, metric)
    base_of = dict(zip(c[CONFIG_ID].astype(str), c["baseline_id"]))
    out = np.zeros(len(df), dtype=bool)
    for i, (cid, v) in enumerate(zip(ids, numeric(df[metric]).to_numpy())):
        band = bands.get(str(base_of.get(cid)))
        out[i] = band is not None and np.isfinite(v) and band[1] <= v <= band[2]
    return out


def _draw_noise(ax, res: Results, data: pd.DataFrame, x: str, y: str, handles: list) -> tuple[bool, bool]:
    """The baselines' means (dashed) and 95 % bands of one run on both axes: a light fill with its edges
    drawn (dotted, ``gid="band-edge"``) and the axes widened to show both edges, so a band wider than the
    points never fills the plot without showing where it ends; the legend gives each band's range. The points
    within the noise on both axes (``within_noise``) are redrawn hollow. Returns whether every non-baseline
    point is within the noise on x, on y."""
    bx, by = baseline_bands(res, x), baseline_bands(res, y)
    if not bx and not by:
        return False, False
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    edge = dict(color="0.35", ls=":", lw=1.1, zorder=1, gid="band-edge")
    for mean, lo, hi in bx.values():
        ax.axvspan(lo, hi, color="0.5", alpha=0.07, lw=0, zorder=0)
        ax.axvline(lo, **edge)
        ax.axvline(hi, **edge)
        ax.axvline(mean, color="0.3", ls="--", lw=0.9, zorder=1)
    for mean, lo, hi in by.values():
        ax.axhspan(lo, hi, color="0.5", alpha=0.07, lw=0, zorder=0)
        ax.axhline(lo, **edge)
        ax.axhline(hi, **edge)
        ax.axhline(mean, color="0.3", ls="--", lw=0.9, zorder=1)
    ax.set_xlim(_widened(xlim, [v for b in bx.values() for v in b[1:]]))
    ax.set_ylim(_widened(ylim, [v for b in by.values() for v in b[1:]]))
    ranges = [f"{m} {_band_range(b)}" for m, bands in ((x, bx), (y, by)) for b in bands.values()]
    handles.append(Patch(facecolor="0.5", alpha=0.15, edgecolor="0.35", linestyle=":",
                         label="λ=0 baseline: mean (dashed), 95 % band of one run (dotted edges)\n"
                               + ", ".join(ranges)))
    cem = data[~data["_baseline"]]
    in_x, in_y = within_noise(res, cem, x), within_noise(res, cem, y)
    both = cem[in_x & in_y]
    if len(cem) > DENSE_POINTS:   # only the drawn fronts are redrawn hollow
        both = both.iloc[0:0]
    if len(both):
        ax.scatter(both[x], both[y], s=52, facecolors="white", edgecolors=[res.colors.get(s, "black")
                   for s in both["_surrogate"]], lw=1.2, zorder=4.5)  # fmt: skip
        handles.append(Line2D([], [], color="0.3", marker="o", markerfacecolor="white", lw=0,
                              label="within the noise of λ=0 on both axes"))
    return bool(len(cem)) and bool(in_x.all()), bool(len(cem)) and bool(in_y.all())


def _without_skipped_attacks(df: pd.DataFrame, *metrics: str) -> pd.DataFrame:
    """``df`` less the rows whose attack did not run, when one of ``metrics`` is an attack metric."""
    if "_attack_skipped" in df and any(is_attack_metric(m) for m in metrics):
        return df[~df["_attack_skipped"]]
    return df


def trials_drawn(res: Results, y_metric: str) -> pd.DataFrame:
    """The trials a single-run frontier plot of ``y_metric`` draws: ok, both metrics known, the attack run."""
    x_metric = res.objectives[0]["metric"]
    return _without_skipped_attacks(res.ok, x_metric, y_metric).dropna(subset=[x_metric, y_metric])


def configs_drawn(res: Results, y_metric: str) -> pd.DataFrame:
    """The configurations a replicated frontier plot of ``y_metric`` draws: an ok run, both means known (a
    configuration whose attacks were all skipped has NaN attack means)."""
    if res.configs is None:
        return pd.DataFrame()
    x_metric = res.objectives[0]["metric"]
    return res.configs[res.configs["_ok"]].dropna(subset=[x_metric, y_metric])


def replicate_caption(res: Results, y_metric: str | None = None, spread: str = "95 % CI") -> str:
    """"mean ± 95 % CI over N seeds": N the runs behind the statistics of the configurations drawn against
    ``y_metric`` (``stats_runs``; all configurations with an ok run without it); a range when they differ."""
    if res.configs is None:
        return f"mean ± {spread} over the seeds"
    cfg = configs_drawn(res, y_metric) if y_metric is not None else res.configs[res.configs["_ok"]]
    if y_metric is not None:
        y_metric = [y_metric, res.objectives[0]["metric"]]
    if cfg.empty:
        return f"mean ± {spread} over the seeds"
    lo, hi = stats_runs(cfg, y_metric or [])
    n = str(lo) if lo == hi else f"{lo}–{hi}"
    return f"mean ± {spread} over {n} seed{'s' * (hi != 1)}"


def stats_runs(cfg: pd.DataFrame, metrics) -> tuple[int, int]:
    """The fewest and most runs behind the statistics of ``cfg``'s configurations on ``metrics`` (``<m>_n``:
    a confirmed configuration's confirmation runs only, not the search's run the choice was made on), the
    ok runs where the table has no count."""
    cols = [f"{m}_n" for m in metrics if f"{m}_n" in cfg]
    n = cfg[cols].apply(pd.to_numeric, errors="coerce").max(axis=1) if cols else cfg["runs_ok"]
    n = n.fillna(cfg["runs_ok"]).astype(int)
    return int(n.min()), int(n.max())


def _ci(df: pd.DataFrame, metric: str) -> np.ndarray:
    """Half-widths of the 95 % CI of ``metric``'s mean (0 where unknown: a single run draws no bar)."""
    col = f"{metric}_ci95"
    if col not in df:
        return np.zeros(len(df))
    return np.nan_to_num(numeric(df[col]).to_numpy(), nan=0.0)


def _bars(values: np.ndarray, half: np.ndarray, metric: str, every) -> np.ndarray:
    """(2, n) error-bar lengths below and above ``values``: the CI's half-width, cut where it would leave the
    metric's range (``metric_bounds``: no accuracy interval past 1, none below 0)."""
    lo, hi = clip_interval(metric, values - half, values + half, every)
    return np.nan_to_num(np.vstack([values - lo, hi - values]), nan=0.0).clip(min=0.0)


def _errorbar(ax, df: pd.DataFrame, x: str, y: str, **kw) -> None:
    xs, ys = df[x].to_numpy(dtype=float), df[y].to_numpy(dtype=float)
    ax.errorbar(xs, ys, xerr=_bars(xs, _ci(df, x), x, df[x]), yerr=_bars(ys, _ci(df, y), y, df[y]),
                linestyle="none", elinewidth=0.9, capsize=2.5, **kw)  # fmt: skip


def _hv_curve(df: pd.DataFrame, res: Results) -> np.ndarray:
    df = df.sort_values("_order")
    values = np.column_stack([df[m].to_numpy(dtype=float) for m in res.metrics])
    values[~df["_ok"].to_numpy()] = np.nan  # errored trials complete but add nothing
    return hypervolume_curve(values, res.modes, [o["ref"] for o in res.objectives])


def plot_hypervolume(res: Results, path: Path) -> tuple[Path, float]:
    """Hypervolume after each completed trial, overall and per surrogate; returns (path, final hv)."""
    trials = res.trials.sort_values("_order")
    fig = _new_figure(7.5, 4.2)
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
            ax.step(position[sub.index], _hv_curve(sub, res), where="post", color=res.colors[s], lw=1.3, label=s)
        ax.legend(fontsize=8, loc="lower right")
    else:
        _no_data(ax, "no trials")
    refs = ", ".join(f"{o['metric']} {o['mode']} ref {format_value(o['ref'])}" for o in res.objectives)
    ax.set_xlabel("completed trials (all surrogates, finish order)")
    ax.set_ylabel("hypervolume (higher is better)")
    ax.set_title(f"hypervolume: {refs}", fontsize=9)
    ax.grid(alpha=0.3)
    return _save(fig, path), final


def param_columns(res: Results) -> list[str]:
    """The main parameters that take two or more values among the ok trials that use them."""
    ok = res.ok
    out = []
    for c in MAIN_PARAMS:
        if c in ok and ok.loc[uses_param(res, c)[ok.index], c].dropna().nunique() >= 2:
            out.append(c)
    return out


def wrapped(label: str, width: int = 28) -> str:
    """A y label of a small panel on two lines when long: ``attack_ssim_paper\n(lower = more private)``."""
    if len(label) <= width or " (" not in label:
        return label
    head, rest = label.split(" (", 1)
    return f"{head}\n({rest}"


def plot_param_effects(res: Results, param: str, path: Path) -> Path:
    """Each objective against one parameter (small multiples), coloured by surrogate; only the trials whose
    surrogate uses ``param`` (λ = 0 baselines only for λ and σ)."""
    ok = res.ok[uses_param(res, param)[res.ok.index]]
    n = len(res.objectives)
    fig = _new_figure(4.0 * n, 3.4, top_in=0.5)
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
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(f"effect of {short(param)}", fontsize=10)
    return _save(fig, path)


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
    fig = _new_figure(4.0 * len(metrics), 3.4, top_in=0.5)
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
            ax.errorbar(x, y, yerr=_bars(y, err, m, cfg[mean]), marker="o", ms=4, lw=1.3, capsize=2.5,
                        color=res.colors[s], label=s)
        b = np.array([float(base[mean])])
        ax.errorbar([0.0], b, yerr=_bars(b, np.nan_to_num([float(base.get(std, np.nan))]), m, cfg[mean]),
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
    return _save(fig, path)


def plot_training_curves(res: Results, path: Path) -> Path | None:
    """test_acc and feature_spread per epoch for the front's trials; None without epoch data."""
    if res.epochs is None:
        return None
    front = res.front.head(MAX_CURVES)
    epochs = res.epochs[res.epochs["trial_id"].isin(front["trial_id"])]
    panels = [c for c in ("test_acc", "feature_spread") if c in epochs and epochs[c].notna().any()]
    if epochs.empty or not panels:
        return None
    fig = _new_figure(5.0 * len(panels), 3.6, top_in=0.5)
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
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle("training curves of the front's trials", fontsize=10)
    return _save(fig, path)
