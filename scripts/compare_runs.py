"""Does a rerun repeat a run? Two experiment folders of the same search space, trial by trial and test by test.

    python scripts/compare_runs.py findings/decoder_digits /tmp/dg/out/decoder_digits

Run the command a folder in findings/ names (findings/README.md), then this: it pairs the two runs' trials by
configuration (from the config keys both runs have; a key only one has is printed) and seed, prints for each
metric how many pairs are identical and the largest difference, then every hypothesis the space wrote down, tested
on each run, side by side, and where each run ran (``device``, ``torch_version``, ``git_sha``). A run on one
torch thread repeats to every digit on the same kind of machine; another CPU or torch build sums in another order
and every trial can move (docs/protocol.md §10): this says by how much, and whether a verdict changed.

Exit status: 0 when every paired trial is identical in every metric compared, 1 when something differs (a metric,
a verdict, a trial or a metric only one run has, no pair at all), 2 when a folder cannot be read or a metric asked
for is in neither. Nothing is written.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

METRICS = ("test_acc", "attack_ssim", "attack_ssim__decoder", "attack_ssim__rmle", "attack_psnr", "cem_loss_scale")


def _load(path: str):
    """The run's results as the report reads them; only a folder whose search wrote its trials table (or one of
    findings/): a folder without it would have its tables built and written into it, and this writes nothing."""
    from cem_bench.analysis.report import load_results
    from cem_bench.errors import ResultsError
    from cem_bench.schema import TRIALS_FILE
    if os.path.isfile(path):
        raise ResultsError(f"{path} is a file, not a folder: give the experiment folder that holds {TRIALS_FILE}")
    if not os.path.isfile(os.path.join(path, TRIALS_FILE)):
        raise ResultsError(f"{path}: no {TRIALS_FILE}; compare_runs reads the tables a finished search wrote "
                           f"(`cem-bench report {path}` writes them for a search that ended without them)")
    res = load_results(Path(path))
    # the pairing's keys: without them a KeyError's traceback exited 1, which this script's status reads as
    # "the runs differ" (2026-12-07 probe)
    missing = [c for c in ("status", "config.seed") if c not in res.trials]
    if missing:
        raise ResultsError(f"{path}/{TRIALS_FILE} has no {' or '.join(missing)} column, which pairing the trials "
                           f"needs; it was not written by `cem-bench search` (or was edited)")
    return res


def _numbers(col: pd.Series) -> bool:
    """A column of numbers with at least one set (booleans and text are not metrics)."""
    values = col.dropna()
    return bool(len(values)) and pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)


def _where(trials: pd.DataFrame) -> str:
    parts = []
    for col in ("device", "torch_version", "git_sha"):
        if col in trials:
            vals = sorted(str(v) for v in trials[col].dropna().unique())
            parts.append(f"{col} {', '.join(v[:12] if col == 'git_sha' else v for v in vals) or '?'}")
    return "; ".join(parts)


def _keyed(trials: pd.DataFrame, config_cols: list[str]) -> pd.DataFrame:
    """The ok trials indexed by (configuration, seed, n): the configuration's id from ``config_cols`` alone (the
    config columns both runs have: a key a later commit added, or a surrogate's own keys missing from a partial
    rerun, would give every trial another id), n counting the trials of one configuration and seed in the order
    they started (a search can run one twice)."""
    from cem_bench.analysis.aggregate import config_ids
    t = trials[trials["status"] == "ok"]
    if "started_at" in t:
        t = t.sort_values("started_at", kind="stable")
    t = t.drop(columns=[c for c in t.columns if c.startswith("config.") and c not in config_cols])
    ids = config_ids(t)
    n = pd.DataFrame({"id": ids, "seed": t["config.seed"]}).groupby(["id", "seed"]).cumcount()
    return t.set_index(pd.MultiIndex.from_arrays([ids, t["config.seed"], n], names=["config", "seed", "n"]))


def compare_trials(a: pd.DataFrame, b: pd.DataFrame, metrics=METRICS) -> tuple[pd.DataFrame, int, int]:
    """One row per metric present in both: pairs, identical pairs, the largest |a - b| and the mean b - a; and the
    counts of trials only ``a`` or only ``b`` has (a trial that did not end ok counts as missing)."""
    config_cols = [c for c in a.columns if c.startswith("config.") and c in b.columns]
    ok_a, ok_b = _keyed(a, config_cols), _keyed(b, config_cols)
    both = ok_a.index.intersection(ok_b.index)
    rows = []
    for m in metrics:
        if m not in ok_a or m not in ok_b:
            continue
        x = ok_a.loc[both, m].to_numpy(dtype=float)
        y = ok_b.loc[both, m].to_numpy(dtype=float)
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        diff = np.abs(x - y)
        # a value on one side and none on the other: no difference can be taken, and it is not 0 (it printed so)
        one_side = int((np.isnan(x) != np.isnan(y)).sum())
        rows.append({"metric": m, "pairs": len(both), "identical": int(same.sum()), "one_side": one_side,
                     "max_abs_diff": float(np.nanmax(diff)) if np.isfinite(diff).any() else 0.0,
                     "mean_diff": float(np.nanmean(y - x)) if np.isfinite(diff).any() else 0.0})
    return pd.DataFrame(rows), len(ok_a.index.difference(ok_b.index)), len(ok_b.index.difference(ok_a.index))


def _one_sided_config(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """The config columns only one run has, with their values: a key one code version has and the other not."""
    out = []
    for side, t, other in (("a", a, b), ("b", b, a)):
        for c in sorted(c for c in t.columns if c.startswith("config.") and c not in other.columns):
            vals = sorted({str(v) for v in t[c].dropna()})
            out.append(f"{c} only in {side} ({', '.join(vals[:4]) or 'empty'}{', …' if len(vals) > 4 else ''})")
    return out


def compare_hypotheses(res_a, res_b) -> pd.DataFrame:
    """The space's hypotheses tested on each run: name, verdict, difference and adjusted p of each side."""
    from cem_bench.analysis.hypotheses import evaluate
    if not res_a.hypotheses and not res_b.hypotheses:
        return pd.DataFrame()
    # a run whose space states none is tested on the other's (and the difference of the spaces is said by main)
    ta = evaluate(res_a.trials, res_a.hypotheses or res_b.hypotheses).set_index("name")
    tb = evaluate(res_b.trials, res_b.hypotheses or res_a.hypotheses).set_index("name")
    rows = []
    for name in ta.index.union(tb.index, sort=False):
        row = {"name": name}
        for side, t in (("a", ta), ("b", tb)):
            r = t.loc[name] if name in t.index else None
            row[f"verdict_{side}"] = r["verdict"] if r is not None else "(not in this run)"
            row[f"diff_{side}"] = float(r["diff"]) if r is not None else math.nan
            row[f"p_adjusted_{side}"] = float(r["p_adjusted"]) if r is not None else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    from cem_bench.cli import ArgParser
    ap = ArgParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="an experiment folder (e.g. findings/NAME)")
    ap.add_argument("b", help="the rerun's experiment folder")
    ap.add_argument("--metrics", nargs="+", help=f"metrics to compare trial by trial (default: those of {METRICS} "
                                                  f"either run has)")
    args = ap.parse_args(argv)
    if os.path.realpath(args.a) == os.path.realpath(args.b):
        # a folder against itself says "identical" whatever it holds: a mistyped rerun path
        print(f"compare_runs: a and b are one folder ({os.path.realpath(args.a)}); give the rerun's folder as b",
              file=sys.stderr)
        return 2
    twice = sorted({m for m in args.metrics or [] if args.metrics.count(m) > 1})
    if twice:   # each was compared and printed twice
        print(f"compare_runs: --metrics: {', '.join(twice)} given more than once; give each once", file=sys.stderr)
        return 2
    from cem_bench.errors import ResultsError
    try:
        res_a, res_b = _load(args.a), _load(args.b)
    except (ResultsError, OSError) as e:
        print(f"compare_runs: {e}", file=sys.stderr)
        return 2
    a, b = res_a.trials, res_b.trials
    metrics = args.metrics or [m for m in METRICS if m in a or m in b]
    unknown = [m for m in metrics if m not in a and m not in b]
    if unknown:
        print(f"compare_runs: neither run has the metric(s) {', '.join(unknown)}; the trials tables' metrics include "
              f"{', '.join(m for m in METRICS if m in a)}", file=sys.stderr)
        return 2
    # a metric is numbers: a text column (trial_dir) was a ValueError's traceback, and one with no value in either
    # run (error, all empty) "compared" identical
    not_numbers = [m for m in metrics if not any(m in t and _numbers(t[m]) for t in (a, b))]
    if not_numbers:
        print(f"compare_runs: {', '.join(not_numbers)}: not a metric with a number in either run; give metrics "
              f"such as {', '.join(m for m in METRICS if m in a)}", file=sys.stderr)
        return 2
    print(f"a: {args.a}: {len(a)} trials; {_where(a)}")
    print(f"b: {args.b}: {len(b)} trials; {_where(b)}")
    differs = False
    for line in _one_sided_config(a, b):
        print(f"config key {line}")
    def has(t, m):   # a metric a run has: a column with a value (the loader adds a missing one as all NaN)
        return m in t and pd.to_numeric(t[m], errors="coerce").notna().any()
    one_sided = [f"{m} ({'a' if has(a, m) else 'b'} only)" for m in metrics if has(a, m) != has(b, m)]
    if one_sided:
        print(f"metrics only one run has: {', '.join(one_sided)}")
        differs = True
    table, only_a, only_b = compare_trials(a, b, metrics)
    pairs = int(table["pairs"].max()) if len(table) else 0
    if only_a or only_b or not pairs:
        print(f"trials that ended ok in one run only (paired by configuration and seed): {only_a} in a, {only_b} in b"
              + ("; no pair at all: are these runs of one search space?" if not pairs else ""))
        differs = True
    print("\n| metric | pairs | identical | a value on one side only | largest abs difference | mean b - a |\n"
          "|---|---|---|---|---|---|")
    for r in table.itertuples():
        print(f"| {r.metric} | {r.pairs} | {r.identical} | {r.one_side} | {r.max_abs_diff:.3g} | {r.mean_diff:+.3g} |")
        differs |= r.identical < r.pairs
    if bool(res_a.hypotheses) != bool(res_b.hypotheses) or (res_a.hypotheses and res_a.hypotheses != res_b.hypotheses):
        print(f"\nthe spaces state different hypotheses ({'a' if res_a.hypotheses else 'b'}'s "
              f"{'only' if not (res_a.hypotheses and res_b.hypotheses) else 'and b' + chr(39) + 's differ'}): each "
              f"run is tested on its own, or on the other's where it states none")
        differs = True
    hyp = compare_hypotheses(res_a, res_b)
    if len(hyp):
        print("\n| hypothesis | a: verdict, a - b of its cells, adjusted p | b: the same |\n|---|---|---|")
        for r in hyp.itertuples():
            print(f"| {r.name} | {r.verdict_a}, {r.diff_a:.4g}, {r.p_adjusted_a:.2g} | "
                  f"{r.verdict_b}, {r.diff_b:.4g}, {r.p_adjusted_b:.2g} |")
            differs |= r.verdict_a != r.verdict_b
    print("\n" + ("the runs differ (above)" if differs else "every paired trial is identical in every metric compared"))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
