"""A name -> class registry: ``@registry.register("name")``; unknown names raise ``ConfigError`` listing the
known ones. Surrogates and attacks each keep one.

A registered class may carry ``Keys``, a frozen dataclass of ``keys.key(...)`` fields: its own configuration
keys, declared under the registry's section (``cem.num_slots``) and listed by ``cem-bench keys``; ``cls.keys``
then holds their flat names. The registered name becomes an allowed value of the registry's key
(``cem.surrogate``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, TypeVar

from . import keys as keys_mod
from .errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str, key: str, skip: tuple[str, ...] = (), shared_keys: bool = True):
        """``package``: where the plug-ins live (every module in it but ``skip`` is imported to register
        them); ``key``: the config key whose values are the registered names (``cem.surrogate``).
        ``shared_keys=False``: no two plug-ins may declare the same key (attacks run together in one trial,
        so one ``attack.lr`` could not mean two things)."""
        self.kind, self.package, self.key, self.skip = kind, package, key, skip
        self.shared_keys = shared_keys
        self._owners: dict[str, str] = {}
        self.section = key.split(".", 1)[0]
        self._items: dict[str, type[T]] = {}
        self._loaded = False

    def register(self, name: str):
        def deco(cls):
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cls.name = name
            keys_cls = getattr(cls, "Keys", None)
            if keys_cls is not None and not self.shared_keys:
                import dataclasses
                for f in dataclasses.fields(keys_cls):
                    if f.name in self._owners:
                        raise ValueError(f"{self.section}.{f.name}: {self.kind} {name!r} declares it, but "
                                         f"{self._owners[f.name]!r} already does; {self.kind}s run together, "
                                         f"so each needs its own keys (prefix it, e.g. {name}_{f.name})")
                    self._owners[f.name] = name
            cls.keys = keys_mod.declare(self.section, name, keys_cls) if keys_cls is not None else ()
            keys_mod.declare_name(self.key, self.kind, name)
            self._items[name] = cls
            return cls
        return deco

    def load(self) -> None:
        """Import every plug-in module of the package (once): adding a plug-in is adding a file."""
        if self._loaded:
            return
        self._loaded = True
        pkg = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name not in self.skip and not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")

    def names(self) -> list[str]:
        self.load()
        return sorted(self._items)

    def get(self, name: str) -> type[T]:
        known = self.names()
        if name not in self._items:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(known)}")
        return self._items[name]
