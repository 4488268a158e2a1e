"""The report's HTML tables (``DataFrame.to_html``, every cell escaped): ``html_table`` and ``facts_table``;
with replicates, the front of configurations (mean ± std, each against its λ = 0 baseline), each surrogate's
best configuration and the paper-style tables (``cem_bench.analysis.table.paper_table``); the trials whose attack did
not run."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from cem_bench.analysis import noise
from cem_bench.analysis.aggregate import CONFIG_ID
from cem_bench.analysis.table import (
    DEFAULT_METRICS,
    NOT_OK_WORDS,
    SIGMA,
    STRENGTH_LEGEND,
    column_label,
    legend,
    paper_table,
    pq_table,
    strength_table,
)
from cem_bench.schema import strongest_column

from .facts import config_searched_columns
from .formatting import few_on, format_value, interval, is_missing, ms, p_text, plural, short
from .load import BASELINE_LABEL, SKIP_COL, SURROGATE_COL, Results, front_of, is_attack_metric
from .summary import at_utility

MAX_TABLE_ROWS = 200  # rows an HTML table of the report shows (the rest are in the Parquet tables and CSVs)
_NEWLINE = "\x1f"  # stands for a line break inside a cell: to_html would print "\n" as a backslash and an n


def _cell(value, column: str) -> str:
    text = format_value(value, column).replace(_NEWLINE, " ").replace("\r\n", "\n").replace("\r", "\n")
    return text.expandtabs(4).replace("\n", _NEWLINE)


def _to_html(df: pd.DataFrame, **kw) -> str:
    """``df`` (strings from ``_cell``) as an escaped HTML table; quotes escaped like ``html.escape``."""
    text = df.to_html(escape=True, border=0, **kw)
    return text.replace("'", "&#x27;").replace(_NEWLINE, "\n")


TRIALS_IN_FULL = "every trial is in trials.parquet (and the front's in frontier.csv)"
CONFIGS_IN_FULL = "every configuration is in configs.csv beside this page (and the front's in frontier_configs.csv)"


def html_table(df: pd.DataFrame, columns: Sequence[str], headers: Sequence[str] | None = None,
               pre: Sequence[str] = (), classes: Sequence[str] = (), full: str = TRIALS_IN_FULL) -> str:
    """An HTML table of ``df[columns]`` with formatted numbers; every cell is escaped.

    ``pre`` columns keep their line breaks in a monospace font; they must be the last columns. ``classes``:
    more CSS classes of the table. ``full``: where the rows a long table leaves out are (``TRIALS_IN_FULL``,
    ``CONFIGS_IN_FULL``)."""
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
        html += f'\n<p class="note">The first {MAX_TABLE_ROWS} of {total:,} rows; {full}.</p>'
    return html


def hypotheses_html(table: pd.DataFrame) -> str:
    """The tested hypotheses (``hypotheses.evaluate``) as the page shows them: each side's mean ± std over its
    runs, the difference with its 95 % interval, the one-sided p and the family's adjusted p, the verdict."""
    def side(r, s):
        return f"{format_value(r['mean_' + s], r['metric'])} ± {format_value(r['std_' + s], r['metric'])} " \
               f"({int(r['n_' + s])} run{'s' * (r['n_' + s] != 1)})"

    def diff(r):
        m = r["metric"]
        return f"{format_value(r['diff'], m)} ({format_value(r['ci_low'], m)} to {format_value(r['ci_high'], m)})"

    rows = [r for _, r in table.iterrows()]
    shown = pd.DataFrame({
        "hypothesis": table["name"],
        "claim": [f"{r['metric']}: {r['claim']}" + (" (paired by seed)" if r["paired"] else "") for r in rows],
        "a": table["a"], "b": table["b"],
        "a: mean ± std": [side(r, "a") for r in rows], "b: mean ± std": [side(r, "b") for r in rows],
        "a − b (95 % interval, two-sided, not adjusted)": [diff(r) for r in rows],
        "p (one-sided)": table["p"], "adjusted p": table["p_adjusted"], "verdict": table["verdict"]})
    return html_table(shown, list(shown.columns), classes=["hypotheses"])


def facts_table(facts: Sequence[tuple[str, str]]) -> str:
    """Key/value pairs as an HTML table (keys as row headers), escaped."""
    shown = pd.DataFrame({"value": [_cell(v, "") for _, v in facts]}, index=[k for k, _ in facts])
    return _to_html(shown, header=False, classes=["facts"])


# ================================================================= replicates: configurations
def mean_std(row: pd.Series, metric: str) -> str:
    """``mean ± std`` of ``metric`` in a configuration row, rounded to the spread (``round_to``: the summary's
    numbers and the tables' agree); the mean alone for a single run."""
    return ms(row, metric)


