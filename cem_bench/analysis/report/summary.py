"""The report's summary: what it may claim about privacy (``claim``: the configurations better than their λ = 0
baseline beyond the noise after Holm's correction, each one's utility state) and the summary sentence that says
so (``summary_sentence``), with the confirmation seeds a difference would need (``seeds_needed``,
``equivalence_seeds``). The numbers' formatting is ``formatting``'s, the tables ``tables``'s, the run facts
``facts``'s."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from cem_bench.analysis import noise
from cem_bench.analysis.aggregate import CONFIG_ID
from cem_bench.analysis.hypotheses import summary_text as hypotheses_summary
from cem_bench.schema import DEFAULT_UTILITY_TOLERANCE

from .facts import config_searched_columns, status_counts
from .formatting import few_on, format_value, interval, is_missing, ms, p_text, plural, short, varies
from .load import LAMBD_COL, NOISE_COL, SURROGATE_COL, Results

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
    """The summary's claim (``Claim``); None without two objectives or a noise floor. The most private of the
    claimed configurations is named, and its utility is one test: naming whichever one passed its equivalence
    test would choose among several such tests uncorrected, and call a cost just past the tolerance "at the
    baseline's accuracy" in 9 % of reports among 12 claimed configurations and 16 % among 40
    (docs/protocol.md §9)."""
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
        named = found.iloc[0]
        state = str(utility_states(found.iloc[:1], res).iloc[0])
    return Claim(pool, int(holm.notna().sum()), res.confirmed, found, named, state)


def _spreads(row: pd.Series, base: pd.Series, metric: str) -> tuple[float, float, int]:
    """The std on ``metric`` of ``row``'s runs (the baseline's where it has none) and of the baseline's, and the
    baseline's run count; a std that is float rounding (``noise.no_spread``) is 0, and where both are, no number of
    seeds resolves anything: the comparison gives no verdict without spread (NaN spreads: unknown)."""
    s_b, n_b = float(base.get(f"{metric}_std", np.nan)), int(base.get(f"{metric}_n", 0) or 0)
    s_c = float(row.get(f"{metric}_std", np.nan))
    s_c = s_b if not np.isfinite(s_c) else s_c
    means = [float(r.get(metric, r.get(f"{metric}_mean", np.nan))) for r in (row, base)]
    size = max([abs(m) for m in means if np.isfinite(m)], default=0.0)
    s_c, s_b = (0.0 if noise.no_spread(s, size) else s for s in (s_c, s_b))
    return s_c, s_b, n_b


def _flat(row: pd.Series, base: pd.Series, metric: str) -> bool:
    """Neither ``row``'s runs nor the baseline's vary on ``metric`` (both stds known and float rounding)."""
    s_c, s_b, _ = _spreads(row, base, metric)
    return s_c == 0 and s_b == 0


_FLAT_TEXT = ("Its runs and the baseline's do not vary, so no test can weigh the difference against noise; more "
              "seeds would not change that while the runs stay equal.")


def seeds_needed(row: pd.Series, base: pd.Series, metric: str, alpha: float = noise.ALPHA) -> int | None:
    """Confirmation seeds that would resolve a difference of ``row``'s size on ``metric`` (Welch's test at
    ``alpha`` against the baseline's runs as they are) with probability ``POWER``, on the row's spread (the
    baseline's where it has none); None beyond ``MOST_SEEDS`` (the baseline's own spread is then the limit)."""
    from scipy.special import nctdtr  # the non-central t's CDF, what scipy.stats.nct.sf calls (noise.t_quantile)
    d = abs(float(row.get(f"{metric}_delta", np.nan)))
    s_c, s_b, n_b = _spreads(row, base, metric)
    if not (np.isfinite(d) and d > 0 and s_c + s_b > 0 and n_b >= noise.MIN_RUNS):
        return None
    for n in range(noise.MIN_RUNS, MOST_SEEDS + 1):   # fewer runs a side get no test
        a, b = s_c ** 2 / n, s_b ** 2 / n_b
        dof = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / (n_b - 1))
        if 1 - nctdtr(dof, d / np.sqrt(a + b), noise.t_quantile(1 - alpha / 2, dof)) >= POWER:
            return n
    return None


def _runs_of(row: pd.Series, metric: str) -> str:
    """``4 runs`` / ``4 confirmation runs``: how many runs a configuration's statistics on ``metric`` use."""
    n = row.get(f"{metric}_n")
    if is_missing(n):
        return ""
    kind = "confirmation run" if row.get("role") == "confirmed" else "run"
    return plural(int(n), kind)


