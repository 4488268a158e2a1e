"""The report's text: number formatting, the HTML tables (``DataFrame.to_html``, escaped), the summary
sentence and the run facts; with replicates, the front of configurations (mean ± std) and the paper-style
tables (``cem_bench.table.paper_table``)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from cem_bench import noise
from cem_bench.aggregate import CONFIG_ID, SEED_COLUMN
from cem_bench.schema import privacy_mode, strongest_column
from cem_bench.table import DEFAULT_METRICS, SIGMA, column_label, paper_table

from .load import LAMBD_COL, MAIN_PARAMS, METRIC_COLUMNS, SKIP_COL, SURROGATE_COL, Results, is_attack_metric

MAX_TABLE_ROWS = 200  # rows an HTML table of the report shows (the rest are in the Parquet tables and CSVs)
_NEWLINE = "\x1f"  # stands for a line break inside a cell: to_html would print "\n" as a backslash and an n


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


def short(column: str) -> str:
    """A config column without its ``config.`` prefix."""
    return column[len("config.") :] if column.startswith("config.") else column


def better(metric: str, mode: str) -> str:
    """An axis label that says which direction is better (or more private)."""
    if privacy_mode(metric) is not None:
        return f"{metric} ({'lower' if mode == 'min' else 'higher'} = more private)"
    return f"{metric} ({'higher' if mode == 'max' else 'lower'} is better)"


def safe_name(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _cell(value, column: str) -> str:
    text = format_value(value, column).replace(_NEWLINE, " ").replace("\r\n", "\n").replace("\r", "\n")
    return text.expandtabs(4).replace("\n", _NEWLINE)


def _to_html(df: pd.DataFrame, **kw) -> str:
    """``df`` (strings from ``_cell``) as an escaped HTML table; quotes escaped like ``html.escape``."""
    text = df.to_html(escape=True, border=0, **kw)
    return text.replace("'", "&#x27;").replace(_NEWLINE, "\n")


def html_table(df: pd.DataFrame, columns: Sequence[str], headers: Sequence[str] | None = None,
               pre: Sequence[str] = (), classes: Sequence[str] = ()) -> str:
    """An HTML table of ``df[columns]`` with formatted numbers; every cell is escaped.

    ``pre`` columns keep their line breaks in a monospace font; they must be the last columns. ``classes``:
    more CSS classes of the table."""
    headers = list(headers) if headers is not None else [short(c) for c in columns]
    columns = list(columns)
    total = len(df)
    if total > MAX_TABLE_ROWS:   # a page of 100,000 trials stays a page: the full lists are the Parquet tables
        df = df.head(MAX_TABLE_ROWS)
    if pre and set(columns[len(columns) - len(pre) :]) != set(pre):
        raise ValueError(f"pre columns {list(pre)} must be the last of {columns}")
    shown = pd.DataFrame({i: [_cell(v, c) for v in (df[c] if c in df else [None] * len(df))]
                          for i, c in enumerate(columns)}, index=range(len(df)))  # fmt: skip
    shown.columns = headers
    classes = ["results"] + ([f"pre{len(pre)}"] if pre else []) + list(classes)
    html = _to_html(shown, index=False, classes=classes)
    if total > MAX_TABLE_ROWS:
        html += (f'\n<p class="note">The first {MAX_TABLE_ROWS} of {total:,} rows; every row is in trials.parquet '
                 f'and configs.parquet (and the front in frontier.csv).</p>')
    return html


def facts_table(facts: Sequence[tuple[str, str]]) -> str:
    """Key/value pairs as an HTML table (keys as row headers), escaped."""
    shown = pd.DataFrame({"value": [_cell(v, "") for _, v in facts]}, index=[k for k, _ in facts])
    return _to_html(shown, header=False, classes=["facts"])


# ================================================================= the summary sentence
def _accuracy_point(values: pd.Series) -> float:
    """'One point' of a utility metric: 0.01 for fractions in [0, 1], else 1.0 (percent)."""
    v = values.dropna()
    return 0.01 if len(v) == 0 or v.abs().max() <= 1.0 else 1.0


def utility_tolerances(rows: pd.DataFrame, metric: str, values: pd.Series) -> pd.Series:
    """How far each configuration's utility may fall below its baseline's and still count as "at the
    baseline's accuracy": the baseline's own noise (its standard deviation over the seeds, ``<metric>_noise``)
    or 2 points of ``values``' scale, the larger."""
    noise = pd.to_numeric(rows[f"{metric}_noise"], errors="coerce").fillna(0.0) if f"{metric}_noise" in rows \
        else pd.Series(0.0, index=rows.index)
    return noise.clip(lower=2 * _accuracy_point(values)).astype(float)


