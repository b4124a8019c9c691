"""Unit checks of the LDP building blocks of rayfed.ldp (spec shared/specs/square-wave.md §2 and the
analytic checks 1-7 of §5.1): the Square Wave band b_SW, its densities and samplers (continuous and
discrete), the transition matrices, EM/EMS, the frequency oracles GRR/OLH/HRR with Norm-Sub, the
mean baselines SR/PM, the hierarchies (constrained inference, HH-ADMM, Haar) and the metrics.

Randomness is fixed (rayfed.rng streams with purpose "test"). Every statistical tolerance is derived
from the estimator's variance in a comment next to the assertion: 4 standard errors, raised to a
Bonferroni level (family-wise false-alarm rate 1e-3) where many entries are compared at once.
"""

import itertools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy.linalg import hadamard
from scipy.optimize import minimize_scalar
from scipy.stats import beta, norm, wasserstein_distance

from rayfed import rng
from rayfed.ldp import hierarchy, metrics, oracles
from rayfed.ldp import square_wave as sw

ROOT = 20240917

#: the spec's §2.9 table: ε -> (b_SW, 2bp, 1 - (2b+1)q)
B_TABLE = {
    0.25: (0.4232, 0.521, 0.115),
    0.5: (0.3582, 0.542, 0.213),
    1.0: (0.2561, 0.582, 0.368),
    1.5: (0.1825, 0.621, 0.482),
    2.0: (0.1293, 0.657, 0.568),
    2.5: (0.0911, 0.689, 0.633),
    3.0: (0.0637, 0.719, 0.683),
    3.5: (0.0442, 0.745, 0.723),
    4.0: (0.0304, 0.769, 0.755),
    5.0: (0.0141, 0.807, 0.801),
}


def _gen(*ident) -> np.random.Generator:
    return rng.stream(ROOT, "test", 0, [str(i) for i in ident])


def _uniforms(n: int, k: int, *ident) -> np.ndarray:
    return _gen(*ident).random((n, k))


def _z(comparisons: int) -> float:
    """4 standard errors, or the two-sided Bonferroni level for a family-wise rate of 1e-3 over
    ``comparisons`` simultaneous (approximately normal) checks, whichever is larger."""
    return max(4.0, float(norm.isf(1e-3 / (2 * comparisons))))


def _mi_bound(b: float, eps: float) -> float:
    """The spec's objective f(b) = log((2b+1)/(2be^ε+1)) + 2bεe^ε/(2be^ε+1)."""
    e = math.exp(eps)
    return math.log((2 * b + 1) / (2 * b * e + 1)) + 2 * b * eps * e / (2 * b * e + 1)


# --- 1. b_SW --------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", sorted(B_TABLE))
def test_band_half_width_matches_spec_table(eps):
    b_expected, band_mass, lemma_factor = B_TABLE[eps]
    b = sw.band_half_width(eps)
    assert round(b, 4) == pytest.approx(b_expected, abs=1e-12)
    p, q = sw.densities(eps, b)
    # the table prints 3 decimals; one unit in the last place, because the table's own rounding
    # is off by one there at ε = 0.5 (2bp = 1 - q = 0.54149, printed 0.542 next to q = 0.459)
    assert 2 * b * p == pytest.approx(band_mass, abs=1e-3)
    outside_band = 1 - (2 * b + 1) * q  # Lemma 1's factor
    assert outside_band == pytest.approx(lemma_factor, abs=1e-3)


def test_band_half_width_small_epsilon():
    assert sw.band_half_width(0.01) == pytest.approx(0.4967, abs=5e-5)
    # b -> 1/2 as ε -> 0, and b is non-increasing in ε
    assert abs(sw.band_half_width(1e-9) - 0.5) < 1e-8
    grid = np.geomspace(1e-7, 10.0, 400)
    values = np.array([sw.band_half_width(e) for e in grid])
    assert (np.diff(values) <= 1e-15).all()
    assert values.max() <= 0.5


def test_band_half_width_small_epsilon_branch_matches_closed_form_series():
    # Taylor expansion of the closed form (εe^ε - e^ε + 1)/(2e^ε(e^ε - 1 - ε)) at ε = 0:
    # 1/2 - ε/3 + ε²/9 - 7ε³/270 + O(ε⁴). Any first-order-correct small-ε branch is within
    # ε²/9 (+ rounding) of 1/2 - ε/3; a wrong slope is off by order ε, far outside ε²/8.
    for eps in (1e-7, 1e-6, 1e-5, 5e-5, 9e-5):
        first_order = 0.5 - eps / 3
        assert sw.band_half_width(eps) == pytest.approx(first_order, abs=eps**2 / 8 + 1e-15), eps


def test_band_half_width_continuous_at_branch_point():
    # at ε = 1e-4 the closed form loses ~ 1e-16/ε² = 1e-8 to cancellation; |db/dε| ≈ 1/3, so over
    # a step of 2e-13 the two sides of the branch must agree to well within 1e-7
    below = sw.band_half_width(1e-4 - 1e-13)
    above = sw.band_half_width(1e-4 + 1e-13)
    assert abs(below - above) < 1e-7


