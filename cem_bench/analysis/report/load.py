"""Reading a results folder: ``trials.parquet`` (built from the Ray experiment when missing),
``configs.parquet`` (built from the trials when missing or not about these trials), ``epochs.parquet`` and
``search_space.json``, into a ``Results``.

The tables are read, not normalised: ``results.write_tables`` leaves ``trials.parquet`` final (statuses,
roles, the λ = 0 rows' keys nulled, ``config_id``, ``pareto_rank``; ``results.FINAL_COLUMNS``) and writes
``configs.parquet`` beside it. Only a table that lacks them, written by an older cem-bench or by hand, is
normalised here, the writer's way (``normalise_older``), and its configurations built (``load_configs``).

Conventions: a trial is "ok" when ``status == "ok"``; the front is the ok trials' ``pareto_rank`` 0 over the
search objectives (-1 for errored trials and trials with a NaN objective); λ = 0 trials
(``config.cem.lambd == 0``) are the baseline and are not counted as any surrogate. A trial whose attack was
skipped (``attack_skipped`` non-empty: the utility gate found its accuracy at chance) is ok, with NaN attack
metrics; ``_attack_skipped`` marks it. Configurations (a trial's config without its seed,
``aggregate.build_configs``) carry the same helper columns and, under each metric's own name, its mean over
the ok runs; their ``pareto_rank`` is over the means. A search is *replicated* when some configuration has
more than one run: the frontier plots and the front table then show configurations (docs/protocol.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cem_bench.analysis.aggregate import (
    CONFIG_ID,
    CONFIRM,
    CONFIRMED,
    ROLE_COLUMN,
    SKIP_COLUMN,
    build_configs,
    config_columns,
    config_ids,
    null_inapplicable,
    null_skipped_attacks,
    roles,
    skipped_attacks,
)
from cem_bench.analysis.results import is_final
from cem_bench.analysis.table import adjusted, check_cells, stored_describes
from cem_bench.errors import ResultsError
from cem_bench.frontier import pareto_mask
from cem_bench.integrity import MANIFEST_FILE, read_table, write_table
from cem_bench.schema import (
    ATTACK_METRICS,
    CHECKPOINT_FILE,
    CONFIGS_FILE,
    COST_COLUMNS,
    EPOCHS_FILE,
    METRICS_FILE,
    OBJECTIVE_METRICS,
    SPACE_FILE,
    SPACE_LOST,
    TRIALS_FILE,
    base_metric,
    load_objectives,
    rank_table,
)
from cem_bench.storage import Dir, is_uri, relative_inside, write_bytes

MAIN_PARAMS: list[str] = [
    "config.cem.lambd",
    "config.defense.noise_std",
    "config.cem.num_slots",
    "config.cem.num_iterations",
    "config.cem.snr_thresh",
    "config.cem.softplus_beta",
]

# the metrics the report reads and shows (objectives and costs); not schema.METRIC_COLUMNS, every final
# column of a trial row, which also holds counters such as epochs_done
REPORTED_METRICS: list[str] = list(OBJECTIVE_METRICS + COST_COLUMNS)

SKIP_COL = SKIP_COLUMN  # why the attack did not run ("" when it ran); absent in older results
SURROGATE_COL = "config.cem.surrogate"
LAMBD_COL = "config.cem.lambd"
NOISE_COL = "config.defense.noise_std"
BASELINE_LABEL = "λ=0 baseline"
NO_SURROGATE = "(none)"

VALID_FOLDER = (
    f"a results folder holds {TRIALS_FILE} (and optionally {EPOCHS_FILE} and {SPACE_FILE}), or is an experiment "
    f"folder written by `cem-bench search` (Ray's experiment_state-*.json and one sub-folder per trial), from "
    f"which {TRIALS_FILE} is built"
)


@dataclass
class Results:
    """Everything the report needs from a results folder."""

    results_dir: Path
    experiment: str
    objectives: list[dict]
    trials: pd.DataFrame  # all trials, with their ``pareto_rank`` and the report's helper columns
    epochs: pd.DataFrame | None
    surrogates: list[str] = field(default_factory=list)  # sorted, baseline excluded
    colors: dict[str, tuple] = field(default_factory=dict)
    # one row per configuration (configs.parquet) with helper columns; None when the trials have no config
    configs: pd.DataFrame | None = None
    # the space's ``utility_tolerance`` (search_space.json); None: not stated, the report's default applies
    utility_tolerance: float | None = None
    # ``configs`` came from the folder's configs.parquet (False: built from the trials by the report, which
    # writes no configs.parquet into the results folder; the page says so)
    configs_stored: bool = False
    # the trials table was as ``results.write_tables`` leaves it (``results.is_final``): each trial's config
    # holds only the keys its surrogate reads. False: an older table (``normalise_older``), whose rows may also
    # hold other surrogates' defaults; ``plots.uses_param`` then asks the surrogate registry
    final_table: bool = False
    # the hypotheses the space wrote down before its run (search_space.json, analysis/hypotheses.py); None: none,
    # or none usable, and then ``hypotheses_problem`` says why
    hypotheses: dict | None = None
    hypotheses_problem: str | None = None
    # does the folder hold the checksums the search wrote (integrity.MANIFEST_FILE)? Without them nothing shows
    # that search_space.json, its hypotheses with it, is the file written before the run
    verified: bool = True
    # the confirmation the space planned (search_space.json ``confirm``: top, replicates); None: none planned,
    # or no space saved. The run facts say when it was planned and none ran (nothing finished to confirm)
    confirm_plan: dict | None = None
    # the lock record of a search running on the folder as the report read it (``results.running_driver``): the
    # trials were read from its trial folders (not finished ones are "running") and the page says it is partial
    running_driver: dict | None = None
    # the keys the space searched (search_space.json ``params``), as config columns in the space's order, each
    # with its ``log`` flag (a log-scale axis); empty without a saved space. The parameter figures draw these
    # beside ``MAIN_PARAMS``: a search over gmm's own keys had shown two of its ten
    searched: dict[str, bool] = field(default_factory=dict)

    @property
    def replicated(self) -> bool:
        """Does some configuration have more than one run (replicates, one trial per seed)?"""
        return self.configs is not None and bool((self.configs["runs"] > 1).any())

    @property
    def confirmed(self) -> bool:
        """Did the search re-run its best configurations with new seeds (``confirm:``)?"""
        return self.configs is not None and bool((self.configs["role"] == CONFIRMED).any())

    @property
    def has_floor(self) -> bool:
        """Is there a λ = 0 baseline with two or more runs to compare against (a noise floor): two or more
        values of the privacy objective (an attack the utility gate skipped gives none), else two ok runs?"""
        if self.configs is None:
            return False
        c = self.configs
        pm = f"{self.metrics[1]}_n" if len(self.metrics) > 1 else None
        runs = pd.to_numeric(c[pm], errors="coerce") if pm in c else c["runs_ok"]
        return bool(((c["role"] == "baseline") & (runs > 1)).any())

    @property
    def front_configs(self) -> pd.DataFrame:
        """The configurations of the final front (``final_front``: the baselines and the confirmed
        configurations when confirmation ran, else all), on the means, best first objective first."""
        if self.configs is None:
            return pd.DataFrame()
        first = self.objectives[0]
        front = self.configs[self.configs["final_front"].astype(bool)]
        return front.sort_values(first["metric"], ascending=first["mode"] == "min", kind="stable")

    @property
    def confirm_started(self) -> int | None:
        """How many trials had finished when the first confirmation run finished (None: no confirmation)."""
        conf = self.trials[self.trials[ROLE_COLUMN] == CONFIRM]
        return int(conf["_order"].min()) if len(conf) else None

    @property
    def skipped(self) -> pd.DataFrame:
        """The trials whose attack did not run (``attack_skipped`` non-empty)."""
        return self.trials[self.trials["_attack_skipped"]]

    @property
    def ok(self) -> pd.DataFrame:
        return self.trials[self.trials["_ok"]]

    @property
    def front(self) -> pd.DataFrame:
        first = self.objectives[0]
        front = self.trials[self.trials["pareto_rank"] == 0]
        return front.sort_values(first["metric"], ascending=first["mode"] == "min", kind="stable")

    @property
    def front_trials(self) -> pd.DataFrame:
        """The trials of the front the page states, which its galleries, its training curves and
        ``frontier.csv`` show. With confirmation, the runs behind the confirmed front's statistics
        (``front_configs``; docs/protocol.md §8): each confirmed configuration's ok confirmation runs (not the
        search's run it was chosen on) and every ok run of a baseline on it, by their configuration's mean
        first objective. With replicates and no confirmation, every ok run of the configurations on the front of
        the means (the page's table and plot: a lone lucky run of a configuration whose mean is off the front is
        not the page's front). Else ``front`` (the trials of ``pareto_rank`` 0)."""
        if not (self.confirmed or self.replicated) or CONFIG_ID not in self.trials:
            return self.front
        first = self.objectives[0]
        configs = self.front_configs
        place = {c: i for i, c in enumerate(configs[CONFIG_ID].astype(str))}
        role = dict(zip(configs[CONFIG_ID].astype(str), configs["role"]))
        ok = self.ok
        ids = ok[CONFIG_ID].astype(str)
        runs = ok[ids.isin(place) & (ids.map(role).ne(CONFIRMED) | ok[ROLE_COLUMN].eq(CONFIRM))]
        order = runs[CONFIG_ID].astype(str).map(place)
        runs = runs.assign(_place=order).sort_values(
            ["_place", first["metric"]], ascending=[True, first["mode"] == "min"], kind="stable")
        # each configuration's best run first, then each one's second, ...: the galleries and training curves
        # show the first rows, and in configuration order they were the first few configurations' runs alone
        # (three baselines of a σ grid filled 9 of the 12 curves)
        turn = runs.groupby("_place", sort=False).cumcount()
        return runs.assign(_turn=turn).sort_values(["_turn", "_place"], kind="stable").drop(columns=["_place", "_turn"])

    @property
    def modes(self) -> list[str]:
        return [o["mode"] for o in self.objectives]

    @property
    def metrics(self) -> list[str]:
        return [o["metric"] for o in self.objectives]


def fetch_remote(uri: str, local: Path) -> tuple[Path, dict | None]:
    """Copy what the report reads from a results folder on object storage (``s3://``, ``gs://``: the tables,
    ``search_space.json`` and each trial's ``recon.png``) into ``local``; return it and ``results.running_driver``
    of the folder. Where the search wrote no tables (it still runs, or was stopped before), they are built from
    its trial folders as they are (``results.live_tables``) into ``local`` only: written into the storage, a table
    drawn mid-search was read as final there once the search stopped. ResultsError when the folder is not a
    search's."""
    from cem_bench.analysis.results import live_tables, running_driver
    from cem_bench.schema import GALLERY_FILE
    src = Dir(uri)
    if not src.is_dir():
        raise ResultsError(f"{uri}: no such folder; {VALID_FOLDER}")
    driver = running_driver(uri)
    live = None
    if driver is not None:
        try:
            live = live_tables(uri)
        except Exception as exc:  # noqa: BLE001 - any failure means: nothing to report on
            raise ResultsError(f"{uri}: no {TRIALS_FILE} and none could be built ({exc}); {VALID_FOLDER}") from exc
    trials = live[0] if live is not None else read_table(src, TRIALS_FILE, "trials")   # verified before writing
    if trials is None:
        raise ResultsError(f"{uri} holds neither {TRIALS_FILE} nor a Ray experiment written by `cem-bench search` "
                           f"(no experiment_state-*.json, no trial folder); {VALID_FOLDER}")
    local = Path(os.path.abspath(local))
    local.mkdir(parents=True, exist_ok=True)
    for name in (TRIALS_FILE, EPOCHS_FILE, CONFIGS_FILE, SPACE_FILE, MANIFEST_FILE):
        # an earlier fetch's (another experiment's, or of before its tables): its checksum list would refuse
        # this fetch's files, and its tables be read as this experiment's
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local / name)
    for name in ((SPACE_FILE,) if live is not None else
                 (TRIALS_FILE, EPOCHS_FILE, CONFIGS_FILE, SPACE_FILE, MANIFEST_FILE)):
        data = src.read_bytes(name)
        if data is not None:
            write_bytes(str(local / name), data, within=local)
    if live is not None:   # the copy's own tables (no configs.parquet: the report builds the configurations)
        for name, table, kind in ((TRIALS_FILE, live[0], "trials"), (EPOCHS_FILE, live[1], "epochs")):
            write_table(Dir(local), name, table, kind)
    for d in trials.get("trial_dir", pd.Series(dtype=object)).dropna().astype(str):
        # a trial folder is a plain relative name: one from a table that leaves `local` is skipped
        rel = relative_inside(local, d) if not os.path.isabs(d) else None
        if rel is None:
            continue
        data = src.read_bytes(*rel.split(os.sep), GALLERY_FILE)
        if data is not None:
            write_bytes(str(local / rel / GALLERY_FILE), data, within=local)
    return local, driver


