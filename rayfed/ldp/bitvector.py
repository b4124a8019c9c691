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
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

from rayfed.clustering import squared_distances
from rayfed.privacy.mechanisms import rr_keep_probability

ROW_BLOCK = 2048  # rows of the distance matrix estimated at a time
PAIR_BLOCK = 16384  # record pairs encoded or decoded at a time (vertical decomposition)
CONSISTENCE_ROWS = 1024  # Algorithm 1: rows of the matrix searched at a time
FIRST_CHUNK, LAST_CHUNK = 32, 1024  # Algorithm 1: candidate j scanned in chunks of growing size
HIT_ROWS = 64  # Algorithm 1: rows whose resolved pairs are indexed at a time
HIT_BATCH = 1 << 24  # Algorithm 1: (pair, candidate j) booleans compared at a time (16 MiB)
# Algorithm 1's memory on the collector, in bytes per record pair: the combined float32 matrix (4),
# one attribute's float32 matrix, chained in place (4), its set-flags (1), the flags a pass adds
# (1/8, packed) and the row-block buffers (O(CONSISTENCE_ROWS x n)): measured at n = 20,000, 2
# bytes a pair above the attribute's matrix (benchmarks/results/ldp_bitvector_consistence.json)
CONSISTENCE_BYTES_PER_PAIR = 10


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


# --- the codes as a release's input: their domain, and sources encoded a block at a time ---------
@dataclass(frozen=True)
class Codes:
    """The domain of the BV codes one unit contributes to a release (a record's attribute codes,
    or the pair codes one of Bob's records enters): ``reach[c]`` is how many of the s = ``bits``
    bits of its c-th code can differ between any two values of that code's range [low, high]
    (:func:`max_differing_bits` of its anchors). Replacing the unit changes each of its codes
    within its reach, so the ℓ0 sensitivity (bits) is Σ reach; adding or removing it adds or
    removes every bit of its codes. A domain for :class:`rayfed.privacy.Measurement` (radius,
    diameter, describe)."""

    bits: int
    reach: tuple[int, ...]
    low: float
    high: float
    what: str = "attribute"

    @staticmethod
    def of(
        anchors: np.ndarray, t: float, low: float, high: float, *, copies: int = 1, what: str
    ) -> Codes:
        """The codes of values in [low, high] under ``anchors`` (one row per code), each code
        entered ``copies`` times by one unit."""
        anchors = np.atleast_2d(anchors)
        reach = tuple(max_differing_bits(r, t, low, high) for r in anchors) * copies
        return Codes(int(anchors.shape[1]), reach, float(low), float(high), what)

    def _norm(self, count: int, p: int) -> float:
        if p not in (0, 1, 2):
            raise ValueError(f"a sensitivity is in the ℓ0, ℓ1 or ℓ2 norm, got ℓ{p}")
        return math.sqrt(count) if p == 2 else float(count)

    def radius(self, p: int) -> float:
        return self._norm(self.bits * len(self.reach), p)

    def diameter(self, p: int) -> float:
        return self._norm(sum(self.reach), p)

    def describe(self) -> str:
        most = max(self.reach)
        return (
            f"{len(self.reach):,} BV code(s) of {self.bits} bits ({self.what}) of values in "
            f"[{self.low:g}, {self.high:g}], each differing in at most {most} bits"
        )


class RecordCodes:
    """The BV codes of a custodian's records (``x``: n x d values on [L, U]; ``anchors``: d x s),
    encoded an attribute at a time when drawn, so only one attribute's n x s bits exist at once;
    the coins of record i's attribute j are keyed by ``keys[j, i]``. As an array (the
    sensitivity check's view of the release's input) it is every bit, n x d x s."""

    def __init__(self, x: np.ndarray, anchors: np.ndarray, t: float, keys: np.ndarray):
        self.x, self.anchors, self.t, self.keys = x, anchors, t, keys

    def blocks(self):
        """(coin keys, n x s bits) of one attribute at a time."""
        for j in range(self.x.shape[1]):
            yield self.keys[j], encode(self.x[:, j], self.anchors[j], self.t)

    @staticmethod
    def pack(blocks) -> np.ndarray:
        """(d, n, ⌈s/8⌉) packed codes from the blocks' bits."""
        return np.stack([np.packbits(bits, axis=1) for bits in blocks])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.stack([bits for _, bits in self.blocks()], axis=1)
        return out if dtype is None else out.astype(dtype)


