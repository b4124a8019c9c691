"""Noise mechanisms: the only way rayfed draws DP noise.

Each mechanism takes the step's :class:`~rayfed.privacy.source.NoiseSource` (``ctx.noise``) as its
first argument, draws from the stream the run's randomness dictates (seeded, or the OS in a secure
run), registers the event it drew under with that step, and returns ``(release, event)``: the noisy
output and the ``dp_accounting`` event that describes it exactly. A message may carry only events
its step registered, and the coordinator's ledger must hold a charge equal to it, so a charge is
always the event of noise actually drawn. Build charges with the ``*_event`` functions, which are
the mechanisms' own constructors (the ledger matches events exactly, float for float).

Sensitivities and scales are arguments, never derived from the data. ``round`` and ``ident`` key
the stream (with a per-actor draw counter, so two calls never reuse noise); mechanisms keyed per
user (``ids``) draw each user's noise from its own stream, so a seeded run gives every user the same
noise whichever cohort hosts it.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from dp_accounting import dp_event

from rayfed.errors import ConfigError
from rayfed.privacy.integer import exact_sigma2
from rayfed.privacy.ledger import (
    DistributedDiscreteGaussianDpEvent,
    EpsilonDeltaDpEvent,
    SkellamDpEvent,
)
from rayfed.privacy.source import NoiseSource


def _positive(name: str, value: float) -> float:
    real = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if not (real and math.isfinite(value) and value > 0):
        raise ConfigError(name, f"must be a finite number > 0, got {value!r}")
    return float(value)


def laplace_event(l1_sensitivity: float, epsilon: float) -> dp_event.LaplaceDpEvent:
    """The event of :func:`laplace` — build a charge with this, so it equals the drawn event."""
    sens = _positive("l1_sensitivity", l1_sensitivity)
    return dp_event.LaplaceDpEvent(noise_multiplier=sens / _positive("epsilon", epsilon) / sens)


def _drawn(noise: NoiseSource, release, event, part_of: str | None = None):
    noise.register(event, release, part_of=part_of)
    return release, event


def laplace(
    noise: NoiseSource,
    values,
    *,
    l1_sensitivity: float,
    epsilon: float,
    round: int = 0,
    ident=None,
):
    """Add Lap(Δ₁/ε) noise to every coordinate of ``values``: ε-DP for ℓ₁ sensitivity Δ₁."""
    event = laplace_event(l1_sensitivity, epsilon)
    scale = float(l1_sensitivity) / float(epsilon)
    return _drawn(noise, draw_laplace(noise, values, scale=scale, round=round, ident=ident), event)


def draw_laplace(noise: NoiseSource, values, *, scale: float, round: int = 0, ident=None):
    """``values`` + Lap(scale) on every coordinate (the draw alone: nothing registered)."""
    values = np.asarray(values, dtype=np.float64)
    gen = noise.generator("laplace", round, ident)
    return values + gen.laplace(0.0, scale, size=values.shape)


def gaussian_event(noise_multiplier: float) -> dp_event.GaussianDpEvent:
    """The event of :func:`gaussian`: σ = noise_multiplier · Δ₂."""
    return dp_event.GaussianDpEvent(
        noise_multiplier=_positive("noise_multiplier", noise_multiplier)
    )


def gaussian(
    noise: NoiseSource,
    values,
    *,
    l2_sensitivity: float,
    noise_multiplier: float,
    round: int = 0,
    ident=None,
    ids=None,
    purpose: str = "gaussian",
    part_of: str | None = None,
):
    """Add N(0, σ²) to every coordinate, σ = noise_multiplier · Δ₂.

    With ``ids`` the rows of ``values`` are users and each row's noise is keyed by (``purpose``,
    round, user id) — no draw counter there, so two such draws in one round need two purposes.
    ``part_of`` names the release (carried, with its event, by another message) this draw
    belongs to; otherwise the step's message must carry the returned event.
    """
    event = gaussian_event(noise_multiplier)
    sigma = event.noise_multiplier * _positive("l2_sensitivity", l2_sensitivity)
    release = draw_gaussian(
        noise, values, sigma=sigma, round=round, ident=ident, ids=ids, purpose=purpose
    )
    return _drawn(noise, release, event, part_of)


def draw_gaussian(
    noise: NoiseSource, values, *, sigma: float, round=0, ident=None, ids=None, purpose="gaussian"
):
    """``values`` + N(0, σ²) on every coordinate, keyed per row by user id with ``ids`` (the
    draw alone: nothing registered)."""
    values = np.asarray(values, dtype=np.float64)
    if ids is None:
        draw = noise.generator(purpose, round, ident).standard_normal(values.shape)
    else:
        draw = noise.user_normal(purpose, round, ids, values.shape[1])
    return values + sigma * draw


def distributed_gaussian_event(
    noise_multiplier: float, *, share: float, quorum: int, replacement: float = 0.0
) -> dp_event.GaussianDpEvent:
    """The event of a sum of at least ``quorum`` users' N(0, share·σ²) shares, against a server
    that may also see each survivor's share replaced by N(0, replacement·σ²) (LFL Round 2).

    The server's best estimate of the noise-free sum from both keeps variance F·σ² with
    F = :func:`distributed_variance`; the event credits at most the nominal σ: z·sqrt(min(1, F)).
    """
    f = distributed_variance(share=share, quorum=quorum, replacement=replacement)
    return gaussian_event(noise_multiplier * math.sqrt(min(1.0, f)))


def distributed_variance(*, share: float, quorum: int, replacement: float = 0.0) -> float:
    """F, in units of σ²: the variance of the server's best estimate of the noise-free sum when at
    least ``quorum`` users added shares of variance share·σ² and each may have had its share
    replaced by one of variance replacement·σ² (spec federated-mf §2.9, |U1| = |U2| = quorum):
    quorum·share·replacement/(share + replacement), or quorum·share without replacement."""
    if replacement > 0:
        return quorum * share * replacement / (share + replacement)
    return quorum * share


def share_noise(
    noise: NoiseSource,
    ids,
    width: int,
    *,
    l2_sensitivity: float,
    noise_multiplier: float,
    share: float,
    round: int = 0,
    regenerate: bool = False,
) -> np.ndarray:
    """The (users x width) N(0, share·σ²) shares of :func:`distributed_gaussian`, keyed by (round,
    user id): a user regenerates its own share with the same arguments and ``regenerate=True``
    (to cancel it later)."""
    sd = math.sqrt(share) * noise_multiplier * _positive("l2_sensitivity", l2_sensitivity)
    return sd * noise.user_normal("gaussian-share", round, ids, width, again=regenerate)


def distributed_gaussian(
    noise: NoiseSource,
    values,
    *,
    ids,
    l2_sensitivity: float,
    noise_multiplier: float,
    share: float,
    quorum: int,
    replacement: float = 0.0,
    round: int = 0,
):
    """Each user (a row of ``values``) adds its share N(0, share·σ²), σ = noise_multiplier · Δ₂;
    the event is that of the aggregate (:func:`distributed_gaussian_event`), which every user's
    message carries: the shares are one release."""
    event = distributed_gaussian_event(
        noise_multiplier, share=share, quorum=quorum, replacement=replacement
    )
    values = np.asarray(values, dtype=np.float64)
    shares = share_noise(
        noise,
        ids,
        values.shape[1],
        l2_sensitivity=l2_sensitivity,
        noise_multiplier=noise_multiplier,
        share=share,
        round=round,
    )
    return _drawn(noise, values + shares, event)


def _count(name: str, value) -> int:
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(name, f"must be an integer >= 1, got {value!r}")
    return int(value)


def _l1_default(l2: float, l1, dim: int) -> float:
    """Δ₁ as given, else the largest an integer vector with ‖x‖₂ <= Δ₂ in ``dim`` coordinates
    can have: min(sqrt(d)·Δ₂, Δ₂²) (an integer's |x_i| <= x_i²)."""
    if l1 is None:
        return float(min(math.sqrt(dim) * l2, l2 * l2))
    return _positive("l1_sensitivity", l1)


def distributed_discrete_gaussian_event(
    sigma2, *, quorum: int, l2_sensitivity: float, l1_sensitivity=None, dim: int
) -> DistributedDiscreteGaussianDpEvent:
    """The event of :func:`discrete_gaussian_shares`: the sum of at least ``quorum`` users'
    N_Z(0, σ²) shares over ``dim`` coordinates (more shares only add independent noise). σ² is
    the sampler's own (:func:`~rayfed.privacy.integer.exact_sigma2`), so a charge built here
    equals the drawn event; Δ₁ defaults to min(sqrt(d)·Δ₂, Δ₂²), sensitivities in the integer
    units of the data."""
    dim = _count("dim", dim)
    l2 = _positive("l2_sensitivity", l2_sensitivity)
    return DistributedDiscreteGaussianDpEvent(
        sigma2=float(exact_sigma2(sigma2)),
        num_shares=_count("quorum", quorum),
        l2_sensitivity=l2,
        l1_sensitivity=_l1_default(l2, l1_sensitivity, dim),
        dim=dim,
    )


def discrete_gaussian_share_noise(
    noise: NoiseSource,
    ids,
    width: int,
    *,
    sigma2,
    round: int = 0,
    purpose: str = "discrete-gaussian-share",
    regenerate: bool = False,
) -> np.ndarray:
    """The (users x width) N_Z(0, σ²) shares of :func:`discrete_gaussian_shares`, keyed by
    (purpose, round, user id) (the draw alone: nothing registered); ``regenerate=True`` redraws
    a user's own share (to cancel it later)."""
    return noise.user_discrete_gaussian(purpose, round, ids, width, sigma2, again=regenerate)


def discrete_gaussian_shares(
    noise: NoiseSource,
    values,
    *,
    ids,
    sigma2,
    quorum: int,
    l2_sensitivity: float,
    l1_sensitivity=None,
    round: int = 0,
    purpose: str = "discrete-gaussian-share",
    part_of=None,
):
    """Each user (a row of the integer ``values``) adds its own N_Z(0, σ²) share, drawn exactly
    (:mod:`rayfed.privacy.integer`) and keyed by (purpose, round, user id); returns (values +
    shares as int64, event). The event is the aggregate's over at least ``quorum`` users
    (:func:`distributed_discrete_gaussian_event`, Kairouz, Liu & Steinke 2021), which every
    user's message carries: the shares are one release."""
    values = _integer_rows(values, "discrete Gaussian shares")
    event = distributed_discrete_gaussian_event(
        sigma2,
        quorum=quorum,
        l2_sensitivity=l2_sensitivity,
        l1_sensitivity=l1_sensitivity,
        dim=values.shape[1],
    )
    shares = discrete_gaussian_share_noise(
        noise, ids, values.shape[1], sigma2=sigma2, round=round, purpose=purpose
    )
    return _drawn(noise, values + shares, event, part_of)


def _integer_rows(values, what: str) -> np.ndarray:
    """A (users x d) integer array as int64, or a ConfigError naming ``what`` needs it."""
    values = np.asarray(values)
    if values.ndim != 2 or not np.issubdtype(values.dtype, np.integer):
        raise ConfigError("values", f"{what} need an integer (users x d) array")
    return values.astype(np.int64)


def skellam_event(
    variance: float, *, l2_sensitivity: float, l1_sensitivity=None, dim: int
) -> SkellamDpEvent:
    """The event of Skellam noise of aggregate ``variance`` μ per coordinate (Agarwal, Kairouz &
    Liu 2021); Δ₁ defaults to min(sqrt(d)·Δ₂, Δ₂²), sensitivities in the integer units of the
    data."""
    dim = _count("dim", dim)
    l2 = _positive("l2_sensitivity", l2_sensitivity)
    return SkellamDpEvent(
        variance=_positive("variance", variance),
        l2_sensitivity=l2,
        l1_sensitivity=_l1_default(l2, l1_sensitivity, dim),
    )


def distributed_skellam_event(
    variance: float, *, quorum: int, l2_sensitivity: float, l1_sensitivity=None, dim: int
) -> SkellamDpEvent:
    """The event of :func:`skellam_shares`: at least ``quorum`` shares of ``variance`` each sum
    to Skellam noise of variance quorum·variance exactly (more shares only add noise)."""
    return skellam_event(
        _count("quorum", quorum) * _positive("variance", variance),
        l2_sensitivity=l2_sensitivity,
        l1_sensitivity=l1_sensitivity,
        dim=dim,
    )


def skellam_share_noise(
    noise: NoiseSource,
    ids,
    width: int,
    *,
    variance: float,
    round: int = 0,
    purpose: str = "skellam-share",
    regenerate: bool = False,
) -> np.ndarray:
    """The (users x width) Skellam shares of ``variance`` (Poisson(v/2) − Poisson(v/2)) of
    :func:`skellam_shares`, keyed by (purpose, round, user id) (the draw alone: nothing
    registered)."""
    mu = _positive("variance", variance) / 2.0
    return noise.user_skellam(purpose, round, ids, width, mu, again=regenerate)


def skellam_shares(
    noise: NoiseSource,
    values,
    *,
    ids,
    variance: float,
    quorum: int,
    l2_sensitivity: float,
    l1_sensitivity=None,
    round: int = 0,
    purpose: str = "skellam-share",
    part_of=None,
):
    """Each user (a row of the integer ``values``) adds a Skellam share of ``variance`` per
    coordinate (Poisson(v/2) − Poisson(v/2)), keyed by (purpose, round, user id); returns
    (values + shares as int64, event). Skellam is closed under sums, so at least ``quorum``
    shares are Skellam noise of variance quorum·v: the event is that
    (:func:`distributed_skellam_event`), carried by every user's message."""
    values = _integer_rows(values, "Skellam shares")
    event = distributed_skellam_event(
        variance,
        quorum=quorum,
        l2_sensitivity=l2_sensitivity,
        l1_sensitivity=l1_sensitivity,
        dim=values.shape[1],
    )
    shares = skellam_share_noise(
        noise, ids, values.shape[1], variance=variance, round=round, purpose=purpose
    )
    return _drawn(noise, values + shares, event, part_of)


def discrete_laplace_event(l1_sensitivity: int, epsilon: float) -> dp_event.DiscreteLaplaceDpEvent:
    """The event of :func:`discrete_laplace`."""
    if not (isinstance(l1_sensitivity, (int, np.integer)) and l1_sensitivity >= 1):
        raise ConfigError("l1_sensitivity", f"must be an integer >= 1, got {l1_sensitivity!r}")
    a = _positive("epsilon", epsilon) / int(l1_sensitivity)
    return dp_event.DiscreteLaplaceDpEvent(noise_parameter=a, sensitivity=int(l1_sensitivity))


def discrete_laplace(
    noise: NoiseSource,
    values,
    *,
    l1_sensitivity: int,
    epsilon: float,
    round: int = 0,
    ident=None,
):
    """Add discrete Laplace (two-sided geometric) noise, P(z) ∝ exp(-a|z|), a = ε/Δ₁, to integers.

    Sampled as the difference of two i.i.d. geometric variables with success 1 - e^{-a}, which
    is exactly DLap(a).
    """
    event = discrete_laplace_event(l1_sensitivity, epsilon)
    release = draw_discrete_laplace(
        noise, values, a=event.noise_parameter, round=round, ident=ident
    )
    return _drawn(noise, release, event)


def draw_discrete_laplace(noise: NoiseSource, values, *, a: float, round: int = 0, ident=None):
    """Integer ``values`` + DLap(a) (the draw alone: nothing registered)."""
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.integer):
        raise ConfigError("values", "the discrete Laplace mechanism needs integer values")
    p = -math.expm1(-a)
    gen = noise.generator("discrete-laplace", round, ident)
    draw = gen.geometric(p, size=values.shape) - gen.geometric(p, size=values.shape)
    return values.astype(np.int64) + draw


