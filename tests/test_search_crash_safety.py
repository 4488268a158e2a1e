"""Crash-safety of a search's files beyond the resume bundle's own format (test_resume_state.py): a bundle that
could not be written at a later checkpoint, a confirmation planned before a resume, the tables' completeness."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import ray.cloudpickle as cloudpickle

from cem_bench import schema, search
from cem_bench.analysis import bundle as bundle_format
from cem_bench.analysis import results
from cem_bench.search import driver
from cem_bench.search import searcher as searcher_mod

S1, S2 = "2026-01-01_00-00-01", "2026-01-01_00-00-02"


def write_checkpoint(folder: Path, session: str, trials: dict[str, str]) -> dict[str, bytes]:
    """Ray's three files of one experiment checkpoint; ``trials``: trial id -> Ray's status."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {"trial_data": [[json.dumps({"trial_id": t, "status": st, "relative_logdir": f"cem_trial_{t}_1_",
                                         "config": {}}), "{}"] for t, st in trials.items()],
             "runner_data": {}, "stats": {}}
    files = {f"experiment_state-{session}.json": json.dumps(state).encode(),
             f"searcher-state-{session}.pkl": cloudpickle.dumps({"trials": sorted(trials)}),
             f"search_gen_state-{session}.json": cloudpickle.dumps({"counter": len(trials)})}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def stale_bundle(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A bundle of a checkpoint with two trials (one running), and Ray's own later checkpoint of the same session:
    five trials, all finished (the bundle could not be written at the later checkpoints)."""
    exp = tmp_path / "exp"
    staging = tmp_path / "staging"
    write_checkpoint(staging, S1, {"aaaaaaaa": "TERMINATED", "bbbbbbbb": "RUNNING"})
    search.write_resume_snapshot(str(staging), S1, str(exp / schema.RESUME_STATE_FILE))
    later = write_checkpoint(exp, S1, {t * 8: "TERMINATED" for t in "abcde"})
    return exp, later


def test_the_tables_read_rays_state_when_it_is_ahead_of_the_bundle(tmp_path):
    exp, _ = stale_bundle(tmp_path)
    assert [t["trial_id"] for t in results.ray_trials(results._Dir(exp))] == [t * 8 for t in "abcde"]


def test_the_bundle_still_wins_over_rays_copy_that_is_behind_or_cut(tmp_path):
    exp = tmp_path / "exp"
    write_checkpoint(exp, S1, {"aaaaaaaa": "RUNNING"})                   # Ray's copy of an earlier checkpoint
    staging = tmp_path / "staging"
    files = write_checkpoint(staging, S1, {"aaaaaaaa": "TERMINATED", "bbbbbbbb": "RUNNING"})
    search.write_resume_snapshot(str(staging), S1, str(exp / schema.RESUME_STATE_FILE))
    ids = lambda: [(t["trial_id"], t["status"]) for t in results.ray_trials(results._Dir(exp))]  # noqa: E731
    assert ids() == [("aaaaaaaa", "TERMINATED"), ("bbbbbbbb", "RUNNING")]
    # Ray's copy with one more trial but an ended one running again is no later checkpoint of this run
    write_checkpoint(exp, S1, {"aaaaaaaa": "RUNNING", "bbbbbbbb": "RUNNING", "cccccccc": "RUNNING"})
    assert ids() == [("aaaaaaaa", "TERMINATED"), ("bbbbbbbb", "RUNNING")]
    name = f"experiment_state-{S1}.json"
    (exp / name).write_bytes(files[name][:-5])
    assert ids() == [("aaaaaaaa", "TERMINATED"), ("bbbbbbbb", "RUNNING")]
    assert search.repair_experiment_state(str(exp))                        # the bundle put back
    assert (exp / name).read_bytes() == files[name]


def test_resume_sets_a_stale_bundle_aside_and_keeps_rays_later_state(tmp_path):
    exp, later = stale_bundle(tmp_path)
    done = search.repair_experiment_state(str(exp))
    assert len(done) == 1 and "older than Ray's" in done[0], done
    for name, data in later.items():
        assert (exp / name).read_bytes() == data, name
    assert not (exp / schema.RESUME_STATE_FILE).exists()
    assert [p.name for p in (exp / search.SUPERSEDED_DIR).rglob("*") if p.is_file()] == [schema.RESUME_STATE_FILE]
    assert search.repair_experiment_state(str(exp)) == []


def test_a_failed_bundle_write_keeps_the_previous_bundle_and_says_so(tmp_path, monkeypatch, capsys):
    """The previous bundle is the last complete checkpoint: removed, a full disk that had cut Ray's own copy too
    left nothing to resume from (tests/test_search.py's full-disk test, 2026-12-06). Kept, it is read only where
    Ray's readable state is not further along (the two tests above)."""
    exp = tmp_path / "exp"
    staging = tmp_path / "staging"
    write_checkpoint(staging, S1, {"aaaaaaaa": "TERMINATED"})
    target = str(exp / schema.RESUME_STATE_FILE)
    search.write_resume_snapshot(str(staging), S1, target)
    assert bundle_format.read_resume_bundle(exp) is not None

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(searcher_mod, "write_resume_snapshot", full)
    monkeypatch.setattr(searcher_mod.SearchGenerator, "save_to_dir", lambda self, d, s: None)
    gen = searcher_mod.SnapshotSearchGenerator.__new__(searcher_mod.SnapshotSearchGenerator)
    gen._cem_experiment = "x"
    with driver.active("x", driver.DriverPaths(snapshot=target)):
        gen.save_to_dir(str(staging), S1)
        gen.save_to_dir(str(staging), S1)
    assert bundle_format.read_resume_bundle(exp) is not None
    err = capsys.readouterr().err
    assert err.count("could not write the resume bundle") == 1 and "previous one is kept" in err, err


def test_a_replaced_file_is_synced_before_its_rename_and_its_folder_after(tmp_path, monkeypatch):
    """The temp file was renamed over the target unsynced: after a power loss or a crashed host the name could hold
    an empty or partial file (ext4, xfs), the very thing the atomic rename is for."""
    import os
    import stat

    from cem_bench import safefiles
    from cem_bench.storage import write_bytes
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        return real_fsync(fd)

    def replace(*args, **kwargs):
        events.append("rename")
        return real_replace(*args, **kwargs)
    monkeypatch.setattr(safefiles.os, "fsync", fsync)
    monkeypatch.setattr(safefiles.os, "replace", replace)
    write_bytes(str(tmp_path / "out" / "t.json"), b"{}", within=tmp_path)
    assert events == ["fsync file", "rename", "fsync folder"]
    assert (tmp_path / "out" / "t.json").read_bytes() == b"{}"


def test_tables_that_cannot_be_written_after_the_trials_advise_the_report(tmp_path, monkeypatch, capsys):
    """Out of space while the tables were written, after every trial had ended: the advice was "run the command
    again", which is refused ("already exists"). It names `cem-bench report DIR`, which builds them."""
    from test_search import write_space

    from cem_bench import cli
    from cem_bench.analysis import results as results_mod
    from cem_bench.search import run
    space = write_space(tmp_path, "full")
    storage = tmp_path / "res"
    exp = storage / "full"

    def trials_done(spec, **kwargs):
        (exp / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": []}')
        return str(exp)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(exp / "trials.parquet"))
    monkeypatch.setattr(run, "run_search", trials_done)
    monkeypatch.setattr(run, "check_data", lambda spec: None)
    monkeypatch.setattr(results_mod, "build_tables", lambda exp: (None, None))
    monkeypatch.setattr(results_mod, "write_tables", no_space)
    rc = cli.main(["search", space, "--storage", str(storage), "--mps", "off"])
    err = capsys.readouterr().err
    assert rc == 2 and f"`cem-bench report {exp}`" in err and "run the command again" not in err, err
    assert exp.is_dir()


def test_out_of_space_in_a_search_does_not_advise_a_command_that_is_refused():
    from cem_bench.cli import os_error_message
    e = OSError(errno.ENOSPC, "No space left on device")
    assert "--resume" in os_error_message(e, search=True) and "cem-bench report" in os_error_message(e, search=True)
    assert "--resume" not in os_error_message(e)


def test_a_damaged_tuner_pkl_is_a_results_error_that_keeps_the_finished_trials(tmp_path, monkeypatch, capsys):
    """It was labelled "configuration error:" and advised deleting the folder, which holds every finished trial."""
    import pickle

    from cem_bench import cli
    from cem_bench.errors import ResultsError, SearchError
    from cem_bench.search import run
    exp = tmp_path / "exp"
    exp.mkdir()
    data = pickle.dumps({"tuner": list(range(1000))})
    (exp / "tuner.pkl").write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(run, "repair_experiment_state", lambda *a, **k: [])
    monkeypatch.setattr(run, "restore_removed_checkpoints", lambda *a, **k: [])
    try:
        run._tuner(None, str(tmp_path), str(exp), True, False, lambda config: None, None)
    except SearchError as e:
        error = e
    assert isinstance(error, ResultsError)
    text = str(error)
    assert f"`cem-bench report {exp}`" in text and "new --name" in text and "delete" not in text, text

    def damaged(args):
        raise error
    monkeypatch.setattr(cli, "cmd_search", damaged)
    args = cli.make_parser().parse_args(["search", "x.yaml"])
    args.func = damaged
    assert cli._dispatch(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("cem-bench: results error:") and "configuration error" not in err, err


def test_a_stop_the_driver_made_itself_replaces_the_hard_stops_record(tmp_path, monkeypatch):
    """A second Ctrl-C raised out of Tune's loop, or a full disk, left the record written before the loop, so the
    report named "a stop it could not answer (kill -9, ...)" as the cause: run._stop_record replaces it with
    the real cause where the storage still takes it, and never raises where it does not."""
    import json as _json

    from cem_bench.analysis.results import hard_stop_record
    from cem_bench.search import run as run_mod

    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / schema.INTERRUPTED_FILE).write_text(_json.dumps(hard_stop_record("cem-bench search S --resume")) + "\n")
    run_mod._stop_record(str(exp), "SIGINT", 12.5, {"resume_command": "cem-bench search S --resume"})
    record = _json.loads((exp / schema.INTERRUPTED_FILE).read_text())
    assert record == {"signal": "SIGINT", "at": 12.5, "resume": "cem-bench search S --resume"}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(run_mod, "write_bytes", full)
    run_mod._stop_record(str(exp), run_mod.FULL_STOP, 13.0, {})      # kept as it was, no exception
    assert _json.loads((exp / schema.INTERRUPTED_FILE).read_text())["signal"] == "SIGINT"
