"""Noise calibration for a target (ε, δ) with dp-accounting's own search (no hand-derived formula),
and the per-report ε0 of shuffled LDP releases for a target central (ε, δ).

``gaussian_noise_multiplier`` finds the smallest noise multiplier z (σ = z·Δ₂) such that the
given composition of (optionally Poisson-subsampled) Gaussian steps is (ε, δ)-DP under the RDP
accountant. RDP is used for the search because it is fast at any z (PLD's discretisation of a
subsampled Gaussian with tiny z does not fit in memory) and its ε upper-bounds PLD's: a protocol
that declares PLD then reports an ε at most the target. The event built by
``gaussian_steps_event`` is exactly what the ledger is then charged with.
"""

from __future__ import annotations

import functools
import math

from dp_accounting import dp_event, mechanism_calibration

from rayfed.errors import ConfigError
from rayfed.privacy.ledger import RELATIONS, check_budget, make_accountant
from rayfed.privacy.shuffling import shuffle_epsilon0_limit, shuffled_guarantee


def gaussian_steps_event(
    noise_multiplier: float, steps: int, sampling_rate: float = 1.0
) -> dp_event.DpEvent:
    """``steps`` compositions of a Gaussian step, Poisson-subsampled at ``sampling_rate`` if < 1."""
    step: dp_event.DpEvent = dp_event.GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1.0:
        step = dp_event.PoissonSampledDpEvent(sampling_rate, step)
    return dp_event.SelfComposedDpEvent(step, steps)


@functools.lru_cache(maxsize=256)  # a pure function of its arguments; the search takes ~1 s
def gaussian_noise_multiplier(
    epsilon: float,
    delta: float,
    *,
    steps: int,
    sampling_rate: float = 1.0,
    accountant: str = "rdp",
    relation: str = "add_or_remove_one",
) -> float:
    """The smallest z for which ``gaussian_steps_event(z, steps, sampling_rate)`` is (ε, δ)-DP.

    Raises ConfigError for a budget that no finite noise meets (δ = 0 with a Gaussian).
    """
    check_budget(epsilon, delta)
    if delta <= 0:
        raise ConfigError(
            "delta", "the Gaussian mechanism needs delta > 0", "e.g. 1e-5 or 1/(number of records)"
        )
    if steps < 1 or not 0 < sampling_rate <= 1:
        raise ConfigError(
            "steps", f"need steps >= 1 and sampling_rate in (0, 1], got {steps}, {sampling_rate}"
        )
    if relation not in RELATIONS:
        raise ConfigError("relation", f"unknown neighbouring relation {relation!r}", RELATIONS)
    return float(
        mechanism_calibration.calibrate_dp_mechanism(
            lambda: make_accountant("rdp", relation),
            lambda z: gaussian_steps_event(z, steps, sampling_rate),
            epsilon,
            delta,
            mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0),
            tol=1e-4,
        )
    )


def shuffled_ldp_epsilon(epsilon: float, delta: float, *, users: int, steps: int) -> float:
    """The largest per-report ε0 for which ``steps`` shuffled releases of at least ``users``
    ε0-LDP reports, each at δ' = δ/steps, compose (basic composition) to at most (ε, δ): bisection
    on steps·min(ε0, ε_shuffle(ε0, users, δ')) = ε, which rises with ε0
    (:mod:`rayfed.privacy.shuffling`).

    Raises ConfigError when too few users for the theorem at δ', or when ε needs an ε0 beyond the
    range charged, log(users / (16 log(4/δ'))).
    """
    check_budget(epsilon, delta)
    if delta <= 0 or steps < 1:
        raise ConfigError(
            "delta", f"shuffling needs delta > 0 and steps >= 1, got {delta}, {steps}", "e.g. 1e-5"
        )
    step_delta = delta / steps
    limit = shuffle_epsilon0_limit(users, step_delta)
    if limit <= 0:
        raise ConfigError(
            "users",
            f"{users} users are too few for amplification by shuffling at δ/T = {step_delta:.3g} "
            f"(the bound needs more than 16·log(4T/δ) = {16 * math.log(4 / step_delta):.0f})",
            "more users, or a larger delta",
        )
    total = lambda eps0: steps * shuffled_guarantee(eps0, users, step_delta)  # noqa: E731
    if total(limit) < epsilon:
        raise ConfigError(
            "epsilon",
            f"{epsilon:g} is beyond what amplification by shuffling certifies for {users} users "
            f"over {steps} iterations: ε0 <= {limit:.4g} gives at most {total(limit):.4g}",
            f"epsilon <= {total(limit):.4g}, more users or fewer iterations",
        )
    low, high = 0.0, limit
    for _ in range(200):  # to adjacent floats; ``low`` always meets the target
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        low, high = (mid, high) if total(mid) <= epsilon else (low, mid)
    return low
