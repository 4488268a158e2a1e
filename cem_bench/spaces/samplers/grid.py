"""``grid``: every cell of a discrete space exactly once. The cells are enqueued in order by the searcher
(``sampling.grid_cells``, ``searcher.make_searcher``); nothing is left for a sampler to choose."""

from __future__ import annotations

from . import register


@register("grid", {}, doc=__doc__)
def build(optuna, spec, opts):
    return optuna.samplers.RandomSampler(seed=0)
