"""The General Wave family (spec §2.7, Def. 3.5.1, Thm 3.5.1) and the structured transition
operator that lifts square-wave's d cap (rayfed.ldp.wave), the fast Walsh-Hadamard transform of
HRR, and the options that reach them.

References are computed independently of the code under test: the wave's normalisation and the
transition matrix from 50-digit decimals and exact rationals (the double integral taken as a 1-D
integral of shape x overlap, exact by Simpson's rule between breakpoints), the sampler against
the density's closed-form CDF, the structured products against the dense matrix.
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy.linalg import hadamard
from scipy.stats import kstest

import rayfed
from rayfed.errors import ConfigError
from rayfed.ldp import oracles, wave
from rayfed.ldp import square_wave as sw

RATIOS = (0.8, 0.4, 0.0)  # two trapezoids and the triangle


def _gen(*ident) -> np.random.Generator:
    return np.random.default_rng([1234, *ident])


# --- the wave: normalisation, ε-LDP, Lemma 2 ------------------------------------------------------
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("eps", [0.5, 1.0, 5.0])
def test_wave_densities_against_50_digit_normalisation(ratio, eps):
    """q = 1/(1 + 2b + (e^ε - 1)·b·(1 + ratio)) from ∫W = 1 in 50-digit decimals; the top is
    e^ε q. SW's q is the smallest (Lemma 2), so Lemma 1's W1 factor 1 - (2b+1)q is the largest."""
    b = sw.band_half_width(eps)
    with localcontext() as context:
        context.prec = 50
        e, db, dr = Decimal(eps).exp(), Decimal(b), Decimal(ratio)
        q = 1 / (1 + 2 * db + (e - 1) * db * (1 + dr))
    high, low = wave.densities(eps, b, ratio)
    assert low == pytest.approx(float(q), rel=1e-13)
    assert high == pytest.approx(float(e * q), rel=1e-13)
    _, q_sw = sw.densities(eps, b)
    assert low > q_sw  # so Lemma 1's factor 1 - (2b+1)q is largest for SW


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("eps", [0.5, 1.0, 5.0])
def test_wave_is_eps_ldp_on_every_output_bucket(ratio, eps):
    """Thm 3.5.1, on the exact transition matrix (checked against exact rationals below): for
    every output bucket the probability ratio over any two inputs is at most e^ε, and fine
    buckets come close to it (the density reaches both q and e^ε q)."""
    b = sw.band_half_width(eps)
    m = wave.transition_matrix(eps, b, ratio, 512, 512)
    per_output = m.max(axis=1) / m.min(axis=1)
    assert per_output.max() <= math.exp(eps) * (1 + 1e-9)
    assert per_output.max() >= math.exp(eps) * 0.9


def _wave_cdf(t: np.ndarray, v: float, eps: float, b: float, ratio: float) -> np.ndarray:
    """Pr[ṽ <= t] = q·(t + b) + (e^ε q - q)·∫_{-b}^{t-v} K, with ∫K by the trapezoid's geometry
    (a rising triangle, the plateau, a falling triangle)."""
    with localcontext() as context:
        context.prec = 50
        e = Decimal(eps).exp()
        q = float(1 / (1 + 2 * Decimal(b) + (e - 1) * Decimal(b) * (1 + Decimal(ratio))))
    high = math.exp(eps) * q
    s, top = b * (1 - ratio), ratio * b
    z = np.clip(t - v, -b, b)
    area = np.where(
        z <= -top,
        (z + b) ** 2 / (2 * s),
        np.where(z <= top, s / 2 + (z + top), b * (1 + ratio) - (b - z) ** 2 / (2 * s)),
    )
    return q * (np.clip(t, -b, 1 + b) + b) + (high - q) * area


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("v", [0.0, 0.37, 0.98])
def test_wave_sampler_follows_its_density(ratio, v):
    """Kolmogorov-Smirnov of 50,000 reports against the closed-form CDF (fixed seed; the test
    fails at the 1e-4 level); every report in [-b, 1+b]."""
    eps, n = 1.0, 50_000
    b = sw.band_half_width(eps)
    u = _gen(int(ratio * 10), int(v * 100)).random((n, 3))
    out = wave.perturb(np.full(n, v), eps, b, ratio, u)
    assert out.min() >= -b and out.max() <= 1 + b
    assert kstest(out, lambda t: _wave_cdf(t, v, eps, b, ratio)).pvalue > 1e-4


# --- the transition matrix ------------------------------------------------------------------------
def _exact_entry(b, ratio, a, w_in, c, w_out) -> Fraction:
    """∬_{[a, a+w_in] x [c, c+w_out]} K(t - v) dt dv = ∫ K(z)·λ(z) dz, λ(z) the length of
    {v in the input bucket : v + z in the output bucket}. K and λ are piecewise linear, so their
    product is quadratic between breakpoints and Simpson's rule is exact there."""
    top = ratio * b

    def k(z):
        z = abs(z)
        if z >= b:
            return Fraction(0)
        return Fraction(1) if z <= top else (b - z) / (b - top)

    def overlap(z):
        return max(Fraction(0), min(a + w_in, c + w_out - z) - max(a, c - z))

    lo, hi = c - a - w_in, c + w_out - a
    points = {lo, hi, c - a, c + w_out - a - w_in, -b, -top, top, b}
    points = sorted(p for p in points if lo <= p <= hi)
    total = Fraction(0)
    for z0, z1 in itertools.pairwise(points):
        mid = (z0 + z1) / 2
        f0, fm, f1 = (k(z) * overlap(z) for z in (z0, mid, z1))
        total += (z1 - z0) * (f0 + 4 * fm + f1) / 6
    return total


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("eps", [1.0, 5.0])
def test_wave_transition_matrix_matches_exact_rationals(ratio, eps):
    """Every entry of M (d = 6 inputs, d̃ = 9 outputs) within 1e-12 of its column's largest of
    the exact double integral (rationals for the shape, 50 digits for q and e^ε q)."""
    d, d_out = 6, 9
    b = sw.band_half_width(eps)
    m = wave.transition_matrix(eps, b, ratio, d, d_out)
    fb, fr = Fraction(b), Fraction(ratio)
    w_in, w_out = Fraction(1, d), (1 + 2 * fb) / d_out
    with localcontext() as context:
        context.prec = 50
        e = Decimal(eps).exp()
        q = 1 / (1 + 2 * Decimal(b) + (e - 1) * Decimal(b) * (1 + Decimal(ratio)))

        def entry(i: int, j: int) -> float:
            shape = _exact_entry(fb, fr, i * w_in, w_in, -fb + j * w_out, w_out)
            band = Decimal(shape.numerator) / Decimal(shape.denominator) * d
            return float(q * Decimal(float(w_out)) + (e - 1) * q * band)

        exact = np.array([[entry(i, j) for i in range(d)] for j in range(d_out)])
    assert (m > 0).all()
    assert np.abs(m - exact).max() <= 1e-12 * exact.max(axis=0).min()