def check_results_dir(results_dir: str | Path) -> Path:
    """``results_dir`` as a Path; ResultsError (nothing written) unless it is a folder that holds
    ``trials.parquet`` or a Ray experiment of ``cem-bench search`` (trial folders or an experiment state)."""
    if is_uri(results_dir):
        raise ResultsError(f"{results_dir}: fetch it first (report.build_report does, given a local out_dir)")
    path = Path(results_dir)
    if not path.exists():
        raise ResultsError(f"{path}: no such folder; {VALID_FOLDER}")
    if not path.is_dir():
        raise ResultsError(f"{path} is not a folder; {VALID_FOLDER}")
    if os.path.lexists(path / TRIALS_FILE):
        return path
    from cem_bench.analysis import results  # lazy: reading Ray folders is only needed without trials.parquet

    exp = Dir(path)
    has_state = results.ray_trials(exp) is not None
    if not has_state and not any(results.is_trial_dir(exp, d) for d in exp.subdirs()):
        if (path / CHECKPOINT_FILE).is_file() and (path / METRICS_FILE).is_file():
            # one `train --out` run: the generic words sent its user looking for a search they never ran
            raise ResultsError(f"{path} is one run of `cem-bench train` ({CHECKPOINT_FILE}, {METRICS_FILE}): its "
                               f"metrics are in {METRICS_FILE}, its gallery in recon.png, and `cem-bench attack "
                               f"{path}` attacks it again; a report is of the experiment folder of a `cem-bench "
                               f"search` (several runs, their front and their tests)")
        raise ResultsError(f"{path} holds neither {TRIALS_FILE} nor a Ray experiment written by `cem-bench search` "
                           f"(no experiment_state-*.json, no trial folder); {VALID_FOLDER}")
    return path


