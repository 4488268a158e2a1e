"""scripts/reattack.py: a search's trials re-attacked, joined and tested. The attacks themselves are
`cem-bench attack`'s (tests/test_cli.py); here the folders are written as that command writes them, and what
the script does with them is checked: which trials it skips, the worst case over old and new attacks, and its
tests against scipy's paired t with the project's Holm."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cem_bench.analysis.noise import holm


@pytest.fixture(scope="module")
def reattack():
    spec = importlib.util.spec_from_file_location("reattack_under_test", "scripts/reattack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attack_config(seed: int, **keys) -> dict:
    """What `cem-bench attack` records in attack.json: the trial's config with the --set keys, resolved."""
    from cem_bench.core.trial import build_config
    return build_config({"seed": seed, **keys}).to_flat()


@pytest.fixture(autouse=True)
def trial_configs(reattack, monkeypatch):
    """Each fake trial's own config (the seed in its folder's name; every other key a default), where the script
    reads a real trial's from its checkpoint."""
    monkeypatch.setattr(reattack, "trial_config", lambda trial: {"seed": int(str(trial).rsplit("_", 1)[1])})


def experiment(tmp_path):
    """6 ok trials (λ 0 and 64, seeds 1-3) and one error row; each ok trial re-attacked once at 16 decoder epochs
    and once at 2, the 16-epoch decoder stronger than rmle at λ 64 only."""
    rng = np.random.default_rng(0)
    rows = []
    for lam in (0.0, 64.0):
        for seed in (1, 2, 3):
            d = f"cem_trial_{int(lam)}_{seed}"
            dec, rml = 0.40 - lam / 2000 + rng.normal(0, 0.005), 0.42 - lam / 4000 + rng.normal(0, 0.005)
            rows.append({"trial_id": d[-6:], "trial_dir": d, "status": "ok", "config.cem.lambd": lam, "config.seed": seed,
                         "config_id": f"c{int(lam)}",
                         "test_acc": 0.8 + rng.normal(0, 0.01), "attack_ssim__decoder": dec,
                         "attack_ssim__rmle": rml, "attack_ssim": max(dec, rml)})
            for i, epochs in enumerate((16, 2)):
                out = tmp_path / d / f"attack-20261201-00000{i}"
                out.mkdir(parents=True)
                strong = dec + (0.04 if epochs == 16 else -0.1)
                out.joinpath("attack.json").write_text(json.dumps(
                    {"attack_ssim__decoder": strong, "attack_ssim": strong,
                     "config": attack_config(seed, **{"attack.names": ["decoder"], "attack.epochs": epochs})}))
    rows.append({"trial_id": "err", "trial_dir": "cem_trial_err", "status": "error", "config.cem.lambd": 0.0,
                 "config.seed": 9})
    pd.DataFrame(rows).to_parquet(tmp_path / "trials.parquet")
    return pd.DataFrame(rows[:-1])


def test_the_worst_case_takes_the_new_attack_and_the_tests_are_paired_t_with_holm(reattack, tmp_path, capsys):
    trials = experiment(tmp_path)
    sets = ["attack.names=[decoder]", "attack.epochs=16"]
    assert reattack.main([str(tmp_path), *(a for s in sets for a in ("--set", s)), "--summarise",
                          "--paired", "R1 worst_attack_ssim lower config.cem.lambd=64 config.cem.lambd=0",
                          "--within", "R2 re_attack_ssim__decoder higher attack_ssim__rmle config.cem.lambd=64",
                          "--out", str(tmp_path / "joined.parquet")]) == 0
    out = capsys.readouterr().out
    df = pd.read_parquet(tmp_path / "joined.parquet")
    assert len(df) == 6 and "cem_trial_err" not in set(df["trial_dir"])          # ok trials only
    assert (df["re_attack_ssim__decoder"] == df["attack_ssim__decoder"] + 0.04).all()   # the 16-epoch folder
    assert np.allclose(df["worst_attack_ssim"],
                       df[["attack_ssim__decoder", "attack_ssim__rmle", "re_attack_ssim__decoder"]].max(axis=1))
    worst = trials.assign(w=np.maximum(trials["attack_ssim"], trials["attack_ssim__decoder"] + 0.04))
    a, b = (worst[worst["config.cem.lambd"] == lam].set_index("config.seed")["w"] for lam in (64.0, 0.0))
    p1 = stats.ttest_rel(a, b, alternative="less").pvalue
    hi = trials[trials["config.cem.lambd"] == 64.0]
    p2 = stats.ttest_rel(hi["attack_ssim__decoder"] + 0.04, hi["attack_ssim__rmle"], alternative="greater").pvalue
    adjusted = holm([p1, p2])
    assert f"R1: worst_attack_ssim: config.cem.lambd=64 lower than config.cem.lambd=0: {(a - b).mean():+.3f}" in out
    assert f"p {p1:.2g}, Holm over 2 {adjusted[0]:.2g}" in out and f"p {p2:.2g}, Holm over 2 {adjusted[1]:.2g}" in out


