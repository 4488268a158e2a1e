"""The paper's decoder-based model-inversion attack (docs/reference.md §7).

The attacker queries the frozen target encoder on its own images (``splits.attack_aux``), adds fresh
N(0, sigma^2) noise to the features every batch, and trains a decoder from noisy features to the [0, 1]
images with MSE. It is then evaluated on ``splits.attack_eval`` (images it never trained on) with fresh
noise, in eval mode, in batches of ``train.eval_batch_size``: cem-bench's per-image metrics (attack_mse,
attack_psnr, attack_ssim) and the paper's per-batch ones (attack_ssim_paper, attack_psnr_batch; the latter
depends on that batch size, the paper's was 256), see docs/metrics.md.

Decoder: ``res_normN_AE(N=blocks, C=channels)`` of xiasong0501/CEM (identical to ResSFL's):
ResBlock(in -> C) -> ReLU; N x [ResBlock(C -> C) -> ReLU]; log2(image/feature) x [ConvT(C, C, 3, s2, p1,
op1) -> BN -> ReLU]; ResBlock(C -> 3) -> Sigmoid. As in the reference, when fewer than two upsamplings are
needed (features at 1/2 or full image resolution) each missing one of the first two is replaced by a
ResBlock(C -> C) -> ReLU, so the decoder keeps its depth. Input channels and size come from the encoder's
output, never hard-coded (the reference hard-codes 8x8).

Differences from the reference, on purpose: features are computed once per attack (the reference re-ran the
encoder every attack epoch), the decoder's BN running statistics are never updated on evaluation images (the
reference's per-epoch "validation" ran in train mode on the test set), and bf16 autocast on CUDA.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import models
from ..core.data import eval_batches
from ..core.graphs import CaptureSchedule, graph_mode
from ..keys import key
from .base import Attack, AttackResult, Scorer, register

ETA_MIN = 1e-5


# ---------------------------------------------------------------------------------------- model
class ResBlock(nn.Module):
    """Pre-activation residual block: BN-ReLU, conv3x3-BN-ReLU, conv3x3, plus a shortcut.

    The shortcut is the identity, or a 1x1 conv (no bias) + BN when the channel count changes. No ReLU
    after the sum (the caller adds one), as in the reference.
    """

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.bn0 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False),
                                          nn.BatchNorm2d(out_channels))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn0(x))
        out = F.relu(self.bn1(self.conv1(out)))
        return self.conv2(out) + self.shortcut(x)


def _upsamplings(feature_size: int, image_size: int) -> int:
    if feature_size < 1 or image_size % feature_size or (image_size // feature_size) & (image_size // feature_size - 1):
        raise ValueError(f"the decoder needs an image size that is a power-of-two multiple of the feature size; "
                         f"got features {feature_size} and images {image_size}")
    return int(math.log2(image_size // feature_size))


class InversionDecoder(nn.Module):
    """``res_normN_AE(N=blocks, C=channels)``: noisy features (B, in, h, w) -> images (B, 3, H, W) in [0, 1].

    ``feature_size`` and ``image_size`` are ints (square) or (h, w) pairs; H/h and W/w must be the same
    power of two. 711,539 parameters at the paper's setting (in=8, N=8, C=64, 8x8 -> 32x32).
    """

    def __init__(self, in_channels: int, feature_size, image_size=32, blocks: int = 8, channels: int = 64,
                 out_channels: int = 3):
        super().__init__()
        fh, fw = (feature_size, feature_size) if isinstance(feature_size, int) else tuple(feature_size)
        ih, iw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        ups_h, ups_w = _upsamplings(fh, ih), _upsamplings(fw, iw)
        if ups_h != ups_w:
            raise ValueError(f"the decoder upsamples height and width equally; got features {fh}x{fw} and "
                             f"images {ih}x{iw}")
        self.in_channels, self.feature_size, self.image_size = in_channels, (fh, fw), (ih, iw)
        self.upsamplings = ups_h
        c = channels
        layers: list[nn.Module] = [ResBlock(in_channels, c), nn.ReLU()]
        for _ in range(blocks):
            layers += [ResBlock(c, c), nn.ReLU()]
        for i in range(max(2, ups_h)):
            if i < ups_h:
                layers += [nn.ConvTranspose2d(c, c, 3, stride=2, padding=1, output_padding=1), nn.BatchNorm2d(c)]
            else:  # the reference keeps two stages: a ResBlock stands in for a missing upsampling
                layers += [ResBlock(c, c)]
            layers += [nn.ReLU()]
        layers += [ResBlock(c, out_channels), nn.Sigmoid()]
        self.m = nn.Sequential(*layers)

    @classmethod
    def for_features(cls, feature_shape, image_shape=(3, 32, 32), blocks: int = 8, channels: int = 64):
        """Build from the encoder's output shape (C, h, w) and the image shape (3, H, W)."""
        c, h, w = feature_shape
        return cls(c, (h, w), tuple(image_shape[1:]), blocks=blocks, channels=channels,
                   out_channels=image_shape[0])

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.m(z)


