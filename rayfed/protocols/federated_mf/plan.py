"""Planning ``federated-mf``: the memory estimate, and the plan of the chosen setting (LFL, or the
partitioned VFL/HFL) — before any actor starts."""

from __future__ import annotations

from rayfed.protocols.base import Plan
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.lfl.plan import plan as plan_lfl
from rayfed.protocols.federated_mf.partitioned.plan import plan as plan_partitioned


def data_bytes(cfg: FederatedMFConfig) -> int:
    """The synthetic ratings (a dense users x items draw), and in LFL every online user's
    Round-1 input, a dense m·p vector, with its masked words."""
    if cfg.data.path is not None:
        return 0
    users = cfg.resolved_users()
    ratings = users * cfg.items * 9
    if cfg.setting == "lfl":
        return ratings + users * cfg.items * cfg.rank * 8 * 3
    return ratings + users * cfg.rank * 8 * (cfg.parties + 2)


def plan(cfg: FederatedMFConfig, seed: int) -> Plan:
    if cfg.setting == "lfl":
        return plan_lfl(cfg, seed)
    return plan_partitioned(cfg, seed)