def _pm(row: pd.Series, metric: str) -> str:
    """``0.905 ± 0.019 over 4 runs`` of a configuration row (the runs its statistics use)."""
    runs = _runs_of(row, metric)
    return ms(row, metric) + (f" over {runs}" if runs else "")


def _family_text(cl: Claim) -> str:
    """``the 12 configurations compared`` / ``the 3 confirmed configurations compared``."""
    kind = "confirmed configuration" if cl.confirmed else "configuration"
    return f"the {plural(cl.family, kind)} compared"


def _strength(cl: Claim, row: pd.Series, metric: str) -> str:
    """How the claim on ``row`` was tested, as a sentence: confirmed, or exploratory; the p-value and Holm's."""
    test = (f"p {p_text(row.get(f'{metric}_p'))} ({p_text(row.get(f'{metric}_holm'))} after Holm's correction over "
            f"{_family_text(cl)})")
    if cl.confirmed:
        return f"The claim is confirmed with new seeds: {test}."
    return (f"The claim is exploratory until confirmed with new seeds, since no configuration ran again after the "
            f"choice: {test}.")


def _marks(res: Results) -> tuple[pd.DataFrame, list[str]]:
    """The configurations the page's tables mark (``<m>_verdict`` better or worse, after the
    Benjamini-Hochberg correction) and the metrics they are marked on: every compared metric, not only the
    two objectives, since the paper-style tables mark ``attack_ssim`` and a third objective as well and the
    frontier plots draw them."""
    c = res.configs
    not_base = (c["role"] != "baseline").to_numpy()
    marked = np.zeros(len(c), dtype=bool)
    metrics = []
    for col in c.columns:
        if not col.endswith("_verdict"):
            continue
        hit = c[col].isin([noise.BETTER, noise.WORSE]).to_numpy() & not_base
        if hit.any():
            metrics.append(col[: -len("_verdict")])
        marked |= hit
    return c[marked], metrics


def _verdict_words(verdict: str) -> str:
    """The tables' verdict (Benjamini-Hochberg) on the summary's closest candidate, as prose."""
    return {noise.WITHIN: "within the noise", noise.BETTER: "marked better by the tables' correction",
            noise.WORSE: "marked worse by the tables' correction"}.get(verdict, verdict)


MAX_SENTENCE_WORDS = 32   # tests/test_report.py holds every sentence of the summary to this


def summary_sentence(res: Results, tested: pd.DataFrame | None = None) -> str:
    """A few short plain sentences on what the search found, claiming only what its replicates support after
    the correction for the comparisons made (unescaped text; docs/protocol.md section 9). Numbers are rounded
    to the precision their spread allows (``round_to``). ``tested``: the space's hypotheses as
    ``hypotheses.evaluate`` tested them; their verdicts lead, and what follows is said to be the report's own
    comparisons, so that a "no difference" there cannot read as denying a hypothesis that holds."""
    if tested is None or tested.empty or not res.hypotheses:
        return _findings(res, "")
    # without a baseline there is no comparison of the report's own to bridge to: it says it claims nothing
    bridge = f"{HYPOTHESES_BRIDGE} " if res.has_floor else ""
    return (f"{hypotheses_summary(tested, res.hypotheses, res.verified)} {bridge}"
            f"{_findings(res, 'beyond the space' + chr(39) + 's hypotheses, ')}")


# between the hypotheses' verdicts and the rest: a different test on other comparisons, chosen after the run
HYPOTHESES_BRIDGE = ("What follows is the report's own comparison of every configuration with the λ=0 baseline, "
                     "picked after the run.")


