"""Noise mechanisms. Each returns ``(release, event)``: the noisy output and the ``dp_accounting``
event that describes it exactly, so the ledger can account for what was actually drawn.

Every mechanism takes a ``numpy.random.Generator`` (from :mod:`rayfed.rng`), never a seed and
never the global numpy RNG. Sensitivities and scales are arguments, never derived from the data.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

from rayfed.errors import ConfigError


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float, np.floating)) and math.isfinite(value) and value > 0):
        raise ConfigError(name, f"must be a finite number > 0, got {value!r}")
    return float(value)


def laplace_event(l1_sensitivity: float, epsilon: float) -> dp_event.LaplaceDpEvent:
    """The event of :func:`laplace` — build a charge with this, so it equals the drawn event."""
    sens = _positive("l1_sensitivity", l1_sensitivity)
    return dp_event.LaplaceDpEvent(noise_multiplier=sens / _positive("epsilon", epsilon) / sens)


def laplace(values, *, l1_sensitivity: float, epsilon: float, rng: np.random.Generator):
    """Add Lap(Δ₁/ε) noise to every coordinate of ``values``: ε-DP for ℓ₁ sensitivity Δ₁."""
    event = laplace_event(l1_sensitivity, epsilon)
    scale = float(l1_sensitivity) / float(epsilon)
    values = np.asarray(values, dtype=np.float64)
    release = values + rng.laplace(0.0, scale, size=values.shape)
    return release, event


def gaussian(values, *, l2_sensitivity: float, sigma: float, rng: np.random.Generator):
    """Add N(0, σ²) noise to every coordinate; the event's noise multiplier is σ/Δ₂."""
    sens = _positive("l2_sensitivity", l2_sensitivity)
    sigma = _positive("sigma", sigma)
    values = np.asarray(values, dtype=np.float64)
    release = values + rng.normal(0.0, sigma, size=values.shape)
    return release, dp_event.GaussianDpEvent(noise_multiplier=sigma / sens)


def discrete_laplace_event(l1_sensitivity: int, epsilon: float) -> dp_event.DiscreteLaplaceDpEvent:
    """The event of :func:`discrete_laplace`."""
    if not (isinstance(l1_sensitivity, (int, np.integer)) and l1_sensitivity >= 1):
        raise ConfigError("l1_sensitivity", f"must be an integer >= 1, got {l1_sensitivity!r}")
    a = _positive("epsilon", epsilon) / int(l1_sensitivity)
    return dp_event.DiscreteLaplaceDpEvent(noise_parameter=a, sensitivity=int(l1_sensitivity))


def discrete_laplace(values, *, l1_sensitivity: int, epsilon: float, rng: np.random.Generator):
    """Add discrete Laplace (two-sided geometric) noise, P(z) ∝ exp(-a|z|), a = ε/Δ₁, to integers.

    Sampled as the difference of two i.i.d. geometric variables with success 1 - e^{-a}, which
    is exactly DLap(a).
    """
    event = discrete_laplace_event(l1_sensitivity, epsilon)
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.integer):
        raise ConfigError("values", "the discrete Laplace mechanism needs integer values")
    p = -math.expm1(-event.noise_parameter)
    noise = rng.geometric(p, size=values.shape) - rng.geometric(p, size=values.shape)
    release = values.astype(np.int64) + noise
    return release, event


def rr_keep_probability(epsilon: float) -> float:
    """Probability that binary randomized response reports the true bit, for ε-DP per bit."""
    e = math.exp(_positive("epsilon", epsilon))
    return e / (1.0 + e)


def binary_rr_event(keep_probability: float) -> dp_event.RandomizedResponseDpEvent:
    """The event of one bit of binary randomized response that keeps the bit with probability q.

    dp_accounting's RR outputs a uniform bucket with probability p, so q = 1 - p/2, p = 2(1 - q).
    Build the event only through this function: the ledger matches events exactly, so the charged
    and the drawn event must come from the same float operations.
    """
    q = float(keep_probability)
    if not 0.5 < q <= 1.0:
        raise ConfigError("keep_probability", f"must be in (0.5, 1], got {q!r}")
    return dp_event.RandomizedResponseDpEvent(noise_parameter=2.0 * (1.0 - q), num_buckets=2)


def binary_randomized_response(bits, *, keep_probability: float, rng: np.random.Generator):
    """Report each bit truthfully with probability q, flipped otherwise (independently).

    Per bit this is ln(q / (1 - q))-DP; the event (:func:`binary_rr_event`) describes one bit;
    compose it for as many bits as one neighbour can change.
    """
    event = binary_rr_event(keep_probability)
    bits = np.asarray(bits).astype(bool)
    flip = rng.random(bits.shape) >= float(keep_probability)
    return bits ^ flip, event


def kary_rr_event(k: int, epsilon: float) -> dp_event.RandomizedResponseDpEvent:
    """The event of :func:`kary_randomized_response`: a uniform report with p = k/(e^ε + k - 1)."""
    if not (isinstance(k, (int, np.integer)) and k >= 2):
        raise ConfigError("k", f"must be an integer >= 2, got {k!r}")
    p = k / (math.exp(_positive("epsilon", epsilon)) + k - 1)
    return dp_event.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=int(k))


def kary_randomized_response(values, *, k: int, epsilon: float, rng: np.random.Generator):
    """Generalised (k-ary) randomized response on values in {0, …, k-1}: ε-DP per value.

    Keeps the value with probability e^ε / (e^ε + k - 1) and otherwise reports one of the other
    k - 1 values uniformly; equivalently (dp_accounting's form) reports a uniform value with
    probability p = k / (e^ε + k - 1) and the true one otherwise.
    """
    event = kary_rr_event(k, epsilon)
    values = np.asarray(values)
    if values.size and (values.min() < 0 or values.max() >= k):
        raise ConfigError("values", f"must lie in {{0, …, {k - 1}}}")
    randomize = rng.random(values.shape) < event.noise_parameter
    uniform = rng.integers(0, k, size=values.shape)
    release = np.where(randomize, uniform, values).astype(np.int64)
    return release, event
