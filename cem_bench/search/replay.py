"""Replay a recorded search through the early-stopping scheduler in simulated time, without training
(``cem-bench replay``; docs/search.md).

A search whose trials all ran to the end with the privacy probe recorded at every epoch (or at least at every
rung epoch of the scheduler settings tried) holds everything a scheduler would have seen: each trial's
per-epoch test accuracy and probe. The replay drives ``rungs.RungRanker`` — the same decisions as the live
``moasha.MOASHA`` — with those records, as Syne Tune's simulator backend does with a tabulated benchmark:

* ``workers`` trials run at once; one epoch costs one unit of simulated time; when a trial ends (its last epoch,
  or a STOP at a rung) its worker takes the next trial of the arrival order;
* results reach the ranker in the order of their simulated finishing times, so that which trials are
  recorded at a rung when a trial arrives there depends on the order, as in a live asynchronous search;
* over ``orders`` random arrival orders it reports the epochs run (as a share of running every trial to the end,
  what a FIFO search of the same trials costs), the hypervolume of the front of the trials it kept on their
  final objectives (as a share of the full front's), and how many of the full front's trials it stopped.

``correlations`` answers whether the rungs predict the end: the Spearman rank correlation, over the trials,
between each objective's per-epoch stand-in at epoch e and the objective's final value.
"""

from __future__ import annotations

import heapq
import math
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import ResultsError
from ..frontier import hypervolume, pareto_ranks
from ..spaces.spec import RUNG_METRICS, rung_epochs
from .rungs import RungRanker


@dataclass(frozen=True)
class Replayed:
    """One scheduler setting replayed over many arrival orders (means and standard deviations)."""
    grace_epochs: int
    reduction_factor: float
    rungs: tuple[int, ...]
    epochs_share: float           # epochs run / epochs of running every trial to the end
    epochs_share_std: float
    hv_share: float               # hypervolume of the kept trials' front / the full front's
    hv_share_std: float
    front_stopped: float          # mean number of the full front's trials the scheduler stopped
    front_size: int
    stopped: float                # mean number of trials stopped
    trials: int


def trial_records(trials: pd.DataFrame, epochs: pd.DataFrame, objectives: list[dict]) -> tuple[
        list[str], dict[str, dict[int, dict]], np.ndarray, int]:
    """(trial ids, trial id -> epoch -> the rung values, final objective values (trials x objectives), epochs
    per trial) of the search trials that finished ("ok", role search) — the ones a replay can judge."""
    ok = trials[(trials["status"] == "ok") & (trials.get("role", "search") == "search")]
    ids = [str(t) for t in ok["trial_id"]]
    stand_ins = [RUNG_METRICS[o["metric"]] for o in objectives]
    by_trial: dict[str, dict[int, dict]] = {t: {} for t in ids}
    ep = epochs[epochs["trial_id"].astype(str).isin(set(ids))]
    for row in ep.itertuples(index=False):
        rec = row._asdict()
        by_trial[str(rec["trial_id"])][int(rec["epoch"])] = {m: rec.get(m, float("nan")) for m in stand_ins}
    finals = ok[[o["metric"] for o in objectives]].to_numpy(dtype=float)
    length = int(max((max(v) for v in by_trial.values() if v), default=0))
    return ids, by_trial, finals, length


def _front_hv(values: np.ndarray, objectives: list[dict], refs: list[float]) -> float:
    values = values[np.isfinite(values).all(axis=1)]
    if not len(values):
        return 0.0
    modes = [o["mode"] for o in objectives]
    return float(hypervolume(values, modes, refs))


