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
from rayfed.privacy import Interval, Neighbours
from rayfed.privacy.measurement import (
    Declared,
    DiscreteLaplace,
    JointDiscreteLaplace,
    Measurement,
    PaddedDiscreteLaplace,
    SplitDiscreteLaplace,
)
from rayfed.protocols.hfl_kmeans.config import HflKmeansConfig
from rayfed.secagg import SecAggParams
from rayfed.secagg.mpc import BitGeometric

#: the member (of the cohorts group) that deals the MPC's correlated randomness (ring_noise=mpc)
DEALER = "dealer"
NOISE_TAIL = 50.0  # overflow check: |Laplace| > 50 scales has probability e^-50
RELATION = Neighbours("add_or_remove_one", "data point")


@dataclass(frozen=True)
class Noise:
    """One block of the aggregate — ``length`` entries (the ``key`` ones: sums, counts or
    centroids) — and the :class:`Measurement` that releases it: its Δ₁ in grid units, its
    mechanism (the server's noise on padded words, a client's own noise, its share of one
    split noise, or its share of a jointly sampled one) and its event."""

    key: str
    measurement: Measurement
    length: int

    @property
    def label(self) -> str:
        return self.measurement.label

    @property
    def l1_sensitivity(self) -> int:
        return int(self.measurement.sensitivity)

    @property
    def event(self):
        return self.measurement.event

    @property
    def sampler(self) -> BitGeometric | None:
        """The MPC's plan of the coins (ring_noise=mpc), else None."""
        return getattr(self.measurement.mechanism, "sampler", None)

    @property
    def epsilon(self) -> float:
        """ε of one draw (what the realised parameter buys, where sampled jointly)."""
        mechanism = self.measurement.mechanism
        return mechanism.epsilon if hasattr(mechanism, "epsilon") else self.event.epsilon

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
    the clients; N is a public input of the run (planned, spec A3)."""

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
    threat_model: str = "semi-honest"  # the server masking=pairwise's secure sum is sized for
    #: per block key: (the thesis's Δ₁, the true Δ₁), in grid units, where they differ
    sensitivity: dict[str, tuple[float, int]] = field(default_factory=dict)
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

    @property
    def measurements(self) -> tuple[Measurement, ...]:
        return tuple(block.measurement for block in self.noise)

    def event(self):
        """The DP event of one iteration's noise (one client's, on the ring)."""
        return noise_event([block.event for block in self.noise])

    def charge(self, scope: str, label: str) -> tuple[str, str, Any]:
        """The ledger charge of one iteration's release — one entry, since one message carries
        every block's noise: the blocks' measurements composed."""
        charges = [block.measurement.charge(scope) for block in self.noise]
        if len(charges) == 1:
            return charges[0]
        return scope, label, noise_event([event for _, _, event in charges])


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
class Evaluation:
    """Ground truth (``evaluate``): every point in the unit cube, for the WCSS and silhouette of
    the released centroids. Not private; never sent to an actor."""

    x: np.ndarray


@dataclass(frozen=True)
class Params:
    """The feature columns in order and their declared bounds (the centroids' data units), the
    public setup of the planned N, and what entering the domain clipped."""

    features: list[str]
    lo: np.ndarray
    hi: np.ndarray
    setup: Setup | None = None
    clipped: tuple = ()  # rayfed.privacy.Clipped per feature column


def noise_event(events: list):
    return events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)


def derive_setup(cfg: HflKmeansConfig, n: int, d: int) -> Setup:
    """The thesis's public arithmetic for N points in d dimensions under ``cfg``, and the
    measurements of every iteration's release."""
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
        threat_model=cfg.threat_model,
    )
    fixed = None if cfg.iterations == "auto" else cfg.iterations
    if cfg.noise == "none":
        return Setup(**common, t_max=fixed or dplloyd.NON_PRIVATE_ITERATIONS)
    eps_m = epsilon_m(cfg, n, d, e, bounds)
    t_max = fixed or dplloyd.iterations(cfg.epsilon, eps_m)
    plan = _nma_noise(cfg, d, e, t_max) if nma else _amn_noise(cfg, d, e, t_max, bounds)
    honest = _honest(cfg)
    noise = tuple(_measured(cfg, block, honest) for block in plan.pop("blocks"))
    # the thesis's calibration buys a larger ε where its Δ is below the truth
    claimed = cfg.epsilon if cfg.sensitivity == "thesis" and plan["sensitivity"] else None
    return Setup(
        **common,
        t_max=t_max,
        epsilon_m=eps_m,
        honest=honest,
        noise=noise,
        claimed_epsilon=claimed,
        **plan,
    )


