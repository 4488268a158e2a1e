"""Ray Tune + Optuna multi-objective search around ``run_trial`` (local and cluster modes, resume).

``cem-bench search SPACE.yaml`` validates the space completely, starts Ray (or connects to a cluster with
``--address``), runs one Tune trial per Optuna suggestion and writes ``trials.parquet``/``epochs.parquet``
(the CLI then builds the HTML report). This package is the only one that imports Ray: ``searcher.py`` at
the top, the others inside functions.

Modules: ``trainable`` (one trial), ``searcher`` (the Optuna search algorithm) and ``queue`` (its plan of
runs, without Ray or Optuna), ``resume`` (the experiment-state guard), ``lock`` (one driver per experiment
folder), ``interrupt`` (SIGINT/SIGTERM as an interruption), ``diskspace`` (the free-space guard), ``driver``
(what pickled search objects find of the driver running them), ``machine`` (the GPUs and CPUs of a local
session), ``run`` (Ray start-up, the Tuner, the summary), ``rungs`` and ``moasha`` (multi-objective early
stopping) and ``replay`` (``cem-bench replay``).

Results on disk (``STORAGE/NAME`` is Ray's experiment folder; STORAGE may be a folder, ``s3://`` or ``gs://``)::

    search_space.json         the validated spec (written first, atomically)
    optuna_journal.log        Optuna JournalStorage mirror of the study (``optuna-dashboard optuna_journal.log``)
    <trial dir>/params.json   Ray: the trial's config
    <trial dir>/result.json   Ray: one JSON line per ``tune.report`` (every epoch, then the final result)
    <trial dir>/error.txt     Ray: every failure of the trial (also those that were retried)
    <trial dir>/checkpoint_*  Ray: the latest checkpoints (``state.pt``: the trainer state of an epoch)
    <trial dir>/trial_result.json  ours: the full result (metrics, status, error, info with config and history)
    <trial dir>/recon.png     ours: the attack's reconstructions

``trial_result.json`` is not called ``result.json`` because Ray's JSON logger owns that name. The trainable
writes it (and ``recon.png``) straight to the storage (``pyarrow.fs``), so it lands in the same place
whichever node ran the trial.

How failures are handled:

* a ``TrialDiverged`` (non-finite loss), ``ConfigError`` or ``DataError`` inside a trial is a *result*: the
  trial reports NaN objectives with ``status: "error"`` and ``error: <reason>``, writes
  ``trial_result.json``, and ends normally (no retry, the search goes on). Optuna is told the trial
  FAILED (a NaN would otherwise be rejected by ``study.tell``).
* any other exception, or the death of the trial's worker process, is retried by Ray up to
  ``max_failures`` times (``FailureConfig``); the new attempt resumes from the trial's latest checkpoint
  (``tune.get_checkpoint()``), so finished epochs are not trained again.
* a killed driver is continued with ``--resume``: ``Tuner.restore(path, trainable, resume_errored=True)``
  restores the trials and the searcher (Optuna study included) from the experiment state; unfinished
  trials resume from their checkpoints and only the missing samples are suggested.

Why the experiment state needs a guard: Ray writes its experiment checkpoint (``experiment_state-S.json``,
``searcher-state-S.pkl``, ``search_gen_state-S.json``) into the driver's staging folder and then *copies*
the folder to the storage in a background thread, file by file and in place. A driver killed during that
copy leaves a truncated file, or files of two different checkpoints, in the experiment folder; Ray's own
restore then fails ("EOFError: Ran out of input"), falls back to "Restarting experiment" and hangs. So the
search algorithm used here (``SnapshotSearchGenerator``) writes, right after Ray has written a checkpoint
into the staging folder and before the copy starts, the same files bundled into one file,
``cem_resume_state.bin``, atomically (temp file + rename; one PUT on s3/gs). It is always at least as new
as anything the copy can have written, and always consistent. ``--resume`` first puts the bundle's files
back in place (``repair_experiment_state``; files it replaces are moved to ``superseded_state/``, never
deleted), then gives each unfinished trial the checkpoint the state records: Ray keeps two per trial and
deletes older ones as new ones come, so a driver killed between a trial's checkpoints and its next snapshot
leaves a state naming a deleted one, which Ray's restore turns into an error; the trial's newer checkpoint is
copied to that name (``restore_removed_checkpoints``). Then Ray restores. The bundle's name ends in neither
``.json`` nor ``.pkl`` because Ray's restore copies those from the storage into the staging folder and would
upload a stale copy back.

The Optuna journal: ``OptunaSearch`` keeps its study in memory (so the study is pickled with the searcher
state and restored consistently with the trials). The searcher used here (``JournalOptunaSearch``) copies
every finished trial into a ``JournalStorage`` study in ``optuna_journal.log`` from the driver, right after
telling the in-memory study; the copy is idempotent (keyed by the Ray trial id), so a resumed search fills
in what a killed driver missed. With remote storage the journal is kept in
``~/.cache/cem-bench/journals/NAME-HASH/`` (HASH: of the experiment's URI, so same-named experiments elsewhere
keep their own) and uploaded after every update.

Test hooks: ``run_search(..., hooks=...)`` (not on the command line) hands every trial an object whose
``before_report`` / ``after_report`` it calls at each epoch, in its Ray worker (``trainable.TrialHooks``).
The faults the tests inject live in the tests (``tests/search_hooks.py``: a worker that dies once after an
epoch, a storage that is full while a file exists), pickled by value with the trainable.

What the pickled searcher, scheduler and storage guard need from the driver that runs them now (a restored
experiment's are the first driver's copies) they look up by the experiment's name in ``driver`` (the journal,
the resume bundle, the scheduler's state file, the live guard), registered by ``run_search`` while it runs.
"""

from ..errors import SearchError
from .resume import (
                     RAY_STATE_KINDS,
                     SUPERSEDED_DIR,
                     recorded_checkpoints,
                     repair_experiment_state,
                     restore_removed_checkpoints,
                     write_resume_snapshot,
)
from .run import overrides_from_args, run_search, search_command
from .trainable import STATE_FILE, TRAINABLE_NAME, TrialHooks, make_trainable, trial_resources, with_resources

__all__ = ["RAY_STATE_KINDS", "STATE_FILE", "SUPERSEDED_DIR", "SearchError", "TRAINABLE_NAME", "TrialHooks",
           "make_trainable", "overrides_from_args", "recorded_checkpoints", "repair_experiment_state",
           "restore_removed_checkpoints",
           "run_search", "search_command", "trial_resources", "with_resources", "write_resume_snapshot"]
