"""Plots (matplotlib) and the self-contained HTML report of a results folder.

``build_report(results_dir)`` reads ``trials.parquet`` (and, when present, ``epochs.parquet``,
``search_space.json`` and each trial's ``recon.png``) and writes into ``results_dir/report``:

* ``frontier_<metric>.png``: the first objective (utility) against each privacy metric / objective
* ``hypervolume.png``: hypervolume after each completed trial, overall and per surrogate
* ``params_<key>.png``: each objective against each main searched parameter
* ``training_curves.png``: per-epoch curves of the front's trials
* ``galleries/<trial>.png``: reconstruction galleries of the front and of the best λ=0 baseline
* ``frontier.csv``: the front's trials (all columns)
* ``index.html``: everything above, relative links only, inline CSS, no external resources

Figures are built on ``matplotlib.figure.Figure`` objects (rendered by the Agg canvas) rather than
through pyplot, so the report never touches the process-wide backend or pyplot's figure registry and
no figure outlives its function.

Conventions: a trial is "ok" when ``status == "ok"``; the front is recomputed over the ok trials with
the search objectives (``pareto_rank`` 0; -1 for errored trials and trials with a NaN objective);
λ = 0 trials (``config.cem.lambd == 0``) are the baseline and are not counted as any surrogate.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from cem_bench.frontier import hypervolume_curve, pareto_mask, pareto_ranks

__all__ = [
    "DEFAULT_OBJECTIVES",
    "PRIVACY_MODES",
    "MAIN_PARAMS",
    "Results",
    "build_report",
    "load_results",
    "load_objectives",
    "add_pareto_ranks",
    "front_of",
    "plot_frontier",
    "plot_hypervolume",
    "plot_param_effects",
    "plot_training_curves",
    "copy_galleries",
    "summary_sentence",
    "html_table",
    "format_value",
]

DEFAULT_OBJECTIVES: list[dict] = [
    {"metric": "test_acc", "mode": "max", "ref": 0.1},
    {"metric": "attack_ssim", "mode": "min", "ref": 1.0},
]

# direction that means "more private" (worse reconstruction)
PRIVACY_MODES: dict[str, str] = {"attack_ssim": "min", "attack_mse": "max", "attack_psnr": "min"}

MAIN_PARAMS: list[str] = [
    "config.cem.lambd",
    "config.defense.noise_std",
    "config.cem.num_slots",
    "config.cem.num_iterations",
    "config.cem.snr_thresh",
    "config.cem.softplus_beta",
]

METRIC_COLUMNS: list[str] = [
    "test_acc",
    "test_acc_clean",
    "feature_spread",
    "attack_mse",
    "attack_psnr",
    "attack_ssim",
    "train_s",
    "attack_s",
    "wall_s",
]

SURROGATE_COL = "config.cem.surrogate"
LAMBD_COL = "config.cem.lambd"
BASELINE_LABEL = "λ=0 baseline"
NO_SURROGATE = "(none)"
MAX_GALLERY = 24  # front trials shown in the gallery (best first objective first)
MAX_CURVES = 12  # front trials drawn in the training curves

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
 color:#222;padding:0 1em;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}
h3{font-size:1.05em}
p.summary{font-size:1.05em;background:#f5f7fa;border-left:4px solid #4c72b0;padding:.6em 1em}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}
.gallery{display:flex;flex-wrap:wrap;gap:1em}
.gallery figure{flex:1 1 300px;max-width:380px;margin:0}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1.5em}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f0f0f0} td.s{text-align:left}
pre{white-space:pre-wrap;font-size:.8em;margin:0;max-height:14em;overflow:auto;text-align:left}
.note{color:#666;font-size:.9em}
"""


# ================================================================= loading
@dataclass
class Results:
    """Everything the report needs from a results folder."""

    results_dir: Path
    experiment: str
    objectives: list[dict]
    trials: pd.DataFrame  # all trials, with recomputed ``pareto_rank`` and helper columns
    epochs: pd.DataFrame | None
    surrogates: list[str] = field(default_factory=list)  # sorted, baseline excluded
    colors: dict[str, tuple] = field(default_factory=dict)

    @property
    def ok(self) -> pd.DataFrame:
        return self.trials[self.trials["_ok"]]

    @property
    def front(self) -> pd.DataFrame:
        first = self.objectives[0]
        front = self.trials[self.trials["pareto_rank"] == 0]
        return front.sort_values(first["metric"], ascending=first["mode"] == "min", kind="stable")

    @property
    def modes(self) -> list[str]:
        return [o["mode"] for o in self.objectives]

    @property
    def metrics(self) -> list[str]:
        return [o["metric"] for o in self.objectives]


