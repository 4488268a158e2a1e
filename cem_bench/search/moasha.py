"""``MOASHA``: a Ray Tune scheduler that stops trials by the multi-objective ASHA rule of ``rungs.py``.

The rule (rungs, Pareto rank, hypervolume-contribution tie-break, ``keep = ceil(n / η)``, NaN = worst) is
documented in ``cem_bench/search/rungs.py``; this module feeds it Ray's results and returns Ray's verdicts.

* A trial whose ``config["role"]`` is in ``exempt_roles`` (baselines, confirmation runs) is never stopped and
  never recorded at a rung.
* Every stop is kept as a dict (``decisions``; ``stopped`` maps trial id -> epoch) with the reason, e.g.
  ``"rank 2 of 3 fronts at epoch 4: outside the top 2 of 6"``.
* Ray does not persist a scheduler's state on ``Tuner.restore`` (the restored scheduler is the object pickled
  at the start of the experiment). So the driver registers the path (a local path or a URI) as
  ``scheduler_state`` of its ``driver.DriverPaths`` under ``state_key`` (the experiment's name) around
  ``fit``; after every result that records something at a rung the scheduler writes the rung
  records and the stop decisions there as one line of JSON (atomic), and on its first call after
  construction, unpickling or ``restore`` it loads that file when it holds more records than the scheduler
  itself, so a resumed driver goes on with every rung record.

``make_scheduler(spec)`` builds the scheduler a space names through its plug-in (``spaces/schedulers/``, one
file each; ``moasha`` builds ``MOASHA(RungRanker(...))``), handing it ``RaySide``: the Ray pieces that a
plug-in, which lives in ``spaces/`` and imports no Ray, builds its scheduler from.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ray.tune import schedulers as tune_schedulers
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from .. import storage
from ..errors import SpaceError
from ..parsing import loads_json
from ..spaces import schedulers
from . import driver
from .rungs import RungRanker

__all__ = ["MOASHA", "RaySide", "make_scheduler"]

_DECISION_KEYS = ("trial_id", "epoch", "rung", "rank", "position", "keep", "recorded", "reason")


def _read_bytes(path: str) -> bytes | None:
    fs, p = storage.filesystem(path)
    try:
        with fs.open_input_stream(p) as fh:
            return fh.read()
    except (FileNotFoundError, IsADirectoryError):
        return None
    except OSError:
        if not storage.exists(path):
            return None
        raise


class MOASHA(FIFOScheduler):
    """Multi-objective asynchronous successive halving (see ``rungs.py`` for the rule)."""

    def __init__(
        self,
        ranker: RungRanker,
        time_attr: str = "epoch",
        exempt_roles: Iterable[str] = ("baseline", "confirm"),
        state_key: str | None = None,
    ):
        super().__init__()
        self.ranker = ranker
        self.time_attr = time_attr
        self.exempt_roles = tuple(exempt_roles)
        self.state_key = state_key
        self._stops: list[dict[str, Any]] = []
        self._live: set[str] = set()
        self._loaded = False
        # trials Tune added in this driver's session (a restoring driver adds every trial its experiment state
        # lists, finished ones too, before the first result): records of any other trial are a killed driver's
        # trials that the state never listed, and are forgotten once (_forget_unknown)
        self._known: set[str] = set()
        self._pruned = False

    # -- pickling: a copy (Ray's experiment pickle, save/restore) re-reads the state file on first use ------

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_loaded"], d["_pruned"], d["_known"] = False, False, set()
        return d

    def save(self, checkpoint_path: str):
        with open(checkpoint_path, "wb") as fh:
            pickle.dump(self.__getstate__(), fh)

    def restore(self, checkpoint_path: str):
        with open(checkpoint_path, "rb") as fh:
            self.__dict__.update(pickle.load(fh))
        self._loaded, self._pruned, self._known = False, False, set()

    # -- the state file --------------------------------------------------------------------------------

    @property
    def state_path(self) -> str | None:
        """Where the state is written: the ``scheduler_state`` of the driver registered under ``state_key``
        (``driver.lookup``), or None (no persistence)."""
        paths = driver.lookup(self.state_key)
        return paths.scheduler_state if paths is not None else None

    def state(self) -> dict[str, Any]:
        """What the state file holds: the ranker's state and the stop decisions."""
        return {"ranker": self.ranker.state_dict(), "decisions": [dict(d) for d in self._stops]}

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        path = self.state_path
        if path is None:
            return
        data = _read_bytes(path)
        if data is None:
            return
        try:
            saved = loads_json(data)
            if int(saved["ranker"]["counter"]) > self.ranker.counter:
                stops = [dict(d) for d in saved.get("decisions", [])]
                self.ranker.load_state_dict(saved["ranker"])   # assigns only once every record has parsed
                self._stops = stops
                if "stopped" not in saved["ranker"]:           # written before the ranker kept its stops
                    for d in stops:
                        self.ranker.mark_stopped(d["trial_id"], d["rung"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # damaged, or valid JSON of another shape ({}, null): the scheduler keeps its own state, and says so
            print(f"cem-bench: the scheduler's saved state {path} is damaged ({type(e).__name__}: {e}); the "
                  f"scheduler goes on with the state it restored with the experiment", file=sys.stderr, flush=True)

    def _write_state(self) -> None:
        path = self.state_path
        if path is not None:
            # one line (schema.SCHEDULER_FILE: why it is not a .json file), written atomically
            storage.write_bytes(path, (json.dumps(storage.jsonable(self.state())) + "\n").encode())

    # -- Ray's hooks -----------------------------------------------------------------------------------

    def on_trial_add(self, tune_controller, trial) -> None:
        self._ensure_loaded()
        self._live.add(trial.trial_id)
        self._known.add(trial.trial_id)
        if getattr(trial, "status", None) in ("PENDING", "RUNNING"):
            self._mark_failed(trial, False)   # Ray requeues a trial it retries (or resumes an errored one) by adding it

    def _mark_failed(self, trial, failed: bool) -> None:
        """Tell the ranker a trial failed (or runs again): a failed trial may hold the only place a rung keeps,
        and the rule's second clause (rungs.py) lets the next trial there go on."""
        if self.ranker.mark_failed(trial.trial_id, failed):
            self._write_state()

    def _forget_unknown(self) -> None:
        """Once per driver session, at its first result: forget the records and stops of trials this session
        never added. A driver killed between starting a trial and its next experiment snapshot leaves records of
        a trial that the restored experiment does not have (the searcher runs that sample again under a new id);
        left in, such a ghost would hold a place at its rungs for ever."""
        if self._pruned:
            return
        self._pruned = True
        ghosts = (self.ranker.trial_ids() | {d["trial_id"] for d in self._stops}) - self._known
        if ghosts:
            self.ranker.forget(ghosts)
            self._stops = [d for d in self._stops if d["trial_id"] not in ghosts]
            self._write_state()

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        self._ensure_loaded()
        config = getattr(trial, "config", None) or {}
        self._forget_unknown()
        if config.get("role") in self.exempt_roles or self.time_attr not in result:
            return TrialScheduler.CONTINUE
        self._mark_failed(trial, False)       # a result: it is running
        if any(d["trial_id"] == trial.trial_id for d in self._stops):
            # a stop is final: a trial that reports again (its worker restarted it from a checkpoint after the
            # driver was killed between the decision and the stop) is stopped again
            return TrialScheduler.STOP
        values = {m: result.get(m) for m in self.ranker.metrics}
        decision = self.ranker.on_result(trial.trial_id, result[self.time_attr], values)
        if decision.rung is None:
            return TrialScheduler.CONTINUE
        if decision.action == "stop":
            self._stops.append({k: getattr(decision, k) for k in _DECISION_KEYS})
        self._write_state()
        return TrialScheduler.STOP if decision.action == "stop" else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        self._live.discard(trial.trial_id)
        if isinstance(result, dict) and result.get("status") == "error":
            # the trainable ends a trial that a retry cannot mend (a diverged loss, a bad config) as a result
            # with status "error" (trainable.py), not as a Ray error
            self._ensure_loaded()
            self._mark_failed(trial, True)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._live.discard(trial.trial_id)

    def on_trial_error(self, tune_controller, trial) -> None:
        self._live.discard(trial.trial_id)
        self._ensure_loaded()
        self._mark_failed(trial, True)        # Ray calls on_trial_add again if it retries the trial

    # -- inspection ------------------------------------------------------------------------------------

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """Every stop, in order: trial_id, epoch, rung, rank, position, keep, recorded, reason."""
        self._ensure_loaded()
        return [dict(d) for d in self._stops]

    @property
    def stopped(self) -> dict[str, Any]:
        """Trial id -> the epoch of the result at which it was stopped."""
        self._ensure_loaded()
        return {d["trial_id"]: d["epoch"] for d in self._stops}

    def debug_string(self) -> str:
        counts = ", ".join(f"{r}: {len(self.ranker.recorded(r))}" for r in self.ranker.rungs)
        return (f"Using MOASHA: {len(self._stops)} stopped; trials recorded per rung epoch {{{counts}}}; "
                f"η={self.ranker.reduction_factor:g}, objectives {self.ranker.metrics}")


# -- building a space's scheduler ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RaySide:
    """What a scheduler plug-in's builder ``build(ray_side, spec, opts)`` is handed (spaces/schedulers/)."""

    tune_schedulers: Any          # ray.tune.schedulers: ASHAScheduler, MedianStoppingRule, HyperBandScheduler, ...
    MOASHA: type                  # this module's multi-objective scheduler
    RungRanker: type              # its rule (rungs.py)
    state_key: str | None = None  # the name under which the driver registers the scheduler's state file (driver.py)
    time_attr: str = "epoch"      # the result field that counts a trial's epochs


def make_scheduler(spec, state_key: str | None = None):
    """The Ray Tune scheduler of ``spec.scheduler``, built by its plug-in; None without one (Tune's FIFO:
    every trial runs to the end). ``state_key``: the name under which the driver registers the
    scheduler's state file (``driver.active``)."""
    if not spec.scheduler:
        return None
    name = spec.scheduler["name"]
    plugin = schedulers.get(name)
    if plugin is None:
        raise SpaceError(f"scheduler.name: unknown scheduler {name!r}; known: {', '.join(schedulers.names())}",
                         spec.path)
    ray_side = RaySide(tune_schedulers, MOASHA, RungRanker, state_key=state_key)
    return plugin.build(ray_side, spec, {k: v for k, v in spec.scheduler.items() if k != "name"})
