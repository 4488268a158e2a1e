"""Replicates: one row per configuration from the runs of a search (``configs.parquet``).

A configuration is a trial's resolved config without its ``seed``; its runs are the trials that share it
(``replicates: N`` in a search space runs every configuration once per seed). Per configuration and metric:
the mean over the runs that finished ok, the sample standard deviation, and the half-width of the 95 %
confidence interval of the mean (Student's t with n - 1 degrees of freedom; NaN for a single run). The
Pareto front of configurations is computed on the means. docs/protocol.md explains the choices.

The λ = 0 baseline is its own kind of row (``null_inapplicable``): no surrogate runs at λ = 0, so its
surrogate is "none" and every other ``cem.*`` key is null, and all λ = 0 trials that share the other keys are
one configuration. Every configuration is compared with the baseline that shares its non-``cem`` keys (σ,
data, model, training, attack): ``<m>_noise`` is that baseline's standard deviation (the search's noise
floor), and ``<m>_delta``, ``_delta_lo``, ``_delta_hi``, ``_p_better`` and ``_verdict`` come from
``noise.compare`` on the runs. A configuration that was re-run with new seeds after the search
(``role == "confirm"``, ``confirm:`` in the space) is summarised over those runs only: the search's own run
was chosen because it looked good, so counting it would bias the mean (the winner's curse).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from . import noise
from .frontier import pareto_ranks
from .schema import (
    ATTACK_METRICS,
    COST_COLUMNS,
    OBJECTIVE_METRICS,
    per_attack_columns,
    privacy_mode,
    rank_table,
    strongest_column,
)

SEED_COLUMN = "config.seed"
CONFIG_ID = "config_id"
AGGREGATED: tuple[str, ...] = OBJECTIVE_METRICS + COST_COLUMNS
LAMBDA_COLUMN = "config.cem.lambd"
SURROGATE_COLUMN = "config.cem.surrogate"
NO_SURROGATE = "none"          # the surrogate of a λ = 0 row: none runs
# why a trial ran (the trial's ``role``): the search's noise floor, a proposal of the search, a re-run of a
# configuration on the search's front with new seeds; tables older than roles read as "search"
ROLE_COLUMN = "role"
BASELINE, SEARCH, CONFIRM = "baseline", "search", "confirm"
ROLES = (BASELINE, SEARCH, CONFIRM)
CONFIRMED = "confirmed"        # a configuration's role once confirmation runs summarise it
# the metrics every configuration is compared on with its baseline, besides the objectives
COMPARED: tuple[str, ...] = ("test_acc", "attack_ssim")


def is_baseline(df: pd.DataFrame) -> np.ndarray:
    """λ = 0 rows (no CEM term at all)."""
    if LAMBDA_COLUMN not in df:
        return np.zeros(len(df), dtype=bool)
    return (pd.to_numeric(df[LAMBDA_COLUMN], errors="coerce") == 0).fillna(False).to_numpy(dtype=bool)


def null_inapplicable(trials: pd.DataFrame) -> pd.DataFrame:
    """The λ = 0 rows with surrogate "none" and every other ``config.cem.*`` key null: at λ = 0 no surrogate
    is built, so its keys did nothing (a copy; unchanged without a λ = 0 row). The keys of the other
    surrogates are already null in a row (a trial's resolved config holds its own surrogate's keys only)."""
    base = is_baseline(trials)
    if not base.any():
        return trials
    trials = trials.copy()
    for c in trials.columns:
        if not c.startswith("config.cem.") or c == LAMBDA_COLUMN:
            continue
        col = trials[c]
        if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            trials.loc[base, c] = np.nan
        else:
            col = col.astype(object)
            col[base] = NO_SURROGATE if c == SURROGATE_COLUMN else None
            trials[c] = col
    return trials


def roles(trials: pd.DataFrame) -> pd.Series:
    """Each trial's role; "search" where the table has none (older tables)."""
    if ROLE_COLUMN not in trials:
        return pd.Series(SEARCH, index=trials.index, dtype=object)
    return trials[ROLE_COLUMN].astype(object).where(trials[ROLE_COLUMN].notna(), SEARCH).astype(str)


def config_columns(trials: pd.DataFrame) -> list[str]:
    """The config columns that define a configuration: every ``config.*`` but the seed."""
    return sorted(c for c in trials.columns if c.startswith("config.") and c != SEED_COLUMN)


