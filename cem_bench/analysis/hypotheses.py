"""The hypotheses a space wrote down before its run, tested on its trials (docs/protocol.md §9, "Hypotheses").

``read_hypotheses`` checks the ``hypotheses`` of a saved ``search_space.json`` (a file from anyone: a bad one is
a problem named, never a crash); ``evaluate`` tests each on the ok runs of its two configurations: Welch's t
(or the paired t over the seeds both sides ran, ``paired: true``) of ``a - b`` shifted by the margin, one-sided
in the claimed direction, the family's p-values adjusted together (Holm or Bonferroni) and judged at its alpha.
A hypothesis without ``MIN_RUNS`` runs a side stays in the family with p = 1: it was planned, so it counts. The
interval shown beside each test is the two-sided 95 % interval of the difference, not adjusted; the verdict is
the adjusted one-sided p's.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd

from ..schema import HYPOTHESIS_CLAIMS as CLAIMS
from ..schema import HYPOTHESIS_CORRECTIONS as CORRECTIONS
from ..schema import MAX_HYPOTHESES as MAX_TESTS
from .noise import MIN_RUNS, holm, no_spread

LISTED = 4    # the summary names each verdict up to this many hypotheses, else counts them
LEVEL = 0.95   # the interval shown beside each test: two-sided, of the difference a - b
COLUMNS = ("name", "metric", "claim", "a", "b", "paired", "n_a", "n_b", "left_out", "unpaired", "mean_a", "std_a",
           "mean_b", "std_b", "diff", "ci_low", "ci_high", "p", "p_adjusted", "verdict")
# the claim's one-sided test of d = a - b: H1 is d < -margin, d > margin, d > -margin or d < margin. Shifting a
# by `sign * margin` and testing the shifted difference against 0 in `alternative` is that test.
_TEST = {"lower": (+1, "less"), "higher": (-1, "greater"), "not_lower": (+1, "greater"), "not_higher": (-1, "less")}


def read_hypotheses(saved: Any) -> tuple[dict | None, str | None]:
    """(hypotheses, problem) from a saved space's ``hypotheses`` value: ``(None, None)`` when it states none,
    ``(None, why)`` when it cannot be used (the page says why instead of testing it)."""
    if saved is None:
        return None, None
    try:
        if not isinstance(saved, dict):
            raise ValueError("not a mapping")
        alpha = saved.get("alpha")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise ValueError(f"alpha {alpha!r} is not a number in (0, 1)")
        if saved.get("correction") not in CORRECTIONS:
            raise ValueError(f"correction {saved.get('correction')!r} is not one of {', '.join(CORRECTIONS)}")
        tests = saved.get("tests")
        if not isinstance(tests, list) or not tests or len(tests) > MAX_TESTS:
            raise ValueError(f"tests is not a list of 1 to {MAX_TESTS}")
        out = []
        for i, t in enumerate(tests):
            if not isinstance(t, dict):
                raise ValueError(f"tests[{i}] is not a mapping")
            margin = t.get("margin", 0.0)
            ok = (isinstance(t.get("name"), str) and isinstance(t.get("metric"), str)
                  and t.get("a_is") in CLAIMS and isinstance(t.get("paired", False), bool)
                  and not isinstance(margin, bool) and isinstance(margin, (int, float))
                  and math.isfinite(margin) and margin >= 0
                  and all(isinstance(t.get(s), dict) and t.get(s) and all(
                      isinstance(k, str) and _scalar(v) for k, v in t[s].items()) for s in ("a", "b")))
            if not ok:
                raise ValueError(f"tests[{i}] lacks a name, metric, a and b (config keys with one value each), "
                                 f"a_is (one of {', '.join(CLAIMS)}) or a margin >= 0")
            out.append({"name": t["name"], "metric": t["metric"], "a": dict(t["a"]), "b": dict(t["b"]),
                        "a_is": t["a_is"], "margin": float(margin), "paired": t.get("paired", False)})
        return {"alpha": float(alpha), "correction": saved["correction"], "tests": out}, None
    except ValueError as e:
        return None, f"the saved space's hypotheses cannot be tested ({e})"


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, bool)) or (isinstance(v, (int, float)) and math.isfinite(v))


def side_rows(ok: pd.DataFrame, side: dict) -> pd.DataFrame:
    """The ok runs of the configuration a side names: every ``config.<key>`` equal to its value."""
    mask = pd.Series(True, index=ok.index)
    for key, value in side.items():
        col = ok.get(f"config.{key}")
        if col is None:
            return ok.iloc[:0]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            num = pd.to_numeric(col, errors="coerce")
            mask &= num == float(value)
        else:
            mask &= col.astype(object) == value
    return ok[mask]


def claim_text(h: dict) -> str:
    """``a lower than b``, ``a not lower than b by more than 0.02``: the claim in words."""
    words = h["a_is"].replace("_", " ")
    if h["a_is"].startswith("not_"):
        return f"a {words} than b by more than {h['margin']:g}"
    return f"a {words} than b" + (f" by more than {h['margin']:g}" if h["margin"] else "")


def side_text(side: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in side.items())


def _seeds(rows: pd.DataFrame) -> pd.Series:
    return pd.to_numeric(rows.get("config.seed", pd.Series(np.nan, index=rows.index)), errors="coerce")


def per_seed(rows: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, int]:
    """(one row per run with ``_seed`` and ``_v``, runs left out): a side's values, one per seed. A seed run
    more than once within one configuration (the λ = 0 cell of each surrogate in a grid that does not condition
    the surrogate on λ, or a baseline beside a λ = 0 cell: the same configuration, the same seed) is one run,
    the first in the table's order, the run the configurations table counts (``aggregate.build_configs``): one
    page, one number for a cell (it was their mean until 2026-12-06, and the two tables disagreed); counting it
    twice would count one measurement as two. Runs without a seed stay as they are; ok runs without a value (an
    attack the utility gate skipped at chance accuracy) are counted as left out."""
    v = pd.to_numeric(rows[metric], errors="coerce") if metric in rows else pd.Series(np.nan, index=rows.index)
    frame = pd.DataFrame({"_seed": _seeds(rows), "_v": v})
    # the first run of a seed first, then its value: the configurations table keeps a seed's first run whether
    # or not it has this metric, so a later copy's value would be a run it never counts
    seeded = frame.dropna(subset=["_seed"]).drop_duplicates("_seed", keep="first")
    frame = pd.concat([seeded, frame[frame["_seed"].isna()]], ignore_index=True)
    left_out = int((~np.isfinite(frame["_v"])).sum())
    return frame[np.isfinite(frame["_v"])].reset_index(drop=True), left_out


def one_test(h: dict, a_rows: pd.DataFrame, b_rows: pd.DataFrame) -> dict:
    """One hypothesis on its two sides' runs: the numbers of a row of ``evaluate`` before the adjustment."""
    from scipy import stats
    m = h["metric"]
    out: dict[str, Any] = {"n_a": 0, "n_b": 0, "left_out": 0, "unpaired": 0, "mean_a": np.nan, "std_a": np.nan,
                           "mean_b": np.nan, "std_b": np.nan, "diff": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                           "p": np.nan}
    (a, gone_a), (b, gone_b) = per_seed(a_rows, m), per_seed(b_rows, m)
    out["left_out"] = gone_a + gone_b
    if h["paired"]:   # the seeds both sides ran
        both = a.dropna(subset=["_seed"]).merge(b.dropna(subset=["_seed"]), on="_seed", suffixes=("_a", "_b"))
        x, y = both["_v_a"].to_numpy(float), both["_v_b"].to_numpy(float)
        # runs whose seed the other side did not run (or without a seed) have no partner: left out, and said, so
        # that n_a, n_b and the means (over the paired seeds) are not read as the whole configuration's
        out["unpaired"] = len(a) + len(b) - 2 * len(both)
    else:
        x, y = a["_v"].to_numpy(float), b["_v"].to_numpy(float)
    out.update(n_a=len(x), n_b=len(y))
    for side, v in (("a", x), ("b", y)):
        if len(v):   # runs equal to float rounding have no spread: 0, not the 1.7e-17 of [0.1] * 3's rounded mean
            std = np.nan if len(v) < 2 else 0.0 if no_spread(np.ptp(v), np.abs(v).max()) else float(v.std(ddof=1))
            out.update({f"mean_{side}": float(v.mean()), f"std_{side}": std})
    if len(x) < MIN_RUNS or len(y) < MIN_RUNS:
        return out
    # no spread, no test: a t-test divides by the spread, and runs (paired: seeds' differences) equal to float
    # rounding gave p = 0 (a tiny search at chance accuracy, 0.1 on every run, "held" with p 5e-35)
    spread = np.ptp(x - y) if h["paired"] else max(np.ptp(x), np.ptp(y))
    if no_spread(spread, max(np.abs(x).max(), np.abs(y).max())):
        out["diff"] = float(x.mean() - y.mean())
        return out
    sign, alternative = _TEST[h["a_is"]]
    shift = sign * h["margin"]
    with warnings.catch_warnings():
        # one side may not vary beside one that does (Welch's test is sound then: that side's variance is ~0);
        # scipy warns of its rounded moments ("Precision loss ... catastrophic cancellation") all the same
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        if h["paired"]:
            res = stats.ttest_rel(x + shift, y, alternative=alternative)
            ci = stats.ttest_rel(x, y).confidence_interval(LEVEL)
            diff = float((x - y).mean())
        else:
            res = stats.ttest_ind(x + shift, y, equal_var=False, alternative=alternative)
            ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(LEVEL)
            diff = float(x.mean() - y.mean())
    out.update(diff=diff, ci_low=float(ci.low), ci_high=float(ci.high), p=float(res.pvalue))
    return out


