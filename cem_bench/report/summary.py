"""The report's text: number formatting, the HTML tables (``DataFrame.to_html``, escaped), the summary
sentence and the run facts; with replicates, the front of configurations (mean ± std) and the paper-style
tables (``cem_bench.table.paper_table``)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cem_bench import noise
from cem_bench.aggregate import CONFIG_ID, SEED_COLUMN
from cem_bench.schema import DEFAULT_UTILITY_TOLERANCE, privacy_mode, strongest_column
from cem_bench.table import DEFAULT_METRICS, SIGMA, column_label, legend, paper_table

from .load import LAMBD_COL, MAIN_PARAMS, REPORTED_METRICS, SKIP_COL, SURROGATE_COL, Results, is_attack_metric

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


def facts_table(facts: Sequence[tuple[str, str]]) -> str:
    """Key/value pairs as an HTML table (keys as row headers), escaped."""
    shown = pd.DataFrame({"value": [_cell(v, "") for _, v in facts]}, index=[k for k, _ in facts])
    return _to_html(shown, header=False, classes=["facts"])


# ================================================================= the summary sentence
AT, TRADE_OFF, UNRESOLVED = "at", "trade-off", "unresolved"   # a claimed configuration's utility (``Claim``)
POWER = 0.8          # the chance a suggested confirmation resolves a difference of the size seen
MOST_SEEDS = 30      # confirmation seeds beyond which the page says the baseline needs more seeds instead


def _accuracy_point(values: pd.Series) -> float:
    """'One point' of a utility metric: 0.01 for fractions in [0, 1], else 1.0 (percent)."""
    v = values.dropna()
    return 0.01 if len(v) == 0 or v.abs().max() <= 1.0 else 1.0


def utility_tolerance(res: Results) -> float:
    """How far a configuration's utility may fall below its baseline's and still count as "at the baseline's
    accuracy": the space's ``utility_tolerance``, else ``schema.DEFAULT_UTILITY_TOLERANCE`` (2 points of a
    fraction; 2.0 for a utility in percent). A stated number, not the baseline's spread: a noisy baseline
    would otherwise excuse any cost (docs/protocol.md §9)."""
    if res.utility_tolerance is not None:
        return float(res.utility_tolerance)
    return DEFAULT_UTILITY_TOLERANCE * _accuracy_point(res.configs[res.metrics[0]]) / 0.01


def utility_states(rows: pd.DataFrame, res: Results) -> pd.Series:
    """Each configuration's utility against its baseline's: ``AT`` where the 95 % interval of the difference
    lies above -``utility_tolerance`` (an equivalence test: a drop, if any, is shown smaller than the
    tolerance), else ``TRADE_OFF`` where the drop itself is beyond the noise (the single test: the
    configuration was chosen on privacy, so this is one test), else ``UNRESOLVED``."""
    u = res.objectives[0]
    m, tol = u["metric"], utility_tolerance(res)
    if f"{m}_delta_lo" not in rows:
        return pd.Series(UNRESOLVED, index=rows.index, dtype=object)
    lo, hi = (pd.to_numeric(rows[f"{m}_delta_{k}"], errors="coerce") for k in ("lo", "hi"))
    at = ((lo >= -tol) if u["mode"] == "max" else (hi <= tol)).fillna(False)
    worse = rows.get(f"{m}_verdict_single", pd.Series("", index=rows.index)) == noise.WORSE
    return pd.Series(np.where(at, AT, np.where(worse, TRADE_OFF, UNRESOLVED)), index=rows.index, dtype=object)


def at_utility(rows: pd.DataFrame, res: Results) -> pd.Series:
    """Is each configuration shown to be at its baseline's utility (``utility_states`` is ``AT``)?"""
    return utility_states(rows, res) == AT


def candidates(res: Results) -> pd.DataFrame:
    """The configurations a claim can be about: ok, not a baseline, and confirmed when confirmation ran."""
    c = res.configs
    pool = c[c["_ok"] & (c["role"] != "baseline")]
    return pool[pool["role"] == "confirmed"] if res.confirmed else pool


