"""The noise algebra of LFL-SGDMF's two rounds (spec federated-mf.md §2.7–2.9).

Round 1: each online user adds a Gaussian share of variance ζ1·σ_v² to its gradient inside secure
aggregation, whose quorum is t = ⌈(1-ω)n⌉. Round 2: each Round-1 survivor still online sends
-ξ_i + ξ'_i, ξ'_i of variance ζ2·σ_v², and the server updates with S1 + β·N2. Every variance here
is in units of σ_v².

Colluding users: secure aggregation's parameters assume c = ⌈γn⌉ users colluding with the server;
they know their own shares and subtract them, so what DP must cover is the honest users' noise.
``corrupt`` = c counts it over those only (the corrected mode sizes ζ1 and ζ2 for them; the
faithful mode keeps the thesis's shares and its charge counts the honest ones).
"""

from __future__ import annotations

import math
from fractions import Fraction

from rayfed.privacy import distributed_variance


def threshold(n: int, omega: float) -> int:
    """t = ⌈(1-ω)n⌉ computed exactly (a float product like 0.3·1000 is not exact)."""
    return math.ceil((1 - Fraction(str(omega))) * n)


def noise_shares(
    mode: str, method: str, n: int, omega: float, u1: int, corrupt: int = 0
) -> tuple[float, float, float]:
    """(ζ1, ζ2, β) in units of σ_v² (spec §2.7, §2.9); the corrected mode's for the honest users
    only, (1-ω)n − c and |U1| − c of them (faithful: the thesis's, which ignores collusion)."""
    if method == "ldp":
        return 1.0, 0.0, 0.0  # every device adds the full σ_v²; no replacement round
    if mode == "faithful":
        return 1.0 / ((1.0 - omega) * n), 1.0 / u1, 1.0
    z1, z2 = 2.0 / ((1.0 - omega) * n - corrupt), 2.0 / (u1 - corrupt)
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


def colluding_variance(zeta1: float, zeta2: float, u1: int, u2: int, corrupt: int) -> float:
    """F_eff left when ``corrupt`` of the users subtract their own noise: the coalition takes the
    largest contributions first — Round-1 survivors who sent no replacement (ζ1 each), then
    replaced ones (ζ1ζ2/(ζ1+ζ2) each)."""
    unreplaced = min(corrupt, u1 - u2)
    return effective_variance(zeta1, zeta2, u1 - corrupt, u2 - (corrupt - unreplaced))


def worst_case_variance(mode: str, method: str, n: int, omega: float, corrupt: int = 0) -> float:
    """min F_eff over every outcome the protocol accepts (|U1| >= t, |U2| <= |U1|) with
    ``corrupt`` users' shares known, reached at |U1| = |U2| = t: the F the charged event (the
    distributed Gaussian's, over the t − c honest shares) is built from."""
    t = threshold(n, omega)
    z1, z2, _ = noise_shares(mode, method, n, omega, t, corrupt)
    return distributed_variance(share=z1, quorum=t - corrupt, replacement=z2)


def round1_noise(
    mode: str, method: str, n: int, omega: float, z: float, sensitivity: float, corrupt: int = 0
) -> dict[str, float]:
    """Round 1's distributed Gaussian (:class:`rayfed.privacy.measurement.DistributedGaussianShare`):
    ζ1 per user, quorum t − c (the honest shares), and the Round-2 replacement ζ2 at the worst
    accepted outcome |U1| = |U2| = t."""
    t = threshold(n, omega)
    zeta1, zeta2, _ = noise_shares(mode, method, n, omega, t, corrupt)
    return dict(z=z, sensitivity=sensitivity, zeta1=zeta1, quorum=t - corrupt, zeta2=zeta2)


def removal_variance(
    quorum: int, levels: tuple[int, ...], upto: int, u1: int, u2: int, corrupt: int = 0
) -> float:
    """The integer mechanism's (``dp_mechanism=skellam``) noise variance on the sum that the
    server and its ``corrupt`` colluding users cannot remove, in units of the target T, when
    Round 2 removed components 0 … ``upto``−1: every user of U1 added a share T/q (q =
    ``quorum``, the honest users of the smallest accepted U1) made of components that sum to
    T/g_j from level j on; the |U2| Round-2 senders keep T/g_upto, the |U1| − |U2| others T/q.
    The coalition knows its own and takes the largest first (the unremoved T/q, then T/g_upto).
    With ``upto`` the largest j with g_j <= |U1| − c (:func:`rayfed.privacy.distributed.level`
    on the honest count, what the driver removes) every honest user keeps at least T/g_upto:
    at least (|U1| − c)/g_upto >= 1. The removed components are independent of what is left, so
    this is also the variance of the server's best estimate (F_eff); without a Round 2 (``upto``
    = 0) it is (|U1| − c)/q."""
    unremoved = min(corrupt, u1 - u2)
    kept = (u1 - u2 - unremoved) / quorum
    if upto == 0:
        return kept + (u2 - (corrupt - unremoved)) / quorum
    return kept + (u2 - (corrupt - unremoved)) / levels[upto]