def split_discrete_laplace(
    noise: NoiseSource,
    values,
    *,
    l1_sensitivity: int,
    epsilon: float,
    parts: int,
    round: int = 0,
    ident=None,
    part_of: str | None = None,
):
    """One party's share of DLap(a), a = ε/Δ₁, split over ``parts`` parties (the discrete form
    of Goryczka & Xiong's split noise, thesis §7.3.3): it adds NB(1/parts, p) − NB(1/parts, p),
    p = 1 − e^{-a}.

    A geometric variable is NB(1, p) and negative binomials add in their shape, so any ``parts``
    shares sum to exactly DLap(a): the release is ε-DP as long as at least ``parts`` of the parties
    that add a share keep it secret; more shares only add noise. The event is the release's; a
    share that another party's message carries the event for names it in ``part_of``.
    """
    event = discrete_laplace_event(l1_sensitivity, epsilon)
    release = draw_split_discrete_laplace(
        noise, values, a=event.noise_parameter, parts=parts, round=round, ident=ident
    )
    return _drawn(noise, release, event, part_of)


def draw_split_discrete_laplace(
    noise: NoiseSource, values, *, a: float, parts: int, round: int = 0, ident=None
):
    """Integer ``values`` + one 1/``parts`` share of DLap(a) (the draw alone: nothing
    registered)."""
    if not (isinstance(parts, (int, np.integer)) and parts >= 1):
        raise ConfigError("parts", f"must be an integer >= 1, got {parts!r}")
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.integer):
        raise ConfigError("values", "the discrete Laplace mechanism needs integer values")
    p = -math.expm1(-a)
    gen = noise.generator("split-discrete-laplace", round, ident)
    shape = 1.0 / int(parts)
    draw = gen.negative_binomial(shape, p, size=values.shape) - gen.negative_binomial(
        shape, p, size=values.shape
    )
    return values.astype(np.int64) + draw