@dataclass
class Claim:
    """What the summary may say about privacy (``claim``): the ``pool`` it chooses from (``candidates``), the
    ``family`` of comparisons its correction covers (the pool's configurations with a p-value on the privacy
    objective: the same family ``aggregate.adjust_comparisons`` corrects), whether they are ``confirmed``, the
    ``claimed`` configurations (better beyond the noise by the single test and by Holm's correction over the
    family; most private first), the one ``named`` and its ``utility`` state (``utility_states``)."""

    pool: pd.DataFrame
    family: int
    confirmed: bool
    claimed: pd.DataFrame
    named: pd.Series | None
    utility: str


def claim(res: Results) -> Claim | None:
    """The summary's claim (``Claim``); None without two objectives or a noise floor. Among the claimed
    configurations, the most private one shown at the baseline's utility is named, else the most private."""
    c = res.configs
    if c is None or len(res.objectives) < 2 or not res.has_floor:
        return None
    pm, mode = res.metrics[1], res.modes[1]
    pool = candidates(res)
    if f"{pm}_holm" not in pool:
        return Claim(pool, 0, res.confirmed, pool.iloc[0:0], None, "")
    holm = pd.to_numeric(pool[f"{pm}_holm"], errors="coerce")
    found = pool[(pool[f"{pm}_verdict_single"] == noise.BETTER) & (holm <= noise.ALPHA)]
    found = found.sort_values(pm, ascending=mode == "min", kind="stable")
    named, state = None, ""
    if len(found):
        states = utility_states(found, res)
        at = found[states == AT]
        named = at.iloc[0] if len(at) else found.iloc[0]
        state = str(states[named.name])
    return Claim(pool, int(holm.notna().sum()), res.confirmed, found, named, state)


def seeds_needed(row: pd.Series, base: pd.Series, metric: str, alpha: float = noise.ALPHA) -> int | None:
    """Confirmation seeds that would resolve a difference of ``row``'s size on ``metric`` (Welch's test at
    ``alpha`` against the baseline's runs as they are) with probability ``POWER``, on the row's spread (the
    baseline's where it has none); None beyond ``MOST_SEEDS`` (the baseline's own spread is then the limit)."""
    from scipy.stats import nct
    from scipy.stats import t as student
    d = abs(float(row.get(f"{metric}_delta", np.nan)))
    s_b, n_b = float(base.get(f"{metric}_std", np.nan)), int(base.get(f"{metric}_n", 0) or 0)
    s_c = float(row.get(f"{metric}_std", np.nan))
    s_c = s_b if not np.isfinite(s_c) else s_c
    if not (np.isfinite(d) and d > 0 and np.isfinite(s_b) and n_b >= 2):
        return None
    for n in range(2, MOST_SEEDS + 1):
        a, b = s_c ** 2 / n, s_b ** 2 / n_b
        if a + b <= 0:
            return n
        dof = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / (n_b - 1))
        if nct.sf(student.ppf(1 - alpha / 2, dof), dof, d / np.sqrt(a + b)) >= POWER:
            return n
    return None


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 configuration``, ``2 configurations``, ``1 ok trial``: a count with its noun in agreement."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def round_to(value, scale, signed: bool = False) -> str:
    """``value`` at the precision ``scale`` (a spread, a half-width) allows: two significant digits of the
    scale, so "0.905 ± 0.019", not "0.9054 ± 0.01851"; three significant digits without a scale."""
    if _is_missing(value):
        return "—"
    v, s = float(value), abs(float(scale)) if not _is_missing(scale) else float("nan")
    sign = "+" if signed else ""
    if not math.isfinite(v):
        return format_value(v)
    if not (math.isfinite(s) and s > 0):
        return f"{v:{sign}.3g}"
    decimals = min(8, max(0, 1 - math.floor(math.log10(s))))
    return f"{v:{sign},.{decimals}f}"


