"""What ``hfl-kmeans`` resolves before its iterations: the public setup the server derives from N
and the options (the thesis's arithmetic, on the fixed-point grid of the masked uploads), the
clients' settings, and the planned features and bounds.

Values travel on the fixed-point grid 2^-f (f = 16): a client's NMA upload is its per-cluster sums
of grid-rounded points and its counts x 2^f (exact integers); an AMN upload is its local centroids
/ M rounded to the grid. Uploads are words of Z_(2^b) (b = 32 or 64) under one-time pads; the
server adds discrete-Laplace noise on the grid to the padded sum, so it never sees a plaintext.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from rayfed.clustering import dplloyd
from rayfed.errors import ConfigError
from rayfed.privacy import discrete_laplace_event, joint_discrete_laplace_event
from rayfed.protocols.hfl_kmeans.config import HflKmeansConfig
from rayfed.secagg.mpc import BitGeometric

#: the member (of the cohorts group) that deals the MPC's correlated randomness (ring_noise=mpc)
DEALER = "dealer"
NOISE_TAIL = 50.0  # overflow check: |Laplace| > 50 scales has probability e^-50


@dataclass(frozen=True)
class Noise:
    """One block of the aggregate and its discrete-Laplace noise: ``length`` entries, each drawn
    with parameter ε/Δ₁ (grid units); the block's charge is (``l1_sensitivity``, ``epsilon``).
    With a ``sampler`` (ring_noise=mpc) the clients sample it jointly, and ``epsilon`` is what
    that sampler's realised parameter buys, with a δ for its truncation."""

    label: str
    length: int
    l1_sensitivity: int
    epsilon: float
    sampler: BitGeometric | None = None

    @property
    def event(self):
        if self.sampler is None:
            return discrete_laplace_event(self.l1_sensitivity, self.epsilon)
        return joint_discrete_laplace_event(
            self.l1_sensitivity, self.sampler.noise_parameter, self.joint_tail
        )

    @property
    def joint_tail(self) -> float:
        """The block's truncation cost (ring_noise=mpc): 2·length truncated geometric variables,
        whose total variations add up."""
        return 2 * self.length * self.sampler.tail

    @property
    def delta(self) -> float:
        """δ of the block's event: 0 unless jointly sampled (the truncation's)."""
        return 0.0 if self.sampler is None else self.event.delta

    @property
    def scale(self) -> float:
        """Laplace scale of one entry in grid units (1/parameter)."""
        return self.l1_sensitivity / self.epsilon


@dataclass(frozen=True)
class Setup:
    """Everything public the server derives from N and the options (§1.6 S1-S2) and broadcasts to
    the clients."""

    n: int
    d: int
    k: int
    clients: int
    bounds: dplloyd.SizeBounds
    contribution: int  # E as the sensitivity sees it (k for non-exclusive)
    length: int  # words per upload: k(d+1) for NMA, k·d for AMN
    frac_bits: int
    ring_bits: int
    t_max: int
    epsilon_m: float | None = None
    split: dict[str, float] = field(default_factory=dict)  # eps_sum/eps_count or eps_mu
    noise: tuple[Noise, ...] = ()  # per iteration (per client on the ring); () if non-private
    honest: int | None = None  # ring_noise=split: h, each client adds a 1/h share of the noise
    sensitivity: dict[str, float] = field(default_factory=dict)  # AMN: thesis and true Δ^μ
    claimed_epsilon: float | None = None  # the thesis's ε where the mode's true ε differs

    @property
    def scale(self) -> int:
        return 1 << self.frac_bits

    @property
    def epsilon_per_iteration(self) -> float:
        return sum(block.epsilon for block in self.noise)

    @property
    def delta_per_iteration(self) -> float:
        return sum(block.delta for block in self.noise)

    @property
    def joint(self) -> bool:
        """ring_noise=mpc: the clients sample one central noise in shares."""
        return any(block.sampler is not None for block in self.noise)

    def event(self):
        """The DP event of one iteration's noise (one client's, on the ring)."""
        return noise_event([block.event for block in self.noise])


