"""The experiment-state guard behind ``--resume`` (package docstring: why Ray's own state can be torn).

The bundle's format (``resume_bundle_bytes``, ``read_resume_bundle``) is in ``cem_bench/analysis/bundle.py``, which
``results`` reads it with too: building the tables of an experiment folder prefers the bundle's state to
Ray's, and that runs in the report too, which may not import ``search`` (docs/architecture.md §3)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from ..errors import SearchError
from ..parsing import loads_json
from ..provenance import now_iso as _now_iso
from ..schema import CHECKPOINT_DIR, CONFIGS_FILE, EPOCHS_FILE, RESUME_STATE_FILE, TRIALS_FILE
from ..storage import filesystem, join, write_bytes

SUPERSEDED_DIR = "superseded_state"
# Ray's experiment-level state files: name prefix -> how Ray reads them
RAY_STATE_KINDS = {"experiment_state-": "json", "searcher-state-": "pickle", "search_gen_state-": "pickle",
                   "callback-states-": "pickle"}


def _state_kind(name: str) -> str | None:
    for prefix in RAY_STATE_KINDS:
        if name.startswith(prefix):
            return prefix
    return None


def has_saved_state(exp_path: str) -> bool:
    """Has Ray saved a state of the experiment that ``--resume`` can start from (an ``experiment_state-*.json`` or
    the resume bundle)? ``tuner.pkl`` alone is not one: Ray writes it before the first experiment state."""
    import pyarrow.fs as pafs
    try:
        fs, root = filesystem(exp_path)
        infos = fs.get_file_info(pafs.FileSelector(root.rstrip("/"), recursive=False, allow_not_found=True))
    except OSError:
        return False
    return any(i.type == pafs.FileType.File and (i.base_name == RESUME_STATE_FILE or (
        i.base_name.startswith("experiment_state-") and i.base_name.endswith(".json"))) for i in infos)


def write_resume_snapshot(staging_dir: str, session_str: str, target: str) -> dict[str, bytes]:
    """Bundle the experiment checkpoint of ``session_str`` that Ray has just written into
    ``staging_dir`` into one file at ``target``, atomically. Returns the bundled files."""
    from ..analysis.bundle import resume_bundle_bytes
    files: dict[str, bytes] = {}
    for entry in os.scandir(staging_dir):
        if entry.is_file() and _state_kind(entry.name) and entry.name.rsplit(".", 1)[0].endswith(session_str):
            with open(entry.path, "rb") as fh:
                files[entry.name] = fh.read()
    if not any(n.startswith("experiment_state-") for n in files):
        raise FileNotFoundError(f"no experiment_state-{session_str}.json in {staging_dir}")
    write_bytes(target, resume_bundle_bytes(session_str, _now_iso(), files))
    return files


def _state_error(name: str, data: bytes) -> str | None:
    """Why Ray could not read this state file (None when it can): truncated or empty files. A pickle is
    walked opcode by opcode (``pickletools``), never loaded: checking a file must not run it."""
    import pickletools
    if not data:
        return "empty file"
    try:
        if RAY_STATE_KINDS[_state_kind(name)] == "json":
            loads_json(data)
        else:
            ops = list(pickletools.genops(data))   # ValueError on a truncated or malformed stream
            if not ops or ops[-1][0].name != "STOP":
                return "no STOP opcode (truncated)"
    except (UnicodeDecodeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _read(fs, path: str) -> bytes:
    with fs.open_input_stream(path) as fh:
        return fh.read()


def _move_aside(fs, root: str, name: str, stamp: str) -> str:
    dest_dir = f"{root}/{SUPERSEDED_DIR}/{stamp}"
    fs.create_dir(dest_dir, recursive=True)
    fs.move(f"{root}/{name}", f"{dest_dir}/{name}")
    return f"{SUPERSEDED_DIR}/{stamp}/{name}"


def _ahead_of_bundle(fs, root: str, names: list[str], snapshot: dict) -> str | None:
    """Ray's experiment state file, of the bundle's session or a later one, that is a later checkpoint than the
    bundle's (``results.state_is_ahead``), or None. Ray copies its files only after the bundle is written, so
    its readable copy is never ahead of an up-to-date bundle; one that is tells that a later bundle could not
    be written (searcher.bundle_write_failed keeps the old one: Ray's copy may be the one cut). Put back, the stale
    bundle would have Ray forget the trials finished since, and run them again under new ids."""
    from ..analysis.results import state_is_ahead
    bundled = [n for n in snapshot["files"] if n.startswith("experiment_state-")]
    if not bundled:
        return None
    mine = max(bundled)
    for name in sorted((n for n in names if n.startswith("experiment_state-") and n >= mine), reverse=True):
        if state_is_ahead(_read(fs, f"{root}/{name}"), snapshot["files"][mine]):
            return name
    return None


def repair_experiment_state(exp_path: str, trust_pickle: bool = False) -> list[str]:
    """Make the experiment's Ray state files consistent and readable before ``Tuner.restore``.

    With a bundle (``cem_resume_state.bin``): its files are authoritative; a state file of the same
    name with other contents, or of a newer session, is moved to ``superseded_state/STAMP/`` and the
    bundle's files are written in place. Unless Ray's own readable state is a later checkpoint than the
    bundle's (``_ahead_of_bundle``: a later bundle could not be written): then the bundle is the file moved
    aside, and Ray's files are checked as without one. Without one (an experiment killed before its first
    checkpoint, or written by an older cem-bench): an unreadable newest state file is moved aside so
    that Ray reads the previous session's. Raises ``SearchError`` when nothing restorable is left.
    Returns what was done, one line per file. ``trust_pickle`` reads a version-1 (pickled) bundle."""
    import pyarrow.fs as pafs
    fs, root = filesystem(exp_path)
    root = root.rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    names = sorted(i.base_name for i in infos if i.type == pafs.FileType.File and _state_kind(i.base_name))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    done: list[str] = []

    from ..analysis.bundle import read_resume_bundle
    try:
        snapshot = read_resume_bundle(exp_path, trust_pickle=trust_pickle)
    except ValueError as e:
        done.append(f"{e}; checking Ray's files alone")
        snapshot = None

    ahead = _ahead_of_bundle(fs, root, names, snapshot) if snapshot is not None else None
    if ahead is not None:
        done.append(f"{RESUME_STATE_FILE} ({snapshot['session']}) is older than Ray's {ahead}, which lists more "
                    f"trials or more finished ones (a later bundle could not be written): moved to "
                    f"{_move_aside(fs, root, RESUME_STATE_FILE, stamp)}; checking Ray's files alone")
        snapshot = None

    if snapshot is not None:
        files: dict[str, bytes] = snapshot["files"]
        session = snapshot["session"]
        for name in names:
            kind = _state_kind(name)
            file_session = name[len(kind):].rsplit(".", 1)[0]
            if name in files:
                if _read(fs, f"{root}/{name}") == files[name]:
                    continue
                why = "differs from the last complete checkpoint"
            elif file_session >= session:
                why = "is newer than the last complete checkpoint"
            else:
                continue  # an older session's file: Ray reads the newest, which the bundle provides
            done.append(f"{name} {why}: moved to {_move_aside(fs, root, name, stamp)}")
        present = {i.base_name for i in fs.get_file_info(pafs.FileSelector(root, recursive=False))}
        for name, data in files.items():
            if name not in present:
                write_bytes(join(exp_path, name), data)
                done.append(f"{name} restored from {RESUME_STATE_FILE} ({session})")
        return done

    for kind in RAY_STATE_KINDS:
        for name in sorted((n for n in names if n.startswith(kind)), reverse=True):
            why = _state_error(name, _read(fs, f"{root}/{name}"))
            if why is None:
                break
            done.append(f"{name} is unreadable ({why}): moved to {_move_aside(fs, root, name, stamp)}")
    left = {i.base_name for i in fs.get_file_info(pafs.FileSelector(root, recursive=False))}
    if not done:
        refuse_a_stopped_start(exp_path)
    if not any(n.startswith("experiment_state-") for n in left):
        raise SearchError(f"--resume: {exp_path} holds no readable experiment state (the driver was killed "
                          f"before Ray wrote a complete one; {'; '.join(done) or 'none was written'}); start "
                          f"the search again under a new --name")
    return done



def refuse_a_stopped_start(exp_path: str) -> None:
    """SearchError where ``exp_path`` holds only what a search leaves while it starts: stopped after Ray's
    tuner.pkl, before its first state, there is nothing to continue, and nothing a new search would lose (it
    takes such a folder over: lock._STARTING_FILES); a new --name was never needed. Decided from the listing,
    so ``--resume --dry-run`` says it too (it passed such a folder that the real --resume refused after Ray's
    start, 2026-12-07 probe)."""
    from .lock import only_starting_files
    if only_starting_files(exp_path):
        raise SearchError(f"--resume: {exp_path} holds no experiment state to continue: its search was stopped "
                          f"while it started, before Ray saved one (only tuner.pkl and the start-up files are there, "
                          f"no trial folder); drop --resume to start it again (the new search takes the folder over)")


def supersede_tables(exp_path: str) -> list[str]:
    """Move the tables of the search before this ``--resume`` (``trials.parquet``, ``epochs.parquet``,
    ``configs.parquet``) to ``superseded_state/STAMP/``; return one line per table moved. This search writes them
    again when it ends; until then `report` and `table` read its trial folders. Left in place, a resume killed
    before its end (kill -9, a lost head node) left them as the folder's final tables, read without a word
    though its trials had gone on (interrupted rows that had since finished ok)."""
    import pyarrow.fs as pafs
    fs, root = filesystem(exp_path)
    root = root.rstrip("/")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    done = []
    for name in (TRIALS_FILE, EPOCHS_FILE, CONFIGS_FILE):
        if fs.get_file_info(f"{root}/{name}").type == pafs.FileType.File:
            done.append(f"{name} (of before this resume) moved to {_move_aside(fs, root, name, stamp)}; "
                        f"written again when the search ends")
    return done


def recorded_checkpoints(trial_run_metadata: dict) -> list[str]:
    """The checkpoint folder names (``checkpoint_000003``) that one trial's entry of Ray's experiment state
    records, oldest first. Ray keeps them in a pickled checkpoint manager; the names are read from its bytes
    (the path strings it holds), never unpickled."""
    blob = trial_run_metadata.get("checkpoint_manager")
    if isinstance(blob, str):
        try:
            blob = json.loads(blob)
        except ValueError:
            return []
    if not isinstance(blob, dict) or not isinstance(blob.get("value"), str):
        return []
    try:
        raw = bytes.fromhex(blob["value"])
    except ValueError:
        return []
    # latin-1 maps each byte to one character, so the shared pattern matches the path strings in place
    return sorted({m.group(0) for m in CHECKPOINT_DIR.finditer(raw.decode("latin-1"))})   # six digits: by number


def restore_removed_checkpoints(exp_path: str) -> list[str]:
    """Give each unfinished trial the checkpoint Ray's experiment state expects to restore it from.

    Ray records a trial's newest checkpoint in the experiment state, which it writes only now and then, and
    deletes a trial's older checkpoints as new ones come (``CheckpointConfig(num_to_keep=2)``). A driver killed
    after a trial's next two checkpoints but before its next snapshot leaves a state whose recorded checkpoint
    is gone, and ``Tuner.restore`` then fails that trial ("Could not recover from checkpoint as it does not
    exist on storage anymore") instead of continuing it, so its search run is lost (seen in a loaded CI run:
    the finished best trial became an error and the confirmation was never planned). Its newer checkpoint is
    still there: it is copied to the recorded name, and the trial continues from the newer epoch (the
    trainable reads the epoch from the state it loads, not from the folder's name). Returns one line per
    trial it gave a checkpoint, or could not."""
    import pyarrow.fs as pafs

    from ..analysis.results import ray_trials
    from ..storage import Dir
    trials = ray_trials(Dir(exp_path))   # the newest state, as Ray picks it; after repair_experiment_state
    if not trials:
        return []
    fs, root = filesystem(exp_path)
    root = root.rstrip("/")
    done: list[str] = []
    for trial in trials:
        logdir = trial["dir"]
        if trial["status"] == "TERMINATED" or not trial["meta"] or not isinstance(logdir, str) \
                or "/" in logdir or logdir in ("", ".", ".."):
            continue
        recorded = recorded_checkpoints(trial["meta"])
        if not recorded:
            continue
        folder = f"{root}/{logdir}"
        want = recorded[-1]
        if fs.get_file_info(f"{folder}/{want}").type == pafs.FileType.Directory:
            continue
        have = sorted((i.base_name for i in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
                       if i.type == pafs.FileType.Directory and CHECKPOINT_DIR.fullmatch(i.base_name)),
                      reverse=True)
        newer = [n for n in have if n > want]
        tid = trial["trial_id"]
        if not newer:
            done.append(f"trial {tid}: its recorded checkpoint {want} is gone and no newer one exists; Ray will "
                        f"report the trial as an error")
            continue
        source = f"{folder}/{newer[0]}"
        for info in fs.get_file_info(pafs.FileSelector(source, recursive=True)):
            if info.type == pafs.FileType.File:
                rel = info.path[len(source) + 1:]
                write_bytes(join(exp_path, logdir, want, rel), _read(fs, info.path), within=exp_path)
        done.append(f"trial {tid}: its recorded checkpoint {want} was removed after the last snapshot; it "
                    f"continues from {newer[0]} (copied to {want})")
    return done
