"""Lloyd's k-means building blocks of the horizontal multiparty protocols (shared/specs/hfl-kmeans.md
§3): size-constrained assignment as a min-cost flow (OR-Tools), data-independent and data-driven
initialisations, and the truncation / folding post-processing. Pure functions; no Ray.

Assignments are returned as ``(rows, cols)``: point ``rows[m]`` belongs to cluster ``cols[m]``. An
exclusive assignment has ``rows == arange(n)``; the non-exclusive and E-exclusive ones may put a
point in several clusters (or, non-exclusive, in none).
"""

from __future__ import annotations

import math

import numpy as np
from ortools.graph.python import min_cost_flow

from rayfed.clustering import nearest
from rayfed.errors import ConfigError

ASSIGNMENTS = ("constrained", "unconstrained", "non-exclusive")
POSTS = ("none", "trunc", "fold")
#: the flow's costs see centroid i shifted by (i + 1)·OFFSET·u (u: :func:`offset_direction`)
OFFSET = 2.0**-16
#: E·(nodes + 1)·(largest arc cost) stays below this: OR-Tools refuses a cost range whose
#: max cost·(nodes + 1) reaches 2^63 (BAD_COST_RANGE), and the total cost must fit in int64
COST_BUDGET = 2.0**61


# --- assignment ---------------------------------------------------------------------------------
def assign(
    x: np.ndarray,
    centers: np.ndarray,
    method: str,
    *,
    min_size: int = 0,
    max_size: int | None = None,
    contribution: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Memberships of the rows of ``x`` under ``method`` (one of :data:`ASSIGNMENTS`)."""
    n = len(x)
    if method == "unconstrained":
        return np.arange(n), nearest(x, centers)
    if method == "non-exclusive":
        return nearest_members(x, centers, min_size)
    if method == "constrained":
        return flow_assign(x, centers, min_size, n if max_size is None else max_size, contribution)
    raise ConfigError("assignment", f"unknown method {method!r}", ", ".join(ASSIGNMENTS))


def nearest_members(x: np.ndarray, centers: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Constrained non-exclusive (§3.1(2)): each cluster independently takes its ``size`` nearest
    points; a point may join several clusters or none. Ties in distance are broken by a strict
    order of the values (then the coordinates in turn), never by position: an added or removed
    point then changes a cluster's members by at most one swap (equal points are
    interchangeable)."""
    n, k = len(x), len(centers)
    size = min(size, n)
    if size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if size == n:
        return np.tile(np.arange(n), k), np.repeat(np.arange(k), n)
    values = tuple(x.T[::-1])  # np.lexsort sorts by its last key first
    rows = [np.lexsort((*values, d2))[:size] for d2 in _distances(x, centers)]
    return np.sort(np.stack(rows), axis=1).ravel(), np.repeat(np.arange(k), size)


def _distances(x: np.ndarray, centers: np.ndarray):
    """Each centroid's (n,) squared distances, every entry from its own point alone."""
    for c in centers:
        yield ((x - c) ** 2).sum(axis=1)


def flow_assign(
    x: np.ndarray,
    centers: np.ndarray,
    min_size: int,
    max_size: int,
    contribution: int = 1,
    bound: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Constrained E-exclusive assignment (§3.1(3)-(4)) as a min-cost flow.

    Minimises Σ squared distances subject to ``min_size <= |O_i| <= max_size`` and every point in
    at least one and at most E = ``contribution`` clusters (E = 1: exactly one, Bennett et al.).
    Graph: point (supply E) -> clone_i (cap 1, cost :func:`flow_costs`) -> cluster_i (cap
    max_size, demand min_size) -> sink; point -> escape (cap E - 1) -> sink, so every point sends
    at least one unit to a real cluster. The points lie in [-bound, bound]^d.
    """
    n, k, e = len(x), len(centers), int(contribution)
    if k * min_size > e * n or n > k * max_size:
        raise ConfigError(
            "min_size",
            f"no assignment of {n} points to {k} clusters of {min_size}..{max_size} points "
            f"each with each point in 1..{e} clusters",
            "lower min_size, raise max_size, or raise contribution",
        )
    cost = flow_costs(x, centers, max_size, e, bound)
    clone, cluster = n + np.arange(k), n + k + np.arange(k)
    escape, sink = n + 2 * k, n + 2 * k + 1
    points = np.arange(n)
    tails = [np.repeat(points, k), clone, cluster]
    heads = [np.tile(clone, n), cluster, np.full(k, sink)]
    caps = [np.ones(n * k, np.int64), np.full(k, max_size, np.int64), np.full(k, e * n, np.int64)]
    costs = [cost.ravel(), np.zeros(k, np.int64), np.zeros(k, np.int64)]
    if e > 1:
        tails += [points, [escape]]
        heads += [np.full(n, escape), [sink]]
        caps += [np.full(n, e - 1, np.int64), [e * n]]
        costs += [np.zeros(n, np.int64), [0]]
    solver = min_cost_flow.SimpleMinCostFlow()
    arcs = solver.add_arcs_with_capacity_and_unit_cost(
        np.concatenate(tails).astype(np.int64),
        np.concatenate(heads).astype(np.int64),
        np.concatenate(caps).astype(np.int64),
        np.concatenate(costs).astype(np.int64),
    )
    supplies = np.zeros(n + 2 * k + 2, np.int64)
    supplies[points] = e
    supplies[cluster] = -min_size
    supplies[sink] = -(e * n - k * min_size)
    solver.set_nodes_supplies(np.arange(len(supplies)), supplies)
    status = solver.solve()
    if status != solver.OPTIMAL:
        raise RuntimeError(f"min-cost flow assignment failed with status {status}")
    flow = solver.flows(arcs[: n * k]).reshape(n, k)
    rows, cols = np.nonzero(flow)
    return rows, cols


def offset_direction(d: int) -> np.ndarray:
    """u ∝ (√2, √3, √5, …): the square roots of the first d primes, unit length. They are linearly
    independent over the rationals, so no difference of two distinct points (a rational vector)
    is orthogonal to the exact u; in floats, only up to the rounding."""
    primes: list[int] = []
    candidate = 2
    while len(primes) < d:
        if all(candidate % p for p in primes):
            primes.append(candidate)
        candidate += 1
    u = np.sqrt(np.asarray(primes, dtype=np.float64))
    return u / np.linalg.norm(u)


def cost_centers(centers: np.ndarray) -> np.ndarray:
    """The centroids as the flow's costs see them: centroid i (from 0) shifted by
    (i + 1)·2^-16·u. Public and data-independent (the centroids are public), so nothing leaks.
    Coinciding centroids (two truncated to one corner, say) no longer tie every point, and no
    centroid sits on a point of a coarse grid (a data point on it would cost 0, tying its
    optional second membership with the escape node when E > 1)."""
    k, d = centers.shape
    return centers + np.arange(1, k + 1)[:, None] * OFFSET * offset_direction(d)[None, :]


def cost_scale(centers: np.ndarray, max_size: int, contribution: int, bound: float) -> float:
    """Integer costs per unit of squared distance: the largest power of two at which every cost a
    point of [-bound, bound]^d can have keeps E·(nodes + 1)·cost below :data:`COST_BUDGET`, nodes
    counted at the largest feasible n (k·max_size). A function of public inputs only, so a
    dataset and its neighbours share it."""
    k = len(centers)
    reach = float(((bound + np.abs(cost_centers(centers))) ** 2).sum(axis=1).max())
    units = contribution * (k * max_size + 2 * k + 3)
    return 2.0 ** math.floor(math.log2(COST_BUDGET / (units * max(reach, 1e-300))))


def flow_costs(
    x: np.ndarray, centers: np.ndarray, max_size: int, contribution: int = 1, bound: float = 1.0
) -> np.ndarray:
    """(n, k) int64 arc costs: squared distances to :func:`cost_centers` x :func:`cost_scale`,
    rounded. Each entry is computed from its own point and centroid alone (no matrix product,
    whose rounding may depend on the other rows), so a point costs the same in every dataset."""
    if len(x) and np.abs(x).max() > bound:
        raise ValueError(f"flow costs need the points in [-{bound}, {bound}]^d")
    shifted = cost_centers(centers)
    scale = cost_scale(centers, max_size, contribution, bound)
    cost = np.empty((len(x), len(shifted)), dtype=np.int64)
    for i, c in enumerate(shifted):
        cost[:, i] = np.rint(((x - c) ** 2).sum(axis=1) * scale)
    return cost


def cluster_sums(
    x: np.ndarray, members: tuple[np.ndarray, np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(k, d) sums and (k,) counts of the clusters; exact integers when ``x`` is integer."""
    rows, cols = members
    counts = np.bincount(cols, minlength=k)
    # float64 bincount is exact for integer inputs while every partial |sum| < 2^53
    sums = np.stack(
        [np.bincount(cols, weights=x[rows, h], minlength=k) for h in range(x.shape[1])], 1
    ).reshape(k, x.shape[1])
    if np.issubdtype(x.dtype, np.integer):
        sums = sums.astype(np.int64)
    return sums, counts


# --- initialisation -----------------------------------------------------------------------------
def sphere_packing(
    k: int, d: int, gen: np.random.Generator, lower: float = -1.0, upper: float = 1.0
) -> np.ndarray:
    """Su et al.'s repulsive initialisation as diffprivlib implements it (§3.2): centers uniform in
    the box shrunk by a, each >= 2a from the earlier ones; after 100 consecutive rejections halve
    a and start again."""
    a = (upper - lower) / 2.0
    for _ in range(64):
        centers: list[np.ndarray] = []
        retry = 0
        while retry < 100 and len(centers) < k:
            cand = gen.random(d) * ((upper - lower) - 2.0 * a) + lower + a
            if not centers or np.min(np.linalg.norm(np.asarray(centers) - cand, axis=1)) >= 2 * a:
                centers.append(cand)
                retry = 0
            else:
                retry += 1
        if len(centers) == k:
            return np.asarray(centers)
        a /= 2.0
    raise RuntimeError(f"sphere packing found no radius for {k} centers in {d} dimensions")


def domain_random(k: int, d: int, gen: np.random.Generator, bound: float = 1.0) -> np.ndarray:
    """k centers uniform in [-B, B]^d (the thesis's "random"; its code used [0, 1)^d, A12)."""
    return gen.uniform(-bound, bound, (k, d))


def data_random(x: np.ndarray, k: int, gen: np.random.Generator) -> np.ndarray:
    """k distinct random data points (not private)."""
    return x[gen.choice(len(x), size=k, replace=len(x) < k)].copy()


def kmeans_plus_plus(x: np.ndarray, k: int, gen: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii): D² sampling (not private)."""
    centers = [x[gen.integers(len(x))]]
    d2 = ((x - centers[0]) ** 2).sum(1)
    for _ in range(1, k):
        total = d2.sum()
        j = gen.choice(len(x), p=d2 / total) if total > 0 else gen.integers(len(x))
        centers.append(x[j])
        d2 = np.minimum(d2, ((x - x[j]) ** 2).sum(1))
    return np.asarray(centers)


# --- post-processing ----------------------------------------------------------------------------
def fold(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect into [lo, hi] across the nearest bound, repeatedly (§3.4, A19): a triangle wave."""
    width = hi - lo
    if width <= 0:
        return np.full(np.shape(x), float(lo))
    y = np.mod(np.asarray(x, dtype=np.float64) - lo, 2.0 * width)
    return lo + np.where(y > width, 2.0 * width - y, y)


def post_process(x: np.ndarray, method: str, lo: float, hi: float) -> np.ndarray:
    """``none``, ``trunc`` (clip) or ``fold`` into [lo, hi]."""
    if method == "none":
        return np.asarray(x, dtype=np.float64)
    if method == "trunc":
        return np.clip(x, lo, hi)
    if method == "fold":
        return fold(x, lo, hi)
    raise ConfigError("post", f"unknown post-processing {method!r}", ", ".join(POSTS))


# --- metrics ------------------------------------------------------------------------------------
def wcss(x: np.ndarray, centers: np.ndarray) -> tuple[float, np.ndarray]:
    """Within-cluster sum of squares of the nearest-center partition (as the thesis reports it,
    not divided by n), and the labels."""
    labels = nearest(x, centers)
    diff = x - centers[labels]
    return float(np.einsum("ij,ij->", diff, diff)), labels


def empty_clusters(labels: np.ndarray, k: int) -> int:
    """k minus the number of distinct nearest-center labels."""
    return int(k - np.unique(labels).size)


def silhouette(
    x: np.ndarray, labels: np.ndarray, gen: np.random.Generator, max_points: int
) -> tuple[float, int]:
    """Mean silhouette (scikit-learn), exact up to ``max_points`` points, else on a uniform sample
    of that size; returns (score, points used). NaN unless 2 <= clusters < points."""
    from sklearn.metrics import silhouette_score

    used = min(len(x), max_points)
    if used < len(x):
        pick = gen.choice(len(x), size=used, replace=False)
        x, labels = x[pick], labels[pick]
    if not 2 <= np.unique(labels).size < used:  # the score needs 2 <= labels <= points - 1
        return math.nan, used
    return float(silhouette_score(x, labels)), used
