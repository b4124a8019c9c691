"""Frequency oracles (GRR, OLH, HRR), Norm-Sub, and the mean estimators SR and PM (spec §2.1–2.3).

Randomizers take the users' uniforms ``u`` (one row per user, from
:func:`rayfed.rng.keyed_uniform`) instead of a Generator, so that one user's report depends only
on the run seed, the purpose and the user's id.
"""

from __future__ import annotations

import math

import numpy as np

MERSENNE = (1 << 31) - 1  # the universal hash's prime


# --- GRR / OLH ----------------------------------------------------------------------------------
def use_grr(domain: int, eps: float) -> bool:
    """GRR has the lower variance iff d - 2 < 3e^ε (spec §2.1); otherwise OLH."""
    return domain - 2 < 3 * math.exp(eps)


def olh_buckets(eps: float) -> int:
    """g = round(e^ε) + 1 (the variance-optimal e^ε + 1, rounded as the authors' code does)."""
    return int(round(math.exp(eps))) + 1


def grr_probabilities(domain: int, eps: float) -> tuple[float, float]:
    e = math.exp(eps)
    return e / (e + domain - 1), 1.0 / (e + domain - 1)


def grr_perturb(values: np.ndarray, domain: int, eps: float, u: np.ndarray) -> np.ndarray:
    """Keep the value w.p. p = e^ε/(e^ε+d-1), else a uniform *other* value; u has 2 columns."""
    p, _ = grr_probabilities(domain, eps)
    other = np.minimum((u[:, 1] * (domain - 1)).astype(np.int64), domain - 2)
    other = other + (other >= values)  # skip the true value
    return np.where(u[:, 0] < p, values, other)


def grr_estimate(reports: np.ndarray, domain: int, eps: float, n: int) -> np.ndarray:
    """Unbiased frequencies (C(v)/n - q)/(p - q)."""
    p, q = grr_probabilities(domain, eps)
    return (np.bincount(reports, minlength=domain) / n - q) / (p - q)


def olh_hash(params: np.ndarray, values: np.ndarray, g: int) -> np.ndarray:
    """H(v) = ((a·v + b) mod (2^31 - 1)) mod g, per user (params[:, 0] = a >= 1, [:, 1] = b)."""
    return ((params[:, 0] * values + params[:, 1]) % MERSENNE) % g


def olh_params(words: np.ndarray) -> np.ndarray:
    """Per-user hash parameters (a, b) from two random 64-bit words each."""
    a = (words[:, 0] % np.uint64(MERSENNE - 1)).astype(np.int64) + 1
    b = (words[:, 1] % np.uint64(MERSENNE)).astype(np.int64)
    return np.stack([a, b], axis=1)


def olh_perturb(values: np.ndarray, params: np.ndarray, eps: float, u: np.ndarray) -> np.ndarray:
    """Report GRR over [g] of the user's hashed value H(v)."""
    g = olh_buckets(eps)
    return grr_perturb(olh_hash(params, values, g), g, eps, u)


def olh_estimate(
    reports: np.ndarray, params: np.ndarray, domain: int, eps: float, n: int
) -> np.ndarray:
    """C(v) = #{users whose report equals H(v)}; x̃_v = (C(v)/n - 1/g)/(p - 1/g)."""
    g = olh_buckets(eps)
    p, _ = grr_probabilities(g, eps)
    support = np.array(
        [
            np.count_nonzero(olh_hash(params, np.full(reports.size, v), g) == reports)
            for v in range(domain)
        ]
    )
    return (support / n - 1.0 / g) / (p - 1.0 / g)


def norm_sub(x: np.ndarray) -> np.ndarray:
    """Norm-Sub (spec §2.2): zero the negatives and shift the positives equally until the estimate
    is non-negative and sums to 1."""
    x = np.asarray(x, dtype=np.float64).copy()
    while True:
        x[x < 0] = 0.0
        positive = x > 0
        if not positive.any():
            return np.full(x.size, 1.0 / x.size)
        x[positive] += (1.0 - x.sum()) / positive.sum()
        if (x >= 0).all():
            return x


# --- HRR ------------------------------------------------------------------------------------------
def hadamard_entry(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """φ[j, a] = (-1)^popcount(j & a) of the Sylvester Hadamard matrix (parity by XOR folding)."""
    x = np.bitwise_and(rows, cols).astype(np.uint64)
    for shift in (32, 16, 8, 4, 2, 1):
        x ^= x >> np.uint64(shift)
    return 1 - 2 * (x & np.uint64(1)).astype(np.int64)


def hrr_perturb(
    index: np.ndarray, sign: np.ndarray, size: int, eps: float, u: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Report (row j, bit y') for the signed one-hot s·e_a: j uniform in [size], y = s·φ[j, a],
    flipped w.p. 1/(e^ε + 1)."""
    rows = np.minimum((u[:, 0] * size).astype(np.int64), size - 1)
    y = sign * hadamard_entry(rows, index)
    flip = u[:, 1] < 1.0 / (math.exp(eps) + 1.0)
    return rows, np.where(flip, -y, y).astype(np.int8)


def walsh_hadamard(x: np.ndarray) -> np.ndarray:
    """φ·x for the Sylvester Hadamard matrix φ of size len(x) (a power of 2), by the fast
    transform: log2(size) butterfly passes, O(size log size), no size x size matrix. On integer
    vectors (HRR's totals) every partial sum is an integer below 2^53, so the result is exactly
    the dense product's."""
    out = np.array(x, dtype=np.float64)
    size, half = out.size, 1
    while half < size:
        pairs = out.reshape(-1, 2, half)
        out = np.stack([pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]], axis=1).reshape(size)
        half *= 2
    return out


def hrr_estimate(rows: np.ndarray, bits: np.ndarray, size: int, eps: float, n: int) -> np.ndarray:
    """θ̂_a = ((e^ε+1)/(e^ε-1)) (1/n) Σ_k y'_k φ[j_k, a], for every a (one fast Walsh-Hadamard
    transform of the per-row totals)."""
    totals = np.bincount(rows, weights=bits.astype(np.float64), minlength=size)
    e = math.exp(eps)
    return (e + 1) / (e - 1) * walsh_hadamard(totals) / n


# --- SR / PM (inputs in [-1, 1]) --------------------------------------------------------------------
def sr_perturb(values: np.ndarray, eps: float, u: np.ndarray) -> np.ndarray:
    """Stochastic rounding (Duchi et al.): ±(e^ε+1)/(e^ε-1), unbiased for v."""
    e = math.exp(eps)
    p, q = e / (e + 1), 1 / (e + 1)
    plus = u[:, 0] < q + (p - q) * (1 + values) / 2
    return np.where(plus, 1.0, -1.0) * (e + 1) / (e - 1)


def pm_perturb(values: np.ndarray, eps: float, u: np.ndarray) -> np.ndarray:
    """Piecewise mechanism (Wang et al., ICDE 2019): w.p. t/(t+1) uniform on [ℓ(v), r(v)], else
    uniform on the rest of [-s, s]; t = e^{ε/2}, s = (t+1)/(t-1). Unbiased for v."""
    t = math.exp(eps / 2)
    s = (t + 1) / (t - 1)
    left = (t * values - 1) / (t - 1)
    right = (t * values + 1) / (t - 1)
    band = left + (right - left) * u[:, 1]
    # the low region [-s, left) ∪ (right, s] has length 2s - 2/(t-1); walk it left to right
    w = u[:, 1] * (2 * s - (right - left))
    low = np.where(w < left + s, -s + w, right + (w - (left + s)))
    return np.where(u[:, 0] < t / (t + 1), band, low)