@pytest.mark.parametrize("eps", [0.01, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 8.0])
def test_band_half_width_is_argmax_of_mutual_information_bound(eps):
    res = minimize_scalar(
        lambda b: -_mi_bound(b, eps),
        bounds=(1e-6, 0.5),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert sw.band_half_width(eps) == pytest.approx(res.x, abs=1e-4)
    # and the closed form is at least as good as the numerical optimum (up to rounding)
    assert _mi_bound(sw.band_half_width(eps), eps) >= -res.fun - 1e-12


# --- 2. SW normalisation and privacy -------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
def test_sw_densities_normalised(eps):
    b = sw.band_half_width(eps)
    p, q = sw.densities(eps, b)
    assert p / q == pytest.approx(math.exp(eps), rel=1e-12)
    assert 2 * b * p + q == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("eps", [1.0, 3.0])
def test_sw_perturb_band_rate_and_support(eps):
    n = 200_000
    b = sw.band_half_width(eps)
    p, _ = sw.densities(eps, b)
    v = _uniforms(n, 1, "sw-band-v", eps)[:, 0]
    out = sw.perturb(v, eps, b, _uniforms(n, 1, "sw-band", eps))
    assert out.min() >= -b and out.max() <= 1 + b
    hit = np.mean(np.abs(out - v) <= b)
    # binomial proportion: sd = sqrt(π(1-π)/n) with π = 2bp (0.582 at ε = 1)
    sd = math.sqrt(2 * b * p * (1 - 2 * b * p) / n)
    assert abs(hit - 2 * b * p) <= 4 * sd


def test_sw_empirical_density_ratio_is_e_eps():
    eps, n, bins = 1.0, 200_000, 20
    b = sw.band_half_width(eps)
    p, q = sw.densities(eps, b)
    width = (1 + 2 * b) / bins
    edges = np.linspace(-b, 1 + b, bins + 1)
    dens = []
    for v in (0.0, 1.0):
        out = sw.perturb(np.full(n, v), eps, b, _uniforms(n, 1, "sw-ratio", v))
        assert out.min() >= -b and out.max() <= 1 + b
        counts, _ = np.histogram(out, bins=edges)
        dens.append(counts / (n * width))
    dens = np.concatenate(dens)
    ratio = dens.max() / dens.min()
    # a bin's count is binomial with mean n·density·width, relative sd 1/sqrt(n·density·width);
    # bins lying wholly inside (density p) and outside (q) the band exist for both inputs, so the
    # ratio of extremes is e^ε up to sqrt(1/(n p w) + 1/(n q w)) relative noise, 4 sd each way
    rel = 4 * math.sqrt(1 / (n * p * width) + 1 / (n * q * width))
    assert ratio <= math.exp(eps) * (1 + rel)
    assert ratio >= math.exp(eps) * (1 - rel)


# --- 3. Lemma 1 -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("eps", "v1", "v2"), [(1.0, 0.0, 1.0), (1.0, 0.2, 0.7), (2.0, 0.1, 0.5)])
def test_sw_wasserstein_lemma_1(eps, v1, v2):
    n = 200_000
    b = sw.band_half_width(eps)
    _, q = sw.densities(eps, b)
    a = sw.perturb(np.full(n, v1), eps, b, _uniforms(n, 1, "lemma1", eps, v1))
    c = sw.perturb(np.full(n, v2), eps, b, _uniforms(n, 1, "lemma1", eps, v2))
    expected = (v2 - v1) * (1 - (2 * b + 1) * q)
    if eps == 1.0 and (v1, v2) == (0.0, 1.0):
        assert expected == pytest.approx(0.368, abs=5e-4)
    got = wasserstein_distance(a, c)
    # F_{v1} >= F_{v2} everywhere, so where they differ Ŵ1 = ∫(F̂1 - F̂2) = mean(c) - mean(a), whose
    # sd is sqrt((Var a + Var c)/n); where F1 ≈ F2 |F̂1 - F̂2| adds a positive bias of at most
    # sd(F̂1(t) - F̂2(t)) <= sqrt(1/(2n)) per unit length, over at most the whole range 1 + 2b
    sd = math.sqrt((a.var() + c.var()) / n)
    tol = 4 * sd + (1 + 2 * b) * math.sqrt(1 / (2 * n))
    assert abs(got - expected) <= tol


# --- 4. transition matrix -------------------------------------------------------------------------
@pytest.mark.parametrize(("eps", "d", "d_out"), [(1.0, 64, 64), (1.0, 64, 100), (3.0, 32, 50)])
def test_transition_matrix_columns_sum_to_one(eps, d, d_out):
    m = sw.transition_matrix(eps, sw.band_half_width(eps), d, d_out)
    assert m.shape == (d_out, d)
    assert (m >= 0).all()
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=1e-10)


def _exact_entry(p, q, b, a, w_in, c, w_out) -> Fraction:
    """M[j, i] from its definition, in exact rationals: (1/w_in)·∫ over input bucket [a, a+w_in]
    of q·w_out + (p - q)·|[c, c+w_out] ∩ [v-b, v+b]| dv. The overlap is piecewise linear in v,
    so the trapezoid rule between its breakpoints is exact."""

    def overlap(v):
        return max(Fraction(0), min(c + w_out, v + b) - max(c, v - b))

    inner = {x for x in (c - b, c + b, c + w_out - b, c + w_out + b) if a < x < a + w_in}
    points = sorted({a, a + w_in} | inner)
    integral = sum(
        (overlap(x0) + overlap(x1)) / 2 * (x1 - x0) for x0, x1 in itertools.pairwise(points)
    )
    return q * w_out + (p - q) * integral / w_in


