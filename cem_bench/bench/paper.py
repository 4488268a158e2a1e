"""The paper trial (``search_spaces/cifar10_paper.yaml``) as ``cem-bench train`` runs it, alone and k at once on
one card: what the grid really costs in GPU-hours at its own packing (``resources: {cpu: 2, gpu: 0.5}``).

The training windows of ``pack.py`` measure only steps and refits, and its attack workers a scaled-down decoder;
a whole trial also starts a process, builds its data and model, captures its graphs, evaluates every epoch and
runs both attacks at full size. Here each trial is the real command on synthetic data of CIFAR-10's size, a
slice of ``epochs`` epochs with both attacks at full size, and the whole 240-epoch trial is extrapolated: the
slice's wall time plus the missing epochs at the median of its epochs after the first two (capture, cuDNN's
autotuning, CEM's start). For k trials started together the k slices' span (first start to last end) plus the
missing epochs at the k trials' median epoch (they train together) is the GPU time of k whole trials.

The grid trains gmm in 30 of its 165 trials and the four attention surrogates in 120, whose steps cost up to
1.5x gmm's: a pair of another surrogate (``surrogate=``) measures one of them packed, and ``grid_lines`` brackets
the grid between every trial at gmm's cost and every attention trial at that surrogate's.

What this leaves out (docs/performance.md "The paper grid"): the grid's trials do not start together, so one
trial's attacks may overlap the other's training rather than the other's attacks; Ray's own start-up of a trial.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from .pack import PAPER_EPOCHS  # the paper trial's 240 epochs (run_exp.sh): one constant for both

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository
STEADY_FROM = 2             # epochs after the first two: capture, autotuning and CEM's start are behind


def paper_space_path(root: str | None = None) -> str:
    return os.path.join(root or ROOT, "search_spaces", "cifar10_paper.yaml")


def paper_keys(cuda: bool, device: str | None = None, root: str | None = None, surrogate: str = "gmm") -> dict:
    """The fixed keys of ``search_spaces/cifar10_paper.yaml`` on synthetic data of CIFAR-10's size (tiny on the
    CPU), ``surrogate`` at lambda = 16, sigma 0.05, the attacks always run (the utility gate off): the paper
    trial."""
    import yaml
    with open(paper_space_path(root)) as f:
        keys = dict(yaml.safe_load(f)["fixed"])
    keys.update({"data.dataset": "synthetic", "data.train_size": 50000 if cuda else 256,
                 "data.test_size": 10000 if cuda else 64, "cem.surrogate": surrogate, "cem.lambd": 16,
                 "defense.noise_std": 0.05, "train.device": device or ("cuda" if cuda else "cpu"),
                 "attack.min_accuracy_margin": -1,
                 "attack.batch_size": 256})   # CIFAR's decoder batch, set: synthetic stands in for CIFAR here
    if not cuda:
        keys.update({"model.width": 0.125, "attack.epochs": 1, "attack.blocks": 1, "attack.channels": 8,
                     "attack.rmle_iterations": 3})
    return keys


def train_args(keys: dict, out_dir: str) -> list[str]:
    """``cem-bench train`` arguments for ``keys`` (lists and booleans as JSON, as ``--set`` reads them)."""
    args = ["train", "--out", out_dir]
    for k, v in keys.items():
        args += ["--set", f"{k}={json.dumps(v) if isinstance(v, (list, bool)) else v}"]
    return args


def epoch_seconds(log_text: str) -> list[float]:
    """Each epoch's ``epoch_s`` as ``cem-bench train`` prints it."""
    return [float(m) for m in re.findall(r"epoch_s=([0-9.]+)", log_text)]


def steady_epoch_s(epoch_lists: list[list[float]]) -> float | None:
    """The median epoch of one or more trials after their first ``STEADY_FROM`` (all of them if that is all)."""
    steady = [e for lst in epoch_lists for e in (lst[STEADY_FROM:] or lst)]
    return statistics.median(steady) if steady else None


def whole_trials_s(span_s: float, epochs_done: int, epoch_s: float, epochs: int = PAPER_EPOCHS) -> float:
    """GPU-seconds of k whole trials that ran ``epochs_done`` epochs together in ``span_s`` (their slices with the
    attacks, first start to last end) and train the rest together at ``epoch_s`` an epoch each."""
    return span_s + max(0, epochs - epochs_done) * epoch_s


