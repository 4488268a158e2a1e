"""cem_bench.analysis.results on hand-made Ray experiment folders (no Ray)."""

from __future__ import annotations

import json
import math
import os
import shutil

import pandas as pd
import pytest
from conftest import fake_object_storage

from cem_bench.analysis import results
from cem_bench.analysis.report.load import load_results

CONFIG = {"seed": 0, "cem.lambd": 8.0, "cem.surrogate": "gmm", "train.epochs": 2, "train.milestones": [0.5]}


def hist(n, acc=0.5):
    return [{"epoch": e, "lr": 0.05, "cem_active": e > 1, "train_loss": 2.0 - 0.1 * e, "train_acc": 0.2 * e,
             "rob_loss": 0.1 * e, "rob_nonfinite": 0, "train_s": 0.3, "test_acc": acc, "test_acc_clean": acc,
             "feature_spread": 0.01, "epoch_s": 0.4} for e in range(1, n + 1)]


def ours(trial_id, status="ok", acc=0.8, ssim=0.3, error=None, lambd=8.0, epochs=2):
    nan = None  # strict JSON, as trial.write_json writes NaN
    return {
        "test_acc": acc if status == "ok" else nan, "test_acc_clean": acc if status == "ok" else nan,
        "feature_spread": 0.01, "attack_mse": 0.05 if status == "ok" else nan, "attack_psnr": 13.0 if status == "ok" else nan,
        "attack_ssim": ssim if status == "ok" else nan, "train_s": 1.0, "attack_s": 0.5, "wall_s": 2.0,
        "epochs_done": epochs, "epoch": epochs, "status": status, "error": error, "node_id": f"node-{trial_id}",
        "hostname": "host", "trial_id": trial_id, "trial_dir": f"cem_trial_{trial_id}_1_x", "started_at":
        "2026-01-01T00:00:00+00:00", "finished_at": f"2026-01-01T00:0{len(trial_id) % 10}:00+00:00",
        "resumed_from_epoch": 0,
        "info": {"config": {**CONFIG, "cem.lambd": lambd}, "device": "cpu (x86_64, 2 cores)", "torch_version": "2.14.1",
                 "package_version": "0.1.0", "git_sha": "abc", "history": hist(epochs, acc or 0.1)},
    }


def make_trial(exp, trial_id, idx, result=None, lines=(), error_txt=None, params=None):
    d = exp / f"cem_trial_{trial_id}_{idx}_cem_lambd=8_2026-01-01_00-00-00"
    d.mkdir()
    (d / "params.json").write_text(json.dumps(params if params is not None else {"cem.lambd": 8.0, "train.epochs": 2}))
    (d / "result.json").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if result is not None:
        (d / results.RESULT_FILE).write_text(json.dumps(result))
    if error_txt is not None:
        (d / "error.txt").write_text(error_txt)
    return d.name


