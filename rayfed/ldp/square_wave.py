"""The Square Wave mechanism and EM/EMS reconstruction (spec §2.8–2.13).

A user with v ∈ [0, 1] reports ṽ ∈ [-b, 1+b] with density p within b of v and q elsewhere,
p/q = e^ε; b is the closed form maximising the mutual-information bound. The aggregator histograms
the reports into d̃ buckets over [-b, 1+b] and finds the d-bucket input histogram of maximum
likelihood under the transition matrix M by EM, or by EMS (EM with a (1,2,1)/4 smoothing step).
"""

from __future__ import annotations

import math

import numpy as np

#: stopping guards of the EM loop (the authors' code): at most this many iterations, and stop
#: once an iteration moves the estimate by at most 1/n in L1
MAX_ITERATIONS = 10_000


#: beyond this ε, b and (p, q) are computed from e^-ε (e^ε, e^2ε overflow near ε = 355)
LARGE_EPSILON = 30.0


def band_half_width(eps: float) -> float:
    """b_SW(ε) = (εe^ε - e^ε + 1) / (2e^ε(e^ε - 1 - ε)); → 1/2 as ε → 0, ≈ (ε - 1)e^-ε / 2 for
    large ε (then computed from e^-ε, divided through by e^2ε)."""
    if eps < 1e-4:  # the closed form cancels catastrophically; its series is 1/2 - ε/3 + ε²/9 …
        return 0.5 - eps / 3 + eps**2 / 9
    if eps > LARGE_EPSILON:
        r = math.exp(-eps)
        return (eps * r - r + r * r) / (2 * (1 - (1 + eps) * r))
    e = math.exp(eps)
    return (eps * e - e + 1) / (2 * e * (e - 1 - eps))


def densities(eps: float, b: float) -> tuple[float, float]:
    """(p, q) = (e^ε, 1) / (2be^ε + 1): 2b·p + 1·q = 1 (from e^-ε for large ε)."""
    if eps > LARGE_EPSILON:
        r = math.exp(-eps)
        return 1 / (2 * b + r), r / (2 * b + r)
    e = math.exp(eps)
    return e / (2 * b * e + 1), 1 / (2 * b * e + 1)


def perturb(values: np.ndarray, eps: float, b: float, u: np.ndarray) -> np.ndarray:
    """Continuous SW by the single-uniform inverse CDF (u: one column per user)."""
    p, q = densities(eps, b)
    r = u[:, 0]
    low = q * values
    high = low + 2 * b * p
    return np.where(
        r <= low,
        r / q - b,
        np.where(r <= high, (r - low) / p + values - b, (r - high) / q + values + b),
    )


def discrete_parameters(eps: float, d: int) -> tuple[int, float, float]:
    """Discrete SW over {0..d-1} (B-R): (b, p, q) with b = ⌊b_SW·d⌋, (2b+1)p + (d-1)q = 1."""
    b = int(math.floor(band_half_width(eps) * d))
    if eps > LARGE_EPSILON:  # divided through by e^ε: no overflow
        r = math.exp(-eps)
        return b, 1 / ((2 * b + 1) + (d - 1) * r), r / ((2 * b + 1) + (d - 1) * r)
    e = math.exp(eps)
    return b, e / ((2 * b + 1) * e + d - 1), 1 / ((2 * b + 1) * e + d - 1)


def perturb_discrete(values: np.ndarray, eps: float, d: int, u: np.ndarray) -> np.ndarray:
    """Discrete SW: ṽ ∈ {-b..d-1+b}; probability p within b of v, q for the other d-1 values."""
    b, p, _ = discrete_parameters(eps, d)
    high = u[:, 0] < (2 * b + 1) * p
    near = values - b + np.minimum((u[:, 1] * (2 * b + 1)).astype(np.int64), 2 * b)
    # the d - 1 far values: -b..v-b-1 and v+b+1..d-1+b
    k = np.minimum((u[:, 1] * (d - 1)).astype(np.int64), d - 2)
    far = np.where(k < values, k - b, k + 2 * b + 1 - b)
    return np.where(high, near, far)


def _ramp_band(x: np.ndarray, h: float) -> np.ndarray:
    """R(x + h) - R(x - h) for the ramp area R(x) = max(x, 0)²/2, without subtracting two nearly
    equal squares: 2xh where both are positive, (x + h)²/2 where only x + h is. (The plain
    difference loses everything when h = b is tiny: at ε = 30 the columns of M summed to 1.07.)"""
    return np.where(x - h >= 0, 2 * x * h, np.where(x + h <= 0, 0.0, (x + h) ** 2 / 2))


