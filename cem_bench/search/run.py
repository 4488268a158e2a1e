"""Run a search: start or join Ray, build the Tuner (or restore it), run it, summarise the trials.

``run_search`` does the work; ``search_command`` is ``cem-bench search`` without the report, which the CLI
builds afterwards (searching and drawing stay apart). ``concurrency`` decides how many trials run at once
(the command line, the space, this machine's GPUs and CPUs) and ``banner`` says it, with ``plan``'s count.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any, NamedTuple

from ..errors import ResultsError, SearchError, StorageFull
from ..integrity import write_recorded_json
from ..parsing import loads_json
from ..schema import INTERRUPTED_FILE, RESUME_STATE_FILE, SCHEDULER_FILE, SPACE_FILE
from ..storage import (
    exists,
    filesystem,
    is_remote,
    is_uri,
    join,
    nearest_existing,
    remove_file,
    resolve_storage,
    write_bytes,
)
from . import driver
from .interrupt import Interruption, resume_command
from .lock import check_available, experiment_lock
from .machine import detect_cpus as _detect_cpus  # names of run.py that tests replace
from .machine import detect_gpus as _detect_gpus
from .resume import (
    has_saved_state,
    refuse_a_stopped_start,
    repair_experiment_state,
    restore_removed_checkpoints,
    supersede_tables,
)
from .trainable import make_trainable, trial_resources, with_resources

# ----------------------------------------------------------------------------------- concurrency
RAY_UNITS = 10_000   # Ray counts CPUs and GPUs in fixed point, in units of 1/10000 of one


def trials_that_fit(have: float, per_trial: float) -> int:
    """How many trials asking ``per_trial`` of a resource Ray places in ``have`` of it (its fixed-point
    arithmetic: 1 GPU holds 8 trials of 0.125 and 3 of 0.3)."""
    need = int(round(per_trial * RAY_UNITS))
    if need <= 0:
        raise ValueError(f"per_trial must be > 0; got {per_trial}")
    return int(round(have * RAY_UNITS)) // need


class Concurrency(NamedTuple):
    limit: int     # the searcher's ConcurrencyLimiter: trials started and not finished, at most
    at_once: int   # trials running at the same time (the limit, or fewer where the machine fits fewer)
    why: str       # for the banner: "1 GPU / 0.125 per trial", "max_concurrent in the space", ...


def _plural(n: float, word: str) -> str:
    return f"{n:g} {word}{'s' * (n != 1)}"


def concurrency(space_limit: int, resources: dict, *, cli_limit: int | None = None, cli_gpu: bool = False,
                gpus: float | None = None, cpus: float | None = None) -> Concurrency:
    """How many trials of a search run at once, and why.

    ``space_limit`` is the space's ``max_concurrent``, ``resources`` its per-trial ``{"cpu", "gpu"}`` (after
    the command line's overrides), ``cli_limit`` the ``--max-concurrent`` given (None: not given) and
    ``cli_gpu`` whether ``--gpus-per-trial`` was. ``gpus`` and ``cpus`` are what Ray has on this machine;
    None for a cluster, whose autoscaler adds nodes while trials wait.

    - ``--max-concurrent`` always sets the limit (on one machine Ray still runs only the trials that fit);
    - on a cluster the space's ``max_concurrent`` is the limit;
    - on one machine the trials that fit are ``floor(GPUs / gpu)`` and ``floor(CPUs / cpu)``, the smaller
      (without a GPU the trials run on CPU: the CPUs alone). ``--gpus-per-trial`` fills the machine: the
      limit is what fits, above the space's ``max_concurrent`` too. Otherwise the space's ``max_concurrent``
      is the limit, lowered to what fits (a trial started beyond it would only wait, and the sampler would
      propose it knowing less).

    Raises ``SearchError`` when one trial does not fit this machine's CPUs (Ray would never start it)."""
    cpu = float(resources.get("cpu", 1.0))
    gpu = float(resources.get("gpu", 0.0))
    if gpus is None or cpus is None:
        if cli_limit is not None:
            return Concurrency(cli_limit, cli_limit, "--max-concurrent")
        why = "max_concurrent in the space"
        if cli_gpu:
            why += "; on a cluster --gpus-per-trial packs the GPUs but sets no count: give --max-concurrent"
        return Concurrency(space_limit, space_limit, why)

    by_cpu = trials_that_fit(cpus, cpu)
    if by_cpu < 1:
        raise SearchError(f"resources.cpu is {cpu:g} per trial but Ray has {_plural(cpus, 'CPU')} on this machine, "
                          f"so no trial could start; give --cpus-per-trial {cpus:g} or less")
    on_gpu = gpu > 0 and gpus > 0
    if on_gpu:
        share = min(gpu, gpus)   # more than the machine has is lowered to all of it (trainable.trial_resources)
        by_gpu = trials_that_fit(gpus, share)
        fit = min(by_gpu, by_cpu)
        if by_gpu <= by_cpu:
            reason = f"{_plural(gpus, 'GPU')} / {share:g} per trial"
        else:
            cpus_each = math.floor(cpus / by_gpu * 100) / 100 or math.floor(cpus / by_gpu * RAY_UNITS) / RAY_UNITS
            reason = (f"{_plural(cpus, 'CPU')} / {cpu:g} per trial; the {_plural(gpus, 'GPU')} would take {by_gpu} "
                      f"at {share:g}: --cpus-per-trial {cpus_each:g} fills them")
    else:
        fit = by_cpu
        reason = f"{_plural(cpus, 'CPU')} / {cpu:g} per trial"

    if cli_limit is not None:
        limit, at_once = cli_limit, min(cli_limit, fit)
        why = "--max-concurrent" if cli_limit <= fit else f"--max-concurrent {cli_limit}, but {reason} fits {fit}"
    elif cli_gpu and on_gpu:
        limit = at_once = fit
        why = reason
    else:
        limit = at_once = min(space_limit, fit)
        if space_limit > fit:
            why = f"{reason}; the space allows {space_limit}"
        elif on_gpu and fit > space_limit and by_gpu <= by_cpu:
            why = f"max_concurrent in the space; {reason} would take {fit}: --max-concurrent {fit}"
        else:
            why = "max_concurrent in the space"
    if gpu > 0 and not on_gpu:
        why += "; no GPU: the trials run on CPU"
    return Concurrency(limit, at_once, why)


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
               stats: dict | None = None, trust_pickled_state: bool = False, *, hooks=None,
               space_checked: bool = False) -> str:
    """Run (or with ``resume`` continue) the search of ``spec``; return the experiment path.

    Local mode (no ``address``) starts Ray on this machine (``ray.init``, no dashboard) unless a Ray
    session is already initialised in this process, in which case that one is used (tests). Cluster
    mode connects with ``ray.init(address=...)``. ``trust_pickled_state`` lets ``--resume`` read a resume
    bundle that an older cem-bench wrote as a pickle. ``stats`` (a dict), when given, receives timings:
    ``ray_start_s``, ``trials_s``, ``trials_ok``, ``trials_error``, ``mode``. ``hooks`` (a picklable
    ``trainable.TrialHooks``; not on the command line) is called by every trial at each epoch: the tests inject
    faults through it. ``space_checked``: the caller has already compared the space with the experiment's
    (``search_command`` does, before its banner), so that a note about it is printed once.
    """

    stats = stats if stats is not None else {}
    storage = resolve_storage(storage)
    exp_path = join(storage, spec.name)
    check_storage(storage)
    from .diskspace import StorageGuard, warn_if_short
    warning = warn_if_short(spec, storage)
    if warning:
        print(warning, flush=True)
    guard = StorageGuard(storage, key=spec.name)
    if resume:
        check_resumable(exp_path)
        if not space_checked:
            check_space_unchanged(spec, exp_path)
    # the folder is made (new) or locked (--resume) here, before Ray starts: a second driver of the same
    # experiment stops now (search_command already holds it around the tables too: re-entrant)
    with experiment_lock(exp_path, resume), driver.active(spec.name, driver_paths(spec, storage, guard)):
        return _run_locked(spec, storage, exp_path, address, resume, stats, trust_pickled_state, guard, hooks)


