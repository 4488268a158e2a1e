"""Run a search: start or join Ray, build the Tuner (or restore it), run it, summarise the trials.

``run_search`` does the work; ``search_command`` is ``cem-bench search`` without the report, which the CLI
builds afterwards (searching and drawing stay apart).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..errors import SearchError, StorageFull
from ..integrity import read_table, write_recorded_json
from ..schema import RESUME_STATE_FILE, SCHEDULER_FILE, SPACE_FILE
from ..storage import exists, filesystem, is_uri, join, jsonable, nearest_existing, resolve_storage
from .resume import repair_experiment_state
from .trainable import DIE_ENV, make_trainable, trial_resources, with_resources


def _detect_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def progress_table(spec):
    """Tune's live table: the objectives first, then the epoch, then the searched keys (which tell the
    rows apart: surrogate, lambda, ...)."""
    from ray.tune import CLIReporter
    metrics = list(dict.fromkeys([*spec.metric_names, "epoch"]))
    # "role": baseline / confirm (blank for the search's own trials)
    extra = ["role"] if spec.baseline_runs or spec.confirm_runs else []
    return CLIReporter(metric_columns=metrics, parameter_columns=[*extra, *(p.key for p in spec.params)],
                       max_report_frequency=30, max_column_length=24)


def run_search(spec, storage: str | None = None, address: str | None = None, resume: bool = False,
               stats: dict | None = None, trust_pickled_state: bool = False) -> str:
    """Run (or with ``resume`` continue) the search of ``spec``; return the experiment path.

    Local mode (no ``address``) starts Ray on this machine (``ray.init``, no dashboard) unless a Ray
    session is already initialised in this process, in which case that one is used (tests). Cluster
    mode connects with ``ray.init(address=...)``. ``trust_pickled_state`` lets ``--resume`` read a resume
    bundle that an older cem-bench wrote as a pickle. ``stats`` (a dict), when given, receives timings:
    ``ray_start_s``, ``trials_s``, ``trials_ok``, ``trials_error``, ``mode``.
    """
    import ray
    from ray import tune

    stats = stats if stats is not None else {}
    storage = resolve_storage(storage)
    exp_path = join(storage, spec.name)
    check_storage(storage)
    from .diskspace import StorageGuard, full_message, is_enospc, one_line_when_full, warn_if_short
    warning = warn_if_short(spec, storage)
    if warning:
        print(warning, flush=True)
    guard = StorageGuard(storage)
    if exists(exp_path) and not resume:
        raise SearchError(f"the experiment folder {exp_path} already exists; continue it with --resume or "
                          f"start a new experiment with --name NEW_NAME (nothing was changed)")
    if resume and not exists(join(exp_path, "tuner.pkl")):
        raise SearchError(f"--resume: {exp_path} holds no Ray Tune experiment to continue "
                          f"({'missing' if not exists(exp_path) else 'no tuner.pkl in'} the folder); "
                          f"drop --resume to start it")

    t0 = time.perf_counter()
    started_ray = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=True)
            stats["mode"] = f"cluster ({address})"
        else:
            # address="local": always a new instance on this machine, even if `ray start` runs here
            ray.init(address="local", num_gpus=_detect_gpus(), include_dashboard=False, log_to_driver=True)
            stats["mode"] = "local"
        started_ray = True
    else:
        stats["mode"] = "existing Ray session"
    stats["ray_start_s"] = time.perf_counter() - t0
    # CheckpointConfig(num_to_keep=2) makes Tune snapshot the experiment state after every two checkpoints
    # of a trial; with per-epoch checkpoints of short epochs Tune then warns about "excessive" snapshots on
    # every trial. A snapshot takes ~20 ms here, and frequent ones are what --resume continues from.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune's newer console output picks the first four numbers a trial reports and no searched parameter;
    # its classic table takes the columns it is given (progress_table), so the search uses that one.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    try:
        gpus = None if address else float(ray.cluster_resources().get("GPU", 0.0))
        resources, note = trial_resources(spec.resources, gpus)
        if note:
            print(note, flush=True)
        die_env = os.environ.get(DIE_ENV)
        die_at = int(die_env) if die_env else None
        trainable = with_resources(make_trainable(exp_path, spec, resources, die_at), resources)
        from .searcher import JOURNAL_TARGET, SNAPSHOT_TARGET, journal_target, make_searcher
        JOURNAL_TARGET[spec.name] = journal_target(exp_path, spec.name)
        SNAPSHOT_TARGET[spec.name] = join(exp_path, RESUME_STATE_FILE)
        if spec.scheduler:   # a restored scheduler is the pickled one of the first driver: it reads its file
            from .moasha import STATE_TARGET
            STATE_TARGET[spec.name] = join(exp_path, SCHEDULER_FILE)

        t1 = time.perf_counter()
        if resume:
            if not tune.Tuner.can_restore(exp_path):
                raise SearchError(f"--resume: Ray cannot restore {exp_path}")
            if exists(join(exp_path, SPACE_FILE)):
                _warn_if_changed(spec, join(exp_path, SPACE_FILE))
            for line in repair_experiment_state(exp_path, trust_pickle=trust_pickled_state):
                print(f"--resume: {line}", flush=True)
            print(f"resuming {exp_path}", flush=True)
            tuner = tune.Tuner.restore(exp_path, trainable=trainable, resume_unfinished=True, resume_errored=True)
            # a restored RunConfig keeps its callbacks and stopper only as pickled; the guard is this driver's
            tuner._local_tuner._run_config.callbacks = [guard]
            tuner._local_tuner._run_config.stop = guard
        else:
            write_recorded_json(exp_path, SPACE_FILE, spec.to_dict())
            scheduler = None
            if spec.scheduler:
                from .moasha import MOASHA
                from .rungs import RungRanker
                scheduler = MOASHA(RungRanker(spec.fixed["train.epochs"], spec.scheduler["grace_epochs"],
                                              spec.scheduler["reduction_factor"], spec.rung_objectives),
                                   time_attr="epoch", state_key=spec.name)
            tuner = tune.Tuner(
                trainable,
                param_space={},
                tune_config=tune.TuneConfig(
                    search_alg=make_searcher(spec, exp_path),
                    # the baseline, every configuration once per seed, the confirmation (the searcher ends
                    # early when there are fewer configurations to confirm)
                    num_samples=spec.total_runs,
                    max_concurrent_trials=None,  # the ConcurrencyLimiter inside the search algorithm
                    scheduler=scheduler,         # None: FIFO, every trial to the end
                    reuse_actors=True,
                ),
                run_config=tune.RunConfig(
                    name=spec.name,
                    storage_path=storage,
                    failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                    progress_reporter=progress_table(spec),
                    verbose=1,
                    callbacks=[guard],
                    stop=guard,
                ),
            )
        try:
            with one_line_when_full(guard):
                grid = tuner.fit()
        except Exception as e:  # noqa: BLE001 - Ray's own failure on a full disk is a traceback of its files
            if guard.full or is_enospc(e):
                raise StorageFull(full_message(storage)) from e
            raise
        if guard.full:
            raise StorageFull(full_message(storage, f"trial {guard.full} ran out of space"))
        stats["trials_s"] = time.perf_counter() - t1
        ok = err = stopped = 0
        for r in grid:
            m = r.metrics or {}
            if r.error is None and m.get("status") == "ok":
                ok += 1
            elif r.error is None and m.get("status") == "running":   # stopped by the scheduler at a rung
                stopped += 1
            else:
                err += 1
        stats["trials_ok"], stats["trials_error"], stats["trials_stopped"] = ok, err, stopped
    finally:
        from .searcher import JOURNAL_TARGET, SNAPSHOT_TARGET
        JOURNAL_TARGET.pop(spec.name, None)
        SNAPSHOT_TARGET.pop(spec.name, None)
        if spec.scheduler:
            from .moasha import STATE_TARGET
            STATE_TARGET.pop(spec.name, None)
        if started_ray:
            ray.shutdown()
    return exp_path


def check_storage(storage: str) -> None:
    """SearchError unless ``storage`` is a folder (or can become one): nothing is started or written."""
    if is_uri(storage) and not storage.startswith("file://"):
        return
    path = nearest_existing(storage)
    if not os.path.isdir(path):
        raise SearchError(f"--storage {storage}: {path} is a file, not a folder; give a folder (it is created "
                          f"when missing) or an s3:// / gs:// URI")


def _warn_if_changed(spec, path: str) -> None:
    try:
        fs, p = filesystem(path)
        with fs.open_input_stream(p) as fh:
            saved = json.loads(fh.read().decode())
    except Exception:  # noqa: BLE001
        return
    now = jsonable(spec.to_dict())
    diff = [k for k in now if k != "path" and saved.get(k) != now[k]]
    if diff:
        print(f"note: the space differs from the experiment's search_space.json in {', '.join(diff)}; the "
              f"restored experiment keeps its own sampler, budget and parameters (new resources apply)",
              flush=True)


# ---------------------------------------------------------------------------------------------- CLI
def overrides_from_args(args) -> dict:
    from ..config import parse_set
    ov: dict[str, Any] = {}
    if getattr(args, "name", None):
        ov["name"] = args.name
    for attr, key in (("num_samples", "num_samples"), ("max_concurrent", "max_concurrent"),
                      ("gpus_per_trial", "resources.gpu"), ("cpus_per_trial", "resources.cpu")):
        v = getattr(args, attr, None)
        if v is not None:
            ov[key] = v
    fixed = parse_set(getattr(args, "set", None) or [])
    if fixed:
        ov["fixed"] = fixed
    return ov


def plan(spec) -> str:
    """The trials a search will run, in words: "17 trials: 3 λ=0 baseline runs (seeds 0, 1, 2), 8
    configurations x 1 seed, then the best 2 again with seeds 3, 4"."""
    parts = []
    if spec.baseline_runs:
        cells = len(spec.baseline_cells)
        parts.append(f"{spec.baseline_runs} λ=0 baseline runs ({f'{cells} cells x ' if cells > 1 else ''}seeds "
                     f"{', '.join(map(str, spec.baseline_seeds))})")
    parts.append(f"{spec.num_samples} configurations x {spec.replicates} seed{'s' * (spec.replicates != 1)}")
    if spec.confirm_runs:
        parts.append(f"then the best {spec.confirm_top} again with seeds {', '.join(map(str, spec.confirm_seeds))}")
    if spec.scheduler:
        parts.append(f"a search trial may stop at epochs {', '.join(map(str, spec.rungs))} (moasha, keeps 1/"
                     f"{spec.scheduler['reduction_factor']:g} of each rung)")
    total = spec.total_runs
    return f"{total} trials{' at most' if spec.confirm_runs else ''}: " + ", ".join(parts)


