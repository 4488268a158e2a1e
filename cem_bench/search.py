"""Ray Tune + Optuna multi-objective search around ``run_trial`` (local and cluster modes, resume).

``cem-bench search SPACE.yaml`` validates the space completely, starts Ray (or connects to a cluster with
``--address``), runs one Tune trial per Optuna suggestion and writes ``trials.parquet``/``epochs.parquet``
and the HTML report. This is the only module that imports Ray, and it does so inside functions.

Results on disk (``STORAGE/NAME`` is Ray's experiment folder; STORAGE may be a folder, ``s3://`` or ``gs://``)::

    search_space.json         the validated spec (written first, atomically)
    optuna_journal.log        Optuna JournalStorage mirror of the study (``optuna-dashboard optuna_journal.log``)
    <trial dir>/params.json   Ray: the trial's config
    <trial dir>/result.json   Ray: one JSON line per ``tune.report`` (every epoch, then the final result)
    <trial dir>/error.txt     Ray: every failure of the trial (also those that were retried)
    <trial dir>/checkpoint_*  Ray: the latest checkpoints (``state.pt``: the trainer state of an epoch)
    <trial dir>/trial_result.json  ours: the full result (metrics, status, error, info with config and history)
    <trial dir>/recon.png     ours: the attack's reconstructions

``trial_result.json`` is not called ``result.json`` because Ray's JSON logger owns that name. The trainable
writes it (and ``recon.png``) straight to the storage (``pyarrow.fs``), so it lands in the same place
whichever node ran the trial.

How failures are handled:

* a ``TrialDiverged`` (non-finite loss), ``ConfigError`` or ``DataError`` inside a trial is a *result*: the
  trial reports NaN objectives with ``status: "error"`` and ``error: <reason>``, writes
  ``trial_result.json``, and ends normally (no retry, the search goes on). Optuna is told the trial
  FAILED (a NaN would otherwise be rejected by ``study.tell``).
* any other exception, or the death of the trial's worker process, is retried by Ray up to
  ``max_failures`` times (``FailureConfig``); the new attempt resumes from the trial's latest checkpoint
  (``tune.get_checkpoint()``), so finished epochs are not trained again.
* a killed driver is continued with ``--resume``: ``Tuner.restore(path, trainable, resume_errored=True)``
  restores the trials and the searcher (Optuna study included) from the experiment state; unfinished
  trials resume from their checkpoints and only the missing samples are suggested.

Why the experiment state needs a guard: Ray writes its experiment checkpoint (``experiment_state-S.json``,
``searcher-state-S.pkl``, ``search_gen_state-S.json``) into the driver's staging folder and then *copies*
the folder to the storage in a background thread, file by file and in place. A driver killed during that
copy leaves a truncated file, or files of two different checkpoints, in the experiment folder; Ray's own
restore then fails ("EOFError: Ran out of input"), falls back to "Restarting experiment" and hangs. So the
search algorithm used here (``SnapshotSearchGenerator``) writes, right after Ray has written a checkpoint
into the staging folder and before the copy starts, the same files bundled into one file,
``cem_resume_state.bin``, atomically (temp file + rename; one PUT on s3/gs). It is always at least as new
as anything the copy can have written, and always consistent. ``--resume`` first puts the bundle's files
back in place (``repair_experiment_state``; files it replaces are moved to ``superseded_state/``, never
deleted), then lets Ray restore. The bundle's name ends in neither ``.json`` nor ``.pkl`` because Ray's
restore copies those from the storage into the staging folder and would upload a stale copy back.

The Optuna journal: ``OptunaSearch`` keeps its study in memory (so the study is pickled with the searcher
state and restored consistently with the trials). The searcher used here (``JournalOptunaSearch``) copies
every finished trial into a ``JournalStorage`` study in ``optuna_journal.log`` from the driver, right after
telling the in-memory study; the copy is idempotent (keyed by the Ray trial id), so a resumed search fills
in what a killed driver missed. With remote storage the journal is kept in
``~/.cache/cem-bench/journals/NAME/`` and uploaded after every update.

Test hook (used by tests/test_search.py only): with ``CEM_BENCH_TEST_DIE_AT_EPOCH=N`` in the driver's
environment when the search starts, every trial's worker process calls ``os._exit(1)`` right after
reporting epoch N, once per trial (a marker file ``.test_died`` in the trial's folder makes later attempts
go on).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Callable

from .config import ConfigError
from .results import RESUME_STATE_FILE  # noqa: F401 - the bundle of the last complete checkpoint

logger = logging.getLogger(__name__)

RESULT_FILE = "trial_result.json"
JOURNAL_FILE = "optuna_journal.log"
SPACE_FILE = "search_space.json"
STATE_FILE = "state.pt"
DIE_ENV = "CEM_BENCH_TEST_DIE_AT_EPOCH"
DIE_MARKER = ".test_died"
TRAINABLE_NAME = "cem_trial"  # Tuner.restore needs the same trainable name

SUPERSEDED_DIR = "superseded_state"
MAX_DUPLICATE_ASKS = 20  # asks per trial before a duplicate configuration is accepted (see suggest)
# Ray's experiment-level state files: name prefix -> how Ray reads them
RAY_STATE_KINDS = {"experiment_state-": "json", "searcher-state-": "pickle", "search_gen_state-": "pickle",
                   "callback-states-": "pickle"}

# Where the searcher mirrors its study and where the generator bundles the experiment state: set by
# run_search for the current driver (after a restore the pickled objects may point at an old location).
_JOURNAL_TARGET: dict[str, tuple[str, str | None]] = {}
_SNAPSHOT_TARGET: dict[str, str] = {}


class SearchError(ConfigError):
    """A search cannot start (existing experiment, nothing to resume, ...). The CLI exits with code 2."""


# ------------------------------------------------------------------------------------------ storage
def is_uri(path: str) -> bool:
    return "://" in str(path)


def resolve_storage(storage: str | None) -> str:
    """``None`` -> ``./results`` made absolute; a URI (``s3://``, ``gs://``, ...) unchanged; a path absolute."""
    if storage is None:
        storage = "results"
    storage = str(storage)
    if is_uri(storage):
        return storage.rstrip("/")
    return os.path.abspath(os.path.expanduser(storage))


def join(base: str, *parts: str) -> str:
    if is_uri(base):
        return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])
    return os.path.join(base, *parts)


