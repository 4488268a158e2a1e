"""Model-inversion attacks: one file each, registered by name."""

from .base import Attack, AttackResult, build, names, register

__all__ = ["Attack", "AttackResult", "build", "names", "register"]
