"""The split VGG11-bn of the CEM paper (docs/reference.md §1).

Client encoder f: the first ``cut_layer`` entries of VGG config 'A' (conv-BN-ReLU, max-pool), then a
bottleneck conv to ``bottleneck_channels`` with no ReLU, then a sigmoid ("sgm"). Its output is the smashed
data, 8x8x8 = 512 values per CIFAR image at the paper's setting. The SCA/LCA layer that the reference's
default script adds is not part of cem-bench: "noise + CEM" is the defense under test.

Server g: a conv back to the cut's width (no BN, no ReLU), the rest of VGG11-bn, and the classifier
Dropout-Linear-ReLU-Dropout-Linear-ReLU-Linear. Client init is Xavier-uniform with zero biases (as the
reference); the server keeps PyTorch's default init.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig
from ..errors import ConfigError

VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


def _ch(c: int, width: float) -> int:
    return max(1, int(round(c * width)))


def _layers(entries, in_ch: int, width: float) -> tuple[list[nn.Module], int]:
    layers: list[nn.Module] = []
    for e in entries:
        if e == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            out = _ch(e, width)
            layers += [nn.Conv2d(in_ch, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            in_ch = out
    return layers, in_ch


class ClientEncoder(nn.Module):
    """f: image -> smashed data (clean, before noise)."""

    def __init__(self, cfg: ModelConfig, in_channels: int = 3):
        super().__init__()
        layers, ch = _layers(VGG11[: cfg.cut_layer], in_channels, cfg.width)
        self.cut_channels = ch
        if cfg.bottleneck_channels > 0:
            layers.append(nn.Conv2d(ch, cfg.bottleneck_channels, 3, padding=1))
            ch = cfg.bottleneck_channels
        if cfg.sigmoid:
            layers.append(Sigmoid32())
        self.features = nn.Sequential(*layers)
        self.out_channels = ch
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The smashed data in fp32, also under bf16 autocast (what is transmitted, noised and attacked)."""
        return self.features(x).float()


class Sigmoid32(nn.Module):
    """The smashed data's sigmoid computed in fp32 (under autocast the conv before it runs in bf16, whose
    steps near 1 are 0.004: a quarter of the smallest defense noise searched)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x.float())


class Server(nn.Module):
    """g: noisy smashed data -> logits (server convs and classifier)."""

    def __init__(self, cfg: ModelConfig, num_classes: int, client: ClientEncoder):
        super().__init__()
        ch = client.out_channels
        layers: list[nn.Module] = []
        if cfg.bottleneck_channels > 0:
            layers.append(nn.Conv2d(ch, client.cut_channels, 3, padding=1))  # "noRELU": no BN, no ReLU
            ch = client.cut_channels
        rest, ch = _layers(VGG11[cfg.cut_layer:], ch, cfg.width)
        self.features = nn.Sequential(*layers, *rest)
        hidden = _ch(512, cfg.width)
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(ch, hidden), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(z), 1))


def build(cfg: ModelConfig, num_classes: int, image_shape=(3, 32, 32)) -> tuple[ClientEncoder, Server]:
    client = ClientEncoder(cfg, image_shape[0])
    n_pools = sum(1 for e in VGG11 if e == "M")
    if image_shape[1] % (2 ** n_pools) or image_shape[2] % (2 ** n_pools):
        raise ValueError(f"image size {image_shape[1:]} must be divisible by {2 ** n_pools} for VGG11")
    if image_shape[1] != 2 ** n_pools or image_shape[2] != 2 ** n_pools:
        raise ValueError(f"the VGG11 classifier expects {2 ** n_pools}x{2 ** n_pools} images, got {image_shape[1:]}")
    return client, Server(cfg, num_classes, client)


def feature_shape(client: ClientEncoder, image_shape=(3, 32, 32)) -> tuple[int, int, int]:
    """(C, H, W) of the smashed data for one image."""
    with torch.no_grad():
        was = client.training
        client.eval()
        dev = next(client.parameters()).device
        out = client(torch.zeros(1, *image_shape, device=dev))
        client.train(was)
    return tuple(out.shape[1:])


def count_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


# ------------------------------------------------------------------------------ running the client
def amp_dtype(train_cfg, device: torch.device):
    """The one autocast policy of training, evaluation and the decoder attack (rmle runs the encoder without
    autocast: fp32, TF32 as ``train.tf32`` sets it): bf16 on a CUDA card with native bf16
    (compute capability 8 and later; ``train.amp`` auto or on), none on the CPU unless ``train.amp`` is on,
    never with ``off``. ``auto`` on an older card runs fp32; ``on`` there is refused."""
    if train_cfg.amp == "off" or (train_cfg.amp == "auto" and device.type != "cuda"):
        return None
    # Native bf16 only: torch.cuda.is_bf16_supported() alone also says yes through emulation on cards before
    # Ampere (a bf16 tensor can be made there), where cuDNN has no bf16 convolution engines and the step fails
    # or crawls. The current device is the trial's (runtime.resolve_device sets it).
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        if train_cfg.amp == "auto":
            return None
        major, minor = torch.cuda.get_device_capability(device)
        raise ConfigError(f"train.amp: on needs native bf16, which {torch.cuda.get_device_name(device)} "
                          f"(compute capability {major}.{minor}; bf16 needs 8.0 or later) does not have: cuDNN "
                          f"has no bf16 convolutions for it; set train.amp: off (or auto, which runs fp32 here)")
    return torch.bfloat16


@torch.no_grad()
def encode(client: nn.Module, batches, device: torch.device, amp) -> torch.Tensor:
    """The clean features (fp32 whatever the autocast: noise is added to these values) of normalised image
    batches, concatenated on the device. The caller sets eval mode."""
    out = []
    for x in batches:
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            out.append(client(x).float())
    return torch.cat(out)


def count_train_flops(client: nn.Module, server: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      amp: torch.dtype | None) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of client and server on the batch ``(x, y)`` with cross-entropy, as a
    training step runs them (``amp`` autocast dtype or None, channels_last on CUDA), counted by
    ``FlopCounterMode`` (convolutions and matrix products; batch norm, activations, the noise and the optimizer
    are not counted). Counted in eval mode, so batch norm's running statistics and dropout's random stream are
    left as they were (eval changes none of the counted operations); gradients are cleared, weights untouched."""
    from torch.utils.flop_counter import FlopCounterMode

    if x.device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    modes = client.training, server.training
    client.eval()
    server.eval()
    cast = torch.autocast(x.device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            with cast:
                logits = server(client(x).float())
            loss = F.cross_entropy(logits.float(), y)
            forward = counter.get_total_flops()
            loss.backward()
    finally:
        client.zero_grad(set_to_none=True)
        server.zero_grad(set_to_none=True)
        client.train(modes[0])
        server.train(modes[1])
    return int(forward), int(counter.get_total_flops())
