"""The searcher's plan of runs, without Ray or Optuna: the lambda = 0 baseline handed out first, the search's
runs (each configuration once per replicate seed, the mean told to the sampler), then the best configurations
again with new seeds (docs/protocol.md sections 7-9); and the rejection of duplicate proposals.

``RunQueue`` holds the state and the decisions; the sampler is reached only through two hooks a subclass
provides: ``_propose(trial_id)`` (the sampler's next configuration, or None) and ``_tell(trial_id, result,
error)`` (a finished configuration's result, or its failure). ``searcher.JournalOptunaSearch`` is that
subclass for Optuna under Ray Tune; tests/test_searcher_logic.py drives the class with a fake sampler. The
state lives in the instance's own attributes, under the names a searcher pickled by an earlier cem-bench has.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ..frontier import hypervolume_contributions, pareto_ranks, stand_in_refs

logger = logging.getLogger(__name__)

MAX_DUPLICATE_ASKS = 20  # asks per trial before a duplicate configuration is accepted (see first_new)
FINISHED = "FINISHED"    # the value of ray.tune.search.Searcher.FINISHED: no run is left to hand out


def first_new(ask: Callable[[], dict | None], key: Callable[[], Hashable], seen: set, reject: Callable[[], None],
              max_asks: int = MAX_DUPLICATE_ASKS) -> tuple[dict | None, int]:
    """Ask until the proposal's ``key()`` is not in ``seen``: (the accepted proposal, duplicates rejected).

    ``ask()`` makes a proposal (None: nothing to propose), ``key()`` is the last proposal's identity and
    ``reject()`` discards it (Optuna: told FAIL, the next ask drawn at random). After ``max_asks`` rejections
    the next proposal is accepted even if it is a copy: a space with nothing new left must not hang."""
    config = ask()
    skipped = 0
    if config is None:
        return None, 0
    for _ in range(max_asks):
        if key() not in seen:
            break
        reject()
        skipped += 1
        config = ask()
        if config is None:
            break
    return config, skipped


def mean_result(runs: list[dict | None], metrics: list[str]) -> dict | None:
    """The result told for a configuration's replicates: each metric's mean over the runs that finished with a
    finite value of it (NaN where none has one: the sampler is then told FAIL); None when none finished. The
    rule of configs.parquet (``aggregate.build_configs``) and of the confirmation's choice: one value per
    configuration everywhere. Until 2026-12-06 one run without a value (an attack the utility gate skipped at
    chance accuracy) made the metric NaN, and Optuna was told FAIL for a configuration the tables ranked."""
    done = [r for r in runs if r is not None]
    if not done:
        return None
    mean: dict[str, Any] = {"status": "ok"}
    for m in metrics:
        vals = [r.get(m) for r in done]
        finite = [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
        mean[m] = sum(finite) / len(finite) if finite else float("nan")
    return mean


def stopped(result: dict | None, error: bool) -> bool:
    """Whether a finished trial was stopped early (a scheduler's STOP): its last result is an epoch's, whose
    status the trainable reports as "running"; a trial that ran to the end reports "ok" or "error"."""
    return not error and bool(result) and result.get("status") == "running"


def _ok(result: dict | None, error: bool) -> bool:
    return not error and bool(result) and result.get("status") != "error" and not stopped(result, error)


class RunQueue:
    """Which run comes next and what the sampler is told (see the module docstring). ``_metric`` and
    ``_mode`` (a name or a list, as Ray's Searcher keeps them) must be set by the subclass."""

    FINISHED = FINISHED
    _metric: str | list[str]
    _mode: str | list[str]

    def _init_queue(self, *, seeds: tuple[int, ...] = (), baseline: list[dict] | None = None,
                    search_runs: int | None = None, confirm_top: int = 0, confirm_seeds: tuple[int, ...] = (),
                    fixed_lambd: float | None = None, refs: list[float | None] | None = None) -> None:
        # The noise floor and the confirmed front (docs/protocol.md sections 7, 8). The baseline's runs are
        # handed out first, the search's ``search_runs`` next, then, once every one of those finished, the
        # ``confirm_top`` best configurations again with each of ``confirm_seeds``. Neither the baseline's nor
        # the confirmation's runs are sampler trials: they answer other questions than the sampler's.
        self._baseline_queue: list[dict] = [dict(c) for c in (baseline or [])]
        self._search_runs = search_runs
        self._search_started = 0
        self._search_config: dict[str, dict] = {}          # search trial id -> its config (seed left out)
        self._search_results: dict[str, dict | None] = {}  # search trial id -> its result (None: failed)
        self._confirm_top, self._confirm_seeds = confirm_top, tuple(confirm_seeds)
        self._confirm_queue: list[dict] | None = None      # planned once every search run finished
        self._fixed_lambd = fixed_lambd
        self._refs = list(refs) if refs else None          # the objectives' hypervolume reference points
        self._role: dict[str, str] = {}                    # trial id -> "baseline" | "confirm"
        # Replicates: every configuration the sampler proposes runs once per seed, each run its own trial.
        # The first run (the "leader") holds the sampler's trial; the others are queued and served before the
        # sampler is asked again; it is told the mean of the runs once all of them finished (docs/protocol.md).
        self._seeds = tuple(seeds)
        self._queued: list[tuple[str, int]] = []          # (leader trial id, seed) still to be started
        self._groups: dict[str, dict] = {}                # leader id -> {"config", "runs": {trial id: result}}
        self._leader_of: dict[str, str] = {}              # trial id -> its leader's id

    # -------------------------------------------------------------------------- the sampler's side
    def _propose(self, trial_id: str) -> dict | None:  # pragma: no cover - provided by the subclass
        raise NotImplementedError

    def _tell(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:  # pragma: no cover
        raise NotImplementedError

    @property
    def _metrics(self) -> list[str]:
        return self._metric if isinstance(self._metric, list) else [self._metric]

    # ------------------------------------------------------------------------------- the plan
    def next_run(self, trial_id: str):
        """The config of the next run (``seed`` set; ``role`` set for a confirmation run), None while the
        confirmation waits for the search's last runs, or ``FINISHED``."""
        # getattr: a searcher pickled by an older cem-bench has none of these (it plans no baseline)
        if getattr(self, "_baseline_queue", None):
            self._role[trial_id] = "baseline"
            return self._baseline_queue.pop(0)
        runs = getattr(self, "_search_runs", None)
        if runs is None or self._search_started < runs:
            config = self._suggest_search(trial_id)
            if isinstance(config, dict) and runs is not None:
                self._search_started += 1
                self._search_config[trial_id] = {k: v for k, v in config.items() if k != "seed"}
            return config
        if len(self._search_results) < runs:
            return None                    # the confirmation waits for the search's last run
        if self._confirm_queue is None:
            self._confirm_queue = self._plan_confirmation()
            if self._confirm_queue:
                # printed, not logged (cem-bench configures no logging: an info line was never shown), with what
                # was chosen and why fewer than asked
                print(self._confirmation_text(runs), file=sys.stderr, flush=True)
            elif self._confirm_top and self._confirm_seeds:
                # said, not only logged: the space asked for a confirmation, and its claims stay exploratory
                print(f"cem-bench: nothing to confirm: of the search's {runs} runs, none with λ ≠ 0 finished with "
                      "every objective finite (each was stopped by the scheduler, failed or gave NaN); the report's "
                      "claims stay exploratory", file=sys.stderr, flush=True)
        if self._confirm_queue:
            self._role[trial_id] = "confirm"
            return self._confirm_queue.pop(0)
        return self.FINISHED

    def _suggest_search(self, trial_id: str):
        if len(self._seeds) > 1 and self._queued:
            leader, seed = self._queued.pop(0)
            self._leader_of[trial_id] = leader
            return {**self._groups[leader]["config"], "seed": seed}
        config = self._propose(trial_id)
        if config is not None and len(self._seeds) > 1:
            self._groups[trial_id] = {"config": dict(config), "runs": {}}
            self._leader_of[trial_id] = trial_id
            self._queued.extend((trial_id, s) for s in self._seeds[1:])
            return {**config, "seed": self._seeds[0]}
        if config is not None and len(self._seeds) == 1:
            return {**config, "seed": self._seeds[0]}
        return config

    def _confirmation_text(self, runs: int) -> str:
        """The plan in a line: the configurations chosen (the keys in which the search's configurations differ),
        the seeds, and why fewer than ``confirm.top`` when so."""
        n_seeds = max(1, len(self._confirm_seeds))
        chosen = [{k: v for k, v in c.items() if k not in ("seed", "role")} for c in self._confirm_queue[::n_seeds]]
        search = list(self._search_config.values())
        varying = sorted({k for c in search for k in c if any(o.get(k) != c.get(k) for o in search)})
        shown = "; ".join(", ".join(f"{k}={c.get(k)}" for k in varying if k in c) or "the configuration"
                          for c in chosen)
        text = (f"cem-bench: confirming {len(chosen)} configuration(s) with seeds {list(self._confirm_seeds)} (the "
                f"best by Pareto rank of their means, then exclusive hypervolume): {shown}")
        if len(chosen) < self._confirm_top:
            text += (f". confirm.top is {self._confirm_top}: only {len(chosen)} of the search's {runs} runs' "
                     f"configurations with λ ≠ 0 finished with every objective finite")
        return text

    def _plan_confirmation(self) -> list[dict]:
        """The confirmation runs: the ``confirm_top`` best configurations of the search (λ = 0 excepted: the
        baseline has its own runs) by Pareto rank of their mean objectives, within a rank by their exclusive
        hypervolume, then by the first objective; each with every confirmation seed."""
        if not self._confirm_top or not self._confirm_seeds:
            return []
        metrics = self._metrics
        modes = self._mode if isinstance(self._mode, list) else [self._mode]
        groups: dict[str, tuple[dict, list[dict]]] = {}
        for tid, config in self._search_config.items():
            lam = config.get("cem.lambd", self._fixed_lambd)
            if lam is not None and float(lam) == 0:
                continue
            key = json.dumps(sorted(config.items()), default=str)
            groups.setdefault(key, (config, []))
            result = self._search_results.get(tid)
            if result is not None:
                groups[key][1].append(result)
        configs, rows = [], []
        for config, results in groups.values():
            # each metric's mean over the runs with a finite value of it (mean_result's rule, and the tables'):
            # dropping a whole run for one missing metric dropped a collapsed seed's accuracy too, and chose on
            # a survivor's mean that no table records
            mean = mean_result(results, metrics)
            if mean is not None and all(math.isfinite(mean[m]) for m in metrics):
                configs.append(config)
                rows.append(np.array([mean[m] for m in metrics], dtype=float))
        if not configs:
            return []
        values = np.asarray(rows)
        ranks = pareto_ranks(values, modes)
        # within a rank, the configurations that add the most hypervolume to it first (the ones that shape
        # the front, rather than its accurate but undefended end); then the first objective
        # an objective without a reference point takes the scheduler's stand-in (the worst mean moved out by a
        # tenth of the range): just past the worst mean, the front's private end shaped it at ~0 gain
        refs = stand_in_refs(values, modes, list(getattr(self, "_refs", None) or [None] * len(metrics)))
        gain = np.zeros(len(values))
        for r in np.unique(ranks):
            at = ranks == r
            gain[at] = hypervolume_contributions(values[at], modes, refs)
        first = values[:, 0] if modes[0] == "min" else -values[:, 0]
        # equal contributions tie on the first objective, as §8 says, not on the float noise of their sums
        gain = np.round(gain, 12)
        order = np.lexsort((first, -gain, ranks))[: self._confirm_top]
        return [{**configs[i], "seed": s, "role": "confirm"} for i in order for s in self._confirm_seeds]

    def reopen_errored(self) -> list[str]:
        """After a restore (``--resume``, which Ray runs with ``resume_errored``): the search runs that had ended
        in a Ray error run again, so they are not finished any more. Without this the confirmation was planned
        while they ran (it waits for every search run), on results without them, and a replicate group's mean
        was told without them. A confirmation planned before the restore, on the results without them (empty when
        every search run had failed), is planned again once they finished, unless one of its runs had been handed
        out already (then that plan stands: its runs are the experiment's). Returns the trial ids reopened."""
        reopened = sorted(getattr(self, "_ray_errored", set()))
        for tid in reopened:
            self._search_results.pop(tid, None)
            leader = self._leader_of.get(tid)
            if leader is not None and len(self._seeds) > 1:
                self._groups[leader]["runs"].pop(tid, None)
        self._ray_errored = set()
        if reopened and "confirm" not in getattr(self, "_role", {}).values():
            self._confirm_queue = None
        return reopened

    def run_finished(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Record a finished run; tell the sampler a configuration's result once all its replicates finished
        (the mean, or a failure when none finished). Baseline and confirmation runs tell it nothing."""
        if trial_id in getattr(self, "_role", {}):
            return                         # a baseline or confirmation run: nothing to tell the sampler
        if trial_id in getattr(self, "_search_config", {}):
            self._search_results[trial_id] = dict(result) if _ok(result, error) else None
            errored = getattr(self, "_ray_errored", set())
            self._ray_errored = errored | {trial_id} if error else errored - {trial_id}
        leader = self._leader_of.get(trial_id)
        if leader is None or len(self._seeds) <= 1:
            self._tell(trial_id, result, error)
            return
        group = self._groups[leader]
        group["runs"][trial_id] = dict(result) if _ok(result, error) else None
        if len(group["runs"]) < len(self._seeds):
            return
        mean = mean_result(list(group["runs"].values()), self._metrics)
        self._tell(leader, mean, error=mean is None)
