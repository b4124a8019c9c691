"""One object per release: its input domain, neighbour relation and mechanism, from which its
sensitivity and its privacy event follow.

A protocol builds each :class:`Measurement` once, in ``plan``; the driver charges
``m.charge(scope)`` and the step draws with ``m(ctx.noise, x)`` — so the domain, the relation,
the sensitivity, the noise drawn and the event charged cannot drift apart. (OpenDP's
measurements, which carry their input domain, input metric and privacy map, are the model.)

The sensitivity is derived (:func:`rayfed.privacy.domain.sensitivity`) wherever the rule
covers the query: a sum of bounded values, of norm-clipped vectors, a histogram, bits. A release
the rule does not cover (a DP subroutine, a statistic whose bound comes from an argument about
the algorithm) declares it with :class:`Declared`, and gives the reason beside the value.

A measurement with a ``sampling`` rate < 1 is a Poisson-subsampled release: its step must draw
the sample through :meth:`Measurement.sample` first, and the source refuses a sampled event no
sample backs (:meth:`rayfed.privacy.source.NoiseSource.register`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from dp_accounting import dp_event

from rayfed.privacy import mechanisms as mech
from rayfed.privacy.domain import Domain, Interval, Neighbours, sensitivity
from rayfed.privacy.ledger import EpsilonDeltaDpEvent, UnitInSampledGroupGaussianDpEvent
from rayfed.privacy.shuffling import ShuffledDpEvent
from rayfed.privacy.source import NoiseSource


# --- mechanisms: how a release is drawn, and its event for a given sensitivity ------------------
@dataclass(frozen=True)
class Laplace:
    """Lap(Δ₁/ε) on every coordinate: ε-DP."""

    epsilon: float
    norm: ClassVar[int] = 1

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.laplace_event(sens, self.epsilon)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        return mech.draw_laplace(noise, values, scale=sens / self.epsilon, round=round, ident=ident)

    def describe(self) -> str:
        return f"Laplace, ε = {self.epsilon:.4g}"


@dataclass(frozen=True)
class Gaussian:
    """N(0, (zΔ₂)²) on every coordinate; with ``ids``, each row's noise keyed by its user id
    under ``purpose``."""

    noise_multiplier: float
    purpose: str = "gaussian"
    norm: ClassVar[int] = 2

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.gaussian_event(self.noise_multiplier)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        sigma = self.noise_multiplier * sens
        return mech.draw_gaussian(
            noise, values, sigma=sigma, round=round, ident=ident, ids=ids, purpose=self.purpose
        )

    def describe(self) -> str:
        return f"Gaussian, noise multiplier z = {self.noise_multiplier:.4g}"


@dataclass(frozen=True)
class DiscreteLaplace:
    """DLap(a), a = ε/Δ₁, on integers (Δ₁ an integer): ε-DP."""

    epsilon: float
    norm: ClassVar[int] = 1

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.discrete_laplace_event(_integer(sens), self.epsilon)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        a = self.event(sens).noise_parameter
        return mech.draw_discrete_laplace(noise, values, a=a, round=round, ident=ident)

    def describe(self) -> str:
        return f"discrete Laplace, ε = {self.epsilon:.4g}"


@dataclass(frozen=True)
class RandomizedResponse:
    """Binary randomized response on every bit (kept with ``keep_probability``): ln(q/(1−q))-DP
    per bit, composed over the Δ₀ bits one neighbour changes."""

    keep_probability: float
    norm: ClassVar[int] = 0
    #: randomises each coordinate (bit, report) on its own: replace-one neighbours only
    randomizes_each: ClassVar[bool] = True

    def event(self, sens: float) -> dp_event.DpEvent:
        return _times(mech.binary_rr_event(self.keep_probability), sens)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        return mech.draw_binary_rr(
            noise, values, keep_probability=self.keep_probability, round=round, ident=ident, ids=ids
        )

    def noiseless(self, values):
        return np.asarray(values).astype(bool)

    def describe(self) -> str:
        return f"binary randomized response, keep probability {self.keep_probability:.4g}"


@dataclass(frozen=True)
class KaryResponse:
    """k-ary randomized response on every value of {0, …, k−1}: ε-DP per value, composed over
    the Δ₀ values one neighbour changes."""

    k: int
    epsilon: float
    norm: ClassVar[int] = 0
    #: randomises each coordinate (bit, report) on its own: replace-one neighbours only
    randomizes_each: ClassVar[bool] = True

    def event(self, sens: float) -> dp_event.DpEvent:
        return _times(mech.kary_rr_event(self.k, self.epsilon), sens)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        return mech.draw_kary_rr(
            noise, values, k=self.k, epsilon=self.epsilon, round=round, ident=ident
        )

    def noiseless(self, values):
        return np.asarray(values).astype(np.int64)

    def describe(self) -> str:
        return f"{self.k}-ary randomized response, ε = {self.epsilon:.4g}"


@dataclass(frozen=True)
class LocalReport:
    """An ε-LDP randomizer run by every user on its own value: ``perturb(values, eps=ε, u=U,
    **options)`` with U the (users x ``width``) uniforms keyed by user id. One neighbour changes
    Δ₀ users' reports (one, for one user's value): the event is (ε, 0) composed Δ₀ times.

    A report's form is the randomizer's own (a float, an index, a dict of fields); the aggregator
    reads that form, and a report has no noiseless value of it. Without noise (the sensitivity
    check) it is drawn as in a run: the check compares the randomizer's inputs per user."""

    epsilon: float
    perturb: Callable
    width: int
    norm: ClassVar[int] = 0
    #: randomises each coordinate (bit, report) on its own: replace-one neighbours only
    randomizes_each: ClassVar[bool] = True
    #: Δ₀ counts the users (rows) whose report changes, not entries
    per_row: ClassVar[bool] = True
    drawn_without_noise: ClassVar[bool] = True

    def event(self, sens: float) -> dp_event.DpEvent:
        return _times(EpsilonDeltaDpEvent(mech._positive("epsilon", self.epsilon), 0.0), sens)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids, **options):
        u = noise.user_uniform("ldp-report", round, ids, self.width)
        return self.perturb(values, eps=self.epsilon, u=u, **options)

    def describe(self) -> str:
        return f"ε-LDP report per user ({getattr(self.perturb, '__name__', 'randomizer')}), ε = {self.epsilon:.4g}"


