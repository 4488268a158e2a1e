"""What the pickled search objects need from the driver that runs them now, found by the experiment's name.

Ray Tune pickles the search algorithm, the scheduler and the RunConfig's callbacks and stopper with the
experiment, and ``Tuner.restore`` gives a resumed driver those copies, as the first driver made them (it takes
no new RunConfig). A copy cannot hold where *this* driver writes (the experiment may have moved; a remote
storage's journal is kept in this machine's cache) nor the live objects whose state this driver reads after
``fit()``. So ``run_search`` registers one ``DriverPaths`` under the experiment's name for as long as its
search runs (``with active(name, paths): ...``) and the objects look it up by the name they were built with
(``lookup(name)``): the searcher its Optuna journal and resume bundle, the search generator where its new
trials go, the MOASHA scheduler its state file, the storage guard the live guard it reports into. Outside a
search nothing is registered and they fall back to what they carry themselves (or do nothing).

Everything here runs in the driver process (Tune calls its searcher, scheduler and callbacks there); the
trainable, which runs in Ray's workers, never looks anything up. No Ray import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["DriverPaths", "active", "lookup", "sole"]


@dataclass
class DriverPaths:
    """What a search's pickled objects need from the driver that runs it (None: not used by this search)."""

    journal: tuple[str, str | None] | None = None   # the Optuna journal: (local file, remote copy or None)
    snapshot: str | None = None                     # the resume bundle (cem_resume_state.bin), path or URI
    scheduler_state: str | None = None              # the scheduler's state file (scheduler_state.jsonl)
    guard: Any = None                               # the live StorageGuard, whose state the driver reads
    storage: str | None = None                      # the storage the experiment folder is in now (path or URI)


_ACTIVE: dict[str, DriverPaths] = {}


@contextlib.contextmanager
def active(name: str, paths: DriverPaths) -> Iterator[DriverPaths]:
    """Register ``paths`` under ``name`` while the block runs; on leaving it, put back what was there before
    (nothing, outside a search)."""
    before = _ACTIVE.get(name)
    _ACTIVE[name] = paths
    try:
        yield paths
    finally:
        if before is None:
            _ACTIVE.pop(name, None)
        else:
            _ACTIVE[name] = before


def lookup(name: str | None) -> DriverPaths | None:
    """The paths of the driver running the search ``name`` in this process; for a name not registered, those of
    the one search running here (``sole``); None for no name (an object meant to keep nothing). The fallback: a
    search resumed under another ``--name`` (its folder renamed) registers under the new name while its pickled
    objects carry the first; without it they would find no state file, journal or guard, and say nothing (the
    scheduler would forget its rung records and write its later stops nowhere: stopped trials read as errors)."""
    if name is None:
        return None
    return _ACTIVE[name] if name in _ACTIVE else sole()


def sole() -> DriverPaths | None:
    """The paths of the one search running in this process, or None when none or several run (for an object
    pickled by an older cem-bench, which carries no name to look up)."""
    return next(iter(_ACTIVE.values())) if len(_ACTIVE) == 1 else None
