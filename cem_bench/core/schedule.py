"""The learning-rate schedule and the scales the CEM step takes from it: ``lr_at`` (the scheduled rate of an
epoch), ``applied_lr`` (the one the optimizers step with), ``inject_scale`` (s(η) of the paper's gradient
injection) and ``estimator_sign`` (the sign of the surrogate's own update). Pure functions of the config, shared
by the trainer, the CEM strength (``strength.py``, ``calibrate.py``) and the bench.
"""

from __future__ import annotations

from ..config import TrialConfig

INJECT_LR_KNEE = 4.1e-4  # the reference's s(eta) switches to 1 below this lr


def lr_at(cfg: TrialConfig, epoch: int) -> float:
    """Scheduled learning rate of 1-based ``epoch``: x gamma for each milestone already passed.

    ``train.milestones_epochs`` (when set) has the reference's MultiStepLR meaning, stepped with the epoch
    index: epoch e is decayed by every milestone m <= e (the reference's 60 puts epoch 60 at 0.01).
    Otherwise epoch e is decayed by the fractions f of ``train.milestones`` with (e - 1) / epochs >= f, so at
    240 epochs the drops come at epochs 61/121/181/211 and short runs keep their first epochs at full lr.
    This is the rate s(eta) of the gradient injection uses; ``applied_lr`` is the one the optimizers step with.
    """
    if cfg.train.milestones_epochs:
        k = sum(1 for m in cfg.train.milestones_epochs if epoch >= m)
    else:
        done = (epoch - 1) / cfg.train.epochs
        k = sum(1 for f in cfg.train.milestones if done >= f - 1e-9)
    return cfg.train.lr * cfg.train.gamma ** k


def applied_lr(cfg: TrialConfig, epoch: int) -> float:
    """The rate the SGD optimizers step with in ``epoch``: ``lr_at``, except 0 in epoch 1 under
    ``train.reference_warmup_lr0`` (the reference's WarmUpLR, built after the MultiStepLR, sets the rate to 0
    in its constructor and is first stepped at the end of epoch 1; docs/reference.md §2). The steps still run:
    momentum buffers (with weight decay) and BatchNorm running statistics move, the weights do not."""
    if cfg.train.reference_warmup_lr0 and epoch == 1:
        return 0.0
    return lr_at(cfg, epoch)


def estimator_sign(estimator_fit: str) -> float:
    """The sign with which the surrogate's own parameters descend the CEM loss: -1 = ascend (adversarial)."""
    return -1.0 if estimator_fit == "adversarial" else 1.0


def inject_scale(lr: float) -> float:
    """s(eta) of the paper's gradient injection."""
    return 0.001 / lr if lr >= INJECT_LR_KNEE else 1.0