def _integer(sens: float) -> int:
    if not float(sens).is_integer():
        raise ValueError(f"an integer mechanism needs an integer sensitivity, got {sens}")
    return int(sens)


def _times(event: dp_event.DpEvent, count: float) -> dp_event.DpEvent:
    """``event`` composed ``count`` times (itself once)."""
    n = _integer(count)
    return event if n == 1 else dp_event.SelfComposedDpEvent(event, n)


Mechanism = Laplace | Gaussian | DiscreteLaplace | RandomizedResponse | KaryResponse | LocalReport


# --- the measurement ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Declared:
    """A sensitivity given by hand where no domain rule covers the query, with its reason."""

    value: float
    reason: str

    def __post_init__(self):
        if not (math.isfinite(self.value) and self.value > 0) or not self.reason.strip():
            raise ValueError("a declared sensitivity is a finite value > 0 with its reason")


@dataclass(frozen=True)
class PublicMap:
    """A public, data-independent linear map the query applies to each unit's contribution
    before the sum (a shared random sketch, a fixed projection), with ``norm`` bounding how far
    it moves the output per unit of the contribution's move, in the mechanism's norm — for a
    sketch G·A, replacing row i of A by one ‖v‖ away moves G·A by ‖G[:, i]‖₂·‖v‖ in Frobenius
    norm, so ``norm`` is a bound on G's column norms. The sensitivity is the domain's, times
    ``norm``; the reason says where the bound comes from."""

    norm: float
    reason: str

    def __post_init__(self):
        if not (math.isfinite(self.norm) and self.norm > 0) or not self.reason.strip():
            raise ValueError("a public map's norm is a finite value > 0 with its reason")


