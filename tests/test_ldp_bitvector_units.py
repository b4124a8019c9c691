"""Unit checks of DPBV (rayfed.ldp.bitvector) and kCluster (rayfed.clustering.kcluster) against the
spec shared/specs/ldp-bitvector.md (§2.3-2.6, §3 and the reproduction checks RC1-RC8, RC13 of §5):
the paper's δ labels (Eq. 10) and Fig. 9 bit counts, weight constancy (Theorem 3), unbiasedness and
spread of the debiased distance (Theorem 5), the Hoeffding bound (Theorem 6), distance consistence
(Theorem 1, Algorithm 1), saturation, the Fig. 5 analogue, the true δ (hockey-stick divergence),
the differing-bits bound and kCluster.

Randomness is fixed (rayfed.rng streams with purpose "test"). Every statistical tolerance is derived
from the estimator's variance in a comment next to the assertion: 4 standard errors, raised to a
Bonferroni level (family-wise false-alarm rate 1e-3) where many entries are compared at once.
"""

import itertools
import math

import numpy as np
import pytest
from reference_consistence import consistence_rowwise
from scipy.spatial.distance import cdist
from scipy.stats import norm
from sklearn.metrics import normalized_mutual_info_score

from rayfed import rng
from rayfed.clustering import kcluster
from rayfed.ldp import bitvector as bv
from rayfed.privacy import NoiseSource, binary_randomized_response

ROOT = 20240923

#: the paper's demonstration setting: [0, 50], t = 25, s = 1000, so μ = 100
LOW, HIGH, T, S = 0.0, 50.0, 25.0, 1000

#: spec §3, Eq. 10 at s = 1000: ε -> δ as printed (the number of significant digits matters)
PAPER_DELTA = {0.5: 1.29e-206, 1.0: 8.957e-137, 2.0: 7.514e-56, 3.0: 7.92e-22, 4.0: 1.31e-8}

#: spec §3, Fig. 9: s = ⌈ln δ / (ε - ln(e^ε + 1))⌉
FIG9_DELTAS = (1e-5, 1e-10, 1e-20, 1e-50, 1e-100)
FIG9 = {
    0.5: (25, 49, 98, 243, 486),
    1.0: (37, 74, 148, 368, 736),
    2.0: (91, 182, 363, 908, 1815),
    3.0: (237, 474, 948, 2370, 4740),
    4.0: (635, 1269, 2538, 6344, 12687),
    5.0: (1715, 3429, 6858, 17145, 34289),
}

#: spec §3, Theorem 6 at μ = 100, s = 1000, β = 0.05
HOEFFDING = {0.5: 35.80, 1.0: 10.06, 2.0: 3.70, 4.0: 2.31}

#: RC4 / RC5 grid and trials (each trial draws fresh anchors and fresh noise)
RC4_DISTANCES = (0.0, 5.0, 10.0, 25.0, 50.0)
RC4_EPSILONS = (0.5, 1.0, 2.0, 4.0)
RC4_TRIALS = 800


def _gen(*ident) -> np.random.Generator:
    return rng.stream(ROOT, "test", 0, [str(i) for i in ident])


def _z(comparisons: int) -> float:
    """4 standard errors, or the two-sided Bonferroni level for a family-wise rate of 1e-3 over
    ``comparisons`` simultaneous (approximately normal) checks, whichever is larger."""
    return max(4.0, float(norm.isf(1e-3 / (2 * comparisons))))


def _pq(eps: float) -> tuple[float, float]:
    p = bv.keep_probability(eps)
    return p, 1 - p


def _paired_hamming(a: np.ndarray, b: np.ndarray, chunk: int = 100) -> np.ndarray:
    """Hamming distance of row i of ``a`` to row i of ``b``, through bv.hamming on blocks."""
    parts = [
        np.diag(bv.hamming(a[i : i + chunk], b[i : i + chunk])) for i in range(0, len(a), chunk)
    ]
    return np.concatenate(parts).astype(np.float64)


def _codes_fresh_anchors(gen, values, trials, s, low, high, t, eps=None):
    """(len(values), trials, s) codes: one independent anchor vector per trial (shared by the
    values within a trial), then per-bit randomized response unless ``eps`` is None."""
    r = bv.anchors(gen, trials, s, low, high, t)  # (trials, s): an independent vector per trial
    codes = bv.encode(np.asarray(values, dtype=np.float64), r.ravel(), t)
    codes = codes.reshape(len(values), trials, s)
    if eps is not None:
        codes = _rr(codes, eps, gen)
    return codes


def _rr(bits: np.ndarray, eps: float, gen) -> np.ndarray:
    """Per-bit RR (Eq. 7) through the mechanism the custodians use, on a seeded source."""
    noise = NoiseSource.seeded(int(gen.integers(2**31)), "custodian")
    flat = np.asarray(bits).reshape(-1, 1)
    out, _ = binary_randomized_response(noise, flat, keep_probability=bv.keep_probability(eps))
    return out.reshape(np.shape(bits))


def _binomial_sd_of_dhat(d: float, s: int, mu: float, t: float, eps: float | None) -> float:
    """sd of d̂ when d_H ~ Binomial(s, P) (exact when anchors are redrawn): P(bits differ) is
    P_BV = 2 min(d, 2t)/μ before noise, (p²+q²)P_BV + 2pq(1-P_BV) after it."""
    p_bv = 2 * min(d, 2 * t) / mu
    if eps is None:
        return mu / (2 * s) * math.sqrt(s * p_bv * (1 - p_bv))
    p, q = _pq(eps)
    big_p = (p * p + q * q) * p_bv + 2 * p * q * (1 - p_bv)
    return mu / (2 * s * (p - q) ** 2) * math.sqrt(s * big_p * (1 - big_p))


