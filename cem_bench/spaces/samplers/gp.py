"""``gp``: Optuna's Gaussian-process sampler (multi-objective through its own acquisition)."""

from __future__ import annotations

from . import register
from ._checks import BOOL, INT_OR_NONE, NONNEG_INT


@register("gp", {"seed": INT_OR_NONE, "n_startup_trials": NONNEG_INT, "deterministic_objective": BOOL},
          doc=__doc__)
def build(optuna, spec, opts):
    opts.setdefault("warn_independent_sampling", False)
    return optuna.samplers.GPSampler(**opts)
