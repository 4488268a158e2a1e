"""The search algorithm: OptunaSearch that de-duplicates proposals and mirrors its study into a journal,
wrapped in a generator that bundles every experiment checkpoint for ``--resume`` (package docstring). Which
run comes next (baseline, replicates, confirmation), what Optuna is told and when a proposal is a duplicate
are decided in ``queue.py`` without Ray; the classes here carry them to Ray Tune and Optuna.

This module imports Ray and Optuna at the top: only the search imports it. Pickled with the experiment
state, so the classes keep their names.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import sys

import optuna
from ray.tune.search import ConcurrencyLimiter, Searcher, SearchGenerator
from ray.tune.search.optuna import OptunaSearch

from ..schema import JOURNAL_FILE
from ..spaces import define_by_run, grid_cells, make_sampler
from ..storage import copy_file, is_remote, join, local
from . import driver
from .queue import FINISHED, RunQueue, first_new, stopped
from .resume import write_resume_snapshot

logger = logging.getLogger(__name__)

assert Searcher.FINISHED == FINISHED   # queue.py names Ray's value without importing Ray


class JournalOptunaSearch(RunQueue, OptunaSearch):
    """OptunaSearch that tells Optuna FAIL for errored/NaN trials and mirrors finished trials into a
    JournalStorage file (see the module docstring); the plan of runs is ``RunQueue``'s."""

    def __init__(self, *args, journal: tuple[str, str | None] | None = None, seeds: tuple[int, ...] = (),
                 baseline: list[dict] | None = None, search_runs: int | None = None, confirm_top: int = 0,
                 confirm_seeds: tuple[int, ...] = (), fixed_lambd: float | None = None,
                 refs: list[float | None] | None = None, discrete: tuple | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._journal = journal
        # a space of finitely many configurations: its parameters, to list the ones not yet run when the sampler
        # keeps proposing copies (None: a continuous range, where a new one is always a draw away)
        self._discrete = discrete
        self._init_queue(seeds=seeds, baseline=baseline, search_runs=search_runs, confirm_top=confirm_top,
                         confirm_seeds=confirm_seeds, fixed_lambd=fixed_lambd, refs=refs)
        self._mirror_journal(init=True)

    def suggest(self, trial_id: str):
        return self.next_run(trial_id)

    def on_trial_result(self, trial_id: str, result: dict):
        if trial_id in self._ot_trials:    # the baseline's and the confirmation's runs are not Optuna's
            super().on_trial_result(trial_id, result)

    def _propose(self, trial_id: str):
        # Optuna has no de-duplication: TPE (and a seeded random sampler) re-propose configurations
        # that already ran or are running, and with a fixed seed a copy gives the same result, so the
        # trial is wasted. A duplicate is told FAIL (samplers ignore failed trials) and replaced by a
        # random draw (asking TPE again gives the same proposal: its model has not changed), up to
        # MAX_DUPLICATE_ASKS times; a space with nothing new left gets the duplicate (queue.first_new).
        if not callable(self._space):
            return super().suggest(trial_id)
        seen = {self._params_key(t) for tid, t in self._ot_trials.items() if tid != trial_id}
        sampler = self._ot_study.sampler

        def reject() -> None:
            ot_trial = self._ot_trials.pop(trial_id)
            self._ot_study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
            # seeded from the trial number: a seeded search stays reproducible
            self._ot_study.sampler = optuna.samplers.RandomSampler(seed=ot_trial.number)

        try:
            config, skipped = first_new(lambda: super(JournalOptunaSearch, self).suggest(trial_id),
                                        lambda: self._params_key(self._ot_trials[trial_id]), seen, reject)
            if config is not None and trial_id in self._ot_trials and \
                    self._params_key(self._ot_trials[trial_id]) in seen:
                # the random draws missed what is left of a discrete space (1 cell of 36 left: 20 draws miss it
                # 57 % of the time, and a copy ran while a configuration never did): the first one not run yet
                unseen = self._unseen_cell(seen)
                if unseen is not None:
                    reject()
                    self._ot_study.enqueue_trial(unseen)
                    config = super().suggest(trial_id)
                else:
                    logger.warning("cem-bench: every configuration of the space has been proposed; %s runs one "
                                   "again", trial_id)
        finally:
            self._ot_study.sampler = sampler
        self._duplicates_skipped = getattr(self, "_duplicates_skipped", 0) + skipped
        return config

    def _unseen_cell(self, seen: set, limit: int = 100_000) -> dict | None:
        """The first configuration of a discrete space (file order, ``when`` applied) no trial has proposed; None
        for a continuous space, one of more than ``limit`` configurations, or one with none left."""
        from ..spaces.parse_params import bounded_cells
        params = getattr(self, "_discrete", None)
        cells = bounded_cells(list(params), limit) if params else None   # the loader's cells, never past limit
        for cell in cells or ():
            if tuple(sorted((k, repr(v)) for k, v in cell.items())) not in seen:
                return cell
        return None

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
        # only --resume restores, and it runs the errored trials again (the generator tells the concurrency
        # limiter around this searcher that they run: SnapshotSearchGenerator.restore_from_dir)
        self._reopened = self.reopen_errored()

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        self.run_finished(trial_id, result, error)

    def _tell(self, trial_id: str, result: dict | None = None, error: bool = False):
        if trial_id in self._completed_trials:
            self._tell_rerun(trial_id, result, error)
            self._mirror_journal()
            return
        if stopped(result, error):
            # a scheduler stopped it: PRUNED (Optuna's samplers leave it out of their model and of the Pareto
            # front), never COMPLETE with a half-trained trial's values (docs/search.md)
            if trial_id in self._ot_trials:
                super().on_trial_complete(trial_id, None, error=False)
            self._mirror_journal()
            return
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

    def _tell_rerun(self, trial_id: str, result: dict | None, error: bool) -> None:
        """A trial Ray ran again after ``--resume`` (it had errored; its Optuna trial was told FAIL, and Ray's
        OptunaSearch drops a second completion): its outcome is a trial of its own in the study, with the same
        parameters, and the journal gets it beside the failure (both carry the Ray trial id)."""
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return
        frozen = self._ot_study.get_trials(deepcopy=False)[ot_trial.number]
        if frozen.state == optuna.trial.TrialState.COMPLETE:
            # a replicate group told the mean of its other runs: a second COMPLETE trial of the same parameters
            # would count the configuration twice in the sampler's model; the tables hold the rerun
            return
        values = None
        if not stopped(result, error) and not error and result and result.get("status") != "error":
            vals = [result.get(m) for m in self._metrics]
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
                values = [float(v) for v in vals]
        state = optuna.trial.TrialState.COMPLETE if values is not None else \
            optuna.trial.TrialState.PRUNED if stopped(result, error) else optuna.trial.TrialState.FAIL
        self._ot_study.add_trial(optuna.trial.create_trial(
            state=state, values=values, params=frozen.params, distributions=frozen.distributions,
            user_attrs={**frozen.user_attrs, "rerun_of": frozen.number}))
        self._ot_trials[trial_id] = self._ot_study.get_trials(deepcopy=False)[-1]

    def _mirror_journal(self, init: bool = False) -> None:
        # where this driver mirrors the study (driver.py: after a restore, the pickled searcher may point at an
        # old location); outside a search, the journal it was built with
        paths = driver.lookup(self._study_name)
        target = (paths.journal if paths is not None else None) or self._journal
        if not target or self._ot_study is None:
            return
        local, remote = target
        try:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
            os.makedirs(os.path.dirname(local), exist_ok=True)
            lock = JournalFileSymlinkLock(local)    # the lock JournalFileBackend takes for every append
            lock.acquire()
            try:
                if init and remote:
                    # a new search (``init`` comes only from __init__: --resume unpickles the searcher Ray saved
                    # and never builds one) starts its cached copy empty. The cache outlives the experiment
                    # (a search made again under the same URI would otherwise upload the old one's trials
                    # with its own); a resumed search keeps it and goes on appending to it.
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(local)
                cut = drop_unfinished_line(local)
            finally:
                lock.release()
            if cut:
                logger.warning("cem-bench: the Optuna journal %s ended in an unfinished line (%d bytes, an append "
                               "that was cut off); it was cut back to its last complete line", local, cut)
            storage = JournalStorage(JournalFileBackend(local, lock_obj=lock))
            try:
                study = optuna.load_study(study_name=self._study_name, storage=storage)
            except KeyError:
                study = optuna.create_study(storage=storage, study_name=self._study_name, load_if_exists=True,
                                            directions=[d.name.lower() for d in self._ot_study.directions])
            if init and not study.user_attrs.get("metrics"):
                study.set_user_attr("metrics", list(self._metric) if isinstance(self._metric, list)
                                    else [self._metric])
            # keyed by Ray's trial id and Optuna's number: a trial Ray ran again after --resume is a second
            # Optuna trial of the same Ray trial, mirrored beside its failure
            done = {(t.user_attrs.get("ray_trial_id"), t.user_attrs.get("optuna_number"))
                    for t in study.get_trials(deepcopy=False)}
            by_number = {t.number: t for t in self._ot_study.get_trials(deepcopy=False)}
            added = 0
            for tid, ot_trial in list(self._ot_trials.items()):
                if (tid, ot_trial.number) in done or tid not in self._completed_trials:
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

    def set_state(self, state: dict):
        """The restored generator's Experiment is the first driver's, with that driver's storage: new trials
        (the rest of the search, the confirmation) would be made in the folder the experiment was in before
        it moved (copied from a cluster, renamed), where they either fail Ray's storage check or land beside
        the old copy. Ray re-targets the restored trials to where the experiment is now, not this one; this
        does the same for it, from this driver's experiment folder."""
        super().set_state(state)
        name = getattr(self, "_cem_experiment", None)
        paths = driver.lookup(name)
        if paths is None or not paths.storage or self._experiment is None:
            return
        ctx = here(self._experiment.storage, paths.storage, name)
        if ctx is not self._experiment.storage:
            print(f"--resume: the experiment was in {self._experiment.storage.experiment_fs_path}; its new trials "
                  f"are made in {ctx.experiment_fs_path}", flush=True)
            self._experiment.storage = self._experiment.spec["storage"] = ctx

    def restore_from_dir(self, dirpath: str):
        """Ray's restore, then the trials the searcher reopened (errored ones ``--resume`` runs again) made live
        in the ConcurrencyLimiter around it: it forwards only the completions of trials it handed out since its
        state was saved, so a rerun's completion never reached the searcher, which then waited for it forever."""
        super().restore_from_dir(dirpath)
        limiter, base = self.searcher, self.searcher
        while hasattr(base, "searcher"):
            base = base.searcher
        if isinstance(limiter, ConcurrencyLimiter):
            for tid in getattr(base, "_reopened", ()):
                if tid not in limiter.live_trials:
                    limiter.live_trials.add(tid)
                    limiter.num_unfinished_live_trials += 1
        # A plan of no confirmation (every search run had failed) made the first driver's generator FINISHED,
        # and Ray restores that flag: Tune would never ask for the confirmation planned again after the reruns
        # (queue.reopen_errored drops the plan; its runs are asked for through this generator alone).
        if getattr(base, "_reopened", None) and getattr(base, "_confirm_queue", None) is None:
            self._finished = False

    def save_to_dir(self, dirpath: str, session_str: str):
        super().save_to_dir(dirpath, session_str)
        paths = driver.lookup(getattr(self, "_cem_experiment", None))   # this driver's bundle (driver.py)
        target = paths.snapshot if paths is not None else None
        if target:
            try:
                write_resume_snapshot(dirpath, session_str, target)
                _BUNDLE_FAILING.discard(target)
            except Exception as e:  # noqa: BLE001 - Ray's own files are still written
                bundle_write_failed(target, e)


# bundles whose last write failed: told once until a write succeeds again (Ray checkpoints every few seconds)
_BUNDLE_FAILING: set[str] = set()


def bundle_write_failed(target: str, error: BaseException) -> None:
    """The bundle of this checkpoint could not be written (a full disk, a lost bucket): said on stderr, not only
    in Ray's log. The previous bundle is kept: it is the last complete checkpoint, and the disk that refused it
    can have cut Ray's own copy of the same state too (then removing the bundle left nothing to resume from:
    tests/test_search.py's full disk). Where Ray's own state is readable and further along, the tables and
    ``--resume`` read it instead of the stale bundle (``results.state_is_ahead``)."""
    logger.warning("cem-bench: could not write %s: %r", target, error)
    if target not in _BUNDLE_FAILING:
        _BUNDLE_FAILING.add(target)
        print(f"cem-bench: warning: could not write the resume bundle {target} ({error!r}); the previous one "
              f"is kept as the last complete checkpoint, and --resume and the tables read Ray's own experiment "
              f"state instead wherever it is readable and lists more trials, or more finished ones",
              file=sys.stderr, flush=True)


def here(ctx, storage: str, name: str):
    """Ray's StorageContext ``ctx`` moved to the experiment ``name`` under ``storage`` as this driver resolves it:
    a copy with the filesystem, path and folder name replaced (as Ray's TuneController does for restored
    trials), or ``ctx`` itself when it already points there."""
    import copy

    from ..storage import filesystem
    fs, fs_path = filesystem(storage)
    if ctx.storage_fs_path.rstrip("/") == fs_path.rstrip("/") and ctx.experiment_dir_name == name and \
            type(ctx.storage_filesystem) is type(fs):
        return ctx
    new = copy.copy(ctx)
    new.storage_filesystem, new.storage_fs_path, new.experiment_dir_name = fs, fs_path, name
    return new


def drop_unfinished_line(path: str) -> int:
    """Cut the journal ``path`` back to just after its last newline; return how many bytes were cut (0: none,
    also when the file is missing).

    Optuna's JournalFileBackend appends each record as one line written with its newline, and its reader skips
    a last line without one: such a line is an append that never finished (the driver killed, the disk full
    during the write). Left in place, the next append is glued onto it, the glued line is not JSON, and Optuna's
    reader then refuses every line after it: the study could never be loaded again. Cutting it loses nothing
    Optuna could read; the trial it was writing is copied again by the next update (keyed by Ray's trial id).
    The caller holds the journal's lock."""
    try:
        fh = open(path, "r+b")
    except FileNotFoundError:
        return 0
    with fh:
        end = pos = fh.seek(0, os.SEEK_END)
        keep = 0
        while pos > 0:                         # the last newline, read backwards in blocks
            step = min(pos, 1 << 16)
            fh.seek(pos - step)
            at = fh.read(step).rfind(b"\n")
            if at >= 0:
                keep = pos - step + at + 1
                break
            pos -= step
        if keep == end:
            return 0
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
        return end - keep


def journal_target(experiment_path: str, name: str) -> tuple[str, str | None]:
    """(local journal file, remote copy or None). A remote experiment's journal is kept in this machine's cache,
    in a folder named after the experiment and a hash of its full URI: experiments of one name in two buckets
    (or two prefixes) have a journal each, and a resume (the same URI) finds its own."""
    if is_remote(experiment_path):
        key = hashlib.sha256(experiment_path.rstrip("/").encode()).hexdigest()[:16]
        cached = os.path.join(os.path.expanduser("~/.cache/cem-bench/journals"), f"{name}-{key}", JOURNAL_FILE)
        return cached, join(experiment_path, JOURNAL_FILE)
    # file://DIR is DIR: joined as it was, the journal went to a relative "file:" folder in the current one
    return os.path.join(local(experiment_path), JOURNAL_FILE), None


def discrete_params(spec) -> tuple | None:
    """The space's parameters where each takes finitely many values (a grid, choices, int and stepped ranges);
    None where one is continuous."""
    from ..spaces.parse_plan import discrete_count
    params = tuple(spec.params)
    return params if params and all(discrete_count(p) is not None for p in params) else None


def make_searcher(spec, experiment_path: str):
    points = grid_cells(spec.params) if spec.sampler.get("name") == "grid" else None
    searcher = JournalOptunaSearch(space=define_by_run(spec), metric=spec.metric_names, mode=spec.modes,
                                   sampler=make_sampler(spec), study_name=spec.name, points_to_evaluate=points,
                                   journal=journal_target(experiment_path, spec.name), seeds=spec.seeds,
                                   baseline=spec.baseline_configs(), search_runs=spec.runs,
                                   confirm_top=spec.confirm_top, confirm_seeds=spec.confirm_seeds,
                                   fixed_lambd=spec.fixed.get("cem.lambd"), refs=[o.ref for o in spec.objectives],
                                   discrete=discrete_params(spec))
    # the generator is built here (not by Tune) so that it can bundle the experiment state; Tune applies
    # max_concurrent_trials only to a bare Searcher, so the limiter is added here too
    limited = ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)
    return SnapshotSearchGenerator(limited, spec.name)