@pytest.mark.parametrize("ratio", RATIOS)
def test_wave_transition_matrix_columns_sum_to_one_and_ratio_bounded(ratio):
    """d = d̃ = 256: columns sum to 1 within 1e-12; in every output bucket the ratio of its
    probabilities over the inputs stays within e^ε (bucket averages of densities in [q, e^ε q];
    a bucket inside a trapezoid's plateau reaches e^ε, up to the matrix's 1e-11 rounding)."""
    eps = 1.0
    m = wave.transition_matrix(eps, sw.band_half_width(eps), ratio, 256, 256)
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=1e-12)
    ratio_per_output = m.max(axis=1) / m.min(axis=1)
    assert ratio_per_output.max() <= math.exp(eps) * (1 + 1e-10)
    assert ratio_per_output.max() > 1.5  # the band is resolved: far from a flat matrix


# --- the structured operator ----------------------------------------------------------------------
def _products(m, op, d, d_out, seed):
    x = _gen(seed).random(d)
    x /= x.sum()
    y = _gen(seed, 1).random(d_out) * 1e3
    return (m @ x, op @ x), (m.T @ y, op.T @ y)


@pytest.mark.parametrize(
    ("ratio", "eps", "d", "d_out"),
    [
        (1.0, 1.0, 256, 256),
        (1.0, 4.0, 64, 100),
        (1.0, 100.0, 64, 64),
        (0.8, 1.0, 256, 256),
        (0.4, 5.0, 64, 100),
        (0.0, 1.0, 256, 256),
    ],
)
def test_structured_products_equal_dense(ratio, eps, d, d_out):
    """M·x and Mᵀ·y by the O(d) operator equal the dense matrix's within 1e-12 relative."""
    b = sw.band_half_width(eps)
    m = wave.transition_matrix(eps, b, ratio, d, d_out)
    op = wave.WaveOperator(eps, b, ratio, d, d_out)
    assert op.shape == m.shape
    for dense, structured in _products(m, op, d, d_out, d):
        np.testing.assert_allclose(structured, dense, rtol=1e-12, atol=0)


