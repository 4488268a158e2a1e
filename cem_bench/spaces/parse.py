"""Search-space YAML -> validated ``SearchSpec``.

``load_space`` reads a file, ``parse_space`` validates a mapping completely: it checks the whole file before
anything runs and raises one ``SpaceError`` that lists every problem, one a line, each starting with its YAML
path (``params.cem.lambd: empty range [64, 1] ...``). Command-line overrides are merged in first.

The validator ``_Parser`` runs in stages: the top level, objectives, sampler, budget, resources and fixed keys
here; the params, their ``when`` conditions and the combination checks in ``parse_params.py``.
Importing this module imports neither torch nor Optuna nor Ray.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import math
from typing import Any

from ..config import ConfigError, TrialConfig, coerce, flatten, key_specs, read_yaml
from ..errors import SpaceError
from ..schema import DEFAULT_UTILITY_TOLERANCE
from . import samplers, schedulers
from .parse_params import ParamStages, as_number, fmt_value
from .spec import (
    DEFAULT_BASELINE_REPLICATES,
    DEFAULT_CONFIRM,
    METRICS,
    MODES,
    REQUIRED_KEYS,
    RUNG_METRICS,
    SAFE_NAME,
    TOP_KEYS,
    Objective,
    SearchSpec,
)


# ------------------------------------------------------------------------------------------ loading
def load_space(path: str, overrides: dict | None = None) -> SearchSpec:
    """Read and validate a search-space YAML file. ``overrides`` (applied before validation):
    ``name``, ``num_samples``, ``max_concurrent``, ``max_failures``, ``resources.cpu``, ``resources.gpu``,
    ``sampler.<option>`` (a value of None is ignored: "not given on the command line"), and ``fixed``:
    ``{flat key: value}`` merged into the fixed keys. Fixing a key the file searches removes it from the
    search; parameters conditioned on it are kept (condition met) or dropped (condition not met)."""
    doc = read_yaml(path, "search space", lambda message: SpaceError(message, path))
    return parse_space(doc, path=path, overrides=overrides)


def parse_space(doc: dict, path: str | None = None, overrides: dict | None = None) -> SearchSpec:
    """Validate a search-space mapping (as read from YAML) completely; raise one ``SpaceError`` listing
    every problem, or return the ``SearchSpec``."""
    if not isinstance(doc, dict):
        raise SpaceError(f"search space{' ' + repr(path) if path else ''} must be a mapping with keys "
                         f"{', '.join(TOP_KEYS)}; got {type(doc).__name__}", path)
    doc = copy.deepcopy(doc)
    errors: list[str] = []
    pinned = _apply_overrides(doc, overrides or {}, errors)
    return _Parser(doc, path, pinned, errors).parse()


def _apply_overrides(doc: dict, overrides: dict, errors: list[str]) -> set[str]:
    """Merge overrides into ``doc``; return the keys fixed by an override (allowed to shadow a param)."""
    pinned: set[str] = set()
    for key, value in overrides.items():
        if key == "fixed":
            if not isinstance(value, dict):
                errors.append(f"overrides.fixed: expected a mapping of config keys to values, got {value!r}")
                continue
            fixed = doc.get("fixed")
            if not isinstance(fixed, dict):
                fixed = {} if fixed is None else fixed
            if isinstance(fixed, dict):
                fixed = flatten(fixed)
                fixed.update(flatten(dict(value)))
                doc["fixed"] = fixed
                pinned.update(flatten(dict(value)))
            continue
        if value is None:
            continue
        if key in ("name", "num_samples", "max_concurrent", "max_failures"):
            doc[key] = _from_cli(value) if key != "name" else value
        elif key.startswith("resources.") or key.startswith("sampler."):
            section, option = key.split(".", 1)
            sub = doc.get(section)
            if section == "sampler" and isinstance(sub, str):
                sub = {"name": sub}
            if not isinstance(sub, dict):
                sub = {}
            sub[option] = value if option == "name" else _from_cli(value)
            doc[section] = sub
        else:
            errors.append(f"overrides.{key}: unknown override; known: name, num_samples, max_concurrent, "
                          "max_failures, resources.cpu, resources.gpu, sampler.<option>, fixed")
    return pinned


def _from_cli(value: Any) -> Any:
    """'8' -> 8, '0.5' -> 0.5 for overrides that came from the command line; anything else unchanged."""
    if isinstance(value, str):
        s = value.strip()
        for conv in (int, float):
            try:
                return conv(s)
            except ValueError:
                pass
    return value


# the most trials one search plans (a grid's cells, a baseline's cells): a typo in a choice list must not
# build a list of 10^9 configurations before a word is said
MAX_CELLS = 100_000


class _Parser(ParamStages):
    """One validation of one document: ``parse()`` runs every stage, collects every problem in ``errors``
    and raises them together as one ``SpaceError``, or returns the ``SearchSpec``."""

    def __init__(self, doc: dict, path: str | None, pinned: set[str], errors: list[str]):
        self.doc, self.path, self.pinned, self.errors = doc, path, pinned, errors
        self.specs = key_specs()
        self.fixed_ok = True

    def err(self, where: str, msg: str) -> None:
        self.errors.append(f"{where}: {msg}")

    # -------------------------------------------------------------------------------- top level
    def parse(self) -> SearchSpec:
        doc = self.doc
        for k in doc:
            if k not in TOP_KEYS:
                close = difflib.get_close_matches(str(k), TOP_KEYS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.err(str(k), f"unknown field{hint}; known: {', '.join(TOP_KEYS)}")
        for k in REQUIRED_KEYS:
            if k not in doc or doc[k] is None:
                self.err(k, "missing (required)")

        name = self.name(doc.get("name"))
        objectives = self.objectives(doc.get("objectives")) if doc.get("objectives") is not None else ()
        sampler = self.sampler(doc.get("sampler", {"name": "tpe"}))
        grid = sampler.get("name") == "grid"
        if "num_samples" in doc and doc["num_samples"] is not None:
            num_samples = self.count("num_samples", doc.get("num_samples"), 1)
        else:
            num_samples = 0   # the grid's cell count (below); any other sampler needs it
            if not grid:
                self.err("num_samples", "missing (required) -- except with sampler grid, where it is the number "
                         "of cells")
        max_concurrent = self.count("max_concurrent", doc.get("max_concurrent", 1), 1)
        max_failures = self.count("max_failures", doc.get("max_failures", 2), -1)
        resources = self.resources(doc.get("resources", {}))
        fixed = self.fixed(doc.get("fixed") or {})
        params = self.params(doc.get("params"), fixed) if doc.get("params") is not None else ()
        seeds = self.seeds(doc.get("replicates"), doc.get("seeds"), fixed, params)
        if self.fixed_ok:
            self.check_combinations(fixed, params)
        if self.errors:
            raise SpaceError(self.errors, self.path)
        params = self.pin(params, fixed)
        if grid:
            num_samples = self.grid(params, num_samples)
        elif num_samples:
            self.distinct(params, num_samples)
        baseline, cells = self.baseline(doc.get("baseline"), fixed, params, grid, seeds)
        top, confirm_reps = self.confirm(doc.get("confirm"))
        tolerance = self.utility_tolerance(doc.get("utility_tolerance", DEFAULT_UTILITY_TOLERANCE))
        scheduler = self.scheduler(doc.get("scheduler"), objectives, fixed, params, grid, seeds)
        if scheduler and not self.errors:
            fixed = self.probe_at_rungs(scheduler, fixed)
        if self.errors:
            raise SpaceError(self.errors, self.path)
        return SearchSpec(name=name, objectives=tuple(objectives), sampler=sampler, num_samples=num_samples,
                          max_concurrent=max_concurrent, resources=resources, fixed=fixed, params=tuple(params),
                          max_failures=max_failures, path=self.path, seeds=seeds, baseline_replicates=baseline,
                          baseline_cells=cells, confirm_top=top, confirm_replicates=confirm_reps,
                          scheduler=scheduler, utility_tolerance=tolerance)

    def utility_tolerance(self, value) -> float:
        """``utility_tolerance: T`` (a number >= 0, in the first objective's units): how far a configuration's
        utility may fall below its baseline's for the report to call it "at the baseline's accuracy" (the
        95 % interval of the difference must lie above -T; docs/protocol.md §9)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            self.err("utility_tolerance", f"{value!r} must be a number >= 0 in the first objective's units (0.02: "
                     "2 points of accuracy)")
            return DEFAULT_UTILITY_TOLERANCE
        return float(value)

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

    def baseline(self, value, fixed: dict, params, grid: bool, seeds) -> tuple[int, tuple[dict, ...]]:
        """``baseline: {replicates: N}`` (N >= 2, or 0), ``true`` (N = 3) or ``false``: the λ = 0 runs that
        measure the search's noise floor. Left out: on wherever λ can be non-zero, except a replicated grid
        whose λ = 0 cells already are the baseline. One cell per combination of the searched keys that change
        the baseline (every searched key outside ``cem.``), which must therefore be choices."""
        lam = next((p for p in params if p.key == "cem.lambd"), None)
        if value is None:
            if lam is None:
                fixed_lam = fixed.get("cem.lambd", 16.0)
                value = not (isinstance(fixed_lam, (int, float)) and fixed_lam == 0)
            else:
                value = not (grid and len(seeds) >= 2 and lam.choices is not None and 0 in lam.choices)
        if value is True:
            n = DEFAULT_BASELINE_REPLICATES
        elif value is False:
            n = 0
        elif isinstance(value, dict) and set(value) <= {"replicates"} and "replicates" in value:
            n = value["replicates"]
            if isinstance(n, bool) or not isinstance(n, int) or n == 1 or n < 0:
                self.err("baseline.replicates", f"{n!r} must be an integer >= 2 (a noise floor needs two runs), "
                         "or 0 for no baseline")
                return 0, ({},)
        else:
            self.err("baseline", f"{value!r} must be {{replicates: N}} (N >= 2), true ({{replicates: "
                     f"{DEFAULT_BASELINE_REPLICATES}}}) or false")
            return 0, ({},)
        if not n:
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
        """``confirm: {top: K, replicates: R}`` (K >= 1, R >= 2), ``true`` (the default, top 3 with 3 seeds) or
        ``false``: after the search, the K best configurations run again with R new seeds."""
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
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 2:
            self.err("confirm.replicates", f"{reps!r} must be an integer >= 2 (an interval needs two runs)")
            return 0, 0
        return (top, reps) if top else (0, 0)

    def grid(self, params, num_samples: int) -> int:
        """Sampler grid: every parameter a choice; ``num_samples`` is the number of cells (the distinct
        configurations once ``when`` conditions are applied), given or not."""
        from .sampling import grid_cells
        bad = [p.key for p in params if p.kind != "choice"]
        for key in bad:
            self.err(f"params.{key}", "sampler grid enumerates discrete values: give it {choice: [...]} "
                     "(continuous and integer ranges are for the other samplers)")
        if bad:
            return max(num_samples, 1)
        bound = math.prod(len(p.choices) for p in params)
        if bound > MAX_CELLS:
            self.err("params", f"sampler grid over {bound:,} cells (the product of the choices' lengths), more than "
                     f"the {MAX_CELLS:,} trials cem-bench plans for one search; use a sampler (tpe, nsga2, random) "
                     f"with num_samples instead")
            return 1
        cells = len(grid_cells(params))
        if num_samples and num_samples != cells:
            self.err("num_samples", f"{num_samples} with sampler grid, whose space has {cells} cells; leave it "
                     f"out (it defaults to the number of cells) or set it to {cells}")
        return cells

    def distinct(self, params, num_samples: int) -> None:
        """A sampler cannot propose more distinct configurations than a discrete space holds: the searcher
        rejects a repeat, and a repeat run would count as a replicate of the same seed. ``num_samples`` above
        that count is refused, naming it (replicates are ``replicates:``/``seeds:``, not repeats)."""
        from .sampling import grid_cells
        if not params or any(p.kind not in ("choice", "int") for p in params):
            return   # a continuous parameter: more configurations than any budget
        sizes = [len(p.choices) if p.kind == "choice" else
                 (int(p.high) - int(p.low)) // int(p.step or 1) + 1 for p in params]
        bound = math.prod(sizes)
        if bound >= num_samples:
            if bound > MAX_CELLS:
                return
            if all(p.kind == "choice" for p in params):
                bound = len(grid_cells(params))   # exact, with the `when` conditions applied
            if bound >= num_samples:
                return
        self.err("num_samples", f"{num_samples}, but the space holds only {bound} distinct configuration"
                 f"{'s' * (bound != 1)}: a sampler cannot propose more, and a repeat is not a replicate (its runs "
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
            return tuple(seeds)
        n = self.count("replicates", replicates, 1)
        base = fixed.get("seed", 0)
        base = base if isinstance(base, int) and not isinstance(base, bool) else 0
        return tuple(range(base, base + n))

    def name(self, value) -> str:
        if value is None:
            return ""
        if not isinstance(value, str) or not SAFE_NAME.match(value) or value in (".", ".."):
            self.err("name", f"{value!r} is not a safe folder name (letters, digits, '.', '_', '-'; starting "
                     "with a letter or digit; at most 100 characters)")
            return str(value)
        return value

    @staticmethod
    def one_attacks_metric(metric) -> bool:
        """``attack_ssim__decoder``: a registered attack's own metric (the trial records it when that attack is
        in ``attack.names``)."""
        from ..schema import attack_of, base_metric
        if not isinstance(metric, str) or attack_of(metric) is None or base_metric(metric) == "attack_s":
            return False
        from ..attacks import names
        return attack_of(metric) in names()

    def objectives(self, value) -> list[Objective]:
        if not isinstance(value, list):
            self.err("objectives", f"expected a list of {{metric, mode, ref}}, got {value!r}")
            return []
        if not 2 <= len(value) <= 3:
            self.err("objectives", f"{len(value)} objective(s) given; a frontier search needs 2 or 3")
        out, seen = [], set()
        for i, o in enumerate(value):
            where = f"objectives[{i}]"
            if not isinstance(o, dict):
                self.err(where, f"expected {{metric: ..., mode: max|min, ref: ...}}, got {o!r}")
                continue
            for k in o:
                if k not in ("metric", "mode", "ref"):
                    self.err(f"{where}.{k}", "unknown field; known: metric, mode, ref")
            metric, mode, ref = o.get("metric"), o.get("mode"), o.get("ref")
            ok = True
            if metric not in METRICS and not self.one_attacks_metric(metric):
                close = difflib.get_close_matches(str(metric), METRICS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.err(f"{where}.metric", f"unknown metric {metric!r}{hint}; known: {', '.join(METRICS)}, or one "
                         f"attack's own: <attack metric>__<attack> (attack_ssim__decoder)")
                ok = False
            elif metric in seen:
                self.err(f"{where}.metric", f"{metric!r} is listed twice")
                ok = False
            seen.add(metric)
            if mode not in MODES:
                self.err(f"{where}.mode", f"{mode!r}; allowed: max, min")
                ok = False
            if ref is not None:
                r = as_number(ref)
                if r is None:
                    self.err(f"{where}.ref", f"{ref!r} is not a finite number (or leave it out)")
                    ok = False
                ref = None if r is None else float(r)
            if ok:
                out.append(Objective(metric, mode, ref))
        return out

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
                self.err(f"sampler.{k}", f"unknown option of sampler {name!r}; known: {', '.join(known)}")
            elif not known[k][1](v):
                self.err(f"sampler.{k}", f"{v!r} must be {known[k][0]}")
        return dict(value, name=name)

    def count(self, where: str, value, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.err(where, f"{value!r} must be an integer >= {minimum}")
            return max(minimum, 1)
        return value

    def resources(self, value) -> dict:
        out = {"cpu": 1.0, "gpu": 0.0}
        if not isinstance(value, dict):
            self.err("resources", f"expected {{cpu: ..., gpu: ...}}, got {value!r}")
            return out
        for k, v in value.items():
            if k not in out:
                self.err(f"resources.{k}", "unknown resource; known: cpu, gpu (per trial)")
                continue
            n = as_number(v)
            if n is None:
                self.err(f"resources.{k}", f"{v!r} is not a number")
            elif k == "cpu" and n <= 0:
                self.err("resources.cpu", f"{fmt_value(v)} must be > 0 (CPUs per trial; fractions are allowed)")
            elif k == "gpu" and n < 0:
                self.err("resources.gpu", f"{fmt_value(v)} must be >= 0 (GPUs per trial; 0.25 = four trials a GPU)")
            elif k == "gpu" and n > 1 and not float(n).is_integer():
                self.err("resources.gpu", f"{fmt_value(v)}: Ray accepts a fraction of one GPU or a whole number")
            else:
                out[k] = float(n)
        return out

    # ------------------------------------------------------------------------------ config keys
    def key_ok(self, where: str, key: Any) -> bool:
        if not isinstance(key, str) or key not in self.specs:
            close = difflib.get_close_matches(str(key), self.specs.keys(), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            sec = str(key).split(".")[0]
            same = [k for k in self.specs if k.startswith(sec + ".")]
            known = f"; known {sec}.* keys: {', '.join(same)}" if same else "; `cem-bench keys` lists them all"
            self.err(where, f"unknown config key {key!r}{hint}{known}")
            return False
        return True

    def coerce(self, where: str, key: str, value: Any) -> tuple[bool, Any]:
        try:
            return True, coerce(key, value, self.specs[key])
        except ConfigError as e:
            self.err(where, str(e))
            return False, None

    def fixed(self, value) -> dict:
        if not isinstance(value, dict):
            self.err("fixed", f"expected a mapping of config keys to values, got {value!r}")
            self.fixed_ok = False
            return {}
        value = flatten(value)
        out, ok_all = {}, True
        for key, v in value.items():
            where = f"fixed.{key}"
            if not self.key_ok(where, key):
                ok_all = False
                continue
            ok, cv = self.coerce(where, key, v)
            ok_all &= ok
            if ok:
                out[key] = cv
        if ok_all:
            try:
                TrialConfig.from_flat(out)
            except ConfigError as e:
                self.errors.extend(f"fixed: {line}" for line in str(e).splitlines())
                ok_all = False
        self.fixed_ok = ok_all
        return out
