"""Model-inversion attacks: one file each, registered by name with its own keys (like the surrogates).

Importing the package registers every attack module in it.
"""

from .base import (
    REGISTRY,
    Attack,
    AttackResult,
    AttackSet,
    build,
    get,
    names,
    per_attack_column,
    register,
    resolve,
    run_all,
    save_gallery,
    strongest_column,
    worst_case,
)

REGISTRY.load()

__all__ = ["Attack", "AttackResult", "AttackSet", "build", "get", "names", "per_attack_column", "register", "resolve",
           "run_all", "save_gallery", "strongest_column", "worst_case"]
