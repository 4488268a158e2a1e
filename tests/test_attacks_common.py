"""Checks every registered attack gets (parametrised over ``attacks.names()``), and the rmle attack's own."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY

from cem_bench import attacks
from cem_bench.core.metrics import ssim_per_image
from cem_bench.core.trial import build, build_config
from cem_bench.schema import ATTACK_METRICS

FAST = {"attack.rmle_iterations": 40, "attack.epochs": 1, "data.test_size": 160}   # 16 evaluation images


def setup(kind: str, **flat):
    cfg = build_config({**TINY, **FAST, "attack.names": [kind], "cem.lambd": 0, **flat})
    splits, trainer = build(cfg, torch.device("cpu"))
    return cfg, splits, trainer.client


@pytest.mark.parametrize("name", attacks.names())
def test_every_attack_scores_leaves_the_encoder_alone_and_repeats(name):
    cfg, splits, client = setup(name)
    client.train()
    before = {k: v.clone() for k, v in client.state_dict().items()}
    res = attacks.build(cfg).run(client, splits, cfg.defense.noise_std, "cpu")
    assert set(ATTACK_METRICS) <= set(res.metrics) and all(math.isfinite(res.metrics[k]) for k in ATTACK_METRICS)
    assert client.training and all(p.requires_grad for p in client.parameters())
    assert all(torch.equal(before[k], v) for k, v in client.state_dict().items())
    assert res.originals.shape == res.reconstructions.shape and res.originals.shape[1:] == (3, 32, 32)
    again = attacks.build(cfg).run(client, splits, cfg.defense.noise_std, "cpu")
    assert again.metrics == res.metrics                       # seeded: the same attack gives the same numbers


def _ssim(x, y) -> float:
    return float(ssim_per_image(x, y).mean())


def test_rmle_beats_a_constant_image_and_noise():
    """On an undefended (here untrained) encoder at sigma = 0.01, rmle's reconstructions are closer (SSIM) to the
    images than each image's own mean colour (the best constant image) and than random pixels. Measured with
    these defaults: 0.41 against 0.31 for the constant; on a trained lambda = 0 encoder 0.59 (docs/attacks.md)."""
    cfg, splits, client = setup("rmle", **{"defense.noise_std": 0.01, "attack.rmle_iterations": 150})
    res = attacks.build(cfg).run(client, splits, 0.01, "cpu")
    target = res.originals
    noise = torch.rand(target.shape, generator=torch.Generator().manual_seed(0))
    constant = target.mean(dim=(2, 3), keepdim=True).expand_as(target)
    got = _ssim(res.reconstructions, target)
    assert got > _ssim(constant, target) + 0.03, (got, _ssim(constant, target))
    assert got > _ssim(noise, target) + 0.2, got


def test_rmle_is_worse_with_more_noise():
    quiet_cfg, splits, client = setup("rmle", **{"attack.rmle_iterations": 100})
    quiet = attacks.build(quiet_cfg).run(client, splits, 0.01, "cpu").metrics["attack_ssim"]
    loud = attacks.build(quiet_cfg).run(client, splits, 1.0, "cpu").metrics["attack_ssim"]
    assert loud < quiet - 0.02, (quiet, loud)


def test_rmle_keeps_the_best_restart():
    from cem_bench.attacks.rmle import RMLEAttack
    cfg, splits, client = setup("rmle", **{"attack.rmle_restarts": 3, "attack.rmle_iterations": 20})
    client.eval().requires_grad_(False)
    x = splits.normalize(splits.attack_eval.images[:4])
    z = client(x).float()
    gen = torch.Generator().manual_seed(0)
    att = RMLEAttack(cfg)
    norm = lambda im: (im - splits.mean) / splits.std  # noqa: E731
    _, fit3 = att.invert(client, z, norm, (3, 32, 32), gen, 0.01)
    one = RMLEAttack(build_config({**TINY, **FAST, "attack.names": ["rmle"], "attack.rmle_iterations": 20}))
    _, fit1 = one.invert(client, z, norm, (3, 32, 32), torch.Generator().manual_seed(0), 0.01)
    assert (fit3 <= fit1 + 1e-6).all()                         # the grey start is one of the three


def test_rmle_gives_every_image_the_same_draws_at_any_batch_size():
    """docs/metrics.md: only attack_psnr_batch changes with rmle_batch_size (the rest by float rounding).
    The noise and the starts were drawn batch by batch until 2026-12-06, so an image's draws, and the
    per-image metrics, depended on its batch; one batch (16 images here) gives the draws of before."""
    flat = {"attack.rmle_iterations": 10, "attack.rmle_restarts": 2}
    got = {}
    for bs in (16, 5):
        cfg, splits, client = setup("rmle", **flat, **{"attack.rmle_batch_size": bs})
        got[bs] = attacks.build(cfg).run(client, splits, cfg.defense.noise_std, "cpu")
    assert len(got[16].originals) == 16
    # equal to float rounding (a convolution of 5 images sums in another order than one of 16): drawn batch by
    # batch, pixels differed by up to 0.25 and the metrics by about 1e-3
    torch.testing.assert_close(got[16].reconstructions, got[5].reconstructions, rtol=0, atol=1e-4)
    for k in ("attack_ssim", "attack_mse", "attack_psnr", "attack_ssim_paper"):
        assert got[16].metrics[k] == pytest.approx(got[5].metrics[k], rel=1e-6), k


# ------------------------------------------------------------------------------------- several attacks per trial
def test_worst_case_takes_the_strongest_attack_per_metric():
    per = {"decoder": {"attack_ssim": 0.6, "attack_psnr": 14.0, "attack_mse": 0.05, "attack_ssim_paper": 0.5},
           "rmle": {"attack_ssim": 0.3, "attack_psnr": 16.0, "attack_mse": 0.04, "attack_ssim_paper": math.nan}}
    worst, by = attacks.worst_case(per)
    assert worst == {"attack_ssim": 0.6, "attack_psnr": 16.0, "attack_mse": 0.04, "attack_ssim_paper": 0.5}
    assert by == {"attack_ssim": "decoder", "attack_psnr": "rmle", "attack_mse": "rmle",
                  "attack_ssim_paper": "decoder"}                 # a NaN never wins
    worst, by = attacks.worst_case({"a": {"attack_ssim": math.nan}, "b": {"attack_ssim": math.nan}})
    assert math.isnan(worst["attack_ssim"]) and by["attack_ssim"] == ""
    _, by = attacks.worst_case({"b": {"attack_mse": 0.1}, "a": {"attack_mse": 0.1}})
    assert by["attack_mse"] == "b"                                 # a tie goes to the first listed


def test_attacks_cannot_share_a_key(monkeypatch):
    from dataclasses import dataclass

    from cem_bench import keys as keys_mod
    from cem_bench.keys import key
    from cem_bench.registry import Registry
    monkeypatch.setattr(keys_mod, "_PLUGIN_SPECS", {})      # a private key table: nothing leaks into the real one
    monkeypatch.setattr(keys_mod, "_NAMES", {})
    reg = Registry("attack", "cem_bench.attacks", key="attack.test_names", shared_keys=False)

    @dataclass(frozen=True)
    class K:
        lr: float = key(0.1, "lr")

    reg.register("one")(type("One", (), {"Keys": K}))
    with pytest.raises(ValueError, match="attack.lr: attack 'two' declares it, but 'one' already does"):
        reg.register("two")(type("Two", (), {"Keys": K}))


def test_a_trial_runs_every_attack_and_records_the_worst_case(tmp_path):
    from PIL import Image

    from cem_bench.core.trial import run_trial
    res = run_trial({**TINY, "cem.lambd": 0, "attack.names": ["rmle", "decoder"]}, out_dir=str(tmp_path))
    for m in ATTACK_METRICS:
        own = {a: res[attacks.per_attack_column(m, a)] for a in ("decoder", "rmle")}
        assert all(math.isfinite(v) for v in own.values())
        strongest = min(own.values()) if m == "attack_mse" else max(own.values())
        assert res[m] == strongest and own[res[attacks.strongest_column(m)]] == strongest
    assert res["attack_s"] == pytest.approx(res["attack_s__decoder"] + res["attack_s__rmle"])
    assert {h["attack"] for h in res["info"]["attack_history"]} == {"decoder", "rmle"}
    # the gallery: the originals, then rmle's row, then the decoder's (attack.names order), 2x scale + padding
    assert res["info"]["gallery"] == "recon.png"   # its name in the run's folder, as a search trial records it
    h = Image.open(tmp_path / res["info"]["gallery"]).size[1]
    assert h == 3 * (2 * 32 + 2) + 2


def test_a_skipped_attack_still_has_every_column():
    from cem_bench.core.trial import run_trial
    res = run_trial({**TINY, "cem.lambd": 0, "attack.min_accuracy_margin": 1.0})
    assert res["attack_skipped"]
    for a in ("decoder", "rmle"):
        assert math.isnan(res[attacks.per_attack_column("attack_ssim", a)])
        assert res[attacks.per_attack_column("attack_s", a)] == 0.0
    assert res["attack_ssim_by"] == ""


def test_one_attacks_metric_is_an_objective():
    from cem_bench.errors import ConfigError
    from cem_bench.spaces import parse_space
    doc = {"name": "x", "objectives": [{"metric": "test_acc", "mode": "max"},
                                       {"metric": "attack_ssim__decoder", "mode": "min"}],
           "num_samples": 1, "params": {"cem.lambd": {"choice": [0, 8]}}}
    assert [o.metric for o in parse_space(doc).objectives] == ["test_acc", "attack_ssim__decoder"]
    doc["objectives"][1]["metric"] = "attack_ssim__nope"
    with pytest.raises(ConfigError, match="unknown metric 'attack_ssim__nope'.*<attack metric>__<attack>"):
        parse_space(doc)


def test_configs_name_the_strongest_attack_over_runs():
    import pandas as pd

    from cem_bench.analysis.aggregate import strongest_summary
    assert strongest_summary(pd.Series(["rmle", "rmle", ""])) == "rmle"
    assert strongest_summary(pd.Series(["rmle", "decoder", "rmle", None])) == "rmle 2/3, decoder 1/3"
    assert strongest_summary(pd.Series(["", None], dtype=object)) == ""