@pytest.fixture
def experiment(tmp_path):
    exp = tmp_path / "handmade"
    exp.mkdir()
    (exp / "search_space.json").write_text(json.dumps({
        "name": "handmade",
        "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                       {"metric": "attack_ssim", "mode": "min", "ref": 1.0}]}))
    (exp / "report").mkdir()          # not a trial
    (exp / "stray").mkdir()           # empty folder: not a trial
    (exp / "tuner.pkl").write_bytes(b"x")
    make_trial(exp, "aaaa0001", 1, ours("aaaa0001", acc=0.8, ssim=0.3))
    make_trial(exp, "aaaa0002", 2, ours("aaaa0002", acc=0.7, ssim=0.2))
    make_trial(exp, "aaaa0003", 3, ours("aaaa0003", acc=0.6, ssim=0.4))
    make_trial(exp, "aaaa0004", 4, ours("aaaa0004", status="error", epochs=1,
                                        error="TrialDiverged: the classification loss became non-finite"))
    running = {"status": "running", "trial_id": "aaaa0005", "attack_ssim": float("nan"), "node_id": "n5",
               "hostname": "h5", "training_iteration": 1}
    make_trial(exp, "aaaa0005", 5, None,
               lines=[{**running, **hist(1)[0], "train_loss": 9.0}, {**running, **hist(1)[0]},  # epoch 1 twice (retry)
                      {**running, **hist(2)[1]}],
               error_txt="Failure # 1 (occurred at 2026-01-01_00-00-00)\nRayActorError: first\n"
                         "Failure # 2 (occurred at 2026-01-01_00-01-00)\nTraceback ...\nRuntimeError: CUDA out of memory\n",
               params={"cem.lambd": 2.0, "train.epochs": 4})
    return exp


def test_write_tables_one_row_per_trial(experiment):
    trials_path, epochs_path = results.write_tables(experiment)
    assert trials_path == experiment / "trials.parquet" and epochs_path == experiment / "epochs.parquet"
    leftovers = [p.name for p in experiment.iterdir() if ".tmp" in p.name]
    assert not leftovers
    t = pd.read_parquet(trials_path).set_index("trial_id")
    assert sorted(t.index) == ["aaaa0001", "aaaa0002", "aaaa0003", "aaaa0004", "aaaa0005"]
    for col in ("experiment", "status", "error", "trial_dir", "pareto_rank", "test_acc", "test_acc_clean",
                "feature_spread", "attack_mse", "attack_psnr", "attack_ssim", "train_s", "attack_s", "wall_s",
                "git_sha", "package_version", "torch_version", "device", "node_id", "finished_at",
                "config.cem.lambd", "config.cem.surrogate", "config.train.milestones"):
        assert col in t.columns, col
    assert (t["experiment"] == "handmade").all()
    assert t.loc["aaaa0001", "status"] == "ok" and t.loc["aaaa0001", "pareto_rank"] == 0
    assert t.loc["aaaa0002", "pareto_rank"] == 0 and t.loc["aaaa0003", "pareto_rank"] == 1
    # the diverged trial: an error row with its reason, NaN objectives, rank -1
    assert t.loc["aaaa0004", "status"] == "error" and "non-finite" in t.loc["aaaa0004", "error"]
    assert math.isnan(t.loc["aaaa0004", "test_acc"]) and t.loc["aaaa0004", "pareto_rank"] == -1
    # the trial that never finished: error row with Ray's last failure, config from params.json
    assert t.loc["aaaa0005", "status"] == "error"
    assert "CUDA out of memory" in t.loc["aaaa0005", "error"] and "first" not in t.loc["aaaa0005", "error"]
    assert t.loc["aaaa0005", "config.cem.lambd"] == 2.0 and t.loc["aaaa0005", "pareto_rank"] == -1
    assert t.loc["aaaa0005", "epochs_done"] == 2 and t.loc["aaaa0005", "node_id"] == "n5"
    assert t.loc["aaaa0001", "config.cem.surrogate"] == "gmm" and list(t.loc["aaaa0001", "config.train.milestones"]) == [0.5]
    assert t.loc["aaaa0001", "trial_dir"].startswith("cem_trial_aaaa0001_1_")
    assert t.loc["aaaa0001", "git_sha"] == "abc" and t.loc["aaaa0001", "torch_version"] == "2.14.1"

    e = pd.read_parquet(epochs_path)
    assert list(e.columns[:3]) == ["experiment", "trial_id", "epoch"]
    for col in ("train_loss", "train_acc", "rob_loss", "test_acc", "test_acc_clean", "feature_spread", "epoch_s"):
        assert col in e.columns
    per = e.groupby("trial_id")["epoch"].apply(list).to_dict()
    assert per == {"aaaa0001": [1, 2], "aaaa0002": [1, 2], "aaaa0003": [1, 2], "aaaa0004": [1], "aaaa0005": [1, 2]}
    # the retried epoch 1 of aaaa0005 keeps its last record
    assert e[(e.trial_id == "aaaa0005") & (e.epoch == 1)]["train_loss"].item() == pytest.approx(1.9)


@pytest.mark.parametrize("damage", ['{"status": "ok", "test_a', "", "[1, 2]"])
def test_a_damaged_trial_result_says_so_and_not_that_the_trial_stopped(experiment, damage):
    """A trial_result.json cut short read as absent: "the trial did not finish", a finished baseline run lost
    without a word (2026-12-07 audit); now its error names the damaged file."""
    folder = next(p for p in experiment.iterdir() if p.name.startswith("cem_trial_aaaa0002_"))
    (folder / results.RESULT_FILE).write_text(damage)
    results.write_tables(experiment)
    t = pd.read_parquet(experiment / "trials.parquet").set_index("trial_id")
    assert t.loc["aaaa0002", "status"] == "error"
    said = t.loc["aaaa0002", "error"]
    assert f"{results.RESULT_FILE} of {folder.name} is damaged" in said and "did not finish" not in said, said
    # a trial without the file still reads as one that did not finish (its Ray error, here)
    assert "CUDA out of memory" in t.loc["aaaa0005", "error"]


def test_write_is_atomic(experiment, monkeypatch):
    results.write_tables(experiment)
    before = (experiment / "trials.parquet").read_bytes()
    import pyarrow.parquet as pq

    def broken(table, where, *a, **k):
        where.write(b"half a table")
        raise OSError("disk full")
    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError):
        results.write_tables(experiment)
    assert (experiment / "trials.parquet").read_bytes() == before
    assert not [p.name for p in experiment.iterdir() if ".tmp" in p.name]
    monkeypatch.undo()

    def no_rename(src, dst, **kw):    # the crash comes after the temporary file was written
        raise OSError("crash before the rename")
    monkeypatch.setattr("cem_bench.storage.os.replace", no_rename)
    with pytest.raises(OSError):
        results.write_tables(experiment)
    assert (experiment / "trials.parquet").read_bytes() == before
    assert not [p.name for p in experiment.iterdir() if ".tmp" in p.name]


def test_trials_parquet_is_written_last_so_a_kill_between_the_tables_is_rebuilt(experiment, monkeypatch):
    """A driver killed after the first table: trials.parquet written first marked the folder's tables as
    written, and the report read it for good without epochs.parquet (no per-epoch data ever again)."""
    written = []
    real = results.write_table

    def killed_after_one(folder, name, df, kind):
        if written:
            raise KeyboardInterrupt("the driver is killed")
        written.append(name)
        return real(folder, name, df, kind)
    monkeypatch.setattr(results, "write_table", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        results.write_tables(experiment)
    monkeypatch.undo()
    assert not (experiment / "trials.parquet").exists()
    res = load_results(experiment)             # the tables are built again from the trial folders
    assert len(res.trials) == 5 and res.epochs is not None and len(res.epochs) > 0
    assert (experiment / "trials.parquet").exists() and (experiment / "epochs.parquet").exists()


def test_experiment_state_is_authoritative(experiment):
    """A folder the newest experiment state does not list (started by a killed driver after its last
    snapshot) is left out; a listed trial without a folder (never started) is an error row."""
    def entry(tid, status, d, config):
        return [json.dumps({"trial_id": tid, "status": status, "relative_logdir": d, "config": config}), "{}"]
    dirs = {p.name.split("_")[2]: p.name for p in experiment.iterdir() if p.name.startswith("cem_trial_")}
    old = {"trial_data": [entry("aaaa0001", "RUNNING", dirs["aaaa0001"], {})]}
    new = {"trial_data": [entry(t, "TERMINATED", dirs[t], {}) for t in ("aaaa0001", "aaaa0002", "aaaa0004")]
           + [entry("bbbb0009", "PENDING", None, {"cem.lambd": 3.0})]}
    (experiment / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps(new | {"runner_data": {}}))
    (experiment / "experiment_state-2025-12-31_00-00-00.json").write_text(json.dumps(old))
    os.utime(experiment / "experiment_state-2025-12-31_00-00-00.json")  # newer mtime, older name: name wins
    t = pd.read_parquet(results.write_tables(experiment)[0]).set_index("trial_id")
    assert sorted(t.index) == ["aaaa0001", "aaaa0002", "aaaa0004", "bbbb0009"]
    # Ray lists it waiting and no driver runs: the search did not finish (a hard stop), and --resume runs it
    assert t.loc["bbbb0009", "status"] == "interrupted"
    assert t.loc["bbbb0009", "config.cem.lambd"] == 3.0
    (experiment / "interrupted.jsonl").write_text(json.dumps({"signal": "SIGINT", "at": 0.0}) + "\n")
    t = results.build_tables(experiment)[0].set_index("trial_id")   # a signal's record: as the record says
    assert t.loc["bbbb0009", "status"] == "interrupted" and t.loc["aaaa0004", "status"] == "error"


def test_report_reads_the_tables(experiment):
    from cem_bench.analysis.report import load_results
    results.write_tables(experiment)
    res = load_results(experiment)
    assert len(res.trials) == 5 and len(res.ok) == 3
    assert sorted(res.front["trial_id"]) == ["aaaa0001", "aaaa0002"]


def test_the_writer_normalises_once_and_the_report_only_reads(experiment, monkeypatch):
    """trials.parquet leaves write_tables final (results.FINAL_COLUMNS: statuses, roles, the λ = 0 rows'
    keys nulled, no attack metric of a skipped attack, config_id, pareto_rank) and configs.parquet is written
    beside it; the report reads both as they are, with no normalisation and no rebuild."""
    import cem_bench.analysis.report.load as load
    from cem_bench.analysis.aggregate import build_configs, config_ids
    from cem_bench.analysis.report import load_results
    base = ours("aaaa0006", acc=0.9, ssim=0.7, lambd=0.0)
    base["info"]["config"].update({"cem.num_clusters": 5, "role": "baseline"})
    make_trial(experiment, "aaaa0006", 6, base)
    skipped = ours("aaaa0007", acc=0.1, ssim=0.05)
    skipped["attack_skipped"] = "test_acc at chance"     # a value where the record should hold none
    make_trial(experiment, "aaaa0007", 7, skipped)
    trials, epochs = results.build_tables(experiment)
    assert results.is_final(trials)
    t = trials.set_index("trial_id")
    assert t.loc["aaaa0006", "config.cem.surrogate"] == "none" and pd.isna(t.loc["aaaa0006", "config.cem.num_clusters"])
    assert t.loc["aaaa0006", "role"] == "baseline" and t.loc["aaaa0001", "role"] == "search"
    assert pd.isna(t.loc["aaaa0007", "attack_ssim"]) and t.loc["aaaa0007", "pareto_rank"] == -1
    assert list(trials["config_id"]) == list(config_ids(trials))
    results.write_tables(experiment, (trials, epochs))
    written = pd.read_parquet(experiment / "trials.parquet")
    assert list(written.columns) == list(trials.columns)
    for col in results.FINAL_COLUMNS:
        assert list(written[col]) == list(trials[col]), col

    def never(*a, **k):
        raise AssertionError("the report normalised or rebuilt a table the writer left final")
    for name in ("normalise_older", "build_configs", "null_inapplicable", "config_ids"):
        monkeypatch.setattr(load, name, never)
    res = load_results(experiment)
    assert res.final_table and res.configs_stored
    assert list(res.trials["pareto_rank"]) == list(trials["pareto_rank"])
    monkeypatch.undo()
    # a table of an older cem-bench (no role, no config_id, a stale rank): normalised by the report alone
    old = trials.drop(columns=["role", "config_id"]).assign(pareto_rank=99)
    older = load.results_of(old, [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}])
    assert not older.final_table and list(older.trials["pareto_rank"]) == list(trials["pareto_rank"])
    assert list(older.trials["config_id"]) == list(trials["config_id"]) and set(older.trials["role"]) == {"search"}
    assert len(older.configs) == len(build_configs(trials, [{"metric": "test_acc", "mode": "max"}]))


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        results.write_tables(tmp_path / "nope")


def test_a_trial_the_scheduler_stopped_is_stopped_not_an_error(experiment):
    """The scheduler's file names the trials it stopped: without a final record they read as "stopped" with
    the epoch and the reason, not as errors; a damaged file loses only that (they read as errors again); a
    trial that finished is never marked, whatever the file says."""
    running = {"status": "running", "trial_id": "bbbb0006", "attack_ssim": float("nan"), "training_iteration": 2}
    make_trial(experiment, "bbbb0006", 6, None, lines=[{**running, **h} for h in hist(2)],
               params={"cem.lambd": 4.0, "train.epochs": 8})
    decisions = [{"trial_id": "bbbb0006", "epoch": 2, "rung": 2, "reason": "rank 1 of 2 fronts at epoch 2"},
                 {"trial_id": "aaaa0001", "epoch": 2, "rung": 2, "reason": "a finished trial is not stopped"}]
    (experiment / results.SCHEDULER_FILE).write_text(json.dumps({"ranker": {}, "decisions": decisions}))
    trials, _ = results.build_tables(experiment)
    row = trials.set_index("trial_id").loc["bbbb0006"]
    assert row["status"] == "stopped" and row["stopped_at_epoch"] == 2 and pd.isna(row["error"])
    assert row["stop_reason"] == "rank 1 of 2 fronts at epoch 2"
    assert trials.set_index("trial_id").loc["aaaa0001", "status"] == "ok"
    assert trials.set_index("trial_id").loc["aaaa0005", "status"] == "error"   # not in the file: not stopped
    (experiment / results.SCHEDULER_FILE).write_text('{"decisions": [{"trial_')
    trials, _ = results.build_tables(experiment)
    assert trials.set_index("trial_id").loc["bbbb0006", "status"] == "error"


def test_the_report_says_how_many_trials_stopped_where_and_the_epochs_saved():
    from cem_bench.analysis.report.facts import stopped_text, trials_text
    t = pd.DataFrame({"status": ["ok", "ok", "stopped", "stopped", "stopped", "error"],
                      "_ok": [True, True, False, False, False, False],
                      "stopped_at_epoch": [None, None, 2, 2, 6, None],
                      "epochs_done": [8, 8, 2, 2, 6, 3],
                      "config.train.epochs": [8] * 6})
    assert trials_text(t) == "6 (2 ok, 3 stopped early, 1 errored)"
    # 8 + 8 + 2 + 2 + 6 + 3 = 29 of 48 epochs
    assert stopped_text(t) == ("3 (2 at epoch 2, 1 at epoch 6); the search ran 60% of the epochs its trials would "
                               "have run to the end")
    assert stopped_text(t.assign(status="ok")) == ""
    # a table written by hand without epochs_done: the stops, not a KeyError that sank the whole report
    assert stopped_text(t.drop(columns="epochs_done")) == "3 (2 at epoch 2, 1 at epoch 6)"


def test_a_trial_without_its_own_config_gets_the_space_s_fixed_keys_and_its_twin_s_resolution(tmp_path):
    """A baseline run stopped by Ctrl-C before its result, and one never started: Ray kept only the searcher's
    sample ({λ, seed, role}), so the row lacked the fixed σ and every default, hashed as a configuration of its
    own, and `table` showed a made-up baseline "σ=?" beside the real one. Now each is the configuration of the
    finished runs of the same sample (its own seed kept); a sample no run finished gets the fixed keys."""
    from cem_bench.analysis.aggregate import build_configs
    exp = tmp_path / "sig"
    exp.mkdir()
    (exp / "search_space.json").write_text(json.dumps({
        "name": "sig", "fixed": {"defense.noise_std": 0.1, "train.epochs": 2},
        "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                       {"metric": "attack_ssim", "mode": "min", "ref": 1.0}]}))
    full = {**CONFIG, "defense.noise_std": 0.1, "data.root": "/first/machine"}
    for i, seed in enumerate((0, 1)):
        r = ours(f"base000{i}", lambd=0.0)
        r["info"]["config"] = {**full, "cem.lambd": 0.0, "seed": seed}
        r["role"] = "baseline"
        make_trial(exp, f"base000{i}", i + 1, r)
    make_trial(exp, "base0002", 3, None, lines=[{"trial_id": "base0002", **hist(1)[0]}],
               params={"cem.lambd": 0, "seed": 2, "role": "baseline"})
    make_trial(exp, "lone0003", 4, None, lines=[{"trial_id": "lone0003", **hist(1)[0]}],
               params={"cem.lambd": 3, "seed": 0, "role": "search"})
    trials, _ = results.build_tables(exp)
    t = trials.set_index("trial_id")
    assert t.loc["base0002", "config_id"] == t.loc["base0000", "config_id"] == t.loc["base0001", "config_id"]
    assert t.loc["base0002", "config.seed"] == 2 and t.loc["base0002", "config.defense.noise_std"] == 0.1
    assert list(t.loc["base0002", "config.train.milestones"]) == [0.5] and t.loc["base0002", "role"] == "baseline"
    assert t.loc["lone0003", "config.defense.noise_std"] == 0.1 and t.loc["lone0003", "config.cem.lambd"] == 3
    configs = build_configs(trials, results.load_objectives(results._Dir(exp))[0])
    assert len(configs) == 2 and configs["config.defense.noise_std"].eq(0.1).all()


def _hold_driver_lock(exp):
    """The lock a running search's driver holds on its folder (search/lock.py), held here by another open
    file description, as another process would: flock locks of separate opens conflict."""
    import fcntl
    fd = os.open(exp / results.DRIVER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": 4242, "host": "head-node", "started": "2026-12-06T07:00:00+0000"}).encode())
    return fd


def test_a_search_still_running_is_read_as_running_and_its_folder_left_alone(experiment, capsys):
    """While a driver holds the folder's lock, a trial with no final result that Ray lists as running or pending
    (or that Ray does not list and has no recorded error) is "still running", not an error; the report and
    `cem-bench table` read the trial folders as they are (the tables beside them are those of before a
    --resume) and write nothing into the folder, and both say the search is running."""
    from cem_bench import cli
    from cem_bench.analysis.report import load_results
    for d in experiment.glob("cem_trial_aaaa000[123]_*"):   # the σ the paper-style table needs
        rec = json.loads((d / results.RESULT_FILE).read_text())
        rec["info"]["config"]["defense.noise_std"] = 0.05
        (d / results.RESULT_FILE).write_text(json.dumps(rec))
    results.write_tables(experiment)          # the tables of an earlier run: 5 trials, two without a result
    before = {p.name: p.read_bytes() for p in experiment.iterdir() if p.suffix == ".parquet"}
    make_trial(experiment, "aaaa0006", 6, None, lines=[{"status": "running", "trial_id": "aaaa0006", **hist(1)[0]}])
    # started since Ray's last snapshot of its state: not listed there yet
    make_trial(experiment, "aaaa0007", 7, None, lines=[{"status": "running", "trial_id": "aaaa0007", **hist(1)[0]}])
    # the record of the signal that stopped the run this one resumes (removed once Ray has restored it)
    (experiment / results.INTERRUPTED_FILE).write_text(json.dumps({"signal": "SIGTERM", "at": 0.0,
                                                                   "resume": "cem-bench search x --resume"}))

    def entry(tid, status, d, config):
        return [json.dumps({"trial_id": tid, "status": status, "relative_logdir": d, "config": config}), "{}"]
    dirs = {p.name.split("_")[2]: p.name for p in experiment.iterdir() if p.name.startswith("cem_trial_")}
    state = [entry(t, "TERMINATED", dirs[t], {}) for t in ("aaaa0001", "aaaa0002", "aaaa0003")]
    state += [entry("aaaa0004", "ERROR", dirs["aaaa0004"], {}),      # its own recorded error: stays one
              entry("aaaa0005", "RUNNING", dirs["aaaa0005"], {}),    # retried after a failure: running again
              entry("aaaa0006", "RUNNING", dirs["aaaa0006"], {}),
              entry("bbbb0009", "PENDING", None, {"cem.lambd": 3.0})]
    (experiment / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": state}))

    assert results.running_driver(experiment) is None
    fd = _hold_driver_lock(experiment)
    try:
        assert results.running_driver(experiment)["pid"] == 4242
        res = load_results(experiment)
        status = res.trials.set_index("trial_id")["status"].to_dict()
        assert status == {"aaaa0001": "ok", "aaaa0002": "ok", "aaaa0003": "ok", "aaaa0004": "error",
                          "aaaa0005": "running", "aaaa0006": "running", "aaaa0007": "running", "bbbb0009": "running"}
        assert not res.configs_stored
        capsys.readouterr()
        assert cli.main(["report", f"file://{experiment}"]) == 0       # file:// is this folder, read in place
        assert "a search is running on" in capsys.readouterr().err
        page = (experiment / "report" / "index.html").read_text()
        assert "Drawn while a cem-bench search was running on this folder (pid 4242 on head-node" in page
        assert "8 trials so far (3 ok, 4 still running, 1 errored)" in page and "interrupted by" not in page
        assert "aaaa0006" not in page.split("Errored trials")[-1]
        assert cli.main(["table", str(experiment), "--metrics", "test_acc"]) == 0
        out, err = capsys.readouterr()
        assert "pid 4242 on head-node" in err and "3 trials that finished ok so far (4 still running, 1 errored)" in err
        assert "running" not in out and "0.8" in out
        # nothing of the driver's folder was written: its tables are as the earlier run left them
        assert {p.name: p.read_bytes() for p in experiment.iterdir() if p.suffix == ".parquet"} == before
    finally:
        os.close(fd)
    # the driver gone (ended or killed): the same trials are read as the tables say, without a "running"
    assert results.running_driver(experiment) is None
    t = results.build_tables(experiment)[0].set_index("trial_id")
    assert (t.loc[["aaaa0005", "aaaa0006"], "status"] == "interrupted").all() and "aaaa0007" not in t.index
    # a configs.parquet that describes the trials exactly (same configurations and runs) is still not used while
    # a search runs: its runs' statuses may have changed since (a running trial finished ok)
    results.write_tables(experiment)
    assert load_results(experiment).configs_stored
    fd = _hold_driver_lock(experiment)
    try:
        assert not load_results(experiment).configs_stored
    finally:
        os.close(fd)


def test_a_named_pipe_at_the_lock_s_name_is_not_waited_on(tmp_path):
    """The probe opens the lock file without blocking: a FIFO planted there made `cem-bench table` hang."""
    os.mkfifo(tmp_path / results.DRIVER_LOCK_FILE)
    assert results.running_driver(tmp_path) is None


def test_files_linked_inside_the_experiment_are_never_read_into_the_tables(experiment, tmp_path):
    """A link planted in a trial folder (its error.txt, its result) or as a trial folder copied the linked
    file into trials.parquet and the report: the folders the tables read are read without following links."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:$6$SECRETHASH:19000\n")
    err = next(experiment.glob("cem_trial_aaaa0005_*")) / "error.txt"
    err.unlink()
    os.symlink(secret, err)
    res = next(experiment.glob("cem_trial_aaaa0003_*")) / results.RESULT_FILE
    res.unlink()
    os.symlink(secret, res)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    make_trial(elsewhere, "bbbb0001", 9, ours("bbbb0001", acc=0.99, ssim=0.01, error="SECRETHASH"))
    os.symlink(next(elsewhere.iterdir()), experiment / "cem_trial_bbbb0001_9_linked")
    trials, epochs = results.build_tables(experiment)
    assert "bbbb0001" not in set(trials["trial_id"])
    assert not trials.astype(str).apply(lambda c: c.str.contains("SECRETHASH")).any().any()
    assert set(trials["trial_id"]) >= {"aaaa0003", "aaaa0005"}


def test_a_report_of_object_storage_mid_search_writes_nothing_there(experiment, tmp_path, monkeypatch, capsys):
    """`report s3://…` of a search that had written no tables built them and wrote them into the bucket: a
    trial still running became an error there, and once that driver was killed the wrong table was read as
    final by every later reader. Now they are built into the report's own copy only, and the page says why."""
    from cem_bench import cli
    fake_object_storage(monkeypatch, tmp_path)
    make_trial(experiment, "aaaa0006", 6, None, lines=[{"status": "running", "trial_id": "aaaa0006", **hist(1)[0]}])
    before = sorted(p.name for p in experiment.iterdir())
    assert cli.main(["report", "test://handmade", "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert "has not written its tables: it is still running, or it was stopped before it could" in err, err
    assert sorted(p.name for p in experiment.iterdir()) == before          # nothing written into the storage
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "Drawn from a folder on object storage whose search has not written its tables" in page
    # aaaa0006 is running, not an error (aaaa0004 recorded its own error; aaaa0005 failed in Ray)
    assert "6 trials so far (3 ok, 1 still running, 2 errored)" in page, page
    assert "from the trial folders of a search that has not written its tables" in page
    cli.main(["table", "test://handmade"])   # (this hand-made folder's trials lack σ, which the table needs)
    assert "has not written its tables" in capsys.readouterr().err
    assert sorted(p.name for p in experiment.iterdir()) == before
    results.write_tables(experiment)         # the search ended: its tables are read, and nothing is said
    assert cli.main(["report", "test://handmade", "--out", str(tmp_path / "rep")]) == 0
    assert "has not written" not in capsys.readouterr().err
    assert "Drawn from a folder" not in (tmp_path / "rep" / "index.html").read_text()
    # a folder that is no search's (the storage root, say) is refused, not read as a search that has not ended
    (tmp_path / "root" / "stray").mkdir(parents=True)
    assert cli.main(["report", "test://root", "--out", str(tmp_path / "rep2")]) == 2
    err = capsys.readouterr().err
    assert "holds neither trials.parquet nor a Ray experiment" in err and "has not written" not in err, err
    # the same --out for another experiment that has no tables yet: the first fetch's checksum list is not kept
    other = tmp_path / "other"
    shutil.copytree(experiment, other)
    for name in ("trials.parquet", "epochs.parquet", "configs.parquet", "cem_bench_files.json"):
        (other / name).unlink(missing_ok=True)
    space = json.loads((other / "search_space.json").read_text())
    (other / "search_space.json").write_text(json.dumps({**space, "name": "other"}))
    assert cli.main(["report", "test://other", "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err


def test_a_resume_moves_the_tables_of_before_it_aside(experiment):
    """A --resume killed before its end left the tables of before it as the folder's final ones: `report` and
    `table` read them without a word, their interrupted rows long finished ok. The resume now moves them to
    superseded_state/ (kept, not deleted), so a reader rebuilds the tables from the trial folders."""
    from cem_bench.search.resume import SUPERSEDED_DIR, supersede_tables
    results.write_tables(experiment)
    before = {n: (experiment / n).read_bytes() for n in ("trials.parquet", "epochs.parquet", "configs.parquet")}
    lines = supersede_tables(str(experiment))
    assert len(lines) == 3 and all("written again when the search ends" in line for line in lines)
    assert not any((experiment / n).exists() for n in before)
    moved = {p.name: p.read_bytes() for p in (experiment / SUPERSEDED_DIR).rglob("*.parquet")}
    assert moved == before
    assert supersede_tables(str(experiment)) == []
    res = load_results(experiment)        # rebuilt from the trial folders, as after a killed first run
    assert len(res.trials) == 5


def test_a_resume_killed_before_its_end_leaves_its_unfinished_trials_interrupted(experiment):
    """The resume removed the interrupted run's record as it started: killed before its end (its tables moved
    aside), the next report rebuilt the tables with the trial that was only interrupted as an error, and wrote
    them into the folder. The record now stays until the resumed search ends."""
    from cem_bench.schema import INTERRUPTED_FILE
    from cem_bench.search.resume import supersede_tables
    make_trial(experiment, "aaaa0006", 6, None, lines=[{"status": "running", "trial_id": "aaaa0006", **hist(1)[0]}])
    (experiment / INTERRUPTED_FILE).write_text(json.dumps({"signal": "SIGINT", "at": "2026-12-06T16:00:00",
                                                           "resume": "cem-bench search s.yaml --resume"}) + "\n")
    results.write_tables(experiment)
    statuses = lambda t: dict(zip(t["trial_id"], t["status"]))   # noqa: E731
    assert statuses(load_results(experiment).trials)["aaaa0006"] == "interrupted"
    supersede_tables(str(experiment))     # what a resume does before Ray runs its trials; then it is killed
    rebuilt = statuses(load_results(experiment).trials)
    assert rebuilt["aaaa0006"] == "interrupted"
    # a trial that recorded its own error (TrialDiverged) ended: never relabelled by a signal's record
    assert rebuilt["aaaa0004"] == "error"


def _ray_state(experiment, statuses: dict[str, str]) -> None:
    """Ray's experiment state of the handmade folder: trial id -> status (its folder as relative_logdir)."""
    dirs = {p.name.split("_")[2]: p.name for p in experiment.iterdir() if p.name.startswith("cem_trial_")}
    state = [[json.dumps({"trial_id": t, "status": s, "relative_logdir": dirs[t], "config": {}}), "{}"]
             for t, s in statuses.items()]
    (experiment / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": state}))


def test_a_driver_killed_hard_leaves_a_search_the_report_says_did_not_finish(experiment):
    """kill -9, the out-of-memory killer or a lost head node write no record (only a signal did): the report
    showed the trials in flight as errors, said nothing of the search being unfinished and gave no --resume
    command. The driver now writes a hard stop's record before Tune's loop (removed when the loop returns)."""
    from cem_bench.schema import INTERRUPTED_FILE
    _ray_state(experiment, {"aaaa0001": "TERMINATED", "aaaa0002": "TERMINATED", "aaaa0003": "TERMINATED",
                            "aaaa0004": "TERMINATED", "aaaa0005": "RUNNING"})
    from cem_bench import cli
    command = "cem-bench search s.yaml --storage /r --name handmade --resume"
    (experiment / INTERRUPTED_FILE).write_text(json.dumps(results.hard_stop_record(command)) + "\n")
    assert cli.main(["report", str(experiment)]) == 0
    t = pd.read_parquet(experiment / "trials.parquet").set_index("trial_id")
    assert t.loc["aaaa0005", "status"] == "interrupted" and t.loc["aaaa0004", "status"] == "error"
    page = (experiment / "report" / "index.html").read_text()
    assert "This search was interrupted by a stop of its driver it could not answer" in page
    assert command.replace("--", "&#8209;&#8209;") in page or command in page


def test_without_a_record_a_state_with_trials_in_flight_marks_them_interrupted(experiment):
    """A folder without any record (an older cem-bench, or a driver killed before Tune's loop): Ray's state listing
    a trial running is a search that did not finish. A trial Ray lists as ended (its retries used up) stays an
    error; a state where every trial ended marks nothing."""
    _ray_state(experiment, {"aaaa0001": "TERMINATED", "aaaa0002": "TERMINATED", "aaaa0003": "TERMINATED",
                            "aaaa0004": "TERMINATED", "aaaa0005": "RUNNING"})
    t = results.build_tables(experiment)[0].set_index("trial_id")
    assert t.loc["aaaa0005", "status"] == "interrupted" and t.loc["aaaa0004", "status"] == "error"
    _ray_state(experiment, {"aaaa0001": "TERMINATED", "aaaa0002": "TERMINATED", "aaaa0003": "TERMINATED",
                            "aaaa0004": "TERMINATED", "aaaa0005": "ERROR"})
    assert results.build_tables(experiment)[0].set_index("trial_id").loc["aaaa0005", "status"] == "error"
