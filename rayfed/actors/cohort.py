"""UserCohortActor: a shard of simulated users held as Arrow columns and processed vectorised.

Users are rows, not actors: one cohort hosts thousands to millions of users (column ``user_id``
plus data and per-user state columns) and runs each phase for all of them at once. Per-user
noise and secrets come from the actor's noise source keyed by user id (``ctx.noise.user_*``), so
in a seeded run results do not depend on how users are dealt to cohorts.
"""

from __future__ import annotations

import numpy as np

from rayfed.actors.base import RoleActor


class UserCohortActor(RoleActor):
    """Hosts a shard of simulated users (one row per user, sorted by ``user_id``)."""

    role = "cohort"

    def user_ids(self) -> np.ndarray:
        return self.ctx.table.column("user_id").to_numpy()
