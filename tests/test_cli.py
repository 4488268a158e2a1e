import json
import math
import os

import pytest
from conftest import TINY, TINY_RMLE, TINY_TRAIN

from cem_bench.cli import main
from cem_bench.core.trial import run_trial
from cem_bench.schema import OBJECTIVE_METRICS as OBJECTIVE_KEYS

SPACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "search_spaces", "demo.yaml")


def _sets(flat):
    out = []
    for k, v in flat.items():
        out += ["--set", f"{k}={v}"]
    return out


@pytest.mark.slow
def test_train_then_attack_end_to_end(tmp_path, capsys):
    import torch
    before = torch.get_num_threads()
    out = tmp_path / "run"
    assert main(["train", *_sets(TINY_TRAIN), "--out", str(out), "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1
    torch.set_num_threads(max(2, before))   # the re-attack below must set the run's own back itself
    printed = capsys.readouterr().out
    assert "epoch   1" in printed and "epoch   2" in printed and str(out) in printed
    metrics = json.loads((out / "metrics.json").read_text())
    for k in OBJECTIVE_KEYS + ("train_s", "attack_s", "wall_s"):
        assert metrics[k] is not None and math.isfinite(metrics[k]), k
    assert metrics["info"]["config"]["cem.grad_mode"] == "inject"  # resolved config is recorded
    assert (out / "checkpoint.pt").is_file() and (out / "recon.png").is_file()

    assert main(["attack", str(out), "--set", "attack.epochs=2"]) == 0
    runs = [d for d in os.listdir(out) if d.startswith("attack-")]
    assert len(runs) == 1
    again = json.loads((out / runs[0] / "attack.json").read_text())
    assert again["config"]["attack.epochs"] == 2 and math.isfinite(again["attack_ssim"])
    # the train run's --threads is recorded, and the re-attack ran at it (torch_threads of metrics.json)
    assert metrics["torch_threads"] == 1 and again["torch_threads"] == 1
    torch.set_num_threads(before)
    assert again["attack_ssim"] == max(again["attack_ssim__decoder"], again["attack_ssim__rmle"])
    # any attack on a saved run: rmle alone, into a second folder (never over the first)
    assert main(["attack", str(out), "--set", "attack.names=[rmle]", "--set", "attack.rmle_iterations=5"]) == 0
    runs = sorted((d for d in os.listdir(out) if d.startswith("attack-")), key=lambda d: (len(d), d))
    assert len(runs) == 2
    rmle = json.loads((out / runs[1] / "attack.json").read_text())
    assert rmle["config"]["attack.names"] == ["rmle"] and "attack_ssim__decoder" not in rmle
    assert rmle["attack_ssim"] == rmle["attack_ssim__rmle"] and rmle["attack_ssim_by"] == "rmle"
    assert main(["attack", str(out), "--set", "cem.lambd=3"]) == 2
    # 2026-12-07 probe: data.root on a synthetic run was taken silently; --out on a re-attack's folder advised
    # `cem-bench attack` on it, which fails
    assert main(["attack", str(out), "--set", f"data.root={tmp_path}"]) == 2
    assert "data.root is read for cifar10 and cifar100 only" in capsys.readouterr().err
    assert main(["train", *_sets(TINY_TRAIN), "--out", str(out / runs[0])]) == 2
    assert f"holds a re-attack's output (attack.json, recon.png) of the run in {out}" in capsys.readouterr().err

    # --out: a run is never replaced without a word, and a file is refused before training (issue 39)
    before = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    assert main(["train", *_sets(TINY_TRAIN), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run (checkpoint.pt, metrics.json, recon.png)" in err and "Nothing was trained" in err
    assert (out / "checkpoint.pt").read_bytes() == before
    (tmp_path / "afile").write_text("x")
    assert main(["train", *_sets(TINY_TRAIN), "--out", str(tmp_path / "afile")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err

    # a checkpoint whose encoder diverged (NaN weights) says so instead of reporting all-null metrics
    from cem_bench.core import checkpoint
    config, state = checkpoint.load_run(str(out))
    key = next(k for k, v in state["client"].items() if v.is_floating_point())
    state["client"][key] = state["client"][key] * float("nan")
    checkpoint.save_run(str(out), config, state)
    assert main(["attack", str(out)]) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite weights" in err and key in err

    # the run's record is verified before any work (2026-12-07 probe: an edited torch_threads re-attacked at 2
    # threads; a deleted metrics.json skipped the data check without a word)
    record = (out / "metrics.json").read_text()
    (out / "metrics.json").write_text(record.replace('"torch_threads": 1', '"torch_threads": 2'))
    assert main(["attack", str(out)]) == 2
    assert "metrics.json is not the file cem-bench wrote there" in capsys.readouterr().err
    (out / "metrics.json").unlink()
    assert main(["attack", str(out)]) == 2
    err = capsys.readouterr().err
    assert "metrics.json is missing, though the folder's cem_bench_files.json lists it" in err, err
    assert len([d for d in os.listdir(out) if d.startswith("attack-")]) == 2   # the two above, no third


def test_train_runs_started_in_the_same_second_keep_their_own_folders(tmp_path, monkeypatch, capsys):
    """The default --out is results/runs/<time to the second>: runs started together (`for s in 1 2; do
    cem-bench train --set seed=$s & done`) wrote into one folder, each replacing the other's files. Each now
    claims its own folder as it starts, and one that fails before writing leaves none behind."""
    import cem_bench.cli as cli
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli.time, "strftime", lambda fmt, *a: "20261206-120000")
    flat = {**TINY_RMLE, "cem.lambd": 0.0, "train.epochs": 1, "attack.names": ["rmle"], "attack.rmle_iterations": 2}
    started = []
    real = cli.claim_run_folder

    def claim(out):   # the second run claims while the first has its folder but has written nothing yet
        made = real(out)
        if not started:
            started.append(made)
            assert main(["train", *_sets({**flat, "seed": 2})]) == 0
        return made

    monkeypatch.setattr(cli, "claim_run_folder", claim)
    assert main(["train", *_sets({**flat, "seed": 1})]) == 0
    runs = tmp_path / "results" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["20261206-120000", "20261206-120000-2"]
    seeds = {p.name: json.loads((p / "metrics.json").read_text())["info"]["config"]["seed"] for p in runs.iterdir()}
    assert seeds == {"20261206-120000": 1, "20261206-120000-2": 2}
    import cem_bench.core.trial as trial_mod
    monkeypatch.setattr(trial_mod, "run_trial", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no data")))
    with pytest.raises(RuntimeError):
        main(["train", *_sets(flat)])
    assert len(list(runs.iterdir())) == 2
    # nor the results/runs/ folders it made, where it was the first run
    import shutil
    shutil.rmtree(tmp_path / "results")
    with pytest.raises(RuntimeError):
        main(["train", *_sets(flat)])
    assert not (tmp_path / "results").exists()


def test_run_trial_reports_every_objective_key_each_epoch():
    records = []
    result = run_trial(TINY, lambda rec, final, **kw: records.append((rec, final)))
    assert [f for _, f in records] == [False, False, True]
    for rec, final in records:
        assert set(OBJECTIVE_KEYS) <= set(rec)
        if not final:
            assert math.isnan(rec["attack_ssim"])
    for k in ("test_acc", "test_acc_clean", "feature_spread", "attack_mse", "attack_psnr", "attack_ssim",
              "train_s", "attack_s", "wall_s"):
        assert k in result
    info = result["info"]
    assert {"config", "device", "torch_version", "package_version", "git_sha", "history"} <= set(info)


def test_run_trial_resumes_from_a_saved_state():
    states = []
    run_trial({**TINY, "train.epochs": 1, "cem.warmup_epochs": 0},
              lambda rec, final, state_fn=None: states.append(state_fn()) if final else None)
    recs = []
    res = run_trial({**TINY, "train.epochs": 2}, lambda rec, final, **kw: recs.append(rec), resume_state=states[-1])
    assert [r["epoch"] for r in recs[:-1]] == [2] and res["epochs_done"] == 2
    assert [h["epoch"] for h in res["info"]["history"]] == [1, 2]


def _states_of(flat: dict, resume_state=None) -> tuple[list, dict]:
    """(the state after each epoch, copied as the trainable's checkpoint copies it, the result) of one run_trial."""
    import copy
    states = []
    res = run_trial(flat, lambda rec, final, state_fn=None: None if final else states.append(copy.deepcopy(state_fn())),
                    resume_state=resume_state)
    return states, res


@pytest.mark.parametrize("surrogate", ["gmm", "slot_cross"])
def test_a_resumed_trial_is_the_trial_that_never_stopped(surrogate):
    """A trial resumed from its state after epoch 1 (a lost worker, ``--resume``) trains and attacks as the one
    that ran through, to the bit: the global stream (the server's dropout) was not in the state, and the resume's
    re-seeding replayed epoch 1's dropout masks (final train loss 2.32368 against 2.30707)."""
    import torch
    flat = {**TINY, "train.epochs": 3, "cem.surrogate": surrogate, "cem.lambd": 4.0, "cem.warmup_epochs": 1,
            "attack.names": ["rmle"]}
    whole, res_whole = _states_of(flat)
    torch.manual_seed(12345)    # whatever the process's stream was before: the state decides
    resumed, res_resumed = _states_of(flat, resume_state=whole[0])
    keys = ("train_loss", "rob_loss", "test_acc", "feature_spread")
    assert [[h[k] for k in keys] for h in res_resumed["info"]["history"]] == \
        [[h[k] for k in keys] for h in res_whole["info"]["history"]]
    for k, v in whole[-1]["client"].items():
        assert torch.equal(v, resumed[-1]["client"][k]), k
    assert res_resumed["attack_ssim"] == res_whole["attack_ssim"]


def test_a_state_saved_on_another_kind_of_device_resumes_with_a_note(capsys):
    """A CUDA generator's state (16 bytes) cannot be set on a CPU generator (5,056): the resume failed with
    torch's RuntimeError, which Ray retried from the same checkpoint every time. Now the streams are seeded
    again, a note says so, and the run goes on from its weights."""
    import torch
    flat = {**TINY, "train.epochs": 2, "attack.names": ["rmle"]}
    states, _ = _states_of(flat)
    cuda_like = {**states[0], "device_type": "cuda", "gen": torch.zeros(16, dtype=torch.uint8),
                 "torch_rng": None, "cuda_rng": torch.zeros(16, dtype=torch.uint8)}
    _, res = _states_of(flat, resume_state=cuda_like)
    assert [h["epoch"] for h in res["info"]["history"]] == [1, 2] and res["epochs_done"] == 2
    assert "saved on cuda and resumes on cpu" in capsys.readouterr().err
    old = {k: v for k, v in states[0].items() if k not in ("device_type", "torch_rng", "cuda_rng")}
    _, res = _states_of(flat, resume_state=old)      # a state from before the global streams were saved
    assert res["epochs_done"] == 2 and "resumes on" not in capsys.readouterr().err


def test_a_resumed_trials_train_s_holds_its_probes_before_the_resume():
    """train_s holds the probes' time (run_trial's docstring); a resumed trial's summed only epoch_s before it."""
    flat = {**TINY, "train.epochs": 2, "attack.names": ["rmle"], "attack.probe_epochs": [1, 2]}
    states, _ = _states_of(flat)
    _, res = _states_of(flat, resume_state=states[0])
    hist = res["info"]["history"]
    assert res["train_s"] >= sum(h["epoch_s"] + h["probe_s"] for h in hist) > 0


def test_missing_run_dir_is_a_clear_error(tmp_path, capsys):
    assert main(["attack", str(tmp_path)]) == 2
    assert "checkpoint.pt" in capsys.readouterr().err


def test_a_remote_run_dir_is_refused_before_anything_is_read_or_made(tmp_path, capsys, monkeypatch):
    """The attack folder is made with os.makedirs beside RUN_DIR: a readable s3:// RUN_DIR would have put the
    gallery in a local ./s3:/bucket/... folder and attack.json in the bucket. Refused first, by name."""
    monkeypatch.chdir(tmp_path)
    assert main(["attack", "s3://bucket/exp/cem_trial_1"]) == 2
    assert "reads and writes a local folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _trial_folder(path, flat):
    """A search trial's folder as the trainable and Ray leave it (checkpoint_NNNNNN/state.pt after each epoch,
    the latest two kept, and trial_result.json), from one run_trial; returns that run's result."""
    from cem_bench.core import checkpoint
    from cem_bench.schema import RESULT_FILE, STATE_FILE
    states = []
    result = run_trial(flat, lambda rec, final, state_fn=None: None if final else states.append(state_fn()))
    for i, state in list(enumerate(states))[-2:]:
        (path / f"checkpoint_{i:06d}").mkdir(parents=True)
        checkpoint.save_state(str(path / f"checkpoint_{i:06d}" / STATE_FILE), state)
    (path / RESULT_FILE).write_text(json.dumps({**result, "status": "ok", "error": None}, default=str))
    return result


def test_a_search_trial_is_re_attacked_from_its_latest_checkpoint(tmp_path, capsys):
    """`cem-bench attack TRIAL_DIR`: the encoder the trial attacked, so its own attack config gives its own
    numbers; and every folder that does not hold that encoder is refused by name, with nothing written."""
    trial = tmp_path / "cem_trial_1"
    result = _trial_folder(trial, TINY)
    assert main(["attack", str(trial)]) == 0
    again = json.loads((trial / next(d for d in os.listdir(trial) if d.startswith("attack-")) / "attack.json").read_text())
    for k in ("attack_ssim__decoder", "attack_ssim__rmle", "attack_mse"):
        assert again[k] == pytest.approx(result[k], rel=1e-6, abs=1e-7), k
    record = json.loads((trial / "trial_result.json").read_text())

    def refused(change, *expected):
        bad = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        import shutil
        shutil.copytree(trial, bad, ignore=shutil.ignore_patterns("attack-*"))
        change(bad)
        capsys.readouterr()
        assert main(["attack", str(bad)]) == 2
        err = capsys.readouterr().err
        assert all(e in err for e in expected), err
        assert not [d for d in os.listdir(bad) if d.startswith("attack-")]

    def rewrite(**fields):
        return lambda d: (d / "trial_result.json").write_text(json.dumps({**record, **fields}))

    import shutil
    refused(rewrite(status="error", error="ValueError: x"), "ended 'error'", "no trained encoder")
    refused(rewrite(selected_epoch=1), "encoder of epoch 1 (train.select_best_last)", "selected copy of epoch None")
    refused(rewrite(selected_epoch=7), "selected_epoch 7, not an epoch of the run (1..2)")
    history = record["info"]["history"]
    refused(rewrite(info={**record["info"], "history": [{**h, "test_acc": h["test_acc"] + 0.01} for h in history]}),
            "are not those", "the checkpoint is another run's")
    refused(lambda d: shutil.rmtree(d / "checkpoint_000001"), "is the state of epoch 1", "attacked at epoch 2")
    refused(lambda d: [shutil.rmtree(c) for c in d.glob("checkpoint_*")], "holds no checkpoint_NNNNNN/ folder")

    def linked(d):   # the latest checkpoint a link (to a copy of itself): said so, not "the state of epoch 1"
        shutil.move(d / "checkpoint_000001", d.parent / f"{d.name}-elsewhere")
        (d / "checkpoint_000001").symlink_to(d.parent / f"{d.name}-elsewhere")
    refused(linked, "checkpoint_000001 is a symbolic link", "copy the checkpoint folder")
    refused(lambda d: (d / "checkpoint_000001" / "state.pt").write_bytes(b"junk"), "state.pt is not a readable")
    refused(lambda d: (d / "trial_result.json").write_text("{"), "trial_result.json is not valid JSON")
    refused(rewrite(info={}), "has no resolved config")


def test_a_select_best_last_trial_is_re_attacked_at_its_selected_epoch(tmp_path, capsys):
    """`train.select_best_last` attacks an earlier epoch's encoder than the last; every per-epoch state holds that
    copy (the trainer's ``best``), so the re-attack of the trial gives the trial's own numbers (it was refused,
    and the paper's protocol, select_best_last 40, could not be re-attacked). A checkpoint of another trial of
    the same width copied into the folder is refused (it was attacked, its numbers under this trial's config)."""
    flat = {**TINY, "train.epochs": 3, "train.select_best_last": 3, "train.lr": 0.2}
    for seed in range(10):   # a seed whose best epoch is not the last, so the selected copy is what is attacked
        trial = tmp_path / f"cem_trial_{seed}"
        result = _trial_folder(trial, {**flat, "seed": seed})
        if result["selected_epoch"] != result["epoch"]:
            break
    assert result["selected_epoch"] < result["epoch"], "no seed selected an earlier epoch"
    capsys.readouterr()
    assert main(["attack", str(trial)]) == 0
    again = json.loads((trial / next(d for d in os.listdir(trial) if d.startswith("attack-")) / "attack.json").read_text())
    for k in ("attack_ssim__decoder", "attack_ssim__rmle", "attack_mse"):
        assert again[k] == pytest.approx(result[k], rel=1e-6, abs=1e-7), k
    import shutil
    other = tmp_path / "other"
    _trial_folder(other, {**flat, "seed": 99, "cem.lambd": 4.0})
    for c in trial.glob("checkpoint_*"):
        shutil.rmtree(c)
    for c in other.glob("checkpoint_*"):
        shutil.copytree(c, trial / c.name)
    capsys.readouterr()
    assert main(["attack", str(trial)]) == 2
    assert "the checkpoint is another run's" in capsys.readouterr().err


def test_a_re_attack_runs_at_the_trial_s_own_torch_threads_unless_told(tmp_path, capsys):
    """On the CPU the thread count changes the order of float sums: a trial trained and attacked at 1 thread
    and re-attacked at torch's default gave other (close) SSIMs. `cem-bench attack` now sets the threads the
    trial recorded, says so and records them; --threads wins; a record without them leaves torch's default."""
    import torch
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        trial = tmp_path / "cem_trial_1"
        result = _trial_folder(trial, TINY)
        assert result["torch_threads"] == 1
        torch.set_num_threads(2)                  # a user's shell: more threads than the trial had
        capsys.readouterr()
        assert main(["attack", str(trial)]) == 0
        assert "cem-bench attack: 1 torch thread(s) (the run's own)" in capsys.readouterr().out
        runs = sorted(d for d in os.listdir(trial) if d.startswith("attack-"))
        again = json.loads((trial / runs[-1] / "attack.json").read_text())
        assert again["torch_threads"] == 1
        assert again["attack_ssim"] == pytest.approx(result["attack_ssim"], rel=1e-6, abs=1e-7)
        assert main(["attack", str(trial), "--threads", "2"]) == 0
        assert "2 torch thread(s) (--threads)" in capsys.readouterr().out
        record = json.loads((trial / "trial_result.json").read_text())
        (trial / "trial_result.json").write_text(json.dumps({k: v for k, v in record.items()
                                                             if k != "torch_threads"}))   # an older record
        torch.set_num_threads(2)
        assert main(["attack", str(trial)]) == 0
        assert "2 torch thread(s) (torch's default: the run records none)" in capsys.readouterr().out
        with pytest.raises(SystemExit) as e:
            main(["attack", str(trial), "--threads", "0"])
        assert e.value.code == 2 and "'0' is not a whole number >= 1" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def test_attack_refuses_keys_its_attacks_never_read_and_checks_before_the_data(tmp_path, capsys):
    """`--set attack.names=[decoder] --set attack.rmle_iterations=500` ran the decoder alone, the user believing
    rmle strengthened; a diverged encoder of a CIFAR run got the data set's error (or its download) first; the
    run's data.root could not be changed, where the data error itself said to set it; attack.json recorded no
    device, so a bf16 GPU re-attack and an fp32 CPU one could not be told apart."""
    from cem_bench.core import checkpoint
    from cem_bench.schema import STATE_FILE
    trial = tmp_path / "cem_trial_1"
    _trial_folder(trial, TINY)

    def attacked():
        return sorted(d for d in os.listdir(trial) if d.startswith("attack-"))

    capsys.readouterr()
    assert main(["attack", str(trial), "--set", "attack.names=[decoder]", "--set", "attack.rmle_iterations=5"]) == 2
    err = capsys.readouterr().err
    assert "attack.rmle_iterations is read by rmle, which attack.names=['decoder'] does not run" in err, err
    assert main(["attack", str(trial), "--set", "attack.probe_epochs=[1]"]) == 2
    assert "attack.probe_epochs is read only by a trial" in capsys.readouterr().err
    assert main(["attack", str(trial), "--set", "attack.min_accuracy_margin=0.2"]) == 2
    assert "a re-attack always attacks" in capsys.readouterr().err
    # data.root of a synthetic run is never read (2026-12-07: refused, as train --set refuses it); a CIFAR run's
    # is taken (below)
    assert main(["attack", str(trial), "--set", f"data.root={tmp_path / 'elsewhere'}"]) == 2
    assert "data.root is read for cifar10 and cifar100 only" in capsys.readouterr().err
    assert attacked() == []
    assert main(["attack", str(trial), "--set", "attack.names=[rmle]", "--set", "attack.rmle_iterations=2"]) == 0
    doc = json.loads((trial / attacked()[0] / "attack.json").read_text())
    assert doc["info"]["device"] and doc["info"]["package_version"] and "git_sha" in doc["info"]
    # a diverged encoder is refused before the data set is read: a CIFAR config without its files
    record = json.loads((trial / "trial_result.json").read_text())
    record["info"]["config"].update({"data.dataset": "cifar10", "data.root": str(tmp_path / "no_cifar")})
    (trial / "trial_result.json").write_text(json.dumps(record))
    latest = sorted(trial.glob("checkpoint_*"))[-1] / STATE_FILE
    state = checkpoint.load_state(str(latest))
    key = next(k for k, v in state["client"].items() if v.is_floating_point())
    state["client"][key] = state["client"][key] * float("nan")
    checkpoint.save_state(str(latest), state)
    capsys.readouterr()
    assert main(["attack", str(trial), "--set", f"data.root={tmp_path / 'elsewhere'}"]) == 2   # taken for CIFAR
    err = capsys.readouterr().err
    assert "NaN or infinite weights" in err and "cifar10" not in err and "data.root is read" not in err, err
    assert len(attacked()) == 1 and not (tmp_path / "no_cifar").exists()


def test_attack_refusal_names_every_key_it_takes(tmp_path, capsys):
    """The refusal said attack.* and train.device, leaving out train.eval_batch_size, which it takes."""
    assert main(["attack", str(tmp_path), "--set", "cem.lambd=8"]) == 2
    err = capsys.readouterr().err
    assert "train.device, train.eval_batch_size, data.root" in err and "cem.lambd" in err, err


@pytest.mark.parametrize("bad", [["--set", "data.dataset=imagenet"], ["--set", "train.epochs=0"]])
def test_bad_values_fail_before_work(bad, tmp_path):
    assert main(["train", *bad, "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_missing_dataset_writes_nothing(tmp_path, capsys):
    """A CIFAR run with no files (and no network in tests) is a clear data error; no run folder is left."""
    out = tmp_path / "run"
    flat = {**TINY_TRAIN, "data.dataset": "cifar10", "data.root": str(tmp_path / "nodata")}
    assert main(["train", *_sets(flat), "--out", str(out)]) == 2
    assert "data error" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_diverged_training_is_one_clear_message(tmp_path, capsys):
    out = tmp_path / "run"
    flat = {**TINY_TRAIN, "train.lr": 1e12, "train.weight_decay": 0, "train.epochs": 1, "cem.warmup_epochs": 0}
    assert main(["train", *_sets(flat), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the trial diverged" in err and "Traceback" not in err and not out.exists()


def test_unavailable_cuda_is_a_configuration_error(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main(["train", "--set", "train.device=cuda", "--set", "train.epochs=2"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_calibrate_measures_every_surrogate_against_gmm(tmp_path, capsys):
    """`cem-bench calibrate` on a tiny configuration: a record per surrogate with the issue's fields, gmm the
    reference (ratio 1, matching λ 16), a finite positive strength for each, and the YAML of loss scales."""
    import yaml
    out_json, out_yaml = tmp_path / "cal.json", tmp_path / "cal.yaml"
    # a match on 4 batches (cem.strength_batches; 64 by default, whose passes were most of this test)
    rc = main(["calibrate", "--set", "model.width=0.0625", "--set", "data.train_size=256", "--set",
                   "train.batch_size=64", "--set", "train.device=cpu", "--set", "cem.strength_batches=4", "--warmup",
                   "1", "--batches", "2", "--json", str(out_json), "--yaml", str(out_yaml)])
    assert rc == 0, capsys.readouterr().err
    records = json.loads(out_json.read_text())["records"]
    from cem_bench import surrogates
    assert [r["surrogate"] for r in records][0] == "gmm"
    assert sorted(r["surrogate"] for r in records) == sorted(surrogates.names())
    for r in records:
        assert {"surrogate", "strength", "ratio_to_gmm", "fixed_ratio_to_gmm", "matching_lambda"} <= set(r)
        assert r["strength"] > 0 and abs(r["fixed_ratio_to_gmm"] * r["matching_lambda"] - 16) < 1e-6 * 16
        # a trial at these keys: the attention surrogates match gmm (their default), so that is their ratio
        assert r["strength_mode"] == ("fixed" if r["surrogate"] == "gmm" else "matched")
        assert r["ratio_to_gmm"] == (r["matched_ratio"] if r["strength_mode"] == "matched" else 1.0)
    assert records[0]["ratio_to_gmm"] == 1.0 and records[0]["matching_lambda"] == 16.0
    fixed = main(["calibrate", "--set", "model.width=0.0625", "--set", "data.train_size=256", "--set",
                  "train.batch_size=64", "--set", "train.device=cpu", "--set", "cem.strength=fixed", "--warmup", "1",
                  "--batches", "2", "--surrogates", "slot_cross", "--json", str(tmp_path / "fixed.json")])
    assert fixed == 0
    as_fixed = json.loads((tmp_path / "fixed.json").read_text())["records"][1]   # cem.strength=fixed: fixed ratio
    assert as_fixed["strength_mode"] == "fixed" and as_fixed["ratio_to_gmm"] == as_fixed["fixed_ratio_to_gmm"]
    for r in records:    # cem.strength=matched: the scale measured on the match's batches, checked on others
        assert 0.5 < r["matched_ratio"] < 2 and r["matched_loss_scale"] > 0
    assert records[0]["matched_ratio"] == 1.0
    scales = yaml.safe_load(out_yaml.read_text())
    assert set(scales) == set(surrogates.names())
    assert scales["gmm"] == {"cem.surrogate": "gmm", "cem.strength": "fixed", "cem.loss_scale": 1,
                             "cem.warmup_epochs": 1}


PROC = pytest.mark.skipif(not os.path.isdir("/proc/sys"), reason="needs Linux's /proc")


@pytest.mark.parametrize("argv, says", [
    (["train", "--out", "{f}/run"], "--out {f}/run: {f} is a file, so nothing can be written under it"),
    (["calibrate", "--json", "{f}/x.json"], "--json {f}/x.json: {f} is a file"),
    (["calibrate", "--yaml", "{d}"], "--yaml {d} is a folder; give a file name"),
    (["bench", "--only", "data", "--json", "{d}"], "--json {d} is a folder; give a file name"),
    (["bench", "--only", "data", "--json", "{f}/x.json"], "--json {f}/x.json: {f} is a file"),
    (["report", "{d}", "--out", "{f}"], "--out {f} is a file, not a folder; give a folder for the report"),
    (["report", "{d}", "--out", "{f}/r"], "--out {f}/r: {f} is a file"),
    # a folder the file system cannot make: found after the training until 2026-12-06
    (["train", "--out", "{d}/" + "a" * 300], "--out {d}/" + "a" * 300 + ": the folder cannot be made"),
    (["report", "{d}", "--out", "{d}/r/" + "a" * 300], "the folder cannot be made"),
    (["calibrate", "--json", "{d}/r/" + "a" * 300 + "/x.json"], "the folder cannot be made"),
    (["search", SPACE, "--storage", "{d}/" + "a" * 300], "--storage {d}/" + "a" * 300 + ": the folder cannot be made"),
    # a file name longer than the file system takes: the checks made its folder, never the file, and the write
    # failed after the measurement (until 2026-12-07); a trailing '/' names a folder, and x.json was written
    (["calibrate", "--json", "{d}/" + "a" * 300 + ".json"], "the file name is 305 bytes, and the file system there "
                                                          "takes names of at most 255"),
    (["bench", "--only", "data", "--json", "{d}/" + "é" * 130], "the file name is 260 bytes"),
    (["calibrate", "--yaml", "{d}/x.yaml/"], "--yaml {d}/x.yaml/ ends in '/', which names a folder; give a file name "
                                            "(e.g. {d}/x.yaml)"),
    (["bench", "--only", "data", "--json", "{d}/x.json/"], "--json {d}/x.json/ ends in '/'"),
    # an existing folder nobody can write a file in, root included (os.access says yes to root): until 2026-12-07
    # `train --out` trained and attacked, then lost the run on its first write; /proc stands for an immutable
    # folder, a read-only mount or an NFS share mapping root to nobody
    pytest.param(["train", "--out", "/proc/sys"], "--out /proc/sys: nothing can be written in the folder /proc/sys",
                 marks=PROC),
    pytest.param(["report", "{d}", "--out", "/proc/sys"], "nothing can be written in the folder /proc/sys", marks=PROC),
    pytest.param(["calibrate", "--json", "/proc/x.json"], "--json /proc/x.json: nothing can be written in the folder "
                 "/proc", marks=PROC),
    pytest.param(["bench", "--only", "data", "--json", "/proc/x.json"], "nothing can be written in the folder /proc",
                 marks=PROC),
    pytest.param(["search", SPACE, "--storage", "/proc/sys"], "--storage /proc/sys: nothing can be written",
                 marks=PROC),
    # an existing file that is not the command's own earlier output: replaced without a word until 2026-12-07
    (["calibrate", "--json", "{f}"], "--json {f} exists and is not an earlier output of `cem-bench calibrate "
                                     "--json`: it would be replaced"),
    (["calibrate", "--yaml", "{f}"], "--yaml {f} exists and is not an earlier output of `cem-bench calibrate"),
    (["bench", "--only", "data", "--json", "{f}"], "--json {f} exists and is not an earlier output of `cem-bench "
                                                   "bench --json`"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_work(argv, says, tmp_path, capsys,
                                                                         monkeypatch):
    """A path under a file, or a folder where a file is asked for, failed with a bare OS message after the
    training or the measuring it was to hold; now refused first, naming the flag."""
    from cem_bench import calibrate, search
    from cem_bench.bench import harness
    from cem_bench.core import trial

    def never(*a, **k):
        raise AssertionError("the work started")
    monkeypatch.setattr(trial, "run_trial", never)
    monkeypatch.setattr(calibrate, "measure", never)
    monkeypatch.setattr(harness, "run_bench", never)
    monkeypatch.setattr(search, "search_command", never)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    f, d = tmp_path / "afile", tmp_path / "adir"
    rc = main([a.format(f=f, d=d) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and says.format(f=f, d=d) in err and "Nothing was" in err and "Traceback" not in err, err
    assert (tmp_path / "afile").read_text() == "x" and not any(d.iterdir())


def test_a_results_file_is_never_an_output_file_and_an_earlier_output_is(tmp_path, capsys, monkeypatch):
    """A file a results folder's manifest records is refused even when it reads as the command's own output; an
    earlier output of the same command and flag passes the checks (it is replaced, as such flags do)."""
    from cem_bench import calibrate
    from cem_bench.integrity import write_recorded

    def never(*a, **k):
        raise AssertionError("the work started")
    monkeypatch.setattr(calibrate, "measure", never)
    earlier = json.dumps({"configuration": {}, "records": []}).encode()
    write_recorded(str(tmp_path), "trials.json", earlier)
    rc = main(["calibrate", "--json", str(tmp_path / "trials.json")])
    assert rc == 2 and "a file of the cem-bench results that cem_bench_files.json beside it records" in \
        capsys.readouterr().err
    rc = main(["calibrate", "--json", str(tmp_path / "cem_bench_files.json")])
    assert rc == 2 and "cem-bench's checksum list" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "cal.json").write_bytes(earlier)
    (tmp_path / "mine" / "cal.yaml").write_text("# cem-bench calibrate: per surrogate ...\ngmm: {}\n")
    with pytest.raises(AssertionError, match="the work started"):   # past every check
        main(["calibrate", "--json", str(tmp_path / "mine" / "cal.json"), "--yaml", str(tmp_path / "mine" / "cal.yaml")])


@pytest.mark.parametrize("sets, says", [
    (["cem.num_slots=4"], "cem.num_slots is read by attention_centroid, serial_enhanced, slot_cross, not by "
                          "cem.surrogate=gmm"),
    (["cem.surrogate=slot_cross", "cem.num_clusters=3"], "cem.num_clusters is read by gmm, not by "
                                                         "cem.surrogate=slot_cross"),
    (["attack.names=[decoder]", "attack.rmle_iterations=500"], "attack.rmle_iterations is read by rmle, which "
                                                                "attack.names=['decoder'] does not run"),
])
def test_train_refuses_a_set_key_the_run_never_reads(sets, says, tmp_path, capsys, monkeypatch):
    """`train --set cem.num_slots=4` under gmm trained gmm and recorded nothing of the key (2026-12-07 audit);
    `cem-bench attack` already refused an attack key its attacks do not read."""
    from cem_bench.core import trial

    def never(*a, **k):
        raise AssertionError("the work started")
    monkeypatch.setattr(trial, "run_trial", never)
    argv = ["train", "--out", str(tmp_path / "run")]
    for kv in sets:
        argv += ["--set", kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Nothing was trained" in err and not (tmp_path / "run").exists(), err


def test_train_takes_surrogate_keys_at_lambda_zero_and_probe_keys(tmp_path, monkeypatch):
    """The same keys with cem.lambd=0 are that configuration's baseline; the probe's keys are a trial's own."""
    from cem_bench.core import trial
    ran = []
    monkeypatch.setattr(trial, "run_trial", lambda cfg, *a, **k: ran.append(cfg) or (_ for _ in ()).throw(
        KeyboardInterrupt))
    for sets in (["cem.lambd=0", "cem.num_slots=4"], ["attack.probe_images=16"]):
        argv = ["train", "--out", str(tmp_path / f"run{len(ran)}")]
        for kv in sets:
            argv += ["--set", kv]
        assert main(argv) == 130     # the stand-in's interrupt: the run had started
    assert len(ran) == 2


@pytest.mark.parametrize("argv", [["train", "--out", ""], ["report", "x", "--out", " "], ["search", SPACE, "--storage", ""],
                                  ["table", ""], ["calibrate", "--json", ""]])
def test_an_empty_path_is_refused(argv, capsys):
    """An unset variable (``--out "$DIR"``) meant the current folder: a report written over its files."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "an empty path" in capsys.readouterr().err


def test_a_tilde_the_shell_left_is_the_home_folder_for_the_check_and_the_writes(tmp_path, monkeypatch, capsys):
    """``--out=~/run`` (the shell expands no ``~`` after ``=``): the check looked at ``./~/run`` and the writes
    went to ``$HOME/run``, replacing a saved run there without a word."""
    from cem_bench.core import trial
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"kept")
    monkeypatch.setattr(trial, "run_trial", lambda *a, **k: pytest.fail("trained"))
    assert main(["train", *_sets(TINY_TRAIN), "--out=~/run"]) == 2
    assert f"--out {tmp_path / 'run'} already holds a run" in capsys.readouterr().err
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == b"kept" and not (tmp_path / "~").exists()

def test_calibrate_refuses_an_unknown_surrogate_before_training(capsys):
    rc = main(["calibrate", "--surrogates", "slotcross", "--set", "model.width=0.0625"])
    assert rc == 2 and "unknown surrogate(s) 'slotcross'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_calibrated_defaults_hold_at_the_reference_state():
    """The surrogates' default cem.loss_scale gives gmm's strength per unit λ within a factor of 1.5 at the
    reference states they were calibrated on (width 0.25, σ 0.1, 10-epoch schedule, the λ = 0 encoder after 3
    epochs, seeds 0-2, the median of the per-seed ratios): a change to a surrogate that re-scales λ fails here.
    The median, not calibrate's geometric mean: on an AVX2 CPU (no AVX-512) seed 2's encoder, trained there by
    other CPU kernels (presumably), sits where gmm's hinge has cut gmm's own strength, and the inject pair's ratio
    there was 5.4 against 0.9-1.1 on seeds 0 and 1 (geometric means 1.70 and 1.75; on the box of the docs' table
    1.24 and 1.29): one seed's state, not a re-scaled surrogate (docs/estimators.md "One λ scale")."""
    import statistics

    from cem_bench import calibrate
    # the fixed ratios asserted come from the 4 held-out batches; the match (cem.strength_batches, the matched
    # ratio, not asserted here) from its own batches under strength.untouched: one batch leaves them bit-equal
    rows = calibrate.table(calibrate.measure({"model.width": 0.25, "defense.noise_std": 0.1, "train.epochs": 10,
                                              "train.device": "cpu", "cem.strength_batches": 1},
                                             warmup=3, batches=4, seeds=[0, 1, 2]))
    medians = {r["surrogate"]: r["fixed_ratio_median"] for r in rows}
    assert medians == {r["surrogate"]: statistics.median(r["fixed_ratio_per_seed"]) for r in rows}
    assert all(1 / 1.5 <= m <= 1.5 for m in medians.values()), (medians, rows)


def test_calibrate_prints_the_median_of_the_seeds_beside_their_geometric_mean():
    """Three seeds, one where gmm's hinge has cut gmm's strength (the AVX2 box's seed 2, docs/estimators.md):
    the geometric mean of the ratios is pulled to about 1.7, the median stays at the typical seed's 1.0; both
    are in the record and the median in the printed row (per-seed rows built by hand: no training)."""
    from cem_bench import calibrate

    def row(name, per_seed, matched):
        return calibrate.Strength(name, calibrate.geo(per_seed), 1.0, "inject", 0.1, tuple(per_seed), 3,
                                  tuple(matched), tuple(matched), tuple(matched))
    gmm = row("gmm", [1.0, 1.0, 0.2], [1.0, 1.0, 1.0])
    other = row("slot_cross", [1.0, 0.9, 1.08], [1.02, 0.99, 1.01])     # ratios 1.0, 0.9, 5.4
    records = calibrate.table([gmm, other])
    rec = records[1]
    assert rec["fixed_ratio_per_seed"] == pytest.approx([1.0, 0.9, 5.4])
    assert rec["fixed_ratio_to_gmm"] == pytest.approx((1.0 * 0.9 * 5.4) ** (1 / 3))    # 1.69: the outlier pulls
    assert rec["fixed_ratio_median"] == pytest.approx(1.0) and rec["matched_ratio_median"] == pytest.approx(1.01)
    assert records[0]["fixed_ratio_median"] == 1.0
    text = calibrate.format_table(records)
    assert text.splitlines()[2].endswith("median 1 | 1.01"), text
    one = calibrate.table([row("gmm", [1.0], [1.0]), row("slot_cross", [2.0], [1.0])])
    assert "median" not in calibrate.format_table(one).splitlines()[2]      # one seed: nothing to take it over
    assert math.isnan(calibrate.median([])) and math.isnan(calibrate.median([1.0, math.nan, 1.0]))
    assert calibrate.median([1.0, math.inf, 0.9]) == 1.0     # an infinite ratio at one seed: one outlier


@pytest.mark.parametrize("argv, says", [
    (["search", "{space}", "--storage", "s3://"], "--storage s3://: not a storage cem-bench can use: no bucket "
                                                  "named (an unset variable in s3://$BUCKET?); give s3://BUCKET/PREFIX"),
    (["search", "{space}", "--storage", "gs://"], "--storage gs://: not a storage cem-bench can use: no bucket named"),
    (["search", "{space}", "--storage", "s3:///"], "--storage s3:///: not a storage cem-bench can use: no bucket"),
    (["search", "{space}", "--storage", "s3://?endpoint_override=127.0.0.1:9"], "no bucket named"),
    (["search", "{space}", "--storage", "file://"], "--storage file://: not a storage cem-bench can use: a scheme "
                                                    "alone names no storage"),
    (["table", "s3://"], "s3://: not a storage cem-bench can use: no bucket named"),
])
def test_a_storage_uri_without_a_bucket_is_refused_before_the_search(argv, says, tmp_path, capsys, monkeypatch):
    """`--storage s3://$BUCKET` with BUCKET unset gives `s3://`: its slashes were stripped to `s3:`, a local
    folder's name, so the check passed, Ray started, `./s3:` was made and Ray tried to create a bucket. Now one
    line naming what is valid, before the search (or the table) starts and with nothing made."""
    import cem_bench.search

    def never(*a, **k):
        raise AssertionError("the work started")
    monkeypatch.setattr(cem_bench.search, "search_command", never)
    monkeypatch.chdir(tmp_path)
    space = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "search_spaces", "demo.yaml")
    rc = main([a.format(space=space) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not os.listdir(tmp_path)


def test_a_storage_uri_loses_only_its_paths_trailing_slashes():
    from cem_bench.storage import resolve_storage
    assert resolve_storage("s3://b/prefix//") == "s3://b/prefix"
    assert resolve_storage("s3://b/") == "s3://b"
    assert resolve_storage("s3://b/p/?endpoint_override=h:9") == "s3://b/p?endpoint_override=h:9"
    assert resolve_storage("file:///") == "/"      # the root, not the local folder 'file:'
    assert resolve_storage("file:///tmp/x/") == "/tmp/x"
    # a local folder as an absolute path: as URIs pyarrow refused these once Ray had started (2026-12-07 probe)
    assert resolve_storage("file://localhost/tmp/x") == "/tmp/x"
    assert resolve_storage("file://res") == os.path.abspath("res")


def test_bench_help_lists_every_group_that_only_accepts(capsys):
    """`bench --help` listed the --only groups by hand and missed `ceiling`, which `bench --only nope` names
    among the known ones: both now come from the bench's registry."""
    from cem_bench.bench import group_names
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "ceiling" in group_names()
    assert f"only these row groups ({' '.join(group_names())}); default: all" in help_text, help_text


def test_a_full_disk_without_a_file_name_does_not_quote_the_working_folders_free_space(tmp_path):
    """ENOSPC from a write that names no file (Ray's, pyarrow's) printed the free space of the folder the command
    ran in, which says nothing of the disk that was full (the audit of 2026-11-28)."""
    import errno

    from cem_bench.cli import os_error_message
    bare = os_error_message(OSError(errno.ENOSPC, "No space left on device"))
    import tempfile
    assert bare.startswith("no space left on the device (the command's output folder, or the temporary folder "
                           f"{tempfile.gettempdir()}, $TMPDIR).") and "MiB free" not in bare, bare
    named = os_error_message(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f")))
    assert f"({tmp_path / 'f'}); " in named and "MiB free there" in named, named


def test_a_search_whose_report_cannot_even_import_says_how_to_build_it(tmp_path, monkeypatch, capsys):
    """Code upgraded under a long search: the tables are written, the report module no longer imports; the
    driver says how to build the report instead of ending in a traceback."""
    import sys
    from types import SimpleNamespace

    from cem_bench import cli, search
    done = {"experiment": str(tmp_path), "name": "x", "stats": {}, "ok": 2, "error": 0, "seconds": 1.0}
    monkeypatch.setattr(search, "search_command", lambda args: done)
    monkeypatch.setitem(sys.modules, "cem_bench.analysis.report", None)   # `import` raises ImportError
    assert cli.cmd_search(SimpleNamespace(storage=str(tmp_path))) == 0
    err = capsys.readouterr().err
    assert "the report could not be built (ModuleNotFoundError: " in err and f"`cem-bench report {tmp_path}`" in err


def test_repeated_calibration_seeds_and_more_threads_than_cores_are_refused(monkeypatch, capsys):
    """`calibrate --seeds 1 1` measured one state twice and called it the median of 2 seeds; `--threads 99999`
    ended in a library's traceback."""
    from cem_bench import calibrate
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: pytest.fail("measured"))
    assert main(["calibrate", "--seeds", "1", "2", "1", "--set", "model.width=0.0625"]) == 2
    assert "--seeds: 1 given more than once" in capsys.readouterr().err
    for command in (["train"], ["attack", "somewhere"]):
        with pytest.raises(SystemExit) as e:
            main([*command, "--threads", str((os.cpu_count() or 1) + 1)])
        assert e.value.code == 2 and "cores; give 1 to" in capsys.readouterr().err


def test_attacking_a_trial_that_did_not_finish_says_so(tmp_path, capsys):
    """A search trial's folder with Ray's files and a checkpoint but no trial_result.json (interrupted): it
    said "checkpoint.pt does not exist", the file of a `train --out` folder."""
    trial = tmp_path / "cem_trial_ab12_1_x"
    (trial / "checkpoint_000001").mkdir(parents=True)
    (trial / "params.json").write_text("{}")
    assert main(["attack", str(trial)]) == 2
    err = capsys.readouterr().err
    assert "is a search trial that did not finish (no trial_result.json)" in err and "--resume" in err, err


def test_a_stopped_train_says_nothing_was_saved(tmp_path, monkeypatch, capsys):
    from cem_bench.core import trial

    def stopped(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(trial, "run_trial", stopped)
    assert main(["train", *_sets(TINY_TRAIN), "--out", str(tmp_path / "run")]) == 130
    assert "interrupted: nothing was saved" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_search_space_given_as_config_says_what_it_is(capsys):
    assert main(["train", "--config", SPACE]) == 2
    assert "is a search space (fixed, num_samples, objectives, params, sampler)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["table", "--metrics", "test_acc", "attack_ssim", "RESULTS"], "--metrics"),
    (["replay", "--grace", "1", "2"], "--grace"),   # ints: a folder name would fail as an int first
    (["calibrate", "--surrogates", "gmm", "--set"], None),   # not a missing positional: argparse's own message
])
def test_a_list_option_that_took_the_folder_says_so(argv, flag, capsys):
    # argparse alone says "required: results_dir" although the folder was given: the list option took it. The
    # hint names the option and both ways out, and nothing runs (exit 2, argparse's usage error).
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    if flag is None:
        assert "takes every word after it" not in err
    else:
        assert "required: results_dir" in err
        assert f"{flag} takes every word after it" in err and "end its list with --" in err


def test_the_list_ends_at_double_dash(tmp_path, capsys):
    # The documented way out works: the folder after `--` is the positional (here a folder without a run: the
    # table's own error, not argparse's).
    assert main(["table", "--metrics", "test_acc", "--", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "takes every word" not in err and "required: results_dir" not in err


def test_version_names_the_package_its_commit_and_the_libraries(capsys):
    from importlib import metadata

    from cem_bench import __version__
    from cem_bench.provenance import git_sha
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cem-bench {__version__} (commit {git_sha()})")
    for name in ("torch", "ray", "optuna", "scikit-image"):
        assert f"{name} " in out
    assert f"optuna {metadata.version('optuna')}" in out


def test_a_checkpoint_of_another_run_at_the_same_accuracies_is_refused():
    """2026-12-07 probe: two runs at chance (0.1 every epoch) were told apart by their accuracies alone, so one's
    checkpoint copied over the other's was attacked under its name; every number of the epoch records counts."""
    from cem_bench.core.checkpoint import _same_run
    from cem_bench.errors import ResultsError
    mine = [{"epoch": 1, "test_acc": 0.1, "train_loss": 2.30, "feature_spread": 0.5},
            {"epoch": 2, "test_acc": float("nan"), "train_loss": 2.29, "feature_spread": 0.4}]
    record = {"info": {"history": json.loads(json.dumps(mine).replace("NaN", "null"))}}
    _same_run({"history": mine}, record, "state.pt", "trial_result.json")       # its own: taken
    other = [{**r, "train_loss": r["train_loss"] + 1e-3} for r in mine]
    with pytest.raises(ResultsError, match="the checkpoint is another run's"):
        _same_run({"history": other}, record, "state.pt", "trial_result.json")
    with pytest.raises(ResultsError, match="the checkpoint is another run's"):
        _same_run({"history": mine[:1]}, record, "state.pt", "trial_result.json")
    _same_run({"history": [{**r, "note": "x"} for r in mine]}, record, "state.pt", "trial_result.json")


def test_a_run_that_cannot_save_leaves_nothing_and_the_same_command_runs_again(tmp_path, capsys, monkeypatch):
    """2026-12-07 probe: a disk that filled while the run was saved left its gallery and checksum list without a
    checkpoint; the advice ("run the command again") was then refused (`--out` already holds a run)."""
    import errno

    from cem_bench.core import checkpoint
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    real = checkpoint.save_run

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint, "save_run", full)
    assert main(["train", *_sets(TINY_RMLE), "--out", str(out)]) == 2
    assert "no space left" in capsys.readouterr().err.lower()
    assert sorted(os.listdir(out)) == ["notes.txt"]           # its own files gone, the user's kept
    monkeypatch.setattr(checkpoint, "save_run", real)
    assert main(["train", *_sets(TINY_RMLE), "--out", str(out)]) == 0
    assert (out / "checkpoint.pt").is_file() and (out / "notes.txt").read_text() == "mine"
    # a search's experiment folder is no run's folder: its checksum list would record the run's files
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "search_space.json").write_text("{}")
    assert main(["train", *_sets(TINY_RMLE), "--out", str(exp)]) == 2
    assert "holds cem-bench results of another kind (search_space.json)" in capsys.readouterr().err
    assert sorted(os.listdir(exp)) == ["search_space.json"]
    report = tmp_path / "report"   # a report's folder (2026-12-07 probe: the run's files joined the page's)
    report.mkdir()
    (report / ".cem-bench-report-files").write_text("[]")
    assert main(["train", *_sets(TINY_RMLE), "--out", str(report)]) == 2
    assert "holds cem-bench results of another kind (.cem-bench-report-files)" in capsys.readouterr().err
    assert os.listdir(report) == [".cem-bench-report-files"]
    # a re-attack that cannot write its record leaves no attack-* folder behind
    from cem_bench import storage
    monkeypatch.setattr(storage, "write_bytes", full)
    assert main(["attack", str(out), "--set", "attack.names=[rmle]"]) == 2
    assert not [d for d in os.listdir(out) if d.startswith("attack-")]


def test_report_out_takes_a_new_empty_or_earlier_report_folder_only(tmp_path, capsys):
    """2026-12-07 probe: `report --out` replaced a site's own index.html and configs.csv without a word, and took
    the results folder, a trial folder and `/` (14 files written there)."""
    import shutil
    exp = tmp_path / "exp"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "format1", "experiment"), exp)
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("MY PAGE")
    assert main(["report", str(exp), "--out", str(site)]) == 2
    err = capsys.readouterr().err
    assert "holds files that are not a cem-bench report (index.html)" in err and "Nothing was written" in err
    assert (site / "index.html").read_text() == "MY PAGE"
    assert main(["report", str(exp), "--out", str(exp)]) == 2          # the results folder itself
    assert "not a cem-bench report" in capsys.readouterr().err
    new = tmp_path / "new"
    (new / "source").mkdir(parents=True)   # what a report of object storage fetched before it stopped
    assert main(["report", str(exp), "--out", str(new)]) == 0
    assert main(["report", str(exp), "--out", str(new)]) == 0          # an earlier report: drawn again



def test_the_default_report_folder_and_a_file_uri_out_are_checked_as_out_is(tmp_path, capsys, monkeypatch):
    """2026-12-07 probe: without --out, a user's own index.html and configs.csv in RESULTS/report were replaced
    (the same folder named by --out was refused); `--out file:///abs` wrote into a folder named "file:" in the
    current one."""
    import shutil
    exp = tmp_path / "exp"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "format1", "experiment"), exp)
    (exp / "report").mkdir()
    (exp / "report" / "index.html").write_text("MY NOTES")
    assert main(["report", str(exp)]) == 2
    err = capsys.readouterr().err
    assert f"the report's folder {exp / 'report'} (the default, RESULTS/report; --out names another) holds files " \
           f"that are not a cem-bench report (index.html)" in err and "Nothing was written" in err, err
    assert (exp / "report" / "index.html").read_text() == "MY NOTES"
    (exp / "report" / "index.html").unlink()
    assert main(["report", str(exp)]) == 0 and main(["report", str(exp)]) == 0   # empty, then an earlier report
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(exp), "--out", f"file://{tmp_path / 'u'}"]) == 0
    assert (tmp_path / "u" / "index.html").is_file() and not (tmp_path / "file:").exists()
    assert main(["report", str(exp), "--out", "s3://bucket/r"]) == 2
    assert "a report is written to a folder of this machine" in capsys.readouterr().err
    assert main(["report", str(exp / "trials.parquet")]) == 2      # a file: said as before the check was added
    err = capsys.readouterr().err
    assert "trials.parquet" in err and "cannot be listed" not in err, err


@pytest.mark.parametrize("sets, says", [
    (["train.device=cuda:5"], "CUDA is not available"),
    (["cem.lambd=4", "cem.strength=fixed", "cem.loss_scale=0"], "multiplies the CEM loss by zero"),
    (["train.cuda_graph=on", "train.device=auto"], "train.cuda_graph=on needs a CUDA device"),
    (["train.epochs=1", "cem.lambd=4"], "is not below train.epochs 1"),
    (["data.dataset=synthetic", "data.train_size=5000000"], "synthetic images would need about"),
])
def test_a_train_refused_by_its_own_checks_prints_no_first_line(tmp_path, capsys, monkeypatch, sets, says):
    """2026-12-07 probe: these were refused after the run's first line ("cem-bench train: ... output in DIR"), a
    folder then never written. The refusal comes alone now, and nothing is made."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # the CPU machine CI is, on any machine
    dataset = [] if any(s.startswith("data.dataset=") for s in sets) else ["--set", "data.dataset=digits"]
    argv = ["train", *dataset, *[a for s in sets for a in ("--set", s)],
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert says in err and out == "", (out, err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("sets, says", [
    (["cem.lambd=4", "cem.strength_every=1"], "cem.strength_every is read by a matched strength (cem.strength=matched), "
                                              "and this run's is fixed"),
    (["cem.lambd=4", "cem.strength=fixed", "cem.surrogate=slot_cross", "cem.strength_batches=7"],
     "cem.strength_batches is read by a matched strength"),
    (["train.milestones=[0.5]", "train.milestones_epochs=[2]"], "train.milestones is replaced by "
                                                                 "train.milestones_epochs, which is set"),
    (["data.root=/elsewhere"], "data.root is read for cifar10 and cifar100 only, and this run's data.dataset is "
                               "digits"),
])
def test_a_train_set_another_setting_leaves_unread_is_refused(tmp_path, capsys, sets, says):
    """2026-12-07 probe: these were taken, and the run changed nothing and recorded nothing of them."""
    argv = ["train", "--set", "data.dataset=digits", *[a for s in sets for a in ("--set", s)],
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Nothing was trained" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, flag", [
    (["train", "--config", "{d}/a.yaml", "--config", "{d}/b.yaml"], "--config"),   # trained b's keys alone
    (["train", "--out", "{d}/r1", "--out={d}/r2"], "--out"),
    (["train", "--threads", "1", "--threads", "2"], "--threads"),
    (["report", "{d}", "--out", "{d}/a", "--out", "{d}/b"], "--out"),
    (["table", "{d}", "--metrics", "test_acc", "--metrics", "attack_ssim"], "--metrics"),
    (["replay", "{d}", "--orders", "2", "--orders", "3"], "--orders"),
])
def test_an_option_that_keeps_one_value_given_twice_is_refused(argv, flag, tmp_path, capsys, monkeypatch):
    """2026-12-07 probe: argparse kept the last of a repeated --config (a run at b's keys and the defaults a had
    set, 240 epochs at width 1 where a asked 1 at 0.0625), --out, --threads, --orders without a word."""
    from cem_bench.core import trial
    monkeypatch.setattr(trial, "run_trial", lambda *a, **k: pytest.fail("the work started"))
    (tmp_path / "a.yaml").write_text("train.epochs: 1\n")
    (tmp_path / "b.yaml").write_text("train.lr: 0.01\n")
    with pytest.raises(SystemExit) as e:
        main([a.format(d=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{flag} given 2 times; an option that keeps one value takes it once" in err, err
    assert not any(p.name.startswith(("r1", "r2", "a", "b")) and p.is_dir() for p in tmp_path.iterdir())


def test_options_that_gather_may_repeat_and_a_subcommand_s_own_are_its_own():
    """--set gathers (given once per key), and is not refused as repeated."""
    from cem_bench.cli import make_parser
    args = make_parser().parse_args(["train", "--set", "seed=1", "--set", "seed=2", "--out", "x"])
    assert args.set == ["seed=1", "seed=2"] and args.out == "x"


def test_attack_on_a_missing_path_says_no_such_folder(tmp_path, capsys):
    """2026-12-07 probe: `attack MISSING` said "is not a folder" where table and replay say "no such folder"."""
    assert main(["attack", str(tmp_path / "nope")]) == 2
    assert f"{tmp_path / 'nope'}: no such folder: RUN_DIR must be" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main(["attack", str(tmp_path / "afile")]) == 2
    assert f"{tmp_path / 'afile'} is not a folder: RUN_DIR must be" in capsys.readouterr().err


@pytest.mark.parametrize("sets, says", [
    (["data.root=/elsewhere"], "search --set: data.root is read for cifar10 and cifar100 only, and this run's "
                               "data.dataset is digits: no trial of this space would read it"),
    (["cem.num_slots=4"], "cem.num_slots is read by attention_centroid, serial_enhanced, slot_cross, not by "
                          "cem.surrogate=gmm"),
    (["attack.names=[decoder]", "attack.rmle_iterations=4"], "attack.rmle_iterations is read by rmle, which "
                                                             "attack.names=['decoder'] does not run"),
    (["train.milestones=[0.5]", "train.milestones_epochs=[1]"], "train.milestones is replaced by "
                                                                "train.milestones_epochs"),
])
def test_search_set_refuses_a_key_no_trial_of_the_space_reads(sets, says, tmp_path, capsys):
    """`search --set` took what `train --set` refuses (a key nothing reads), listed it among the fixed keys and
    recorded it in every trial (2026-12-07 probe). A λ = 0 cell reads no surrogate's key either: gmm's space with
    λ ∈ {0, 16} does not make cem.num_slots read."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    space = os.path.join(root, "search_spaces", "noise_alone_matched_acc_digits.yaml")   # gmm, λ 0 and 16, digits
    argv = ["search", space, "--storage", str(tmp_path / "res"), "--dry-run"]
    rc = main([*argv, *(a for s in sets for a in ("--set", s))])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Nothing was started" in err, err
    assert main([*argv, "--set", "train.epochs=9"]) == 0   # a key the trials read is taken
    assert not (tmp_path / "res").exists()
