"""The Optuna samplers a search space may name (``sampler: {name: tpe, seed: 0, ...}``): one file each.

A sampler plug-in is a module of this package that calls :func:`register` with its name, the options a space
may give it (``name -> (what it must be, check)``; anything else is an error that lists them) and a builder
``build(optuna, spec, opts) -> optuna.samplers.BaseSampler``. Importing the package's registry loads every
module in it, so adding a sampler is adding a file (docs/architecture.md §5, "Add a sampler").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Check = tuple[str, Callable[[Any], bool]]


@dataclass(frozen=True)
class SamplerPlugin:
    name: str
    options: dict[str, Check]            # option -> (what it must be, check)
    build: Callable[..., Any]            # (optuna, spec, opts) -> an Optuna sampler
    doc: str = ""


_PLUGINS: dict[str, SamplerPlugin] = {}
_LOADED = False


def register(name: str, options: dict[str, Check], doc: str = ""):
    """Decorator of a builder ``build(optuna, spec, opts)``: registers the sampler ``name``."""
    def deco(build):
        if name in _PLUGINS:
            raise ValueError(f"sampler {name!r} is registered twice")
        _PLUGINS[name] = SamplerPlugin(name, dict(options), build, doc)
        return build
    return deco


def unregister(name: str) -> None:
    """Remove a sampler (tests register throw-away ones)."""
    _PLUGINS.pop(name, None)


def load() -> None:
    """Import every module of this package once: each registers its samplers."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def get(name: str) -> SamplerPlugin | None:
    load()
    return _PLUGINS.get(name)


def names() -> tuple[str, ...]:
    load()
    return tuple(sorted(_PLUGINS))


def options() -> dict[str, dict[str, Check]]:
    """``{sampler: {option: (what it must be, check)}}`` of every registered sampler."""
    load()
    return {n: dict(_PLUGINS[n].options) for n in sorted(_PLUGINS)}
