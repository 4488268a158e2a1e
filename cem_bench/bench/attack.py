"""Row ``attack``: one epoch of the decoder attack (res_normN8C64, the attack's batch) on encoder features
cached once per attack, as ``DecoderAttack.run`` trains it; against the same epoch plus the encoder pass
over the attacker's images that the reference repeated every attack epoch. The two are timed alternately;
no target (the ratio is what caching saves).
"""

from __future__ import annotations

import statistics

import torch

from .harness import Sizes, make_row, round_robin, row, step_config, synthetic_splits


@row("attack", "attack epoch", order=40)
def bench_attack(device: torch.device, sizes: Sizes) -> list[dict]:
    """One decoder-attack epoch on cached features vs the same epoch plus a fresh encoder pass."""
    from .. import models
    from ..attacks import build as build_attack
    from ..attacks.decoder import InversionDecoder, encode
    from ..models import amp_dtype
    from ..trial import build_config

    flat = step_config(sizes, device, **{"data.train_size": 20, "data.test_size": sizes.attack_test,
                                         "cem.lambd": 0.0, "attack.epochs": 1,
                                         "attack.blocks": sizes.attack_blocks,
                                         "attack.channels": sizes.attack_channels})
    cfg = build_config(flat)
    splits = synthetic_splits(20, sizes.attack_test, device)
    torch.manual_seed(0)
    client, _ = models.build(cfg.model, splits.num_classes, splits.image_shape)
    client.to(device).eval().requires_grad_(False)
    if device.type == "cuda":
        client.to(memory_format=torch.channels_last)
    amp = amp_dtype(cfg.train, device) is not None
    aux = splits.attack_aux
    ebs = cfg.train.eval_batch_size
    z_aux = None

    def feature_pass() -> None:
        nonlocal z_aux
        z_aux = encode(client, aux, splits, ebs, device, amp)

    feature_pass()
    decoder = InversionDecoder.for_features(tuple(z_aux.shape[1:]), splits.image_shape,
                                            blocks=cfg.attack.blocks, channels=cfg.attack.channels).to(device)
    if device.type == "cuda":
        decoder = decoder.to(memory_format=torch.channels_last)
    attack = build_attack(cfg, "decoder")
    gen = torch.Generator(device=device).manual_seed(0)
    noise_std = cfg.defense.noise_std

    def noisy(z: torch.Tensor) -> torch.Tensor:
        z = z.float()
        return z + noise_std * torch.randn(z.shape, generator=gen, device=device) if noise_std > 0 else z

    def epoch() -> None:
        attack.train(decoder, z_aux, aux.images, noisy, gen, device, amp)

    times = round_robin({"epoch": epoch, "encode": feature_pass}, device, sizes.repeats, sizes.warmup)
    ep_s, enc_s = times["epoch"], times["encode"]
    med, enc = statistics.median(ep_s), statistics.median(enc_s)
    n = len(aux)
    return [make_row("attack epoch (cached features)", med, "s/epoch", med + enc,
                     "epoch + encoder pass (reference)", (med + enc) / med, "speed-up",
                     note=f"{n} aux images ({n / med:.0f} img/s), decoder res_normN{cfg.attack.blocks}"
                          f"C{cfg.attack.channels}, batch {cfg.attack.batch_size}; the encoder pass the reference "
                          f"repeats every epoch takes {enc:.3f} s here (features computed once per attack)",
                     samples=ep_s)]