def run_together(keys: list[dict], out_root: str, timeout: float, threads: int = 2) -> list[dict]:
    """``cem-bench train`` once per entry of ``keys``, all started at once, each in a process of its own with
    ``threads`` CPU threads (as Ray runs a trial of ``resources: {cpu: 2}``: OMP_NUM_THREADS 2); per process:
    ``rc`` (124: killed at ``timeout``; 125: killed when another failed), ``start``/``end`` on the monotonic
    clock, ``epoch_s``, its metrics (``train_s``, ``attack_s``, ...), ``log`` (the output's tail). The trial
    folders (checkpoints, images) are removed after reading."""
    import shutil
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}
    procs = []
    try:
        for i, k in enumerate(keys):
            out_dir = os.path.join(out_root, f"trial{i}")
            log = tempfile.TemporaryFile()
            procs.append((subprocess.Popen([sys.executable, "-m", "cem_bench.cli", *train_args(k, out_dir)],
                                           env=env, stdout=log, stderr=subprocess.STDOUT), log, out_dir,
                          time.monotonic()))
        deadline = time.monotonic() + timeout
        ends: dict[int, float] = {}
        failed = False
        while len(ends) < len(procs) and not failed:   # each end read as it happens (polled), not in turn
            for i, (p, *_rest) in enumerate(procs):
                if i not in ends and p.poll() is not None:
                    ends[i] = time.monotonic()
                    # one that failed spoils the packing: the rest stop now rather than spend a lent card's minutes
                    failed = failed or p.returncode != 0
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        out = []
        for i, (p, log, out_dir, t0) in enumerate(procs):
            if i in ends:
                rc, end = p.returncode, ends[i]
            else:                              # past the timeout (124), or stopped after another failed (125): no end
                p.kill()
                p.wait()
                rc, end = 125 if failed else 124, None
            log.seek(0)
            text = log.read().decode(errors="replace")
            res = {"rc": rc, "start": t0, "end": end, "epoch_s": epoch_seconds(text), "log": text[-3000:]}
            metrics = os.path.join(out_dir, "metrics.json")
            if os.path.exists(metrics):
                with open(metrics) as f:
                    m = json.load(f)
                res.update({k: m.get(k) for k in ("test_acc", "attack_ssim", "attack_ssim__decoder",
                                                  "attack_ssim__rmle", "train_s", "attack_s", "attack_s__decoder",
                                                  "attack_s__rmle", "wall_s", "epochs_done")})
            shutil.rmtree(out_dir, ignore_errors=True)
            out.append(res)
        return out
    finally:
        # an exception on the way (SystemExit from a SIGTERM handler, KeyboardInterrupt) must not leave the
        # trials running: they outlived the caller, spent the card's time and recreated trial<i>/ inside the
        # caller's temporary folder after it had been removed
        _end_all([p for p, *_rest in procs])
        for _p, log, *_rest in procs:
            log.close()


