"""``gp``: Optuna's Gaussian-process sampler (multi-objective through its own acquisition)."""

from __future__ import annotations

from . import register
from ._checks import BOOL, NONNEG_INT, SEED


@register("gp", {"seed": SEED, "n_startup_trials": NONNEG_INT, "deterministic_objective": BOOL},
          doc=__doc__)
def build(optuna, spec, opts):
    opts.setdefault("warn_independent_sampling", False)
    return optuna.samplers.GPSampler(**opts)