def adjust(p: np.ndarray, correction: str) -> np.ndarray:
    """The family's adjusted p-values; every member counts (an untested one enters with p = 1)."""
    p = np.where(np.isfinite(p), p, 1.0)
    if correction == "bonferroni":
        return np.minimum(1.0, p * len(p))
    return holm(p)


PLANNED_ROLES = ("search", "baseline")


def evaluate(trials: pd.DataFrame, hypotheses: dict) -> pd.DataFrame:
    """One row per hypothesis (``COLUMNS``), tested on the ``ok`` runs of ``trials`` that the plan fixed before
    the run: the grid's and the λ = 0 baseline's. The confirmation's runs are left out: which configurations get
    them depends on the results, so counting them would let the results choose a side's number of runs."""
    ok = trials[trials["status"] == "ok"] if "status" in trials else trials
    if "role" in ok:
        ok = ok[ok["role"].isin(PLANNED_ROLES) | ok["role"].isna()]
    rows = []
    for h in hypotheses["tests"]:
        a_rows, b_rows = side_rows(ok, h["a"]), side_rows(ok, h["b"])
        row = {"name": h["name"], "metric": h["metric"], "claim": claim_text(h), "a": side_text(h["a"]),
               "b": side_text(h["b"]), "paired": h["paired"], **one_test(h, a_rows, b_rows)}
        if h["metric"] not in ok:
            row["verdict"] = f"not tested: the trials record no {h['metric']}"
        # one configuration a side: two (a resumed search that changed a key the side does not name) would
        # pool runs that are not replicates of each other
        for side, r in (("a", a_rows), ("b", b_rows)):
            if "config_id" in r and r["config_id"].nunique() > 1:
                row["p"] = np.nan
                row["verdict"] = f"{side} matches {r['config_id'].nunique()} configurations"
        rows.append(row)
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("p_adjusted", "verdict")] + ["verdict"])
    table["verdict"] = table["verdict"].astype(object)
    p_adj = adjust(table["p"].to_numpy(float), hypotheses["correction"])
    table.insert(len(table.columns) - 1, "p_adjusted", p_adj)
    alpha = hypotheses["alpha"]
    for i, row in table.iterrows():
        if isinstance(row["verdict"], str) and row["verdict"]:
            continue
        n = min(row["n_a"], row["n_b"])
        if n < MIN_RUNS:
            kind = "seeds both sides ran" if row["paired"] else "runs on one side"
            table.at[i, "verdict"] = f"not tested: {n} {kind} (needs {MIN_RUNS})"
        elif not np.isfinite(row["p"]):
            table.at[i, "verdict"] = "not tested: the runs do not vary"
        else:
            table.at[i, "verdict"] = "holds" if row["p_adjusted"] <= alpha else "not shown"
        if row["unpaired"]:
            table.at[i, "verdict"] += (f" ({row['unpaired']} run{'s' * (row['unpaired'] != 1)} without a partner "
                                       f"seed left out)")
        if row["left_out"]:
            table.at[i, "verdict"] += (f" ({row['left_out']} ok run{'s' * (row['left_out'] != 1)} without "
                                       f"{row['metric']} left out)")
    return table[list(COLUMNS)]