@dataclass(frozen=True)
class Measurement:
    """One release: ``label`` names it (in the ledger, the transcript and the statement).

    Parameters
    ----------
    mechanism:
        How the noise is drawn (:class:`Laplace`, :class:`Gaussian`, …), calibrated by its own
        parameters (ε, the noise multiplier, a keep probability).
    domain, relation:
        Where one unit's contribution lies and what one neighbour changes: together they give
        the sensitivity in the mechanism's norm.
    declared:
        The sensitivity, where no domain rule covers the query, with the reason.
    sampling:
        A Poisson sampling rate < 1 makes the event a subsampled one; the step then draws the
        sample with :meth:`sample` before the release.
    shared:
        A release whose noise several members draw in shares (distributed noise, each member's
        message carrying the release's event under scope ``"run"``): one charge covers the
        members' messages of one phase. Any other release needs a charge per message.
    through:
        A public linear map applied to each unit's contribution (:class:`PublicMap`): the
        derived sensitivity is scaled by its norm.
    """

    label: str
    mechanism: Any
    domain: Domain
    relation: Neighbours
    declared: Declared | None = None
    sampling: float = 1.0
    shared: bool = False
    through: PublicMap | None = None
    _sens: float = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not 0 < self.sampling <= 1:
            raise ValueError(f"{self.label}: a sampling rate is in (0, 1], got {self.sampling}")
        if isinstance(self.mechanism, LocalReport) and not isinstance(self.domain, Interval):
            raise ValueError(f"{self.label}: a per-user report's domain is an Interval of values")
        if getattr(self.mechanism, "randomizes_each", False) and self.relation.kind != (
            "replace_one"
        ):
            # a randomized report of a user who is absent is not "a null user's report": the
            # radius rule does not bound it (a count of reports reveals the user); under zero-out
            # dp-accounting's REPLACE_SPECIAL randomized response assumes the special record's
            # report is uniform, which the empty record's is not (k-ary RR at ε = 2 would be
            # charged 1.67)
            raise ValueError(
                f"{self.label}: a per-bit or per-report randomizer is accounted for replace-one "
                "neighbours only"
            )
        own = getattr(self.mechanism, "for_relation", None)
        if own is not None and own != self.relation.kind:
            raise ValueError(
                f"{self.label}: its subroutine's event holds for {own} neighbours, the release's "
                f"relation is {self.relation.kind}"
            )
        if self.declared is not None and self.through is not None:
            raise ValueError(f"{self.label}: a declared sensitivity includes any public map")
        sens = (
            float(self.declared.value)
            if self.declared is not None
            else sensitivity(self.domain, self.relation, self.mechanism.norm)
        )
        if not math.isfinite(sens):
            raise ValueError(
                f"{self.label}: the sensitivity is unbounded under {self.relation.describe()} on "
                f"{self.domain.describe()}: declare bounds on the data, or bound the move"
            )
        if self.through is not None:
            sens *= self.through.norm
        if not sens > 0:
            raise ValueError(
                f"{self.label}: the sensitivity is 0 under {self.relation.describe()} on "
                f"{self.domain.describe()}: nothing to protect, release it without noise"
            )
        object.__setattr__(self, "_sens", sens)

    @property
    def sensitivity(self) -> float:
        """Δ in the mechanism's norm (ℓ0, ℓ1 or ℓ2)."""
        return self._sens

    @property
    def event(self) -> dp_event.DpEvent:
        """The event of one draw (subsampled if ``sampling`` < 1)."""
        base = self.mechanism.event(self._sens)
        if self.sampling < 1:
            return dp_event.PoissonSampledDpEvent(self.sampling, base)
        return base

    def charge(self, scope: str, times: int = 1) -> tuple[str, str, dp_event.DpEvent]:
        """The ledger charge ``(scope, label, event)`` for ``times`` draws."""
        event = self.event if times == 1 else dp_event.SelfComposedDpEvent(self.event, times)
        return scope, self.label, event

    def sample(
        self, noise: NoiseSource, size: int, *, round: int = 0, ident=None, purpose: str = "sample"
    ) -> np.ndarray:
        """The Poisson sample (a boolean mask over ``size`` units at rate ``sampling``) this
        measurement's next draw is amplified by."""
        return noise.poisson_sample(self.sampling, size, round=round, ident=ident, purpose=purpose)

    def __call__(
        self,
        noise: NoiseSource,
        values,
        *,
        round: int = 0,
        ident=None,
        ids=None,
        part_of: Measurement | None = None,
        **options,
    ):
        """``(release, event)``: the noisy ``values`` drawn from ``noise``, registered with the
        step (``part_of``: the declared release, carried by another message, that this draw is
        a share of). ``options`` go to the mechanism (a randomizer's or algorithm's own)."""

        if isinstance(self.mechanism, LocalReport):
            self._check_inputs(values)

        def draw(values):
            return self.mechanism.draw(
                noise, values, self._sens, round=round, ident=ident, ids=ids, **options
            )

        if noise.probe is not None:  # the test-only noiseless source (sensitivity check)
            exact = (
                draw if getattr(self.mechanism, "drawn_without_noise", False) else self._noiseless
            )
            share = part_of is not None
            release = noise.probe.observe(self, noise.name, values, ids, exact, share=share)
        else:
            release = draw(values)
        event = self.event
        noise.register(event, release, part_of=part_of, shared=self.shared)
        return release, event

    def _check_inputs(self, values) -> None:
        """A local randomizer's ε holds only for inputs in its declared domain: an input outside
        it is a defect of the protocol that computed it (refused, not clipped)."""
        x = np.asarray(values, dtype=np.float64)
        low, high = self.domain.low, self.domain.high
        if x.size and not ((x >= low) & (x <= high)).all():
            raise ValueError(
                f"{self.label}: a report's input lies outside its declared domain "
                f"{self.domain.describe()} (range [{np.nanmin(x):.4g}, {np.nanmax(x):.4g}]); its "
                "ε holds only inside it"
            )

    def _noiseless(self, values):
        exact = getattr(self.mechanism, "noiseless", None)
        return exact(values) if exact is not None else np.asarray(values, dtype=np.float64)

    def describe(self) -> str:
        """One line for the privacy statement: what is released, how, and why its Δ is what
        it is."""
        norm = self.mechanism.norm
        why = (
            self.declared.reason
            if self.declared is not None
            else f"{self.relation.describe()}, {self.domain.describe()}"
        )
        if self.through is not None:
            why += f"; × {self.through.norm:.4g}: {self.through.reason}"
        sampled = f", Poisson-sampled at q = {self.sampling:.4g}" if self.sampling < 1 else ""
        return (
            f"{self.label}: {self.mechanism.describe()}{sampled}, "
            f"Δ{norm} = {self._sens:.4g} ({why})"
        )