def _findings(res: Results, beyond: str) -> str:
    """The summary without the hypotheses; ``beyond`` qualifies its "claims no difference" sentences."""
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
        return (f"No λ=0 baseline ran, so there is no noise floor and no reference accuracy: {beyond}this report "
                f"claims no difference between configurations.{tail}")
    base = base_rows.sort_values("runs_ok", ascending=False, kind="stable").iloc[0]
    if not res.has_floor:
        ok = int(pd.to_numeric(base.get("runs_ok"), errors="coerce") or 0)
        if ok > 1:   # runs enough, but the privacy metric recorded in one or none of them
            n_pm = int(pd.to_numeric(base.get(f"{pm}_n"), errors="coerce") or 0)
            return (f"The λ=0 baseline has {ok} runs but {pm} from {n_pm or 'none'} of them "
                    f"({_base_text(base, pm, um)}): the others recorded none (the utility gate skips the attack "
                    f"of a model at chance accuracy), so there is no noise floor for {pm}, and {beyond}this report "
                    f"claims no difference.{tail}")
        return (f"The λ=0 baseline ran once ({_base_text(base, pm, um)}). With one seed there is no noise floor, "
                f"so {beyond}this report claims no difference. The plots show single runs.{tail}")
    scope = "confirmed configurations" if res.confirmed else "configurations"
    cl = claim(res)
    tol = utility_tolerance(res)
    tol_txt = f"{format_value(tol)} ({'the space' + chr(39) + 's' if res.utility_tolerance is not None else 'the default'} " \
              f"utility_tolerance)"
    if cl.named is None:
        text, closest = _no_claim(res, cl, scope)
        own = _baseline_of(res, closest) if closest is not None else None
        return text + _base_sentence(res, own if own is not None else base) + tail
    r = cl.named
    base_sentence = _base_sentence(res, _baseline_of(res, r))
    strength = " " + _strength(cl, r, pm)
    others = ""
    if len(cl.claimed) > 1:
        by = cl.claimed.groupby("_label").size()
        others = (f" {len(cl.claimed)} of {_family_text(cl)} pass the same test and correction (" +
                  ", ".join(f"{k}: {v}" for k, v in by.items()) + ").")
    who = f"{r['_label']} (configuration {r[CONFIG_ID]}, {'confirmed, ' if r['role'] == 'confirmed' else ''}" \
          f"{_params_text(res, r)})"
    moves = f"{'lowers' if p['mode'] == 'min' else 'raises'} {pm} to {_pm(r, pm)}. That is {interval(r, pm)}."
    if cl.utility == TRADE_OFF:
        return (f"A trade-off, not free privacy: {who} is more private than the λ=0 baseline beyond its noise. "
                f"It {moves}{strength} But its {um} falls beyond the noise: {_pm(r, um)}, {interval(r, um)}, "
                f"p {p_text(r.get(f'{um}_p'))}. That is one test, as the configuration was chosen on privacy."
                f"{_um_table_note(r, um)} None of the {scope} is shown more private at the baseline's {um}."
                f"{others}{base_sentence}{tail}")
    head = f"Beyond the noise of the λ=0 baseline, {who} {moves}{strength}"
    if cl.utility == AT:
        body = (f" It is at the baseline's {um}: {_pm(r, um)}, {interval(r, um)}. That interval lies within the "
                f"{tol_txt} allowed.")
    else:
        body = (f" Its cost in {um} is not resolved: {_pm(r, um)}, {interval(r, um)}. That interval reaches "
                f"below the −{tol_txt} allowed, and no drop is beyond the noise either.")
        own = _baseline_of(res, r)
        need = equivalence_seeds(r, own, um, tol, res.modes[0]) if own is not None else None
        if need is not None:
            body += (f" With {need} confirmation seeds its interval would lie inside the tolerance "
                     f"{POWER:.0%} of the time, if the difference is what it seems.")
        elif own is not None and _flat(r, own, um):
            body += f" {_FLAT_TEXT}"
        elif own is not None and _drop_seen(r, um, res.modes[0]) >= tol:
            # no number of seeds shows a drop of this size inside the tolerance: the baseline's spread is not
            # what stands in the way
            body += (f" The drop seen already reaches the tolerance: no number of seeds would show it at the "
                     f"baseline's {um}; more would tell whether the drop is beyond the noise.")
        elif own is not None:
            body += (f" Confirmation seeds alone cannot narrow its interval inside the tolerance. The baseline's "
                     f"own {um} spread needs more seeds too.")
    return head + body + others + base_sentence + tail


