"""Integer shares through the distributed-DP pipeline (:mod:`rayfed.secagg.ddp`), as the
protocols that add them use it: the share's calibration at the pipeline's own rounded
sensitivity, and the "add then remove" split of a Skellam share into components (Dordis).

Shared by ``secure-sum``'s private mean (:mod:`rayfed.protocols.secure_sum.dp`) and LFL
``federated-mf``'s Round 1 and Round 2 (:mod:`rayfed.protocols.federated_mf.lfl.plan`).
"""

from __future__ import annotations

from rayfed.errors import ConfigError
from rayfed.privacy.calibration import ddg_sigma2, skellam_variance
from rayfed.privacy.measurement import DiscreteGaussianShares, SkellamShares
from rayfed.secagg import ddp
from rayfed.secagg.ddp import DdpPlan

#: the integer share mechanisms and the pipeline's name of their noise
NOISE = {"ddg": "discrete_gaussian", "skellam": "skellam"}
#: add then remove: a share is split at about this many survivor counts between q and n
LEVELS = 8


def calibrated_shares(
    mechanism: str,
    epsilon: float,
    delta: float,
    *,
    quorum: int,
    users: int,
    dim: int,
    clip: float,
    bits: int,
    rotation_seed: int,
    steps: int = 1,
    accountant: str = "tightest",
) -> tuple[DdpPlan, DiscreteGaussianShares | SkellamShares]:
    """The pipeline (γ, Δ₂, Δ₁, bits) and each user's integer share (``mechanism`` = ddg or
    skellam) to a fixed point (:func:`rayfed.secagg.ddp.plan_calibrated`): the share is what
    ``steps`` releases at (ε, δ) need at the plan's own Δ₂/Δ₁ with only ``quorum`` shares in the
    sum (zero-out neighbours); the modular-clipping bound is taken over all ``users`` users' rows
    and shares (the largest sum)."""
    if mechanism == "ddg":

        def need(p: DdpPlan) -> float:
            return ddg_sigma2(
                epsilon,
                delta,
                l2_sensitivity=p.l2_bound,
                quorum=quorum,
                dim=p.padded_dim,
                l1_sensitivity=p.l1_bound,
                steps=steps,
                accountant=accountant,
            )

    else:

        def need(p: DdpPlan) -> float:
            mu = skellam_variance(
                epsilon,
                delta,
                l2_sensitivity=p.l2_bound,
                l1_sensitivity=p.l1_bound,
                dim=p.padded_dim,
                steps=steps,
                accountant=accountant,
            )
            return mu / quorum

    try:
        p = ddp.plan_calibrated(
            need,
            dim=dim,
            users=users,
            clip=float(clip),
            bits=int(bits),
            noise=NOISE[mechanism],
            rotation_seed=int(rotation_seed),
        )
    except RuntimeError as e:
        # no fixed point: just above the bits that cannot hold the rounding errors alone, the
        # noise (ε, δ) needs at the rounded Δ₂ (≥ √(padded_dim)/2 however small γ) does not fit
        # either, and γ and the noise chase each other down (found by benchmarks/distributed_dp.py)
        raise ConfigError(
            "bits",
            f"{bits} bits cannot hold the sum of {users} users' rounded rows plus the noise "
            f"(ε, δ) = ({epsilon:g}, {delta:.3g}) needs with modular-clipping probability <= 1e-6 "
            "at any scale",
            "more bits, a larger epsilon, or fewer users per sum",
        ) from e
    share = need(p)  # what the calibration certifies; p.noise_variance >= it (the clip bound's)
    if mechanism == "ddg":
        return p, DiscreteGaussianShares(share, quorum, p.padded_dim, p.l1_bound)
    return p, SkellamShares(share, quorum, p.padded_dim, p.l1_bound)


def survivor_levels(quorum: int, n: int, count: int = LEVELS) -> tuple[int, ...]:
    """g_0 = q < g_1 < … < g_L = n, geometric: with s survivors the sum keeps at most
    g_{j+1}/g_j <= (n/q)^(1/L) (rounded) times the target variance."""
    ratio = n / quorum
    return tuple(sorted({quorum, n} | {round(quorum * ratio ** (j / count)) for j in range(count)}))


def excess_components(target: float, levels: tuple[int, ...]) -> tuple[float, ...]:
    """Component variances c_j = T/g_j − T/g_{j+1} (c_L = T/n): the components j, j+1, … of a
    share sum to T/g_j, so g_j survivors keeping them hold T."""
    tails = [target / g for g in levels]
    return tuple(a - b for a, b in zip(tails[:-1], tails[1:], strict=True)) + (tails[-1],)


def level(levels: tuple[int, ...], survivors: int) -> int:
    """j*: the largest j with g_j <= ``survivors`` — they remove components 0 … j*-1 and keep
    T/g_j* each, survivors·T/g_j* >= T in all."""
    return max(j for j, g in enumerate(levels) if g <= survivors)
