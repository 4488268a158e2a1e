"""Search spaces: a YAML file -> validated ``SearchSpec`` -> Optuna define-by-run function and sampler.

A search space names the experiment, its 2 or 3 objectives (metric, mode, hypervolume reference), the
Optuna sampler, the trial budget and per-trial resources, the config keys it fixes and the keys it
searches (README.md, Search, "Search")::

    params:
      cem.surrogate: {choice: [gmm, gated_attention, slot_cross]}
      cem.lambd: {loguniform: [1, 64]}
      cem.num_slots: {int: [2, 16], when: {cem.surrogate: [slot_cross]}}

``parse_space`` checks the whole file before anything runs and raises one ``SpaceError`` that lists every
problem, one a line, each starting with its YAML path (``params.cem.lambd: empty range [64, 1] ...``).

- ``spec.py``: ``Objective``, ``Param``, ``SearchSpec`` and the vocabularies (metrics, modes, kinds, samplers);
- ``parse.py``: ``load_space``, ``parse_space`` and the validator's top-level stages;
  ``parse_params.py``: its params / when / combination stages; ``parse_plan.py``: the scheduler, baseline,
  confirmation, grid and sampler stages;
- ``sampling.py``: ``define_by_run``, ``make_sampler``, ``trial_config`` (the Optuna side);
- ``samplers/``: the sampler plug-ins, one file each (``tpe``, ``nsga`` for nsga2/nsga3, ``gp``, ``random``,
  ``grid``): a name, the options a space may give, a builder;
- ``schedulers/``: the early-stopping scheduler plug-ins, one file each (``moasha``, ``fifo``): a name, the
  options a space may give (type, range, default, meaning), the epochs it may stop a trial at, a builder that
  the search hands Ray's pieces (``search.moasha.make_scheduler``).

Nothing here imports Ray; Optuna is imported only by ``make_sampler``. ``import cem_bench.spaces`` imports
no torch either; validating a file does, because it needs the surrogate and attack registries (their names,
their keys, ``surrogates.resolve``), and registering a plug-in imports its torch module.
"""

from ..errors import SpaceError
from .parse import load_space, parse_space
from .sampling import define_by_run, grid_cells, make_sampler, trial_config
from .spec import KINDS, METRICS, MODES, SAMPLER_OPTIONS, SAMPLERS, Objective, Param, SearchSpec

__all__ = ["KINDS", "METRICS", "MODES", "SAMPLER_OPTIONS", "SAMPLERS", "Objective", "Param", "SearchSpec",
           "SpaceError", "define_by_run", "grid_cells", "load_space", "make_sampler", "parse_space", "trial_config"]
