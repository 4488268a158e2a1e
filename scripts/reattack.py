"""Re-attack every finished trial of a search with another attack, and test what was written down about it.

A search's privacy number is the worst case over the attacks each trial ran. Whether a defense holds against a
stronger attack is a question of the same trained encoders: this script runs `cem-bench attack TRIAL_DIR --set
...` on every ok trial of an experiment folder (JOBS at a time, each at the trial's own torch threads unless
--threads says; a trial that
already has an attack folder of exactly these settings (every attack.* key as `cem-bench attack` resolves it, and
the evaluation batch size and device it takes) is
skipped, so the script can be stopped and run again),
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
columns; each side one configuration), ``--within NAME COLUMN CLAIM OTHER SIDE`` the paired t of two columns
over the runs of one configuration; CLAIM is lower or higher, one-sided; each is the report's test of a
hypothesis (``hypotheses.one_test``: at least 3 pairs, none without spread) and the family of every test given
is adjusted together as the report adjusts it (Holm; an untested member counts). ``--where KEY=VALUE`` keeps
the trials of that configuration only (repeatable: any of them), for the re-attack and the summary alike.
``--out FILE.parquet`` writes the joined rows (nothing is written into the experiment folder but the trials' own
attack-<time>/ folders, which `cem-bench attack` writes).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cem_bench.analysis.hypotheses import MIN_RUNS, adjust, one_test  # noqa: E402
from cem_bench.cli import ATTACK_ALSO, check_out_file  # noqa: E402
from cem_bench.config import ConfigError, parse_set  # noqa: E402
from cem_bench.parsing import load_yaml, positive_int  # noqa: E402
from cem_bench.schema import HYPOTHESIS_CLAIMS as CLAIMS  # noqa: E402


def wanted(trial: Path, sets: list[str]) -> dict:
    """The ``attack_setting`` keys a re-attack of ``trial`` with ``--set sets`` runs with, as `cem-bench attack` resolves
    and records them (its config, the overrides coerced by the config's own rules: ``1e-3`` a float,
    ``attack.names=decoder`` a list), JSON-normalised as attack.json holds them."""
    from cem_bench.core.runtime import resolve_device
    from cem_bench.core.trial import build_config
    from cem_bench.provenance import device_name
    flat = build_config({**trial_config(trial), **parse_set(sets)}).to_flat()
    want = json.loads(json.dumps({k: v for k, v in flat.items() if attack_setting(k)}))
    # the device it would run on here: train.device is "auto" on a GPU machine and on a CPU alike
    return {**want, DEVICE: device_name(resolve_device(flat["train.device"]))}


DEVICE = "info.device"   # the key of ``wanted`` that attack.json holds under info (cem-bench attack records it)


def attack_setting(key: str) -> bool:
    """A key that changes what a re-attack measures: every attack.* key, and the train.* keys `cem-bench attack`
    takes (the evaluation batch sets attack_ssim_paper's and attack_psnr_batch's batches; the device sets bf16
    autocast). data.root, which it takes too, only says where the same images are."""
    return key.startswith("attack.") or key in ("train.eval_batch_size", "train.device")


def trial_config(trial: Path) -> dict:
    """The trial's own resolved config: ``info.config`` of its ``trial_result.json`` (what `cem-bench attack`
    builds on; the checkpoint's weights are not read here). ValueError, naming the file, when it has none."""
    from cem_bench.parsing import loads_json
    from cem_bench.schema import RESULT_FILE
    from cem_bench.storage import Dir
    try:
        record = loads_json(Dir(str(trial)).read_bytes_or_raise(RESULT_FILE))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{trial / RESULT_FILE} cannot be read ({type(e).__name__}: {e})") from e
    config = (record.get("info") or {}).get("config") if isinstance(record, dict) else None
    if not isinstance(config, dict):
        raise ValueError(f"{trial / RESULT_FILE} has no resolved config (info.config)")
    return config


def matches(attack_json: Path, want: dict) -> bool:
    """An earlier re-attack of exactly these settings: every key of ``attack_setting`` equal (one given by --set
    alone matched an attack that differed in the others, and --summarise reported that other attack as this
    one)."""
    try:
        doc = json.loads(attack_json.read_text())
        config = doc["config"]
        device = (doc.get("info") or {}).get("device")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    # an attack.json without info (written before cem-bench attack recorded it) is matched on its config alone
    return ({k: v for k, v in config.items() if attack_setting(k)} == {k: v for k, v in want.items() if k != DEVICE}
            and (device is None or device == want.get(DEVICE)))


def done_attack(trial: Path, want: dict) -> Path | None:
    """The trial's latest attack folder of exactly these settings, or None."""
    found = sorted((p for p in trial.glob("attack-*/attack.json") if matches(p, want)), key=lambda p: p.parent.name)
    return found[-1] if found else None