def _end_all(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Every process of ``procs`` still running is asked to end (SIGTERM), killed after ``grace_s``, and
    waited for: none is left running or unreaped when this returns."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def measure(k: int, keys: dict, out_root: str, timeout: float, epochs_done: int, threads: int = 2) -> dict:
    """k copies of the trial ``keys`` at once (seeds apart); the span, each process, the median steady epoch and
    the GPU-seconds of one whole trial at this packing (``trial_gpu_s`` = whole_trials_s / k)."""
    runs = run_together([{**keys, "seed": keys.get("seed", 0) + i} for i in range(k)], out_root, timeout, threads)
    # a run that printed no epoch has nothing to extrapolate from (its output not what epoch_seconds reads)
    ok = all(r["rc"] == 0 and r["end"] is not None and r["epoch_s"] for r in runs)
    res = {"k": k, "ok": ok, "runs": runs}
    if ok:
        span = max(r["end"] for r in runs) - min(r["start"] for r in runs)
        e = steady_epoch_s([r["epoch_s"] for r in runs])
        res.update({"span_s": span, "steady_epoch_s": e,
                    "trial_gpu_s": whole_trials_s(span, epochs_done, e) / k})
    return res


def grid_trials(root: str | None = None) -> dict[str, int]:
    """The paper grid's trials by what they train, read from ``cifar10_paper.yaml`` itself: ``lambda=0`` (no
    surrogate) or the surrogate's name, each cell times its seeds."""
    from ..spaces import load_space
    from ..spaces.sampling import grid_cells
    spec = load_space(paper_space_path(root))
    counts: dict[str, int] = {}
    for cell in grid_cells(spec.params):
        lambd = cell.get("cem.lambd", spec.fixed.get("cem.lambd"))
        what = "lambda=0" if not lambd else cell.get("cem.surrogate", spec.fixed.get("cem.surrogate"))
        counts[what] = counts.get(what, 0) + len(spec.seeds)
    return counts


def grid_lines(packed: list[dict], counts: dict[str, int], how: str = "") -> list[str]:
    """The grid's GPU-hours at its own packing from whole trials measured packed per surrogate (each result's
    ``surrogate``, the first ok one of each): every trial at gmm's cost, and every trial at its own surrogate's
    where that was measured, at an attention surrogate's where not (the measured one with the dearest trial;
    lambda = 0 at gmm's, whose step is 3-5 % dearer). Nothing when gmm or no attention surrogate was measured.
    ``how``: how the pairs shared the card, said after "packed as measured" (e.g. "without MPS")."""
    per = {}
    for r in packed:
        if r.get("ok") and r.get("surrogate") not in per:
            per[r.get("surrogate")] = r["trial_gpu_s"]
    attention = {s: v for s, v in per.items() if s not in ("gmm", None)}
    if "gmm" not in per or not attention:
        return []
    total = sum(counts.values())
    dearest = max(attention, key=attention.get)
    low = total * per["gmm"] / 3600
    cost = {w: per.get(w, per["gmm"] if w in ("lambda=0", "gmm") else attention[dearest]) for w in counts}
    high = sum(n * cost[w] for w, n in counts.items()) / 3600
    unmeasured = sorted(w for w in counts if w not in per and w not in ("lambda=0", "gmm"))
    by = ", ".join(f"{w} {n}" for w, n in counts.items())
    packed_as = f"packed as measured{' ' + how if how else ''}"
    return [f"- the grid {packed_as} ({total} trials: {by}): {low:.1f} GPU-hours with every trial at gmm's "
            f"cost; {high:.1f} with each surrogate's own" +
            (f" ({', '.join(unmeasured)} at {dearest}'s, the dearest measured)" if unmeasured else "")]


def summary_lines(alone: dict | None, packed: list[dict]) -> list[str]:
    """Markdown lines: one trial alone and each packing, as whole-trial minutes, trials per GPU-hour and the
    grid's GPU-hours, each packing of the lone trial's surrogate beside it. ``alone`` None: no lone trial was
    measured (the pairs run first, the lone trial only with the time they leave), and no ratio is given."""
    total = sum(grid_trials().values())   # read from cifar10_paper.yaml, as the bracket's counts are
    lines = []
    alone = alone or {}
    for r in [*([alone] if alone else []), *packed]:
        label = r.get("label") or f"k={r.get('k')}"
        if not r.get("ok"):
            bad = next((x for x in r["runs"] if x["rc"] not in (0, 125) or not x.get("epoch_s")), r["runs"][0])
            lines.append(f"- {label}: failed (return codes {[x['rc'] for x in r['runs']]}): {bad['log'][-300:]!r}")
            continue
        per = r["trial_gpu_s"]
        walls = ", ".join(f"{x['end'] - x['start']:.1f}" for x in r["runs"])
        att = ", ".join(f"{x.get('attack_s') or 0:.1f}" for x in r["runs"])
        line = (f"- {label}: slice span {r['span_s']:.1f} s (each process {walls} s; attacks {att} s), steady "
                f"epoch {r['steady_epoch_s']:.2f} s: a whole trial {per / 60:.2f} GPU-min, "
                f"{3600 / per:.1f} trials per GPU-hour, {total} trials {total * per / 3600:.1f} "
                f"GPU-hours")
        # beside the lone trial of its own surrogate only: another's trial costs more for another reason
        if r is not alone and alone.get("ok") and r.get("surrogate") == alone.get("surrogate"):
            line += f"; {alone['trial_gpu_s'] / per:.2f}x one at a time"
        lines.append(line)
    return lines
