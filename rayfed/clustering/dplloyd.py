"""The public arithmetic of DPLloyd (Su et al.; Sum/Count, used by NMA) and CDPLloyd (Centroid, used
by AMN) as the multiparty thesis sets it (shared/specs/hfl-kmeans.md §3.5-§3.7): cluster-size
bounds, the iteration rule, the budget split and the sensitivities. Data live in [-B, B]^d, B = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RHO = 0.225  # Su et al.'s conjectured |S|/(2B·C)
MSE_TARGET = 0.004  # the iteration rule's per-iteration MSE bound (1/500)
MIN_ITERATIONS, MAX_ITERATIONS = 2, 7
NON_PRIVATE_ITERATIONS = 7
BOUND = 1.0  # B


@dataclass(frozen=True)
class SizeBounds:
    """Global c_min = ⌈N/(1.5k)⌉, c_max = ⌊3N/k⌋ (A2: floor) and each client's share of them."""

    c_min: int
    c_max: int
    client_min: int
    client_max: int


def size_bounds(
    n: int, k: int, clients: int, c_min: int | None = None, c_max: int | None = None
) -> SizeBounds:
    """The thesis's defaults unless given; per client ⌈c_min/M⌉ and ⌊c_max/M⌋ (§3.1)."""
    lo = math.ceil(n / (1.5 * k)) if c_min is None else int(c_min)
    hi = (3 * n) // k if c_max is None else int(c_max)
    return SizeBounds(lo, hi, math.ceil(lo / clients), hi // clients)


def split_constant(d: int, rho: float = RHO) -> float:
    """∛(4dρ²): the optimal ε^C/ε^Σ ratio (§3.5.4)."""
    return (4.0 * d * rho**2) ** (1.0 / 3.0)


def nma_epsilon_m(n: int, k: int, d: int, contribution: int = 1, rho: float = RHO) -> float:
    """ε^(m) = √(500·E²·k³·(d + ∛(4dρ²))³ / N²) (§3.5.5)."""
    c = split_constant(d, rho)
    return math.sqrt(contribution**2 * k**3 * (d + c) ** 3 / MSE_TARGET * 2.0) / n


def amn_epsilon_m(c_min: float, k: int, d: int, contribution: int = 1) -> float:
    """ε^(m) = √(500·k·d³·E² / c_min²) (§3.6.4); infinite without a minimum size."""
    if c_min <= 0:
        return math.inf
    return math.sqrt(2.0 * k * d**3 * contribution**2 / MSE_TARGET) / c_min


def iterations(epsilon: float, epsilon_m: float) -> int:
    """t_max = int(clip(ε/ε^(m), 2, 7)): clip, then truncate (§3.5.5)."""
    return int(min(max(epsilon / epsilon_m, MIN_ITERATIONS), MAX_ITERATIONS))


def nma_split(epsilon: float, t_max: int, d: int, rho: float = RHO) -> tuple[float, float]:
    """(ε^Σ per sum coordinate, ε^C per count) with t_max·(d·ε^Σ + ε^C) = ε and
    ε^Σ : ε^C = 1 : ∛(4dρ²)."""
    c = split_constant(d, rho)
    per_iteration = epsilon / t_max
    return per_iteration / (d + c), c * per_iteration / (d + c)


def amn_epsilon(epsilon: float, t_max: int, d: int) -> float:
    """ε^μ = ε/(t_max·d) per centroid coordinate (the thesis; its code's ε/t_max is not DP, A15)."""
    return epsilon / (t_max * d)


def centroid_sensitivity_thesis(c_min: int, contribution: int, constrained: bool) -> float:
    """The thesis's Δ^μ = B·E/c_min per coordinate (B·E without a minimum size, §3.6.1/§3.6.5)."""
    return BOUND * contribution / (c_min if constrained and c_min > 0 else 1)


# --- the true sensitivities (add or remove one point at one client) --------------------------------
# A size-constrained assignment is a min-cost flow (constrained.flow_assign); the flows of D and
# D' = D + x (x at one client; the other clients' flows do not change) differ by E unit paths from
# x to the sink (and by cycles of cost 0: other optima, see below). A unit path enters x into a
# cluster i1 and, while i1 has no room, moves one of its points y1 to a cluster i2, y2 from i2 to
# i3, …, until a cluster with room grows by one (or, E > 1, a point drops a membership through the
# escape node). The path is simple, so it visits each cluster at most once: it moves at most k − 1
# other points and touches at most k clusters, each by one replacement (one point in, one out:
# ℓ1 <= 2dB, count unchanged) or, the last one, one addition (<= dB, count + 1). Per unit path the
# sums move by at most (2k − 1)·d·B (E = 1; 2k·d·B when it ends at the escape node) and the counts
# by 1. A cycle moves points around clusters at zero cost: it exists only where D's (or D''s)
# optimum is not unique up to exchanging equal points, and the bound assumes it does not
# (constrained.flow_costs shifts the centroids by public offsets so that coinciding ones do not
# tie every point; an exact tie of its integer costs remains possible and is not excluded).
def sums_sensitivity(assignment: str, k: int, contribution: int) -> int:
    """The ℓ1 change of the k·d cluster sums one added or removed point can cause, in units of
    d·B: 1 (unconstrained: its own cluster), 2k (non-exclusive: each cluster keeps its size, so
    each may swap a point), 2k − 1 (constrained, E = 1: the augmenting path) or 2k·E
    (constrained, E > 1: E paths, each may end at the escape node)."""
    if assignment == "unconstrained":
        return 1
    if assignment == "non-exclusive":
        return 2 * k
    return 2 * k - 1 if contribution == 1 else 2 * k * contribution


def counts_sensitivity(assignment: str, k: int, contribution: int) -> int:
    """The ℓ1 change of the k counts: 1 (unconstrained), E (constrained: every path nets one
    membership, displaced points keep the counts), k (non-exclusive: the clusters keep their
    size, which moves only where a client has fewer rows than it)."""
    if assignment == "unconstrained":
        return 1
    if assignment == "non-exclusive":
        return k
    return contribution


def centroid_sensitivity_grid(
    assignment: str, k: int, d: int, contribution: int, clients: int, client_min: int, scale: int
) -> int:
    """The ℓ1 change, in grid units 1/``scale``, of the k·d uploaded local centroids S_l/(M·C_l)
    (each rounded to the grid) when one point is added to or removed from client l.

    A cluster whose members change by one replacement keeps its size C >= max(client_min, 1): its
    mean moves by at most 2B/C per coordinate; one that gains a point moves by at most 2B/(C + 1),
    C >= client_min (an empty local cluster uploads the previous centroid, in the box: 2B from
    empty to one point). Rounding adds at most one grid unit: ⌊move·scale⌋ + 1. Unconstrained:
    one cluster gains the point; non-exclusive: each of the k clusters (fixed size client_min)
    may swap one; constrained, E = 1: the augmenting path's k − 1 replacements and one addition;
    E > 1: E paths of up to k replacements."""

    def grid(move: float) -> int:
        return math.floor(move * scale) + 1

    replaced = grid(2.0 * BOUND / (clients * max(client_min, 1)))
    added = grid(2.0 * BOUND / (clients * (client_min + 1)))
    if assignment == "unconstrained":
        return d * grid(2.0 * BOUND / clients)
    if assignment == "non-exclusive":
        return k * d * replaced
    if contribution == 1:
        return d * ((k - 1) * replaced + added)
    return contribution * k * d * replaced