def joint_discrete_laplace_event(
    l1_sensitivity: int, noise_parameter: float, tail: float
) -> EpsilonDeltaDpEvent:
    """The event of :func:`joint_discrete_laplace`: noise whose unit-shift log-ratios are all at
    most a' (as DLap(a')'s are) is ε-DP for ℓ₁ sensitivity Δ with ε = a'·Δ; a sampler within
    total variation ``tail`` of such an untruncated one M* adds δ = (1 + e^ε)·tail
    (P[M(x) ∈ S] <= P[M*(x) ∈ S] + tail <= e^ε P[M*(x') ∈ S] + tail <= e^ε P[M(x') ∈ S] +
    (1 + e^ε)·tail). One (ε, δ) event: dp_accounting has no truncated discrete Laplace."""
    sensitivity = discrete_laplace_event(l1_sensitivity, 1.0).sensitivity  # checks Δ₁
    epsilon = _positive("noise_parameter", noise_parameter) * sensitivity
    if not (math.isfinite(tail) and 0 <= tail < 1):
        raise ConfigError("tail", f"must be in [0, 1), got {tail!r}")
    return EpsilonDeltaDpEvent(epsilon, (1.0 + math.exp(epsilon)) * float(tail))


def joint_discrete_laplace(
    noise: NoiseSource,
    values,
    share,
    *,
    l1_sensitivity: int,
    noise_parameter: float,
    tail: float,
    part_of: str | None = None,
):
    """Add this party's additive share (words mod 2^b, b <= 64) of discrete Laplace noise that
    the parties sampled jointly (an MPC such as :mod:`rayfed.secagg.mpc`: each party's coin bits
    come from its noise source, a dealer's correlated randomness from its own). Only the sum of
    all shares is noise; the release is Σ values + DLap once every party has added its share.

    ``noise_parameter`` a' and ``tail`` are what the sampler really gives (its coins are
    quantised and its variables truncated): the event is ε = a'·Δ₁ with δ = (1 + e^ε)·tail
    (:func:`joint_discrete_laplace_event`). The result is ``values + share`` mod 2^64 as int64
    (two's complement): the caller reduces it to its ring. A share that another party's message
    carries the event for names that release in ``part_of``.
    """
    event = joint_discrete_laplace_event(l1_sensitivity, noise_parameter, tail)
    return _drawn(noise, add_noise_share(values, share), event, part_of)


