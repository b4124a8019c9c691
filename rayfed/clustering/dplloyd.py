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


def centroid_sensitivity(clients: int, client_min: int, assignment: str) -> float:
    """How far one added or removed point moves one coordinate of one cluster's uploaded local
    centroid S_l/(M·C_l): the mean of c >= client_min points moves by at most 2B/(c + 1) (a
    non-exclusive cluster keeps its size, so a swap moves it by 2B/c); an empty local cluster
    uploads the previous centroid, so from empty to one point it moves by 2B. Divided by M."""
    if assignment == "constrained":
        per_client = 2.0 * BOUND / (client_min + 1)
    elif assignment == "non-exclusive" and client_min > 0:
        per_client = 2.0 * BOUND / client_min
    else:
        per_client = 2.0 * BOUND
    return per_client / clients
