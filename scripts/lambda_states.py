"""Where the λ scale moves (issue 36): `cem-bench calibrate` over σ × width × warm-up × seed × data set.

Each state is one `cem-bench calibrate` run (one seed, the λ = 0 reference run measured after each warm-up),
written to OUT/<dataset>_w<width>_s<sigma>_seed<seed>.json (with the arguments it was measured for) and skipped
when that file exists for the same arguments, so the script can be stopped and run again; one measured for other
--warmups, --batches or --set is refused before any work (``--redo`` measures it again). ``--summarise`` reads
every file and prints the table of docs/estimators.md ("One λ scale across states") and draws
OUT/lambda_states.png: each surrogate's fixed-default ratio to gmm and the matched ratio against σ, the spread
over seeds as bars.

    python scripts/lambda_states.py --out /tmp/lambda-states --datasets synthetic --widths 1.0 0.25 \\
        --sigmas 0.01 0.025 0.05 0.1 0.15 --warmups 2 3 5 --seeds 0 1 2
    python scripts/lambda_states.py --out /tmp/lambda-states --summarise
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from cem_bench.parsing import positive_int


def request(args, dataset, width, sigma, seed) -> dict:
    """What a state file is asked to hold: the state and the measurement's arguments, stored in the file so that
    a later run with other --warmups, --batches or --set does not take it for its own."""
    return {"dataset": dataset, "width": width, "sigma": sigma, "seed": seed, "warmups": sorted(set(args.warmups)),
            "batches": args.batches, "set": sorted(args.set)}


def read_state(f: Path):
    """A state file's JSON; SystemExit naming the file when it is not JSON (a file cut short, or another's)."""
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"lambda_states: {f} is not a readable state file ({e}): move it away, or measure its "
                         f"state again (delete it and run without --summarise)") from None


def stored_request(f: Path) -> dict | None:
    """The request a state file was measured for (None: a file written before the request was stored)."""
    doc = read_state(f)
    return doc.get("lambda_states") if isinstance(doc, dict) else None


# the keys each state sets (its file's name holds them); a --set of one would override the state's in calibrate
STATE_KEYS = frozenset({"data.dataset", "model.width", "defense.noise_std", "seed", "train.device"})


def check_states(args, states) -> None:
    """Every state's configuration as calibrate checks it, before the first is measured: a data set or width
    calibrate refuses failed only when its state's turn came, after hours of the others, in a traceback."""
    from cem_bench import calibrate
    from cem_bench.config import parse_set
    from cem_bench.errors import ConfigError
    try:
        extra = parse_set(args.set)
    except ConfigError as e:
        raise SystemExit(f"lambda_states: --set: {e}. Nothing was measured") from None
    own = sorted(set(extra) & STATE_KEYS)
    if own:   # calibrate took the --set, given after the state's: every file would be named for a state not measured
        raise SystemExit(f"lambda_states: --set {', '.join(own)}: the script sets it for each state; give it with "
                         f"--datasets, --widths, --sigmas or --seeds. Nothing was measured")
    for f, req in states:
        flat = {**extra, "data.dataset": req["dataset"], "model.width": req["width"],
                "defense.noise_std": req["sigma"], "seed": req["seed"], "train.device": "cpu"}
        try:
            calibrate.plan(flat, None, req["warmups"], req["batches"])
        except ConfigError as e:
            raise SystemExit(f"lambda_states: the state {f.stem}: {e}. Nothing was measured") from None
    # the data sets too, before --out is made: a missing CIFAR failed inside its first state's calibrate, after
    # every state of the data sets before it had been measured (2026-12-07 probe)
    from cem_bench.config import DataConfig
    from cem_bench.core.data import check_available
    from cem_bench.errors import DataError
    root = str(extra.get("data.root", DataConfig().root))
    for dataset in dict.fromkeys(req["dataset"] for _, req in states):
        try:
            check_available(dataset, os.path.expanduser(root))
        except DataError as e:
            raise SystemExit(f"lambda_states: data.dataset={dataset}: {e}. Nothing was measured") from None