def epsilon_m(cfg: HflKmeansConfig, n: int, d: int, e: int, bounds: dplloyd.SizeBounds) -> float:
    """ε^(m) of the iteration rule t_max = clip(ε/ε^(m), 2, 7): the thesis's (§3.5.5, §3.6.4),
    which keeps one iteration's centroid MSE under 1/500 with the thesis's noise. With
    ``sensitivity=corrected`` a block's noise is r = true Δ / thesis Δ times the thesis's, and
    ε^(m) grows by the factor that restores the thesis's MSE. AMN: its MSE is the centroids'
    noise alone, so the factor is r (≈ 2k constrained). NMA: the sums' r (2k - 1 constrained at
    E = 1, 2k at E > 1, 2 non-exclusive, 1 unconstrained) and the counts' r_C (1: their Δ is the
    thesis's) enter the model (6.1) with the split fixed (ε^Σ = ε^(t)/(d + c), ε^C =
    c·ε^(t)/(d + c), c = ∛(4dρ²)) as MSE ∝ (d + c)²(r²d + r_C²c)/ε^(t)² against the thesis's
    (d + c)³/ε^(t)², so the factor is √((r²d + r_C²c)/(d + c)) (12.8 for r = 15, d = 2). All
    public (N, k, d, E, M, the sizes); the factor is 1 where the Δ agree (unconstrained NMA)."""
    k = cfg.k
    constrained = cfg.assignment != "unconstrained"
    if cfg.aggregation == "nma":
        eps_m = dplloyd.nma_epsilon_m(n, k, d, e, cfg.rho)
        sums = dplloyd.sums_sensitivity(cfg.assignment, k, e) / e
        counts = dplloyd.counts_sensitivity(cfg.assignment, k, e) / e
        c = dplloyd.split_constant(d, cfg.rho)
        ratio = math.sqrt((sums**2 * d + counts**2 * c) / (d + c))
    else:
        eps_m = dplloyd.amn_epsilon_m(bounds.c_min if constrained else 0, k, d, e)
        scale = 1 << cfg.frac_bits
        true = dplloyd.centroid_sensitivity_grid(
            cfg.assignment, k, d, e, cfg.clients, bounds.client_min, scale
        )
        ratio = true / (
            d * dplloyd.centroid_sensitivity_thesis(bounds.c_min, e, constrained) * scale
        )
    return eps_m if cfg.sensitivity == "thesis" else eps_m * max(ratio, 1.0)


@dataclass(frozen=True)
class _Block:
    """A block before its mechanism is chosen: its true Δ₁ (grid units) with the domain or the
    reason it comes from, and the ε one draw spends against it."""

    key: str
    length: int
    domain: Interval
    sensitivity: Declared | None  # None: derived from the domain (a sum of bounded points)
    epsilon: float

    @property
    def l1(self) -> int:
        if self.sensitivity is not None:
            return int(self.sensitivity.value)
        return int(self.domain.radius(1))


def _measured(cfg: HflKmeansConfig, block: _Block, honest: int | None) -> Noise:
    """The block's measurement under the run's topology: the server's noise on the padded
    aggregate, every client's own noise (ring, local), a 1/h share of one noise (ring, split) or
    a share of one noise the clients sample jointly (ring, mpc: its coins planned for
    DLap(ε/Δ₁), charged at the ε their realised parameter buys, a' ≈ a; the gap is ~1e-9
    relative with κ = 128)."""
    where = {"server": "server noise on the padded aggregate"}.get(cfg.topology)
    if cfg.topology == "ring":
        where = {
            "local": "each client's own noise (ring)",
            "split": f"split noise, 1/{honest} shares (ring)",
            "mpc": "noise sampled jointly by the clients' MPC (ring)",
        }[cfg.ring_noise]
    if cfg.topology == "server":
        mechanism = PaddedDiscreteLaplace(block.epsilon, cfg.ring_bits)
    elif cfg.ring_noise == "local":
        mechanism = DiscreteLaplace(block.epsilon)
    elif cfg.ring_noise == "split":
        mechanism = SplitDiscreteLaplace(block.epsilon, honest)
    else:
        sampler = BitGeometric.plan(block.epsilon / block.l1)
        # 2·length truncated geometric variables: their total variations add up
        tail = 2 * block.length * sampler.tail
        _check_truncation(cfg, block.epsilon, tail)
        mechanism = JointDiscreteLaplace(sampler.noise_parameter, tail, sampler)
    label = f"cluster {block.key}: {where}"
    measurement = Measurement(label, mechanism, block.domain, RELATION, block.sensitivity)
    return Noise(block.key, measurement, block.length)


#: the most δ the MPC sampler's truncation may add to a block's ε-DP release
MAX_TRUNCATION_DELTA = 1e-9


