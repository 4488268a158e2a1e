"""Re-attack every finished trial of a search with another attack, and test what was written down about it.

A search's privacy number is the worst case over the attacks each trial ran. Whether a defense holds against a
stronger attack is a question of the same trained encoders: this script runs `cem-bench attack TRIAL_DIR --set
...` on every ok trial of an experiment folder (JOBS at a time, each at the trial's own torch threads unless
--threads says; a trial that
already has an attack folder of exactly these settings is skipped, so the script can be stopped and run again),
then joins each new attack.json to the trial's row of trials.parquet as ``re_<column>`` and takes the worst case
over the trial's attacks and the new ones (``worst_attack_ssim``: the highest SSIM).

    python scripts/reattack.py EXPERIMENT_DIR --set attack.names=[decoder] --set attack.epochs=16 --jobs 2
    python scripts/reattack.py EXPERIMENT_DIR --set attack.names=[decoder] --set attack.epochs=16 --summarise \\
        --by config.cem.lambd \\
        --paired "R1 worst_attack_ssim lower config.cem.lambd=64 config.cem.lambd=0" \\
        --within "R3 re_attack_ssim__decoder higher attack_ssim__rmle config.cem.lambd=256"

``--summarise`` prints, per value of ``--by``, the runs' mean ± std of the accuracy, of each attack's SSIM (the
trial's and the new) and of the worst case, with which attack set it; then each test: ``--paired NAME METRIC
CLAIM A B`` is the paired t over the seeds both configurations ran (A and B: KEY=VALUE of trials.parquet's
columns), ``--within NAME COLUMN CLAIM OTHER SIDE`` the paired t of two columns over the runs of one
configuration; CLAIM is lower or higher, one-sided; the family of every test given is adjusted together (Holm,
the project's own). ``--where KEY=VALUE`` keeps the trials of that configuration only (repeatable: any of
them), for the re-attack and the summary alike. ``--out FILE.parquet`` writes the joined rows (nothing is
written into the experiment folder but the trials' own attack-<time>/ folders, which `cem-bench attack`
writes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cem_bench.analysis.noise import holm  # noqa: E402
from cem_bench.parsing import load_yaml  # noqa: E402


def overrides(sets: list[str]) -> dict:
    """The --set values as cem-bench parses them (a YAML scalar or list each)."""
    out = {}
    for s in sets:
        key, _, value = s.partition("=")
        out[key] = load_yaml(value)
    return out


def matches(attack_json: Path, want: dict) -> bool:
    try:
        config = json.loads(attack_json.read_text())["config"]
    except (OSError, ValueError, KeyError):
        return False
    return all(config.get(k) == v for k, v in want.items())


def done_attack(trial: Path, want: dict) -> Path | None:
    """The trial's latest attack folder of exactly these settings, or None."""
    found = sorted((p for p in trial.glob("attack-*/attack.json") if matches(p, want)), key=lambda p: p.parent.name)
    return found[-1] if found else None


def run(exp: Path, trials: pd.DataFrame, sets: list[str], jobs: int, threads: int | None) -> None:
    want = overrides(sets)
    todo = [exp / d for d in trials["trial_dir"] if done_attack(exp / d, want) is None]
    each = f"{threads} torch thread(s)" if threads else "the trial's own torch threads"
    print(f"{len(trials)} ok trials, {len(trials) - len(todo)} already re-attacked with these settings, "
          f"{len(todo)} to go ({jobs} at a time, {each} each)", flush=True)

    def one(trial: Path) -> None:
        # cem-bench attack sets the trial's own torch threads (what it recorded) unless --threads is given
        cmd = [sys.executable, "-m", "cem_bench.cli", "attack", str(trial)] + \
            (["--threads", str(threads)] if threads else [])
        for s in sets:
            cmd += ["--set", s]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAILED {trial.name}: {r.stderr.strip()[-600:]}", flush=True)
        else:
            print(f"done {trial.name[:40]}", flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, todo))


def joined(exp: Path, trials: pd.DataFrame, sets: list[str]) -> pd.DataFrame:
    want = overrides(sets)
    rows = []
    for _, row in trials.iterrows():
        found = done_attack(exp / row["trial_dir"], want)
        if found is None:
            raise SystemExit(f"{row['trial_dir']} has no attack folder with {want}: run without --summarise first")
        new = json.loads(found.read_text())
        rows.append({**row.to_dict(), **{f"re_{k}": v for k, v in new.items() if k not in ("config", "history")}})
    df = pd.DataFrame(rows)
    ssim = [c for c in df.columns if c.startswith(("attack_ssim__", "re_attack_ssim__"))]
    df["worst_attack_ssim"] = df[ssim].max(axis=1)
    df["worst_attack_ssim_by"] = df[ssim].idxmax(axis=1).str.replace("attack_ssim__", "")
    return df


