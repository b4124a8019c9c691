"""A d-bucket histogram of values in [0, 1] from one ε-LDP report per user (spec
shared/specs/square-wave.md §2): the user-side reports of the binned CFO, the hierarchy and the
Haar hierarchy, and the aggregator's estimate of every method from the reports it received.

Users are vectorised: ``u`` holds each user's uniforms (one row per user); every estimator is a
pure function of the reports, so the order of the users does not matter beyond aligning fields.
"""

from __future__ import annotations

import math

import numpy as np

from rayfed.ldp import hierarchy, oracles, wave
from rayfed.ldp import square_wave as sw


def bucket_index(values: np.ndarray, d: int) -> np.ndarray:
    """The bucket of each value among d equal buckets of [0, 1] (exactly 1 in the last)."""
    return np.minimum((values * d).astype(np.int64), d - 1)


def true_histogram(values: np.ndarray, d: int) -> np.ndarray:
    """Frequencies of d equal buckets of [0, 1]; a value of exactly 1 falls in the last bucket."""
    return np.bincount(bucket_index(values, d), minlength=d) / values.size


def round_log2(d: int) -> int:
    return int(round(math.log2(d)))


# --- users' reports ---------------------------------------------------------------------------------
def frequency_report(values: np.ndarray, domain: int, hashes, *, eps: float, u) -> dict:
    """GRR over the domain, or OLH (``hashes`` given): the report ⟨H, y⟩ carries the user's hash
    (a, b), public randomness from the run seed."""
    if hashes is None:
        return {"report": oracles.grr_perturb(values, domain, eps, u)}
    return {"report": oracles.olh_perturb(values, hashes, eps, u), "hash": hashes}


def hh_report(leaf, d: int, branching: int, hashes: list, *, eps: float, u) -> dict:
    """A uniformly chosen layer ℓ (u's third column) and the FO report of the leaf's ancestor
    there (GRR or OLH by the layer's size; ``hashes[ℓ - 1]`` the OLH parameters of its users)."""
    sizes = hierarchy.layer_sizes(d, branching)
    layer = np.minimum((u[:, 2] * len(sizes)).astype(np.int64), len(sizes) - 1) + 1
    node = hierarchy.ancestor(leaf, layer, branching)
    report = np.empty_like(node)
    olh_rows = np.zeros((node.size, 2), dtype=np.int64)
    for ell, size in enumerate(sizes, start=1):
        mine = layer == ell
        h = None if hashes[ell - 1] is None else hashes[ell - 1][mine]
        part = frequency_report(node[mine], size, h, eps=eps, u=u[mine])
        report[mine] = part["report"]
        if h is not None:
            olh_rows[mine] = h
    olh = ~np.array([oracles.use_grr(size, eps) for size in sizes])[layer - 1]
    return {"layer": layer.astype(np.int8), "report": report, "hash": olh_rows[olh]}


def haar_report(leaf, d: int, *, eps: float, u) -> dict:
    """A uniformly chosen height (u's third column) and an HRR report of that level's signed
    coefficient."""
    heights = int(round_log2(d))
    height = np.minimum((u[:, 2] * heights).astype(np.int64), heights - 1) + 1
    node, sign = hierarchy.haar_signs(leaf, height)
    rows = np.empty_like(node)
    bits = np.empty(node.size, dtype=np.int8)
    for h in range(1, heights + 1):
        mine = height == h
        rows[mine], bits[mine] = oracles.hrr_perturb(node[mine], sign[mine], d >> h, eps, u[mine])
    return {"height": height.astype(np.int8), "row": rows, "bit": bits}


# --- the aggregator's estimates ---------------------------------------------------------------------
def frequencies(report: np.ndarray, hashes: np.ndarray | None, domain: int, eps: float):
    """GRR or OLH frequency estimates of one group of users (OLH when hashes are given)."""
    n = max(1, report.size)
    if hashes is None:
        return oracles.grr_estimate(report, domain, eps, n)
    return oracles.olh_estimate(report, hashes, domain, eps, n)


def sw_estimate(
    values: np.ndarray,
    *,
    eps: float,
    d: int,
    b: float,
    output_buckets: int,
    discrete: bool,
    smoothing: bool,
    tolerance: float,
    max_iterations: int,
    ratio: float = 1.0,
    structured: bool = False,
) -> tuple[np.ndarray, int]:
    """EM (or EMS) on the histogram of the Square Wave reports: (estimate, iterations). Discrete
    SW's reports are integers in [-b, d + b) with its own integer b; ``b`` and
    ``output_buckets`` are the continuous SW's, ``ratio`` its wave's top/bottom ratio (1 = SW).
    ``structured``: M as its O(d) product (rayfed.ldp.wave) instead of a dense array."""
    if discrete:
        b_int, _, _ = sw.discrete_parameters(eps, d)
        counts = np.bincount(values + b_int, minlength=d + 2 * b_int).astype(np.float64)
        if structured:
            m = wave.DiscreteOperator(eps, d)
        else:
            m = sw.discrete_transition_matrix(eps, d)
    else:
        counts = sw.histogram(values, b, output_buckets)
        if structured:
            m = wave.WaveOperator(eps, b, ratio, d, output_buckets)
        else:
            m = wave.transition_matrix(eps, b, ratio, d, output_buckets)
    return sw.expectation_maximisation(
        counts, m, smoothing=smoothing, tolerance=tolerance, max_iterations=max_iterations
    )


def cfo_estimate(
    report: np.ndarray, hashes: np.ndarray | None, *, bins: int, d: int, eps: float
) -> np.ndarray:
    """The bins' frequencies (GRR, or OLH with ``hashes``) after Norm-Sub, each spread uniformly
    over its d / bins buckets."""
    freq = oracles.norm_sub(frequencies(report, hashes, bins, eps))
    spread = d // bins
    return np.repeat(freq / spread, spread)


def hh_layers(
    layer: np.ndarray, report: np.ndarray, hashes: np.ndarray, *, d: int, branching: int, eps: float
) -> list[np.ndarray]:
    """Every layer's frequency estimate from the users who reported it; ``hashes`` are the OLH
    parameters of the users of OLH layers, in the users' order."""
    sizes = hierarchy.layer_sizes(d, branching)
    olh_layer = ~np.array([oracles.use_grr(size, eps) for size in sizes])
    aligned = np.zeros((layer.size, 2), dtype=np.int64)
    aligned[olh_layer[layer - 1]] = hashes.reshape(-1, 2)
    layers = []
    for ell, size in enumerate(sizes, start=1):
        mine = layer == ell
        own = aligned[mine] if olh_layer[ell - 1] else None
        layers.append(frequencies(report[mine], own, size, eps))
    return layers


def haar_estimate(
    height: np.ndarray, rows: np.ndarray, bits: np.ndarray, *, d: int, eps: float
) -> np.ndarray:
    """The leaves from every height's HRR estimate of its Haar coefficients."""
    coefficients = []
    for h in range(1, round_log2(d) + 1):
        mine = height == h
        coefficients.append(
            oracles.hrr_estimate(rows[mine], bits[mine], d >> h, eps, max(1, int(mine.sum())))
        )
    return hierarchy.haar_leaves(coefficients)
