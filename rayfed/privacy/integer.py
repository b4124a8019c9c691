"""Integer noise samplers: the discrete Gaussian (Canonne, Kamath & Steinke 2020) and Skellam.

Both are vectorised over any shape and draw from a numpy Generator (``discrete_gaussian``,
``skellam``) or, for per-user keyed shares, from keyed coins (:func:`discrete_gaussian_coins`,
driven by :meth:`NoiseSource.user_discrete_gaussian
<rayfed.privacy.source.NoiseSource.user_discrete_gaussian>`).

What is exact
-------------
* **Discrete Gaussian.** σ² is a :class:`fractions.Fraction` p/q (a float is converted with
  :func:`exact_sigma2`, whose denominator is bounded so that every integer below fits in 63 bits;
  the mechanisms' events use that exact σ²). CKS's Algorithm 3 is followed step for step: the
  discrete Laplace proposal with t = ⌊σ⌋ + 1 (their Algorithm 2) and the acceptance
  Bernoulli(exp(−(|Y| − σ²/t)²/(2σ²))). Every Bernoulli(exp(−γ)) is CKS's Algorithm 1 for the
  rational γ = N/D, and every Bernoulli(a/b) inside it is an integer comparison ``U < a`` with U
  uniform on {0, …, b − 1} drawn by rejection from uniform 64-bit words: no floating point
  anywhere, so the output law is exactly N_Z(0, σ²) given uniform words — **for σ² <= 2^30**
  (:data:`EXACT_SIGMA2_MAX`). Above it, D = 2pqt² no longer fits in 63 bits and the final
  acceptance coin is a float64 comparison U < exp(−γ) (U with 53 random bits): its probability is
  off by at most ~2^−52 relatively per coin, the proposal stays exact. (TFF's sampler, by
  contrast, computes every coin in floating point.) One more, immaterial, approximation: where
  (|Y|·q·t − p)² would exceed 63 bits (|Y| beyond about 2^31/(qt), i.e. tens of σ), ⌊γ⌋ is capped at
  2^62, which changes an acceptance probability below e^−(2^62) to another one below it.
* **Skellam.** Poisson(μ) − Poisson(μ) with numpy's Poisson sampler (inversion for μ < 10, the
  PTRS transformed rejection above): float64 arithmetic, exact up to float rounding — as in TFF
  and the Skellam paper's code.

The generators (PCG64 or the keyed Philox/AES words) are statistical or cryptographic as the
run's randomness says (see :mod:`rayfed.privacy.source`); exactness here is about the map from
uniform words to samples.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from rayfed.errors import ConfigError

#: the largest σ² the discrete Gaussian is sampled with integer arithmetic only
EXACT_SIGMA2_MAX = 1 << 30
#: the bound on D = 2pqt² (and on the numerators compared with it)
_DEN_MAX = 1 << 62
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


def exact_sigma2(sigma2) -> Fraction:
    """σ² as the Fraction p/q the sampler uses: a Fraction or int is kept when its integers fit,
    a float is its closest fraction whose denominator keeps 2pqt² below 2^62 (t = ⌊σ⌋ + 1);
    above :data:`EXACT_SIGMA2_MAX` the nearest integer. ConfigError unless finite and > 0."""
    if isinstance(sigma2, (bool, np.bool_)) or not isinstance(
        sigma2, (int, float, Fraction, np.integer, np.floating)
    ):
        raise ConfigError("sigma2", f"must be a number > 0, got {sigma2!r}")
    if isinstance(sigma2, (float, np.floating)) and not math.isfinite(sigma2):
        raise ConfigError("sigma2", f"must be finite, got {sigma2!r}")
    value = Fraction(sigma2) if not isinstance(sigma2, np.floating) else Fraction(float(sigma2))
    if value <= 0:
        raise ConfigError("sigma2", f"must be > 0, got {sigma2!r}")
    if value > EXACT_SIGMA2_MAX:
        return Fraction(max(1, round(value)))
    if _fits(value):
        return value
    q = max(1, int(_DEN_MAX // (2 * (value * (math.isqrt(math.ceil(value)) + 2) ** 2))))
    while q >= 1:
        candidate = value.limit_denominator(q)
        if candidate > 0 and _fits(candidate):
            return candidate
        q //= 2
    raise ConfigError(
        "sigma2", f"{sigma2!r} is too small for the sampler's integers", "a larger sigma2"
    )


def _fits(value: Fraction) -> bool:
    p, q = value.numerator, value.denominator
    t = math.isqrt(p // q) + 1
    return 2 * p * q * t * t < _DEN_MAX and p < (1 << 31)


# --- coins ---------------------------------------------------------------------------------------
class GeneratorCoins:
    """Uniform 64-bit words from a numpy Generator (its bit generator's raw output)."""

    def __init__(self, gen: np.random.Generator):
        self._raw = gen.bit_generator.random_raw

    def words(self, idx: np.ndarray) -> np.ndarray:
        return np.asarray(self._raw(idx.size), dtype=np.uint64)


class PositionCoins:
    """Uniform 64-bit words keyed by position: ``block(pos, counter)`` is a pure function of the
    position (a user and a coordinate) and of how many words that position drew before, so a
    position's samples never depend on the others'."""

    def __init__(self, block, size: int):
        self._block = block
        self._count = np.zeros(size, dtype=np.uint32)

    def words(self, idx: np.ndarray) -> np.ndarray:
        out = self._block(idx, self._count[idx])
        self._count[idx] += np.uint32(1)
        return out


# --- exact Bernoulli draws -----------------------------------------------------------------------
def _uniform_below(coins, idx: np.ndarray, m) -> np.ndarray:
    """Uniform integers in {0, …, m − 1} for the positions ``idx`` (m >= 1, < 2^63; a scalar or
    one per position), by rejection from 64-bit words: exact."""
    m = np.broadcast_to(np.asarray(m, dtype=np.uint64), idx.shape)
    out = np.empty(idx.shape, dtype=np.uint64)
    todo = np.arange(idx.size)
    while todo.size:
        w = coins.words(idx[todo])
        mm = m[todo]
        r = (np.zeros_like(mm) - mm) % mm  # 2^64 mod m
        ok = (r == 0) | (w < np.zeros_like(r) - r)  # w below the largest multiple of m
        out[todo[ok]] = w[ok] % mm[ok]
        todo = todo[~ok]
    return out


def _bernoulli(coins, idx, num, den) -> np.ndarray:
    """Bernoulli(num/den) for 0 <= num <= den: U < num, U uniform on {0, …, den − 1}."""
    u = _uniform_below(coins, idx, den)
    return u < np.asarray(num, dtype=np.uint64)


def _bernoulli_exp_le1(coins, idx, num, den) -> np.ndarray:
    """Bernoulli(exp(−γ)) for γ = num/den in [0, 1]: CKS Algorithm 1 (K = 1; while
    Bernoulli(γ/K): K += 1; return K odd), with Bernoulli(γ/K) = Bernoulli(γ)·Bernoulli(1/K)."""
    n = idx.size
    num = np.broadcast_to(np.asarray(num, dtype=np.int64), (n,))
    den = np.broadcast_to(np.asarray(den, dtype=np.int64), (n,))
    k = np.ones(n, dtype=np.int64)
    out = np.empty(n, dtype=bool)
    act = np.arange(n)
    while act.size:
        a = _bernoulli(coins, idx[act], num[act], den[act])
        kk = k[act]
        more = np.flatnonzero(a & (kk > 1))
        if more.size:
            a[more] = _uniform_below(coins, idx[act[more]], kk[more]) == 0
        stop = act[~a]
        out[stop] = (k[stop] & 1) == 1
        act = act[a]
        k[act] += 1
    return out


def _bernoulli_exp(coins, idx, whole, frac, den) -> np.ndarray:
    """Bernoulli(exp(−γ)) for γ = whole + frac/den >= 0 (CKS: ⌊γ⌋ draws of Bernoulli(e^−1),
    then Bernoulli(exp(−(γ − ⌊γ⌋))))."""
    n = idx.size
    alive = np.ones(n, dtype=bool)
    act = np.flatnonzero(whole > 0)
    k = 0
    while act.size:
        e1 = _bernoulli_exp_le1(coins, idx[act], 1, 1)
        alive[act[~e1]] = False
        k += 1
        act = act[e1 & (whole[act] > k)]
    fin = np.flatnonzero(alive)
    if fin.size:
        den = np.broadcast_to(np.asarray(den, dtype=np.int64), (n,))
        alive[fin] = _bernoulli_exp_le1(coins, idx[fin], frac[fin], den[fin])
    return alive


def _discrete_laplace(coins, idx: np.ndarray, t: int) -> np.ndarray:
    """P(y) ∝ exp(−|y|/t) for the positions ``idx``: CKS Algorithm 2."""
    out = np.empty(idx.size, dtype=np.int64)
    todo = np.arange(idx.size)
    while todo.size:
        ii = idx[todo]
        u = _uniform_below(coins, ii, t).astype(np.int64)
        d = _bernoulli_exp_le1(coins, ii, u, t)
        go = np.flatnonzero(d)
        gi = ii[go]
        v = np.zeros(go.size, dtype=np.int64)
        act = np.arange(go.size)
        while act.size:
            a = _bernoulli_exp_le1(coins, gi[act], 1, 1)
            act = act[a]
            v[act] += 1
        negative = _uniform_below(coins, gi, 2) == 1
        y = u[go] + t * v
        ok = ~(negative & (y == 0))
        good = go[ok]
        out[todo[good]] = np.where(negative[ok], -y[ok], y[ok])
        done = np.zeros(todo.size, dtype=bool)
        done[good] = True
        todo = todo[~done]
    return out


def _discrete_gaussian(coins, size: int, sigma2: Fraction) -> np.ndarray:
    """``size`` draws of N_Z(0, σ²) (CKS Algorithm 3) from ``coins``, positions 0 … size − 1."""
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1
    den = 2 * p * q * t * t
    exact = den < _DEN_MAX
    zmax = ((1 << 31) - 1 + p) // (q * t)  # |z| <= zmax keeps (|z|qt − p)² below 2^62
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        z = _discrete_laplace(coins, todo, t)
        mag = np.abs(z)
        if exact:
            small = mag <= zmax
            a = mag * (q * t) - p
            num = np.where(small, a, 0) ** 2
            whole, frac = num // den, num % den
            for i in np.flatnonzero(~small):  # tens of σ out: Python integers
                big = (int(mag[i]) * q * t - p) ** 2
                whole[i], frac[i] = min(big // den, 1 << 62), big % den
            accept = _bernoulli_exp(coins, todo, whole, frac, den)
        else:  # σ² > 2^30: the acceptance coin in float64 (see the module docstring)
            sigma2_f = p / q
            gamma = (mag - sigma2_f / t) ** 2 / (2.0 * sigma2_f)
            u = (coins.words(todo) >> np.uint64(11)).astype(np.float64) * 2.0**-53
            accept = u < np.exp(-gamma)
        out[todo[accept]] = z[accept]
        todo = todo[~accept]
    return out


# --- public samplers -----------------------------------------------------------------------------
def discrete_gaussian(gen: np.random.Generator, sigma2, shape) -> np.ndarray:
    """Draws of the discrete Gaussian N_Z(0, σ²), P(x) ∝ exp(−x²/(2σ²)) on the integers, of
    ``shape`` (int64), from ``gen``. σ² is taken as :func:`exact_sigma2` (a Fraction); the draw
    is exact for σ² <= 2^30 (see the module docstring)."""
    s2 = exact_sigma2(sigma2)
    shape = tuple(np.atleast_1d(shape).tolist()) if not isinstance(shape, tuple) else shape
    size = int(np.prod(shape, dtype=np.int64))
    return _discrete_gaussian(GeneratorCoins(gen), size, s2).reshape(shape)


def discrete_gaussian_coins(coins, size: int, sigma2) -> np.ndarray:
    """``size`` draws of N_Z(0, σ²) from position-keyed ``coins`` (:class:`PositionCoins`):
    position i's draw depends on position i's words only."""
    return _discrete_gaussian(coins, int(size), exact_sigma2(sigma2))


def skellam(gen: np.random.Generator, mu, shape) -> np.ndarray:
    """Poisson(μ) − Poisson(μ) of ``shape`` (int64): the symmetric Skellam law, variance 2μ,
    P(k) = e^{−2μ} I_|k|(2μ). Independent Skellams add their μ, so n shares of μ/n sum to
    exactly Skellam(μ). Float arithmetic in numpy's Poisson sampler (module docstring)."""
    if isinstance(mu, (bool, np.bool_)) or not isinstance(
        mu, (int, float, np.integer, np.floating)
    ):
        raise ConfigError("mu", f"must be a number > 0, got {mu!r}")
    if not (math.isfinite(mu) and mu > 0):
        raise ConfigError("mu", f"must be a finite number > 0, got {mu!r}")
    return gen.poisson(float(mu), size=shape).astype(np.int64) - gen.poisson(
        float(mu), size=shape
    ).astype(np.int64)


# --- tail bounds (modular clipping) --------------------------------------------------------------
def discrete_gaussian_sum_tail(sigma2, num_shares: int, x: float) -> float:
    """An upper bound on P[|S| >= x] for S the sum of ``num_shares`` independent N_Z(0, σ²) (one
    coordinate): N_Z(0, σ²) is sub-Gaussian with variance proxy σ² (E e^{λX} <= e^{λ²σ²/2},
    Canonne, Kamath & Steinke 2020), so S is with nσ² and P[|S| >= x] <= 2·exp(−x²/(2nσ²)).
    Union-bound it over the coordinates for the probability that any one wraps mod 2^b."""
    var = float(num_shares) * float(sigma2)
    if x <= 0:
        return 1.0
    return min(1.0, 2.0 * math.exp(-(float(x) ** 2) / (2.0 * var)))


def skellam_tail(variance: float, x: float) -> float:
    """An upper bound on P[|S| >= x] for S Skellam noise of ``variance`` μ (Poisson(μ/2) −
    Poisson(μ/2), one coordinate): Chernoff with E e^{λS} = exp(μ(cosh λ − 1)), optimal at
    λ = asinh(x/μ): P[|S| >= x] <= 2·exp(μ(sqrt(1 + (x/μ)²) − 1) − x·asinh(x/μ)).
    Union-bound it over the coordinates for the probability that any one wraps mod 2^b."""
    mu, x = float(variance), float(x)
    if x <= 0:
        return 1.0
    r = x / mu
    return min(1.0, 2.0 * math.exp(mu * (math.sqrt(1.0 + r * r) - 1.0) - x * math.asinh(r)))
