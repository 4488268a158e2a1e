"""The Ray Tune function trainable of a search: one trial = ``run_trial`` with a checkpoint per epoch.

See the package docstring for how failures, retries and resumption work. Ray is imported inside the
trainable (it runs in a Ray worker).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable

from ..errors import TRIAL_FATAL, ResultsError, StorageFull
from ..provenance import git_sha
from ..provenance import now_iso as _now_iso
from ..schema import GALLERY_FILE, OBJECTIVE_METRICS, RESULT_FILE, STATE_FILE
from ..storage import copy_file, join, write_json

TRAINABLE_NAME = "cem_trial"  # Tuner.restore needs the same trainable name


class TrialHooks:
    """What a trial calls at each epoch besides its own work: nothing, unless ``run_search(hooks=...)`` hands it an
    object with these methods (the tests inject faults through it, ``tests/search_hooks.py``; the command line
    cannot). It runs inside the Ray worker of the trial, carried there pickled with the trainable, so it must
    pickle (and unpickle in a worker). ``record`` is the epoch's record (``record["epoch"]``), ``trial_path``
    the trial's folder or URI in the experiment, ``trial_id`` Ray's id of the trial."""

    def before_report(self, record: dict, trial_path: str, trial_id: str) -> None:
        """Before the epoch's checkpoint is saved and its result reported (an ``OSError`` raised here is the
        trial's: ENOSPC stops the search as a full storage does)."""

    def after_report(self, record: dict, trial_path: str, trial_id: str) -> None:
        """After the epoch's result and checkpoint are reported (the worker may end here: Ray retries the trial
        from that checkpoint)."""


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
STAGING_PREFIXES = ("cem-bench-trial-", "cem-bench-ckpt-")   # + the worker's pid, in the temp folder


def staging_dirs(pid: int, tmp: str | None = None) -> tuple[str, str]:
    """The gallery and checkpoint staging folders of worker process ``pid``."""
    tmp = tmp or tempfile.gettempdir()
    return tuple(os.path.join(tmp, f"{prefix}{pid}") for prefix in STAGING_PREFIXES)


def private_dir(path: str) -> str:
    """A folder at ``path`` (emptied) that only this user can enter (mode 0o700, made here), or, when the name is
    held by something this user cannot remove, a new one beside it that still names the pid. The staging folders
    are in the shared temp folder under predictable names: a folder, or a link, planted there by another local user
    would let them swap the gallery or a checkpoint file for a link between the trial's write and Ray's or
    ``finish``'s read, and so copy a file only this user may read into the results (the review of 2026-12-06)."""
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.mkdir(path, 0o700)
        return path
    except FileExistsError:
        return tempfile.mkdtemp(prefix=os.path.basename(path) + "-", dir=os.path.dirname(path))