def _base_text(base: pd.Series, pm: str, um: str) -> str:
    """``attack_ssim 0.75 ± 0.01 over 4 runs, test_acc 0.90 ± 0.02 over 4 runs`` of a baseline row."""
    return f"{pm} {_pm(base, pm)}, {um} {_pm(base, um)}"


def _base_sentence(res: Results, base: pd.Series | None) -> str:
    """`` The λ=0 baseline (σ 0.1) has ...``: the baseline the sentence before compared with, its σ named when
    the search ran several."""
    if base is None:
        return ""
    sigmas = res.configs[NOISE_COL].dropna().nunique() if NOISE_COL in res.configs else 0
    which = f" (σ {format_value(base.get(NOISE_COL))})" if sigmas > 1 else ""
    return f" The λ=0 baseline{which} has {_base_text(base, res.metrics[1], res.metrics[0])}."


def _baseline_of(res: Results, row: pd.Series) -> pd.Series | None:
    c = res.configs
    own = c[c[CONFIG_ID] == row.get("baseline_id")]
    return own.iloc[0] if len(own) else None


def _drop_seen(row: pd.Series, metric: str, mode: str) -> float:
    """How much worse than the baseline ``row`` is on ``metric`` in the metric's bad direction (0 when better;
    NaN unknown)."""
    d = float(row.get(f"{metric}_delta", np.nan)) * (1 if mode == "max" else -1)
    return max(-d, 0.0) if np.isfinite(d) else float("nan")


def equivalence_seeds(row: pd.Series, base: pd.Series, metric: str, tol: float, mode: str) -> int | None:
    """Runs of ``row``'s configuration at which Welch's interval of the difference lies inside ``tol`` with
    probability ``POWER``, the difference being the drop seen (against the baseline's runs as they are, on the
    row's spread or the baseline's: the lower end above −``tol``, a noncentral t); None beyond ``MOST_SEEDS`` or
    where the drop seen already reaches the tolerance. (The runs at which the *expected* half-width fits would
    give such an interval in 53-59 % of confirmations: a coin flip, where ``seeds_needed`` promises 80 %.)"""
    from scipy.special import nctdtr
    d = float(row.get(f"{metric}_delta", np.nan)) * (1 if mode == "max" else -1)
    s_c, s_b, n_b = _spreads(row, base, metric)
    margin = tol + min(d, 0.0)
    if not (np.isfinite(d) and margin > 0 and s_c + s_b > 0 and n_b >= noise.MIN_RUNS):
        return None
    for n in range(noise.MIN_RUNS, MOST_SEEDS + 1):   # fewer runs a side get no test
        a, b = s_c ** 2 / n, s_b ** 2 / n_b
        dof = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / (n_b - 1))
        if 1 - nctdtr(dof, margin / np.sqrt(a + b), noise.t_quantile(0.5 + noise.LEVEL / 2, dof)) >= POWER:
            return n
    return None


def _um_table_note(row: pd.Series, metric: str) -> str:
    """Why the tables may leave that drop unmarked: their marks are corrected over every configuration."""
    if row.get(f"{metric}_verdict") == noise.WORSE:
        return ""
    return (f" The tables, corrected over every configuration of the page, leave it unmarked: q "
            f"{p_text(row.get(f'{metric}_q'))}.")


