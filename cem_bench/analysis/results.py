"""Read a Ray Tune experiment folder written by ``cem-bench search``; write ``trials.parquet`` and
``epochs.parquet`` (no Ray import).

A trial is a sub-folder of the experiment that holds Ray's ``params.json`` / ``result.json`` or our
``trial_result.json`` (written by the trainable: status, error, metrics, node, ``info.config``,
``info.history``). Every trial folder gives one row of ``trials.parquet``, errored trials included:

* ``trial_result.json`` present: its status (``ok``/``error``), error, metrics, config and provenance;
* absent (the trial never finished: it crashed for good, or the search was stopped): status ``error``
  with Ray's ``error.txt`` (its last failure) or "no final result"; config from ``params.json``.

``epochs.parquet`` has one row per (trial, epoch): from ``info.history`` where the trial finished, else
from the epoch records in Ray's ``result.json`` lines (the last record of an epoch wins).

Both tables are written to a temporary file and renamed into place (``os.replace``), so a crash never
leaves a half-written table. Local folders and ``file://`` paths are supported directly; ``s3://``/
``gs://`` experiment URIs are read and written through ``pyarrow.fs`` (a single PUT per table, which
object stores make atomic); ``cem-bench report s3://... --out DIR`` reads them there (docs/cluster.md).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..integrity import parse_table, table_bytes, write_table
from ..parsing import loads_json
from ..schema import (
    CONFIGS_FILE,
    DRIVER_LOCK_FILE,
    EPOCH_COLUMNS,
    EPOCHS_FILE,
    EXECUTION_KEYS,
    INTERRUPTED_FILE,
    METRIC_COLUMNS,
    PROVENANCE,
    RAY_ERROR_FILE,
    RAY_PARAMS_FILE,
    RAY_RESULT_FILE,
    RESULT_FILE,
    SCHEDULER_FILE,
    TRIALS_FILE,
    load_objectives,
    rank_table,
)
from ..storage import Dir as _Dir
from ..storage import lock_holder
from .bundle import read_resume_bundle

# keys of Ray's result lines that are bookkeeping, not epoch metrics
_RAY_KEYS = {"timestamp", "checkpoint_dir_name", "done", "training_iteration", "trial_id", "date",
             "time_this_iter_s", "time_total_s", "pid", "hostname", "node_ip", "config", "time_since_restore",
             "iterations_since_restore", "status", "node_id", "resumed_from_epoch", "attack_mse",
             "attack_psnr", "attack_ssim", "experiment_tag", "should_checkpoint"}
_TRIAL_ID = re.compile(r"^[A-Za-z0-9]+(?:_[A-Za-z]+)*_([0-9a-f]{8}|[0-9a-f]{5}_\d{5})_\d+_")



def _load_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return loads_json(text)
    except ValueError:
        return None


def _json_lines(text: str | None) -> list[dict]:
    out = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = loads_json(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _num(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan


# ----------------------------------------------------------------------------------- reading
def ray_trials(exp: _Dir) -> list[dict] | None:
    """The trials of Ray's newest ``experiment_state-*.json`` (``trial_id``, ``status``, ``dir``, ``config``,
    ``failures``, ``meta``), or None when there is no readable state file. ``meta`` is the trial's run metadata
    (the second item of its entry, a dict, or None), as parsed JSON: nothing in it is unpickled. ``failures`` is
    its ``num_failures``: how often the trial failed (its worker or node died) and, within ``max_failures``, was
    started again from its last checkpoint; None when Ray did not record it."""
    names = []
    if not exp.uri:
        names = [e.name for e in os.scandir(exp.root) if e.is_file() and e.name.startswith("experiment_state-")
                 and e.name.endswith(".json")]
    else:
        import pyarrow.fs as pafs
        infos = exp.fs.get_file_info(pafs.FileSelector(exp.root, recursive=False))
        names = [i.base_name for i in infos if i.base_name.startswith("experiment_state-")
                 and i.base_name.endswith(".json")]
    # newest by name, as Ray does (the name carries the driver's start time; mtimes change when a resumed
    # driver syncs its copy of an older state file back). The search's own bundle of the last complete
    # checkpoint (search.RESUME_STATE_FILE) wins over Ray's copy of the same name, which a driver killed
    # while copying can have left truncated or one checkpoint behind; unless Ray's copy is further along
    # (``state_is_ahead``): then a later bundle could not be written and the one left is stale.
    texts: dict[str, str | None] = {}
    bundled = _bundled_experiment_state(exp)
    for name in sorted(set(names) | set(bundled), reverse=True):
        texts[name] = exp.read_text(name) if name in names else None
        if name in bundled and not state_is_ahead(texts[name], bundled[name]):
            texts[name] = bundled[name]
    for name in sorted(texts, reverse=True):
        state = _load_json(texts[name])
        if not isinstance(state, dict) or "trial_data" not in state:
            continue
        out = []
        for entry in state["trial_data"]:
            try:
                t = entry[0] if isinstance(entry, (list, tuple)) else entry
                t = loads_json(t) if isinstance(t, str) else t
                meta = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 else None
                meta = loads_json(meta) if isinstance(meta, str) else meta
                failures = meta.get("num_failures") if isinstance(meta, dict) else None
                out.append({"trial_id": str(t["trial_id"]), "status": t.get("status"),
                            "dir": t.get("relative_logdir"), "config": t.get("config") or {},
                            "failures": int(failures) if isinstance(failures, (int, float)) else None,
                            "meta": meta if isinstance(meta, dict) else None})
            except (KeyError, TypeError, ValueError, IndexError):
                continue
        return out
    return None


_ENDED_STATUSES = frozenset({"TERMINATED", "ERROR"})


def _state_progress(text: str | bytes | None) -> dict[str, bool] | None:
    """trial id -> has the trial ended (TERMINATED or ERROR), of one experiment state's text; None when it is not
    a readable state (a copy cut by a kill)."""
    state = _load_json(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)
    if not isinstance(state, dict) or not isinstance(state.get("trial_data"), list):
        return None
    out: dict[str, bool] = {}
    for entry in state["trial_data"]:
        try:
            t = entry[0] if isinstance(entry, (list, tuple)) else entry
            t = loads_json(t) if isinstance(t, str) else t
            out[str(t["trial_id"])] = str(t.get("status")).upper() in _ENDED_STATUSES
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return out


def state_is_ahead(text: str | bytes | None, than: str | bytes | None) -> bool:
    """Is the experiment state ``text`` a later checkpoint than ``than``: readable, every trial of ``than`` in it
    and every trial ``than`` lists as ended ended in it too, and one more trial, or one more ended? Within a run
    Ray only adds trials and never restarts an ended one, and a restored run starts from all of them, so a later
    checkpoint is always ahead or equal; one that is neither (behind, or each ahead in something) is not taken
    for a later one. This is how the search's bundle of its last complete checkpoint (``RESUME_STATE_FILE``) is
    known to be stale: the driver writes it before Ray copies its own files, so Ray's readable copy is never
    ahead of it, unless a later bundle could not be written (search/searcher.py: the previous bundle is then
    kept, since the same full disk can have cut Ray's copy, and this tells when Ray's is the later one)."""
    new, old = _state_progress(text), _state_progress(than)
    if new is None or old is None:
        return False
    if any(t not in new or (ended and not new[t]) for t, ended in old.items()):
        return False
    return len(new) > len(old) or sum(new.values()) > sum(old.values())


def _bundled_experiment_state(exp: _Dir) -> dict[str, str]:
    """``{experiment_state-S.json: text}`` from the search's bundle of its last complete checkpoint."""
    try:
        bundle = read_resume_bundle(exp.display if exp.uri else exp.root)
    except ValueError:  # unreadable: use Ray's files
        return {}
    if bundle is None:
        return {}
    return {n: b.decode("utf-8", errors="replace") for n, b in bundle["files"].items()
            if n.startswith("experiment_state-") and n.endswith(".json")}


