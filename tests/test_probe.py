"""The privacy probe during training (issue 26 item 1): ``attack.probe_*`` keys, ``trial.probe`` and its epoch
records; a run with probes trains exactly as one without."""

import json
import math

import pytest
import torch
from conftest import TINY, TINY_RMLE, build_tiny

from cem_bench.config import ConfigError, TrialConfig
from cem_bench.core.trial import PROBE_KEYS, probe, probe_config, run_trial

# rmle only, short, so that each tiny trial takes a few seconds
FAST = {"attack.names": ["rmle"], "attack.rmle_iterations": 5, "attack.probe_iterations": 5,
        "attack.probe_images": 8}


def test_probe_keys_default_to_no_probe_and_validate():
    cfg = TrialConfig()
    assert cfg.attack.probe_epochs == [] and cfg.attack.probe_images == 64 and cfg.attack.probe_iterations == 30
    assert TrialConfig.from_flat({"attack.probe_epochs": "[3, 1]"}).attack.probe_epochs == [3, 1]
    for bad in ("[0]", "[-1, 2]", "[2, 2]"):
        with pytest.raises(ConfigError, match=r"attack.probe_epochs: .* must be positive integers, each listed once"):
            TrialConfig.from_flat({"attack.probe_epochs": bad})
    for bad in ("[1.5]", "[true]", "three"):
        with pytest.raises(ConfigError, match="attack.probe_epochs"):
            TrialConfig.from_flat({"attack.probe_epochs": bad})
    for k in ("attack.probe_images", "attack.probe_iterations"):
        with pytest.raises(ConfigError, match=k):
            TrialConfig.from_flat({k: 0})


def test_probe_config_is_rmle_with_the_probe_s_iterations_and_one_start():
    from cem_bench.core.trial import build_config
    cfg = build_config({"attack.names": ["decoder"], "attack.probe_iterations": 7, "defense.noise_std": 0.1})
    pc = probe_config(cfg)
    assert pc.attack.names == ["rmle"] and pc.attack.rmle_iterations == 7 and pc.attack.rmle_restarts == 1
    from cem_bench.attacks.rmle import auto_tv_weight
    assert pc.attack.rmle_tv_weight == pytest.approx(auto_tv_weight(0.1))      # rmle's own default
    own = build_config({"attack.names": ["rmle"], "attack.rmle_lr": 0.3, "attack.rmle_restarts": 3})
    assert probe_config(own).attack.rmle_lr == 0.3 and probe_config(own).attack.rmle_restarts == 1


def test_probe_is_deterministic_and_moves_no_random_stream_nor_the_encoder_state():
    cfg, splits, trainer = build_tiny(**FAST)
    enc = trainer.client
    enc.train()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    rng, gen = torch.get_rng_state(), trainer.gen.get_state()
    a = probe(cfg, enc, splits, cfg.defense.noise_std, torch.device("cpu"))
    b = probe(cfg, enc, splits, cfg.defense.noise_std, torch.device("cpu"))
    assert set(a) == set(PROBE_KEYS)
    assert a["probe_ssim"] == b["probe_ssim"] and a["probe_psnr"] == b["probe_psnr"]
    assert -1.0 <= a["probe_ssim"] <= 1.0 and a["probe_s"] > 0
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(trainer.gen.get_state(), gen)
    assert enc.training and all(p.requires_grad and p.grad is None for p in enc.parameters())
    after = enc.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)      # BatchNorm statistics included
    enc.eval()
    probe(cfg, enc, splits, cfg.defense.noise_std, torch.device("cpu"))
    assert not enc.training


def _trial(**flat):
    """(result, final trainer state, reported records) of a TINY trial."""
    seen: dict = {"records": []}

    def report(record, final, state_fn=None):
        if final:
            seen["state"] = state_fn()
        else:
            seen["records"].append(dict(record))

    result = run_trial({**TINY, **FAST, **flat}, report)
    return result, seen["state"], seen["records"]


