"""The stages of the search-space validator that say how the search runs: the sampler and its options, the
seeds of the replicates, the grid's cells and the count of distinct configurations a sampler can propose, the
λ = 0 baseline, the confirmation of the best configurations, and the early-stopping scheduler with the probe at
its rungs.

``PlanStages`` is a mixin of ``parse._Parser`` (as ``parse_params.ParamStages`` is); it uses the parser's
``specs``, ``errors``, ``err`` and ``count``. Every problem is appended to ``errors`` so that all of them are
reported at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from ..analysis.noise import MIN_RUNS
from ..config import MAX_SEED, key_specs
from . import samplers, schedulers
from .spec import DEFAULT_BASELINE_REPLICATES, DEFAULT_CONFIRM, RUNG_METRICS

# the most trials one search plans (a grid's cells, a baseline's cells): a typo in a choice list must not
# build a list of 10^9 configurations before a word is said
MAX_CELLS = 100_000


def discrete_count(p) -> int | None:
    """How many values a parameter can take when they are finitely many (a choice, an int range, a uniform range
    with a step, as Optuna samples them: low, low + step, … up to high), else None; counted, not listed."""
    if p.kind == "choice":
        return len(p.choices)
    if p.kind == "int":
        return len(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
    if p.kind == "uniform" and p.step and not p.log:
        return int(math.floor((float(p.high) - float(p.low)) / float(p.step) + 1e-9)) + 1
    return None


def as_choice(p):
    """``p`` as the choice of its ``discrete_count`` values (for counting cells under `when`)."""
    if p.kind == "int":
        values = tuple(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
    elif p.kind == "uniform":
        # as Optuna draws them: low + i·step, never past high (0 + 7·0.1 is 0.7000000000000001, outside the
        # range: a cell no sampler proposes, refused by the config, and a near-copy of one that ran)
        values = tuple(min(float(p.low) + i * float(p.step), float(p.high)) for i in range(discrete_count(p)))
    else:
        return p
    return dataclasses.replace(p, kind="choice", choices=values)


class PlanStages:
    """The sampler, seeds, grid, distinct, baseline, confirm, scheduler and probe-at-rungs stages of
    ``parse._Parser`` (see the module docstring)."""

    def scheduler(self, value, objectives, fixed: dict, params, grid: bool, seeds) -> dict | None:
        """``scheduler: {name: moasha, grace_epochs: G, reduction_factor: η}`` (docs/search.md), or a bare name:
        stop trials that are dominated at a rung. The name and the options are those of a plug-in of
        ``schedulers/`` (an unknown one is refused with the list; left-out options take their defaults).
        ``fifo`` or left out: every trial runs to the end (None). Refused, for any scheduler that stops trials,
        where stopping has no sound meaning: the grid (every cell must finish), replicates (one configuration's
        seeds would be stopped one by one), an objective with no per-epoch stand-in, a searched ``train.epochs``;
        and whatever the plug-in's own ``check`` refuses against ``train.epochs`` (moasha: a first rung at or past
        the end). The baseline's and the confirmation's runs are never stopped (``search.moasha``)."""
        if value is None:
            return None
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, dict):
            forms = " or ".join(schedulers.get(n).form() for n in schedulers.names())
            self.err("scheduler", f"{value!r} must be a mapping such as {forms}, or a bare name (known: "
                     f"{', '.join(schedulers.names())})")
            return None
        name = value.get("name")
        plugin = schedulers.get(name) if isinstance(name, str) else None
        if plugin is None:
            self.err("scheduler.name", f"unknown scheduler {name!r}; known: {', '.join(schedulers.names())}")
            return None
        known, ok = plugin.options, True
        for k, v in value.items():
            if k == "name":
                continue
            if k not in known:
                self.err(f"scheduler.{k}", f"unknown option of scheduler {name!r}; known: "
                         f"{', '.join(known) or 'none (it takes no options)'}")
                ok = False
            elif (problem := known[k].problem(v)) is not None:
                self.err(f"scheduler.{k}", problem)
                ok = False
        if not plugin.stops_trials:
            return None
        out = {"name": name, **plugin.defaults(), **{k: v for k, v in value.items() if k != "name"}}
        if grid:
            self.err("scheduler", "the grid sampler runs every cell to the end (a paper table has no holes): "
                     "leave the scheduler out, or use another sampler")
        if len(seeds) > 1:
            self.err("scheduler", f"replicates: {len(seeds)} with a scheduler would stop a configuration's "
                     "seeds one by one on their own noise; use replicates: 1 (the confirmation runs re-measure the "
                     "best configurations with new seeds)")
        if any(p.key == "seed" for p in params):
            # a configuration's id leaves the seed out: searched seeds are its replicates, and the scheduler would
            # stop them one by one, its mean then over the seeds it kept
            self.err("scheduler", "seed is searched: its values are replicates of one configuration, and a "
                     "scheduler would stop them one by one on their own noise, the configuration's mean then "
                     "over the seeds it kept; fix the seed (or use replicates: 1 and the confirmation's new seeds), "
                     "or leave the scheduler out")
        for o in objectives:
            if o.metric not in RUNG_METRICS:
                self.err("scheduler", f"objective {o.metric} has no per-epoch value to rank by at a rung; the "
                         f"scheduler ranks by {', '.join(sorted(RUNG_METRICS))}")
        if any(p.key == "train.epochs" for p in params):
            self.err("scheduler", "train.epochs is searched: the rungs are epochs of one fixed length; fix "
                     "train.epochs")
        epochs = fixed.get("train.epochs", self.specs["train.epochs"].default)
        if ok and plugin.check is not None and isinstance(epochs, int) and not isinstance(epochs, bool):
            opts = {k: v for k, v in out.items() if k != "name"}
            for option, message in plugin.check(opts, epochs):
                self.err(f"scheduler.{option}" if option else "scheduler", message)
        return out

    def probe_at_rungs(self, scheduler: dict, fixed: dict) -> dict:
        """The privacy probe runs after every rung's epoch (``attack.probe_epochs``): set it, or check that
        a space that sets it covers the rungs (the epochs its plug-in may stop a trial at)."""
        epochs = fixed.get("train.epochs", self.specs["train.epochs"].default)
        try:
            rungs = schedulers.get(scheduler["name"]).rungs({k: v for k, v in scheduler.items() if k != "name"}, epochs)
        except ValueError as e:     # a plug-in whose check lets through what its rungs refuse
            self.err("scheduler", f"{e} (train.epochs {epochs})")
            return fixed
        fixed = {"train.epochs": epochs, **fixed}     # the rungs' length, stated (SearchSpec.rungs reads it)
        given = fixed.get("attack.probe_epochs")
        if given:
            missing = sorted(set(rungs) - set(given))
            if missing:
                self.err("fixed.attack.probe_epochs", f"{list(given)} misses the scheduler's rung epochs "
                         f"{missing}; leave it out (the rungs {rungs} are set) or add them")
            return fixed
        return {**fixed, "attack.probe_epochs": rungs}

    def baseline_form(self, value) -> int | None:
        """``baseline: {replicates: N}`` (N >= ``noise.MIN_RUNS``, or 0), ``true`` (N = 3) or ``false``: the
        λ = 0 runs that measure the search's noise floor. Fewer than MIN_RUNS runs are refused rather than run:
        such a baseline is compared with nothing (docs/protocol.md §9), so its runs would be spent for a band.
        Returns N (0: none, also after a refusal), or None where it is left out (its default depends on the
        parameters: ``baseline``)."""
        if value is None:
            return None
        if value is True:
            return DEFAULT_BASELINE_REPLICATES
        if value is False:
            return 0
        if isinstance(value, dict) and set(value) <= {"replicates"} and "replicates" in value:
            n = value["replicates"]
            if isinstance(n, bool) or not isinstance(n, int) or 0 < n < MIN_RUNS or n < 0:
                self.err("baseline.replicates", f"{n!r} must be an integer >= {MIN_RUNS} (a comparison needs "
                         f"{MIN_RUNS} runs a side), or 0 for no baseline")
                return 0
            return n
        self.err("baseline", f"{value!r} must be {{replicates: N}} (N >= {MIN_RUNS}), true ({{replicates: "
                 f"{DEFAULT_BASELINE_REPLICATES}}}) or false")
        return 0

    def cem_keys_without_cem(self, fixed: dict, params) -> None:
        """A searched ``cem.*`` key with ``cem.lambd`` fixed at 0: no surrogate runs at λ = 0, so each of its
        values trains the same model (the tables null such keys at λ = 0: ``aggregate.null_inapplicable``), and
        the sampler's "distinct" configurations would be one run repeated."""
        if not lambda_fixed_at_zero(fixed, params):
            return
        for p in params:
            if p.key.startswith("cem."):
                self.err(f"params.{p.key}", "is searched with cem.lambd fixed at 0: no surrogate runs at λ = 0, "
                         "so every value trains the same model; fix cem.lambd above 0, search it, or drop this "
                         "parameter")

    def baseline(self, n: int | None, fixed: dict, params, grid: bool, seeds) -> tuple[int, tuple[dict, ...]]:
        """The baseline's runs and cells from ``baseline_form``'s N. Left out (None): on wherever λ can be
        non-zero, except a replicated grid whose λ = 0 cells already are the baseline. One cell per combination
        of the searched keys that change the baseline (every searched key outside ``cem.``), which must
        therefore be choices."""
        lam = next((p for p in params if p.key == "cem.lambd"), None)
        lam_zero = lambda_fixed_at_zero(fixed, params)
        if n is None:
            on = not lam_zero if lam is None else \
                not (grid and len(seeds) >= 2 and lam.choices is not None and 0 in lam.choices)
            n = DEFAULT_BASELINE_REPLICATES if on else 0
        if not n:
            return 0, ({},)
        if lam_zero:
            # every configuration is then a λ = 0 run: the baseline's seeds repeated the search's runs exactly
            self.err("baseline", f"{{replicates: {n}}} with cem.lambd fixed at 0: every configuration is a λ = 0 "
                     f"run already, so the baseline would repeat them; set baseline: false, or search cem.lambd")
            return 0, ({},)
        changing = [p for p in params if not p.key.startswith("cem.") and p.key != "seed"]
        bad = False
        for p in changing:
            if p.kind != "choice" or p.when:
                self.err(f"params.{p.key}", "changes the λ = 0 baseline (it is not a cem.* key), so the baseline "
                         "runs once per value: make it an unconditional {choice: [...]}, or set baseline: false")
                bad = True
        if bad or not changing:
            return n, ({},)
        bound = math.prod(len(p.choices) for p in changing)
        if bound > MAX_CELLS:
            self.err("baseline", f"the λ = 0 baseline would run once per value of {', '.join(p.key for p in changing)}: "
                     f"{bound:,} cells, more than the {MAX_CELLS:,} trials cem-bench plans for one search")
            return n, ({},)
        cells = tuple(dict(zip([p.key for p in changing], combo))
                      for combo in itertools.product(*[p.choices for p in changing]))
        return n, cells

    def confirm(self, value) -> tuple[int, int]:
        """``confirm: {top: K, replicates: R}`` (K >= 1, R >= ``noise.MIN_RUNS``), ``true`` (the default, top 3
        with 3 seeds) or ``false``: after the search, the K best configurations run again with R new seeds."""
        if value is None or value is True:
            return DEFAULT_CONFIRM["top"], DEFAULT_CONFIRM["replicates"]
        if value is False:
            return 0, 0
        if not isinstance(value, dict) or not set(value) <= {"top", "replicates"}:
            self.err("confirm", f"{value!r} must be {{top: K, replicates: R}}, true ({{top: "
                     f"{DEFAULT_CONFIRM['top']}, replicates: {DEFAULT_CONFIRM['replicates']}}}) or false")
            return 0, 0
        top = value.get("top", DEFAULT_CONFIRM["top"])
        reps = value.get("replicates", DEFAULT_CONFIRM["replicates"])
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            self.err("confirm.top", f"{top!r} must be an integer >= 1, or 0 for no confirmation")
            return 0, 0
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < MIN_RUNS:
            # fewer confirmation runs give no verdict (docs/protocol.md §9): the confirmation would claim nothing
            self.err("confirm.replicates", f"{reps!r} must be an integer >= {MIN_RUNS} (a comparison needs "
                     f"{MIN_RUNS} runs a side)")
            return 0, 0
        return (top, reps) if top else (0, 0)

    def confirmable(self, top: int, given, fixed: dict, params, grid: bool, num_samples: int) -> int:
        """``confirm.top`` as the search can run it: at most its configurations with λ ≠ 0 (a grid's cells with
        λ ≠ 0, a sampler's ``num_samples``), so that the banner's count is one the search can reach. With λ fixed
        at 0 there is nothing to confirm: the default is then off, and a ``confirm`` given is refused (the
        banner promised runs the end of the search said were "none with λ ≠ 0")."""
        if lambda_fixed_at_zero(fixed, params):
            if given is not None:   # (false never reaches here: its top is 0)
                shown = "true" if given is True else repr(given)
                self.err("confirm", f"{shown} with cem.lambd fixed at 0: the confirmation runs the best λ ≠ 0 "
                         f"configurations again, and there are none; set confirm: false, or search cem.lambd")
            return 0
        if grid:
            from .sampling import grid_cells
            if math.prod(len(p.choices) for p in params) > MAX_CELLS:
                return top   # refused by ``grid`` already; never listed
            default = fixed.get("cem.lambd", key_specs()["cem.lambd"].default)
            cap = sum(1 for c in grid_cells(params) if float(c.get("cem.lambd", default)) != 0)
        else:
            cap = num_samples
        return min(top, cap)

    def grid_kinds(self, params) -> None:
        """Sampler grid enumerates discrete values: every parameter must be a choice."""
        for p in params:
            if p.kind != "choice":
                self.err(f"params.{p.key}", "sampler grid enumerates discrete values: give it {choice: [...]} "
                         "(continuous and integer ranges are for the other samplers)")

    def grid(self, params, num_samples: int) -> int:
        """Sampler grid (every parameter a choice: ``grid_kinds``, checked before): ``num_samples`` is the
        number of cells (the distinct configurations once ``when`` conditions are applied), given or not."""
        from .sampling import grid_cells
        bound = math.prod(len(p.choices) for p in params)
        if bound > MAX_CELLS:
            self.err("params", f"sampler grid over {bound:,} cells (the product of the choices' lengths), more than "
                     f"the {MAX_CELLS:,} trials cem-bench plans for one search; use a sampler (tpe, nsga2, random) "
                     f"with num_samples instead")
            return 1
        cells = len(grid_cells(params))
        if num_samples and num_samples != cells:
            self.err("num_samples", f"{num_samples} with sampler grid, whose space has {cells} "
                     f"cell{'s' * (cells != 1)}; leave it "
                     f"out (it defaults to the number of cells) or set it to {cells}")
        return cells

    def distinct(self, params, num_samples: int) -> None:
        """A sampler cannot propose more distinct configurations than a discrete space holds: the searcher
        rejects a repeat, and a repeat run would count as a replicate of the same seed. ``num_samples`` above
        that count is refused, naming it (replicates are ``replicates:``/``seeds:``, not repeats). No parameters
        left (an override fixed every searched key; a file's own empty ``params`` is refused before) is one
        configuration."""
        from .sampling import grid_cells
        sizes = [discrete_count(p) for p in params]
        if any(n is None for n in sizes):
            return   # a continuous parameter: more configurations than any budget
        bound = math.prod(sizes)
        if bound >= num_samples:
            if bound > MAX_CELLS:
                return
            # exact, with the `when` conditions applied (an int or a stepped uniform as its values: counted as
            # its whole range, a conditional one was counted in cells where it is not sampled)
            bound = len(grid_cells([as_choice(p) for p in params]))
            if bound >= num_samples:
                return
        why = "" if params else " (every key it searches is fixed by --set)"
        self.err("num_samples", f"{num_samples}, but the space holds only {bound} distinct configuration"
                 f"{'s' * (bound != 1)}{why}: a sampler cannot propose more, and a repeat is not a replicate (its runs "
                 f"would share a seed). Set num_samples to {bound} or fewer (sampler grid runs each once); for "
                 f"several seeds of each, add replicates: N")

    def seeds(self, replicates, seeds, fixed: dict, params) -> tuple[int, ...]:
        """``replicates: N`` (seeds base..base+N-1, base = the fixed ``seed`` or 0) or ``seeds: [...]``: every
        configuration runs once per seed, each run its own trial."""
        if replicates is None and seeds is None:
            return ()
        if any(p.key == "seed" for p in params):
            self.err("params.seed", "the seed is set per replicate (replicates/seeds); it cannot be searched too")
            return ()
        if seeds is not None:
            ok = (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool)
                                                            for s in seeds) and len(set(seeds)) == len(seeds))
            if not ok:
                self.err("seeds", f"{seeds!r} must be a non-empty list of distinct integers")
                return ()
            if replicates is not None and replicates != len(seeds):
                self.err("replicates", f"{replicates!r} disagrees with the {len(seeds)} seeds given; give one of them")
            if "seed" in fixed:   # the trials run the listed seeds; search_space.json would record this one
                self.err("fixed.seed", f"{fixed['seed']!r}, but seeds: {seeds!r} sets each run's seed; remove one of "
                         f"them (with replicates: N, a fixed seed is the first of N)")
            bad = [s for s in seeds if not 0 <= s <= MAX_SEED]
            if bad:   # refused here, not by every trial at its start
                self.err("seeds", f"{bad!r} outside the seeds a trial takes, 0 to {MAX_SEED} (the key seed)")
            return tuple(seeds)
        n = self.count("replicates", replicates, 1)
        base = fixed.get("seed", 0)
        base = base if isinstance(base, int) and not isinstance(base, bool) else 0
        return tuple(range(base, base + n))

    def sampler(self, value) -> dict:
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, dict):
            self.err("sampler", f"expected {{name: {'|'.join(samplers.names())}, seed: ..., ...}}, got {value!r}")
            return {"name": "tpe"}
        name = value.get("name", "tpe")
        plugin = samplers.get(name) if isinstance(name, str) else None
        if plugin is None:
            self.err("sampler.name", f"unknown sampler {name!r}; known: {', '.join(samplers.names())}")
            return dict(value)
        known = plugin.options
        for k, v in value.items():
            if k == "name":
                continue
            if k not in known:
                self.err(f"sampler.{k}", f"unknown option of sampler {name!r}; " +
                         (f"known: {', '.join(known)}" if known else "it takes no options"))
            elif not known[k][1](v):
                self.err(f"sampler.{k}", f"{v!r} must be {known[k][0]}")
        return dict(value, name=name)


def lambda_fixed_at_zero(fixed: dict, params) -> bool:
    """Is ``cem.lambd`` not searched and fixed (or left at its default) at the number 0: CEM off in every trial?"""
    if any(p.key == "cem.lambd" for p in params):
        return False
    value = fixed.get("cem.lambd", key_specs()["cem.lambd"].default)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