def is_trial_dir(exp: _Dir, name: str) -> bool:
    if name.startswith(".") or name in ("report",):
        return False
    return any(exp.exists(name, f) for f in (RESULT_FILE, RAY_PARAMS_FILE, RAY_RESULT_FILE))


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    from datetime import datetime, timezone
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def _last_error(text: str | None) -> str | None:
    """The last failure recorded in Ray's error.txt ("Failure # N (occurred at ...)" blocks)."""
    if not text or not text.strip():
        return None
    blocks = re.split(r"(?m)^Failure # \d+ \(occurred at [^)]*\)\s*$", text)
    last = next((b.strip() for b in reversed(blocks) if b.strip()), text.strip())
    lines = [ln for ln in last.splitlines() if ln.strip()]
    # the exception line is the most telling; keep a bounded tail of the traceback
    tail = "\n".join(lines[-12:])
    return tail[-4000:]


def read_trial(exp: _Dir, name: str, experiment: str) -> tuple[dict, list[dict]]:
    """One row of trials.parquet and the trial's epoch rows."""
    text = exp.read_text(name, RESULT_FILE)
    ours = _load_json(text)
    ours = ours if isinstance(ours, dict) else None
    # written once, at the trial's end: there but unreadable is a damaged file, not a trial that stopped (it read
    # "did not finish", and a baseline lost a replicate without a word)
    damaged = text is not None and ours is None
    lines = _json_lines(exp.read_text(name, RAY_RESULT_FILE))
    params = _load_json(exp.read_text(name, RAY_PARAMS_FILE))
    m = _TRIAL_ID.search(name)
    trial_id = (ours or {}).get("trial_id") or next((r["trial_id"] for r in lines if r.get("trial_id")), None) \
        or (m.group(1) if m else name)

    row: dict[str, Any] = {"experiment": experiment, "trial_id": str(trial_id), "trial_dir": name}
    if ours is not None:
        info = ours.get("info") or {}
        row["status"] = "ok" if ours.get("status", "ok") == "ok" else "error"
        row["error"] = ours.get("error")
        config = info.get("config") or (params if isinstance(params, dict) else {})
        for k, v in ours.items():
            if k in ("info", "status", "error", "trial_id", "trial_dir", "experiment", "epoch"):
                continue
            if isinstance(v, (int, float, str, bool)) or v is None:
                row[k] = v
        for k in ("git_sha", "package_version", "torch_version", "device"):
            row[k] = info.get(k)
        history = info.get("history") or []
    else:
        row["status"] = "error"
        row["error"] = (f"{RESULT_FILE} of {name} is damaged (not a JSON object: cut short, or overwritten), so the "
                        f"trial's final result cannot be read, though the trial wrote it at its end; restore the "
                        f"file from a copy, or rerun the trial") if damaged else \
            _last_error(exp.read_text(name, RAY_ERROR_FILE)) or \
            "no final result: the trial did not finish (stopped, or it failed for good without a recorded error)"
        row["_error_at"] = exp.mtime(name, RAY_ERROR_FILE)
        config = params if isinstance(params, dict) else {}
        last = lines[-1] if lines else {}
        row["node_id"] = last.get("node_id")
        row["hostname"] = last.get("hostname")
        history = _history_from_lines(lines)
        row["epochs_done"] = max((h["epoch"] for h in history), default=0)
        row["finished_at"] = _iso(exp.mtime(name, RAY_ERROR_FILE) or exp.mtime(name, RAY_RESULT_FILE))
    # no resolved config of the trial's own: the searcher's sample only (complete_configs fills the rest)
    row["_partial"] = not (ours is not None and (ours.get("info") or {}).get("config"))
    config = dict(config or {})
    # why the trial ran (aggregate.ROLES): the trial's own record, else the config the searcher gave it
    role = config.pop("role", None)
    row["role"] = str((ours or {}).get("role") or role or "search")
    for k, v in config.items():
        row[f"config.{k}"] = v

    epochs = []
    seen: dict[int, int] = {}
    for rec in history:
        if not isinstance(rec, dict) or "epoch" not in rec:
            continue
        erow = {"experiment": experiment, "trial_id": str(trial_id)}
        for k, v in rec.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                erow[k] = v
        ep = int(rec["epoch"])
        erow["epoch"] = ep
        if ep in seen:  # keep the last record of an epoch
            epochs[seen[ep]] = erow
        else:
            seen[ep] = len(epochs)
            epochs.append(erow)
    return row, epochs