def test_trials_re_attacked_with_these_settings_are_skipped(reattack, tmp_path, capsys, monkeypatch):
    experiment(tmp_path)
    (tmp_path / "cem_trial_64_3" / "attack-20261201-000000" / "attack.json").unlink()   # its 16-epoch run lost
    ran = []
    monkeypatch.setattr(reattack.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or type("R", (), {"returncode": 0, "stderr": ""})())
    assert reattack.main([str(tmp_path), "--set", "attack.names=[decoder]", "--set", "attack.epochs=16"]) == 0
    assert [cmd[4] for cmd in ran] == [str(tmp_path / "cem_trial_64_3")]
    assert cmd_sets(ran[0]) == ["attack.names=[decoder]", "attack.epochs=16"]
    assert "6 ok trials, 5 already re-attacked with these settings, 1 to go" in capsys.readouterr().out
    ran.clear()   # --where: only that configuration's trials, here none of them left to re-attack
    assert reattack.main([str(tmp_path), "--set", "attack.names=[decoder]", "--set", "attack.epochs=16",
                          "--where", "config.cem.lambd=0"]) == 0
    assert ran == [] and "3 ok trials, 3 already re-attacked" in capsys.readouterr().out


def test_a_relative_experiment_folder_reaches_each_re_attack_whole(reattack, tmp_path, capsys, monkeypatch):
    """Each re-attack runs with the repository as its folder: a relative experiment path named another folder
    there, and every trial failed ("no such folder"), one subprocess each (2026-12-07 probe)."""
    experiment(tmp_path)
    (tmp_path / "cem_trial_64_3" / "attack-20261201-000000" / "attack.json").unlink()
    ran = []
    monkeypatch.setattr(reattack.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or type("R", (), {"returncode": 0, "stderr": ""})())
    monkeypatch.chdir(tmp_path.parent)
    assert reattack.main([tmp_path.name, "--set", "attack.names=[decoder]", "--set", "attack.epochs=16"]) == 0
    assert [cmd[4] for cmd in ran] == [str(tmp_path / "cem_trial_64_3")]


def cmd_sets(cmd):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]


