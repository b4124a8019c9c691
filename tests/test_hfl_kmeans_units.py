"""Unit checks of the horizontal k-means building blocks (spec shared/specs/hfl-kmeans.md §2, §3.1,
§3.2, §3.4 and §6 checks 1 and 3): the size-constrained min-cost-flow assignment against an
independent LP solver, the non-exclusive assignment, cluster sums, the initialisations, folding,
the metrics, and the one-time pads / pairwise masks of the masked secure aggregation.

Everything is deterministic: numpy generators with fixed seeds, fixed secret bytes for the keys.
"""

import math

import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, vstack
from scipy.stats import chisquare
from sklearn.metrics import silhouette_score

from rayfed.clustering import squared_distances
from rayfed.clustering.constrained import (
    assign,
    cluster_sums,
    cost_centers,
    cost_scale,
    data_random,
    domain_random,
    empty_clusters,
    flow_assign,
    fold,
    kmeans_plus_plus,
    nearest_members,
    post_process,
    silhouette,
    sphere_packing,
    wcss,
)
from rayfed.errors import ConfigError
from rayfed.protocols.hfl_kmeans.steps import INFO_INIT
from rayfed.secagg import pads

# (seed, n, k, d, min_size, max_size): loose, tight and one-sided bounds
FLOW_CASES = [
    (1, 30, 3, 2, 8, 12),
    (2, 30, 3, 2, 10, 10),
    (3, 50, 4, 2, 10, 15),
    (4, 60, 5, 3, 0, 60),
    (5, 80, 6, 2, 12, 14),
    (6, 120, 4, 2, 20, 40),
    (7, 150, 3, 4, 0, 55),
    (8, 200, 6, 2, 30, 36),
    (9, 200, 5, 3, 35, 200),
]


