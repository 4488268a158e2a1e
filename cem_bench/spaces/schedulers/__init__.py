"""The early-stopping schedulers a search space may name (``scheduler: {name: moasha, grace_epochs: 2, ...}``):
one file each.

A scheduler plug-in is a module of this package that decorates its builder with :func:`register`, giving

* its name;
* its options, each an :class:`Option`: what the value must be and its check, its default, what it means
  (``scheduler.grace_epochs: 0 must be an integer >= 1 (the first rung's epoch)``); any other option is an
  error that lists them;
* ``rungs(opts, epochs)``: the epochs of a ``train.epochs``-long trial at which it may stop it (the privacy
  probe runs there, ``attack.probe_epochs``); None for a scheduler that never stops a trial (``fifo``: the
  space then has no scheduler);
* optionally ``check(opts, epochs)``: problems of its options against ``train.epochs``, as
  ``[(option, message)]``, and ``describe(opts)``: its words in the search's plan ("keeps 1/3 of each rung");
* the builder ``build(ray_side, spec, opts)``, which returns the Ray Tune scheduler (None: Ray's FIFO).
  ``ray_side`` is handed over by the search (``search.moasha.make_scheduler``): Ray Tune's ``schedulers``
  module, the project's ``MOASHA`` and ``RungRanker``, the state key. So this package imports neither Ray nor
  ``search`` (docs/architecture.md §3, rule 14), and the parser reads a plug-in's options without Ray.

The checks that hold for every scheduler that stops trials (no grid, one replicate, objectives with a
per-epoch value, a fixed ``train.epochs``) are the parser's (``parse._Parser.scheduler``). Importing the
package's registry loads every module in it, so adding a scheduler is adding a file (docs/architecture.md §5.4,
"Add a sampler or a scheduler").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..plugin_table import PluginTable


@dataclass(frozen=True)
class Option:
    """One option of a scheduler: ``what`` the value must be ("an integer >= 1") and its ``check``, its
    ``default`` (used when a space leaves it out) and ``help``, what it means ("the first rung's epoch")."""

    what: str
    check: Callable[[Any], bool]
    default: Any
    help: str = ""

    def problem(self, value: Any) -> str | None:
        """The message for a value the check refuses (``"0 must be an integer >= 1 (the first rung's epoch)"``)."""
        if self.check(value):
            return None
        return f"{value!r} must be {self.what}" + (f" ({self.help})" if self.help else "")


@dataclass(frozen=True)
class SchedulerPlugin:
    name: str
    options: dict[str, Option]
    build: Callable[..., Any]                                   # (ray_side, spec, opts) -> a Ray Tune scheduler
    rungs: Callable[[dict, int], list[int]] | None              # (opts, train.epochs) -> epochs it may stop at
    check: Callable[[dict, int], list[tuple[str, str]]] | None = None   # (opts, train.epochs) -> [(option, msg)]
    describe: Callable[[dict], str] | None = None               # opts -> its words in the search's plan
    doc: str = ""

    @property
    def stops_trials(self) -> bool:
        return self.rungs is not None

    def defaults(self) -> dict[str, Any]:
        return {k: o.default for k, o in self.options.items()}

    def form(self) -> str:
        """How a space names it: ``{name: moasha, grace_epochs: 2, reduction_factor: 3}`` (the defaults)."""
        return "{" + ", ".join([f"name: {self.name}", *(f"{k}: {o.default}" for k, o in self.options.items())]) + "}"


_TABLE = PluginTable("scheduler", __name__, __path__)


def register(name: str, options: dict[str, Option], *, rungs: Callable[[dict, int], list[int]] | None,
             check: Callable[[dict, int], list[tuple[str, str]]] | None = None,
             describe: Callable[[dict], str] | None = None, doc: str = ""):
    """Decorator of a builder ``build(ray_side, spec, opts)``: registers the scheduler ``name``."""
    for k, o in options.items():
        if k == "name" or not isinstance(o, Option):
            raise ValueError(f"scheduler {name!r}: option {k!r} must be an Option and not be called 'name'")
        if not o.check(o.default):
            raise ValueError(f"scheduler {name!r}: the default of {k!r}, {o.default!r}, fails its own check")

    def deco(build):
        _TABLE.add(name, SchedulerPlugin(name, dict(options), build, rungs, check, describe, doc))
        return build
    return deco


unregister, load, get, names, options = (_TABLE.unregister, _TABLE.load, _TABLE.get, _TABLE.names,
                                         _TABLE.options)


def describe(scheduler: dict) -> str:
    """A space's scheduler (``SearchSpec.scheduler``: its name and options) in the search's plan:
    ``"moasha, keeps 1/3 of each rung"``."""
    plugin = get(scheduler["name"])
    opts = {k: v for k, v in scheduler.items() if k != "name"}
    words = plugin.describe(opts) if plugin is not None and plugin.describe is not None else ""
    return f"{scheduler['name']}, {words}" if words else str(scheduler["name"])
