"""``tpe``: Optuna's TPE, multivariate, grouped for conditional spaces, with the constant liar for parallel
trials (several trials run at once; without the liar they would be proposed knowing the same)."""

from __future__ import annotations

from . import register
from ._checks import BOOL, NONNEG_INT, POS_INT, SEED

OPTIONS = {"seed": SEED, "n_startup_trials": NONNEG_INT, "n_ei_candidates": POS_INT,
           "multivariate": BOOL, "group": BOOL, "constant_liar": BOOL}


@register("tpe", OPTIONS, doc=__doc__)
def build(optuna, spec, opts):
    opts.setdefault("multivariate", True)
    opts.setdefault("group", spec.conditional and opts["multivariate"])
    opts.setdefault("constant_liar", True)
    return optuna.samplers.TPESampler(**opts)
