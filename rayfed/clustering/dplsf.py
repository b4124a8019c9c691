"""DPLSF — the LSH-forest private k-means of Google's differential-privacy library, in the VFL
adaptation of Li, Wang & Li (VLDB'23, App. B.1; spec shared/specs/vfl-kmeans.md §2.3).

Points in [-1, 1]^d are routed down a SimHash tree of depth L = 20. Every tree level publishes
discrete-Laplace counts of its nodes (a point is in one node per level: L+1 levels share 20 % of
the budget); a node branches while its noisy count is >= 3θ and a child survives while its noisy
count is >= θ. Each leaf publishes a noisy sum with per-dimension Laplace noise of scale Δ₁/ε_sum
(leaves are disjoint, so the sums compose in parallel: 80 % of the budget). Weighted k-means++ on
the noisy leaf means gives the k centers. The whole is pure ε-DP.

The two kinds of release are :class:`~rayfed.privacy.measurement.Measurement` objects built once
(in the protocol's plan: :func:`dplsf_releases`): the level counts a histogram of one point per
level (domain: one of the 2^L nodes), the leaf sums a sum of points of [-1, 1]^d. Their
sensitivities follow from the neighbour relation: Δ₁ = 1 and d for one point added or removed,
2 and 2d for one replaced (the point leaves one node, or leaf, and joins another) — which is the
old "run at ε/2 and charge it twice" of replace-one neighbours, as one event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event

from rayfed.clustering import weighted_kmeans
from rayfed.privacy import (
    DiscreteLaplace,
    Interval,
    Laplace,
    Measurement,
    Neighbours,
    NoiseSource,
    OneHot,
)

DEPTH = 20
COUNT_SHARE = 0.2
#: the ledger label of one DPLSF run (its count levels and leaf sums composed)
LABEL = "DPLSF local clustering"


def budgets(epsilon: float, depth: int = DEPTH, count_share: float = COUNT_SHARE):
    """(ε per tree level for the counts, ε for the leaf sums)."""
    return count_share * epsilon / (depth + 1), (1.0 - count_share) * epsilon


@dataclass(frozen=True)
class DplsfReleases:
    """The releases of one DPLSF run: every level's node counts (``depth`` + 1 levels, the root
    included) and the leaf sums. ``event`` is the run's: all levels are charged, even when the
    tree stops early — where it stops depends on the noisy counts, so the levels below are drawn
    as empty histograms (no live node) and the count of draws is that of the charge."""

    counts: Measurement
    sums: Measurement
    depth: int = DEPTH

    @property
    def event(self) -> dp_event.DpEvent:
        levels = dp_event.SelfComposedDpEvent(self.counts.event, self.depth + 1)
        return dp_event.ComposedDpEvent([levels, self.sums.event])

    def charge(self, scope: str, label: str = LABEL) -> tuple[str, str, dp_event.DpEvent]:
        """The ledger charge ``(scope, label, event)`` of one run."""
        return scope, label, self.event


def dplsf_releases(
    epsilon: float,
    d: int,
    relation: Neighbours,
    *,
    label: str = "",
    depth: int = DEPTH,
    count_share: float = COUNT_SHARE,
) -> DplsfReleases:
    """The measurements of one ε-DP DPLSF run on points of [-1, 1]^d under ``relation``
    (``label`` prefixes theirs: e.g. the party)."""
    eps_level, eps_sum = budgets(epsilon, depth, count_share)
    prefix = f"{label}: " if label else ""
    counts = Measurement(
        f"{prefix}DPLSF level counts",
        DiscreteLaplace(eps_level),
        OneHot(2**depth),  # a point lies in one node of each level
        relation,
    )
    sums = Measurement(
        f"{prefix}DPLSF leaf sums", Laplace(eps_sum), Interval(-1.0, 1.0, d), relation
    )
    return DplsfReleases(counts, sums, depth)


def dplsf_event(
    epsilon: float,
    d: int,
    *,
    replace_one: bool = False,
    depth: int = DEPTH,
    count_share: float = COUNT_SHARE,
):
    """The DP event of one ε-DP DPLSF run on [-1, 1]^d as :func:`dplsf` with an ε gives it: for
    one point added or removed; with ``replace_one``, the run at ε/2 composed twice (a replacement
    is a removal and an addition). A plan's :func:`dplsf_releases` under replace-one neighbours
    derives the same noise directly (Δ₁ = 2 and 2d at ε), as one run's event."""
    if replace_one:
        half = dplsf_releases(epsilon / 2, d, _ADD_REMOVE, depth=depth, count_share=count_share)
        return dp_event.SelfComposedDpEvent(half.event, 2)
    return dplsf_releases(epsilon, d, _ADD_REMOVE, depth=depth, count_share=count_share).event


