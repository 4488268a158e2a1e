"""The validated form of a search space: ``Objective``, ``Param``, ``SearchSpec``, and the vocabularies a
search-space YAML may use (metrics, modes, parameter kinds, samplers and the options each accepts; the
schedulers and theirs are the registry of ``schedulers/``, asked when needed).

Imports nothing heavy (no torch, no Optuna, no Ray); ``parse.py`` builds these, ``sampling.py`` turns them
into Optuna's define-by-run function and sampler.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..schema import HYPOTHESIS_CLAIMS, HYPOTHESIS_CORRECTIONS, OBJECTIVE_METRICS

METRICS: tuple[str, ...] = OBJECTIVE_METRICS
MODES = ("max", "min")
from . import samplers as _samplers  # noqa: E402 - the plug-ins need nothing of this module
from . import schedulers as _schedulers  # noqa: E402 - loaded on first use; its plug-ins read rung_epochs here

KINDS = ("uniform", "loguniform", "int", "choice")

# Sampler name -> options it accepts (with their type check), from the sampler plug-ins (spaces/samplers/, one
# file each). The parser and sampling.make_sampler ask the registry itself, so a sampler registered later
# (a plug-in of a user's, a test's) is seen too; these two names are the shipped set, for readers.
SAMPLER_OPTIONS: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = _samplers.options()
SAMPLERS = tuple(sorted(SAMPLER_OPTIONS))

# The shape of the YAML file itself (used by the parser).
TOP_KEYS = ("name", "objectives", "sampler", "num_samples", "replicates", "seeds", "baseline", "confirm",
            "scheduler", "max_concurrent", "max_failures", "resources", "fixed", "params", "utility_tolerance",
            "hypotheses")
# Early stopping (docs/search.md): the schedulers a space may name and their options are the plug-ins of
# spaces/schedulers/ (one file each; the parser, SearchSpec.rungs and the search ask that registry). For each
# objective, the value every epoch record carries that stands for it at a rung (the probe for the attack's SSIM):
RUNG_METRICS = {"test_acc": "test_acc", "test_acc_clean": "test_acc_clean", "attack_ssim": "probe_ssim"}
# The noise floor and the confirmed front (docs/protocol.md sections 7 and 8): on unless a space says false.
DEFAULT_BASELINE_REPLICATES = 3
DEFAULT_CONFIRM = {"top": 3, "replicates": 3}
REQUIRED_KEYS = ("name", "objectives", "params")   # num_samples too, except with sampler grid (the cell count)
PARAM_FIELDS = (*KINDS, "log", "step", "when")
# \Z, not $: "$" also matches before a final newline, which would let a name end in one
SAFE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")


def rung_epochs(max_epochs: int, grace_epochs: int, reduction_factor: float) -> list[int]:
    """The epochs at which an early-stopping scheduler judges a trial, ascending: Ray's ASHA milestones
    ``grace_epochs * reduction_factor ** k`` (one bracket) rounded up to whole epochs, below ``max_epochs`` (a
    trial at its last epoch has nothing left to save). The rule that ranks a rung: ``search/rungs.py``."""
    if max_epochs <= 0:
        raise ValueError(f"max_epochs must be positive; got {max_epochs}")
    if grace_epochs <= 0:
        raise ValueError(f"grace_epochs must be positive; got {grace_epochs}")
    if grace_epochs > max_epochs:
        raise ValueError(f"grace_epochs ({grace_epochs}) must be <= max_epochs ({max_epochs})")
    if not reduction_factor > 1:
        raise ValueError(f"reduction_factor must be > 1; got {reduction_factor}")
    out: list[int] = []
    k = 0
    log_eta = math.log(reduction_factor)
    while True:
        try:
            milestone = grace_epochs * reduction_factor ** k
        except OverflowError:   # past any epoch count
            break
        # a milestone in (max_epochs - 1, max_epochs) is met first at max_epochs; inf (η near 1e308) is past too
        if not milestone <= max_epochs - 1:
            break
        epoch = math.ceil(milestone)
        if not out or epoch > out[-1]:
            out.append(int(epoch))
        # the next k whose milestone can pass this epoch, less one for the logs' rounding: with η just above 1
        # one k at a time took 2e10 turns (η = 1 + 1e-10), and `search --dry-run` hung before Ray (2026-12-07)
        k = max(k + 1, math.floor(math.log(epoch / grace_epochs) / log_eta) - 1)
    return out


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


# Hypotheses written into a space before its run (docs/protocol.md section 9, "Hypotheses"): what each claims
# of side a against side b, as a one-sided test of the difference a - b shifted by the margin.
CLAIMS = HYPOTHESIS_CLAIMS
CORRECTIONS = HYPOTHESIS_CORRECTIONS
HYPOTHESIS_FIELDS = ("name", "metric", "a", "b", "a_is", "margin", "paired")
HYPOTHESES_FIELDS = ("alpha", "correction", "tests")
DEFAULT_HYPOTHESES = {"alpha": 0.05, "correction": "holm"}


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis: ``metric`` of configuration ``a`` is ``a_is`` (lower, higher, not_lower, not_higher)
    than that of configuration ``b``, by ``margin`` in the metric's units. ``a`` and ``b`` are flat config keys
    with their values, each naming one cell of the grid; ``paired`` pairs their runs by seed."""
    name: str
    metric: str
    a: dict
    b: dict
    a_is: str
    margin: float = 0.0
    paired: bool = False

    def to_dict(self) -> dict:
        return {"name": self.name, "metric": self.metric, "a": dict(self.a), "b": dict(self.b), "a_is": self.a_is,
                "margin": self.margin, "paired": self.paired}


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
    seeds: tuple[int, ...] = ()    # one run per seed for every configuration (replicates); empty = one run
    # The λ = 0 baseline, run before the search with ``baseline_replicates`` seeds for each cell (the values of
    # the searched keys that change it, such as σ; one empty cell when none is searched). 0 = no baseline.
    baseline_replicates: int = 0
    baseline_cells: tuple[dict, ...] = ({},)
    # After the search: the ``confirm_top`` best configurations re-run with ``confirm_replicates`` new seeds.
    confirm_top: int = 0
    confirm_replicates: int = 0
    # ``scheduler: {name: moasha, grace_epochs: G, reduction_factor: η}``: its name and every option of its
    # plug-in (defaults filled in); None = every trial runs to the end (no scheduler, or fifo)
    scheduler: dict | None = None
    # the report's equivalence margin on the first objective; None: the space states none, and the report's
    # default (schema.DEFAULT_UTILITY_TOLERANCE, in the objective's units) applies and is called the default
    utility_tolerance: float | None = None
    # the hypotheses written into the space before its run, tested by the report as one family at
    # ``hypotheses_alpha`` with ``hypotheses_correction``; empty: none
    hypotheses: tuple[Hypothesis, ...] = ()
    hypotheses_alpha: float = DEFAULT_HYPOTHESES["alpha"]
    hypotheses_correction: str = DEFAULT_HYPOTHESES["correction"]

    @property
    def replicates(self) -> int:
        return max(1, len(self.seeds))

    @property
    def runs(self) -> int:
        """Ray trials of the search proper: every configuration once per seed."""
        return self.num_samples * self.replicates

    @property
    def search_seeds(self) -> tuple[int, ...]:
        """The seeds of the search's runs: the replicates' seeds, else the one fixed seed (0 when unset)."""
        if self.seeds:
            return self.seeds
        seed = self.fixed.get("seed", 0)
        return (seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,)

    @property
    def baseline_seeds(self) -> tuple[int, ...]:
        """The baseline's seeds: the search's first, then the next integers (so a single-seed search shares
        its seed with one baseline run). In a grid whose λ choices include 0, only the integers after the
        search's: its λ = 0 cells already run the search's seeds, and a baseline run at one of them was the
        same configuration at the same seed, run twice (the statistics then keep one)."""
        if not self.baseline_replicates:
            return ()
        zero_cells = self.sampler.get("name") == "grid" and any(
            p.key == "cem.lambd" and p.choices is not None and any(float(v) == 0 for v in p.choices)
            for p in self.params)
        seeds = [] if zero_cells else list(self.search_seeds[: self.baseline_replicates])
        # after a searched seed's values too: a grid's λ = 0 cells run each of them
        drawn = [int(v) for p in self.params if p.key == "seed"
                 for v in (p.choices if p.kind == "choice" else (p.high,)) if v is not None] if zero_cells else []
        nxt = max((*self.search_seeds, *drawn)) + 1
        while len(seeds) < self.baseline_replicates:
            seeds.append(nxt)
            nxt += 1
        return tuple(seeds)

    @property
    def confirm_seeds(self) -> tuple[int, ...]:
        """New seeds for the confirmation runs: after every seed the search and its baseline used, a searched
        ``seed``'s values included (without them a confirmation re-ran the very runs that chose its configuration:
        search_seeds is then the fixed seed alone)."""
        if not self.confirm_top:
            return ()
        drawn = [int(v) for p in self.params if p.key == "seed"
                 for v in (p.choices if p.kind == "choice" else (p.high,)) if v is not None]
        start = max((*self.search_seeds, *self.baseline_seeds, *drawn)) + 1
        return tuple(range(start, start + self.confirm_replicates))

    @property
    def baseline_runs(self) -> int:
        return len(self.baseline_cells) * self.baseline_replicates

    @property
    def confirm_runs(self) -> int:
        """At most this many (fewer when the search has fewer configurations to confirm)."""
        return self.confirm_top * self.confirm_replicates

    @property
    def total_runs(self) -> int:
        """Every Ray trial of the experiment: the baseline, the search, the confirmation (at most)."""
        return self.baseline_runs + self.runs + self.confirm_runs

    def baseline_configs(self) -> list[dict]:
        """The baseline's trials as the searcher hands them to Tune: λ = 0, one cell, one seed, the role."""
        return [{**cell, "cem.lambd": 0.0, "seed": s, "role": "baseline"}
                for cell in self.baseline_cells for s in self.baseline_seeds]

    @property
    def rungs(self) -> list[int]:
        """The epochs at which the scheduler may stop a search trial (empty without one): its plug-in's
        ``rungs`` (spaces/schedulers/) for this space's ``train.epochs``."""
        if not self.scheduler:
            return []
        plugin = _schedulers.get(self.scheduler["name"])
        if plugin is None or plugin.rungs is None:
            raise ValueError(f"scheduler {self.scheduler['name']!r} is not a registered scheduler that stops trials; "
                             f"known: {', '.join(_schedulers.names())}")
        return plugin.rungs({k: v for k, v in self.scheduler.items() if k != "name"},
                            self.fixed.get("train.epochs", 0))

    @property
    def rung_objectives(self) -> list[tuple[str, str, float | None]]:
        """``(metric, mode, ref)`` of the per-epoch values the scheduler ranks by at a rung: each objective's
        ``RUNG_METRICS`` stand-in (the probe for ``attack_ssim``), with the objective's mode and reference."""
        return [(RUNG_METRICS[o.metric], o.mode, o.ref) for o in self.objectives]

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
            "seeds": list(self.seeds),
            "baseline": {"replicates": self.baseline_replicates, "cells": [dict(c) for c in self.baseline_cells],
                         "seeds": list(self.baseline_seeds)},
            "confirm": {"top": self.confirm_top, "replicates": self.confirm_replicates,
                        "seeds": list(self.confirm_seeds)},
            "scheduler": dict(self.scheduler) if self.scheduler else None,
            "utility_tolerance": self.utility_tolerance,
            "hypotheses": {"alpha": self.hypotheses_alpha, "correction": self.hypotheses_correction,
                           "tests": [h.to_dict() for h in self.hypotheses]} if self.hypotheses else None,
            "path": self.path,
        }