# ---------------------------------------------------------------------------------------- attack
def encode(encoder: nn.Module, split, splits, batch_size: int, device: torch.device, amp: bool) -> torch.Tensor:
    """The clean fp32 features of a whole split (``models.encode``), channels_last on CUDA for the decoder."""
    batches = (x.to(device) for x, _ in eval_batches(split, splits, batch_size))
    z = models.encode(encoder, batches, device, torch.bfloat16 if amp else None)
    return z.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else z


@dataclass(frozen=True)
class DecoderKeys:
    # At least 1: a decoder of 0 epochs is the untrained network, whose low SSIM would read as privacy
    epochs: Optional[int] = key(None, "attack decoder epochs (empty = the data set's; on the small sets where "
                                "the decoder stops improving, docs/attacks.md section 3)", lo=1)
    blocks: Optional[int] = key(None, "residual blocks of the decoder (empty = the data set's: the paper's "
                                "res_normN8C64 on CIFAR)", lo=0, hi=64)
    channels: Optional[int] = key(None, "channels of the decoder (empty = the data set's: the paper's on "
                                  "CIFAR)", lo=1, hi=1024)
    lr: float = key(1e-3, "Adam learning rate (cosine to 1e-5)", lo=0.0, lo_open=True)
    weight_decay: float = key(1e-4, "Adam weight decay", lo=0.0)
    batch_size: Optional[int] = key(None, "attack batch size (empty = the data set's)", lo=1)


# The paper's decoder attack (50 epochs, res_normN8C64, batch 256) on CIFAR; set the keys to override any.
DATASET_DEFAULTS = {
    "cifar10": {"epochs": 50, "blocks": 8, "channels": 64, "batch_size": 256},
    "cifar100": {"epochs": 50, "blocks": 8, "channels": 64, "batch_size": 256},
    # The small sets get a CPU-sized decoder (2 blocks x 32 channels, a few minutes on one core), trained to where
    # it stops improving at lambda = 0 (docs/attacks.md section 3, 2026-12-02): their attackers have 324 (digits) and
    # 2,304 (synthetic, photos) images, so batch 256 gave 2 and 9 Adam steps an epoch, and 10 such epochs drew a
    # flat image on digits (SSIM 0.18 where 96 epochs at batch 32 give 0.96), scored 0.35 on photos (below rmle's
    # 0.42 and 48 epochs at batch 32's 0.43-0.47) and 0.71-0.73 on the shapes (0.84 at 48, 0.86 at 96), taking
    # longer on the CPU than 10 epochs at batch 32.
    "synthetic": {"epochs": 48, "blocks": 2, "channels": 32, "batch_size": 32},
    "digits": {"epochs": 96, "blocks": 2, "channels": 32, "batch_size": 32},
    "photos": {"epochs": 48, "blocks": 2, "channels": 32, "batch_size": 32},
}


