"""The Optuna side of a search space: the define-by-run function, the sampler, and one trial's full config.

Nothing here imports Ray; Optuna is imported only by ``make_sampler`` (``define_by_run`` only calls the
``trial`` object Optuna hands it), so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import ConfigError, coerce, flatten, key_specs
from ..errors import SpaceError
from . import samplers
from .spec import SearchSpec


def define_by_run(spec: SearchSpec) -> Callable[[Any], dict]:
    """The define-by-run function for ``OptunaSearch(space=...)``: suggests the parameters in order,
    skipping those whose ``when`` does not hold, and returns the fixed keys as constants (which Ray
    merges into the trial's config)."""
    params = spec.params
    fixed = dict(spec.fixed)

    def space(trial) -> dict:
        values: dict[str, Any] = {}
        for p in params:
            if not p.active(values):
                continue
            if p.kind == "choice":
                values[p.key] = trial.suggest_categorical(p.key, list(p.choices))
            elif p.kind == "int":
                values[p.key] = trial.suggest_int(p.key, p.low, p.high, step=p.step or 1, log=p.log)
            else:
                values[p.key] = trial.suggest_float(p.key, p.low, p.high, step=p.step, log=p.log)
        return dict(fixed)

    return space


def grid_cells(params) -> list[dict[str, Any]]:
    """Every distinct configuration of a discrete space, in file order: a parameter whose ``when`` does not
    hold in a cell is left out of it (so lambda = 0 with a surrogate that applies only for lambda > 0 is one
    cell, not one per surrogate). ``params`` must be ordered so that a parameter follows those it names."""
    cells: list[dict[str, Any]] = [{}]
    for p in params:
        out = []
        for cell in cells:
            if p.active(cell):
                out.extend({**cell, p.key: v} for v in p.choices)
            else:
                out.append(cell)
        cells = out
    return cells


def make_sampler(spec: SearchSpec):
    """The Optuna sampler named by ``spec.sampler``: tpe (multivariate, grouped for conditional spaces,
    constant liar for parallel trials), nsga2, nsga3 (population defaults to a quarter of the budget,
    between 4 and 50, so that a short search gets past its first generation), gp, random."""
    import warnings

    import optuna
    with warnings.catch_warnings():  # `group` and friends are "experimental" in Optuna 5; nothing to act on
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _make_sampler(optuna, spec)


def _make_sampler(optuna, spec: SearchSpec):
    name = spec.sampler.get("name", "tpe")
    plugin = samplers.get(name)
    if plugin is None:
        raise SpaceError(f"sampler.name: unknown sampler {name!r}; known: {', '.join(samplers.names())}", spec.path)
    return plugin.build(optuna, spec, {k: v for k, v in spec.sampler.items() if k != "name"})


def trial_config(spec: SearchSpec, params: dict) -> dict:
    """The full flat config of one trial: the fixed keys, then the sampled ones (flat dotted keys, or a
    config nested by section). Known keys are coerced to their types (an int-searched lambda becomes a
    float); ``TrialConfig.from_flat`` still validates the result."""
    from ..schema import EXECUTION_KEYS
    specs = key_specs()
    out = dict(spec.fixed)
    for k, v in flatten(dict(params)).items():
        if k in specs:
            try:
                v = coerce(k, v, specs[k])
            except ConfigError:
                pass  # left for from_flat to report with its context
        out[k] = v
    # the fixed keys that only say how a trial runs are this driver's: a trial's config carries the fixed keys
    # the searcher proposed it with, and a --resume that moved the data (data.root) or the device would
    # otherwise run every restored and later trial, confirmation runs included, with the old ones
    out.update({k: v for k, v in spec.fixed.items() if k in EXECUTION_KEYS})
    return out
