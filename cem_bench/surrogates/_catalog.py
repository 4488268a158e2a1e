"""Imports every surrogate module so that its ``@register`` runs. Add a line for a new file."""

from . import gmm  # noqa: F401
from . import gated_attention  # noqa: F401
from . import slot_cross  # noqa: F401
from . import attention_centroid  # noqa: F401
from . import serial_enhanced  # noqa: F401