def not_ok_kinds(res: Results) -> dict[str, str]:
    """Per configuration id, what its runs that are not ok are, in the words of the run facts
    (``facts.status_counts``): "errored", "stopped early", "interrupted", "still running", or "not ok" for a mix."""
    t = res.trials
    if CONFIG_ID not in t or "status" not in t:
        return {}
    bad = t.loc[~t["_ok"], [CONFIG_ID, "status"]].astype(str)
    out = {}
    for cid, status in bad.groupby(CONFIG_ID)["status"]:
        kinds = {NOT_OK_WORDS.get(s, "errored") for s in status}
        out[cid] = kinds.pop() if len(kinds) == 1 else "not ok"
    return out


def _runs(row: pd.Series, kinds: dict[str, str] | None = None) -> str:
    """The runs of a configuration, saying which its statistics use: ``3 (1 errored)`` (or ``stopped early``,
    ``interrupted``: ``kinds``, from ``not_ok_kinds``); for a confirmed configuration ``4 confirmation runs (+1
    search run, not in the statistics)``, so the count agrees with the summary's and the plot's (``<m>_n``: the
    confirmation's runs only)."""
    runs, ok = int(row["runs"]), int(row["runs_ok"])
    word = (kinds or {}).get(str(row.get(CONFIG_ID)), "errored")
    text = str(runs) if ok == runs else f"{runs} ({runs - ok} {word})"
    seeds = row.get("seeds")
    used = len(seeds) if isinstance(seeds, (list, tuple, np.ndarray)) else None
    if row.get("role") == "confirmed" and used is not None and 0 < used < ok:
        left = ok - used
        text = (f"{plural(used, 'confirmation run')} (+{plural(left, 'search run')}, not in the statistics"
                + (f"; {runs - ok} {word})" if ok != runs else ")"))
    return text


def _seeds(value) -> str:
    if isinstance(value, (list, tuple, np.ndarray)):
        return ", ".join(str(int(v)) for v in value) or "—"
    return "—" if is_missing(value) else str(value)


def config_front_table(res: Results, front: pd.DataFrame | None = None) -> str:
    """The configurations on the front of the means (``front``, default ``res.front_configs``), one row each: id,
    surrogate, the varying config keys, ``mean ± std`` of each objective over the ok runs, the runs and their
    seeds."""
    front = res.front_configs if front is None else front
    kinds = not_ok_kinds(res)
    searched = [c for c in config_searched_columns(res) if c != SURROGATE_COL]
    shown = front.copy()
    rows = [r for _, r in front.iterrows()]
    for m in res.metrics:
        shown[f"_ms_{m}"] = [mean_std(r, m) for r in rows]
        shown[f"_vs_{m}"] = [versus_baseline(r, m) for r in rows]
    shown["_runs"] = [_runs(r, kinds) for r in rows]
    shown["_seeds"] = [_seeds(r.get("seeds")) for r in rows]
    by_metric = {m: strongest_column(m) for m in res.metrics if strongest_column(m) in front}  # strongest_summary
    pq = [m for m in res.metrics if f"{m}_q" in front]
    for m in pq:
        shown[f"_p_{m}"] = [p_text(r.get(f"{m}_p")) for r in rows]
        shown[f"_q_{m}"] = [p_text(r.get(f"{m}_q")) for r in rows]
    columns = [CONFIG_ID, "_label", "role", *searched, *(f"_ms_{m}" for m in res.metrics),
               *(f"_vs_{m}" for m in res.metrics), *(c for m in pq for c in (f"_p_{m}", f"_q_{m}")),
               *by_metric.values(), "_runs", "_seeds"]
    headers = ["configuration", "surrogate", "role", *(short(c) for c in searched),
               *(f"{m} (mean ± std)" for m in res.metrics), *(f"{m} vs the λ=0 baseline" for m in res.metrics),
               *(h for m in pq for h in (f"{m} p (single test)", f"{m} q (adjusted)")),
               *(f"strongest attack ({m})" for m in by_metric), "runs (of the statistics)",
               "seeds (of the statistics)"]  # fmt: skip
    return html_table(shown, columns, headers, full=CONFIGS_IN_FULL)


def surrogate_config_fronts(res: Results) -> list[tuple[str, pd.DataFrame]]:
    """Per surrogate, then the λ=0 baseline, the configurations on its own front of the means (best first
    objective first): its confirmed configurations where it has any (their means are confirmation runs; an
    unconfirmed one's are the search's own runs, chosen among), else all its ok ones. On runs, one lucky seed of a
    configuration whose mean is far from it put that configuration on its surrogate's front."""
    c = res.configs
    pool = c[c["_ok"]]
    first = res.objectives[0]
    out = []
    for name, own in [*((s, pool[(pool["_surrogate"] == s) & (pool["role"] != "baseline")]) for s in res.surrogates),
                      (BASELINE_LABEL, pool[pool["role"] == "baseline"])]:
        if (own["role"] == "confirmed").any():
            own = own[own["role"] == "confirmed"]
        own = front_of(own, res.metrics, res.modes)
        if len(own):
            out.append((name, own.sort_values(first["metric"], ascending=first["mode"] == "min", kind="stable")))
    return out


