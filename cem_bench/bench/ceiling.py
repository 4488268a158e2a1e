"""Row group ``ceiling``: what the card gives this model, one model alone, as the batch grows.

One split VGG11-bn (the step rows' width; the paper's 1.0 on CUDA) trains at λ = 0 with the project's own
trainer (SGD, the graphed step on CUDA) at batch 128 (the paper's) up to 2048, in the grid's precision
(``train.amp: off``: fp32 with TF32 convolutions) and in bf16. The images per second at the best batch is
the card's ceiling for this model in that precision: k trials packed on the card (the ``pack`` group) share at
most that, so every packed figure is printed as a fraction of it, and a packed figure above it is an error of
the measurement (docs/performance.md "Packing trials on one GPU").
Each figure: ``sizes.repeats`` timed runs of ``CEILING_STEPS`` steps after untimed ones (capture,
autotuning), the median. On the CPU it runs at the step rows' tiny sizes (the code path, not a figure).
"""

from __future__ import annotations

import statistics

import torch

from .harness import Sizes, error_row, make_row, row, step_config, synthetic_splits, timed

CUDA_BATCHES = (128, 256, 512, 1024, 2048)
CPU_BATCHES = (16, 32)
PRECISIONS = ("off", "on")         # train.amp: the grid's fp32 (TF32 convolutions), and bf16 autocast


def precision_name(amp: str) -> str:
    return "fp32 (TF32 convolutions)" if amp == "off" else "bf16"
CEILING_STEPS = 20


def measure(device: torch.device, sizes: Sizes, batch: int, amp: str) -> float:
    """Images per second of one model at ``batch`` in precision ``amp``: the median of the timed runs."""
    from ..core.trial import build, build_config
    images = batch * 4
    splits = synthetic_splits(images, 64, device)
    flat = step_config(sizes, device, **{"data.train_size": images, "data.test_size": 64, "cem.lambd": 0.0,
                                         "train.batch_size": batch, "train.amp": amp, "train.augment": "none"})
    _, tr = build(build_config(flat), device, splits)
    acc = tr.epoch_acc()
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.rand((batch, *splits.image_shape), device=device, generator=gen)
    y = torch.randint(0, splits.num_classes, (batch,), device=device, generator=gen)
    lr = tr.cfg.train.lr

    def steps() -> None:
        for _ in range(CEILING_STEPS):
            tr.step(x, y, False, lr, acc)
    for _ in range(max(1, sizes.warmup)):
        steps()                                   # untimed: capture, cuDNN autotuning
    times = [timed(steps, device) for _ in range(max(1, sizes.repeats))]
    return CEILING_STEPS * batch / statistics.median(times)


_MEASURED: dict[tuple, dict[int, float]] = {}   # (device, sizes, precision) -> images/s by batch, per process


def ceiling(device: torch.device, sizes: Sizes, amp: str) -> dict:
    """``{"images_per_s", "batch", "precision", "by_batch"}``: the best batch of one model in ``amp``
    (measured once per process, shared with the ``pack`` group)."""
    key = (str(device), sizes.label, sizes.width, amp)
    if key not in _MEASURED:
        batches = CUDA_BATCHES if device.type == "cuda" else CPU_BATCHES
        _MEASURED[key] = {b: measure(device, sizes, b, amp) for b in batches}
    by_batch = _MEASURED[key]
    batch = max(by_batch, key=by_batch.get)
    return {"images_per_s": by_batch[batch], "batch": batch, "precision": precision_name(amp),
            "by_batch": by_batch}


@row("ceiling", "ceiling", order=58)
def bench_ceiling(device: torch.device, sizes: Sizes) -> list[dict]:
    rows = []
    for amp in PRECISIONS:
        if amp == "on" and device.type == "cpu" and not sizes.label.startswith("tiny"):
            continue                               # CPU bf16 is not a figure anyone packs trials by
        label = f"ceiling ({'grid fp32' if amp == 'off' else 'bf16'}): one model, best batch"
        try:
            top = ceiling(device, sizes, amp)
            per_batch = ", ".join(f"{b}: {v:,.0f}" for b, v in top["by_batch"].items())
            rows.append(make_row(label, top["images_per_s"], "images/s", note=(
                f"batch {top['batch']}; images/s by batch: {per_batch}; width {sizes.width:g}, λ = 0, the "
                f"trainer's {'graphed ' if device.type == 'cuda' else ''}step; at most "
                f"{top['images_per_s'] * 3600 / (240 * 50000):.1f} paper trials (240 × 50k images) per hour "
                f"of training on this {device.type}"), samples=list(top["by_batch"].values()),
                by_batch={str(b): v for b, v in top["by_batch"].items()}))
        except Exception as e:  # noqa: BLE001
            rows.append(error_row(label, e))
    return rows
