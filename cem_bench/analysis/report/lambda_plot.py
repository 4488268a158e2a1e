"""The trade-off over λ: one curve per surrogate of a replicated λ sweep, starting from the λ = 0 baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cem_bench.analysis.aggregate import CONFIG_ID, config_columns
from cem_bench.schema import EXECUTION_KEYS

from .formatting import better, format_value, is_missing, short, varies
from .frontier_plot import stats_runs
from .load import BASELINE_LABEL, LAMBD_COL, NOISE_COL, SURROGATE_COL, Results, numeric
from .plots import bars, lambda_axis, legend_below, new_figure, save, wrapped

# distinct λ > 0 of one surrogate beyond which its λ values are not a grid (a random search's draws: one
# configuration per λ, a curve of single runs zigzagging over the other keys) and it gets no curve
MAX_CURVE_LAMBDAS = 20
# a surrogate's curves at most (one per value of its other varying keys: a σ grid's 5 σ, a few slot counts);
# beyond it those keys were drawn, not gridded (a random search's 100,000 trials: no per-curve pass over them)
MAX_CURVES = 24


def _hashable(v):
    """A config cell as a dict key: lists and arrays (milestones) by their items, every missing value alike."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(np.ravel(v).tolist())
    return None if is_missing(v) else v


def _curves(res: Results) -> tuple[pd.DataFrame | None, dict[str, str]]:
    """``lambda_curves`` and, per surrogate of the sweep left without a curve (or without some), why."""
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
    # the keys the baselines differ in title the rows (σ=0.05): a curve's label leaves them out
    row_keys = {c for c in fixed if varies(bases[c]) or (bases[c].isna().any() and bases[c].notna().any())}
    keep, curve_of, label_of, base_of, gaps = [], {}, {}, {}, {}
    for s in res.surrogates:
        sub = cfg[(cfg["_surrogate"] == s) & (cfg["_lam"] > 0)]
        if sub.empty:
            continue
        n_lam = sub["_lam"].nunique()
        if n_lam > MAX_CURVE_LAMBDAS:
            gaps[s] = f"its {n_lam} λ values are not a grid (more than {MAX_CURVE_LAMBDAS})"
            continue
        moving = [c for c in fixed if varies(sub[c]) or (sub[c].isna().any() and sub[c].notna().any())]
        # one curve per value of the keys that move among the surrogate's configurations (a σ grid: one per σ,
        # each from its own baseline); a key that moves with λ instead leaves one λ at each of its values
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(sub[moving].itertuples(index=False) if moving else [()] * len(sub)):
            groups.setdefault(tuple(_hashable(v) for v in row), []).append(i)
        if len(groups) > MAX_CURVES:
            gaps[s] = (f"{', '.join(short(c) for c in moving)} take{'s' * (len(moving) == 1)} {len(groups)} values "
                       f"along its λ values (a curve each: more than {MAX_CURVES})")
            continue
        drawn, single, why = 0, [], []
        for key, rows in groups.items():
            g = sub.iloc[rows]
            where = ", ".join(f"{short(c)}={format_value(v)}" for c, v in zip(moving, key))
            at = f"at {where}: " if where else ""
            if moving and g["_lam"].nunique() < 2:
                single.append(where)
            elif g["_lam"].duplicated().any():
                why.append(f"{at}two configurations share a λ")
            elif (base := _baseline_of(g, bases)) is None:
                why.append(f"{at}no λ=0 baseline with its other keys")
            else:
                keep += [base, *g[CONFIG_ID]]
                curve_of.update(dict.fromkeys(g[CONFIG_ID], where))
                label_of.update(dict.fromkeys(g[CONFIG_ID], ", ".join(
                    f"{short(c)}={format_value(v)}" for c, v in zip(moving, key) if c not in row_keys)))
                base_of.update(dict.fromkeys(g[CONFIG_ID], base))
                drawn += 1
        if single and not drawn and not why:
            gaps[s] = f"{', '.join(short(c) for c in moving)} also var{'y' if len(moving) > 1 else 'ies'} along its λ values"
        elif single or why:
            gaps[s] = "; ".join(why + ([f"one λ only at {'; '.join(single)}"] if single else []))
    if not keep:
        return None, gaps
    out = cfg[cfg[CONFIG_ID].isin(set(keep))]
    return out.assign(_curve=out[CONFIG_ID].map(curve_of).fillna(""),
                      _curve_label=out[CONFIG_ID].map(label_of).fillna(""), _base=out[CONFIG_ID].map(base_of)), gaps


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
    """The configurations of a λ sweep with replicates that its curves draw: per surrogate, one curve per value
    of the other keys that vary among its configurations (a σ grid: one per σ), each one configuration per
    λ > 0 with every other key fixed, and the λ = 0 baseline it is compared with; ``_curve`` names a curve's
    other keys (empty where none vary), ``_curve_label`` those of them the baselines do not differ in (its row's
    title names the others), ``_base`` its baseline's id. None when the results are not one (no
    replicates, fewer than two λ > 0, no baseline) or no surrogate has such a curve. A key that moves with λ
    (``num_slots`` 2 at λ 2, 8 at λ 8: a line would join them as if λ alone moved) leaves one λ at each of its
    values, so no curve; more than ``MAX_CURVE_LAMBDAS`` λ values of one surrogate are a random search's draws,
    not a grid, and so are more than ``MAX_CURVES`` values of its other keys (``lambda_curves_note`` says which
    and why)."""
    return _curves(res)[0]


