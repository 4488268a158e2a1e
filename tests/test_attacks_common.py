"""Checks every registered attack gets (parametrised over ``attacks.names()``), and the rmle attack's own."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY

from cem_bench import attacks
from cem_bench.metrics import ssim_per_image
from cem_bench.schema import ATTACK_METRICS
from cem_bench.trial import build, build_config

FAST = {"attack.iterations": 40, "attack.epochs": 1, "data.test_size": 160}   # 16 evaluation images


def setup(kind: str, **flat):
    cfg = build_config({**TINY, **FAST, "attack.kind": kind, "cem.lambd": 0, **flat})
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


def test_rmle_reconstructs_more_than_noise_and_moves_from_its_start():
    """On an untrained encoder at sigma = 0.01 the reconstruction is far from random pixels and has moved away
    from its grey start. (Beating a constant grey image needs a trained encoder: on the demo-budget lambda = 0
    encoder at sigma = 0.1 rmle scored SSIM 0.34 against 0.27 for grey and 0.665 for the decoder; see the
    closing note of the attacks issue. Not a test here: training one takes minutes.)"""
    cfg, splits, client = setup("rmle", **{"defense.noise_std": 0.01, "attack.iterations": 150})
    res = attacks.build(cfg).run(client, splits, 0.01, "cpu")
    target = res.originals
    noise = torch.rand(target.shape, generator=torch.Generator().manual_seed(0))
    got = _ssim(res.reconstructions, target)
    assert got > _ssim(noise, target) + 0.05, got
    assert (res.reconstructions - 0.5).abs().mean() > 0.02


def test_rmle_is_worse_with_more_noise():
    quiet_cfg, splits, client = setup("rmle", **{"attack.iterations": 100})
    quiet = attacks.build(quiet_cfg).run(client, splits, 0.01, "cpu").metrics["attack_ssim"]
    loud = attacks.build(quiet_cfg).run(client, splits, 1.0, "cpu").metrics["attack_ssim"]
    assert loud < quiet - 0.02, (quiet, loud)


def test_rmle_keeps_the_best_restart():
    from cem_bench.attacks.rmle import RMLEAttack
    cfg, splits, client = setup("rmle", **{"attack.restarts": 3, "attack.iterations": 20})
    client.eval().requires_grad_(False)
    x = splits.normalize(splits.attack_eval.images[:4])
    z = client(x).float()
    gen = torch.Generator().manual_seed(0)
    att = RMLEAttack(cfg)
    norm = lambda im: (im - splits.mean) / splits.std  # noqa: E731
    _, fit3 = att.invert(client, z, norm, (3, 32, 32), gen, 0.01)
    one = RMLEAttack(build_config({**TINY, **FAST, "attack.kind": "rmle", "attack.iterations": 20}))
    _, fit1 = one.invert(client, z, norm, (3, 32, 32), torch.Generator().manual_seed(0), 0.01)
    assert (fit3 <= fit1 + 1e-6).all()                         # the grey start is one of the three
