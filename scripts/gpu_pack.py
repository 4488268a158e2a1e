"""Issue 40's device run: the card's ceiling for the paper's model, then k = 1, 2, 4, 8 packed trials, with and
without MPS, in the grid's fp32 and in bf16, and the attacks of k = 2 packed trials (docs/performance.md
"Packing trials on one GPU").

    OUT=/some/folder PYTHONPATH=. python3 scripts/gpu_pack.py [--budget-s 500]

Each phase appends its rows to ``$OUT/pack.jsonl`` as soon as it ends (a run cut short keeps what it measured)
and starts only when its estimated time is left in the budget (``--budget-s`` from this script's start, or
``--deadline`` on the caller's clock, whichever ends first); the order is the grid's fp32 first (ceiling,
packed, the attacks packed), then bf16. ``summary.md`` is written again after every row (and on the way out of
a run ended by SIGTERM): every figure and, from the fp32 phase's k = 2 without MPS (where the attacks are
measured packed), the grid's whole trials per GPU-hour at its own packing (``cifar10_paper.yaml``: 2 to a GPU,
2 CPUs each; ``--phases trials`` measures them under MPS). ``--phases attacks``: only the attacks of 2 packed
trials (alone and together, warmed up), without and under MPS (about 2 min on an H100). ``--phases trials``
(not in the default list): whole paper trials, ``cem-bench train`` on a 10-epoch slice with both attacks at full
size (``cem_bench/bench/paper.py``): 2 at once under MPS, then (``--trials-surrogates gmm attention_centroid``)
an attention surrogate's pair under MPS, the two the grid's GPU-hours need, then one alone, then with
``--trials-no-mps`` 2 at once without MPS; about 650 s on an H100 by estimate (110 s alone, 170 s a gmm pair,
200 s an attention pair), so a shorter budget skips the last; ``--hard-deadline`` (where the caller's `timeout`
ends this) lets the pair that gives the grid's line its second end run past the budget into the caller's
reserve. The summary gives a whole trial's GPU-minutes at each packing and the grid's GPU-hours, bracketed by
its surrogates when more than one was measured (from the pairs without MPS, said so, where MPS did not start).
Without CUDA it runs every phase on the CPU at tiny sizes: a dry run of the script, not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cem_bench import mps  # noqa: E402
from cem_bench.bench import pack, paper  # noqa: E402
from cem_bench.bench.ceiling import ceiling  # noqa: E402
from cem_bench.bench.harness import positive_seconds, sizes_for  # noqa: E402
from cem_bench.parsing import positive_int  # noqa: E402

# The paper trial's attacks alone on an H100 in the grid's precision (issue 40's measurement, the same day's
# card type): the decoder 47.8 s, rmle 18.7 s; the attack packing measured here scales them.
PAPER_ATTACKS_ALONE_S = 47.8 + 18.7
PHASES = ("fp32", "fp32-mps", "bf16", "bf16-mps", "trials", "attacks")
# estimated seconds on an H100 of one paper-trial slice of 10 epochs with both attacks at full size, alone and
# 2 at once (from the lone paper trial's parts: epochs of 1.0 s, decoder 47.8 s, rmle 18.7 s, start-up)
TRIALS_EST_S = {1: 110, 2: 170}
# a pair of an attention surrogate also compiles it and runs the 64-batch strength match in each process (docs/
# performance.md: about 180 s for 2 attention_centroid under MPS); the estimate a pair of it is started on
TRIALS_EST_ATTENTION_PAIR_S = 200
# the pair that completes the grid's line (gmm's and an attention surrogate's) is started on 1.0x its estimate,
# times how far the pair of the other kind ran over its own, by at most this: that pair ran first and paid the
# machine's cold start (page cache, cuDNN's first autotuning), which the next does not pay again, so its overrun
# overstates the card's slowness (a cold gmm pair of 280 s against 170 would otherwise skip an attention pair
# that fits)
GRID_PAIR_SCALE_CAP = 1.05
# seconds before --hard-deadline at which that pair's timeout ends it: its processes ended (5 s grace), its row
# written and the MPS daemon it started stopped before the caller's `timeout` sends SIGTERM
HARD_MARGIN_S = 10.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=positive_seconds, default=500.0)
    ap.add_argument("--deadline", type=float, default=None, metavar="EPOCH_S",
                    help="the budget's end on the wall clock, in seconds since the epoch (`date +%%s`): the "
                         "caller's clock, which started before this script's `import torch` (10-20 s on a cold "
                         "machine); the budget ends at whichever of this and --budget-s comes first")
    ap.add_argument("--hard-deadline", type=float, default=None, metavar="EPOCH_S",
                    help="where the caller's `timeout` ends this script, on the same clock, after --deadline: "
                         "the pair that completes the grid's line (the trials phase) may run until shortly "
                         "before it, into the time after the budget that the caller keeps for other work; "
                         "every other run keeps to the budget (default: the budget's end)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/cem_gpu_pack"))
    ap.add_argument("--phases", nargs="+", default=[p for p in PHASES if p != "trials"], choices=list(PHASES),
                    help="which precisions and MPS settings (default: all but trials, in this order); trials: whole "
                         "paper trials (cem-bench train, a slice of --trials-epochs with both attacks): 2 at once "
                         "under MPS, then alone (and 2 at once without MPS, with --trials-no-mps)")
    ap.add_argument("--trials-epochs", type=positive_int, default=None, help="epochs of each trial slice (default 10; 3 "
                    "on the CPU)")
    ap.add_argument("--trials-no-mps", action="store_true", help="the trials phase also runs 2 at once without "
                    "MPS, budget allowing, after every other run (not where MPS could not start: its pairs "
                    "already ran without it)")
    ap.add_argument("--trials-surrogates", nargs="+", default=["gmm"], metavar="SURROGATE",
                    choices=[w for w in paper.grid_trials() if w != "lambda=0"],   # the grid's own
                    help="the trials phase's surrogates: each 2 at once under MPS, first to last, then the first "
                         "alone (and 2 at once without MPS), budget allowing; the summary brackets the grid's "
                         "GPU-hours with them (default: gmm)")
    args = ap.parse_args(argv)
    if args.deadline is not None and args.deadline < 1e9:
        ap.error(f"--deadline {args.deadline:g} is not a time: give the budget's end in seconds since the epoch "
                 f"(e.g. $(( $(date +%s) + 500 ))), or a length with --budget-s")
    if args.hard_deadline is not None and args.hard_deadline < 1e9:
        ap.error(f"--hard-deadline {args.hard_deadline:g} is not a time: give where the caller's timeout ends this "
                 f"script in seconds since the epoch (e.g. $(( $(date +%s) + 540 )))")
    if args.hard_deadline is not None and args.deadline is not None and args.hard_deadline < args.deadline:
        ap.error(f"--hard-deadline {args.hard_deadline:g} is before --deadline {args.deadline:g}: the hard deadline "
                 f"is the latest a run the grid's line needs may go on to, at or after the budget's end")
    # `timeout` (gpu_grid_cost.sh) ends this with SIGTERM, whose default action runs no `finally` or `__exit__`:
    # an MPS daemon it started (detached, -d) outlived it, and on the same warm machine the next call's alone
    # run found it and every pair was skipped. As SystemExit, mps.Session's exit stops it. Restored on the way
    # out: a caller in the same process (a test) keeps its own handler.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    t_start = time.monotonic()

    def left() -> float:
        by_budget = args.budget_s - (time.monotonic() - t_start)
        return by_budget if args.deadline is None else min(by_budget, args.deadline - time.time())

    def hard_left() -> float:
        return left() if args.hard_deadline is None else args.hard_deadline - time.time()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sizes = sizes_for(device, quick=True, tiny=not cuda)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "cpus": os.cpu_count(),
           "device": torch.cuda.get_device_name(0) if cuda else "cpu",
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}
    summary: dict = {}
    jsonl = open(os.path.join(args.out, "pack.jsonl"), "a")

    def save() -> None:
        """summary.md from every row so far: a run ended at any point (SIGTERM at the device call's limit)
        leaves the figures it measured summed up, not only as rows."""
        try:
            write_summary(args.out, env, summary, echo=False)
        except Exception:  # noqa: BLE001 - the summary of partial results must not end the measurements
            print(f"[gpu_pack] summary.md not written: {traceback.format_exc()[-1500:]}", file=sys.stderr,
                  flush=True)

    def emit(kind: str, **rec) -> None:
        rec = {"kind": kind, "t": round(time.monotonic() - t_start, 1), **rec}
        print(json.dumps(rec, default=str)[:600], flush=True)
        jsonl.write(json.dumps(rec, default=str) + "\n")
        jsonl.flush()
        if kind in SUMMARY_KINDS:
            save()

    try:
        measure_all(args, cuda, device, sizes, left, emit, env, summary, hard_left)
    finally:
        save()
        jsonl.close()
    write_summary(args.out, env, summary, echo=True)
    return 0


# the rows after which summary.md is written again (each one's figure is in the summary by then)
SUMMARY_KINDS = ("ceiling", "pack", "attack", "trials", "error", "skipped")


def measure_all(args, cuda: bool, device, sizes, left, emit, env: dict, summary: dict, hard_left=None) -> None:
    """Every phase of ``args.phases`` in order; each result goes into ``summary`` before its row is emitted."""
    if cuda and mps.running():
        # left by an earlier call killed past its handler (a device call's own limit): this project's pipe
        # directory, no one else's; the runs below that are not under MPS must not be its clients
        emit("mps", message=f"a control daemon left in {mps.pipe_dir()} by an earlier run: stopping it")
        err = mps.stop()
        if err:
            emit("mps", message=err)
    if cuda:
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm,"
                                            "power.limit", "--format=csv"], capture_output=True, text=True).stdout
    emit("env", **env)
    if cuda:
        ks, n_images = pack.PACK_K, pack.PACK_IMAGES
    else:                                 # the dry run: the same phases, a tiny model, 2 workers
        ks, n_images = (1, 2), 256

    def flat_for(amp: str) -> dict:
        f = pack.worker_flat(n_images, amp)
        if not cuda:
            f.update({"train.device": "cpu", "data.test_size": 64, "train.batch_size": 64,
                      "attack.epochs": 1, "attack.blocks": 1, "attack.channels": 8, "attack.rmle_iterations": 5,
                      "model.width": sizes.width})
        return f

    now = {"phase": None}   # the pack phase running: its rows go into its summary entry as they come

    def log(rec) -> None:
        """pack_phase's records: a message of MPS, the workers started, or a row."""
        if isinstance(rec, str):
            emit("mps", message=rec)
            return
        if "name" in rec and now["phase"] in summary:
            summary[now["phase"]]["rows"].append(rec)
        emit("pack" if "name" in rec else "workers", **rec)

    def attacks(workers) -> dict:
        att = pack.measure_attacks(workers)
        if now["phase"] in summary:
            summary[now["phase"]]["attack"] = att
        emit("attack", **att)
        return att

    # estimated seconds of each phase on an H100 (worker start-up ~40 s, 2 windows of 6 s per k)
    for amp, est_ceiling, est_pack in (("off", 45, 110), ("on", 45, 110)):
        if not any(p.startswith("fp32" if amp == "off" else "bf16") for p in args.phases):
            continue
        if left() < est_ceiling:
            emit("skipped", phase=f"ceiling {amp}", left=left())
            break
        top = ceiling(device, sizes, amp)
        emit("ceiling", amp=amp, **top)
        for use_mps in (False, True):
            name = f"{'fp32' if amp == 'off' else 'bf16'}{'-mps' if use_mps else ''}"
            phase = f"pack {'fp32' if amp == 'off' else 'bf16'}{' MPS' if use_mps else ''}"
            if name not in args.phases:
                continue
            if left() < est_pack + (40 if amp == "off" and not use_mps else 0):
                emit("skipped", phase=phase, left=left())
                continue
            now["phase"], summary[phase] = phase, {"rows": [], "attack": None, "ceiling": top}
            try:
                rows, attack = pack.pack_phase(flat_for(amp), ks, top, use_mps, log=log,
                                               then=attacks if amp == "off" and not use_mps else None,
                                               timeout=max(60.0, left()))
                summary[phase] = {"rows": rows, "attack": attack, "ceiling": top}
            except Exception:  # noqa: BLE001
                emit("error", phase=phase, traceback=traceback.format_exc()[-2000:])
            now["phase"] = None
    if "trials" in args.phases:             # the grid's own packing as whole trials: 2 at once first
        trials_phase(args, cuda, left, emit, summary, hard_left)
    if "attacks" in args.phases:            # the attacks of the grid's packing alone: 2 fp32 workers
        for use_mps in (False, True):
            phase = f"attacks{' MPS' if use_mps else ''}"
            if left() < 60:
                emit("skipped", phase=phase, left=left())
                continue
            now["phase"], summary[phase] = phase, {"rows": [], "attack": None, "ceiling": None}
            try:
                rows, attack = pack.pack_phase(flat_for("off"), (), None, use_mps, log=log,
                                               then=attacks, workers_n=2, timeout=max(60.0, left()))
                summary[phase] = {"rows": [], "ceiling": None, "attack": attack or {"rows": rows}}
            except Exception:  # noqa: BLE001
                emit("error", phase=phase, traceback=traceback.format_exc()[-2000:])
            now["phase"] = None


def trials_phase(args, cuda: bool, left, emit, summary: dict, hard_left=None) -> None:
    """2 paper-trial slices at once under MPS for each of ``args.trials_surrogates`` in turn, then one of the
    first alone (no MPS), then (with --trials-no-mps) 2 of the first at once without MPS, each ``cem-bench
    train`` in a process of its own; each result goes into ``summary["trials"]`` and then out as its row, as it
    ends. ``left``: seconds to the budget's end; ``hard_left``: to where the caller's `timeout` ends this (the
    budget's end if None), which only the pair that completes the grid's line may run into."""
    import tempfile

    hard_left = hard_left or left
    epochs = args.trials_epochs or (10 if cuda else 3)
    first, *others = args.trials_surrogates

    def h100_s(k: int, surrogate: str) -> float:
        return TRIALS_EST_ATTENTION_PAIR_S if k > 1 and surrogate != "gmm" else TRIALS_EST_S[k]

    def est(k: int, surrogate: str) -> float:
        """The seconds a run is started on: the H100 estimate with a tenth to spare (a run killed at its
        timeout returns nothing to extrapolate from); on the CPU (the dry run) any time left."""
        return 1.1 * h100_s(k, surrogate) if cuda else 1.0

    results = {"alone": None, "packed": [], "epochs": epochs, "surrogate": first}
    summary["trials"] = {"trials": results}
    took: dict[int, float] = {}      # id of a pair's result: its seconds, MPS start and stop included

    def completes_grid(k: int, use_mps, surrogate: str):
        """The ok MPS pair of the other kind (gmm / an attention surrogate) where this pair would give the grid's
        line its second end, else None."""
        if k != 2 or use_mps is not True:
            return None
        ok = [r for r in results["packed"] if r.get("ok") and id(r) in took]
        if any((r.get("surrogate") == "gmm") == (surrogate == "gmm") for r in ok):
            return None
        return ok[0] if ok else None

    # what the grid's GPU-hours need first: a pair of each surrogate at the grid's packing (the grid line needs
    # gmm's and an attention surrogate's; with the lone trial first, a budget 20 % short skipped the attention
    # pair and the grid had no figure). The lone trial (the ratio to one at a time) and the no-MPS comparison
    # only with the time the pairs leave. The first pair also pays the machine's cold start (page cache,
    # cuDNN's first autotuning): its span is, if anything, an overestimate
    plan = [(f"2 at once, MPS{', ' + s if s != first else ''}", 2, True, s) for s in [first, *others]] + \
        [("alone", 1, None, first)] + ([("2 at once, no MPS", 2, False, first)] if args.trials_no_mps else [])
    skipped = False
    cold = True      # the first run this phase starts: it pays the machine's cold start
    for label, k, use_mps, surrogate in plan:
        keys = {**paper.paper_keys(cuda, surrogate=surrogate), "train.epochs": epochs}
        # the no-MPS comparison comes last and only after everything else: not when an earlier run was skipped
        # (its time would have been the check's)
        late = use_mps is False and skipped
        other = completes_grid(k, use_mps, surrogate)
        if other is not None:
            # the grid's line is the run's first aim: this pair is held to its estimate (scaled by the other
            # pair's overrun), not the tenth more, and may run into the caller's reserve up to the hard deadline;
            # skipped only where it cannot finish even so (the alone run and the check would then gain nothing)
            scale = min(max(took[id(other)] / h100_s(2, other["surrogate"]), 1.0), GRID_PAIR_SCALE_CAP)
            need = h100_s(k, surrogate) * scale if cuda else 1.0
            if hard_left() - HARD_MARGIN_S < need:
                emit("skipped", phase=f"trials {label}", left=left(), hard_left=hard_left(),
                     message=f"needs {need:.0f} s ({scale:.2f}x its estimate, as the other pair ran), "
                             f"{hard_left() - HARD_MARGIN_S:.0f} s left before the hard deadline")
                skipped = True
                continue
            run_left = hard_left
        elif left() < est(k, surrogate) or late:
            emit("skipped", phase=f"trials {label}", left=left())
            skipped = True
            continue
        else:
            run_left = left
        # where MPS could not start on the card, the first surrogate's MPS pair already ran without it: the no-MPS
        # pair would measure the same again. The CPU dry run (MPS never wanted there) runs it, to run every path
        same = next((r for r in results["packed"] if r.get("surrogate") == first and r.get("ok")
                     and r.get("mps") not in mps.ON_STATES), None) if use_mps is False and cuda else None
        if same is not None:
            emit("skipped", phase=f"trials {label}", left=left(),
                 message=f"'{same['label']}' already ran 2 at once without MPS (MPS {same['mps']})")
            continue
        if use_mps is not True and mps.running():   # these processes would be MPS clients: not what is asked
            emit("error", phase=f"trials {label}", message=f"an MPS control daemon is running ({mps.pipe_dir()})")
            continue
        before, r = left(), None
        try:
            with (mps.Session("auto", 0.5, cuda, log=lambda m: emit("mps", message=m)) if use_mps
                  else contextlib.nullcontext()) as session:
                state = session.state if session is not None else "off"
                margin = HARD_MARGIN_S if run_left is hard_left else 5.0
                with tempfile.TemporaryDirectory(prefix="cem-bench-trials-") as tmp:
                    r = paper.measure(k, keys, tmp, timeout=max(30.0, run_left() - margin), epochs_done=epochs,
                                      threads=2 if cuda else 1)
                if use_mps and state not in mps.ON_STATES:
                    label = f"{label} (MPS {state})"     # a pair that ran without MPS says so in its every line
                r.update({"label": label, "mps": state, "epochs": epochs, "surrogate": surrogate})
                if cold:
                    r["cold"] = True
                if k == 1:
                    results["alone"] = r
                else:
                    results["packed"].append(r)
                # out before the MPS diagnostic and the daemon's stop: either may hang on a wedged daemon,
                # and the pair is measured whatever they say
                emit("trials", **{**r, "runs": [{**x, "log": x["log"][-400:]} for x in r["runs"]]})
                if use_mps and state != "off":   # read after the pair ended: a server it left, if any
                    emit("mps", label=label, message=f"servers after the pair: {mps.servers()}")
        except Exception:  # noqa: BLE001
            emit("error", phase=f"trials {label}", traceback=traceback.format_exc()[-2000:])
        cold = False
        if r is not None and k == 2 and use_mps is True:
            took[id(r)] = before - left()       # on the caller's clock: MPS's start and stop are the pair's too


COLD_NOTE = (" (this pair ran first, on a cold machine: its span includes the cold start (page cache, cuDNN's "
             "first autotuning) that the lone trial after it did not pay, so the ratio understates packing's gain)")


def without_mps(packed: list[dict]) -> str:
    """Which of the pairs ``paper.grid_lines`` uses (the first ok one of each surrogate) ran without MPS, and
    why, e.g. "attention_centroid's pair (MPS not started)"."""
    used: dict = {}
    for r in packed:
        if r.get("ok"):
            used.setdefault(r.get("surrogate"), r)
    return ", ".join(f"{s}'s pair (MPS {str(r.get('mps')).split(':')[0]})" for s, r in used.items()
                     if r.get("mps") not in mps.ON_STATES)


def write_summary(out, env, summary, echo: bool = True) -> None:
    """``summary.md`` in ``out`` from what ``summary`` holds so far (written whole and then renamed over the
    last one: a run ended while writing leaves the previous summary, never half of one)."""
    lines = [f"# Packing on {env['device']} (torch {env['torch']}, commit {env['commit'][:10]})", ""]
    for phase, s in summary.items():
        if "trials" in s:
            t = s["trials"]
            first = t["alone"] or (t["packed"][0] if t["packed"] else None)
            if first is None:
                continue
            counts = paper.grid_trials()
            on = [r for r in t["packed"] if r.get("mps") in mps.ON_STATES]
            # where MPS did not start, the pairs that ran without it give the grid's cost, said so; where it
            # started for one pair and not the other, neither subset holds both ends: all of them, saying which
            grid = paper.grid_lines(on, counts) or paper.grid_lines(
                [r for r in t["packed"] if r.get("mps") not in mps.ON_STATES], counts, how="without MPS") or \
                paper.grid_lines(t["packed"], counts, how=f"partly without MPS: {without_mps(t['packed'])}")
            measured = paper.summary_lines(t["alone"], t["packed"])
            for r in t["packed"]:
                if r.get("cold"):       # the ratio's pair paid the cold start that the lone trial after it did not
                    measured = [line + COLD_NOTE if line.startswith(f"- {r['label']}:") and
                                line.endswith("x one at a time") else line for line in measured]
            lines += [f"## whole paper trials (slices of {t.get('epochs', first.get('epochs'))} epochs with both "
                      f"attacks, extrapolated to {paper.PAPER_EPOCHS}; {t.get('surrogate', first.get('surrogate'))} "
                      f"unless named; evaluation and start-up included)",
                      *measured, *grid, ""]
            continue
        top = s["ceiling"]
        if top is None:
            a = s["attack"] or {"rows": s["rows"]}
            lines.append(f"## {phase}: " + (f"alone {a['alone_s']:.1f} s, 2 together {a['together_s']:.1f} s: "
                                            f"factor {a['factor_k2']:.2f}" if "alone_s" in a else str(a)))
            continue
        lines.append(f"## {phase}: ceiling {top['images_per_s']:,.0f} images/s (batch {top['batch']}; "
                     f"{', '.join(f'{b}: {v:,.0f}' for b, v in top['by_batch'].items())})")
        for r in s["rows"]:
            what = f"k={r['k']}" if "k" in r else r["name"]   # a phase's own row (MPS not started, workers failed)
            lines.append(f"- {what}: {r['value'] if r['value'] is None else round(r['value'], 1)} "
                         f"trials/h; {r.get('error') or ''} {r['note']}")
        if s["attack"]:
            a = s["attack"]
            k2 = next((r for r in s["rows"] if r.get("k") == 2 and r.get("images_per_s")), None)
            lines.append(f"- attacks: alone {a['alone_s']:.1f} s, 2 together {a['together_s']:.1f} s: "
                         f"factor {a['factor_k2']:.2f}")
            if k2:
                whole = pack.whole_trials_per_hour(k2["images_per_s"], PAPER_ATTACKS_ALONE_S, a["factor_k2"])
                # training and attacks only: a trial's evaluation and start-up (336 - 233 - 66.5 ≈ 36 s alone on
                # the H100, docs/performance.md) are not measured packed, so the grid's cost adds them as a bound
                lines.append(f"- the grid's packing (k=2, no MPS): {whole:.1f} paper trials per GPU-hour of training "
                             f"and attacks (evaluation and start-up not included); 165 trials: {165 / whole:.1f} "
                             f"GPU-hours plus at most 165 x 36 s = 1.7")
        lines.append("")
    path = os.path.join(out, "summary.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(path + ".tmp", path)
    if echo:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
