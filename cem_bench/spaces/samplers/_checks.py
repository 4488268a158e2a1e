"""Option checks the sampler plug-ins share: ``(what the value must be, check)``."""

from __future__ import annotations

INT = ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
# numpy's seeds, which Optuna's samplers pass on (a -5 passed the space and failed in Ray, after it started)
SEED = ("an integer from 0 to 2**32 - 1, or empty",
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 32))
BOOL = ("true or false", lambda v: isinstance(v, bool))
PROB = ("a number in [0, 1]", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1)
POS_INT = ("an integer >= 1", lambda v: INT[1](v) and v >= 1)
NONNEG_INT = ("an integer >= 0", lambda v: INT[1](v) and v >= 0)