def load_objectives(results_dir: str | Path) -> tuple[list[dict], str | None]:
    """Objectives (metric, mode, ref) and experiment name from ``search_space.json``; defaults if missing."""
    path = Path(results_dir) / "search_space.json"
    if not path.is_file():
        return [dict(o) for o in DEFAULT_OBJECTIVES], None
    spec = json.loads(path.read_text())
    objectives = spec.get("objectives") or DEFAULT_OBJECTIVES
    out = []
    for o in objectives:
        mode = o.get("mode", "max")
        if mode not in ("max", "min"):
            raise ValueError(f"{path}: objective {o.get('metric')!r} has mode {mode!r}; known: max, min")
        out.append({"metric": o["metric"], "mode": mode, "ref": o.get("ref")})
    return out, spec.get("name")


def _read_trials(results_dir: Path) -> pd.DataFrame:
    path = results_dir / "trials.parquet"
    if not path.is_file():
        try:
            from cem_bench.results import write_tables  # lazy: results.py reads Ray folders

            write_tables(results_dir)
        except Exception as exc:  # noqa: BLE001 - any failure means: no table to report on
            raise FileNotFoundError(
                f"{path} is missing and could not be created from the Ray experiment folder ({exc!r}). "
                f"Create it with cem_bench.results.write_tables({str(results_dir)!r}) "
                f"or point `cem-bench report` at a folder written by `cem-bench search`."
            ) from exc
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing and cem_bench.results.write_tables did not create it; "
                f"is {results_dir} a folder written by `cem-bench search`?"
            )
    return pd.read_parquet(path)


def _read_epochs(results_dir: Path) -> pd.DataFrame | None:
    path = results_dir / "epochs.parquet"
    if not path.is_file():
        return None
    epochs = pd.read_parquet(path)
    if epochs.empty or "trial_id" not in epochs or "epoch" not in epochs:
        return None
    epochs = epochs.copy()
    epochs["trial_id"] = epochs["trial_id"].astype(str)
    return epochs


