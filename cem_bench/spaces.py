"""Search-space YAML -> validated ``SearchSpec`` -> Optuna define-by-run function.

A search space names the experiment, its 2 or 3 objectives (metric, mode, hypervolume reference), the
Optuna sampler, the trial budget and per-trial resources, the config keys it fixes and the keys it
searches (DESIGN.md, "Search")::

    params:
      cem.surrogate: {choice: [gmm, gated_attention, slot_cross]}
      cem.lambd: {loguniform: [1, 64]}
      cem.num_slots: {int: [2, 16], when: {cem.surrogate: [slot_cross]}}

``parse_space`` checks the whole file before anything runs and raises one ``SpaceError`` that lists every
problem, one a line, each starting with its YAML path (``params.cem.lambd: empty range [64, 1] ...``).
Nothing here imports Ray; Optuna is imported only by ``define_by_run`` and ``make_sampler``.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .config import ConfigError, TrialConfig, coerce, flatten, key_specs
from .errors import SpaceError  # noqa: F401  (re-exported)
from .schema import OBJECTIVE_METRICS




METRICS: tuple[str, ...] = OBJECTIVE_METRICS
MODES = ("max", "min")
KINDS = ("uniform", "loguniform", "int", "choice")

# Sampler name -> options it accepts (with their type check). Anything else is an error listing these.
_INT = ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
_INT_OR_NONE = ("an integer or empty", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)))
_BOOL = ("true or false", lambda v: isinstance(v, bool))
_PROB = ("a number in [0, 1]", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1)
_POS_INT = ("an integer >= 1", lambda v: _INT[1](v) and v >= 1)
_NONNEG_INT = ("an integer >= 0", lambda v: _INT[1](v) and v >= 0)
_NSGA = {"seed": _INT_OR_NONE, "population_size": ("an integer >= 2", lambda v: _INT[1](v) and v >= 2),
         "mutation_prob": ("a number in [0, 1] or empty", lambda v: v is None or _PROB[1](v)),
         "crossover_prob": _PROB, "swapping_prob": _PROB}
SAMPLER_OPTIONS: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "tpe": {"seed": _INT_OR_NONE, "n_startup_trials": _NONNEG_INT, "n_ei_candidates": _POS_INT,
            "multivariate": _BOOL, "group": _BOOL, "constant_liar": _BOOL},
    "nsga2": dict(_NSGA),
    "nsga3": {**_NSGA, "dividing_parameter": _POS_INT},
    "gp": {"seed": _INT_OR_NONE, "n_startup_trials": _NONNEG_INT, "deterministic_objective": _BOOL},
    "random": {"seed": _INT_OR_NONE},
}
SAMPLERS = tuple(sorted(SAMPLER_OPTIONS))

_TOP_KEYS = ("name", "objectives", "sampler", "num_samples", "max_concurrent", "max_failures", "resources",
             "fixed", "params")
_REQUIRED = ("name", "objectives", "num_samples", "params")
_PARAM_FIELDS = (*KINDS, "log", "step", "when")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str                      # "max" | "min"
    ref: float | None = None       # hypervolume reference point (the worst value worth counting)


@dataclass(frozen=True)
class Param:
    key: str
    kind: str                      # "uniform" | "loguniform" | "int" | "choice"
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple | None = None
    log: bool = False
    step: float | int | None = None
    when: dict[str, tuple] = field(default_factory=dict)   # param key -> allowed values; all must hold

    def active(self, values: dict[str, Any]) -> bool:
        """Whether this parameter is sampled, given the values sampled before it."""
        return all(ref in values and values[ref] in allowed for ref, allowed in self.when.items())

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"key": self.key, "kind": self.kind}
        if self.kind == "choice":
            d["choices"] = list(self.choices)
        else:
            d["low"], d["high"] = self.low, self.high
            d["log"] = self.log
            if self.step is not None:
                d["step"] = self.step
        if self.when:
            d["when"] = {k: list(v) for k, v in self.when.items()}
        return d


@dataclass(frozen=True)
class SearchSpec:
    name: str
    objectives: tuple[Objective, ...]
    sampler: dict
    num_samples: int
    max_concurrent: int
    resources: dict
    fixed: dict
    params: tuple[Param, ...]
    max_failures: int = 2
    path: str | None = None

    @property
    def metric_names(self) -> list[str]:
        return [o.metric for o in self.objectives]

    @property
    def modes(self) -> list[str]:
        return [o.mode for o in self.objectives]

    @property
    def conditional(self) -> bool:
        return any(p.when for p in self.params)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "objectives": [{"metric": o.metric, "mode": o.mode, "ref": o.ref} for o in self.objectives],
            "sampler": dict(self.sampler),
            "num_samples": self.num_samples,
            "max_concurrent": self.max_concurrent,
            "max_failures": self.max_failures,
            "resources": dict(self.resources),
            "fixed": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in self.fixed.items()},
            "params": [p.to_dict() for p in self.params],
            "path": self.path,
        }


# ------------------------------------------------------------------------------------------ loading
def load_space(path: str, overrides: dict | None = None) -> SearchSpec:
    """Read and validate a search-space YAML file. ``overrides`` (applied before validation):
    ``name``, ``num_samples``, ``max_concurrent``, ``max_failures``, ``resources.cpu``, ``resources.gpu``,
    ``sampler.<option>`` (a value of None is ignored: "not given on the command line"), and ``fixed``:
    ``{flat key: value}`` merged into the fixed keys. Fixing a key the file searches removes it from the
    search; parameters conditioned on it are kept (condition met) or dropped (condition not met)."""
    import yaml
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except FileNotFoundError:
        raise SpaceError(f"search space {path!r} does not exist", path) from None
    except OSError as e:
        raise SpaceError(f"search space {path!r} cannot be read: {e}", path) from None
    except yaml.YAMLError as e:
        raise SpaceError(f"search space {path!r} is not valid YAML: {e}", path) from None
    return parse_space(doc, path=path, overrides=overrides)


def parse_space(doc: dict, path: str | None = None, overrides: dict | None = None) -> SearchSpec:
    """Validate a search-space mapping (as read from YAML) completely; raise one ``SpaceError`` listing
    every problem, or return the ``SearchSpec``."""
    if not isinstance(doc, dict):
        raise SpaceError(f"search space{' ' + repr(path) if path else ''} must be a mapping with keys "
                         f"{', '.join(_TOP_KEYS)}; got {type(doc).__name__}", path)
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


def _num(value: Any) -> float | int | None:
    """A YAML number, also '1e-3' (which YAML 1.1 reads as a string); None if not a finite number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            return None
        if not math.isfinite(v):
            return None
        return int(v) if v.is_integer() and re.fullmatch(r"[+-]?\d+", value.strip()) else v
    return None


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