def _instance(seed: int, n: int, k: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    return gen.uniform(-1, 1, (n, d)), gen.uniform(-1, 1, (k, d))


def _lp_optimum(cost: np.ndarray, lo: int, hi: int, e: int, total: int | None = None) -> float:
    """Optimum of the LP relaxation (HiGHS) of: min Σ cost·z, z in [0,1]^(n×k), each row sum in
    [1, E], each column sum in [lo, hi] (and Σ z = total if given). The constraint matrix is a
    bipartite incidence matrix, totally unimodular, so this is the integer optimum too."""
    n, k = cost.shape
    var = np.arange(n * k)
    ones = np.ones(n * k)
    by_row = coo_matrix((ones, (var // k, var)), shape=(n, n * k))
    by_col = coo_matrix((ones, (var % k, var)), shape=(k, n * k))
    a_ub = vstack([by_row, -by_row, by_col, -by_col]).tocsr()
    b_ub = np.concatenate([np.full(n, e), -np.ones(n), np.full(k, hi), np.full(k, -lo)])
    a_eq, b_eq = (np.ones((1, n * k)), [total]) if total is not None else (None, None)
    res = linprog(
        cost.ravel(), A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, 1), method="highs"
    )
    assert res.status == 0, res.message
    return float(res.fun)


def _cost(x: np.ndarray, centers: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> float:
    """The flow's objective: squared distances to the centroids as its costs see them (shifted
    by the public offsets, cost_centers)."""
    shifted = cost_centers(centers)
    return float(((x[rows] - shifted[cols]) ** 2).sum())


def _d2(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """The LP's costs: squared distances to the shifted centroids, computed here."""
    shifted = cost_centers(centers)
    return ((x[:, None, :] - shifted[None, :, :]) ** 2).sum(axis=2)


def _tol(n: int, centers: np.ndarray, hi: int, e: int = 1) -> float:
    """Integer costs are rounded at the flow's scale (n·E half-units on each side, ~2^-40 here),
    plus the LP solver's and the floats' precision."""
    return n * e / cost_scale(centers, hi, e, 1.0) + 1e-9


# --- min-cost-flow assignment (§3.1(3)-(4), §6 check 3) ----------------------------------------
@pytest.mark.parametrize("seed,n,k,d,lo,hi", FLOW_CASES)
def test_flow_assign_is_exclusive_within_bounds_and_optimal(seed, n, k, d, lo, hi):
    """E = 1: every point in exactly one cluster, lo <= sizes <= hi, cost = LP optimum."""
    x, centers = _instance(seed, n, k, d)
    rows, cols = flow_assign(x, centers, lo, hi)
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))
    sizes = np.bincount(cols, minlength=k)
    assert sizes.min() >= lo and sizes.max() <= hi
    optimum = _lp_optimum(_d2(x, centers), lo, hi, 1)
    assert abs(_cost(x, centers, rows, cols) - optimum) <= _tol(n, centers, hi)


def test_flow_assign_binding_c_min_costs_more_than_argmin():
    """A binding c_min makes the constrained cost strictly higher than the unconstrained one."""
    x, centers = _instance(11, 100, 4, 2)
    free_rows, free_cols = flow_assign(x, centers, 0, 100)
    rows, cols = flow_assign(x, centers, 25, 25)
    assert np.bincount(free_cols, minlength=4).min() < 25  # the bound binds on this instance
    np.testing.assert_array_equal(np.bincount(cols, minlength=4), [25, 25, 25, 25])
    assert _cost(x, centers, rows, cols) > _cost(x, centers, free_rows, free_cols) + 1e-3


@pytest.mark.parametrize("seed,n,k,d", [(21, 30, 3, 2), (22, 100, 5, 3), (23, 200, 6, 2)])
def test_flow_assign_without_bounds_is_the_argmin(seed, n, k, d):
    x, centers = _instance(seed, n, k, d)
    d2 = _d2(x, centers)
    best2 = np.sort(d2, axis=1)[:, :2]
    assert (best2[:, 1] - best2[:, 0]).min() > 1e-5  # no ties, even after rounding
    rows, cols = flow_assign(x, centers, 0, n)
    np.testing.assert_array_equal(rows, np.arange(n))
    np.testing.assert_array_equal(cols, np.argmin(d2, axis=1))
    # assign() defaults max_size to n, and "unconstrained" is the argmin directly (of the
    # centroids themselves: the same wherever the offsets, <= k·2^-16 per centroid, cannot
    # reorder a point's two nearest, i.e. its gap exceeds 2·(2√d·k·2^-16) + (k·2^-16)²)
    np.testing.assert_array_equal(assign(x, centers, "constrained")[1], cols)
    u_rows, u_cols = assign(x, centers, "unconstrained")
    np.testing.assert_array_equal(u_rows, np.arange(n))
    true2 = np.sort(squared_distances(x, centers), axis=1)[:, :2]
    clear = true2[:, 1] - true2[:, 0] > 4 * np.sqrt(d) * k * 2.0**-16 + (k * 2.0**-16) ** 2
    assert clear.sum() >= n - 1
    np.testing.assert_array_equal(u_cols[clear], cols[clear])


@pytest.mark.parametrize(
    "seed,n,k,hi,e", [(33, 60, 4, 60, 4), (34, 60, 4, 16, 3), (35, 100, 5, 22, 2)]
)
def test_flow_assign_with_contribution_but_no_c_min_stays_exclusive(seed, n, k, hi, e):
    """E > 1, c_min = 0: an extra membership only adds cost and cannot relieve a max bound, so
    every point joins exactly one cluster and the cost is the E = 1 optimum."""
    x, centers = _instance(seed, n, k, 2)
    rows, cols = flow_assign(x, centers, 0, hi, contribution=e)
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))
    assert np.bincount(cols, minlength=k).max() <= hi
    cost = _cost(x, centers, rows, cols)
    assert abs(cost - _lp_optimum(_d2(x, centers), 0, hi, e)) <= _tol(n, centers, hi, e)
    rows1, cols1 = flow_assign(x, centers, 0, hi)
    assert abs(cost - _cost(x, centers, rows1, cols1)) <= 2 * _tol(n, centers, hi, e)


@pytest.mark.parametrize(
    "seed,n,k,lo,hi,e",
    [
        (31, 40, 3, 10, 20, 2),
        (32, 90, 5, 15, 30, 3),
        (201, 90, 5, 15, 30, 2),
        (6, 120, 4, 20, 40, 2),
    ],
)
def test_flow_assign_with_contribution_is_optimal_when_k_c_min_fits(seed, n, k, lo, hi, e):
    """E > 1, k*c_min <= n: every point in 1..E clusters, sizes within bounds, cost = the LP
    optimum, which is never above the exclusive (E = 1) optimum."""
    x, centers = _instance(seed, n, k, 2)
    assert k * lo <= n
    rows, cols = flow_assign(x, centers, lo, hi, contribution=e)
    per_point = np.bincount(rows, minlength=n)
    assert per_point.min() == 1 and per_point.max() <= e
    sizes = np.bincount(cols, minlength=k)
    assert sizes.min() >= lo and sizes.max() <= hi
    cost = _cost(x, centers, rows, cols)
    assert abs(cost - _lp_optimum(_d2(x, centers), lo, hi, e)) <= _tol(n, centers, hi, e)
    rows1, cols1 = flow_assign(x, centers, lo, hi)
    assert cost <= _cost(x, centers, rows1, cols1) + 2 * _tol(n, centers, hi, e)


def test_flow_assign_contribution_exclusive_on_instance_where_c_min_does_not_bind():
    x, centers = _instance(31, 40, 3, 2)
    rows, cols = flow_assign(x, centers, 10, 20, contribution=2)
    np.testing.assert_array_equal(np.sort(rows), np.arange(40))


def test_flow_assign_contribution_adds_memberships_when_c_min_binds_even_if_k_c_min_fits():
    """Documents that E > 1 is not a no-op when k*c_min <= n: on (n=90, k=5, c_min=15,
    c_max=30, E=3) the exact optimum of J makes 96 memberships (a cheap second membership
    replaces an expensive forced one) and costs strictly less than the exclusive optimum."""
    x, centers = _instance(32, 90, 5, 2)
    rows, cols = flow_assign(x, centers, 15, 30, contribution=3)
    rows1, cols1 = flow_assign(x, centers, 15, 30)
    assert len(rows) == 96 and len(rows1) == 90
    assert _cost(x, centers, rows, cols) < _cost(x, centers, rows1, cols1) - 1.0


@pytest.mark.parametrize(
    "seed,n,k,lo,e", [(0, 30, 4, 10, 2), (41, 50, 6, 12, 2), (42, 40, 5, 20, 3), (43, 30, 3, 25, 3)]
)
def test_flow_assign_doubles_points_only_as_far_as_c_min_forces(seed, n, k, lo, e):
    """k*c_min > n: with max_size = c_min the sizes are exactly c_min, every point is in 1..E
    clusters and exactly k*c_min - n extra memberships are made; with max_size = n the cost
    is still the LP optimum and never more than E memberships per point."""
    x, centers = _instance(seed, n, k, 2)
    assert n < k * lo <= e * n
    rows, cols = flow_assign(x, centers, lo, lo, contribution=e)
    per_point = np.bincount(rows, minlength=n)
    assert per_point.min() == 1 and per_point.max() <= e
    assert len(rows) == k * lo
    np.testing.assert_array_equal(np.bincount(cols, minlength=k), np.full(k, lo))
    assert len(set(zip(rows.tolist(), cols.tolist(), strict=True))) == len(rows)  # no repeats
    if e == 2:
        assert (per_point == 2).sum() == k * lo - n
    d2 = _d2(x, centers)
    assert abs(_cost(x, centers, rows, cols) - _lp_optimum(d2, lo, lo, e)) <= _tol(
        n, centers, lo, e
    )

    rows, cols = flow_assign(x, centers, lo, n, contribution=e)
    per_point = np.bincount(rows, minlength=n)
    assert per_point.min() == 1 and per_point.max() <= e
    assert np.bincount(cols, minlength=k).min() >= lo
    assert len(rows) >= k * lo
    assert abs(_cost(x, centers, rows, cols) - _lp_optimum(d2, lo, n, e)) <= _tol(n, centers, n, e)


def test_flow_assign_loose_max_uses_exactly_k_c_min_memberships_on_typical_instance():
    """n=30, k=4, c_min=10, E=2, max_size=n: 40 memberships, 10 points in two clusters."""
    x, centers = _instance(0, 30, 4, 2)
    rows, cols = flow_assign(x, centers, 10, 30, contribution=2)
    assert len(rows) == 40
    np.testing.assert_array_equal(np.bincount(cols, minlength=4), [10, 10, 10, 10])
    assert (np.bincount(rows, minlength=30) == 2).sum() == 10


def test_flow_assign_optimum_may_exceed_k_c_min_memberships():
    """Documents §6 check 3's "joins >1 only when c_min forces it" as a heuristic: on this
    instance (n=30, k=4, c_min=10, E=2, max=n) the true optimum makes 41 memberships, and
    forcing exactly 40 (the LP with Σ z = 40) costs strictly more."""
    x, centers = _instance(4, 30, 4, 2)
    rows, cols = flow_assign(x, centers, 10, 30, contribution=2)
    d2 = _d2(x, centers)
    cost = _cost(x, centers, rows, cols)
    assert len(rows) == 41
    assert abs(cost - _lp_optimum(d2, 10, 30, 2)) <= _tol(30, centers, 30, 2)
    assert _lp_optimum(d2, 10, 30, 2, total=40) > cost + 1e-3


@pytest.mark.parametrize(
    "n,k,lo,hi,e",
    [(30, 4, 8, 30, 1), (30, 4, 16, 30, 2), (30, 3, 0, 9, 1), (30, 3, 0, 9, 3), (10, 2, 6, 10, 1)],
)
def test_flow_assign_infeasible_bounds_raise_config_error_on_min_size(n, k, lo, hi, e):
    x, centers = _instance(51, n, k, 2)
    with pytest.raises(ConfigError) as info:
        flow_assign(x, centers, lo, hi, contribution=e)
    assert info.value.field == "min_size"
    with pytest.raises(ConfigError) as info:
        assign(x, centers, "constrained", min_size=lo, max_size=hi, contribution=e)
    assert info.value.field == "min_size"


def test_assign_unknown_method_raises_config_error():
    x, centers = _instance(52, 10, 2, 2)
    with pytest.raises(ConfigError) as info:
        assign(x, centers, "balanced")
    assert info.value.field == "assignment"


# --- non-exclusive assignment (§3.1(2)) ---------------------------------------------------------
@pytest.mark.parametrize("seed,n,k,size", [(61, 40, 3, 5), (62, 100, 5, 30), (63, 50, 4, 49)])
def test_nearest_members_takes_each_clusters_size_nearest_points(seed, n, k, size):
    x, centers = _instance(seed, n, k, 2)
    rows, cols = nearest_members(x, centers, size)
    d2 = squared_distances(x, centers)
    np.testing.assert_array_equal(np.bincount(cols, minlength=k), np.full(k, size))
    for i in range(k):
        members = rows[cols == i]
        assert len(np.unique(members)) == size
        outside = np.setdiff1d(np.arange(n), members)
        assert d2[members, i].max() <= d2[outside, i].min()
        np.testing.assert_array_equal(np.sort(members), np.sort(np.argsort(d2[:, i])[:size]))
    via_assign = assign(x, centers, "non-exclusive", min_size=size)
    np.testing.assert_array_equal(via_assign[0], rows)
    np.testing.assert_array_equal(via_assign[1], cols)


def test_nearest_members_edge_sizes():
    """size 0: no memberships; size >= n: every point in every cluster."""
    x, centers = _instance(64, 12, 3, 2)
    rows, cols = nearest_members(x, centers, 0)
    assert rows.size == 0 and cols.size == 0
    rows, cols = nearest_members(x, centers, 50)
    pairs = set(zip(rows.tolist(), cols.tolist(), strict=True))
    assert pairs == {(j, i) for j in range(12) for i in range(3)}


# --- cluster sums -------------------------------------------------------------------------------
def _brute_sums(x, rows, cols, k):
    sums = np.zeros((k, x.shape[1]), dtype=x.dtype)
    counts = np.zeros(k, dtype=np.int64)
    for r, c in zip(rows, cols, strict=True):
        sums[c] += x[r]
        counts[c] += 1
    return sums, counts


def test_cluster_sums_of_integers_are_exact_int64():
    """Grid values up to 2^17 in magnitude, non-exclusive memberships, one empty cluster."""
    gen = np.random.default_rng(71)
    x = gen.integers(-(2**17), 2**17, size=(300, 3), dtype=np.int64)
    rows = np.concatenate([np.arange(300), gen.integers(0, 300, 200)])
    cols = np.concatenate([gen.integers(0, 4, 300), gen.integers(0, 4, 200)])
    sums, counts = cluster_sums(x, (rows, cols), 5)
    want_sums, want_counts = _brute_sums(x, rows, cols, 5)
    assert sums.dtype == np.int64
    np.testing.assert_array_equal(sums, want_sums)
    np.testing.assert_array_equal(counts, want_counts)
    assert counts[4] == 0 and not sums[4].any()


def test_cluster_sums_of_floats_match_brute_force():
    x, centers = _instance(72, 150, 4, 3)
    rows, cols = flow_assign(x, centers, 20, 60)
    sums, counts = cluster_sums(x, (rows, cols), 4)
    want_sums, want_counts = _brute_sums(x, rows, cols, 4)
    np.testing.assert_allclose(sums, want_sums, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(counts, want_counts)
    assert sums.shape == (4, 3)


# --- initialisations (§3.2) ---------------------------------------------------------------------
def _implied_radius(centers: np.ndarray, lo: float, hi: float) -> float | None:
    """Largest a = (hi - lo)/2 · 2^-j with every center >= a inside the box and pairwise >= 2a."""
    gaps = np.linalg.norm(centers[:, None] - centers[None], axis=2)
    np.fill_diagonal(gaps, np.inf)
    for j in range(65):
        a = (hi - lo) / 2.0 * 2.0**-j
        inside = centers.min() >= lo + a - 1e-12 and centers.max() <= hi - a + 1e-12
        if inside and gaps.min() >= 2 * a - 1e-12:
            return a
    return None


@pytest.mark.parametrize("k,d", [(3, 2), (5, 2), (4, 3), (6, 4), (8, 5), (15, 2)])
def test_sphere_packing_centers_are_separated_inside_the_box(k, d):
    for seed in range(5):
        centers = sphere_packing(k, d, np.random.default_rng(seed))
        assert centers.shape == (k, d)
        assert centers.min() >= -1.0 and centers.max() <= 1.0
        a = _implied_radius(centers, -1.0, 1.0)
        # a = 1 shrinks the box to its center point, so k >= 2 always needs a <= 1/2
        assert a is not None and 2.0**-6 <= a <= 0.5


def test_sphere_packing_single_center_is_the_box_center():
    """k = 1 succeeds at the first level a = (hi - lo)/2, whose shrunk box is one point."""
    np.testing.assert_array_equal(sphere_packing(1, 3, np.random.default_rng(0)), np.zeros((1, 3)))
    np.testing.assert_array_equal(
        sphere_packing(1, 2, np.random.default_rng(0), lower=2.0, upper=6.0), [[4.0, 4.0]]
    )


def test_sphere_packing_two_centers_in_the_plane_use_radius_half_or_quarter():
    """k=2, d=2: a=1 fails (both candidates at the origin); a=1/2 succeeds only if the first
    center lands near a corner of [-1/2,1/2]^2; otherwise a=1/4 (box [-3/4,3/4]^2, 1/2 apart)."""
    radii = []
    for seed in range(40):
        centers = sphere_packing(2, 2, np.random.default_rng(seed))
        assert np.abs(centers).max() <= 0.75 and np.linalg.norm(centers[0] - centers[1]) >= 0.5
        radii.append(_implied_radius(centers, -1.0, 1.0))
    assert set(radii) == {0.25, 0.5}
    half = [s for s, a in zip(range(40), radii, strict=True) if a == 0.5]
    centers = sphere_packing(2, 2, np.random.default_rng(half[0]))
    assert np.abs(centers).max() <= 0.5 and np.linalg.norm(centers[0] - centers[1]) >= 1.0


def test_sphere_packing_respects_other_bounds():
    centers = sphere_packing(6, 3, np.random.default_rng(81), lower=0.0, upper=10.0)
    assert centers.min() >= 0.0 and centers.max() <= 10.0
    a = _implied_radius(centers, 0.0, 10.0)
    assert a is not None and a <= 2.5


def test_sphere_packing_is_deterministic_per_seed():
    first = sphere_packing(5, 3, np.random.default_rng(123))
    np.testing.assert_array_equal(first, sphere_packing(5, 3, np.random.default_rng(123)))
    assert not np.allclose(first, sphere_packing(5, 3, np.random.default_rng(124)))


def test_domain_random_is_uniform_in_the_box():
    gen = np.random.default_rng(82)
    centers = domain_random(2000, 3, gen, bound=2.0)
    assert centers.shape == (2000, 3)
    assert centers.min() >= -2.0 and centers.max() <= 2.0
    assert centers.min() < -1.9 and centers.max() > 1.9  # spans the box, not [0, 1)
    assert abs(centers.mean()) < 0.1  # mean 0, sd of the mean 2/sqrt(3·6000) ≈ 0.015


def test_data_random_and_kmeans_plus_plus_pick_distinct_data_points():
    x, _ = _instance(83, 60, 1, 2)
    for init in (data_random, kmeans_plus_plus):
        centers = init(x, 8, np.random.default_rng(84))
        assert centers.shape == (8, 2)
        hits = [np.flatnonzero((x == c).all(axis=1)) for c in centers]
        assert all(len(h) == 1 for h in hits)
        assert len({int(h[0]) for h in hits}) == 8
    # D² sampling never re-picks a chosen point (its weight is 0) even with duplicates present
    dup = np.repeat(x[:3], 10, axis=0)
    centers = kmeans_plus_plus(dup, 3, np.random.default_rng(85))
    assert len(np.unique(centers, axis=0)) == 3


# --- post-processing (§3.4) ---------------------------------------------------------------------
def _reflect(v: float, lo: float, hi: float) -> float:
    """The spec's formula, applied until inside: v < lo -> 2lo - v, v > hi -> 2hi - v."""
    while v < lo or v > hi:
        v = 2 * lo - v if v < lo else 2 * hi - v
    return v


def test_fold_hand_values():
    got = fold(np.array([0.3, -1.0, 1.0, 1.2, -1.5, 3.5, 5.0, -4.2]), -1.0, 1.0)
    # 3.5 -> 2·1 - 3.5 = -1.5 -> 2·(-1) + 1.5 = -0.5; 5 -> -3 -> 1; -4.2 -> 2.2 -> -0.2
    np.testing.assert_allclose(got, [0.3, -1.0, 1.0, 0.8, -0.5, -0.5, 1.0, -0.2], atol=1e-12)


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (0.0, 3.0), (12.0, 40.0), (-50.0, -10.0)])
def test_fold_matches_repeated_reflection_and_stays_in_bounds(lo, hi):
    gen = np.random.default_rng(91)
    width = hi - lo
    x = gen.uniform(lo - 5 * width, hi + 5 * width, 2000)
    got = fold(x, lo, hi)
    assert got.min() >= lo and got.max() <= hi
    np.testing.assert_allclose(got, [_reflect(v, lo, hi) for v in x], atol=1e-9)
    inside = (x >= lo) & (x <= hi)
    np.testing.assert_array_equal(got[inside], x[inside])
    np.testing.assert_allclose(fold(got, lo, hi), got, atol=0)  # idempotent


