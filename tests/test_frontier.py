"""frontier.py against slow, obvious references: O(n^2) dominance peeling and inclusion-exclusion."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cem_bench.frontier import hypervolume, hypervolume_curve, pareto_mask, pareto_ranks


# ---------------------------------------------------------------- references (original units)
def _better_or_equal(a: float, b: float, mode: str) -> bool:
    return a >= b if mode == "max" else a <= b


def _strictly_better(a: float, b: float, mode: str) -> bool:
    return a > b if mode == "max" else a < b


def _dominates(a, b, modes) -> bool:
    return all(_better_or_equal(x, y, m) for x, y, m in zip(a, b, modes)) and any(
        _strictly_better(x, y, m) for x, y, m in zip(a, b, modes)
    )


def brute_ranks(values: np.ndarray, modes) -> np.ndarray:
    n = len(values)
    ranks = np.full(n, -1)
    left = [i for i in range(n) if not np.isnan(values[i]).any()]
    rank = 0
    while left:
        front = [i for i in left if not any(_dominates(values[j], values[i], modes) for j in left if j != i)]
        for i in front:
            ranks[i] = rank
        left = [i for i in left if i not in front]
        rank += 1
    return ranks


def brute_hypervolume(values: np.ndarray, modes, ref) -> float:
    """Inclusion-exclusion over subsets of the boxes [point, ref]: exact, exponential, n <= ~10."""
    pts = [
        p
        for p in values
        if not np.isnan(p).any() and all(_strictly_better(x, r, m) for x, r, m in zip(p, ref, modes))
    ]
    total = 0.0
    for k in range(1, len(pts) + 1):
        for subset in itertools.combinations(pts, k):
            vol = 1.0
            for j, mode in enumerate(modes):
                coords = [p[j] for p in subset]
                # the intersection of boxes reaches only as far as the worst corner in each objective
                corner = min(coords) if mode == "max" else max(coords)
                vol *= abs(corner - ref[j])
            total += (-1) ** (k + 1) * vol
    return total


MODE_SETS = [
    ["max", "min"],
    ["min", "min"],
    ["max", "max"],
    ["max", "min", "max"],
    ["min", "min", "min"],
    ["max", "max", "min"],
]


# ---------------------------------------------------------------- ranks
@pytest.mark.parametrize("modes", MODE_SETS)
def test_ranks_match_bruteforce_random(modes):
    rng = np.random.default_rng(len(modes) * 10 + sum(m == "max" for m in modes))
    for trial in range(40):
        n = int(rng.integers(1, 30))
        # coarse integers make ties and duplicate points frequent
        values = rng.integers(0, 5, size=(n, len(modes))).astype(float)
        if trial % 3 == 0:
            values[rng.random(n) < 0.2, int(rng.integers(len(modes)))] = np.nan
        np.testing.assert_array_equal(pareto_ranks(values, modes), brute_ranks(values, modes))
        np.testing.assert_array_equal(pareto_mask(values, modes), brute_ranks(values, modes) == 0)


def test_ranks_hand_cases():
    values = np.array([[0.9, 0.5], [0.8, 0.3], [0.7, 0.6], [0.9, 0.5], [np.nan, 0.1], [0.6, 0.7]])
    ranks = pareto_ranks(values, ["max", "min"])
    # (0.9,0.5) twice: identical -> same rank 0; (0.8,0.3) front; (0.7,0.6) dominated by both -> 1
    np.testing.assert_array_equal(ranks, [0, 0, 1, 0, -1, 2])
    assert pareto_mask(values, ["max", "min"]).tolist() == [True, True, False, True, False, False]


def test_ranks_empty_and_all_nan():
    assert pareto_ranks(np.empty((0, 2)), ["max", "min"]).shape == (0,)
    np.testing.assert_array_equal(pareto_ranks(np.full((3, 2), np.nan), ["max", "min"]), [-1, -1, -1])


def test_bad_modes_and_shapes():
    with pytest.raises(ValueError, match="unknown mode"):
        pareto_ranks(np.zeros((2, 2)), ["max", "maximise"])
    with pytest.raises(ValueError, match="objectives"):
        pareto_ranks(np.zeros((2, 3)), ["max", "min"])
    with pytest.raises(ValueError, match="ref"):
        hypervolume(np.zeros((2, 2)), ["max", "min"], [0.0])


# ---------------------------------------------------------------- hypervolume
def test_hypervolume_hand_2d():
    # minimise both, ref (4, 4): points (1,3), (2,2), (3,1) -> staircase area 3 + 2 + 1 = 6
    pts = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]])
    assert hypervolume(pts, ["min", "min"], [4, 4]) == pytest.approx(6.0)
    # the same in mixed modes: x maximised (negated), ref x = -4
    assert hypervolume(pts * [-1, 1], ["max", "min"], [-4, 4]) == pytest.approx(6.0)
    # accuracy vs ssim: one point (0.9, 0.4), ref (0.1, 1.0) -> 0.8 * 0.6
    assert hypervolume(np.array([[0.9, 0.4]]), ["max", "min"], [0.1, 1.0]) == pytest.approx(0.48)


def test_hypervolume_hand_3d():
    # unit-cube corners: (0,0,1) box 2*2*1=4 w.r.t. ref (2,2,2); adding (1,1,0) adds 1*1*2 - overlap 1*1*1 = 1
    pts = np.array([[0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    assert hypervolume(pts, ["min"] * 3, [2, 2, 2]) == pytest.approx(5.0)
    assert hypervolume(pts[:1], ["min"] * 3, [2, 2, 2]) == pytest.approx(4.0)


def test_hypervolume_edge_cases():
    modes = ["max", "min"]
    assert hypervolume(np.empty((0, 2)), modes, [0.1, 1.0]) == 0.0
    assert hypervolume(np.array([[np.nan, 0.2]]), modes, [0.1, 1.0]) == 0.0
    # on the reference boundary or worse: contributes nothing
    assert hypervolume(np.array([[0.1, 0.5], [0.5, 1.0], [0.05, 0.1]]), modes, [0.1, 1.0]) == 0.0
    # NaN rows are ignored, the rest counts
    assert hypervolume(np.array([[0.5, 0.5], [np.nan, 0.0]]), modes, [0.0, 1.0]) == pytest.approx(0.25)
    # duplicates count once
    assert hypervolume(np.array([[0.5, 0.5], [0.5, 0.5]]), modes, [0.0, 1.0]) == pytest.approx(0.25)


@pytest.mark.parametrize("modes", MODE_SETS)
def test_hypervolume_matches_inclusion_exclusion(modes):
    rng = np.random.default_rng(7 + len(modes))
    for trial in range(30):
        n = int(rng.integers(1, 9))
        values = rng.random((n, len(modes)))
        if trial % 2:
            values = np.round(values, 1)  # ties and duplicates
        if trial % 5 == 0:
            values[0, -1] = np.nan
        # ref roughly in the "bad" corner but sometimes cutting through the cloud
        ref = [0.1 if m == "max" else 0.9 for m in modes]
        got = hypervolume(values, modes, ref)
        assert got == pytest.approx(brute_hypervolume(values, modes, ref), abs=1e-12)


def test_hypervolume_four_objectives():
    rng = np.random.default_rng(3)
    values = rng.random((6, 4))
    modes = ["max", "min", "min", "max"]
    ref = [0.0, 1.0, 1.0, 0.0]
    assert hypervolume(values, modes, ref) == pytest.approx(brute_hypervolume(values, modes, ref))


def test_hypervolume_3d_moderate_size_is_quick():
    rng = np.random.default_rng(0)
    # points on a sphere octant: all mutually non-dominated, the worst case for slicing
    v = np.abs(rng.normal(size=(400, 3)))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    hv = hypervolume(v, ["min"] * 3, [1.0, 1.0, 1.0])
    # the octant of the unit sphere leaves 1 - pi/6 of the cube; a finite sample dominates less
    assert 0.0 < hv < 1 - np.pi / 6


# ---------------------------------------------------------------- hypervolume curve
@pytest.mark.parametrize("modes", [["max", "min"], ["max", "min", "max"]])
def test_hypervolume_curve_matches_prefixes(modes):
    rng = np.random.default_rng(11)
    values = np.round(rng.random((12, len(modes))), 1)
    values[3] = np.nan
    ref = [0.0 if m == "max" else 1.0 for m in modes]
    order = rng.permutation(len(values))
    curve = hypervolume_curve(values, modes, ref, order)
    expected = [hypervolume(values[order[: k + 1]], modes, ref) for k in range(len(order))]
    np.testing.assert_allclose(curve, expected, atol=1e-12)
    assert np.all(np.diff(curve) >= -1e-12)  # never decreases
    np.testing.assert_allclose(
        hypervolume_curve(values, modes, ref),
        [hypervolume(values[: k + 1], modes, ref) for k in range(len(values))],
        atol=1e-12,
    )


def test_hypervolume_curve_empty():
    assert hypervolume_curve(np.empty((0, 2)), ["max", "min"], [0, 1], []).shape == (0,)


def test_hypervolume_contributions_are_each_points_exclusive_area():
    from cem_bench.frontier import hypervolume_contributions
    # max accuracy, min ssim, ref (0, 1): three front points and a dominated one
    pts = np.array([[0.9, 0.8], [0.7, 0.5], [0.3, 0.2], [0.6, 0.6]])
    got = hypervolume_contributions(pts, ["max", "min"], [0.0, 1.0])
    # exclusive areas: (0.9-0.7)*(1-0.8); (0.7-0.3)*(0.8-0.5) less what the dominated (0.6, 0.6) covers
    # without it, (0.6-0.3)*(0.8-0.6); (0.3-0)*(0.5-0.2); the dominated point adds nothing
    assert got == pytest.approx([0.04, 0.06, 0.09, 0.0])


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_fast_ranks_match_the_dominance_matrix(m):
    """The sweep (2 objectives) and the sequential-search sort (3+) give the definition's ranks on random
    sets with many ties (values on a coarse grid), duplicates and NaN rows, in both directions."""
    from cem_bench.frontier import _ranks_by_matrix
    rng = np.random.default_rng(m)
    for trial in range(30):
        n = int(rng.integers(1, 120))
        values = rng.integers(0, 6, size=(n, m)).astype(float)
        values[rng.random(n) < 0.1, int(rng.integers(0, m))] = np.nan
        if n > 3:
            values[1] = values[0]                     # an exact duplicate
        modes = [["max", "min"][int(b)] for b in rng.integers(0, 2, m)]
        assert np.array_equal(pareto_ranks(values, modes), _ranks_by_matrix(values, modes)), (trial, values, modes)
