"""How a trial's training step is built: as a CUDA graph or eagerly (``train.cuda_graph``), with the
surrogate on its own CUDA stream (``train.surrogate_stream``) and compiled (``train.compile_surrogate``), and
the Inductor options of that compile. Read from the config by the trainer when it is built.
"""

from __future__ import annotations

import torch

from ..config import TrialConfig
from ..errors import ConfigError
from . import graphs


def graph_mode(cfg: TrialConfig, device: torch.device) -> bool:
    """Whether the training step runs as a CUDA graph (``train.cuda_graph``; ``graphs.graph_mode``); ``on``
    without CUDA is refused."""
    if cfg.train.cuda_graph == "on" and device.type != "cuda":
        raise ConfigError(f"train.cuda_graph=on needs a CUDA device; the trial runs on {device}. Use "
                          f"train.cuda_graph=auto (graphs on CUDA, the eager step elsewhere) or off")
    return graphs.graph_mode(cfg.train.cuda_graph, device, cfg.train.compile)


def surrogate_options(cfg: TrialConfig, graphed: bool) -> tuple[bool, bool]:
    """``(own stream, compiled)`` of the surrogate's training forward (``train.surrogate_stream``,
    ``train.compile_surrogate``): ``auto`` is on for a graphed CUDA step, where both were measured to take the
    eager step to rounding, step by step (docs/performance.md), and off elsewhere. The stream is CUDA only."""
    t = cfg.train
    return (t.surrogate_stream == "on" or (t.surrogate_stream == "auto" and graphed),
            t.compile_surrogate == "on" or (t.compile_surrogate == "auto" and graphed))


# Inductor options of the compiled surrogate (train.compile_surrogate): its backward computes each slot-attention
# iteration's weight gradients as separate small products of one shape, which this pass batches into one; on a
# graphed CUDA step each product is a kernel on the step's critical path (docs/performance.md)
SURROGATE_COMPILE_OPTIONS = {"post_grad_fusion_options": {"batch_linear_post_grad": {}}}
