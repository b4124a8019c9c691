"""The row-by-row Algorithm 1 of ldp-bitvector before its block search (issue 18): the
independent reference of the tests and the baseline of ``benchmarks/ldp_bitvector.py
--consistence``. Not product code."""

from __future__ import annotations

import numpy as np


def consistence_rowwise(d: np.ndarray, radius: float, max_iter: int = 50) -> np.ndarray:
    """The row-by-row implementation Algorithm 1 had before the block search (kept as an
    independent reference): per row i, an (n x unset) mask of the usable j, first j by argmax."""
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
            via = finite[i][:, None] & finite[:, targets]
            via[i] = False
            via[targets, np.arange(targets.size)] = False
            has = via.any(axis=0)
            k, j = targets[has], via.argmax(axis=0)[has]
            new[i, k] = out[i, j] + out[j, k]
        if np.array_equal(np.isfinite(new), finite):
            break
        out = new
    return np.where(np.isfinite(out), out, d)