def driver_paths(spec, storage: str, guard) -> driver.DriverPaths:
    """What the searcher, the scheduler and the guard find of this driver by the experiment's name while its search
    runs (driver.py): pickled with the experiment, a restored one is the first driver's copy."""
    from .searcher import journal_target
    exp_path = join(storage, spec.name)
    return driver.DriverPaths(journal=journal_target(exp_path, spec.name), snapshot=join(exp_path, RESUME_STATE_FILE),
                              scheduler_state=join(exp_path, SCHEDULER_FILE) if spec.scheduler else None, guard=guard,
                              storage=storage)


def _run_locked(spec, storage: str, exp_path: str, address: str | None, resume: bool, stats: dict,
                trust_pickled_state: bool, guard, hooks) -> str:
    import ray

    from .diskspace import full_message, is_enospc, one_line_when_full
    t0 = time.perf_counter()
    started_ray = False
    # ray.init replaces SIGTERM's handler with a sys.exit(15) of its own, which outlives ray.shutdown: the
    # command's own (interrupt.terminating_raises) is put back with Ray's shutdown
    sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=True)
            stats["mode"] = f"cluster ({address})"
        else:
            # address="local": always a new instance on this machine, even if `ray start` runs here
            ray.init(address="local", num_cpus=_detect_cpus(), num_gpus=_detect_gpus(), include_dashboard=False,
                     log_to_driver=True)
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
        if address:
            note = cluster_gpu_note(address, spec.resources, float(ray.cluster_resources().get("GPU", 0.0)))
            if note:
                print(note, flush=True)
        trainable = with_resources(make_trainable(exp_path, spec, resources, hooks), resources)
        t1 = time.perf_counter()
        try:
            tuner = _tuner(spec, storage, exp_path, resume, trust_pickled_state, trainable, guard)
        except Exception as e:  # noqa: BLE001 - a full disk while Ray writes tuner.pkl: one line, not its traceback
            if is_enospc(e):
                raise StorageFull(full_message(storage)) from e
            raise
        if resume:   # the tables of before it are not this search's final ones (written when it ends)
            for line in supersede_tables(exp_path):
                print(f"--resume: {line}", flush=True)
        # what the folder says if this driver ends without a word (kill -9, the out-of-memory killer, a lost head
        # node): without it the report read such a search as finished, its trials in flight as errors and no
        # --resume command (only a signal wrote a record). Replaced by a signal's record, or removed, below
        from ..analysis.results import hard_stop_record
        try:
            write_bytes(join(exp_path, INTERRUPTED_FILE),
                        (json.dumps(hard_stop_record(stats.get("resume_command"))) + "\n").encode())
        except OSError as e:
            if is_enospc(e):
                raise StorageFull(full_message(storage)) from e
            raise
        interruption = None
        try:
            with one_line_when_full(guard), Interruption() as interruption:
                grid = tuner.fit()
        except BaseException as e:
            # the driver did stop itself here: its record replaces the hard stop's ("a stop it could not
            # answer"), where it can still be written: a second signal raised out of Tune's loop, a full disk
            full = isinstance(e, Exception) and (guard.full or is_enospc(e))
            if interruption is not None and interruption.signal is not None:
                _stop_record(exp_path, interruption.signal.name, interruption.at, stats)
            elif full:
                _stop_record(exp_path, FULL_STOP, time.time(), stats)
            if full:
                raise StorageFull(full_message(storage)) from e   # Ray's failure is a traceback of its files
            raise
        if guard.full:
            _stop_record(exp_path, FULL_STOP, time.time(), stats)
            raise StorageFull(full_message(storage, f"trial {guard.full} ran out of space"))
        if interruption.signal is not None:
            stats["interrupted"] = interruption.signal.name
            record = {"signal": interruption.signal.name, "at": interruption.at, "resume": stats.get("resume_command")}
            write_bytes(join(exp_path, INTERRUPTED_FILE), (json.dumps(record) + "\n").encode())
        elif exists(join(exp_path, INTERRUPTED_FILE)):
            # Tune's loop has returned: the hard-stop record written before it (and the record of the interrupted
            # run a --resume continued) no longer applies; kept until here, so that a run killed before its end
            # (a resume's tables moved aside) is rebuilt with its unfinished trials interrupted, not errors
            remove_file(join(exp_path, INTERRUPTED_FILE))
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
        if started_ray:
            ray.shutdown()
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
    return exp_path