@pytest.mark.parametrize("eps", [1.0, 20.0, 30.0, 50.0, 100.0])
def test_transition_matrix_matches_exact_rationals_at_any_epsilon(eps):
    """Against the definition in exact arithmetic, for the same b, p, q: every entry within
    1e-9 of its column's largest, columns summing to 1. (The plain difference of ramp areas
    failed from ε ≈ 25: at ε = 30 columns summed to 1.07 with negative entries.)"""
    d, d_out = 8, 12
    b = sw.band_half_width(eps)
    p, q = sw.densities(eps, b)
    m = sw.transition_matrix(eps, b, d, d_out)
    fb, fp, fq = Fraction(b), Fraction(p), Fraction(q)
    w_in, w_out = Fraction(1, d), (1 + 2 * fb) / d_out
    exact = np.array(
        [
            [
                float(_exact_entry(fp, fq, fb, i * w_in, w_in, -fb + j * w_out, w_out))
                for i in range(d)
            ]
            for j in range(d_out)
        ]
    )
    assert (m >= 0).all()
    assert np.abs(m - exact).max() <= 1e-9 * exact.max(axis=0).min()
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=1e-12)


@pytest.mark.parametrize("eps", [1.0, 30.0, 100.0])
def test_transition_matrix_columns_hold_at_the_largest_d(eps):
    """At d = d̃ = 4,096 (the cap) the columns still sum to 1 within 1e-11 (the error grows as
    d·ulp), and nothing is negative."""
    m = sw.transition_matrix(eps, sw.band_half_width(eps), 4096, 4096)
    assert (m >= 0).all()
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=1e-11)


@pytest.mark.parametrize("eps", [1.0, 20.0, 30.0, 50.0, 100.0, 300.0])
def test_band_half_width_and_densities_at_high_precision(eps):
    """b_SW and (p, q) against 50-digit decimal arithmetic of the closed forms (e^ε and e^2ε
    overflow floats near ε = 355; the large-ε branch works from e^-ε)."""
    with localcontext() as context:
        context.prec = 50
        e = Decimal(eps).exp()
        b = (Decimal(eps) * e - e + 1) / (2 * e * (e - 1 - Decimal(eps)))
        p = e / (2 * b * e + 1)
    assert sw.band_half_width(eps) == pytest.approx(float(b), rel=1e-12)
    got_p, got_q = sw.densities(eps, float(b))
    assert got_p == pytest.approx(float(p), rel=1e-12)
    assert got_q == pytest.approx(float(p / e), rel=1e-12)


@pytest.mark.parametrize(("d", "d_out"), [(64, 64), (64, 100)])
@pytest.mark.parametrize("column", [0, 21, 63])
def test_transition_matrix_column_matches_monte_carlo(d, d_out, column):
    eps, n = 1.0, 400_000
    b = sw.band_half_width(eps)
    m = sw.transition_matrix(eps, b, d, d_out)
    u = _uniforms(n, 2, "matrix", d, d_out, column)
    v = (column + u[:, 0]) / d  # uniform inside input bucket `column`
    out = sw.perturb(v, eps, b, u[:, 1:])
    counts, _ = np.histogram(out, bins=np.linspace(-b, 1 + b, d_out + 1))
    freq = counts / n
    # each entry is a binomial proportion: sd = sqrt(M(1-M)/n); d_out entries compared at once
    sd = np.sqrt(m[:, column] * (1 - m[:, column]) / n)
    assert (np.abs(freq - m[:, column]) <= _z(d_out) * sd).all()


def test_histogram_buckets_reports():
    b, d_out = 0.25, 6  # bucket width 0.25 over [-0.25, 1.25]
    reports = np.array([-0.25, -0.01, 0.0, 0.49, 0.51, 1.2499, 1.25])
    # idx = floor((r + b)·4); the right end 1 + b is clipped into the last bucket
    np.testing.assert_array_equal(sw.histogram(reports, b, d_out), [2, 1, 1, 1, 0, 2])


# --- 5. discrete SW -------------------------------------------------------------------------------
@pytest.mark.parametrize(("eps", "d"), [(1.0, 32), (2.0, 32), (0.5, 20)])
def test_discrete_parameters_normalised(eps, d):
    b, p, q = sw.discrete_parameters(eps, d)
    assert b == math.floor(sw.band_half_width(eps) * d)
    assert (2 * b + 1) * p + (d - 1) * q == pytest.approx(1.0, abs=1e-12)
    assert p / q == pytest.approx(math.exp(eps), rel=1e-12)
    m = sw.discrete_transition_matrix(eps, d)
    assert m.shape == (d + 2 * b, d)
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=1e-12)