def test_post_process_methods():
    x = np.array([-3.0, -1.0, 0.25, 1.0, 1.2])
    np.testing.assert_array_equal(post_process(x, "trunc", -1.0, 1.0), [-1.0, -1.0, 0.25, 1, 1])
    np.testing.assert_array_equal(post_process(x, "none", -1.0, 1.0), x)
    np.testing.assert_allclose(post_process(x, "fold", -1.0, 1.0), fold(x, -1.0, 1.0))
    with pytest.raises(ConfigError) as info:
        post_process(x, "wrap", -1.0, 1.0)
    assert info.value.field == "post"


# --- metrics ------------------------------------------------------------------------------------
def test_wcss_and_empty_clusters_by_hand():
    x = np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [10.0, 2.0]])
    centers = np.array([[1.0, 0.0], [10.0, 1.0], [100.0, 100.0]])
    total, labels = wcss(x, centers)
    np.testing.assert_array_equal(labels, [0, 0, 1, 1])
    assert total == pytest.approx(4.0, abs=1e-12)  # four points at distance 1
    assert empty_clusters(labels, 3) == 1
    assert empty_clusters(labels, 2) == 0
    total, labels = wcss(x, np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [10.0, 2.0]]))
    assert total == 0.0 and empty_clusters(labels, 4) == 0