def run(args) -> None:
    out = Path(args.out)
    states = [(out / f"{dataset}_w{width}_s{sigma}_seed{seed}.json", request(args, dataset, width, sigma, seed))
              for dataset in args.datasets for width in args.widths for sigma in args.sigmas for seed in args.seeds]
    check_states(args, states)
    out.mkdir(parents=True, exist_ok=True)
    # every existing file checked before the first state is measured: one measured for other arguments is not
    # reused (it would enter the table as if measured for these), and not replaced without --redo
    stale = []
    for f, req in states:
        if f.exists() and stored_request(f) != req:
            old = stored_request(f)
            differ = ("no arguments stored (written before they were)" if old is None else
                      ", ".join(f"{k} {old.get(k)} (now {v})" for k, v in req.items() if old.get(k) != v))
            stale.append(f"{f}: {differ}")
    if stale and not args.redo:
        raise SystemExit("lambda_states: state files measured for other arguments than these:\n  "
                         + "\n  ".join(stale) + "\ngive --redo to measure them again with these arguments, or "
                         "another --out. Nothing was measured")
    for f, req in states:
        if f.exists() and stored_request(f) == req:
            continue
        part = Path(str(f) + ".part")
        cmd = [sys.executable, "-m", "cem_bench.cli", "calibrate", "--set", f"data.dataset={req['dataset']}",
               "--set", f"model.width={req['width']}", "--set", f"defense.noise_std={req['sigma']}",
               "--set", f"seed={req['seed']}", "--set", "train.device=cpu",
               "--warmup", *map(str, args.warmups), "--batches", str(args.batches),
               "--json", str(part), *sum((["--set", s] for s in args.set), [])]
        t0 = time.perf_counter()
        try:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"lambda_states: calibrate failed for {f.name} (exit {e.returncode}; its message is "
                             f"above). The states measured before it are kept in {out}: run again to go on") from None
        doc = read_state(part)
        part.write_text(json.dumps({**doc, "lambda_states": req}, indent=2))
        part.rename(f)
        print(f"{f.name}: {time.perf_counter() - t0:.0f} s", flush=True)


