"""The attack interface and registry (the same pattern as the surrogates')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..config import ConfigError, TrialConfig, resolve_attack


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


_REGISTRY: dict[str, type[Attack]] = {}


def register(name: str):
    def deco(cls):
        if name in _REGISTRY:
            raise ValueError(f"attack {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def _load_all() -> None:
    from . import decoder  # noqa: F401


def names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def build(cfg: TrialConfig) -> Attack:
    _load_all()
    if cfg.attack.kind not in _REGISTRY:
        raise ConfigError(f"attack.kind: unknown attack {cfg.attack.kind!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[cfg.attack.kind](cfg)