class _Parser:
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
            if k not in _TOP_KEYS:
                close = difflib.get_close_matches(str(k), _TOP_KEYS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.err(str(k), f"unknown field{hint}; known: {', '.join(_TOP_KEYS)}")
        for k in _REQUIRED:
            if k not in doc or doc[k] is None:
                self.err(k, "missing (required)")

        name = self.name(doc.get("name"))
        objectives = self.objectives(doc.get("objectives")) if doc.get("objectives") is not None else ()
        sampler = self.sampler(doc.get("sampler", {"name": "tpe"}))
        num_samples = self.count("num_samples", doc.get("num_samples"), 1) if "num_samples" in doc else 1
        max_concurrent = self.count("max_concurrent", doc.get("max_concurrent", 1), 1)
        max_failures = self.count("max_failures", doc.get("max_failures", 2), -1)
        resources = self.resources(doc.get("resources", {}))
        fixed = self.fixed(doc.get("fixed") or {})
        params = self.params(doc.get("params"), fixed) if doc.get("params") is not None else ()
        if self.fixed_ok:
            self.check_combinations(fixed, params)
        if self.errors:
            raise SpaceError(self.errors, self.path)
        params = self.pin(params, fixed)
        return SearchSpec(name=name, objectives=tuple(objectives), sampler=sampler, num_samples=num_samples,
                          max_concurrent=max_concurrent, resources=resources, fixed=fixed, params=tuple(params),
                          max_failures=max_failures, path=self.path)

    def name(self, value) -> str:
        if value is None:
            return ""
        if not isinstance(value, str) or not _SAFE_NAME.match(value) or value in (".", ".."):
            self.err("name", f"{value!r} is not a safe folder name (letters, digits, '.', '_', '-'; starting "
                     "with a letter or digit; at most 100 characters)")
            return str(value)
        return value

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
            if metric not in METRICS:
                close = difflib.get_close_matches(str(metric), METRICS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.err(f"{where}.metric", f"unknown metric {metric!r}{hint}; known: {', '.join(METRICS)}")
                ok = False
            elif metric in seen:
                self.err(f"{where}.metric", f"{metric!r} is listed twice")
                ok = False
            seen.add(metric)
            if mode not in MODES:
                self.err(f"{where}.mode", f"{mode!r}; allowed: max, min")
                ok = False
            if ref is not None:
                r = _num(ref)
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
            self.err("sampler", f"expected {{name: {'|'.join(SAMPLERS)}, seed: ..., ...}}, got {value!r}")
            return {"name": "tpe"}
        name = value.get("name", "tpe")
        if name not in SAMPLER_OPTIONS:
            self.err("sampler.name", f"unknown sampler {name!r}; known: {', '.join(SAMPLERS)}")
            return dict(value)
        known = SAMPLER_OPTIONS[name]
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
            n = _num(v)
            if n is None:
                self.err(f"resources.{k}", f"{v!r} is not a number")
            elif k == "cpu" and n <= 0:
                self.err("resources.cpu", f"{_fmt(v)} must be > 0 (CPUs per trial; fractions are allowed)")
            elif k == "gpu" and n < 0:
                self.err("resources.gpu", f"{_fmt(v)} must be >= 0 (GPUs per trial; 0.25 = four trials a GPU)")
            elif k == "gpu" and n > 1 and not float(n).is_integer():
                self.err("resources.gpu", f"{_fmt(v)}: Ray accepts a fraction of one GPU or a whole number")
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

    # ---------------------------------------------------------------------------------- params
    def params(self, value, fixed: dict) -> list[Param]:
        if not isinstance(value, dict) or not value:
            self.err("params", "expected a non-empty mapping of config keys to {uniform|loguniform|int|choice: "
                     "...}")
            return []
        parsed: dict[str, Param] = {}
        raw_when: dict[str, Any] = {}
        for key, body in value.items():
            where = f"params.{key}"
            if not self.key_ok(where, key):
                continue
            if key in fixed and key not in self.pinned:
                self.err(where, "is both fixed and searched; remove it from one of them")
            p = self.param(where, key, body)
            raw_when[key] = body.get("when") if isinstance(body, dict) else None
            if p is not None:
                parsed[key] = p
        # `when` needs every parameter parsed first (it may refer to one defined later in the file);
        # it is checked even where the parameter's own range is broken, so that all mistakes show at once
        out: dict[str, Param] = {}
        for key, w in raw_when.items():
            when = self.when(f"params.{key}.when", w, parsed, value)
            if key in parsed:
                p = parsed[key]
                out[key] = Param(p.key, p.kind, p.low, p.high, p.choices, p.log, p.step, when)
        return self.order(out)

    def param(self, where: str, key: str, body) -> Param | None:
        spec = self.specs[key]
        if not isinstance(body, dict):
            self.err(where, f"expected {{uniform|loguniform|int: [low, high]}} or {{choice: [...]}}, got {body!r}")
            return None
        for f in body:
            if f not in _PARAM_FIELDS:
                self.err(f"{where}.{f}", f"unknown field; known: {', '.join(_PARAM_FIELDS)}")
        kinds = [k for k in KINDS if k in body]
        if len(kinds) != 1:
            got = f"got {', '.join(kinds)}" if kinds else "got none"
            self.err(where, f"needs exactly one of {', '.join(KINDS)}; {got}")
            return None
        kind = kinds[0]
        if kind == "choice":
            for f in ("log", "step"):
                if f in body:
                    self.err(f"{where}.{f}", "does not apply to choice")
            return self.choice(where, key, body["choice"])
        numeric = spec.type in (int, float)
        if not numeric:
            self.err(where, f"{kind} needs a numeric key; {key} is {spec.describe()}: use choice")
            return None
        if spec.type is int and kind != "int":
            self.err(where, f"{key} is an integer key: use int (with log: true for a log scale), not {kind}")
            return None
        rng = body[kind]
        if not isinstance(rng, (list, tuple)) or len(rng) != 2:
            self.err(f"{where}.{kind}", f"expected [low, high], got {rng!r}")
            return None
        low, high = _num(rng[0]), _num(rng[1])
        if low is None or high is None:
            self.err(f"{where}.{kind}", f"bounds must be finite numbers, got {list(rng)!r}")
            return None
        ok = True
        log = kind == "loguniform"
        if "log" in body:
            if kind != "int":
                self.err(f"{where}.log", "only int takes log: true (use loguniform for floats)")
                ok = False
            elif not isinstance(body["log"], bool):
                self.err(f"{where}.log", f"{body['log']!r} must be true or false")
                ok = False
            else:
                log = body["log"]
        if kind == "int":
            if not (float(low).is_integer() and float(high).is_integer()):
                self.err(f"{where}.int", f"bounds must be integers, got [{_fmt(low)}, {_fmt(high)}]")
                return None
            low, high = int(low), int(high)
        else:
            low, high = float(low), float(high)
        if low >= high:
            self.err(f"{where}.{kind}", f"empty range [{_fmt(low)}, {_fmt(high)}] (need low < high)")
            ok = False
        if log and low <= 0:
            self.err(f"{where}.{kind}", f"a log scale needs low > 0, got {_fmt(low)}"
                     + (" (use choice to include 0, e.g. the lambda = 0 baseline)" if key == "cem.lambd" else ""))
            ok = False
        for b in (low, high):
            try:
                coerce(key, b, spec)
            except ConfigError:
                self.err(f"{where}.{kind}", f"bound {_fmt(b)} is outside {key}'s allowed values: {spec.describe()}")
                ok = False
        step = body.get("step")
        if step is not None:
            s = _num(step)
            if log:
                self.err(f"{where}.step", "cannot be combined with a log scale (Optuna)")
                ok = False
            elif s is None or s <= 0 or (kind == "int" and not float(s).is_integer()):
                self.err(f"{where}.step", f"{step!r} must be a {'positive integer' if kind == 'int' else 'number > 0'}")
                ok = False
            else:
                step = int(s) if kind == "int" else float(s)
        return Param(key, kind, low, high, None, log, step) if ok else None

    def choice(self, where: str, key: str, values) -> Param | None:
        if not isinstance(values, (list, tuple)) or not values:
            self.err(f"{where}.choice", f"expected a non-empty list, got {values!r}")
            return None
        out, ok = [], True
        for v in values:
            if isinstance(v, (list, tuple, dict)):
                self.err(f"{where}.choice", f"{v!r}: choices must be single values (Optuna categoricals)")
                ok = False
                continue
            good, cv = self.coerce(f"{where}.choice", key, v)
            if key == "cem.surrogate" and good:
                from .surrogates import names
                if cv not in names():
                    self.err(f"{where}.choice", f"unknown surrogate {cv!r}; known: {', '.join(names())}")
                    good = False
            if key == "attack.kind" and good:
                from .attacks import names as attack_names
                if cv not in attack_names():
                    self.err(f"{where}.choice", f"unknown attack {cv!r}; known: {', '.join(attack_names())}")
                    good = False
            if good and cv in out:
                self.err(f"{where}.choice", f"{v!r} is listed twice")
                good = False
            ok &= good
            if good:
                out.append(cv)
        return Param(key, "choice", choices=tuple(out)) if ok else None

    def when(self, where: str, value, parsed: dict[str, Param], raw_params: dict) -> dict[str, tuple]:
        if value is None:
            return {}
        if not isinstance(value, dict) or not value:
            self.err(where, f"expected {{param key: [allowed values]}}, got {value!r}")
            return {}
        out = {}
        for ref, allowed in value.items():
            w = f"{where}.{ref}"
            if ref not in raw_params:
                close = difflib.get_close_matches(str(ref), [str(k) for k in raw_params], n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                fixed_note = " (it is fixed, not searched)" if ref in (self.doc.get("fixed") or {}) else ""
                self.err(w, f"refers to unknown parameter {ref!r}{fixed_note}{hint}; `when` may only name "
                         f"parameters searched in this file: {', '.join(map(str, raw_params))}")
                continue
            if ref not in parsed:  # the referenced parameter is itself broken (already reported)
                continue
            target = parsed[ref]
            allowed = list(allowed) if isinstance(allowed, (list, tuple)) else [allowed]
            if not allowed:
                self.err(w, "empty list of allowed values")
                continue
            vals = []
            for a in allowed:
                try:
                    ca = coerce(ref, a, self.specs[ref])
                except ConfigError:
                    ca = a
                if target.kind == "choice":
                    possible = ca in target.choices
                    domain = f"its choices: {', '.join(map(_fmt, target.choices))}"
                else:
                    n = _num(ca)
                    possible = n is not None and target.low <= n <= target.high and (
                        target.kind != "int" or float(n).is_integer())
                    domain = f"its range [{_fmt(target.low)}, {_fmt(target.high)}]"
                if not possible:
                    self.err(w, f"{a!r} is not a possible value of {ref} ({domain})")
                else:
                    vals.append(ca)
            if vals:
                out[ref] = tuple(vals)
        return out

    def order(self, params: dict[str, Param]) -> list[Param]:
        """File order, moved just enough that every parameter follows those its `when` names."""
        done: list[Param] = []
        placed: set[str] = set()
        pending = list(params.values())
        while pending:
            progress = False
            for p in list(pending):
                if all(r in placed for r in p.when):
                    done.append(p)
                    placed.add(p.key)
                    pending.remove(p)
                    progress = True
                    break
            if not progress:
                cycle = ", ".join(p.key for p in pending)
                self.err("params", f"`when` conditions form a cycle among: {cycle}")
                break
        return done

    # --------------------------------------------------------------------- cross-field checks
    def check_combinations(self, fixed: dict, params: list[Param]) -> None:
        """Each searched value with the fixed keys (and each surrogate it can meet) must make a config
        that ``TrialConfig.from_flat`` and ``surrogates.resolve`` accept."""
        from . import surrogates
        searched = {p.key for p in params}
        by_key = {p.key: p for p in params}
        surr = by_key.get("cem.surrogate")

        def surrogates_for(p: Param | None) -> tuple:
            if "cem.surrogate" in fixed and "cem.surrogate" not in searched:
                return (fixed["cem.surrogate"],)
            if surr is None:
                return (key_specs()["cem.surrogate"].default,)
            if p is not None and "cem.surrogate" in p.when:
                return p.when["cem.surrogate"]
            return surr.choices

        def probe(where: str, flat: dict) -> None:
            try:
                cfg = TrialConfig.from_flat(flat)
                surrogates.resolve(cfg)
            except ConfigError as e:
                for line in str(e).splitlines():
                    # a clash with another searched key's default is not this value's fault
                    others = [k for k in searched if k not in flat and k in line]
                    if not others:
                        self.err(where, line)

        seen: set[str] = set()
        for p in params:
            values = p.choices if p.kind == "choice" else (p.low, p.high)
            for v in values:
                for s in (surrogates_for(p) if p.key != "cem.surrogate" else (v,)):
                    flat = dict(fixed)
                    flat["cem.surrogate"] = s
                    flat[p.key] = v
                    n = len(self.errors)
                    probe(f"params.{p.key}" + (f" (with cem.surrogate={s})" if p.key != "cem.surrogate" and
                                                 surr is not None else ""), flat)
                    if len(self.errors) > n:
                        # one report per message is enough
                        new = self.errors[n:]
                        del self.errors[n:]
                        for line in new:
                            tail = line.split(": ", 1)[-1]
                            if tail not in seen:
                                seen.add(tail)
                                self.errors.append(line)

    def pin(self, params: list[Param], fixed: dict) -> list[Param]:
        """Drop searched keys that an override fixed; resolve `when` conditions on them statically."""
        if not self.pinned:
            return params
        gone: set[str] = set()
        out = []
        for p in params:
            if p.key in self.pinned and p.key in fixed:
                gone.add(p.key)
                continue
            when, alive = {}, True
            for ref, allowed in p.when.items():
                if ref in gone and ref in fixed:
                    if fixed[ref] not in allowed:
                        alive = False
                elif ref in gone:        # conditioned on a parameter that can never be sampled
                    alive = False
                else:
                    when[ref] = allowed
            if not alive:
                gone.add(p.key)
                continue
            out.append(Param(p.key, p.kind, p.low, p.high, p.choices, p.log, p.step, when))
        return out


# ------------------------------------------------------------------------------------ Optuna side
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
    opts = {k: v for k, v in spec.sampler.items() if k != "name"}
    name = spec.sampler.get("name", "tpe")
    if name == "tpe":
        opts.setdefault("multivariate", True)
        opts.setdefault("group", spec.conditional and opts["multivariate"])
        opts.setdefault("constant_liar", True)
        return optuna.samplers.TPESampler(**opts)
    if name in ("nsga2", "nsga3"):
        opts.setdefault("population_size", max(4, min(50, spec.num_samples // 4)))
        klass = optuna.samplers.NSGAIISampler if name == "nsga2" else optuna.samplers.NSGAIIISampler
        return klass(**opts)
    if name == "gp":
        opts.setdefault("warn_independent_sampling", False)
        return optuna.samplers.GPSampler(**opts)
    if name == "random":
        return optuna.samplers.RandomSampler(**opts)
    raise SpaceError(f"sampler.name: unknown sampler {name!r}; known: {', '.join(SAMPLERS)}", spec.path)


def trial_config(spec: SearchSpec, params: dict) -> dict:
    """The full flat config of one trial: the fixed keys, then the sampled ones (flat dotted keys, or a
    config nested by section). Known keys are coerced to their types (an int-searched lambda becomes a
    float); ``TrialConfig.from_flat`` still validates the result."""
    specs = key_specs()
    out = dict(spec.fixed)
    for k, v in flatten(dict(params)).items():
        if k in specs:
            try:
                v = coerce(k, v, specs[k])
            except ConfigError:
                pass  # left for from_flat to report with its context
        out[k] = v
    return out