def _runs_of(row: pd.Series, metric: str) -> str:
    """``4 runs`` / ``4 confirmation runs``: how many runs a configuration's statistics on ``metric`` use."""
    n = row.get(f"{metric}_n")
    if _is_missing(n):
        return ""
    kind = "confirmation run" if row.get("role") == "confirmed" else "run"
    return plural(int(n), kind)


def _ms(row: pd.Series, metric: str) -> str:
    """``0.905 ± 0.019`` of a configuration row, rounded to its spread (the mean alone for a single run)."""
    mean, std = row.get(metric), row.get(f"{metric}_std")
    if _is_missing(mean):
        return "—"
    if _is_missing(std):
        return round_to(mean, None)
    return f"{round_to(mean, std)} ± {round_to(std, std)}"


def _pm(row: pd.Series, metric: str) -> str:
    """``0.905 ± 0.019 over 4 runs`` of a configuration row (the runs its statistics use)."""
    runs = _runs_of(row, metric)
    return _ms(row, metric) + (f" over {runs}" if runs else "")


def _interval(row: pd.Series, metric: str) -> str:
    """``Δ -0.062 (95 % interval -0.090 to -0.030, P(improvement) 0.89)`` of a configuration row, rounded to the
    interval's half-width."""
    d, lo, hi, pb = (row.get(f"{metric}_{k}") for k in ("delta", "delta_lo", "delta_hi", "p_better"))
    if _is_missing(d):
        return "Δ —"
    half = (float(hi) - float(lo)) / 2 if not (_is_missing(lo) or _is_missing(hi)) else None
    text = f"Δ {round_to(d, half, signed=True)}"
    if not _is_missing(lo):
        text += f" (95 % interval {round_to(lo, half, signed=True)} to {round_to(hi, half, signed=True)}"
        text += f", P(improvement) {float(pb):.2f})" if not _is_missing(pb) else ")"
    return text


def _p(value) -> str:
    """A p- or q-value: two significant digits, "< 0.0001" below that."""
    if _is_missing(value):
        return "—"
    v = float(value)
    return "< 0.0001" if v < 1e-4 else f"{v:.2g}"


def _family_text(cl: Claim) -> str:
    """``the 12 configurations compared`` / ``the 3 confirmed configurations compared``."""
    kind = "confirmed configuration" if cl.confirmed else "configuration"
    return f"the {plural(cl.family, kind)} compared"


def _strength(cl: Claim, row: pd.Series, metric: str) -> str:
    """How the claim on ``row`` was tested, as a sentence: confirmed, or exploratory; the p-value and Holm's."""
    test = (f"p {_p(row.get(f'{metric}_p'))} ({_p(row.get(f'{metric}_holm'))} after Holm's correction over "
            f"{_family_text(cl)})")
    if cl.confirmed:
        return f"The claim is confirmed with new seeds: {test}."
    return (f"The claim is exploratory until confirmed with new seeds, since no configuration ran again after the "
            f"choice: {test}.")


def _marks(res: Results) -> pd.DataFrame:
    """The configurations the page's tables mark on either objective (``<m>_verdict`` better or worse, after
    the Benjamini-Hochberg correction)."""
    c = res.configs
    marked = np.zeros(len(c), dtype=bool)
    for m in res.metrics[:2]:
        if f"{m}_verdict" in c:
            marked |= c[f"{m}_verdict"].isin([noise.BETTER, noise.WORSE]).to_numpy()
    return c[marked & (c["role"] != "baseline").to_numpy()]


def _verdict_words(verdict: str) -> str:
    """The tables' verdict (Benjamini-Hochberg) on the summary's closest candidate, as prose."""
    return {noise.WITHIN: "within the noise", noise.BETTER: "marked better by the tables' correction",
            noise.WORSE: "marked worse by the tables' correction"}.get(verdict, verdict)


MAX_SENTENCE_WORDS = 32   # tests/test_report.py holds every sentence of the summary to this


