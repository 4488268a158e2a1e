"""The results schema: file names, column lists, default objectives and Pareto ranking of a table.

One owner for each fact that the trial, the search, the results tables and the report share. Imports nothing
of the project above ``frontier``/``storage``/``errors``. The columns are described in docs/results.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from .errors import ResultsError
from .frontier import pareto_ranks
from .storage import Dir

# ------------------------------------------------------------------------------------------ file names
RESULT_FILE = "trial_result.json"            # a trial's final record, written by the search's trainable
RAY_RESULT_FILE = "result.json"              # Ray's per-report lines
RAY_PARAMS_FILE = "params.json"
RAY_ERROR_FILE = "error.txt"
RESUME_STATE_FILE = "cem_resume_state.bin"   # the search's bundle of its last complete Ray checkpoint
SPACE_FILE = "search_space.json"             # the validated search space (objectives, reference points)
JOURNAL_FILE = "optuna_journal.log"          # the Optuna study (optuna-dashboard reads it)
# The early-stopping scheduler's rung records and stop decisions, one JSON document on one line. Not ".json":
# a restoring Tune driver copies every .json and .pkl of the experiment folder into its staging folder and
# uploads them again later, which would put back a stale copy over the scheduler's newer one.
SCHEDULER_FILE = "scheduler_state.jsonl"
# Written when SIGINT/SIGTERM stopped the search (search/interrupt.py): the signal, when, the --resume command.
# Not ".json" either, for the same reason: --resume removes it, and a stale copy must not come back.
INTERRUPTED_FILE = "interrupted.jsonl"
# Held (flock, exclusive) by the search's driver from before Ray starts until its tables are written
# (search/lock.py); the report and `cem-bench table` look at it to say that a search is still running
DRIVER_LOCK_FILE = ".cem-bench-driver.lock"
TRIALS_FILE = "trials.parquet"
EPOCHS_FILE = "epochs.parquet"
CONFIGS_FILE = "configs.parquet"             # one row per configuration: its replicates aggregated
REPORT_DIR = "report"
# the files a report wrote into its folder, so that the next one removes those it does not write again (safefiles.prune)
REPORT_RECORD = ".cem-bench-report-files"
GALLERY_FILE = "recon.png"
CHECKPOINT_FILE = "checkpoint.pt"            # a saved run's encoder, server and config (`cem-bench train --out`)
METRICS_FILE = "metrics.json"                # a saved run's result
STATE_FILE = "state.pt"                      # a search trial's trainer state, in each Ray checkpoint_NNNNNN/
# Ray names a trial's checkpoint folders by the report's index: checkpoint_000031 after the 32nd epoch
CHECKPOINT_DIR = re.compile(r"checkpoint_(\d{6})")

# ------------------------------------------------------------------------------------------ columns
# reported by every trial at every epoch (attack metrics NaN until the attack ran); the searchable objectives
OBJECTIVE_METRICS: tuple[str, ...] = ("test_acc", "test_acc_clean", "feature_spread", "attack_mse",
                                      "attack_psnr", "attack_ssim", "attack_ssim_paper", "attack_psnr_batch")
# the attack's metrics among them (NaN until the attack ran, and when the utility gate skipped it)
ATTACK_METRICS: tuple[str, ...] = tuple(m for m in OBJECTIVE_METRICS if m.startswith("attack_"))
COST_COLUMNS: tuple[str, ...] = ("train_s", "attack_s", "wall_s")
# cem.strength: the loss scale a CEM trial used (measured under matched; cem_bench/core/strength.py), aggregated per
# configuration so that a table can show it beside each cell
STRENGTH_COLUMNS: tuple[str, ...] = ("cem_loss_scale",)
# every final metric of a trial row
METRIC_COLUMNS: tuple[str, ...] = OBJECTIVE_METRICS + COST_COLUMNS + (
    "epochs_done", "final_train_loss", "final_train_acc", "rob_nonfinite", "resumed_from_epoch")
PROVENANCE: tuple[str, ...] = ("git_sha", "package_version", "torch_version", "device", "node_id", "hostname",
                               "started_at", "finished_at")
EPOCH_COLUMNS: tuple[str, ...] = ("experiment", "trial_id", "epoch", "train_loss", "train_acc", "rob_loss",
                                  "test_acc", "test_acc_clean", "feature_spread", "epoch_s", "images_per_s", "tflops")
# direction that means "more private" (a worse reconstruction)
PRIVACY_MODES: dict[str, str] = {"attack_ssim": "min", "attack_mse": "max", "attack_psnr": "min",
                                 "attack_ssim_paper": "min", "attack_psnr_batch": "min"}

# Several attacks per trial (attack.names): each attack's own metrics are columns ``<metric>__<attack>``
# (attack_ssim__rmle, and its seconds attack_s__rmle); the ATTACK_METRICS columns are the worst case for privacy
# over the attacks that ran, and ``<metric>_by`` names the attack that set it (cem_bench.attacks.worst_case).
PER_ATTACK_SEP = "__"
STRONGEST_SUFFIX = "_by"


def per_attack_column(metric: str, attack: str) -> str:
    """``attack_ssim`` of attack ``rmle`` -> ``attack_ssim__rmle`` (a plain Parquet/pandas column name)."""
    return f"{metric}{PER_ATTACK_SEP}{attack}"


def strongest_column(metric: str) -> str:
    """The column naming the attack that set the worst-case ``metric``: ``attack_ssim_by``."""
    return metric + STRONGEST_SUFFIX


def attack_of(column: str) -> str | None:
    """``attack_ssim__rmle`` -> ``rmle``; None for a column that is not one attack's own."""
    head, sep, tail = column.partition(PER_ATTACK_SEP)
    return tail if sep and tail and head in ATTACK_METRICS + ("attack_s",) else None