def simulate(ids: list[str], by_trial: dict[str, dict[int, dict]], length: int, ranker: RungRanker,
             order: list[int], workers: int) -> dict[str, int]:
    """trial id -> epochs it ran, when its trials start in ``order`` on ``workers`` workers and ``ranker``
    judges them at its rungs (see the module docstring)."""
    ran: dict[str, int] = {}
    queue = list(order)
    events: list[tuple[float, int, str, int]] = []   # (time, tie-break, trial id, epoch finished)
    counter = 0

    def start(now: float) -> None:
        nonlocal counter
        if queue:
            tid = ids[queue.pop(0)]
            heapq.heappush(events, (now + 1, counter, tid, 1))
            counter += 1

    for _ in range(min(workers, len(queue))):
        start(0.0)
    while events:
        now, _, tid, epoch = heapq.heappop(events)
        values = by_trial[tid].get(epoch, {})
        decision = ranker.on_result(tid, epoch, values)
        if decision.action == "stop" or epoch >= length:
            ran[tid] = epoch
            start(now)
        else:
            heapq.heappush(events, (now + 1, counter, tid, epoch + 1))
            counter += 1
    return ran


def replay(trials: pd.DataFrame, epochs: pd.DataFrame, objectives: list[dict], grace_epochs: int,
           reduction_factor: float, orders: int = 50, workers: int = 4, seed: int = 0) -> Replayed:
    """``simulate`` over ``orders`` random arrival orders (see the module docstring)."""
    ids, by_trial, finals, length = trial_records(trials, epochs, objectives)
    if not ids:
        raise ResultsError("no finished search trial to replay: the replay needs trials that ran to the end")
    rung_objs = [(RUNG_METRICS[o["metric"]], o["mode"], o.get("ref")) for o in objectives]
    modes = [o["mode"] for o in objectives]
    refs = [o["ref"] if o.get("ref") is not None else
            (float(np.nanmin(finals[:, j])) - 1e-9 if o["mode"] == "max" else float(np.nanmax(finals[:, j])) + 1e-9)
            for j, o in enumerate(objectives)]
    finite = np.isfinite(finals).all(axis=1)
    full_hv = _front_hv(finals, objectives, refs)
    ranks = np.full(len(ids), -1)
    ranks[finite] = pareto_ranks(finals[finite], modes)
    front = {ids[i] for i in np.flatnonzero(ranks == 0)}
    rng = np.random.default_rng(seed)
    shares, hvs, front_stops, stops = [], [], [], []
    for _ in range(orders):
        ranker = RungRanker(length, grace_epochs, reduction_factor, rung_objs)
        ran = simulate(ids, by_trial, length, ranker, list(rng.permutation(len(ids))), workers)
        kept = np.array([ran[t] >= length for t in ids])
        shares.append(sum(ran.values()) / (length * len(ids)))
        hvs.append(_front_hv(finals[kept], objectives, refs) / full_hv if full_hv > 0 else math.nan)
        front_stops.append(sum(1 for t in front if ran[t] < length))
        stops.append(int((~kept).sum()))
    # a front that dominates nothing up to the refs (every trial at chance accuracy, say) has no share to keep:
    # NaN, printed as such, not numpy's "Mean of empty slice" above the table
    hv, hv_std = (float(np.mean(hvs)), float(np.std(hvs))) if full_hv > 0 else (math.nan, math.nan)
    return Replayed(grace_epochs, reduction_factor, tuple(rung_epochs(length, grace_epochs, reduction_factor)),
                    float(np.mean(shares)), float(np.std(shares)), hv, hv_std,
                    float(np.mean(front_stops)), len(front), float(np.mean(stops)), len(ids))


def correlations(trials: pd.DataFrame, epochs: pd.DataFrame, objectives: list[dict]) -> pd.DataFrame:
    """Spearman's rank correlation, over the finished search trials, between each objective's stand-in at epoch
    e and its final value: one row per epoch, a column per objective (NaN where fewer than 3 trials have both).
    Signs as they come: a stand-in that ranks trials as the end does correlates positively."""
    from scipy.stats import spearmanr
    ids, by_trial, finals, length = trial_records(trials, epochs, objectives)
    rows = []
    for e in range(1, length + 1):
        row: dict = {"epoch": e}
        for j, o in enumerate(objectives):
            m = RUNG_METRICS[o["metric"]]
            x = np.array([by_trial[t].get(e, {}).get(m, math.nan) for t in ids], dtype=float)
            ok = np.isfinite(x) & np.isfinite(finals[:, j])
            row[f"{m} vs final {o['metric']}"] = float(spearmanr(x[ok], finals[ok, j]).statistic) \
                if ok.sum() >= 3 and np.ptp(x[ok]) > 0 and np.ptp(finals[ok, j]) > 0 else math.nan
        row["trials"] = int(len(ids))
        rows.append(row)
    return pd.DataFrame(rows)


