"""``moasha``: multi-objective asynchronous successive halving (docs/search.md). A search trial is judged at
the rungs ``grace_epochs * reduction_factor ** k`` (whole epochs below ``train.epochs``) and continues only if
it is among the best ⌈n/η⌉ of the n trials recorded there (Pareto rank, then hypervolume contribution), or
every other trial recorded there was stopped or failed (so that some trial runs to the end when the one that
continued failed, or was forgotten by a resumed driver). The rule is ``search/rungs.py`` (``RungRanker``), the
Ray Tune scheduler ``search/moasha.py`` (``MOASHA``)."""

from __future__ import annotations

import math

from ..spec import rung_epochs
from . import Option, register

OPTIONS = {
    "grace_epochs": Option("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                           2, "the first rung's epoch"),
    "reduction_factor": Option("a finite number > 1", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                               and 1 < v < math.inf, 3, "a rung keeps 1/η of its trials"),
}


def rungs(opts: dict, epochs: int) -> list[int]:
    return rung_epochs(epochs, opts["grace_epochs"], opts["reduction_factor"])


def check(opts: dict, epochs: int) -> list[tuple[str, str]]:
    g = opts["grace_epochs"]
    if g >= epochs:
        return [("grace_epochs", f"{g} must be below train.epochs ({epochs}): the first rung comes before the end "
                 "of a trial")]
    return []


def describe(opts: dict) -> str:
    return f"keeps 1/{opts['reduction_factor']:g} of each rung"


@register("moasha", OPTIONS, rungs=rungs, check=check, describe=describe, doc=__doc__)
def build(ray_side, spec, opts):
    ranker = ray_side.RungRanker(spec.fixed["train.epochs"], opts["grace_epochs"], opts["reduction_factor"],
                                 spec.rung_objectives)
    return ray_side.MOASHA(ranker, time_attr=ray_side.time_attr, state_key=ray_side.state_key)