def base_metric(column: str) -> str:
    """``attack_ssim__rmle`` -> ``attack_ssim``; any other column unchanged."""
    return column.partition(PER_ATTACK_SEP)[0] if attack_of(column) is not None else column


def privacy_mode(metric: str) -> str | None:
    """The direction that means "more private" of an attack metric (also of one attack's own column)."""
    return PRIVACY_MODES.get(base_metric(metric))


def per_attack_columns(columns) -> list[str]:
    """The columns among ``columns`` that are one attack's own metric or seconds."""
    return [c for c in columns if attack_of(c) is not None]


# How far a configuration's utility (the first objective) may fall below its baseline's and still count as "at
# the baseline's accuracy": the 95 % interval of the difference must lie above minus this (an equivalence
# test), in the objective's own units. A search space sets it (``utility_tolerance``); 2 points of accuracy
# otherwise. docs/protocol.md §9 says why a stated number and not the baseline's spread.
DEFAULT_UTILITY_TOLERANCE = 0.02
# The hypotheses a space writes down before its run (docs/search-spaces.md §8a): what side a's metric is claimed
# to be against side b's, and how the family's p-values are adjusted. The parser (spaces/) and the tests on the
# trials (analysis/hypotheses.py) read the same words.
HYPOTHESIS_CLAIMS = ("lower", "higher", "not_lower", "not_higher")
HYPOTHESIS_CORRECTIONS = ("holm", "bonferroni")
MAX_HYPOTHESES = 100   # in one family: the parser refuses more, the report reads a saved file no further

# Config keys that say how a trial runs, not what it measures (run on another card, compiled or graphed, its
# data read from another folder, probed at other epochs). A baseline that differs from its configurations only
# in these is still their baseline (analysis/aggregate.py), and a resumed search may change them (search/run.py:
# an experiment copied to another machine reads its data from another folder); any other key makes another
# experiment.
EXECUTION_KEYS = frozenset((
    "data.root", "train.device", "train.amp", "train.tf32", "train.compile", "train.cuda_graph",
    "train.surrogate_stream", "train.compile_surrogate", "train.eval_batch_size",
    "attack.probe_epochs", "attack.probe_images", "attack.probe_iterations"))

# used when a results folder has no search_space.json; ref = the hypervolume reference point
DEFAULT_OBJECTIVES: tuple[dict, ...] = (
    {"metric": "test_acc", "mode": "max", "ref": 0.1},        # chance on 10 classes
    {"metric": "attack_ssim", "mode": "min", "ref": 1.0},     # a perfect reconstruction
)
MODES = ("max", "min")


# the statuses a trials table's rows can hold: finished, failed, stopped by the scheduler, stopped by a signal, and
# (in the tables read while a search runs) still running
STATUSES = ("ok", "error", "stopped", "interrupted", "running")

