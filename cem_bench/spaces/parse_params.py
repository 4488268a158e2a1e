"""The second half of the search-space validator: the ``params`` section, its ``when`` conditions, and the
checks that every searched value makes a valid trial config together with the fixed keys.

``ParamStages`` is a mixin of ``parse._Parser`` (which holds the top level, objectives, sampler, resources
and fixed keys); it uses the parser's ``doc``, ``specs``, ``pinned``, ``errors``, ``err``, ``key_ok`` and
``coerce``. Every problem is appended to ``errors`` (``params.<key>...: message``) so that all of them are
reported at once.

The surrogate and attack registries import torch, so they are imported here only inside the checks that
need them (a ``cem.surrogate`` choice, and the combination check), never at import time.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from ..config import ConfigError, TrialConfig, coerce, key_specs
from .spec import KINDS, PARAM_FIELDS, Param


def as_number(value: Any) -> float | int | None:
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


def fmt_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


# the most configurations of a space ``check_cells`` builds one by one (about 0.5 ms each)
CELL_CHECK_LIMIT = 2000


def bounded_cells(params: list[Param], limit: int) -> list[dict] | None:
    """The configurations ``check_cells`` builds: every value of each finitely-valued key and the two bounds of
    each continuous range, ``when`` applied as the sampler applies it (a key is in a cell only where its
    conditions hold); None when they are more than ``limit`` (counted as they are built, so a space of 10⁹
    nominal cells costs no more than one of ``limit``)."""
    from .parse_plan import as_choice, discrete_count
    cells: list[dict[str, Any]] = [{}]
    for p in params:
        n = discrete_count(p)   # counted, not listed: an int range of 10⁹ values is never made
        if n is not None and n > limit:
            return None
        values = as_choice(p).choices if n is not None else (p.low, p.high)
        out = []
        for cell in cells:
            if p.active(cell):
                out.extend({**cell, p.key: v} for v in values)
            else:
                out.append(cell)
            if len(out) > limit:
                return None
        cells = out
    return cells


def surrogates_for(fixed: dict, params: list[Param], p: Param | None) -> tuple:
    """The surrogates a searched key ``p`` can meet: the fixed one where the surrogate is not searched (else the
    default), those its ``when`` names, else every searched choice."""
    surr = next((q for q in params if q.key == "cem.surrogate"), None)
    if surr is None:
        return (fixed.get("cem.surrogate", key_specs()["cem.surrogate"].default),)
    if p is not None and "cem.surrogate" in p.when:
        return tuple(p.when["cem.surrogate"])
    return tuple(surr.choices)


class ParamStages:
    """The params, when, order, combination and pin stages of ``parse._Parser`` (see the module docstring)."""

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
            if f not in PARAM_FIELDS:
                self.err(f"{where}.{f}", f"unknown field; known: {', '.join(PARAM_FIELDS)}")
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
        low, high = as_number(rng[0]), as_number(rng[1])
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
                self.err(f"{where}.int", f"bounds must be integers, got [{fmt_value(low)}, {fmt_value(high)}]")
                return None
            low, high = int(low), int(high)
        else:
            low, high = float(low), float(high)
        if low >= high:
            self.err(f"{where}.{kind}", f"empty range [{fmt_value(low)}, {fmt_value(high)}] (need low < high)")
            ok = False
        if log and low <= 0:
            self.err(f"{where}.{kind}", f"a log scale needs low > 0, got {fmt_value(low)}"
                     + (" (use choice to include 0, e.g. the lambda = 0 baseline)" if key == "cem.lambd" else ""))
            ok = False
        for b in (low, high):
            try:
                coerce(key, b, spec)
            except ConfigError:
                self.err(f"{where}.{kind}", f"bound {fmt_value(b)} is outside {key}'s allowed values: {spec.describe()}")
                ok = False
        step = body.get("step")
        if step is not None:
            s = as_number(step)
            if log:
                self.err(f"{where}.step", "cannot be combined with a log scale (Optuna)")
                ok = False
            elif s is None or s <= 0 or (kind == "int" and not float(s).is_integer()):
                self.err(f"{where}.step", f"{step!r} must be a {'positive integer' if kind == 'int' else 'number > 0'}")
                ok = False
            else:
                step = int(s) if kind == "int" else float(s)
                if ok and step > high - low:   # listed as "2 to 8", one value drawn (2026-12-07 probe)
                    self.err(f"{where}.step", f"{fmt_value(step)} is wider than the range [{fmt_value(low)}, "
                             f"{fmt_value(high)}]: only {fmt_value(low)} could be drawn; give a step of at most "
                             f"{fmt_value(high - low)}, or fix the key at {fmt_value(low)}")
                    ok = False
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
                from ..surrogates import names
                if cv not in names():
                    self.err(f"{where}.choice", f"unknown surrogate {cv!r}; known: {', '.join(names())}")
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
                    domain = f"its choices: {', '.join(map(fmt_value, target.choices))}"
                else:
                    n = as_number(ca)
                    possible = n is not None and target.low <= n <= target.high and (
                        target.kind != "int" or float(n).is_integer())
                    domain = f"its range [{fmt_value(target.low)}, {fmt_value(target.high)}]"
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
        from .. import surrogates
        searched = {p.key for p in params}
        surr = next((p for p in params if p.key == "cem.surrogate"), None)

        def probe(where: str, flat: dict) -> None:
            try:
                cfg = TrialConfig.from_flat(flat)
                inactive = surrogates.never_active(surrogates.resolve(cfg))
                if inactive:
                    raise ConfigError(inactive)
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
                for s in (surrogates_for(fixed, params, p) if p.key != "cem.surrogate" else (v,)):
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

    def keys_no_surrogate_reads(self, fixed: dict, params: list[Param]) -> None:
        """A searched surrogate's own key (``surrogates.readers``) that no surrogate the space can run with it
        reads: each value trained the same model, so its "distinct" configurations were one run repeated
        (2026-12-07 audit: two trials, one config_id). A fixed one stays allowed: a space switched to another
        surrogate (``--set cem.surrogate=...``) keeps its fixed keys, and no trial is repeated for it. With λ
        fixed at 0 ``cem_keys_without_cem`` says it."""
        from .. import surrogates
        from .parse_plan import lambda_fixed_at_zero
        if lambda_fixed_at_zero(fixed, params):
            return
        for p in params:
            who, runs = surrogates.readers(p.key), surrogates_for(fixed, params, p)
            if who is not None and not set(runs) & set(who):
                self.err(f"params.{p.key}", f"is read by {', '.join(who)}, and this space runs it with "
                         f"cem.surrogate {', '.join(map(str, runs))} only: every value trains the same model; "
                         f"drop the key, or run it with a surrogate that reads it (`when: {{cem.surrogate: "
                         f"[{who[0]}]}}` where the space searches the surrogate)")

    def check_cells(self, fixed: dict, params: list[Param]) -> None:
        """Every configuration of a discrete space of at most ``CELL_CHECK_LIMIT`` (a grid, or choices a sampler
        draws from) must make a valid config with the fixed keys. ``check_combinations`` tries one searched value
        at a time, with the other searched keys at their defaults, so a rule between two searched keys
        (``cem.warmup_epochs`` below ``train.epochs``, ``cem.num_heads`` dividing ``cem.hidden_dim``) passed it,
        and its trials ended as error rows after Ray started. Refused here, naming a few of the cells."""
        from .. import surrogates
        cells = bounded_cells(params, CELL_CHECK_LIMIT)
        if cells is None:
            return
        bad = []
        for cell in cells:
            try:
                cfg = TrialConfig.from_flat({**fixed, **cell})
                inactive = surrogates.never_active(surrogates.resolve(cfg))
                if inactive:
                    raise ConfigError(inactive)
            except ConfigError as e:
                bad.append((cell, str(e).splitlines()[0]))
        if bad:
            shown = "; ".join(f"{', '.join(f'{k}={v}' for k, v in cell.items())}: {why}" for cell, why in bad[:3])
            self.err("params", f"{len(bad)} of the {len(cells)} combinations of the searched values make no valid "
                     f"configuration with the fixed keys, e.g. {shown}. Every such trial would end as an error "
                     f"row: leave those values out, fix one of the keys, or search a key only `when` the other "
                     f"takes values it agrees with")

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
