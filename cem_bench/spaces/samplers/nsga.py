"""``nsga2`` and ``nsga3``: Optuna's genetic multi-objective samplers. The population defaults to a quarter of
the budget, between 4 and 50, so that a short search gets past its first generation."""

from __future__ import annotations

from . import register
from ._checks import INT, POS_INT, PROB, SEED

NSGA = {"seed": SEED, "population_size": ("an integer >= 2", lambda v: INT[1](v) and v >= 2),
        "mutation_prob": ("a number in [0, 1] or empty", lambda v: v is None or PROB[1](v)),
        "crossover_prob": PROB, "swapping_prob": PROB}


def _population(spec, opts) -> dict:
    opts.setdefault("population_size", max(4, min(50, spec.num_samples // 4)))
    return opts


@register("nsga2", NSGA, doc=__doc__)
def build_nsga2(optuna, spec, opts):
    return optuna.samplers.NSGAIISampler(**_population(spec, opts))


@register("nsga3", {**NSGA, "dividing_parameter": POS_INT}, doc=__doc__)
def build_nsga3(optuna, spec, opts):
    return optuna.samplers.NSGAIIISampler(**_population(spec, opts))
