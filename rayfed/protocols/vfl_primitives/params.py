"""Everything ``vfl-primitives`` resolves at planning time, per task family, and the public
arithmetic (thresholds and sizes derived from the config) that only this protocol uses."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rayfed.privacy import Clipped, Measurement
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig


@dataclass(frozen=True, kw_only=True)
class Params:
    """Every task: the servers in order, the number of users, what the guarantee protects in a
    few words (the headline's tag: user-level on its declared domain, or the paper's neighbours,
    named), and what the plan clipped into the declared bounds (user-level; empty otherwise)."""

    order: list[str]
    users: int
    protects: str
    clipped: tuple[Clipped, ...] = ()


@dataclass(frozen=True, kw_only=True)
class L1Params(Params):
    """l1-moment: each server's release, ‖x^(j)‖₁ + Laplace."""

    releases: dict[str, Measurement]


@dataclass(frozen=True, kw_only=True)
class LpParams(Params):
    """lp-moment (Alg. 2): the public constants (B and τ scaled by ``unit``, the per-entry
    sensitivity: hi − lo user-level, 1 under the paper's neighbours), the pattern bound M used and
    the theorem's, and each server's two releases: its noisy vector (Laplace, ε/2) and its
    pattern bits over {0..M} (randomized response at ε/2: bias ε')."""

    unit: float
    tau: float
    big_m: int
    theorem_m: int
    eps_prime: float
    vectors: dict[str, Measurement]
    counting: dict[str, Measurement]


@dataclass(frozen=True, kw_only=True)
class ClusteringParams(Params):
    """kmeans / kmedian: the attributes d of a full row and each server's column positions in
    it (where its local centers go in the product grid); each server's releases — its local
    clustering (ε/2) and the pattern counting of its labels (randomized response at ε/2: bias
    ε'), or with baseline=central the curator's histogram (run-wide)."""

    dims: int
    positions: list[list[int]]
    local: dict[str, Measurement]
    eps_prime: float | None = None
    counting: dict[str, Measurement] | None = None
    central: Measurement | None = None


@dataclass(frozen=True, kw_only=True)
class SketchParams(Params):
    """l2-moment, lowrank, regression: the sketch size s, the draw of G that passed Lemma E.2's
    test, the feature servers' ℓ₂ sensitivity, the noise multiplier z and σ = z · sensitivity
    per entry (regression: the label server's own, ``label_sigma``), and every sender's
    release (its noisy sketch)."""

    s: int
    attempt: int
    sensitivity: float
    z: float
    sigma: float
    releases: dict[str, Measurement]
    label_sigma: float | None = None


@dataclass(frozen=True, kw_only=True)
class PerturbationParams(Params):
    """lowrank with baseline=input-perturbation (spec §4.4): a server's ℓ₂ sensitivity (one row
    of A^(j) replaced in the ball of radius C: 2C; the paper's neighbours: ν), the noise
    multiplier z and σ = z · sensitivity per entry — the sketch's calibration for one Gaussian
    release at (ε, δ) — each server's number of columns d^(j) (it sends m x d^(j) reals) and its
    release."""

    widths: list[int]
    sensitivity: float
    z: float
    sigma: float
    releases: dict[str, Measurement]


@dataclass(frozen=True)
class Truth:
    """The non-private answer's inputs (never given to an actor): the full matrix A, and the labels
    b of regression, as the servers hold them (clipped into the declared bounds, user-level); and
    A as given, where the plan clipped some of it."""

    a: np.ndarray
    b: np.ndarray | None
    unclipped: np.ndarray | None = None


def lp_constants(
    v: int, m: int, eps: float, alpha: float, unit: float = 1.0
) -> tuple[float, float, int]:
    """(B, τ, M) of Alg. 2 made explicit (spec §2.5): B = unit·v(2/ε)ln(100mv), τ = B/α,
    M = ⌈τ + B⌉. B bounds the sum of the v servers' Lap(2·unit/ε) noises of one user (w.p.
    about 0.99 over all users); ``unit`` is the per-entry sensitivity (1: the paper's
    event-level neighbours)."""
    b = unit * v * (2 / eps) * math.log(100 * m * v)
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
