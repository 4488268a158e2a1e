"""Non-dominated sorting, Pareto sets and exact hypervolume (numpy only).

Every function takes ``values`` of shape ``(n, m)`` (one row per trial, one column per objective)
and ``modes``, a list of ``"max"`` / ``"min"`` of length ``m``. Internally everything is converted to
minimisation by negating the ``max`` columns (and, for the hypervolume, the matching reference
coordinates).

Conventions:

* A row with any NaN objective is not comparable: it gets rank ``-1``, is never on the front and
  adds nothing to a hypervolume.
* Dominance is the usual weak one: ``a`` dominates ``b`` when ``a`` is no worse in every objective and
  strictly better in at least one. Identical points therefore do not dominate each other and share a
  rank.
* The hypervolume counts only points that strictly dominate the reference point in every objective.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["pareto_ranks", "pareto_mask", "hypervolume", "hypervolume_curve"]

_MODES = ("max", "min")

# Rows per chunk when building the dominance matrix: bounds the (chunk, n, m) temporaries.
_CHUNK_ROWS = 256


def _as_min(values: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """Return a float copy of ``values`` (n, m) where every objective is to be minimised."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim == 1:
        arr = arr.reshape(-1, len(modes)) if arr.size else arr.reshape(0, len(modes))
    if arr.ndim != 2:
        raise ValueError(f"values must be 2-D (n, m); got shape {arr.shape}")
    if arr.shape[1] != len(modes):
        raise ValueError(f"values has {arr.shape[1]} objectives but {len(modes)} modes were given: {list(modes)}")
    signs = np.empty(len(modes))
    for j, mode in enumerate(modes):
        if mode not in _MODES:
            raise ValueError(f"unknown mode {mode!r} for objective {j}; known: max, min")
        signs[j] = -1.0 if mode == "max" else 1.0
    return arr * signs


def _dominance_matrix(points: np.ndarray) -> np.ndarray:
    """``D[i, j]`` is True when point ``i`` dominates point ``j`` (minimisation, no NaNs)."""
    n = len(points)
    dom = np.zeros((n, n), dtype=bool)
    for start in range(0, n, _CHUNK_ROWS):
        a = points[start : start + _CHUNK_ROWS, None, :]
        b = points[None, :, :]
        dom[start : start + _CHUNK_ROWS] = np.all(a <= b, axis=2) & np.any(a < b, axis=2)
    return dom


