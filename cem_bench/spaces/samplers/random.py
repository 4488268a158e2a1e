"""``random``: independent uniform draws (Optuna's RandomSampler): the baseline every other sampler must beat."""

from __future__ import annotations

from . import register
from ._checks import SEED


@register("random", {"seed": SEED}, doc=__doc__)
def build(optuna, spec, opts):
    return optuna.samplers.RandomSampler(**opts)
