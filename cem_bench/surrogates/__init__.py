"""Conditional-entropy surrogates (docs/surrogates.md): one file each, registered by name with its own keys.

Importing the package registers every surrogate module in it (``Registry.load``): adding a surrogate is
adding a file with ``@register("name")``.
"""

from .base import (
                   GLOBAL_DEFAULTS,
                   REGISTRY,
                   AttentionKeys,
                   SlotKeys,
                   Surrogate,
                   SurrogateKeys,
                   SurrogateOut,
                   build,
                   get,
                   group_by_class,
                   intra_class_mse,
                   names,
                   never_active,
                   readers,
                   register,
                   resolve,
)

REGISTRY.load()

__all__ = ["GLOBAL_DEFAULTS", "AttentionKeys", "SlotKeys", "Surrogate", "SurrogateKeys", "SurrogateOut", "build",
           "get", "group_by_class", "intra_class_mse", "names", "never_active", "readers", "register",
           "resolve"]