def test_probe_epochs_record_the_probe_and_training_is_bit_identical_without():
    res, state, reports = _trial(**{"train.epochs": 3, "attack.probe_epochs": [3, 1, 9]})   # 9 never comes
    history = res["info"]["history"]
    assert [r["epoch"] for r in history] == [1, 2, 3]
    for rec, rep in zip(history, reports):
        assert set(PROBE_KEYS) <= set(rec) and set(PROBE_KEYS) <= set(rep)      # every record has the keys
        if rec["epoch"] in (1, 3):
            assert math.isfinite(rec["probe_ssim"]) and -1.0 <= rec["probe_ssim"] <= 1.0
            assert math.isfinite(rec["probe_psnr"]) and rec["probe_s"] > 0
            assert rep["probe_ssim"] == rec["probe_ssim"]
        else:
            assert math.isnan(rec["probe_ssim"]) and math.isnan(rep["probe_ssim"]) and rec["probe_s"] == 0.0

    plain, pstate, preports = _trial(**{"train.epochs": 3})
    assert not any(k in r for r in plain["info"]["history"] + preports for k in PROBE_KEYS)
    # the probes moved nothing the training uses: same losses, same weights, same final attack
    strip = lambda h: [{k: v for k, v in r.items() if k not in PROBE_KEYS and not k.endswith("_s")}  # noqa: E731
                       for r in h]
    assert strip(history) == strip(plain["info"]["history"])
    for part in ("client", "server"):
        assert all(torch.equal(v, pstate[part][k]) for k, v in state[part].items()), part
    assert torch.equal(state["gen"], pstate["gen"])
    assert res["attack_ssim"] == plain["attack_ssim"]


def test_a_probe_at_the_last_epoch_estimates_the_final_attack_of_the_same_images():
    """With the probe's images and iterations equal to rmle's, the last epoch's probe is rmle on those images."""
    n = 10
    res, _, _ = _trial(**{"attack.probe_epochs": [TINY["train.epochs"]], "attack.probe_images": n,
                          "attack.probe_iterations": 5})
    cfg, splits, _ = build_tiny(**FAST)
    assert len(splits.attack_eval) == n                         # the inference protocol: test[90%:] = 10 images
    assert res["info"]["history"][-1]["probe_ssim"] == pytest.approx(res["attack_ssim"], abs=1e-6)


def test_cli_train_records_the_probe(tmp_path, capsys):
    from cem_bench.cli import main
    out = tmp_path / "run"
    sets = []
    for k, v in {**TINY_RMLE, **FAST, "attack.probe_epochs": [2]}.items():
        sets += ["--set", f"{k}={json.dumps(v) if isinstance(v, list) else v}"]
    assert main(["train", *sets, "--out", str(out)]) == 0
    assert "epoch   2" in capsys.readouterr().out
    history = json.loads((out / "metrics.json").read_text())["info"]["history"]
    assert history[0]["probe_ssim"] is None or math.isnan(history[0]["probe_ssim"])     # JSON has no NaN
    assert -1.0 <= history[1]["probe_ssim"] <= 1.0 and history[1]["probe_s"] > 0


def test_bench_row_times_one_probe_against_an_epoch():
    from cem_bench.bench import attack as attack_mod
    from cem_bench.bench import harness
    from cem_bench.core import models
    from cem_bench.core.trial import build_config
    device = torch.device("cpu")
    sizes = harness.sizes_for(device, quick=True, tiny=True)
    cfg = build_config(harness.step_config(sizes, device, **{"cem.lambd": 0.0, "attack.probe_images": 8,
                                                             "attack.probe_iterations": 3}))
    splits = harness.synthetic_splits(20, 20, device)
    client, _ = models.build(cfg.model, splits.num_classes, splits.image_shape)
    (r,) = attack_mod._probe_rows(device, client.eval(), cfg, sizes)
    assert r["name"].startswith("privacy probe: rmle, 8 images x 3 iterations") and r["error"] is None
    # both timed, and their ratio is the row's; which is larger is a measurement (the bench reports it), not
    # something a test on a busy machine may assert
    assert r["value"] > 0 and r["baseline"] > 0 and r["ratio"] == pytest.approx(r["value"] / r["baseline"])
    assert harness.MEASURED["probe_s"] == r["value"] and not client.training