def test_an_attack_of_other_settings_is_not_this_one_and_set_values_are_read_as_the_cli_reads_them(
        reattack, tmp_path, capsys, monkeypatch):
    """An earlier attack matched when the --set keys alone agreed (one with 64 channels passed for this 32-channel
    re-attack, and --summarise reported it), and `attack.lr=1e-3` (a YAML string) never matched the float that
    attack.json holds, so every run re-attacked every trial again."""
    experiment(tmp_path)
    for d in tmp_path.glob("cem_trial_*_*"):
        for f in d.glob("attack-*/attack.json"):
            doc = json.loads(f.read_text())
            if doc["config"]["attack.epochs"] == 16:
                doc["config"] = attack_config(int(d.name.rsplit("_", 1)[1]), **{
                    "attack.names": ["decoder"], "attack.epochs": 16, "attack.channels": 64})
                f.write_text(json.dumps(doc))
    ran = []
    monkeypatch.setattr(reattack.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or type("R", (), {"returncode": 0, "stderr": ""})())
    sets = ["--set", "attack.names=[decoder]", "--set", "attack.epochs=16"]
    assert reattack.main([str(tmp_path), *sets]) == 0
    assert len(ran) == 6 and "0 already re-attacked" in capsys.readouterr().out
    assert reattack.main([str(tmp_path), *sets, "--set", "attack.channels=64"]) == 0
    assert "6 already re-attacked" in capsys.readouterr().out
    ran.clear()
    for d in tmp_path.glob("cem_trial_*_*"):
        out = d / "attack-20261202-000000"
        out.mkdir()
        out.joinpath("attack.json").write_text(json.dumps({"attack_ssim__decoder": 0.5, "attack_ssim": 0.5, "config":
            attack_config(int(d.name.rsplit("_", 1)[1]), **{"attack.names": ["decoder"], "attack.lr": 0.001})}))
    assert reattack.main([str(tmp_path), "--set", "attack.names=decoder", "--set", "attack.lr=1e-3"]) == 0
    assert ran == [] and "6 already re-attacked" in capsys.readouterr().out
    # the evaluation batch sets attack_ssim_paper's and attack_psnr_batch's batches: another one is another attack
    assert reattack.main([str(tmp_path), "--set", "attack.names=decoder", "--set", "attack.lr=1e-3",
                          "--set", "train.eval_batch_size=4"]) == 0
    assert len(ran) == 6 and "0 already re-attacked" in capsys.readouterr().out
    # train.device is "auto" on a GPU machine and a CPU alike: the device attack.json records decides (a bf16
    # re-attack on a GPU is another attack than this machine's)
    for f in tmp_path.glob("cem_trial_*_*/attack-20261202-000000/attack.json"):
        doc = json.loads(f.read_text())
        f.write_text(json.dumps({**doc, "info": {"device": "NVIDIA H100 80GB HBM3"}}))
    ran.clear()
    assert reattack.main([str(tmp_path), "--set", "attack.names=decoder", "--set", "attack.lr=1e-3"]) == 0
    assert len(ran) == 6 and "0 already re-attacked" in capsys.readouterr().out


def test_failed_attacks_exit_1_and_missing_trial_folders_stop_it_before_any(reattack, tmp_path, capsys, monkeypatch):
    experiment(tmp_path)
    ran = []
    monkeypatch.setattr(reattack.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or type("R", (), {"returncode": 2, "stderr": "boom"})())
    assert reattack.main([str(tmp_path), "--set", "attack.epochs=3"]) == 1
    assert "6 of 6 re-attacks failed" in capsys.readouterr().out
    ran.clear()
    import shutil
    shutil.rmtree(tmp_path / "cem_trial_0_2")
    assert reattack.main([str(tmp_path), "--set", "attack.epochs=3"]) == 2
    assert ran == [] and "1 trial folder(s) of trials.parquet are not in" in capsys.readouterr().err
    assert reattack.main([str(tmp_path / "nope"), "--set", "attack.epochs=3"]) == 2
    assert "holds no trials.parquet" in capsys.readouterr().err


def test_the_tests_are_the_reports_a_side_of_two_configurations_is_refused(reattack):
    """Its own t-tests pooled two configurations matching a side (each λ = 0 run reused twice), tested 2 pairs,
    and called a constant difference p 0 "holds"; they are now hypotheses.one_test's, adjusted as the report's."""
    rows = []
    for surr in ("gmm", "attention_centroid"):
        for seed in (0, 1, 2, 3):
            rows.append({"config.cem.lambd": 16.0, "config.cem.surrogate": surr, "config.seed": seed,
                         "config_id": surr, "m": 0.5 - 0.01 * seed, "n": 0.4})
    for seed in (0, 1, 2, 3):
        rows.append({"config.cem.lambd": 0.0, "config.cem.surrogate": "none", "config.seed": seed,
                     "config_id": "zero", "m": 0.6 + 0.01 * seed, "n": 0.4})
    df = pd.DataFrame(rows)
    with pytest.raises(SystemExit, match="matches 2 configurations"):
        reattack.tests(df, ["R1 m lower config.cem.lambd=16 config.cem.lambd=0"], [])
    t = reattack.tests(df, ["R1 m lower config.cem.lambd=16,config.cem.surrogate=gmm config.cem.lambd=0"],
                       ["R2 n higher n config.cem.lambd=0"])
    assert t.loc[0, "verdict"] == "holds" and t.loc[1, "verdict"] == "not tested: the runs do not vary"
    assert t.loc[1, "p_holm"] == 1.0       # an untested member counts in the family, as the report counts it
    few = reattack.tests(df[df["config.seed"] < 2], ["R1 m lower config.cem.lambd=16,config.cem.surrogate=gmm "
                                                     "config.cem.lambd=0"], [])
    assert few.loc[0, "verdict"] == "not tested: 2 seeds both sides ran (needs 3)"


