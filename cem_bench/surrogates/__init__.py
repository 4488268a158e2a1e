"""Conditional-entropy surrogates (SURROGATES.md): one file each, registered by name."""

from .base import (GLOBAL_DEFAULTS, Surrogate, SurrogateOut, build, get, group_by_class, intra_class_mse,
                   names, register, resolve)

__all__ = ["GLOBAL_DEFAULTS", "Surrogate", "SurrogateOut", "build", "get", "group_by_class", "intra_class_mse",
           "names", "register", "resolve"]