def _read_trials(results_dir: Path) -> pd.DataFrame:
    path = results_dir / TRIALS_FILE
    if not os.path.lexists(path):
        from cem_bench.analysis.results import write_tables  # lazy: results.py reads Ray folders
        try:
            write_tables(results_dir)
        except ResultsError:
            raise
        except Exception as exc:  # noqa: BLE001 - the Ray files may be anything: a message, not a traceback
            raise ResultsError(f"{path} is missing and could not be built from the Ray experiment folder "
                               f"({type(exc).__name__}: {exc}); {VALID_FOLDER}") from exc
    trials = read_table(results_dir, TRIALS_FILE, "trials")
    if trials is None:
        raise ResultsError(f"{path} is missing and could not be built from the Ray experiment folder; "
                           f"{VALID_FOLDER}")
    return trials


def _read_epochs(results_dir: Path) -> pd.DataFrame | None:
    return _epochs_frame(read_table(results_dir, EPOCHS_FILE, "epochs"))


def _epochs_frame(epochs: pd.DataFrame | None) -> pd.DataFrame | None:
    if epochs is None or epochs.empty or "trial_id" not in epochs or "epoch" not in epochs:
        return None
    epochs = epochs.copy()
    epochs["trial_id"] = epochs["trial_id"].astype(str)
    return epochs