def summary_sentence(res: Results) -> str:
    """A few short plain sentences on what the search found, claiming only what its replicates support after
    the correction for the comparisons made (unescaped text; docs/protocol.md section 9). Numbers are rounded
    to the precision their spread allows (``round_to``)."""
    ok = res.ok
    counts = f"{plural(len(res.trials), 'trial')} {status_counts(res.trials)}"
    tail = f" {counts[0].upper() + counts[1:]}."
    if len(res.objectives) < 2 or ok.empty:
        return f"{counts[0].upper() + counts[1:]}. No completed trial to compare."
    u, p = res.objectives[0], res.objectives[1]
    um, pm = u["metric"], p["metric"]
    c = res.configs
    base_rows = c[(c["role"] == "baseline") & c["_ok"]] if c is not None else pd.DataFrame()
    if base_rows.empty:
        return (f"No λ=0 baseline ran, so there is no noise floor and no reference accuracy. This report claims "
                f"no difference between configurations.{tail}")
    base = base_rows.sort_values("runs_ok", ascending=False, kind="stable").iloc[0]
    base_runs = _runs_of(base, pm)
    base_txt = f"{pm} {_ms(base, pm)}, {um} {_ms(base, um)}" + (f" over {base_runs}" if base_runs else "")
    if not res.has_floor:
        return (f"The λ=0 baseline ran once ({base_txt}). With one seed there is no noise floor, so this report "
                f"claims no difference. The plots show single runs.{tail}")
    base_sentence = f" The λ=0 baseline has {base_txt}."
    scope = "confirmed configurations" if res.confirmed else "configurations"
    cl = claim(res)
    tol = utility_tolerance(res)
    tol_txt = f"{format_value(tol)} (the space's utility_tolerance)"
    if cl.named is None:
        return _no_claim(res, cl, scope) + base_sentence + tail
    r = cl.named
    strength = " " + _strength(cl, r, pm)
    borrowed = " Its spread is the baseline's (it ran once)." if bool(r.get("spread_borrowed")) else ""
    others = ""
    if len(cl.claimed) > 1:
        by = cl.claimed.groupby("_label").size()
        others = (f" {len(cl.claimed)} of {_family_text(cl)} pass the same test and correction (" +
                  ", ".join(f"{k}: {v}" for k, v in by.items()) + ").")
    who = f"{r['_label']} (configuration {r[CONFIG_ID]}, {'confirmed, ' if r['role'] == 'confirmed' else ''}" \
          f"{_params_text(res, r)})"
    moves = f"{'lowers' if p['mode'] == 'min' else 'raises'} {pm} to {_pm(r, pm)}. That is {_interval(r, pm)}."
    if cl.utility == TRADE_OFF:
        return (f"A trade-off, not free privacy: {who} is more private than the λ=0 baseline beyond its noise. "
                f"It {moves}{strength} But its {um} falls beyond the noise: {_pm(r, um)}, {_interval(r, um)}, "
                f"p {_p(r.get(f'{um}_p'))}. That is one test, as the configuration was chosen on privacy."
                f"{_um_table_note(r, um)} None of the {scope} is more private at the baseline's {um}."
                f"{borrowed}{others}{base_sentence}{tail}")
    head = f"Beyond the noise of the λ=0 baseline, {who} {moves}{strength}"
    if cl.utility == AT:
        body = (f" It is at the baseline's {um}: {_pm(r, um)}, {_interval(r, um)}. That interval lies within the "
                f"{tol_txt} allowed.")
    else:
        body = (f" Its cost in {um} is not resolved: {_pm(r, um)}, {_interval(r, um)}. That interval reaches "
                f"below the −{tol_txt} allowed, and no drop is beyond the noise either.")
        own = _baseline_of(res, r)
        need = equivalence_seeds(r, own, um, tol, res.modes[0]) if own is not None else None
        if need is not None:
            body += (f" With {need} confirmation seeds its interval would be narrow enough to lie inside the "
                     f"tolerance, if the difference is what it seems.")
        elif own is not None:
            body += (f" Confirmation seeds alone cannot narrow its interval inside the tolerance. The baseline's "
                     f"own {um} spread needs more seeds too.")
    return head + body + borrowed + others + base_sentence + tail


