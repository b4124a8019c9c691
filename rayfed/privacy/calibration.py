"""Noise calibration for a target (ε, δ) with dp-accounting's own search (no hand-derived formula),
and the per-report ε0 of shuffled LDP releases for a target central (ε, δ).

``gaussian_noise_multiplier`` finds the smallest noise multiplier z (σ = z·Δ₂) such that the
given composition of (optionally Poisson-subsampled) Gaussian steps is (ε, δ)-DP under the
accountant the ledger will use. The search runs under RDP first — fast and safe at any z — and,
for the ``tightest`` accountant, then under PLD inside [z_RDP/64, z_RDP] (PLD's z is never above
RDP's; searching from a tiny z would make PLD's discretised loss range exceed memory), with a
coarse discretisation for the bisection and the ledger's own for the final check. The event built
by ``gaussian_steps_event`` is exactly what the ledger is then charged with.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting import dp_event, mechanism_calibration
from scipy import optimize, special

from rayfed.errors import ConfigError
from rayfed.privacy.ledger import (
    PLD_INTERVAL,
    RELATIONS,
    ZERO_OUT_ONLY,
    UnitInSampledGroupGaussianDpEvent,
    check_budget,
    make_accountant,
)
from rayfed.privacy.shuffling import shuffle_epsilon0_limit, shuffled_guarantee


def gaussian_steps_event(
    noise_multiplier: float, steps: int, sampling_rate: float = 1.0
) -> dp_event.DpEvent:
    """``steps`` compositions of a Gaussian step, Poisson-subsampled at ``sampling_rate`` if < 1."""
    step: dp_event.DpEvent = dp_event.GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1.0:
        step = dp_event.PoissonSampledDpEvent(sampling_rate, step)
    return dp_event.SelfComposedDpEvent(step, steps)


def sampled_steps_event(
    noise_multiplier: float, steps: int, sampling_rate: float, *, unit: str, sampled: str
) -> dp_event.DpEvent:
    """The true event of ``steps`` Gaussian releases of a sum over a Poisson sample at
    ``sampling_rate``, protecting one ``unit`` ("rating" or "user") when the sample draws
    ``sampled`` ("rating" or "user") units: the subsampled Gaussian when the protected unit is
    what is sampled; :class:`UnitInSampledGroupGaussianDpEvent` (no amplification of ε) for one
    rating of a sampled user."""
    if unit == sampled or sampling_rate >= 1.0:
        return gaussian_steps_event(noise_multiplier, steps, sampling_rate)
    if (unit, sampled) != ("rating", "user"):
        raise ValueError(f"no event for protecting a {unit} with {sampled}-level sampling")
    step = UnitInSampledGroupGaussianDpEvent(sampling_rate, noise_multiplier)
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
    """The smallest z for which ``gaussian_steps_event(z, steps, sampling_rate)`` is (ε, δ)-DP
    under ``accountant`` (``rdp`` or ``tightest``).

    Raises ConfigError for a budget that no finite noise meets (δ = 0 with a Gaussian).
    """
    z_rdp = _rdp_noise_multiplier(epsilon, delta, steps, sampling_rate, relation)
    if accountant == "rdp":
        return z_rdp
    if accountant != "tightest":
        raise ConfigError("accountant", f"calibrates under rdp or tightest, got {accountant!r}")
    return tightest_noise_multiplier(
        lambda z: gaussian_steps_event(z, steps, sampling_rate), epsilon, delta, relation, z_rdp
    )


#: PLD's discretisation during the bisection (the check uses the ledger's own, finer one)
_SEARCH_INTERVAL = 1e-3


def tightest_noise_multiplier(make_event, epsilon, delta, relation, upper: float) -> float:
    """The smallest z <= ``upper`` (a noise multiplier RDP certifies) for which
    ``make_event(z)`` is (ε, δ)-DP under the ledger's ``tightest`` accountant, to a relative
    1e-4: bisection under PLD, then the ledger's own check (z raised until it passes)."""
    from rayfed.privacy.ledger import PLD_EPSILON_CAP, TightestAccountant

    rel = RELATIONS[relation]

    def eps(z: float, interval: float = PLD_INTERVAL) -> float:
        acc = TightestAccountant(rel, interval)
        acc.compose(make_event(z))
        return acc.get_epsilon(delta)

    rdp_only = make_accountant("rdp", relation)
    rdp_only.compose(make_event(upper / 2))
    if rdp_only.get_epsilon(delta) > PLD_EPSILON_CAP:  # PLD is not built there: nothing to gain
        return upper
    low = upper / 2
    while low > upper / 64 and eps(low, _SEARCH_INTERVAL) <= epsilon:
        low /= 2
    high = upper
    while high - low > 1e-4 * upper:
        mid = (low + high) / 2
        low, high = (mid, high) if eps(mid, _SEARCH_INTERVAL) > epsilon else (low, mid)
    while eps(high) > epsilon * (1 + 1e-12):
        high *= 1 + 1e-4
    return float(min(high, upper))


