"""DPBV: LDP bit-vector encoding of numerical values and distance estimation in the anonymised
Hamming space — Sun, Zhao & Ye, "Distributed Clustering in the Anonymized Space with Local
Differential Privacy" (arXiv:1906.11441; spec shared/specs/ldp-bitvector.md).

A value x ∈ [L, U] becomes s bits, bit i = 1 iff |x - r_i| <= t, with anchors r_i uniform on the
extended range [L - t, U + t] (so every value has the same expected weight), then every bit goes
through symmetric randomized response (kept with p = e^ε/(e^ε+1)). The debiased Hamming distance
estimates |x - y| up to 2t (Theorem 5); distance consistence chains short distances into long ones.

Privacy, honestly (spec §3): each bit is ε-LDP, but two values' codes can differ in up to k_max bits
(all s when t covers half the range), so a value is only (k_max·ε)-LDP — the paper's δ of its
Eq. 10 does not hold (the hockey-stick divergence of two codes 100 bits apart is ≈ 1).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln, logsumexp

from rayfed.clustering import squared_distances
from rayfed.privacy.mechanisms import rr_keep_probability

ROW_BLOCK = 2048  # rows of the distance matrix estimated at a time
PAIR_BLOCK = 16384  # record pairs encoded or decoded at a time (vertical decomposition)


# --- encoding -------------------------------------------------------------------------------------
def anchor_range(low: float, high: float, t: float) -> float:
    """μ = U - L + 2t, the length of the extended anchor range."""
    return high - low + 2 * t


def anchors(gen: np.random.Generator, dims: int, s: int, low: float, high: float, t: float):
    """(dims, s) anchors: an independent vector per attribute, uniform on [L - t, U + t]."""
    return gen.uniform(low - t, high + t, (dims, s))


def encode(values: np.ndarray, r: np.ndarray, t: float) -> np.ndarray:
    """Noise-free modified BV of one attribute: (n, s) booleans |x - r_i| <= t."""
    return np.abs(values[:, None] - r[None, :]) <= t


keep_probability = rr_keep_probability  # binary RR: report the true bit w.p. e^ε/(1+e^ε)


# --- distances --------------------------------------------------------------------------------------
def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """All-pairs Hamming distances of two boolean matrices (rows), by one BLAS product."""
    af, bf = a.astype(np.float32), b.astype(np.float32)
    return af.sum(1)[:, None] + bf.sum(1)[None, :] - 2 * (af @ bf.T)


def debias(d_h: np.ndarray, s: int, mu: float, eps: float | None) -> np.ndarray:
    """Theorem 5 / Eq. 11: d̂ = μ/(2s(p-q)²)·(d_H - 2pq·s); eps None is noise-free BV (μ·d_H/2s)."""
    if eps is None:
        return mu * d_h / (2 * s)
    p = keep_probability(eps)
    q = 1 - p
    return mu / (2 * s * (p - q) ** 2) * (d_h - 2 * p * q * s)


def estimator_sd(d: float, s: int, mu: float, eps: float) -> float:
    """sd of d̂ for true distance d <= 2t: (μ/(2s(p-q)²))·sqrt(s·P(1-P)), P = 2pq + (p-q)²·2d/μ."""
    p = keep_probability(eps)
    q = 1 - p
    big_p = 2 * p * q + (p - q) ** 2 * 2 * d / mu
    return mu / (2 * s * (p - q) ** 2) * math.sqrt(s * big_p * (1 - big_p))


def hoeffding_bound(s: int, mu: float, eps: float, beta: float) -> float:
    """Theorem 6: |d̂ - d| <= (μ/2)·((e^ε+1)/(e^ε-1))²·sqrt(ln(2/β)/(2s)) w.p. >= 1 - β."""
    e = math.exp(eps)
    return mu / 2 * ((e + 1) / (e - 1)) ** 2 * math.sqrt(math.log(2 / beta) / (2 * s))


def distance_consistence(d: np.ndarray, radius: float, max_iter: int = 50) -> np.ndarray:
    """Algorithm 1 per attribute: keep distances <= radius; fill each unset pair (i, k) with
    d(i, j) + d(j, k) for the first j (lowest index) whose two hops were set in an earlier
    iteration — not the minimum, which noise biases downward (spec §2.4); repeat until nothing
    changes; pairs never reached keep their raw estimate. Vectorised: the first j is found with a
    boolean mask per row."""
    known = d <= radius
    np.fill_diagonal(known, True)
    out = np.where(known, d, np.inf)
    for _ in range(max_iter):
        unset = ~np.isfinite(out)
        if not unset.any():
            break
        finite = np.isfinite(out)
        new = out.copy()
        for i in np.flatnonzero(unset.any(axis=1)):
            targets = np.flatnonzero(unset[i])
            via = finite[i][:, None] & finite[:, targets]  # (n, |targets|): j usable for (i, k)
            via[i] = False
            via[targets, np.arange(targets.size)] = False
            has = via.any(axis=0)
            first = via.argmax(axis=0)
            k = targets[has]
            j = first[has]
            new[i, k] = out[i, j] + out[j, k]
        if np.array_equal(np.isfinite(new), finite):
            break
        out = new
    return np.where(np.isfinite(out), out, d)


def exact_distances(x: np.ndarray) -> np.ndarray:
    """n x n Euclidean distances (float32): the non-private comparator."""
    return np.sqrt(squared_distances(x, x)).astype(np.float32)


def distance_matrix(
    blocks: list[np.ndarray], s: int, mu: float, eps: float | None, consistence: float | None
) -> np.ndarray:
    """n x n combined distance (Eq. 19): sqrt(Σ_attributes d̂²) from per-attribute bit matrices,
    built in row blocks (float32) so only the matrix itself is n² sized."""
    n = blocks[0].shape[0]
    out = np.zeros((n, n), dtype=np.float32)
    for bits in blocks:
        if consistence is not None:  # Algorithm 1 needs the whole per-attribute matrix
            d = distance_consistence(debias(hamming(bits, bits), s, mu, eps), consistence)
            out += (d**2).astype(np.float32)
            continue
        for a in range(0, n, ROW_BLOCK):
            d = debias(hamming(bits[a : a + ROW_BLOCK], bits), s, mu, eps)
            out[a : a + ROW_BLOCK] += (d**2).astype(np.float32)
    np.sqrt(out, out=out)
    np.fill_diagonal(out, 0.0)
    return out


# --- vertical decomposition (Eq. 21–23) -------------------------------------------------------------
def pair_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every record pair i < j (triu order): u = ‖x_i‖² + ‖x_j‖², v = 2·x_i·x_j, so
    u - v = ‖x_i - x_j‖²."""
    i, j = np.triu_indices(x.shape[0], k=1)
    sq = (x**2).sum(1)
    return sq[i] + sq[j], 2 * np.einsum("pk,pk->p", x[i], x[j])


