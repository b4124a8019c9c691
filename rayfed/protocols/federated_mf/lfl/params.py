"""Everything the LFL setting of ``federated-mf`` resolves at planning time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.dropout import DropoutSchedule
from rayfed.privacy import Clipped, Measurement
from rayfed.secagg import FixedPoint, SecAggParams
from rayfed.secagg.ddp import DdpPlan


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
class LflReleases:
    """The releases an LFL run draws, each built once in plan: Round 1's gradient rows with
    their distributed Gaussian shares, Round 2's replacement shares (part of Round 1's release;
    none without a replacement round), or GD-DR's one-bit reports."""

    round1: Measurement | None = None
    round2: Measurement | None = None
    reports: Measurement | None = None

    def all(self) -> tuple[Measurement, ...]:
        return tuple(m for m in (self.round1, self.round2, self.reports) if m is not None)


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
    #: γ, the server's step: ``lr`` if given, else the public rule
    #: (:func:`rayfed.protocols.federated_mf.lfl.plan.server_lr`); None for stage1 and central
    server_lr: float | None
    registry: np.ndarray
    #: who drops from Round 1 (secure aggregation): the dropout rate and the population models
    schedule: DropoutSchedule
    #: the releases (none for stage1 and central)
    releases: LflReleases = LflReleases()
    #: ratings outside [0, R] clipped (out_of_domain=clip; a count of 0 otherwise)
    clipped: Clipped | None = None
    #: method=gd-dr only
    gddr: GddrParams | None = None
    #: dp_mechanism=skellam: the distributed-DP pipeline (γ, Δ₂, Δ₁, bits; the rotation's signs
    #: and the rounding keyed per iteration by ``dataclasses.replace(ddp, round=t)``) and the
    #: honest-user counts g_0 = t − c < … < g_L = n − c the shares are split at (Round 2 removes
    #: the components below the largest g_j <= |U1| − c); None and () for gaussian
    ddp: DdpPlan | None = None
    levels: tuple[int, ...] = ()