# --- ldp-bitvector ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeResponse:
    """Binary randomized response on every bit of codes encoded a block at a time (ldp-bitvector's
    BV codes): ``values`` is a code source (:class:`rayfed.ldp.bitvector.RecordCodes`,
    ``PairCodes``) whose ``blocks()`` yield (coin keys, bits) and whose ``pack`` assembles the
    noisy blocks, so the whole bit tensor never exists at once in a run; as an array it is every
    bit (the sensitivity check counts the bits a neighbour changes). Each bit is kept with
    ``keep_probability``, its coin keyed by the block's keys (as :class:`RandomizedResponse`
    with ids): the event is the per-bit RR composed over the Δ₀ bits one neighbour changes."""

    keep_probability: float
    norm: ClassVar[int] = 0
    #: randomises each coordinate (bit, report) on its own: replace-one neighbours only
    randomizes_each: ClassVar[bool] = True

    def event(self, sens: float) -> dp_event.DpEvent:
        return _times(mech.binary_rr_event(self.keep_probability), sens)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        q = self.keep_probability
        return values.pack(
            mech.draw_binary_rr(noise, bits, keep_probability=q, round=round, ident=ident, ids=keys)
            for keys, bits in values.blocks()
        )

    def noiseless(self, values):
        return values.pack(bits for _, bits in values.blocks())

    def describe(self) -> str:
        return (
            f"binary randomized response on BV codes, keep probability {self.keep_probability:.4g}"
        )


# --- hfl-kmeans: discrete Laplace on padded ring words, in split shares, or sampled jointly -------
@dataclass(frozen=True)
class PaddedDiscreteLaplace:
    """DLap(a), a = ε/Δ₁, added to words of Z_2^``ring_bits``: a padded aggregate whose adder
    cannot read it (the pads cancel when the clients unpad, so the noise lands on the sum): ε-DP.
    A neighbour moves the words by the sum's change mod 2^b, so the sensitivity check measures
    the words' difference in the ring (``modulus``)."""

    epsilon: float
    ring_bits: int
    norm: ClassVar[int] = 1

    @property
    def modulus(self) -> int:
        return 1 << self.ring_bits

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.discrete_laplace_event(_integer(sens), self.epsilon)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        words = np.asarray(values)
        a = self.event(sens).noise_parameter
        noisy = mech.draw_discrete_laplace(noise, words, a=a, round=round, ident=ident)
        return noisy.astype(words.dtype)  # two's complement: mod 2^b

    def noiseless(self, values):
        return np.array(values, copy=True)

    def describe(self) -> str:
        return f"discrete Laplace on words of Z_2^{self.ring_bits}, ε = {self.epsilon:.4g}"