def decomposition_distances(
    alice: np.ndarray, codes: np.ndarray, s: int, mu: float, eps: float | None
) -> np.ndarray:
    """sqrt(L² + max(R̂², 0)): Alice's exact part, Bob's part from the Hamming distance between the
    codes of u and v of each pair (the debiased estimate of |u - v| = R²). ``codes`` is (2, pairs,
    packed bytes): u's codes, then v's."""
    n = alice.shape[0]
    d2 = exact_distances(alice).astype(np.float64) ** 2
    i, j = np.triu_indices(n, k=1)
    r2 = np.empty(i.size)
    for a in range(0, i.size, PAIR_BLOCK):
        cu = np.unpackbits(codes[0, a : a + PAIR_BLOCK], axis=1, count=s).astype(bool)
        cv = np.unpackbits(codes[1, a : a + PAIR_BLOCK], axis=1, count=s).astype(bool)
        r2[a : a + PAIR_BLOCK] = debias((cu != cv).sum(1), s, mu, eps)
    d2[i, j] += np.maximum(r2, 0.0)
    d2[j, i] = d2[i, j]
    return np.sqrt(d2).astype(np.float32)


# --- the paper's privacy claims, and the true guarantee ---------------------------------------------
def paper_delta(eps: float, s: int) -> float:
    """Theorem 4 / Eq. 10 as printed: δ = p^s - e^ε q^s. NOT a valid guarantee (see hockey_stick)."""
    p = keep_probability(eps)
    return p**s - math.exp(eps) * (1 - p) ** s


def paper_bits(eps: float, delta: float) -> int:
    """Fig. 9: s = ⌈ln δ / (ε - ln(e^ε + 1))⌉."""
    return math.ceil(math.log(delta) / (eps - math.log(math.exp(eps) + 1)))


def hockey_stick(eps: float, k: int) -> float:
    """The true δ at the per-bit ε for two codes that differ in k bits: Σ_j C(k, j)[p^j q^(k-j) -
    e^ε q^j p^(k-j)] over the outputs where the first term is larger (j > (k+1)/2 flips fewer)."""
    p = keep_probability(eps)
    q = 1 - p
    j = np.arange(k + 1)
    log_binom = gammaln(k + 1) - gammaln(j + 1) - gammaln(k - j + 1)
    log_a = log_binom + j * math.log(p) + (k - j) * math.log(q)
    log_b = log_binom + eps + j * math.log(q) + (k - j) * math.log(p)
    keep = log_a > log_b
    if not keep.any():
        return 0.0
    delta = float(np.exp(logsumexp(log_a[keep])) - np.exp(logsumexp(log_b[keep])))
    return min(1.0, max(0.0, delta))  # the difference of two sums near 1 can round past 1


def max_differing_bits(r: np.ndarray, t: float, low: float, high: float) -> int:
    """An upper bound on the bits two values in [L, U] can differ in, for these anchors: every
    anchor whose interval [r - t, r + t] does not cover all of [L, U] (x and y can then fall on
    different sides of it). With t = (U - L)/2 that is every anchor: two values can differ in all s
    bits (x = L and x = U have complementary codes)."""
    covers = (r - t <= low) & (r + t >= high)
    return int(np.count_nonzero(~covers))