@dataclass(frozen=True)
class Settings:
    """The options every client reads in its steps."""

    aggregation: str
    assignment: str
    init: str
    sum_post: str
    count_post: str
    centroid_post: str
    masking: str
    topology: str

    @classmethod
    def of(cls, cfg: HflKmeansConfig) -> Settings:
        return cls(
            aggregation=cfg.aggregation,
            assignment=cfg.assignment,
            init=cfg.init,
            sum_post=cfg.sum_post,
            count_post=cfg.count_post,
            centroid_post=cfg.centroid_post,
            masking=cfg.masking,
            topology=cfg.topology,
        )


@dataclass(frozen=True)
class Params:
    """The feature columns in order and their declared bounds (the centroids' data units)."""

    features: list[str]
    lo: np.ndarray
    hi: np.ndarray


def noise_event(events: list):
    return events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)


def derive_setup(cfg: HflKmeansConfig, n: int, d: int) -> Setup:
    """The thesis's public arithmetic for N points in d dimensions under ``cfg``."""
    k, m = cfg.k, cfg.clients
    bounds = dplloyd.size_bounds(
        n,
        k,
        m,
        None if cfg.min_size == "auto" else cfg.min_size,
        None if cfg.max_size == "auto" else cfg.max_size,
    )
    e = {"unconstrained": 1, "non-exclusive": k}.get(cfg.assignment, cfg.contribution)
    nma = cfg.aggregation == "nma"
    common = dict(
        n=n,
        d=d,
        k=k,
        clients=m,
        bounds=bounds,
        contribution=e,
        length=k * (d + 1) if nma else k * d,
        frac_bits=cfg.frac_bits,
        ring_bits=cfg.ring_bits,
    )
    fixed = None if cfg.iterations == "auto" else cfg.iterations
    if cfg.noise == "none":
        return Setup(**common, t_max=fixed or dplloyd.NON_PRIVATE_ITERATIONS)
    constrained = cfg.assignment != "unconstrained"
    if nma:
        eps_m = dplloyd.nma_epsilon_m(n, k, d, e, cfg.rho)
    else:
        eps_m = dplloyd.amn_epsilon_m(bounds.c_min if constrained else 0, k, d, e)
    t_max = fixed or dplloyd.iterations(cfg.epsilon, eps_m)
    noise = _nma_noise(cfg, d, e, t_max) if nma else _amn_noise(cfg, d, e, t_max, bounds)
    if cfg.topology == "ring" and cfg.ring_noise == "mpc":
        noise["noise"] = tuple(_jointly_sampled(block) for block in noise["noise"])
    return Setup(**common, t_max=t_max, epsilon_m=eps_m, honest=_honest(cfg), **noise)


def _jointly_sampled(block: Noise) -> Noise:
    """The block's noise as the clients' MPC samples it: the coins for DLap(ε/Δ₁), charged at
    the ε their realised parameter buys (a' ≈ a; the gap is ~1e-9 relative with κ = 128)."""
    sampler = BitGeometric.plan(block.epsilon / block.l1_sensitivity)
    epsilon = sampler.noise_parameter * block.l1_sensitivity
    return Noise(block.label, block.length, block.l1_sensitivity, epsilon, sampler)


