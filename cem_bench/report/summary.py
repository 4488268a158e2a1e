"""The report's text: number formatting, the HTML tables (``DataFrame.to_html``, escaped), the summary
sentence and the run facts; with replicates, the front of configurations (mean ± std) and the paper-style
tables (``cem_bench.table.paper_table``)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from cem_bench.aggregate import CONFIG_ID, SEED_COLUMN
from cem_bench.schema import privacy_mode, strongest_column
from cem_bench.table import DEFAULT_METRICS, SIGMA, paper_table

from .load import MAIN_PARAMS, METRIC_COLUMNS, SKIP_COL, SURROGATE_COL, Results, best_baseline, is_attack_metric

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
    if pre and set(columns[len(columns) - len(pre) :]) != set(pre):
        raise ValueError(f"pre columns {list(pre)} must be the last of {columns}")
    shown = pd.DataFrame({i: [_cell(v, c) for v in (df[c] if c in df else [None] * len(df))]
                          for i, c in enumerate(columns)}, index=range(len(df)))  # fmt: skip
    shown.columns = headers
    classes = ["results"] + ([f"pre{len(pre)}"] if pre else []) + list(classes)
    return _to_html(shown, index=False, classes=classes)


def facts_table(facts: Sequence[tuple[str, str]]) -> str:
    """Key/value pairs as an HTML table (keys as row headers), escaped."""
    shown = pd.DataFrame({"value": [_cell(v, "") for _, v in facts]}, index=[k for k, _ in facts])
    return _to_html(shown, header=False, classes=["facts"])


# ================================================================= the summary sentence
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
        ("trials", f"{len(t)} ({int(t['_ok'].sum())} ok, {int((~t['_ok']).sum())} errored)"),
        ("trials on the front", str(int((t["pareto_rank"] == 0).sum()))),
    ]
    if SKIP_COL in t:
        k = int(t["_attack_skipped"].sum())
        facts.append(("attack not run (utility gate)", f"{k} trial{'s' * (k != 1)}"))
    if res.replicated:
        c = res.configs
        facts += [
            ("configurations", f"{len(c)} ({_range(c['runs'])} runs each, {int(c['runs_ok'].sum())} ok runs)"),
            ("configurations on the front (means)", str(int((c["pareto_rank"] == 0).sum()))),
        ]
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
    shown["_runs"] = [_runs(r) for r in rows]
    shown["_seeds"] = [_seeds(r.get("seeds")) for r in rows]
    by_metric = {m: strongest_column(m) for m in res.metrics if strongest_column(m) in front}  # strongest_summary
    columns = [CONFIG_ID, "_label", *searched, *(f"_ms_{m}" for m in res.metrics), *by_metric.values(), "_runs",
               "_seeds"]
    headers = ["configuration", "surrogate", *(short(c) for c in searched),
               *(f"{m} (mean ± std)" for m in res.metrics), *(f"strongest attack ({m})" for m in by_metric),
               "runs", "seeds"]  # fmt: skip
    return html_table(shown, columns, headers)


PAPER_ALWAYS = ("test_acc", "attack_ssim")  # the paper's two tables; PSNR and MSE when they hold a value


def paper_tables(res: Results) -> list[dict] | None:
    """``cem_bench.table.paper_table`` of test_acc and attack_ssim (and attack_psnr, attack_mse when they hold
    a value) as escaped HTML: ``[{metric, table, error}]``; None without a σ column (not a CEM grid)."""
    c = res.configs
    if c is None or SIGMA not in c:
        return None
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
