"""hfl-kmeans: the assignments' ties. The displacement bounds of the size-constrained assignment
(rayfed.clustering.dplloyd) hold where the min-cost flow's optimum is unique up to exchanging
equal points; these tests put the flow where it was not (coinciding centroids, rounded costs) and
check that one added or removed point still moves the counts by at most E and the sums by at most
the declared bound.

References are computed here by hand or by brute force, never by the code under test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from ortools.graph.python import min_cost_flow

from rayfed.clustering import dplloyd
from rayfed.clustering.constrained import (
    cluster_sums,
    cost_centers,
    cost_scale,
    flow_assign,
    flow_costs,
    nearest_members,
    offset_direction,
)
from rayfed.errors import ConfigError
from rayfed.protocols.hfl_kmeans.config import HflKmeansConfig
from rayfed.protocols.hfl_kmeans.plan import plan


def _moves(x, centers, lo, hi, e, gen):
    """(counts ℓ1, sums ℓ1 / d) between x and each of its neighbours: the far corner added, a
    random point removed."""
    k, d = centers.shape
    s0, c0 = cluster_sums(x, flow_assign(x, centers, lo, hi, e), k)
    for x1 in (np.vstack([x, -np.ones((1, d))]), np.delete(x, int(gen.integers(len(x))), 0)):
        s1, c1 = cluster_sums(x1, flow_assign(x1, centers, lo, hi, e), k)
        yield int(np.abs(c1 - c0).sum()), float(np.abs(s1 - s0).sum() / d)


def test_coinciding_centroids_move_no_more_than_the_bound():
    """Two centroids at the same point (both truncated to the box's corner, say) cost every point
    the same: without a tie-breaker the flow's optimum is far from unique and a neighbour's
    assignment re-routes points freely (the counts moved by 177, the sums by 104·d·B, against
    E = 1 and 2k - 1 = 5). Over 60 instances at E = 1 and E = 2, every neighbour stays within
    counts_sensitivity and sums_sensitivity."""
    gen = np.random.default_rng(0)
    centers = np.array([[1.0, 1.0], [1.0, 1.0], [-0.3, -0.5]])
    k = len(centers)
    worst = {1: (0, 0.0), 2: (0, 0.0)}
    for _ in range(60):
        n = int(gen.integers(40, 200))
        x = np.clip(gen.normal(0.5, 0.4, (n, 2)), -1, 1)
        for e in (1, 2):
            for counts, sums in _moves(x, centers, n // 6, n, e, gen):
                worst[e] = (max(worst[e][0], counts), max(worst[e][1], sums))
    for e, (counts, sums) in worst.items():
        assert counts <= dplloyd.counts_sensitivity("constrained", k, e), (e, counts)
        assert sums <= dplloyd.sums_sensitivity("constrained", k, e) + 1e-9, (e, sums)


def test_centroids_closer_than_the_rounding_move_no_more_than_the_bound():
    """Two distinct centroids 2^-24 apart: every point's costs to them differ by less than 2^-22,
    which integer costs at 2^20 per unit rounded to a tie for most points. The flow's costs must
    tell them apart: the neighbours stay within the bounds."""
    gen = np.random.default_rng(1)
    centers = np.array([[0.5, 0.5], [0.5 + 2.0**-24, 0.5], [-0.3, -0.5]])
    worst = (0, 0.0)
    for _ in range(40):
        n = int(gen.integers(40, 200))
        x = np.clip(gen.normal(0.5, 0.4, (n, 2)), -1, 1)
        for counts, sums in _moves(x, centers, n // 6, n, 1, gen):
            worst = (max(worst[0], counts), max(worst[1], sums))
    assert worst[0] <= 1 and worst[1] <= 5 + 1e-9, worst


def test_flow_costs_use_the_int64_range_the_solver_accepts():
    """The integer costs are squared distances to the shifted centroids x the largest power of
    two the solver takes: S1's per-client flow (k = 15, max 500 points) gets 2^45 (not 2^20);
    E·(nodes + 1)·(largest cost) stays below 2^61 (OR-Tools refuses max cost·(nodes + 1) >=
    2^63), and the solver solves the extreme instance — k·max_size points at the corner
    farthest from every centroid — at that scale, where twice the scale is refused."""
    centers = np.array([[1.0, 1.0]] * 14 + [[0.0, 0.0]])
    scale = cost_scale(centers, 500, 1, 1.0)
    assert scale == 2.0**45
    shifted = cost_centers(centers)
    reach = ((1 + np.abs(shifted)) ** 2).sum(axis=1).max()
    nodes = 15 * 500 + 2 * 15 + 2
    assert (nodes + 1) * reach * scale < 2.0**61 <= 2 * (nodes + 1) * reach * scale
    far = -np.ones((15 * 500, 2))
    rows, cols = flow_assign(far, centers, 0, 500)
    assert np.bincount(cols, minlength=15).tolist() == [500] * 15
    cost = flow_costs(far, centers, 500)
    assert cost.max() == np.rint(((-1 - shifted) ** 2).sum(axis=1).max() * scale)
    solver = min_cost_flow.SimpleMinCostFlow()  # the same graph at twice the costs: refused
    n, k = len(far), 15
    tails = np.concatenate([np.repeat(np.arange(n), k), n + np.arange(k)])
    heads = np.concatenate([np.tile(n + np.arange(k), n), np.full(k, n + k)])
    caps = np.concatenate([np.ones(n * k, np.int64), np.full(k, 500, np.int64)])
    costs = np.concatenate([2 * cost.ravel(), np.zeros(k, np.int64)])
    solver.add_arcs_with_capacity_and_unit_cost(tails, heads, caps, costs)
    supplies = np.concatenate([np.ones(n, np.int64), np.zeros(k, np.int64), [-n]])
    solver.set_nodes_supplies(np.arange(n + k + 1), supplies)
    assert solver.solve() == solver.BAD_COST_RANGE


def test_a_points_cost_depends_on_its_value_and_the_centroids_only():
    """The same point costs the same whatever the other rows are (its neighbours share the cost
    function): each entry equals the one computed for that point alone, at the scale of the
    public inputs (k, max_size, E, the centroids)."""
    gen = np.random.default_rng(3)
    x, centers = gen.uniform(-1, 1, (300, 3)), gen.uniform(-1, 1, (5, 3))
    cost = flow_costs(x, centers, 100, 2)
    scale = cost_scale(centers, 100, 2, 1.0)
    shifted = cost_centers(centers)
    for j in (0, 17, 299):
        alone = flow_costs(x[j : j + 1], centers, 100, 2)
        assert (alone[0] == cost[j]).all()
        want = [round(float(((x[j] - c) ** 2).sum()) * scale) for c in shifted]
        assert np.abs(cost[j] - want).max() <= 1


def test_the_offsets_are_public_distinct_and_small():
    """Centroid i is shifted by (i + 1)·2^-16·u, u a fixed unit vector ∝ (√2, √3, √5, …): the
    shifts are distinct (coinciding centroids separate), none is zero (a centroid on a data
    point's grid would cost that point 0), and the largest is k·2^-16."""
    u = np.sqrt([2.0, 3.0, 5.0, 7.0])
    np.testing.assert_allclose(offset_direction(4), u / np.linalg.norm(u), rtol=1e-15)
    centers = np.zeros((4, 4))
    shifts = cost_centers(centers)
    np.testing.assert_allclose(
        shifts, np.arange(1, 5)[:, None] * 2.0**-16 * u / np.linalg.norm(u), rtol=1e-15
    )
    assert len(np.unique(shifts, axis=0)) == 4


def test_truncation_runs_only_where_the_corrected_constrained_bound_is_not_claimed():
    """Truncation puts two centroids on one point with positive probability (8 of 24 client
    assignments at ε = 0.25 on the synthetic example), where data placed on the tie break the
    unique-optimum assumption even with the offsets (u is public): refused with the corrected
    constrained calibration (test_hfl_kmeans's BAD_INPUT); allowed without noise, with the
    unconstrained assignment, and with sensitivity=thesis, whose statement says its ε is then
    no guarantee."""
    base = dict(users=600, k=3)
    with pytest.raises(ConfigError) as err:
        plan(_config(**base, centroid_post="trunc"), seed=0)
    assert err.value.field == "centroid_post" and "fold or none" in str(err.value)
    with pytest.raises(ConfigError) as err:
        plan(_config(**base, sum_post="trunc", count_post="trunc"), seed=0)
    assert err.value.field == "sum_post"
    plan(_config(**base, sum_post="trunc"), seed=0)  # counts stay noisy: no coincidence
    for options in (dict(noise="none"), dict(assignment="unconstrained")):
        p = plan(_config(**base, centroid_post="trunc", **options), seed=0)
        assert "truncation" not in p.privacy.statement
    thesis = plan(_config(**base, centroid_post="trunc", sensitivity="thesis"), seed=0)
    assert "the ε is not a guarantee" in thesis.privacy.statement
    plain = plan(_config(**base), seed=0)
    assert "public offsets (i + 1)·2^-16·u" in plain.privacy.statement
    assert "neither excluded nor charged" in plain.privacy.statement


def _config(**options) -> HflKmeansConfig:
    cfg = HflKmeansConfig(**options)
    cfg.validate()
    return cfg


def test_non_exclusive_ties_in_distance_swap_no_more_than_one_point():
    """Non-exclusive: each cluster takes its `size` nearest points. Where points tie in distance
    (1-D data on a grid of quarters: ±0.25 from the centroid 0 tie), a choice by position lets an
    added or removed point change which tied point is taken on top of its own swap: one
    cluster's sum moved by 3·d·B here (3.5 in the review's 20,000 trials; sums_sensitivity's 2k
    counts 2·d·B per cluster, one swap). Ordered by (distance, value), it stays within 2."""
    gen = np.random.default_rng(0)
    worst = 0.0
    for _ in range(4000):
        n = int(gen.integers(4, 12))
        x = gen.integers(-4, 5, (n, 1)) / 4.0
        centers = np.array([[0.0]])
        size = int(gen.integers(1, n))
        s0, _ = cluster_sums(x, nearest_members(x, centers, size), 1)
        j = int(gen.integers(n))
        for x1 in (np.delete(x, j, 0), np.vstack([x, gen.integers(-4, 5, (1, 1)) / 4.0])):
            s1, _ = cluster_sums(x1, nearest_members(x1, centers, size), 1)
            worst = max(worst, float(np.abs(s1 - s0).sum()))
    assert worst <= dplloyd.sums_sensitivity("non-exclusive", 1, 1), worst


def test_non_exclusive_takes_the_smallest_values_among_equal_distances():
    """The strict order: distance, then the point's coordinates in turn. From {0.5, -0.5, 0.25,
    -0.25, 0} the 3 nearest to 0 are 0 and the tie ±0.25 broken by value: -0.25 before 0.25;
    of 4: 0, ±0.25 and -0.5; in 2-D the second coordinate breaks a tie in the first."""
    x = np.array([[0.5], [-0.5], [0.25], [-0.25], [0.0]])
    for size, want in ((2, [0.0, -0.25]), (3, [0.0, -0.25, 0.25]), (4, [0.0, -0.25, 0.25, -0.5])):
        rows, cols = nearest_members(x, np.array([[0.0]]), size)
        assert sorted(x[rows, 0].tolist()) == sorted(want) and (cols == 0).all()
    y = np.array([[0.0, 1.0], [0.0, -1.0], [1.0, 0.0], [-1.0, 0.0]])
    rows, _ = nearest_members(y, np.zeros((1, 2)), 2)
    assert sorted(map(tuple, y[rows].tolist())) == [(-1.0, 0.0), (0.0, -1.0)]


def _brute_optima(x, centers, lo, hi, e):
    """Every optimal E-exclusive assignment by enumeration (each point in 1..E clusters, sizes
    in lo..hi), as sets of (point, cluster); costs are the squared distances to the flow's
    shifted centroids, compared to 1e-12."""
    k = len(centers)
    shifted = cost_centers(centers)
    cost = ((x[:, None, :] - shifted[None]) ** 2).sum(axis=2)
    choices = [s for r in range(1, e + 1) for s in itertools.combinations(range(k), r)]
    best, optima = np.inf, []
    for pick in itertools.product(choices, repeat=len(x)):
        sizes = np.bincount([i for s in pick for i in s], minlength=k)
        if sizes.min() < lo or sizes.max() > hi:
            continue
        total = sum(cost[j, list(s)].sum() for j, s in enumerate(pick))
        pairs = {(j, i) for j, s in enumerate(pick) for i in s}
        if total < best - 1e-12:
            best, optima = total, [pairs]
        elif total <= best + 1e-12:
            optima.append(pairs)
    return optima


def test_at_e_2_one_added_point_moves_the_counts_by_2():
    """E = 2, clusters at -0.82, -0.80 and 0.10 of 1..5 members, D = {0.25, 0.69, 0.42, 0.24}:
    the two lowest points are forced into the far clusters 0 and 1 (counts 1, 1, 2). The added
    point -1 joins both far clusters (its two memberships), which frees 0.24 and 0.25 to join
    cluster 2: counts 1, 1, 4. Both optima are unique (brute force), and the counts move by
    2 = E — the counts' sensitivity must be E, not 1 (the sums move by 2.98·d·B, within 2kE)."""
    x = np.array([[0.25], [0.69], [0.42], [0.24]])
    centers = np.array([[-0.82], [-0.80], [0.10]])
    counts, sums = [], []
    for data in (x, np.vstack([x, [[-1.0]]])):
        rows, cols = flow_assign(data, centers, 1, 5, 2)
        (optimum,) = _brute_optima(data, centers, 1, 5, 2)  # unique
        assert set(zip(rows.tolist(), cols.tolist(), strict=True)) == optimum
        s, c = cluster_sums(data, (rows, cols), 3)
        counts.append(c)
        sums.append(s)
    assert counts[0].tolist() == [1, 1, 2] and counts[1].tolist() == [1, 1, 4]
    moved = int(np.abs(counts[1] - counts[0]).sum())
    assert moved == 2 == dplloyd.counts_sensitivity("constrained", 3, 2)
    assert np.abs(sums[1] - sums[0]).sum() == pytest.approx(2.98)
    assert 2.98 <= dplloyd.sums_sensitivity("constrained", 3, 2)