# --- RC1: the paper's δ labels (Eq. 10) --------------------------------------------------------
@pytest.mark.parametrize("eps", sorted(PAPER_DELTA))
def test_paper_delta_reproduces_printed_labels(eps):
    printed = PAPER_DELTA[eps]
    mantissa = f"{printed:e}".split("e")[0].rstrip("0")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    # the spec prints 3 or 4 significant digits: allow half a unit in the last printed digit
    half_unit = 0.5 * 10 ** (math.floor(math.log10(printed)) - decimals)
    assert bv.paper_delta(eps, S) == pytest.approx(printed, abs=half_unit)
    # the paper's own two labels, 8.9e-137 and 7.5e-56, are the truncations of the exact values
    if eps in (1.0, 2.0):
        assert bv.paper_delta(eps, S) == pytest.approx(printed, rel=1e-3)


def test_paper_delta_is_the_printed_formula_in_log_space():
    # δ = p^s - e^ε q^s; at s = 1000 the second term underflows, at small s it does not
    for eps, s in [(1.0, 5), (2.0, 20), (0.5, 3), (4.0, 200)]:
        p, q = _pq(eps)
        expected = math.exp(s * math.log(p)) - math.exp(eps + s * math.log(q))
        assert bv.paper_delta(eps, s) == pytest.approx(expected, rel=1e-12)


# --- RC2: Fig. 9 -------------------------------------------------------------------------------
def test_paper_bits_reproduces_fig9_table():
    got = {eps: tuple(bv.paper_bits(eps, delta) for delta in FIG9_DELTAS) for eps in FIG9}
    assert got == FIG9


def test_paper_bits_increases_with_eps_and_with_one_over_delta():
    eps_grid = np.linspace(0.1, 6.0, 60)
    delta_grid = np.geomspace(1e-3, 1e-150, 40)
    table = np.array([[bv.paper_bits(e, d) for d in delta_grid] for e in eps_grid])
    assert (np.diff(table, axis=0) >= 0).all()  # non-decreasing in ε
    assert (np.diff(table, axis=1) >= 0).all()  # non-decreasing as δ shrinks
    # and strictly over the spec's coarse grid
    coarse = np.array([FIG9[e] for e in sorted(FIG9)])
    assert (np.diff(coarse, axis=0) > 0).all() and (np.diff(coarse, axis=1) > 0).all()
    # the chosen s is the smallest that reaches δ under the paper's own (flawed) Eq. 10 bound
    # p^s <= δ, i.e. s·ln(1/p) >= ln(1/δ)
    for eps in FIG9:
        p, _ = _pq(eps)
        for delta in FIG9_DELTAS:
            s = bv.paper_bits(eps, delta)
            assert s * math.log(p) <= math.log(delta) + 1e-9 < (s - 1) * math.log(p)


# --- RC3: Theorem 3 weight constancy, and the original BV's boundary flaw ----------------------
@pytest.mark.parametrize(("t", "eps"), [(25.0, None), (25.0, 0.5), (25.0, 2.0), (10.0, 1.0)])
def test_expected_weight_is_the_same_for_every_value(t, eps):
    trials, xs = 1000, (0.0, 25.0, 50.0)
    mu = bv.anchor_range(LOW, HIGH, t)
    codes = _codes_fresh_anchors(_gen("rc3", t, eps), xs, trials, S, LOW, HIGH, t, eps)
    weights = codes.sum(axis=2).astype(np.float64)  # (values, trials)
    # Theorem 3: per bit P(1) = (2t/μ)(p - q) + q (2t/μ without noise), for every x in [L, U]
    if eps is None:
        p_one = 2 * t / mu
    else:
        p, q = _pq(eps)
        p_one = (2 * t / mu) * (p - q) + q
    expected = S * p_one
    if t == 25.0:
        assert expected == pytest.approx(500.0, abs=1e-9)  # 2t/μ = 1/2, so (p - q)/2 + q = 1/2
    # with anchors redrawn per trial, w ~ Binomial(s, P(1)): sd of the mean over trials is
    # sqrt(s·P(1-P)/trials) (≈ 0.5 at P = 1/2), 4 sd ≈ 2 bits; 3 values, _z(3) = 4
    se = math.sqrt(S * p_one * (1 - p_one) / trials)
    for x, w in zip(xs, weights, strict=True):
        assert abs(w.mean() - expected) <= _z(3) * se, (x, w.mean(), expected)


def test_original_bv_has_the_boundary_flaw():
    trials, s = 1000, S
    gen = _gen("rc3-original")
    r = gen.uniform(LOW, HIGH, (trials, s))  # the original BV: anchors on [L, U] only
    codes = bv.encode(np.array([0.0, 25.0, 50.0]), r.ravel(), T).reshape(3, trials, s)
    w = codes.sum(axis=2).astype(np.float64)
    # every anchor of [0, 50] lies within 25 of 25: the middle value has all s bits set
    assert (w[1] == s).all()
    # the ends: P(|x - r| <= 25) = 1/2 for r ~ U[0, 50], w ~ Binomial(s, 1/2); 2 values -> 4 sd
    se = math.sqrt(s * 0.25 / trials)
    for end in (w[0], w[2]):
        assert abs(end.mean() - s / 2) <= _z(2) * se
    # the modified range removes the flaw (the companion test above): the middle is not special
    assert w[1].mean() - w[0].mean() > s / 2 - 2 * _z(2) * se


# --- encoding primitives ------------------------------------------------------------------------
def test_hamming_counts_differing_bits_exactly():
    gen = _gen("hamming")
    a = gen.random((37, 613)) < 0.3
    b = gen.random((29, 613)) < 0.6
    got = bv.hamming(a, b)
    direct = (a[:, None, :] != b[None, :, :]).sum(axis=2)
    assert np.array_equal(got, direct)
    assert np.array_equal(bv.hamming(a, a), bv.hamming(a, a).T)
    assert (np.diag(bv.hamming(a, a)) == 0).all()