def _history_from_lines(lines: list[dict]) -> list[dict]:
    out: dict[int, dict] = {}
    for rec in lines:
        if "epoch" not in rec or rec.get("status") not in (None, "running"):
            continue
        try:
            ep = int(rec["epoch"])
        except (TypeError, ValueError):
            continue
        out[ep] = {k: v for k, v in rec.items() if k not in _RAY_KEYS}
    return [out[k] for k in sorted(out)]


def _arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns pyarrow cannot type (e.g. a mix of strings and numbers) become JSON strings."""
    import pyarrow as pa
    df = df.copy()
    for col in df.columns:
        if df[col].dtype != object:
            continue
        try:
            pa.array(df[col].tolist(), from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            df[col] = [None if (v is None or (isinstance(v, float) and math.isnan(v))) else
                       (v if isinstance(v, str) else json.dumps(v)) for v in df[col]]
    return df


READ_THREADS_LOCAL = 4     # threads reading trial folders on a local disk (JSON parsing holds the GIL)
READ_THREADS_REMOTE = 32   # on object storage, where each read waits for a request


def scheduler_stops(exp: _Dir) -> dict[str, dict]:
    """trial id -> the scheduler's stop decision (``SCHEDULER_FILE``, written by the search's scheduler:
    ``{"decisions": [{"trial_id", "epoch", "reason", ...}], ...}``); empty without a scheduler. A damaged
    file is not a reason to lose the tables: its trials then read as "no final result"."""
    doc = _load_json(exp.read_text(SCHEDULER_FILE)) if exp.exists(SCHEDULER_FILE) else None
    decisions = doc.get("decisions") if isinstance(doc, dict) else None
    out = {}
    for d in decisions if isinstance(decisions, list) else []:
        if isinstance(d, dict) and d.get("trial_id") is not None and d.get("action", "stop") == "stop":
            out[str(d["trial_id"])] = d
    return out


def mark_stopped(row: dict, stops: dict[str, dict]) -> dict:
    """A trial the scheduler stopped has no final record: status "stopped" (not an error; left out of every
    aggregate, front and table like any trial that is not "ok"), ``stopped_at_epoch`` and ``stop_reason``."""
    d = stops.get(str(row.get("trial_id")))
    if d is None or row.get("status") == "ok":
        return row
    return {**row, "status": "stopped", "error": None, "stopped_at_epoch": d.get("epoch"),
            "stop_reason": d.get("reason")}


# an error Ray recorded up to this long before the signal is the signal's doing (a worker ended by it)
INTERRUPT_SLACK_S = 5.0


def interruption(exp: _Dir) -> dict | None:
    """The record of the signal that stopped the search (search/interrupt.py), or None."""
    doc = _load_json(exp.read_text(INTERRUPTED_FILE)) if exp.exists(INTERRUPTED_FILE) else None
    return doc if isinstance(doc, dict) and isinstance(doc.get("signal"), str) else None


# The record of a search whose driver ended before the search did, without a signal it could answer (kill -9, the
# out-of-memory killer, a lost head node, a crash): the driver writes it when Tune's loop starts, and replaces it
# with a signal's record, or removes it, when the loop returns (search/run.py); a reader makes one up for a folder
# without any whose Ray state still lists trials in flight (``unfinished_record``)
HARD_STOP = "a stop of its driver it could not answer (kill -9, out of memory, a lost head node, or a crash)"


def hard_stop_record(resume: str | None) -> dict:
    """``INTERRUPTED_FILE``'s record of a hard stop (``HARD_STOP``), with the command that continues the search."""
    return {"signal": HARD_STOP, "hard": True, "at": None, "resume": resume}