def test_silhouette_is_sklearns_when_small():
    x, centers = _instance(101, 120, 3, 2)
    _, labels = wcss(x, centers)
    score, used = silhouette(x, labels, np.random.default_rng(0), max_points=500)
    assert used == 120
    assert score == pytest.approx(silhouette_score(x, labels), abs=1e-12)


def test_silhouette_samples_when_large():
    """n > max_points: the score is sklearn's on a uniform sample of max_points points."""
    gen = np.random.default_rng(102)
    x = np.concatenate([gen.normal(-3, 0.5, (600, 2)), gen.normal(3, 0.5, (600, 2))])
    labels = np.repeat([0, 1], 600)
    score, used = silhouette(x, labels, np.random.default_rng(7), max_points=300)
    assert used == 300
    pick = np.random.default_rng(7).choice(1200, size=300, replace=False)
    assert score == pytest.approx(silhouette_score(x[pick], labels[pick]), abs=1e-12)
    assert score == pytest.approx(silhouette_score(x, labels), abs=0.02)


def test_silhouette_is_nan_with_one_label():
    x, _ = _instance(103, 50, 1, 2)
    score, used = silhouette(x, np.zeros(50, np.int64), np.random.default_rng(0), 20)
    assert math.isnan(score) and used == 20


# --- one-time pads and pairwise masks (§2, §6 check 1) ------------------------------------------
PAD_KEY = pads.subkey(bytes(range(32)), pads.INFO_PADS)
SCALE = 2.0**16