def at_utility(rows: pd.DataFrame, res: Results) -> pd.Series:
    """Is each configuration's first objective within ``utility_tolerances`` of its baseline's?"""
    u = res.objectives[0]
    delta = pd.to_numeric(rows[f"{u['metric']}_delta"], errors="coerce")
    tol = utility_tolerances(rows, u["metric"], res.configs[u["metric"]])
    return ((delta >= -tol) if u["mode"] == "max" else (delta <= tol)).fillna(False)


def candidates(res: Results) -> pd.DataFrame:
    """The configurations a claim can be about: ok, not a baseline, and confirmed when confirmation ran."""
    c = res.configs
    pool = c[c["_ok"] & (c["role"] != "baseline")]
    return pool[pool["role"] == "confirmed"] if res.confirmed else pool


def claims(res: Results) -> pd.DataFrame:
    """The configurations the report may call more private than their baseline: among ``candidates``, better
    on the first privacy objective beyond the noise (``noise.compare``) and ``at_utility``. Sorted best
    privacy first; empty without a noise floor."""
    c = res.configs
    if c is None or len(res.objectives) < 2 or not res.has_floor:
        return pd.DataFrame()
    um, p = res.metrics[0], res.objectives[1]
    if f"{p['metric']}_verdict" not in c or f"{um}_delta" not in c:
        return pd.DataFrame()
    pool = candidates(res)
    out = pool[(pool[f"{p['metric']}_verdict"] == noise.BETTER) & at_utility(pool, res)]
    return out.sort_values(p["metric"], ascending=p["mode"] == "min", kind="stable")


def _pm(row: pd.Series, metric: str) -> str:
    """``mean ± std (n runs)`` of a configuration row."""
    n = row.get(f"{metric}_n")
    runs = f" over {int(n)} run{'s' * (int(n) != 1)}" if not _is_missing(n) else ""
    return mean_std(row, metric) + runs


def _interval(row: pd.Series, metric: str) -> str:
    """``Δ -0.062 (95 % interval -0.09 to -0.03, P(improvement) 0.89)`` of a configuration row."""
    d, lo, hi, pb = (row.get(f"{metric}_{k}") for k in ("delta", "delta_lo", "delta_hi", "p_better"))
    if _is_missing(d):
        return "Δ —"
    text = f"Δ {float(d):+.3g}"
    if not _is_missing(lo):
        text += f" (95 % interval {float(lo):+.3g} to {float(hi):+.3g}"
        text += f", P(improvement) {float(pb):.2f})" if not _is_missing(pb) else ")"
    return text


