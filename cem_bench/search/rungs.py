"""Multi-objective asynchronous successive halving: the rungs and the rule that ranks a rung (no Ray, no Optuna).

``MOASHA`` (``moasha.py``) is the Ray Tune scheduler; this module is its arithmetic and its decisions, so that
the rule can be tested on hand-made rung records and replayed on recorded experiments without Ray.

The rungs
---------
Ray's ASHA (``ray/tune/schedulers/async_hyperband.py``, ``_Bracket``, one bracket ``s = 0``): the milestones
are ``grace_epochs * reduction_factor ** k`` for ``k = 0, 1, ...``. A milestone at or beyond ``max_epochs``
decides nothing (the trial is done there), so only those strictly below it are rungs. A fractional milestone
(η = 1.5 gives 1.5, 2.25, ...) is rounded up, since ASHA compares ``epoch >= milestone`` and epochs are whole;
milestones that round to the same epoch are one rung. ``rung_epochs(240, 15, 2)`` is ``[15, 30, 60, 120]``.

The rule at a rung
------------------
A trial is judged once per rung: at the first result whose epoch is at or past the rung and at which it is
not yet recorded there. When a result passes several rungs at once (a trial that reports sparsely), it is
judged at the highest of them only; the rungs it jumped over never record it (comparing its later values with
other trials' values at an earlier epoch would not be fair). Results before the first rung, results at or
after ``max_epochs`` and results at a rung where the trial is already recorded continue and record nothing.
Decisions already taken are never revisited (asynchronous: a stopped trial stays stopped, a continued one is
not recalled).

When judged, the trial's objective vector is recorded at the rung; ``n`` is then the number of trials recorded
there (including it) and ``keep = ceil(n / η)``, so the first trial at a rung always continues. The recorded
trials are ordered by

1. their Pareto rank (non-dominated sorting of all the vectors recorded at the rung, ``frontier.pareto_ranks``;
   rank 0 is the non-dominated front; identical vectors share a rank);
2. inside a front, their exclusive hypervolume contribution *within that front*, larger first
   (``frontier.hypervolume_contributions`` on the front's members only; the reference point is each
   objective's ``ref``; an objective whose ``ref`` is None takes the worst finite value recorded at the rung
   moved outwards by a tenth of the rung's range of that objective, or by 1 when the range is 0, so that the
   extreme points of a front keep a positive share; a point that does not beat a given ``ref`` in every
   objective has no share). A front's extreme points and isolated points come
   before points in a crowded stretch of it;
3. then the order in which the trials were recorded at the rung (earlier first).

The trial continues if its position in that order is below ``keep``, or if every other trial recorded at the
rung has been stopped (at this rung or a later one) or has failed. The second clause keeps ASHA's guarantee that
some trial runs to the end. ASHA gets it from the first trial at each rung, which always continues and, when
every epoch is reported, is recorded at every rung below; a trial that continued and then failed (an error, a
diverged loss) keeps its place but will never finish. A resumed driver forgets a killed driver's trials that
its experiment never listed (``MOASHA._forget_unknown``) while the stops they caused stay final; if a forgotten
trial was the one that continued at a rung, position alone could stop every later trial there
(docs/search.md §3 measures how often, on searches simulated in ``tests/test_moasha.py``). When every epoch is
reported and nothing is forgotten or failed the clause never applies: some trial recorded at each rung is
never stopped (the first at the highest rung reached, recorded at every rung below it). A failed trial keeps
its record and its place in the order; the clause only asks whether some other trial there may still finish.
Consequences (tested):

* a trial that no recorded trial dominates is never stopped unless more than ``keep`` trials of the rung are
  non-dominated; then the tie-break (2, 3) decides;
* some trial runs to the end, whatever the values, the order of the results, the drivers killed and the trials
  failed, as long as a trial started after the last kill or failure does not fail itself;
* a trial that dominates every recorded one is alone in front 0, position 0, and always continues, whatever
  the order in which the others arrived. Ranks are computed by non-dominated sorting, never read off a sorted
  order (issue 26: Syne Tune's MOASHA priority appears to read the position of a trial in its sorted list as its rank, so a
  dominating newcomer can be stopped depending on the arrival order of the others).

A value that is NaN or missing counts as the worst possible value of that objective (``-inf`` for ``max``,
``+inf`` for ``min``): such a trial is dominated by any trial that is no worse elsewhere, and two trials
missing the same objective are compared on the others. The rung epochs must therefore be epochs at which every
objective is reported (the probe's epochs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..frontier import hypervolume_contributions, pareto_ranks, stand_in_refs
from ..spaces.spec import rung_epochs

__all__ = ["Decision", "RungRanker", "rung_epochs"]

_STATE_VERSION = 1


@dataclass(frozen=True)
class Decision:
    """One result's fate. ``rung`` is None when the result recorded nothing (then ``rank``, ``position``,
    ``keep``, ``recorded`` are None too)."""

    action: str                # "continue" | "stop"
    trial_id: str
    epoch: int
    rung: int | None
    rank: int | None           # Pareto rank at the rung, 0 = non-dominated
    position: int | None       # 0-based place in the rung's order (rank, contribution, arrival)
    keep: int | None           # ceil(recorded / η): how many of the rung continue
    recorded: int | None       # trials recorded at the rung, this one included
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _objective(o: Sequence[Any]) -> tuple[str, str, float | None]:
    metric, mode, ref = o
    if mode not in ("max", "min"):
        raise ValueError(f"objective {metric!r}: mode must be 'max' or 'min'; got {mode!r}")
    return str(metric), str(mode), None if ref is None else float(ref)


def _float(v: Any) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


class RungRanker:
    """The rungs of one ASHA bracket and the multi-objective rule of the module docstring.

    ``objectives`` is a list of ``(metric, mode, ref)``: ``mode`` ``"max"`` or ``"min"``, ``ref`` the
    hypervolume reference point of that objective (in its own units) or None.
    """

    def __init__(
        self,
        max_epochs: int,
        grace_epochs: int,
        reduction_factor: float,
        objectives: Sequence[Sequence[Any]],
    ):
        if not objectives:
            raise ValueError("RungRanker needs at least one objective")
        self.max_epochs = int(max_epochs)
        self.grace_epochs = int(grace_epochs)
        self.reduction_factor = float(reduction_factor)
        self.objectives = [_objective(o) for o in objectives]
        self.metrics = [o[0] for o in self.objectives]
        self.modes = [o[1] for o in self.objectives]
        self.rungs = rung_epochs(self.max_epochs, self.grace_epochs, self.reduction_factor)
        # rung epoch -> {trial_id: (arrival, values as given, NaN for missing)}; dicts keep arrival order
        self._records: dict[int, dict[str, tuple[int, list[float]]]] = {r: {} for r in self.rungs}
        self._stopped: dict[str, int] = {}    # trial id -> the rung at which it was stopped
        self._failed: set[str] = set()        # trials that ended in an error (they keep their records)
        self._counter = 0

    # -- decisions -------------------------------------------------------------------------------------

    def _rung_for(self, epoch: float) -> int | None:
        if epoch >= self.max_epochs:
            return None
        passed = [r for r in self.rungs if epoch >= r]
        return passed[-1] if passed else None

    def on_result(self, trial_id: str, epoch: float, values: Mapping[str, Any]) -> Decision:
        """Record the trial at the rung this result reaches (if any, and not yet recorded) and decide."""
        trial_id = str(trial_id)
        rung = self._rung_for(epoch)
        if rung is None or trial_id in self._records[rung]:
            why = ("before the first rung" if rung is None and (not self.rungs or epoch < self.rungs[0])
                   else "at or after max_epochs" if rung is None
                   else f"already recorded at rung {rung}")
            return Decision("continue", trial_id, epoch, None, None, None, None, None, f"no rung: {why}")
        vector = [_float(values.get(m)) for m in self.metrics]
        self._records[rung][trial_id] = (self._counter, vector)
        self._counter += 1
        return self._judge(trial_id, epoch, rung)

    def _judge(self, trial_id: str, epoch: float, rung: int) -> Decision:
        recorded = self._records[rung]
        ids = list(recorded)
        n = len(ids)
        keep = math.ceil(n / self.reduction_factor)
        pts = self._worst_filled(np.array([recorded[t][1] for t in ids], dtype=float))
        ranks = pareto_ranks(pts, self.modes)
        me = ids.index(trial_id)
        rank = int(ranks[me])
        n_fronts = int(ranks.max()) + 1
        better = int(np.sum(ranks < rank))
        front = np.flatnonzero(ranks == rank)
        within = self._front_order(pts, front)
        position = better + within.index(me)
        inside = position < keep
        # the module docstring: with every other trial of the rung stopped, stopping this one too could leave
        # the search with no trial run to the end
        last_hope = not inside and all(t in self._stopped or t in self._failed for t in ids if t != trial_id)
        where = f"rank {rank} of {n_fronts} fronts at epoch {rung}"
        reason = f"{where}: {'inside' if inside else 'outside'} the top {keep} of {n}"
        if better < keep < better + len(front):
            reason += (f" (front {rank} has {len(front)} trials across the cut: place {within.index(me)} in it "
                       "by hypervolume contribution, then arrival)")
        if last_hope:
            reason += f", but continues: every other trial recorded at epoch {rung} was stopped or failed"
        cont = inside or last_hope
        if not cont:
            self._stopped[trial_id] = rung
        return Decision("continue" if cont else "stop", trial_id, epoch, rung, rank, position, keep, n, reason)

    def _worst_filled(self, pts: np.ndarray) -> np.ndarray:
        """NaN -> the worst possible value of its objective (-inf for max, +inf for min)."""
        out = pts.copy()
        for j, mode in enumerate(self.modes):
            col = out[:, j]
            col[np.isnan(col)] = -np.inf if mode == "max" else np.inf
        return out

    def _refs(self, pts: np.ndarray) -> list[float]:
        return stand_in_refs(pts, self.modes, [ref for _, _, ref in self.objectives])

    def _front_order(self, pts: np.ndarray, front: np.ndarray) -> list[int]:
        """Indices of the front's members (into ``pts``), best first: contribution desc, then arrival."""
        if len(front) == 1:
            return [int(front[0])]
        sub = pts[front]
        contrib = np.zeros(len(front))
        finite = np.isfinite(sub).all(axis=1)
        if finite.any():
            contrib = hypervolume_contributions(np.where(finite[:, None], sub, np.nan), self.modes, self._refs(pts))
            scale = float(np.max(np.abs(contrib))) or 1.0
            contrib = np.round(contrib / scale, 9)  # float noise must not override arrival order
        # ``pts`` rows are in the rung's recording order, so the row index is the arrival order
        order = sorted(range(len(front)), key=lambda k: (-contrib[k], int(front[k])))
        return [int(front[k]) for k in order]

    # -- state -----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the settings, every rung's recorded vectors per trial id (NaN as None), the
        stopped trials (trial id -> rung), the failed ones and the arrival counter."""
        return {
            "version": _STATE_VERSION,
            "max_epochs": self.max_epochs,
            "grace_epochs": self.grace_epochs,
            "reduction_factor": self.reduction_factor,
            "objectives": [list(o) for o in self.objectives],
            "rungs": {
                str(r): {t: {"arrival": a, "values": [None if math.isnan(v) else v for v in vec]}
                         for t, (a, vec) in rec.items()}
                for r, rec in self._records.items()
            },
            "stopped": dict(self._stopped),
            "failed": sorted(self._failed),
            "counter": self._counter,
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Replace the records and stops with those of ``d``; ValueError when ``d`` was made with other settings.
        A state written before the stops were kept has no ``stopped``: then none is known (``mark_stopped``)."""
        if d.get("version") != _STATE_VERSION:
            raise ValueError(f"rung state version {d.get('version')!r}; expected {_STATE_VERSION}")
        mine = self.state_dict()
        for key in ("max_epochs", "grace_epochs", "reduction_factor", "objectives"):
            theirs = d.get(key)
            if key == "objectives":
                theirs = [list(o) for o in theirs or []]
            if theirs != mine[key]:
                raise ValueError(f"rung state was saved with {key}={theirs!r}; this scheduler has {mine[key]!r}")
        records: dict[int, dict[str, tuple[int, list[float]]]] = {r: {} for r in self.rungs}
        for r, rec in d["rungs"].items():
            if int(r) not in records:
                raise ValueError(f"rung state has a rung at epoch {r}; the rungs are {self.rungs}")
            items = sorted(rec.items(), key=lambda kv: kv[1]["arrival"])
            records[int(r)] = {t: (int(v["arrival"]), [_float(x) for x in v["values"]]) for t, v in items}
        stopped = {str(t): int(r) for t, r in (d.get("stopped") or {}).items()}
        failed = {str(t) for t in d.get("failed") or []}
        self._records = records
        self._stopped, self._failed = stopped, failed
        self._counter = int(d["counter"])

    def mark_stopped(self, trial_id: str, rung: int) -> None:
        """Know that ``trial_id`` was stopped at ``rung`` (a state file written before the ranker kept its stops:
        the scheduler's own decisions say which)."""
        self._stopped[str(trial_id)] = int(rung)

    def mark_failed(self, trial_id: str, failed: bool = True) -> bool:
        """Know that ``trial_id`` ended in an error (``failed=False``: it is running again, a retry); returns
        whether that changed anything. Its records stay: only the second clause of the rule reads this."""
        t = str(trial_id)
        if failed == (t in self._failed):
            return False
        (self._failed.add if failed else self._failed.discard)(t)
        return True

    def forget(self, trial_ids) -> int:
        """Drop every record of ``trial_ids`` (trials that no longer exist: a killed driver's trials that its
        experiment snapshot did not list); returns how many records went. Later decisions rank without them."""
        gone = set(trial_ids)
        for t in gone & self._stopped.keys():
            del self._stopped[t]
        self._failed -= gone
        n = 0
        for recs in self._records.values():
            for t in [t for t in recs if t in gone]:
                del recs[t]
                n += 1
        return n

    def trial_ids(self) -> set[str]:
        """Every trial recorded at some rung."""
        return {t for recs in self._records.values() for t in recs}

    # -- inspection ------------------------------------------------------------------------------------

    def recorded(self, rung: int) -> dict[str, list[float]]:
        """The vectors recorded at ``rung`` (trial id -> values in the objectives' order; NaN kept)."""
        return {t: list(vec) for t, (_, vec) in self._records[rung].items()}

    @property
    def counter(self) -> int:
        """How many records were made (all rungs)."""
        return self._counter
