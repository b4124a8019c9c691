"""The distributed-DP pipeline around secure aggregation: real vectors in, ring words out, and back.

Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation" (ICML 2021, Algorithms 1-2), and Agarwal, Kairouz & Liu, "The Skellam
Mechanism for Differentially Private Federated Learning" (NeurIPS 2021), as TensorFlow Federated's
``DistributedDpSumFactory`` composes them. Per user (a row; every step vectorised over users and
coordinates):

1. clip to ℓ2 norm ``clip``;
2. rotate: zero-pad to ``padded_dim`` = the next power of two, multiply by public random signs
   (from ``rotation_seed``), apply the normalised Walsh-Hadamard transform H/√padded_dim
   (orthonormal, so the norm is kept and the inverse is the same transform then the signs);
3. scale by γ (``gamma``: a multiplier here — the papers' rounding granularity is 1/γ);
4. conditional randomized rounding: each coordinate to floor or ceil with probability its
   fractional part, the rows whose integer ℓ2 norm exceeds ``l2_bound`` (Kairouz et al. Thm. 1 /
   §4.1 with its β) rounded again until they fit — so the integer vector's norm is *exactly*
   bounded (the check is in integers), and that bound is the sensitivity the DP event needs;
5. add the integer noise (any callable ``noise(shape) -> int64``: the mechanism is the caller's);
6. reduce mod 2^bits: :class:`~rayfed.secagg.encoding.RingWords` for ``secure_sum``.

Server (:meth:`DdpPlan.decode`): the sum's words mod 2^bits → centred integers in
[-2^(bits-1), 2^(bits-1)) → divided by γ → inverse rotation → the first ``dim`` coordinates.

γ is the largest scale whose modular-clipping bound (:meth:`DdpPlan.modular_clip_bound`, a
Chernoff bound on every coordinate of the noisy integer sum, union over ``padded_dim``) is at most
``modclip_prob``. The bound is rigorous for the pipeline as built (no normal approximation):

* the signal coordinate γ(HDΣx)_j is a Rademacher sum over the public signs D with variance proxy
  γ²‖Σx‖²/padded_dim ≤ γ²(n·clip)²/padded_dim;
* each rounding error lies in an interval of length ≤ 1 with mean 0 (Hoeffding: proxy 1/4);
  conditioning on the norm check multiplies a user's moment generating function by at most
  1/P[accepted] ≤ 1/(1-β), so the bound carries a factor (1-β)^-n — negligible for the default
  β = 1e-6, large for the paper's e^-1/2 at large n (hence the default);
* the noise: discrete Gaussian N_Z(0, σ²) is σ²-sub-Gaussian (Canonne, Kamath & Steinke 2020);
  a Skellam share Poisson(μ)-Poisson(μ) has log-MGF 2μ(cosh λ - 1), exactly.

The modular-clipping bound is a probability over the public random signs: it holds for inputs
chosen independently of them. An adversary who knows the signs before choosing inputs (the same
``rotation_seed`` and ``round`` every time) can align every user's vector and wrap the sum while the
bound reads 1e-6: derive the signs per round from randomness drawn after the inputs are fixed (the
PKI's beacon in a secure round), and never reuse a seed across rounds. A wrap is bounded, not
detected.

What is exact: the integer pipeline (the norm check, the noise, the sum mod 2^bits, the
centring); the decode is float64 (rotation error ~1e-15 relative). What is a bound: the
modular-clipping probability, and the rounded norm bound's tightness (never its validity).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from rayfed import rng
from rayfed.errors import ConfigError
from rayfed.secagg.encoding import RingWords

__all__ = [
    "DEFAULT_BETA",
    "NOISE_KINDS",
    "DdpPlan",
    "DdpReport",
    "RoundingStats",
    "conditional_round",
    "fwht",
    "plan",
    "plan_calibrated",
    "plan_for_multiplier",
    "rounded_norm_bound",
]

#: the noise families the clipping bound knows (the samplers are the caller's: ``noise=``)
NOISE_KINDS = ("none", "discrete_gaussian", "skellam")
#: conditional rounding's β: P[a rounding fails the norm check] ≤ β (Kairouz et al. Thm. 1). The
#: paper suggests e^-1/2; 1e-6 costs √(2 ln 1e6) ≈ 5.3 instead of 1 in the bound's cross term and
#: keeps the clipping bound's conditioning factor (1-β)^-n near 1 up to n ≈ 10^5.
DEFAULT_BETA = 1e-6
MAX_BITS = 62
#: integer norms are checked as exact int64 sums of squares: the bound's square stays below this
_MAX_NORM_SQ = 1 << 61


def _next_pow2(d: int) -> int:
    return 1 << max(0, (int(d) - 1).bit_length())


def fwht(x: np.ndarray) -> np.ndarray:
    """The normalised Walsh-Hadamard transform H/√m of each row of ``x`` (rows x m, m a power of
    two), in Sylvester's order (``scipy.linalg.hadamard``). Orthonormal and symmetric: it is its
    own inverse."""
    x = np.array(x, dtype=np.float64, copy=True)
    rows, m = x.shape
    if m & (m - 1):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two width, got {m}")
    h = 1
    while h < m:
        y = x.reshape(rows, m // (2 * h), 2, h)
        a = y[:, :, 0, :].copy()
        y[:, :, 0, :] += y[:, :, 1, :]
        y[:, :, 1, :] = a - y[:, :, 1, :]
        h *= 2
    return x / math.sqrt(m)


def rounded_norm_bound(norm: float, dim: int, beta: float) -> float:
    """Kairouz et al.'s bound on ‖round(y)‖₂ for ‖y‖₂ ≤ ``norm`` (integer grid, ``dim``
    coordinates): min(norm + √dim, √(norm² + dim/4 + √(2 ln 1/β)·(norm + √dim/2))); the first
    holds always, the second fails with probability ≤ β per rounding (β = 0: the first only)."""
    first = norm + math.sqrt(dim)
    if beta <= 0:
        return first
    second = math.sqrt(
        norm**2 + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (norm + math.sqrt(dim) / 2)
    )
    return min(first, second)


Uniforms = Callable[[np.ndarray, int], np.ndarray]


def _uniforms(rounding: np.random.Generator | Uniforms, width: int) -> Uniforms:
    """The rounding's uniforms as ``u(rows, attempt) -> (len(rows), width)``: a Generator's next
    draws, or the caller's keyed function (e.g. ``ctx.noise.user_uniform`` per user id, so a
    user's rounding does not depend on its cohort)."""
    if isinstance(rounding, np.random.Generator):
        return lambda rows, attempt: rounding.random((len(rows), width))
    return rounding


