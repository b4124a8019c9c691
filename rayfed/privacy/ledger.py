"""The privacy ledger of a run, over ``dp_accounting``.

A protocol declares its budget (ε, δ), the accountant (``pure``: basic composition of pure/approximate
DP; ``rdp``; ``pld``; ``tightest``: PLD and RDP side by side, the smaller ε reported — both are
valid upper bounds — and the one that gave it named), the neighbouring relation, and whether its
scopes compose in parallel (disjoint data: e.g. "DP in VFL", where a neighbour changes one party's
data only) or sequentially. Every noise event is charged *before* the noise is drawn; a charge that
would exceed the budget raises :class:`~rayfed.errors.BudgetExceeded` and records nothing.
"""

from __future__ import annotations

import copy
import math
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any

import attr
import numpy as np
from dp_accounting import dp_event, pld, rdp
from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant

from rayfed.errors import BudgetExceeded, ConfigError, RayfedError, UnaccountedNoise
from rayfed.privacy.shuffling import ShuffledDpEvent, shuffle_epsilon0_limit, shuffled_guarantee
from rayfed.privacy.source import STATEMENTS as RANDOMNESS_STATEMENTS

# Relative slack for comparing floating-point ε against the budget: a protocol that calibrates
# its noise to spend exactly the budget must not be refused for a rounding error.
_RTOL = 1e-9
# Absolute slack, for the smallest budgets: a randomized response at ε = 1e-9 keeps a bit with
# probability 1/2 + ε/4, which float64 holds to ~1e-16 — a relative error of 1e-7 in its ε. An ε
# differing by 1e-12 is the same guarantee (e^1e-12 = 1 + 1e-12). Capped at 1e-3 of the budget
# (:func:`_within`): a budget of 1e-13 must not admit an ε of 9e-13.
_ATOL = 1e-12
_ATOL_OF_BUDGET = 1e-3


def _within(epsilon: float, budget_epsilon: float) -> bool:
    """Whether a charge's ε fits the budget up to float rounding (see _RTOL, _ATOL)."""
    return epsilon <= budget_epsilon * (1 + _RTOL) + min(_ATOL, _ATOL_OF_BUDGET * budget_epsilon)


RUN_SCOPE = "run"


@attr.s(frozen=True, slots=True, auto_attribs=True)
class EpsilonDeltaDpEvent(dp_event.DpEvent):
    """A black-box (ε, δ)-DP mechanism, for steps with no finer description (e.g. a DP
    clustering subroutine). Only the ``pure`` accountant (basic composition) supports it."""

    epsilon: float
    delta: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class UnitInSampledGroupGaussianDpEvent(dp_event.DpEvent):
    """A Gaussian release (σ = z·Δ₂) of a sum over a Poisson sample of *groups* at rate q, where
    the protected unit is one member of a group: per-rating privacy with user-level sampling.

    Neighbours differ in one rating g of user i (add/remove); if i is sampled (probability q) the
    sum also holds i's other ratings h, in both worlds. In units of σ the pair of output laws is
        P = (1 − q) N(a, 1) + q N(a + h, 1),   Q = (1 − q) N(a, 1) + q N(a + h + g, 1),
    ‖g‖ <= 1/z. Sampling hides whether i is in the batch, not the rating: for large ‖h‖ the loss
    is the full Gaussian loss with probability q and 0 otherwise, so ε is not amplified. By joint
    convexity of (P, Q) -> E_Q[(P/Q)^α] (tight as ‖h‖ -> ∞, and the same with P and Q swapped):

        ε_α = log(1 − q + q·exp(α(α − 1)/(2z²))) / (α − 1),

    which is at least the Poisson-subsampled Gaussian's curve and equals the Gaussian's α/(2z²)
    at q = 1. Supported by :class:`MemoRdpAccountant` under add/remove-one neighbours."""

    sampling_probability: float
    noise_multiplier: float


