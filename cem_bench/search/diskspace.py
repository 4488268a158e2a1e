"""A full storage stops the search cleanly: no new trials, one message, exit 2, and ``--resume`` finishes it.

Without this, a full disk is a cascade: every trial's checkpoint upload fails with ENOSPC, Ray retries it and
launches new trials into the same full disk, and the driver ends in a traceback from Ray reading a
truncated error file. Here:

* before starting, ``estimate_bytes`` (checkpoint size from the models' parameter counts x the checkpoints
  Tune keeps x the trials, plus each trial's result files) is compared with the free space of a local
  storage and a warning printed when it does not fit;
* a trial that hits ENOSPC raises ``StorageFull`` naming the storage and its free space (trainable.py);
* ``StorageGuard`` (a Tune callback and stopper) reads each failed trial's ``error.txt`` (text, in the driver's
  staging folder) and, at the first out-of-space failure, interrupts Tune the way Ctrl+C does (SIGUSR1, which
  Tune handles by saving its state and ending the run); ``run_search`` then raises ``errors.StorageFull``,
  which the CLI prints with the advice and exit code 2.

The failed trial is errored in Ray's state and the others are unfinished, so ``--resume``
(``resume_errored=True``, ``resume_unfinished=True``) runs them again from their last checkpoints once space
is freed; a finished trial is not run twice.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import threading

from ray.tune import Callback
from ray.tune.stopper import Stopper

from ..storage import is_remote, nearest_existing
from . import driver

ENOSPC_TEXT = ("No space left on device", f"[Errno {errno.ENOSPC}]", "Disk quota exceeded")   # an OS's words
FULL_TEXT = (*ENOSPC_TEXT, "StorageFull")   # ... or the trainable's StorageFull, in a trial's error.txt
CHECKPOINTS_KEPT = 2          # CheckpointConfig(num_to_keep=2) in run_search
RESULT_FILES_BYTES = 200_000  # per trial: result.json lines, trial_result.json, recon.png, error.txt


def is_enospc(exc: BaseException | None) -> bool:
    """Is ``exc`` (or an exception it was raised from) an out-of-space error? pyarrow's filesystem errors
    carry the text rather than the errno."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(t in str(exc) for t in ENOSPC_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def free_bytes(storage: str) -> int | None:
    """Free bytes where a local ``storage`` is (its nearest existing folder); None for object storage."""
    if is_remote(storage):
        return None
    try:
        return shutil.disk_usage(nearest_existing(storage)).free
    except OSError:
        return None


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def estimate_bytes(spec) -> tuple[int, int]:
    """``(total, per checkpoint)``: what the search will write into its storage, estimated from the fixed
    config (searched keys at their defaults): the trainer state is about the client's and server's
    parameters twice (weights and SGD momentum; three times with ``train.select_best_last``), Tune keeps
    ``CHECKPOINTS_KEPT`` per trial, and every trial writes its result files."""
    from ..config import TrialConfig
    from ..core.models import build, count_params
    try:
        cfg = TrialConfig.from_flat({k: v for k, v in spec.fixed.items()})
        classes = 100 if cfg.data.dataset == "cifar100" else 10
        client, server = build(cfg.model, classes, (3, 32, 32))
        params = count_params(client) + count_params(server)
    except Exception:  # noqa: BLE001 - an estimate only: never stop a search over it
        return 0, 0
    copies = 3 if getattr(cfg.train, "select_best_last", 0) else 2
    per_ckpt = int(params * 4 * copies * 1.1)   # +10 %: buffers, the surrogate, the history
    return spec.total_runs * (CHECKPOINTS_KEPT * per_ckpt + RESULT_FILES_BYTES), per_ckpt


def warn_if_short(spec, storage: str) -> str | None:
    """The warning to print when a local storage has less free space than the search will write."""
    free = free_bytes(storage)
    need, per_ckpt = estimate_bytes(spec)
    if free is None or not need or free >= need:
        return None
    return (f"warning: {storage} has {mib(free)} free; this search writes about {mib(need)} ({spec.total_runs} trials x "
            f"{CHECKPOINTS_KEPT} checkpoints of ~{mib(per_ckpt)} kept, plus results). If the disk fills, the "
            f"search stops and `--resume` finishes it once space is freed")