def _baseline_of(res: Results, row: pd.Series) -> pd.Series | None:
    c = res.configs
    own = c[c[CONFIG_ID] == row.get("baseline_id")]
    return own.iloc[0] if len(own) else None


def equivalence_seeds(row: pd.Series, base: pd.Series, metric: str, tol: float, mode: str) -> int | None:
    """Runs of ``row``'s configuration at which the expected half-width of Welch's interval of the difference
    fits inside ``tol`` less the drop seen (against the baseline's runs as they are, on the row's spread or the
    baseline's); None beyond ``MOST_SEEDS`` or where the drop seen already reaches the tolerance."""
    from scipy.stats import t as student
    d = float(row.get(f"{metric}_delta", np.nan)) * (1 if mode == "max" else -1)
    s_b, n_b = float(base.get(f"{metric}_std", np.nan)), int(base.get(f"{metric}_n", 0) or 0)
    s_c = float(row.get(f"{metric}_std", np.nan))
    s_c = s_b if not np.isfinite(s_c) else s_c
    margin = tol + min(d, 0.0)
    if not (np.isfinite(d) and margin > 0 and np.isfinite(s_b) and n_b >= 2):
        return None
    for n in range(2, MOST_SEEDS + 1):
        a, b = s_c ** 2 / n, s_b ** 2 / n_b
        dof = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / (n_b - 1)) if a + b > 0 else n + n_b - 2
        if student.ppf(0.5 + noise.LEVEL / 2, dof) * np.sqrt(a + b) <= margin:
            return n
    return None


def _um_table_note(row: pd.Series, metric: str) -> str:
    """Why the tables may leave that drop unmarked: their marks are corrected over every configuration."""
    if row.get(f"{metric}_verdict") == noise.WORSE:
        return ""
    return (f" The tables, corrected over every configuration of the page, leave it unmarked: q "
            f"{_p(row.get(f'{metric}_q'))}.")


def _no_claim(res: Results, cl: Claim, scope: str) -> str:
    """The summary when no configuration survives: what was compared, the most private one's numbers, what
    the tables mark instead, and how many confirmation seeds a difference of that size would need."""
    pm, um = res.metrics[1], res.metrics[0]
    corrected = f", once corrected for {_family_text(cl)} (Holm)" if cl.family > 1 else ""
    text = f"None of the {scope} is more private than the λ=0 baseline beyond its noise{corrected}."
    marks = _marks(res)
    if marks.empty:
        text += " After the correction, the differences the plots show are within the noise of the baseline."
    else:
        text += (f" The tables mark {plural(len(marks), 'configuration')} against the baseline on {pm} or {um}, "
                 f"by Benjamini-Hochberg (q ≤ {noise.ALPHA:g}). That rule keeps false marks to 5 % of the marks "
                 f"on average, a weaker guarantee than the summary's."
                 + (" They are the search's own runs, not confirmed." if not (marks["role"] == "confirmed").all()
                    else ""))
    closest = cl.pool.dropna(subset=[pm]).sort_values(pm, ascending=res.modes[1] == "min", kind="stable")
    if not len(closest):
        return text
    r = closest.iloc[0]
    if not isinstance(r.get("baseline_id"), str):
        return (text + f" The most private of them, {r['_label']} ({r[CONFIG_ID]}), has {pm} {_pm(r, pm)}. No "
                f"λ=0 baseline shares its other keys (σ, …), so it is compared with none.")
    verdict = r.get(f"{pm}_verdict") or "no verdict"
    text += (f" The most private of them, {r['_label']} ({r[CONFIG_ID]}), has {pm} {_pm(r, pm)} and {um} "
             f"{_ms(r, um)}. Against the baseline: {_interval(r, pm)}, {_verdict_words(verdict)}, p "
             f"{_p(r.get(f'{pm}_p'))} ({_p(r.get(f'{pm}_holm'))} after Holm's correction).")
    better = r.get(f"{pm}_delta")
    if not _is_missing(better) and (float(better) < 0) == (res.modes[1] == "min") and float(better) != 0:
        base = _baseline_of(res, r)
        need = seeds_needed(r, base, pm) if base is not None else None
        if need is not None:
            text += (f" Confirming it alone with {need} new seeds would resolve a difference of this size "
                     f"{POWER:.0%} of the time, if it is real. The most private of many looks better than it is.")
        elif base is not None:
            text += (f" A difference of this size would need more than {MOST_SEEDS} confirmation seeds against "
                     f"the baseline's runs. The baseline needs more seeds too.")
    return text


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
    cols += [c for c in REPORTED_METRICS if c not in cols and res.trials[c].notna().any()]
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
    if "failures" in t:   # Ray's num_failures (results.ray_trials): a worker or node lost, the trial started again
        n = pd.to_numeric(t["failures"], errors="coerce").fillna(0)
        k, failures = int((n > 0).sum()), int(n.sum())
        resumed = pd.to_numeric(t.loc[n > 0, "resumed_from_epoch"], errors="coerce") if "resumed_from_epoch" in t else []
        where = sorted({int(e) for e in pd.Series(resumed).dropna()})
        facts.append(("retried after a failure (worker or node lost)", f"{k} trial{'s' * (k != 1)}" + (
            f" ({failures} failure{'s' * (failures != 1)}; the last attempt resumed from the checkpoint of epoch "
            f"{', '.join(map(str, where))}; 0 = from the start)" if k else "")))
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
        facts.append(("configurations table", configs_source_text(res)))
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