def test_structured_products_equal_dense_at_4096():
    """At d = d̃ = 4,096 (the old cap) within 2e-11 relative: the difference is the dense
    matrix's own rounding — its columns sum to 1 within 1e-11 (d·ulp), the operator's within
    1e-13 (extended-precision prefix sums)."""
    eps, d = 1.0, 4096
    b = sw.band_half_width(eps)
    m = sw.transition_matrix(eps, b, d, d)
    op = wave.WaveOperator(eps, b, 1.0, d, d)
    for dense, structured in _products(m, op, d, d, 7):
        np.testing.assert_allclose(structured, dense, rtol=2e-11, atol=0)
    np.testing.assert_allclose(op.T @ np.ones(d), 1.0, atol=1e-13)


@pytest.mark.parametrize(
    ("ratio", "eps", "tolerance"),
    [(1.0, 1.0, 1e-13), (1.0, 100.0, 1e-13), (0.8, 1.0, 1e-11), (0.0, 5.0, 1e-10)],
)
def test_structured_columns_sum_to_one_at_2_to_16(ratio, eps, tolerance):
    """d = d̃ = 65,536 (dense: 32 GiB): every column of M sums to 1 (Mᵀ·1) — SW within 1e-13
    at any ε (a band far narrower than a bucket at ε = 100), the waves within 1e-10 up to their
    ε = 5 — and Σ(M·x) = Σx."""
    d = 65_536
    op = wave.WaveOperator(eps, sw.band_half_width(eps), ratio, d, d)
    np.testing.assert_allclose(op.T @ np.ones(d), 1.0, atol=tolerance)
    x = _gen(3).random(d)
    assert (op @ x).sum() == pytest.approx(x.sum(), rel=1e-12)


@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_discrete_operator_equals_dense(eps):
    d = 200
    m = sw.discrete_transition_matrix(eps, d)
    op = wave.DiscreteOperator(eps, d)
    assert op.shape == m.shape
    for dense, structured in _products(m, op, d, m.shape[0], 5):
        np.testing.assert_allclose(structured, dense, rtol=1e-12, atol=0)