@pytest.mark.parametrize("eps", [1.0, 2.0])
@pytest.mark.parametrize("value", [0, 13, 31])
def test_perturb_discrete_pmf_matches_matrix(eps, value):
    d, n = 32, 200_000
    b, _, _ = sw.discrete_parameters(eps, d)
    out = sw.perturb_discrete(np.full(n, value), eps, d, _uniforms(n, 2, "dsw", eps, value))
    assert out.min() >= -b and out.max() <= d - 1 + b
    freq = np.bincount(out + b, minlength=d + 2 * b) / n
    col = sw.discrete_transition_matrix(eps, d)[:, value]
    # binomial proportion per output value, d + 2b values compared at once
    sd = np.sqrt(col * (1 - col) / n)
    assert (np.abs(freq - col) <= _z(d + 2 * b) * sd).all()


# --- 6. GRR / OLH ---------------------------------------------------------------------------------
def test_grr_perturb_pmf():
    d, eps, n = 8, 1.0, 400_000
    p, q = oracles.grr_probabilities(d, eps)
    assert p == pytest.approx(math.exp(eps) / (math.exp(eps) + d - 1))
    values = _gen("grr-values").integers(0, d, n)
    reports = oracles.grr_perturb(values, d, eps, _uniforms(n, 2, "grr-pmf"))
    assert reports.min() >= 0 and reports.max() < d
    joint = np.bincount(values * d + reports, minlength=d * d).reshape(d, d)
    rows = joint.sum(axis=1, keepdims=True)
    cond = joint / rows
    expected = np.where(np.eye(d, dtype=bool), p, q)
    # each entry is a binomial proportion over the users holding that value; d² entries at once
    sd = np.sqrt(expected * (1 - expected) / rows)
    assert (np.abs(cond - expected) <= _z(d * d) * sd).all()


def _replicate_variance_check(estimates, truth, variance, replicates):
    """Mean within z·sqrt(σ²/R) of the truth and sample variance within z·sqrt(2/(R-1)) of σ²
    (normal approximation of χ²_{R-1}/(R-1), whose sd is sqrt(2/(R-1)))."""
    z = _z(2 * truth.size)
    mean = estimates.mean(axis=0)
    assert (np.abs(mean - truth) <= z * np.sqrt(variance / replicates)).all()
    ratio = estimates.var(axis=0, ddof=1) / variance
    assert (np.abs(ratio - 1) <= z * math.sqrt(2 / (replicates - 1))).all(), ratio


def test_grr_estimate_unbiased_with_formula_variance():
    d, eps, n, reps = 8, 1.0, 2000, 400
    x = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.1, 0.05, 0.0])
    values = np.repeat(np.arange(d), np.round(x * n).astype(np.int64))
    u = _uniforms(n * reps, 2, "grr-var")
    reports = oracles.grr_perturb(np.tile(values, reps), d, eps, u).reshape(reps, n)
    est = np.array([oracles.grr_estimate(r, d, eps, n) for r in reports])
    p, q = oracles.grr_probabilities(d, eps)
    # with the users' values fixed, C(v) is a sum of n x_v Bernoulli(p) and n(1-x_v) Bernoulli(q)
    variance = (x * p * (1 - p) + (1 - x) * q * (1 - q)) / (n * (p - q) ** 2)
    # for x_v = 0 this is exactly the spec's (3.1)
    e = math.exp(eps)
    assert variance[-1] == pytest.approx((d - 2 + e) / ((e - 1) ** 2 * n), rel=1e-12)
    _replicate_variance_check(est, x, variance, reps)


def test_olh_buckets():
    assert oracles.olh_buckets(1.0) == 4  # round(2.718) + 1
    assert oracles.olh_buckets(2.0) == 8  # round(7.389) + 1
    assert oracles.olh_buckets(0.1) == 2


def test_olh_hash_range_and_collisions():
    n, g = 200_000, 5
    params = oracles.olh_params(_gen("olh-hash").bit_generator.random_raw((n, 2)))
    assert (params[:, 0] >= 1).all() and (params[:, 0] < oracles.MERSENNE).all()
    assert (params[:, 1] >= 0).all() and (params[:, 1] < oracles.MERSENNE).all()
    h3 = oracles.olh_hash(params, np.full(n, 3), g)
    h9 = oracles.olh_hash(params, np.full(n, 9), g)
    assert h3.min() >= 0 and h3.max() < g
    # universal hashing: each bucket w.p. 1/g, and two fixed values collide w.p. ~1/g (binomial)
    sd = math.sqrt((1 / g) * (1 - 1 / g) / n)
    z = _z(g + 1)
    assert (np.abs(np.bincount(h3, minlength=g) / n - 1 / g) <= z * sd).all()
    assert abs(np.mean(h3 == h9) - 1 / g) <= z * sd