def _check_truncation(cfg: HflKmeansConfig, epsilon: float, tail: float) -> None:
    """ConfigError naming ``epsilon`` when the MPC sampler's truncation adds δ = (1 + e^ε)·tail
    above :data:`MAX_TRUNCATION_DELTA` (computed in logs: e^ε overflows past ε ≈ 709)."""
    log_delta = epsilon + math.log1p(math.exp(-epsilon)) + math.log(tail) if tail > 0 else -math.inf
    if log_delta > math.log(MAX_TRUNCATION_DELTA):
        raise ConfigError(
            "epsilon",
            f"ε = {cfg.epsilon:g} gives a block ε = {epsilon:g}, for which ring_noise=mpc's "
            f"truncated sampler adds δ = (1 + e^ε)·tail ≈ 10^{log_delta / math.log(10):.1f} "
            f"> {MAX_TRUNCATION_DELTA:g} (its coins stop at a fixed precision, and e^ε magnifies "
            "what they cut off)",
            "a smaller epsilon, or ring_noise=split / local",
        )


def _honest(cfg: HflKmeansConfig) -> int | None:
    """h of the split ring noise (None: each client's noise is its own)."""
    if cfg.topology != "ring" or cfg.ring_noise != "split":
        return None
    if cfg.honest_clients == "majority":
        return min(cfg.clients // 2 + 1, cfg.clients - 1)
    return cfg.honest_clients


def _grid_point(scale: int, d: int) -> Interval:
    """A point's coordinates on the grid: [-1, 1]^d (the declared bounds mapped) x 2^f, rounded:
    exactly [-2^f, 2^f]^d."""
    return Interval(-dplloyd.BOUND * scale, dplloyd.BOUND * scale, d)


def _nma_noise(cfg: HflKmeansConfig, d: int, e: int, t_max: int) -> dict[str, Any]:
    """DPLloyd's split of ε over the sums and counts, and their blocks in grid units. The sums'
    Δ₁ is derived from the grid point's domain where only the point's own cluster changes
    (unconstrained); under a size bound it moves other points (dplloyd.sums_sensitivity), a
    bound the domain rule does not cover, declared with its reason. With sensitivity=thesis the
    noise is the thesis's (Δ^Σ = B·E per coordinate, Δ^C = E), charged at the ε it buys
    against the true Δ₁."""
    k, scale = cfg.k, 1 << cfg.frac_bits
    eps_sum, eps_count = dplloyd.nma_split(cfg.epsilon, t_max, d, cfg.rho)
    point = _grid_point(scale, d)
    sums_factor = dplloyd.sums_sensitivity(cfg.assignment, k, e)
    counts_factor = dplloyd.counts_sensitivity(cfg.assignment, k, e)
    true_sums = sums_factor * d * scale
    true_counts = counts_factor * scale
    sums_reason = counts_reason = None
    if cfg.assignment == "non-exclusive":
        sums_reason = Declared(
            true_sums,
            f"non-exclusive: each of the k = {k} clusters keeps its size, so one point may "
            "swap a point in or out of every cluster: 2k·d·B on the 2^-f grid",
        )
        counts_reason = Declared(
            true_counts,
            f"non-exclusive: the k = {k} fixed sizes move only where a client has fewer rows "
            "than a size: k on the grid",
        )
    elif cfg.assignment == "constrained":
        path = (
            f"2k - 1 = {sums_factor}"
            if e == 1
            else f"2k·E = {sums_factor} (E = {e} paths, each may end at the escape node)"
        )
        sums_reason = Declared(
            true_sums,
            f"size-constrained min-cost flow: one point's augmenting path enters it and moves up "
            f"to k - 1 = {k - 1} other points between clusters, so the sums move by up to {path} "
            "times d·B on the 2^-f grid (assumes the flow's optimum unique up to equal points)",
        )
        counts_reason = Declared(
            true_counts,
            f"size-constrained min-cost flow: displaced points keep the counts; the point's "
            f"E = {e} memberships move them by E on the grid",
        )
    thesis_sums, thesis_counts = e * d * scale, e * scale
    blocks = [
        _Block("sums", k * d, point, sums_reason, d * eps_sum),
        _Block("counts", k, Interval(0.0, float(scale), 1), counts_reason, eps_count),
    ]
    sensitivity = {"sums": (thesis_sums, true_sums), "counts": (thesis_counts, true_counts)}
    if cfg.sensitivity == "thesis":
        # the thesis's noise scale Δ_thesis/ε; the charge is what that scale buys
        blocks = [
            b
            if b.l1 == thesis
            else _Block(b.key, b.length, b.domain, b.sensitivity, b.epsilon * b.l1 / thesis)
            for b, thesis in zip(blocks, (thesis_sums, thesis_counts), strict=True)
        ]
    return {
        "split": {"eps_sum": eps_sum, "eps_count": eps_count},
        "blocks": blocks,
        "sensitivity": {key: v for key, v in sensitivity.items() if v[0] != v[1]},
    }


def _amn_noise(
    cfg: HflKmeansConfig, d: int, e: int, t_max: int, bounds: dplloyd.SizeBounds
) -> dict[str, Any]:
    """CDPLloyd's ε^μ and the centroid block, calibrated to the true sensitivity — a mean, not a
    sum, so no domain rule: declared with its reason — or, with sensitivity=thesis, to the
    thesis's Δ^μ = B·E/c_min, charged at the ε that noise actually buys."""
    constrained = cfg.assignment != "unconstrained"
    scale = 1 << cfg.frac_bits
    eps_mu = dplloyd.amn_epsilon(cfg.epsilon, t_max, d)
    l1 = dplloyd.centroid_sensitivity_grid(
        cfg.assignment, cfg.k, d, e, cfg.clients, bounds.client_min, scale
    )
    thesis = dplloyd.centroid_sensitivity_thesis(bounds.c_min, e, constrained)
    why = {
        "unconstrained": "a local cluster goes from empty (the previous centroid, in the box) "
        "to one point: 2B/M per coordinate",
        "non-exclusive": f"each of the k = {cfg.k} local clusters (size ⌈c_min/M⌉ = "
        f"{bounds.client_min}) may swap one point: 2B/(M·{max(bounds.client_min, 1)}) per "
        "coordinate",
        "constrained": f"size-constrained min-cost flow: the augmenting path replaces a point "
        f"in up to k - 1 = {cfg.k - 1} local clusters (2B/(M·⌈c_min/M⌉) per coordinate, "
        f"⌈c_min/M⌉ = {bounds.client_min}) and adds one to the last (2B/(M(⌈c_min/M⌉ + 1))); "
        f"E = {e} paths (assumes the flow's optimum unique up to equal points)",
    }[cfg.assignment]
    reason = Declared(
        l1,
        f"uploaded local centroids / M on the 2^-f grid: {why}; each rounded coordinate moves "
        "by at most ⌊move·2^f⌋ + 1",
    )
    epsilon = d * eps_mu
    if cfg.sensitivity == "thesis":
        # the thesis's noise scale Δ^μ/ε^μ; the charge is what that scale buys against the truth
        epsilon = eps_mu * l1 / (thesis * scale)
    block = _Block("centroids", cfg.k * d, _grid_point(scale, d), reason, epsilon)
    return {
        "split": {"eps_mu": eps_mu},
        "blocks": [block],
        "sensitivity": {"centroids": (d * thesis * scale, l1)},
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


def sum_params(
    m: int, honest: int | None = None, threat_model: str = "semi-honest"
) -> SecAggParams:
    """SecAgg on the complete graph over m parties, quorum m (any drop aborts before the unmask).

    Semi-honest: the coordinator with c colluding clients holds c Shamir shares of every other
    client's keys and unmasks one upload once c >= t. Threshold t = max(2, ⌊m/2⌋ + 1), at most
    m - 1: a server with fewer than t clients sees no upload. With split noise (``honest`` = h >= 2)
    an upload carries only a 1/h share of the noise and the release is claimed DP against any
    m - h clients, so t >= m - h + 1 (<= m - 1 as h >= 2); at h = 1 every upload carries full
    noise.

    Malicious: a server that may show clients different dropout claims isolates one upload once
    2t <= (m - 1) + c (secagg.params: the victim's honest holders answer one kind of share each,
    the c corrupt ones both). The quorum is m, so no dropout tolerance is lost by the largest
    threshold, t = m - 1, which holds against c <= :func:`malicious_coalition` = m - 2 clients
    (m >= 3; this covers the split noise's m - h as h >= 2)."""
    if threat_model == "malicious":
        if m < 3:
            raise ConfigError(
                "threat_model",
                f"malicious needs M >= 3 clients (with M = {m} the one other client's shares "
                "decide alone)",
                "clients >= 3, or threat_model=semi-honest",
            )
        return SecAggParams(m, m - 1, m - 1, m, True, -math.inf, -math.inf, "malicious")
    t = max(2, m // 2 + 1)
    if honest is not None and honest >= 2:
        t = max(t, m - honest + 1)
    t = min(m - 1, t)
    return SecAggParams(m, m - 1, t, m, True, -math.inf, -math.inf)


def malicious_coalition(m: int) -> int:
    """The most clients a malicious server may corrupt against :func:`sum_params`'s t = m - 1:
    the isolation needs 2t <= m - 1 + c, i.e. c >= m - 1."""
    return m - 2
