"""The report's run facts (``run_facts``: the trials by status, the stopped and retried ones, the
configurations, the noise floor, the objectives, the time and the versions) and the columns its tables show
(``searched_columns``, ``metric_columns``, ``config_searched_columns``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cem_bench.analysis.aggregate import SEED_COLUMN
from cem_bench.analysis.table import NOT_ERRORS, NOT_OK_WORDS

from .formatting import format_value, varies
from .load import MAIN_PARAMS, REPORTED_METRICS, SKIP_COL, SURROGATE_COL, Results


# ================================================================= table columns and run facts
def searched_columns(res: Results) -> list[str]:
    """The config columns that vary across trials (else the surrogate and the main parameters present)."""
    cfg = [c for c in res.trials.columns if c.startswith("config.")]
    varying = [c for c in cfg if varies(res.trials[c])]
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
        # with confirmation or replicates the page's front is of configurations: this one, of single trials, is not
        # it (frontier.csv holds the runs of the page's)
        ("trials on the front of all trials (search runs included)" if res.confirmed
         else "trials on the front of single trials (the page's front is of the configurations' means)"
         if res.replicated else "trials on the front", str(int((t["pareto_rank"] == 0).sum()))),
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
        ]
        if res.confirmed:
            # the heading's front (final_front: the confirmed configurations and the baseline, on the means of
            # the confirmation runs); the front of every configuration's means is a different, larger set
            facts += [("configurations on the confirmed front", str(len(res.front_configs))),
                      ("configurations on the front of all the means (search runs included)",
                       str(int((c["pareto_rank"] == 0).sum())))]
        else:
            facts.append(("configurations on the front (means)", str(int((c["pareto_rank"] == 0).sum()))))
    plan = res.confirm_plan
    if plan and not res.confirmed:
        # the driver said so too ("nothing to confirm"); the page must not read as if none was asked for
        n = int(t["role"].eq("confirm").sum()) if "role" in t else 0   # a numpy int cannot repeat a str
        facts.append(("confirmation (planned in the space)", (
            f"the best {plan['top']} with {plan['replicates']} new seeds each; " + (
                f"{n} confirmation run{'s' * (n != 1)} finished, none ok" if n else
                ("none yet: the search has not written its tables (still running, or stopped before)"
                 if res.running_driver.get("unseen") else "none yet: the search is still running")
                if res.running_driver is not None else
                "none ran: no search configuration with λ ≠ 0 finished ok (stopped early, errored or NaN), or the "
                "search ended before its last run"))))
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
        ("total trial time (sum of wall_s)", _wall_text(t)),
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
    if res.running_driver is not None:
        return ("built by this report from the trial folders of "
                + ("a search that has not written its tables (still running, or stopped before)"
                   if res.running_driver.get("unseen") else "the search still running")
                + " (its tables are written when it ends); configs.csv beside this page holds the configurations")
    from ...schema import CONFIGS_FILE
    held = res.results_dir is not None and (Path(res.results_dir) / CONFIGS_FILE).is_file()
    why = ("its configs.parquet is an older cem-bench's, about other trials, or read unverified (not recorded "
           "with trials.parquet in cem_bench_files.json, so either may have been edited: its statistics are "
           "rebuilt, docs/protocol.md §9)" if held else "the results folder holds no configs.parquet")
    return (f"built from trials.parquet by this report: {why}, and this report wrote none there (it writes only "
            f"its own folder); configs.csv beside this page holds the configurations, and `cem-bench table --csv` "
            f"prints them")


def status_counts(t: pd.DataFrame) -> str:
    """``(3 ok, 1 stopped early, 2 interrupted, 2 still running, 1 errored)``: a trial the scheduler stopped, a
    signal interrupted, or that has not finished while the search runs is not an error (results.mark_stopped,
    results.mark_interrupted, results.mark_running)."""
    status = t["status"] if "status" in t else pd.Series("ok", index=t.index)
    parts, named = [f"{int(t['_ok'].sum())} ok"], 0
    for kind in NOT_ERRORS:
        n = int((status == kind).sum())
        named += n
        parts += [f"{n} {NOT_OK_WORDS[kind]}"] if n else []
    return f"({', '.join(parts)}, {int((~t['_ok']).sum()) - named} errored)"


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
    if "epochs_done" not in t:   # a table written by hand (scripts/independent_claims.py's) may lack it
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
        # each std is over the runs with a value of its metric (``<m>_n``): an attack the utility gate skipped
        # leaves an ok run without attack metrics, so the counts can differ between metrics
        counts = {m: int(c) if pd.notna(c := r.get(f"{m}_n")) else n for m in res.metrics}
        where = f"σ={format_value(r.get('config.defense.noise_std'))}: " if len(base) > 1 else ""
        if n <= 1:
            parts.append(f"{where}one run: no floor")
            continue
        one = len(set(counts.values())) == 1    # one count for the line, else each metric's own
        spread = ", ".join(f"{m} ± {format_value(r.get(f'{m}_std'), m)}" + ("" if one else f" ({_seeds(counts[m])})")
                           for m in res.metrics)
        parts.append(f"{where}{spread}" + (f" ({_seeds(counts[res.metrics[0]])})" if one else ""))
    return "; ".join(parts)


def _seeds(n: int) -> str:
    return f"{n} seed{'s' * (n != 1)}"


def config_searched_columns(res: Results) -> list[str]:
    """The config columns (the seed excepted) that vary across configurations, else the main ones present."""
    c = res.configs
    cfg = [col for col in c.columns if col.startswith("config.") and col != SEED_COLUMN]
    varying = [col for col in cfg if varies(c[col])]
    return varying or [col for col in [SURROGATE_COL, *MAIN_PARAMS] if col in c]


def _wall_text(t) -> str:
    """The summed ``wall_s`` of the trials that recorded one: a trial that failed or stopped before its result
    has none (it read "0.0 s" for a search of errors that ran seconds each)."""
    wall = pd.to_numeric(t["wall_s"], errors="coerce") if "wall_s" in t else pd.Series(dtype=float)
    known = int(wall.notna().sum())
    if not known:
        return f"not recorded (none of the {len(t)} trials finished with a result)"
    text = f"{format_value(float(wall.sum()), 'wall_s')} s"
    return text if known == len(t) else f"{text} over the {known} of {len(t)} trials that recorded it"
