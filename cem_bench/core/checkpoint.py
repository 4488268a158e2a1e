"""Checkpoints: a saved run's ``checkpoint.pt`` and a search trial's ``state.pt``, written and read without
pickled code; and the encoder of either, for ``cem-bench attack`` (:func:`load_attackable`).

Both hold only tensors and plain values (dicts, lists, strings, numbers, booleans, None): the config as
flat keys, the trainer's ``state_dict`` (module and optimizer states, random-generator states as byte
tensors, the per-epoch history as dicts of numbers). So they are read with ``torch.load(weights_only=True)``,
whose unpickler builds those types and nothing else: a crafted file that would run code is refused, not
run. Each carries ``{"format": KIND, "version": N}``; files of version 1, written before the version
existed, hold the same types and still load. Every failure is a ``ResultsError`` that names the file.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import warnings
from typing import Any

import torch

from ..errors import ResultsError
from ..integrity import read_recorded, write_recorded
from ..parsing import loads_json
from ..schema import CHECKPOINT_DIR, CHECKPOINT_FILE, RAY_PARAMS_FILE, RESULT_FILE, STATE_FILE
from ..storage import Dir, read_regular

WHERE = ("RUN_DIR must be the --out folder of `cem-bench train` (it holds checkpoint.pt) or a search trial's "
         "folder (it holds trial_result.json and checkpoint_NNNNNN/state.pt)")
KIND = "cem-bench-checkpoint"
VERSION = 2        # 1: written before checkpoints carried a version
WHAT = "a cem-bench checkpoint (PyTorch, tensors and plain values only)"


def to_bytes(config: dict, trainer_state: dict | None) -> bytes:
    buf = io.BytesIO()
    torch.save({"format": KIND, "version": VERSION, "config": config, "trainer": trainer_state}, buf)
    return buf.getvalue()


def parse(data: bytes, path: str) -> dict[str, Any]:
    """The checkpoint dict of ``data`` (read from ``path``), loaded with ``weights_only=True``, its version
    checked. ResultsError otherwise."""
    if not data:
        raise ResultsError(f"{path} is empty (0 bytes): it should be {WHAT}")
    try:
        with warnings.catch_warnings():
            # torch warns on what a damaged file's bytes happen to say (a second byte read as "pickle protocol 65",
            # asking for an issue to be filed with torch; an opcode that rebuilds a TypedStorage, deprecated)
            # before it fails, above the one clear message below. The load ends in a checked dict or that message,
            # so no warning of it tells a user anything: all are silenced, not each text torch may choose
            warnings.simplefilter("ignore")
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e):
            raise ResultsError(f"{path} holds Python objects other than tensors and plain values, which would "
                               f"run code if loaded; cem-bench loads weights only and refused it (nothing of it "
                               f"was run). cem-bench never writes such a file: it was made or changed by "
                               f"someone else") from e
        raise ResultsError(f"{path} is not a readable checkpoint (UnpicklingError: {_short(e)}): it should be "
                           f"{WHAT}; it is truncated, damaged or of another format") from e
    # struct.error: the weights-only unpickler reading a length from bytes that end too soon ("junk");
    # AssertionError: torch's persistent_load checking a damaged storage id ("saved_id must be a tuple")
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            UnicodeDecodeError, OverflowError, MemoryError, struct.error, AssertionError) as e:
        raise ResultsError(f"{path} is not a readable checkpoint ({type(e).__name__}: {_short(e)}): it should "
                           f"be {WHAT}; it is truncated, damaged or of another format") from e
    if not isinstance(obj, dict):
        raise ResultsError(f"{path} holds a {type(obj).__name__}, not {WHAT}")
    version = obj.get("version", 1) if obj.get("format", KIND) == KIND else None
    if version is None:
        raise ResultsError(f"{path} is a {obj.get('format')!r} file, not {WHAT}")
    if version not in (1, VERSION):
        newer = isinstance(version, int) and version > VERSION
        raise ResultsError(f"{path} is a checkpoint of format version {version!r}; this cem-bench reads versions "
                           f"1 and {VERSION}" + (": upgrade cem-bench to read it" if newer else ""))
    return obj


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:240]


def save_run(out_dir: str, config: dict, trainer_state: dict | None) -> str:
    """``out_dir/checkpoint.pt``, recorded in the run folder's checksums; returns its path."""
    return write_recorded(out_dir, CHECKPOINT_FILE, to_bytes(config, trainer_state))