def _canonical(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, np.ndarray):
        return [_canonical(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    return v


def config_ids(trials: pd.DataFrame) -> pd.Series:
    """A short stable id of each row's configuration (its config columns without the seed; the λ = 0 rows'
    inapplicable keys null first, so that every λ = 0 row of the same other keys is one configuration)."""
    trials = null_inapplicable(trials)
    cols = config_columns(trials)

    def one(row) -> str:
        items = [(c, _canonical(row[c])) for c in cols]
        return hashlib.sha1(json.dumps(items, default=str).encode()).hexdigest()[:10]
    if not len(trials):
        return pd.Series([], dtype=object)
    return trials.apply(one, axis=1)


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for a mean over ``n`` runs (NaN below two runs)."""
    if n < 2:
        return float("nan")
    from scipy.stats import t
    return float(t.ppf(0.5 + level / 2, n - 1))


def strongest_summary(names: pd.Series) -> str:
    """The attacks that set a worst-case metric over a configuration's runs: ``rmle`` when it set it in
    every run that attacked, else each with its share (``rmle 2/3, decoder 1/3``); "" when none did."""
    names = names[names.notna() & (names.astype(str) != "")].astype(str)
    if names.empty:
        return ""
    counts = names.value_counts(sort=True)
    if len(counts) == 1:
        return str(counts.index[0])
    return ", ".join(f"{k} {v}/{len(names)}" for k, v in counts.items())


def _counted(ok: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The runs a configuration's statistics use: its confirmation runs when it has any (the search's own run
    was selected for looking good), else every ok run; one run per seed (the same seed again is the same
    run, not a replicate). Returns (runs, from confirmation)."""
    role = roles(ok)
    confirm = ok[(role == CONFIRM).to_numpy()]
    runs = confirm if len(confirm) else ok
    if SEED_COLUMN in runs and len(runs) > 1:
        seeded = runs[SEED_COLUMN].notna().to_numpy()
        keep = np.where(seeded, ~runs[SEED_COLUMN].duplicated(keep="first").to_numpy(), True)
        runs = runs[keep]
    return runs, bool(len(confirm))


def metric_mode(metric: str, objectives: Sequence[dict]) -> str:
    """The better direction of ``metric``: its objective's mode, else more private for an attack metric, else
    higher."""
    for o in objectives:
        if o["metric"] == metric:
            return o["mode"]
    return privacy_mode(metric) or "max"


def compared_metrics(columns, objectives: Sequence[dict]) -> list[str]:
    """The metrics each configuration is compared with its baseline on: the objectives, test accuracy and
    the attack's SSIM (when present)."""
    return [m for m in dict.fromkeys([*(o["metric"] for o in objectives), *COMPARED]) if m in columns]


SIGMA_COLUMN = "config.defense.noise_std"


def baseline_key_columns(trials: pd.DataFrame, cols: Sequence[str]) -> list[str]:
    """The config columns that pick a configuration's baseline: σ, and every other non-``cem`` column that
    takes two or more values among the λ = 0 rows or among the others (a searched key). A column constant in
    each group is left out even where the two constants differ: a key resolved per trial (a GPU-only
    feature off without a surrogate, say) must not leave a configuration without its baseline."""
    base = is_baseline(trials)
    out = []
    for c in cols:
        if c.startswith("config.cem."):
            continue
        values = trials[c].map(lambda v: json.dumps(_canonical(v), default=str))
        if c == SIGMA_COLUMN or values[base].nunique() > 1 or values[~base].nunique() > 1:
            out.append(c)
    return out


def _baseline_key(row: pd.Series, cols: Sequence[str]) -> str:
    return json.dumps([(c, _canonical(row[c])) for c in cols], default=str)


def build_configs(trials: pd.DataFrame, objectives: Sequence[dict]) -> pd.DataFrame:
    """``configs.parquet``: per configuration its id, ``role`` (baseline, search or confirmed), the config
    columns, ``runs`` (trials), ``runs_ok``, ``seeds`` (of the runs the statistics use), per metric
    ``<m>_mean``, ``<m>_std``, ``<m>_ci95`` (half-width), ``<m>_n``, plus ``pareto_rank`` of the means over
    the objectives (-1 without an ok run), ``final_front`` and, per compared metric, the comparison with
    the configuration's baseline (module docstring)."""
    if not len(trials):
        return pd.DataFrame(columns=[CONFIG_ID, "role", "pareto_rank", "final_front", "runs", "runs_ok", "seeds"])
    trials = null_inapplicable(trials)
    if CONFIG_ID not in trials:
        trials[CONFIG_ID] = config_ids(trials)
    cols = config_columns(trials)
    metrics = [m for m in dict.fromkeys([*AGGREGATED, *(o["metric"] for o in objectives),
                                         *per_attack_columns(trials.columns)]) if m in trials]
    compared = compared_metrics(metrics, objectives)
    key_cols = baseline_key_columns(trials, cols)
    winners = [strongest_column(m) for m in ATTACK_METRICS if strongest_column(m) in trials]
    rows, values = [], {}
    for cid, group in trials.groupby(CONFIG_ID, sort=False):
        ok = group[group["status"] == "ok"] if "status" in group else group
        runs, confirmed = _counted(ok)
        first = group.iloc[0]
        role = BASELINE if is_baseline(group.iloc[:1])[0] else (CONFIRMED if confirmed else SEARCH)
        row = {CONFIG_ID: cid, "role": role, **{c: first[c] for c in cols}, "runs": len(group), "runs_ok": len(ok),
               "seeds": sorted(int(s) for s in runs[SEED_COLUMN].dropna()) if SEED_COLUMN in runs else []}
        values[cid] = {}
        for m in metrics:
            vals = pd.to_numeric(runs[m], errors="coerce").dropna().to_numpy(dtype=float)
            values[cid][m] = vals
            n = len(vals)
            row[f"{m}_mean"] = float(vals.mean()) if n else float("nan")
            row[f"{m}_std"] = float(vals.std(ddof=1)) if n > 1 else float("nan")
            row[f"{m}_ci95"] = t_quantile(n) * row[f"{m}_std"] / math.sqrt(n) if n > 1 else float("nan")
            row[f"{m}_n"] = n
        for w in winners:
            row[w] = strongest_summary(runs[w])
        row["_key"] = _baseline_key(first, key_cols)
        rows.append(row)
    configs = pd.DataFrame(rows)
    means = configs.rename(columns={f"{o['metric']}_mean": o["metric"] for o in objectives})
    ok_rows = (configs["runs_ok"] > 0).to_numpy()
    configs["pareto_rank"] = rank_table(means, objectives, ok=ok_rows)
    configs["final_front"] = _final_front(means, objectives, ok_rows)
    _compare_with_baselines(configs, values, compared, objectives)
    configs = configs.drop(columns="_key")
    first = [CONFIG_ID, "role", "pareto_rank", "final_front", "runs", "runs_ok", "seeds", "baseline_id"]
    stats = [c for c in configs.columns if c not in first and c not in cols]
    return configs[first + stats + cols]


def _final_front(means: pd.DataFrame, objectives: Sequence[dict], ok: np.ndarray) -> np.ndarray:
    """The front the report states: among the baselines and the confirmed configurations when confirmation
    ran, else among all configurations; on the means."""
    role = means["role"].to_numpy()
    candidates = ok & ((role == BASELINE) | (role == CONFIRMED)) if (role == CONFIRMED).any() else ok.copy()
    out = np.zeros(len(means), dtype=bool)
    if candidates.any():
        values = np.column_stack([pd.to_numeric(means[o["metric"]], errors="coerce").to_numpy(dtype=float)
                                  for o in objectives])
        out[candidates] = pareto_ranks(values[candidates], [o["mode"] for o in objectives]) == 0
    return out


def _compare_with_baselines(configs: pd.DataFrame, values: dict, compared: Sequence[str],
                            objectives: Sequence[dict]) -> None:
    """In place: ``baseline_id`` and, per compared metric, ``_noise``, ``_delta``, ``_delta_lo``,
    ``_delta_hi``, ``_p_better``, ``_verdict`` (noise.compare), and ``spread_borrowed``."""
    base = configs[configs["role"] == BASELINE]
    # one baseline per value of the non-cem keys: the one with the most ok runs
    best = base.sort_values("runs_ok", ascending=False, kind="stable").drop_duplicates("_key")
    of_key = dict(zip(best["_key"], best[CONFIG_ID]))
    configs["baseline_id"] = [of_key.get(k) for k in configs["_key"]]
    borrowed = np.zeros(len(configs), dtype=bool)
    for m in compared:
        mode = metric_mode(m, objectives)
        cols = {k: np.full(len(configs), np.nan) for k in ("noise", "delta", "delta_lo", "delta_hi", "p_better")}
        verdict = np.full(len(configs), "", dtype=object)
        for i, (cid, bid) in enumerate(zip(configs[CONFIG_ID], configs["baseline_id"])):
            if not isinstance(bid, str):
                continue
            y = values[bid][m]
            if len(y) > 1:
                cols["noise"][i] = float(np.std(y, ddof=1))
            if cid == bid:
                continue
            x = values[cid][m]
            c = noise.compare(x, y, mode)
            sign = 1.0 if mode == "max" else -1.0   # the delta columns are in the metric's own direction
            cols["delta"][i] = sign * c.diff
            lo, hi = sorted((sign * c.lo, sign * c.hi)) if np.isfinite(c.lo) else (np.nan, np.nan)
            cols["delta_lo"][i], cols["delta_hi"][i], cols["p_better"][i] = lo, hi, c.p_better
            verdict[i] = c.verdict
            borrowed[i] |= c.borrowed
        for k, v in cols.items():
            configs[f"{m}_{k}"] = v
        configs[f"{m}_verdict"] = verdict
    configs["spread_borrowed"] = borrowed