def configs_source_text(res: Results) -> str:
    """Where the page's configurations come from: the folder's configs.parquet, or the trials (issue 34: a
    folder holding only trials.parquet gets no configs.parquet from the report, and the page says so)."""
    if res.configs_stored:
        return "configs.parquet of the results folder; configs.csv beside this page is a copy"
    return ("built from trials.parquet by this report: the results folder holds no configs.parquet about these "
            "trials, and this report wrote none there (it writes only its own folder); configs.csv beside this "
            "page holds the configurations, and `cem-bench table --csv` prints them")


def status_counts(t: pd.DataFrame) -> str:
    """``(3 ok, 1 stopped early, 2 interrupted, 1 errored)``: a trial the scheduler stopped or a signal
    interrupted is not an error (results.mark_stopped, results.mark_interrupted)."""
    status = t["status"] if "status" in t else pd.Series("ok", index=t.index)
    stopped, interrupted = int((status == "stopped").sum()), int((status == "interrupted").sum())
    errored = int((~t["_ok"]).sum()) - stopped - interrupted
    return (f"({int(t['_ok'].sum())} ok, " + (f"{stopped} stopped early, " if stopped else "")
            + (f"{interrupted} interrupted, " if interrupted else "") + f"{errored} errored)")


def trials_text(t: pd.DataFrame) -> str:
    return f"{len(t)} {status_counts(t)}"


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
    """``mean ± std`` of ``metric`` in a configuration row, rounded to the spread (``round_to``: the summary's
    numbers and the tables' agree); the mean alone for a single run."""
    return _ms(row, metric)


