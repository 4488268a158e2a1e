"""The decoder attack: decoder shapes and size, the attacker's data protocol, features once, learning,
the encoder left untouched, seeding and the gallery PNG. Tiny sizes: the whole file runs in seconds on CPU."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from cem_bench.attacks import AttackResult, build, names, save_gallery
from cem_bench.attacks.decoder import DecoderAttack, InversionDecoder
from cem_bench.config import ModelConfig, TrialConfig
from cem_bench.core import data, models
from cem_bench.errors import ConfigError
from cem_bench.schema import ATTACK_METRICS


def tiny_cfg(**flat) -> TrialConfig:
    base = {"data.train_size": 64, "data.test_size": 200, "model.width": 0.125, "attack.epochs": 1,
            "attack.blocks": 0, "attack.channels": 4, "attack.batch_size": 32, "train.eval_batch_size": 64,
            "attack.names": ["decoder"]}
    base.update(flat)
    return TrialConfig.from_flat(base)


def encoder_for(cfg: TrialConfig, splits) -> models.ClientEncoder:
    torch.manual_seed(0)
    enc, _ = models.build(cfg.model, splits.num_classes, splits.image_shape)
    return enc


# ------------------------------------------------------------------------------ decoder
@pytest.mark.parametrize("cut", [2, 3, 4])
@pytest.mark.parametrize("bottleneck", [8, 0])
def test_decoder_output_shape(cut, bottleneck):
    enc = models.ClientEncoder(ModelConfig(width=0.125, cut_layer=cut, bottleneck_channels=bottleneck))
    fshape = models.feature_shape(enc)
    if bottleneck:
        assert fshape[0] == 8
    dec = InversionDecoder.for_features(fshape, (3, 32, 32), blocks=1, channels=8)
    assert dec.in_channels == fshape[0] and dec.feature_size == fshape[1:]
    with torch.no_grad():
        out = dec(enc(torch.rand(2, 3, 32, 32)))
    assert out.shape == (2, 3, 32, 32)
    assert 0.0 <= float(out.min()) and float(out.max()) <= 1.0


def test_decoder_for_128_channel_features():
    enc = models.ClientEncoder(ModelConfig(width=1.0, cut_layer=4, bottleneck_channels=0))
    fshape = models.feature_shape(enc)
    assert fshape == (128, 8, 8)
    dec = InversionDecoder.for_features(fshape, blocks=0, channels=8)
    with torch.no_grad():
        assert dec(torch.rand(2, *fshape)).shape == (2, 3, 32, 32)


def test_paper_decoder_parameter_count():
    # res_normN8C64 on 8x8x8 features, 32x32 images: 711,539 parameters (docs/reference.md §7)
    assert models.count_params(InversionDecoder(8, 8, 32, blocks=8, channels=64)) == 711_539


def test_decoder_rejects_non_power_of_two_ratio():
    with pytest.raises(ValueError, match="power-of-two"):
        InversionDecoder(8, 12, 32)
    with pytest.raises(ValueError, match="power-of-two"):
        InversionDecoder(8, 64, 32)


# ------------------------------------------------------------------------------ attack
def test_registered():
    assert "decoder" in names()
    assert isinstance(build(tiny_cfg()), DecoderAttack)


def test_inference_protocol_aux_and_eval_are_disjoint():
    cfg = TrialConfig.from_flat({"data.test_size": 200, "data.train_size": 64, "data.attack_split": "inference"})
    splits = data.load(cfg.data, "cpu")
    assert len(splits.attack_aux) == 180 and len(splits.attack_eval) == 20

    def digests(images):
        return {hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest() for img in images}

    aux, ev = digests(splits.attack_aux.images), digests(splits.attack_eval.images)
    assert len(ev) == 20  # no duplicate images either
    assert not aux & ev


def test_features_once_encoder_untouched_and_seeded():
    cfg = tiny_cfg(**{"attack.epochs": 2})
    splits = data.load(cfg.data, "cpu")
    enc = encoder_for(cfg, splits)
    enc.train()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    calls = []
    handle = enc.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    rng = torch.get_rng_state()
    try:
        res = build(cfg).run(enc, splits, 0.05, "cpu")
    finally:
        handle.remove()
    # aux 180 images -> 3 batches of <= 64, eval 20 -> 1: four forwards for 2 epochs, not 4 x epochs
    assert calls == [64, 64, 52, 20]
    assert enc.training and all(m.training for m in enc.modules())
    assert all(p.requires_grad for p in enc.parameters())
    after = enc.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN running stats included
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG was not consumed

    assert isinstance(res, AttackResult)
    assert set(res.metrics) == set(ATTACK_METRICS) == {"attack_mse", "attack_psnr", "attack_ssim",
                                                       "attack_ssim_paper", "attack_psnr_batch"}
    assert [h["epoch"] for h in res.history] == [1, 2]
    assert all(h["train_mse"] > 0 for h in res.history)
    assert res.originals.shape == res.reconstructions.shape == (16, 3, 32, 32)
    assert res.originals.device.type == "cpu"
    assert torch.allclose(res.originals, splits.attack_eval.images[:16].float() / 255)
    assert 0.0 <= float(res.reconstructions.min()) and float(res.reconstructions.max()) <= 1.0
    assert res.seconds > 0

    enc.eval()
    again = build(cfg).run(enc, splits, 0.05, "cpu")
    assert again.metrics == res.metrics  # same attack seed, same result
    assert not enc.training


def test_one_epoch_decoder_is_valid():
    cfg = tiny_cfg()
    splits = data.load(cfg.data, "cpu")
    res = build(cfg).run(encoder_for(cfg, splits), splits, 0.0, "cpu")
    assert len(res.history) == 1
    assert 0 < res.metrics["attack_mse"] < 1 and -1 <= res.metrics["attack_ssim"] <= 1


def test_paper_convention_metrics():
    """attack_ssim_paper / attack_psnr_batch are reported, finite, differ from the per-image metrics
    (zero padding and the whole map vs scikit-image's symmetric padding and cropped map; PSNR of the
    batch MSE <= mean per-image PSNR), and only attack_psnr_batch depends on the evaluation batch size."""
    splits = data.load(tiny_cfg().data, "cpu")  # 20 evaluation images
    out = {}
    for ebs in (64, 8):  # one batch of 20; batches of 8, 8, 4
        cfg = tiny_cfg(**{"train.eval_batch_size": ebs})
        out[ebs] = build(cfg).run(encoder_for(cfg, splits), splits, 0.0, "cpu").metrics
    for m in out.values():
        assert {"attack_ssim_paper", "attack_psnr_batch"} <= set(m)
        assert all(isinstance(m[k], float) and math.isfinite(m[k]) for k in ATTACK_METRICS)
        assert -1 <= m["attack_ssim_paper"] <= 1
        assert abs(m["attack_ssim_paper"] - m["attack_ssim"]) > 1e-2
        assert m["attack_psnr_batch"] <= m["attack_psnr"] + 1e-9
    a, b = out[64], out[8]
    for k in ("attack_mse", "attack_psnr", "attack_ssim", "attack_ssim_paper"):  # per image, or image-weighted
        assert a[k] == pytest.approx(b[k], abs=1e-6), k
    assert abs(a["attack_psnr_batch"] - b["attack_psnr_batch"]) > 1e-2


def test_short_attack_beats_untrained_decoder(monkeypatch):
    # the paper's cut (8x8x8 smashed data), no noise, 512 synthetic images: 461 aux, 51 eval
    cfg = tiny_cfg(**{"data.test_size": 512, "attack.blocks": 1, "attack.channels": 16, "attack.batch_size": 16,
                      "train.eval_batch_size": 256, "attack.epochs": 2})
    splits = data.load(cfg.data, "cpu")
    enc = encoder_for(cfg, splits)
    trained = build(cfg).run(enc, splits, 0.0, "cpu")
    with monkeypatch.context() as m:   # the control: the same decoder scored without its training
        m.setattr(DecoderAttack, "train", lambda self, *args: [])
        untrained = build(cfg).run(enc, splits, 0.0, "cpu").metrics["attack_mse"]
    assert trained.history[-1]["train_mse"] < trained.history[0]["train_mse"]
    assert trained.metrics["attack_mse"] < 0.9 * untrained


# ------------------------------------------------------------------------------ gallery
def test_save_gallery_png(tmp_path):
    from PIL import Image

    x = torch.rand(4, 3, 32, 32)
    path = save_gallery(x, x.flip(0), tmp_path / "sub" / "recon.png")
    with Image.open(path) as im:
        assert im.format == "PNG"
        # x2 nearest, padding 2: 4 * (64 + 2) + 2 wide, 2 * (64 + 2) + 2 high
        assert im.size == (266, 134)
    with pytest.raises(ValueError):
        save_gallery(x, x[:2], tmp_path / "bad.png")


def test_a_decoder_of_no_epochs_is_refused():
    # an untrained decoder's reconstructions are noise: its low SSIM would be reported as privacy
    with pytest.raises(ConfigError, match=r"attack.epochs: 0 is out of range; allowed: int in \[1, inf\)"):
        tiny_cfg(**{"attack.epochs": 0})
