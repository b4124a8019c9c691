"""t-out-of-n Shamir secret sharing of 32-byte secrets over GF(p), vectorised over many secrets.

p = 2^20 + 7 (prime). A 32-byte secret is split into 13 chunks of 20 bits (260 >= 256 bits), each
shared with its own random polynomial of degree t - 1. Elements are below 2^20.001, so a dot
product of up to 8191 terms is exact in float64; polynomial evaluation therefore runs as BLAS
matrix products in blocks of 4096 terms, reduced mod p after each block. Share x-coordinates are
user ids + 1 (non-zero, distinct, < p: at most p - 2 users).
"""

from __future__ import annotations

import numpy as np

P = (1 << 20) + 7
CHUNK_BITS = 20
CHUNKS = 13  # ceil(256 / 20)
SECRET_BYTES = 32
_BLOCK = 4096
MAX_USERS = P - 2


def secret_to_chunks(secrets: np.ndarray) -> np.ndarray:
    """(S, 32) uint8 → (S, 13) int64 chunks of 20 bits (big-endian bit order)."""
    bits = np.unpackbits(np.asarray(secrets, dtype=np.uint8), axis=1)  # (S, 256)
    padded = np.concatenate(
        [np.zeros((bits.shape[0], CHUNKS * CHUNK_BITS - 256), np.uint8), bits], axis=1
    )
    weights = 1 << np.arange(CHUNK_BITS - 1, -1, -1, dtype=np.int64)
    return padded.reshape(-1, CHUNKS, CHUNK_BITS).astype(np.int64) @ weights


def chunks_to_secret(chunks: np.ndarray) -> np.ndarray:
    """Inverse of :func:`secret_to_chunks`; ValueError if a chunk is not a 20-bit value."""
    chunks = np.asarray(chunks, dtype=np.int64)
    if chunks.size and (chunks.min() < 0 or chunks.max() >= 1 << CHUNK_BITS):
        raise ValueError("reconstructed chunk out of range: shares are inconsistent")
    shifts = np.arange(CHUNK_BITS - 1, -1, -1, dtype=np.int64)
    bits = ((chunks[:, :, None] >> shifts) & 1).astype(np.uint8).reshape(chunks.shape[0], -1)
    if bits[:, : CHUNKS * CHUNK_BITS - 256].any():
        raise ValueError("reconstructed secret exceeds 256 bits: shares are inconsistent")
    return np.packbits(bits[:, CHUNKS * CHUNK_BITS - 256 :], axis=1)


def _powers(x: np.ndarray, t: int) -> np.ndarray:
    """x^0 .. x^(t-1) mod p along a new last axis (exact in int64)."""
    out = np.empty((*x.shape, t), dtype=np.int64)
    out[..., 0] = 1
    for k in range(1, t):
        out[..., k] = out[..., k - 1] * x % P
    return out


def _matmul_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(…, K) @ (…, K, C) mod p, exact: float64 BLAS in blocks of at most 4096 terms."""
    k = a.shape[-1]
    out = None
    for s in range(0, k, _BLOCK):
        part = np.matmul(
            a[..., s : s + _BLOCK].astype(np.float64), b[..., s : s + _BLOCK, :].astype(np.float64)
        )
        part = np.fmod(part, P)
        out = part if out is None else np.fmod(out + part, P)
    return out.astype(np.int64)


def split(secrets: np.ndarray, points: np.ndarray, t: int, coef_words: np.ndarray) -> np.ndarray:
    """Shares of each secret at its points.

    Parameters
    ----------
    secrets:
        (S, 32) uint8.
    points:
        (K,) int — the same x-coordinates for every secret — or (S, K).
    t:
        Threshold: any t shares reconstruct, fewer reveal nothing.
    coef_words:
        (S, t - 1, 13) uint64 random words for the non-constant coefficients (reduced mod p;
        the bias of a 64-bit word mod p is below 2^-43).

    Returns
    -------
    (S, K, 13) int64 shares.
    """
    secrets = np.asarray(secrets, dtype=np.uint8)
    coefs = np.empty((secrets.shape[0], t, CHUNKS), dtype=np.int64)
    coefs[:, 0] = secret_to_chunks(secrets)
    if t > 1:
        coefs[:, 1:] = (np.asarray(coef_words, dtype=np.uint64) % np.uint64(P)).astype(np.int64)
    points = np.asarray(points, dtype=np.int64) % P
    if points.ndim == 1:  # one Vandermonde matrix for all secrets: a single large product
        vander = _powers(points, t)  # (K, t)
        flat = coefs.transpose(1, 0, 2).reshape(t, -1)  # (t, S*13)
        return (
            _matmul_mod(vander, flat)
            .reshape(len(points), secrets.shape[0], CHUNKS)
            .transpose(1, 0, 2)
        )
    out = np.empty((*points.shape, CHUNKS), dtype=np.int64)
    step = max(1, (1 << 22) // max(1, points.shape[1] * t))
    for s in range(0, points.shape[0], step):
        out[s : s + step] = _matmul_mod(_powers(points[s : s + step], t), coefs[s : s + step])
    return out


def _modpow(a: np.ndarray, e: int) -> np.ndarray:
    result = np.ones_like(a)
    base = a % P
    while e:
        if e & 1:
            result = result * base % P
        base = base * base % P
        e >>= 1
    return result


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """(S, t) distinct non-zero points → (S, t) Lagrange coefficients λ_j = Π_{m≠j} x_m / (x_m - x_j)."""
    xs = np.asarray(xs, dtype=np.int64) % P
    num = np.ones_like(xs)
    den = np.ones_like(xs)
    for m in range(xs.shape[1]):
        xm = xs[:, m : m + 1]
        other = np.arange(xs.shape[1]) != m
        num = np.where(other, num * xm % P, num)
        den = np.where(other, den * ((xm - xs) % P) % P, den)
    return num * _modpow(den, P - 2) % P


def lagrange_leave_one_out(xs: np.ndarray) -> np.ndarray:
    """For t+1 points C: (t+1, t+1) matrix whose row r holds the coefficients of C without point r
    (column r is 0). λ_j(C∖r) = λ_j(C) · (x_r - x_j) / x_r, so all t+1 sets cost O(t²) in total."""
    xs = np.asarray(xs, dtype=np.int64).reshape(1, -1) % P
    lam = lagrange_at_zero(xs)[0]
    x = xs[0]
    out = lam[None, :] * ((x[:, None] - x[None, :]) % P) % P * _modpow(x, P - 2)[:, None] % P
    np.fill_diagonal(out, 0)
    return out


def combine(lam: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Σ_j λ_j y_j mod p for (S, t) coefficients and (S, t, 13) shares → (S, 32) uint8 secrets."""
    chunks = (np.asarray(lam, np.int64)[:, :, None] * np.asarray(ys, np.int64) % P).sum(axis=1) % P
    return chunks_to_secret(chunks)


def reconstruct(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Secrets from t shares each: xs (S, t) points, ys (S, t, 13) shares → (S, 32) uint8.

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
