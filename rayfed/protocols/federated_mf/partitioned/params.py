"""Everything the VFL and HFL settings of ``federated-mf`` resolve at planning time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionedParams:
    """The method and privacy unit (the setting's defaults resolved; no unit with ``noise=none``),
    θ ratings kept per user and party (None: per-rating or no noise, no trimming), n users and m
    items, δ, the noise multiplier z (None: ``noise=none``, no noise), the sensitivities of a joint
    (U, V) step and of a V-only step, the mean training rating (the embeddings' initial scale) and
    each party's share of the items (VFL) or users (HFL)."""

    method: str
    privacy_unit: str | None
    trim: int | None
    n: int
    m: int
    delta: float
    z: float | None
    delta_joint: float
    delta_v: float
    mean: float
    shares: dict[str, float]