def _numeric(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce").astype(float)


def add_pareto_ranks(trials: pd.DataFrame, objectives: Sequence[dict]) -> pd.DataFrame:
    """Recompute ``pareto_rank`` over ok trials (errored trials and NaN objectives get -1)."""
    trials = trials.copy()
    ranks = np.full(len(trials), -1, dtype=int)
    ok = trials["_ok"].to_numpy() if "_ok" in trials else (trials["status"] == "ok").to_numpy()
    if ok.any():
        values = np.column_stack([_numeric(trials[o["metric"]]).to_numpy() for o in objectives])
        ranks[ok] = pareto_ranks(values[ok], [o["mode"] for o in objectives])
    trials["pareto_rank"] = ranks
    return trials


def load_results(results_dir: str | Path) -> Results:
    """Read and normalise a results folder (see the module docstring for the conventions)."""
    results_dir = Path(results_dir)
    objectives, name = load_objectives(results_dir)
    trials = _read_trials(results_dir).copy().reset_index(drop=True)

    if "trial_id" not in trials:
        trials["trial_id"] = [f"trial_{i}" for i in range(len(trials))]
    trials["trial_id"] = trials["trial_id"].astype(str)
    if "status" not in trials:
        trials["status"] = "ok"
    trials["status"] = trials["status"].fillna("error").astype(str)
    trials["_ok"] = trials["status"].str.lower() == "ok"
    for col in set(METRIC_COLUMNS) | {o["metric"] for o in objectives}:
        if col not in trials:
            trials[col] = np.nan
        trials[col] = _numeric(trials[col])
    for col in MAIN_PARAMS:
        if col in trials:
            trials[col] = _numeric(trials[col])

    if SURROGATE_COL in trials:
        surrogate = trials[SURROGATE_COL].astype(object).where(trials[SURROGATE_COL].notna(), NO_SURROGATE)
        trials["_surrogate"] = surrogate.astype(str)
    else:
        trials["_surrogate"] = NO_SURROGATE
    if LAMBD_COL in trials:
        trials["_baseline"] = (trials[LAMBD_COL] == 0).fillna(False).astype(bool)
    else:
        trials["_baseline"] = False
    trials["_label"] = trials["_surrogate"].where(~trials["_baseline"], BASELINE_LABEL)

    finished = trials["finished_at"] if "finished_at" in trials else pd.Series(pd.NaT, index=trials.index)
    trials["_finished"] = pd.to_datetime(finished, utc=True, errors="coerce", format="mixed")
    # completion order: by finish time, unknown times last, table order breaks ties
    unknown = trials["_finished"].isna().to_numpy()
    trials["_order"] = np.argsort(np.lexsort((np.arange(len(trials)), _ns(trials["_finished"]), unknown)))

    trials = add_pareto_ranks(trials, objectives)

    # fill missing references from the data (the worst ok value), so a hypervolume always exists
    for o in objectives:
        if o.get("ref") is None:
            vals = trials.loc[trials["_ok"], o["metric"]].dropna()
            worst = (vals.min() if o["mode"] == "max" else vals.max()) if len(vals) else 0.0
            o["ref"] = float(worst) - 1e-9 if o["mode"] == "max" else float(worst) + 1e-9
        o["ref"] = float(o["ref"])

    if not name and "experiment" in trials and trials["experiment"].notna().any():
        name = str(trials["experiment"].dropna().iloc[0])
    name = name or results_dir.resolve().name

    ok_non_baseline = trials[trials["_ok"] & ~trials["_baseline"]]
    surrogates = sorted(set(ok_non_baseline["_surrogate"]) | set(trials.loc[~trials["_baseline"], "_surrogate"]))
    palette = [
        "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3",
        "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd",
    ]  # fmt: skip
    colors = {s: palette[i % len(palette)] for i, s in enumerate(surrogates)}
    return Results(results_dir, name, objectives, trials, _read_epochs(results_dir), surrogates, colors)


def _ns(ts: pd.Series) -> np.ndarray:
    """Datetimes as int64 nanoseconds (NaT -> 0; NaT is sorted separately)."""
    out = np.zeros(len(ts), dtype=np.int64)
    mask = ts.notna().to_numpy()
    if mask.any():
        out[mask] = ts[mask].astype("datetime64[ns, UTC]").astype("int64").to_numpy()
    return out


def front_of(df: pd.DataFrame, metrics: Sequence[str], modes: Sequence[str]) -> pd.DataFrame:
    """Rows of ``df`` on the Pareto front of ``metrics`` (NaN rows excluded)."""
    if df.empty:
        return df
    values = np.column_stack([_numeric(df[m]).to_numpy() for m in metrics])
    return df[pareto_mask(values, list(modes))]


# ================================================================= formatting
def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _is_missing(value) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def format_value(value, column: str = "") -> str:
    """Human formatting: seconds with one decimal, counts as ints, other floats with 4 significant digits."""
    if _is_missing(value):
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, pd.Timestamp):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if column.endswith("_s"):
            return f"{v:,.1f}"
        if v.is_integer() and abs(v) < 1e6 and not column.startswith(("test_acc", "attack_", "feature_")):
            return f"{int(v):,}"
        if abs(v) >= 1e4:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(value)


def _short(column: str) -> str:
    return column[len("config.") :] if column.startswith("config.") else column


