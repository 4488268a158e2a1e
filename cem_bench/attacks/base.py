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


GALLERY_SIZE = 16   # images shown in recon.png


class Scorer:
    """Scores reconstructions of the evaluation images batch by batch: both metric conventions (per image,
    and the paper's per-batch ones) and the first ``GALLERY_SIZE`` images for the gallery."""

    def __init__(self, image_shape: tuple[int, ...]):
        from ..metrics import MetricAccumulator, PaperMetricAccumulator
        self.image_shape = tuple(image_shape)
        self.acc, self.paper = MetricAccumulator(), PaperMetricAccumulator()
        self.originals: list[torch.Tensor] = []
        self.reconstructions: list[torch.Tensor] = []
        self.n_gallery = 0

    def add(self, recon: torch.Tensor, target: torch.Tensor) -> None:
        """``recon`` and ``target`` in [0, 1], (n, C, H, W), on the device."""
        self.acc.update(recon, target)
        self.paper.update(recon, target)
        if self.n_gallery < GALLERY_SIZE:
            k = min(GALLERY_SIZE - self.n_gallery, len(target))
            self.originals.append(target[:k].cpu())
            self.reconstructions.append(recon[:k].detach().cpu())
            self.n_gallery += k

    def result(self, history: list[dict], seconds: float) -> AttackResult:
        m, mp = self.acc.compute(), self.paper.compute()
        metrics = {"attack_mse": m["mse"], "attack_psnr": m["psnr"], "attack_ssim": m["ssim"],
                   "attack_ssim_paper": mp["ssim_paper"], "attack_psnr_batch": mp["psnr_batch"]}
        empty = torch.zeros(0, *self.image_shape)
        return AttackResult(metrics=metrics,
                            originals=torch.cat(self.originals) if self.originals else empty,
                            reconstructions=torch.cat(self.reconstructions) if self.reconstructions else empty,
                            history=history, seconds=seconds)


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