def numeric(series: pd.Series) -> pd.Series:
    """Numbers, with anything else and ±inf as NaN: an infinite metric is a run that measured nothing (the
    statistics of ``aggregate.build_configs`` count it as missing too, so a mean and its n agree)."""
    return pd.to_numeric(series, errors="coerce").astype(float).replace([np.inf, -np.inf], np.nan)


def is_attack_metric(metric: str) -> bool:
    """A metric the attack computes (NaN when the attack did not run; ``attack_s``, its time, is a cost)."""
    return base_metric(metric) in ATTACK_METRICS


def _label_columns(df: pd.DataFrame) -> None:
    """``_surrogate``, ``_baseline`` (λ = 0) and ``_label`` of each row, in place."""
    if SURROGATE_COL in df:
        surrogate = df[SURROGATE_COL].astype(object).where(df[SURROGATE_COL].notna(), NO_SURROGATE)
        df["_surrogate"] = surrogate.astype(str)
    else:
        df["_surrogate"] = NO_SURROGATE
    if LAMBD_COL in df:
        df["_baseline"] = (numeric(df[LAMBD_COL]) == 0).fillna(False).astype(bool)
    else:
        df["_baseline"] = False
    df["_label"] = df["_surrogate"].where(~df["_baseline"], BASELINE_LABEL)