@dataclass(frozen=True)
class SplitDiscreteLaplace:
    """One party's 1/``parts`` share of DLap(a), a = ε/Δ₁: NB(1/parts, p) − NB(1/parts, p),
    p = 1 − e^−a. Any ``parts`` shares add up to exactly DLap(a), so the release that sums them
    is ε-DP while ``parts`` of the parties that add one keep theirs secret. The event is the
    release's; a party whose share another's message carries draws with ``part_of``."""

    epsilon: float
    parts: int
    norm: ClassVar[int] = 1

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.discrete_laplace_event(_integer(sens), self.epsilon)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        a = self.event(sens).noise_parameter
        return mech.draw_split_discrete_laplace(
            noise, values, a=a, parts=self.parts, round=round, ident=ident
        )

    def noiseless(self, values):
        return np.asarray(values).astype(np.int64)

    def describe(self) -> str:
        return f"discrete Laplace in 1/{self.parts} shares, ε = {self.epsilon:.4g}"


@dataclass(frozen=True)
class JointDiscreteLaplace:
    """A party's additive ``share`` (ring words: an option of the draw) of discrete Laplace noise
    the parties sampled together in an MPC (:mod:`rayfed.secagg.mpc`), whose realised parameter
    is ``noise_parameter`` a' and whose truncation is within total variation ``tail`` of an
    a'-DP sampler (``sampler``: the MPC's plan of the coins): (a'·Δ₁, (1 + e^ε)·tail)-DP."""

    noise_parameter: float
    tail: float
    sampler: Any = field(default=None, compare=False)
    norm: ClassVar[int] = 1

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.joint_discrete_laplace_event(_integer(sens), self.noise_parameter, self.tail)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids, share):
        return mech.add_noise_share(values, share)

    def noiseless(self, values):
        return np.asarray(values).astype(np.int64)

    def describe(self) -> str:
        return (
            f"discrete Laplace sampled jointly in shares, a' = {self.noise_parameter:.4g} per "
            f"unit, truncation {self.tail:.3g}"
        )


# --- vfl-primitives (Alg. 3's local clustering; vfl-kmeans' DPLSF alike) ------------------------
@dataclass(frozen=True)
class Subroutine:
    """A DP algorithm on one unit's rows that draws all its noise from the step's source through
    the mechanisms' draw_* functions (registering nothing), ``algorithm(noise, values, round=...,
    **options)``, and whose event for one unit is ``dp_event`` — its own composition of those
    draws, which may depend on data-dependent choices the event bounds (DPLSF charges every tree
    level, however deep it grew). The measurement registers that event once. Its privacy for one
    unit is the algorithm's own argument: a measurement of it declares Δ₀ = 1 with the reason.
    Without noise (the sensitivity check) it runs as drawn, and the check compares its inputs."""

    algorithm: Callable
    dp_event: Any
    #: the neighbour relation ``dp_event`` holds for ("add_or_remove_one" or "replace_one"): a
    #: measurement of another relation is refused (an add/remove event is not a replace-one one)
    for_relation: str
    norm: ClassVar[int] = 0
    per_row: ClassVar[bool] = True
    drawn_without_noise: ClassVar[bool] = True

    def event(self, sens: float) -> dp_event.DpEvent:
        if _integer(sens) != 1:
            raise ValueError("a DP subroutine is DP for one unit: Δ₀ = 1")
        return self.dp_event

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids, **options):
        return self.algorithm(noise, values, round=round, **options)

    def describe(self) -> str:
        function = getattr(self.algorithm, "func", self.algorithm)  # a functools.partial's
        return f"DP subroutine {getattr(function, '__name__', 'algorithm')}"