def full_message(storage: str, where: str | None = None) -> str:
    free = free_bytes(storage)
    return (f"the storage {storage} is full ({mib(free) + ' free' if free is not None else 'out of space'}"
            f"{'; ' + where if where else ''}): the search stopped launching trials. Nothing finished was lost. "
            f"Free some space there (or move the experiment folder to a larger disk) and run the same "
            f"`cem-bench search ... --resume` to finish the stopped trials from their last checkpoints")


class _OneLineWhenFull(logging.Filter):
    """Ray logs a trial's failure, and a failed save of its experiment state, with the whole traceback; when
    the cause is a full disk the traceback says nothing the final message does not, so it becomes one line.
    Ray's words on the interruption the guard caused ("Stop signal received (e.g. via SIGINT/Ctrl+C)",
    "Resume experiment with: Tuner.restore(...)") are replaced by what they mean here."""

    def __init__(self, guard: StorageGuard | None = None):
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if self.guard is not None and self.guard.full and ("Stop signal received" in text
                                                           or "has been interrupted" in text):
            record.msg, record.args = "stopping the search: the storage is full", ()
        elif record.exc_info and is_enospc(record.exc_info[1]) or any(t in text for t in FULL_TEXT):
            first = text.strip().splitlines()[0] if text.strip() else "error"
            record.msg, record.args, record.exc_info, record.exc_text = f"{first} (out of space)", (), None, None
        return True


@contextlib.contextmanager
def one_line_when_full(guard: StorageGuard | None = None):
    """While the search runs: Ray's out-of-space tracebacks as one line each (``_OneLineWhenFull``)."""
    filt = _OneLineWhenFull(guard)
    handlers = [h for name in ("ray", "ray.tune", "") for h in logging.getLogger(name).handlers]
    for h in handlers:
        h.addFilter(filt)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(filt)


class StorageGuard(Callback, Stopper):
    """Stops the experiment at the first trial that failed for lack of space (see the module docstring).

    ``key`` is the experiment's name. A restored experiment's RunConfig holds the guard as the first driver
    pickled it (``Tuner.restore`` takes no new callbacks or stopper), so every hook first finds the live guard of
    the driver running now, registered under ``key`` (``driver.DriverPaths.guard``), and reports into it: the
    state the driver reads after ``fit()`` (``full``, ``interrupted``) and the storage it checks are that one's.
    """

    def __init__(self, storage: str, key: str | None = None):
        self.storage = storage
        self.key = key
        self.full: str | None = None     # the trial that hit it
        self.interrupted = False

    def live(self) -> StorageGuard:
        """The guard of the driver running this experiment in this process (this one when it is not registered,
        outside a search, or none is)."""
        key = getattr(self, "key", None)   # a guard pickled by an older cem-bench has no key: the one search here
        paths = driver.lookup(key) if key is not None else driver.sole()
        guard = paths.guard if paths is not None else None
        return guard if isinstance(guard, StorageGuard) else self

    def _check(self, trial) -> None:
        if self.full is not None:
            return
        text = ""
        try:
            if trial.error_file and os.path.isfile(trial.error_file):
                with open(trial.error_file, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()[-20_000:]
        except OSError:
            pass
        free = free_bytes(self.storage)
        if any(t in text for t in FULL_TEXT) or (free is not None and free < 64 * 1024):
            self.full = str(trial.trial_id)
            print(f"cem-bench: trial {trial.trial_id} failed for lack of space in {self.storage}; stopping the "
                  f"search", flush=True)
            # Tune's own interruption (what Ctrl+C does): it saves the experiment state with the running trials
            # unfinished, so that --resume runs them again. A Stopper's stop_all would mark them TERMINATED,
            # as if they had finished, and --resume would never run them.
            if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
                self.interrupted = True
                signal.raise_signal(signal.SIGUSR1)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.live()._check(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.live()._check(trial)

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        guard = self.live()
        return guard.full is not None and not guard.interrupted