def unit_in_sampled_group_rdp(q: float, z: float, orders: np.ndarray) -> np.ndarray:
    """The RDP curve of :class:`UnitInSampledGroupGaussianDpEvent` at ``orders`` (all > 1)."""
    orders = np.asarray(orders, dtype=np.float64)
    if z == 0:
        return np.full_like(orders, np.inf)
    loss = orders * (orders - 1) / (2 * z**2)  # the Gaussian's (α − 1)·ε_α
    if q >= 1:
        return loss / (orders - 1)
    return np.logaddexp(math.log1p(-q), math.log(q) + loss) / (orders - 1)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DistributedDiscreteGaussianDpEvent(dp_event.DpEvent):
    """The sum of ``num_shares`` independent discrete Gaussians N_Z(0, σ²) (σ² = ``sigma2``, the
    per-share scale parameter, in the integer units of the data) added to an integer vector query
    of ``dim`` coordinates with ℓ2 and ℓ1 sensitivities Δ₂, Δ₁ (Kairouz, Liu & Steinke, ICML
    2021, the distributed discrete Gaussian). The sum is close to N_Z(0, nσ²) but is not one; with
    τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1)), a = Δ₂/sqrt(nσ²), b = Δ₁/sqrt(nσ²), the release is
    (α, ε_α)-RDP for (their Proposition 14, as in TFF's accounting)

        ε_α = min{ α·a²/2 + τ·d,  α/2·(a² + 2bτ + τ²d),  α/2·(a + sqrt(d)·τ)² },

    evaluated at ⌈α⌉ (Rényi divergence grows with α; the paper's analysis is for integer orders).
    With n = 1 (τ = 0) this is the discrete Gaussian's Δ₂²/(2σ²)-zCDP (Canonne, Kamath & Steinke
    2020). Supported by :class:`MemoRdpAccountant` (hence ``rdp`` and ``tightest``)."""

    sigma2: float
    num_shares: int
    l2_sensitivity: float
    l1_sensitivity: float
    dim: int


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SkellamDpEvent(dp_event.DpEvent):
    """Skellam noise of ``variance`` μ per coordinate (Poisson(μ/2) − Poisson(μ/2); a sum of
    shares of variance μ/n each is exactly this law) added to an integer vector query with ℓ2 and
    ℓ1 sensitivities Δ₂, Δ₁ (Agarwal, Kairouz & Liu, NeurIPS 2021, Theorem 3.5 / Corollary 3.6):
    for integer α > 1,

        ε_α = α·Δ₂²/(2μ) + min{ ((2α − 1)·Δ₂² + 6·Δ₁)/(4μ²),  3·Δ₁/(2μ) },

    evaluated at ⌈α⌉ for a real order (Rényi divergence grows with α). Supported by
    :class:`MemoRdpAccountant` (hence ``rdp`` and ``tightest``)."""

    variance: float
    l2_sensitivity: float
    l1_sensitivity: float


#: why the distributed integer events refuse every relation but zero-out
ZERO_OUT_ONLY = (
    "the distributed discrete Gaussian and Skellam curves compare two sums of the same number of "
    "noise shares: zero-out neighbours (relation=replace_special: one user's input replaced by "
    "zero, its noise share still in the sum). Under add/remove the removed user's share leaves "
    "with it and the noise variance differs between the neighbours, which the curves do not count "
    "(up to 8x the charged divergence at small sizes); replace-one needs twice the sensitivity"
)


def ddg_tau(sigma2: float, num_shares: int) -> float:
    """τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1)): how far a sum of n N_Z(0, σ²) is from
    N_Z(0, nσ²) in Kairouz, Liu & Steinke's bound."""
    k = np.arange(1, int(num_shares), dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * float(sigma2) * k / (k + 1.0)).sum())


def ddg_rdp(event: DistributedDiscreteGaussianDpEvent, orders) -> np.ndarray:
    """The RDP curve of :class:`DistributedDiscreteGaussianDpEvent` at ``orders`` (all > 1)."""
    alpha = np.ceil(np.asarray(orders, dtype=np.float64))
    n, d = int(event.num_shares), int(event.dim)
    scale = math.sqrt(n * float(event.sigma2))
    a, b = event.l2_sensitivity / scale, event.l1_sensitivity / scale
    tau = ddg_tau(event.sigma2, n)
    first = alpha / 2 * a**2 + tau * d
    second = alpha / 2 * (a**2 + 2 * b * tau + tau**2 * d)
    third = alpha / 2 * (a + math.sqrt(d) * tau) ** 2
    return np.minimum(np.minimum(first, second), third)


