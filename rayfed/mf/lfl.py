"""The noise algebra of LFL-SGDMF's two rounds (spec federated-mf.md §2.7–2.9).

Round 1: each online user adds a Gaussian share of variance ζ1·σ_v² to its gradient inside secure
aggregation, whose quorum is t = ⌈(1-ω)n⌉. Round 2: each Round-1 survivor still online sends
-ξ_i + ξ'_i, ξ'_i of variance ζ2·σ_v², and the server updates with S1 + β·N2. Every variance here
is in units of σ_v².
"""

from __future__ import annotations

import math
from fractions import Fraction

from rayfed.privacy import distributed_variance


def threshold(n: int, omega: float) -> int:
    """t = ⌈(1-ω)n⌉ computed exactly (a float product like 0.3·1000 is not exact)."""
    return math.ceil((1 - Fraction(str(omega))) * n)


def noise_shares(
    mode: str, method: str, n: int, omega: float, u1: int
) -> tuple[float, float, float]:
    """(ζ1, ζ2, β) in units of σ_v² (spec §2.7, §2.9)."""
    if method == "ldp":
        return 1.0, 0.0, 0.0  # every device adds the full σ_v²; no replacement round
    base = 1.0 / ((1.0 - omega) * n)
    if mode == "faithful":
        return base, 1.0 / u1, 1.0
    z1, z2 = 2.0 * base, 2.0 / u1
    return z1, z2, z1 / (z1 + z2)


def effective_variance(zeta1: float, zeta2: float, u1: int, u2: int) -> float:
    """F_eff: noise variance (units of σ_v²) of the server's best estimate from S1 and N2."""
    if zeta2 == 0:
        return u1 * zeta1
    return u2 * zeta1 * zeta2 / (zeta1 + zeta2) + (u1 - u2) * zeta1


def applied_variance(zeta1: float, zeta2: float, beta: float, u1: int, u2: int) -> float:
    """Noise variance (units of σ_v²) of the update's own S1 + β·N2: what V receives, as opposed
    to :func:`effective_variance`, what DP must cover."""
    return u2 * beta**2 * zeta2 + (u1 - u2) * zeta1 + u2 * (1 - beta) ** 2 * zeta1


def worst_case_variance(mode: str, method: str, n: int, omega: float) -> float:
    """min F_eff over every outcome the protocol accepts (|U1| >= t, |U2| <= |U1|), reached at
    |U1| = |U2| = t: the F the charged event (the distributed Gaussian's) is built from."""
    t = threshold(n, omega)
    z1, z2, _ = noise_shares(mode, method, n, omega, t)
    return distributed_variance(share=z1, quorum=t, replacement=z2)


def round1_noise(
    mode: str, method: str, n: int, omega: float, z: float, sensitivity: float
) -> dict[str, float]:
    """Round 1's distributed Gaussian (:class:`rayfed.privacy.measurement.DistributedGaussianShare`): ζ1 per user,
    quorum t, and the Round-2 replacement ζ2 at the worst accepted outcome |U1| = |U2| = t."""
    t = threshold(n, omega)
    zeta1, zeta2, _ = noise_shares(mode, method, n, omega, t)
    return dict(z=z, sensitivity=sensitivity, zeta1=zeta1, quorum=t, zeta2=zeta2)


def removal_variance(quorum: int, levels: tuple[int, ...], upto: int, u1: int, u2: int) -> float:
    """The integer mechanism's (``dp_mechanism=skellam``) noise variance on the sum, in units of
    the target T, when Round 2 removed components 0 … ``upto``−1: every user of U1 added a share
    T/t (t = ``quorum``) made of components that sum to T/g_j from level j on; the |U2| Round-2
    senders keep T/g_upto, the |U1| − |U2| others T/t. With ``upto`` the largest j with
    g_j <= |U1| (:func:`rayfed.privacy.distributed.level`, what the driver removes),
    (|U1| − |U2|)/t + |U2|/g_upto >= |U1|/g_upto >= 1. The removed components are independent
    of what is left, so this is also the variance of the server's best estimate (F_eff);
    without a Round 2 (``upto`` = 0) it is |U1|/t."""
    if upto == 0:
        return u1 / quorum
    return (u1 - u2) / quorum + u2 / levels[upto]
