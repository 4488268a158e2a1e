"""``rmle``: the white-box regularised maximum-likelihood inversion (He, Zhang and Lee, "Model inversion
attacks against collaborative inference", ACSAC 2019).

The attacker knows the client encoder f (its weights) and the defense noise σ. For each observed noisy
feature z̃ = f(x) + σ·ε it looks for the image that best explains it under the Gaussian noise model, with a
total-variation prior:

    x̂ = argmin_x  mean_d (f(x) − z̃)² / (2 s²)  +  w_tv · TV(x),      s = max(σ, 0.01)

where TV is the mean absolute vertical difference of neighbouring pixels plus the mean horizontal one, and
w_tv defaults to 0.6·s^-1.5 (measured: a fixed weight fades against the 1/(2s²) data term as σ falls; see
``auto_tv_weight``). Pixels are kept in
range by optimising logits: x = sigmoid(u). Adam on a whole batch of images at once,
``attack.rmle_iterations`` steps from a grey image (u ≈ 0, jittered by 0.01); with ``attack.rmle_restarts``
> 1 the later starts are random (u ~ N(0, 1) from the attack's generator) and each image keeps the start
whose final data term is lowest. No training images are needed:
the attack is scored on the same evaluation images as the decoder (``attack_eval``), each image's noise
drawn once. No host sync inside the optimisation loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from ..core.data import eval_batches
from ..keys import key
from .base import Attack, AttackResult, Scorer, register

MIN_NOISE_STD = 0.01   # the data term's scale when σ is smaller (σ = 0 would make it infinite)
TV_COEF = 0.6          # the default prior weight is TV_COEF · s^-1.5 (measured, see auto_tv_weight)
GREY_JITTER = 0.01     # logit noise of the grey start


@dataclass(frozen=True)
class RMLEKeys:
    # prefixed: attacks run together in one trial, so they cannot share a key (attack.lr is the decoder's)
    rmle_iterations: int = key(150, "rmle: Adam steps of the optimisation of each batch of images", lo=1)
    rmle_lr: float = key(0.1, "rmle: Adam learning rate on the image logits", lo=0.0, lo_open=True)
    rmle_tv_weight: Optional[float] = key(None, "rmle: weight of the total-variation prior (mean |vertical "
                                          "difference| + mean |horizontal difference|) beside the noise-scaled "
                                          "data term; empty = "
                                          f"{TV_COEF:g}·s^-1.5, s = max(σ, {MIN_NOISE_STD:g}) (measured best "
                                          "over σ 0.01..0.15, docs/attacks.md)", lo=0.0,
                                          derived_from=("defense.noise_std",))
    rmle_restarts: int = key(1, "rmle: starts per image (the first grey, the others random); the best data fit "
                             "is kept", lo=1, hi=16)
    rmle_batch_size: int = key(256, "rmle: images optimised at once", lo=1)


def auto_tv_weight(noise_std: float) -> float:
    """The default TV weight at noise σ: ``TV_COEF · s^-1.5``, s = max(σ, MIN_NOISE_STD). The data term is
    scaled by 1/(2s²), so a fixed prior weight fades as σ falls and the inversion fills the encoder's null
    space with noise; the best weight measured on a λ = 0 synthetic encoder (SSIM; docs/attacks.md) was
    ≈ 500 at σ 0.01, 200 at 0.025, 20 at 0.1 and 10 at 0.15, which this power law follows within ×1.3."""
    return TV_COEF * max(float(noise_std), MIN_NOISE_STD) ** -1.5


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Per-image mean absolute difference of vertically neighbouring pixels plus that of horizontally
    neighbouring ones (two means added), (N,)."""
    dh = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().flatten(1).mean(1)
    dw = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().flatten(1).mean(1)
    return dh + dw