def _stored_configs(results_dir: Path | None, ids: pd.Series) -> pd.DataFrame | None:
    """``configs.parquet`` when it describes exactly these trials (same configurations, as many runs and
    repeats as trials)."""
    stored = read_table(results_dir, CONFIGS_FILE, "configs") if results_dir is not None else None
    if stored is None:   # (a damaged table stops the report)
        return None
    if not {CONFIG_ID, "runs", "runs_ok", "role", "final_front"} <= set(stored.columns):
        return None   # older than the comparison with the baseline: rebuilt from the trials
    if not adjusted(stored):
        return None   # older verdicts (single tests, or one run judged by the baseline's spread): rebuilt
    return stored if stored_describes(Dir(str(results_dir)), stored, ids) else None


def load_configs(results_dir: Path | None, raw: pd.DataFrame, trials: pd.DataFrame,
                 objectives: Sequence[dict]) -> tuple[pd.DataFrame | None, bool]:
    """One row per configuration: ``configs.parquet`` when it matches the trials, else
    ``aggregate.build_configs`` of ``raw`` (the table as read; statuses normalised like the report's). Adds
    the helper columns, each metric's mean under the metric's own name and ``_ok`` (an ok run); its
    ``pareto_rank`` is ``build_configs``'s (on the means). None when the trials have no config columns
    (nothing to group by). Also returns whether the table is the folder's ``configs.parquet`` (False: built
    here)."""
    if not len(raw) or not config_columns(raw):
        return None, False
    ids = trials[CONFIG_ID].astype(str)
    configs = _stored_configs(results_dir, ids)
    stored = configs is not None
    if configs is None:
        status = np.where(trials["_ok"].to_numpy(), "ok", "error")
        configs = build_configs(raw.assign(**{CONFIG_ID: ids.to_numpy(), "status": status}), objectives)
    configs = configs.copy().reset_index(drop=True)
    configs[CONFIG_ID] = configs[CONFIG_ID].astype(str)
    for col in ("runs", "runs_ok"):
        configs[col] = pd.to_numeric(configs[col], errors="coerce").fillna(0).astype(int)
    for m in dict.fromkeys([*REPORTED_METRICS, *(o["metric"] for o in objectives)]):
        configs[m] = numeric(configs[f"{m}_mean"]) if f"{m}_mean" in configs else np.nan
    configs["_ok"] = configs["runs_ok"] > 0
    _label_columns(configs)
    if "pareto_rank" not in configs or not pd.api.types.is_integer_dtype(configs["pareto_rank"]):
        # a table made by hand: build_configs ranks the means over the same objectives
        configs["pareto_rank"] = rank_table(configs, objectives, configs["_ok"].to_numpy())
    configs["pareto_rank"] = configs["pareto_rank"].astype(int)
    configs["final_front"] = configs["final_front"].fillna(False).astype(bool)
    return configs, stored