def _encode(values: np.ndarray) -> np.ndarray:
    return np.rint(values * SCALE).astype(np.int64)


def _ring_sum(words: np.ndarray, bits: int) -> np.ndarray:
    return words.sum(axis=0, dtype=pads.ring_dtype(bits))


@pytest.mark.parametrize("bits", [32, 64])
def test_ring_round_trip_of_signed_values(bits):
    top = 2 ** (bits - 1)
    gen = np.random.default_rng(111)
    values = np.concatenate(
        [
            [-top, -top + 1, -1, 0, 1, top - 1],
            gen.integers(-top, top, 1000, dtype=np.int64),
        ]
    ).astype(np.int64)
    words = pads.to_ring(values, bits)
    assert words.dtype == pads.ring_dtype(bits)
    np.testing.assert_array_equal(pads.from_ring(words, bits), values)
    assert int(pads.to_ring(np.array([-1]), bits)[0]) == 2**bits - 1  # two's complement
    with pytest.raises(ValueError):
        pads.ring_dtype(16)


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("m", [2, 3, 10])
def test_shared_pads_unmask_to_the_exact_sum(m, bits):
    """Σ uploads − Σ r_l = Σ encoded values mod 2^b; decoded it is within M·2^-16 of the float
    sum (rounding to nearest: M·2^-17)."""
    gen = np.random.default_rng(120 + m)
    n, iteration = 257, 3
    values = gen.uniform(-1, 1, (m, n))
    encoded = _encode(values)
    r = pads.shared_pads(PAD_KEY, iteration, m, n, bits)
    assert r.shape == (m, n) and r.dtype == pads.ring_dtype(bits)
    uploads = pads.to_ring(encoded, bits) + r
    unmasked = pads.from_ring(_ring_sum(uploads, bits) - _ring_sum(r, bits), bits)
    np.testing.assert_array_equal(unmasked, encoded.sum(axis=0))
    assert np.abs(unmasked / SCALE - values.sum(axis=0)).max() <= m * 2.0**-17
    # every party derives the same pads
    np.testing.assert_array_equal(r, pads.shared_pads(PAD_KEY, iteration, m, n, bits))