def conditional_round(
    y: np.ndarray, bound_sq: int, rounding: np.random.Generator | Uniforms, max_tries: int = 1000
) -> tuple[np.ndarray, int]:
    """Round each row of ``y`` to the integers, coordinate j up with probability frac(y_j),
    again for the rows whose integer Σ round(y)_j² exceeds ``bound_sq`` (only those rows, until
    none does). Returns the int64 rows and the number of row re-roundings.

    Raises RuntimeError after ``max_tries`` attempts (a bound the rows cannot meet)."""
    y = np.asarray(y, dtype=np.float64)
    floor = np.floor(y)
    frac = y - floor
    floor = floor.astype(np.int64)
    draw = _uniforms(rounding, y.shape[1])
    out = floor + (draw(np.arange(len(y)), 0) < frac)
    redo = np.flatnonzero(np.einsum("ij,ij->i", out, out) > bound_sq)
    rerounds = 0
    attempt = 1
    while redo.size:
        if attempt >= max_tries:
            raise RuntimeError(
                f"conditional rounding: {redo.size} row(s) still above the norm bound after "
                f"{max_tries} tries"
            )
        rerounds += redo.size
        out[redo] = floor[redo] + (draw(redo, attempt) < frac[redo])
        sq = np.einsum("ij,ij->i", out[redo], out[redo])
        redo = redo[sq > bound_sq]
        attempt += 1
    return out, rerounds


@dataclass(frozen=True)
class RoundingStats:
    """What one :meth:`DdpPlan.encode` call saw (merge several with :meth:`DdpPlan.report`)."""

    rows: int
    clipped: int  # rows whose ℓ2 norm exceeded ``clip`` (scaled down to it)
    rerounds: int  # row re-roundings of the conditional rounding
    max_norm_sq: int  # the largest Σ round(y)_j² (integers, before noise)