def add_pareto_ranks(trials: pd.DataFrame, objectives: Sequence[dict]) -> pd.DataFrame:
    """Recompute ``pareto_rank`` over ok trials (errored trials and NaN objectives get -1)."""
    trials = trials.copy()
    ok = trials["_ok"].to_numpy() if "_ok" in trials else None
    trials["pareto_rank"] = rank_table(trials, objectives, ok).astype(int)
    return trials


def load_results(results_dir: str | Path) -> Results:
    """Read and normalise a results folder (see the module docstring for the conventions).

    Raises ResultsError, before writing anything, when the folder does not exist or holds neither
    ``trials.parquet`` nor a Ray experiment of ``cem-bench search``."""
    results_dir = check_results_dir(results_dir)
    objectives, name = load_objectives(results_dir)
    space = _read_space(results_dir)   # once: each read is verified against the folder's manifest
    from cem_bench.analysis.results import live_tables, running_driver
    driver = running_driver(results_dir)
    if driver is None:
        trials, epochs = _read_trials(results_dir), _read_epochs(results_dir)
        check_cells(trials, str(Path(results_dir) / TRIALS_FILE))
    else:   # its tables are not written yet, or are those of before a --resume: read from its trials, not written
        trials, epochs = live_tables(results_dir)
        epochs = _epochs_frame(epochs)
    res = results_of(trials, objectives, results_dir=results_dir, name=name, epochs=epochs,
                     utility_tolerance=_utility_tolerance(space), running_driver=driver)
    res.hypotheses, res.hypotheses_problem = _space_hypotheses(space)
    res.verified = (results_dir / MANIFEST_FILE).is_file()
    res.confirm_plan = _confirm_plan(space)
    res.searched = _searched(space)
    return res


def _searched(spec: dict | None) -> dict[str, bool]:
    """The space's searched keys as config columns, with their ``log`` flags ({} without a space, or for an
    entry not of the shape ``spaces.validate`` writes)."""
    params = spec.get("params") if spec else None
    out: dict[str, bool] = {}
    for p in params if isinstance(params, list) else []:
        if isinstance(p, dict) and isinstance(p.get("key"), str) and p["key"]:
            out[f"config.{p['key']}"] = p.get("log") is True
    return out


def _read_space(results_dir: Path) -> dict | None:
    """``search_space.json`` parsed (verified, ``integrity``); None when there is none or it is not an object."""
    from cem_bench.integrity import read_json_file
    spec = read_json_file(results_dir, SPACE_FILE, "the search space the search saved (JSON)", lost=SPACE_LOST)
    return spec if isinstance(spec, dict) else None


def _confirm_plan(spec: dict | None) -> dict | None:
    """The space's planned confirmation (``{"top": K, "replicates": R}``); None when it planned none
    (``confirm: false``), or there is no space, or the entry is not of that shape."""
    conf = spec.get("confirm") if spec else None
    if not isinstance(conf, dict):
        return None
    top, reps = conf.get("top"), conf.get("replicates")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (top, reps)):
        return None
    return {"top": top, "replicates": reps}


def read_space_hypotheses(results_dir: Path) -> tuple[dict | None, str | None]:
    """The space's ``hypotheses`` from ``search_space.json`` (``hypotheses.read_hypotheses``): (None, None)
    when it states none or there is no space."""
    return _space_hypotheses(_read_space(results_dir))