def pareto_ranks(values: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """Non-dominated sorting: rank 0 is the Pareto front, rank 1 the front of the rest, and so on.

    Rows containing any NaN get rank ``-1`` (they are excluded from the sorting). Identical points are
    mutually non-dominated and receive the same rank. Works for any number of objectives: a sweep in
    O(n log n) for two (``_ranks_2d``), the efficient non-dominated sort with binary search for more
    (``_ranks_ens``); both are checked against the dominance-matrix definition (``_ranks_by_matrix``).
    """
    pts = _as_min(values, modes)
    n = len(pts)
    ranks = np.full(n, -1, dtype=int)
    valid = ~np.isnan(pts).any(axis=1)
    idx = np.flatnonzero(valid)
    if len(idx) == 0:
        return ranks
    ranks[idx] = _ranks_min(pts[idx])
    return ranks


def _ranks_min(points: np.ndarray) -> np.ndarray:
    """Ranks of points to be minimised, without NaN: the sort that suits the number of objectives."""
    if points.shape[1] == 1:
        return np.unique(points[:, 0], return_inverse=True)[1].reshape(-1)
    if points.shape[1] == 2:
        return _ranks_2d(points)
    return _ranks_ens(points)


def _lex_order(points: np.ndarray) -> np.ndarray:
    """Row order sorted by the first objective, ties by the next, and so on."""
    return np.lexsort(points.T[::-1])


def _ranks_2d(points: np.ndarray) -> np.ndarray:
    """Two objectives (minimised, no NaN) in O(n log n) (Jensen 2003): in lexicographic order a point can
    only be dominated by an earlier one, and within a front the second objective falls as the first rises,
    so a front is represented by its last point's second objective; these minima rise from front to front,
    and a binary search finds the first front whose minimum is above the point's. Identical points share
    the rank of the first of them."""
    order = _lex_order(points)
    f1, f2 = points[order, 0], points[order, 1]
    out = np.empty(len(points), dtype=int)
    minima: list[float] = []
    from bisect import bisect_right
    prev_rank = -1
    for k, i in enumerate(order):
        if k and f1[k] == f1[k - 1] and f2[k] == f2[k - 1]:
            out[i] = prev_rank
            continue
        r = bisect_right(minima, f2[k])
        if r == len(minima):
            minima.append(f2[k])
        else:
            minima[r] = f2[k]
        out[i] = prev_rank = r
    return out


def _ranks_ens(points: np.ndarray) -> np.ndarray:
    """Any number of objectives (minimised, no NaN): the efficient non-dominated sort with binary search
    (ENS-BS, Zhang et al. 2015). In lexicographic order only earlier points can dominate a point; it joins
    the first front none of whose members dominates it, found by bisection over the fronts, each front
    checked at once with numpy. Memory O(n); time O(m n^2) at worst, O(m n log F · |front|) typically."""
    order = _lex_order(points)
    buffers: list[np.ndarray] = []   # each front's points, in a buffer that doubles when full
    sizes: list[int] = []
    out = np.empty(len(points), dtype=int)
    for i in order:
        p = points[i]
        lo, hi = 0, len(buffers)
        while lo < hi:   # a point dominated by front k is dominated by every front before it: bisect
            mid = (lo + hi) // 2
            f = buffers[mid][: sizes[mid]]
            if np.any(np.all(f <= p, axis=1) & np.any(f < p, axis=1)):
                lo = mid + 1
            else:
                hi = mid
        r = lo
        if r == len(buffers):
            buffers.append(np.empty((16, points.shape[1])))
            sizes.append(0)
        if sizes[r] == len(buffers[r]):
            buffers[r] = np.concatenate((buffers[r], np.empty_like(buffers[r])))
        buffers[r][sizes[r]] = p
        sizes[r] += 1
        out[i] = r
    return out


def _ranks_by_matrix(values: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """The definition, by the n x n dominance matrix (O(n^2) memory): the reference the tests hold the fast
    sorts to."""
    pts = _as_min(values, modes)
    n = len(pts)
    ranks = np.full(n, -1, dtype=int)
    valid = ~np.isnan(pts).any(axis=1)
    idx = np.flatnonzero(valid)
    if len(idx) == 0:
        return ranks
    dom = _dominance_matrix(pts[idx])
    n_dominators = dom.sum(axis=0)
    remaining = np.ones(len(idx), dtype=bool)
    rank = 0
    while remaining.any():
        front = remaining & (n_dominators == 0)
        ranks[idx[front]] = rank
        remaining &= ~front
        n_dominators = n_dominators - dom[front].sum(axis=0)
        rank += 1
    return ranks


def pareto_mask(values: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """Boolean mask of the rows on the Pareto front (rank 0); NaN rows are False."""
    return pareto_ranks(values, modes) == 0


def _nondominated(points: np.ndarray) -> np.ndarray:
    """The distinct non-dominated rows of ``points`` (minimisation, no NaNs)."""
    if len(points) <= 1:
        return points
    points = np.unique(points, axis=0)
    return points[_ranks_min(points) == 0]


def _hv_min(points: np.ndarray, ref: np.ndarray) -> float:
    """Exact hypervolume of ``points`` (minimisation, all strictly better than ``ref``).

    m = 1 and 2 are closed forms; m >= 3 slices along the last objective and sums the
    (m-1)-dimensional hypervolumes of the slabs (HSO), which is O(n^2 log n) for m = 3.
    """
    n, m = points.shape
    if n == 0:
        return 0.0
    if m == 1:
        return float(ref[0] - points[:, 0].min())
    if m == 2:
        order = np.lexsort((points[:, 1], points[:, 0]))  # by x, then y
        x, y = points[order, 0], points[order, 1]
        best_y = np.minimum.accumulate(y)
        prev_y = np.concatenate(([ref[1]], best_y[:-1]))
        return float(np.sum((ref[0] - x) * np.maximum(prev_y - y, 0.0)))
    points = _nondominated(points)
    order = np.argsort(points[:, -1], kind="stable")
    points = points[order]
    z = points[:, -1]
    z_next = np.concatenate((z[1:], [ref[-1]]))
    total = 0.0
    for i in range(len(points)):
        depth = z_next[i] - z[i]
        if depth <= 0.0:
            continue
        total += depth * _hv_min(points[: i + 1, :-1], ref[:-1])
    return float(total)


def _prepare_hv(values: np.ndarray, modes: Sequence[str], ref: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    pts = _as_min(values, modes)
    ref_arr = np.asarray(ref, dtype=float).reshape(-1)
    if ref_arr.shape[0] != len(modes):
        raise ValueError(f"ref has {ref_arr.shape[0]} coordinates but there are {len(modes)} objectives")
    ref_min = ref_arr * np.where(np.asarray(modes) == "max", -1.0, 1.0)
    return pts, ref_min


def _contributing(pts: np.ndarray, ref_min: np.ndarray) -> np.ndarray:
    """Mask of rows without NaN that strictly dominate the reference point in every objective."""
    with np.errstate(invalid="ignore"):
        return ~np.isnan(pts).any(axis=1) & np.all(pts < ref_min, axis=1)


def hypervolume(values: np.ndarray, modes: Sequence[str], ref: Sequence[float]) -> float:
    """Exact hypervolume dominated by ``values`` and bounded by the reference point ``ref``.

    ``ref`` is given in the original units (for a ``max`` objective it is a lower bound, for a ``min``
    objective an upper bound). Points that do not strictly beat ``ref`` in every objective and rows with
    NaN contribute nothing; no points gives 0.0. Exact for any m; meant for m = 2 and 3 with n up to a
    few thousand.
    """
    pts, ref_min = _prepare_hv(values, modes, ref)
    pts = pts[_contributing(pts, ref_min)]
    if len(pts) == 0:
        return 0.0
    return _hv_min(_nondominated(pts), ref_min)


def hypervolume_curve(
    values: np.ndarray,
    modes: Sequence[str],
    ref: Sequence[float],
    order: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """Hypervolume after each completed trial.

    ``order`` lists row indices of ``values`` in completion (finish) order; ``None`` means row order.
    Entry ``k`` of the result is the hypervolume of rows ``order[:k + 1]``. Only the running front is
    kept, so trials that are dominated on arrival cost nothing.
    """
    pts, ref_min = _prepare_hv(values, modes, ref)
    order_arr = np.arange(len(pts)) if order is None else np.asarray(order, dtype=int).reshape(-1)
    ok = _contributing(pts, ref_min)
    curve = np.zeros(len(order_arr), dtype=float)
    front = np.empty((0, pts.shape[1]))
    current = 0.0
    for k, i in enumerate(order_arr):
        if ok[i]:
            p = pts[i]
            # weakly dominated by the running front (incl. equal): the hypervolume is unchanged
            if not (len(front) and np.any(np.all(front <= p, axis=1))):
                keep = ~np.all(p <= front, axis=1)
                front = np.vstack((front[keep], p))
                current = _hv_min(front, ref_min)
        curve[k] = current
    return curve


def hypervolume_contributions(values: np.ndarray, modes: Sequence[str], ref: Sequence[float]) -> np.ndarray:
    """Each row's exclusive hypervolume: the hypervolume of all rows less that of all rows but this one
    (0 for a dominated row, a copy of another row, a NaN row or one that does not beat ``ref``). The
    search's confirmation takes the configurations of a front in this order: those that shape it most."""
    values = np.asarray(values, dtype=float)
    total = hypervolume(values, modes, ref)
    out = np.zeros(len(values))
    for i in range(len(values)):
        out[i] = total - hypervolume(np.delete(values, i, axis=0), modes, ref)
    return out


def stand_in_refs(values: np.ndarray, modes: Sequence[str], refs: Sequence[float | None]) -> list[float]:
    """Each objective's hypervolume reference: its ``ref`` where given, else the worst finite value of
    ``values``' column moved outwards by a tenth of the column's range (by 1 when the range is 0; 0.0 for a
    column with no finite value). The margin gives a front's extreme points a share: a reference just past the
    worst value left the extreme point on that objective's side ~0 exclusive hypervolume, last in any order
    by contribution although it shapes the front."""
    values = np.asarray(values, dtype=float)
    out = []
    for j, (mode, ref) in enumerate(zip(modes, refs)):
        if ref is not None:
            out.append(float(ref))
            continue
        col = values[:, j][np.isfinite(values[:, j])] if len(values) else np.array([])
        if len(col) == 0:
            out.append(0.0)
            continue
        span = float(col.max() - col.min())
        margin = span / 10 if span > 0 else 1.0
        out.append(float(col.min() - margin) if mode == "max" else float(col.max() + margin))
    return out