def _runs(row: pd.Series) -> str:
    """The runs of a configuration, saying which its statistics use: ``3 (1 errored)``; for a confirmed
    configuration ``4 confirmation runs (+1 search run, not in the statistics)``, so the count agrees with
    the summary's and the plot's (``<m>_n``: the confirmation's runs only)."""
    runs, ok = int(row["runs"]), int(row["runs_ok"])
    text = str(runs) if ok == runs else f"{runs} ({runs - ok} errored)"
    seeds = row.get("seeds")
    used = len(seeds) if isinstance(seeds, (list, tuple, np.ndarray)) else None
    if row.get("role") == "confirmed" and used is not None and 0 < used < ok:
        left = ok - used
        text = (f"{plural(used, 'confirmation run')} (+{plural(left, 'search run')}, not in the statistics"
                + (f"; {runs - ok} errored)" if ok != runs else ")"))
    return text


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
    pq = [m for m in res.metrics if f"{m}_q" in front]
    for m in pq:
        shown[f"_p_{m}"] = [_p(r.get(f"{m}_p")) for r in rows]
        shown[f"_q_{m}"] = [_p(r.get(f"{m}_q")) for r in rows]
    columns = [CONFIG_ID, "_label", "role", *searched, *(f"_ms_{m}" for m in res.metrics),
               *(f"_vs_{m}" for m in res.metrics), *(c for m in pq for c in (f"_p_{m}", f"_q_{m}")),
               *by_metric.values(), "_runs", "_seeds"]
    headers = ["configuration", "surrogate", "role", *(short(c) for c in searched),
               *(f"{m} (mean ± std)" for m in res.metrics), *(f"{m} vs the λ=0 baseline" for m in res.metrics),
               *(h for m in pq for h in (f"{m} p (single test)", f"{m} q (adjusted)")),
               *(f"strongest attack ({m})" for m in by_metric), "runs (of the statistics)",
               "seeds (of the statistics)"]  # fmt: skip
    return html_table(shown, columns, headers, full=CONFIGS_IN_FULL)


def comparison_note(res: Results) -> str:
    """What the front and per-surrogate tables' verdicts mean (the note above the front table)."""
    return (f"Against the λ=0 baseline: the difference of the means, its 95 % interval (percentile bootstrap, "
            f"widened to Welch's t interval where that is wider) and the probability that a run beats a baseline "
            f"run; \"beyond the noise\" needs the interval to exclude 0, that probability to be at least "
            f"{noise.P_MIN:g}, and the difference to survive Benjamini-Hochberg's correction over the page's "
            f"comparisons of that metric (q ≤ {noise.ALPHA:g}; the confirmed configurations are corrected among "
            f"themselves). p is the comparison's own Welch p-value, q the adjusted one; a confirmed role means "
            f"the statistics are confirmation runs (new seeds after the choice), a search role the search's own "
            f"runs, exploratory (docs/protocol.md §9).")


def versus_baseline(row: pd.Series, metric: str) -> str:
    """A configuration against its baseline on ``metric``: the verdict, then the difference, its interval and
    the probability of improvement (``noise.compare``); "—" for a baseline itself or without a floor."""
    verdict = row.get(f"{metric}_verdict")
    if row.get("role") == "baseline" or not isinstance(verdict, str) or not verdict:
        return "—"
    text = {noise.BETTER: "better beyond the noise", noise.WORSE: "worse beyond the noise"}.get(
        verdict, "within the noise")
    single = row.get(f"{metric}_verdict_single")
    if verdict == noise.WITHIN and single in (noise.BETTER, noise.WORSE):
        text += f" after the correction ({'better' if single == noise.BETTER else 'worse'} as a single test)"
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
    for key, m in (("p", pm), ("u", um)):
        shown[f"_pp_{key}"] = [_p(r.get(f"{m}_p")) for r in rows]
        shown[f"_q_{key}"] = [_p(r.get(f"{m}_q")) for r in rows]
    columns = ["_label", CONFIG_ID, "role", "_ms_p", "_vs_p", "_pp_p", "_q_p", "_ms_u", "_vs_u", "_pp_u", "_q_u",
               "_runs"]
    headers = ["surrogate", "configuration", "role", f"{pm} (mean ± std)", f"{pm} vs the λ=0 baseline",
               f"{pm} p (single test)", f"{pm} q (adjusted)", f"{um} (mean ± std)", f"{um} vs the λ=0 baseline",
               f"{um} p (single test)", f"{um} q (adjusted)", "runs (of the statistics)"]
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
        out.append({"metric": m, "table": _to_html(table, classes=["paper"]), "legend": legend(c, m),
                    "error": None})
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