class PairCodes:
    """Bob's pair codes (decomposition): the BV codes of u and v of every record pair (triu
    order) under one anchor vector, encoded ``PAIR_BLOCK`` pairs at a time; the coins of pair k's
    u and v codes are keyed by 2k and 2k + 1. As an array it is every bit, pairs x 2 x s."""

    def __init__(self, u: np.ndarray, v: np.ndarray, anchors: np.ndarray, t: float):
        self.u, self.v, self.anchors, self.t = u, v, anchors, t

    def blocks(self):
        """(coin keys, 2·block x s bits): a block's u codes, then its v codes."""
        for a in range(0, self.u.size, PAIR_BLOCK):
            both = np.concatenate([self.u[a : a + PAIR_BLOCK], self.v[a : a + PAIR_BLOCK]])
            ids = np.arange(a, a + both.size // 2, dtype=np.uint64)
            yield (
                np.concatenate([2 * ids, 2 * ids + np.uint64(1)]),
                encode(both, self.anchors, self.t),
            )

    def pack(self, blocks) -> np.ndarray:
        """(2, pairs, ⌈s/8⌉) packed codes: u's, then v's."""
        size = (self.anchors.size + 7) // 8
        parts = [np.packbits(bits, axis=1).reshape(2, -1, size) for bits in blocks]
        return np.concatenate(parts, axis=1) if parts else np.zeros((2, 0, size), np.uint8)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        s = self.anchors.size
        parts = [bits.reshape(2, -1, s) for _, bits in self.blocks()]
        out = np.concatenate(parts, axis=1).transpose(1, 0, 2) if parts else np.zeros((0, 2, s))
        return out if dtype is None else out.astype(dtype)


def pair_range(x_low: float, x_high: float, dims: int) -> tuple[float, float]:
    """[lo, top]: where u = ‖a‖² + ‖b‖² and v = 2a·b of two records with ``dims`` values in
    [x_low, x_high] lie. top = 2·dims·max(x_low², x_high²) bounds both; v is negative only when
    x_low < 0 < x_high (then down to 2·dims·x_low·x_high); else lo = 0."""
    top = 2 * dims * max(abs(x_low), abs(x_high)) ** 2
    lo = 2 * dims * x_low * x_high if x_low < 0 < x_high else 0.0
    return lo, top


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
    changes; pairs never reached keep their raw estimate. Returns a new matrix (see
    ``consistence_in_place``)."""
    d = d.astype(np.result_type(d.dtype, np.inf), copy=True)  # as ∞-padding it would: ints -> float
    consistence_in_place(d, radius, max_iter)
    return d


def consistence_in_place(d: np.ndarray, radius: float, max_iter: int = 50) -> int:
    """Algorithm 1 on ``d`` itself (a floating n x n matrix); returns the passes that set a pair.

    One boolean matrix ``known`` marks the pairs set before the current pass; a pass writes its
    chained sums only where ``known`` is False and reads only where it is True, so ``d`` can hold
    both the raw estimates of the unset pairs and the values set so far. Each pass searches a block
    of rows at a time, the candidates j in ascending chunks: one 0/1 matrix product per chunk says
    which unset (i, k) have a j in it with both hops known (float32 counts <= the chunk size are
    exact), the first such j is taken within the chunk, and resolved pairs leave the search. On
    1-D data most pairs find their first j in the first chunks; a pair no chain reaches in this
    pass costs a scan over all j, so a pass is at most one n x n x n product."""
    if not np.issubdtype(d.dtype, np.floating):
        raise TypeError(f"Algorithm 1 chains in place: d must be floating, got {d.dtype}")
    n = d.shape[0]
    with np.errstate(invalid="ignore"):
        known = d <= radius
    np.fill_diagonal(known, True)
    known &= np.isfinite(d)  # a NaN or -∞ estimate is never a hop (∞-padding leaves it unset)
    order = _row_order(known)
    passes = 0
    for _ in range(max_iter):
        if known.all():
            break
        added = np.zeros((n, (n + 7) // 8), dtype=np.uint8)  # this pass's new pairs, packed
        grown = 0
        for a in range(0, n, CONSISTENCE_ROWS):
            rows = order[a : a + CONSISTENCE_ROWS]
            new = _chain_rows(d, known, rows)
            grown += int(np.count_nonzero(new))
            added[rows] = np.packbits(new, axis=1)
        if not grown:
            break
        passes += 1
        for a in range(0, n, CONSISTENCE_ROWS):
            rows = slice(a, min(n, a + CONSISTENCE_ROWS))
            known[rows] |= np.unpackbits(added[rows], axis=1, count=n).view(bool)
    return passes


def _row_order(known: np.ndarray) -> np.ndarray:
    """Rows by breadth-first layer of the local graph, from a far end of each component (the
    last layer of a first sweep). On 1-D data the layers are slices of the line, so a block of
    consecutive rows has its unset pairs in a few columns; the order changes no result (j is
    still searched by index), only how many columns a block must scan."""
    n = len(known)
    layer = np.full(n, -1)
    while (layer < 0).any():
        free = layer < 0
        far = _layers(known, int(np.argmax(free)), free).argmax()
        reached = _layers(known, int(far), free)
        placed = reached >= 0
        layer[placed] = layer.max() + 1 + reached[placed]
    return np.argsort(layer, kind="stable")


def _layers(known: np.ndarray, start: int, free: np.ndarray) -> np.ndarray:
    """Breadth-first layer of every free record reached from ``start`` (-1: not reached)."""
    layer = np.full(len(known), -1)
    seen = ~free
    frontier, depth = np.array([start]), 0
    while frontier.size:
        layer[frontier] = depth
        seen[frontier] = True
        reach = np.zeros(len(known), dtype=bool)
        for a in range(0, frontier.size, CONSISTENCE_ROWS):
            reach |= known[frontier[a : a + CONSISTENCE_ROWS]].any(axis=0)
        frontier, depth = np.flatnonzero(reach & ~seen), depth + 1
    return layer


def _chain_rows(d: np.ndarray, known: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One pass of Algorithm 1 over a block of rows: writes d[i, k] = d[i, j] + d[j, k] for every
    unset (i, k) of the block with a first j; returns the block's newly set pairs (booleans)."""
    n = d.shape[0]
    new = np.zeros((rows.size, n), dtype=bool)
    todo = ~known[rows]  # unset pairs of the block not yet given a j in this pass
    live_rows = np.flatnonzero(todo.any(axis=1))
    live_cols = np.flatnonzero(todo.any(axis=0))
    todo = todo[np.ix_(live_rows, live_cols)]
    left = known[rows][live_rows]  # first hops (i, j) of the live rows
    start, size = 0, FIRST_CHUNK
    while start < n and todo.size:
        stop = min(n, start + size)
        right = known[start:stop][:, live_cols]  # second hops (j, k)
        count = left[:, start:stop].astype(np.float32) @ right.astype(np.float32)
        hit = count > 0.5
        del count
        hit &= todo
        for r0 in range(0, hit.shape[0], HIT_ROWS):  # a few rows at a time: small index arrays
            ii, kk = np.nonzero(hit[r0 : r0 + HIT_ROWS])
            ii += r0
            j = _first_j(left[:, start:stop], right, ii, kk) + start
            i, k = rows[live_rows[ii]], live_cols[kk]
            total = d[i, j] + d[j, k]
            ok = np.isfinite(total)  # an overflowing sum leaves the pair unset, as a raw ∞ would
            d[i[ok], k[ok]] = total[ok]
            new[live_rows[ii[ok]], k[ok]] = True
        todo ^= hit  # hit is a subset of todo
        keep_r, keep_c = todo.any(axis=1), todo.any(axis=0)
        if keep_r.mean() < 0.9 or keep_c.mean() < 0.9:  # shrink the search to what is left
            todo = todo[np.ix_(keep_r, keep_c)]
            live_rows, live_cols, left = live_rows[keep_r], live_cols[keep_c], left[keep_r]
        start, size = stop, min(2 * size, LAST_CHUNK)
    return new


def _first_j(left: np.ndarray, right: np.ndarray, ii: np.ndarray, kk: np.ndarray) -> np.ndarray:
    """For each hit pair (ii, kk), the first j of the chunk with both hops known — compared in
    batches of at most HIT_BATCH booleans, so a chunk with millions of hits stays small."""
    step = max(1, HIT_BATCH // left.shape[1])
    j = np.empty(ii.size, dtype=np.intp)
    for a in range(0, ii.size, step):
        batch = slice(a, a + step)
        j[batch] = (left[ii[batch]] & right[:, kk[batch]].T).argmax(axis=1)
    return j


def exact_distances(x: np.ndarray) -> np.ndarray:
    """n x n Euclidean distances (float32): the non-private comparator."""
    return np.sqrt(squared_distances(x, x)).astype(np.float32)


def distance_matrix(
    blocks: list[np.ndarray], s: int, mu: float, eps: float | None, consistence: float | None
) -> np.ndarray:
    """n x n combined distance (Eq. 19): sqrt(Σ_attributes d̂²) from per-attribute bit matrices,
    built in row blocks (float32) so only the matrix itself is n² sized — with ``consistence``,
    also one attribute's matrix and its flags (``CONSISTENCE_BYTES_PER_PAIR`` bytes a pair in
    all), since Algorithm 1 needs the whole per-attribute matrix."""
    n = blocks[0].shape[0]
    out = np.zeros((n, n), dtype=np.float32)
    for bits in blocks:
        one = None  # the attribute's whole matrix, for Algorithm 1 (freed before the next one)
        for a in range(0, n, ROW_BLOCK):
            d = debias(hamming(bits[a : a + ROW_BLOCK], bits), s, mu, eps)
            if consistence is None:
                out[a : a + ROW_BLOCK] += (d**2).astype(np.float32)
                continue
            if one is None:
                one = np.empty((n, n), dtype=d.dtype)
            one[a : a + ROW_BLOCK] = d
        if one is not None:
            consistence_in_place(one, consistence)
            for a in range(0, n, ROW_BLOCK):
                out[a : a + ROW_BLOCK] += (one[a : a + ROW_BLOCK] ** 2).astype(np.float32)
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
    bits (x = L and x = U have complementary codes). Coverage is decided by the encoder itself:
    its bit is set at both ends (then at every x in between, since the rounding of x - r is
    monotone in x); testing r - t <= L and r + t >= U instead rounds differently and can call an
    anchor at U - t (to within an ulp) covering while L and U get different bits."""
    covers = encode(np.array([low, high], dtype=float), np.asarray(r, dtype=float), t).all(axis=0)
    return int(np.count_nonzero(~covers))