def comparison_note(res: Results) -> str:
    """What the front and per-surrogate tables' verdicts mean (the note above the front table)."""
    return (f"Against the λ=0 baseline: the difference of the means, its 95 % interval (percentile bootstrap, "
            f"widened to Welch's t interval where that is wider; for the search's own runs on Hsu's degrees of "
            f"freedom, the smaller side's runs less one) and the probability that a run beats a baseline "
            f"run, given {noise.MIN_RUNS} or more runs a side (fewer: the difference alone, no verdict); "
            f"\"beyond the noise\" needs the interval to exclude 0, that probability to be at least "
            f"{noise.P_MIN:g}, and the difference to survive Benjamini-Hochberg's correction over the page's "
            f"comparisons of that metric (q ≤ {noise.ALPHA:g}; the confirmed configurations are corrected among "
            f"themselves). p is the comparison's own p-value (Welch's statistic, on those degrees of freedom), "
            f"q the adjusted one; a confirmed role means "
            f"the statistics are confirmation runs (new seeds after the choice), a search role the search's own "
            f"runs, exploratory (docs/protocol.md §9).")


def versus_baseline(row: pd.Series, metric: str) -> str:
    """A configuration against its baseline on ``metric``: the verdict, then the difference, its interval and
    the probability of improvement (``noise.compare``); "—" for a baseline itself or without a floor."""
    verdict = row.get(f"{metric}_verdict")
    if row.get("role") != "baseline" and few_on(row, metric) and not is_missing(row.get(f"{metric}_delta")):
        return f"too few runs for a verdict (fewer than {noise.MIN_RUNS}): {interval(row, metric)}"
    if row.get("role") == "baseline" or not isinstance(verdict, str) or not verdict:
        return "—"
    text = {noise.BETTER: "better beyond the noise", noise.WORSE: "worse beyond the noise"}.get(
        verdict, "within the noise")
    single = row.get(f"{metric}_verdict_single")
    if verdict == noise.WITHIN and single in (noise.BETTER, noise.WORSE):
        text += f" after the correction ({'better' if single == noise.BETTER else 'worse'} as a single test)"
    elif verdict == noise.WITHIN and _means_resolved(row, metric):
        # the interval excludes 0 but runs of the two overlap too much for a verdict: "within the noise" alone
        # read as if the difference were not resolved at all (at many runs, next to p = 1e-7)
        text = (f"no verdict: the means differ (the interval excludes 0), but a run is better than a baseline run "
                f"in {float(row.get(f'{metric}_p_better')):.0%} of pairs; a verdict needs {noise.P_MIN:.0%} (or "
                f"{1 - noise.P_MIN:.0%} for worse)")
    return text + f": {interval(row, metric)}"


def _means_resolved(row: pd.Series, metric: str) -> bool:
    lo, hi, pb = (row.get(f"{metric}_{k}") for k in ("delta_lo", "delta_hi", "p_better"))
    if is_missing(lo) or is_missing(hi) or is_missing(pb):
        return False
    return float(lo) > 0 or float(hi) < 0


BESTS_HEADING = "Each surrogate's most private configuration at the baseline's accuracy (where it has one)"
BESTS_NONE_AT = "Each surrogate's most private configuration (none is shown at the baseline's accuracy)"


