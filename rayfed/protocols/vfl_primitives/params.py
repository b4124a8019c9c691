"""Everything ``vfl-primitives`` resolves at planning time, per task family, and the public
arithmetic (thresholds and sizes derived from the config) that only this protocol uses."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig


@dataclass(frozen=True)
class Params:
    """Every task: the servers in order and the number of users."""

    order: list[str]
    users: int


@dataclass(frozen=True)
class ClusteringParams(Params):
    """kmeans / kmedian: the attributes d of a full row and each server's column positions in
    it (where its local centers go in the product grid)."""

    dims: int
    positions: list[list[int]]


@dataclass(frozen=True)
class SketchParams(Params):
    """l2-moment, lowrank, regression: the sketch size s, the draw of G that passed Lemma E.2's
    test, a server's ℓ₂ sensitivity, the noise multiplier z and σ = z · sensitivity per entry."""

    s: int
    attempt: int
    sensitivity: float
    z: float
    sigma: float


@dataclass(frozen=True)
class PerturbationParams(Params):
    """lowrank with baseline=input-perturbation (spec §4.4): a server's ℓ₂ sensitivity (ν: one
    row of A^(j) moves by at most ν), the noise multiplier z and σ = z · ν per entry — the same
    RDP calibration for one Gaussian release at (ε, δ) as the sketch's — and each server's
    number of columns d^(j) (it sends m x d^(j) reals)."""

    widths: list[int]
    sensitivity: float
    z: float
    sigma: float


@dataclass(frozen=True)
class Truth:
    """The non-private answer's inputs (never given to an actor): the full matrix A, and the labels
    b of regression."""

    a: np.ndarray
    b: np.ndarray | None


def lp_constants(v: int, m: int, eps: float, alpha: float) -> tuple[float, float, int]:
    """(B, τ, M) of Alg. 2 made explicit (spec §2.5): B = v(2/ε)ln(100mv), τ = B/α, M = ⌈τ + B⌉."""
    b = v * (2 / eps) * math.log(100 * m * v)
    tau = b / alpha
    return b, tau, math.ceil(tau + b)


def pattern_weights(size: int, v: int, p: float) -> np.ndarray:
    """(Σρ)^p for every pattern ρ in {0..size-1}^v (Alg. 2 sums over all of {0..M}^v)."""
    return np.indices((size,) * v).sum(axis=0).astype(np.float64) ** p


def sketch_size(cfg: VflPrimitivesConfig, d: int) -> int:
    """s = C·k/α² (lowrank), C·d/α² (regression), C/α² (l2-moment), unless sketch_size is given."""
    if cfg.sketch_size is not None:
        return cfg.sketch_size
    scale = {"l2-moment": 1, "lowrank": cfg.k, "regression": d}[cfg.task]
    return max(1, math.ceil(cfg.sketch_constant * scale / cfg.alpha**2))


def column_norm_bound(s: int, m: int) -> float:
    """Lemma E.2: max_i ‖G[:, i]‖₂ <= √s + 4√ln m with probability >= 1 - 1/m."""
    return math.sqrt(s) + 4 * math.sqrt(math.log(max(m, 2)))
