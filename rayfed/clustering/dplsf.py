"""DPLSF — the LSH-forest private k-means of Google's differential-privacy library, in the VFL
adaptation of Li, Wang & Li (VLDB'23, App. B.1; spec shared/specs/vfl-kmeans.md §2.3).

Points in [-1, 1]^d are routed down a SimHash tree of depth L = 20. Every tree level publishes
discrete-Laplace counts of its nodes (a point is in one node per level: L+1 levels share 20 % of
the budget); a node branches while its noisy count is >= 3θ and a child survives while its noisy
count is >= θ. Each leaf publishes a noisy sum with per-dimension Laplace noise of scale d/ε_sum
(sensitivity 1 per coordinate; leaves are disjoint, so the sums compose in parallel: 80 % of the
budget). Weighted k-means++ on the noisy leaf means gives the k centers. The whole is pure ε-DP.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

from rayfed.clustering import weighted_kmeans
from rayfed.privacy import (
    NoiseSource,
    discrete_laplace,
    discrete_laplace_event,
    laplace,
    laplace_event,
)
from rayfed.privacy.mechanisms import draw_discrete_laplace, draw_laplace

DEPTH = 20
COUNT_SHARE = 0.2


def budgets(epsilon: float, depth: int = DEPTH, count_share: float = COUNT_SHARE):
    """(ε per tree level for the counts, ε for the leaf sums)."""
    return count_share * epsilon / (depth + 1), (1.0 - count_share) * epsilon


def dplsf_event(
    epsilon: float,
    d: int,
    *,
    replace_one: bool = False,
    depth: int = DEPTH,
    count_share: float = COUNT_SHARE,
):
    """The DP event of one DPLSF run at ε: L+1 levels of discrete-Laplace counts, then the leaf
    sums (add/remove one point). Under replace-one neighbours a replacement is a removal and an
    addition, so the run is calibrated at ε/2 and the event counts twice (group privacy of 2)."""
    if replace_one:
        inner = dplsf_event(epsilon / 2, d, depth=depth, count_share=count_share)
        return dp_event.SelfComposedDpEvent(inner, 2)
    eps_level, eps_sum = budgets(epsilon, depth, count_share)
    counts = discrete_laplace_event(1, eps_level)
    sums = laplace_event(d, eps_sum)
    return dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(counts, depth + 1), sums])


LEAF_THRESHOLDS = ("coordinate", "radius")


def threshold(d: int, eps_sum: float, root_count: int, k: int, rule: str = "coordinate") -> int:
    """θ = max(1, min(⌊10·√d·σ⌋, ⌊ĉ_root / 2k⌋)) with σ the sum noise's std √2·d/ε_sum in
    coordinate units (``rule="coordinate"``: the spec's reading, for data in [-1, 1]^d) or in
    units of the data's radius √d, as Google's library measures it (``rule="radius"``: σ/√d, so θ
    is √d times lower — more, noisier leaves)."""
    sigma_sum = math.sqrt(2.0) * d / eps_sum
    if rule == "radius":
        sigma_sum /= math.sqrt(d)
    return max(1, min(math.floor(10 * math.sqrt(d) * sigma_sum), math.floor(root_count / (2 * k))))


class _Tree:
    """The per-point state of the tree walk: each point's node code at the current level, whether
    it is still in a live node, and the leaf it ended in."""

    def __init__(self, n: int):
        self.code = np.zeros(n, dtype=np.int64)
        self.active = np.ones(n, dtype=bool)
        self.leaf_of = np.full(n, -1, dtype=np.int64)
        self.leaf_counts: list[np.ndarray] = []

    def settle(self, nodes: np.ndarray, counts: np.ndarray) -> None:
        """Make these current-level nodes leaves, with their noisy counts as weights."""
        if nodes.size == 0:
            return
        order = np.argsort(nodes)
        sorted_nodes = nodes[order]
        pts = np.flatnonzero(self.active)
        pos = np.minimum(np.searchsorted(sorted_nodes, self.code[pts]), nodes.size - 1)
        hit = sorted_nodes[pos] == self.code[pts]
        base = sum(c.size for c in self.leaf_counts)
        self.leaf_of[pts[hit]] = base + order[pos[hit]]
        self.active[pts[hit]] = False
        self.leaf_counts.append(np.asarray(counts, dtype=np.float64))


def dplsf(
    noise: NoiseSource,
    x: np.ndarray,
    k: int,
    epsilon: float,
    *,
    round: int = 0,
    replace_one: bool = False,
    depth: int = DEPTH,
    count_share: float = COUNT_SHARE,
    leaf_threshold: str = "coordinate",
) -> tuple[np.ndarray, dp_event.DpEvent, dict]:
    """(k centers, the DP event, facts about the tree) for points ``x`` in [-1, 1]^d; ε-DP under
    add/remove one point, or under replace-one with ``replace_one`` (then run at ε/2).

    Every random choice — the SimHash planes, the noise, the k-means++ seeds — comes from
    ``noise`` (the step's source), keyed by ``round``. The event charges all L+1 count levels even
    when the tree stops early: where it stops depends on the noisy counts, so the algorithm's
    privacy loss is that of the full depth (the count of draws is data-dependent, the charge not).
    """
    return _dplsf(
        noise,
        x,
        k,
        epsilon,
        round=round,
        replace_one=replace_one,
        depth=depth,
        count_share=count_share,
        leaf_threshold=leaf_threshold,
        register=True,
    )


def dplsf_centers(
    noise: NoiseSource,
    x: np.ndarray,
    *,
    k: int,
    epsilon: float,
    round: int = 0,
    replace_one: bool = False,
    leaf_threshold: str = "coordinate",
) -> np.ndarray:
    """The k centers of :func:`dplsf`, the same draws, but registering nothing: the algorithm a
    :class:`~rayfed.privacy.measurement.Subroutine` measurement runs, which registers the whole
    :func:`dplsf_event` once."""
    return _dplsf(
        noise,
        x,
        k,
        epsilon,
        round=round,
        replace_one=replace_one,
        depth=DEPTH,
        count_share=COUNT_SHARE,
        leaf_threshold=leaf_threshold,
        register=False,
    )[0]


def _dplsf(
    noise, x, k, epsilon, *, round, replace_one, depth, count_share, leaf_threshold, register
):
    """:func:`dplsf`; with ``register=False`` every draw goes through the mechanisms' draw_*
    functions (nothing registered with the step), else through the mechanisms (each registers)."""
    if replace_one:
        centers, event, info = _dplsf(
            noise,
            x,
            k,
            epsilon / 2,
            round=round,
            replace_one=False,
            depth=depth,
            count_share=count_share,
            leaf_threshold=leaf_threshold,
            register=register,
        )
        return centers, dp_event.SelfComposedDpEvent(event, 2), info
    n, d = x.shape
    eps_level, eps_sum = budgets(epsilon, depth, count_share)
    count = _count_noise(noise, eps_level, round, register)
    gen = noise.generator("clustering", round, "dplsf")
    bits = (x @ gen.standard_normal((d, depth)) < 0).astype(np.int64)
    root, count_event = count(np.array([n]))
    theta = threshold(d, eps_sum, int(root[0]), k, leaf_threshold)
    tree = _Tree(n)
    levels = _grow(count, tree, bits, root, theta)
    weights = np.concatenate(tree.leaf_counts) if tree.leaf_counts else np.zeros(0)
    sums = _leaf_sums(tree, x, weights.size)
    if register:
        noisy_sums, sum_event = laplace(noise, sums, l1_sensitivity=d, epsilon=eps_sum, round=round)
    else:
        sum_event = laplace_event(d, eps_sum)
        noisy_sums = draw_laplace(noise, sums, scale=float(d) / float(eps_sum), round=round)
    means = np.clip(noisy_sums / np.maximum(weights, 1.0)[:, None], -1.0, 1.0)
    weights = np.maximum(weights, 1.0)
    centers = weighted_kmeans(means, weights, k, gen)
    event = dp_event.ComposedDpEvent(
        [dp_event.SelfComposedDpEvent(count_event, depth + 1), sum_event]
    )
    info = {"theta": theta, "leaves": int(weights.size), "levels_used": levels}
    return centers, event, info


def _count_noise(noise: NoiseSource, eps_level: float, round: int, register: bool):
    """counts -> (noisy counts, event): one tree level's discrete-Laplace counts (ℓ₁ sensitivity
    1), through the mechanism (registered) or its draw alone."""
    event = discrete_laplace_event(1, eps_level)

    def count(values):
        if register:
            return discrete_laplace(noise, values, l1_sensitivity=1, epsilon=eps_level, round=round)
        return draw_discrete_laplace(noise, values, a=event.noise_parameter, round=round), event

    return count


def _grow(count, tree: _Tree, bits, root, theta: float) -> int:
    """Split the tree level by level: a node whose noisy count reaches 3θ branches, and a child
    whose noisy count falls below θ is dropped with its points (``count``: the level's noisy
    counts, :func:`_count_noise`). Returns the count levels drawn."""
    nodes, counts = np.zeros(1, dtype=np.int64), root.astype(np.float64)
    levels = 1
    for level in range(bits.shape[1]):
        branch = counts >= 3 * theta
        tree.settle(nodes[~branch], counts[~branch])
        if not branch.any():
            return levels
        parents = nodes[branch]
        children = np.stack([2 * parents, 2 * parents + 1], axis=1).reshape(-1)  # sorted pairs
        pts = np.flatnonzero(tree.active)
        child_of = 2 * tree.code[pts] + bits[pts, level]
        order = np.argsort(children)
        slot = order[np.searchsorted(children[order], child_of)]
        true = np.bincount(slot, minlength=children.size)
        noisy, _ = count(true)
        levels += 1
        kept = (noisy >= theta).reshape(-1, 2)
        barren = ~kept.any(axis=1)
        tree.settle(parents[barren], counts[branch][barren])
        still = tree.active[pts]
        keep_pt = kept.reshape(-1)[slot] & still
        tree.active[pts[still & ~keep_pt]] = False  # points of dropped children are discarded
        tree.code[pts[keep_pt]] = child_of[keep_pt]
        nodes, counts = children[kept.reshape(-1)], noisy[kept.reshape(-1)].astype(np.float64)
    tree.settle(nodes, counts)
    return levels


def _leaf_sums(tree: _Tree, x: np.ndarray, leaves: int) -> np.ndarray:
    """Per leaf, the coordinate-wise sum of the points it holds (leaves × d)."""
    member = tree.leaf_of >= 0
    return np.stack(
        [
            np.bincount(tree.leaf_of[member], weights=x[member, j], minlength=leaves)
            for j in range(x.shape[1])
        ],
        axis=1,
    )
