"""The attack interface and registry (the same pattern as the surrogates')."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..config import TrialConfig
from ..registry import Registry
from ..schema import per_attack_column, strongest_column


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
        from ..core.metrics import MetricAccumulator, PaperMetricAccumulator
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


REGISTRY: Registry[Attack] = Registry("attack", "cem_bench.attacks", key="attack.names", skip=("base",),
                                       shared_keys=False)
register, names, get = REGISTRY.register, REGISTRY.names, REGISTRY.get


def resolve(cfg: TrialConfig) -> TrialConfig:
    """The config with every key of the chosen attacks filled in (their ``Keys`` defaults, then
    ``complete``); keys of other attacks are dropped."""
    params: dict = {}
    for name in cfg.attack.names:
        klass = get(name)
        if klass.Keys is None:
            continue
        own = {f.name: getattr(klass.Keys(), f.name) for f in dataclasses.fields(klass.Keys)}
        params.update(klass.complete({**own, **{k: v for k, v in cfg.attack.params.items() if k in own}}, cfg))
    return dataclasses.replace(cfg, attack=dataclasses.replace(cfg.attack, params=params))


def build(cfg: TrialConfig, name: str | None = None) -> Attack:
    """The attack ``name`` (default: the only one of ``attack.names``)."""
    if name is None:
        if len(cfg.attack.names) != 1:
            raise ValueError(f"attack.names lists {cfg.attack.names}: say which one to build")
        name = cfg.attack.names[0]
    return get(name)(cfg)


# ------------------------------------------------------------------------------------------ several attacks
def worst_case(per_attack: dict[str, dict[str, float]]) -> tuple[dict[str, float], dict[str, str]]:
    """The worst case for privacy over several attacks' metrics: per metric, the value of the strongest attack
    (highest SSIM/PSNR, lowest MSE: ``schema.PRIVACY_MODES`` reversed) and its name. A NaN value never
    wins; a metric NaN for every attack stays NaN with no name. Ties go to the first attack listed."""
    from ..schema import PRIVACY_MODES
    metrics: dict[str, float] = {}
    by: dict[str, str] = {}
    names = list(per_attack)
    for metric in dict.fromkeys(m for res in per_attack.values() for m in res):
        higher_is_stronger = PRIVACY_MODES.get(metric, "min") == "min"
        best_name, best = "", float("nan")
        for name in names:
            v = float(per_attack[name].get(metric, float("nan")))
            if v != v:
                continue
            if best != best or (v > best if higher_is_stronger else v < best):
                best_name, best = name, v
        metrics[metric], by[metric] = best, best_name
    return metrics, by


@dataclass
class AttackSet:
    """The results of every attack of a trial, and their worst case."""
    results: dict[str, AttackResult]

    def metrics(self) -> dict[str, float | str]:
        """The worst-case metrics, each attack's own (``attack_ssim__rmle``), the strongest attack per metric
        (``attack_ssim_by``) and each attack's seconds (``attack_s__rmle``)."""
        worst, by = worst_case({n: r.metrics for n, r in self.results.items()})
        out: dict[str, float | str] = dict(worst)
        out.update({strongest_column(m): name for m, name in by.items()})
        for name, res in self.results.items():
            out.update({per_attack_column(m, name): v for m, v in res.metrics.items()})
            out[per_attack_column("attack_s", name)] = res.seconds
        return out

    @staticmethod
    def skipped_metrics(names) -> dict[str, float | str]:
        """The same columns as ``metrics()`` for attacks that did not run (the utility gate): NaN metrics,
        0 seconds, no strongest attack."""
        from ..schema import ATTACK_METRICS
        out: dict[str, float | str] = {k: float("nan") for k in ATTACK_METRICS}
        out.update({strongest_column(k): "" for k in ATTACK_METRICS})
        for name in names:
            out.update({per_attack_column(k, name): float("nan") for k in ATTACK_METRICS})
            out[per_attack_column("attack_s", name)] = 0.0
        return out

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.results.values())

    def history(self) -> list[dict]:
        return [{"attack": name, **h} for name, r in self.results.items() for h in r.history]

    def save_gallery(self, path, scale: int = 2, within=None) -> str:
        """One PNG: the evaluation images in the top row, then one row per attack in ``attack.names`` order."""
        first = next(iter(self.results.values()))
        return save_gallery(first.originals, [r.reconstructions for r in self.results.values()], path, scale,
                            within=within)


def run_all(cfg: TrialConfig, encoder: torch.nn.Module, splits, noise_std: float, device) -> AttackSet:
    """Run every attack of ``attack.names`` on the frozen encoder, in that order."""
    return AttackSet({name: build(cfg, name).run(encoder, splits, noise_std, device) for name in cfg.attack.names})


def save_gallery(originals: torch.Tensor, reconstructions, path, scale: int = 2, within=None) -> str:
    """A PNG with the originals in the top row and below them one row per reconstruction batch
    (``reconstructions``: one (n, C, H, W) tensor or a list of them), each image ×``scale`` (nearest).

    For n images of HxW and r rows of reconstructions the file is ((r+1)*(scale*H + 2) + 2) high and
    (n*(scale*W + 2) + 2) wide. Written as every result file is (``storage.write_bytes``): a new file renamed
    into place, so a link planted at ``path`` in a shared run folder is replaced, never written through;
    ``within``: a folder above ``path`` trusted instead of its parent (no link is followed below it).
    """
    import io

    import torch.nn.functional as F
    from torchvision.utils import save_image

    from ..storage import write_bytes

    rows = [reconstructions] if isinstance(reconstructions, torch.Tensor) else list(reconstructions)
    if originals.dim() != 4 or len(originals) == 0 or not rows or any(r.shape != originals.shape for r in rows):
        raise ValueError(f"save_gallery needs a non-empty (n, C, H, W) batch of originals and reconstructions of "
                         f"the same shape; got {tuple(originals.shape)} and {[tuple(r.shape) for r in rows]}")
    grid = torch.cat([originals, *rows]).detach().float().cpu().clamp(0, 1)
    if scale != 1:
        grid = F.interpolate(grid, scale_factor=scale, mode="nearest")
    png = io.BytesIO()
    save_image(grid, png, nrow=len(originals), padding=2, format="PNG")
    path = str(path)
    write_bytes(path, png.getvalue(), within=within)
    return path
