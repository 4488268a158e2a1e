"""The attack interface and registry (the same pattern as the surrogates')."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..config import TrialConfig
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
    Keys: ClassVar[type | None] = None      # the attack's own keys (a frozen dataclass of keys.key fields)
    keys: ClassVar[tuple] = ()              # their flat names, set by @register

    def __init__(self, cfg: TrialConfig):
        self.cfg = resolve(cfg)

    @classmethod
    def complete(cls, params: dict, cfg: TrialConfig) -> dict:
        """Derived or dataset-dependent defaults of the attack's own keys."""
        return params

    def run(self, encoder: torch.nn.Module, splits, noise_std: float, device) -> AttackResult:  # pragma: no cover
        raise NotImplementedError


_REGISTRY: Registry[Attack] = Registry("attack", "cem_bench.attacks", key="attack.kind", skip=("base",))
register, names, get = _REGISTRY.register, _REGISTRY.names, _REGISTRY.get


def resolve(cfg: TrialConfig) -> TrialConfig:
    """The config with every key of the chosen attack filled in (its ``Keys`` defaults, then ``complete``);
    keys of other attacks are dropped."""
    klass = get(cfg.attack.kind)
    if klass.Keys is None:
        return dataclasses.replace(cfg, attack=dataclasses.replace(cfg.attack, params={}))
    own = {f.name: getattr(klass.Keys(), f.name) for f in dataclasses.fields(klass.Keys)}
    params = klass.complete({**own, **{k: v for k, v in cfg.attack.params.items() if k in own}}, cfg)
    return dataclasses.replace(cfg, attack=dataclasses.replace(cfg.attack, params=params))


def build(cfg: TrialConfig) -> Attack:
    return get(cfg.attack.kind)(cfg)