def clear_dead_staging(tmp: str | None = None) -> list[str]:
    """Remove the staging folders of worker processes that no longer run (a worker killed with its trial, or
    ended with Ray, leaves the folders of its last trial: nothing runs its clean-up); returns what it removed.
    A folder whose pid runs is kept, whoever owns the process."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        prefix = next((p for p in STAGING_PREFIXES if name.startswith(p)), None)
        digits = name[len(prefix):].split("-", 1)[0] if prefix else ""   # private_dir's own name: pid-XXXX
        if not digits.isdigit():
            continue
        pid = int(digits)
        try:
            os.kill(pid, 0)
            continue                      # alive
        except ProcessLookupError:
            pass
        except PermissionError:           # alive, another user's
            continue
        shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        removed.append(name)
    return removed


def _scalars(record: dict) -> dict:
    out = {}
    for k, v in record.items():
        if isinstance(v, bool) or isinstance(v, (int, float, str)) or v is None:
            out[k] = v
        elif hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            out[k] = v.item()
    return out


def finished_result(experiment_path: str, trial_dir_name: str, trial_id: str) -> dict | None:
    """The trial's own ``trial_result.json`` where it records this trial's finished run (status ``ok``), else
    None. A trial writes it just before its last ``tune.report``; one stopped in between (Ctrl-C while it
    finished, a node lost) is not done for Tune, and ``--resume`` restarts it from its last checkpoint: it
    would attack (or train) again for nothing and replace the result already in the tables. An unreadable or
    foreign file is None: the trial runs as it would have."""
    from ..parsing import loads_json
    from ..storage import Dir
    try:
        text = Dir(experiment_path).read_text(trial_dir_name, RESULT_FILE)
        doc = loads_json(text) if text is not None else None
    except Exception:  # noqa: BLE001 - an unreadable or damaged file is no finished result
        return None
    if isinstance(doc, dict) and doc.get("status") == "ok" and doc.get("trial_id") == trial_id:
        return doc
    return None


def reset_compiled() -> None:
    """Forget what torch.compile made in this process, at the start of each trial. A reused worker
    (``reuse_actors``) compiles a new surrogate every trial, and Dynamo's guards on the code it already compiled
    (one per module attribute such as ``noise_std``) count as recompiles of the same functions: past
    ``torch._dynamo.config.recompile_limit`` (8) Dynamo runs them eagerly without a word, so a worker's later
    trials ran uncompiled and their timings were not comparable with its first ones. A process that has not
    imported Dynamo has compiled nothing: it is not imported here for nothing (docs/performance.md)."""
    import sys
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and hasattr(dynamo, "reset"):
        dynamo.reset()


def cpu_without_gpu_share(flat: dict, gpu_frac: float) -> dict:
    """``flat`` with ``train.device: cpu`` where the trial was given no GPU (``resources.gpu`` 0) and its device
    is ``auto``. Ray leaves CUDA_VISIBLE_DEVICES alone for a task with no GPU, so ``auto`` saw the node's cards
    and trained on cuda:0 outside Ray's accounting and with no memory fraction, beside the trials that were
    given that card. Naming the device in the config, rather than hiding the cards through
    CUDA_VISIBLE_DEVICES, also holds in a reused worker whose CUDA is already initialised (the variable is
    read once per process), and the trial's result records it (``info.config``, ``info.device``). An explicit
    ``cuda``/``cuda:N`` is left as asked."""
    if gpu_frac <= 0 and str(flat.get("train.device", "auto")) == "auto":
        return {**flat, "train.device": "cpu"}
    return flat


def make_trainable(experiment_path: str, spec, resources: dict, hooks: TrialHooks | None = None) -> Callable:
    """The function trainable of a search (named ``cem_trial``), not yet wrapped with resources.

    ``experiment_path`` is the experiment folder or URI (where ``trial_result.json`` and ``recon.png`` go),
    ``spec`` the SearchSpec (objectives, fixed keys), ``resources`` the per-trial resources, ``hooks`` what
    each epoch also calls (``TrialHooks``; None: nothing).
    """
    objectives = list(spec.metric_names)
    cpus = float(resources.get("cpu", 1.0))
    gpu_frac = float(resources.get("gpu", 0.0))

    def cem_trial(config: dict) -> None:
        import ray
        import torch
        from ray import tune

        from ..core.checkpoint import load_state, save_state
        from ..core.trial import build_config, run_trial
        from ..spaces import trial_config
        from .diskspace import is_enospc

        started_at = _now_iso()
        reset_compiled()
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

        done = finished_result(experiment_path, trial_dir_name, trial_id)
        state = None
        resumed_from = 0
        ckpt = tune.get_checkpoint() if done is None else None
        if ckpt is not None:
            with ckpt.as_directory() as d:
                # weights only: the experiment storage may be a shared bucket. A damaged or crafted state is
                # refused (nothing of it runs) and the trial starts again from epoch 1.
                try:
                    state = load_state(os.path.join(d, STATE_FILE))
                except ResultsError as e:
                    print(f"[cem-bench] trial {trial_id}: its checkpoint was refused ({e}); starting from "
                          f"epoch 1", flush=True)
        if state is not None:
            resumed_from = int(state["epoch"])
            print(f"[cem-bench] trial {trial_id}: resuming from the checkpoint of epoch {resumed_from}", flush=True)
        history: list[dict] = list(state["history"]) if state is not None else []

        # the searcher's reason for the trial (baseline, search, confirm) is not a config key
        config = dict(config)
        role = str(config.pop("role", "search"))
        try:
            flat = trial_config(spec, config)
        except Exception:  # noqa: BLE001 - from_flat reports the problem below
            flat = dict(config)
        else:
            flat = cpu_without_gpu_share(flat, gpu_frac)

        def base_metrics(record: dict) -> dict:
            m = _scalars(record)
            for k in set(OBJECTIVE_METRICS) | set(objectives):
                m.setdefault(k, nan)
            m.update(node)
            m["resumed_from_epoch"] = resumed_from
            return m

        if done is not None:
            print(f"[cem-bench] trial {trial_id}: already finished (its {RESULT_FILE} of {done.get('finished_at')}); "
                  f"reporting that result, not running it again", flush=True)
            metrics = base_metrics({k: v for k, v in done.items() if k not in ("info", "role")})
            metrics.update({k: done[k] for k in (*node, "resumed_from_epoch") if k in done})
            tune.report(metrics)
            return

        # Per worker process, not per trial: a trial that a scheduler stops ends with SystemExit inside
        # tune.report while its actor is shut down or reused, so its own clean-up may never run. The next trial of
        # the same process clears what the last one left, and any trial clears those of processes that have ended.
        # Each is made private (private_dir) when it is needed: the gallery's at the start, the checkpoint's at
        # each report.
        out_dir, ckpt_base = staging_dirs(os.getpid())
        shutil.rmtree(ckpt_base, ignore_errors=True)
        out_dir = private_dir(out_dir)   # run_trial writes the gallery into it at the end
        clear_dead_staging()

        def finish(result: dict, status: str, error: str | None) -> None:
            info = dict(result.get("info") or {})
            gallery = os.path.join(out_dir, GALLERY_FILE)
            if os.path.isfile(gallery):
                copy_file(gallery, join(trial_path, GALLERY_FILE))
                info["gallery"] = GALLERY_FILE
            else:   # never the private staging folder's path, which is gone once the trial ends
                info["gallery"] = None
            full = {**{k: v for k, v in result.items() if k != "info"}, "status": status, "error": error, "role": role,
                    **node, "trial_dir": trial_dir_name, "started_at": started_at, "finished_at": _now_iso(),
                    "resumed_from_epoch": resumed_from, "info": info}
            write_json(join(trial_path, RESULT_FILE), full)
            metrics = base_metrics({k: v for k, v in full.items() if k not in ("info", "role")})
            if status != "ok":
                for k in set(OBJECTIVE_METRICS) | set(objectives):
                    metrics[k] = nan
            tune.report(metrics)

        def report(record: dict, final: bool, state_fn=None) -> None:
            if final:
                finish(record, "ok", None)
                return
            history.append(dict(record))
            if hooks is not None:
                hooks.before_report(record, trial_path, trial_id)
            metrics = base_metrics(record)
            metrics["status"] = "running"
            ckpt_dir = private_dir(ckpt_base)
            try:
                if state_fn is not None:
                    save_state(os.path.join(ckpt_dir, STATE_FILE), state_fn())
                # Ray copies the checkpoint to the storage inside report
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(ckpt_dir) if state_fn else None)
            finally:
                shutil.rmtree(ckpt_dir, ignore_errors=True)
            if hooks is not None:
                hooks.after_report(record, trial_path, trial_id)

        try:
            run_trial(flat, report, out_dir=out_dir, resume_state=state)
        except OSError as e:
            if not is_enospc(e):
                raise
            # not an error row (there is no space to write one) and not a retry into the same full disk: the
            # driver's StorageGuard reads this from error.txt and stops the search
            raise StorageFull(f"StorageFull: no space left in {experiment_path} ({e}); the trial stopped after "
                              f"epoch {history[-1]['epoch'] if history else 0}") from e
        except TRIAL_FATAL as e:
            reason = f"{type(e).__name__}: {e}"
            print(f"[cem-bench] trial {trial_id} ended with an error (not retried): {reason}", flush=True)
            try:
                resolved = build_config(flat).to_flat()
            except Exception:  # noqa: BLE001
                resolved = flat
            result = {k: nan for k in OBJECTIVE_METRICS}
            result["epochs_done"] = history[-1]["epoch"] if history else 0
            result["info"] = {"config": resolved, "history": history, "torch_version": torch.__version__}
            try:
                from .. import __version__
                result["info"].update(package_version=__version__, git_sha=git_sha())
            except Exception:  # noqa: BLE001
                pass
            finish(result, "error", reason)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    cem_trial.__name__ = cem_trial.__qualname__ = TRAINABLE_NAME
    return cem_trial