def surrogate_bests(res: Results) -> tuple[str, str] | None:
    """Per surrogate, its most private configuration at the baseline's utility (``at_utility``; among
    its confirmed configurations where it has any) and what the replicates say about it: the section's heading
    and table; None without a noise floor or two objectives. Where no surrogate has one at the baseline's
    utility the heading says so (the page promised "at the baseline's accuracy" above rows none of which were)."""
    c = res.configs
    if c is None or len(res.objectives) < 2 or not res.has_floor:
        return None
    um, pm = res.metrics[0], res.metrics[1]
    p_mode = res.modes[1]
    pool = c[c["_ok"] & (c["role"] != "baseline")]
    rows, fallback = [], []
    for s in res.surrogates:
        own = pool[pool["_surrogate"] == s].dropna(subset=[pm])
        if own.empty:
            continue
        if (own["role"] == "confirmed").any():   # a surrogate's confirmed configurations speak for it
            own = own[own["role"] == "confirmed"]
        near = own[at_utility(own, res)] if f"{um}_delta" in own else own.iloc[0:0]
        fallback.append(near.empty)
        own = near if len(near) else own
        rows.append(own.sort_values(pm, ascending=p_mode == "min", kind="stable").iloc[0])
    if not rows:
        return None
    shown = pd.DataFrame(rows).reset_index(drop=True)
    kinds = not_ok_kinds(res)
    # a surrogate none of whose configurations is shown at the baseline's accuracy: its most private one, so
    # marked (the table's heading promises "at the baseline's accuracy")
    shown["_label"] = [f"{lab} (none at the baseline's accuracy: its most private)" if fb else lab
                       for lab, fb in zip(shown["_label"], fallback)]
    shown["_ms_u"] = [mean_std(r, um) for r in rows]
    shown["_ms_p"] = [mean_std(r, pm) for r in rows]
    shown["_vs_u"] = [versus_baseline(r, um) for r in rows]
    shown["_vs_p"] = [versus_baseline(r, pm) for r in rows]
    shown["_runs"] = [_runs(r, kinds) for r in rows]
    for key, m in (("p", pm), ("u", um)):
        shown[f"_pp_{key}"] = [p_text(r.get(f"{m}_p")) for r in rows]
        shown[f"_q_{key}"] = [p_text(r.get(f"{m}_q")) for r in rows]
    columns = ["_label", CONFIG_ID, "role", "_ms_p", "_vs_p", "_pp_p", "_q_p", "_ms_u", "_vs_u", "_pp_u", "_q_u",
               "_runs"]
    headers = ["surrogate", "configuration", "role", f"{pm} (mean ± std)", f"{pm} vs the λ=0 baseline",
               f"{pm} p (single test)", f"{pm} q (adjusted)", f"{um} (mean ± std)", f"{um} vs the λ=0 baseline",
               f"{um} p (single test)", f"{um} q (adjusted)", "runs (of the statistics)"]
    return (BESTS_NONE_AT if all(fallback) else BESTS_HEADING), html_table(shown, columns, headers)


PAPER_ALWAYS = ("test_acc", "attack_ssim")  # the paper's two tables; PSNR and MSE when they hold a value
MAX_PAPER_COLUMNS = 40  # λ × surrogate columns beyond which the paper-style tables are not drawn in the page


def paper_tables(res: Results) -> list[dict] | None:
    """``cem_bench.analysis.table.paper_table`` of test_acc and attack_ssim (and attack_psnr, attack_mse when they hold
    a value) as escaped HTML: ``[{metric, table, error}]``; None without a σ column (not a CEM grid)."""
    c = res.configs
    if c is None or SIGMA not in c:
        return None
    columns = c.apply(column_label, axis=1).nunique() if len(c) <= MAX_PAPER_COLUMNS * 50 else MAX_PAPER_COLUMNS + 1
    if columns > MAX_PAPER_COLUMNS:   # a continuous λ: one column per configuration, unreadable and slow
        return [{"metric": "paper-style tables", "table": None, "legend": None, "error": f"the configurations "
                 f"span more than {MAX_PAPER_COLUMNS} λ × surrogate columns (a searched λ, or a grid that wide); "
                 f"`cem-bench table --csv` prints them, and configs.csv beside this page holds every "
                 f"configuration"}]
    out = []
    for m in DEFAULT_METRICS:
        col = f"{m}_mean"
        if col not in c or (m not in PAPER_ALWAYS and not c[col].notna().any()):
            continue
        try:
            table = paper_table(c, m)
        except Exception as exc:  # noqa: BLE001 - one table that cannot be built must not sink the report
            out.append({"metric": m, "table": None, "legend": None, "error": f"{type(exc).__name__}: {exc}"})
            continue
        table = table.copy()
        table.columns.name, table.index.name = m, None  # one header row: the metric above the σ labels
        # the p / q table the legend cites: every marked cell's p and q, as `cem-bench table` prints them (a cell
        # neither on the front nor a surrogate's best had its numbers nowhere on the page before 2026-12-06)
        pq = pq_table(c, m)
        if pq is not None:
            pq = pq.copy()
            pq.columns.name, pq.index.name = f"{m}: p / q", None
        out.append({"metric": m, "table": _to_html(table, classes=["paper"]), "legend": legend(c, m),
                    "pq": _to_html(pq, classes=["paper"]) if pq is not None else None, "error": None})
    # what one unit of λ meant in each cell (`cem-bench table` prints it too): the columns compare surrogates at
    # equal λ, which is equal strength only where the scales say so
    try:
        scales = strength_table(c)
    except Exception as exc:  # noqa: BLE001 - as above
        out.append({"metric": "cem loss scale", "table": None, "legend": None, "error": f"{type(exc).__name__}: {exc}"})
    else:
        if scales is not None:
            scales = scales.copy()
            scales.columns.name, scales.index.name = "cem loss scale", None
            out.append({"metric": "cem loss scale", "table": _to_html(scales, classes=["paper"]),
                        "legend": STRENGTH_LEGEND, "pq": None, "error": None})
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