def add_noise_share(values, share):
    """Integer ``values`` + a party's additive noise ``share`` (ring words) mod 2^64, as int64
    (the draw of :func:`joint_discrete_laplace` alone: nothing registered)."""
    values, share = np.asarray(values), np.asarray(share)
    if not (
        np.issubdtype(values.dtype, np.integer) and np.issubdtype(share.dtype, np.unsignedinteger)
    ):
        raise ConfigError(
            "values", "joint discrete Laplace needs integer values and ring-word shares"
        )
    words = values.astype(np.int64).view(np.uint64) + share.astype(np.uint64)
    return words.view(np.int64)


def rr_keep_probability(epsilon: float) -> float:
    """Probability that binary randomized response reports the true bit, for ε-DP per bit."""
    e = math.exp(_positive("epsilon", epsilon))
    return e / (1.0 + e)


def binary_rr_event(keep_probability: float) -> dp_event.RandomizedResponseDpEvent:
    """The event of one bit of binary randomized response that keeps the bit with probability q.

    dp_accounting's RR outputs a uniform bucket with probability p, so q = 1 - p/2, p = 2(1 - q).
    Build the event only through this function: the ledger matches events exactly, so the charged
    and the drawn event must come from the same float operations.
    """
    q = float(keep_probability)
    if not 0.5 < q < 1.0:
        raise ConfigError(
            "keep_probability", f"must be in (0.5, 1) (1 adds no noise: ε = ∞), got {q!r}"
        )
    return dp_event.RandomizedResponseDpEvent(noise_parameter=2.0 * (1.0 - q), num_buckets=2)