def unfinished_record(state: list[dict] | None) -> dict | None:
    """A hard stop's record (no command known) where Ray's newest experiment state lists a trial running,
    waiting or paused, as no search that ended does (every trial then ended, or a signal's record is there);
    else None."""
    if any(str(t.get("status")).upper() in _LIVE_STATUSES for t in state or []):
        return hard_stop_record(None)
    return None


def mark_interrupted(row: dict, record: dict | None, ray_status: str | None = None) -> dict:
    """A trial that was in flight (or waiting) when a signal stopped the search: status "interrupted", not
    "error" (``--resume`` continues it from its last checkpoint). Stays an error: a trial's own recorded error
    (its ``trial_result.json``: it ended, a diverged run, say, which no resume runs again), and an error Ray
    recorded before the signal. (One Ray recorded after it, in a resumed run killed before its end, is
    "interrupted": the next ``--resume`` runs it again, as it runs every errored trial.) After a hard stop
    (``record["hard"]``: no time of the stop is known) the trials in flight are those Ray's experiment state
    (``ray_status``) lists as running, waiting or paused; one it lists as ended stays as it is."""
    error_at = row.pop("_error_at", None)
    if record is None or row.get("status") != "error":
        return row
    if error_at is None and not row.get("_partial"):
        return row
    if record.get("hard"):
        if str(ray_status).upper() not in _LIVE_STATUSES:
            return row
        return {**row, "status": "interrupted", "error": None, "interrupted_by": record["signal"]}
    at = record.get("at")
    if error_at is not None and isinstance(at, (int, float)) and error_at < at - INTERRUPT_SLACK_S:
        return row
    return {**row, "status": "interrupted", "error": None, "interrupted_by": record["signal"]}


