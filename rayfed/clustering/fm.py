"""DP Flajolet–Martin sketches and the grid-weight estimators of DPFMPS (Li, Wang & Li, VLDB'23,
Alg. 2–5; spec shared/specs/vfl-kmeans.md §2.5–2.9, §2.12).

A party's partition of its users into k' local clusters becomes an M x k' matrix A: entry (i, a) is
the maximum over the cluster's ids of a geometric hash H_i(id) ~ Geometric(γ/(1+γ)) on {1, 2, …},
the maximum of n_p fresh geometric "phantoms", and the floor α_min — one party's entry of a key is
about ε'-DP for a hash key the server does not know; all parties' sketches together, which share
the keys, are accounted in :mod:`rayfed.clustering.fm_privacy`. Sketches of the same key merge under union by element-wise max, so the
server estimates every grid cell's weight |∩_ℓ M^(ℓ)_{a_ℓ}| as n̂ minus the union of the cells'
complements (BasicEst), or fits the grid to the pairwise tables (2PEst).

The paper's estimator (1+γ)^{HarmonicMean(U)} overestimates a cardinality by x1.5–2.2 and makes the
method collapse to independent weights; ``corrected`` is the bias-corrected harmonic mean
[γ/((1+γ)ln(1+γ))]·M/Σ_i (1+γ)^{-U_i} of the spec (§2.8), unbiased to simulation accuracy.
``literal`` keeps the paper's formula so its bias can be shown.

The number of local clusters k' trades the sketches' noise against the grid's resolution: the
paper's noise-vs-signal rule (§2.10) or the thesis's Table 5.1.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
from collections.abc import Iterator

import numpy as np

ESTIMATORS = ("corrected", "literal")
PROJECTIONS = ("clip", "simplex")


# --- one sketch ---------------------------------------------------------------------------------
def sketch_epsilon(eps2: float, delta2: float, m: int) -> float:
    """ε' of one key by the paper's Lemma 1: ε2 / (4·sqrt(M·ln(1/δ2))), for one party's M keys
    to be (ε2, δ2)-DP. The parties share the keys, so their sketches are not independent: the
    calibration the protocol uses is :func:`rayfed.clustering.fm_privacy.calibrate`."""
    return eps2 / (4.0 * math.sqrt(m * math.log(1.0 / delta2)))


def phantom_count(eps_prime: float) -> int:
    """n_p = ⌈1/(e^{ε'} - 1)⌉ phantom elements per sketch."""
    return math.ceil(1.0 / math.expm1(eps_prime))


def alpha_min(eps_prime: float, gamma: float) -> int:
    """α_min = ⌈log_{1+γ}(1/(1 - e^{-ε'}))⌉, the floor of every sketch value."""
    return math.ceil(-math.log(-math.expm1(-eps_prime)) / math.log1p(gamma))


def geometric_from_words(words: np.ndarray, gamma: float) -> np.ndarray:
    """Geometric(γ/(1+γ)) values ⌈-ln U / ln(1+γ)⌉ >= 1 from unsigned words, U = (w+1)/2^bits.

    32-bit words resolve the hash up to (1+γ)^-y = 2^-32: exact for sets far below 2^32 ids."""
    u = (words.astype(np.float64) + 1.0) * 2.0 ** -(8 * words.dtype.itemsize)
    return np.maximum(1, np.ceil(-np.log(u) / math.log1p(gamma))).astype(np.int64)


def phantom_max(n_p: int, gamma: float, shape, rng: np.random.Generator) -> np.ndarray:
    """The maximum of n_p fresh geometric values, drawn in one step by inverting its CDF
    (1 - (1+γ)^{-y})^{n_p}."""
    v = rng.random(shape)
    exp_max = -np.log(-np.expm1(np.log(v) / n_p))
    return np.maximum(1, np.ceil(exp_max / math.log1p(gamma))).astype(np.int64)


def cluster_max_hash(
    hash_words, ids: np.ndarray, labels: np.ndarray, k: int, m: int, gamma: float, chunk=512
) -> np.ndarray:
    """(M, k) max over each cluster's ids of the keyed geometric hash (0 for an empty cluster).

    ``hash_words(ids, M)`` returns (len(ids), M) unsigned words; the maximum of the hash is the hash
    of the minimum word, so the reduction runs on the words and converts once.
    """
    best = None
    for c in range(k):
        members = ids[labels == c]
        for a in range(0, members.size, chunk):
            low = hash_words(members[a : a + chunk], m).min(axis=0)
            if best is None:
                best = np.full((m, k), np.iinfo(low.dtype).max, dtype=low.dtype)
            np.minimum(best[:, c], low, out=best[:, c])
    if best is None:
        return np.zeros((m, k), dtype=np.int64)
    present = np.bincount(labels, minlength=k) > 0
    return np.where(present[None, :], geometric_from_words(best, gamma), 0)


def dp_sketch(
    real: np.ndarray, n_p: int, floor: int, gamma: float, rng: np.random.Generator
) -> np.ndarray:
    """DPFM on every entry: max(real hash max, phantom max, α_min)."""
    return np.maximum(np.maximum(real, phantom_max(n_p, gamma, real.shape, rng)), floor)


def dp_sketches(
    noise,
    labels: np.ndarray,
    *,
    round: int,
    k: int,
    hash_words,
    rows: np.ndarray,
    keys: int,
    phantoms: int,
    floor: int,
    gamma: float,
) -> np.ndarray:
    """DPFMPS-Gen (Alg. 3): the M x k DP FM sketches of the partition ``labels`` of the users
    named ``rows`` (hashed by ``hash_words``), the phantoms from the source's ``sketch`` stream
    (the algorithm of the protocol's sketch measurement: it registers nothing itself)."""
    real = cluster_max_hash(hash_words, rows, np.asarray(labels), k, keys, gamma)
    return dp_sketch(real, phantoms, floor, gamma, noise.generator("sketch", round))


# --- estimators ---------------------------------------------------------------------------------
def estimate(values: np.ndarray, gamma: float, estimator: str = "corrected") -> np.ndarray:
    """Cardinality of the set behind M sketch values (axis 0), with either estimator."""
    values = np.asarray(values, dtype=np.float64)
    m = values.shape[0]
    if estimator == "corrected":
        base = gamma / ((1.0 + gamma) * math.log1p(gamma))
        return base * m / np.exp(-values * math.log1p(gamma)).sum(axis=0)
    if estimator == "literal":
        return np.exp(m / (1.0 / values).sum(axis=0) * math.log1p(gamma))
    raise ValueError(f"unknown estimator {estimator!r}; one of {ESTIMATORS}")


def leave_one_out_max(a: np.ndarray) -> np.ndarray:
    """(M, k): entry (i, c) is max_{c' != c} a[i, c'] — the sketch of cluster c's complement."""
    m, k = a.shape
    if k == 1:
        return np.zeros_like(a)
    order = np.argsort(a, axis=1)
    top = np.take_along_axis(a, order[:, -1:], axis=1)
    second = np.take_along_axis(a, order[:, -2:-1], axis=1)
    return np.where(np.arange(k)[None, :] == order[:, -1:], second, top)


#: the uniform fallbacks of :func:`normalise` inside :func:`counting_fallbacks`, one per use
_FALLBACKS: contextvars.ContextVar[list[tuple[int, ...]] | None] = contextvars.ContextVar(
    "fm_uniform_fallbacks", default=None
)


@contextlib.contextmanager
def counting_fallbacks() -> Iterator[list[tuple[int, ...]]]:
    """Collect the shape of every table :func:`normalise` made uniform (no positive weight left)
    while the block runs, so that the run can say it (post-processing, never silent)."""
    seen: list[tuple[int, ...]] = []
    token = _FALLBACKS.set(seen)
    try:
        yield seen
    finally:
        _FALLBACKS.reset(token)


def _uniform(shape: tuple[int, ...], total: float) -> np.ndarray:
    seen = _FALLBACKS.get()
    if seen is not None:
        seen.append(tuple(shape))
    return np.full(shape, total / math.prod(shape))


def normalise(w: np.ndarray, total: float, projection: str = "clip") -> np.ndarray:
    """BasicEst line 13, "ensure Σw = n̂ and w >= 0" (spec §2.8).

    ``clip``: clip at 0 and rescale (uniform if nothing is left, counted by
    :func:`counting_fallbacks`) — the spec's default.
    ``simplex``: the Euclidean projection onto {w >= 0, Σw = n̂} (Duchi et al. 2008): subtracts one
    common shift before clipping, so the positive noise of empty cells is removed rather than
    rescaled — far less spurious mass (spec §2.8 names it as the alternative).
    """
    w = np.asarray(w, dtype=np.float64)
    if projection == "simplex":
        v = w.reshape(-1)
        u = np.sort(v)[::-1]
        excess = np.cumsum(u) - total
        rank = np.arange(1, v.size + 1)
        kept = np.flatnonzero(u - excess / rank > 0)
        if kept.size == 0:  # (only from non-finite cells: noise at a tiny ε) uniform, as clip
            return _uniform(w.shape, total)
        last = kept[-1]
        return np.maximum(w - excess[last] / (last + 1), 0.0)
    if projection != "clip":
        raise ValueError(f"unknown projection {projection!r}; one of {PROJECTIONS}")
    w = np.maximum(w, 0.0)
    s = w.sum()
    return w * (total / s) if s > 0 else _uniform(w.shape, total)


def raw_intersections(
    n_hat: float,
    sketches: list[np.ndarray],
    n_p: int,
    gamma: float,
    estimator: str = "corrected",
    max_bytes: int = 64 << 20,
) -> np.ndarray:
    """BasicEst before line 13: n̂ minus the estimated union of each cell's complements, less the
    s(k'-1) merged phantom sets. Shape (k',)*s; unbiased for the corrected estimator, may be < 0."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; one of {ESTIMATORS}")
    s, (m, k) = len(sketches), sketches[0].shape
    if k == 1:
        return np.full((1,) * s, float(n_hat))
    loo = [leave_one_out_max(a).astype(np.float64) for a in sketches]
    chunk = max(1, max_bytes // (8 * k**s))
    log_base = math.log1p(gamma)
    acc = np.zeros((k,) * s)
    for a in range(0, m, chunk):
        u = np.zeros((min(chunk, m - a),) + (k,) * s)
        for ell, lo in enumerate(loo):
            shape = [u.shape[0]] + [k if j == ell else 1 for j in range(s)]
            np.maximum(u, lo[a : a + chunk].reshape(shape), out=u)
        acc += (np.exp(-u * log_base) if estimator == "corrected" else 1.0 / u).sum(axis=0)
    if estimator == "corrected":
        union = gamma / ((1.0 + gamma) * log_base) * m / acc
    else:
        union = np.exp(m / acc * log_base)
    return n_hat - (union - s * (k - 1) * n_p)


def basic_est(
    n_hat: float,
    sketches: list[np.ndarray],
    n_p: int,
    gamma: float,
    estimator: str = "corrected",
    projection: str = "clip",
) -> np.ndarray:
    """DPFMPS-BasicEst (Alg. 4): weights of the k'^s grid, shape (k',)*s, summing to n̂."""
    raw = raw_intersections(n_hat, sketches, n_p, gamma, estimator)
    return normalise(raw, n_hat, projection)


def theorem6_sd(n: float, true: np.ndarray, m: int, s: int, k: int, rho: float, phantoms: int):
    """Theorem 6's sd of a cell estimate, ρ(n - w*)/√M + ρ·s·(k'-1)·n_p/√M: the set's own spread
    and that of the s(k'-1) merged phantom sets. The paper writes the second term as
    4ρ·s·(k'-1)·sqrt(ln 1/δ)/ε2, which is this with Lemma 1's n_p ≈ 1/ε' = 4·sqrt(M ln 1/δ)/ε2."""
    return rho * (n - true) / math.sqrt(m) + rho * s * (k - 1) * phantoms / math.sqrt(m)


def marginal(w: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
    """The pair table Σ w over every axis but ``axes`` (kept in that order)."""
    other = tuple(j for j in range(w.ndim) if j not in axes)
    table = w.sum(axis=other)
    return table if axes[0] < axes[1] else table.T


def independence_grid(n_hat: float, singles: list[np.ndarray]) -> np.ndarray:
    """w(a1..aS) = n̂ · Π_ℓ (f_ℓ[a_ℓ] / n̂), with every f clipped at 0."""
    w = np.array(float(n_hat))
    for f in singles:
        w = np.multiply.outer(w, np.maximum(f, 0.0) / n_hat)
    return w


def refine_pairwise(
    w: np.ndarray,
    pairs: dict[tuple[int, int], np.ndarray],
    n_hat: float,
    rng: np.random.Generator,
    iterations: int = 3000,
    tolerance: float = 1.0,
    projection: str = "clip",
) -> tuple[np.ndarray, int]:
    """The 2PEst update (Alg. 5) with the spec's per-step clipping: pick a random pair, spread the
    gap between the grid's pair marginal and the estimated pair table evenly over the cells
    (η = 1), clip at 0. Stops after ``iterations`` or once every pair is within ``tolerance``.
    Returns (grid normalised to n̂, iterations run)."""
    keys = sorted(pairs)
    s, k = w.ndim, w.shape[0]
    spread = float(k ** (s - 2))
    w = w.copy()
    worst = {key: math.inf for key in keys}
    t = 0
    while t < iterations:
        t += 1
        l1, l2 = keys[int(rng.integers(len(keys)))]
        delta = marginal(w, (l1, l2)) - pairs[(l1, l2)]
        worst[(l1, l2)] = float(np.abs(delta).max())
        shape = [k if j in (l1, l2) else 1 for j in range(s)]
        w -= (delta / spread).reshape(shape)
        np.maximum(w, 0.0, out=w)
        if max(worst.values()) < tolerance:
            break
    return normalise(w, n_hat, projection), t


def two_pass_est(
    n_hat: float,
    sketches: list[np.ndarray],
    n_p: int,
    gamma: float,
    rng: np.random.Generator,
    estimator: str = "corrected",
    iterations: int = 3000,
    tolerance: float = 1.0,
    projection: str = "clip",
) -> tuple[np.ndarray, int]:
    """DPFMPS-2PEst (Alg. 5): independence init from single-cluster sizes, then fit to the
    pairwise BasicEst tables. At S = 2 it is BasicEst itself."""
    if len(sketches) == 2:
        return basic_est(n_hat, sketches, n_p, gamma, estimator, projection), 0
    singles = [estimate(a, gamma, estimator) - n_p for a in sketches]
    pairs = {
        (i, j): basic_est(n_hat, [sketches[i], sketches[j]], n_p, gamma, estimator, projection)
        for i, j in itertools.combinations(range(len(sketches)), 2)
    }
    w = independence_grid(n_hat, singles)
    return refine_pairwise(w, pairs, n_hat, rng, iterations, tolerance, projection)


# --- the baselines' weights -----------------------------------------------------------------------
def exact_grid(labels: list[np.ndarray], k: int) -> np.ndarray:
    """w*(a1..aS) = |∩_ℓ M^(ℓ)_{a_ℓ}| from every user's local labels (non-private)."""
    flat = np.ravel_multi_index(tuple(labels), (k,) * len(labels))
    return np.bincount(flat, minlength=k ** len(labels)).reshape((k,) * len(labels)).astype(float)


def ldp_probabilities(eps: float, k: int) -> tuple[str, int, float, float]:
    """(oracle, g, p, q): GRR when k <= 3e^ε + 2, else OLH with g = ⌊e^ε + 1⌋ (as the paper
    writes it). p, q are the probabilities that a report supports the true and a wrong label."""
    e = math.exp(eps)
    if k <= 3 * e + 2:
        return "grr", k, e / (e + k - 1), 1.0 / (e + k - 1)
    g = math.floor(e + 1)
    return "olh", g, e / (e + g - 1), 1.0 / g


def unbias_axis(y: np.ndarray, p: float, q: float, axis: int) -> np.ndarray:
    """Apply P1^{-1}, P1 = (p - q)I + q·11ᵀ, along one axis of a support-count array."""
    k = y.shape[axis]
    total = y.sum(axis=axis, keepdims=True)
    return (y - q * total / (p - q + k * q)) / (p - q)


def ldp_two_pass(
    supports: list[np.ndarray],
    p: float,
    q: float,
    n: float,
    rng: np.random.Generator,
    iterations: int = 3000,
    tolerance: float = 1.0,
    projection: str = "clip",
) -> tuple[np.ndarray, int]:
    """LDP-AGG-2PEst: pair tables (P1⊗P1)^{-1} ŵ and singles P1^{-1} ŵ from the users' support
    matrices (n x k' booleans per party), then the 2PEst fit (or the one table at S = 2)."""
    mats = [b.astype(np.float64) for b in supports]
    pairs = {}
    for i, j in itertools.combinations(range(len(mats)), 2):
        table = mats[i].T @ mats[j]
        pairs[(i, j)] = normalise(unbias_axis(unbias_axis(table, p, q, 0), p, q, 1), n, projection)
    if len(mats) == 2:
        return pairs[(0, 1)], 0
    singles = [unbias_axis(b.sum(axis=0), p, q, 0) for b in mats]
    w = independence_grid(n, singles)
    return refine_pairwise(w, pairs, n, rng, iterations, tolerance, projection)


# --- choosing k' --------------------------------------------------------------------------------
#: Table 5.1 of the thesis: automatically chosen k' by (n, S), for ε = 0.5, 1, 2, 3, 4.
K_PRIME_TABLE = {
    (20000, 2): (4, 5, 5, 6, 6),
    (60000, 2): (5, 6, 6, 7, 7),
    (100000, 2): (6, 6, 7, 7, 7),
    (20000, 4): (4, 4, 5, 5, 5),
    (60000, 4): (4, 5, 6, 6, 6),
    (100000, 4): (5, 6, 6, 7, 7),
}
K_PRIME_TABLE_EPS = (0.5, 1.0, 2.0, 3.0, 4.0)
RHO_LANG = 0.649  # the FM estimator's relative sd constant the paper takes from Lang (2017)


def k_prime_formula(
    n_hat: float, k: int, parties: int, eps2: float, delta: float, m: int, rho: float = RHO_LANG
) -> int:
    """§2.10: k' = max(k0, ⌈k^{1/S}⌉), k0 the smallest integer with 2σ >= n̂/k0²,
    σ = ρ(n̂ - n̂/k0²)/√M + 4ρ·s·(k0-1)·sqrt(ln 1/δ)/ε2, s = 2."""
    floor = math.ceil(k ** (1.0 / parties) - 1e-9)
    for k0 in range(1, 10_000):
        sigma = (
            rho * (n_hat - n_hat / k0**2) / math.sqrt(m)
            + 4 * rho * 2 * (k0 - 1) * math.sqrt(math.log(1.0 / delta)) / eps2
        )
        if 2 * sigma >= n_hat / k0**2:
            return max(k0, floor)
    return max(10_000, floor)


def k_prime_from_table(n_hat: float, parties: int, epsilon: float) -> int | None:
    """Table 5.1's k' for the row within 2 % of n̂, or None if the table has no such cell."""
    for (n, s), row in K_PRIME_TABLE.items():
        if s == parties and abs(n_hat - n) <= 0.02 * n:
            for eps, kp in zip(K_PRIME_TABLE_EPS, row, strict=True):
                if math.isclose(epsilon, eps):
                    return kp
    return None
