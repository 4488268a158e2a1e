"""The registry both plug-in packages of a space share (``samplers/``, ``schedulers/``): plug-ins by name,
each registered once, every module of the package imported on first use (the package is the list)."""

from __future__ import annotations

import importlib
import pkgutil


class PluginTable:
    def __init__(self, kind: str, package: str, path):
        self.kind, self.package, self.path = kind, package, path
        self.plugins: dict = {}
        self.loaded = False

    def add(self, name: str, plugin) -> None:
        if name in self.plugins:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self.plugins[name] = plugin

    def unregister(self, name: str) -> None:
        """Remove a plug-in (tests register throw-away ones)."""
        self.plugins.pop(name, None)

    def load(self) -> None:
        """Import every module of the package once: each registers its plug-ins."""
        if self.loaded:
            return
        self.loaded = True
        for info in pkgutil.iter_modules(self.path):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")

    def get(self, name: str):
        self.load()
        return self.plugins.get(name)

    def names(self) -> tuple[str, ...]:
        self.load()
        return tuple(sorted(self.plugins))

    def options(self) -> dict[str, dict]:
        """``{plug-in: {option: its declaration}}`` of every registered plug-in."""
        self.load()
        return {n: dict(self.plugins[n].options) for n in sorted(self.plugins)}
