"""The search algorithm: OptunaSearch that de-duplicates proposals and mirrors its study into a journal,
wrapped in a generator that bundles every experiment checkpoint for ``--resume`` (package docstring).

This module imports Ray and Optuna at the top: only the search imports it. Pickled with the experiment
state, so the classes keep their names.
"""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np
import optuna
from ray.tune.search import ConcurrencyLimiter, Searcher, SearchGenerator
from ray.tune.search.optuna import OptunaSearch

from ..frontier import hypervolume_contributions, pareto_ranks
from ..schema import JOURNAL_FILE
from ..spaces import define_by_run, grid_cells, make_sampler
from ..storage import copy_file, is_uri, join
from .resume import write_resume_snapshot

logger = logging.getLogger(__name__)

MAX_DUPLICATE_ASKS = 20  # asks per trial before a duplicate configuration is accepted (see suggest)

# Where the searcher mirrors its study and where the generator bundles the experiment state: set by
# run_search for the current driver (after a restore the pickled objects may point at an old location).
JOURNAL_TARGET: dict[str, tuple[str, str | None]] = {}
SNAPSHOT_TARGET: dict[str, str] = {}


class JournalOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna FAIL for errored/NaN trials and mirrors finished trials into a
    JournalStorage file (see the module docstring)."""

    def __init__(self, *args, journal: tuple[str, str | None] | None = None, seeds: tuple[int, ...] = (),
                 baseline: list[dict] | None = None, search_runs: int | None = None, confirm_top: int = 0,
                 confirm_seeds: tuple[int, ...] = (), fixed_lambd: float | None = None,
                 refs: list[float | None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._journal = journal
        # The noise floor and the confirmed front (docs/protocol.md sections 7, 8). The baseline's runs are
        # handed out first, the search's ``search_runs`` next, then, once every one of those finished, the
        # ``confirm_top`` best configurations again with each of ``confirm_seeds``. Neither the baseline's nor
        # the confirmation's runs are Optuna trials: they answer other questions than the sampler's.
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
        # Replicates: every configuration Optuna proposes runs once per seed, each run its own Ray trial.
        # The first run (the "leader") holds the Optuna trial; the others are queued and served before Optuna
        # is asked again; Optuna is told the mean of the runs once all of them finished (docs/protocol.md).
        self._seeds = tuple(seeds)
        self._queued: list[tuple[str, int]] = []          # (leader trial id, seed) still to be started
        self._groups: dict[str, dict] = {}                # leader id -> {"config", "runs": {trial id: result}}
        self._leader_of: dict[str, str] = {}              # trial id -> its leader's id
        self._mirror_journal(init=True)

    def suggest(self, trial_id: str):
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
                logger.info("cem-bench: confirming %d configurations with seeds %s", len(self._confirm_queue)
                            // max(1, len(self._confirm_seeds)), list(self._confirm_seeds))
        if self._confirm_queue:
            self._role[trial_id] = "confirm"
            return self._confirm_queue.pop(0)
        return Searcher.FINISHED

    def _plan_confirmation(self) -> list[dict]:
        """The confirmation runs: the ``confirm_top`` best configurations of the search (λ = 0 excepted: the
        baseline has its own runs) by Pareto rank of their mean objectives, within a rank by their exclusive
        hypervolume, then by the first objective; each with every confirmation seed."""
        if not self._confirm_top or not self._confirm_seeds:
            return []
        metrics = self._metric if isinstance(self._metric, list) else [self._metric]
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
            vals = [[r.get(m) for m in metrics] for r in results]
            vals = [v for v in vals if all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)]
            if vals:
                configs.append(config)
                rows.append(np.mean(np.asarray(vals, dtype=float), axis=0))
        if not configs:
            return []
        values = np.asarray(rows)
        ranks = pareto_ranks(values, modes)
        # within a rank, the configurations that add the most hypervolume to it first (the ones that shape
        # the front, rather than its accurate but undefended end); then the first objective
        refs = list(getattr(self, "_refs", None) or [None] * len(metrics))
        for j, (ref, mode) in enumerate(zip(refs, modes)):
            if ref is None:   # no reference point: just beyond the worst mean
                col = values[:, j]
                refs[j] = float(col.min() - 1e-9) if mode == "max" else float(col.max() + 1e-9)
        gain = np.zeros(len(values))
        for r in np.unique(ranks):
            at = ranks == r
            gain[at] = hypervolume_contributions(values[at], modes, refs)
        first = values[:, 0] if modes[0] == "min" else -values[:, 0]
        order = np.lexsort((first, -gain, ranks))[: self._confirm_top]
        return [{**configs[i], "seed": s, "role": "confirm"} for i in order for s in self._confirm_seeds]

    def on_trial_result(self, trial_id: str, result: dict):
        if trial_id in self._ot_trials:    # the baseline's and the confirmation's runs are not Optuna's
            super().on_trial_result(trial_id, result)

    def _suggest_search(self, trial_id: str):
        if len(self._seeds) > 1 and self._queued:
            leader, seed = self._queued.pop(0)
            self._leader_of[trial_id] = leader
            return {**self._groups[leader]["config"], "seed": seed}
        config = self._suggest_new(trial_id)
        if config is not None and len(self._seeds) > 1:
            self._groups[trial_id] = {"config": dict(config), "runs": {}}
            self._leader_of[trial_id] = trial_id
            self._queued.extend((trial_id, s) for s in self._seeds[1:])
            return {**config, "seed": self._seeds[0]}
        if config is not None and len(self._seeds) == 1:
            return {**config, "seed": self._seeds[0]}
        return config

    def _suggest_new(self, trial_id: str):
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
        if trial_id in getattr(self, "_role", {}):
            return                         # a baseline or confirmation run: nothing to tell Optuna
        if trial_id in getattr(self, "_search_config", {}):
            ok = not error and bool(result) and result.get("status") != "error"
            self._search_results[trial_id] = dict(result) if ok else None
        leader = self._leader_of.get(trial_id)
        if leader is None or len(self._seeds) <= 1:
            self._tell(trial_id, result, error)
            return
        group = self._groups[leader]
        ok = not error and bool(result) and result.get("status") != "error"
        group["runs"][trial_id] = dict(result) if ok else None
        if len(group["runs"]) < len(self._seeds):
            return
        runs = [r for r in group["runs"].values() if r is not None]
        mean = None
        if runs:
            mean = {"status": "ok"}
            for m in (self._metric if isinstance(self._metric, list) else [self._metric]):
                vals = [r.get(m) for r in runs]
                finite = [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
                mean[m] = sum(finite) / len(finite) if len(finite) == len(vals) else float("nan")
        self._tell(leader, mean, error=mean is None)

    def _tell(self, trial_id: str, result: dict | None = None, error: bool = False):
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
        target = JOURNAL_TARGET.get(self._study_name) or self._journal
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
                copy_file(local, remote)
        except Exception as e:  # noqa: BLE001 - the mirror must never stop a search
            logger.warning("cem-bench: could not update the Optuna journal %s: %r", local, e)


class SnapshotSearchGenerator(SearchGenerator):
    """Ray's SearchGenerator that bundles each experiment checkpoint into ``cem_resume_state.bin``
    (see the module docstring)."""

    def __init__(self, searcher, experiment: str):
        super().__init__(searcher)
        self._cem_experiment = experiment

    def save_to_dir(self, dirpath: str, session_str: str):
        super().save_to_dir(dirpath, session_str)
        target = SNAPSHOT_TARGET.get(getattr(self, "_cem_experiment", ""))
        if target:
            try:
                write_resume_snapshot(dirpath, session_str, target)
            except Exception as e:  # noqa: BLE001 - Ray's own files are still written
                logger.warning("cem-bench: could not write %s: %r", target, e)


def journal_target(experiment_path: str, name: str) -> tuple[str, str | None]:
    """(local journal file, remote copy or None)."""
    if is_uri(experiment_path) and not experiment_path.startswith("file://"):
        local = os.path.join(os.path.expanduser("~/.cache/cem-bench/journals"), name, JOURNAL_FILE)
        return local, join(experiment_path, JOURNAL_FILE)
    return os.path.join(experiment_path, JOURNAL_FILE), None


def make_searcher(spec, experiment_path: str):
    points = grid_cells(spec.params) if spec.sampler.get("name") == "grid" else None
    searcher = JournalOptunaSearch(space=define_by_run(spec), metric=spec.metric_names, mode=spec.modes,
                                   sampler=make_sampler(spec), study_name=spec.name, points_to_evaluate=points,
                                   journal=journal_target(experiment_path, spec.name), seeds=spec.seeds,
                                   baseline=spec.baseline_configs(), search_runs=spec.runs,
                                   confirm_top=spec.confirm_top, confirm_seeds=spec.confirm_seeds,
                                   fixed_lambd=spec.fixed.get("cem.lambd"), refs=[o.ref for o in spec.objectives])
    # the generator is built here (not by Tune) so that it can bundle the experiment state; Tune applies
    # max_concurrent_trials only to a bare Searcher, so the limiter is added here too
    limited = ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)
    return SnapshotSearchGenerator(limited, spec.name)
