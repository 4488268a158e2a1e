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
floor), and ``<m>_delta``, ``_delta_lo``, ``_delta_hi``, ``_p_better``, ``_p`` and ``_verdict_single`` come
from ``noise.compare`` on the runs. One table makes many such comparisons, so each is also adjusted within its
family (``comparison_families``: one metric, the confirmed configurations or the others): ``<m>_q``
(Benjamini-Hochberg) and ``<m>_holm`` (Holm's step-down); ``<m>_verdict``, what the report and ``cem-bench
table`` state, is the single verdict where ``<m>_q`` <= 0.05 and "within noise" elsewhere.

A configuration that was re-run with new seeds after the search (``role == "confirm"``, ``confirm:`` in the
space) is summarised over those runs only: the search's own run was chosen because it looked good, so counting
it would bias the mean (the winner's curse).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..frontier import pareto_ranks
from ..schema import (
    ATTACK_METRICS,
    COST_COLUMNS,
    OBJECTIVE_METRICS,
    STRENGTH_COLUMNS,
    base_metric,
    per_attack_columns,
    privacy_mode,
    rank_table,
    strongest_column,
)
from ..schema import EXECUTION_KEYS as schema_execution_keys
from . import noise

SEED_COLUMN = "config.seed"
CONFIG_ID = "config_id"
AGGREGATED: tuple[str, ...] = OBJECTIVE_METRICS + COST_COLUMNS + STRENGTH_COLUMNS
LAMBDA_COLUMN = "config.cem.lambd"
SURROGATE_COLUMN = "config.cem.surrogate"
NO_SURROGATE = "none"          # the surrogate of a λ = 0 row: none runs
# why a trial ran (the trial's ``role``): the search's noise floor, a proposal of the search, a re-run of a
# configuration on the search's front with new seeds; tables older than roles read as "search"
ROLE_COLUMN = "role"
SKIP_COLUMN = "attack_skipped"  # why the utility gate skipped the attack ("" when it ran); absent in older tables
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


def skipped_attacks(trials: pd.DataFrame) -> np.ndarray:
    """The rows whose attack did not run (``attack_skipped`` non-empty: the utility gate found the trial's
    accuracy at chance)."""
    if SKIP_COLUMN not in trials:
        return np.zeros(len(trials), dtype=bool)
    why = trials[SKIP_COLUMN].astype(object).where(trials[SKIP_COLUMN].notna(), "").astype(str)
    return (why.str.strip() != "").to_numpy(dtype=bool)


def null_skipped_attacks(trials: pd.DataFrame) -> pd.DataFrame:
    """No attack, no attack metric: NaN in every attack metric column (``schema.ATTACK_METRICS`` and each
    attack's own, not the seconds) of the rows whose attack was skipped, whatever was stored (a copy where
    there are such rows; a trial records NaN there itself)."""
    skipped = skipped_attacks(trials)
    if not skipped.any():
        return trials
    trials = trials.copy()
    for col in [c for c in trials.columns if base_metric(c) in ATTACK_METRICS]:
        trials.loc[skipped, col] = np.nan
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


def _encoded(column: pd.Series, fmt) -> np.ndarray:
    """``fmt(canonical value)`` of every cell, computed once per distinct value (a column of 100,000 trials
    holds a handful): the columnar path behind ``config_ids`` and the baseline keys."""
    values = column.to_numpy(dtype=object)
    try:
        codes, uniques = pd.factorize(column, use_na_sentinel=True)
    except TypeError:       # unhashable cells (lists): one at a time
        return np.array([fmt(_canonical(v)) for v in values], dtype=object)
    table = np.array([fmt(_canonical(v)) for v in uniques] + [fmt(None)], dtype=object)
    return table[np.where(codes < 0, len(uniques), codes)]


def config_ids(trials: pd.DataFrame) -> pd.Series:
    """A short stable id of each row's configuration (its config columns without the seed and without the
    ``EXECUTION_KEYS``; the λ = 0 rows' inapplicable keys null first, so that every λ = 0 row of the same other
    keys is one configuration): the SHA-1 of the JSON list of ``[column, value]`` pairs. How a run ran (its data
    read from another folder after the experiment moved, another device) does not make another configuration:
    a resumed search may change those keys (search/run.py), and its runs of one configuration stay one."""
    trials = null_inapplicable(trials)
    cols = [c for c in config_columns(trials) if c not in EXECUTION_KEYS]
    if not len(trials):
        return pd.Series([], dtype=object)
    pieces = [_encoded(trials[c], lambda v, c=c: json.dumps([c, v], default=str)) for c in cols]
    text = ["[" + ", ".join(parts) + "]" for parts in zip(*pieces)] if pieces else ["[]"] * len(trials)
    return pd.Series([hashlib.sha1(t.encode()).hexdigest()[:10] for t in text], index=trials.index, dtype=object)


def strongest_summary(names: pd.Series) -> str:
    """The attacks that set a worst-case metric over a configuration's runs: ``rmle`` when it set it in
    every run that attacked, else each with its share (``rmle 2/3, decoder 1/3``); "" when none did."""
    return _strongest(pd.DataFrame({CONFIG_ID: "", "by": names.to_numpy(dtype=object)}), pd.Index([""]))[0]


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


# Columns that say how a trial ran, not what it measures (schema.EXECUTION_KEYS): a baseline that differs from
# its configurations only in these is still their baseline. Any other key that differs (the data set, the model,
# the training, the attack) makes it another experiment, never a noise floor to compare with.
EXECUTION_KEYS = frozenset(f"config.{k}" for k in schema_execution_keys)


def baseline_key_columns(trials: pd.DataFrame, cols: Sequence[str]) -> list[str]:
    """The config columns that pick a configuration's baseline: σ, every other non-``cem`` column that takes
    two or more values among the λ = 0 rows or among the others (a searched key), and every column whose one
    value among the λ = 0 rows differs from its one value among the others: configurations on another data set
    than the only baseline then have none, and the report says so, instead of being compared with it. A column
    that only says how the trials ran (``EXECUTION_KEYS``) is never one, even where its value varies: it does
    not split a configuration (``config_ids``), so a configuration's value of it is only its first run's."""
    base = is_baseline(trials)
    out = []
    for c in cols:
        if c.startswith("config.cem.") or c in EXECUTION_KEYS:
            continue
        values = pd.Series(_encoded(trials[c], lambda v: json.dumps(v, default=str)), index=trials.index)
        varies = values[base].nunique() > 1 or values[~base].nunique() > 1
        differs = base.any() and (~base).any() and set(values[base]) != set(values[~base])
        if c == SIGMA_COLUMN or varies or differs:
            out.append(c)
    return out


def build_configs(trials: pd.DataFrame, objectives: Sequence[dict]) -> pd.DataFrame:
    """``configs.parquet``: per configuration its id, ``role`` (baseline, search or confirmed), the config
    columns, ``runs`` (distinct seeds: a trial repeating a configuration's seed is counted in ``repeats``,
    not as a run), ``runs_ok``, ``seeds`` (of the runs the statistics use), per metric
    ``<m>_mean``, ``<m>_std``, ``<m>_ci95`` (half-width), ``<m>_n``, plus ``pareto_rank`` of the means over
    the objectives (-1 without an ok run), ``final_front`` and, per compared metric, the comparison with
    the configuration's baseline (module docstring). Columnar: one groupby per statistic, no Python loop
    over configurations (100,000 trials in seconds)."""
    if not len(trials):
        return pd.DataFrame(columns=[CONFIG_ID, "role", "pareto_rank", "final_front", "runs", "runs_ok", "repeats",
                                     "seeds"])
    trials = null_inapplicable(trials).reset_index(drop=True)
    for o in objectives:    # a table without an objective's column (older, or by hand): no value of it, NaN
        if o["metric"] not in trials:
            trials[o["metric"]] = np.nan
    if CONFIG_ID not in trials:
        trials[CONFIG_ID] = config_ids(trials)
    trials[CONFIG_ID] = trials[CONFIG_ID].astype(str)
    cols = config_columns(trials)
    metrics = [m for m in dict.fromkeys([*AGGREGATED, *(o["metric"] for o in objectives),
                                         *per_attack_columns(trials.columns)]) if m in trials]
    compared = compared_metrics(metrics, objectives)
    winners = [strongest_column(m) for m in ATTACK_METRICS if strongest_column(m) in trials]
    cid = trials[CONFIG_ID]
    ok = (trials["status"] == "ok").to_numpy() if "status" in trials else np.ones(len(trials), dtype=bool)
    confirm = (roles(trials) == CONFIRM).to_numpy()
    confirmed = pd.Series(ok & confirm).groupby(cid.to_numpy()).transform("any").to_numpy()
    # the runs the statistics use: the confirmation's where there are any, else the ok ones; a seed once
    counted = ok & (~confirmed | confirm)
    if SEED_COLUMN in trials:
        seeded = counted & trials[SEED_COLUMN].notna().to_numpy()
        again = trials.loc[seeded, [CONFIG_ID, SEED_COLUMN]].duplicated(keep="first")
        counted[again.index[again.to_numpy()]] = False

    first = trials.drop_duplicates(CONFIG_ID).set_index(CONFIG_ID)      # in order of first appearance
    order = first.index
    configs = pd.DataFrame({CONFIG_ID: order})
    base_row = is_baseline(first)
    conf_any = pd.Series(confirmed, index=trials.index).groupby(cid).any().reindex(order).to_numpy()
    configs["role"] = np.where(base_row, BASELINE, np.where(conf_any, CONFIRMED, SEARCH))
    # a run is a seed: two trials of one configuration with the same seed (a repeat, a resumed copy) are one
    # run, never two replicates (the statistics above count each seed once for the same reason)
    repeat = np.zeros(len(trials), dtype=bool)
    repeat_ok = np.zeros(len(trials), dtype=bool)
    if SEED_COLUMN in trials:
        seeded = trials[SEED_COLUMN].notna().to_numpy()
        keys = trials[[CONFIG_ID, SEED_COLUMN]]
        repeat = seeded & keys.duplicated(keep="first").to_numpy()
        dup_ok = keys[ok & seeded].duplicated(keep="first")
        repeat_ok[dup_ok.index[dup_ok.to_numpy()]] = True
    configs["runs"] = pd.Series(~repeat).groupby(cid.to_numpy()).sum().reindex(order).to_numpy()
    configs["runs_ok"] = pd.Series(ok & ~repeat_ok).groupby(cid.to_numpy()).sum().reindex(order).to_numpy()
    configs["repeats"] = pd.Series(repeat).groupby(cid.to_numpy()).sum().reindex(order).to_numpy()
    used = trials[counted]
    if SEED_COLUMN in used:
        seeds = used.dropna(subset=[SEED_COLUMN]).sort_values(SEED_COLUMN, kind="stable")
        by = seeds.groupby(CONFIG_ID)[SEED_COLUMN].agg(lambda v: [int(s) for s in v])
        configs["seeds"] = [by.get(c, []) for c in order]
    else:
        configs["seeds"] = [[] for _ in order]
    # an infinite metric measured nothing: missing, like NaN, in the mean, the spread, n and the comparison alike
    values = used[metrics].apply(pd.to_numeric, errors="coerce").replace([np.inf, -np.inf], np.nan)
    grouped = values.groupby(used[CONFIG_ID].to_numpy())
    mean, std, n = (grouped.mean().reindex(order), grouped.std(ddof=1).reindex(order),
                    grouped.count().reindex(order).fillna(0).astype(int))
    stats = {}
    for m in metrics:
        nm = n[m].to_numpy()
        sd = np.where(nm > 1, std[m].to_numpy(), np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            half = np.where(nm > 1, noise.t_quantile(0.975, nm - 1) * sd / np.sqrt(nm), np.nan)
        stats.update({f"{m}_mean": mean[m].to_numpy(), f"{m}_std": sd, f"{m}_ci95": half, f"{m}_n": nm})
    configs = pd.concat([configs, pd.DataFrame(stats)], axis=1)
    for w in winners:
        configs[w] = _strongest(used[[CONFIG_ID, w]], order)
    key_cols = baseline_key_columns(trials, cols)
    pieces = [_encoded(first[c], lambda v: json.dumps(v, default=str)) for c in key_cols]
    configs["_key"] = ["|".join(p) for p in zip(*pieces)] if pieces else [""] * len(order)
    configs = pd.concat([configs, first[cols].reset_index(drop=True)], axis=1)
    means = configs.rename(columns={f"{o['metric']}_mean": o["metric"] for o in objectives})
    ok_rows = (configs["runs_ok"] > 0).to_numpy()
    configs["pareto_rank"] = rank_table(means, objectives, ok=ok_rows)
    configs["final_front"] = _final_front(means, objectives, ok_rows)
    _compare_with_baselines(configs, used, values, compared, objectives)
    configs = configs.drop(columns="_key")
    lead = [CONFIG_ID, "role", "pareto_rank", "final_front", "runs", "runs_ok", "repeats", "seeds", "baseline_id"]
    rest = [c for c in configs.columns if c not in lead and c not in cols]
    return configs[lead + rest + cols]


def _strongest(df: pd.DataFrame, order: pd.Index) -> list[str]:
    """``strongest_summary`` of every configuration at once (a Python step only for the configurations whose
    runs name more than one attack)."""
    w = df.columns[1]
    named = df[df[w].notna() & (df[w].astype(str) != "")]
    counts = named.groupby([CONFIG_ID, named[w].astype(str)]).size().rename("k").reset_index()
    counts = counts.sort_values([CONFIG_ID, "k", w], ascending=[True, False, True], kind="stable")
    total = counts.groupby(CONFIG_ID)["k"].transform("sum")
    single = counts.groupby(CONFIG_ID)[w].transform("size") == 1
    text = np.where(single, counts[w], counts[w] + " " + counts["k"].astype(str) + "/" + total.astype(str))
    joined = pd.Series(text, index=counts.index).groupby(counts[CONFIG_ID].to_numpy()).agg(", ".join)
    return [joined.get(c, "") for c in order]


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


def _compare_with_baselines(configs: pd.DataFrame, used: pd.DataFrame, values: pd.DataFrame,
                            compared: Sequence[str], objectives: Sequence[dict]) -> None:
    """In place: ``baseline_id`` and, per compared metric, ``_noise``, ``_delta``, ``_delta_lo``,
    ``_delta_hi``, ``_p_better``, ``_p``, ``_dof``, ``_verdict_single`` (``noise.compare_many``, all configurations at
    once), their adjusted ``_q``, ``_holm`` and ``_verdict`` (``adjust_comparisons``), ``_few`` (fewer than
    ``noise.MIN_RUNS`` runs with a value of the metric: no interval, p or verdict on it), and ``few_runs`` (so on
    any compared metric)."""
    base = configs[configs["role"] == BASELINE]
    # one baseline per value of the baseline keys: the one with the most ok runs
    best = base.sort_values("runs_ok", ascending=False, kind="stable").drop_duplicates("_key")
    of_key = dict(zip(best["_key"], best[CONFIG_ID]))
    configs["baseline_id"] = [of_key.get(k) for k in configs["_key"]]
    row_of = {c: i for i, c in enumerate(configs[CONFIG_ID])}
    bidx = np.array([row_of.get(b, -1) if isinstance(b, str) else -1 for b in configs["baseline_id"]])
    rows = np.flatnonzero((bidx >= 0) & (bidx != np.arange(len(configs))))
    few = np.zeros(len(configs), dtype=bool)
    ids = used[CONFIG_ID].map(row_of).to_numpy(dtype=np.int64)
    # the search's own comparisons on Hsu's degrees of freedom, a confirmed configuration's on Welch's (noise.py)
    conservative = comparison_families(configs)[rows] != CONFIRMED
    for m in compared:
        mode = metric_mode(m, objectives)
        v = values[m].to_numpy(dtype=float)
        keep = np.isfinite(v)
        slot = pd.Series(ids[keep]).groupby(ids[keep]).cumcount().to_numpy()
        runs = np.full((len(configs), max(1, int(slot.max()) + 1 if len(slot) else 1)), np.nan)
        runs[ids[keep], slot] = v[keep]
        out = {k: np.full(len(configs), np.nan)
               for k in ("noise", "delta", "delta_lo", "delta_hi", "p_better", "p", "dof")}
        verdict = np.full(len(configs), "", dtype=object)
        has_base = bidx >= 0
        out["noise"][has_base] = configs[f"{m}_std"].to_numpy(dtype=float)[bidx[has_base]]   # the floor
        few_m = np.zeros(len(configs), dtype=bool)
        if len(rows):
            c = noise.compare_many(runs[rows], runs[bidx[rows]], mode, conservative=conservative)
            sign = 1.0 if mode == "max" else -1.0    # the delta columns are in the metric's own direction
            out["delta"][rows] = sign * c["diff"]
            lo, hi = sign * c["lo"], sign * c["hi"]
            out["delta_lo"][rows], out["delta_hi"][rows] = np.minimum(lo, hi), np.maximum(lo, hi)
            out["p_better"][rows] = c["p_better"]
            out["p"][rows] = c["p"]
            out["dof"][rows] = c["dof"]
            verdict[rows] = c["verdict"]
            few_m[rows] = c["few"]
            few |= few_m
        for k, col in out.items():
            configs[f"{m}_{k}"] = col
        # per metric: a run whose attack the utility gate skipped has its accuracy but no SSIM, so a configuration
        # can be compared on one and too few on the other (few_runs, any metric, read per metric called a tested
        # accuracy "too few runs" beside its own p and mark)
        configs[f"{m}_few"] = few_m
        configs[f"{m}_verdict_single"] = verdict
        adjust_comparisons(configs, m)
    configs["few_runs"] = few


def comparison_families(configs: pd.DataFrame) -> np.ndarray:
    """The family each configuration's comparisons are adjusted in (per metric): the confirmed configurations
    (new seeds, run after the choice: a claim on them is a claim on fresh data, corrected only among
    themselves) and the others (the search's own runs, every one of which the page compares)."""
    role = configs["role"].astype(str).to_numpy() if "role" in configs else np.full(len(configs), SEARCH)
    return np.where(role == CONFIRMED, CONFIRMED, SEARCH)


def adjust_comparisons(configs: pd.DataFrame, metric: str) -> None:
    """In place, from ``<metric>_p`` and ``_verdict_single``: ``_q`` (Benjamini-Hochberg) and ``_holm`` (Holm)
    within each family of ``comparison_families``, and ``_verdict``: the single verdict where it survives
    ``noise.ALPHA`` after Benjamini-Hochberg, "within noise" where it does not, "" without a comparison."""
    p = pd.to_numeric(configs[f"{metric}_p"], errors="coerce").to_numpy(dtype=float)
    q, fw = np.full(len(p), np.nan), np.full(len(p), np.nan)
    family = comparison_families(configs)
    for f in np.unique(family):
        rows = np.flatnonzero(family == f)
        q[rows], fw[rows] = noise.bh(p[rows]), noise.holm(p[rows])
    configs[f"{metric}_q"], configs[f"{metric}_holm"] = q, fw
    single = configs[f"{metric}_verdict_single"].fillna("").astype(str).to_numpy(dtype=object)
    survives = np.isfinite(q) & (q <= noise.ALPHA)
    claimed = np.isin(single, [noise.BETTER, noise.WORSE])
    configs[f"{metric}_verdict"] = np.where(claimed & ~survives, noise.WITHIN, single)