def test_a_trial_whose_record_cannot_be_read_fails_alone(reattack, tmp_path, capsys, monkeypatch):
    """Reading every trial's settings first, one unreadable trial (no trial_result.json, say) stopped every
    re-attack with rc 2; it now fails alone (rc 1), the others run, and --summarise says which to leave out."""
    experiment(tmp_path)
    real = reattack.trial_config

    def one_broken(trial):
        if trial.name == "cem_trial_64_2":
            raise ValueError(f"{trial}/trial_result.json cannot be read")
        return real(trial)
    monkeypatch.setattr(reattack, "trial_config", one_broken)
    ran = []
    monkeypatch.setattr(reattack.subprocess, "run",
                        lambda cmd, **kw: ran.append(cmd) or type("R", (), {"returncode": 0, "stderr": ""})())
    assert reattack.main([str(tmp_path), "--set", "attack.epochs=3"]) == 1
    out = capsys.readouterr().out
    assert len(ran) == 5 and "FAILED cem_trial_64_2" in out and "1 of 6 re-attacks failed" in out, out
    with pytest.raises(SystemExit, match="leave its configuration out with --where"):
        reattack.main([str(tmp_path), "--set", "attack.names=[decoder]", "--set", "attack.epochs=16", "--summarise"])


def test_the_trials_own_config_is_read_from_its_record(reattack, tmp_path):
    """From trial_result.json's info.config, not the checkpoint (whose weights were read for every trial, and
    which a trial run with train.select_best_last cannot give)."""
    d = tmp_path / "cem_trial_0_1"
    d.mkdir()
    (d / "trial_result.json").write_text(json.dumps({"status": "ok", "info": {"config": {"seed": 1,
                                                                                          "attack.epochs": 7}}}))
    import importlib.util
    spec = importlib.util.spec_from_file_location("reattack_fresh", "scripts/reattack.py")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.trial_config(d) == {"seed": 1, "attack.epochs": 7}
    (d / "trial_result.json").write_text("{}")
    with pytest.raises(ValueError, match="has no resolved config"):
        fresh.trial_config(d)


@pytest.mark.parametrize("argv, says", [
    # a sealed results table replaced with exit 0 (2026-12-07 probe): every later read of the folder failed
    (["--summarise", "--out", "{exp}/trials.parquet"], "exists and is a file of the cem-bench results"),
    (["--summarise", "--out", "{exp}"], "is a folder"),
    (["--out", "{exp}/x.parquet"], "only with --summarise"),
    (["--where", "nosuch=1"], "'nosuch=1' is not KEY=VALUE of a column of trials.parquet"),
    (["--where", "config.cem.lambd=[1"], "'[1' is not a value"),
    (["--summarise", "--by", "nosuch"], "--by nosuch: not a column of trials.parquet"),
    (["--summarise", "--paired", "R1 worst_attack_ssim lower"], "give five fields, NAME METRIC CLAIM A B"),
    (["--set", "train.epochs=3"], "--set train.epochs: a re-attack changes only attack.* keys"),
])
def test_options_that_cannot_work_are_refused_before_any_attack(reattack, tmp_path, capsys, monkeypatch, argv, says):
    """Each was a traceback (some after the summary had printed), a subprocess failing once per trial, or a
    file written over; each is now one line and exit 2, with nothing run and nothing written."""
    from cem_bench import integrity
    experiment(tmp_path)
    integrity.write_recorded(str(tmp_path), "trials.parquet", (tmp_path / "trials.parquet").read_bytes())
    before = (tmp_path / "trials.parquet").read_bytes()
    ran = []
    monkeypatch.setattr(reattack.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    argv = [a.format(exp=tmp_path) for a in argv]
    sets = [] if "--set" in argv else ["--set", "attack.epochs=3"]
    assert reattack.main([str(tmp_path), *sets, *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert ran == [] and (tmp_path / "trials.parquet").read_bytes() == before


@pytest.mark.parametrize("flag", ["--jobs", "--threads"])
def test_jobs_and_threads_are_whole_numbers_from_1(reattack, tmp_path, capsys, flag):
    experiment(tmp_path)
    with pytest.raises(SystemExit) as e:
        reattack.main([str(tmp_path), "--set", "attack.epochs=3", flag, "0"])
    assert e.value.code == 2 and "'0' is not a whole number >= 1" in capsys.readouterr().err