ACCURACY_METRICS = ("test_acc", "test_acc_clean")
# the values a bounded metric can take: an objective's reference point must be one some value can beat, and a
# trials table with a value outside them was edited (analysis.table.check_cells refuses it)
METRIC_RANGES: dict[str, tuple[float, float]] = {"test_acc": (0.0, 1.0), "test_acc_clean": (0.0, 1.0),
                                                 "attack_ssim": (-1.0, 1.0), "attack_ssim_paper": (-1.0, 1.0),
                                                 "attack_mse": (0.0, math.inf),
                                                 # of images clamped to [0, 1]: an MSE of at most 1
                                                 "attack_psnr": (0.0, math.inf), "attack_psnr_batch": (0.0, math.inf)}


def out_of_range(table, ranges: dict[str, tuple[float, float]] | None = None):
    """``(column, value, row index, how many, low, high)`` of the first column of ``table`` (a DataFrame) holding
    a value outside its range ``[low, high]``, or None. ``ranges``: column → (low, high); by default every column whose metric
    (``base_metric``) ``METRIC_RANGES`` bounds, so the config's text columns are never converted. NaN passes (a
    metric not measured); inf does not. A bound may be passed by float32 rounding (an SSIM of 1): 1e-6 is allowed."""
    ranges = ranges if ranges is not None else {c: METRIC_RANGES[base_metric(c)] for c in table.columns
                                                 if base_metric(c) in METRIC_RANGES}
    for col, (low, high) in ranges.items():
        if col not in table:
            continue
        v = pd.to_numeric(table[col], errors="coerce")
        out = v[(v < low - 1e-6) | (v > high + 1e-6)]
        if len(out):
            return col, float(out.iloc[0]), out.index[0], len(out), low, high
    return None


def margin_problem(metric: str, margin: float) -> str | None:
    """Why ``margin`` (a hypothesis's margin, a space's ``utility_tolerance``: a difference in ``metric``'s units)
    decides nothing, or None: a difference of two values of a bounded metric is less than its range's width, so
    a margin that wide makes a non-inferiority claim hold, and a superiority claim fail, whatever the runs measure
    (``utility_tolerance: 2``, meant as 2 points, was taken, 2026-12-07 probe)."""
    low, high = METRIC_RANGES.get(base_metric(metric), (-math.inf, math.inf))
    if margin < high - low:
        return None
    points = " (in its units: 0.02 is 2 points of accuracy)" if base_metric(metric) in ACCURACY_METRICS else ""
    return (f"{margin:g} is not below the widest difference {metric} can show ({high - low:g}: its values lie in "
            f"[{low:g}, {high:g}]), so the comparison would be decided whatever the runs measure; give a margin "
            f"below {high - low:g}{points}")


def ref_problem(metric: str, mode: str, ref: float) -> str | None:
    """Why no value of ``metric`` can beat the reference point ``ref`` in ``mode``, or None. Such a ref makes
    every trial's hypervolume 0: the front's gains, the confirmation's choice and the scheduler's tie-break all
    fall back to accuracy alone, and the report draws a hypervolume of 0 without a word."""
    low, high = METRIC_RANGES.get(base_metric(metric), (-math.inf, math.inf))
    if mode == "max" and ref >= high:
        return (f"{ref:g} is not below {metric}'s best possible value {high:g}, so no trial can beat it"
                + (" (an accuracy is a fraction, not a percentage)" if metric in ACCURACY_METRICS else "")
                + ": a max objective's ref is a value every useful trial exceeds, e.g. chance accuracy, 0.1 for 10 "
                  "classes")
    if mode == "min" and ref <= low:
        return (f"{ref:g} is not above {metric}'s best possible value {low:g}, so no trial can beat it: a min "
                f"objective's ref is a value every useful trial stays below, e.g. 1.0 for an SSIM")
    return None