def search_command(args) -> dict:
    """``cem-bench search`` without the report: validate, search, write the tables, print what was done.

    Returns ``{"experiment", "name", "trials", "epochs", "ok", "error", "stats", "seconds"}``; the CLI
    builds the report from it."""
    from ..spaces import load_space
    t_all = time.perf_counter()
    if getattr(args, "trust_pickled_state", False) and not args.resume:
        raise SearchError("--trust-pickled-state only applies to --resume (it reads an old experiment's pickled "
                          "resume bundle)")
    spec = load_space(args.space, overrides_from_args(args))  # SpaceError -> the CLI prints it, exit 2
    stats: dict[str, Any] = {}
    print(f"cem-bench search: {spec.name}: {plan(spec)}, {spec.max_concurrent} at a time, "
          f"objectives {', '.join(f'{o.metric} ({o.mode})' for o in spec.objectives)}", flush=True)
    from .. import mps
    # MPS on this machine for a local search whose trials share a GPU (a cluster starts it in cluster.yaml)
    mode = (getattr(args, "mps", None) or "auto") if args.address is None else "off"
    with mps.Session(mode, float(spec.resources.get("gpu", 0)), mode != "off" and _detect_gpus() > 0):
        exp = run_search(spec, storage=args.storage, address=args.address, resume=bool(args.resume),
                         stats=stats, trust_pickled_state=bool(getattr(args, "trust_pickled_state", False)))

    t_write = time.perf_counter()
    from .. import results
    trials_path, epochs_path = results.write_tables(exp)
    stats["write_s"] = time.perf_counter() - t_write

    if is_uri(str(trials_path)):
        n_ok, n_err, n_stop = stats.get("trials_ok", 0), stats.get("trials_error", 0), stats.get("trials_stopped", 0)
    else:
        df = read_table(exp, os.path.basename(str(trials_path)), "trials")
        n_stop = int((df["status"] == "stopped").sum())
        n_ok, n_err = int((df["status"] == "ok").sum()), int((df["status"] != "ok").sum()) - n_stop
    print(f"experiment: {exp}")
    print(f"trials: {trials_path}")
    print(f"epochs: {epochs_path}")
    return {"experiment": exp, "name": spec.name, "trials": trials_path, "epochs": epochs_path, "ok": n_ok,
            "error": n_err, "stopped": n_stop, "stats": stats, "seconds": time.perf_counter() - t_all}
