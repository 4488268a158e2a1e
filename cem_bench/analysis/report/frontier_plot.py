"""The frontier plots: the first objective against each privacy metric, one point per trial (or, with
replicates, per configuration at its means with 95 % CI error bars), the fronts, and each λ = 0 baseline's mean
and 95 % band of one run on both axes (one band per baseline: per σ on a σ grid), and, with replicates and λ = 0
at two σ or more, the noise-alone curve through the baselines' means."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from cem_bench.analysis.aggregate import BASELINE, CONFIG_ID, CONFIRMED
from cem_bench.analysis.noise import WITHIN, band_of

from .facts import searched_columns
from .formatting import better, format_value, plural
from .load import BASELINE_LABEL, NOISE_COL, SURROGATE_COL, Results, front_of, is_attack_metric, numeric
from .plots import bars, clip_interval, legend_below, new_figure, no_data, save, title_text


def _step(ax, front: pd.DataFrame, x: str, y: str, x_mode: str, **kw) -> None:
    """The attainment boundary of the points ``front`` (mutually non-dominated): with x maximised, the point
    covering (x_{i-1}, x_i] is point i."""
    if front.empty:
        return
    front = front.sort_values([x, y])
    ax.step(front[x], front[y], where="pre" if x_mode == "max" else "post", **kw)


def _front_line(ax, df: pd.DataFrame, x: str, y: str, x_mode: str, y_mode: str, **kw) -> None:
    _step(ax, front_of(df, [x, y], [x_mode, y_mode]), x, y, x_mode, **kw)


def plot_frontier(res: Results, y_metric: str, y_mode: str, path: Path) -> Path:
    """First objective (x) against ``y_metric`` (``frontier_figure``), saved to ``path``."""
    return save(frontier_figure(res, y_metric, y_mode), path)


def eligible(res: Results, df: pd.DataFrame) -> np.ndarray:
    """Per row of ``df`` (configurations or trials): may it be on the page's front? With confirmation only the
    baselines and the confirmed configurations (docs/protocol.md §8: a configuration the search chose on one
    lucky run is not on the front the page states); else every row."""
    if not (res.confirmed and res.replicated) or "role" not in df:   # configurations' roles, not trials
        return np.ones(len(df), dtype=bool)
    return df["role"].isin([BASELINE, CONFIRMED]).to_numpy()


def on_page_front(res: Results, df: pd.DataFrame) -> np.ndarray:
    """Per row of ``df``: is it on the front the page's table lists? With replicates the configurations of
    ``Results.front_configs`` (``final_front``: the confirmed front when confirmation ran); else the trials of
    ``pareto_rank`` 0. Over all the search's objectives, which a plot of two of them may not show."""
    if res.replicated:
        ids = set(res.front_configs[CONFIG_ID].astype(str)) if len(res.front_configs) else set()
        return df[CONFIG_ID].astype(str).isin(ids).to_numpy() if CONFIG_ID in df else np.zeros(len(df), bool)
    return (df["pareto_rank"] == 0).to_numpy() if "pareto_rank" in df else np.zeros(len(df), dtype=bool)


def front_labels(res: Results, x_metric: str, y_metric: str) -> tuple[str, str | None]:
    """The legend's words for the black step line and for the ringed points. Where the page's objectives are
    these two metrics, both are the page's front: one entry. Else (a third objective, or a privacy metric that
    is no objective) the line is the front of the two metrics alone, which is not the page's, and the rings
    mark the page's front."""
    what = ("baseline and confirmed means" if res.confirmed else "configuration means" if res.replicated
            else "all trials")
    if len(res.metrics) == 2 and {x_metric, y_metric} == set(res.metrics):
        return (f"{'confirmed front' if res.confirmed else 'front'} ({what})", None)
    page = "the confirmed front" if res.confirmed else "the front of all objectives"
    return (f"front of {x_metric} and {y_metric} alone ({what})", f"on {page} ({', '.join(res.metrics)})")


