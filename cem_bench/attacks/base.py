"""The attack interface and registry (the same pattern as the surrogates')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..config import TrialConfig, resolve_attack
from ..registry import Registry


@dataclass
class AttackResult:
    metrics: dict[str, float]             # attack_mse, attack_psnr, attack_ssim (image-weighted means)
    originals: torch.Tensor               # (n, 3, H, W) float in [0, 1] on the CPU, first gallery images
    reconstructions: torch.Tensor         # the attack's reconstructions of the same images
    history: list[dict] = field(default_factory=list)  # per attack epoch: {"epoch", "train_mse", ...}
    seconds: float = 0.0


class Attack:
    """``run(encoder, splits, noise_std, device) -> AttackResult``: invert the frozen encoder's features."""

    name: ClassVar[str] = ""

    def __init__(self, cfg: TrialConfig):
        self.cfg = resolve_attack(cfg)  # empty attack keys take the dataset's defaults

    def run(self, encoder: torch.nn.Module, splits, noise_std: float, device) -> AttackResult:  # pragma: no cover
        raise NotImplementedError


_REGISTRY: Registry[Attack] = Registry("attack", "cem_bench.attacks.decoder")
register, names = _REGISTRY.register, _REGISTRY.names


def build(cfg: TrialConfig) -> Attack:
    return _REGISTRY.get(cfg.attack.kind)(cfg)