def binary_randomized_response(
    noise: NoiseSource,
    bits,
    *,
    keep_probability: float,
    round: int = 0,
    ident=None,
    ids=None,
):
    """Report each bit truthfully with probability q, flipped otherwise (independently).

    Per bit this is ln(q / (1 - q))-DP; the event (:func:`binary_rr_event`) describes one bit;
    compose it for as many bits as one neighbour can change. With ``ids`` the rows of ``bits`` are
    users (or records) and each row's coins are keyed by its id.
    """
    event = binary_rr_event(keep_probability)
    release = draw_binary_rr(
        noise, bits, keep_probability=keep_probability, round=round, ident=ident, ids=ids
    )
    return _drawn(noise, release, event)


def draw_binary_rr(
    noise: NoiseSource, bits, *, keep_probability: float, round=0, ident=None, ids=None
):
    """Every bit kept with probability q, flipped otherwise (the draw alone: nothing
    registered)."""
    bits = np.asarray(bits).astype(bool)
    if ids is None:
        u = noise.generator("randomized-response", round, ident).random(bits.shape)
    else:
        u = noise.user_uniform("randomized-response", round, ids, bits.shape[1])
    return bits ^ (u >= float(keep_probability))


def kary_rr_event(k: int, epsilon: float) -> dp_event.RandomizedResponseDpEvent:
    """The event of :func:`kary_randomized_response`: a uniform report with p = k/(e^ε + k - 1)."""
    if not (isinstance(k, (int, np.integer)) and k >= 2):
        raise ConfigError("k", f"must be an integer >= 2, got {k!r}")
    p = k / (math.exp(_positive("epsilon", epsilon)) + k - 1)
    return dp_event.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=int(k))