def transition_matrix(eps: float, b: float, d: int, d_out: int) -> np.ndarray:
    """M[j, i] = Pr[ṽ in output bucket j | v uniform in input bucket i] (spec §2.11, exact).

    The band's share is the measure of {(v, t) in the two buckets : |t - v| <= b}, a signed sum
    of ramp areas R at the four corner offsets z, each taken as R(z + b) - R(z - b) at once."""
    p, q = densities(eps, b)
    width_in, width_out = 1.0 / d, (1 + 2 * b) / d_out
    a = (np.arange(d) * width_in)[None, :]
    c = (-b + np.arange(d_out) * width_out)[:, None]
    band = (
        _ramp_band(a + width_in - c, b)
        - _ramp_band(a - c, b)
        - _ramp_band(a + width_in - c - width_out, b)
        + _ramp_band(a - c - width_out, b)
    )
    return q * width_out + (p - q) * band / width_in


def discrete_transition_matrix(eps: float, d: int) -> np.ndarray:
    """M[j, i] for discrete SW: output value j - b given input i."""
    b, p, q = discrete_parameters(eps, d)
    j = np.arange(d + 2 * b)[:, None] - b
    return np.where(np.abs(j - np.arange(d)[None, :]) <= b, p, q)


def histogram(reports: np.ndarray, b: float, d_out: int) -> np.ndarray:
    """Counts of continuous reports in d̃ equal buckets over [-b, 1+b]."""
    idx = np.floor((reports + b) / (1 + 2 * b) * d_out).astype(np.int64)
    return np.bincount(np.clip(idx, 0, d_out - 1), minlength=d_out).astype(np.float64)


def smooth(x: np.ndarray) -> np.ndarray:
    """The S-step: (1,2,1)/4 binomial smoothing of the interior buckets, the two edge buckets left
    as they are, renormalised.

    The text leaves the edges open. On identical report histograms (10 seeds, n = 10^5, d = 256,
    paired; ``benchmarks/ems_edges.py``) leaving them unsmoothed lowers W1 against the
    row-normalised (2/3, 1/3) edge kernel: Beta(5,2) by 10 % at ε = 0.5 and 6 % at ε = 1, mass
    piled at 1 by 10 % and 9 %, mass piled at 0 by 15 % and 10 %, and raises it nowhere beyond
    its standard error. The authors' code leaves the last bucket alone (an off-by-one) and gains
    the same at that edge only."""
    out = x.copy()
    out[1:-1] = 0.5 * x[1:-1] + 0.25 * (x[:-2] + x[2:])
    return out / out.sum()


def log_likelihood(counts: np.ndarray, m: np.ndarray, x: np.ndarray) -> float:
    """Σ_j n_j ln (Mx)_j on the raw counts."""
    return _log_likelihood_of(counts, m @ x)


def _log_likelihood_of(counts: np.ndarray, mx: np.ndarray) -> float:
    keep = counts > 0
    return float(counts[keep] @ np.log(mx[keep]))


def expectation_maximisation(
    counts: np.ndarray,
    m: np.ndarray,
    *,
    smoothing: bool,
    tolerance: float,
    max_iterations: int = MAX_ITERATIONS,
) -> tuple[np.ndarray, int]:
    """EM (smoothing False) or EMS (True) from a uniform start (spec §2.12, Algorithm 1). ``m`` is
    the dense transition matrix or a structured one (:mod:`rayfed.ldp.wave`): only ``m @ x``,
    ``m.T @ y`` and ``m.shape`` are used.

    Stops when the count log-likelihood improves by less than ``tolerance`` (checked from the
    third iteration), when an iteration moves the estimate by at most 1/n in L1, or after
    ``max_iterations``. Returns (estimate summing to 1, iterations run).
    """
    counts = np.asarray(counts, dtype=np.float64)
    d = m.shape[1]
    n = counts.sum()
    x = np.full(d, 1.0 / d)
    mx = m @ x
    previous = _log_likelihood_of(counts, mx)
    for it in range(1, max_iterations + 1):
        ratio = np.divide(counts, mx, out=np.zeros_like(counts), where=counts > 0)
        new = x * (m.T @ ratio)
        new /= new.sum()
        if smoothing:
            new = smooth(new)
        mx = m @ new  # the likelihood's, and the next iteration's E-step's: one product, not two
        current = _log_likelihood_of(counts, mx)
        moved = np.abs(new - x).sum()
        x = new
        if (it > 2 and abs(current - previous) < tolerance) or moved <= 1.0 / n:
            return x, it
        previous = current
    return x, max_iterations
