"""The users' inputs of ``secure-sum``: computed inside each cohort for its users and handed to
:func:`rayfed.secagg.secure_sum` (which runs every phase of the protocol)."""

from __future__ import annotations

import numpy as np

from rayfed import rng
from rayfed.actors.base import StepContext
from rayfed.secagg.client import by_user


# --- cohorts (users) -------------------------------------------------------------------------------
@by_user
def synthetic_inputs(
    ctx: StepContext, round: int, ids: np.ndarray, dim: int, clip: float
) -> np.ndarray:
    """Uniform on [-clip, clip], keyed by (round, user id): the same wherever the user is hosted."""
    x = rng.keyed_uniform(ctx.seed, "synthetic", round, ids, dim)
    x *= 2  # in place: (u·2 - 1)·clip, the same floats without two more users x dim copies
    x -= 1
    x *= clip
    return x


@by_user
def table_inputs(ctx: StepContext, round: int, ids: np.ndarray, columns: list[str]) -> np.ndarray:
    """The users' rows of the value columns (one row per user), inside [-clip, clip]: plan
    refused the file or clipped them (counted), so the encoding's clip changes nothing here."""
    rows = np.searchsorted(ctx.table.column("user_id").to_numpy(), ids)
    return np.column_stack([ctx.table.column(c).to_numpy()[rows] for c in columns]).astype(
        np.float64
    )