def kary_randomized_response(
    noise: NoiseSource, values, *, k: int, epsilon: float, round: int = 0, ident=None
):
    """Generalised (k-ary) randomized response on values in {0, …, k-1}: ε-DP per value.

    Keeps the value with probability e^ε / (e^ε + k - 1) and otherwise reports one of the other
    k - 1 values uniformly; equivalently (dp_accounting's form) reports a uniform value with
    probability p = k / (e^ε + k - 1) and the true one otherwise.
    """
    event = kary_rr_event(k, epsilon)
    release = draw_kary_rr(noise, values, k=k, epsilon=epsilon, round=round, ident=ident)
    return _drawn(noise, release, event)


def draw_kary_rr(noise: NoiseSource, values, *, k: int, epsilon: float, round=0, ident=None):
    """Each value kept, or with probability k/(e^ε + k − 1) replaced by a uniform one (the draw
    alone: nothing registered)."""
    p = kary_rr_event(k, epsilon).noise_parameter
    values = np.asarray(values)
    if values.size and (values.min() < 0 or values.max() >= k):
        raise ConfigError("values", f"must lie in {{0, …, {k - 1}}}")
    gen = noise.generator("randomized-response", round, ident)
    randomize = gen.random(values.shape) < p
    uniform = gen.integers(0, k, size=values.shape)
    return np.where(randomize, uniform, values).astype(np.int64)