@register("rmle")
class RMLEAttack(Attack):
    """White-box rMLE: optimise each evaluation image until the frozen encoder maps it onto the noisy feature."""

    Keys = RMLEKeys

    @classmethod
    def complete(cls, params: dict, cfg) -> dict:
        """An empty ``attack.rmle_tv_weight`` becomes the measured rule's value at ``defense.noise_std`` (so the
        recorded config holds the weight that was used)."""
        if params.get("rmle_tv_weight") is None:
            params = {**params, "rmle_tv_weight": auto_tv_weight(cfg.defense.noise_std)}
        return params

    def invert(self, encoder: nn.Module, z_noisy: torch.Tensor, normalize, image_shape, gen: torch.Generator,
               noise_std: float, starts: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reconstructions in [0, 1] (n, C, H, W) of the noisy features ``z_noisy`` and each one's final data
        term (n,). ``normalize`` maps float images in [0, 1] to the encoder's input. ``starts`` (one N(0, 1)
        tensor of shape (n, C, H, W) per restart) are the draws of the starts; without them they are drawn
        from ``gen`` here."""
        acfg = self.cfg.attack
        n = z_noisy.shape[0]
        scale = 2.0 * max(float(noise_std), MIN_NOISE_STD) ** 2
        tv_weight = acfg.rmle_tv_weight if acfg.rmle_tv_weight is not None else auto_tv_weight(noise_std)
        best = best_fit = None
        for r in range(acfg.rmle_restarts):
            shape = (n, *image_shape)
            # grey (with a 0.01 logit jitter: at an exactly grey, normalised-to-zero image an encoder whose
            # biases are zero sits at ReLU(0) and gets no gradient), then random starts
            jitter = starts[r].clone() if starts is not None else torch.randn(shape, generator=gen,
                                                                               device=z_noisy.device)
            u = (GREY_JITTER * jitter if r == 0 else jitter).requires_grad_(True)
            opt = torch.optim.Adam([u], lr=acfg.rmle_lr)
            for _ in range(acfg.rmle_iterations):
                opt.zero_grad(set_to_none=True)
                x = torch.sigmoid(u)
                fit = (encoder(normalize(x)).float() - z_noisy).pow(2).flatten(1).mean(1) / scale
                loss = (fit + tv_weight * total_variation(x)).sum()
                loss.backward()
                opt.step()
            with torch.no_grad():
                x = torch.sigmoid(u)
                fit = (encoder(normalize(x)).float() - z_noisy).pow(2).flatten(1).mean(1) / scale
                if best is None:
                    best, best_fit = x, fit
                else:
                    better = fit < best_fit
                    best = torch.where(better.view(-1, 1, 1, 1), x, best)
                    best_fit = torch.minimum(fit, best_fit)
        return best, best_fit

    def run(self, encoder: nn.Module, splits, noise_std: float, device) -> AttackResult:
        t0 = time.perf_counter()
        acfg = self.cfg.attack
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(acfg.seed)
        image_shape = tuple(splits.attack_eval.images.shape[1:])
        scorer = Scorer(image_shape)
        history = []
        was_training = encoder.training
        grads = [p.requires_grad for p in encoder.parameters()]
        try:
            encoder.eval()
            encoder.requires_grad_(False)        # the gradient is taken with respect to the image only
            # every image's noise, then every restart's starts, drawn once for the whole set before any
            # optimisation: an image gets the same draws at any rmle_batch_size (drawn batch by batch, which
            # noise and start an image got depended on its batch, and the per-image metrics moved by about 1e-3
            # with the batch size, until 2026-12-06). With one batch the draws are those of before.
            with torch.no_grad():
                z_all = torch.cat([encoder(x.to(device)).float() for x, _ in
                                   eval_batches(splits.attack_eval, splits, acfg.rmle_batch_size)])
                if noise_std > 0:
                    z_all = z_all + noise_std * torch.randn(z_all.shape, generator=gen, device=device)
            n, bs = len(z_all), acfg.rmle_batch_size
            starts = [torch.randn((n, *image_shape), generator=gen, device=device) for _ in range(acfg.rmle_restarts)]
            for i, lo in enumerate(range(0, n, bs)):
                z = z_all[lo:lo + bs]
                target = splits.attack_eval.images[lo:lo + bs].to(device).float().div_(255.0)
                recon, fit = self.invert(encoder, z, splits.standardize, image_shape, gen, noise_std,
                                         starts=[s[lo:lo + bs] for s in starts])
                scorer.add(recon.float().clamp_(0.0, 1.0).contiguous(), target)
                history.append({"batch": i, "images": len(target), "final_fit": fit.mean()})
        finally:
            encoder.train(was_training)
            for p, g in zip(encoder.parameters(), grads):
                p.requires_grad_(g)
        for h in history:                         # one host sync, after the optimisation
            h["final_fit"] = float(h["final_fit"])
        return scorer.result(history, time.perf_counter() - t0)
