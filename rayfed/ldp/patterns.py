"""Pattern counting with per-bit randomized response on one-hot values (Cohen-Addad, Kacham,
Mirrokni & Zhong, Alg. 1 and Thm B.2; spec shared/specs/vfl-primitives.md §2.1–2.2): the encoding
of a party's values, the public sample, the exact loss of the RR bits, and the unbiased estimate
of joint pattern counts with its variance.

The estimator is computed exactly: expanding Π_j (lo + d·b_j) over subsets T of parties turns
the sum into integer counts of co-occurring bits, so the result does not depend on summation order,
thread count or backend.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayfed import rng
from rayfed.errors import DataError
from rayfed.privacy import Measurement, Neighbours, OneHot, RandomizedResponse

Domain = int | list[str | int]


def exact_loss(eps_prime: float) -> float:
    """Exact privacy loss of one party's message: two bits of RR with bias ε' (spec §2.1)."""
    return 2.0 * math.log((1 + 2 * eps_prime) / (1 - 2 * eps_prime))


def bias(epsilon: float, calibration: str) -> float:
    """The randomized-response bias ε' of a party's ε under a calibration: ``paper`` (Alg. 1,
    ε' = ε/16) or ``exact`` (ε' = tanh(ε/4)/2: the exact loss 2·ln((1+2ε')/(1−2ε')) is ε)."""
    if calibration == "paper":
        return epsilon / 16.0
    return math.tanh(epsilon / 4.0) / 2.0


def keep_probability(eps_prime: float) -> float:
    """Pr[reported bit = true bit] = 1/2 + ε'."""
    return 0.5 + eps_prime


def rr_measurement(label: str, eps_prime: float, size: int, relation: Neighbours) -> Measurement:
    """One party's release: binary RR on its users' one-hot values over ``size`` values (a value
    outside the domain is the all-zero vector, within the same Hamming distance). Replacing a
    user's value flips two bits: the event is the per-bit RR composed twice."""
    return Measurement(
        label, RandomizedResponse(keep_probability(eps_prime)), OneHot(max(size, 2)), relation
    )


def debias_constants(eps_prime: float) -> tuple[float, float]:
    """(lo, d): a debiased bit is z = lo + d·b, lo = 1/2 - 1/(4ε'), d = 1/(2ε')."""
    return 0.5 - 1.0 / (4.0 * eps_prime), 1.0 / (2.0 * eps_prime)


def per_user_variance_constant(eps_prime: float) -> float:
    """c = Var[z] = 1/(16ε'²) - 1/4, the same for a true bit 0 or 1."""
    return 1.0 / (16.0 * eps_prime**2) - 0.25