@dataclass(frozen=True)
class DdpReport:
    """What a run reports about the pipeline."""

    bits: int
    gamma: float
    padded_dim: int
    #: the bound on P[some coordinate of the noisy integer sum wraps mod 2^bits]
    modular_clip_bound: float
    #: Δ₂ / (γ·clip): the rounded norm bound over the scaled clip
    inflation_bound: float
    #: EVALUATION ONLY, not a release (exact, data-dependent, not noised, not in the ledger: a
    #: protocol must not publish them as a result): max over users of ‖round(y)‖₂ / (γ·clip),
    #: the rows clipped and the re-roundings
    inflation_realised: float
    rows: int
    clipped: int
    rerounds: int


@dataclass(frozen=True)
class DdpPlan:
    """The resolved parameters of one pipeline (build it with :func:`plan`)."""

    dim: int
    padded_dim: int
    users: int
    clip: float
    bits: int
    gamma: float
    beta: float
    noise: str
    #: each user's noise variance in integer units (γ²·noise_std²/users)
    noise_variance: float
    modclip_prob: float
    rotation_seed: int
    round: int = 0
    max_tries: int = 1000

    # --- sensitivity, in integer units -------------------------------------------------------
    @property
    def l2_bound_sq(self) -> int:
        """⌊Δ₂²⌋: every user's rounded integer vector has Σ x_j² ≤ this, exactly."""
        return math.floor(
            rounded_norm_bound(self.gamma * self.clip, self.padded_dim, self.beta) ** 2
        )

    @property
    def l2_bound(self) -> float:
        """Δ₂: the ℓ2 sensitivity of the integer sum for zero-out neighbours (one user's vector
        replaced by zero, its noise share still in the sum: the relation the distributed events
        account, ``relation=replace_special``); replace-one is 2·Δ₂, and add/remove also changes
        the number of noise shares, which the events do not cover."""
        return math.sqrt(self.l2_bound_sq)

    @property
    def l1_bound(self) -> int:
        """Δ₁ ≤ min(√padded_dim·Δ₂, Δ₂²): an integer vector has |x_j| ≤ x_j² (Skellam's RDP)."""
        return min(math.floor(math.sqrt(self.padded_dim * self.l2_bound_sq)), self.l2_bound_sq)

    @property
    def poisson_mean(self) -> float:
        """The mean of each Poisson in a user's Skellam share Poisson(m) - Poisson(m): half the
        share's variance (the events and ``skellam_variance`` speak of the variance)."""
        return self.noise_variance / 2

    @property
    def inflation_bound(self) -> float:
        """Δ₂ / (γ·clip): what rounding adds to the sensitivity (and so to the noise)."""
        return self.l2_bound / (self.gamma * self.clip)

    @property
    def noise_multiplier(self) -> float:
        """The sum's integer noise std over Δ₂: √(users·noise_variance) / l2_bound."""
        return math.sqrt(self.users * self.noise_variance) / self.l2_bound

    @property
    def mse_bound(self) -> float:
        """An upper bound on the decoded sum's mean squared error per coordinate (data units)
        when ``users`` users take part and nothing wraps: (users/4 + users·noise_variance)/γ²
        (a rounding error's variance is p(1-p) ≤ 1/4; the rotation is orthonormal, so the
        per-coordinate average is kept). Equal to it for Skellam noise and rounding at p = ½;
        a discrete Gaussian's variance is slightly below its σ²."""
        return (self.users / 4 + self.users * self.noise_variance) / self.gamma**2

    def modular_clip_bound(self, gamma: float | None = None) -> float:
        """The bound on P[some coordinate of the noisy integer sum of ``users`` users lies
        outside [-2^(bits-1), 2^(bits-1))]: see the module docstring."""
        return _clip_bound(self, self.gamma if gamma is None else gamma)

    def signs(self) -> np.ndarray:
        """The rotation's public random signs (±1.0 per padded coordinate)."""
        gen = rng.stream(self.rotation_seed, "ddp-rotation", self.round, 0)
        return gen.integers(0, 2, self.padded_dim).astype(np.float64) * 2 - 1

    # --- client ------------------------------------------------------------------------------
    def keyed_rounding(self, noise, ids, purpose: str = "ddp-rounding") -> Uniforms:
        """The rounding's uniforms keyed by user id (``noise``: a ``rayfed.privacy.NoiseSource``,
        ``ids``: the users of the rows): attempt a of the user in row r is
        ``noise.user_uniform(f"{purpose}/{a}", round, ids[r], padded_dim)``, so a user's rounding
        is the same whichever cohort holds it (seeded runs) and from the actor's secret in a
        secure run; each (attempt, round, user) is drawn once."""
        ids = np.asarray(ids, dtype=np.int64)

        def uniforms(rows: np.ndarray, attempt: int) -> np.ndarray:
            key = ids[rows]
            return noise.user_uniform(f"{purpose}/{attempt}", self.round, key, self.padded_dim)

        return uniforms

    def rotate(self, x: np.ndarray) -> np.ndarray:
        """Rows of ``dim`` reals → rows of ``padded_dim``: pad, random signs, H/√padded_dim."""
        x = np.asarray(x, dtype=np.float64)
        pad = np.zeros((len(x), self.padded_dim))
        pad[:, : self.dim] = x
        return fwht(pad * self.signs())

    def unrotate(self, y: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`rotate`, truncated to ``dim``."""
        return (fwht(np.asarray(y, dtype=np.float64)) * self.signs())[:, : self.dim]

    def clip_rows(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"inputs must be (users x {self.dim}), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ConfigError("inputs", "NaN or infinite input to the distributed-DP pipeline")
        norms = np.sqrt(np.einsum("ij,ij->i", x, x))
        over = norms > self.clip
        factor = np.where(over, self.clip / np.where(over, norms, 1.0), 1.0)
        return x * factor[:, None], int(over.sum())

    def quantise(
        self, x: np.ndarray, rounding: np.random.Generator | Uniforms
    ) -> tuple[np.ndarray, RoundingStats]:
        """Steps 1-4: clip, rotate, scale, conditionally round. int64 rows of ``padded_dim``."""
        clipped, n_clipped = self.clip_rows(x)
        scaled = self.rotate(clipped) * self.gamma
        ints, rerounds = conditional_round(scaled, self.l2_bound_sq, rounding, self.max_tries)
        sq = np.einsum("ij,ij->i", ints, ints)
        stats = RoundingStats(
            rows=len(ints),
            clipped=n_clipped,
            rerounds=rerounds,
            max_norm_sq=int(sq.max()) if sq.size else 0,
        )
        return ints, stats

    def encode(
        self,
        x: np.ndarray,
        rounding: np.random.Generator | Uniforms,
        noise: Callable[[tuple[int, int]], np.ndarray] | None = None,
    ) -> tuple[RingWords, RoundingStats]:
        """The client: rows of ``dim`` reals → (ring words of Z_2^bits, rounding stats).
        ``noise(shape)`` returns each user's integer noise (int64, ``(rows, padded_dim)``)."""
        ints, stats = self.quantise(x, rounding)
        if noise is not None:
            z = np.asarray(noise(ints.shape))
            if z.shape != ints.shape or not np.issubdtype(z.dtype, np.integer):
                raise ValueError(
                    f"noise must return integers of shape {ints.shape}, got {z.dtype} {z.shape}"
                )
            ints = ints + z.astype(np.int64)
        return self.to_words(ints), stats

    def to_words(self, ints: np.ndarray) -> RingWords:
        """Step 6: integers (the quantised rows, plus noise) mod 2^bits, for ``secure_sum``. With
        a mechanism that adds its shares to the rows itself (``rayfed.privacy``'s
        ``discrete_gaussian_shares`` / ``skellam_shares``, which return ``(rows + shares,
        event)``): ``p.to_words(shares(noise, p.quantise(x, u)[0], ...)[0])``."""
        ints = np.asarray(ints)
        if not np.issubdtype(ints.dtype, np.integer):
            raise ValueError(f"ring words come from integers, got {ints.dtype}")
        return RingWords((ints.astype(np.int64) & np.int64((1 << self.bits) - 1)).astype(np.uint64))

    # --- server ------------------------------------------------------------------------------
    def centred(self, words: np.ndarray) -> np.ndarray:
        """Words of Z_2^bits (any integer dtype, reduced here) → int64 in [-2^(bits-1), 2^(bits-1))."""
        shift = np.uint64(64 - self.bits)
        w = np.asarray(words).astype(np.uint64) & np.uint64((1 << self.bits) - 1)
        return (w << shift).view(np.int64) >> np.int64(shift)

    def decode(self, words: np.ndarray) -> np.ndarray:
        """The server: the secure sum's words (``padded_dim``, or rows of them) → the sum of the
        users' clipped vectors plus the noise, in the data's units (``dim`` reals per row)."""
        w = np.atleast_2d(np.asarray(words))
        out = self.unrotate(self.centred(w).astype(np.float64) / self.gamma)
        return out if np.ndim(words) == 2 else out[0]

    def report(self, stats: Sequence[RoundingStats] | RoundingStats) -> DdpReport:
        stats = [stats] if isinstance(stats, RoundingStats) else list(stats)
        max_sq = max((s.max_norm_sq for s in stats), default=0)
        return DdpReport(
            bits=self.bits,
            gamma=self.gamma,
            padded_dim=self.padded_dim,
            modular_clip_bound=self.modular_clip_bound(),
            inflation_bound=self.inflation_bound,
            inflation_realised=math.sqrt(max_sq) / (self.gamma * self.clip),
            rows=sum(s.rows for s in stats),
            clipped=sum(s.clipped for s in stats),
            rerounds=sum(s.rerounds for s in stats),
        )


def _log_clip_bound(p: DdpPlan, gamma: float) -> float:
    """log of the Chernoff bound on P[some |S_j| ≥ 2^(bits-1)] at scale ``gamma``."""
    t = float(1 << (p.bits - 1))
    n = p.users
    # the Gaussian-type variance proxy: signal (Rademacher over the signs) + rounding (Hoeffding)
    a = gamma**2 * (n * p.clip) ** 2 / p.padded_dim + n / 4
    var = p.noise_variance * (gamma / p.gamma) ** 2  # each user's noise variance at gamma
    conditioning = -n * math.log1p(-p.beta) if p.beta > 0 else 0.0
    union = math.log(2 * p.padded_dim)
    if p.noise in ("none", "discrete_gaussian"):
        v = a + (n * var if p.noise == "discrete_gaussian" else 0.0)
        exponent = -(t**2) / (2 * v)
    else:  # Skellam: n shares of variance var each, log-MGF var·(cosh λ - 1) per share
        b = n * var

        def slope(lam: float) -> float:
            return -t + a * lam + b * math.sinh(lam)

        # the root lies below t/a and asinh(t/b); any λ > 0 gives a valid bound, so a cap that
        # keeps cosh finite (a negligible noise, λ beyond 700) only loosens it
        hi = min(t / a, math.asinh(t / b) if b > 0 else math.inf, 700.0)
        lam = brentq(slope, 0.0, hi) if slope(hi) > 0 else hi
        exponent = -lam * t + a * lam**2 / 2 + b * (math.cosh(lam) - 1)
    return union + conditioning + exponent


def _clip_bound(p: DdpPlan, gamma: float) -> float:
    return min(1.0, math.exp(min(0.0, _log_clip_bound(p, gamma))))


def plan(
    *,
    dim: int,
    users: int,
    clip: float,
    bits: int,
    noise_std: float = 0.0,
    noise: str = "discrete_gaussian",
    beta: float = DEFAULT_BETA,
    modclip_prob: float = 1e-6,
    gamma: float | None = None,
    rotation_seed: int = 0,
    round: int = 0,
) -> DdpPlan:
    """Resolve the pipeline for ``users`` users' vectors of ``dim`` reals, each clipped to ℓ2
    norm ``clip``, summed mod 2^``bits``, with total noise of standard deviation ``noise_std``
    on the sum (data units; each user adds a share of variance noise_std²/users).

    ``gamma`` (the scale) is chosen as the largest whose modular-clipping bound is at most
    ``modclip_prob``, capped so that the integer norms stay exact in int64; pass it to fix it
    (the bound is then whatever it is, reported, never refused: a test can force a wrap).

    Raises ConfigError naming the option when no scale fits the bits."""
    if not (isinstance(dim, (int, np.integer)) and dim >= 1):
        raise ConfigError("dim", f"must be an integer >= 1, got {dim!r}")
    if not (isinstance(users, (int, np.integer)) and users >= 1):
        raise ConfigError("users", f"must be an integer >= 1, got {users!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError("clip", f"must be a finite number > 0, got {clip}")
    if not (isinstance(bits, (int, np.integer)) and 2 <= bits <= MAX_BITS):
        raise ConfigError("bits", f"must be an integer in [2, {MAX_BITS}], got {bits!r}")
    if not (math.isfinite(noise_std) and noise_std >= 0):
        raise ConfigError("noise_std", f"must be a finite number >= 0, got {noise_std}")
    if noise not in NOISE_KINDS:
        raise ConfigError("noise", f"unknown noise {noise!r}", NOISE_KINDS)
    if not 0 <= beta < 1:
        raise ConfigError("beta", f"must be in [0, 1), got {beta}")
    if not 0 < modclip_prob < 1:
        raise ConfigError("modclip_prob", f"must be in (0, 1), got {modclip_prob}")
    if noise == "none" and noise_std > 0:
        raise ConfigError("noise", "noise=none with noise_std > 0", "a noise kind, or noise_std=0")
    padded = _next_pow2(int(dim))
    share_var = noise_std**2 / users  # per user, data units

    def at(g: float) -> DdpPlan:
        return DdpPlan(
            dim=int(dim),
            padded_dim=padded,
            users=int(users),
            clip=float(clip),
            bits=int(bits),
            gamma=g,
            beta=float(beta),
            noise=noise,
            noise_variance=share_var * g**2,
            modclip_prob=float(modclip_prob),
            rotation_seed=int(rotation_seed),
            round=int(round),
        )

    cap = (math.sqrt(_MAX_NORM_SQ) - math.sqrt(padded)) / clip
    if gamma is not None:
        if not (math.isfinite(gamma) and 0 < gamma <= cap):
            raise ConfigError("gamma", f"must be in (0, {cap:.4g}], got {gamma}")
        return at(float(gamma))
    log_target = math.log(modclip_prob)

    def fits(g: float) -> bool:
        return _log_clip_bound(at(g), g) <= log_target

    lo = 1e-12
    if not fits(lo):
        raise ConfigError(
            "bits",
            f"{bits} bits cannot hold the sum of {users} users' rounding errors with "
            f"modular-clipping probability <= {modclip_prob:g} at any scale",
            "more bits, fewer users per sum, or a larger modclip_prob",
        )
    if fits(cap):
        return at(cap)
    hi = cap
    for _ in range(200):  # bisection on log γ: the bound grows with γ
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if hi / lo < 1 + 1e-12:
            break
    return at(lo)


def plan_for_multiplier(multiplier: float, **options) -> DdpPlan:
    """:func:`plan` with the sum's noise std set to ``multiplier`` × the *rounded* sensitivity
    Δ₂ (integer units) — what a Gaussian-type calibration of (ε, δ) against Δ₂ asks for. γ
    depends on the noise and Δ₂ on γ, so this iterates noise_std = multiplier·Δ₂/γ to a fixed
    point (the inflation Δ₂/(γ·clip) changes little with γ: a few steps)."""
    if not (math.isfinite(multiplier) and multiplier > 0):
        raise ConfigError("noise_multiplier", f"must be a finite number > 0, got {multiplier}")
    std = multiplier * options["clip"]
    for _ in range(50):
        p = plan(**options, noise_std=std)
        new = multiplier * p.l2_bound / p.gamma
        if abs(new - std) <= 1e-12 * std:
            break
        std = new
    # noise_std fixed, Δ₂ from the final γ: the plan's multiplier is at least the one asked for
    return p if p.noise_multiplier >= multiplier * (1 - 1e-9) else plan(**options, noise_std=new)


def plan_calibrated(share_variance: Callable[[DdpPlan], float], **options) -> DdpPlan:
    """:func:`plan` with each user's integer noise variance set by a calibration that depends on
    the plan's own sensitivity: ``share_variance(p)`` is the per-user variance (integer units) a
    mechanism needs for (ε, δ) at ``p.l2_bound`` / ``p.l1_bound`` — e.g.
    ``lambda p: ddg_sigma2(eps, delta, l2_sensitivity=p.l2_bound, quorum=q,
    dim=p.padded_dim)`` with q the least number of surviving users the run accepts (zero-out
    neighbours: the events' relation). γ depends on the noise and Δ₂ on γ: iterated to a fixed point, then the
    noise nudged up until the plan's variance is at least what its own Δ₂ asks for."""
    users = options["users"]
    std = 0.0
    p = plan(**options, noise_std=std)
    for _ in range(60):
        new = math.sqrt(share_variance(p) * users) / p.gamma
        if abs(new - std) <= 1e-9 * max(new, 1e-300):
            break
        std = new
        p = plan(**options, noise_std=std)
    for _ in range(200):
        if p.noise_variance >= share_variance(p):
            return p
        std *= 1 + 1e-6
        p = plan(**options, noise_std=std)
    raise RuntimeError("plan_calibrated: the noise did not settle (γ and Δ₂ keep moving)")
