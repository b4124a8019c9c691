"""Everything ``vfl-kmeans`` resolves at planning time, and the public arithmetic of its budget
split and k' that planning and the driver share (the k' rule itself is in
:mod:`rayfed.clustering.fm`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.clustering import fm
from rayfed.clustering.dplsf import DplsfReleases
from rayfed.clustering.fm_privacy import Calibration
from rayfed.errors import ConfigError
from rayfed.privacy import Clipped, Measurement
from rayfed.protocols.vfl_kmeans.config import FM_METHODS, VflKmeansConfig


@dataclass(frozen=True)
class Split:
    """The budget split of Alg. 1: n̂ query, each party's LocCluster and MemEnc."""

    eps0: float
    eps1: float
    eps2: float
    delta2: float


@dataclass(frozen=True)
class Evaluation:
    """Ground truth, from the raw data (never sent to an actor): the unit-scaled features as the
    parties see them (within their bounds, or clipped to them) and each user's reference label
    (the data's label column, or central k-means) for the loss, V-measure and intersection
    error."""

    x: np.ndarray
    reference: np.ndarray


@dataclass(frozen=True)
class Releases:
    """Every release of a run, built in plan: the noisy user count n̂, each party's (or the
    curator's) DPLSF, and the parties' membership encoding — the FM sketches (one release of all
    parties, charged once), the noisy cluster sizes or the LDP label reports (one per party, the
    same measurement) — with the sketches' calibration (None without sketches)."""

    count: Measurement | None = None
    local: dict[str, DplsfReleases] | None = None
    membership: Measurement | None = None
    sketch: Calibration | None = None

    def declared(self) -> tuple[Measurement, ...]:
        """The measurements the plan declares."""
        out = [self.count] if self.count is not None else []
        for dplsf in (self.local or {}).values():
            out += [dplsf.counts, dplsf.sums]
        return tuple(out + ([self.membership] if self.membership is not None else []))


@dataclass(frozen=True)
class Params:
    """The parties in order and the global positions of each one's columns, every feature in
    global order with its declared bounds, the number of users (the analyst's: never sent), the
    sketches' public δ (:func:`public_delta`; None without sketches) and the budget split, the k'
    planned from n (the driver replays the rule with n̂), the releases and what was clipped."""

    order: list[str]
    positions: list[list[int]]
    features: list[str]
    lo: np.ndarray
    hi: np.ndarray
    users: int
    delta: float | None
    split: Split
    k_plan: int = 0
    releases: Releases = Releases()
    clipped: tuple[Clipped, ...] = ()


@dataclass(frozen=True)
class ServerParams:
    """The public parameters the server needs to weigh the grid. The phantom count n_p is a
    function of public options only (ε, b, S, M, γ and the public δ of :func:`public_delta`),
    never of the data: neighbouring datasets give the server the same parameters."""

    method: str
    eps2: float
    phantoms: int | None
    gamma: float
    estimator: str
    iterations: int
    tolerance: float
    projection: str


def public_delta(cfg: VflKmeansConfig) -> float | None:
    """The sketches' total δ (None without sketches): the option, or 1/users — the synthetic
    data's declared size, a run option (the paper's δ = 1/n). Never counted from the data: n_p
    depends on δ and reaches the server (a data file has no declared size: validate refuses one
    without ``delta``)."""
    if cfg.method not in FM_METHODS:
        return None
    return cfg.delta if cfg.delta is not None else 1.0 / cfg.users


def split_budget(cfg: VflKmeansConfig, parties: int, delta: float | None) -> Split:
    """ε0 = (1-b)ε, ε1 = ε2 = bε/2S, δ2 = δ/S (LDP-AGG: ε0 = 0; central: ε1 = ε). The parties'
    sketches are charged together: (S·ε2, S·δ2) = (bε/2, δ)."""
    eps = cfg.epsilon
    if cfg.method == "vfl-nonprivate":
        return Split(0.0, 0.0, 0.0, 0.0)
    if cfg.method.startswith("central"):
        return Split(0.0, eps, 0.0, 0.0)
    if cfg.method == "ldp-agg-2pest":
        return Split(0.0, eps / (2 * parties), eps / (2 * parties), 0.0)
    rest = (1.0 - cfg.count_fraction) * eps
    fm_delta = delta / parties if cfg.method in FM_METHODS and delta is not None else 0.0
    return Split(cfg.count_fraction * eps, rest / (2 * parties), rest / (2 * parties), fm_delta)


def choose_k_prime(
    cfg: VflKmeansConfig, n_hat: float, parties: int, split: Split, delta: float | None
) -> tuple[int, str]:
    """(k', how it was chosen). The formula reads the sketches' public δ, or — methods without
    sketches — the paper's δ = 1/n as 1/n̂ (post-processing of the released n̂)."""
    if cfg.method == "vfl-nonprivate":
        return cfg.k, "k' = k (non-private VFL)"
    if cfg.k_prime != "auto":
        return int(cfg.k_prime), "given"
    if cfg.k_prime_rule == "table":
        kp = fm.k_prime_from_table(n_hat, parties, cfg.epsilon)
        if kp is not None:
            return kp, "Table 5.1"
    delta = 1.0 / n_hat if delta is None else delta
    kp = max(2, fm.k_prime_formula(n_hat, cfg.k, parties, split.eps2, delta, cfg.sketches))
    return kp, "formula (§2.10)"


def check_grid(cells: int, limit: int, k_prime: int, parties: int, m: int) -> None:
    """The server materialises all k'^S grid points: refuse more than ``max_grid_cells``."""
    if cells > limit:
        raise ConfigError(
            "k_prime",
            f"the grid has k'^S = {k_prime}^{parties} = {cells:,} cells, above max_grid_cells="
            f"{limit:,} (the server holds {cells * m * 8 / 2**20:,.0f} MiB of grid points and "
            "runs k-means on them)",
            "a smaller k', fewer parties, or raise max_grid_cells",
        )


def server_params(cfg: VflKmeansConfig, split: Split, releases: Releases) -> ServerParams:
    sketch = releases.sketch
    return ServerParams(
        method=cfg.method,
        eps2=split.eps2,
        phantoms=sketch.phantoms if sketch is not None else None,
        gamma=cfg.gamma,
        estimator=cfg.estimator,
        iterations=cfg.iterations,
        tolerance=cfg.tolerance,
        projection=cfg.projection,
    )
