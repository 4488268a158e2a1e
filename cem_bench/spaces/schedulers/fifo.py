"""``fifo``: no early stopping, every trial runs to the end (Ray's default FIFO scheduler). ``{name: fifo}``,
``fifo`` and leaving ``scheduler`` out are the same: the space has no scheduler (``SearchSpec.scheduler`` is
None), so no rung, no probe epochs set, no refusals."""

from __future__ import annotations

from . import register


@register("fifo", {}, rungs=None, doc=__doc__)
def build(ray_side, spec, opts):
    return None   # Tune's default: FIFOScheduler