def test_randomize_flips_each_bit_with_probability_q():
    n_bits = 400_000
    for eps in (0.5, 2.0):
        gen = _gen("flip", eps)
        bits = gen.random(n_bits) < 0.5
        out = _rr(bits, eps, gen)
        _, q = _pq(eps)
        # the flip count is Binomial(n, q): 4 sd of the rate is 4·sqrt(q(1-q)/n) (≈ 0.003)
        rate = np.count_nonzero(out != bits) / n_bits
        assert abs(rate - q) <= 4 * math.sqrt(q * (1 - q) / n_bits)


def test_debias_inverts_the_expected_hamming_distance():
    # Eq. 12: E[d_H] = 2pq·s + (2s·d/μ)(p - q)² for d <= 2t; eps None: E[d_H] = 2s·d/μ
    mu = bv.anchor_range(LOW, HIGH, T)
    d = np.linspace(0, 2 * T, 11)
    for eps in RC4_EPSILONS:
        p, q = _pq(eps)
        expected_dh = 2 * p * q * S + 2 * S * d / mu * (p - q) ** 2
        assert np.allclose(bv.debias(expected_dh, S, mu, eps), d, atol=1e-9)
        # the paper's Eq. 11 written out: (μ/2s)((e^ε+1)/(e^ε-1))²·d_H - μe^ε/(e^ε-1)²
        e = math.exp(eps)
        eq11 = mu / (2 * S) * ((e + 1) / (e - 1)) ** 2 * expected_dh - mu * e / (e - 1) ** 2
        assert np.allclose(bv.debias(expected_dh, S, mu, eps), eq11, atol=1e-9)
    assert np.allclose(bv.debias(2 * S * d / mu, S, mu, None), d, atol=1e-12)


# --- RC4 / RC5: Theorem 5 unbiasedness and Theorem 6 -------------------------------------------
@pytest.fixture(scope="module")
def dpbv_estimates():
    """(d, ε) -> d̂ over RC4_TRIALS trials, each with fresh anchors and fresh noise, for the pair
    (0, d) on [0, 50] with t = 25, s = 1000, μ = 100."""
    mu = bv.anchor_range(LOW, HIGH, T)
    out = {}
    for d in RC4_DISTANCES:
        for eps in RC4_EPSILONS:
            gen = _gen("rc4", d, eps)
            codes = _codes_fresh_anchors(gen, (0.0, d), RC4_TRIALS, S, LOW, HIGH, T, eps)
            out[d, eps] = bv.debias(_paired_hamming(codes[0], codes[1]), S, mu, eps)
    return out


@pytest.mark.parametrize("eps", RC4_EPSILONS)
@pytest.mark.parametrize("d", RC4_DISTANCES)
def test_debiased_distance_is_unbiased_with_the_predicted_spread(dpbv_estimates, d, eps):
    mu = bv.anchor_range(LOW, HIGH, T)
    est = np.asarray(dpbv_estimates[d, eps], dtype=np.float64)
    n = est.size
    sd = bv.estimator_sd(d, S, mu, eps)
    # with anchors redrawn per trial every bit differs independently with P = 2pq + (p-q)²·2d/μ,
    # so d_H ~ Binomial(s, P) and estimator_sd is the exact sd of d̂ (cross-checked here)
    assert sd == pytest.approx(_binomial_sd_of_dhat(d, S, mu, T, eps), rel=1e-12)
    # mean: 40 simultaneous checks in this grid (20 means, 20 sds) -> Bonferroni z ≈ 4.2
    z = _z(2 * len(RC4_DISTANCES) * len(RC4_EPSILONS))
    assert abs(est.mean() - d) <= z * sd / math.sqrt(n), (est.mean(), d, sd)
    # spread: the sample sd has relative sd sqrt((κ - 1)/(4n)), κ = 3 + (1 - 6P(1-P))/(sP(1-P))
    # the binomial's kurtosis (≈ 3 here) -> about 2.5 % at n = 800, so z of them ≈ 10.5 % — tighter
    # than the spec's ±25 %
    p, q = _pq(eps)
    big_p = 2 * p * q + (p - q) ** 2 * 2 * d / mu
    kurt = 3 + (1 - 6 * big_p * (1 - big_p)) / (S * big_p * (1 - big_p))
    rel_se = math.sqrt((kurt - 1) / (4 * n))
    assert abs(est.std(ddof=1) / sd - 1) <= z * rel_se, (est.std(ddof=1), sd)


@pytest.mark.parametrize("eps", sorted(HOEFFDING))
def test_hoeffding_bound_values_and_coverage(dpbv_estimates, eps):
    mu = bv.anchor_range(LOW, HIGH, T)
    beta = 0.05
    bound = bv.hoeffding_bound(S, mu, eps, beta)
    assert round(bound, 2) == pytest.approx(HOEFFDING[eps], abs=1e-9)
    # the bound is Eq. 13 written out
    e = math.exp(eps)
    assert bound == pytest.approx(
        mu / 2 * ((e + 1) / (e - 1)) ** 2 * math.sqrt(math.log(2 / beta) / (2 * S)), rel=1e-12
    )
    # coverage: the exceedance count over n trials is at most Binomial(n, β); allow its mean plus
    # z sd, z the Bonferroni level over the 20 (d, ε) cells
    z = _z(len(RC4_DISTANCES) * len(RC4_EPSILONS))
    for d in RC4_DISTANCES:
        est = np.asarray(dpbv_estimates[d, eps], dtype=np.float64)
        rate = np.mean(np.abs(est - d) > bound)
        assert rate <= beta + z * math.sqrt(beta * (1 - beta) / est.size), (d, rate)