_ADD_REMOVE = Neighbours("add_or_remove_one", "point")


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
    releases: DplsfReleases | float,
    *,
    round: int = 0,
    replace_one: bool = False,
    depth: int = DEPTH,
    count_share: float = COUNT_SHARE,
    leaf_threshold: str = "coordinate",
) -> tuple[np.ndarray, dp_event.DpEvent, dict]:
    """(k centers, the DP event, facts about the tree) for points ``x`` in [-1, 1]^d, every
    count level and the leaf sums drawn (and registered) through ``releases`` — built by
    :func:`dplsf_releases` in a plan. An ε instead builds them here for one point added or
    removed, and with ``replace_one`` runs at ε/2 and returns that run's event composed twice
    (:func:`dplsf_event`), which the step's draws do not make up: a replace-one run draws
    through releases planned under replace-one neighbours, or runs as a Subroutine
    (:func:`dplsf_centers`).

    Every random choice — the SimHash planes, the noise, the k-means++ seeds — comes from
    ``noise`` (the step's source), keyed by ``round``. The event charges all L+1 count levels even
    when the tree stops early (:class:`DplsfReleases`).
    """
    if isinstance(releases, DplsfReleases):
        return _run(
            noise, x, k, releases, round=round, leaf_threshold=leaf_threshold, register=True
        )
    epsilon = float(releases) / (2 if replace_one else 1)
    planned = dplsf_releases(epsilon, x.shape[1], _ADD_REMOVE, depth=depth, count_share=count_share)
    centers, event, info = _run(
        noise, x, k, planned, round=round, leaf_threshold=leaf_threshold, register=True
    )
    return centers, dp_event.SelfComposedDpEvent(event, 2) if replace_one else event, info


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
    """The k centers of :func:`dplsf` with an ε, the same draws, but registering nothing: the
    algorithm a :class:`~rayfed.privacy.measurement.Subroutine` measurement runs, which registers
    the whole :func:`dplsf_event` once."""
    planned = dplsf_releases(epsilon / (2 if replace_one else 1), x.shape[1], _ADD_REMOVE)
    return _run(noise, x, k, planned, round=round, leaf_threshold=leaf_threshold, register=False)[0]


def _run(
    noise: NoiseSource,
    x: np.ndarray,
    k: int,
    releases: DplsfReleases,
    *,
    round: int,
    leaf_threshold: str,
    register: bool,
) -> tuple[np.ndarray, dp_event.DpEvent, dict]:
    """One DPLSF run; with ``register=False`` each release's mechanism draws alone (nothing
    registered with the step: a Subroutine registers the whole event)."""

    def draw(release: Measurement, values):
        if register:
            return release(noise, values, round=round)[0]
        return release.mechanism.draw(
            noise, values, release.sensitivity, round=round, ident=None, ids=None
        )

    n, d = x.shape
    counts, sums = releases.counts, releases.sums
    gen = noise.generator("clustering", round, "dplsf")
    bits = (x @ gen.standard_normal((d, releases.depth)) < 0).astype(np.int64)
    root = draw(counts, np.array([n]))
    # θ from the sum noise's scale Δ₁/ε_sum, as ε_sum·d/Δ₁ (exact: d/Δ₁ is 1 or 1/2)
    theta = threshold(
        d, sums.mechanism.epsilon * (d / sums.sensitivity), int(root[0]), k, leaf_threshold
    )
    tree = _Tree(n)
    levels = _grow(lambda values: draw(counts, values), tree, bits, root, theta)
    for _ in range(releases.depth + 1 - levels):  # the levels below the tree: no live node
        draw(counts, np.zeros(0, dtype=np.int64))
    weights = np.concatenate(tree.leaf_counts) if tree.leaf_counts else np.zeros(0)
    noisy_sums = draw(sums, _leaf_sums(tree, x, weights.size))
    means = np.clip(noisy_sums / np.maximum(weights, 1.0)[:, None], -1.0, 1.0)
    weights = np.maximum(weights, 1.0)
    centers = weighted_kmeans(means, weights, k, gen)
    info = {"theta": theta, "leaves": int(weights.size), "levels_used": levels}
    return centers, releases.event, info


def _grow(count, tree: _Tree, bits, root, theta: float) -> int:
    """Split the tree level by level: a node whose noisy count reaches 3θ branches, and a child
    whose noisy count falls below θ is dropped with its points (``count``: a level's noisy
    counts). Returns the count levels drawn."""
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
        noisy = count(true)
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
