"""Ctrl-C and SIGTERM end a search as an interruption, not as a failure.

Ray Tune stops gracefully on its own SIGINT handler: it stops the trials, saves the experiment one last time
and returns. But it told nobody that it was interrupted (the search then counted the trials in flight as
errors and exited 0), it named only ``Tuner.restore(...)``, and SIGTERM, which it does not handle, aborted
the driver in Ray's C++ code (exit 134). Here both signals take the same graceful path:

* while ``tuner.fit()`` runs, the first SIGINT or SIGTERM is recorded and handed to Tune as SIGUSR1, which
  Tune always listens to for exactly this stop (its SIGINT handler is turned off, so that this one sees
  every Ctrl-C); a second signal stops at once (KeyboardInterrupt);
* before and after ``fit`` a signal is a KeyboardInterrupt: Python's default for SIGINT, and for SIGTERM
  :func:`terminating_raises` (``cem-bench``'s whole command; Python's default would end the process without
  running a single ``finally``, leaving the report's staging folder in the temp folder, and ``ray.init`` puts in
  a ``sys.exit(15)`` of its own, which ``search.run`` takes out again with Ray);
* the experiment folder then gets :data:`~cem_bench.schema.INTERRUPTED_FILE` (the signal, when, the
  command that continues it); the tables mark the trials that were in flight ``interrupted`` (not
  ``error``), the report says the search was interrupted, and ``cem-bench search`` exits 130 (SIGINT) or
  143 (SIGTERM) with the ``--resume`` command as its last line. A search writes a hard stop's record there
  before Tune's loop (``results.hard_stop_record``: a driver killed without a word leaves it); a signal's
  record, or a full storage's, replaces it, and a search (or ``--resume``) that ends its loop removes it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time

from ..storage import is_uri

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Terminated(KeyboardInterrupt):
    """SIGTERM outside Tune's loop: raised as Ctrl-C's KeyboardInterrupt is, so that every ``finally`` and
    ``with`` runs (staging folders removed, the experiment lock released); ``cem-bench`` then exits 143."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def terminating_raises():
    """Within it, SIGTERM raises :class:`Terminated` (in the main thread; elsewhere signals never arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def interrupt_for(signum) -> KeyboardInterrupt:
    """What a signal that stops at once raises: :class:`Terminated` for SIGTERM (exit 143), else
    KeyboardInterrupt (130)."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


class Interruption:
    """A context around ``tuner.fit()``: ``signal`` is the first SIGINT/SIGTERM received inside it, or None."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self.at: float | None = None
        self._saved: dict = {}
        self._env: str | None = None

    def _handler(self, signum, frame) -> None:
        if self.signal is not None:
            raise interrupt_for(signum)   # a second signal: stop now
        tune_listens = signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        if not tune_listens:
            raise interrupt_for(signum)   # Tune's loop is not running: nothing to stop gracefully
        self.signal, self.at = signal.Signals(signum), time.time()
        print(f"\ncem-bench: {self.signal.name} received: stopping the trials in flight and saving the experiment "
              f"(send it again to stop at once)", file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGUSR1)   # Tune's own graceful stop (ray/tune/tune.py)

    def __enter__(self) -> Interruption:
        if threading.current_thread() is not threading.main_thread():
            return self   # signals reach only the main thread: nothing to install
        self._env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        for sig in EXIT_CODES:
            self._saved[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        if self._saved:
            if self._env is None:
                os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
            else:
                os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = self._env
        # Tune's SIGUSR1 handler stays installed after fit; put the default back so that a later stray
        # SIGUSR1 is not swallowed by a finished run
        if self._saved and hasattr(signal, "SIGUSR1"):
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def resume_command(args, name: str, storage: str) -> str:
    """The exact ``cem-bench search ... --resume`` that continues this experiment: the same space, the
    storage made absolute and the name explicit, the same address, overrides, sample count, resources and MPS."""
    cmd = ["cem-bench", "search", os.path.abspath(args.space) if not is_uri(args.space) else args.space,
           "--storage", storage, "--name", name]
    if getattr(args, "address", None):
        cmd += ["--address", args.address]
    # --num-samples is part of the space a resume must match (it was dropped, and the printed command was refused)
    for flag, attr in (("--num-samples", "num_samples"), ("--gpus-per-trial", "gpus_per_trial"),
                       ("--cpus-per-trial", "cpus_per_trial")):
        if getattr(args, attr, None) is not None:
            cmd += [flag, f"{getattr(args, attr):g}"]
    if getattr(args, "mps", "auto") not in (None, "auto"):
        cmd += ["--mps", args.mps]
    for item in getattr(args, "set", None) or []:
        cmd += ["--set", item]
    return shlex.join([*cmd, "--resume"])