UNVERIFIED = ("this folder has no cem_bench_files.json, the checksums the search wrote, so nothing shows that its "
              "search_space.json, these hypotheses with it, is the one written before the run")


def summary_text(table: pd.DataFrame, hypotheses: dict, verified: bool = True) -> str:
    """What the report's summary opens with: the family and its test, then each verdict (with more than
    ``LISTED`` hypotheses, those that hold), in short sentences like the rest of the summary. ``verified``
    False: the folder's checksums are gone (the refusal of an edited file says to delete them to read it), and
    the hypotheses are not said to have been written before the run."""
    m = len(table)
    family = f"{hypotheses['correction'].capitalize()} over {m} at α {hypotheses['alpha']:g}"
    first = (f"The space wrote down {m} hypothes{'es' if m != 1 else 'is'} before the run ({family})." if verified
             else f"The space's search_space.json holds {m} hypothes{'es' if m != 1 else 'is'} ({family}), "
                  f"unverified: {UNVERIFIED}.")
    if m <= LISTED:
        return first + " " + "; ".join(f"{r['name']}: {r['verdict']}" for _, r in table.iterrows()) + "."
    held = table[table["verdict"].str.startswith("holds")]["name"].tolist()
    which = f": {', '.join(held[:LISTED])}{', …' if len(held) > LISTED else ''}" if held else ""
    return first + f" {len(held)} of {m} hold{which} (the table below has each)."
