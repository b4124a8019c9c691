"""t-out-of-n Shamir secret sharing of 32-byte secrets over GF(p), vectorised over many secrets.

The field is the Mersenne prime p = 2^31 - 1, so share x-coordinates (user ids + 1: non-zero,
distinct, < p) allow up to p - 2 = 2,147,483,645 users. A 32-byte secret is split into 9 chunks
of 30 bits (270 >= 256 bits), each shared with its own random polynomial of degree t - 1; a share
is 9 words that each fit a uint32 (the encrypted plaintext of a key share and a self-mask share is
72 bytes).

Why this field (``benchmarks/shamir_field.py`` measures it against the former p = 2^20 + 7, which
stopped at 1,048,581 users, in ``benchmarks/results/shamir_field.json``):

- Products of two elements are below 2^62, so every scalar product is exact in int64 and is
  reduced with shifts (x mod p = (x & p) + (x >> 31), twice, then one conditional subtraction)
  instead of a division.
- Polynomial evaluation stays a float64 BLAS product. It is kept exact with both operands as
  balanced residues in [-(p - 1)/2, (p - 1)/2] and the coefficient operand split into 2 signed
  limbs of 16 bits (lo in [-2^15, 2^15), hi = (b - lo) / 2^16): a product is below 2^45 in
  magnitude and a block of 2^8 terms sums below 2^53. The limbs are two columns of the same product
  (9 · 2 = 18 columns where the old field had 13; 3 unsigned limbs of 11 bits took 27 and were
  10-25 % slower), the blocks are summed in int64 and the two partial results recombined with a
  shift and reduced with shifts, where the old field used ``np.fmod`` on floats, which costs
  ~70-100 ns per element against ~5 ns.
- The powers x^0 .. x^(t-1) are computed once per distinct point (the neighbour sets of a cohort's
  users overlap heavily) and gathered, rather than once per (user, neighbour).
- Measured on 2 cores (CPU seconds): split and reconstruct at SecAgg+'s shapes for n = 10^3 ..
  10^5 take 0.4-0.6x the old field's time (measured with 3 limbs; 2 are 10-20 % faster again);
  the complete graph's split at n = 10^3 (t = 699), where the BLAS flops dominate, takes 0.8x
  (1.1x with 3 limbs).
- 2^61 - 1 would need more limbs per product and 8-byte shares for no gain below 2^31 users; a field
  chosen from n would carry two code paths for a speed the single field already matches.

Random coefficients are drawn from two 64-bit words each, (w1 · 2^64 + w2) mod p, so their
distance from uniform is below 2^-97 (one word mod p would be 2^-33).
"""

from __future__ import annotations

import numpy as np

P = (1 << 31) - 1
MERSENNE_BITS = 31
CHUNK_BITS = 30
CHUNKS = 9  # ceil(256 / 30)
SECRET_BYTES = 32
#: uint64 words of randomness per coefficient row (two words per chunk: see the module docstring)
COEF_WORDS = 2 * CHUNKS
HALF = P >> 1  # balanced residues lie in [-HALF, HALF]
LIMB_BITS = 16  # b = lo + hi · 2^16 with lo in [-2^15, 2^15), |hi| <= 2^14 + 1
#: terms per float64 block: |a| <= 2^30 - 1 times |limb| <= 2^15 is below 2^45, 2^8 terms below 2^53
_BLOCK = 1 << (53 - (MERSENNE_BITS - 1) - (LIMB_BITS - 1))
_REDUCE_EVERY = 128  # blocks summed in int64 between reductions: |sum| <= 2^7 · 2^53 = 2^60
MAX_USERS = P - 2


def _red(v: np.ndarray) -> np.ndarray:
    """v mod p for non-negative int64 or any uint64 v: two Mersenne folds leave at most p + 4,
    then one conditional subtraction."""
    r = v >> MERSENNE_BITS
    r += v & P
    hi = r >> MERSENNE_BITS
    r &= P
    r += hi
    np.subtract(r, P, out=r, where=r >= P)
    return r


def secret_to_chunks(secrets: np.ndarray) -> np.ndarray:
    """(S, 32) uint8 → (S, 9) int64 chunks of 30 bits (big-endian bit order)."""
    bits = np.unpackbits(np.asarray(secrets, dtype=np.uint8), axis=1)  # (S, 256)
    padded = np.concatenate(
        [np.zeros((bits.shape[0], CHUNKS * CHUNK_BITS - 256), np.uint8), bits], axis=1
    )
    weights = 1 << np.arange(CHUNK_BITS - 1, -1, -1, dtype=np.int64)
    return padded.reshape(-1, CHUNKS, CHUNK_BITS).astype(np.int64) @ weights