def html_table(df: pd.DataFrame, columns: Sequence[str], headers: Sequence[str] | None = None, pre: Sequence[str] = ()) -> str:
    """An HTML table of ``df[columns]`` with formatted numbers; every cell is escaped."""
    headers = list(headers) if headers is not None else [_short(c) for c in columns]
    rows = ["<table>", "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in headers) + "</tr>"]
    for _, row in df.iterrows():
        cells = []
        for col in columns:
            value = row[col] if col in row else None
            text = _esc(format_value(value, col))
            if col in pre:
                cells.append(f'<td class="s"><pre>{text}</pre></td>')
            elif isinstance(value, (str, bool)) or value is None:
                cells.append(f'<td class="s">{text}</td>')
            else:
                cells.append(f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _better(metric: str, mode: str) -> str:
    privacy = metric in PRIVACY_MODES
    if privacy:
        return f"{metric} ({'lower' if mode == 'min' else 'higher'} = more private)"
    return f"{metric} ({'higher' if mode == 'max' else 'lower'} is better)"


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _new_figure(width: float, height: float, top_in: float = 0.45) -> Figure:
    """A figure with fixed margins in inches (a layout engine would double the drawing time)."""
    fig = Figure(figsize=(width, height), dpi=110)
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.2 / width, bottom=0.6 / height, top=1 - top_in / height,
                        wspace=0.45)  # fmt: skip
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png")
    fig.clear()
    return path


def _no_data(ax, text: str = "no completed trials with these metrics") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777")


# ================================================================= figures
def _front_line(ax, df: pd.DataFrame, x: str, y: str, x_mode: str, y_mode: str, **kw) -> None:
    front = front_of(df, [x, y], [x_mode, y_mode])
    if front.empty:
        return
    front = front.sort_values([x, y])
    # attainment boundary: with x maximised, the point covering (x_{i-1}, x_i] is point i
    ax.step(front[x], front[y], where="pre" if x_mode == "max" else "post", **kw)


def plot_frontier(res: Results, y_metric: str, y_mode: str, path: Path) -> Path:
    """First objective (x) against ``y_metric``: points by surrogate, overall and per-surrogate fronts."""
    x_metric, x_mode = res.objectives[0]["metric"], res.objectives[0]["mode"]
    ok = res.ok.dropna(subset=[x_metric, y_metric])
    fig = _new_figure(7.5, 5.0)
    ax = fig.add_subplot()
    handles = []
    for s in res.surrogates:
        sub = ok[(ok["_surrogate"] == s) & ~ok["_baseline"]]
        if sub.empty:
            continue
        color = res.colors[s]
        ax.scatter(sub[x_metric], sub[y_metric], s=28, color=color, alpha=0.75, edgecolors="none", zorder=3)
        _front_line(ax, sub, x_metric, y_metric, x_mode, y_mode, color=color, lw=1.0, alpha=0.8, zorder=2)
        handles.append(Line2D([], [], color=color, marker="o", lw=1.0, label=s))
    base = ok[ok["_baseline"]]
    if not base.empty:
        ax.scatter(base[x_metric], base[y_metric], s=80, marker="X", color="black", zorder=4)
        handles.append(Line2D([], [], color="black", marker="X", lw=0, markersize=8, label=BASELINE_LABEL))
    if not ok.empty:
        _front_line(ax, ok, x_metric, y_metric, x_mode, y_mode, color="black", lw=2.2, alpha=0.9, zorder=5)
        front = front_of(ok, [x_metric, y_metric], [x_mode, y_mode])
        ax.scatter(front[x_metric], front[y_metric], s=90, facecolors="none", edgecolors="black", lw=1.3, zorder=6)
        handles.append(Line2D([], [], color="black", lw=2.2, label="front (all trials)"))
    else:
        _no_data(ax)
    ax.set_xlabel(_better(x_metric, x_mode) + (" →" if x_mode == "max" else " ←"))
    ax.set_ylabel(_better(y_metric, y_mode))
    ax.set_title(f"{res.experiment}: {x_metric} vs {y_metric} ({len(ok)} ok trials)")
    ax.grid(alpha=0.3)
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="best", framealpha=0.85)
    return _save(fig, path)


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


def _param_columns(res: Results) -> list[str]:
    ok = res.ok
    return [c for c in MAIN_PARAMS if c in ok and ok[c].dropna().nunique() >= 2]


