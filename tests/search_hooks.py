"""Faults the search tests inject into every trial (``search.run_search(..., hooks=...)``, ``TrialHooks``).

The hooks run in Ray's worker processes, which cannot import this file (``tests/`` is not on their path): each
hook registers this module with ``ray.cloudpickle.register_pickle_by_value`` when it is made, so the trainable
carries the classes themselves, not a reference to a module the worker lacks.

``python -c 'import search_hooks; search_hooks.main()' --full-while MARKER search SPACE ...`` (with ``tests/`` on
``PYTHONPATH``) is ``cem-bench search SPACE ...`` whose trials run with ``FullWhile(MARKER)`` (``--wait-for
RELEASE``: ``WaitFor``; ``--hold-after-first RELEASE``: ``HoldAfter``; ``--slow-report MARKER``: the report
waits, ``slow_report``): the command line itself cannot inject a hook.
"""

from __future__ import annotations

import errno
import functools
import os
import sys

from cem_bench.search.trainable import TrialHooks
from cem_bench.storage import exists, join, write_bytes

DIE_MARKER = ".test_died"   # in the trial's folder: the worker has died once


def _by_value() -> None:
    import ray.cloudpickle
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DieOnce(TrialHooks):
    """The trial's worker process ends (``os._exit(1)``) right after reporting epoch ``epoch``, once per trial
    (``DIE_MARKER`` in the trial's folder lets later attempts go on): Ray retries it from that checkpoint."""

    def __init__(self, epoch: int):
        _by_value()
        self.epoch = epoch

    def after_report(self, record: dict, trial_path: str, trial_id: str) -> None:
        if record.get("epoch") != self.epoch:
            return
        marker = join(trial_path, DIE_MARKER)
        if not exists(marker):
            write_bytes(marker, b"died once\n")
            print(f"[cem-bench] test hook: trial {trial_id} exits after epoch {self.epoch}", flush=True)
            os._exit(1)


class FullWhile(TrialHooks):
    """While the file ``marker`` exists, saving an epoch's checkpoint fails with ENOSPC (a full storage)."""

    def __init__(self, marker: str):
        _by_value()
        self.marker = str(marker)

    def before_report(self, record: dict, trial_path: str, trial_id: str) -> None:
        if os.path.exists(self.marker):
            raise OSError(errno.ENOSPC, "No space left on device (test hook)", trial_path)


class WaitFor(TrialHooks):
    """Each trial's first report waits until the file ``release`` exists (at most ``timeout`` seconds): the
    search stays running, whatever the machine's load, for as long as a test needs it to."""

    def __init__(self, release: str, timeout: float = 600.0):
        _by_value()
        self.release, self.timeout = str(release), timeout

    def before_report(self, record: dict, trial_path: str, trial_id: str) -> None:
        import time
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(self.release) and time.monotonic() < deadline:
            time.sleep(0.1)


def held_markers(release) -> list[str]:
    """The trials ``HoldAfter(release)`` holds now: each wrote ``<release>.held.<trial id>`` as it began to wait."""
    import glob
    return sorted(glob.glob(glob.escape(str(release)) + ".held.*"))


class HoldAfter(TrialHooks):
    """Each trial, once epoch ``epoch``'s result and checkpoint are reported, writes ``<release>.held.<trial id>``
    and waits until the file ``release`` exists (at most ``timeout`` seconds): every trial is held mid-run, its
    checkpoint saved, for as long as a test needs (a node can be lost under a trial known to be running).

    The marker, not the checkpoint's file in the storage, says the checkpoint is the trial's: the file is
    uploaded inside ``tune.report``, before the driver records it as the trial's checkpoint, and ``report``
    returns (this hook runs) only after the driver has. A node killed in between retried its trial from
    scratch."""

    def __init__(self, release: str, epoch: int = 1, timeout: float = 600.0):
        _by_value()
        self.release, self.epoch, self.timeout = str(release), epoch, timeout

    def after_report(self, record: dict, trial_path: str, trial_id: str) -> None:
        import time
        if record.get("epoch") != self.epoch:
            return
        with open(f"{self.release}.held.{trial_id}", "w"):
            pass
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(self.release) and time.monotonic() < deadline:
            time.sleep(0.1)


def slow_report(marker: str) -> None:
    """The report's drawing first writes its staging folder's path into ``marker``, then waits (up to 10 min)
    for a signal: the search is over and its tables written, the report not yet published."""
    import time

    from cem_bench.analysis.report import page
    draw = page._draw

    def waiting(res, out_dir):
        with open(marker + ".tmp", "w") as f:
            f.write(str(out_dir))
        os.replace(marker + ".tmp", marker)
        time.sleep(600)
        return draw(res, out_dir)
    page._draw = waiting


def main(argv: list[str] | None = None) -> None:
    """``--full-while MARKER``, ``--wait-for RELEASE`` or ``--hold-after-first RELEASE``, then the arguments of
    ``cem-bench``: the command with that hook in every trial."""
    argv = list(sys.argv[1:] if argv is None else argv)
    hooks = None
    if argv[:1] == ["--full-while"]:
        hooks, argv = FullWhile(argv[1]), argv[2:]
    elif argv[:1] == ["--wait-for"]:
        hooks, argv = WaitFor(argv[1]), argv[2:]
    elif argv[:1] == ["--hold-after-first"]:
        hooks, argv = HoldAfter(argv[1]), argv[2:]
    elif argv[:1] == ["--slow-report"]:
        slow_report(argv[1])
        argv = argv[2:]
    from cem_bench import cli
    from cem_bench.search import run
    run.run_search = functools.partial(run.run_search, hooks=hooks)   # what search_command calls
    sys.exit(cli.main(argv))
