"""Search-space YAML -> validated ``SearchSpec``.

``load_space`` reads a file, ``parse_space`` validates a mapping completely: it checks the whole file before
anything runs and raises one ``SpaceError`` that lists every problem, one a line, each starting with its YAML
path (``params.cem.lambd: empty range [64, 1] ...``). Command-line overrides are merged in first.

The validator ``_Parser`` runs in stages: the top level, the objectives, resources, fixed keys and the utility
tolerance here; the params, their ``when`` conditions and the combination checks in ``parse_params.py``; the
sampler, seeds, grid, baseline, confirmation and scheduler in ``parse_plan.py``; the hypotheses written down
before the run in ``parse_hypotheses.py``.
Importing this module imports neither torch nor Optuna nor Ray.
"""

from __future__ import annotations

import copy
import difflib
import math
from typing import Any

from ..config import ConfigError, TrialConfig, coerce, flatten, key_specs, read_yaml
from ..errors import SpaceError
from ..schema import DEFAULT_UTILITY_TOLERANCE, margin_problem
from .parse_hypotheses import HypothesisStages
from .parse_params import ParamStages, as_number, fmt_value
from .parse_plan import PlanStages
from .spec import (
    METRICS,
    MODES,
    REQUIRED_KEYS,
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
                try:
                    fixed = flatten(fixed)
                except ConfigError:
                    continue     # the file's own fixed: is refused by _Parser.fixed, with the file's words
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


class _Parser(ParamStages, PlanStages, HypothesisStages):
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
        # pinned first: a key an override fixed is no longer searched, so its other values meet no trial
        params = self.pin(params, fixed)
        if self.fixed_ok:
            self.check_combinations(fixed, params)
            if not self.errors:   # each value alone is valid: now the values together
                self.check_cells(fixed, params)
        # every check that reads one field, or the fields as parsed, runs before the first refusal, so that
        # one run lists them all; only those that count configurations (which a parameter left out by its own
        # error would change) wait for the rest to be clean
        if grid:
            self.grid_kinds(params)
        baseline_n = self.baseline_form(doc.get("baseline"))
        top, confirm_reps = self.confirm(doc.get("confirm"))
        tolerance = self.utility_tolerance(doc.get("utility_tolerance"), objectives[0].metric if objectives else None)
        scheduler = self.scheduler(doc.get("scheduler"), objectives, fixed, params, grid, seeds)
        hypotheses, alpha, correction = self.hypotheses_form(doc.get("hypotheses"), grid, seeds)
        self.attacks_run(objectives, hypotheses, fixed, params)
        self.cem_keys_without_cem(fixed, params)
        self.keys_no_surrogate_reads(fixed, params)
        if self.errors:
            raise SpaceError(self.errors, self.path)
        if grid:
            num_samples = self.grid(params, num_samples)
        elif num_samples:
            self.distinct(params, num_samples)
        baseline, cells = self.baseline(baseline_n, fixed, params, grid, seeds)
        if top and not self.errors:   # (a grid refused for its size is never listed)
            top = self.confirmable(top, doc.get("confirm"), fixed, params, grid, num_samples)
        if hypotheses and not self.errors:
            from .sampling import grid_cells
            self.hypotheses_cells(hypotheses, fixed, grid_cells(params), cells, baseline)
        if scheduler and not self.errors:
            fixed = self.probe_at_rungs(scheduler, fixed)
        if self.errors:
            raise SpaceError(self.errors, self.path)
        spec = SearchSpec(name=name, objectives=tuple(objectives), sampler=sampler, num_samples=num_samples,
                          max_concurrent=max_concurrent, resources=resources, fixed=fixed, params=tuple(params),
                          max_failures=max_failures, path=self.path, seeds=seeds, baseline_replicates=baseline,
                          baseline_cells=cells, confirm_top=top, confirm_replicates=confirm_reps,
                          scheduler=scheduler, utility_tolerance=tolerance, hypotheses=hypotheses,
                          hypotheses_alpha=alpha, hypotheses_correction=correction)
        # the baseline's and the confirmation's seeds follow the search's: past the largest a trial takes, every
        # one of those runs failed, after the whole search had run
        from ..config import MAX_SEED
        derived = [s for s in (*spec.baseline_seeds, *spec.confirm_seeds) if s > MAX_SEED]
        if derived:
            raise SpaceError([f"seeds: the baseline's and the confirmation's seeds follow the search's, and would "
                              f"reach {max(derived)}, past {MAX_SEED}, the largest seed a trial takes: give "
                              f"smaller seeds"], self.path)
        return spec

    def attacks_run(self, objectives, hypotheses, fixed: dict, params) -> None:
        """An objective or hypothesis on one attack's own metric (``attack_ssim__rmle``) needs that attack in
        ``attack.names`` (fixed, or its default): otherwise every trial ran without
        it, ranked nowhere (no front, hypervolume 0, no line saying why) or, as a hypothesis, untested."""
        from ..schema import PER_ATTACK_SEP
        if any(p.key == "attack.names" for p in params):   # (a list cannot be a searched choice today)
            return
        names = fixed.get("attack.names", key_specs()["attack.names"].default)
        run = set(names) if isinstance(names, (list, tuple)) else set()
        named = [(f"objectives[{i}].metric", o.metric) for i, o in enumerate(objectives)]
        named += [(f"hypotheses.tests[{i}].metric", h.metric) for i, h in enumerate(hypotheses or ())]
        for where, metric in named:
            attack = metric.split(PER_ATTACK_SEP, 1)[1] if PER_ATTACK_SEP in metric else None
            if attack is not None and run and attack not in run:
                self.err(where, f"{metric!r} is measured by attack {attack!r}, which the trials do not run "
                         f"(attack.names {sorted(run)}): add it to attack.names (fixed) or name one of those")

    def utility_tolerance(self, value, metric: str | None = None) -> float | None:
        """``utility_tolerance: T`` (a number >= 0, in the first objective's units): how far a configuration's
        utility may fall below its baseline's for the report to call it "at the baseline's accuracy" (the
        95 % interval of the difference must lie above -T; docs/protocol.md §9). None where the space states
        none: the report's default then applies, in the objective's own units (2 points of a fraction or of a
        percentage), and the report says it is the default, not the space's."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            self.err("utility_tolerance", f"{value!r} must be a number >= 0 in the first objective's units (0.02: "
                     "2 points of accuracy)")
            return DEFAULT_UTILITY_TOLERANCE
        why = margin_problem(metric, float(value)) if metric else None
        if why:
            self.err("utility_tolerance", f"{why} (the first objective's, {metric})")
        return float(value)

    def name(self, value) -> str:
        if value is None:
            return ""
        if not isinstance(value, str) or not SAFE_NAME.match(value) or value in (".", ".."):
            # YAML reads `name: 123` as a number: the text the user meant needs quotes
            quote = (f"; YAML read it as a number: quote it, name: \"{value}\""
                     if isinstance(value, (int, float)) and not isinstance(value, bool) else "")
            self.err("name", f"{value!r} is not a safe folder name (letters, digits, '.', '_', '-'; starting "
                     f"with a letter or digit; at most 100 characters){quote}")
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

    def metric_ok(self, where: str, metric) -> bool:
        """A metric the trials record (an objective's, a hypothesis's); else the error, with the closest name."""
        if metric in METRICS or self.one_attacks_metric(metric):
            return True
        close = difflib.get_close_matches(str(metric), METRICS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        self.err(where, f"unknown metric {metric!r}{hint}; known: {', '.join(METRICS)}, or one attack's own: "
                 f"<attack metric>__<attack> (attack_ssim__decoder)")
        return False

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
            if not self.metric_ok(f"{where}.metric", metric):
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
            if ok and ref is not None:
                from ..schema import ref_problem
                problem = ref_problem(metric, mode, ref)
                if problem:
                    self.err(f"{where}.ref", problem)
                    ok = False
            if ok:
                out.append(Objective(metric, mode, ref))
        from ..schema import objective_problems
        checked = out if len(out) == len(value) else []     # (indices hold only when every objective parsed)
        for i, problem in objective_problems([{"metric": o.metric, "mode": o.mode} for o in checked]):
            self.err(f"objectives[{i}]", problem)
        return out

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
            elif k == "cpu" and n < 1e-4:   # Ray counts in ten-thousandths: less is 0 to it (a traceback)
                self.err("resources.cpu", f"{fmt_value(v)} must be > 0 (CPUs per trial, 0.0001 or more; fractions "
                         f"are allowed)")
            elif k == "gpu" and (n < 0 or 0 < n < 1e-4):
                self.err("resources.gpu", f"{fmt_value(v)} must be >= 0 (GPUs per trial, 0 or 0.0001 or more; 0.25 = "
                         f"four trials a GPU)")
            elif k == "gpu" and n > 1:
                # a trial trains on one device (no data parallelism): Ray would reserve the other cards idle
                self.err("resources.gpu", f"{fmt_value(v)}: a trial trains on one GPU, so the other "
                         f"{fmt_value(math.ceil(n) - 1)} would be reserved and idle; give 1, or a fraction of one GPU "
                         "to pack trials onto it (0.25 = four trials a GPU)")
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
        # a section that is not a mapping, a key given both nested and flat: reported, and the other keys
        # are still checked (every problem at once)
        problems: list[str] = []
        value = flatten(value, errors=problems)
        for problem in problems:
            self.err("fixed", problem)
        out, ok_all = {}, not problems
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