# --- federated-mf: LFL's distributed Gaussian and its Round-2 replacement, per-rating DP-SGD with
# users sampled, GD-DR's one-bit reports, ObjPertb's objective perturbation ---------------------
@dataclass(frozen=True)
class DistributedGaussianShare:
    """Each user (a row, keyed by its id) adds its share N(0, share·σ²), σ = zΔ₂, to its row of a
    sum that at least ``quorum`` users' rows make up (LFL Round 1, inside secure aggregation). The
    event is the aggregate's (:func:`~rayfed.privacy.mechanisms.distributed_gaussian_event`):
    against a server that may also see each share replaced by N(0, replacement·σ²) (Round 2),
    its best estimate keeps variance F·σ², and the event credits z·sqrt(min(1, F))."""

    noise_multiplier: float
    share: float
    quorum: int
    replacement: float = 0.0
    norm: ClassVar[int] = 2
    #: the event compares two sums of the same number of shares: a neighbour's user still adds
    #: its share (under add/remove it would leave with it, a variance the event does not count)
    for_relation: ClassVar[str] = "replace_special"

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.distributed_gaussian_event(
            self.noise_multiplier,
            share=self.share,
            quorum=self.quorum,
            replacement=self.replacement,
        )

    def shares(
        self, noise: NoiseSource, ids, width: int, sens: float, *, round: int, again: bool = False
    ):
        """The users' shares (a user regenerates its own with the same arguments and
        ``again=True``: the keyed draw's deliberate repeat)."""
        return mech.share_noise(
            noise,
            ids,
            width,
            l2_sensitivity=sens,
            noise_multiplier=self.noise_multiplier,
            share=self.share,
            round=round,
            regenerate=again,
        )

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        values = np.asarray(values, dtype=np.float64)
        return values + self.shares(noise, ids, values.shape[1], sens, round=round)

    def describe(self) -> str:
        return (
            f"distributed Gaussian, noise multiplier z = {self.noise_multiplier:.4g}, a share "
            f"{self.share:.4g}·σ² per user, at least {self.quorum} users (event credits "
            f"z·sqrt(min(1, F)), F with Round-2 replacements {self.replacement:.4g}·σ²)"
        )


@dataclass(frozen=True)
class ReplacementShare:
    """LFL Round 2: a Round-1 survivor's −ξ_i + ξ'_i, ξ_i its own Round-1 share regenerated and
    ξ'_i ~ N(0, ζ2·σ²) keyed by its id (``replacement`` = ζ2, from the realised |U1|, a draw
    option). Part of the Round-1 release (its event is that release's, which covers the
    replacement): drawn with ``part_of`` = the Round-1 measurement. The query is the zero row —
    the message carries no data."""

    round1: DistributedGaussianShare
    purpose: str = "replacement"
    norm: ClassVar[int] = 2
    for_relation: ClassVar[str] = "replace_special"  # Round 1's

    def event(self, sens: float) -> dp_event.DpEvent:
        return self.round1.event(sens)

    def draw(self, noise: NoiseSource, values, sens, *, round: int, ident, ids, replacement):
        values = np.asarray(values, dtype=np.float64)
        xi = self.round1.shares(noise, ids, values.shape[1], sens, round=round, again=True)
        sigma = math.sqrt(replacement) * self.round1.noise_multiplier * sens
        return mech.draw_gaussian(
            noise, values - xi, sigma=sigma, round=round, ids=ids, purpose=self.purpose
        )

    def describe(self) -> str:
        return (
            "Round-2 replacement of each survivor's share by N(0, ζ2·σ²), ζ2 from |U1|: part of "
            "the Round-1 release, whose event covers it"
        )


@dataclass(frozen=True)
class DiscreteGaussianShares:
    """Each user (an integer row, keyed by its id) adds its own N_Z(0, σ²) share to its row of a
    sum that at least ``quorum`` users' rows make up (the distributed discrete Gaussian, Kairouz,
    Liu & Steinke 2021, inside secure aggregation). The rows are integers (the distributed-DP
    pipeline's rounded vectors, :mod:`rayfed.secagg.ddp`), Δ₂ and ``l1_sensitivity`` in their
    units, ``dim`` their width; the event is the aggregate's
    (:func:`~rayfed.privacy.mechanisms.distributed_discrete_gaussian_event`)."""

    sigma2: float
    quorum: int
    dim: int
    l1_sensitivity: float | None = None
    purpose: str = "discrete-gaussian-share"
    norm: ClassVar[int] = 2
    for_relation: ClassVar[str] = "replace_special"  # the event's (equal numbers of shares)

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.distributed_discrete_gaussian_event(
            self.sigma2,
            quorum=self.quorum,
            l2_sensitivity=sens,
            l1_sensitivity=self.l1_sensitivity,
            dim=self.dim,
        )

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        values = np.asarray(values)
        shares = mech.discrete_gaussian_share_noise(
            noise, ids, values.shape[1], sigma2=self.sigma2, round=round, purpose=self.purpose
        )
        return values.astype(np.int64) + shares

    def noiseless(self, values):
        return np.asarray(values).astype(np.int64)

    def describe(self) -> str:
        return (
            f"distributed discrete Gaussian, N_Z(0, {self.sigma2:.6g}) per user and integer "
            f"coordinate (d = {self.dim}), at least {self.quorum} users' shares in the sum"
        )


