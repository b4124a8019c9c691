"""Everything the LFL setting of ``federated-mf`` resolves at planning time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.dropout import DropoutSchedule
from rayfed.secagg import FixedPoint, SecAggParams


@dataclass(frozen=True)
class GddrParams:
    """GD-DR's public constants: the projection Φ (k x m), the entry bound c, the per-report ε0
    and each iteration's δ' = δ/T, the reports a release needs (the shuffle bound's n) and the
    reports' magnitude B."""

    projection: np.ndarray
    clip: float
    epsilon0: float
    step_delta: float
    quorum: int
    scale: float


@dataclass(frozen=True)
class LflParams:
    """The method (the setting's default resolved), n users and m items, δ, the noise multiplier
    z and sensitivity Δ = 2R^{3/2}, secure aggregation's graph, encoding, registry and threshold
    t = ⌈(1-ω)n⌉, and the mean training rating (the embeddings' initial scale)."""

    method: str
    n: int
    m: int
    delta: float
    z: float
    sensitivity: float
    secagg: SecAggParams
    encoding: FixedPoint
    mean: float
    threshold: int
    registry: np.ndarray
    #: who drops from Round 1 (secure aggregation): the dropout rate and the population models
    schedule: DropoutSchedule
    #: method=gd-dr only
    gddr: GddrParams | None = None