def objective_problems(objectives: Sequence[dict]) -> list[tuple[int, str]]:
    """What makes a list of objectives unreadable by the report, as (index, message): a metric no trial records,
    an attack metric as the first objective (the report's utility axis), one whose mode is not its "more private" direction (the
    report would call the less private configurations more private), or an accuracy minimised."""
    out = []
    for i, o in enumerate(objectives):
        metric, mode = o.get("metric"), o.get("mode")
        if not (metric in OBJECTIVE_METRICS or (isinstance(metric, str) and attack_of(metric) is not None
                                                and base_metric(metric) in OBJECTIVE_METRICS)):
            # a name no trial records: the report's sentences came out garbled and the table listed it among the
            # compared objectives (2026-12-07 probe)
            out.append((i, f"{metric!r} is not a metric a trial records; known: {', '.join(OBJECTIVE_METRICS)}, or "
                           f"one attack's own (attack_ssim__decoder)"))
            continue
        if metric in ACCURACY_METRICS and mode in MODES and mode != "max":
            # minimised, the search looked for the worst classifier and the front began at chance accuracy
            out.append((i, f"{metric} is better when higher: its mode is max, not {mode}"))
            continue
        want = privacy_mode(metric) if isinstance(metric, str) else None
        if want is None:
            continue
        if i == 0:
            out.append((i, f"{metric} is an attack metric; the first objective is the utility axis (test_acc, "
                           f"say): list the attack metric second"))
        elif mode in MODES and mode != want:
            out.append((i, f"{metric} is more private when {'lower' if want == 'min' else 'higher'}: its mode is "
                           f"{want}, not {mode}"))
    return out


# what a results folder read without its recorded search_space.json would lose (integrity.read_json_file)
SPACE_LOST = ("its objectives would be the defaults and the hypotheses written down before the run would be "
              "neither tested nor mentioned")


def load_objectives(results_dir) -> tuple[list[dict], str | None]:
    """Objectives ``[{metric, mode, ref}]`` and experiment name from ``search_space.json`` of a results folder
    (a path, a URI or a ``storage.Dir``); the defaults when it is missing or names none. ResultsError when it
    exists but is damaged (verified against the folder's checksums, ``integrity``)."""
    from .integrity import read_json_file
    d = results_dir if isinstance(results_dir, Dir) else Dir(results_dir)
    spec = read_json_file(d, SPACE_FILE, "the search space the search saved (JSON)", lost=SPACE_LOST)
    if spec is not None and not isinstance(spec, dict):
        raise ResultsError(f"{d.url(SPACE_FILE)} is not a search space (a JSON object with `objectives`); "
                           f"it holds a {type(spec).__name__}")
    if spec is None or not spec.get("objectives"):
        return [dict(o) for o in DEFAULT_OBJECTIVES], None
    out = []
    objectives = spec["objectives"]
    if not isinstance(objectives, list) or not all(isinstance(o, dict) and isinstance(o.get("metric"), str)
                                                   for o in objectives):
        raise ResultsError(f"{d.url(SPACE_FILE)}: `objectives` must be a list of {{metric, mode, ref}}; got "
                           f"{str(objectives)[:200]}")
    for o in objectives:
        mode = o.get("mode", "max")
        if mode not in MODES:
            raise ResultsError(f"{d.join(SPACE_FILE)}: objective {o.get('metric')!r} has mode {mode!r}; "
                               f"known: {', '.join(MODES)}")
        ref = o.get("ref")
        if ref is not None and (isinstance(ref, bool) or not isinstance(ref, (int, float))):
            raise ResultsError(f"{d.url(SPACE_FILE)}: objective {o['metric']!r} has ref {ref!r}; a number or null")
        out.append({"metric": o["metric"], "mode": mode, "ref": ref})
    for _, problem in objective_problems(out):
        raise ResultsError(f"{d.url(SPACE_FILE)}: {problem}; a search space that says so is refused, so this "
                           f"file was written by hand or by another tool")
    name = spec.get("name")
    return out, name if isinstance(name, str) else None


def rank_table(trials: pd.DataFrame, objectives: Sequence[dict], ok: np.ndarray | None = None) -> np.ndarray:
    """Pareto rank of each row over ``objectives`` among the ``ok`` rows (default: ``status == "ok"``);
    0 = on the front; -1 for rows that are not ok or have a missing objective: NaN, or ±inf, a run that
    measured nothing (a diverged attack's MSE). ``aggregate.build_configs`` counts an infinite metric as missing
    and the report draws none, so a front that ranked it would hold a trial no plot shows and no mean counts."""
    ranks = np.full(len(trials), -1, dtype=np.int64)
    if not len(trials):
        return ranks
    if ok is None:
        ok = (trials["status"] == "ok").to_numpy() if "status" in trials else np.ones(len(trials), dtype=bool)
    if ok.any():
        values = np.column_stack([pd.to_numeric(trials[o["metric"]], errors="coerce").to_numpy(dtype=float)
                                  for o in objectives])
        values[~np.isfinite(values)] = np.nan    # pareto_ranks leaves NaN rows out (rank -1)
        ranks[ok] = pareto_ranks(values[ok], [o["mode"] for o in objectives])
    return ranks