def test_ems_with_the_operator_equals_ems_with_the_matrix():
    """The same EMS run from the same report counts: the same iterations, estimates within
    1e-10."""
    eps, d = 1.0, 128
    b = sw.band_half_width(eps)
    values = _gen(11).beta(5, 2, 50_000)
    reports = sw.perturb(values, eps, b, _gen(12).random((values.size, 1)))
    counts = sw.histogram(reports, b, d)
    dense = sw.expectation_maximisation(
        counts, sw.transition_matrix(eps, b, d, d), smoothing=True, tolerance=1e-3
    )
    structured = sw.expectation_maximisation(
        counts, wave.WaveOperator(eps, b, 1.0, d, d), smoothing=True, tolerance=1e-3
    )
    assert structured[1] == dense[1]
    np.testing.assert_allclose(structured[0], dense[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("size", [1, 2, 64, 4096])
def test_walsh_hadamard_equals_the_dense_product_exactly(size):
    x = _gen(size).integers(-1000, 1000, size).astype(np.float64)
    assert np.array_equal(oracles.walsh_hadamard(x), hadamard(size) @ x)


# --- the options, end to end ----------------------------------------------------------------------
def run(**options):
    return rayfed.run("square-wave", backend="local", out_dir=None, **options)


def test_sw_ems_at_d_2_to_16_end_to_end():
    """d = 65,536 (the new cap) runs with the structured operator: a histogram on the simplex,
    closer to the truth than the uniform start after five EMS iterations (W1 0.126 against the
    uniform's 0.214 at this seed; 20,000 users are far too few for 65,536 buckets to do well)."""
    result = run(users=20_000, buckets=65_536, max_iterations=5, seed=3)
    est = result.tables["histogram"].column("estimate").to_numpy()
    assert est.size == 65_536 and (est >= 0).all()
    assert est.sum() == pytest.approx(1.0, abs=1e-12)
    uniform = np.full(est.size, 1 / est.size)
    truth = result.tables["histogram"].column("true").to_numpy()
    w1_uniform = np.abs(np.cumsum(truth) - np.cumsum(uniform)).sum() / est.size
    assert result.metrics["wasserstein"] < 0.75 * w1_uniform


@pytest.mark.parametrize("wave_options", [{"wave": "triangle"}, {"wave": "trapezoid"}])
def test_wave_runs_with_either_matrix(wave_options):
    """A wave's run with the dense matrix and with the operator: the same estimate to 1e-9."""
    common = dict(users=20_000, buckets=128, seed=5, **wave_options)
    dense = run(transition="dense", **common)
    structured = run(transition="structured", **common)
    assert dense.metrics["iterations"] == structured.metrics["iterations"]
    np.testing.assert_allclose(
        structured.tables["histogram"].column("estimate").to_numpy(),
        dense.tables["histogram"].column("estimate").to_numpy(),
        atol=1e-9,
    )


@pytest.mark.parametrize(
    ("options", "structured"),
    [
        ({"buckets": 2048}, False),  # every result up to 2,048² bit for bit as before
        ({"buckets": 2048, "output_buckets": 4096}, True),
        ({"buckets": 4096}, True),
        ({"buckets": 4096, "transition": "dense"}, False),
        ({"buckets": 256, "transition": "structured"}, True),
        ({"buckets": 8192, "bucketize": "br"}, True),
    ],
)
def test_auto_keeps_the_dense_matrix_up_to_2048_squared(options, structured):
    from rayfed.protocols.square_wave.config import SquareWaveConfig

    assert SquareWaveConfig(**options).structured() is structured


@pytest.mark.parametrize(
    "options,field",
    [
        ({"wave": "triangle", "epsilon": 6.0}, "epsilon"),
        ({"wave": "trapezoid", "trapezoid_ratio": 0.95}, "trapezoid_ratio"),
        ({"wave": "trapezoid", "trapezoid_ratio": 0.0}, "trapezoid_ratio"),
        ({"trapezoid_ratio": 0.5}, "trapezoid_ratio"),  # wave=square reads no ratio
        ({"wave": "sine"}, "wave"),
        ({"bucketize": "br", "wave": "triangle"}, "wave"),
        ({"method": "cfo", "wave": "triangle"}, "wave"),
        ({"method": "cfo", "transition": "dense"}, "transition"),
        ({"buckets": 8192, "transition": "dense"}, "transition"),
        ({"method": "hh", "buckets": 16_384}, "buckets"),
        ({"buckets": 131_072}, "buckets"),
    ],
)
def test_bad_wave_and_transition_options(options, field):
    with pytest.raises(ConfigError) as info:
        run(**options)
    assert info.value.field == field