def frontier_figure(res: Results, y_metric: str, y_mode: str) -> Figure:
    """First objective (x) against ``y_metric``: one point per trial, or, when the search has replicates, one
    point per configuration at its means with the 95 % CI as error bars (``configs_drawn``); coloured by
    surrogate, each surrogate's own front, the front of the two metrics (black step line, ``gid="front"``) and
    the page's front ringed (``on_page_front``; ``gid="page-front"``): the same points where the page's
    objectives are these two metrics (``front_labels``). With confirmation, the configurations not confirmed
    are drawn faded, on no front. The legend lies under the axes (``plots.legend_below``)."""
    x_metric, x_mode = res.objectives[0]["metric"], res.objectives[0]["mode"]
    if res.replicated:
        data = configs_drawn(res, y_metric)

        def points(ax, df, color, label, base, faded=False):
            _errorbar(ax, df, x_metric, y_metric, marker="X" if base else "o",
                      markersize=9 if base else 6 if faded else 7, color=color,
                      alpha=0.35 if faded else 1.0 if base else 0.8, zorder=2 if faded else BASE_Z if base else 3,
                      label=label, gid="baseline" if base else None)  # fmt: skip
        empty = "no configuration with an ok run and these metrics"
        title = f"{plural(len(data), 'configuration')}, {replicate_caption(res, y_metric)}"
    else:
        data = trials_drawn(res, y_metric)

        def points(ax, df, color, label, base, faded=False):
            ax.scatter(df[x_metric], df[y_metric], s=80 if base else 28, marker="X" if base else "o", color=color,
                       alpha=1.0 if base else 0.75, edgecolors="none", zorder=BASE_Z if base else 3,
                       gid="baseline" if base else None)
        empty, title = None, plural(len(data), "ok trial")
    front_label, ring_label = front_labels(res, x_metric, y_metric)
    fig = new_figure(7.5, 5.0)
    ax = fig.add_subplot()
    handles = []
    dense = len(data) > DENSE_POINTS
    can = eligible(res, data)
    shown, faded = data[can], data[~can]
    if dense:   # thousands of points: their density, and each surrogate's own front drawn on top
        rest = data[~data["_baseline"]]
        ax.hexbin(rest[x_metric].to_numpy(dtype=float), rest[y_metric].to_numpy(dtype=float), gridsize=70,
                  cmap="Greys", bins="log", mincnt=1, linewidths=0, zorder=1)
        handles.append(Patch(facecolor="0.45", label=f"density of all {len(rest):,} points (log)"))
    for s in res.surrogates:
        sub = shown[(shown["_surrogate"] == s) & ~shown["_baseline"]]
        pale = faded[(faded["_surrogate"] == s) & ~faded["_baseline"]] if not dense else faded.iloc[0:0]
        if sub.empty and pale.empty:
            continue
        color = res.colors[s]
        if len(sub):
            points(ax, front_of(sub, [x_metric, y_metric], [x_mode, y_mode]) if dense else sub, color, s, False)
            _front_line(ax, sub, x_metric, y_metric, x_mode, y_mode, color=color, lw=1.0, alpha=0.8, zorder=2)
        if len(pale):
            points(ax, pale, color, f"{s} (not confirmed)", False, faded=True)
        handles.append(Line2D([], [], color=color, marker="o", lw=1.0, label=s))
    if len(faded) and not dense:
        handles.append(Line2D([], [], color="0.5", marker="o", markersize=6, alpha=0.4, lw=0,
                              label=f"not confirmed ({plural(len(faded), 'configuration')}: the search's runs "
                                    f"only), on no front"))
    base = shown[shown["_baseline"]]
    if not base.empty:
        points(ax, base, "black", BASELINE_LABEL, True)
        handles.append(Line2D([], [], color="black", marker="X", lw=0, markersize=8, label=BASELINE_LABEL))
        if res.replicated:
            _noise_alone(ax, res, base, x_metric, y_metric, handles)
    if not data.empty:
        ring = data[on_page_front(res, data)]
        line = ring if ring_label is None else front_of(shown, [x_metric, y_metric], [x_mode, y_mode])
        _step(ax, line, x_metric, y_metric, x_mode, color="black", lw=2.2, alpha=0.9, zorder=5, gid="front")
        ax.scatter(ring[x_metric], ring[y_metric], s=90, facecolors="none", edgecolors="black", lw=1.3, zorder=6,
                   gid="page-front")  # fmt: skip
        if ring_label is None:
            handles.append(Line2D([], [], color="black", lw=2.2, marker="o", markersize=9, markerfacecolor="none",
                                  label=front_label))  # fmt: skip
        else:
            handles.append(Line2D([], [], color="black", lw=2.2, label=front_label))
            handles.append(Line2D([], [], color="black", lw=0, marker="o", markersize=9, markerfacecolor="none",
                                  label=ring_label))  # fmt: skip
    else:
        no_data(ax, empty) if empty else no_data(ax)
    inside_x = inside_y = False
    if not data.empty:
        inside_x, inside_y = _draw_noise(ax, res, data, shown, x_metric, y_metric, handles)
    ax.set_xlabel(better(x_metric, x_mode) + (" →" if x_mode == "max" else " ←")
                  + (f"\n{ALL_WITHIN}" if inside_x else ""))
    ax.set_ylabel(better(y_metric, y_mode) + (f"\n{ALL_WITHIN}" if inside_y else ""))
    ax.set_title(title_text(f"{res.experiment}: {x_metric} vs {y_metric} ({title})", name=res.experiment),
                 fontsize=9)
    ax.grid(alpha=0.3)
    legend_below(fig, ax, handles)
    return fig