def side(df: pd.DataFrame, text: str) -> pd.DataFrame:
    mask = np.ones(len(df), dtype=bool)
    for part in text.split(","):
        key, _, value = part.partition("=")
        v = load_yaml(value)
        mask &= np.isclose(df[key].astype(float), float(v)) if isinstance(v, (int, float)) else (df[key] == v)
    return df[mask]


def tests(df: pd.DataFrame, paired: list[str], within: list[str]) -> pd.DataFrame:
    out = []
    for spec in paired:
        name, metric, claim, a, b = spec.split()
        ra = side(df, a).set_index("config.seed")[metric]
        rb = side(df, b).set_index("config.seed")[metric]
        seeds = ra.index.intersection(rb.index)
        d = (ra[seeds] - rb[seeds]).to_numpy()
        out.append({"name": name, "test": f"{metric}: {a} {claim} than {b}", "n": len(d), "claim": claim, "d": d})
    for spec in within:
        name, column, claim, other, where = spec.split()
        rows = side(df, where)
        d = (rows[column] - rows[other]).to_numpy()
        out.append({"name": name, "test": f"{column} {claim} than {other} at {where}", "n": len(d), "claim": claim,
                    "d": d})
    for t in out:
        d = t.pop("d")
        t["mean"], t["std"] = d.mean(), d.std(ddof=1)
        half = stats.t.ppf(0.975, len(d) - 1) * t["std"] / np.sqrt(len(d))
        t["ci_low"], t["ci_high"] = t["mean"] - half, t["mean"] + half
        t["p"] = stats.ttest_1samp(d, 0.0, alternative="less" if t["claim"] == "lower" else "greater").pvalue
    table = pd.DataFrame(out)
    if len(table):
        table["p_holm"] = holm(table["p"].to_numpy())
    return table


def summarise(df: pd.DataFrame, by: str) -> None:
    cols = ["test_acc"] + sorted(c for c in df.columns if c.startswith(("attack_ssim__", "re_attack_ssim__"))) \
        + ["attack_ssim", "worst_attack_ssim"]
    print(f"{'':>10} n  " + "  ".join(f"{c:>26}" for c in cols) + "  worst case set by")
    for value, g in df.groupby(by):
        cells = "  ".join(f"{g[c].mean():>16.3f} ± {g[c].std(ddof=1):.3f}" for c in cols)
        setters = ", ".join(f"{k} {v}/{len(g)}" for k, v in g["worst_attack_ssim_by"].value_counts().items())
        print(f"{value:>10} {len(g)}  {cells}  {setters}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", type=Path)
    p.add_argument("--set", action="append", default=[], required=True, help="the attack's attack.* keys")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch threads of each re-attack (default: the "
                   "trial's own, as its result records them)")
    p.add_argument("--summarise", action="store_true")
    p.add_argument("--by", default="config.cem.lambd")
    p.add_argument("--paired", action="append", default=[])
    p.add_argument("--within", action="append", default=[])
    p.add_argument("--where", action="append", default=[],
                   help="KEY=VALUE[,KEY=VALUE]: only the trials of this configuration (repeatable: any of them)")
    p.add_argument("--out", type=Path, help="with --summarise: write the joined rows to this Parquet file")
    args = p.parse_args(argv)
    trials = pd.read_parquet(args.experiment / "trials.parquet")
    trials = trials[trials["status"] == "ok"]
    if args.where:   # only the trials of these configurations (any of them)
        trials = pd.concat([side(trials, w) for w in args.where]).drop_duplicates("trial_dir")
    trials = trials.reset_index(drop=True)
    if not args.summarise:
        run(args.experiment, trials, args.set, args.jobs, args.threads)
        return 0
    df = joined(args.experiment, trials, args.set)
    if args.out:
        df.to_parquet(args.out)
    summarise(df, args.by)
    table = tests(df, args.paired, args.within)
    for _, t in table.iterrows():
        print(f"{t['name']}: {t['test']}: {t['mean']:+.3f} ± {t['std']:.3f} ({t['ci_low']:+.3f} to {t['ci_high']:+.3f}), "
              f"n {t['n']}, p {t['p']:.2g}, Holm over {len(table)} {t['p_holm']:.2g}: "
              f"{'holds' if t['p_holm'] <= 0.05 else 'not shown'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