def plot_param_effects(res: Results, param: str, path: Path) -> Path:
    """Each objective against one parameter (small multiples), coloured by surrogate."""
    ok = res.ok
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
            ax.set_xscale("symlog", linthresh=float(positive.min()))
        ax.set_xlabel(_short(param) + (" (log)" if param == LAMBD_COL else ""))
        ax.set_ylabel(_better(obj["metric"], obj["mode"]), fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(f"effect of {_short(param)}", fontsize=10)
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
            ax.plot(sub["epoch"], _numeric(sub[col]), marker=".", lw=1.2, color=color, alpha=0.85, label=label,
                    ls="--" if is_base else "-")  # fmt: skip
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(col)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle("training curves of the front's trials", fontsize=10)
    return _save(fig, path)


# ================================================================= galleries
def _recon_path(res: Results, row: pd.Series) -> Path | None:
    candidates = []
    trial_dir = row.get("trial_dir")
    if isinstance(trial_dir, str) and trial_dir:
        p = Path(trial_dir)
        candidates.append(p if p.is_absolute() else res.results_dir / p)
    candidates.append(res.results_dir / str(row["trial_id"]))
    for c in candidates:
        if (c / "recon.png").is_file():
            return c / "recon.png"
    return None


def best_baseline(res: Results) -> pd.Series | None:
    """The ok λ=0 trial with the best first objective, or None."""
    first = res.objectives[0]
    base = res.ok[res.ok["_baseline"]].dropna(subset=[first["metric"]])
    if base.empty:
        return None
    return base.sort_values(first["metric"], ascending=first["mode"] == "min", kind="stable").iloc[0]


def copy_galleries(res: Results, out_dir: Path) -> list[dict]:
    """Copy recon.png of the front's trials and of the best baseline to out_dir/galleries/.

    Returns one dict per shown trial: ``row`` and ``src`` (relative path, or None when recon.png is missing).
    """
    gallery_dir = out_dir / "galleries"
    rows = [r for _, r in res.front.head(MAX_GALLERY).iterrows()]
    base = best_baseline(res)
    if base is not None and base["trial_id"] not in {r["trial_id"] for r in rows}:
        rows.append(base)
    shown = []
    for row in rows:
        src = _recon_path(res, row)
        rel = None
        if src is not None:
            gallery_dir.mkdir(parents=True, exist_ok=True)
            dest = gallery_dir / f"{_safe_name(str(row['trial_id']))}.png"
            shutil.copyfile(src, dest)
            rel = f"galleries/{dest.name}"
        shown.append({"row": row, "src": rel})
    return shown


# ================================================================= text
def _accuracy_point(values: pd.Series) -> float:
    """'One point' of a utility metric: 0.01 for fractions in [0, 1], else 1.0 (percent)."""
    v = values.dropna()
    return 0.01 if len(v) == 0 or v.abs().max() <= 1.0 else 1.0


def summary_sentence(res: Results) -> str:
    """One or two plain sentences on what the search found (unescaped text)."""
    ok = res.ok
    n_err = int((~res.trials["_ok"]).sum())
    counts = f"{len(res.trials)} trials ({len(ok)} ok, {n_err} errored)"
    if len(res.objectives) < 2 or ok.empty:
        return f"{counts}; no completed trial to compare."
    u, p = res.objectives[0], res.objectives[1]
    um, pm = u["metric"], p["metric"]
    asc_p = p["mode"] == "min"
    front = res.front
    by_s = front.groupby("_label").size()
    front_txt = f"the front has {len(front)} trial{'s' * (len(front) != 1)}" + (
        " (" + ", ".join(f"{k}: {v}" for k, v in by_s.items()) + ")" if len(by_s) else ""
    )
    base = best_baseline(res)
    cem = ok[~ok["_baseline"]].dropna(subset=[um, pm])
    if base is None:
        if cem.empty:
            return f"{counts}; {front_txt}."
        best = cem.sort_values(pm, ascending=asc_p, kind="stable").iloc[0]
        return (
            f"{counts}; {front_txt}. No λ=0 baseline ran, so there is no reference accuracy: the best {pm} "
            f"is {format_value(best[pm])} ({best['_surrogate']}, trial {best['trial_id']}, "
            f"{um} {format_value(best[um])})."
        )
    point = _accuracy_point(ok[um])
    point_txt = "1 point" if point == 0.01 else "1 unit"
    bu = base[um]
    within = cem[(cem[um] >= bu - point) if u["mode"] == "max" else (cem[um] <= bu + point)]
    base_p = f"{pm} {format_value(base[pm])}" if not _is_missing(base[pm]) else f"{pm} —"
    if within.empty:
        closest = cem.sort_values(um, ascending=u["mode"] == "min", kind="stable")
        closest_txt = (
            f"; the closest is trial {closest.iloc[0]['trial_id']} ({closest.iloc[0]['_surrogate']}, "
            f"{um} {format_value(closest.iloc[0][um])}, {pm} {format_value(closest.iloc[0][pm])})"
            if len(closest)
            else ""
        )
        return (
            f"No CEM trial reaches {um} within {point_txt} of the best λ=0 baseline "
            f"({format_value(bu)}, {base_p}){closest_txt}. {counts[0].upper() + counts[1:]}; {front_txt}."
        )
    best = within.sort_values(pm, ascending=asc_p, kind="stable").iloc[0]
    verdict = ""
    if not _is_missing(base[pm]):
        improved = best[pm] < base[pm] if asc_p else best[pm] > base[pm]
        verdict = f", versus {format_value(base[pm])} for the baseline" + ("" if improved else " (no improvement)")
    return (
        f"At {um} within {point_txt} of the best λ=0 baseline ({format_value(bu)}), "
        f"{best['_surrogate']} reaches the {'lowest' if asc_p else 'highest'} {pm}: {format_value(best[pm])} "
        f"(trial {best['trial_id']}, {um} {format_value(best[um])}){verdict}. {counts[0].upper() + counts[1:]}; "
        f"{front_txt}."
    )


def _searched_columns(res: Results) -> list[str]:
    cfg = [c for c in res.trials.columns if c.startswith("config.")]
    varying = [c for c in cfg if res.trials[c].dropna().astype(str).nunique() >= 2]
    if varying:
        return varying
    return [c for c in [SURROGATE_COL, *MAIN_PARAMS] if c in res.trials]


def _metric_columns(res: Results) -> list[str]:
    cols = list(res.metrics)
    cols += [c for c in METRIC_COLUMNS if c not in cols and res.trials[c].notna().any()]
    return cols


def _run_facts(res: Results, final_hv: float) -> list[tuple[str, str]]:
    t = res.trials
    facts = [
        ("experiment", res.experiment),
        ("trials", f"{len(t)} ({int(t['_ok'].sum())} ok, {int((~t['_ok']).sum())} errored)"),
        ("trials on the front", str(int((t["pareto_rank"] == 0).sum()))),
        (
            "objectives",
            "; ".join(f"{o['metric']} ({o['mode']}, ref {format_value(o['ref'])})" for o in res.objectives),
        ),
        ("final hypervolume", format_value(final_hv)),
        ("total trial time (sum of wall_s)", f"{format_value(float(t['wall_s'].sum()), 'wall_s')} s"),
    ]
    finished = t["_finished"].dropna()
    if len(finished):
        span = (finished.max() - finished.min()).total_seconds()
        facts.append(("first → last finished", f"{finished.min():%Y-%m-%d %H:%M:%S} → {finished.max():%Y-%m-%d %H:%M:%S} UTC ({span:,.1f} s)"))
    for col, label in [
        ("device", "device"),
        ("torch_version", "torch"),
        ("package_version", "cem-bench"),
        ("git_sha", "git sha"),
    ]:
        if col in t:
            values = sorted({str(v) for v in t[col].dropna()})
            facts.append((label, ", ".join(values) if values else "—"))
    return facts


# ================================================================= the report
def _img(src: str, alt: str, caption: str | None = None) -> str:
    cap = f"<figcaption>{_esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{_esc(quote(src))}" alt="{_esc(alt)}">{cap}</figure>'


def build_report(results_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write plots, tables, galleries, frontier.csv and index.html; return the path of index.html."""
    results_dir = Path(results_dir)
    out_dir = Path(out_dir) if out_dir is not None else results_dir / "report"
    res = load_results(results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    ok = res.ok
    # frontier plots: the search objectives after the first, then the other privacy metrics present
    pairs: list[tuple[str, str]] = [(o["metric"], o["mode"]) for o in res.objectives[1:]]
    for metric, mode in PRIVACY_MODES.items():
        if metric not in {m for m, _ in pairs} and metric in ok and ok[metric].notna().any():
            pairs.append((metric, mode))
    frontier_imgs = [
        (plot_frontier(res, m, mode, out_dir / f"frontier_{_safe_name(m)}.png").name, m) for m, mode in pairs
    ]
    hv_path, final_hv = plot_hypervolume(res, out_dir / "hypervolume.png")
    param_imgs = [
        (plot_param_effects(res, c, out_dir / f"params_{_safe_name(_short(c))}.png").name, c)
        for c in _param_columns(res)
    ]
    curves = plot_training_curves(res, out_dir / "training_curves.png")
    gallery = copy_galleries(res, out_dir)

    front = res.front
    public_cols = [c for c in res.trials.columns if not c.startswith("_")]
    front[public_cols].to_csv(out_dir / "frontier.csv", index=False)

    searched = [c for c in _searched_columns(res) if c != SURROGATE_COL]
    metrics = _metric_columns(res)
    table_cols = ["trial_id", "_label", *searched, *metrics]
    table_heads = ["trial", "surrogate", *[_short(c) for c in searched], *metrics]

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>cem-bench report: {_esc(res.experiment)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>cem-bench report: {_esc(res.experiment)}</h1>",
        '<section id="frontier">',
        _img(frontier_imgs[0][0], f"frontier {frontier_imgs[0][1]}") if frontier_imgs else "",
        "</section>",
        f'<p class="summary">{_esc(summary_sentence(res))}</p>',
    ]
    if len(frontier_imgs) > 1:
        parts.append('<h2 id="other-frontiers">Other privacy metrics</h2>')
        parts += [_img(src, f"frontier {m}") for src, m in frontier_imgs[1:]]
    parts += [
        '<h2 id="hypervolume">Hypervolume over the search</h2>',
        _img(hv_path.name, "hypervolume", f"final hypervolume {format_value(final_hv)}"),
    ]
    parts.append('<h2 id="parameters">Effect of the main parameters</h2>')
    if param_imgs:
        parts += [_img(src, f"effect of {_short(c)}") for src, c in param_imgs]
    else:
        parts.append('<p class="note">No main parameter took two or more values among the ok trials.</p>')
    parts.append('<h2 id="training">Training curves of the front</h2>')
    if curves is not None:
        parts.append(_img(curves.name, "training curves"))
    else:
        parts.append('<p class="note">No per-epoch records (epochs.parquet missing or empty).</p>')

    parts.append('<h2 id="galleries">Reconstructions (originals above, attack below)</h2>')
    if gallery:
        parts.append('<div class="gallery">')
        for g in gallery:
            row = g["row"]
            caption = f"{row['trial_id']} · {row['_label']} · " + ", ".join(
                f"{m} {format_value(row[m], m)}" for m in metrics if m in PRIVACY_MODES or m in res.metrics
            )
            if g["src"]:
                parts.append(_img(g["src"], f"reconstructions of {row['trial_id']}", caption))
            else:
                parts.append(f'<figure><p class="note">recon.png missing</p><figcaption>{_esc(caption)}</figcaption></figure>')
        parts.append("</div>")
    else:
        parts.append('<p class="note">No trial on the front and no baseline.</p>')

    parts.append(f'<h2 id="front-table">Trials on the front ({len(front)})</h2>')
    parts.append(html_table(front, table_cols, table_heads))

    parts.append('<h2 id="surrogate-fronts">Best trade-offs of each surrogate</h2>')
    cem_ok = ok[~ok["_baseline"]]
    for s in res.surrogates:
        own = front_of(cem_ok[cem_ok["_surrogate"] == s], res.metrics, res.modes)
        if own.empty:
            continue
        own = own.sort_values(res.metrics[0], ascending=res.modes[0] == "min", kind="stable")
        parts.append(f"<h3>{_esc(s)} ({len(own)})</h3>")
        parts.append(html_table(own, table_cols, table_heads))
    base = ok[ok["_baseline"]]
    if not base.empty:
        own = front_of(base, res.metrics, res.modes)
        parts.append(f"<h3>{_esc(BASELINE_LABEL)} ({len(own)})</h3>")
        parts.append(html_table(own, table_cols, table_heads))

    errored = res.trials[~res.trials["_ok"]]
    parts.append(f'<h2 id="errors">Errored trials ({len(errored)})</h2>')
    if errored.empty:
        parts.append('<p class="note">None.</p>')
    else:
        err = errored.copy()
        err["error"] = err["error"].map(_tail) if "error" in err else "—"
        cols = ["trial_id", "_label", *searched, "error"]
        parts.append(html_table(err, cols, ["trial", "surrogate", *[_short(c) for c in searched], "error"], pre=["error"]))

    parts.append('<h2 id="run">Run facts</h2><table>')
    parts += [f'<tr><th>{_esc(k)}</th><td class="s">{_esc(v)}</td></tr>' for k, v in _run_facts(res, final_hv)]
    parts.append("</table>")
    parts.append('<p class="note">Files: <a href="frontier.csv">frontier.csv</a> (the front\'s trials).</p>')
    parts.append("</body></html>")

    index = out_dir / "index.html"
    tmp = index.with_suffix(".html.tmp")
    tmp.write_text("\n".join(p for p in parts if p), encoding="utf-8")
    tmp.replace(index)
    return index


def _tail(text, limit: int = 3000):
    """The last ``limit`` characters of an error (tracebacks end with the useful line)."""
    if _is_missing(text):
        return None
    text = str(text)
    return text if len(text) <= limit else "…" + text[-limit:]
