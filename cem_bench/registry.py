"""A name -> class registry: ``@registry.register("name")``; unknown names raise ``ConfigError`` listing the
known ones. Surrogates and attacks each keep one."""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from .errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, catalog: str):
        self.kind, self.catalog = kind, catalog  # catalog: module whose import registers every entry
        self._items: dict[str, type[T]] = {}

    def register(self, name: str):
        def deco(cls):
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cls.name = name
            self._items[name] = cls
            return cls
        return deco

    def names(self) -> list[str]:
        importlib.import_module(self.catalog)
        return sorted(self._items)

    def get(self, name: str) -> type[T]:
        known = self.names()
        if name not in self._items:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(known)}")
        return self._items[name]