# --- RC6: Theorem 1 (distance consistence is exact for noise-free BV) --------------------------
def _triples(gen, m, low, high, width_low, width_high):
    """m ordered triples x <= y <= z in [low, high] with z - x uniform in [width_low, width_high)."""
    w = gen.uniform(width_low, width_high, m)
    x = low + gen.random(m) * (high - low - w)
    z = x + w
    y = x + gen.random(m) * w
    return x, y, z


def _triangle_defect(r, t, x, y, z):
    """(d_H(x,y) + d_H(y,z) - d_H(x,z), number of anchors whose bits on (x,y,z) read ι,ῑ,ι)."""
    m = len(x)
    codes = bv.encode(np.concatenate([x, y, z]), r, t)
    bx, by, bz = codes[:m], codes[m : 2 * m], codes[2 * m :]
    defect = _paired_hamming(bx, by) + _paired_hamming(by, bz) - _paired_hamming(bx, bz)
    pattern = ((bx == bz) & (bx != by)).sum(axis=1)
    return defect, pattern


@pytest.mark.parametrize(("t", "low", "high"), [(3.0, 0.0, 25.0), (25.0, 0.0, 50.0)])
def test_theorem1_holds_exactly_in_local_view(t, low, high):
    gen = _gen("rc6", t)
    r = bv.anchors(gen, 1, S, low, high, t)[0]
    x, y, z = _triples(gen, 1500, low, high, 0.0, min(2 * t, high - low))
    defect, pattern = _triangle_defect(r, t, x, y, z)
    # Table II: per bit, only ι,ῑ,ι contributes (2); it needs z - x > 2t, so in local view the
    # integer identity d_H(x,z) = d_H(x,y) + d_H(y,z) holds for every triple
    assert np.array_equal(defect, 2 * pattern)
    assert (defect == 0).all()


def test_theorem1_fails_outside_local_view():
    t, low, high = 3.0, 0.0, 25.0
    gen = _gen("rc6-far")
    r = bv.anchors(gen, 1, S, low, high, t)[0]
    x, y, z = _triples(gen, 1500, low, high, 2 * t, high - low)
    defect, pattern = _triangle_defect(r, t, x, y, z)
    assert np.array_equal(defect, 2 * pattern)  # Table II still accounts for every bit
    assert (defect >= 0).all()  # the Hamming triangle inequality
    assert (defect > 0).mean() > 0  # the identity breaks for a positive fraction
    # and it breaks exactly when an anchor lies in (x + t, z - t) within t of y (pattern 0,1,0)
    inner = (r[None, :] > x[:, None] + t) & (r[None, :] < z[:, None] - t)
    near_y = np.abs(y[:, None] - r[None, :]) <= t
    assert np.array_equal(defect > 0, (inner & near_y).any(axis=1))


# --- RC7: saturation -------------------------------------------------------------------------------
def test_noise_free_estimate_saturates_at_2t_for_the_fig3_pair():
    t, low, high, s = 1.2, 0.0, 20.0, 1000
    mu = bv.anchor_range(low, high, t)
    assert mu == pytest.approx(22.4)
    r = bv.anchors(_gen("rc7"), 1, s, low, high, t)[0]
    codes = bv.encode(np.array([5.0, 9.0]), r, t)
    est = float(bv.debias(bv.hamming(codes, codes)[0, 1], s, mu, None))
    # d = 4 > 2t: the intervals are disjoint, d_H ~ Binomial(s, 4t/μ) over anchors, E d̂ = 2t,
    # sd = (μ/2s)·sqrt(s·P(1-P)) ≈ 0.145; 4 sd ≈ 0.58
    sd = _binomial_sd_of_dhat(4.0, s, mu, t, None)
    assert abs(est - 2 * t) <= 4 * sd
    assert est < 4.0 - 4 * sd  # far below the true distance 4


def test_noise_free_estimate_is_min_of_d_and_2t_on_average():
    t, low, high, s, trials = 1.2, 0.0, 20.0, 1000, 400
    mu = bv.anchor_range(low, high, t)
    distances = (0.5, 1.5, 2.4, 3.0, 4.0, 8.0, 15.0)
    z = _z(len(distances))
    for d in distances:
        x1 = (high - low - d) / 2
        codes = _codes_fresh_anchors(_gen("rc7-mean", d), (x1, x1 + d), trials, s, low, high, t)
        est = bv.debias(_paired_hamming(codes[0], codes[1]), s, mu, None)
        # E d_H = s·2 min(d, 2t)/μ exactly; z sd of the mean over trials (Bonferroni over 7)
        sd = _binomial_sd_of_dhat(d, s, mu, t, None)
        assert abs(est.mean() - min(d, 2 * t)) <= z * sd / math.sqrt(trials), (d, est.mean())


# --- Algorithm 1: distance consistence ------------------------------------------------------------
def _consistence_reference(d: np.ndarray, radius: float, max_iter: int = 50) -> np.ndarray:
    """Spec §2.4 pseudo-code, literally: keep d <= radius; fill each unset (i, k) with
    d(i, j) + d(j, k) for the first j != i, k whose two hops were set before this iteration;
    repeat until nothing changes; unreachable pairs keep their raw value."""
    n = len(d)
    out = np.where(d <= radius, d, np.inf)
    np.fill_diagonal(out, np.diag(d))
    for _ in range(max_iter):
        new = out.copy()
        for i, k in itertools.product(range(n), range(n)):
            if np.isfinite(out[i, k]):
                continue
            for j in range(n):
                if j not in (i, k) and np.isfinite(out[i, j]) and np.isfinite(out[j, k]):
                    new[i, k] = out[i, j] + out[j, k]
                    break
        if np.array_equal(np.isfinite(new), np.isfinite(out)):
            break
        out = new
    return np.where(np.isfinite(out), out, d)