def load_run(run_dir: str) -> tuple[dict, dict]:
    """``(config, trainer_state)`` of a run folder's ``checkpoint.pt``, verified and checked. ResultsError
    (before anything is written) when it is missing, damaged, refused or not a finished run's."""
    folder = Dir(run_dir)
    if folder.kind() != "dir":   # a missing path is said as table and replay say it
        raise ResultsError(f"{run_dir}{': no such folder' if folder.kind() == 'missing' else ' is not a folder'}: "
                           f"{WHERE}")
    path = folder.url(CHECKPOINT_FILE)
    data = read_recorded(folder, CHECKPOINT_FILE, WHAT)
    if data is None:
        raise ResultsError(f"{path} does not exist: {WHERE}")
    obj = parse(data, path)
    config, state = obj.get("config"), obj.get("trainer")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise ResultsError(f"{path} has no config (a dict of flat keys): it is not a run's checkpoint")
    client = state.get("client") if isinstance(state, dict) else None
    if not isinstance(client, dict) or not all(isinstance(v, torch.Tensor) for v in client.values()):
        raise ResultsError(f"{path} holds no trained client encoder (trainer.client): the run did not finish, or "
                           f"the file is not a run's checkpoint")
    # the run's record, read later for its torch threads and its data's fingerprints: verified here, before any
    # work (2026-12-07 probe: an edited one re-attacked at another thread count, or blamed the data after it was
    # loaded; a deleted one skipped the data check without a word)
    from ..integrity import read_json_file
    from ..schema import METRICS_FILE
    read_json_file(folder, METRICS_FILE, "the run's record (metrics.json)",
                   lost="the re-attack would run without the run's torch threads and without checking its images")
    return config, state


def save_state(path: str, state: dict) -> None:
    """A search trial's per-epoch trainer state (inside a Ray checkpoint folder)."""
    torch.save({"format": KIND, "version": VERSION, "trainer": state}, path)


def load_state(path: str) -> dict:
    """The trainer state of :func:`save_state` (or of a version-1 ``state.pt``: the state itself)."""
    data = read_regular(path)   # a pipe or a device in a checkpoint folder: refused, never blocked on
    return _state_of(parse(data, path), path)


def _state_of(obj: dict, path: str) -> dict:
    state = obj["trainer"] if obj.get("format") == KIND else obj
    if not isinstance(state, dict) or "epoch" not in state or "client" not in state:
        raise ResultsError(f"{path} is not a trial's trainer state (no epoch and client)")
    return state