def load(results_dir: str) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """(trials, epochs, objectives) of a search's folder: its tables when written, else built from its files."""
    from ..analysis.results import build_tables
    from ..integrity import read_table
    from ..schema import EPOCHS_FILE, TRIALS_FILE, load_objectives
    from ..storage import Dir
    d = Dir(results_dir)
    if not d.is_dir():
        what = " is a file, not a folder" if d.kind() == "file" else ": no such folder"
        raise ResultsError(f"{results_dir}{what}; give the experiment folder of a `cem-bench search`")
    trials, epochs = read_table(d, TRIALS_FILE, "trials"), read_table(d, EPOCHS_FILE, "epochs")
    if trials is None or epochs is None:
        trials, epochs = build_tables(results_dir)
    if not len(trials) or "status" not in trials or "trial_id" not in epochs:
        raise ResultsError(f"{results_dir} holds no trials of a `cem-bench search` (no {TRIALS_FILE}, no trial "
                           f"folders); give the experiment folder of a search")
    objectives, _ = load_objectives(d)
    for o in objectives:
        if o["metric"] not in RUNG_METRICS:
            raise ResultsError(f"objective {o['metric']} has no per-epoch stand-in to replay (known: "
                             f"{', '.join(sorted(RUNG_METRICS))})")
    # a hand-edited table's odd values were tracebacks (KeyError, int() of text or NaN) or "the trials ran -1
    # epochs" (2026-12-07 probe): named here, with the file
    missing = [o["metric"] for o in objectives if o["metric"] not in trials]
    if missing and (trials["status"] == "ok").any():   # (a search none of whose trials finished is said below)
        raise ResultsError(f"{d.url(TRIALS_FILE)} has no {', '.join(missing)} column, an objective of the search "
                           f"(search_space.json); a trials table of `cem-bench search` has every objective's")
    if "epoch" not in epochs:
        raise ResultsError(f"{d.url(EPOCHS_FILE)} has no epoch column; an epochs table of `cem-bench search` has it")
    ep = pd.to_numeric(epochs["epoch"], errors="coerce")
    if len(ep) and not (ep.notna().all() and (ep >= 1).all() and (ep == ep.round()).all()):
        bad = sorted({str(v) for v, n in zip(epochs["epoch"], ep) if not (pd.notna(n) and n >= 1 and n == round(n))})
        raise ResultsError(f"{d.url(EPOCHS_FILE)}: its epoch column holds {', '.join(bad[:5])}, not whole epochs "
                           f"from 1; an epochs table of `cem-bench search` counts from 1")
    # values no trial can hold (an accuracy of inf, an SSIM of -5) shifted the hypervolumes without a word, where
    # table and report refuse them (2026-12-07 probe); the rungs' stand-ins are bounded as their objectives are
    from ..schema import METRIC_RANGES, base_metric, out_of_range
    ok = trials[trials["status"] == "ok"]
    for table, name, ranges in (
            (ok, TRIALS_FILE, None),
            (epochs, EPOCHS_FILE, {RUNG_METRICS[o["metric"]]: METRIC_RANGES[base_metric(o["metric"])]
                                   for o in objectives if base_metric(o["metric"]) in METRIC_RANGES})):
        bad = out_of_range(table, ranges)
        if bad is not None:
            col, value, _, n, low, high = bad
            raise ResultsError(f"{d.url(name)}: {col} holds {value:g}{f' (and {n - 1} more)' if n > 1 else ''}, "
                               f"outside the values it can take ({low:g} to {high:g}); a table of `cem-bench "
                               f"search` holds none (this one was edited)")
    if "role" not in trials:
        print(f"note: {d.url(TRIALS_FILE)} has no role column: every trial is replayed as a search trial (the λ = 0 "
              f"baseline's and a confirmation's runs cannot be told apart)")
    return trials, epochs.assign(epoch=ep.astype(int)) if len(ep) else epochs, objectives