def local_randomizer(
    noise: NoiseSource, perturb, *args, epsilon: float, ids, width: int, round: int = 0, **kwargs
):
    """Run an ε-LDP randomizer for every user: ``perturb(*args, eps=ε, u=U, **kwargs)`` with U the
    (users x width) uniforms keyed by user id. The event is the randomizer's ε (pure)."""
    event = EpsilonDeltaDpEvent(_positive("epsilon", epsilon), 0.0)
    u = noise.user_uniform("ldp-report", round, ids, width)
    return _drawn(noise, perturb(*args, eps=event.epsilon, u=u, **kwargs), event)


def randomized(
    noise: NoiseSource,
    algorithm,
    *args,
    epsilon: float,
    delta: float = 0.0,
    purpose: str,
    round: int = 0,
    ident=None,
    **kwargs,
):
    """Run an (ε, δ)-DP randomized algorithm whose every random choice comes from the source:
    ``algorithm(*args, gen, **kwargs)`` with ``gen`` a Generator of ``purpose``. For a DP
    subroutine with no finer event (e.g. a DP sketch); its event is (ε, δ) (pure accountant)."""
    if not 0 <= delta < 1:
        raise ConfigError("delta", f"must be in [0, 1), got {delta!r}")
    event = EpsilonDeltaDpEvent(_positive("epsilon", epsilon), float(delta))
    gen = noise.generator(purpose, round, ident)
    return _drawn(noise, algorithm(*args, gen, **kwargs), event)


def l2_laplace_vectors(gen: np.random.Generator, rows: int, width: int, scale: float) -> np.ndarray:
    """``rows`` independent vectors of R^width, each with density ∝ exp(−‖b‖₂/scale): the norm is
    Gamma(shape=width, scale) (the density of ‖b‖ = r is ∝ r^{width−1} e^{−r/scale}, the sphere's
    area times the radial law) and the direction uniform on the sphere (a normalised Gaussian).
    Shifting b by a vector of norm Δ changes its density by at most e^{Δ/scale}: the K-norm
    mechanism for the ℓ2 ball (Hardt & Talwar 2010), the noise of objective perturbation
    (Chaudhuri, Monteleoni & Sarwate 2011, Alg. 2)."""
    direction = gen.standard_normal((rows, width))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    return gen.gamma(width, _positive("scale", scale), size=(rows, 1)) * direction


def objective_perturbation_event(epsilon: float) -> EpsilonDeltaDpEvent:
    """The event of :func:`objective_perturbation`: a pure ε-DP release (basic composition)."""
    return EpsilonDeltaDpEvent(_positive("epsilon", epsilon), 0.0)


def objective_perturbation(
    noise: NoiseSource,
    solve,
    *,
    rows: int,
    width: int,
    scale: float,
    epsilon: float,
    round: int = 0,
    ident=None,
):
    """Objective perturbation: draw the random linear terms b (``rows`` x ``width``, each row
    ∝ exp(−‖b‖/scale), :func:`l2_laplace_vectors`) and release ``solve(b)``, the exact minimiser
    of the objective with ⟨b_j, ·⟩ added. The caller proves that this is ε-DP for its ``scale``
    (a proof is about the objective, which only the caller knows: see
    :func:`rayfed.mf.baselines.objpert_scale`); the event is that (ε, 0)."""
    event = objective_perturbation_event(epsilon)
    release = draw_objective_perturbation(
        noise, solve, rows=rows, width=width, scale=scale, round=round, ident=ident
    )
    return _drawn(noise, release, event)