def _column_index(values: pa.ChunkedArray, col: str, dom: Domain) -> np.ndarray:
    """Index of each value in the declared domain of one column; -1 where it is outside."""
    if isinstance(dom, int):
        raw = values.to_numpy(zero_copy_only=False)
        if not np.issubdtype(raw.dtype, np.number):
            raise DataError(
                f"domains.{col}",
                f"column {col!r} is not numeric but its domain is a size",
                "declare the list of its values instead",
            )
        idx = raw.astype(np.int64)
        return np.where((raw == idx) & (idx >= 0) & (idx < dom), idx, -1)
    try:
        value_set = pa.array(dom).cast(values.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise DataError(
            f"domains.{col}",
            f"declared values {dom!r} do not match the column's type {values.type}",
            f"values of type {values.type}",
        ) from err
    idx = pc.index_in(values, value_set=value_set)
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def encode_values(table: pa.Table, columns: list[str], domains: dict[str, Domain]) -> np.ndarray:
    """One index in {0..size-1} per user from its columns (mixed radix); -1 if any value is outside
    its declared domain (encoded as the all-zero one-hot vector, spec §2.1)."""
    index = np.zeros(table.num_rows, dtype=np.int64)
    valid = np.ones(table.num_rows, dtype=bool)
    for col in columns:
        dom = domains[col]
        idx = _column_index(table.column(col), col, dom)
        ok = idx >= 0
        index = index * (dom if isinstance(dom, int) else len(dom)) + np.where(ok, idx, 0)
        valid &= ok
    return np.where(valid, index, -1)


def out_of_domain(
    table: pa.Table, columns: list[str], domains: dict[str, Domain]
) -> dict[str, int]:
    """Number of values outside the declared domain, per column (only the non-zero ones)."""
    counts = {
        c: int(np.count_nonzero(_column_index(table.column(c), c, domains[c]) < 0)) for c in columns
    }
    return {c: n for c, n in counts.items() if n}


def one_hot(values: np.ndarray, size: int) -> np.ndarray:
    """(size, n) boolean matrix; a value of -1 gives an all-zero column."""
    out = np.zeros((size, values.size), dtype=bool)
    present = values >= 0
    out[values[present], np.flatnonzero(present)] = True
    return out


def public_sample(seed: int, m: int, rate: float) -> np.ndarray:
    """The shared sample S of Thm B.2: user i is in S with probability ``rate``; the same for all."""
    if rate >= 1.0:
        return np.ones(m, dtype=bool)
    return rng.stream(seed, "sample", 0, "public-sample").random(m) < rate


def subset_counts(
    mats: list[np.ndarray], subset: tuple[int, ...], patterns: np.ndarray | None
) -> np.ndarray:
    """Σ_i Π_{j∈subset} A_j[ρ_j, i] for 0/1 matrices A_j: exact integer counts (as float64).

    ``patterns`` None: the full tensor over the subset's domains; else a (K, v) index array.
    """
    n = mats[0].shape[1]
    if not subset:
        return np.full(() if patterns is None else len(patterns), float(n))
    if patterns is None:
        letters = "abcdefghijklmnopqrstuvwxy"[: len(subset)]
        expr = ",".join(f"{c}z" for c in letters) + "->" + letters
        out = np.zeros([mats[j].shape[0] for j in subset])
        chunk = max(1024, (1 << 24) // max(1, out.size))
        for a in range(0, n, chunk):
            ops = [mats[j][:, a : a + chunk].astype(np.float64) for j in subset]
            out += np.einsum(expr, *ops)
        return out
    out = np.zeros(len(patterns))
    chunk = max(1024, (1 << 24) // max(1, len(patterns)))
    for a in range(0, n, chunk):
        prod = np.ones((len(patterns), min(chunk, n - a)), dtype=bool)
        for j in subset:
            prod &= mats[j][patterns[:, j], a : a + chunk].astype(bool)
        out += prod.sum(axis=1)
    return out


def product_sums(
    mats: list[np.ndarray], base: float, scale: float, patterns: np.ndarray | None
) -> np.ndarray:
    """Σ_i Π_j (base + scale·A_j[ρ_j, i]), expanded over subsets T of parties into exact counts:
    Σ_T base^(v-|T|) · scale^|T| · #{i : A_j[ρ_j, i] = 1 for all j in T}."""
    v = len(mats)
    sizes = [m.shape[0] for m in mats]
    out = np.zeros(sizes if patterns is None else len(patterns))
    for k in range(v + 1):
        for subset in itertools.combinations(range(v), k):
            coef = base ** (v - k) * scale**k
            if coef == 0.0:
                continue
            counts = subset_counts(mats, subset, patterns)
            if patterns is None:
                counts = counts.reshape([sizes[j] if j in subset else 1 for j in range(v)])
            out = out + coef * counts
    return out


def raw_counts(
    bits: list[np.ndarray], eps_prime: float, patterns: np.ndarray | None, sample_rate: float
) -> np.ndarray:
    """The unbiased (unclipped) estimate (1/p) Σ_{i∈S} Π_j z_j[ρ_j, i] from the parties' RR bits."""
    lo, d = debias_constants(eps_prime)
    return product_sums(bits, lo, d, patterns) / sample_rate


def predicted_variance(
    true_onehots: list[np.ndarray],
    eps_prime: float,
    patterns: np.ndarray | None,
    sample_rate: float,
) -> np.ndarray:
    """Var(raw_ρ) = Σ_i [(1/p) Π_j (c + a_ij) - Π_j a_ij] (spec §2.1–2.2), from the true data."""
    c = per_user_variance_constant(eps_prime)
    second = product_sums(true_onehots, c, 1.0, patterns)
    truth = product_sums(true_onehots, 0.0, 1.0, patterns)
    return second / sample_rate - truth