@dataclass(frozen=True)
class SkellamShares:
    """Each user (an integer row, keyed by its id) adds a Skellam share of ``variance`` per
    coordinate (Poisson(v/2) − Poisson(v/2)) to its row of a sum that at least ``quorum`` users'
    rows make up (Agarwal, Kairouz & Liu 2021): the shares sum to Skellam noise of variance
    quorum·v at least. Integer rows as :class:`DiscreteGaussianShares`; the event is
    :func:`~rayfed.privacy.mechanisms.distributed_skellam_event`'s."""

    variance: float
    quorum: int
    dim: int
    l1_sensitivity: float | None = None
    purpose: str = "skellam-share"
    #: "add then remove": the share drawn as independent components of these variances (summing
    #: to ``variance``), so that a survivor can later reveal the first ones (:class:`SkellamExcess`)
    components: tuple[float, ...] = ()
    norm: ClassVar[int] = 2
    for_relation: ClassVar[str] = "replace_special"  # the event's (equal numbers of shares)

    def __post_init__(self):
        if self.components and not math.isclose(sum(self.components), self.variance, rel_tol=1e-9):
            raise ValueError("the share's components must sum to its variance")

    def event(self, sens: float) -> dp_event.DpEvent:
        return mech.distributed_skellam_event(
            self.variance,
            quorum=self.quorum,
            l2_sensitivity=sens,
            l1_sensitivity=self.l1_sensitivity,
            dim=self.dim,
        )

    def component_noise(self, noise: NoiseSource, ids, width: int, j: int, *, round: int, again):
        """Component ``j`` of the users' shares (keyed by (purpose/j, round, user id))."""
        return mech.skellam_share_noise(
            noise,
            ids,
            width,
            variance=self.components[j],
            round=round,
            purpose=f"{self.purpose}/{j}",
            regenerate=again,
        )

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        values = np.asarray(values)
        if self.components:
            shares = sum(
                self.component_noise(noise, ids, values.shape[1], j, round=round, again=False)
                for j in range(len(self.components))
            )
        else:
            shares = mech.skellam_share_noise(
                noise,
                ids,
                values.shape[1],
                variance=self.variance,
                round=round,
                purpose=self.purpose,
            )
        return values.astype(np.int64) + shares

    def noiseless(self, values):
        return np.asarray(values).astype(np.int64)

    def describe(self) -> str:
        return (
            f"distributed Skellam, a share of variance {self.variance:.6g} per user and integer "
            f"coordinate (d = {self.dim}), at least {self.quorum} users' shares in the sum"
        )


@dataclass(frozen=True)
class SkellamExcess:
    """ "Add then remove" (Dordis): a survivor's first ``upto`` components of its
    :class:`SkellamShares` share, regenerated and negated, sent once the survivors are known so
    the server subtracts them (a draw option). They are independent of the components left in the
    sum and of the data, so revealing them costs nothing: part of the share release (drawn with
    ``part_of`` = that measurement, whose event covers what is left). The query is the zero row."""

    shares: SkellamShares
    norm: ClassVar[int] = 2
    for_relation: ClassVar[str] = "replace_special"

    def event(self, sens: float) -> dp_event.DpEvent:
        return self.shares.event(sens)

    def draw(self, noise: NoiseSource, values, sens, *, round: int, ident, ids, upto: int):
        values = np.asarray(values).astype(np.int64)
        for j in range(upto):
            values = values - self.shares.component_noise(
                noise, ids, values.shape[1], j, round=round, again=True
            )
        return values

    def noiseless(self, values):
        return np.asarray(values).astype(np.int64)

    def describe(self) -> str:
        return (
            "add then remove: each survivor's excess components of its Skellam share, revealed "
            "once U3 is known; part of the share release, whose event covers what is left"
        )