def chunks_to_secret(chunks: np.ndarray) -> np.ndarray:
    """Inverse of :func:`secret_to_chunks`; ValueError if a chunk is not a 30-bit value."""
    chunks = np.asarray(chunks, dtype=np.int64)
    if chunks.size and (chunks.min() < 0 or chunks.max() >= 1 << CHUNK_BITS):
        raise ValueError("reconstructed chunk out of range: shares are inconsistent")
    shifts = np.arange(CHUNK_BITS - 1, -1, -1, dtype=np.int64)
    bits = ((chunks[:, :, None] >> shifts) & 1).astype(np.uint8).reshape(chunks.shape[0], -1)
    if bits[:, : CHUNKS * CHUNK_BITS - 256].any():
        raise ValueError("reconstructed secret exceeds 256 bits: shares are inconsistent")
    return np.packbits(bits[:, CHUNKS * CHUNK_BITS - 256 :], axis=1)


def _powers(x: np.ndarray, t: int, dtype=np.int64) -> np.ndarray:
    """x^0 .. x^(t-1) mod p along a new last axis (x in [0, p)), computed once per distinct value
    of x and gathered."""
    x = np.asarray(x, dtype=np.int64)
    uniq, where = np.unique(x, return_inverse=True)
    table = np.empty((t, len(uniq)), dtype=np.int64)
    table[0] = 1
    for k in range(1, t):
        table[k] = _red(table[k - 1] * uniq)
    return np.ascontiguousarray(table.T, dtype=dtype)[where.reshape(x.shape)]


def _coefficients(words: np.ndarray) -> np.ndarray:
    """(..., 2 · C) uint64 words → (..., C) uniform elements: (w1 · 2^64 + w2) mod p for each pair
    (w1, w2), where 2^64 ≡ 2^(64 mod 31) = 4 (mod p)."""
    words = np.asarray(words, dtype=np.uint64)
    return _red(_red(words[..., 0::2]) * np.uint64(4) + _red(words[..., 1::2])).astype(np.int64)


def _signed_red(v: np.ndarray) -> np.ndarray:
    """v mod p for int64 v with |v| < 2^62 - 2^31 (shifted by P · 2^31 ≡ 0 to non-negative)."""
    v += P << MERSENNE_BITS
    return _red(v)