def _fs(path: str):
    """(pyarrow filesystem, path on it) for a local path or a URI."""
    import pyarrow.fs as pafs
    if is_uri(path):
        if path.startswith("file://"):
            return pafs.LocalFileSystem(), path[len("file://"):]
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(path)


def exists(path: str) -> bool:
    import pyarrow.fs as pafs
    fs, p = _fs(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def write_bytes(path: str, data: bytes) -> None:
    """Write a file atomically: temp file + ``os.replace`` locally; a single PUT on object stores."""
    if not is_uri(path) or path.startswith("file://"):
        path = path[len("file://"):] if path.startswith("file://") else path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        return
    fs, p = _fs(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as out:
        out.write(data)


def write_json_to(path: str, obj: Any) -> None:
    from .trial import jsonable
    write_bytes(path, json.dumps(jsonable(obj), indent=2).encode())


def copy_file_to(src: str, dest: str) -> None:
    if not is_uri(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.tmp{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        return
    with open(src, "rb") as fh:
        write_bytes(dest, fh.read())


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------- resources
def trial_resources(resources: dict, gpus_available: float | None = None) -> tuple[dict, str | None]:
    """Per-trial ``{"cpu": c, "gpu": g}`` for ``tune.with_resources`` and a note to print (or None).

    ``gpus_available`` is what the local Ray session has (``None``: unknown, e.g. a cluster whose GPU
    workers the autoscaler starts on demand, so the request is kept). With no GPU the trials run on CPU
    (gpu forced to 0). A fractional gpu (0.25 = four trials on one GPU) is kept as is.
    """
    cpu = float(resources.get("cpu", 1.0))
    gpu = float(resources.get("gpu", 0.0))
    note = None
    if gpu > 0 and gpus_available is not None and gpus_available <= 0:
        note = (f"note: resources.gpu={gpu:g} but this Ray session has no GPU; trials run on CPU "
                f"(resources.gpu forced to 0)")
        gpu = 0.0
    elif gpus_available is not None and gpu > gpus_available:
        note = (f"note: resources.gpu={gpu:g} is more than this Ray session's {gpus_available:g} GPU(s); "
                f"using {gpus_available:g}")
        gpu = float(gpus_available)
    return {"cpu": cpu, "gpu": gpu}, note


def with_resources(trainable: Callable, resources: dict):
    """``tune.with_resources`` with the ``{"cpu", "gpu"}`` of :func:`trial_resources`."""
    from ray import tune
    return tune.with_resources(trainable, {"cpu": resources["cpu"], "gpu": resources["gpu"]})


# ---------------------------------------------------------------------------------------- trainable
def _scalars(record: dict) -> dict:
    out = {}
    for k, v in record.items():
        if isinstance(v, bool) or isinstance(v, (int, float, str)) or v is None:
            out[k] = v
        elif hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            out[k] = v.item()
    return out


def make_trainable(experiment_path: str, spec, resources: dict, die_at_epoch: int | None = None) -> Callable:
    """The function trainable of a search (named ``cem_trial``), not yet wrapped with resources.

    ``experiment_path`` is the experiment folder or URI (where ``trial_result.json`` and ``recon.png`` go),
    ``spec`` the SearchSpec (objectives, fixed keys), ``resources`` the per-trial resources.
    """
    objectives = list(spec.metric_names)
    cpus = float(resources.get("cpu", 1.0))
    gpu_frac = float(resources.get("gpu", 0.0))

    def cem_trial(config: dict) -> None:
        import ray
        import torch
        from ray import tune

        from .data import DataError
        from .spaces import trial_config
        from .trainer import TrialDiverged
        from .trial import OBJECTIVE_KEYS, build_config, run_trial

        started_at = _now_iso()
        torch.set_num_threads(max(1, int(round(cpus))))
        if torch.cuda.is_available() and 0 < gpu_frac < 1:
            torch.cuda.set_per_process_memory_fraction(gpu_frac)
        ctx = tune.get_context()
        trial_id = ctx.get_trial_id()
        trial_dir_name = os.path.basename(ctx.get_trial_dir().rstrip("/"))
        trial_path = join(experiment_path, trial_dir_name)
        node = {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
                "trial_id": trial_id}
        nan = float("nan")

        state = None
        resumed_from = 0
        ckpt = tune.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                state = torch.load(os.path.join(d, STATE_FILE), map_location="cpu", weights_only=False)
            resumed_from = int(state["epoch"])
            print(f"[cem-bench] trial {trial_id}: resuming from the checkpoint of epoch {resumed_from}", flush=True)
        history: list[dict] = list(state["history"]) if state is not None else []

        try:
            flat = trial_config(spec, config)
        except Exception:  # noqa: BLE001 - from_flat reports the problem below
            flat = dict(config)

        def base_metrics(record: dict) -> dict:
            m = _scalars(record)
            for k in set(OBJECTIVE_KEYS) | set(objectives):
                m.setdefault(k, nan)
            m.update(node)
            m["resumed_from_epoch"] = resumed_from
            return m

        out_dir = tempfile.mkdtemp(prefix="cem-bench-trial-")

        def finish(result: dict, status: str, error: str | None) -> None:
            info = dict(result.get("info") or {})
            gallery = os.path.join(out_dir, "recon.png")
            if os.path.isfile(gallery):
                copy_file_to(gallery, join(trial_path, "recon.png"))
                info["gallery"] = "recon.png"
            full = {**{k: v for k, v in result.items() if k != "info"}, "status": status, "error": error,
                    **node, "trial_dir": trial_dir_name, "started_at": started_at, "finished_at": _now_iso(),
                    "resumed_from_epoch": resumed_from, "info": info}
            write_json_to(join(trial_path, RESULT_FILE), full)
            metrics = base_metrics({k: v for k, v in full.items() if k != "info"})
            if status != "ok":
                for k in set(OBJECTIVE_KEYS) | set(objectives):
                    metrics[k] = nan
            tune.report(metrics)

        def report(record: dict, final: bool, state_fn=None) -> None:
            if final:
                finish(record, "ok", None)
                return
            history.append(dict(record))
            metrics = base_metrics(record)
            metrics["status"] = "running"
            with tempfile.TemporaryDirectory(prefix="cem-bench-ckpt-") as tmp:
                if state_fn is not None:
                    torch.save(state_fn(), os.path.join(tmp, STATE_FILE))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp) if state_fn else None)
            if die_at_epoch is not None and record.get("epoch") == die_at_epoch:
                marker = join(trial_path, DIE_MARKER)
                if not exists(marker):
                    write_bytes(marker, b"died once\n")
                    print(f"[cem-bench] test hook: trial {trial_id} exits after epoch {die_at_epoch}", flush=True)
                    os._exit(1)

        try:
            run_trial(flat, report, out_dir=out_dir, resume_state=state)
        except (TrialDiverged, ConfigError, DataError) as e:
            reason = f"{type(e).__name__}: {e}"
            print(f"[cem-bench] trial {trial_id} ended with an error (not retried): {reason}", flush=True)
            try:
                resolved = build_config(flat).to_flat()
            except Exception:  # noqa: BLE001
                resolved = flat
            result = {k: nan for k in OBJECTIVE_KEYS}
            result["epochs_done"] = history[-1]["epoch"] if history else 0
            result["info"] = {"config": resolved, "history": history, "torch_version": torch.__version__}
            try:
                from . import __version__
                from .trial import git_sha
                result["info"].update(package_version=__version__, git_sha=git_sha())
            except Exception:  # noqa: BLE001
                pass
            finish(result, "error", reason)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    cem_trial.__name__ = cem_trial.__qualname__ = TRAINABLE_NAME
    return cem_trial


# ----------------------------------------------------------------------------------------- searcher
def _build_searcher_class():
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    class JournalOptunaSearch(OptunaSearch):
        """OptunaSearch that tells Optuna FAIL for errored/NaN trials and mirrors finished trials into a
        JournalStorage file (see the module docstring)."""

        def __init__(self, *args, journal: tuple[str, str | None] | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            self._journal = journal
            self._mirror_journal(init=True)

        def suggest(self, trial_id: str):
            # Optuna has no de-duplication: TPE (and a seeded random sampler) re-propose configurations
            # that already ran or are running, and with a fixed seed a copy gives the same result, so the
            # trial is wasted. A duplicate is told FAIL (samplers ignore failed trials) and replaced by a
            # random draw (asking TPE again gives the same proposal: its model has not changed), up to
            # MAX_DUPLICATE_ASKS times; a space with nothing new left gets the duplicate.
            config = super().suggest(trial_id)
            if config is None or not callable(self._space):
                return config
            seen = {self._params_key(t) for tid, t in self._ot_trials.items() if tid != trial_id}
            sampler = self._ot_study.sampler
            try:
                for _ in range(MAX_DUPLICATE_ASKS):
                    ot_trial = self._ot_trials[trial_id]
                    if self._params_key(ot_trial) not in seen:
                        break
                    self._ot_study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
                    del self._ot_trials[trial_id]
                    self._duplicates_skipped = getattr(self, "_duplicates_skipped", 0) + 1
                    # seeded from the trial number: a seeded search stays reproducible
                    self._ot_study.sampler = optuna.samplers.RandomSampler(seed=ot_trial.number)
                    config = super().suggest(trial_id)
            finally:
                self._ot_study.sampler = sampler
            return config

        @staticmethod
        def _params_key(ot_trial) -> tuple:
            return tuple(sorted((k, repr(v)) for k, v in ot_trial.params.items()))

        def save(self, checkpoint_path: str):
            # OptunaSearch pickles with the standard pickle, which cannot hold the define-by-run closure.
            import ray.cloudpickle as cloudpickle
            with open(checkpoint_path, "wb") as fh:
                cloudpickle.dump(self.__dict__.copy(), fh)

        def restore(self, checkpoint_path: str):
            import ray.cloudpickle as cloudpickle
            with open(checkpoint_path, "rb") as fh:
                self.__dict__.update(cloudpickle.load(fh))

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
            bad = error or not result or result.get("status") == "error"
            if not bad and isinstance(self._metric, list):
                for m in self._metric:
                    v = result.get(m)
                    if not isinstance(v, (int, float)) or not math.isfinite(v):
                        bad = True
            if bad and trial_id in self._ot_trials:
                super().on_trial_complete(trial_id, None, error=True)
            else:
                super().on_trial_complete(trial_id, result, error)
            self._mirror_journal()

        def _mirror_journal(self, init: bool = False) -> None:
            target = _JOURNAL_TARGET.get(self._study_name) or self._journal
            if not target or self._ot_study is None:
                return
            local, remote = target
            try:
                from optuna.storages import JournalStorage
                from optuna.storages.journal import JournalFileBackend
                os.makedirs(os.path.dirname(local), exist_ok=True)
                storage = JournalStorage(JournalFileBackend(local))
                try:
                    study = optuna.load_study(study_name=self._study_name, storage=storage)
                except KeyError:
                    study = optuna.create_study(storage=storage, study_name=self._study_name, load_if_exists=True,
                                                directions=[d.name.lower() for d in self._ot_study.directions])
                if init and not study.user_attrs.get("metrics"):
                    study.set_user_attr("metrics", list(self._metric) if isinstance(self._metric, list)
                                        else [self._metric])
                done = {t.user_attrs.get("ray_trial_id") for t in study.get_trials(deepcopy=False)}
                by_number = {t.number: t for t in self._ot_study.get_trials(deepcopy=False)}
                added = 0
                for tid, ot_trial in list(self._ot_trials.items()):
                    if tid in done or tid not in self._completed_trials:
                        continue
                    ft = by_number.get(ot_trial.number)
                    if ft is None or not ft.state.is_finished():
                        continue
                    complete = ft.state == optuna.trial.TrialState.COMPLETE
                    study.add_trial(optuna.trial.create_trial(
                        state=ft.state, values=ft.values if complete else None, params=ft.params,
                        distributions=ft.distributions,
                        user_attrs={**ft.user_attrs, "ray_trial_id": tid, "optuna_number": ft.number}))
                    added += 1
                if remote and (added or init):
                    copy_file_to(local, remote)
            except Exception as e:  # noqa: BLE001 - the mirror must never stop a search
                logger.warning("cem-bench: could not update the Optuna journal %s: %r", local, e)

    JournalOptunaSearch.__module__ = __name__
    JournalOptunaSearch.__qualname__ = "JournalOptunaSearch"
    return JournalOptunaSearch


def _build_generator_class():
    from ray.tune.search import SearchGenerator

    class SnapshotSearchGenerator(SearchGenerator):
        """Ray's SearchGenerator that bundles each experiment checkpoint into ``cem_resume_state.bin``
        (see the module docstring)."""

        def __init__(self, searcher, experiment: str):
            super().__init__(searcher)
            self._cem_experiment = experiment

        def save_to_dir(self, dirpath: str, session_str: str):
            super().save_to_dir(dirpath, session_str)
            target = _SNAPSHOT_TARGET.get(getattr(self, "_cem_experiment", ""))
            if target:
                try:
                    write_resume_snapshot(dirpath, session_str, target)
                except Exception as e:  # noqa: BLE001 - Ray's own files are still written
                    logger.warning("cem-bench: could not write %s: %r", target, e)

    SnapshotSearchGenerator.__module__ = __name__
    SnapshotSearchGenerator.__qualname__ = "SnapshotSearchGenerator"
    return SnapshotSearchGenerator


_LAZY_CLASSES = {"JournalOptunaSearch": _build_searcher_class, "SnapshotSearchGenerator": _build_generator_class}


def __getattr__(name: str):
    # These classes subclass Ray classes, so they are built on first use (this module imports Ray
    # lazily); pickle finds them here when Tuner.restore unpickles the search algorithm.
    if name in _LAZY_CLASSES:
        cls = _LAZY_CLASSES[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------- experiment-state guard
def _state_kind(name: str) -> str | None:
    for prefix in RAY_STATE_KINDS:
        if name.startswith(prefix):
            return prefix
    return None


def write_resume_snapshot(staging_dir: str, session_str: str, target: str) -> dict[str, bytes]:
    """Bundle the experiment checkpoint of ``session_str`` that Ray has just written into
    ``staging_dir`` into one file at ``target``, atomically. Returns the bundled files."""
    import pickle
    files: dict[str, bytes] = {}
    for entry in os.scandir(staging_dir):
        if entry.is_file() and _state_kind(entry.name) and entry.name.rsplit(".", 1)[0].endswith(session_str):
            with open(entry.path, "rb") as fh:
                files[entry.name] = fh.read()
    if not any(n.startswith("experiment_state-") for n in files):
        raise FileNotFoundError(f"no experiment_state-{session_str}.json in {staging_dir}")
    write_bytes(target, pickle.dumps({"format": 1, "session": session_str, "written_at": _now_iso(),
                                      "files": files}, protocol=4))
    return files


def _state_error(name: str, data: bytes) -> str | None:
    """Why Ray could not read this state file (None when it can): truncated or empty files."""
    import pickle
    if not data:
        return "empty file"
    try:
        if RAY_STATE_KINDS[_state_kind(name)] == "json":
            json.loads(data.decode())
        else:
            import ray.cloudpickle as cloudpickle
            cloudpickle.loads(data)
    except (EOFError, pickle.UnpicklingError, UnicodeDecodeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _read(fs, path: str) -> bytes:
    with fs.open_input_stream(path) as fh:
        return fh.read()


def _move_aside(fs, root: str, name: str, stamp: str) -> str:
    dest_dir = f"{root}/{SUPERSEDED_DIR}/{stamp}"
    fs.create_dir(dest_dir, recursive=True)
    fs.move(f"{root}/{name}", f"{dest_dir}/{name}")
    return f"{SUPERSEDED_DIR}/{stamp}/{name}"


def repair_experiment_state(exp_path: str) -> list[str]:
    """Make the experiment's Ray state files consistent and readable before ``Tuner.restore``.

    With a bundle (``cem_resume_state.bin``): its files are authoritative; a state file of the same
    name with other contents, or of a newer session, is moved to ``superseded_state/STAMP/`` and the
    bundle's files are written in place. Without one (an experiment killed before its first
    checkpoint, or written by an older cem-bench): an unreadable newest state file is moved aside so
    that Ray reads the previous session's. Raises ``SearchError`` when nothing restorable is left.
    Returns what was done, one line per file."""
    import pyarrow.fs as pafs
    fs, root = _fs(exp_path)
    root = root.rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    names = sorted(i.base_name for i in infos if i.type == pafs.FileType.File and _state_kind(i.base_name))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    done: list[str] = []

    from .results import read_resume_bundle
    try:
        snapshot = read_resume_bundle(exp_path)
    except ValueError as e:
        done.append(f"{e}; checking Ray's files alone")
        snapshot = None

    if snapshot is not None:
        files: dict[str, bytes] = snapshot["files"]
        session = snapshot["session"]
        for name in names:
            kind = _state_kind(name)
            file_session = name[len(kind):].rsplit(".", 1)[0]
            if name in files:
                if _read(fs, f"{root}/{name}") == files[name]:
                    continue
                why = "differs from the last complete checkpoint"
            elif file_session >= session:
                why = "is newer than the last complete checkpoint"
            else:
                continue  # an older session's file: Ray reads the newest, which the bundle provides
            done.append(f"{name} {why}: moved to {_move_aside(fs, root, name, stamp)}")
        present = {i.base_name for i in fs.get_file_info(pafs.FileSelector(root, recursive=False))}
        for name, data in files.items():
            if name not in present:
                write_bytes(join(exp_path, name), data)
                done.append(f"{name} restored from {RESUME_STATE_FILE} ({session})")
        return done

    for kind in RAY_STATE_KINDS:
        for name in sorted((n for n in names if n.startswith(kind)), reverse=True):
            why = _state_error(name, _read(fs, f"{root}/{name}"))
            if why is None:
                break
            done.append(f"{name} is unreadable ({why}): moved to {_move_aside(fs, root, name, stamp)}")
    left = {i.base_name for i in fs.get_file_info(pafs.FileSelector(root, recursive=False))}
    if not any(n.startswith("experiment_state-") for n in left):
        raise SearchError(f"--resume: {exp_path} holds no readable experiment state (the driver was killed "
                          f"before Ray wrote a complete one; {'; '.join(done) or 'none was written'}); start "
                          f"the search again under a new --name")
    return done


def journal_target(experiment_path: str, name: str) -> tuple[str, str | None]:
    """(local journal file, remote copy or None)."""
    if is_uri(experiment_path) and not experiment_path.startswith("file://"):
        local = os.path.join(os.path.expanduser("~/.cache/cem-bench/journals"), name, JOURNAL_FILE)
        return local, join(experiment_path, JOURNAL_FILE)
    return os.path.join(experiment_path, JOURNAL_FILE), None


def make_searcher(spec, experiment_path: str):
    from .spaces import define_by_run, make_sampler
    from ray.tune.search import ConcurrencyLimiter
    cls = __getattr__("JournalOptunaSearch")
    searcher = cls(space=define_by_run(spec), metric=spec.metric_names, mode=spec.modes,
                   sampler=make_sampler(spec), study_name=spec.name,
                   journal=journal_target(experiment_path, spec.name))
    # the generator is built here (not by Tune) so that it can bundle the experiment state; Tune applies
    # max_concurrent_trials only to a bare Searcher, so the limiter is added here too
    limited = ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)
    return __getattr__("SnapshotSearchGenerator")(limited, spec.name)


# ------------------------------------------------------------------------------------------- search
def _detect_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def run_search(spec, storage: str | None = None, address: str | None = None, resume: bool = False,
               stats: dict | None = None) -> str:
    """Run (or with ``resume`` continue) the search of ``spec``; return the experiment path.

    Local mode (no ``address``) starts Ray on this machine (``ray.init``, no dashboard) unless a Ray
    session is already initialised in this process, in which case that one is used (tests). Cluster
    mode connects with ``ray.init(address=...)``. ``stats`` (a dict), when given, receives timings:
    ``ray_start_s``, ``trials_s``, ``trials_ok``, ``trials_error``, ``mode``.
    """
    import ray
    from ray import tune

    stats = stats if stats is not None else {}
    storage = resolve_storage(storage)
    exp_path = join(storage, spec.name)
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
    try:
        gpus = None if address else float(ray.cluster_resources().get("GPU", 0.0))
        resources, note = trial_resources(spec.resources, gpus)
        if note:
            print(note, flush=True)
        die_env = os.environ.get(DIE_ENV)
        die_at = int(die_env) if die_env else None
        trainable = with_resources(make_trainable(exp_path, spec, resources, die_at), resources)
        _JOURNAL_TARGET[spec.name] = journal_target(exp_path, spec.name)
        _SNAPSHOT_TARGET[spec.name] = join(exp_path, RESUME_STATE_FILE)

        t1 = time.perf_counter()
        if resume:
            if not tune.Tuner.can_restore(exp_path):
                raise SearchError(f"--resume: Ray cannot restore {exp_path}")
            if exists(join(exp_path, SPACE_FILE)):
                _warn_if_changed(spec, join(exp_path, SPACE_FILE))
            for line in repair_experiment_state(exp_path):
                print(f"--resume: {line}", flush=True)
            print(f"resuming {exp_path}", flush=True)
            tuner = tune.Tuner.restore(exp_path, trainable=trainable, resume_unfinished=True, resume_errored=True)
        else:
            write_json_to(join(exp_path, SPACE_FILE), spec.to_dict())
            tuner = tune.Tuner(
                trainable,
                param_space={},
                tune_config=tune.TuneConfig(
                    search_alg=make_searcher(spec, exp_path),
                    num_samples=spec.num_samples,
                    max_concurrent_trials=None,  # the ConcurrencyLimiter inside the search algorithm
                    reuse_actors=True,
                ),
                run_config=tune.RunConfig(
                    name=spec.name,
                    storage_path=storage,
                    failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                    verbose=1,
                ),
            )
        grid = tuner.fit()
        stats["trials_s"] = time.perf_counter() - t1
        ok = err = 0
        for r in grid:
            m = r.metrics or {}
            if r.error is None and m.get("status") == "ok":
                ok += 1
            else:
                err += 1
        stats["trials_ok"], stats["trials_error"] = ok, err
    finally:
        _JOURNAL_TARGET.pop(spec.name, None)
        _SNAPSHOT_TARGET.pop(spec.name, None)
        if started_ray:
            ray.shutdown()
    return exp_path


def _warn_if_changed(spec, path: str) -> None:
    try:
        fs, p = _fs(path)
        with fs.open_input_stream(p) as fh:
            saved = json.loads(fh.read().decode())
    except Exception:  # noqa: BLE001
        return
    from .trial import jsonable
    now = jsonable(spec.to_dict())
    diff = [k for k in now if k != "path" and saved.get(k) != now[k]]
    if diff:
        print(f"note: the space differs from the experiment's search_space.json in {', '.join(diff)}; the "
              f"restored experiment keeps its own sampler, budget and parameters (new resources apply)",
              flush=True)


# ---------------------------------------------------------------------------------------------- CLI
def overrides_from_args(args) -> dict:
    from .config import parse_set
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


def main(args) -> int:
    """``cem-bench search``: validate, search, write tables and report, print a summary."""
    from .spaces import load_space
    t_all = time.perf_counter()
    spec = load_space(args.space, overrides_from_args(args))  # SpaceError -> the CLI prints it, exit 2
    stats: dict[str, Any] = {}
    print(f"cem-bench search: {spec.name}: {spec.num_samples} trials, {spec.max_concurrent} at a time, "
          f"objectives {', '.join(f'{o.metric} ({o.mode})' for o in spec.objectives)}", flush=True)
    exp = run_search(spec, storage=args.storage, address=args.address, resume=bool(args.resume), stats=stats)

    t_write = time.perf_counter()
    from . import results
    trials_path, epochs_path = results.write_tables(exp)
    index = None
    if not is_uri(exp):
        try:
            from .report import build_report
        except ImportError:
            build_report = None
        if build_report is not None:
            try:
                index = build_report(exp)
            except Exception as e:  # noqa: BLE001 - the tables are written; the report can be rebuilt
                print(f"cem-bench: the report could not be built ({type(e).__name__}: {e}); "
                      f"rebuild it with `cem-bench report {exp}`", file=sys.stderr)
    write_s = time.perf_counter() - t_write

    import pandas as pd
    if is_uri(str(trials_path)):
        n_ok, n_err = stats.get("trials_ok", 0), stats.get("trials_error", 0)
    else:
        df = pd.read_parquet(trials_path)
        n_ok, n_err = int((df["status"] == "ok").sum()), int((df["status"] != "ok").sum())
    print(f"experiment: {exp}")
    print(f"trials: {trials_path}")
    print(f"epochs: {epochs_path}")
    if index is not None:
        print(f"report: {index}")
    elif is_uri(exp):
        print(f"report: sync the folder (e.g. `aws s3 sync {exp} results/{spec.name}`) and run "
              f"`cem-bench report results/{spec.name}`")
    print(f"summary: {n_ok} trial(s) ok, {n_err} error(s); mode {stats.get('mode')}; wall "
          f"{time.perf_counter() - t_all:.1f} s = Ray start {stats.get('ray_start_s', 0):.1f} s + trials "
          f"{stats.get('trials_s', 0):.1f} s + writing {write_s:.1f} s (+ setup)")
    return 0