# The most arrival orders one setting replays: each order replays the whole search, and past a few thousand
# the shares' standard errors are far below the differences a choice of grace and eta turns on
MAX_ORDERS = 10_000
# From this many orders a setting says on stderr that it started (the default 50 take moments; thousands, minutes)
PROGRESS_ORDERS = 1_000


def check_args(args) -> None:
    """ResultsError for a setting no replay can run, naming the option and what it takes (before any read)."""
    if args.workers < 1:
        raise ResultsError(f"--workers {args.workers}: give how many trials run at once in the simulation, an "
                           f"integer >= 1")
    if not 1 <= args.orders <= MAX_ORDERS:   # 10^8 ran for days without a word
        raise ResultsError(f"--orders {args.orders}: give how many random arrival orders to replay, 1 to "
                           f"{MAX_ORDERS:,} (the means' spread over orders falls as 1/sqrt(orders): the default 50 "
                           f"gives its shares to about 0.01)")
    bad = [g for g in args.grace if g < 1]
    if bad:
        raise ResultsError(f"--grace {' '.join(map(str, bad))}: grace epochs are whole epochs >= 1")
    bad = [e for e in args.eta if not (math.isfinite(e) and e > 1)]
    if bad:
        raise ResultsError(f"--eta {' '.join(f'{e:g}' for e in bad)}: a reduction factor keeps 1/eta of each rung, "
                           f"so it must be > 1 (2 or 3 are usual)")
    if not 0 <= args.seed < 2 ** 32:   # numpy's own ValueError was a traceback
        raise ResultsError(f"--seed {args.seed}: the arrival orders' seed is an integer from 0 to 2**32 - 1")
    for flag, values in (("--grace", args.grace), ("--eta", args.eta)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:   # each would print its row twice, as if two settings had been replayed
            raise ResultsError(f"{flag} {' '.join(f'{v:g}' for v in twice)} given more than once; give each value "
                               f"once")


def main(args) -> int:
    """``cem-bench replay RESULTS``: the probe's rank correlations, then a table of every grace x η setting."""
    check_args(args)
    trials, epochs, objectives = load(args.results_dir)
    ids, by_trial, _, length = trial_records(trials, epochs, objectives)
    if not ids:
        raise ResultsError(f"{args.results_dir}: no search trial ran to the end ({len(trials)} trial(s) recorded); the "
                           f"replay judges the trials that finished")
    search = trials[trials.get("role", pd.Series("search", index=trials.index)).fillna("search") == "search"]
    n_stopped = int((search["status"] == "stopped").sum())
    if n_stopped:   # the survivors of a scheduler are a sample it chose: replaying them says nothing of the whole
        raise ResultsError(f"{args.results_dir}: {n_stopped} of its {len(search)} search trials were stopped early by "
                           f"its scheduler, so only the ones it kept ran to the end, a sample it chose; the replay "
                           f"needs every trial run to the end: replay a search run with `scheduler: fifo` and the "
                           f"probe on (docs/search.md)")
    n_other = len(search) - len(ids)
    if n_other:
        print(f"note: {n_other} of the {len(search)} search trials did not finish ok (errors, or still running); "
              f"the replay judges the {len(ids)} that did")
    missing = [RUNG_METRICS[o["metric"]] for o in objectives
               if not any(np.isfinite(float(v.get(RUNG_METRICS[o["metric"]], math.nan)))
                          for rec in by_trial.values() for v in rec.values())]
    if missing:
        raise ResultsError(f"{args.results_dir}: nothing to replay: the trials recorded no per-epoch "
                           f"{' or '.join(missing)}, which the scheduler ranks at its rungs. Search with the privacy "
                           f"probe on (attack.probe_epochs, docs/search.md), then replay that search")
    settings = [g for g in args.grace if g < length]
    if not settings:   # the error alone: a note on stdout per skipped --grace beside it said the same twice
        raise ResultsError(f"{args.results_dir}: every --grace ({' '.join(map(str, args.grace))}) is at or past the "
                           f"trials' {length} epochs; give --grace below {length}")
    for g in sorted(set(args.grace) - set(settings)):
        print(f"note: --grace {g} skipped: the trials ran {length} epoch{'s' * (length != 1)}, so a first rung at "
              f"epoch {g} would judge nothing")
    args.grace = settings
    stand_ins = [RUNG_METRICS[o["metric"]] for o in objectives]

    def unrecorded(epoch: int) -> list[str]:   # the stand-ins no trial has a value of at this epoch
        return [m for m in stand_ins
                if not any(np.isfinite(float(rec.get(epoch, {}).get(m, math.nan))) for rec in by_trial.values())]
    unprobed = {(g, eta): {r: unrecorded(r) for r in rung_epochs(length, g, eta) if unrecorded(r)}
                for g in args.grace for eta in args.eta}
    if all(unprobed.values()):
        probed = sorted({e for rec in by_trial.values() for e, v in rec.items()
                         if all(np.isfinite(float(v.get(m, math.nan))) for m in stand_ins)})
        raise ResultsError(f"{args.results_dir}: every setting has a rung at an epoch no trial probed (probed: "
                           f"{', '.join(map(str, probed)) or 'none'}); give --grace and --eta whose rungs fall on "
                           f"those epochs, or search with the probe at every epoch (attack.probe_epochs)")
    for (g, eta), gaps in unprobed.items():
        if gaps:   # its rungs would rank a NaN as the worst value: on the other objective alone, without a word
            print(f"note: --grace {g} --eta {eta:g} skipped: no trial recorded "
                  + "; ".join(f"{' or '.join(ms)} at epoch {r}" for r, ms in gaps.items())
                  + " (a rung of that setting: the probe's attack.probe_epochs)")
    corr = correlations(trials, epochs, objectives)
    print(f"{args.results_dir}: {int(corr['trials'].iloc[0]) if len(corr) else 0} finished search trials")
    print("\nSpearman rank correlation of the per-epoch value with the final objective:")
    print(corr.drop(columns="trials").to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    rows = []
    todo = [(g, eta) for g in args.grace for eta in args.eta if not unprobed[(g, eta)]]
    for i, (g, eta) in enumerate(todo, 1):
        if args.orders >= PROGRESS_ORDERS:
            print(f"replaying --grace {g} --eta {eta:g} over {args.orders:,} orders ({i} of {len(todo)})",
                  file=sys.stderr, flush=True)
        r = replay(trials, epochs, objectives, g, eta, orders=args.orders, workers=args.workers, seed=args.seed)
        rows.append({"grace": g, "eta": eta, "rungs": list(r.rungs),
                     "epochs run (share of FIFO)": f"{r.epochs_share:.2f} ± {r.epochs_share_std:.2f}",
                     "kept front's hypervolume (share)": (f"{r.hv_share:.3f} ± {r.hv_share_std:.3f}"
                                                          if np.isfinite(r.hv_share) else "— (front's is 0)"),
                     "front trials stopped": f"{r.front_stopped:.1f} of {r.front_size}",
                     "trials stopped": f"{r.stopped:.1f} of {r.trials}"})
    print(f"\nScheduler replayed over {args.orders} random arrival orders, {args.workers} workers:")
    print(pd.DataFrame(rows).to_string(index=False))
    return 0