@dataclass(frozen=True)
class GroupSampledGaussian:
    """N(0, (zΔ₂)²) on a sum over a Poisson sample of *groups* at ``sampling_probability`` when
    the protected unit is one member of a group (one rating of a sampled user): the event is
    :class:`~rayfed.privacy.ledger.UnitInSampledGroupGaussianDpEvent` (no amplification of ε),
    registered whole after the step's sample at that rate (drawn as :class:`Gaussian`)."""

    noise_multiplier: float
    sampling_probability: float
    purpose: str = "gaussian"
    norm: ClassVar[int] = 2

    def event(self, sens: float) -> dp_event.DpEvent:
        return UnitInSampledGroupGaussianDpEvent(
            self.sampling_probability, mech._positive("noise_multiplier", self.noise_multiplier)
        )

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids):
        return Gaussian(self.noise_multiplier, self.purpose).draw(
            noise, values, sens, round=round, ident=ident, ids=ids
        )

    def describe(self) -> str:
        return (
            f"Gaussian, noise multiplier z = {self.noise_multiplier:.4g}, on a sum over users "
            f"Poisson-sampled at q = {self.sampling_probability:.4g} (one member of a sampled "
            "group: ε not amplified)"
        )


@dataclass(frozen=True)
class OneBitReport:
    """Each user's entry x of its private vector of ``size`` entries, at its own data-independent
    sampled index (``index``, a draw option: :func:`~rayfed.privacy.mechanisms.one_bit_index`),
    reported with Duchi, Jordan and Wainwright's one-bit mechanism: ±B, x clipped to
    [−``bound``, ``bound``], ε-LDP (GD-DR). The reports reach the server only as the multiset of
    at least ``users`` reports (a trusted shuffler): the event is the shuffled one at ``delta``
    (Feldman et al. 2021). One user's report changes: Δ₀ = 1."""

    epsilon: float
    size: int
    bound: float
    users: int
    delta: float
    norm: ClassVar[int] = 0
    per_row: ClassVar[bool] = True
    drawn_without_noise: ClassVar[bool] = True

    def event(self, sens: float) -> dp_event.DpEvent:
        if _integer(sens) != 1:
            raise ValueError("a one-bit report is ε-LDP for one user's report: Δ₀ = 1")
        local = EpsilonDeltaDpEvent(mech._positive("epsilon", self.epsilon), 0.0)
        return ShuffledDpEvent(local, self.users, self.delta)

    def index(self, noise: NoiseSource, ids, *, round: int) -> np.ndarray:
        """Each user's sampled entry (data-independent, from its keyed stream: the draw
        recomputes the same)."""
        return mech.one_bit_index(noise, ids, self.size, round=round)

    def draw(self, noise: NoiseSource, values, sens: float, *, round: int, ident, ids, index):
        return mech.draw_one_bit(
            noise,
            values,
            index=index,
            size=self.size,
            bound=self.bound,
            epsilon=self.epsilon,
            ids=ids,
            round=round,
        )

    def describe(self) -> str:
        return (
            f"one-bit report per user (Duchi et al.), ε0 = {self.epsilon:.4g}, entries clipped "
            f"to ±{self.bound:.4g}, shuffled among at least {self.users} users at δ' = "
            f"{self.delta:.3g}"
        )


@dataclass(frozen=True)
class ObjectivePerturbation:
    """Objective perturbation (Chaudhuri, Monteleoni & Sarwate 2011): ``solve(b)``, the exact
    minimiser of a per-block objective with ⟨b_k, ·⟩ added to each of the ``len(values)`` blocks,
    b_k ∝ exp(−‖b‖/``scale``) in R^``width`` (a draw option, with ``solve``). ``values`` are the
    blocks' data terms; ε-DP for a neighbour that changes at most ``blocks`` of them, by the
    caller's proof for its ``scale`` (:func:`rayfed.mf.baselines.objpert_scale`): Δ₀ counts the
    blocks a neighbour changes. Without noise (the sensitivity check) it runs as drawn; the
    check counts the changed blocks."""

    epsilon: float
    scale: float
    blocks: int
    norm: ClassVar[int] = 0
    per_row: ClassVar[bool] = True
    drawn_without_noise: ClassVar[bool] = True

    def event(self, sens: float) -> dp_event.DpEvent:
        if _integer(sens) > self.blocks:
            raise ValueError(
                f"the objective perturbation is ε-DP for {self.blocks} changed blocks, not {sens}"
            )
        return EpsilonDeltaDpEvent(mech._positive("epsilon", self.epsilon), 0.0)

    def draw(self, noise: NoiseSource, values, sens, *, round: int, ident, ids, solve, width):
        return mech.draw_objective_perturbation(
            noise, solve, rows=len(values), width=width, scale=self.scale, round=round, ident=ident
        )

    def describe(self) -> str:
        return (
            f"objective perturbation, ε = {self.epsilon:.4g} for at most {self.blocks} changed "
            f"blocks (‖b‖ ~ Gamma(width, {self.scale:.4g}))"
        )
