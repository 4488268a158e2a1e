"""Option checks the sampler plug-ins share: ``(what the value must be, check)``."""

from __future__ import annotations

INT = ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
INT_OR_NONE = ("an integer or empty", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)))
BOOL = ("true or false", lambda v: isinstance(v, bool))
PROB = ("a number in [0, 1]", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1)
POS_INT = ("an integer >= 1", lambda v: INT[1](v) and v >= 1)
NONNEG_INT = ("an integer >= 0", lambda v: INT[1](v) and v >= 0)
