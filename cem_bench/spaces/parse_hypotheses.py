"""The ``hypotheses:`` stage of the search-space validator (``parse._Parser`` mixes it in).

A space may write down, before its run, the comparisons it was run to decide (docs/search-spaces.md §8a,
docs/protocol.md §9 "Hypotheses"): each names two cells of the grid (``a`` and ``b``, by their config keys),
a metric, what ``a`` is claimed to be against ``b`` and a margin. The report tests exactly these, as one family
with the stated correction, so a finding the space planned is not one picked from many after the run.

Two stages, like the rest of the parser: ``hypotheses_form`` reads each field (before the first refusal, so one
run lists every problem), ``hypotheses_cells`` matches each side to exactly one cell once the grid is known.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from ..analysis.noise import MIN_RUNS
from ..schema import MAX_HYPOTHESES as MAX_TESTS
from ..schema import margin_problem
from .parse_params import as_number, fmt_value
from .spec import (
    CLAIMS,
    CORRECTIONS,
    DEFAULT_HYPOTHESES,
    HYPOTHESES_FIELDS,
    HYPOTHESIS_FIELDS,
    SAFE_NAME,
    Hypothesis,
)


class HypothesisStages:
    """Mixed into ``parse._Parser``: uses its ``err``, ``key_ok``, ``coerce``, ``specs`` and ``metric_ok``."""

    def hypotheses_form(self, value, grid: bool, seeds: tuple) -> tuple[tuple[Hypothesis, ...], float, str]:
        """``hypotheses: {alpha, correction, tests: [...]}`` field by field: (tests, alpha, correction)."""
        alpha, correction = DEFAULT_HYPOTHESES["alpha"], DEFAULT_HYPOTHESES["correction"]
        if value is None:
            return (), alpha, correction
        if not isinstance(value, dict):
            self.err("hypotheses", f"expected a mapping {{alpha: 0.05, correction: holm, tests: [...]}}, got "
                     f"{fmt_value(value)}")
            return (), alpha, correction
        for k in value:
            if k not in HYPOTHESES_FIELDS:
                self.err(f"hypotheses.{k}", f"unknown field; known: {', '.join(HYPOTHESES_FIELDS)}")
        if "alpha" in value:
            a = as_number(value["alpha"])
            if a is None or not 0 < a < 1:
                self.err("hypotheses.alpha", f"{fmt_value(value['alpha'])} must be a number in (0, 1): the "
                         f"family's error rate (0.05)")
            else:
                alpha = float(a)
        if "correction" in value:
            if value["correction"] not in CORRECTIONS:
                self.err("hypotheses.correction", f"{fmt_value(value['correction'])}; allowed: "
                         f"{', '.join(CORRECTIONS)} (how the family's p-values are adjusted)")
            else:
                correction = value["correction"]
        tests = value.get("tests")
        if not isinstance(tests, list) or not tests:
            self.err("hypotheses.tests", f"expected a non-empty list of {{name, metric, a, b, a_is, margin}}, "
                     f"got {fmt_value(tests)}")
            return (), alpha, correction
        if len(tests) > MAX_TESTS:
            self.err("hypotheses.tests", f"{len(tests)} hypotheses; at most {MAX_TESTS} in one family (a family "
                     f"that large tests each at alpha / {len(tests)}: split the question into runs of their own)")
            return (), alpha, correction
        if not grid:
            self.err("hypotheses", "need sampler grid: each side must be a configuration fixed before the run "
                     "(a sampler chooses its configurations during the run, and a comparison picked after it "
                     "is exploratory: the report's summary corrects for those, docs/protocol.md §9)")
        if len(seeds) < MIN_RUNS:
            self.err("hypotheses", f"need at least {MIN_RUNS} runs a side: give replicates: {MIN_RUNS} or more "
                     f"(or seeds: [...]); the space has {len(seeds) or 1}")
        out: list[Hypothesis] = []
        names: set[str] = set()
        for i, t in enumerate(tests):
            h = self.one_hypothesis(f"hypotheses.tests[{i}]", t, i)
            if h is None:
                continue
            if h.name in names:
                self.err(f"hypotheses.tests[{i}].name", f"{h.name!r} is used twice; each hypothesis needs its own")
                continue
            names.add(h.name)
            out.append(h)
        return tuple(out), alpha, correction

    def one_hypothesis(self, where: str, t: Any, i: int) -> Hypothesis | None:
        if not isinstance(t, dict):
            self.err(where, f"expected {{name, metric, a, b, a_is, margin, paired}}, got {fmt_value(t)}")
            return None
        before = len(self.errors)
        for k in t:
            if k not in HYPOTHESIS_FIELDS:
                close = difflib.get_close_matches(str(k), HYPOTHESIS_FIELDS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.err(f"{where}.{k}", f"unknown field{hint}; known: {', '.join(HYPOTHESIS_FIELDS)}")
        for k in ("metric", "a", "b", "a_is"):
            if k not in t:
                self.err(f"{where}.{k}", "missing (required)")
        name = t.get("name", f"H{i + 1}")
        if not isinstance(name, str) or not SAFE_NAME.match(name):
            self.err(f"{where}.name", f"{fmt_value(name)} must be a short name of letters, digits, '.', '_', '-' "
                     f"(H1)")
        metric = t.get("metric")
        if "metric" in t:
            self.metric_ok(f"{where}.metric", metric)
        a_is = t.get("a_is")
        if "a_is" in t and a_is not in CLAIMS:
            self.err(f"{where}.a_is", f"{fmt_value(a_is)}; allowed: {', '.join(CLAIMS)} (what a's metric is "
                     f"against b's)")
        margin = as_number(t.get("margin", 0))
        if margin is None or not 0 <= margin < math.inf:
            self.err(f"{where}.margin", f"{fmt_value(t.get('margin'))} must be a number >= 0 in the metric's units")
            margin = 0
        elif isinstance(metric, str) and (why := margin_problem(metric, margin)):
            self.err(f"{where}.margin", why)
        elif a_is in ("not_lower", "not_higher") and margin == 0:
            self.err(f"{where}.margin", f"{a_is} needs a margin > 0, in the metric's units (0.02: 2 points of "
                     f"accuracy): with margin 0 it is the test of {'higher' if a_is == 'not_lower' else 'lower'}")
        paired = t.get("paired", False)
        if not isinstance(paired, bool):
            self.err(f"{where}.paired", f"{fmt_value(paired)} must be true or false (pair the runs by seed)")
        sides = {side: self.side(f"{where}.{side}", t.get(side)) for side in ("a", "b") if side in t}
        if len(self.errors) > before:
            return None
        return Hypothesis(name=name, metric=metric, a=sides["a"], b=sides["b"], a_is=a_is, margin=float(margin),
                          paired=paired)

    def side(self, where: str, value: Any) -> dict:
        """A side: ``{flat config key: value}``, each value checked as the key's own."""
        if not isinstance(value, dict) or not value:
            self.err(where, f"expected a mapping of config keys to values naming one cell "
                     f"({{cem.surrogate: gmm, cem.lambd: 16}}), got {fmt_value(value)}")
            return {}
        out = {}
        for key, v in value.items():
            if key == "seed":
                self.err(f"{where}.seed", "a side is a configuration over all its seeds; leave seed out")
                continue
            if not self.key_ok(f"{where}.{key}", key):
                continue
            if isinstance(v, (list, dict)):
                self.err(f"{where}.{key}", f"{fmt_value(v)}: one value, as a cell holds it")
                continue
            ok, cv = self.coerce(f"{where}.{key}", key, v)
            if ok and cv is None:
                self.err(f"{where}.{key}", "a side names the value its runs hold, not an empty one (the runs record "
                         "the value each surrogate resolves; fix or search the key to name it)")
            elif ok:
                out[key] = cv
        return out

    def hypotheses_cells(self, tests: tuple[Hypothesis, ...], fixed: dict, cells: list[dict],
                         baseline_cells: tuple[dict, ...], baseline_n: int) -> None:
        """Each side names exactly one configuration the run will hold: a cell of the grid, or a cell of the
        λ = 0 baseline; a and b name different ones."""
        configs = [resolved_cell(fixed, c) for c in cells]
        if baseline_n:
            configs += [resolved_cell(fixed, {**c, "cem.lambd": 0.0}) for c in baseline_cells]
        unique: list[dict] = []
        for c in configs:
            if c not in unique:
                unique.append(c)
        for i, h in enumerate(tests):
            found = {}
            for side in ("a", "b"):
                where = f"hypotheses.tests[{i}].{side}"
                matches = [c for c in unique if self.side_matches(getattr(h, side), c)]
                if len(matches) == 1:
                    found[side] = matches[0]
                    continue
                shown = "; ".join(_cell_text(c, fixed) for c in unique[:12]) + ("; ..." if len(unique) > 12 else "")
                what = "no cell" if not matches else f"{len(matches)} cells"
                self.err(where, f"{_side_text(getattr(h, side))} matches {what}; it must name exactly one "
                         f"configuration of the run (its cells: {shown}). A key the space neither fixes nor "
                         f"searches counts at its default in `cem-bench keys`; a surrogate's own key, or one whose "
                         f"default each surrogate sets, only where the space fixes or searches it")
            if len(found) == 2 and found["a"] == found["b"]:
                self.err(f"hypotheses.tests[{i}]", "a and b name the same configuration")

    def side_matches(self, side: dict, cell: dict) -> bool:
        """Every key of the side holds its value in the cell: set by the cell (the grid, ``fixed``), or a core
        key's plain default. A plug-in's key the cell does not set has its surrogate's own default, and a core key
        whose default is empty (``cem.warmup_epochs``, ``cem.grad_mode``, ...) the value each surrogate resolves:
        neither is known here without building the trial, so the side can name them only through the cell
        (``fixed`` or a searched value)."""
        for key, value in side.items():
            if key in cell:
                have = cell[key]
            elif key.startswith("cem.") and cell.get("cem.lambd") == 0:
                return False            # the λ = 0 runs hold no CEM key but λ
            elif not self.specs[key].owners and self.specs[key].default is not None:
                have = self.specs[key].default
            else:   # a surrogate's own key, or one whose default each surrogate sets (empty in the key table)
                return False
            if not _same(have, value):
                return False
        return True


def resolved_cell(fixed: dict, cell: dict) -> dict:
    """A cell as its runs hold it: the fixed keys and the cell's values; λ = 0 keeps no other CEM key (the
    baseline's own kind, docs/results.md §2)."""
    out = {**fixed, **cell}
    if out.get("cem.lambd", None) == 0:
        out = {k: v for k, v in out.items() if not k.startswith("cem.") or k == "cem.lambd"}
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _side_text(side: dict) -> str:
    return "{" + ", ".join(f"{k}: {fmt_value(v)}" for k, v in side.items()) + "}"


def _cell_text(cell: dict, fixed: dict) -> str:
    own = {k: v for k, v in cell.items() if k not in fixed or fixed[k] != v}
    return _side_text(own) if own else "{} (the fixed keys only)"
