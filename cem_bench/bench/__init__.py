"""``cem-bench bench``: the performance harness behind every speed claim (docs/architecture.md §4,
docs/performance.md, Performance habits).

A header (device, CPU count, torch version, date, git commit, load average) and one table. Every figure is
the median of several timed repeats after warm-up, and every comparison is a ratio of two figures measured
in the same run, timed alternately (docs/performance.md). The row groups, each a module that registers
itself with ``harness.row``, run in this order:

1. ``data`` (data.py): on-device batches with augmentation against a torchvision ``DataLoader`` with the
   same augmentation as PIL transforms.
2. ``step`` (step.py): ``Trainer.step`` with lambda = 0 and with each registered surrogate, against the
   lambda = 0 step; ``flops`` (CUDA): achieved TFLOP/s of the lambda = 0 step, FLOPs counted by
   ``torch.utils.flop_counter``.
3. ``kernels`` (kernels.py): the kernel-launching operators of one eager step per configuration, counted
   by a ``TorchDispatchMode`` on any device, and the H200 step ratio they predict.
4. ``refit`` (refit.py): the ``gmm`` refit from cold against scikit-learn's ``KMeans`` per class.
5. ``attack`` (attack.py): a decoder-attack epoch on cached features against the same epoch plus an
   encoder pass; the 50-epoch decoder on 50k images and rmle per 1,000 images, estimated from them.
6. ``epoch`` (epoch.py): whole epochs (augmentation, steps, evaluation) scaled to 50k images, and one
   paper trial estimated from them.
7. ``ray`` (ray.py): a trial under Ray Tune against ``run_trial`` directly; Ray's start-up.
8. ``results`` (results.py): ``build_configs``, ``pareto_ranks``, the report and ``cem-bench table`` on
   synthetic results of 1,000 / 10,000 / 100,000 trials, and the Optuna samplers' ask + tell as a study grows.
9. ``ceiling`` (ceiling.py): one model alone at batch 128 to 2048, in the grid's fp32 and in bf16: the card's
   images per second for this model, the bound every packed figure is printed against.
10. ``pack`` (pack.py, CUDA): paper trials per GPU-hour with k = 1, 2, 4, 8 trial processes on one card,
   with and without MPS, measured only while all k run (a barrier releases them together), twice each.

``run_bench(device, quick, only=..., tiny=...)`` returns ``{"header": {...}, "rows": [...]}``;
``format_table`` prints it; a row group that fails is an error row, the rest of the table is still measured.
``main`` is ``cem-bench bench``.
"""

from __future__ import annotations

from . import attack, ceiling, data, epoch, kernels, pack, ray, refit, results, step  # noqa: F401 - importing a row module registers its group
from .attack import bench_attack
from .data import bench_data
from .harness import ROWS, Sizes, format_table, group_names, header, main, registered, row, run_bench, sizes_for
from .ray import RAY_TRIALS_PER_SEARCH, bench_ray
from .refit import bench_refit
from .step import bench_steps, count_step_flops

GROUPS = group_names()  # ("data", "step", ..., "results", "ceiling", "pack", "flops")

__all__ = ["GROUPS", "RAY_TRIALS_PER_SEARCH", "ROWS", "Sizes", "bench_attack", "bench_data", "bench_ray",
           "bench_refit", "bench_steps", "count_step_flops", "format_table", "group_names", "header", "main",
           "registered", "row", "run_bench", "sizes_for"]
