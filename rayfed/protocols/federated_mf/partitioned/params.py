"""Everything the VFL and HFL settings of ``federated-mf`` resolve at planning time."""

from __future__ import annotations

from dataclasses import dataclass

from rayfed.privacy import Clipped, Measurement


@dataclass(frozen=True)
class PartitionedReleases:
    """The releases a VFL/HFL run draws, each built once in plan: ``local``, every local step's
    gradient sums (VFL: of (U, V_Fk) jointly; HFL: of V), DP-SGLD's step or ObjPertb's V-solve;
    ``finetune``, VFL's fine-tuning steps on V_Fk. None where the method makes no such release
    (both with ``noise=none``)."""

    local: Measurement | None = None
    finetune: Measurement | None = None

    def all(self) -> tuple[Measurement, ...]:
        return tuple(m for m in (self.local, self.finetune) if m is not None)


@dataclass(frozen=True)
class PartitionedParams:
    """The method and privacy unit (the setting's defaults resolved; no unit with ``noise=none``),
    θ ratings kept per user and party (None: per-rating or no noise, no trimming), n users and m
    items, δ, the noise multiplier z (None: ``noise=none``, no noise), the sensitivities of a joint
    (U, V) step and of a V-only step, the mean training rating (the embeddings' initial scale) and
    each party's share of the items (VFL) or users (HFL); the unit DP-SGD's Poisson sampling draws
    (``sampled``: users, or ratings in a corrected per-rating run) and, for a faithful per-rating
    run (user sampling, the thesis), the true ε it is charged (``faithful_epsilon``)."""

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
    #: DP-SGLD's or ObjPertb's own resolved values (None for the other methods)
    baseline: SgldParams | ObjPertParams | None = None
    sampled: str = "user"
    faithful_epsilon: float | None = None
    releases: PartitionedReleases = PartitionedReleases()
    #: ratings outside [0, R] clipped (out_of_domain=clip; a count of 0 otherwise)
    clipped: Clipped | None = None
    #: per-rating HFL with pre-training: the guarantee holds given the pre-trained U only
    rating_gap: bool = False
    #: DP-SGD's learning rate: its start and its end (None: constant), resolved from the options or
    #: the public rule (rayfed/mf/rates.py); ``lr_source`` says which
    lr: float = 0.0
    lr_end: float | None = None
    lr_source: str = "given"


@dataclass(frozen=True)
class SgldParams:
    """DP-SGLD (spec §2.10): the step size η, the sensitivity (L, the gradient bound of one
    rating; per user √(θ²+θ)·2R^{3/2}, or θL with ``user_sensitivity=thesis``), the temperature
    τ = 2q/(z√η·L) and the z the papers' advanced composition gives (the run's ``z``; the
    ledger's accountant proves a smaller ε for it)."""

    step: float
    sensitivity: float
    temperature: float
    target_epsilon: float


@dataclass(frozen=True)
class ObjPertParams:
    """ObjPertb (spec §2.10): K alternations, each V-solve ε_k = ε/K-DP with ridge λ, the norm
    scale of every b_j and ε' (the part of ε_k left for the noise)."""

    alternations: int
    epsilon_k: float
    reg: float
    scale: float
    epsilon_prime: float
