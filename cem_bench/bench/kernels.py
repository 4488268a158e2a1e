"""Row group ``kernels``: the kernels one training step launches, counted on any device.

Under a CUDA graph (``train.cuda_graph``) Python does not launch the step, so what a surrogate adds to it
is set by how many small kernels it runs, one after another (docs/performance.md, 'Kernels per step').
The count needs no GPU, so a change to a surrogate can be measured where it is made.

``OpCounter`` is a ``TorchDispatchMode`` that counts the ATen operators that run below autograd, except
those that launch no kernel: views, allocations without initialisation, reads of a tensor's metadata and
``_local_scalar_dense`` (a host read; a graphed step has none). ``count_step`` counts one eager
``Trainer.step`` (forward, noise, CE, the CEM loss, backward, the optimizers, the log accumulators) after
one uncounted step that creates the optimizer state. The row reports each configuration's count, the
surrogate's extra operators over the lambda = 0 step, the operators it has most of, and the GPU ratio that
the count predicts: 1 + extra x ``US_PER_OP`` / ``STEP0_MS`` (the constants fitted on the H200's
measurements, below). The count is the same on every run of the same code (the row's test checks it).

Where the CPU count differs from a CUDA step: ``nn.GRUCell`` is one fused kernel on CUDA and about 16
operators on the CPU (slot attention runs one per iteration, so the CPU count of the three slot-attention
surrogates is high by about 40 forward and 40 backward operators); a matrix product is one operator here
and one or two cuBLAS kernels there. On CUDA the row counts a real eager CUDA step.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .harness import Sizes, error_row, make_row, named_config, row, step_config, step_trainer, synthetic_splits

# operators that launch no kernel (views are recognised by their schema, ``OpOverload.is_view``)
NO_KERNEL = frozenset({
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "_local_scalar_dense",
    "lift_fresh", "_unsafe_view", "set_", "resize_", "is_same_size", "_has_compatible_shallow_copy_type",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "numel", "dim", "size", "stride",
})

# the model of a graphed step's time from its operator count: STEP0_MS + US_PER_OP x the surrogate's extra
# operators (the fit and its data: docs/performance.md, 'Kernels per step')
STEP0_MS = 1.65
US_PER_OP = 2.86


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` counts the kernel-launching ATen operators run inside, by name
    (``c.counts``, a ``Counter``; ``c.total``)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NO_KERNEL:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def count_step(trainer, x: torch.Tensor, y: torch.Tensor, cem_on: bool, lr: float) -> Counter:
    """The operators of one eager ``trainer.step`` on ``(x, y)``, after one uncounted step (optimizer state,
    lazy initialisations). The trainer must not be graphed (a replay dispatches nothing)."""
    if trainer.graph_step is not None:
        raise ValueError("count_step needs an eager trainer (train.cuda_graph=off): a graph replay runs no operators")
    acc = trainer.epoch_acc()
    trainer.step(x, y, cem_on, lr, acc)
    with OpCounter() as counter:
        trainer.step(x, y, cem_on, lr, acc)
    return counter.counts


def predicted_ratio(extra_ops: int) -> float:
    """The graphed step time over the lambda = 0 step on the H200 that ``extra_ops`` predict."""
    return 1.0 + extra_ops * US_PER_OP / 1e3 / STEP0_MS


def count_configs(device: torch.device, sizes: Sizes, names: list[str] | None = None,
                  errors: dict[str, BaseException] | None = None) -> dict[str, Counter]:
    """``{"lambda=0": ops, surrogate: ops, ...}`` for one step of each configuration at ``sizes`` (default:
    lambda = 0 and every surrogate), all on the same batch. With ``errors`` a configuration that fails is
    recorded there and the others are still counted; without, it raises."""
    from .. import surrogates
    from ..core import data
    from ..core.schedule import lr_at

    images = max(2 * sizes.batch_size, 256)
    splits = synthetic_splits(images, 20, device)
    gen = torch.Generator(device=device).manual_seed(0)
    x, y = next(iter(data.BatchIterator(splits.train, splits, sizes.batch_size, "crop_flip_rotate", gen)))
    base = step_config(sizes, device, **{"data.train_size": images, "data.test_size": 20, "train.cuda_graph": "off"})
    out: dict[str, Counter] = {}
    for name in names or ["lambda=0"] + surrogates.names():
        try:
            cfg, tr = step_trainer({**base, **named_config(name)}, device, splits)
            out[name] = count_step(tr, x, y, tr.surrogate is not None, lr_at(cfg, 1))
        except Exception as e:  # noqa: BLE001 - one broken surrogate must not hide the others
            if errors is None:
                raise
            errors[name] = e
    return out


@row("kernels", "kernels per step", order=25)
def bench_kernels(device: torch.device, sizes: Sizes) -> list[dict]:
    """Kernel-launching operators of one eager step, per configuration, and the H200 ratio they predict."""
    errors: dict[str, BaseException] = {}
    counts = count_configs(device, sizes, errors=errors)
    rows = [error_row(f"kernels per step: {name}", e) for name, e in errors.items()]
    if "lambda=0" not in counts:
        return rows
    base = sum(counts["lambda=0"].values())
    setting = f"width {sizes.width:g}, batch {sizes.batch_size}, {device.type}, eager step counted"
    for name, ops in counts.items():
        total = sum(ops.values())
        if name == "lambda=0":
            rows.append(make_row("kernels per step: lambda=0", total, "ops", note=setting))
            continue
        extra = ops - counts["lambda=0"]
        top = ", ".join(f"{k} {v}" for k, v in extra.most_common(6))
        rows.append(make_row(f"kernels per step: {name}", total, "ops", base, "lambda=0 ops",
                             predicted_ratio(total - base), "x lambda=0 (H200 est.)",
                             note=f"{setting}; +{total - base} ops over lambda=0 (most: {top}); est. = 1 + "
                                  f"extra x {US_PER_OP} us / {STEP0_MS} ms (fitted, docs/performance.md)"))
    return rows