def _no_claim(res: Results, cl: Claim, scope: str) -> tuple[str, pd.Series | None]:
    """The summary when no configuration survives: what was compared, the most private one's numbers, what
    the tables mark instead, and how many confirmation seeds a difference of that size would need; and that
    most private configuration (None without one)."""
    pm, um = res.metrics[1], res.metrics[0]
    # too few runs on the privacy metric, the one the summary compares (an accuracy-only gap is not this)
    few = cl.pool[[few_on(r, pm) for _, r in cl.pool.iterrows()]] if len(cl.pool) else cl.pool[:0]
    need = f"{noise.MIN_RUNS} or more runs a side"
    marks, marked_on = _marks(res)
    if cl.family == 0:
        text = f"None of the {scope} could be compared with the λ=0 baseline: a comparison needs {need}."
        if len(few):
            text += f" {plural(len(few), 'configuration')} ran fewer times."
    else:
        corrected = f", once corrected for {_family_text(cl)} (Holm)" if cl.family > 1 else ""
        text = f"None of the {scope} is more private than the λ=0 baseline beyond its noise{corrected}."
        if len(few):
            text += (f" {plural(len(few), 'other configuration')} ran fewer than {noise.MIN_RUNS} times and "
                     f"{'is' if len(few) == 1 else 'are'} not compared.")
    if marks.empty and cl.family:
        text += " After the correction, the differences the plots show are within the noise of the baseline."
    elif not marks.empty:
        text += (f" The tables mark {plural(len(marks), 'configuration')} against the baseline on "
                 f"{' or '.join([', '.join(marked_on[:-1]), marked_on[-1]] if len(marked_on) > 1 else marked_on)}, "
                 f"by Benjamini-Hochberg (q ≤ {noise.ALPHA:g}). That rule keeps false marks to 5 % of the marks "
                 f"on average within each metric and family (the search's runs, the confirmed ones), not over the "
                 f"page: a weaker guarantee than the summary's."
                 + (" They are the search's own runs, not confirmed." if not (marks["role"] == "confirmed").all()
                    else ""))
    closest = cl.pool.dropna(subset=[pm]).sort_values(pm, ascending=res.modes[1] == "min", kind="stable")
    if not len(closest):
        return text, None
    r = closest.iloc[0]
    if not isinstance(r.get("baseline_id"), str):
        return (text + f" The most private of them, {r['_label']} ({r[CONFIG_ID]}), has {pm} {_pm(r, pm)}. No "
                f"λ=0 baseline shares its other keys (σ, data, model, …), so it is compared with none."), r
    if few_on(r, pm):
        text += (f" The most private of them, {r['_label']} ({r[CONFIG_ID]}), has {pm} {_pm(r, pm)} and {um} "
                 f"{ms(r, um)}: {interval(r, pm)} against the baseline. It is a candidate to run again with new "
                 f"seeds, not a finding.")
    else:
        verdict = r.get(f"{pm}_verdict") or "no verdict"
        text += (f" The most private of them, {r['_label']} ({r[CONFIG_ID]}), has {pm} {_pm(r, pm)} and {um} "
                 f"{ms(r, um)}. Against the baseline: {interval(r, pm)}, {_verdict_words(verdict)}, p "
                 f"{p_text(r.get(f'{pm}_p'))} ({p_text(r.get(f'{pm}_holm'))} after Holm's correction).")
    better = r.get(f"{pm}_delta")
    if not is_missing(better) and (float(better) < 0) == (res.modes[1] == "min") and float(better) != 0:
        base = _baseline_of(res, r)
        need = seeds_needed(r, base, pm) if base is not None else None
        if need is not None:
            text += (f" Confirming it alone with {need} new seeds would resolve a difference of this size "
                     f"{POWER:.0%} of the time, if it is real. The most private of many looks better than it is.")
        elif base is not None and _flat(r, base, pm):
            text += f" {_FLAT_TEXT}"
        elif base is not None and (pd.to_numeric(base.get(f"{pm}_n"), errors="coerce") or 0) >= noise.MIN_RUNS:
            text += (f" A difference of this size would need more than {MOST_SEEDS} confirmation seeds against "
                     f"the baseline's runs. The baseline needs more seeds too.")
    return text, r


def _params_text(res: Results, row: pd.Series) -> str:
    """The keys that tell a configuration row from the others of its surrogate, ``lambd 32, num_clusters 4``
    (λ always; a key that only differs between surrogates, such as ``loss_scale``, is the surrogate's)."""
    c = res.configs
    own = c[c["_surrogate"] == row.get("_surrogate")]
    varying = [col for col in config_searched_columns(res)
               if col == LAMBD_COL or varies(own[col])]
    cols = [col for col in varying if col != SURROGATE_COL and not is_missing(row.get(col))]
    return ", ".join(f"{short(col).split('.')[-1]} {format_value(row.get(col))}" for col in cols) or "fixed keys"