# Ray's statuses of a trial that has not ended: started, waiting for resources or a free slot, or paused
_LIVE_STATUSES = frozenset({"RUNNING", "PENDING", "PAUSED"})


# ``running_driver`` of a folder on object storage whose search has written no tables: there is no lock there
# to ask (search/lock.py), so whether its driver still runs or was stopped before its tables is not known
UNSEEN_DRIVER: dict = {"unseen": True}


def running_driver(experiment_dir: str | os.PathLike) -> dict | None:
    """The driver of a search running on this experiment folder now (its lock's record: ``pid``, ``host``,
    ``started``; ``storage.lock_holder``), or None: no driver holds it. On object storage there is no lock
    (search/lock.py): a folder there without ``trials.parquet`` is read as one whose search may still run
    (``UNSEEN_DRIVER``), its tables built in memory and never written there, since a table written while the
    search runs would be read as final once it stopped; with the tables, None."""
    exp = _Dir(experiment_dir)
    if exp.uri:
        if exp.exists(TRIALS_FILE) or not is_experiment(exp):   # a folder that is no search's: none runs there
            return None
        return dict(UNSEEN_DRIVER)
    return lock_holder(os.path.join(exp.root, DRIVER_LOCK_FILE))


def is_experiment(exp: _Dir) -> bool:
    """Does ``exp`` hold a Ray experiment of `cem-bench search` (an experiment state, or a trial folder)?"""
    return ray_trials(exp) is not None or any(is_trial_dir(exp, d) for d in exp.subdirs())


def running_text(where: str, driver: dict) -> str:
    """What a reader says of a folder ``running_driver`` found a search on, naming ``where``."""
    from ..storage import holder_text
    if driver.get("unseen"):
        return (f"the search on {where} has not written its tables: it is still running, or it was stopped before "
                f"it could (its --resume finishes it); object storage has no lock to tell which")
    return f"a search is running on {where}{holder_text(driver)}"


def mark_running(row: dict, ray_status: str | None) -> dict:
    """While a search runs on the folder (``build_tables(running=True)``), a trial without a final result that
    Ray lists as running, waiting or paused, or that Ray does not list yet and has recorded no error, is not an
    error: status "running" (not finished yet). One Ray lists as ended stays as it is."""
    if row.get("status") != "error" or not ("_error_at" in row or row.get("_partial")):
        return row   # ok, or the trial's own recorded error (its trial_result.json)
    live = str(ray_status).upper() in _LIVE_STATUSES if ray_status is not None else row.get("_error_at") is None
    return {**row, "status": "running", "error": None} if live else row