# the cause a full storage's stop gives in INTERRUPTED_FILE ("interrupted by <signal>" on the report's page)
FULL_STOP = "a full storage (the search stopped launching trials)"


def _stop_record(exp_path: str, cause: str, at: float | None, stats: dict) -> None:
    """INTERRUPTED_FILE's record of a stop the driver made itself, written where the storage still takes it
    (a full one may not: the hard stop's record, written before Tune's loop, then stays, still with --resume)."""
    record = {"signal": cause, "at": at, "resume": stats.get("resume_command")}
    try:
        write_bytes(join(exp_path, INTERRUPTED_FILE), (json.dumps(record) + "\n").encode())
    except OSError:
        pass


class DamagedExperiment(SearchError, ResultsError):
    """A file Ray restores the experiment from is damaged: a fault of the results folder, not of the command's
    configuration (the CLI says "results error"), and still a SearchError to the search's callers."""


def _tuner(spec, storage: str, exp_path: str, resume: bool, trust_pickled_state: bool, trainable, guard):
    """The Tuner of a new search, or the restored one of ``--resume``. A restored experiment keeps the RunConfig,
    searcher and scheduler its first driver pickled (``Tuner.restore`` takes no new RunConfig): they find this
    driver's paths and live guard through ``driver.lookup`` (the caller has registered them)."""
    from ray import tune

    from .moasha import make_scheduler
    from .searcher import make_searcher
    if resume:
        if not tune.Tuner.can_restore(exp_path):
            raise SearchError(f"--resume: Ray cannot restore {exp_path}")
        for line in repair_experiment_state(exp_path, trust_pickle=trust_pickled_state):
            print(f"--resume: {line}", flush=True)
        for line in restore_removed_checkpoints(exp_path):
            print(f"--resume: {line}", flush=True)
        print(f"resuming {exp_path}", flush=True)
        import pickle
        try:
            return tune.Tuner.restore(exp_path, trainable=trainable, resume_unfinished=True, resume_errored=True)
        except (pickle.UnpicklingError, EOFError) as e:   # one line, not Ray's unpickling traceback
            raise DamagedExperiment(
                f"--resume: {join(exp_path, 'tuner.pkl')} cannot be read ({type(e).__name__}: {e}): it is "
                f"truncated or damaged (a driver killed, or out of space, while Ray wrote it), and Ray restores "
                f"an experiment from it, so this one cannot be continued. Its finished trials' results are still in "
                f"the folder (keep it): `cem-bench report {exp_path}` builds their tables and report; to run the "
                f"rest of the search, start it under a new --name"
            ) from None
    write_recorded_json(exp_path, SPACE_FILE, spec.to_dict())
    scheduler = make_scheduler(spec, state_key=spec.name)   # by its plug-in (spaces/schedulers/); None: FIFO
    return tune.Tuner(
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


def check_sets_are_read(spec, overrides: dict) -> None:
    """ConfigError, before anything starts, for a ``search --set`` key that no trial of the space would read
    (``keyref.unread_keys`` in every configuration of the space: ``--set data.root=…`` on digits, another
    surrogate's key, an attack's key that ``attack.names`` leaves out), as ``train --set`` refuses it: it was
    taken, listed among the fixed keys and recorded in every trial (2026-12-07 probe). A λ = 0 cell reads no
    surrogate's key, so it does not make one read where the space also has λ > 0 cells. The keys a space file
    fixes are not checked: a family of spaces shares its keys. A space of more configurations than
    ``CELL_CHECK_LIMIT`` is not checked."""
    if not overrides:
        return
    from ..core.trial import build_config
    from ..errors import ConfigError
    from ..keyref import unread_keys
    from ..spaces.parse_params import CELL_CHECK_LIMIT, bounded_cells
    cells = bounded_cells(spec.params, CELL_CHECK_LIMIT)
    if cells is None:
        return
    configs = [build_config({**spec.fixed, **cell}) for cell in cells]
    configs = [c for c in configs if c.cem.lambd > 0] or configs
    unread = [unread_keys(overrides, c) for c in configs]
    never = [k for k in overrides if all(k in u for u in unread)]
    if never:
        raise ConfigError(f"search --set: {'; '.join(unread[0][k][0] for k in never)}: no trial of this space would "
                          f"read it, and every trial would record it. Drop the key, or set the surrogate or attack "
                          f"that reads it. Nothing was started")


def check_resumable(exp_path: str) -> None:
    """SearchError unless ``exp_path`` holds a Ray Tune experiment to continue (nothing is touched). Whether it
    holds more than a stopped start's files is asked once no other driver can be starting in it (under the lock,
    or after the dry run's lock check): ``resume.refuse_a_stopped_start``."""
    if not exists(join(exp_path, "tuner.pkl")):
        raise SearchError(f"--resume: {exp_path} holds no Ray Tune experiment to continue "
                          f"({'missing' if not exists(exp_path) else 'no tuner.pkl in'} the folder); "
                          f"drop --resume to start it")



def check_data(spec) -> None:
    """DataError (nothing started, nothing written) unless every data set the space's trials read is on this
    machine, CIFAR downloaded now if it can be: without it every trial of a local search failed on its own,
    and the search ran to the end with nothing but errors. A cluster's trials read ``data.root`` on their own
    nodes (and download CIFAR there), so a search with ``--address`` is not checked here."""
    from ..core.data import check_available
    for name in dict.fromkeys(space_values(spec, "data.dataset")):
        for root in dict.fromkeys(space_values(spec, "data.root")):
            check_available(str(name), str(root))


def check_data_root(spec) -> None:
    """DataError (nothing started) where a space's ``data.root`` is a relative path: Ray runs each trial in a
    folder of its own, so a relative root named another folder there than the one this driver checked, and
    every trial failed (online, each downloaded CIFAR into its own folder). ``~`` is expanded on each node."""
    from ..errors import DataError
    for root in dict.fromkeys(str(r) for r in space_values(spec, "data.root")):
        if not (root.startswith("~") or os.path.isabs(root) or is_uri(root)):
            raise DataError(f"data.root={root!r} is a relative path, and a search's trials each run in a folder of "
                            f"their own, where it names another folder; give it absolute, here "
                            f"data.root={os.path.abspath(root)}")


def space_values(spec, key: str) -> list:
    """The values ``key`` takes in a space's trials: its choices where searched, else the fixed value or the
    key's default."""
    from ..config import key_specs
    p = next((p for p in spec.params if p.key == key), None)
    return list(p.choices) if p is not None and p.choices is not None else \
        [spec.fixed.get(key, key_specs()[key].default)]


def check_device(spec) -> None:
    """SearchError (nothing started, nothing written) where a local search's trials name a device this machine
    lacks (``train.device: cuda`` or ``cuda:N`` without CUDA): every trial failed on its own with the
    ConfigError ``train`` gives before any work, and the experiment's name was used up by a search of errors."""
    import torch
    for name in dict.fromkeys(str(n) for n in space_values(spec, "train.device")):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise SearchError(f"train.device={name!r}, but this machine has no CUDA device, and a local "
                              f"search's trials run here; set train.device=auto (the trial's GPU where it is given "
                              f"one, else the CPU) or cpu, or search on a cluster that has one (--address)")


def check_storage(storage: str) -> None:
    """SearchError unless ``storage`` is a folder (or can become one): nothing is started or written."""
    if is_remote(storage):
        # the bucket is asked once now, before Ray starts: a wrong endpoint, credential or bucket is one line
        # (storage.StorageUnavailable), not a failure inside Ray's first upload
        filesystem(storage)
        return
    path = nearest_existing(storage)
    if not os.path.isdir(path):
        raise SearchError(f"--storage {storage}: {path} is a file, not a folder; give a folder (it is created "
                          f"when missing) or an s3:// / gs:// URI")


def saved_plan(spec, path: str):
    """``spec`` with the trial plan of the experiment's own ``search_space.json`` (what a restored search
    runs: its budget, seeds, baseline, confirmation and scheduler), when it can be read; else ``spec``."""
    try:
        fs, p = filesystem(path)
        with fs.open_input_stream(p) as fh:
            saved = loads_json(fh.read())
        base, conf = saved["baseline"], saved["confirm"]
        return dataclasses.replace(
            spec, num_samples=int(saved["num_samples"]), seeds=tuple(int(x) for x in saved.get("seeds") or ()),
            baseline_replicates=int(base["replicates"]), baseline_cells=tuple(dict(c) for c in base["cells"]) or ({},),
            confirm_top=int(conf["top"]), confirm_replicates=int(conf["replicates"]),
            scheduler=saved.get("scheduler") or None)
    except Exception:  # noqa: BLE001 - an older or unreadable file: the banner falls back to the file given
        return spec


# What a resumed search may change: where and how its trials run. Anything else decides what they compute, and a
# restored experiment's searcher proposes what its first driver planned while every trial's config is built from
# the space given now (trainable.make_trainable): a changed ``fixed`` would reach the remaining epochs of trials
# already halfway through.
RESUME_MAY_CHANGE = ("resources",)
# Refused although they compute nothing, because a resumed search could not honour them: Tuner.restore keeps the
# experiment's RunConfig (its FailureConfig's max_failures), and the report reads the tolerance from the saved
# space. Accepting them with a note left a user believing a changed failure budget or tolerance was in force;
# a tolerance chosen after results were seen would also be a forking path (docs/protocol.md section 9).
RESUME_KEPT = ("max_failures", "utility_tolerance")
# Never news: the name is the folder's, the file's path may move, and a new search saves the concurrency it
# computed for its machine, not the space's number (a restored experiment keeps its own)
RESUME_UNCOMPARED = ("name", "path", "max_concurrent")


# the privacy probe's keys: execution keys (a trial's final metrics do not read them), but a stopping scheduler
# ranks its rungs on the probe's SSIM
PROBE_KEYS = frozenset(("attack.probe_iterations", "attack.probe_images"))


def _ranks_on_probe(saved: dict) -> bool:
    """Does the saved space's scheduler rank a rung on the probe (an objective whose stand-in is ``probe_ssim``)?"""
    from ..spaces.spec import RUNG_METRICS
    objectives = saved.get("objectives") if isinstance(saved.get("objectives"), list) else []
    return any(isinstance(o, dict) and RUNG_METRICS.get(o.get("metric")) == "probe_ssim" for o in objectives)


def space_changes(spec, saved: dict) -> tuple[list[str], list[str]]:
    """(refused, allowed): how ``spec`` differs from an experiment's saved ``search_space.json``. ``fixed`` is
    compared key by key with each key's default standing in for a missing one, and its ``EXECUTION_KEYS`` (the
    data's folder, the device, compilation, the probe) are allowed; a top-level key the saved file lacks (an
    older cem-bench's) is not compared."""
    from ..config import key_specs
    from ..schema import EXECUTION_KEYS
    from ..storage import json_bytes
    now = loads_json(json_bytes(spec.to_dict()))   # as the file was written: tuples are lists, floats as stored
    specs = key_specs()
    refused: list[str] = []
    allowed: list[str] = []
    for key, value in now.items():
        if key in RESUME_UNCOMPARED or key not in saved or saved[key] == value:
            continue
        if key in ("baseline", "confirm") and isinstance(value, dict) and isinstance(saved[key], dict):
            # their seeds follow from the search's, and confirm.top is cut to what the search can have: derived
            # values, which an experiment started by an older cem-bench saved otherwise for the same space.
            # Compared: what the space says; a lower top is what the restored plan can run anyway
            was = {k: v for k, v in saved[key].items() if k != "seeds"}
            is_ = {k: v for k, v in value.items() if k != "seeds"}
            if key == "confirm" and isinstance(was.get("top"), int) and isinstance(is_.get("top"), int) and \
                    is_["top"] <= was["top"]:
                was["top"] = is_["top"]
            if was == is_:
                continue
        if key in RESUME_MAY_CHANGE:
            allowed.append(key)
        elif key in RESUME_KEPT:
            refused.append(f"{key} ({json.dumps(saved[key])} -> {json.dumps(value)}: the restored experiment keeps "
                           f"its own)")
        elif key == "fixed" and isinstance(saved[key], dict) and isinstance(value, dict):
            missing = object()
            for k in sorted(set(value) | set(saved[key])):
                default = specs[k].default if k in specs else missing
                was, is_ = saved[key].get(k, default), value.get(k, default)
                if was == is_:
                    continue
                words = f"fixed.{k} ({_shown(was, missing)} -> {_shown(is_, missing)})"
                if k in PROBE_KEYS and saved.get("scheduler") and _ranks_on_probe(saved):
                    # the scheduler ranks each rung on the probe: records from before and after the change
                    # would be two measurements on one scale (30 and 300 iterations gave SSIM 0.14 and 0.26)
                    refused.append(f"{words}: the scheduler's rungs rank on the probe, and its records from "
                                   f"before the resume were measured with the old one")
                    continue
                (allowed if k in EXECUTION_KEYS else refused).append(words)
        elif not isinstance(value, (dict, list)) and not isinstance(saved[key], (dict, list)):
            refused.append(f"{key} ({json.dumps(saved[key])} -> {json.dumps(value)})")
        else:
            refused.append(key)
    return refused, allowed


def _shown(value, missing) -> str:
    return "not set" if value is missing else json.dumps(value)


def check_space_unchanged(spec, exp_path: str) -> None:
    """``--resume``, before Ray starts: the experiment's ``search_space.json`` verified against its manifest (a
    damaged one, or a damaged manifest, is a ResultsError now, not after every trial has run), and a SearchError
    where the space given (its file and every ``--set``) would change what the remaining trials compute
    (``space_changes``); a note for what may change. An experiment without the file (an older cem-bench's) is
    not checked; one whose manifest lists the file it lacks is refused (it was deleted: any space would pass)."""
    from ..integrity import MANIFEST_FILE, listed_but_missing, read_json_file
    saved = read_json_file(exp_path, SPACE_FILE, "the search space the search saved (JSON)")
    if saved is None:
        if listed_but_missing(exp_path, SPACE_FILE):
            # 2026-12-07 probe: with the file deleted, a space of 2 epochs resumed one of 1 and the table split
            # its cells by train.epochs; the file was never written again
            raise SearchError(f"--resume: {join(exp_path, SPACE_FILE)} is missing, though the experiment's "
                              f"{MANIFEST_FILE} lists it: the space the search was started with is gone, so "
                              f"nothing can check that this one would not change what its remaining trials "
                              f"compute. Restore the file (a copy, or the space and --set options it was started "
                              f"with: its first line printed them), or start a new experiment with --name NEW_NAME. "
                              f"Nothing was changed")
        return
    if not isinstance(saved, dict):
        return
    refused, allowed = space_changes(spec, saved)
    if refused:
        raise SearchError(
            f"--resume: the space differs from the experiment's {SPACE_FILE} in {', '.join(refused)}. A resumed "
            f"search runs the trials it planned, and their configs would mix both (trials halfway through "
            f"would finish under the new values): resume with the space and --set options it was started with "
            f"(its {SPACE_FILE} shows them), or start a new experiment with --name NEW_NAME. What may change "
            f"on --resume: {', '.join(RESUME_MAY_CHANGE)} and how trials "
            f"run (fixed keys such as data.root and train.device); {' and '.join(RESUME_KEPT)} stay the "
            f"experiment's own (Ray's restore keeps its failure budget, the report its tolerance). Nothing was "
            f"changed")
    if allowed:
        print(f"note: the space differs from the experiment's {SPACE_FILE} in {', '.join(allowed)}; the trials "
              f"from now on run with the new fixed keys and resources (the restored experiment keeps its own "
              f"concurrency)", flush=True)


# ---------------------------------------------------------------------------------------------- CLI
def overrides_from_args(args) -> dict:
    from ..config import parse_set
    ov: dict[str, Any] = {}
    if getattr(args, "name", None) is not None:
        ov["name"] = args.name   # "" too: the space's check of names refuses it (a silent fallback resumed another)
    for attr, key in (("num_samples", "num_samples"), ("max_concurrent", "max_concurrent"),
                      ("gpus_per_trial", "resources.gpu"), ("cpus_per_trial", "resources.cpu")):
        v = getattr(args, attr, None)
        if v is not None:
            ov[key] = v
    fixed = parse_set(getattr(args, "set", None) or [])
    if fixed:
        ov["fixed"] = fixed
    return ov


def seed_list(seeds) -> str:
    """``0, 1, 2`` for a few seeds; ``0, 1, …, 4999 (5,000 seeds)`` for many (one first line, not 29 KB)."""
    seeds = list(seeds)
    if len(seeds) <= 8:
        return ", ".join(map(str, seeds))
    return f"{seeds[0]}, {seeds[1]}, …, {seeds[-1]} ({len(seeds):,} seeds)"


def plan(spec) -> str:
    """The trials a search will run, in words: "17 trials: 3 λ=0 baseline runs (seeds 0, 1, 2), 8
    configurations x 1 seed, then the best 2 again with seeds 3, 4"."""
    parts = []
    if spec.baseline_runs:
        cells = len(spec.baseline_cells)
        parts.append(f"{spec.baseline_runs} λ=0 baseline runs ({f'{cells} cells x ' if cells > 1 else ''}seeds "
                     f"{seed_list(spec.baseline_seeds)})")
    parts.append(f"{spec.num_samples} configurations x {spec.replicates} seed{'s' * (spec.replicates != 1)}")
    if spec.confirm_runs:
        parts.append(f"then the best {spec.confirm_top} again with seeds {seed_list(spec.confirm_seeds)}")
    if spec.scheduler:
        from ..spaces import schedulers
        parts.append(f"a search trial may stop at epochs {', '.join(map(str, spec.rungs))} "
                     f"({schedulers.describe(spec.scheduler)})")
    total = spec.total_runs
    return f"{total} trials{' at most' if spec.confirm_runs else ''}: " + ", ".join(parts)


def check_args(args) -> None:
    """SearchError for a command-line value no search could run with, naming the option and what it takes
    (before the space is read or Ray starts)."""
    n = getattr(args, "max_concurrent", None)
    if n is not None and n < 1:
        raise SearchError(f"--max-concurrent {n}: give how many trials may run at once, an integer >= 1 (left out: "
                          f"as many as this machine's GPUs and CPUs hold, up to the space's max_concurrent)")
    g = getattr(args, "gpus_per_trial", None)
    if g is not None and not (math.isfinite(g) and (g == 0 or 1 / RAY_UNITS <= g <= 1)):
        # above 1: a trial trains on one device, so Ray would reserve the other cards idle
        raise SearchError(f"--gpus-per-trial {g:g}: give a fraction of one GPU (0 < F <= 1; 0.125 runs 8 trials on "
                          f"each GPU; a trial trains on one GPU, so more than 1 would leave cards reserved and idle), "
                          f"or 0 for trials without a GPU")
    c = getattr(args, "cpus_per_trial", None)
    if c is not None and not (math.isfinite(c) and c >= 1 / RAY_UNITS):
        raise SearchError(f"--cpus-per-trial {c:g}: give the CPUs each trial reserves, a number > 0 (fractions such "
                          f"as 0.5 are allowed)")


def cluster_gpu_note(address: str, resources: dict, cluster_gpus: float) -> str | None:
    """A cluster's GPU request is kept (its autoscaler may add GPU nodes); on a cluster with none now, the note that
    says so: without a node type that can add one, the trials wait forever, and Ray's "No available node types can
    fulfill" lines do not say what to change."""
    gpu = float(resources.get("gpu", 0) or 0)
    if gpu <= 0 or cluster_gpus > 0:
        return None
    return (f"note: the cluster at {address} has no GPU now; each trial asks for {gpu:g} GPU and waits until a GPU "
            f"node joins (cluster.yaml's gpu_worker, started by the autoscaler). On a cluster without GPU nodes, "
            f"give --gpus-per-trial 0")


ADDRESS_FORMS = "auto or the head's HOST:PORT (its GCS port, 6379 unless `ray start --port` said otherwise)"


def address_form(address: str) -> None:
    """SearchError for an ``--address`` that is neither ``auto``, ``HOST:PORT`` nor a Ray Client ``ray://``
    URI this installation can use: Ray's own errors for them were tracebacks (``Invalid address format``,
    ``invalid literal for int()``, ``Ray Client requires ray[client]``). The dashboard's ``http://…:8265``,
    the README's line above ``--address auto``, is the job API's address, not the cluster's."""
    import importlib.util
    scheme, sep, _ = address.partition("://")
    if sep and scheme in ("http", "https"):
        raise SearchError(f"--address {address} is the dashboard's (the job API's: `ray job submit --address "
                          f"{address} -- cem-bench search ... --address auto`), not the cluster's; give {ADDRESS_FORMS}")
    if sep and scheme == "ray":
        if importlib.util.find_spec("grpc") is None:
            raise SearchError(f"--address {address}: a Ray Client address needs `pip install 'ray[client]'`, not "
                              f"installed here; or submit the search as a job on the cluster (`ray job submit`, "
                              f"docs/cluster.md) with --address auto")
        return
    if sep:
        raise SearchError(f"--address {address}: unknown scheme {scheme}://; give {ADDRESS_FORMS}")
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise SearchError(f"--address {address} is not an address Ray can connect to; give {ADDRESS_FORMS}")


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """SearchError, before Ray starts, when the cluster of ``--address HOST:PORT`` (or the one ``auto`` finds:
    ``RAY_ADDRESS``, else the address ``ray start`` last recorded on this machine) does not answer within
    ``timeout_s``. ``ray.init`` retries a dead address about 20 times, some 40 s each, so a stale recorded
    address would hang the command for minutes before its error. An address of no form Ray takes is refused
    first (``address_form``); a ``ray://`` one, and ``auto`` with nothing recorded, are left to Ray, whose errors
    for them are immediate."""
    import socket
    if not address:
        return
    address_form(address)
    if "://" in address:
        return
    target = address
    if address == "auto":
        target = os.environ.get("RAY_ADDRESS", "")
        if not target:
            try:   # Ray's own reading of what `auto` means (a private helper: skipped if it moves)
                from ray._private.utils import read_ray_address
                target = read_ray_address() or ""
            except Exception:  # noqa: BLE001
                return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or "://" in target:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        found = "" if target == address else f" (where --address auto found the cluster: {target})"
        raise SearchError(f"--address {address}: nothing answers at {host}:{port}{found} within {timeout_s:g} s "
                          f"({e.strerror or type(e).__name__}); is the cluster up (`ray status` on its head)? "
                          f"Give its head's HOST:PORT, or leave --address out to search on this machine") from None


def machine_resources(address: str | None) -> tuple[float | None, float | None]:
    """``(GPUs, CPUs)`` the search's Ray will have: those of a Ray session this process already holds, else
    this machine's (the local session is started with them); ``(None, None)`` for a cluster."""
    if address:
        return None, None
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        have = ray.cluster_resources()
        return float(have.get("GPU", 0.0)), float(have.get("CPU", 0.0))
    return float(_detect_gpus()), float(_detect_cpus())


def banner(spec, conc: Concurrency | None) -> str:
    """The first line of ``cem-bench search``: the trials, how many at once and why, the objectives.
    ``conc`` None: a resumed experiment, whose restored searcher keeps the limit it started with."""
    at_once = (f"{conc.at_once} at a time ({conc.why})" if conc is not None
               else "as many at a time as the experiment started with (--resume keeps its limit)")
    tests = (f", hypotheses {', '.join(h.name for h in spec.hypotheses)} ({spec.hypotheses_correction} at "
             f"{spec.hypotheses_alpha:g}; the report tests them)" if spec.hypotheses else "")
    return (f"cem-bench search: {spec.name}: {plan(spec)}, {at_once}, "
            f"objectives {', '.join(f'{o.metric} ({o.mode})' for o in spec.objectives)}{tests}")


def dry_run_text(spec, exp_path: str, resume: bool) -> str:
    """What ``search --dry-run`` prints after the banner: where the experiment would go, each searched key as
    the sampler sees it, the fixed keys, and that nothing ran. A 165-trial grid booked on a cluster is checked
    here first, not by starting it and pressing Ctrl-C."""
    def searched(p) -> str:
        if p.kind == "choice":
            what = f"one of {', '.join(map(str, p.choices))}"
        else:
            what = (f"{p.low:g} to {p.high:g} ({p.kind}{', log' if p.log and p.kind != 'loguniform' else ''}"
                    f"{f', step {p.step:g}' if p.step is not None else ''})")
        when = "".join(f" when {k} in {', '.join(map(str, v))}" for k, v in p.when.items())
        return f"  {p.key}: {what}{when}"
    lines = [f"experiment: {exp_path} ({'would be continued' if resume else 'would be made'})",
             f"sampler: {spec.sampler.get('name')}; searched ({len(spec.params)}):" if spec.params
             else f"sampler: {spec.sampler.get('name')}; nothing searched (every trial is the fixed keys, "
                  f"seeds apart)"]
    lines += [searched(p) for p in spec.params]
    lines.append(f"fixed ({len(spec.fixed)}): " + (", ".join(f"{k}={v}" for k, v in sorted(spec.fixed.items()))
                                                   or "none (every key at its default)"))
    lines.append("dry run: the checks passed; nothing was started and nothing was written")
    return "\n".join(lines)


def search_command(args) -> dict:
    """``cem-bench search`` without the report: validate, search, write the tables, print what was done.

    Returns ``{"experiment", "name", "trials", "epochs", "ok", "error", "stats", "seconds"}``; the CLI
    builds the report from it."""
    from ..spaces import load_space
    t_all = time.perf_counter()
    if getattr(args, "trust_pickled_state", False) and not args.resume:
        raise SearchError("--trust-pickled-state only applies to --resume (it reads an old experiment's pickled "
                          "resume bundle)")
    check_args(args)
    spec = load_space(args.space, overrides_from_args(args))  # SpaceError -> the CLI prints it, exit 2
    from ..config import parse_set
    check_sets_are_read(spec, parse_set(getattr(args, "set", None) or []))
    check_address(args.address)
    stats: dict[str, Any] = {}
    conc = None
    if not args.resume:
        gpus, cpus = machine_resources(args.address)
        conc = concurrency(spec.max_concurrent, spec.resources, cli_limit=getattr(args, "max_concurrent", None),
                           cli_gpu=getattr(args, "gpus_per_trial", None) is not None, gpus=gpus, cpus=cpus)
        spec = dataclasses.replace(spec, max_concurrent=conc.limit)
    from .. import mps
    # MPS on this machine for a local search whose trials share a GPU (a cluster starts it in cluster.yaml)
    mode = (getattr(args, "mps", None) or "auto") if args.address is None else "off"
    exp_path = join(resolve_storage(args.storage), spec.name)
    stats["resume_command"] = resume_command(args, spec.name, resolve_storage(args.storage))
    if args.resume:
        check_resumable(exp_path)
        check_space_unchanged(spec, exp_path)   # before the banner's plan is trusted and before Ray starts
    else:
        check_storage(resolve_storage(args.storage))
    check_data_root(spec)
    if args.address is None:
        check_data(spec)
        check_device(spec)
    elif not is_remote(resolve_storage(args.storage)):
        # a worker node writes its trials' results and checkpoints to this path on its own disk: Ray's storage
        # check then fails every trial there, retried until max_failures, and each ends an error row
        print(f"note: --storage {resolve_storage(args.storage)} is a folder, and with --address every node writes "
              f"there: it works only where all nodes share it (one machine, or a network file system); else "
              f"give s3://BUCKET/PREFIX (docs/cluster.md)", flush=True)
    if mode == "on":
        mps.control()   # MPSError (exit 2) now, before the storage and the experiment folder are made
    # the plan after every check (it was printed before them until 2026-12-07, and a newcomer read a data or storage
    # refusal under it as a search that had started and then failed)
    if not args.resume:
        print(banner(spec, conc), flush=True)
    else:   # the restored experiment keeps its own plan: the banner counts its trials, not the file's
        print(banner(saved_plan(spec, join(resolve_storage(args.storage), spec.name, SPACE_FILE)), conc), flush=True)
        if getattr(args, "max_concurrent", None) is not None:   # taken silently before 2026-12-07
            print(f"note: --max-concurrent {args.max_concurrent} is not applied on --resume: Ray's restored "
                  f"searcher keeps the limit the experiment started with", flush=True)
    if getattr(args, "dry_run", False):
        check_available(exp_path, bool(args.resume))   # the lock's own refusals, asked without taking it
        if args.resume:
            refuse_a_stopped_start(exp_path)
        print(dry_run_text(spec, exp_path, bool(args.resume)), flush=True)
        return {"dry_run": True, "experiment": exp_path, "name": spec.name}
    # one driver per experiment, from before Ray starts until its tables are written (search/lock.py)
    try:
        with experiment_lock(exp_path, bool(args.resume)):
            if args.resume:   # before Ray starts (its restore refused it only after)
                refuse_a_stopped_start(exp_path)
            with mps.Session(mode, float(spec.resources.get("gpu", 0)), mode != "off" and _detect_gpus() > 0):
                exp = run_search(spec, storage=args.storage, address=args.address, resume=bool(args.resume),
                                 stats=stats, trust_pickled_state=bool(getattr(args, "trust_pickled_state", False)),
                                 space_checked=True)
            t_write = time.perf_counter()
            from ..analysis import results
            trials, epochs = results.build_tables(exp)
            try:
                trials_path, epochs_path = results.write_tables(exp, (trials, epochs))
            except OSError as e:
                from .diskspace import is_enospc
                if not is_enospc(e):
                    raise
                # every trial has ended: the same command again is refused (the folder exists), and --resume would
                # only restore a finished experiment; the report builds the tables from the trial folders
                raise StorageFull(f"no space left on the device to write the tables of {exp} ({e}): every trial "
                                  f"has ended and its results are in its folder, and nothing was lost. Free some "
                                  f"space, then build the tables and the report with `cem-bench report {exp}` "
                                  f"(the same search command is refused now: the experiment exists)") from e
            stats["write_s"] = time.perf_counter() - t_write
    except KeyboardInterrupt:   # a second signal, or one outside Tune's loop: stopped at once
        # only a saved experiment state can be continued: stopped after tuner.pkl but before it, --resume would be
        # refused (check_resumable), and a new search takes the folder over (lock.py: _STARTING_FILES)
        if has_saved_state(exp_path):
            print(f"cem-bench: stopped at once; the experiment keeps its last saved state. Continue with:\n"
                  f"  {stats['resume_command']}", file=sys.stderr, flush=True)
        raise

    # the statuses of the table just written (not Ray's results: the table also counts the trials that never
    # started, and tells a stopped or interrupted trial from an error), counted from it in memory
    n_ok, n_err, n_stop, n_int = (int((trials["status"] == s).sum()) for s in ("ok", "error", "stopped", "interrupted"))
    print(f"experiment: {exp}")
    print(f"trials: {trials_path}")
    print(f"epochs: {epochs_path}")
    return {"experiment": exp, "name": spec.name, "trials": trials_path, "epochs": epochs_path, "ok": n_ok,
            "error": n_err, "stopped": n_stop, "interrupted": n_int, "stats": stats,
            "seconds": time.perf_counter() - t_all}