def run(exp: Path, trials: pd.DataFrame, sets: list[str], jobs: int, threads: int | None) -> int:
    """Re-attack the trials not yet re-attacked with these settings; the number that failed (a trial whose
    record cannot be read counts as one, and the others still run)."""
    todo, unreadable = [], []
    for d in trials["trial_dir"]:
        try:
            if done_attack(exp / d, wanted(exp / d, sets)) is None:
                todo.append(exp / d)
        except (ValueError, ConfigError) as e:
            unreadable.append(d)
            print(f"FAILED {d}: {e}", flush=True)
    each = f"{threads} torch thread(s)" if threads else "the trial's own torch threads"
    print(f"{len(trials)} ok trials, {len(trials) - len(todo) - len(unreadable)} already re-attacked with these "
          f"settings, {len(todo)} to go ({jobs} at a time, {each} each)", flush=True)
    failed = list(unreadable)

    def one(trial: Path) -> None:
        # cem-bench attack sets the trial's own torch threads (what it recorded) unless --threads is given
        cmd = [sys.executable, "-m", "cem_bench.cli", "attack", str(trial)] + \
            (["--threads", str(threads)] if threads else [])
        for s in sets:
            cmd += ["--set", s]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            failed.append(trial.name)
            print(f"FAILED {trial.name}: {r.stderr.strip()[-600:]}", flush=True)
        else:
            print(f"done {trial.name[:40]}", flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, todo))
    if failed:
        print(f"{len(failed)} of {len(todo) + len(unreadable)} re-attacks failed", flush=True)
    return len(failed)


def joined(exp: Path, trials: pd.DataFrame, sets: list[str]) -> pd.DataFrame:
    rows = []
    for _, row in trials.iterrows():
        try:
            want = wanted(exp / row["trial_dir"], sets)
        except (ValueError, ConfigError) as e:
            raise SystemExit(f"reattack: {e}: leave its configuration out with --where") from None
        found = done_attack(exp / row["trial_dir"], want)
        if found is None:
            raise SystemExit(f"{row['trial_dir']} has no attack folder with {sets}: run without --summarise first")
        new = json.loads(found.read_text())
        rows.append({**row.to_dict(), **{f"re_{k}": v for k, v in new.items() if k not in ("config", "history")}})
    df = pd.DataFrame(rows)
    ssim = [c for c in df.columns if c.startswith(("attack_ssim__", "re_attack_ssim__"))]
    df["worst_attack_ssim"] = df[ssim].max(axis=1)
    df["worst_attack_ssim_by"] = df[ssim].idxmax(axis=1).str.replace("attack_ssim__", "")
    return df


def where_parts(text: str, columns) -> list[tuple[str, object]]:
    """``KEY=VALUE[,KEY=VALUE]`` as (column, value) pairs; ConfigError naming the part that is not one, before any
    work (a pandas KeyError or a YAML traceback, some after the summary had printed)."""
    out = []
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or key not in columns:
            known = ", ".join(sorted(c for c in columns if c.startswith("config."))[:8])
            raise ConfigError(f"{text!r}: {part!r} is not KEY=VALUE of a column of trials.parquet (e.g. {known})")
        try:
            out.append((key, load_yaml(value)))
        except Exception as e:  # noqa: BLE001 - any YAML error: one line
            raise ConfigError(f"{text!r}: {value!r} is not a value ({' '.join(str(e).split())[:120]})") from None
    return out


def check_args(args, columns) -> None:
    """Every option that names a column or a test, checked against the trials table before any re-attack."""
    for text in args.where:
        where_parts(text, columns)
    if args.by not in columns:
        raise ConfigError(f"--by {args.by}: not a column of trials.parquet; e.g. config.cem.lambd")
    for flag, specs, fields in (("--paired", args.paired, "NAME METRIC CLAIM A B"),
                                ("--within", args.within, "NAME COLUMN CLAIM OTHER WHERE")):
        for spec in specs:
            parts = spec.split()
            if len(parts) != 5 or parts[2] not in CLAIMS:
                raise ConfigError(f"{flag} {spec!r}: give five fields, {fields}, CLAIM one of {', '.join(CLAIMS)}")
            for text in (parts[3:] if flag == "--paired" else parts[4:]):
                where_parts(text, columns)
    bad = [k for k in parse_set(args.set) if not (k.startswith("attack.") or k in ATTACK_ALSO)]
    if bad:   # each trial's `cem-bench attack` would refuse it after the one before had run
        raise ConfigError(f"--set {', '.join(bad)}: a re-attack changes only attack.* keys and "
                          f"{', '.join(ATTACK_ALSO)}")
    if args.out is not None:
        if not args.summarise:
            raise ConfigError(f"--out {args.out}: only with --summarise (the joined rows it writes)")
        check_out_file("--out", str(args.out), "Nothing was re-attacked.")


def side(df: pd.DataFrame, text: str) -> pd.DataFrame:
    mask = np.ones(len(df), dtype=bool)
    for key, v in where_parts(text, df.columns):
        mask &= np.isclose(df[key].astype(float), float(v)) if isinstance(v, (int, float)) else (df[key] == v)
    return df[mask]


