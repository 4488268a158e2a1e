"""Replicates: one row per configuration from the runs of a search (``configs.parquet``).

A configuration is a trial's resolved config without its ``seed``; its runs are the trials that share it
(``replicates: N`` in a search space runs every configuration once per seed). Per configuration and metric:
the mean over the runs that finished ok, the sample standard deviation, and the half-width of the 95 %
confidence interval of the mean (Student's t with n - 1 degrees of freedom; NaN for a single run). The
Pareto front of configurations is computed on the means. docs/protocol.md explains the choices.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from .schema import ATTACK_METRICS, COST_COLUMNS, OBJECTIVE_METRICS, per_attack_columns, rank_table, strongest_column

SEED_COLUMN = "config.seed"
CONFIG_ID = "config_id"
AGGREGATED: tuple[str, ...] = OBJECTIVE_METRICS + COST_COLUMNS


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
    """A short stable id of each row's configuration (its config columns without the seed)."""
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


def build_configs(trials: pd.DataFrame, objectives: Sequence[dict]) -> pd.DataFrame:
    """``configs.parquet``: per configuration its id, the config columns, ``runs`` (trials), ``runs_ok``,
    ``seeds``, and per metric ``<m>_mean``, ``<m>_std``, ``<m>_ci95`` (half-width), plus ``pareto_rank`` of
    the means over the objectives (-1 without an ok run)."""
    if not len(trials):
        return pd.DataFrame(columns=[CONFIG_ID, "runs", "runs_ok", "seeds", "pareto_rank"])
    trials = trials.copy()
    if CONFIG_ID not in trials:
        trials[CONFIG_ID] = config_ids(trials)
    cols = config_columns(trials)
    metrics = [m for m in dict.fromkeys([*AGGREGATED, *(o["metric"] for o in objectives),
                                         *per_attack_columns(trials.columns)]) if m in trials]
    winners = [strongest_column(m) for m in ATTACK_METRICS if strongest_column(m) in trials]
    rows = []
    for cid, group in trials.groupby(CONFIG_ID, sort=False):
        ok = group[group["status"] == "ok"] if "status" in group else group
        row = {CONFIG_ID: cid, **{c: group.iloc[0][c] for c in cols}, "runs": len(group), "runs_ok": len(ok),
               "seeds": sorted(int(s) for s in group[SEED_COLUMN].dropna()) if SEED_COLUMN in group else []}
        for m in metrics:
            vals = pd.to_numeric(ok[m], errors="coerce").dropna().to_numpy(dtype=float)
            n = len(vals)
            row[f"{m}_mean"] = float(vals.mean()) if n else float("nan")
            row[f"{m}_std"] = float(vals.std(ddof=1)) if n > 1 else float("nan")
            row[f"{m}_ci95"] = t_quantile(n) * row[f"{m}_std"] / math.sqrt(n) if n > 1 else float("nan")
            row[f"{m}_n"] = n
        for w in winners:
            row[w] = strongest_summary(ok[w])
        rows.append(row)
    configs = pd.DataFrame(rows)
    means = configs.rename(columns={f"{o['metric']}_mean": o["metric"] for o in objectives})
    configs["pareto_rank"] = rank_table(means, objectives, ok=(configs["runs_ok"] > 0).to_numpy())
    first = [CONFIG_ID, "pareto_rank", "runs", "runs_ok", "seeds"]
    stats = [c for c in configs.columns if c not in first and c not in cols]
    return configs[first + stats + cols]