@register("decoder")
class DecoderAttack(Attack):
    """Train ``InversionDecoder`` on noisy features of ``attack_aux``; evaluate on ``attack_eval``."""

    Keys = DecoderKeys

    @classmethod
    def complete(cls, params: dict, cfg) -> dict:
        """Empty epochs/blocks/channels/batch_size take the dataset's defaults."""
        defaults = DATASET_DEFAULTS[cfg.data.dataset]
        return {**params, **{k: v for k, v in defaults.items() if params[k] is None}}

    def run(self, encoder: nn.Module, splits, noise_std: float, device) -> AttackResult:
        t0 = time.perf_counter()
        cfg, acfg = self.cfg, self.cfg.attack
        device = torch.device(device)
        amp = models.amp_dtype(cfg.train, device) is not None
        gen = torch.Generator(device=device).manual_seed(acfg.seed)

        # -- features of the attacker's images, once, with the encoder frozen (its state restored after)
        was_training = encoder.training
        grads = [p.requires_grad for p in encoder.parameters()]
        try:
            encoder.eval()
            encoder.requires_grad_(False)
            ebs = cfg.train.eval_batch_size
            z_aux = encode(encoder, splits.attack_aux, splits, ebs, device, amp)
            z_eval = encode(encoder, splits.attack_eval, splits, ebs, device, amp)
        finally:
            encoder.train(was_training)
            for p, g in zip(encoder.parameters(), grads):
                p.requires_grad_(g)

        image_shape = tuple(splits.attack_aux.images.shape[1:])
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # seeded init without touching the global RNG
            torch.manual_seed(acfg.seed)
            decoder = InversionDecoder.for_features(tuple(z_aux.shape[1:]), image_shape,
                                                    blocks=acfg.blocks, channels=acfg.channels).to(device)
        if device.type == "cuda":
            decoder = decoder.to(memory_format=torch.channels_last)

        def noisy(z: torch.Tensor) -> torch.Tensor:
            z = z.float()
            if noise_std > 0:
                z = z + noise_std * torch.randn(z.shape, generator=gen, device=device)
            return z

        # -- training
        history = self.train(decoder, z_aux, splits.attack_aux.images, noisy, gen, device, amp)

        # -- evaluation on images the decoder never saw, fresh noise, eval mode
        decoder.eval()
        scorer = Scorer(image_shape)   # both metric conventions (the paper's per batch of eval_batch_size)
        with torch.no_grad():
            for i in range(0, len(z_eval), cfg.train.eval_batch_size):
                z = noisy(z_eval[i:i + cfg.train.eval_batch_size])
                target = splits.attack_eval.images[i:i + cfg.train.eval_batch_size].to(device).float().div_(255.0)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                    recon = decoder(z)
                scorer.add(recon.float().clamp_(0.0, 1.0).contiguous(), target)
        return scorer.result(history, time.perf_counter() - t0)

    def train(self, decoder, z_aux, images_u8, noisy, gen, device, amp) -> list[dict]:
        """Train ``decoder`` for ``attack.epochs`` epochs from the features ``z_aux`` (``noisy`` adds the
        defense noise per batch) to ``images_u8`` / 255; returns one record per epoch. On CUDA with
        ``train.cuda_graph`` on (auto), the full-size batches replay one captured step (``DecoderStepGraph``);
        a short last batch runs eagerly."""
        acfg = self.cfg.attack
        graphed = device.type == "cuda" and graph_mode(self.cfg.train.cuda_graph, device, self.cfg.train.compile)
        kw = {"fused": True} if device.type == "cuda" else {}
        lr = torch.tensor(acfg.lr, device=device) if graphed else acfg.lr   # filled in place by the scheduler
        opt = torch.optim.Adam(decoder.parameters(), lr=lr, weight_decay=acfg.weight_decay,
                               **kw, **({"capturable": True} if graphed else {}))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=acfg.epochs, eta_min=ETA_MIN)
        n = len(z_aux)
        bs = min(acfg.batch_size, n)
        history = []
        decoder.train()

        def step(idx: torch.Tensor, total: torch.Tensor) -> None:
            z = noisy(z_aux[idx])
            target = images_u8[idx].to(device).float().div_(255.0)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=not graphed):
                recon = decoder(z)
            loss = F.mse_loss(recon.float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach() * len(idx)

        total = torch.zeros((), device=device)
        graph = DecoderStepGraph(step, bs, total, gen, device, strict=self.cfg.train.cuda_graph == "on") \
            if graphed else None
        for epoch in range(acfg.epochs):
            perm = torch.randperm(n, generator=gen, device=device)
            total.zero_()
            seen = 0
            for i in range(0, n, bs):
                idx = perm[i:i + bs]
                if len(idx) < 2 < n:  # a lone trailing sample: BatchNorm may not normalise a single value
                    continue
                if graph is not None and len(idx) == bs:
                    graph.step(idx)
                else:
                    step(idx, total)
                seen += len(idx)
            lr_now = float(opt.param_groups[0]["lr"])
            sched.step()
            if graphed and opt.param_groups[0]["lr"] is not lr:   # a scheduler that assigns instead of fills
                lr.fill_(float(opt.param_groups[0]["lr"]))
                opt.param_groups[0]["lr"] = lr
            history.append({"epoch": epoch + 1, "train_mse": float(total) / max(seen, 1), "lr": lr_now})
        if graph is not None:
            history[-1].update(graph.stats())
        return history


class DecoderStepGraph:
    """The decoder's training step as one CUDA graph (``graphs.CaptureSchedule``, the trainer's recipe): the
    batch indices in a static tensor, the noise generator registered with the graph; the lr is a device
    tensor. ``strict``: ``train.cuda_graph=on`` (a failed capture raises; auto runs eager steps instead)."""

    def __init__(self, step, batch_size: int, total: torch.Tensor, gen: torch.Generator, device,
                 strict: bool = False):
        self.body, self.total, self.gen = step, total, gen
        self.idx = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.schedule = CaptureSchedule(device, strict, "decoder attack's step")

    def step(self, idx: torch.Tensor) -> None:
        self.schedule.run(lambda: self.body(idx, self.total), lambda: self.body(self.idx, self.total),
                          lambda: self.idx.copy_(idx), [self.gen])

    def stats(self) -> dict:
        return self.schedule.stats()