# What ``trials.parquet`` holds as ``write_tables`` leaves it, so that its readers (the report, ``cem-bench
# table``) only read it: every row's ``status`` and ``role``; the λ = 0 rows as their own kind (surrogate
# "none", every other ``config.cem.*`` key null: ``aggregate.null_inapplicable``) and a trial's config with
# only the keys its surrogate reads (its resolved config, as the trial recorded it); no attack metric where
# the attack was skipped; ``config_id`` and ``pareto_rank`` over the search's objectives. A table that lacks
# one of these columns was written by an older cem-bench (or by hand): ``is_final`` tells the reader.
FINAL_COLUMNS: tuple[str, ...] = ("trial_id", "status", "role", "config_id", "pareto_rank")


def is_final(trials: pd.DataFrame) -> bool:
    """Does ``trials`` hold what ``write_tables`` guarantees (``FINAL_COLUMNS``, filled, an integer rank)?"""
    if not set(FINAL_COLUMNS) <= set(trials.columns):
        return False
    filled = not trials[[c for c in FINAL_COLUMNS if c != "pareto_rank"]].isna().to_numpy().any()
    return filled and pd.api.types.is_integer_dtype(trials["pareto_rank"])


def final_trials(rows: pd.DataFrame, objectives: list[dict]) -> pd.DataFrame:
    """The trials table as ``write_tables`` writes it (``FINAL_COLUMNS``) from one row per trial as read:
    the normalisation done once, here, and by no reader. Columns in order: ``experiment``, ``trial_id``,
    ``config_id``, the other base columns, ``pareto_rank``, the metrics, the rest, provenance, the config."""
    from .aggregate import CONFIG_ID, ROLE_COLUMN, config_ids, null_inapplicable, null_skipped_attacks, roles
    trials = null_skipped_attacks(null_inapplicable(rows))
    base = ["experiment", "trial_id", ROLE_COLUMN, "status", "error", "trial_dir"]
    for c in base + list(METRIC_COLUMNS) + list(PROVENANCE) + [o["metric"] for o in objectives]:
        if c not in trials:
            trials[c] = np.nan if c in METRIC_COLUMNS else None
    trials[ROLE_COLUMN] = roles(trials)     # every row has one (read_trial's), "search" where none was given
    for c in list(METRIC_COLUMNS) + [o["metric"] for o in objectives]:
        trials[c] = pd.to_numeric(trials[c], errors="coerce").astype(float)
    trials["pareto_rank"] = rank_table(trials, objectives)
    config_cols = sorted(c for c in trials.columns if c.startswith("config."))
    first = base + ["pareto_rank"] + list(METRIC_COLUMNS)
    rest = [c for c in trials.columns if c not in first and c not in config_cols and c not in PROVENANCE]
    trials = trials[first + sorted(rest) + list(PROVENANCE) + config_cols]
    if len(trials):
        trials = trials.sort_values(["finished_at", "trial_id"], na_position="last", kind="stable")
    trials = _arrow_safe(trials.reset_index(drop=True))
    # hashed as written (the JSON text _arrow_safe gives a mixed column), as a reader of the table hashes it
    trials.insert(2, CONFIG_ID, config_ids(trials).astype(str) if len(trials) else [])
    return trials


def saved_fixed(exp: _Dir) -> dict:
    """The fixed keys of the experiment's ``search_space.json`` ({} without one; a damaged one is the error
    ``load_objectives`` raises first)."""
    from ..integrity import read_json_file
    from ..schema import SPACE_FILE
    spec = read_json_file(exp, SPACE_FILE, "the search space the search saved (JSON)")
    fixed = spec.get("fixed") if isinstance(spec, dict) else None
    return dict(fixed) if isinstance(fixed, dict) else {}


