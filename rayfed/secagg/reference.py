"""An exactness reference for secure aggregation that does not reuse what it checks.

:func:`expected_survivors` derives whose input must be in a round's sum from the round's public
inputs alone — the dropout schedule, the neighbour graph, the threshold and the cohorts planned to
die at a phase — by the participation rules of Bonawitz et al. as this package states them, not
from the protocol's own survivor set. :func:`exact_sum` is the sum of those users' inputs, clipped
and quantised to the fixed-point grid and added in exact integers, without the modulus, the two's
complement words or the decoder of :class:`~rayfed.secagg.encoding.FixedPoint`: what the
protocol must decode to. :func:`raw_sum` is the same sum without the clip, the plaintext sum a
user would compute, kept beside it so that what clipping changed is visible.
"""

from __future__ import annotations

import math

import numpy as np

from rayfed.secagg.phases import ADVERTISE, MASKED_INPUT, NEVER, SHARE_KEYS


def _enough_neighbours(member: np.ndarray, graph, threshold: int) -> np.ndarray:
    """Per position: at least ``threshold`` of its neighbours are in ``member``."""
    if graph.complete:  # everyone else is a neighbour: no n x n table
        return member.sum() - member >= threshold
    out = np.empty(member.size, dtype=bool)
    step = max(1, _CHUNK_NEIGHBOURS // max(graph.degree, 1))  # never the (n x k) table at once
    for a in range(0, member.size, step):
        nb = graph.neighbours(np.arange(a, min(a + step, member.size)))
        out[a : a + step] = member[nb].sum(axis=1) >= threshold  # not count_in: independent
    return out


_CHUNK_NEIGHBOURS = 1 << 22  # neighbour entries (int64) per chunk of users


def expected_survivors(
    registry: np.ndarray,
    drop: np.ndarray,
    graph,
    threshold: int,
    lost_at: np.ndarray | None = None,
) -> np.ndarray:
    """The user ids whose masked input must be in the round's sum.

    Parameters
    ----------
    registry:
        The round's sorted user ids (a user's position is its index here).
    drop:
        Per position, the first phase it does not answer (:func:`rayfed.secagg.phases.drop_codes`:
        0 advertise … 3 unmask, 4 NEVER: it answers every phase).
    graph:
        The round's public neighbour graph.
    threshold:
        Shamir's t: a user with fewer than t live neighbours cannot share its secrets (at share
        keys) or spread its mask (at masked input), and leaves.
    lost_at:
        Per position, the phase at which its cohort died (the same codes; a cohort that dies at
        a phase sends nothing from that phase on).
    """
    lost = np.full(registry.size, NEVER) if lost_at is None else np.asarray(lost_at)
    gone = np.minimum(np.asarray(drop), lost)  # the first phase it does not answer
    u1 = gone > ADVERTISE  # advertised its keys
    u2 = u1 & _enough_neighbours(u1, graph, threshold) & (gone > SHARE_KEYS)  # shared them
    u3 = u2 & (gone > MASKED_INPUT)  # sends a masked input ...
    u3 &= _enough_neighbours(u2, graph, threshold)  # ... if its mask has enough peers
    return np.asarray(registry)[u3]


def exact_sum(inputs: np.ndarray, clip: float, frac_bits: int) -> np.ndarray:
    """Σ_users round(clip(x)·2^f) per coordinate, as exact integers (int64 while the bound n·R
    fits, Python integers beyond): what secure aggregation of these inputs must decode to."""
    x = np.asarray(inputs, dtype=np.float64)
    scaled = np.rint(np.clip(x, -clip, clip) * 2.0**frac_bits)  # exact: a power-of-two scale
    return _integer_sum(scaled, len(x) * int(round(clip * 2**frac_bits)))


def raw_sum(inputs: np.ndarray, frac_bits: int) -> np.ndarray:
    """Σ_users round(x·2^f) per coordinate, as exact integers, with no clip: the plaintext sum of
    the raw inputs on the same grid. It equals :func:`exact_sum` when every input lies in
    [-clip, clip]; the difference is what clipping changed. Integer inputs are added as integers
    (a float64 cast would round those beyond 2^53)."""
    if np.issubdtype(np.asarray(inputs).dtype, np.integer):
        ints = np.asarray(inputs).astype(object) * (1 << frac_bits)  # Python integers: exact
        bound = len(ints) * int(np.max(np.abs(ints), initial=0))
        return ints.astype(np.int64).sum(axis=0) if bound < 2**62 else ints.sum(axis=0)
    x = np.asarray(inputs, dtype=np.float64)
    with np.errstate(over="ignore"):  # an overflow is handled below
        scaled = np.rint(x * 2.0**frac_bits)
    if not np.all(np.isfinite(scaled)):  # |x|·2^f beyond float64: integers, shifted exactly
        # (|x| >= 2^52 is an integer already, so round(x·2^f) = x·2^f = int(x) << f)
        big = np.abs(x) >= 2.0**52
        ints = [
            int(v) << frac_bits if b else int(s)
            for v, b, s in zip(
                x.ravel(), big.ravel(), np.where(big, 0.0, scaled).ravel(), strict=True
            )
        ]
        return np.array(ints, dtype=object).reshape(x.shape).sum(axis=0)
    largest = int(np.max(np.abs(scaled))) if scaled.size else 0
    return _integer_sum(scaled, len(x) * largest)


def to_float(total: np.ndarray, frac_bits: int) -> np.ndarray:
    """The nearest float64 of each exact grid sum ``total``·2^-f: int64 sums by ``ldexp``, Python
    integers (beyond int64) by exact division, rounded once — their integer may lie beyond
    float64 while the sum does not; a sum beyond float64's range is ±inf."""
    total = np.asarray(total)
    if total.dtype != object:
        return np.ldexp(total.astype(np.float64), -frac_bits)
    out = np.empty(total.shape)
    for i, v in np.ndenumerate(total):
        try:
            out[i] = int(v) / (1 << frac_bits)  # Python's int division rounds correctly
        except OverflowError:
            out[i] = math.inf if v > 0 else -math.inf
    return out


def _integer_sum(scaled: np.ndarray, bound: int) -> np.ndarray:
    """The column sums of integer-valued floats, exact: int64 while ``bound`` (>= the largest
    |partial sum|) fits, Python integers beyond."""
    if bound < 2**62:
        return scaled.astype(np.int64).sum(axis=0)
    ints = np.array([[int(v) for v in row] for row in scaled], dtype=object).reshape(scaled.shape)
    return ints.sum(axis=0)