def _space_hypotheses(spec: dict | None) -> tuple[dict | None, str | None]:
    from cem_bench.analysis.hypotheses import read_hypotheses
    return read_hypotheses(spec.get("hypotheses") if spec else None)


def _utility_tolerance(spec: dict | None) -> float | None:
    """The space's ``utility_tolerance``; None when it states none (a space saved before the key, or no space);
    ResultsError when it states something that is not a number >= 0."""
    value = spec.get("utility_tolerance") if spec else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        # the space's parser refuses such a value: written by hand, and replacing it by the default without a
        # word reported a tolerance nobody chose (2026-12-07 probe)
        raise ResultsError(f"{SPACE_FILE}: utility_tolerance {value!r} is not a number >= 0 (the accuracy a "
                           f"configuration may lose against its baseline and still count as useful); a search "
                           f"space that says so is refused, so this file was written by hand or by another tool")
    return float(value)


def results_of(trials: pd.DataFrame, objectives: Sequence[dict], results_dir: Path | None = None,
               name: str | None = None, epochs: pd.DataFrame | None = None,
               utility_tolerance: float | None = None, running_driver: dict | None = None) -> Results:
    """A ``Results`` of a trials table as read (``load_results`` without the folder: the claims' simulation in
    tests/test_claims.py judges hundreds of tables this way). ``objectives`` are copied, their missing
    references filled from the data; without ``results_dir``, or with ``running_driver`` (a search still runs
    on the folder: its configs.parquet, if any, is of before a ``--resume``), no stored ``configs.parquet`` is
    read.

    A table as ``results.write_tables`` leaves it (``results.is_final``) is only read: its statuses, roles,
    nulled keys, ``config_id`` and ``pareto_rank`` (over the folder's objectives, which ``load_results``
    passes) are the writer's. Only a table without them, written by an older cem-bench or by hand, is
    normalised here (``normalise_older``). Either way the report adds its helper columns (``_ok``,
    ``_label``, ...) and coerces the columns it draws to numbers."""
    objectives = [dict(o) for o in objectives]
    final = is_final(trials)
    if final:
        trials = trials.reset_index(drop=True)
        raw = trials.copy()
    else:
        trials, raw = normalise_older(trials, objectives)

    trials["trial_id"] = trials["trial_id"].astype(str)
    trials["_ok"] = trials["status"].astype(str).str.lower() == "ok"
    for col in loaded_metrics(objectives):
        if col not in trials:
            trials[col] = np.nan
        trials[col] = numeric(trials[col])
    for col in MAIN_PARAMS:
        if col in trials:
            trials[col] = numeric(trials[col])

    _label_columns(trials)
    trials["_attack_skipped"] = skipped_attacks(trials)
    if SKIP_COL in trials:
        trials[SKIP_COL] = trials[SKIP_COL].astype(object).where(trials[SKIP_COL].notna(), "").astype(str)
    finished = trials["finished_at"] if "finished_at" in trials else pd.Series(pd.NaT, index=trials.index)
    trials["_finished"] = pd.to_datetime(finished, utc=True, errors="coerce", format="mixed")
    # completion order: by finish time, unknown times last, table order breaks ties
    unknown = trials["_finished"].isna().to_numpy()
    trials["_order"] = np.argsort(np.lexsort((np.arange(len(trials)), _ns(trials["_finished"]), unknown)))
    trials["pareto_rank"] = trials["pareto_rank"].astype(int)

    # fill missing references from the data (the worst ok value), so a hypervolume always exists
    for o in objectives:
        if o.get("ref") is None:
            vals = trials.loc[trials["_ok"], o["metric"]].dropna()
            worst = (vals.min() if o["mode"] == "max" else vals.max()) if len(vals) else 0.0
            o["ref"] = float(worst) - 1e-9 if o["mode"] == "max" else float(worst) + 1e-9
        o["ref"] = float(o["ref"])

    if not name and "experiment" in trials and trials["experiment"].notna().any():
        name = str(trials["experiment"].dropna().iloc[0])
    name = name or (results_dir.resolve().name if results_dir is not None else "results")

    ok_non_baseline = trials[trials["_ok"] & ~trials["_baseline"]]
    surrogates = sorted(set(ok_non_baseline["_surrogate"]) | set(trials.loc[~trials["_baseline"], "_surrogate"]))
    palette = [
        "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3",
        "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd",
    ]  # fmt: skip
    colors = {s: palette[i % len(palette)] for i, s in enumerate(surrogates)}
    configs, stored = load_configs(None if running_driver is not None else results_dir, raw, trials, objectives)
    return Results(results_dir, name, objectives, trials, epochs, surrogates, colors, configs, utility_tolerance,
                   configs_stored=stored, final_table=final, running_driver=running_driver)