def summarise(args) -> None:
    out = Path(args.out)
    rows = []
    if not sorted(out.glob("*.json")):
        raise SystemExit(f"lambda_states: no state files (*.json) in {out}: run it without --summarise first")
    requests: dict[str, list[str]] = {}
    for f in sorted(out.glob("*.json")):
        doc = read_state(f)
        req = doc.get("lambda_states") if isinstance(doc, dict) else None
        key = json.dumps({k: v for k, v in (req or {}).items() if k in ("warmups", "batches", "set")},
                         sort_keys=True)
        requests.setdefault(key, []).append(f.name)
    if len(requests) > 1:
        # one table, one measurement: files of other warm-ups, batches or keys would sit under one column head
        # ("drift from warm-up 1" over rows that start at 2) and out of the compact table
        kinds = "; ".join(f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''} ({k})"
                          for k, names in requests.items())
        raise SystemExit(f"lambda_states: the state files in {out} were measured with different arguments: {kinds}. "
                         f"Summarise one kind at a time (another --out), or measure them again with --redo")
    for f in sorted(out.glob("*.json")):
        dataset, w, s, seed = f.stem.split("_")
        doc = read_state(f)
        # calibrate's --json: {configuration, records} (files written before it recorded the configuration: the
        # records alone)
        for r in (doc["records"] if isinstance(doc, dict) else doc):
            rows.append({"dataset": dataset, "width": float(w[1:]), "sigma": float(s[1:]), "seed": int(seed[4:]),
                         **r})
    import pandas as pd
    df = pd.DataFrame(rows)
    df = df[df.surrogate != "gmm"]
    # the fixed default's ratio (files written before calibrate's records named it fixed_ratio_to_gmm hold it
    # as ratio_to_gmm)
    df["fixed"] = df["fixed_ratio_to_gmm"].fillna(df.ratio_to_gmm) if "fixed_ratio_to_gmm" in df else df.ratio_to_gmm
    df["matched"] = df.matched_ratio

    def gstat(v):
        lv = np.log(np.asarray(v, dtype=float))
        return math.exp(lv.mean()), (math.exp(lv.std(ddof=1)) if len(lv) > 1 else math.nan)

    lines = ["| data set | width | σ | warm-up | surrogate | fixed default ÷ gmm (geo mean, ×/÷ seed sd) | "
             "matched ÷ gmm | drift from warm-up " + str(int(df.warmup.min())) + " | seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, g in df.groupby(["dataset", "width", "sigma", "warmup", "surrogate"]):
        fm, fs = gstat(g.fixed)
        mm, ms = gstat(g.matched)
        dm, _ = gstat(g.drift_ratio)
        lines.append(f"| {key[0]} | {key[1]:g} | {key[2]:g} | {key[3]} | {key[4]} | {fm:.2f} ×/÷ {fs:.2f} | "
                     f"{mm:.2f} ×/÷ {ms:.2f} | {dm:.2f} | {len(g)} |")
    print("\n".join(lines))
    print("\n" + compact(df))
    fixed_all = df.fixed.to_numpy(float)
    matched_all = df.matched.to_numpy(float)
    print(f"\nfixed defaults: ratio to gmm {fixed_all.min():.2f}-{fixed_all.max():.2f} over {len(df)} "
          f"(state, seed, surrogate) cells; {np.mean((fixed_all < 2 / 3) | (fixed_all > 1.5)):.0%} outside "
          f"[0.67, 1.5]")
    outside = int(np.sum((matched_all < 2 / 3) | (matched_all > 1.5)))
    print(f"matched: ratio to gmm on held-out batches {matched_all.min():.2f}-{matched_all.max():.2f}; "
          f"{outside} of {len(matched_all)} cells outside [0.67, 1.5]")
    # the later warm-ups only: at the first, drift_ratio is the match's own held-out error, not a drift
    drift = df.loc[df.warmup > df.warmup.min(), "drift_ratio"].to_numpy(float)
    if len(drift) and np.isfinite(drift).any():
        print(f"drift of a match made at the first warm-up: {np.nanmin(drift):.2f}-{np.nanmax(drift):.2f}")
    gmm = pd.DataFrame([r for r in rows if r["surrogate"] == "gmm"])
    for key, g in gmm.groupby(["dataset", "width", "warmup"]):
        print(f"gmm strength per unit λ, {key}: " + ", ".join(
            f"σ {s:g}: {gstat(gg.strength)[0]:.3g}" for s, gg in g.groupby("sigma")))
    plot(df, out / "lambda_states.png")


def compact(df) -> str:
    """The docs' table: per data set, width and σ (the first warm-up), each surrogate's equalising loss scale
    (what a matched trial measures; geometric mean over seeds, ×/÷ their spread) and, in brackets, the fixed
    default's ratio to gmm there; then the drift of a match to the later warm-ups."""
    w0 = int(df.warmup.min())
    names = sorted(df.surrogate.unique())
    head = "| data set | width | σ | seeds | " + " | ".join(f"{n}: scale (fixed ÷ gmm)" for n in names) + " |"
    lines = [head, "|" + "---|" * (4 + len(names))]
    first = df[df.warmup == w0]
    for (dataset, width, sigma), g in first.groupby(["dataset", "width", "sigma"]):
        cells = []
        for n in names:
            gg = g[g.surrogate == n]
            scale = np.log(gg.matched_loss_scale.to_numpy(float))
            fixed = np.exp(np.log(gg.fixed.to_numpy(float)).mean())
            sd = f" ×/÷ {math.exp(scale.std(ddof=1)):.2f}" if len(scale) > 1 else ""
            cells.append(f"{math.exp(scale.mean()):.3g}{sd} ({fixed:.2g})")
        lines.append(f"| {dataset} | {width:g} | {sigma:g} | {g.seed.nunique()} | " + " | ".join(cells) + " |")
    later = df[df.warmup > w0]
    if len(later):
        lines += ["", "| data set | width | " + " | ".join(f"{n}: drift from warm-up {w0}" for n in names) + " |",
                  "|" + "---|" * (2 + len(names))]
        for (dataset, width), g in later.groupby(["dataset", "width"]):
            cells = []
            for n in names:
                d = g[g.surrogate == n].drift_ratio.to_numpy(float)
                cells.append(f"{d.min():.2f}–{d.max():.2f}")
            lines.append(f"| {dataset} | {width:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(df, path: Path) -> None:
    """Each surrogate's equalising loss scale (what a matched trial measures) against σ at the first warm-up,
    one panel per data set and width, seeds as min-max bars; its fixed default as a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted(df.groupby(["dataset", "width"]).groups)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.3 * len(groups), 3.4), sharey=True, squeeze=False)
    w0 = int(df.warmup.min())
    for ax, (dataset, width) in zip(axes[0], groups):
        d = df[(df.dataset == dataset) & (df.width == width) & (df.warmup == w0)]
        for i, name in enumerate(sorted(df.surrogate.unique())):
            g = d[d.surrogate == name]
            if g.empty:
                continue
            stats = g.groupby("sigma")["matched_loss_scale"].apply(lambda v: np.log(v.to_numpy(float)))
            sig = stats.index.to_numpy(float)
            mean = np.exp([v.mean() for v in stats])
            lo, hi = np.exp([v.min() for v in stats]), np.exp([v.max() for v in stats])
            ax.errorbar(sig, mean, yerr=[mean - lo, hi - mean], fmt="-o", color=f"C{i}", ms=3, capsize=2,
                        label=name)
            ax.axhline(float(g.loss_scale.iloc[0]), color=f"C{i}", ls="--", lw=0.8, alpha=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted(d.sigma.unique())
        ax.set_xticks(ticks, [f"{v:g}" for v in ticks], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("σ (defense noise)")
        ax.set_title(f"{dataset}, width {width:g}", fontsize=9)
    axes[0][0].set_ylabel(f"equalising loss scale (warm-up {w0})")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.suptitle("the loss scale with gmm's pull per unit λ (solid, seeds min-max) and the fixed default (dashed)",
                 fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def _folder(text: str) -> str:
    """argparse type of --out: not empty (``--out "$DIR"`` with DIR unset measured into the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset variable?); give the folder for the state files")
    return os.path.expanduser(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=_folder)
    p.add_argument("--datasets", nargs="+", default=["synthetic"])
    p.add_argument("--widths", nargs="+", type=float, default=[1.0, 0.25])
    p.add_argument("--sigmas", nargs="+", type=float, default=[0.01, 0.025, 0.05, 0.1, 0.15])
    p.add_argument("--warmups", nargs="+", type=int, default=[2, 3, 5])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--batches", type=positive_int, default=8)
    p.add_argument("--set", action="append", default=[], help="another config key for every state")
    p.add_argument("--redo", action="store_true", help="measure again the state files in --out that were "
                   "measured for other --warmups, --batches or --set (without it they are refused)")
    p.add_argument("--summarise", action="store_true")
    args = p.parse_args()
    if Path(args.out).exists() and not Path(args.out).is_dir():
        p.error(f"--out {args.out} is a file; give a folder for the state files")
    if args.summarise and not Path(args.out).is_dir():
        p.error(f"--out {args.out} does not exist; give the folder a run without --summarise measured into")
    twice = {n: sorted({v for v in getattr(args, n) if getattr(args, n).count(v) > 1})
             for n in ("datasets", "widths", "sigmas", "warmups", "seeds")}
    for name, values in twice.items():
        if values:   # one state file a state: a repeat was measured once and counted once, without a word
            p.error(f"--{name}: {', '.join(map(str, values))} given more than once; give each once")
    summarise(args) if args.summarise else run(args)


if __name__ == "__main__":
    main()