def test_olh_estimate_unbiased_with_exact_g_variance():
    domain, eps, n, reps = 16, 1.0, 2000, 300
    g = oracles.olh_buckets(eps)
    x = np.zeros(domain)
    x[:10] = np.array([0.25, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025])
    values = np.repeat(np.arange(domain), np.round(x * n).astype(np.int64))
    words = _gen("olh-words").bit_generator.random_raw((n * reps, 2))
    params = oracles.olh_params(words).reshape(reps, n, 2)
    u = _uniforms(n * reps, 2, "olh-u").reshape(reps, n, 2)
    est = np.array(
        [
            oracles.olh_estimate(
                oracles.olh_perturb(values, params[r], eps, u[r]), params[r], domain, eps, n
            )
            for r in range(reps)
        ]
    )
    p, _ = oracles.grr_probabilities(g, eps)
    qs = 1.0 / g  # a user holding w != v supports v w.p. p/g + (1 - 1/g)(1-p)/(g-1) = 1/g
    variance = (x * p * (1 - p) + (1 - x) * qs * (1 - qs)) / (n * (p - qs) ** 2)
    _replicate_variance_check(est, x, variance, reps)
    # the spec's approximation 4e^ε/((e^ε-1)² n) assumes the unrounded g = e^ε + 1; at ε = 1 the
    # rounded g = 4 differs from 3.718 by 8%, which moves the x_v = 0 variance by under 1%
    e = math.exp(eps)
    assert variance[-1] == pytest.approx(4 * e / ((e - 1) ** 2 * n), rel=0.01)


@pytest.mark.parametrize(("c", "threshold"), [(16, 1.540), (32, 2.303), (64, 3.029)])
def test_use_grr_thresholds(c, threshold):
    star = math.log((c - 2) / 3)
    assert star == pytest.approx(threshold, abs=5e-4)
    assert oracles.use_grr(c, star + 1e-9)
    assert not oracles.use_grr(c, star - 1e-9)


# --- 7. Norm-Sub ----------------------------------------------------------------------------------
def _norm_sub_spec(x):
    """The spec's §2.2 loop, verbatim."""
    x = np.array(x, dtype=np.float64)
    while True:
        x[x < 0] = 0
        positive = x > 0
        x[positive] += (1 - x.sum()) / positive.sum()
        if (x >= 0).all():
            return x


def test_norm_sub_hand_example():
    out = oracles.norm_sub(np.array([0.5, -0.2, 0.4, 0.5]))
    # clip -> [0.5, 0, 0.4, 0.5] (sum 1.4); subtract 0.4/3 from the three positives
    np.testing.assert_allclose(out, [0.5 - 0.4 / 3, 0.0, 0.4 - 0.4 / 3, 0.5 - 0.4 / 3], atol=1e-15)
    # a case needing a second pass: 0.05 - 0.3 < 0
    out = oracles.norm_sub(np.array([0.9, 0.05, 0.95, -0.1]))
    np.testing.assert_allclose(out, [0.475, 0.0, 0.525, 0.0], atol=1e-15)


def test_norm_sub_properties_and_spec_loop():
    g = _gen("norm-sub")
    for _ in range(200):
        x = g.normal(1 / 16, 0.1, 16)
        out = oracles.norm_sub(x)
        assert (out >= 0).all()
        assert out.sum() == pytest.approx(1.0, abs=1e-12)
        if (x > 0).any():
            np.testing.assert_allclose(out, _norm_sub_spec(x), atol=1e-14)
        np.testing.assert_allclose(oracles.norm_sub(out), out, atol=1e-14)  # idempotent
    valid = g.dirichlet(np.full(10, 0.3))
    valid[3] = 0.0
    valid /= valid.sum()
    np.testing.assert_allclose(oracles.norm_sub(valid), valid, atol=1e-15)


# --- 8. HRR ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2, 8, 64])
def test_hadamard_entry_is_sylvester(size):
    idx = np.arange(size)
    got = oracles.hadamard_entry(idx[:, None], idx[None, :])
    np.testing.assert_array_equal(got, hadamard(size))


def test_hrr_perturb_flip_rate():
    size, eps, n = 16, 1.0, 200_000
    g = _gen("hrr-flip")
    index = g.integers(0, size, n)
    sign = g.choice(np.array([-1, 1]), n)
    rows, bits = oracles.hrr_perturb(index, sign, size, eps, _uniforms(n, 2, "hrr-flip-u"))
    assert rows.min() >= 0 and rows.max() < size
    truth = sign * oracles.hadamard_entry(rows, index)
    keep = np.mean(bits == truth)
    e = math.exp(eps)
    # binomial: the bit is kept w.p. e^ε/(e^ε+1); rows uniform on [size] (size proportions)
    z = _z(size + 1)
    assert abs(keep - e / (e + 1)) <= z * math.sqrt(e / (e + 1) ** 2 / n)
    sd_row = math.sqrt((1 / size) * (1 - 1 / size) / n)
    assert (np.abs(np.bincount(rows, minlength=size) / n - 1 / size) <= z * sd_row).all()


def test_hrr_estimate_unbiased():
    size, eps, n = 16, 1.0, 400_000
    g = _gen("hrr-est")
    index = np.minimum((g.random(n) ** 2 * size).astype(np.int64), size - 1)  # skewed
    sign = np.where(g.random(n) < 0.7, 1, -1)
    rows, bits = oracles.hrr_perturb(index, sign, size, eps, _uniforms(n, 2, "hrr-est-u"))
    est = oracles.hrr_estimate(rows, bits, size, eps, n)
    theta = np.bincount(index, weights=sign, minlength=size) / n
    # θ̂_a = (1/n) Σ_u c·y'_u φ[j_u, a] with c = (e^ε+1)/(e^ε-1): each term is ±c with mean
    # s_u 1[a_u = a], so Var θ̂_a = Σ_u (c² - 1[a_u = a]) / n²
    e = math.exp(eps)
    c = (e + 1) / (e - 1)
    sd = np.sqrt(n * c**2 - np.bincount(index, minlength=size)) / n
    assert (np.abs(est - theta) <= _z(size) * sd).all()


