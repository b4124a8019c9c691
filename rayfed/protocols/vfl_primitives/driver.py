"""The rounds of ``vfl-primitives``: each task family runs its own (see moments, clustering,
sketches)."""

from __future__ import annotations

from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.vfl_primitives import clustering, moments, sketches
from rayfed.protocols.vfl_primitives.config import CLUSTER_TASKS, MOMENT_TASKS, VflPrimitivesConfig


def drive(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    if cfg.task in MOMENT_TASKS:
        return moments.drive(fed, cfg, plan)
    if cfg.task in CLUSTER_TASKS:
        return clustering.drive(fed, cfg, plan)
    return sketches.drive(fed, cfg, plan)