def normalise_older(trials: pd.DataFrame, objectives: Sequence[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The fallback for a trials table that lacks what ``results.write_tables`` now guarantees
    (``results.FINAL_COLUMNS``): written by an older cem-bench, or by hand. The writer's normalisation,
    done here once for such a table: the λ = 0 rows as the baseline (whatever surrogate keys an older table
    recorded for them), roles ("search" where none), ``config_id``, a ``trial_id`` and a ``status`` for every
    row, no attack metric where the attack was skipped, and ``pareto_rank`` over ``objectives`` among the ok
    trials (-1 for the others and for a NaN objective). Returns ``(trials, raw)``: ``raw`` is the table with
    only the nulled keys, roles and skipped attacks, whose config values ``config_id`` hashes and
    ``load_configs`` aggregates (before any coercion)."""
    trials = null_inapplicable(trials).reset_index(drop=True)
    trials[ROLE_COLUMN] = roles(trials)
    trials = null_skipped_attacks(trials)
    raw = trials.copy()  # as stored: configuration ids hash the config values before any coercion
    if CONFIG_ID not in trials and len(trials) and config_columns(raw):
        trials[CONFIG_ID] = config_ids(raw).astype(str)
    if "trial_id" not in trials:
        trials["trial_id"] = [f"trial_{i}" for i in range(len(trials))]
    if "status" not in trials:
        trials["status"] = "ok"
    trials["status"] = trials["status"].fillna("error").astype(str)
    for col in loaded_metrics(objectives):
        if col not in trials:
            trials[col] = np.nan
    ok = (trials["status"].str.lower() == "ok").to_numpy()
    trials["pareto_rank"] = rank_table(trials, objectives, ok).astype(int)
    return trials, raw


def loaded_metrics(objectives: Sequence[dict]) -> set[str]:
    """The metric columns every ``Results.trials`` has (NaN where the table has none): the reported metrics
    and the objectives."""
    return set(REPORTED_METRICS) | {o["metric"] for o in objectives}


def _ns(ts: pd.Series) -> np.ndarray:
    """Datetimes as int64 nanoseconds (NaT -> 0; NaT is sorted separately)."""
    out = np.zeros(len(ts), dtype=np.int64)
    mask = ts.notna().to_numpy()
    if mask.any():
        out[mask] = ts[mask].astype("datetime64[ns, UTC]").astype("int64").to_numpy()
    return out


def front_of(df: pd.DataFrame, metrics: Sequence[str], modes: Sequence[str]) -> pd.DataFrame:
    """Rows of ``df`` on the Pareto front of ``metrics`` (NaN rows excluded)."""
    if df.empty:
        return df
    values = np.column_stack([numeric(df[m]).to_numpy() for m in metrics])
    return df[pareto_mask(values, list(modes))]


def best_baseline(res: Results) -> pd.Series | None:
    """The ok λ=0 trial with the best first objective, or None."""
    first = res.objectives[0]
    base = res.ok[res.ok["_baseline"]].dropna(subset=[first["metric"]])
    if base.empty:
        return None
    return base.sort_values(first["metric"], ascending=first["mode"] == "min", kind="stable").iloc[0]