def test_pads_are_fresh_per_iteration_and_party():
    n = 1000
    r1 = pads.shared_pads(PAD_KEY, 1, 4, n, 32)
    r2 = pads.shared_pads(PAD_KEY, 2, 4, n, 32)
    # equal words by chance: expected n / 2^32 per pair
    assert np.mean(r1 == r2) < 0.01
    for a in range(4):
        for b in range(a + 1, 4):
            assert np.mean(r1[a] == r1[b]) < 0.01


def test_subkey_is_deterministic_and_purpose_bound():
    group = bytes(range(100, 132))
    key = pads.subkey(group, pads.INFO_PADS)
    assert len(key) == 32 and key == pads.subkey(group, pads.INFO_PADS)
    assert key != pads.subkey(group, INFO_INIT)
    assert key != pads.subkey(bytes(range(101, 133)), pads.INFO_PADS)


def test_padded_upload_top_byte_is_uniform():
    """Server's view: the top byte of 20,000 padded Z_2^32 words passes a chi-square test, while
    the unpadded encoding (top byte 0x00 or 0xFF) fails it by far."""
    n = 20_000
    encoded = _encode(np.random.default_rng(141).uniform(-1, 1, n))
    plain = pads.to_ring(encoded, 32)
    upload = plain + pads.shared_pads(PAD_KEY, 7, 3, n, 32)[1]
    counts = np.bincount(upload >> np.uint32(24), minlength=256)
    assert chisquare(counts).pvalue > 1e-3
    plain_counts = np.bincount(plain >> np.uint32(24), minlength=256)
    assert chisquare(plain_counts).pvalue < 1e-100