def _value_key(v: Any) -> str:
    """One config value as a searcher sampled it and as the trial resolved it, made comparable (16 and 16.0
    alike; a list by its JSON)."""
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
        return repr(float(v))
    return json.dumps(v, sort_keys=True, default=str)


def complete_configs(rows: list[dict], fixed: dict) -> list[dict]:
    """The config columns of trials that never recorded their resolved config (stopped by a signal before
    their result, failed for good, or never started): Ray kept only the searcher's sample, so such a row lacked
    the space's fixed keys and every default, hashed as a configuration of its own, and the tables showed
    a made-up one ("σ=?" beside the real baseline). Each gets the fixed keys under its sample, then the
    resolved config of a finished trial that agrees with all of them (the same sample of the same space
    resolves the same way; the seed and how it ran stay its own); without one, the fixed keys alone. The
    finished trials are indexed once per set of keys compared, not scanned per row (100,000-trial tables)."""
    done = [r for r in rows if not r.get("_partial")]
    index: dict[tuple, dict] = {}
    out = []
    for row in rows:
        if not row.pop("_partial", False):
            out.append(row)
            continue
        own = {k: v for k, v in row.items() if k.startswith("config.")}
        config = {**{f"config.{k}": v for k, v in fixed.items()}, **own}
        compared = tuple(sorted(k for k in config if k != "config.seed" and k[len("config."):] not in EXECUTION_KEYS))
        if compared not in index:
            index[compared] = {}
            for d in reversed(done):   # the first finished trial of each sample wins
                if all(k in d for k in compared):
                    index[compared][tuple(_value_key(d[k]) for k in compared)] = d
        twin = index[compared].get(tuple(_value_key(config[k]) for k in compared))
        if twin is not None:
            config = {**{k: v for k, v in twin.items() if k.startswith("config.")}, **{
                k: v for k, v in config.items() if k == "config.seed" or k[len("config."):] in EXECUTION_KEYS}}
        out.append({**{k: v for k, v in row.items() if not k.startswith("config.")}, **config})
    return out


