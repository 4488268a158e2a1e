"""The guard around Ray's experiment state: a driver killed while Ray copies its checkpoint to the storage
leaves truncated or mixed files; ``--resume`` must put the last complete checkpoint back (search.py)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle

from cem_bench import schema, search
from cem_bench.analysis import bundle as bundle_format
from cem_bench.analysis import results

S1, S2, S3 = "2026-01-01_00-00-01", "2026-01-01_00-00-02", "2026-01-01_00-00-03"


def write_checkpoint(folder: Path, session: str, trials: list[str]) -> dict[str, bytes]:
    """The three files Ray writes for one experiment checkpoint (same formats as Ray's)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {"trial_data": [[json.dumps({"trial_id": t, "status": "TERMINATED", "relative_logdir": f"cem_trial_{t}_1_",
                                         "config": {}}), "{}"] for t in trials],
             "runner_data": {}, "stats": {}}
    files = {f"experiment_state-{session}.json": json.dumps(state).encode(),
             f"searcher-state-{session}.pkl": cloudpickle.dumps({"trials": trials}),
             f"search_gen_state-{session}.json": cloudpickle.dumps({"counter": len(trials)})}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def test_snapshot_replaces_truncated_and_newer_files(tmp_path):
    exp = tmp_path / "exp"
    old = write_checkpoint(exp, S1, ["a"])
    staging = tmp_path / "staging"
    files = write_checkpoint(staging, S2, ["a", "b"])
    (staging / f"experiment_state-{S1}.json").write_text("older session: not bundled")
    bundled = search.write_resume_snapshot(str(staging), S2, str(exp / schema.RESUME_STATE_FILE))
    assert set(bundled) == set(files)

    # the copy of checkpoint S2 was cut: one file truncated, one missing, one complete; plus a stray newer one
    name_es, name_ss, name_gs = (f"experiment_state-{S2}.json", f"searcher-state-{S2}.pkl",
                                 f"search_gen_state-{S2}.json")
    (exp / name_es).write_bytes(files[name_es][: len(files[name_es]) // 2])
    (exp / name_gs).write_bytes(files[name_gs])
    (exp / f"searcher-state-{S3}.pkl").write_bytes(b"")

    done = search.repair_experiment_state(str(exp))
    for name, data in files.items():
        assert (exp / name).read_bytes() == data, name
    for name, data in old.items():  # the older session is left as it was
        assert (exp / name).read_bytes() == data, name
    assert not (exp / f"searcher-state-{S3}.pkl").exists()
    moved = sorted(p.name for p in (exp / search.SUPERSEDED_DIR).rglob("*") if p.is_file())
    assert moved == sorted([name_es, f"searcher-state-{S3}.pkl"])  # kept, not deleted
    assert any(name_ss in line and "restored" in line for line in done), done
    # a second repair finds nothing to do
    assert search.repair_experiment_state(str(exp)) == []


def test_without_snapshot_an_unreadable_newest_file_falls_back_to_the_previous_session(tmp_path):
    exp = tmp_path / "exp"
    write_checkpoint(exp, S1, ["a"])
    files = write_checkpoint(exp, S2, ["a", "b"])
    (exp / f"searcher-state-{S2}.pkl").write_bytes(files[f"searcher-state-{S2}.pkl"][:10])
    done = search.repair_experiment_state(str(exp))
    assert len(done) == 1 and f"searcher-state-{S2}.pkl is unreadable" in done[0]
    assert not (exp / f"searcher-state-{S2}.pkl").exists()
    assert (exp / f"searcher-state-{S1}.pkl").exists() and (exp / f"experiment_state-{S2}.json").exists()


def test_nothing_restorable_is_a_clear_error_and_deletes_nothing(tmp_path):
    exp = tmp_path / "exp"
    files = write_checkpoint(exp, S1, ["a"])
    (exp / f"experiment_state-{S1}.json").write_bytes(b'{"trial_data": [')
    with pytest.raises(search.SearchError, match="no readable experiment state.*new --name"):
        search.repair_experiment_state(str(exp))
    kept = [p for p in exp.rglob(f"experiment_state-{S1}.json")]
    assert len(kept) == 1 and search.SUPERSEDED_DIR in str(kept[0])
    assert (exp / f"searcher-state-{S1}.pkl").read_bytes() == files[f"searcher-state-{S1}.pkl"]


def test_results_read_the_bundle_over_a_truncated_state_file(tmp_path):
    exp = tmp_path / "exp"
    write_checkpoint(exp, S1, ["aaaaaaaa"])
    staging = tmp_path / "staging"
    files = write_checkpoint(staging, S2, ["aaaaaaaa", "bbbbbbbb"])
    search.write_resume_snapshot(str(staging), S2, str(exp / schema.RESUME_STATE_FILE))
    name = f"experiment_state-{S2}.json"
    (exp / name).write_bytes(files[name][:40])
    ids = [t["trial_id"] for t in results.ray_trials(results._Dir(exp))]
    assert ids == ["aaaaaaaa", "bbbbbbbb"]
    # and a bundle that is not a pickle is ignored, not fatal
    (exp / schema.RESUME_STATE_FILE).write_bytes(b"garbage")
    assert [t["trial_id"] for t in results.ray_trials(results._Dir(exp))] == ["aaaaaaaa"]


def test_bundle_is_written_atomically_and_holds_one_session(tmp_path):
    staging = tmp_path / "staging"
    write_checkpoint(staging, S1, ["a"])
    files = write_checkpoint(staging, S2, ["a", "b"])
    target = tmp_path / "exp" / schema.RESUME_STATE_FILE
    search.write_resume_snapshot(str(staging), S2, str(target))
    assert target.read_bytes()[:1] == b"{"   # JSON: bytes without code
    bundle = bundle_format.read_resume_bundle(target.parent)
    assert bundle["session"] == S2 and bundle["files"] == files and bundle["version"] == 2
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp file left behind
    with pytest.raises(FileNotFoundError):
        search.write_resume_snapshot(str(staging), S3, str(target))
    assert bundle_format.read_resume_bundle(target.parent)["session"] == S2  # the previous bundle survives a failed write


def test_an_edited_bundle_is_reported_and_rays_files_are_checked_alone(tmp_path):
    exp = tmp_path / "exp"
    write_checkpoint(exp, S1, ["a"])
    (exp / schema.RESUME_STATE_FILE).write_bytes(b"not a bundle")
    done = search.repair_experiment_state(str(exp))
    assert len(done) == 1 and "not an intact cem-bench state bundle" in done[0]
    assert (exp / f"experiment_state-{S1}.json").exists()


def test_a_bundle_with_one_changed_byte_is_refused(tmp_path):
    staging = tmp_path / "staging"
    write_checkpoint(staging, S1, ["a", "b"])
    target = tmp_path / "exp" / schema.RESUME_STATE_FILE
    search.write_resume_snapshot(str(staging), S1, str(target))
    data = bytearray(target.read_bytes())
    i = data.index(S1.encode()) + 3          # the session's name: valid JSON either way
    data[i] = ord("9") if data[i] != ord("9") else ord("8")
    target.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not an intact"):
        bundle_format.read_resume_bundle(target.parent)


class _Marker:
    """Unpickling this creates a file: the test that nothing of ours unpickles a file it was given."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_a_pickled_bundle_is_never_unpickled_without_the_flag(tmp_path):
    exp = tmp_path / "exp"
    write_checkpoint(exp, S1, ["a"])
    marker = tmp_path / "ran"
    (exp / schema.RESUME_STATE_FILE).write_bytes(pickle.dumps({"format": 1, "x": _Marker(marker)}, protocol=4))
    assert [t["trial_id"] for t in results.ray_trials(results._Dir(exp))] == ["a"]   # what report reads
    done = search.repair_experiment_state(str(exp))                                     # what --resume reads
    assert len(done) == 1 and "--trust-pickled-state" in done[0]
    with pytest.raises(bundle_format.PickledBundle):
        bundle_format.read_resume_bundle(exp)
    assert not marker.exists()
    with pytest.raises(ValueError):   # with the flag it is read (and, being crafted, runs: what the flag warns of)
        bundle_format.read_resume_bundle(exp, trust_pickle=True)
    assert marker.exists()


def test_a_bundle_of_the_old_format_is_read_with_the_flag():
    exp = Path(__file__).parent / "fixtures" / "format1" / "experiment"
    with pytest.raises(bundle_format.PickledBundle):
        bundle_format.read_resume_bundle(exp)
    bundle = bundle_format.read_resume_bundle(exp, trust_pickle=True)
    assert bundle["version"] == 1 and any(n.startswith("experiment_state-") for n in bundle["files"])


def test_a_checkpoint_removed_after_the_last_snapshot_is_replaced_by_the_trials_newer_one(tmp_path):
    """Ray deletes a trial's older checkpoints as new ones come (two kept) and writes its experiment state only
    now and then: a driver killed in between leaves a state that names a deleted checkpoint, and Ray's restore
    then fails the trial. --resume copies the trial's newest checkpoint to the recorded name; a finished trial, a
    trial whose checkpoint is there and a trial with nothing newer are left as they are (the last one said)."""
    from ray import tune
    exp = tmp_path / "exp"

    def trial(tid, status, recorded, present):
        folder = exp / f"cem_trial_{tid}_1_"
        for n in present:
            (folder / f"checkpoint_{n:06d}").mkdir(parents=True)
            (folder / f"checkpoint_{n:06d}" / "state.pt").write_bytes(f"{tid} epoch {n + 1}".encode())
        # what Ray pickles: its checkpoint manager, holding the recorded checkpoints by path
        blob = cloudpickle.dumps([tune.Checkpoint(path=str(folder / f"checkpoint_{n:06d}")) for n in recorded])
        meta = {"checkpoint_manager": {"_type": "CLOUDPICKLE_FALLBACK", "value": blob.hex()}}
        return [json.dumps({"trial_id": tid, "status": status, "relative_logdir": folder.name}), json.dumps(meta)]

    state = {"trial_data": [trial("gone", "RUNNING", [0, 1], [2, 3]), trial("done", "TERMINATED", [0, 1], [3]),
                            trial("here", "RUNNING", [1, 2], [1, 2]), trial("lost", "ERROR", [4, 5], [3])],
             "runner_data": {}, "stats": {}}
    (exp / f"experiment_state-{S1}.json").write_text(json.dumps({"trial_data": [], "runner_data": {}}))
    (exp / f"experiment_state-{S2}.json").write_text(json.dumps(state))   # the newest: the one Ray restores
    assert search.recorded_checkpoints(json.loads(state["trial_data"][0][1])) == ["checkpoint_000000",
                                                                                  "checkpoint_000001"]
    done = search.restore_removed_checkpoints(str(exp))
    assert len(done) == 2 and "trial gone:" in done[0] and "continues from checkpoint_000003" in done[0], done
    assert "trial lost:" in done[1] and "no newer one" in done[1], done
    assert (exp / "cem_trial_gone_1_" / "checkpoint_000001" / "state.pt").read_bytes() == b"gone epoch 4"
    assert (exp / "cem_trial_gone_1_" / "checkpoint_000003" / "state.pt").read_bytes() == b"gone epoch 4"
    assert not (exp / "cem_trial_done_1_" / "checkpoint_000001").exists()
    assert sorted(p.name for p in (exp / "cem_trial_here_1_").iterdir()) == ["checkpoint_000001", "checkpoint_000002"]
    assert search.restore_removed_checkpoints(str(exp)) == [done[1]]   # done once; the lost trial is said again


# ------------------------------------------------------------------ a trial that finished before Tune knew it
def test_a_trial_that_wrote_its_result_before_the_stop_reports_it_again_instead_of_rerunning(monkeypatch, tmp_path):
    """Ctrl-C while a trial finished: it wrote trial_result.json (status ok, the tables' row) but Tune never took
    its last report, so --resume restarts it from its last checkpoint. It reports the recorded result once and
    returns, without training or attacking again (it attacked again, replacing the result, until 2026-12-06);
    a result of another trial, an error, or a damaged file leaves the trial to run."""
    import torch
    from conftest import direct_trainable

    from cem_bench.core.checkpoint import save_state

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_state(str(ckpt / schema.STATE_FILE), {"epoch": 6, "history": [{"epoch": e} for e in range(1, 7)],
                                                "weights": torch.zeros(2)})
    folder = tmp_path / "cem_trial_t0001"
    folder.mkdir()
    recorded = {"trial_id": "t0001", "status": "ok", "error": None, "role": "search", "test_acc": 0.875,
                "attack_ssim": 0.5, "epochs_done": 6, "resumed_from_epoch": 0, "node_id": "first-node",
                "hostname": "first-host", "finished_at": "2026-12-06T04:00:00", "info": {"history": []}}

    def run(doc):
        if doc is not None:
            (folder / schema.RESULT_FILE).write_text(doc if isinstance(doc, str) else json.dumps(doc))
        ran, reports = [], []
        direct_trainable(monkeypatch, tmp_path, 0, ran.append, checkpoint=ckpt, reports=reports)({"cem.lambd": 1.0})
        return ran, reports

    ran, reports = run(recorded)
    assert ran == [] and len(reports) == 1
    assert {k: reports[0][k] for k in ("status", "test_acc", "attack_ssim", "node_id", "resumed_from_epoch")} == \
        {"status": "ok", "test_acc": 0.875, "attack_ssim": 0.5, "node_id": "first-node", "resumed_from_epoch": 0}
    assert json.loads((folder / schema.RESULT_FILE).read_text()) == recorded       # the recorded result untouched
    for other in ({**recorded, "trial_id": "t0002"}, {**recorded, "status": "error"}, '{"status": "ok", ', None):
        (folder / schema.RESULT_FILE).unlink(missing_ok=True)
        ran, _ = run(other)
        assert len(ran) == 1, other