def draw_objective_perturbation(
    noise: NoiseSource, solve, *, rows: int, width: int, scale: float, round: int = 0, ident=None
):
    """``solve(b)`` for the random linear terms b of :func:`objective_perturbation` (the draw
    alone: nothing registered)."""
    b = l2_laplace_vectors(
        noise.generator("objective-perturbation", round, ident), rows, width, scale
    )
    return solve(b)


def one_bit_scale(epsilon: float, bound: float, size: int) -> float:
    """B = size·c·(e^ε + 1)/(e^ε - 1): the magnitude of :func:`sampled_one_bit`'s reports."""
    e = math.exp(_positive("epsilon", epsilon))
    return int(size) * _positive("bound", bound) * (e + 1.0) / (e - 1.0)


def sampled_one_bit(
    noise: NoiseSource, entry, *, size: int, bound: float, epsilon: float, ids, round: int = 0
):
    """Each user samples one entry of its private vector of ``size`` entries uniformly and reports
    it with Duchi, Jordan and Wainwright's one-bit mechanism: (index a, y = ±B),
    B = :func:`one_bit_scale`, the + sign with probability 1/2 + x(e^ε - 1)/(2c(e^ε + 1)),
    x = ``entry(a)`` clipped to [-c, c] (c = ``bound``).

    ``entry(index)`` returns each user's (a row of ``ids``) entry at its sampled index: only those
    are ever computed. E[y | a] = size·x, so the report (y at a, 0 elsewhere) is an unbiased
    estimate of the clipped vector. The index is data-independent and the sign's probabilities at
    x = c and x = -c differ by the factor e^ε, so each report is ε-LDP (event: pure ε). The index
    and the sign's coin come from the user's keyed stream."""
    event = EpsilonDeltaDpEvent(_positive("epsilon", epsilon), 0.0)
    index = one_bit_index(noise, ids, size, round=round)
    release = draw_one_bit(
        noise,
        entry(index),
        index=index,
        size=size,
        bound=bound,
        epsilon=event.epsilon,
        ids=ids,
        round=round,
    )
    return _drawn(noise, release, event)


def one_bit_index(noise: NoiseSource, ids, size: int, *, round: int = 0) -> np.ndarray:
    """Each user's (a row of ``ids``) uniformly sampled entry index of :func:`sampled_one_bit`,
    from its keyed stream: data-independent, and the same each time it is asked for."""
    u = noise.user_uniform("ldp-report", round, ids, 2)
    return np.minimum((u[:, 0] * size).astype(np.int64), int(size) - 1)


def draw_one_bit(
    noise: NoiseSource, x, *, index, size: int, bound: float, epsilon: float, ids, round: int = 0
):
    """The one-bit reports (index, ±B) of :func:`sampled_one_bit` for each user's entry ``x`` at
    its sampled ``index`` (:func:`one_bit_index`), ``x`` clipped to [-c, c] (the draw alone:
    nothing registered). The sign's coin is the second uniform of the user's keyed stream."""
    c = _positive("bound", bound)
    scale = one_bit_scale(epsilon, c, size)
    # the same keyed draw as the index's (one_bit_index), regenerated for the sign's coin
    u = noise.user_uniform("ldp-report", round, ids, 2, again=True)
    if not np.array_equal(index, np.minimum((u[:, 0] * size).astype(np.int64), int(size) - 1)):
        raise ValueError("a one-bit report's index is the user's own sampled one (one_bit_index)")
    x = np.clip(np.asarray(x, dtype=np.float64), -c, c)
    e = math.exp(epsilon)
    plus = u[:, 1] < 0.5 + x * (e - 1.0) / (2.0 * c * (e + 1.0))
    return index, np.where(plus, scale, -scale)