def load_trial(trial_dir: str) -> tuple[dict, dict]:
    """``(config, trainer_state)`` of a finished search trial: the resolved config of its ``trial_result.json``
    and the state of its latest Ray checkpoint with the encoder the trial attacked as its ``client`` (with
    ``train.select_best_last`` the selected epoch's copy that state holds). ResultsError (before anything is
    written) when the trial did not finish, or when that checkpoint is not of the attacked encoder: a trial whose
    last checkpoint is of an earlier epoch than its result (a folder copied in part), or another run's."""
    folder = Dir(trial_dir)
    if folder.kind() != "dir":
        raise ResultsError(f"{trial_dir} is not a folder: {WHERE}")
    path = folder.url(RESULT_FILE)
    try:
        record = loads_json(folder.read_bytes_or_raise(RESULT_FILE))
    except OSError as e:
        raise ResultsError(f"{path} cannot be read ({type(e).__name__}: {_short(e)}): {WHERE}") from e
    except (UnicodeDecodeError, ValueError) as e:
        raise ResultsError(f"{path} is not valid JSON ({type(e).__name__}: {_short(e)}): it should be the "
                           f"trial's final record; it is truncated, damaged or of another format") from e
    info = record.get("info") if isinstance(record, dict) else None
    config = info.get("config") if isinstance(info, dict) else None
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise ResultsError(f"{path} has no resolved config (info.config, a dict of flat keys): it is not a "
                           f"cem-bench trial's final record")
    status = record.get("status", "ok")
    if status != "ok":
        raise ResultsError(f"{path}: the trial ended {status!r}, not 'ok' ({record.get('error') or 'no error'}): "
                           f"it has no trained encoder to attack")
    epoch, selected = record.get("epoch"), record.get("selected_epoch", record.get("epoch"))
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        raise ResultsError(f"{path} records no final epoch (epoch: {epoch!r}): it is not a finished trial's record")
    if not isinstance(selected, int) or isinstance(selected, bool) or not 1 <= selected <= epoch:
        raise ResultsError(f"{path} records selected_epoch {selected!r}, not an epoch of the run (1..{epoch}): it "
                           f"is not a finished trial's record")
    kept = sorted((int(m.group(1)), name) for name in folder.subdirs() if (m := CHECKPOINT_DIR.fullmatch(name)))
    if not folder.uri:   # subdirs() leaves links out: said here, not as a missing or earlier checkpoint
        linked = sorted(e.name for e in os.scandir(folder.root) if e.is_symlink() and CHECKPOINT_DIR.fullmatch(e.name))
        if linked:
            raise ResultsError(f"{folder.url(linked[-1])} is a symbolic link: a trial's checkpoints are read from "
                               f"its own folders only (a link may point at another run's); copy the checkpoint "
                               f"folder into {folder.url()} in its place")
    if not kept:
        raise ResultsError(f"{folder.url()} holds no checkpoint_NNNNNN/ folder: the trial's trained encoder is "
                           f"not there (was the folder copied without them?)")
    name = kept[-1][1]
    state_path = folder.url(name, STATE_FILE)
    try:
        data = folder.read_bytes_or_raise(name, STATE_FILE)
    except OSError as e:
        raise ResultsError(f"{state_path} cannot be read ({type(e).__name__}: {_short(e)}): the latest "
                           f"checkpoint holds no trainer state") from e
    state = _state_of(parse(data, state_path), state_path)
    if state["epoch"] != epoch:
        raise ResultsError(f"{state_path} is the state of epoch {state['epoch']}, and the trial finished and was "
                           f"attacked at epoch {epoch}: it is not the encoder the trial attacked")
    _same_run(state, record, state_path, path)
    if selected != epoch:
        # train.select_best_last: the trial attacked the selected epoch's encoder, which every per-epoch state
        # holds beside the latest one (the trainer's ``best``)
        best = state.get("best")
        if not isinstance(best, dict) or best.get("epoch") != selected:
            raise ResultsError(f"{state_path}: the trial attacked the encoder of epoch {selected} "
                               f"(train.select_best_last), and its latest state holds the selected copy of epoch "
                               f"{best.get('epoch') if isinstance(best, dict) else None}: it is not the encoder "
                               f"the trial attacked")
        state = {**state, "client": best.get("client")}
    client = state["client"]
    if not isinstance(client, dict) or not all(isinstance(v, torch.Tensor) for v in client.values()):
        raise ResultsError(f"{state_path} holds no client encoder (trainer.client): it is not a trial's state")
    return config, state


def _same_run(state: dict, record: dict, state_path: str, path: str) -> None:
    """ResultsError when the state's epoch history is not the record's: a checkpoint of another trial of the same
    width copied into the folder would be attacked, and its numbers reported under this trial's config. Compared
    on every number each epoch's record holds in both (test accuracy, training loss, feature spread, seconds: each
    written from the same float): two runs at chance share their accuracies (2026-12-07 probe: a seed's checkpoint
    copied over another's, both at 0.1, was attacked under the other's name), not their losses. A record without
    a history (an older cem-bench's) is not compared."""
    ours = (record.get("info") or {}).get("history")
    theirs = state.get("history")
    if not isinstance(ours, list) or not isinstance(theirs, list):
        return

    def number(v):   # NaN (an epoch without a test pass) reads as None, as the JSON record holds it
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        return None if v != v else float(v)

    def rows(history: list) -> list:
        return [r if isinstance(r, dict) else {} for r in history]
    differ = len(ours) != len(theirs) or any(
        number(a.get(k)) != number(b.get(k)) for a, b in zip(rows(ours), rows(theirs))
        for k in set(a) & set(b) if isinstance(number(a.get(k)), (float, type(None))))
    if differ:
        raise ResultsError(f"{state_path}: its epochs' records (test accuracies, losses) are not those {path} "
                           f"records: the checkpoint is another run's (copied in?), not the encoder this trial "
                           f"attacked")


