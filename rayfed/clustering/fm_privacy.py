"""The privacy of the parties' DP Flajolet–Martin sketches taken together, and the calibration of
ε′ (the phantom count n_p and the floor α_min) against it.

All S parties hash a user with the same M secret keys (DPFMPS needs it: the server merges the
parties' sketches of one key). So one user's hash value h_i reaches the server S times per key —
once in the entry of its cluster at every party — while the phantoms that hide it are drawn afresh
at each party. The paper composes the parties' sketch matrices as independent (ε2, δ2) mechanisms
(Theorem 4, from Lemma 1); they are not: when the S entries of one key agree on a high value, that
value is almost surely h_i. Here the S sketch matrices are one release about a user, and its
privacy loss is computed from the mechanism itself.

**The pair of output laws of one key.** Neighbours: one user added or removed (all its columns, at
every party). With an ideal keyed hash whose keys the server does not know, the hash values are
i.i.d. Geometric(γ/(1+γ)) on {1, 2, …}, independent across keys. At party ℓ the entry of the
user's cluster is max(h, V_ℓ) with V_ℓ = max(phantoms, α_min, other members' hashes); the entries
of the other clusters do not involve the user. The worst case is the user alone in its cluster
at every party: given the other users' hashes, a larger cluster turns (max(h, V_ℓ))_ℓ into
(max(h, V_ℓ, g_ℓ))_ℓ for constants g_ℓ, and a user sharing its grid cell with others adds one
common independent maximum to every entry — both post-processing of the lone case, and a mixture
over them (the other entries) is dominated by its worst component (joint convexity of the
hockey-stick divergence). So, per key,

    P0: (V_1, …, V_S), V_ℓ = max(α_min, max of n_p geometrics) i.i.d. (the user absent),
    P1: (max(h, V_1), …, max(h, V_S)), h geometric, shared (the user present).

**A sufficient statistic.** With m = min_ℓ y_ℓ and j = #{ℓ : y_ℓ = m}, the likelihood ratio is

    P1(y)/P0(y) = L(m, j) = P(h < m) + P(h = m)·(F_V(m)/p_V(m))^j,

a function of (m, j) only, so the pair of laws of T = (m, j) (S·(Z − α_min) atoms) has the same
privacy loss distribution as the pair on {α_min, …}^S. For j = 1, L ≤ 1 + 1/n_p: one party's
sketch is about ε′-DP, as Lemma 1 assumes. For j ≥ 2 and m above the phantoms' range,
L ≈ (1+γ)^{(j−1)m}/n_p^j grows without bound: a tie of the parties' entries at a high value is a
rare event with a large loss, so the joint release is (ε, δ)-DP with δ ≈ M·P(such a tie) — and
not pure at any ε. (Its Rényi divergences are infinite above order S/(S−1): an RDP bound cannot
see it; the privacy loss distribution can.)

**Composition over the M keys** (independent keys) is the M-fold convolution of the per-key
privacy loss distribution, in both directions (removal: P1 against P0; addition: P0 against P1).
It is computed numerically, as an upper bound:

* the per-key losses are put on a grid of step ε_u/4, ε_u = ln(1 + 1/n_p), each atom split
  between its two neighbouring grid points so that E[e^{−loss}] is kept ("connecting the dots":
  by Jensen's inequality in e^{−loss} this increases δ(ε) for every ε at once);
* the atoms with the largest losses (the high ties), of total mass β per key with M·β <= 0.02,
  are kept exact: the M-fold composition is Σ_k C(M, k)·bulk^{*(M−k)} * high^{*k} for k < K = 5,
  and the terms k >= K are bounded by P(Binomial(M, β) >= K);
* the bulk is convolved by FFT on a window that holds all but 1e-18 of its mass (Chernoff bounds
  from its exact moment generating function); the mass outside is added to δ, as is every
  pruned term and the tail of the statistic beyond its last atom;
* addition's losses below −c0 (c0 the bulk's upper end) are raised to −c0 (raising a loss can only
  increase δ).

The result is within about 0.3 % of dp-accounting's PLD accountant at its finest discretisation
(tests/test_vfl_kmeans_units.py checks it both ways against dp-accounting on the full pmf of
(y_1, …, y_S)), and takes milliseconds to a second. Float64 round-off (≈ 1e-15) is far below any δ.

:func:`calibrate` finds the largest ε′ (fewest phantoms) whose joint (ε, δ) is within the share
of the budget the sketches are given.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import comb, logsumexp
from scipy.stats import binom

from rayfed.clustering import fm

#: per-key tail of the statistic beyond its last atom, and the Chernoff window's tail, each <= this
TAIL = 1e-18
#: the high atoms' mass per key is at most this over M (so K terms leave P(Bin >= K) ~ 1e-11)
HIGH_MASS = 0.02
TERMS = 5
#: the grid of the high ties' summed losses (split onto it as the bulk is: second-order error)
HIGH_STEP = 1e-3
#: default δ the rarest high ties and the smallest sums of k of them may add, counted whole
#: rather than composed (calibrate uses 1e-6·δ)
NEGLIGIBLE = 1e-15
#: grid steps per ε_u = ln(1 + 1/n_p), the largest loss of a key without a tie
STEPS_PER_UNIT = 4


def statistic(phantoms: int, floor: int, gamma: float, parties: int):
    """The per-key pair of laws on T = (m, j): ``(log P0(t), log L(t), P1(m > Z), P0(m > Z))``
    over the atoms t (m = floor … Z, j = 1 … S, flattened), Z where the tails are below
    :data:`TAIL`. L = P1/P0."""
    lq = -math.log1p(gamma)  # log q, q = P(H > y + 1 | H > y)
    z = floor + math.ceil(math.log(TAIL) / lq) + 1
    m = np.arange(floor, z + 1, dtype=np.float64)
    log_f = phantoms * np.log1p(-np.exp(m * lq))  # log F_R(m) = log P(max of n_p <= m)
    log_f_prev = np.concatenate([[-np.inf], log_f[:-1]])  # V >= floor: F_V(floor - 1) = 0
    log_p = log_f + np.log(-np.expm1(log_f_prev - log_f))  # log p_V(m)
    log_above = np.log(-np.expm1(log_f))  # log(1 - F_V(m))
    j = np.arange(1, parties + 1, dtype=np.float64)
    log_p0 = (
        np.log(comb(parties, j))[None, :]
        + j[None, :] * log_p[:, None]
        + (parties - j)[None, :] * log_above[:, None]
    )
    below = np.log(-np.expm1((m - 1) * lq))  # log P(h < m)
    at = math.log(-math.expm1(lq)) + (m - 1) * lq  # log P(h = m)
    log_ratio = np.logaddexp(below[:, None], at[:, None] + j[None, :] * (log_f - log_p)[:, None])
    q_z = math.exp(z * lq)
    tail0 = math.exp(parties * log_above[-1])
    tail1 = q_z + (1.0 - q_z) * tail0
    return log_p0.ravel(), log_ratio.ravel(), tail1, tail0


def _on_grid(loss: np.ndarray, mass: np.ndarray, step: float) -> tuple[np.ndarray, int]:
    """(pmf over grid indices offset…, offset): each atom split between the grid points a < ℓ <=
    b around it with weights keeping E[e^{-loss}] (pessimistic for every ε: Jensen in e^{-loss})."""
    low = np.floor(loss / step).astype(np.int64)
    a, b = low * step, (low + 1) * step
    on_a = np.exp(a - loss) - np.exp(a - b)
    on_a = np.clip(on_a / -np.expm1(a - b), 0.0, 1.0)
    offset = int(low.min())
    size = int(low.max()) + 2 - offset
    pmf = np.bincount(low - offset, weights=mass * on_a, minlength=size)
    pmf += np.bincount(low + 1 - offset, weights=mass * (1.0 - on_a), minlength=size)
    return pmf, offset


class _Composed:
    """n-fold self-convolutions of a (sub-)pmf on a grid, for several n, on one window that holds
    all of each one's mass but at most :data:`TAIL` on either side; called with n and e, the
    hockey-stick divergence D_n(e) = Σ_x p^{*n}(x)(1 − e^{e−x})_+ plus the mass left outside (an
    upper bound)."""

    def __init__(self, pmf: np.ndarray, offset: int, step: float, counts: list[int]):
        self._tables = {}
        positive = [n for n in counts if n > 0]
        if 0 in counts:  # nothing composed: a point mass at loss 0
            self._tables[0] = self._table(np.ones(1), 0, 0.0, step)
        if not positive:
            return
        width = pmf.size
        low = min(self._bound(pmf, n, -1) for n in positive)
        high = max(self._bound(pmf, n, +1) for n in positive)
        size = 1 << math.ceil(math.log2(max(high - low + 1, width, 2)))
        spectrum = np.fft.rfft(pmf, size)
        window = np.arange(low, high + 1) % size
        power, done = np.ones_like(spectrum), 0
        for n in sorted(positive):  # one complex power, then a product per extra key
            power = power * (spectrum ** (n - done) if n - done > 1 else spectrum)
            done = n
            circular = np.maximum(np.fft.irfft(power, size), 0.0)
            # each tail, and what each wraps into the window
            self._tables[n] = self._table(circular[window], low + offset * n, 4 * TAIL, step)

    @staticmethod
    def _bound(pmf: np.ndarray, n: int, side: int) -> int:
        """The index beyond which (side +1: above; −1: below) the n-fold convolution holds at
        most TAIL: Chernoff, P(X >= t) <= exp(n·log E[e^{λX}] − λt), over a range of λ."""
        support = np.flatnonzero(pmf > 0)
        orders = side * np.geomspace(1e-6, 50.0, 200) / max(1.0, math.sqrt(n))
        log_mgf = logsumexp(np.outer(orders, support) + np.log(pmf[support])[None, :], axis=1)
        bound = (n * log_mgf + math.log(1.0 / TAIL)) / orders
        full = n * (pmf.size - 1)
        if side > 0:
            return min(full, math.ceil(float(np.min(bound))))
        return max(0, math.floor(float(np.max(bound))))

    @staticmethod
    def _table(values: np.ndarray, low: int, outside: float, step: float):
        x = (np.arange(values.size) + low) * step
        upper = np.concatenate([np.cumsum(values[::-1])[::-1], [0.0]])
        lower = np.concatenate([np.cumsum((values * np.exp(-x))[::-1])[::-1], [0.0]])
        return x, upper, lower, outside

    def __call__(self, n: int, e) -> np.ndarray:
        x, upper, lower, outside = self._tables[n]
        e = np.asarray(e, dtype=np.float64)
        i = np.searchsorted(x, e, side="right")
        return np.maximum(upper[i] - np.exp(e) * lower[i], 0.0) + outside


class JointSketchLoss:
    """The privacy loss of S parties' M-key DP FM sketch matrices, built with shared keys, for one
    user added or removed (module docstring): ``delta(ε)`` and ``epsilon(δ)`` of the whole release,
    upper bounds."""

    def __init__(
        self,
        phantoms: int,
        floor: int,
        gamma: float,
        parties: int,
        keys: int,
        negligible: float = NEGLIGIBLE,
    ):
        self.phantoms, self.floor, self.gamma = int(phantoms), int(floor), float(gamma)
        self.parties, self.keys = int(parties), int(keys)
        log_p0, log_ratio, tail1, tail0 = statistic(phantoms, floor, gamma, parties)
        unit = math.log1p(1.0 / phantoms)
        step = unit / STEPS_PER_UNIT
        m = self.keys
        # removal: losses log L under P1
        mass1 = np.exp(log_p0 + log_ratio)
        order = np.argsort(log_ratio)[::-1]
        top = int(np.searchsorted(np.cumsum(mass1[order]), HIGH_MASS / m, side="right"))
        cut = max(float(log_ratio[order[top]]) if top < order.size else -math.inf, unit)
        bulk = log_ratio <= cut
        pmf, offset = _on_grid(log_ratio[bulk], mass1[bulk], step)
        high_loss, high_mass = log_ratio[~bulk], mass1[~bulk]
        # the rarest high atoms (of mass <= negligible/(2·terms·M) in all) count as infinite losses
        prune = negligible / (2 * TERMS)
        order = np.argsort(high_mass)
        rare = order[: int(np.searchsorted(np.cumsum(high_mass[order]), prune / m))]
        tail1 += float(high_mass[rare].sum())
        high_loss, high_mass = np.delete(high_loss, rare), np.delete(high_mass, rare)
        terms = min(TERMS, m + 1)
        self._bulk = _Composed(pmf, offset, step, [m - k for k in range(terms)])
        # k high atoms together: their summed losses split onto a grid of HIGH_STEP (as the bulk:
        # pessimistic), merged; the smallest sums, of mass <= prune/C(M, k), are counted whole in
        # δ — and so is every k-tuple extending a pruned (k−1)-tuple (its mass times β)
        beta = float(high_mass.sum())
        self._high = [(np.zeros(1), np.ones(1), 0.0)]  # (losses, masses, mass counted whole)
        for k in range(1, terms if high_loss.size else 1):
            losses, masses, whole = self._high[-1]
            whole *= beta
            if not losses.size:
                self._high.append((losses, masses, whole))
                continue
            pmf_k, low = _on_grid(
                (losses[:, None] + high_loss[None, :]).ravel(),
                (masses[:, None] * high_mass[None, :]).ravel(),
                HIGH_STEP,
            )
            index = np.flatnonzero(pmf_k)
            merged = pmf_k[index]
            order = np.argsort(merged)
            small = order[: int(np.searchsorted(np.cumsum(merged[order]), prune / comb(m, k)))]
            keep = np.ones(index.size, dtype=bool)
            keep[small] = False
            whole += float(merged[small].sum())
            self._high.append(((index[keep] + low) * HIGH_STEP, merged[keep], whole))
        self._remainder = float(binom.sf(terms - 1, m, beta)) if terms <= m and beta else 0.0
        self._infinite = -math.expm1(m * math.log1p(-tail1))
        # addition: losses −log L under P0, those below −cut raised to −cut
        pmf_add, offset_add = _on_grid(np.maximum(-log_ratio, -cut), np.exp(log_p0), step)
        self._add = _Composed(pmf_add, offset_add, step, [m])
        self._infinite_add = -math.expm1(m * math.log1p(-tail0))

    def delta(self, epsilon: float) -> float:
        """δ(ε) of the M keys, the larger of removal and addition (an upper bound)."""
        removal = self._infinite + self._remainder
        for k, (losses, masses, whole) in enumerate(self._high):
            removal += comb(self.keys, k) * (
                float(np.dot(masses, self._bulk(self.keys - k, epsilon - losses))) + whole
            )
        addition = self._infinite_add + float(self._add(self.keys, epsilon))
        return min(1.0, max(removal, addition))

    def epsilon(self, delta: float) -> float:
        """The smallest ε (to a relative 1e-6) with δ(ε) <= ``delta``."""
        if not 0 < delta < 1:
            raise ValueError(f"δ must be in (0, 1), got {delta}")
        low, high = 0.0, 1.0
        while self.delta(high) > delta:
            low, high = high, 2 * high
            if high > 1e4:
                return math.inf
        while high - low > 1e-6 * high:
            mid = (low + high) / 2
            low, high = (low, mid) if self.delta(mid) <= delta else (mid, high)
        return high


@dataclass(frozen=True)
class Calibration:
    """ε′ with its phantom count and floor, and the joint (ε, δ) it gives."""

    eps_prime: float
    phantoms: int
    floor: int
    epsilon: float
    delta: float


#: the largest ε at which :meth:`JointSketchLoss.delta` is evaluated (e^ε overflows past ~709)
EPSILON_CHECKED = 500.0


@functools.lru_cache(maxsize=256)
def calibrate(
    epsilon: float, delta: float, keys: int, parties: int, gamma: float, rtol: float = 1e-3
) -> Calibration:
    """The largest ε′ (to ``rtol``) whose S parties' M-key sketches are jointly (ε, δ)-DP
    (:class:`JointSketchLoss`): the fewest phantoms that spend the sketches' share and no more."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"the sketches' share needs ε > 0 and 0 < δ < 1, got ({epsilon}, {delta})")

    seen: dict[tuple[int, int], bool] = {}

    def holds(eps_prime: float) -> bool:
        if fm.alpha_min(eps_prime, gamma) < 1:
            # 1 - e^-ε′ rounds to 1 in float64 (ε′ past ~37): no sketch of that ε′ can be
            # represented, so the search stays below it (fewer ε′ than the share allows: still DP)
            return False
        key = (fm.phantom_count(eps_prime), fm.alpha_min(eps_prime, gamma))
        if key not in seen:
            loss = JointSketchLoss(*key, gamma, parties, keys, negligible=1e-6 * delta)
            # δ(ε) falls as ε grows: checking at min(ε, EPSILON_CHECKED) is a sound bound where
            # the loss grid cannot take ε itself (its e^ε overflows float64 past ~709)
            seen[key] = loss.delta(min(epsilon, EPSILON_CHECKED)) <= delta
        return seen[key]

    guess = fm.sketch_epsilon(epsilon / parties, delta / parties, keys)  # Lemma 1's, a start
    low, high = guess, guess
    for _ in range(200):
        if holds(low):
            break
        high, low = low, low / 2
    else:
        raise ValueError(f"no phantom count makes the sketches ({epsilon}, {delta})-DP")
    while holds(high):
        low, high = high, 2 * high
    while high / low > 1 + rtol:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if holds(mid) else (low, mid)
    phantoms, floor = fm.phantom_count(low), fm.alpha_min(low, gamma)
    loss = JointSketchLoss(phantoms, floor, gamma, parties, keys, negligible=1e-6 * delta)
    # δ(ε) <= δ holds: the charge is ε, or the smaller ε the bound finds for δ
    return Calibration(low, phantoms, floor, min(epsilon, loss.epsilon(delta)), delta)


@functools.lru_cache(maxsize=64)
def evaluate(eps_prime: float, delta: float, keys: int, parties: int, gamma: float) -> Calibration:
    """The joint (ε, δ) of sketches with ε′'s phantom count and floor (e.g. Lemma 1's ε′)."""
    phantoms, floor = fm.phantom_count(eps_prime), fm.alpha_min(eps_prime, gamma)
    loss = JointSketchLoss(phantoms, floor, gamma, parties, keys, negligible=1e-6 * delta)
    return Calibration(eps_prime, phantoms, floor, loss.epsilon(delta), delta)