#: the largest δ a Gaussian-calibrated option accepts (declared on each protocol's ``delta``)
MAX_DELTA = 0.1
MAX_DELTA_WHY = (
    "δ is the probability that the ε guarantee fails outright: above 0.1 it is all but void, "
    "and the Gaussian calibration's search grows as 1/σ² while δ nears 1 (minutes of planning)"
)

#: the smallest noise multiplier (σ/Δ) the calibration searches: below it dp-accounting's RDP
#: orders lose precision ("negative Rényi divergence") and σ is under a thousandth of Δ
NOISE_MULTIPLIER_FLOOR = 1e-3


def _check_above_floor(epsilon, delta, steps, sampling_rate, relation) -> None:
    """ConfigError naming ``epsilon`` when noise at the floor already meets (ε, δ): the budget
    asks for less noise than the calibration can certify (the release would be all but exact)."""
    acc = make_accountant("rdp", relation)
    acc.compose(gaussian_steps_event(NOISE_MULTIPLIER_FLOOR, steps, sampling_rate))
    at_floor = float(acc.get_epsilon(delta))
    if at_floor <= epsilon:
        raise ConfigError(
            "epsilon",
            f"ε = {epsilon:g} at δ = {delta:g} over {steps} Gaussian step(s) needs noise below "
            f"{NOISE_MULTIPLIER_FLOOR:g}·Δ, the calibration's floor (dp-accounting's RDP numerics "
            "break down there; the release would be the exact value to within a thousandth of "
            "its sensitivity)",
            f"epsilon below {at_floor:.4g} at this δ",
        )


def _rdp_noise_multiplier(epsilon, delta, steps, sampling_rate, relation) -> float:
    """The smallest z (dp-accounting's calibration under RDP)."""
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
    _check_above_floor(epsilon, delta, steps, sampling_rate, relation)
    return float(
        mechanism_calibration.calibrate_dp_mechanism(
            lambda: make_accountant("rdp", relation),
            lambda z: gaussian_steps_event(z, steps, sampling_rate),
            epsilon,
            delta,
            mechanism_calibration.LowerEndpointAndGuess(NOISE_MULTIPLIER_FLOOR, 1.0),
            tol=1e-4,
        )
    )


# --- the SGLD papers' calibration: per-step (ε0, δ0), amplification, advanced composition ---------
def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """The exact δ(ε) of one Gaussian release with σ = z·Δ₂ (Balle & Wang 2018, Thm 8):
    Φ(1/(2z) − εz) − e^ε Φ(−1/(2z) − εz). Valid at every ε, unlike the classical
    z = sqrt(2 ln(1.25/δ))/ε (ε < 1 only), which it never exceeds."""
    z = noise_multiplier
    # the second term as exp(ε + log Φ(...)): e^ε overflows long before the product does
    return float(
        special.ndtr(0.5 / z - epsilon * z)
        - math.exp(epsilon + special.log_ndtr(-0.5 / z - epsilon * z))
    )


