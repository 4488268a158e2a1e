"""The process a trial runs in: which device, which seeds, which TF32 flags. Small and separate from the trainer
(issue 37: trainer.py held process utilities beside the step), imported by the trainer, the trial, the CLI,
calibrate and the bench."""

from __future__ import annotations

import torch

from ..errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available; use train.device=cpu or auto")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None:
        # what PyTorch does on the "current" device rather than a named one must land on this card too:
        # torch.cuda.graph's capture stream, is_bf16_supported, the RNG that fork_rng saves, a bare "cuda".
        # Without this a trial on cuda:1 captured its step on a stream of device 0 (an empty graph).
        torch.cuda.set_device(device)
    return device


def set_tf32(mode: str) -> None:
    """``train.tf32``: the process's TF32 flags for cuDNN convolutions and cuBLAS matrix products (process-wide, as
    PyTorch keeps them; a trial is one process). ``auto`` restores PyTorch's defaults rather than leaving what an
    earlier trial of the same process set. The legacy ``allow_tf32`` flags, which every other place in the project that
    touches TF32 uses too: PyTorch refuses a mix of these and the newer ``fp32_precision`` settings."""
    conv, matmul = {"auto": (True, False), "on": (True, True), "off": (False, False)}[mode]
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, matmul


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