def build_tables(experiment_dir: str | os.PathLike, running: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trials and epochs DataFrames of an experiment folder (nothing written); the trials table as it is
    written (``final_trials``). ``running``: a search is running on the folder now (``running_driver``), so a
    trial without a final result may still be running or waiting (``mark_running``): the table of a moment,
    for the reader that asked, never written into the folder (its driver writes the tables when it ends)."""
    exp = _Dir(experiment_dir)
    if not exp.is_dir():
        raise FileNotFoundError(f"{exp.display} is not a folder (expected a `cem-bench search` experiment)")
    objectives, name = load_objectives(exp)
    experiment = name or os.path.basename(exp.root.rstrip("/"))
    rows, epoch_rows = [], []
    state = ray_trials(exp)
    dirs = exp.subdirs()
    if state is not None and not running:
        # Ray's experiment state is authoritative: a folder it does not list was started by a driver that
        # was killed before its next snapshot, and a resumed search ran that sample again under a new id.
        # (While the search runs, such a folder is most often a trial started since the last snapshot.)
        listed = {t["dir"] for t in state if t["dir"]}
        dirs = [d for d in dirs if d in listed]

    def one(d: str):
        return read_trial(exp, d, experiment) if is_trial_dir(exp, d) else None
    # the folders are read by a pool of threads: three small files each, and on object storage every read is
    # a request whose latency the threads overlap (docs/results.md)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=READ_THREADS_REMOTE if exp.uri else READ_THREADS_LOCAL) as pool:
        read = list(pool.map(one, dirs))
    dirs = [d for d, r in zip(dirs, read) if r is not None]
    stops = scheduler_stops(exp)
    # a --resume removes the record of the signal only once Ray has restored the run: while it runs, none applies.
    # Without a record, a state that still lists trials in flight is a driver that ended without one (a folder of
    # an older cem-bench, or a driver killed before Tune's loop wrote its record)
    interrupted = None if running else (interruption(exp) or unfinished_record(state))
    # a trial retried after a lost worker or node is one row like any other; this column says it was retried
    failures = {t["dir"]: t["failures"] for t in state or [] if t["dir"]}
    ray_status = {t["dir"]: t["status"] for t in state or [] if t["dir"]}

    def marked(row: dict) -> dict:
        row = mark_stopped(row, stops)
        if running:
            row = mark_running(row, ray_status.get(row.get("trial_dir")))
        return mark_interrupted(row, interrupted, ray_status.get(row.get("trial_dir")))
    for r in read:
        if r is not None:
            r[0]["failures"] = failures.get(r[0]["trial_dir"])
            rows.append(marked(r[0]))
            epoch_rows.extend(r[1])
    for t in state or []:
        if t["dir"] in dirs:
            continue
        # created by Tune but never started (no folder): still a row, as an error
        row = {"experiment": experiment, "trial_id": t["trial_id"], "trial_dir": t["dir"], "status": "error",
               "error": f"not run: the search stopped while the trial was {str(t['status']).lower()}",
               "_partial": True}
        config = dict(t["config"])
        row["role"] = str(config.pop("role", None) or "search")
        row.update({f"config.{k}": v for k, v in config.items()})
        rows.append(mark_interrupted(mark_running(row, t["status"]) if running else row, interrupted, t["status"]))

    # the space's fixed keys are read again only where a trial needs them (load_objectives read the file above)
    fixed = saved_fixed(exp) if any(r.get("_partial") for r in rows) else {}
    trials = final_trials(pd.DataFrame(complete_configs(rows, fixed)), objectives)

    epochs = pd.DataFrame(epoch_rows)
    for c in EPOCH_COLUMNS:
        if c not in epochs:
            epochs[c] = np.nan if c not in ("experiment", "trial_id") else None
    epochs = epochs[list(EPOCH_COLUMNS) + sorted(c for c in epochs.columns if c not in EPOCH_COLUMNS)]
    if len(epochs):
        epochs["epoch"] = epochs["epoch"].astype(np.int64)
        epochs = epochs.sort_values(["trial_id", "epoch"], kind="stable").reset_index(drop=True)
    return trials, _arrow_safe(epochs)


def write_tables(experiment_dir: str | os.PathLike,
                 tables: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> tuple[Path | str, Path | str]:
    """Write ``trials.parquet``, ``epochs.parquet`` and ``configs.parquet`` (the runs of each configuration
    aggregated, aggregate.py) into the experiment folder (atomically); return their paths (``Path`` for local
    folders, the URI string for remote ones). ``tables``: the ``build_tables`` of this folder when the caller
    has built them already (the search counts the statuses of the table it writes)."""
    from .aggregate import build_configs
    trials, epochs = tables if tables is not None else build_tables(experiment_dir)
    exp = _Dir(experiment_dir)
    objectives, _ = load_objectives(exp)
    configs = _arrow_safe(build_configs(trials, objectives))
    # trials.parquet last: its presence is what tells a reader the tables are written (load.py builds all three
    # where it is missing), so a driver killed between two writes leaves a folder whose tables are built again,
    # not one read for good without its per-epoch data
    e = write_table(exp, EPOCHS_FILE, epochs, "epochs")
    write_table(exp, CONFIGS_FILE, configs, "configs")
    t = write_table(exp, TRIALS_FILE, trials, "trials")
    if exp.uri:
        return t, e
    return Path(t), Path(e)


def live_tables(experiment_dir: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trials and epochs tables of a folder whose search is running (``build_tables(running=True)``), as
    ``write_tables`` would write them and ``integrity.read_table`` read them back, in memory: the folder is its
    driver's, which writes the tables when it ends (and a table written now would be stale then, and read as
    final by the next reader if the driver were killed)."""
    trials, epochs = build_tables(experiment_dir, running=True)
    where = f"{_Dir(experiment_dir).display} (read while its search runs)"
    return (parse_table(table_bytes(trials, "trials"), where, "trials"),
            parse_table(table_bytes(epochs, "epochs"), where, "epochs"))