def one_configuration(rows: pd.DataFrame, text: str) -> pd.DataFrame:
    """A side's rows, which must be one configuration's runs: two (gmm and attention_centroid both at
    ``config.cem.lambd=16``) would be pooled, and a paired test reuse the other side's runs for each."""
    if "config_id" in rows and rows["config_id"].nunique() > 1:
        raise SystemExit(f"{text} matches {rows['config_id'].nunique()} configurations: name the keys that tell "
                         f"them apart (KEY=VALUE,KEY=VALUE)")
    return rows


def tests(df: pd.DataFrame, paired: list[str], within: list[str]) -> pd.DataFrame:
    """Each test as the report tests a hypothesis (``hypotheses.one_test``: paired t over the seeds both sides
    ran, one-sided, no test below ``MIN_RUNS`` pairs or without spread), the family adjusted as the report
    adjusts it (Holm; an untested member counts, with p = 1)."""
    out = []
    for spec in paired:
        name, metric, claim, a, b = spec.split()
        h = {"metric": metric, "paired": True, "a_is": claim, "margin": 0.0}
        res = one_test(h, one_configuration(side(df, a), a), one_configuration(side(df, b), b))
        out.append({"name": name, "test": f"{metric}: {a} {claim} than {b}", **res})
    for spec in within:
        name, column, claim, other, where = spec.split()
        rows = one_configuration(side(df, where), where)
        h = {"metric": "_v", "paired": True, "a_is": claim, "margin": 0.0}
        res = one_test(h, rows.assign(_v=rows[column]), rows.assign(_v=rows[other]))
        out.append({"name": name, "test": f"{column} {claim} than {other} at {where}", **res})
    table = pd.DataFrame(out)
    if len(table):
        table["p_holm"] = adjust(table["p"].to_numpy(float), "holm")
        table["verdict"] = [
            f"not tested: {min(t['n_a'], t['n_b'])} seeds both sides ran (needs {MIN_RUNS})"
            if min(t["n_a"], t["n_b"]) < MIN_RUNS else "not tested: the runs do not vary"
            if not np.isfinite(t["p"]) else "holds" if t["p_holm"] <= 0.05 else "not shown"
            for _, t in table.iterrows()]
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
    # absolute: each re-attack runs with cwd=ROOT, where a relative folder named another (every trial failed)
    p.add_argument("experiment", type=lambda text: Path(text).expanduser().absolute())
    p.add_argument("--set", action="append", default=[], required=True, help="the attack's attack.* keys")
    p.add_argument("--jobs", type=positive_int, default=1)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads of each re-attack (default: "
                   "the trial's own, as its result records them)")
    p.add_argument("--summarise", action="store_true")
    p.add_argument("--by", default="config.cem.lambd")
    p.add_argument("--paired", action="append", default=[])
    p.add_argument("--within", action="append", default=[])
    p.add_argument("--where", action="append", default=[],
                   help="KEY=VALUE[,KEY=VALUE]: only the trials of this configuration (repeatable: any of them)")
    p.add_argument("--out", type=Path, help="with --summarise: write the joined rows to this Parquet file")
    args = p.parse_args(argv)
    from cem_bench.errors import ResultsError
    from cem_bench.integrity import read_table
    try:
        parse_set(args.set)
        trials = read_table(str(args.experiment), "trials.parquet", "trials")   # verified against its checksums
    except (ConfigError, ResultsError) as e:
        print(f"reattack: {e}", file=sys.stderr)
        return 2
    if trials is None:
        print(f"reattack: {args.experiment} holds no trials.parquet: give the experiment folder of a finished "
              f"`cem-bench search` (or run `cem-bench report` on it first)", file=sys.stderr)
        return 2
    try:
        check_args(args, trials.columns)
    except ConfigError as e:
        print(f"reattack: {e}", file=sys.stderr)
        return 2
    trials = trials[trials["status"] == "ok"]
    if args.where:   # only the trials of these configurations (any of them)
        trials = pd.concat([side(trials, w) for w in args.where]).drop_duplicates("trial_dir")
    trials = trials.reset_index(drop=True)
    missing = [d for d in trials["trial_dir"] if not (args.experiment / d).is_dir()]
    if missing:   # before any attack starts: each would fail on its own after the others' work
        print(f"reattack: {len(missing)} trial folder(s) of trials.parquet are not in {args.experiment} (e.g. "
              f"{missing[0]}): the tables were copied without the trial folders", file=sys.stderr)
        return 2
    if not args.summarise:
        try:
            return 1 if run(args.experiment, trials, args.set, args.jobs, args.threads) else 0
        except (ConfigError, ResultsError) as e:
            print(f"reattack: {e}", file=sys.stderr)
            return 2
    df = joined(args.experiment, trials, args.set)
    if args.out:
        df.to_parquet(args.out)
    summarise(df, args.by)
    table = tests(df, args.paired, args.within)
    for _, t in table.iterrows():
        print(f"{t['name']}: {t['test']}: {t['diff']:+.3f} ({t['ci_low']:+.3f} to {t['ci_high']:+.3f}), "
              f"n {min(t['n_a'], t['n_b'])}, p {t['p']:.2g}, Holm over {len(table)} {t['p_holm']:.2g}: "
              f"{t['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
