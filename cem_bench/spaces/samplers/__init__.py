"""The Optuna samplers a search space may name (``sampler: {name: tpe, seed: 0, ...}``): one file each.

A sampler plug-in is a module of this package that calls :func:`register` with its name, the options a space
may give it (``name -> (what it must be, check)``; anything else is an error that lists them) and a builder
``build(optuna, spec, opts) -> optuna.samplers.BaseSampler``. Importing the package's registry loads every
module in it, so adding a sampler is adding a file (docs/architecture.md §5, "Add a sampler").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..plugin_table import PluginTable

Check = tuple[str, Callable[[Any], bool]]


@dataclass(frozen=True)
class SamplerPlugin:
    name: str
    options: dict[str, Check]            # option -> (what it must be, check)
    build: Callable[..., Any]            # (optuna, spec, opts) -> an Optuna sampler
    doc: str = ""


_TABLE = PluginTable("sampler", __name__, __path__)


def register(name: str, options: dict[str, Check], doc: str = ""):
    """Decorator of a builder ``build(optuna, spec, opts)``: registers the sampler ``name``."""
    def deco(build):
        _TABLE.add(name, SamplerPlugin(name, dict(options), build, doc))
        return build
    return deco


unregister, load, get, names, options = (_TABLE.unregister, _TABLE.load, _TABLE.get, _TABLE.names,
                                         _TABLE.options)