def test_wrong_pad_key_or_missing_party_gives_garbage():
    m, n, bits = 3, 500, 32
    encoded = _encode(np.random.default_rng(151).uniform(-1, 1, (m, n)))
    r = pads.shared_pads(PAD_KEY, 2, m, n, bits)
    total = _ring_sum(pads.to_ring(encoded, bits) + r, bits)
    want = encoded.sum(axis=0)

    def decoded(key_pads, words=total):
        return pads.from_ring(words - _ring_sum(key_pads, bits), bits)

    np.testing.assert_array_equal(decoded(r), want)
    wrong_key = pads.subkey(bytes(range(1, 33)), pads.INFO_PADS)
    for garbage in (
        decoded(pads.shared_pads(wrong_key, 2, m, n, bits)),  # wrong key
        decoded(pads.shared_pads(PAD_KEY, 3, m, n, bits)),  # wrong iteration
        decoded(r, _ring_sum(pads.to_ring(encoded[:2], bits) + r[:2], bits)),  # a dropout
    ):
        assert np.mean(garbage == want) < 0.01
        # far outside the range of a sum of 3 values in [-1, 1] on the 2^16 grid
        assert np.mean(np.abs(garbage) > 4 * SCALE) > 0.9


def test_fold_onto_a_point_and_silhouette_on_a_tiny_sample():
    """A zero-width interval folds everything onto it; a sample with as many labels as points
    has no silhouette (NaN, not an error)."""
    assert np.all(fold(np.array([-3.0, 0.5, 7.0]), 2.0, 2.0) == 2.0)
    x = np.random.default_rng(0).normal(size=(50, 2))
    labels = np.arange(50) % 2
    score, used = silhouette(x, labels, np.random.default_rng(1), 2)
    assert used == 2 and math.isnan(score)