def summary_sentence(res: Results) -> str:
    """A few plain sentences on what the search found, claiming only what its replicates support (unescaped
    text; docs/protocol.md section 9)."""
    ok = res.ok
    n_err = int((~res.trials["_ok"]).sum())
    counts = f"{len(res.trials)} trials ({len(ok)} ok, {n_err} errored)"
    if len(res.objectives) < 2 or ok.empty:
        return f"{counts}; no completed trial to compare."
    u, p = res.objectives[0], res.objectives[1]
    um, pm = u["metric"], p["metric"]
    c = res.configs
    base_rows = c[(c["role"] == "baseline") & c["_ok"]] if c is not None else pd.DataFrame()
    if base_rows.empty:
        return (f"No λ=0 baseline ran, so there is no noise floor and no reference accuracy: this report claims "
                f"no difference between configurations. {counts[0].upper() + counts[1:]}.")
    base = base_rows.sort_values("runs_ok", ascending=False, kind="stable").iloc[0]
    base_txt = f"{pm} {_pm(base, pm)}, {um} {_pm(base, um)}"
    if not res.has_floor:
        return (f"The λ=0 baseline ran once ({base_txt}): with one seed there is no noise floor, so this report "
                f"claims no difference; the plots show single runs. {counts[0].upper() + counts[1:]}.")
    scope = "confirmed configurations (re-run with new seeds after the search)" if res.confirmed else \
        "configurations"
    found = claims(res)
    tol = float(utility_tolerances(base.to_frame().T, um, c[um]).iloc[0])
    tol_txt = f"{um} within {format_value(tol)} of the baseline's (its noise or 2 points, the larger)"
    if found.empty:
        pool = candidates(res)
        costly = pool[pool[f"{pm}_verdict"] == noise.BETTER].sort_values(pm, ascending=p["mode"] == "min",
                                                                          kind="stable")
        if len(costly):   # more private beyond the noise, but not at the baseline's utility: a trade-off
            r = costly.iloc[0]
            return (f"A trade-off, not free privacy: {r['_label']} ({r[CONFIG_ID]}, {_params_text(res, r)}) is more "
                    f"private than the λ=0 baseline ({base_txt}) beyond its noise, {pm} {_pm(r, pm)}, "
                    f"{_interval(r, pm)}, but its {um} falls further than the {format_value(tol)} allowed (the "
                    f"baseline's noise or 2 points, the larger): {_pm(r, um)}, {_interval(r, um)}. None of the "
                    f"{scope} is more private at the baseline's {um}. {counts[0].upper() + counts[1:]}.")
        closest = pool.dropna(subset=[pm]).sort_values(pm, ascending=p["mode"] == "min", kind="stable")
        near = ""
        if len(closest):
            r = closest.iloc[0]
            if isinstance(r.get("baseline_id"), str):
                verdict = f"{_interval(r, pm)}: {r.get(f'{pm}_verdict') or 'no verdict'}"
            else:
                verdict = "no λ=0 baseline shares its other keys (σ, …), so it is compared with none"
            near = (f" The most private of them, {r['_label']} ({r[CONFIG_ID]}), has {pm} {_pm(r, pm)}, "
                    f"{verdict}; {um} {_pm(r, um)}.")
        return (f"None of the {scope} is more private than the λ=0 baseline "
                f"({base_txt}) beyond its noise at {tol_txt}: the differences the plots show are within the "
                f"noise of the baseline.{near} {counts[0].upper() + counts[1:]}.")
    best = found.iloc[0]
    borrowed = " Its spread is the baseline's (it ran once)." if bool(best.get("spread_borrowed")) else ""
    others = ""
    if len(found) > 1:
        by = found.groupby("_label").size()
        others = (f" {len(found)} {scope.split(' (')[0]} in all pass the same test (" +
                  ", ".join(f"{k}: {v}" for k, v in by.items()) + ").")
    return (f"Beyond the noise of the λ=0 baseline ({base_txt}): {best['_label']} (configuration "
            f"{best[CONFIG_ID]}, {'confirmed, ' if best['role'] == 'confirmed' else ''}"
            f"{_params_text(res, best)}) {'lowers' if p['mode'] == 'min' else 'raises'} {pm} to "
            f"{_pm(best, pm)}, {_interval(best, pm)}, at "
            f"{um} {_pm(best, um)}: {_interval(best, um)}, within {format_value(tol)} of the baseline (its noise or 2 "
            f"points, the larger)."
            f"{borrowed}{others} {counts[0].upper() + counts[1:]}.")


def _params_text(res: Results, row: pd.Series) -> str:
    """The keys that tell a configuration row from the others of its surrogate, ``lambd 32, num_clusters 4``
    (λ always; a key that only differs between surrogates, such as ``loss_scale``, is the surrogate's)."""
    c = res.configs
    own = c[c["_surrogate"] == row.get("_surrogate")]
    varying = [col for col in config_searched_columns(res)
               if col == LAMBD_COL or own[col].dropna().astype(str).nunique() >= 2]
    cols = [col for col in varying if col != SURROGATE_COL and not _is_missing(row.get(col))]
    return ", ".join(f"{short(col).split('.')[-1]} {format_value(row.get(col))}" for col in cols) or "fixed keys"