def advanced_composition_epsilon(
    noise_multiplier: float, delta: float, *, steps: int, sampling_rate: float = 1.0
) -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian releases by the SGLD papers' analysis (Liu,
    Wang & Smola 2015 compose this way; spec federated-mf §2.10): δ is split in halves, δ'' = δ/2
    for the advanced composition theorem and T·δ' = δ/2 for the steps; each step is the Gaussian
    mechanism's (ε0, δ0) with δ0 = δ'/q (:func:`gaussian_delta` solved for ε0), amplified by
    sampling to ε' = log(1 + q(e^{ε0} − 1)), δ' = q·δ0, and composed by Dwork–Rothblum–Vadhan:
    ε = sqrt(2T ln(1/δ'')) ε' + T ε'(e^{ε'} − 1), δ = T δ' + δ''."""
    q, t = sampling_rate, steps
    delta0 = delta / 2 / t / q
    # the smallest ε0 with δ(ε0) <= δ0 (δ(ε) decreases in ε; 0 if the step alone meets δ0)
    if gaussian_delta(noise_multiplier, 0.0) <= delta0:
        eps0 = 0.0
    else:
        high = 1.0
        while gaussian_delta(noise_multiplier, high) > delta0:
            high *= 2
        eps0 = optimize.brentq(
            lambda e: gaussian_delta(noise_multiplier, e) - delta0, 0.0, high, xtol=1e-14
        )
    # log(1 + q(e^{ε0} − 1)) without overflowing e^{ε0} (tiny z at a huge ε)
    eps1 = eps0 if q == 1 else float(np.logaddexp(math.log1p(-q), math.log(q) + eps0))
    if eps1 > 700:
        return math.inf
    return math.sqrt(2 * t * math.log(2 / delta)) * eps1 + t * eps1 * math.expm1(eps1)


def advanced_composition_noise_multiplier(
    epsilon: float, delta: float, *, steps: int, sampling_rate: float = 1.0
) -> float:
    """The smallest z (to a relative 1e-6) whose ``steps`` subsampled Gaussian releases reach
    (ε, δ) by :func:`advanced_composition_epsilon` — the looser calibration the thesis blames
    for DP-SGLD's accuracy (spec §5.4, Fig. 4.4). The ledger still charges the Gaussian events,
    whose RDP ε is below the target."""
    check_budget(epsilon, delta)
    if steps < 1:
        raise ConfigError("steps", f"must be >= 1, got {steps!r}")
    if not 0 < sampling_rate <= 1:
        raise ConfigError("sampling_rate", f"must be in (0, 1], got {sampling_rate!r}")
    if delta >= 2 * steps * sampling_rate:
        # δ0 = δ/(2·steps·q) would be >= 1: any z would do, and none is a calibration
        raise ConfigError(
            "delta",
            f"δ = {delta:g} leaves each of the {steps} steps a δ0 >= 1",
            f"delta < {2 * steps * sampling_rate:g}",
        )

    def excess(z: float) -> float:
        return (
            advanced_composition_epsilon(z, delta, steps=steps, sampling_rate=sampling_rate)
            - epsilon
        )

    low, high = 1e-3, 1.0
    while excess(high) > 0:
        low, high = high, high * 2
    while excess(low) <= 0 and low > 1e-12:
        low /= 2
    while high - low > 1e-6 * high:  # bisection: excess decreases in z, keep excess(high) <= 0
        mid = (low + high) / 2
        low, high = (mid, high) if excess(mid) > 0 else (low, mid)
    return high


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
            "more users, a smaller omega (more of them must report), or a larger delta",
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


# --- integer noise: the distributed discrete Gaussian and Skellam --------------------------------
def _integer_epsilon(event, steps: int, delta: float, accountant: str, relation: str) -> float:
    acc = make_accountant(accountant, relation)
    acc.compose(dp_event.SelfComposedDpEvent(event, steps))
    return float(acc.get_epsilon(delta))


def _calibrate_integer(make_event, epsilon, delta, steps, accountant, relation, what: str):
    """The smallest parameter x (to a relative 1e-6) with ``make_event(x)`` composed ``steps``
    times (ε, δ)-DP under ``accountant``; ε falls as x grows. Bisection on log x."""
    check_budget(epsilon, delta)
    if delta <= 0:
        raise ConfigError("delta", f"{what} needs delta > 0", "e.g. 1e-5 or 1/n²")
    if not (isinstance(steps, (int, np.integer)) and steps >= 1):
        raise ConfigError("steps", f"must be an integer >= 1, got {steps!r}")
    if accountant not in ("rdp", "tightest"):
        raise ConfigError("accountant", f"calibrates under rdp or tightest, got {accountant!r}")
    if relation != "replace_special":
        raise ConfigError("relation", ZERO_OUT_ONLY, "relation=replace_special (zero-out)")

    def excess(x: float) -> float:
        return _integer_epsilon(make_event(x), steps, delta, accountant, relation) - epsilon

    low, high = 1e-3, 1.0
    while excess(high) > 0:
        low, high = high, high * 4
        if high > 1e30:
            raise ConfigError("epsilon", f"no {what} up to 1e30 reaches ε = {epsilon:g}")
    while excess(low) <= 0 and low > 1e-12:
        low /= 4
    while high - low > 1e-6 * high:
        mid = math.sqrt(low * high) if high > 4 * low else (low + high) / 2
        low, high = (mid, high) if excess(mid) > 0 else (low, mid)
    while excess(high) > 0:  # the event's own rounding (σ² as a Fraction) may have moved it
        high *= 1 + 1e-6
    return high


@functools.lru_cache(maxsize=256)
def ddg_sigma2(
    epsilon: float,
    delta: float,
    *,
    l2_sensitivity: float,
    quorum: int,
    dim: int,
    l1_sensitivity: float | None = None,
    steps: int = 1,
    accountant: str = "tightest",
    relation: str = "replace_special",
) -> float:
    """The smallest per-share σ² (to a relative 1e-6, as the sampler represents it) for which
    ``steps`` releases of a sum of ``quorum`` N_Z(0, σ²) shares
    (:func:`~rayfed.privacy.mechanisms.distributed_discrete_gaussian_event`) are (ε, δ)-DP under
    ``accountant`` (the events are RDP-only, so ``tightest`` is RDP here)."""
    from rayfed.privacy.integer import exact_sigma2
    from rayfed.privacy.mechanisms import distributed_discrete_gaussian_event

    def make(s2: float):
        return distributed_discrete_gaussian_event(
            s2, quorum=quorum, l2_sensitivity=l2_sensitivity, l1_sensitivity=l1_sensitivity, dim=dim
        )

    s2 = _calibrate_integer(make, epsilon, delta, steps, accountant, relation, "sigma2")
    return float(exact_sigma2(s2))


@functools.lru_cache(maxsize=256)
def skellam_variance(
    epsilon: float,
    delta: float,
    *,
    l2_sensitivity: float,
    dim: int,
    l1_sensitivity: float | None = None,
    steps: int = 1,
    accountant: str = "tightest",
    relation: str = "replace_special",
) -> float:
    """The smallest aggregate Skellam variance μ per coordinate (to a relative 1e-6) for which
    ``steps`` releases (:func:`~rayfed.privacy.mechanisms.skellam_event`) are (ε, δ)-DP under
    ``accountant``; each of n users then adds a share of variance μ/n."""
    from rayfed.privacy.mechanisms import skellam_event

    def make(mu: float):
        return skellam_event(
            mu, l2_sensitivity=l2_sensitivity, l1_sensitivity=l1_sensitivity, dim=dim
        )

    return _calibrate_integer(make, epsilon, delta, steps, accountant, relation, "variance")