NOISE_ALONE_LABEL = "noise alone: λ=0 over σ (its means, joined in σ order)"


def noise_alone_curves(res: Results, base: pd.DataFrame) -> list[pd.DataFrame]:
    """The λ = 0 configurations of ``base`` (configuration means) that differ in σ alone, one frame per set of
    the other searched keys outside ``cem.`` (a baseline cell is one such combination: docs/search-spaces.md),
    sorted by σ; only sets of two σ or more. What more noise alone buys is the comparison a defense has to win
    (docs/estimators.md, "beyond noise alone"): drawn as a line, a CEM point left of it (less accurate at its
    privacy) or above it is visibly not beyond the noise."""
    if NOISE_COL not in base or base[NOISE_COL].nunique() < 2:
        return []
    keys = [c for c in (res.searched or searched_columns(res)) if c in base and c != NOISE_COL
            and not c.startswith("config.cem.") and c != SURROGATE_COL
            # a key that σ alone decides (attack.rmle_tv_weight's default follows σ) sets no curve apart
            and base.groupby(NOISE_COL)[c].apply(lambda v: v.astype(str).nunique(dropna=False)).max() > 1]
    groups = base.groupby(keys, dropna=False, sort=False) if keys else [((), base)]
    return [g.sort_values(NOISE_COL, kind="stable") for _, g in groups if g[NOISE_COL].nunique() >= 2]


def _noise_alone(ax, res: Results, base: pd.DataFrame, x: str, y: str, handles: list) -> None:
    """``noise_alone_curves`` drawn: a thin dotted black line through the baselines' crosses
    (``gid="noise-alone"``), each cross labelled with its σ."""
    curves = noise_alone_curves(res, base)
    for curve in curves:
        ax.plot(curve[x], curve[y], color="black", ls=":", lw=1.3, zorder=BASE_Z - 0.5, gid="noise-alone")
        for _, row in curve.iterrows():
            ax.annotate(f"σ={format_value(float(row[NOISE_COL]))}", (row[x], row[y]), xytext=(6, 6),
                        textcoords="offset points", fontsize=7, zorder=BASE_Z)
    if curves:
        handles.append(Line2D([], [], color="black", ls=":", lw=1.3, label=NOISE_ALONE_LABEL))


ALL_WITHIN = "(every point within the noise of the λ=0 baseline)"
# the λ = 0 cross above the front's step line (5) and ring (6): a baseline on the front was hidden under them
BASE_Z = 7


def _widened(lim: tuple[float, float], edges: list[float]) -> tuple[float, float]:
    """Axis limits ``lim`` widened, with a margin, to hold every band edge in ``edges``."""
    lo, hi = min([lim[0], *edges]), max([lim[1], *edges])
    if (lo, hi) == tuple(lim):
        return lim
    pad = 0.04 * (hi - lo)
    return (lo - pad if lo < lim[0] else lim[0], hi + pad if hi > lim[1] else lim[1])


