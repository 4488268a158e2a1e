"""Row group ``ray``: the cost of running a trial under Ray Tune. A trial through the search's trainable
(``search.run_search`` on a running local Ray session) against the same trial by ``run_trial`` directly,
alternated; target: Tune/direct <= 1.15 (overhead <= 15 %), checked only on a demo-size trial (the full
mode), not on the tiny trial of ``--quick``. Ray's start-up (``ray.init``, local) is a row of its own.

``import ray`` stays inside ``bench_ray``: a machine without Ray (the GPU machine) still runs every other
row, and this one becomes an error row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import statistics
import tempfile
import time

import torch

from ..schema import RESULT_FILE
from .harness import TINY_TRIAL, Sizes, make_row, row

TARGET_RAY = ("le", 1.15)  # trial wall under Tune / direct wall, i.e. overhead <= 15 %
RAY_TRIALS_PER_SEARCH = 2  # the first trial of a search starts the worker process, the next reuses it


@row("ray", "Ray Tune trial", order=50)
def bench_ray(device: torch.device, sizes: Sizes) -> list[dict]:
    """``run_trial`` directly against the same trial through the search's trainable under Ray Tune.

    One local Ray session (its start-up is a row of its own); then, alternately, a direct ``run_trial`` and
    a search of two trials of the same config on that session, run as a search runs them (one at a time
    here: the second trial reuses the first one's worker process, as trials do in every search). The
    alternation makes load from other processes, and the speed drift of a shared machine, fall on both
    alike. A Tune trial's time is the search's ``Tuner.fit()`` wall time divided by two: Tune's set-up, the
    worker process (a fresh Python process: imports and first-run initialisation, paid once per two
    trials here, once per ``num_samples / max_concurrent`` trials in a real search), per-epoch checkpoints,
    result files and bookkeeping, and the trials themselves."""
    import ray

    from .. import search, spaces
    from ..core.trial import run_trial

    flat = dict(sizes.ray_trial, **{"train.device": device.type})
    n = sizes.ray_trials
    per = RAY_TRIALS_PER_SEARCH
    cpus = max(1, torch.get_num_threads())  # the worker gets as many threads as the direct runs
    cuda = device.type == "cuda"

    def spec_for(i: int):
        # every Tune trial runs ``flat`` with seed 0 (a one-value choice: a space needs a searched key)
        spec = spaces.parse_space({
            "name": f"bench-ray-{os.getpid()}-{i}",
            "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.0},
                           {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
            "sampler": {"name": "random", "seed": 0}, "num_samples": 1, "max_concurrent": 1,
            "max_failures": 0, "resources": {"cpu": cpus, "gpu": 1 if cuda else 0}, "fixed": flat,
            "params": {"seed": {"choice": [0]}}, "baseline": False, "confirm": False})   # only the timed trials
        # the same trial ``per`` times on purpose (the bench times repeats of one trial); a space may not ask
        # for that (a repeat is not a replicate), so the count is set past the parser
        return dataclasses.replace(spec, num_samples=per)

    spec_for(0)  # before any work: a bad spec is an error row at once
    direct_flat = dict(flat, seed=0)
    # warm-up (a tiny trial: the same code paths): imports, allocator and kernel caches, so that the direct
    # figure is a trial in a warm process; the Tune worker is a fresh process and pays these itself
    run_trial(dict(TINY_TRIAL, **{"train.device": device.type, "train.epochs": 1, "cem.warmup_epochs": 0}))

    if ray.is_initialized():
        raise RuntimeError("a Ray session is already initialised in this process; the bench starts its own")
    log = io.StringIO()
    direct: list[float] = []
    tune_s: list[float] = []
    inner: list[float] = []
    # Ray starts its workers at nice 15 (RAY_worker_niceness): on a machine shared with other busy processes
    # the trial then gets less CPU than the direct run, which is not Ray's overhead; run them at our priority
    nice_key = "RAY_worker_niceness"
    nice_env = os.environ.get(nice_key)
    worker_nice = nice_env if nice_env is not None else str(os.nice(0))
    os.environ[nice_key] = worker_nice
    t0 = time.perf_counter()
    try:
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                # as search.run_search starts a local session (address="local": a new instance on this machine)
                ray.init(address="local", num_gpus=torch.cuda.device_count() if cuda else 0,
                         include_dashboard=False, log_to_driver=True)
        finally:
            if nice_env is None:
                os.environ.pop(nice_key, None)
            else:
                os.environ[nice_key] = nice_env
        start_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory(prefix="cem-bench-ray-") as tmp:
            for i in range(n):
                t0 = time.perf_counter()
                run_trial(direct_flat)
                direct.append(time.perf_counter() - t0)
                stats: dict = {}
                try:
                    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                        exp = search.run_search(spec_for(i), storage=tmp, stats=stats)
                except Exception as e:
                    tail = " | ".join(log.getvalue().strip().splitlines()[-3:])
                    raise RuntimeError(f"{type(e).__name__}: {e}" + (f" (log: {tail})" if tail else "")) from e
                if stats.get("trials_ok", 0) != per:
                    tail = " | ".join(log.getvalue().strip().splitlines()[-3:])
                    raise RuntimeError(f"the Ray Tune trials did not all finish ok ({stats}; log: {tail})")
                tune_s.append(stats["trials_s"] / per)
                for root, _, files in os.walk(exp):
                    if RESULT_FILE in files:
                        with open(os.path.join(root, RESULT_FILE)) as fh:
                            res = json.load(fh)
                        if res.get("wall_s") is not None:
                            inner.append(float(res["wall_s"]))
    finally:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            ray.shutdown()
    per_trial, d = statistics.median(tune_s), statistics.median(direct)
    w = statistics.median(inner) if inner else float("nan")
    kind = sizes.ray_kind
    note = (f"{kind} trial ({_describe_trial(flat)}); {n} x (direct run_trial, then a search of {per} trials "
            f"on the same Ray session, the second reusing the first's worker process), {cpus} CPU(s) per "
            f"trial, workers at nice {worker_nice} (Ray's default 15 only matters against other busy "
            f"processes); overhead {per_trial - d:+.2f} s/trial = {w - d:+.2f} s for run_trial in the worker "
            f"(median {w:.2f} s there) and {per_trial - w:.2f} s outside run_trial (Tune and searcher set-up, "
            f"worker start and imports once per search, per-epoch checkpoints, result files)")
    trial_row = make_row(f"Ray Tune trial vs direct ({kind})", per_trial, "s/trial", d, "run_trial direct",
                         per_trial / d, "Tune/direct", TARGET_RAY, note=note, samples=tune_s,
                         baseline_samples=direct, overhead=per_trial / d - 1.0, overhead_s=per_trial - d,
                         inner_samples=inner)
    if kind == "tiny":  # the target is a fraction of a demo-size trial; a tiny trial cannot be checked against it
        trial_row["met"] = None
        trial_row["note"] += ("; target not checked: it is stated for a demo-size trial, measured by "
                              "`cem-bench bench` without --quick")
    return [make_row("Ray start-up (ray.init, local)", start_s, "s",
                     note="a local session, as `cem-bench search` starts it; paid once per search, not per trial"),
            trial_row]


def _describe_trial(flat: dict) -> str:
    keys = (("model.width", "width"), ("data.train_size", "train"), ("data.test_size", "test"),
            ("train.epochs", "epochs"), ("attack.epochs", "attack epochs"))
    return ", ".join(f"{label} {flat[k]:g}" for k, label in keys if k in flat)