def skellam_rdp(event: SkellamDpEvent, orders) -> np.ndarray:
    """The RDP curve of :class:`SkellamDpEvent` at ``orders`` (all > 1)."""
    alpha = np.ceil(np.asarray(orders, dtype=np.float64))
    mu, l2, l1 = float(event.variance), float(event.l2_sensitivity), float(event.l1_sensitivity)
    extra = np.minimum(((2 * alpha - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu))
    return alpha * l2**2 / (2 * mu) + extra


#: rayfed's integer-noise events and their RDP curves
_INTEGER_RDP = {DistributedDiscreteGaussianDpEvent: ddg_rdp, SkellamDpEvent: skellam_rdp}


class PureDpAccountant(PrivacyAccountant):
    """Basic composition (Dwork–Roth Thm 3.16): ε and δ add up.

    Supports Laplace (ε = 1/noise_multiplier), discrete Laplace (ε = a·Δ), k-ary randomized
    response (ε = ln(1 + k(1-p)/p)), :class:`EpsilonDeltaDpEvent`, a shuffled pure-LDP release
    (:class:`~rayfed.privacy.shuffling.ShuffledDpEvent`), and their compositions.
    """

    def __init__(self, neighboring_relation: NeighboringRelation = NeighboringRelation.REPLACE_ONE):
        super().__init__(neighboring_relation)
        self._epsilon = 0.0
        self._delta = 0.0

    def _maybe_compose(self, event, count, do_compose):
        def add(eps: float, delta: float = 0.0) -> None:
            if do_compose:
                self._epsilon += count * eps
                self._delta += count * delta

        if isinstance(event, dp_event.NoOpDpEvent):
            return None
        if isinstance(event, dp_event.NonPrivateDpEvent):
            add(math.inf)
        elif isinstance(event, dp_event.LaplaceDpEvent):
            add(1.0 / event.noise_multiplier)
        elif isinstance(event, dp_event.DiscreteLaplaceDpEvent):
            add(event.noise_parameter * event.sensitivity)
        elif isinstance(event, dp_event.RandomizedResponseDpEvent):
            p, k = event.noise_parameter, event.num_buckets
            add(math.inf if p == 0 else math.log1p(k * (1.0 - p) / p))
        elif isinstance(event, EpsilonDeltaDpEvent):
            add(event.epsilon, event.delta)
        elif isinstance(event, ShuffledDpEvent):
            return self._shuffled(event, add)
        elif isinstance(event, dp_event.SelfComposedDpEvent):
            return self._maybe_compose(event.event, count * event.count, do_compose)
        elif isinstance(event, dp_event.ComposedDpEvent):
            for sub in event.events:
                error = self._maybe_compose(sub, count, do_compose)
                if error is not None:
                    return error
        else:
            return self.CompositionErrorDetails(
                invalid_event=event,
                error_message="the pure-DP accountant cannot account this event",
            )
        return None

    def _shuffled(self, event: ShuffledDpEvent, add):
        """Amplification by shuffling (Feldman et al. 2021, Thm 3.1) of a pure ε0-LDP randomizer,
        inside the theorem's range only, and for replace-one neighbours (the theorem's: one
        user's data replaced)."""
        if self.neighboring_relation is not NeighboringRelation.REPLACE_ONE:
            return self.CompositionErrorDetails(
                invalid_event=event,
                error_message="shuffling's bound is for replace-one neighbours only",
            )
        local = PureDpAccountant(self.neighboring_relation)
        error = local._maybe_compose(event.event, 1, True)
        if error is not None:
            return error
        eps0, n, delta = local._epsilon, event.num_users, event.delta
        limit = shuffle_epsilon0_limit(n, delta) if 0 < delta < 1 else -math.inf
        if local._delta > 0 or not 0 < eps0 <= limit:
            return self.CompositionErrorDetails(
                invalid_event=event,
                error_message=f"shuffling covers a pure ε0-LDP randomizer with 0 < ε0 <= "
                f"log(n/(16 log(4/δ))) = {limit:.4g} only",
            )
        add(shuffled_guarantee(eps0, n, delta), delta)
        return None

    def get_epsilon(self, target_delta: float) -> float:
        return self._epsilon if self._delta <= target_delta + 1e-15 else math.inf

    def get_delta(self, target_epsilon: float) -> float:
        return self._delta if self._epsilon <= target_epsilon else 1.0


class MemoRdpAccountant(rdp.RdpAccountant):
    """dp-accounting's RDP accountant, computing each distinct event's RDP curve once per process.

    A ledger composes the same per-round event hundreds of times (and tries every charge on a copy
    first); one subsampled-Gaussian curve costs about 0.1 s. RDP composes by adding curves, which is
    what the parent does with the curve it would recompute; the curve itself is the library's.
    """

    _curves: dict = {}

    def _maybe_compose(self, event, count, do_compose):
        if isinstance(event, (dp_event.SelfComposedDpEvent, dp_event.ComposedDpEvent)):
            return super()._maybe_compose(event, count, do_compose)  # recurses into this method
        key = (event, self.neighboring_relation, tuple(self._orders))
        if isinstance(event, UnitInSampledGroupGaussianDpEvent) and key not in self._curves:
            if self.neighboring_relation != NeighboringRelation.ADD_OR_REMOVE_ONE:
                return self.CompositionErrorDetails(
                    invalid_event=event,
                    error_message="a unit in a sampled group is accounted for add/remove-one "
                    "neighbours only",
                )
            self._curves[key] = unit_in_sampled_group_rdp(
                event.sampling_probability, event.noise_multiplier, self._orders
            )
        if type(event) in _INTEGER_RDP and key not in self._curves:
            if self.neighboring_relation != NeighboringRelation.REPLACE_SPECIAL:
                return self.CompositionErrorDetails(
                    invalid_event=event,
                    error_message=ZERO_OUT_ONLY,
                )
            self._curves[key] = _INTEGER_RDP[type(event)](event, self._orders)
        if key not in self._curves:
            single = rdp.RdpAccountant(self._orders, self.neighboring_relation)
            error = rdp.RdpAccountant._maybe_compose(single, event, 1, True)
            if error is not None:
                return error
            self._curves[key] = single.rdp.copy()
        if do_compose:
            self._rdp += count * self._curves[key]
        return None


#: PLD's discretisation of the privacy loss (dp-accounting's default)
PLD_INTERVAL = 1e-4
#: above this ε (by RDP) PLD is not built: its pmf grows as ε / interval entries (ε = 100 at
#: 1e-4 is two million), and an ε that large gains nothing from a tighter bound
PLD_EPSILON_CAP = 100.0
_LEAF_PLDS: dict = {}
_SELF_COMPOSED: dict = {}
_COMPOSED_EPSILONS: dict = {}


def _leaves_counted(event: dp_event.DpEvent, count: int, out: dict) -> None:
    """The mechanism events ``event`` composes, with how often (compositions unwrapped)."""
    if isinstance(event, dp_event.NoOpDpEvent):
        return
    if isinstance(event, dp_event.SelfComposedDpEvent):
        _leaves_counted(event.event, count * event.count, out)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for sub in event.events:
            _leaves_counted(sub, count, out)
    else:
        out[event] = out.get(event, 0) + count


class MemoPldAccountant(PrivacyAccountant):
    """dp-accounting's PLD, built once per process for each distinct mechanism event and
    self-composed as often as charged (a ledger charges the same round's event hundreds of times;
    building a subsampled Gaussian's PLD takes ~0.1 s). The composed ε of one multiset of events
    is computed once, so parallel scopes with the same history share it.

    rayfed's :class:`UnitInSampledGroupGaussianDpEvent` gets the PLD of its dominating pair: the
    tagged mixture "no loss with probability 1 − q, the Gaussian's with probability q" (joint
    convexity of the hockey-stick divergence; δ(ε) = q·δ_Gauss(ε) for one release)."""

    def __init__(self, neighboring_relation: NeighboringRelation, interval: float = PLD_INTERVAL):
        super().__init__(neighboring_relation)
        self.interval = interval
        self.counts: dict[dp_event.DpEvent, int] = {}
        #: (counts, their composed PLD) of the last composition: a new charge composes onto it
        self._last: tuple[dict, Any] = ({}, None)

    def _supports_leaf(self, event: dp_event.DpEvent) -> bool:
        if isinstance(event, UnitInSampledGroupGaussianDpEvent):
            return self.neighboring_relation == NeighboringRelation.ADD_OR_REMOVE_ONE
        return pld.PLDAccountant(self.neighboring_relation).supports(event)

    def _maybe_compose(self, event, count, do_compose):
        leaves: dict = {}
        _leaves_counted(event, count, leaves)
        for leaf in leaves:
            if isinstance(leaf, dp_event.NonPrivateDpEvent) or not self._supports_leaf(leaf):
                return self.CompositionErrorDetails(
                    invalid_event=leaf, error_message="the PLD accountant cannot account it"
                )
        if do_compose:
            for leaf, n in leaves.items():
                self.counts[leaf] = self.counts.get(leaf, 0) + n
        return None

    def _leaf_pld(self, event: dp_event.DpEvent):
        key = (event, self.neighboring_relation, self.interval)
        if key not in _LEAF_PLDS:
            if isinstance(event, UnitInSampledGroupGaussianDpEvent):
                gaussian = pld.privacy_loss_distribution.from_gaussian_mechanism(
                    event.noise_multiplier, value_discretization_interval=self.interval
                )
                identity = pld.privacy_loss_distribution.identity(self.interval)
                # the loss distributions mixed: δ(ε) = q·δ_Gauss(ε) + (1 − q)·0
                _LEAF_PLDS[key] = gaussian.compute_mixture(identity, event.sampling_probability)
            else:
                acc = pld.PLDAccountant(self.neighboring_relation, self.interval)
                acc.compose(event)
                _LEAF_PLDS[key] = acc._pld
        return _LEAF_PLDS[key]

    def _self_composed(self, event: dp_event.DpEvent, n: int):
        """The leaf's PLD composed ``n`` times, built once per process: a ledger charges the same
        round's event (n = its steps) every round."""
        key = (event, self.neighboring_relation, self.interval, n)
        if key not in _SELF_COMPOSED:
            leaf = self._leaf_pld(event)
            _SELF_COMPOSED[key] = leaf.self_compose(n) if n > 1 else leaf
        return _SELF_COMPOSED[key]

    def _composed(self):
        """The composed PLD: the last one, composed with what was charged since, if every count
        only grew (a ledger's accountant only ever adds)."""
        counts, total = self._last
        if any(self.counts.get(leaf, 0) < n for leaf, n in counts.items()):
            counts, total = {}, None
        for leaf in sorted(self.counts, key=repr):
            n = self.counts[leaf] - counts.get(leaf, 0)
            if n:
                part = self._self_composed(leaf, n)
                total = part if total is None else total.compose(part)
        self._last = (dict(self.counts), total)
        return total

    def get_epsilon(self, target_delta: float) -> float:
        key = (frozenset(self.counts.items()), self.neighboring_relation, self.interval)
        key += (float(target_delta),)
        if key not in _COMPOSED_EPSILONS:
            total = self._composed()
            eps = 0.0 if total is None else float(total.get_epsilon_for_delta(target_delta))
            _COMPOSED_EPSILONS[key] = eps
        return _COMPOSED_EPSILONS[key]

    def get_delta(self, target_epsilon: float) -> float:
        total = self._composed()
        return 0.0 if total is None else float(total.get_delta_for_epsilon(target_epsilon))


class TightestAccountant(PrivacyAccountant):
    """PLD (:class:`MemoPldAccountant`) and RDP (:class:`MemoRdpAccountant`) composed side by
    side: ε is the smaller of the two (each is a valid upper bound), :meth:`used` names the one
    that gave it. An event one of them does not support (PLD: a sampled release under
    replace-one) leaves the other alone for the rest of the composition; one neither supports is
    refused. PLD is skipped where RDP's ε is above :data:`PLD_EPSILON_CAP`."""

    def __init__(self, neighboring_relation: NeighboringRelation, interval: float = PLD_INTERVAL):
        super().__init__(neighboring_relation)
        replace = neighboring_relation == NeighboringRelation.REPLACE_ONE
        self.parts: dict[str, PrivacyAccountant | None] = {
            # rayfed's events measure noise against the distance between neighbouring outputs
            # (the relation's Δ), as dp-accounting's RDP does; its PLD reads a replace-one
            # Gaussian or Laplace as two unit shifts apart. Without sampling the pair of output
            # laws is the add/remove pair at distance Δ, which is what PLD is given here.
            "pld": MemoPldAccountant(
                NeighboringRelation.ADD_OR_REMOVE_ONE if replace else neighboring_relation,
                interval,
            ),
            "rdp": MemoRdpAccountant(neighboring_relation=neighboring_relation),
        }
        self._replace = replace

    def _supports(self, key: str, acc: PrivacyAccountant, event) -> bool:
        if key == "pld" and self._replace and not _additive_only(event):
            return False  # only an unsampled additive release is the add/remove pair at Δ
        if key == "pld" and _holds(event, dp_event.RandomizedResponseDpEvent):
            return False  # PLD's randomized response is the replace-one pair only
        try:
            return acc.supports(event)
        except TypeError:  # an event dp-accounting cannot even hash (lists in its fields)
            return False

    def _maybe_compose(self, event, count, do_compose):
        live = {k: a for k, a in self.parts.items() if a is not None}
        able = {k: a for k, a in live.items() if self._supports(k, a, event)}
        if not able:
            return self.CompositionErrorDetails(
                invalid_event=event, error_message="neither PLD nor RDP accounts this event"
            )
        if do_compose:
            for key, acc in live.items():
                if key in able:
                    acc.compose(event, count)
                else:
                    self.parts[key] = None
        return None

    def epsilons(self, target_delta: float) -> dict[str, float]:
        out = {}
        if self.parts["rdp"] is not None:
            out["rdp"] = float(self.parts["rdp"].get_epsilon(target_delta))
        too_wide = out.get("rdp", 0.0) > PLD_EPSILON_CAP
        if self.parts["pld"] is not None and not too_wide:
            out["pld"] = float(self.parts["pld"].get_epsilon(target_delta))
        return out

    def used(self, target_delta: float) -> str:
        eps = self.epsilons(target_delta)
        return min(eps, key=lambda k: (eps[k], k))

    def get_epsilon(self, target_delta: float) -> float:
        eps = self.epsilons(target_delta)
        return min(eps.values()) if eps else math.inf

    def get_delta(self, target_epsilon: float) -> float:
        return min(float(a.get_delta(target_epsilon)) for a in self.parts.values() if a is not None)


#: the releases whose replace-one pair is the add/remove pair at the relation's Δ: additive
#: noise on the query, unsampled
_ADDITIVE = (dp_event.GaussianDpEvent, dp_event.LaplaceDpEvent, dp_event.DiscreteLaplaceDpEvent)


def _additive_only(event: dp_event.DpEvent) -> bool:
    """Whether ``event`` composes only unsampled additive-noise releases (an allow-list: any
    other event, or one with sampling, is not given to PLD as the add/remove pair)."""
    if isinstance(event, dp_event.NoOpDpEvent):
        return True
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _additive_only(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return all(_additive_only(e) for e in event.events)
    return type(event) in _ADDITIVE


def _holds(event: dp_event.DpEvent, kind: type) -> bool:
    """Whether ``event`` is or composes an event of class ``kind``."""
    if isinstance(event, kind):
        return True
    if isinstance(event, (dp_event.SelfComposedDpEvent, dp_event.PoissonSampledDpEvent)):
        return _holds(event.event, kind)
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_holds(e, kind) for e in event.events)
    return False


ACCOUNTANTS = ("pure", "rdp", "pld", "tightest")
RELATIONS = {
    "replace_one": NeighboringRelation.REPLACE_ONE,
    "add_or_remove_one": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_special": NeighboringRelation.REPLACE_SPECIAL,
}


@dataclass(frozen=True)
class Budget:
    """A declared privacy budget: ε > 0 and 0 <= δ < 1 — or :meth:`none` for a protocol that adds
    no DP noise at all (its ledger refuses every charge)."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self):
        if (self.epsilon, self.delta) != (0.0, 0.0):
            check_budget(self.epsilon, self.delta)

    @staticmethod
    def none() -> Budget:
        return Budget(0.0, 0.0)


def check_budget(
    epsilon: Any, delta: Any, *, eps_field: str = "epsilon", delta_field: str = "delta"
):
    """Raise ConfigError unless ε is a finite number > 0 and δ is in [0, 1)."""
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, (int, float))
        or not math.isfinite(epsilon)
        or epsilon <= 0
    ):
        raise ConfigError(
            eps_field, f"must be a finite number > 0, got {epsilon!r}", "e.g. 0.5, 1, 4"
        )
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise ConfigError(
            delta_field, f"must be in [0, 1), got {delta!r}", "0 for pure DP, e.g. 1e-5"
        )


def make_accountant(kind: str, relation: str) -> PrivacyAccountant:
    rel = RELATIONS[relation]
    if kind == "pure":
        return PureDpAccountant(rel)
    if kind == "rdp":
        return MemoRdpAccountant(neighboring_relation=rel)
    if kind == "pld":
        return pld.PLDAccountant(neighboring_relation=rel)
    if kind == "tightest":
        return TightestAccountant(rel)
    raise ConfigError("accountant", f"unknown accountant {kind!r}", ACCOUNTANTS)


def event_to_dict(event: dp_event.DpEvent) -> dict[str, Any]:
    """A JSON-ready form of a DpEvent: dp-accounting's own named tuple
    (``DpEvent.to_named_tuple``: module, class and fields, nested events expanded) as a dict."""

    def plain(value):
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return {k: plain(v) for k, v in value._asdict().items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(event.to_named_tuple())


#: the modules whose event classes a stored event may name
_EVENT_MODULES = ("dp_accounting.", "rayfed.privacy.")


def event_from_dict(data: dict[str, Any]) -> dp_event.DpEvent:
    """The DpEvent of :func:`event_to_dict`'s form, through ``DpEvent.from_named_tuple``; only
    classes of dp-accounting and rayfed.privacy are rebuilt."""

    def tupled(value):
        if isinstance(value, dict) and "class_name" in value:
            if not str(value.get("module_name", "")).startswith(_EVENT_MODULES):
                raise ValueError(f"not a privacy event's module: {value.get('module_name')!r}")
            fields = {k: tupled(v) for k, v in value.items()}
            return namedtuple(f"_{value['class_name']}NamedTupleWrapper", list(fields))(**fields)
        if isinstance(value, list):
            return [tupled(v) for v in value]
        return value

    return dp_event.DpEvent.from_named_tuple(tupled(data))


@dataclass(frozen=True)
class LedgerEntry:
    round: int
    scope: str
    label: str
    event: dp_event.DpEvent
    epsilon_after: float  # ε of the entry's scope (or of the whole run, if sequential) after it


@dataclass
class PrivacyReport:
    """The guarantee a run actually achieved, as stated in its result and manifest."""

    epsilon: float
    delta: float
    budget_epsilon: float
    budget_delta: float
    accountant: str
    neighboring_relation: str
    composition: str
    statement: str
    per_scope: dict[str, float] = field(default_factory=dict)
    #: where the noise and secrets came from: "seeded" or "secure" (rayfed.privacy.source)
    randomness: str = "seeded"
    randomness_statement: str = ""
    #: the ε the user asked for where a faithful mode's budget is its true, higher, cost
    requested_epsilon: float | None = None
    #: False for a run that declared no DP at all (Budget.none()): its ε = 0 is not a guarantee
    private: bool = True
    notes: list[str] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    composed_event: dict[str, Any] = field(default_factory=dict)
    #: each declared release: its mechanism, Δ and why (Measurement.describe)
    releases: list[str] = field(default_factory=list)
    #: the accountant that gave ε ("pld" or "rdp" under ``tightest``; else the accountant)
    accountant_used: str = ""
    #: ε by each accountant composed (``tightest``: both PLD's and RDP's)
    epsilon_by_accountant: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def summary(self) -> str:
        if self.budget_epsilon == 0 and self.budget_delta == 0:
            return f"no differential privacy ({self.statement})"
        how = self.accountant
        others = {k: v for k, v in self.epsilon_by_accountant.items() if k != self.accountant_used}
        if self.accountant_used and self.accountant_used != self.accountant:
            how += f": {self.accountant_used}" + "".join(
                f"; {k} gives {v:.4g}" for k, v in sorted(others.items())
            )
        text = f"epsilon={self.epsilon:.4g}, delta={self.delta:.3g} ({how}, {self.composition})"
        return text + f" of budget epsilon={self.budget_epsilon:g}, delta={self.budget_delta:g}"


class PrivacyLedger:
    """Records, composes and bounds every noise event of one run.

    Parameters
    ----------
    budget:
        The declared (ε, δ).
    accountant:
        ``"pure"``, ``"rdp"`` or ``"pld"``.
    relation:
        Neighbouring relation the sensitivities refer to: ``"replace_one"``, ``"add_or_remove_one"``
        or ``"replace_special"``.
    composition:
        ``"sequential"`` (all events compose) or ``"parallel"`` (events compose within a scope; the
        guarantee is the worst scope, because a neighbour changes the data of one scope only).
    statement:
        One sentence saying what the guarantee protects (e.g. "DP in VFL, Def. 1.2").
    randomness:
        Where the run's noise and secrets come from (``"seeded"`` or ``"secure"``); the report
        states what that means for the guarantee.
    """

    def __init__(
        self,
        budget: Budget,
        *,
        accountant: str = "pure",
        relation: str = "replace_one",
        composition: str = "sequential",
        statement: str = "",
        randomness: str = "seeded",
        releases: list[str] | None = None,
        declared: dict[str, dp_event.DpEvent] | None = None,
    ):
        if accountant not in ACCOUNTANTS:
            raise ConfigError("accountant", f"unknown accountant {accountant!r}", ACCOUNTANTS)
        if relation not in RELATIONS:
            raise ConfigError("relation", f"unknown neighbouring relation {relation!r}", RELATIONS)
        if composition not in ("sequential", "parallel"):
            raise ConfigError(
                "composition", f"unknown composition {composition!r}", ["sequential", "parallel"]
            )
        self.budget = budget
        self.accountant = accountant
        self.relation = relation
        self.composition = composition
        self.statement = statement
        if randomness not in RANDOMNESS_STATEMENTS:
            raise ConfigError("randomness", f"unknown {randomness!r}", RANDOMNESS_STATEMENTS)
        self.randomness = randomness
        self.releases = list(releases or [])
        #: label -> event of every declared release (None: charges are not checked against it)
        self.declared = declared
        self.entries: list[LedgerEntry] = []
        self.notes: list[str] = []
        self._accountants: dict[str, PrivacyAccountant] = {}

    def _compose(self, acc: PrivacyAccountant, event: dp_event.DpEvent) -> PrivacyAccountant:
        try:
            acc.compose(event)
        except Exception as err:  # UnsupportedEventError and the accountants' own value checks
            raise RayfedError(
                f"the {self.accountant} accountant cannot account {event}: {err}"
            ) from err
        return acc

    def _guarantee(self, acc: PrivacyAccountant) -> tuple[float, float]:
        eps = float(acc.get_epsilon(self.budget.delta))
        delta = acc._delta if isinstance(acc, PureDpAccountant) else self.budget.delta
        return eps, delta

    def _accountant_of(self, key: str) -> PrivacyAccountant:
        """The key's accountant; a new parallel scope starts from every run-wide event so far."""
        if key not in self._accountants:
            acc = make_accountant(self.accountant, self.relation)
            for e in self.entries:
                if e.scope == RUN_SCOPE:
                    self._compose(acc, e.event)
            return acc
        return self._accountants[key]

    def charge(
        self, event: dp_event.DpEvent, *, label: str, scope: str = RUN_SCOPE, round: int = 0
    ) -> LedgerEntry:
        """Record ``event`` or raise BudgetExceeded (recording nothing) if it would exceed the budget.

        Under parallel composition an event in scope ``"run"`` touches every scope's data, so it is
        composed into every scope (and checked against the budget in each).
        """
        self._check_declared(event, label)
        if self.composition == "sequential":
            keys = [RUN_SCOPE]
        elif scope == RUN_SCOPE:
            keys = sorted(set(self._accountants) | {RUN_SCOPE})
        else:
            keys = [scope]
        trials = {k: self._compose(copy.deepcopy(self._accountant_of(k)), event) for k in keys}
        would = max(self._guarantee(acc)[0] for acc in trials.values())
        if not _within(would, self.budget.epsilon):
            raise BudgetExceeded(scope, label, would, self.budget.epsilon, self.budget.delta)
        self._accountants.update(trials)
        entry = LedgerEntry(round=round, scope=scope, label=label, event=event, epsilon_after=would)
        self.entries.append(entry)
        return entry

    def _check_declared(self, event: dp_event.DpEvent, label: str) -> None:
        """UnaccountedNoise unless the charge is made of declared releases' events (one, one
        composed several times, or several composed in one message): a release the plan did
        not declare cannot be charged."""
        if self.declared is None:
            return
        known = list(self.declared.values())  # a composed event (a list inside) has no hash

        def declared(e: dp_event.DpEvent) -> bool:
            if e in known:
                return True
            if isinstance(e, dp_event.SelfComposedDpEvent):
                return declared(e.event)
            if isinstance(e, dp_event.ComposedDpEvent):
                return bool(e.events) and all(declared(sub) for sub in e.events)
            return False

        if not declared(event):
            raise UnaccountedNoise(
                f"the charge {label!r} carries {event}, which is not made of the releases the "
                f"plan declares ({sorted(self.declared)})"
            )

    def charge_all(self, charges: list[tuple[str, str, Any]], *, round: int) -> list[LedgerEntry]:
        """Charge ``(scope, label, event)`` triples in order, all or nothing: if one would exceed
        the budget, none is recorded. (``charge`` composes into copies and swaps them in, so the
        accountants held before stay untouched and restoring them is exact.)"""
        accountants, count = dict(self._accountants), len(self.entries)
        try:
            return [
                self.charge(event, label=label, scope=scope, round=round)
                for scope, label, event in charges
            ]
        except BaseException:
            self._accountants, self.entries[count:] = accountants, []
            raise

    def scopes(self) -> list[str]:
        return sorted({e.scope for e in self.entries})

    def spent(self, scope: str | None = None) -> tuple[float, float]:
        """(ε, δ) of one scope's accountant, or the run's guarantee (the worst scope) if None.

        Under sequential composition every scope shares one accountant: the run's.
        """
        if scope is None:
            keys = list(self._accountants)
        else:
            keys = [scope if self.composition == "parallel" else RUN_SCOPE]
        spent = [self._guarantee(self._accountants[k]) for k in keys if k in self._accountants]
        return (max(s[0] for s in spent), max(s[1] for s in spent)) if spent else (0.0, 0.0)

    def note(self, text: str) -> None:
        """Attach a statement to the report (e.g. a paper's claim next to the true guarantee)."""
        self.notes.append(text)

    def _worst_accountant(self) -> PrivacyAccountant | None:
        if not self._accountants:
            return None
        return max(self._accountants.values(), key=lambda a: self._guarantee(a)[0])

    def report(self) -> PrivacyReport:
        eps, delta = self.spent()
        worst = self._worst_accountant()
        by_accountant = (
            worst.epsilons(self.budget.delta)
            if isinstance(worst, TightestAccountant)
            else ({self.accountant: eps} if worst is not None else {})
        )
        used = (
            worst.used(self.budget.delta)
            if isinstance(worst, TightestAccountant)
            else self.accountant
        )
        return PrivacyReport(
            epsilon=eps,
            delta=delta,
            budget_epsilon=self.budget.epsilon,
            budget_delta=self.budget.delta,
            private=self.budget != Budget.none(),
            accountant=self.accountant,
            neighboring_relation=self.relation,
            composition=self.composition,
            statement=self.statement,
            per_scope={s: self.spent(s)[0] for s in self.scopes()},
            randomness=self.randomness,
            randomness_statement=RANDOMNESS_STATEMENTS[self.randomness],
            notes=list(self.notes),
            releases=list(self.releases),
            accountant_used=used,
            epsilon_by_accountant=by_accountant,
            composed_event=event_to_dict(dp_event.ComposedDpEvent([e.event for e in self.entries])),
            entries=[
                {
                    "round": e.round,
                    "scope": e.scope,
                    "label": e.label,
                    "epsilon_after": e.epsilon_after,
                    **event_to_dict(e.event),
                }
                for e in self.entries
            ],
        )