@pytest.mark.parametrize("case", ["noisy", "noise-free", "two-groups"])
def test_distance_consistence_matches_the_literal_algorithm(case):
    gen = _gen("alg1", case)
    t, low, high, s, n = 3.0, 0.0, 25.0, 300, 16
    mu = bv.anchor_range(low, high, t)
    if case == "two-groups":  # no chain can cross the gap: those pairs keep their raw estimate
        x = np.concatenate([gen.uniform(0, 4, n // 2), gen.uniform(18, 25, n - n // 2)])
    else:
        x = gen.uniform(low, high, n)
    r = bv.anchors(gen, 1, s, low, high, t)[0]
    codes = bv.encode(x, r, t)
    eps = 2.0 if case == "noisy" else None
    if eps is not None:
        codes = _rr(codes, eps, gen)
    d = bv.debias(bv.hamming(codes, codes), s, mu, eps).astype(np.float64)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    got = bv.distance_consistence(d, t)
    assert np.array_equal(got, _consistence_reference(d, t))
    if case == "two-groups":
        cross = np.abs(x[:, None] - x[None, :]) > 10
        assert np.array_equal(got[cross], d[cross])


def test_distance_consistence_telescopes_for_noise_free_bv():
    # spec §2.4 [derived]: with hops <= 2t the chain sum telescopes to
    # (μ/2s)·(#anchors in [x - t, z - t) + #anchors in (x + t, z + t]), whatever the chain; with
    # radius t and s = 1000 no saturated pair looks local, so every reached pair equals it exactly
    gen = _gen("telescope")
    t, low, high, s, n = 3.0, 0.0, 25.0, 1000, 120
    mu = bv.anchor_range(low, high, t)
    x = gen.uniform(low, high, n)
    r = bv.anchors(gen, 1, s, low, high, t)[0]
    codes = bv.encode(x, r, t)
    d = bv.debias(bv.hamming(codes, codes), s, mu, None).astype(np.float64)
    got = bv.distance_consistence(d, t)
    lo_, hi_ = np.minimum.outer(x, x)[..., None], np.maximum.outer(x, x)[..., None]
    count = ((r >= lo_ - t) & (r < hi_ - t)).sum(-1) + ((r > lo_ + t) & (r <= hi_ + t)).sum(-1)
    # hamming returns float32: compare to float32 resolution of values up to ~25
    assert np.allclose(got, mu * count / (2 * s), rtol=0, atol=1e-4)


def _consistence_case(gen: np.random.Generator, kind: str, n: int) -> np.ndarray:
    """A distance matrix of one kind: 1-D with noise, integer ties, NaN/±inf entries, two groups
    no chain joins, an integer matrix, or an arbitrary asymmetric one."""
    x = gen.uniform(0, 25, n)
    if kind == "noisy":
        d = np.abs(x[:, None] - x[None, :]) + gen.normal(0, 0.5, (n, n))
        return ((d + d.T) / 2).astype(np.float32)
    if kind == "ties":
        return np.abs(np.round(x)[:, None] - np.round(x)[None, :])
    if kind == "non-finite":
        d = np.abs(x[:, None] - x[None, :]) + gen.normal(0, 1, (n, n))
        for value, share in ((np.nan, 0.05), (np.inf, 0.02), (-np.inf, 0.02)):
            d[gen.random((n, n)) < share] = value
        return d
    if kind == "two-groups":
        x = np.concatenate([gen.uniform(0, 4, n // 2), gen.uniform(18, 25, n - n // 2)])
        return np.abs(x[:, None] - x[None, :]).astype(np.float32)
    if kind == "integers":
        return gen.integers(0, 10, (n, n))
    return gen.uniform(0, 10, (n, n))


@pytest.mark.parametrize(
    "kind", ["noisy", "ties", "non-finite", "two-groups", "integers", "asymmetric"]
)
def test_block_search_equals_the_rowwise_algorithm_bit_for_bit(kind, monkeypatch):
    # tiny row blocks, chunks and hit batches so that every case crosses several of each (the
    # defaults would search these n <= 60 in one block and a couple of chunks)
    gen = _gen("alg1-blocks", kind)
    for case in range(12):
        monkeypatch.setattr(bv, "CONSISTENCE_ROWS", int(gen.integers(1, 9)))
        monkeypatch.setattr(bv, "FIRST_CHUNK", int(gen.integers(1, 5)))
        monkeypatch.setattr(bv, "LAST_CHUNK", bv.FIRST_CHUNK + int(gen.integers(0, 13)))
        monkeypatch.setattr(bv, "HIT_ROWS", int(gen.integers(1, 5)))
        monkeypatch.setattr(bv, "HIT_BATCH", int(gen.integers(1, 40)))
        n = int(gen.integers(1, 61))
        d = _consistence_case(gen, kind, n)
        radius = float(gen.choice([0.5, 2.0, 3.0, 5.0]))
        max_iter = (0, 1, 2, 50)[case % 4]
        with np.errstate(invalid="ignore"):
            want = consistence_rowwise(d, radius, max_iter)
            got = bv.distance_consistence(d, radius, max_iter)
        assert got.dtype == want.dtype, (case, n)
        assert np.array_equal(got, want, equal_nan=True), (case, n, radius, max_iter)


def test_consistence_in_place_counts_its_passes_and_leaves_the_input_alone():
    # a path 0 - 1 - ... - 9 with unit hops and radius 1: pass m joins pairs up to 2^m apart, so
    # three passes reach every pair (9 hops) and a fourth finds nothing left
    x = np.arange(10.0)
    d = np.abs(x[:, None] - x[None, :])
    before = d.copy()
    chained = bv.distance_consistence(d, 1.0)
    assert np.array_equal(d, before)
    assert np.array_equal(chained, d)  # unit hops add up exactly
    work = np.where(d <= 1.0, d, 99.0)
    assert bv.consistence_in_place(work, 1.0) == 4
    assert np.array_equal(work, d)
    assert bv.consistence_in_place(np.where(d <= 1.0, d, 99.0), 1.0, max_iter=2) == 2


def test_distance_matrix_with_consistence_equals_the_whole_matrix_formula(monkeypatch):
    # the attribute's matrix is built in row blocks: the same numbers as building it whole
    monkeypatch.setattr(bv, "ROW_BLOCK", 7)
    gen = _gen("alg1-matrix")
    t, low, high, s, n = 3.0, 0.0, 25.0, 200, 40
    mu = bv.anchor_range(low, high, t)
    r = bv.anchors(gen, 2, s, low, high, t)
    x = gen.uniform(low, high, (n, 2))
    blocks = [_rr(bv.encode(x[:, a], r[a], t), 2.0, gen) for a in range(2)]
    got = bv.distance_matrix(blocks, s, mu, 2.0, t)
    total = sum(
        consistence_rowwise(bv.debias(bv.hamming(b, b), s, mu, 2.0), t) ** 2 for b in blocks
    )
    want = np.sqrt(total.astype(np.float32))
    np.fill_diagonal(want, 0.0)
    assert got.dtype == np.float32
    assert np.array_equal(got, want)


# --- RC8: Fig. 5 analogue ----------------------------------------------------------------------------
def test_fig5_consistence_error_is_low_and_decreases_with_s():
    t, low, high, n = 3.0, 0.0, 25.0, 200
    mu = bv.anchor_range(low, high, t)
    bits = (100, 1000, 2000)
    reps = 20
    iu = np.triu_indices(n, 1)
    raw = np.empty((reps, len(bits)))
    cons = np.empty((reps, len(bits)))
    noise_bound = np.empty((reps, len(bits)))
    for rep in range(reps):
        gen = _gen("rc8", rep)
        x = gen.uniform(low, high, n)
        true = np.abs(x[:, None] - x[None, :])
        r_all = bv.anchors(gen, 1, max(bits), low, high, t)[0]
        for col, s in enumerate(bits):
            codes = bv.encode(x, r_all[:s], t)  # nested anchor sets: a paired design over s
            d = bv.debias(bv.hamming(codes, codes), s, mu, None).astype(np.float64)
            fixed = bv.distance_consistence(d, 0.5 * 2 * t)
            raw[rep, col] = np.abs(d - true)[iu].mean()
            cons[rep, col] = np.abs(fixed - true)[iu].mean()
            p_bv = 2 * np.minimum(true[iu], 2 * t) / mu
            noise_bound[rep, col] = (mu / (2 * s) * np.sqrt(s * p_bv * (1 - p_bv))).mean()
    # without consistence: per pair E|d̂ - d| lies in [(d - 2t)+, (d - 2t)+ + sd(d̂)] (d̂ saturates
    # at 2t in mean; |·| adds at most its sd), and E(D - 6)+ = 19³/1875 for D = |X - Y|,
    # X, Y ~ U[0, 25]; the replicate mean varies with se = sd over replicates/sqrt(reps)
    analytic = 19**3 / 1875
    for col in range(len(bits)):
        mean = raw[:, col].mean()
        se = raw[:, col].std(ddof=1) / math.sqrt(reps)
        assert analytic - 4 * se <= mean <= analytic + noise_bound[:, col].mean() + 4 * se
    # with consistence the error is far lower in every replicate (≈ 0.2-1.3 against ≈ 3.7, with
    # replicate sds ≈ 0.25 and 0.2: the gap is > 8 sd)
    assert (cons < raw).all()
    # and it decreases with s. Calibration (30 replicates, this setup): means 0.66 / 0.22 / 0.17
    # at s = 100 / 1000 / 2000, paired differences with sd 0.22 and 0.063 per replicate; with
    # 20 replicates the gaps are ≈ 7.5 and 4.1 standard errors
    means = cons.mean(axis=0)
    assert means[0] > means[1] > means[2]
    # at s = 1000: mean ≈ 0.22, se ≈ 0.075/sqrt(20) ≈ 0.017, so 0.5 is > 15 se away
    assert means[1] < 0.5


# --- RC13: the true δ -----------------------------------------------------------------------------
def _hockey_stick_brute_force(eps: float, k: int) -> float:
    """Σ_o max(0, P_A(o) - e^ε P_B(o)) over all 2^k outputs, codes A = 1^k and B = 0^k."""
    p, q = _pq(eps)
    outputs = np.array(list(itertools.product((0, 1), repeat=k)), dtype=np.int64)
    ones = outputs.sum(axis=1)
    prob_a = p**ones * q ** (k - ones)
    prob_b = q**ones * p ** (k - ones)
    return float(np.maximum(0.0, prob_a - math.exp(eps) * prob_b).sum())


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_hockey_stick_matches_brute_force_enumeration(eps):
    for k in range(1, 13):
        assert bv.hockey_stick(eps, k) == pytest.approx(
            _hockey_stick_brute_force(eps, k), rel=1e-9, abs=1e-12
        )


def test_hockey_stick_reproduces_the_spec_table():
    assert bv.hockey_stick(1.0, 1) == pytest.approx(0.0, abs=1e-12)
    assert round(bv.hockey_stick(1.0, 2), 2) == pytest.approx(0.34, abs=1e-9)
    assert round(bv.hockey_stick(1.0, 10), 2) == pytest.approx(0.82, abs=1e-9)
    assert round(bv.hockey_stick(1.0, 100), 2) == pytest.approx(1.0, abs=1e-9)
    # the paper's δ at s = 1000 is no guarantee: codes can differ in all s bits
    assert bv.paper_delta(1.0, S) < 1e-100 * bv.hockey_stick(1.0, S)


def test_hockey_stick_is_a_divergence_nondecreasing_in_k():
    # dropping one of k + 1 differing bits is post-processing, so δ(k) <= δ(k + 1); δ in [0, 1].
    # Tolerance 1e-10: the log-sum-exp difference of two sums ≈ 1 carries ~1e-12 rounding error
    for eps in (0.5, 1.0, 4.0):
        values = np.array([bv.hockey_stick(eps, k) for k in range(1, 200)])
        assert (values >= 0).all() and (values <= 1 + 1e-10).all()
        assert (np.diff(values) >= -1e-10).all()


# --- the differing-bits bound -------------------------------------------------------------------------
def test_max_differing_bits_is_s_when_t_is_half_the_range():
    gen = _gen("kmax")
    r = bv.anchors(gen, 1, S, LOW, HIGH, T)[0]
    r[:7] = 25.0  # anchors exactly at the middle cover all of [0, 50]: they never differ
    k_max = bv.max_differing_bits(r, T, LOW, HIGH)
    assert k_max == S - np.count_nonzero(r == 25.0)
    codes = bv.encode(np.array([LOW, HIGH]), r, T)
    # x = 0 and x = 50 have complementary codes except at anchors exactly at 25 (both set)
    hamming = int(bv.hamming(codes, codes)[0, 1])
    assert hamming == k_max
    clean = bv.anchors(gen, 1, S, LOW, HIGH, T)[0]
    assert bv.max_differing_bits(clean, T, LOW, HIGH) == S - np.count_nonzero(clean == 25.0)


@pytest.mark.parametrize(("t", "low", "high"), [(3.0, 0.0, 25.0), (30.0, 0.0, 50.0)])
def test_max_differing_bits_bounds_every_pair_on_a_grid(t, low, high):
    r = bv.anchors(_gen("kmax-grid", t), 1, S, low, high, t)[0]
    k_max = bv.max_differing_bits(r, t, low, high)
    grid = np.linspace(low, high, 401)
    codes = bv.encode(grid, r, t)
    worst = int(bv.hamming(codes, codes).max())
    assert worst <= k_max
    if 2 * t >= high - low:
        # wide intervals: the two ends differ at every non-covering anchor, so the bound is tight
        assert worst == k_max
        assert k_max < S  # some anchors in [U - t, L + t] cover the whole range


def test_max_differing_bits_decides_coverage_with_the_encoder_itself():
    """An anchor's bit cannot differ on [L, U] iff the encoder sets it at both ends (the rounding
    of x - r is monotone in x, so |x - r| <= t then holds in between). Testing r - t <= L and
    r + t >= U instead rounds differently: an anchor placed at U - t or L + t, give or take a few
    ulps, can pass it while the encoder gives L and U different bits — Δ₀ one bit short. Found
    by search: L = 27.39…, U = 54.37…, t = 14.04…, r = 40.33… (U - t to within an ulp)."""
    low, high, t, r = 27.39233746429086, 54.37831097354025, 14.045841970386068, 40.33246900315418
    ends = np.abs(np.array([low, high]) - r) <= t  # the encoding, written out
    assert ends.tolist() == [True, False]
    assert bv.max_differing_bits(np.array([r]), t, low, high) == 1
    gen = _gen("kmax-edges")
    for _ in range(2000):
        low = gen.uniform(-100, 100)
        high = low + gen.uniform(0.01, 100)
        t = gen.uniform((high - low) / 2, high - low)
        edge = gen.choice([high - t, low + t])
        r = edge + np.arange(-3, 4) * np.spacing(edge)
        bits = np.abs(np.array([low, high])[:, None] - r[None, :]) <= t
        assert bv.max_differing_bits(r, t, low, high) == np.count_nonzero(~bits.all(axis=0))


# --- kCluster -----------------------------------------------------------------------------------------
def _blobs(gen, per=30):
    centers = np.array([[0.0, 0.0], [30.0, 0.0], [0.0, 30.0]])
    labels = np.repeat(np.arange(len(centers)), per)
    points = centers[labels] + gen.standard_normal((len(labels), 2))
    return points, labels


def _objective(d: np.ndarray, labels: np.ndarray) -> float:
    """Eq. 17: Σ_i Σ_{p ∈ C_i} D_C(p, C_i), D_C the average distance to the members of C_i."""
    total = 0.0
    for c in np.unique(labels):
        members = labels == c
        total += d[np.ix_(members, members)].sum() / members.sum()
    return total


def test_kcluster_recovers_well_separated_blobs():
    points, truth = _blobs(_gen("blobs"))
    d = cdist(points, points)
    k = 3
    runs = []
    for restart in range(10):
        start = kcluster(d, k, _gen("kc", restart), max_iter=0)  # the initial assignment
        final = kcluster(d, k, _gen("kc", restart))
        runs.append((start, final))
    # a start whose seeds hit every blob is already the true partition, and stays there
    hits = [
        final for start, final in runs if normalized_mutual_info_score(truth, start) > 1 - 1e-12
    ]
    assert hits
    for final in hits:
        assert normalized_mutual_info_score(truth, final) == pytest.approx(1.0)
    # the best of the restarts by the Eq. 17 objective recovers the blobs
    best = min((final for _, final in runs), key=lambda labels: _objective(d, labels))
    assert normalized_mutual_info_score(truth, best) == pytest.approx(1.0)
    assert _objective(d, best) == pytest.approx(_objective(d, truth))


def test_kcluster_is_deterministic_for_a_fixed_seed():
    points, _ = _blobs(_gen("blobs-det"), per=20)
    d = cdist(points, points) + _gen("jitter").uniform(0, 5, (60, 60))  # not metric, still fine
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    for restart in range(5):
        first = kcluster(d, 4, _gen("det", restart))
        second = kcluster(d, 4, _gen("det", restart))
        assert np.array_equal(first, second)


def test_kcluster_never_assigns_an_empty_cluster():
    # duplicated points make seeds tie: a seed that loses the tie leaves its cluster empty. An
    # empty cluster has average 0/1 = 0 if unguarded, which would attract every point; the set of
    # used clusters must instead never grow from one iteration to the next
    values = np.array([0.0, 0.0, 0.0, 10.0, 10.0, 10.0, 11.0])
    d = np.abs(values[:, None] - values[None, :])
    k = 3
    started_with_empty = 0
    for seed in range(12):
        iterates = [kcluster(d, k, _gen("empty", seed), max_iter=m) for m in range(8)]
        started_with_empty += len(np.unique(iterates[0])) < k
        for before, after in itertools.pairwise(iterates):
            assert set(np.unique(after)) <= set(np.unique(before)), (seed, before, after)
        final = kcluster(d, k, _gen("empty", seed))
        # the result is a fixed point of the update restricted to the non-empty clusters
        used = np.unique(final)
        averages = np.stack([d[:, final == c].mean(axis=1) for c in used], axis=1)
        assert np.array_equal(used[np.argmin(averages, axis=1)], final)
    assert started_with_empty > 0  # the guarded path was exercised


# --- the codes as a release's input ---------------------------------------------------------------
def _rr_by_hand(noise: NoiseSource, bits: np.ndarray, keys: np.ndarray, q: float) -> np.ndarray:
    """Every bit flipped where its keyed uniform is >= q: the randomized response of one block,
    written out (no mechanism)."""
    u = noise.user_uniform("randomized-response", 0, keys, bits.shape[1])
    return bits ^ (u >= q)


def test_code_response_draws_every_pair_block_and_carries_one_event(monkeypatch):
    """Bob's pair codes across several blocks (PAIR_BLOCK set to 7 pairs): the measurement's
    release is the per-pair keyed RR of every code (u's under key 2k, v's under 2k + 1), whatever
    the blocking; one event (the RR composed Δ₀ times) is registered for all the blocks, so one
    message carries it; as an array the source is every noise-free bit (pairs x 2 x s), the
    view the sensitivity check counts."""
    from rayfed.privacy import CodeResponse, Measurement, Neighbours

    gen = rng.stream(ROOT, "test", 0, "pairs")
    x = gen.uniform(0, 5, (9, 2))  # 36 pairs: 6 blocks of 7 and one of 1
    u, v = bv.pair_sums(x)
    lo, top = bv.pair_range(0.0, 5.0, 2)
    t = (top - lo) / 2
    anchors = bv.anchors(gen, 1, 40, lo, top, t)[0]
    codes = bv.Codes.of(anchors, t, lo, top, copies=2 * 8, what="pairs")
    q = bv.keep_probability(1.0)
    m = Measurement("pairs", CodeResponse(q), codes, Neighbours("replace_one", "record"))
    assert m.sensitivity == 2 * 8 * bv.max_differing_bits(anchors, t, lo, top)
    monkeypatch.setattr(bv, "PAIR_BLOCK", 7)
    noise = NoiseSource.seeded(ROOT, "bob")
    released, event = m(noise, bv.PairCodes(u, v, anchors, t))
    assert noise.events == [event] and event.count == m.sensitivity
    pairs = np.arange(u.size, dtype=np.uint64)
    reference = [
        _rr_by_hand(NoiseSource.seeded(ROOT, "bob"), bv.encode(w, anchors, t), keys, q)
        for w, keys in ((u, 2 * pairs), (v, 2 * pairs + np.uint64(1)))
    ]
    unpacked = np.unpackbits(released, axis=2, count=40).astype(bool)
    assert released.shape == (2, 36, 5)
    assert np.array_equal(unpacked[0], reference[0]) and np.array_equal(unpacked[1], reference[1])
    assert 0 < np.count_nonzero(unpacked[0] != bv.encode(u, anchors, t)) < u.size * 40 // 2
    exact = np.asarray(bv.PairCodes(u, v, anchors, t))
    assert exact.shape == (36, 2, 40)
    assert np.array_equal(exact[:, 0], bv.encode(u, anchors, t))
    assert np.array_equal(exact[:, 1], bv.encode(v, anchors, t))


def test_record_codes_are_keyed_by_record_and_attribute():
    """A custodian's records: attribute j of record i flipped by the coins of key i·4096 + j,
    so the release does not depend on which custodian holds the record or the attribute."""
    from rayfed.privacy import CodeResponse, Measurement, Neighbours

    gen = rng.stream(ROOT, "test", 0, "records")
    x = gen.uniform(LOW, HIGH, (30, 3))
    r = bv.anchors(gen, 3, 50, LOW, HIGH, T)
    ids = np.arange(100, 130, dtype=np.uint64)
    keys = ids[None, :] * np.uint64(4096) + np.arange(3, dtype=np.uint64)[:, None]
    codes = bv.Codes.of(r, T, LOW, HIGH, what="attributes")
    assert codes.diameter(0) == sum(bv.max_differing_bits(a, T, LOW, HIGH) for a in r) == 150
    assert codes.radius(0) == 150 and codes.diameter(2) == pytest.approx(math.sqrt(150))
    q = bv.keep_probability(2.0)
    m = Measurement("codes", CodeResponse(q), codes, Neighbours("replace_one", "record"))
    released, _ = m(NoiseSource.seeded(ROOT, "p0"), bv.RecordCodes(x, r, T, keys), ids=ids)
    for j in range(3):
        expected = _rr_by_hand(
            NoiseSource.seeded(ROOT, "p0"), bv.encode(x[:, j], r[j], T), keys[j], q
        )
        assert np.array_equal(np.unpackbits(released[j], axis=1, count=50).astype(bool), expected)
    # the second attribute alone, at another custodian: the same bits
    alone, _ = m(
        NoiseSource.seeded(ROOT, "p1"), bv.RecordCodes(x[:, 1:2], r[1:2], T, keys[1:2]), ids=ids
    )
    assert np.array_equal(alone[0], released[1])
    assert np.asarray(bv.RecordCodes(x, r, T, keys)).shape == (30, 3, 50)