# ================================================================= table columns and run facts
def searched_columns(res: Results) -> list[str]:
    """The config columns that vary across trials (else the surrogate and the main parameters present)."""
    cfg = [c for c in res.trials.columns if c.startswith("config.")]
    varying = [c for c in cfg if res.trials[c].dropna().astype(str).nunique() >= 2]
    if varying:
        return varying
    return [c for c in [SURROGATE_COL, *MAIN_PARAMS] if c in res.trials]


def metric_columns(res: Results) -> list[str]:
    """The objectives, then the other metric columns that hold a value."""
    cols = list(res.metrics)
    cols += [c for c in METRIC_COLUMNS if c not in cols and res.trials[c].notna().any()]
    return cols


def _range(values: pd.Series) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def run_facts(res: Results, final_hv: float) -> list[tuple[str, str]]:
    t = res.trials
    facts = [
        ("experiment", res.experiment),
        ("trials", trials_text(t)),
        ("trials on the front", str(int((t["pareto_rank"] == 0).sum()))),
    ]
    stopped = stopped_text(t)
    if stopped:
        facts.append(("stopped early (scheduler)", stopped))
    if SKIP_COL in t:
        k = int(t["_attack_skipped"].sum())
        facts.append(("attack not run (utility gate)", f"{k} trial{'s' * (k != 1)}"))
    if res.replicated:
        c = res.configs
        facts += [
            ("configurations", f"{len(c)} ({_range(c['runs'])} runs each, {int(c['runs_ok'].sum())} ok runs)"),
            ("configurations on the front (means)", str(int((c["pareto_rank"] == 0).sum()))),
        ]
    if res.configs is not None:
        facts.append(("noise floor (λ=0 baseline, std over its seeds)", noise_floor_text(res)))
        if "role" in t:
            n = t["role"].value_counts()
            facts.append(("trials by role", ", ".join(f"{k} {int(n[k])}" for k in ("baseline", "search", "confirm")
                                                      if k in n)))
    facts += [
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
        first, last = f"{finished.min():%Y-%m-%d %H:%M:%S}", f"{finished.max():%Y-%m-%d %H:%M:%S}"
        facts.append(("first → last finished", f"{first} → {last} UTC ({span:,.1f} s)"))
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


def trials_text(t: pd.DataFrame) -> str:
    stopped = int((t["status"] == "stopped").sum()) if "status" in t else 0
    errored = int((~t["_ok"]).sum()) - stopped
    return f"{len(t)} ({int(t['_ok'].sum())} ok, " + (f"{stopped} stopped early, " if stopped else "") + \
        f"{errored} errored)"


def stopped_text(t: pd.DataFrame) -> str:
    """How many trials the scheduler stopped, at which epochs, and the epochs run as a share of what the same
    trials would have run to the end (a FIFO search of them); "" without stopped trials."""
    if "status" not in t or "stopped_at_epoch" not in t or not (t["status"] == "stopped").any():
        return ""
    stop = t[t["status"] == "stopped"]
    at = pd.to_numeric(stop["stopped_at_epoch"], errors="coerce").dropna().astype(int).value_counts().sort_index()
    full = pd.to_numeric(t.get("config.train.epochs"), errors="coerce") if "config.train.epochs" in t else None
    where = ", ".join(f"{n} at epoch {e}" for e, n in at.items())
    if full is None or full.isna().all():
        return f"{len(stop)} ({where})"
    ran = pd.to_numeric(t["epochs_done"], errors="coerce").fillna(full)
    ran = ran.where(t["status"] != "stopped", pd.to_numeric(t["stopped_at_epoch"], errors="coerce"))
    share = float(ran.sum()) / float(full.sum())
    return f"{len(stop)} ({where}); the search ran {share:.0%} of the epochs its trials would have run to the end"


def noise_floor_text(res: Results) -> str:
    """Each baseline's std of the objectives over its seeds: "σ=0.1: test_acc ± 0.09, attack_ssim ± 0.005 (3
    seeds)"; or why there is none."""
    c = res.configs
    base = c[(c["role"] == "baseline") & c["_ok"]]
    if base.empty:
        return "none: no λ=0 baseline ran"
    parts = []
    for _, r in base.iterrows():
        n = int(r["runs_ok"])
        spread = ", ".join(f"{m} ± {format_value(r.get(f'{m}_std'), m)}" for m in res.metrics)
        where = f"σ={format_value(r.get('config.defense.noise_std'))}: " if len(base) > 1 else ""
        parts.append(f"{where}{spread} ({n} seed{'s' * (n != 1)})" if n > 1 else f"{where}one run: no floor")
    return "; ".join(parts)


# ================================================================= replicates: configurations
def mean_std(row: pd.Series, metric: str) -> str:
    """``mean ± std`` of ``metric`` in a configuration row (the mean alone for a single run)."""
    mean, std = row.get(metric), row.get(f"{metric}_std")
    if _is_missing(mean):
        return "—"
    text = format_value(float(mean), metric)
    return text if _is_missing(std) else f"{text} ± {format_value(float(std), metric)}"


def _runs(row: pd.Series) -> str:
    runs, ok = int(row["runs"]), int(row["runs_ok"])
    return str(runs) if ok == runs else f"{runs} ({runs - ok} errored)"


def _seeds(value) -> str:
    if isinstance(value, (list, tuple, np.ndarray)):
        return ", ".join(str(int(v)) for v in value) or "—"
    return "—" if _is_missing(value) else str(value)


def config_searched_columns(res: Results) -> list[str]:
    """The config columns (the seed excepted) that vary across configurations, else the main ones present."""
    c = res.configs
    cfg = [col for col in c.columns if col.startswith("config.") and col != SEED_COLUMN]
    varying = [col for col in cfg if c[col].dropna().astype(str).nunique() >= 2]
    return varying or [col for col in [SURROGATE_COL, *MAIN_PARAMS] if col in c]


def config_front_table(res: Results) -> str:
    """The configurations on the front of the means, one row each: id, surrogate, the varying config keys,
    ``mean ± std`` of each objective over the ok runs, the runs and their seeds."""
    front = res.front_configs
    searched = [c for c in config_searched_columns(res) if c != SURROGATE_COL]
    shown = front.copy()
    rows = [r for _, r in front.iterrows()]
    for m in res.metrics:
        shown[f"_ms_{m}"] = [mean_std(r, m) for r in rows]
        shown[f"_vs_{m}"] = [versus_baseline(r, m) for r in rows]
    shown["_runs"] = [_runs(r) for r in rows]
    shown["_seeds"] = [_seeds(r.get("seeds")) for r in rows]
    by_metric = {m: strongest_column(m) for m in res.metrics if strongest_column(m) in front}  # strongest_summary
    columns = [CONFIG_ID, "_label", "role", *searched, *(f"_ms_{m}" for m in res.metrics),
               *(f"_vs_{m}" for m in res.metrics), *by_metric.values(), "_runs", "_seeds"]
    headers = ["configuration", "surrogate", "role", *(short(c) for c in searched),
               *(f"{m} (mean ± std)" for m in res.metrics), *(f"{m} vs the λ=0 baseline" for m in res.metrics),
               *(f"strongest attack ({m})" for m in by_metric), "runs", "seeds (of the statistics)"]  # fmt: skip
    return html_table(shown, columns, headers)


def versus_baseline(row: pd.Series, metric: str) -> str:
    """A configuration against its baseline on ``metric``: the verdict, then the difference, its interval and
    the probability of improvement (``noise.compare``); "—" for a baseline itself or without a floor."""
    verdict = row.get(f"{metric}_verdict")
    if row.get("role") == "baseline" or not isinstance(verdict, str) or not verdict:
        return "—"
    text = {noise.BETTER: "better beyond the noise", noise.WORSE: "worse beyond the noise"}.get(
        verdict, "within the noise")
    text += f": {_interval(row, metric)}"
    if bool(row.get("spread_borrowed")):
        text += "; one run, the baseline's spread"
    return text


def surrogate_bests(res: Results) -> str | None:
    """Per surrogate, its most private configuration at the baseline's utility (``at_utility``; among
    its confirmed configurations where it has any) and what the replicates say about it; None without a noise
    floor or two objectives."""
    c = res.configs
    if c is None or len(res.objectives) < 2 or not res.has_floor:
        return None
    um, pm = res.metrics[0], res.metrics[1]
    p_mode = res.modes[1]
    pool = c[c["_ok"] & (c["role"] != "baseline")]
    rows = []
    for s in res.surrogates:
        own = pool[pool["_surrogate"] == s].dropna(subset=[pm])
        if own.empty:
            continue
        if (own["role"] == "confirmed").any():   # a surrogate's confirmed configurations speak for it
            own = own[own["role"] == "confirmed"]
        if f"{um}_delta" in own:
            near = own[at_utility(own, res)]
            own = near if len(near) else own
        rows.append(own.sort_values(pm, ascending=p_mode == "min", kind="stable").iloc[0])
    if not rows:
        return None
    shown = pd.DataFrame(rows).reset_index(drop=True)
    shown["_ms_u"] = [mean_std(r, um) for r in rows]
    shown["_ms_p"] = [mean_std(r, pm) for r in rows]
    shown["_vs_u"] = [versus_baseline(r, um) for r in rows]
    shown["_vs_p"] = [versus_baseline(r, pm) for r in rows]
    shown["_runs"] = [_runs(r) for r in rows]
    columns = ["_label", CONFIG_ID, "role", "_ms_p", "_vs_p", "_ms_u", "_vs_u", "_runs"]
    headers = ["surrogate", "configuration", "role", f"{pm} (mean ± std)", f"{pm} vs the λ=0 baseline",
               f"{um} (mean ± std)", f"{um} vs the λ=0 baseline", "runs"]
    return html_table(shown, columns, headers)


PAPER_ALWAYS = ("test_acc", "attack_ssim")  # the paper's two tables; PSNR and MSE when they hold a value
MAX_PAPER_COLUMNS = 40  # λ × surrogate columns beyond which the paper-style tables are not drawn in the page


def paper_tables(res: Results) -> list[dict] | None:
    """``cem_bench.table.paper_table`` of test_acc and attack_ssim (and attack_psnr, attack_mse when they hold
    a value) as escaped HTML: ``[{metric, table, error}]``; None without a σ column (not a CEM grid)."""
    c = res.configs
    if c is None or SIGMA not in c:
        return None
    columns = c.apply(column_label, axis=1).nunique() if len(c) <= MAX_PAPER_COLUMNS * 50 else MAX_PAPER_COLUMNS + 1
    if columns > MAX_PAPER_COLUMNS:   # a continuous λ: one column per configuration, unreadable and slow
        return [{"metric": "paper-style tables", "table": None, "error": f"the configurations span more than "
                 f"{MAX_PAPER_COLUMNS} λ × surrogate columns (a searched λ, not a grid); configs.parquet and "
                 f"`cem-bench table --csv` hold them"}]
    out = []
    for m in DEFAULT_METRICS:
        col = f"{m}_mean"
        if col not in c or (m not in PAPER_ALWAYS and not c[col].notna().any()):
            continue
        try:
            table = paper_table(c, m)
        except Exception as exc:  # noqa: BLE001 - one table that cannot be built must not sink the report
            out.append({"metric": m, "table": None, "error": f"{type(exc).__name__}: {exc}"})
            continue
        table = table.copy()
        table.columns.name, table.index.name = m, None  # one header row: the metric above the σ labels
        out.append({"metric": m, "table": _to_html(table, classes=["paper"]), "error": None})
    return out


# ================================================================= trials whose attack did not run
def skipped_table(res: Results, searched: Sequence[str]) -> str | None:
    """The trials whose attack did not run: id, surrogate, ``searched`` keys, utility metrics and
    "attack not run: <reason>"; None when there is none."""
    skipped = res.skipped
    if skipped.empty:
        return None
    shown = skipped.copy()
    shown["_why"] = "attack not run: " + skipped[SKIP_COL].str.strip()
    utility = [m for m in dict.fromkeys([*res.metrics, "test_acc", "test_acc_clean"])
               if m in skipped and not is_attack_metric(m)]  # fmt: skip
    columns = ["trial_id", "_label", *searched, *utility, "_why"]
    headers = ["trial", "surrogate", *(short(c) for c in searched), *utility, "attack"]
    return html_table(shown, columns, headers, classes=["skipped"])


def tail(text, limit: int = 3000):
    """The last ``limit`` characters of an error (tracebacks end with the useful line)."""
    if _is_missing(text):
        return None
    text = str(text)
    return text if len(text) <= limit else "…" + text[-limit:]