def recorded_threads(run_dir: str) -> int | None:
    """The torch threads a run or trial trained and attacked with (``torch_threads`` of its ``trial_result.json``
    or ``metrics.json``), so that a re-attack on the CPU repeats its arithmetic; None when no file records a
    whole number >= 1 (an older cem-bench's, or one that cannot be read: the attack then runs at torch's
    default, which ``cem-bench attack`` says)."""
    from ..schema import METRICS_FILE
    folder = Dir(run_dir)
    for name in (RESULT_FILE, METRICS_FILE):
        try:
            n = loads_json(folder.read_bytes_or_raise(name)).get("torch_threads")
        except Exception:  # noqa: BLE001 - missing, unreadable or not a JSON object: the next, then None
            continue
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            return n
    return None


# the splits a re-attack reads (the decoder trains on attack_aux, every attack is scored on attack_eval); train and
# test are recorded too, but a re-attack's numbers do not depend on them
ATTACKED_SPLITS = ("attack_aux", "attack_eval")


def recorded_data_sha256(run_dir: str) -> tuple[dict[str, str], str] | None:
    """``(info.data_sha256, the file's path)`` of a run's ``trial_result.json`` or ``metrics.json``; None when
    neither records one (an older cem-bench's run, or a file that cannot be read)."""
    from ..schema import METRICS_FILE
    folder = Dir(run_dir)
    for name in (RESULT_FILE, METRICS_FILE):
        try:
            sums = loads_json(folder.read_bytes_or_raise(name))["info"]["data_sha256"]
        except Exception:  # noqa: BLE001 - missing, unreadable or without the key: the next, then None
            continue
        if isinstance(sums, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in sums.items()):
            return sums, folder.url(name)
    return None


def check_same_data(run_dir: str, ours: dict[str, str], data_root: str) -> None:
    """DataError (nothing attacked) where the images a re-attack loaded (``ours``: ``data.fingerprints`` of its
    splits; computed by the caller, since this module may not import the data path) are not those its run
    recorded (``info.data_sha256``) for a split the attack reads: the numbers would be of other images than the
    run's, reported beside them. A run that records no fingerprint (an older cem-bench's) is not compared."""
    recorded = recorded_data_sha256(run_dir)
    if recorded is None:
        return
    sums, where = recorded
    from ..errors import DataError
    differ = [n for n in ATTACKED_SPLITS if n in sums and sums[n] != ours[n]]
    if differ:
        raise DataError(f"the {' and '.join(differ)} images loaded now (data.root={data_root!r}) are not those "
                        f"the run used "
                        f"(sha256 {', '.join(f'{n} {ours[n][:12]} here, {sums[n][:12]} in {where}' for n in differ)}): "
                        f"the data differ from the run's (another copy of the data set under data.root, or other "
                        f"versions of the packages that read or make it: torchvision, scikit-learn, scikit-image, "
                        f"torch). Nothing was attacked; attack with the run's data (--set data.root=DIR where its "
                        f"copy is, or the package versions its info records)")


def load_attackable(run_dir: str) -> tuple[dict, dict, str]:
    """``(config, trainer_state, where)`` of a ``cem-bench train --out`` folder (:func:`load_run`) or of a
    search trial's folder (:func:`load_trial`), whichever ``run_dir`` is; ``where`` names the file(s) they came
    from, for the errors that follow."""
    folder = Dir(run_dir)
    if folder.kind() == "dir" and not folder.exists(CHECKPOINT_FILE) and folder.exists(RESULT_FILE):
        return (*load_trial(run_dir), f"{folder.url(RESULT_FILE)} and its latest checkpoint")
    if folder.kind() == "dir" and not folder.exists(CHECKPOINT_FILE) and folder.exists(RAY_PARAMS_FILE):
        raise ResultsError(f"{run_dir} is a search trial that did not finish (no {RESULT_FILE}): only a finished "
                           f"trial is attacked, with the encoder its result was measured on; `--resume` the search "
                           f"to finish it")
    return (*load_run(run_dir), folder.url(CHECKPOINT_FILE))