# --- 9. SR / PM -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["sr", "pm"])
@pytest.mark.parametrize("eps", [0.5, 2.0])
@pytest.mark.parametrize("value", [-1.0, -0.3, 0.0, 0.8, 1.0])
def test_sr_pm_unbiased(mechanism, eps, value):
    n = 200_000
    perturb = oracles.sr_perturb if mechanism == "sr" else oracles.pm_perturb
    out = perturb(np.full(n, value), eps, _uniforms(n, 2, mechanism, eps, value))
    # the mean of n i.i.d. reports: sd = sqrt(Var/n), Var estimated from the sample
    assert abs(out.mean() - value) <= 4 * out.std() / math.sqrt(n)
    e = math.exp(eps)
    if mechanism == "sr":
        np.testing.assert_allclose(np.abs(out), (e + 1) / (e - 1), rtol=1e-15)


@pytest.mark.parametrize("eps", [1.0, 3.0])
@pytest.mark.parametrize("value", [-1.0, -0.3, 0.8, 1.0])
def test_pm_band_mass_and_density_ratio(eps, value):
    n = 200_000
    t = math.exp(eps / 2)
    s = (t + 1) / (t - 1)
    left, right = (t * value - 1) / (t - 1), (t * value + 1) / (t - 1)
    out = oracles.pm_perturb(np.full(n, value), eps, _uniforms(n, 2, "pm-band", eps, value))
    assert out.min() >= -s and out.max() <= s
    inside = (out >= left) & (out <= right)
    frac = inside.mean()
    pi = t / (t + 1)
    # binomial proportion, sd = sqrt(π(1-π)/n)
    assert abs(frac - pi) <= 4 * math.sqrt(pi * (1 - pi) / n)
    # density ratio band/outside = (frac/w_in)/((1-frac)/w_out) should be t² = e^ε; by the delta
    # method its relative sd is sqrt(1/(nπ(1-π)))
    ratio = (frac / (right - left)) / ((1 - frac) / (2 * s - (right - left)))
    assert abs(ratio / math.exp(eps) - 1) <= 4 / math.sqrt(n * pi * (1 - pi))
    # outside the band the output is uniform: the share left of the band is (ℓ+s)/(2s - width)
    low = out[~inside]
    share = (left + s) / (2 * s - (right - left))
    sd = math.sqrt(share * (1 - share) / low.size)
    assert abs(np.mean(low < left) - share) <= 4 * sd + 1e-15


# --- 10. EM / EMS ---------------------------------------------------------------------------------
def _beta_histogram(d: int) -> np.ndarray:
    return np.diff(beta(5, 2).cdf(np.linspace(0, 1, d + 1)))


def test_em_recovers_exact_histogram_and_likelihood_increases():
    eps, d, n = 1.0, 64, 1e6
    m = sw.transition_matrix(eps, sw.band_half_width(eps), d, d)
    x = _beta_histogram(d)
    counts = n * (m @ x)
    est, iterations = sw.expectation_maximisation(counts, m, smoothing=False, tolerance=0.0)
    assert iterations < sw.MAX_ITERATIONS  # stopped on the 1/n L1-move guard
    assert est.sum() == pytest.approx(1.0, abs=1e-12) and (est >= 0).all()
    # noise-free counts make x the unique MLE (Gibbs' inequality, M invertible); EM run to its
    # 1/n-move guard lands within a small fraction of one bucket width (1/64) in W1
    assert metrics.wasserstein(x, est) < 1e-3
    assert sw.log_likelihood(counts, m, est) <= sw.log_likelihood(counts, m, x) + 1e-6
    # EM never decreases the likelihood: the iterates are reproduced by capping the iterations
    trace = [sw.log_likelihood(counts, m, np.full(d, 1 / d))]
    for k in range(1, 41):
        step, ran = sw.expectation_maximisation(
            counts, m, smoothing=False, tolerance=0.0, max_iterations=k
        )
        assert ran == k
        trace.append(sw.log_likelihood(counts, m, step))
    trace = np.array(trace)
    assert (np.diff(trace) >= -1e-9 * np.abs(trace[1:])).all()
    assert sw.log_likelihood(counts, m, est) > trace[-1]


def test_smooth_properties():
    g = _gen("smooth")
    for _ in range(50):
        x = g.dirichlet(np.full(32, 0.5))
        out = sw.smooth(x)
        assert (out >= 0).all()
        assert out.sum() == pytest.approx(1.0, abs=1e-12)
        ref = np.concatenate([[x[0]], 0.5 * x[1:-1] + 0.25 * (x[:-2] + x[2:]), [x[-1]]])
        np.testing.assert_allclose(out, ref / ref.sum(), rtol=1e-13)
    # (1,2,1)/4 fixes any linear vector in the interior and the edges are kept, so a linear
    # vector comes back unchanged (the renormalisation is the identity)
    d = 20
    lin = 1 + 0.1 * np.arange(d)
    lin /= lin.sum()
    np.testing.assert_allclose(sw.smooth(lin), lin, rtol=1e-13)


