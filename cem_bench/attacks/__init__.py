"""Model-inversion attacks: one file each, registered by name with its own keys (like the surrogates).

Importing the package registers every attack module in it.
"""

from .base import _REGISTRY, Attack, AttackResult, build, get, names, register, resolve

_REGISTRY.load()

__all__ = ["Attack", "AttackResult", "build", "get", "names", "register", "resolve"]