def _band_range(band: tuple[float, float, float]) -> str:
    """``0.72 to 1.00``: a band's edges at the precision its width needs."""
    from .formatting import round_to
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
    ``noise.MIN_RUNS`` or more runs judged by its own interval; fewer runs have no verdict, so False). A metric
    the report does not compare (attack_psnr, attack_mse, ...: no ``<metric>_verdict``) is untested: False, as
    where there is no baseline. Until 2026-12-06 such a metric took "the mean inside the baseline's band of one
    run" instead, and a point that Welch's test put beyond the noise (p 0.011) was drawn hollow, its axis
    labelled "every point within the noise"."""
    c = res.configs
    if c is None or CONFIG_ID not in df or not len(df) or f"{metric}_verdict" not in c:
        return np.zeros(len(df), dtype=bool)
    ids = df[CONFIG_ID].astype(str)
    verdict = dict(zip(c[CONFIG_ID].astype(str), c[f"{metric}_verdict"].fillna("").astype(str)))
    return ids.map(verdict).fillna("").eq(WITHIN).to_numpy()


def band_names(res: Results, ids) -> dict[str, str]:
    """Per baseline configuration (its id): ``σ=0.05``, its ``defense.noise_std``, which tells the bands of a
    σ grid apart; with its id where σ is unknown or two bands share one (they differ in another key)."""
    c = res.configs.set_index(res.configs[CONFIG_ID].astype(str)) if res.configs is not None else pd.DataFrame()
    sigma = numeric(c[NOISE_COL]) if NOISE_COL in c else pd.Series(np.nan, index=c.index)
    out = {i: (f"σ={format_value(float(sigma[i]))}" if i in sigma.index and pd.notna(sigma[i]) else "") for i in ids}
    seen = Counter(out.values())
    return {i: name if name and seen[name] == 1 else f"{name} ({i})".strip() for i, name in out.items()}


def _draw_noise(ax, res: Results, data: pd.DataFrame, shown: pd.DataFrame, x: str, y: str,
                handles: list) -> tuple[bool, bool]:
    """Each baseline's mean (dashed) and 95 % band of one run on both axes: a light fill with its edges
    drawn (dotted, ``gid="band-edge"``), one shade of grey per baseline, and the axes widened to show both
    edges, so a band wider than the points never fills the plot without showing where it ends; the legend has
    one entry per band, named by its σ (``band_names``), with its ranges. The points of ``shown`` (those
    drawn in full) within the noise on both axes (``within_noise``) are redrawn hollow. Returns whether every
    non-baseline point of ``data`` is within the noise on x, on y."""
    bx, by = baseline_bands(res, x), baseline_bands(res, y)
    if not bx and not by:
        return False, False
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    ids = list(dict.fromkeys([*bx, *by]))
    names = band_names(res, ids)
    handles.append(Line2D([], [], color="0.3", ls="--", lw=0.9,
                          label="λ=0 baseline: mean (dashed), 95 % band of one run (dotted edges)"))
    for k, cid in enumerate(ids):
        shade = str(round(0.2 + 0.45 * k / max(len(ids) - 1, 1), 3))
        # the dots' spacing differs too: greys alone are hard to tell apart
        edge = dict(color=shade, ls=(0, (1, 1.5 + k % 4)), lw=1.1, zorder=1, gid="band-edge")
        for bands, span, line in ((bx, ax.axvspan, ax.axvline), (by, ax.axhspan, ax.axhline)):
            if cid not in bands:
                continue
            mean, lo, hi = bands[cid]
            span(lo, hi, color=shade, alpha=0.07, lw=0, zorder=0)
            line(lo, **edge)
            line(hi, **edge)
            line(mean, color=shade, ls="--", lw=0.9, zorder=1)
        ranges = [f"{m} {_band_range(bands[cid])}" for m, bands in ((x, bx), (y, by)) if cid in bands]
        handles.append(Patch(facecolor=shade, alpha=0.2, edgecolor=shade, linestyle=edge["ls"],
                             label=f"{BASELINE_LABEL} {names[cid]}: {', '.join(ranges)}"))
    ax.set_xlim(_widened(xlim, [v for b in bx.values() for v in b[1:]]))
    ax.set_ylim(_widened(ylim, [v for b in by.values() for v in b[1:]]))
    cem = data[~data["_baseline"]]
    in_x, in_y = within_noise(res, cem, x), within_noise(res, cem, y)
    drawn = shown[~shown["_baseline"]]
    both = drawn[within_noise(res, drawn, x) & within_noise(res, drawn, y)]
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


def _errorbar(ax, df: pd.DataFrame, x: str, y: str, **kw) -> None:
    xs, ys = df[x].to_numpy(dtype=float), df[y].to_numpy(dtype=float)
    ax.errorbar(xs, ys, xerr=bars(xs, _ci(df, x), x, df[x]), yerr=bars(ys, _ci(df, y), y, df[y]),
                linestyle="none", elinewidth=0.9, capsize=2.5, **kw)  # fmt: skip