@pytest.mark.parametrize("smoothing", [True, False])
def test_em_stopping_rule_on_noisy_reports(smoothing):
    eps, d, n, tol = 1.0, 64, 100_000, 1e-3
    b = sw.band_half_width(eps)
    g = _gen("ems-values")
    x = _beta_histogram(d)
    v = (g.choice(d, n, p=x) + g.random(n)) / d
    counts = sw.histogram(sw.perturb(v, eps, b, _uniforms(n, 1, "ems-noise")), b, d)
    m = sw.transition_matrix(eps, b, d, d)
    est, iterations = sw.expectation_maximisation(counts, m, smoothing=smoothing, tolerance=tol)
    assert (est >= 0).all() and est.sum() == pytest.approx(1.0, abs=1e-12)
    assert 3 <= iterations < sw.MAX_ITERATIONS // 2

    def run(k):
        return sw.expectation_maximisation(
            counts, m, smoothing=smoothing, tolerance=tol, max_iterations=k
        )[0]

    before, last = run(iterations - 2), run(iterations - 1)
    np.testing.assert_allclose(run(iterations), est, atol=0)
    move = np.abs(est - last).sum()
    gain = abs(sw.log_likelihood(counts, m, est) - sw.log_likelihood(counts, m, last))
    # it stopped because one of the two guards fired at `iterations` ...
    assert gain < tol or move <= 1 / n
    # ... and neither had fired one iteration earlier
    previous_gain = abs(sw.log_likelihood(counts, m, last) - sw.log_likelihood(counts, m, before))
    if iterations - 1 > 2:
        assert previous_gain >= tol
    assert np.abs(last - before).sum() > 1 / n
    if smoothing:
        # EMS on n = 1e5 reports recovers the smooth Beta(5,2) to well under a bucket width
        assert metrics.wasserstein(x, est) < 1 / d


def test_em_discrete_reports():
    eps, d, n = 1.0, 32, 100_000
    b, _, _ = sw.discrete_parameters(eps, d)
    x = _beta_histogram(d)
    m = sw.discrete_transition_matrix(eps, d)
    est, _ = sw.expectation_maximisation(n * (m @ x), m, smoothing=False, tolerance=0.0)
    assert metrics.wasserstein(x, est) < 1e-3


# --- 11. hierarchies ------------------------------------------------------------------------------
def _split(flat: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(sizes)[:-1])