def lambda_curves_note(res: Results) -> str | None:
    """What the page says under the λ curves about the surrogates it drew none (or not all) for (None: none
    left out)."""
    cfg, gaps = _curves(res)
    if cfg is None or not gaps:
        return None
    return "No curve for " + "; ".join(f"{s}: {why}" for s, why in gaps.items()) + "."


# line styles of a surrogate's curves that share one baseline (two num_slots on one σ's row)
STYLES = ("-", "--", ":", "-.")


def _rows(bases: pd.DataFrame) -> list[str]:
    """The baselines' ids in the order of their rows: by σ where the table has it, then by id."""
    sigma = numeric(bases[NOISE_COL]) if NOISE_COL in bases else pd.Series(np.nan, index=bases.index)
    order = pd.DataFrame({"_s": sigma.to_numpy(), "_id": bases[CONFIG_ID].astype(str).to_numpy()})
    return list(order.sort_values(["_s", "_id"], kind="stable")["_id"])


def _row_titles(bases: pd.DataFrame, rows: list[str]) -> dict[str, str]:
    """Per baseline (its id), the keys that tell the rows apart (``σ=0.05``; ``model.width=0.25, σ=0.1``);
    {} for one row."""
    if len(rows) < 2:
        return {}
    keys = [c for c in config_columns(bases) if c.removeprefix("config.") not in EXECUTION_KEYS and varies(bases[c])]
    name = {NOISE_COL: "σ"}
    return {bid: ", ".join(f"{name.get(c, short(c))}={format_value(bases.loc[bid, c])}" for c in keys) or bid
            for bid in rows}


def plot_lambda_curves(res: Results, path: Path) -> Path | None:
    """One curve per surrogate over λ (symlog; λ = 0 is the baseline every curve starts from): the first
    objective, the within-class feature spread and each privacy objective, mean ± std over the seeds. A row of
    panels per λ = 0 baseline (a σ grid: a row per σ, its curves from its own baseline); a surrogate with two
    curves on one row (another key crossed with λ) draws them in two line styles, named by that key."""
    cfg = lambda_curves(res)
    if cfg is None:
        return None
    metrics = [res.objectives[0]["metric"], "feature_spread",
               *[o["metric"] for o in res.objectives[1:] if o["metric"] != "feature_spread"]]
    metrics = [m for m in dict.fromkeys(metrics) if f"{m}_mean" in cfg]
    bases = cfg[cfg["_lam"] == 0].set_index(CONFIG_ID, drop=False)
    curves = cfg[cfg["_lam"] > 0]
    rows = _rows(bases)
    names = _row_titles(bases, rows)
    fig = new_figure(4.0 * len(metrics), 3.4 * len(rows), top_in=0.5)
    if len(rows) > 1:
        fig.subplots_adjust(hspace=0.55)
    axes = fig.subplots(len(rows), len(metrics), squeeze=False)
    handles: dict[str, object] = {}
    # a surrogate's curves keep one line style and one legend entry across the rows (slot count 2 dashed on every σ)
    style = {(s, lbl): STYLES[k % len(STYLES)] for s, sub in curves.groupby("_surrogate")
             for k, lbl in enumerate(sorted(sub["_curve_label"].unique()))}
    for r, bid in enumerate(rows):
        on_row = curves[curves["_base"] == bid]
        base = bases.loc[bid]
        for ax, m in zip(axes[r], metrics):
            mean, std = f"{m}_mean", f"{m}_std"
            for s in res.surrogates:
                mine = on_row[on_row["_surrogate"] == s]
                for _, sub in mine.groupby("_curve", sort=True):
                    sub, where = sub.sort_values("_lam"), sub["_curve_label"].iloc[0]
                    x = np.concatenate([[0.0], sub["_lam"].to_numpy(dtype=float)])
                    y = np.concatenate([[float(base[mean])], numeric(sub[mean]).to_numpy()])
                    err = np.nan_to_num(np.concatenate([[float(base.get(std, np.nan))],
                                                        numeric(sub[std]).to_numpy()]))
                    label = f"{s} ({where})" if where else s
                    line = ax.errorbar(x, y, yerr=bars(y, err, m, cfg[mean]), marker="o", ms=4, lw=1.3,
                                       capsize=2.5, color=res.colors[s], ls=style[s, where], label=label)
                    handles.setdefault(label, line)
            b = np.array([float(base[mean])])
            cross = ax.errorbar([0.0], b, yerr=bars(b, np.nan_to_num([float(base.get(std, np.nan))]), m, cfg[mean]),
                                marker="X", ms=7, color="black", linestyle="none", capsize=2.5, label=BASELINE_LABEL)
            handles.setdefault(BASELINE_LABEL, cross)
            lambda_axis(ax, cfg["_lam"])
            ax.set_xlabel("cem.lambd (log; 0 = the baseline)")
            mode = next((o["mode"] for o in res.objectives if o["metric"] == m), None)
            ax.set_ylabel(wrapped(better(m, mode) if mode else m), fontsize=8)
            if names:
                ax.set_title(names[bid], fontsize=9)
            ax.grid(alpha=0.3)
    legend_below(fig, axes[-1][0], list(handles.values()), fontsize=7, max_cols=6)
    lo, hi = stats_runs(cfg, metrics)
    n = str(lo) if lo == hi else f"{lo}–{hi}"
    per = ", a row per λ=0 baseline" if len(rows) > 1 else ""
    fig.suptitle(f"trade-off over λ per surrogate{per}: mean ± std over {n} seed{'s' * (hi != 1)}", fontsize=10)
    return save(fig, path)