def _matmul_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(…, M, K) @ (…, K, C) mod p for elements in [0, p), exact: both operands as balanced residues
    in [-HALF, HALF], ``b`` split into 2 signed limbs of 16 bits side by side (…, K, 2C), float64
    BLAS in blocks of 2^8 terms (each sum below 2^53 in magnitude), the blocks summed in int64, the
    limbs recombined with a shift."""
    b = np.asarray(b, dtype=np.int64)
    c = b.shape[-1]
    b = b - P * (b > HALF)
    half_limb = 1 << (LIMB_BITS - 1)
    lo = ((b + half_limb) & ((1 << LIMB_BITS) - 1)) - half_limb
    limbs = np.concatenate([lo, (b - lo) >> LIMB_BITS], axis=-1).astype(np.float64)
    a = np.asarray(a, dtype=np.float64)
    a = a - P * (a > HALF)
    k = a.shape[-1]
    acc = None
    for n, s in enumerate(range(0, k, _BLOCK)):
        part = np.matmul(a[..., s : s + _BLOCK], limbs[..., s : s + _BLOCK, :]).astype(np.int64)
        if acc is None:
            acc = part
            continue
        acc += part
        if n % _REDUCE_EVERY == _REDUCE_EVERY - 1:
            acc = _signed_red(acc)  # [0, p): below 2^31 + 2^60 until the next
    out = _signed_red(acc[..., c:])  # hi in [0, p)
    out <<= LIMB_BITS  # < 2^47
    out += acc[..., :c]  # |lo| < 2^60 + 2^47
    return _signed_red(out)


def split(secrets: np.ndarray, points: np.ndarray, t: int, coef_words: np.ndarray) -> np.ndarray:
    """Shares of each secret at its points.

    Parameters
    ----------
    secrets:
        (S, 32) uint8.
    points:
        (K,) int — the same x-coordinates for every secret — or (S, K); each in [1, p)
        (ValueError for a point ≡ 0 mod p).
    t:
        Threshold: any t shares reconstruct, fewer reveal nothing.
    coef_words:
        (S, t - 1, COEF_WORDS) uint64 random words for the non-constant coefficients, two per
        chunk (see the module docstring).

    Returns
    -------
    (S, K, 9) int64 shares.
    """
    secrets = np.asarray(secrets, dtype=np.uint8)
    coefs = np.empty((secrets.shape[0], t, CHUNKS), dtype=np.int64)
    coefs[:, 0] = secret_to_chunks(secrets)
    if t > 1:
        coefs[:, 1:] = _coefficients(coef_words)
    points = np.mod(np.asarray(points, dtype=np.int64), P)
    if not points.all():
        raise ValueError("share points must be non-zero mod p: a share at 0 is the secret itself")
    if points.ndim == 1:  # one Vandermonde matrix for all secrets: a single large product
        vander = _powers(points, t, np.float64)  # (K, t)
        flat = coefs.transpose(1, 0, 2).reshape(t, -1)  # (t, S*9)
        return (
            _matmul_mod(vander, flat)
            .reshape(len(points), secrets.shape[0], CHUNKS)
            .transpose(1, 0, 2)
        )
    out = np.empty((*points.shape, CHUNKS), dtype=np.int64)
    step = max(1, (1 << 22) // max(1, points.shape[1] * t))
    for s in range(0, points.shape[0], step):
        vander = _powers(points[s : s + step], t, np.float64)
        out[s : s + step] = _matmul_mod(vander, coefs[s : s + step])
    return out


def _pow_p_minus_2(a: np.ndarray) -> np.ndarray:
    """a^(p - 2) = 1/a mod p for a in [1, p), by an addition chain on 2^31 - 3 = (2^29 - 1)·4 + 1
    (30 squarings, 8 multiplications where binary exponentiation takes 60 steps)."""

    def sq(x: np.ndarray, times: int) -> np.ndarray:
        for _ in range(times):
            x = _red(x * x)
        return x

    a = np.asarray(a, dtype=np.int64)
    e2 = _red(sq(a, 1) * a)  # a^(2^2 - 1)
    e4 = _red(sq(e2, 2) * e2)
    e8 = _red(sq(e4, 4) * e4)
    e16 = _red(sq(e8, 8) * e8)
    e24 = _red(sq(e16, 8) * e8)
    e28 = _red(sq(e24, 4) * e4)
    e29 = _red(sq(e28, 1) * a)
    return _red(sq(e29, 2) * a)


def _inverse(a: np.ndarray) -> np.ndarray:
    """Inverses mod p of (S, t) non-zero elements in [1, p): one exponentiation per row and 3t
    multiplications (Montgomery's batch inversion along the rows)."""
    a = np.ascontiguousarray(np.asarray(a, dtype=np.int64).T)  # (t, S)
    pre = np.empty_like(a)
    pre[0] = a[0]
    for j in range(1, len(a)):
        pre[j] = _red(pre[j - 1] * a[j])
    inv = _pow_p_minus_2(pre[-1])  # 1 / (a_0 … a_{t-1})
    out = np.empty_like(a)
    for j in range(len(a) - 1, 0, -1):
        out[j] = _red(inv * pre[j - 1])
        inv = _red(inv * a[j])
    out[0] = inv
    return out.T


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """(S, t) distinct non-zero points → (S, t) Lagrange coefficients λ_j = Π_{m≠j} x_m / (x_m - x_j),
    computed as (Π_m x_m) / (x_j · Π_{m≠j} (x_m - x_j)). ValueError for a point ≡ 0 or two equal
    points mod p (a denominator 0, whose inverse would silently be 0)."""
    xs = np.mod(np.asarray(xs, dtype=np.int64), P)
    if not xs.all():
        raise ValueError("Lagrange points must be non-zero mod p")
    total = np.ones(xs.shape[0], dtype=np.int64)
    den = xs.copy()
    for m in range(xs.shape[1]):
        xm = xs[:, m : m + 1]
        total = _red(total * xm[:, 0])
        diff = xm - xs
        diff += (diff >> 63) & P  # x_m - x_j mod p, both in [0, p)
        diff[:, m] = 1
        diff *= den
        den = _red(diff)
    if not den.all():
        raise ValueError("a Lagrange denominator is 0: a secret's points are not distinct mod p")
    return _red(total[:, None] * _inverse(den))


def lagrange_leave_one_out(xs: np.ndarray) -> np.ndarray:
    """For t+1 points C: (t+1, t+1) matrix whose row r holds the coefficients of C without point r
    (column r is 0). λ_j(C∖r) = λ_j(C) · (x_r - x_j) / x_r, so all t+1 sets cost O(t²) in total."""
    xs = np.mod(np.asarray(xs, dtype=np.int64).reshape(1, -1), P)
    lam = lagrange_at_zero(xs)[0]
    x = xs[0]
    out = _red(_red(lam[None, :] * _red(x[:, None] - x[None, :] + P)) * _inverse(xs)[0][:, None])
    np.fill_diagonal(out, 0)
    return out


def combine(lam: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Σ_j λ_j y_j mod p for (S, t) coefficients and (S, t, 9) shares → (S, 32) uint8 secrets."""
    terms = _red(np.asarray(lam, np.int64)[:, :, None] * np.asarray(ys, np.int64))
    return chunks_to_secret(_red(terms.sum(axis=1)))  # a sum of t < 2^32 terms below 2^31


def reconstruct(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Secrets from t shares each: xs (S, t) points, ys (S, t, 9) shares → (S, 32) uint8.

    Lagrange coefficients cost O(t²) per distinct point set; secrets whose shares come from the
    same holders share one computation.
    """
    xs = np.asarray(xs, dtype=np.int64)
    ys = np.asarray(ys, dtype=np.int64)
    order = np.argsort(xs, axis=1)
    xs = np.take_along_axis(xs, order, axis=1)
    ys = np.take_along_axis(ys, order[:, :, None], axis=1)
    sets, which = np.unique(xs, axis=0, return_inverse=True)
    return combine(lagrange_at_zero(sets)[which.reshape(-1)], ys)