def test_layer_sizes_and_ancestor():
    assert hierarchy.depth(256, 4) == 4
    assert hierarchy.layer_sizes(256, 4) == [256, 64, 16, 4]
    assert hierarchy.layer_sizes(1024, 4) == [1024, 256, 64, 16, 4]
    with pytest.raises(ValueError):
        hierarchy.depth(100, 4)
    t = hierarchy.aggregation_matrix(256, 4)
    offsets = np.cumsum([0, *hierarchy.layer_sizes(256, 4)])
    leaves = np.arange(256)
    for layer in range(1, 5):
        anc = hierarchy.ancestor(leaves, np.full(256, layer), 4)
        np.testing.assert_array_equal(anc, leaves // 4 ** (layer - 1))
        # the ancestor's row in the aggregation matrix covers exactly that leaf among its block
        np.testing.assert_array_equal(t[offsets[layer - 1] + anc, leaves], 1.0)
    np.testing.assert_array_equal(t.sum(axis=1), np.repeat([1, 4, 16, 64], [256, 64, 16, 4]))


def _tree(d, k, seed, noise):
    g = _gen("tree", seed)
    x = g.dirichlet(np.full(d, 0.5))
    t = hierarchy.aggregation_matrix(d, k)
    flat = t @ x + g.normal(0.0, noise, t.shape[0])
    return x, t, flat


def _check_consistent(out, k):
    for child, parent in zip(out[:-1], out[1:], strict=True):
        np.testing.assert_allclose(child.reshape(-1, k).sum(axis=1), parent, atol=1e-10)
    assert out[-1].sum() == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_constrained_inference_is_consistent_least_squares(seed):
    d, k = 64, 4
    sizes = hierarchy.layer_sizes(d, k)
    _, t, flat = _tree(d, k, seed, 0.02)
    out = hierarchy.constrained_inference(_split(flat, sizes), k)
    assert [o.size for o in out] == sizes
    _check_consistent(out, k)
    # Hay et al.'s estimate is the equal-weight least squares fit of a consistent tree with the
    # root fixed to 1: min ‖Tℓ - x̃‖² s.t. Σℓ = 1, solved here through its KKT system
    kkt = np.block([[t.T @ t, np.ones((d, 1))], [np.ones((1, d)), np.zeros((1, 1))]])
    leaves = np.linalg.solve(kkt, np.concatenate([t.T @ flat, [1.0]]))[:d]
    np.testing.assert_allclose(out[0], leaves, atol=1e-12)


def test_constrained_inference_keeps_consistent_input():
    d, k = 256, 4
    x, t, flat = _tree(d, k, 7, 0.0)
    layers = _split(flat, hierarchy.layer_sizes(d, k))
    out = hierarchy.constrained_inference(layers, k)
    for got, want in zip(out, layers, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-14)


def _objective(t, flat, leaves):
    return 0.5 * float(np.sum((t @ leaves - flat) ** 2))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_admm_leaves_optimal_on_simplex(seed):
    d, k = 64, 4
    sizes = hierarchy.layer_sizes(d, k)
    _, t, flat = _tree(d, k, seed, 0.02)
    layers = _split(flat, sizes)
    leaves = hierarchy.admm_leaves(layers, k)
    assert (leaves >= 0).all()
    assert leaves.sum() == pytest.approx(1.0, abs=1e-12)
    _check_consistent(_split(t @ leaves, sizes), k)
    best = _objective(t, flat, leaves)
    hay = np.maximum(hierarchy.constrained_inference(layers, k)[0], 0)
    assert best <= _objective(t, flat, hay / hay.sum()) + 1e-12
    g = _gen("simplex", seed)
    for point in g.dirichlet(np.full(d, 0.5), 20):
        assert best <= _objective(t, flat, point)
    # KKT of min ½‖Tℓ - x̃‖² on the simplex: the gradient equals a common μ on the support and is
    # >= μ off it. The weighted sum row (weight 1e4) shifts the optimum by O(|μ|/1e8), so 1e-7.
    grad = t.T @ (t @ leaves - flat)
    support = leaves > 1e-12
    mu = grad[support].mean()
    assert np.abs(grad[support] - mu).max() < 1e-7
    assert (grad[~support] >= mu - 1e-7).all()


def test_admm_leaves_recovers_exact_layers():
    d, k = 256, 4
    x, _, flat = _tree(d, k, 3, 0.0)
    leaves = hierarchy.admm_leaves(_split(flat, hierarchy.layer_sizes(d, k)), k)
    np.testing.assert_allclose(leaves, x, atol=1e-9)


def test_haar_leaves_inverts_exact_coefficients():
    heights = 6
    d = 2**heights
    x = _gen("haar").dirichlet(np.full(d, 0.7))
    leaf = np.arange(d)
    coefficients = []
    for h in range(1, heights + 1):
        node, sign = hierarchy.haar_signs(leaf, np.full(d, h))
        coef = np.zeros(d >> h)
        np.add.at(coef, node, sign * x)
        # directly: left half minus right half of every block of 2^h leaves
        blocks = x.reshape(-1, 2**h)
        half = 2 ** (h - 1)
        np.testing.assert_allclose(coef, blocks[:, :half].sum(1) - blocks[:, half:].sum(1))
        coefficients.append(coef)
    np.testing.assert_allclose(hierarchy.haar_leaves(coefficients), x, atol=1e-15)


# --- 12. metrics ----------------------------------------------------------------------------------
def test_metrics_identical_and_point_masses():
    d = 64
    x = _beta_histogram(d)
    starts = metrics.range_starts(_gen("starts"))
    assert metrics.wasserstein(x, x) == 0.0
    assert metrics.kolmogorov_smirnov(x, x) == 0.0
    for alpha in metrics.RANGE_WIDTHS:
        assert metrics.range_query_error(x, x, alpha, starts[alpha]) == 0.0
    assert all(v == 0.0 for v in metrics.all_metrics(x, x, starts).values())
    for i, j in [(0, 63), (10, 12), (40, 5)]:
        a, c = np.eye(d)[i], np.eye(d)[j]
        assert metrics.wasserstein(a, c) == pytest.approx(abs(i - j) / d, abs=1e-15)
        assert metrics.kolmogorov_smirnov(a, c) == 1.0


def test_metrics_uniform_histogram():
    d = 50
    x = np.full(d, 1 / d)
    np.testing.assert_allclose(metrics.quantiles(x), metrics.QUANTILES, atol=1e-12)
    mean, var = metrics.moments(x)
    assert mean == pytest.approx(0.5, abs=1e-15)
    assert var == pytest.approx((1 - 1 / d**2) / 12, rel=1e-12)
    pts = np.linspace(0, 1, 11)
    np.testing.assert_allclose(metrics.cdf_at(x, pts), pts, atol=1e-15)
    # a range query of width α on a uniform histogram has mass α; a point mass at the last bucket
    # gives R = 0 on [0, 0.4], so the error is exactly 0.4
    starts = np.zeros(3)
    last = np.eye(d)[-1]
    assert metrics.range_query_error(x, last, 0.4, starts) == pytest.approx(0.4, abs=1e-12)


def test_discrete_sw_output_width_is_d_plus_2b():
    """Discrete SW (bucketize=br) reports over d + 2b outputs, b = ⌊b_SW·d⌋: the width the dense
    limit and the memory estimate count (at d = 4,096, ε = 0.25 that is 7,562, not 4,096)."""
    from rayfed.protocols.square_wave.config import SquareWaveConfig

    cfg = SquareWaveConfig(bucketize="br", buckets=4096, epsilon=0.25)
    b = math.floor(sw.band_half_width(0.25) * 4096)
    assert cfg.output_width() == 4096 + 2 * b == 7562
    assert SquareWaveConfig(buckets=4096, epsilon=0.25).output_width() == 4096