def _honest(cfg: HflKmeansConfig) -> int | None:
    """h of the split ring noise (None: each client's noise is its own)."""
    if cfg.topology != "ring" or cfg.ring_noise != "split":
        return None
    if cfg.honest_clients == "majority":
        return min(cfg.clients // 2 + 1, cfg.clients - 1)
    return cfg.honest_clients


def _nma_noise(cfg: HflKmeansConfig, d: int, e: int, t_max: int) -> dict[str, Any]:
    """DPLloyd's split of ε over the sums and counts, and their noise blocks in grid units."""
    k, scale = cfg.k, 1 << cfg.frac_bits
    eps_sum, eps_count = dplloyd.nma_split(cfg.epsilon, t_max, d, cfg.rho)
    # one point moves a sum coordinate by its own grid value, at most B·2^f — or, where a
    # non-exclusive cluster keeps its size, swaps out another point: 2B·2^f
    swap = 2 if cfg.assignment == "non-exclusive" else 1
    grid_bound = swap * round(dplloyd.BOUND * scale)
    noise = (
        Noise("sums", k * d, e * d * grid_bound, d * eps_sum),
        Noise("counts", k, e * scale, eps_count),
    )
    return {"split": {"eps_sum": eps_sum, "eps_count": eps_count}, "noise": noise}


def _amn_noise(
    cfg: HflKmeansConfig, d: int, e: int, t_max: int, bounds: dplloyd.SizeBounds
) -> dict[str, Any]:
    """CDPLloyd's ε^μ and the centroid noise block, calibrated to the true sensitivity — or, with
    sensitivity=thesis, to the thesis's, charged at the ε that noise actually buys."""
    constrained = cfg.assignment != "unconstrained"
    scale = 1 << cfg.frac_bits
    eps_mu = dplloyd.amn_epsilon(cfg.epsilon, t_max, d)
    true = dplloyd.centroid_sensitivity(cfg.clients, bounds.client_min, cfg.assignment)
    thesis = dplloyd.centroid_sensitivity_thesis(bounds.c_min, e, constrained)
    # one coordinate of one rounded local centroid moves by at most floor(true·2^f) + 1 grid units
    l1 = e * d * (math.floor(true * scale) + 1)
    claimed = None
    epsilon = d * eps_mu
    if cfg.sensitivity == "thesis":
        # the thesis's noise scale Δ^μ/ε^μ; the charge is what that scale buys against the truth
        epsilon, claimed = eps_mu * l1 / (thesis * scale), cfg.epsilon
    return {
        "split": {"eps_mu": eps_mu},
        "noise": (Noise("centroids", cfg.k * d, l1, epsilon),),
        "sensitivity": {"thesis": thesis, "true": true * e},
        "claimed_epsilon": claimed,
    }


def overflow_check(setup: Setup, assignment: str, aggregation: str, topology: str) -> None:
    """A possible wrap-around of Z_(2^b) is a ConfigError naming the limit (§2.3): every decoded
    value must stay below 2^(b-1)/2^f in magnitude, noise included (50 Laplace scales)."""
    limit = 2.0 ** (setup.ring_bits - 1) / setup.scale
    b = setup.bounds
    cap = {
        "unconstrained": setup.n,
        "non-exclusive": setup.clients * b.client_min,
        "constrained": min(setup.n, setup.clients * b.client_max),
    }[assignment]
    draws = setup.clients if topology == "ring" else 1
    tails = [NOISE_TAIL * draws * block.scale / setup.scale for block in setup.noise] or [0.0]
    if aggregation == "nma":  # sums reach B·cap, counts cap, each with its own noise
        reach, which = max((dplloyd.BOUND * cap + tails[0], "sum"), (cap + tails[-1], "count"))
        what = f"a cluster {which} can reach ±{reach:,.0f} ({cap:,} points"
    else:
        reach = dplloyd.BOUND + tails[0]
        what = f"a centroid coordinate can reach ±{reach:,.4g} (B"
    what += " + 50 noise scales)" if setup.noise else ")"
    if reach >= limit:
        raise ConfigError(
            "ring_bits",
            f"Z_2^{setup.ring_bits} at precision 2^-{setup.frac_bits} holds values below "
            f"±{limit:,.0f}; {what}: the aggregate could overflow",
            "ring_bits=64, or a constrained assignment with a smaller max_size",
        )
