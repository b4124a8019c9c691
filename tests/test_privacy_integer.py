"""Integer noise for distributed DP (issue 27): the samplers against their exact pmfs, per-user
keying, and the events against the exact privacy loss of the integer distributions.

References are computed independently of the code under test: the discrete Gaussian's pmf as
normalised exp sums in mpmath (60 digits), Skellam's as e^{−μ}·I_k(μ) (mpmath's Bessel function)
or scipy.stats.skellam, sums of shares by convolving those pmfs, and the privacy loss of a
neighbouring pair (the noise law against itself shifted by the sensitivity) summed directly:
δ(ε) = Σ max(0, P(x) − e^ε·Q(x)) and the Rényi divergence D_α(P‖Q) = log Σ P^α Q^{1−α}/(α − 1).
χ² tests use fixed seeds and the critical value of scipy.stats.chi2 at α = 1e-3.
"""

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import stats

import rayfed.privacy.ledger as ledger
from rayfed.errors import ConfigError, RayfedError, UnaccountedNoise
from rayfed.privacy import (
    Budget,
    NoiseSource,
    PrivacyLedger,
    ddg_sigma2,
    discrete_gaussian,
    discrete_gaussian_share_noise,
    discrete_gaussian_shares,
    discrete_gaussian_sum_tail,
    distributed_discrete_gaussian_event,
    event_from_dict,
    event_to_dict,
    exact_sigma2,
    gaussian_noise_multiplier,
    skellam,
    skellam_event,
    skellam_shares,
    skellam_tail,
    skellam_variance,
)
from rayfed.privacy.ledger import DistributedDiscreteGaussianDpEvent, SkellamDpEvent

CHI2_ALPHA = 1e-3
DELTA = 1e-5


# --- independent references ----------------------------------------------------------------------
def dg_pmf(sigma2, radius: int) -> dict[int, float]:
    """N_Z(0, σ²) on [−radius, radius], normalised in mpmath (the mass beyond is below 1e-60
    for the radii used)."""
    mpmath.mp.dps = 60
    s2 = mpmath.mpf(Fraction(sigma2).numerator) / Fraction(sigma2).denominator
    w = {k: mpmath.exp(-mpmath.mpf(k * k) / (2 * s2)) for k in range(-radius, radius + 1)}
    z = mpmath.fsum(w.values())
    return {k: v / z for k, v in w.items()}


def skellam_pmf(variance, radius: int) -> dict[int, float]:
    """Poisson(μ/2) − Poisson(μ/2) (variance μ): e^{−μ}·I_|k|(μ)."""
    mpmath.mp.dps = 60
    mu = mpmath.mpf(variance)
    return {k: mpmath.exp(-mu) * mpmath.besseli(abs(k), mu) for k in range(-radius, radius + 1)}


def convolve(p: dict, q: dict) -> dict:
    out: dict = {}
    for i, a in p.items():
        for j, b in q.items():
            out[i + j] = out.get(i + j, 0) + a * b
    return out


def dg_sum_pmf(sigma2, n: int, radius: int) -> dict:
    one = dg_pmf(sigma2, radius)
    total = one
    for _ in range(n - 1):
        total = convolve(total, one)
    return total


def exact_delta(pmf: dict, shift: int, eps: float) -> float:
    """δ(ε) of the pair (noise, noise + shift): Σ_x max(0, P(x) − e^ε P(x − shift)) (the pair is
    symmetric for a symmetric pmf, so one order suffices)."""
    e = mpmath.exp(eps)
    return float(mpmath.fsum(max(0, p - e * pmf.get(x - shift, 0)) for x, p in pmf.items()))


def exact_epsilon(pmf: dict, shift: int, delta: float) -> float:
    low, high = 0.0, 60.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if exact_delta(pmf, shift, mid) > delta else (low, mid)
    return high


def exact_renyi(pmf: dict, alpha: int, shift: int = 1) -> float:
    """D_α(P‖Q), Q = P shifted by ``shift``, over the common support (P and Q have the same one
    up to the truncation, whose mass is below 1e-60)."""
    terms = [p**alpha * pmf[x - shift] ** (1 - alpha) for x, p in pmf.items() if x - shift in pmf]
    return float(mpmath.log(mpmath.fsum(terms)) / (alpha - 1))


def chi2_test(samples: np.ndarray, pmf) -> tuple[float, float]:
    """(χ² statistic, its critical value at CHI2_ALPHA): one bin per integer a..b whose expected
    count is >= 5, and one bin for each tail beyond; ``pmf(k)`` is the reference probability."""
    n = samples.size
    lo, hi = int(samples.min()), int(samples.max())
    inner = [k for k in range(lo, hi + 1) if float(pmf(k)) * n >= 5]
    a, b = min(inner), max(inner)
    middle = np.array([float(pmf(k)) for k in range(a, b + 1)])
    reach = 10 * (b - a) + 50  # the pmfs decay faster than exponentially beyond
    left = sum(float(pmf(k)) for k in range(a - reach, a))
    right = 1.0 - left - middle.sum()
    expected = n * np.concatenate([[left], middle, [right]])
    observed = np.bincount(np.clip(samples, a - 1, b + 1) - (a - 1), minlength=b - a + 3)
    use = expected > 1e-9
    stat = float(((observed - expected) ** 2)[use].__truediv__(expected[use]).sum())
    return stat, float(stats.chi2.ppf(1 - CHI2_ALPHA, int(use.sum()) - 1))


def ledger_epsilon(event, delta=DELTA) -> float:
    acc = ledger.make_accountant("tightest", "replace_special")
    acc.compose(event)
    return float(acc.get_epsilon(delta))


# --- samplers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma2,seed", [(Fraction(5, 2), 1), (30.7, 2), (Fraction(1, 3), 3)])
def test_discrete_gaussian_matches_its_pmf(sigma2, seed):
    """χ² of 2·10^5 draws against the exact pmf (exact regime: σ² <= 2^30)."""
    s2 = exact_sigma2(sigma2)
    assert s2 == Fraction(sigma2).limit_denominator(10**6)  # the value the caller meant
    draws = discrete_gaussian(np.random.default_rng(seed), s2, (400, 500))
    assert draws.shape == (400, 500) and draws.dtype == np.int64
    pmf = dg_pmf(s2, int(12 * math.sqrt(float(s2))) + 12)
    stat, critical = chi2_test(draws.ravel(), lambda k: pmf.get(k, 0))
    assert stat < critical


def test_chi2_detects_a_biased_sampler():
    """The check bites: the rounded continuous Gaussian (a common stand-in) and N_Z with σ² off
    by 4 % both fail it at 2·10^5 draws."""
    s2 = Fraction(5, 2)
    pmf = dg_pmf(s2, 40)
    rounded = np.rint(np.random.default_rng(1).normal(0, math.sqrt(2.5), 200_000)).astype(np.int64)
    off = discrete_gaussian(np.random.default_rng(1), Fraction(26, 10), 200_000)
    for draws in (rounded, off):
        stat, critical = chi2_test(draws, lambda k: pmf.get(k, 0))
        assert stat > critical


def test_discrete_gaussian_above_the_exact_range():
    """σ² > 2^30 (float acceptance coin): mean and variance within 5 sd of N_Z's (= N's there)."""
    s2 = float(2**31)
    draws = discrete_gaussian(np.random.default_rng(5), s2, 200_000).astype(np.float64)
    n = draws.size
    assert abs(draws.mean()) < 5 * math.sqrt(s2 / n)
    assert abs(draws.var() / s2 - 1) < 5 * math.sqrt(2 / n)


def test_discrete_gaussian_speed():
    """10^6 draws in about a second on one core (CI bound: 10 s)."""
    import time

    start = time.perf_counter()
    discrete_gaussian(np.random.default_rng(0), 100.0, 10**6)
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("mu,seed", [(0.7, 1), (12.5, 2)])
def test_skellam_matches_scipy(mu, seed):
    draws = skellam(np.random.default_rng(seed), mu, 200_000)
    ref = stats.skellam(mu, mu)
    stat, critical = chi2_test(draws, lambda k: ref.pmf(k))
    assert stat < critical


def test_skellam_shares_sum_to_the_closed_form():
    """n = 5 users' keyed shares of variance μ/5 sum, per coordinate, to Skellam of variance μ:
    χ² against scipy.stats.skellam(μ/2, μ/2) over 40,000 coordinates; a sum with the wrong
    parametrisation (each Poisson of mean μ/n, variance 2μ) fails it."""
    n, d, mu = 5, 40_000, 9.0
    noise = NoiseSource.seeded(21, "skellam")
    out, event = skellam_shares(
        noise,
        np.zeros((n, d), dtype=np.int64),
        ids=np.arange(n),
        variance=mu / n,
        quorum=n,
        l2_sensitivity=1.0,
    )
    assert event == SkellamDpEvent(variance=mu, l2_sensitivity=1.0, l1_sensitivity=1.0)
    total = out.sum(axis=0)
    stat, critical = chi2_test(total, lambda k: stats.skellam(mu / 2, mu / 2).pmf(k))
    assert stat < critical
    stat, critical = chi2_test(total, lambda k: stats.skellam(mu, mu).pmf(k))
    assert stat > critical


def test_keyed_discrete_gaussian_matches_its_pmf():
    """The per-user keyed draws (AES coins per coordinate) are N_Z too: χ² over 100 x 2,000."""
    noise = NoiseSource.seeded(5, "dg")
    draws = noise.user_discrete_gaussian("t-dg", 0, np.arange(100), 2000, Fraction(7, 2))
    pmf = dg_pmf(Fraction(7, 2), 40)
    stat, critical = chi2_test(draws.ravel(), lambda k: pmf.get(k, 0))
    assert stat < critical


@pytest.mark.parametrize("kind", ["dg", "skellam"])
def test_shares_are_keyed_per_user(kind):
    """Seeded: a user draws the same share whichever cohort (and order) hosts it; secure: the
    shares differ from the seeded run's and between two actors; a second draw of one purpose and
    round is refused, a deliberate regeneration repeats the share."""

    def draw(source, ids, again=False):
        if kind == "dg":
            return discrete_gaussian_share_noise(source, ids, 16, sigma2=6.0, regenerate=again)
        return source.user_skellam("skellam-share", 0, ids, 16, 3.0, again=again)

    ids = np.arange(1000, 1060)
    whole = draw(NoiseSource.seeded(9, "a"), ids)
    b = NoiseSource.seeded(9, "b")
    first, second = draw(b, ids[::3]), draw(b, ids[np.arange(60) % 3 != 0][::-1])
    assert np.array_equal(whole[::3], first)
    assert np.array_equal(whole[np.arange(60) % 3 != 0][::-1], second)
    assert np.array_equal(draw(b, ids, again=True), whole)
    with pytest.raises(UnaccountedNoise, match="twice"):
        draw(b, ids[:1])
    secure, other = NoiseSource("secure", 9, "a"), NoiseSource("secure", 9, "a")
    s1, s2 = draw(secure, ids), draw(other, ids)
    assert not np.array_equal(s1, whole) and not np.array_equal(s1, s2)
    assert np.array_equal(draw(secure, ids[5:9], again=True), s1[5:9])  # keyed within the actor


def test_share_mechanism_registers_the_aggregate_event():
    noise = NoiseSource.seeded(3, "m")
    values = np.arange(12, dtype=np.int64).reshape(3, 4)
    out, event = discrete_gaussian_shares(
        noise, values, ids=np.arange(3), sigma2=2.0, quorum=2, l2_sensitivity=3.0
    )
    assert event == DistributedDiscreteGaussianDpEvent(2.0, 2, 3.0, 6.0, 4)  # Δ₁ = min(2·3, 9)
    assert out.dtype == np.int64 and not np.array_equal(out, values)
    noise.check_carried(event, "the shares' message")
    with pytest.raises(ConfigError, match="values"):
        discrete_gaussian_shares(
            noise, values * 1.0, ids=np.arange(3), sigma2=2.0, quorum=2, l2_sensitivity=3.0
        )


@pytest.mark.parametrize(
    "call",
    [
        lambda: exact_sigma2(0),
        lambda: exact_sigma2(float("nan")),
        lambda: exact_sigma2(1e-20),
        lambda: distributed_discrete_gaussian_event(1.0, quorum=0, l2_sensitivity=1.0, dim=1),
        lambda: skellam_event(-1.0, l2_sensitivity=1.0, dim=1),
        lambda: skellam(np.random.default_rng(0), 0.0, 3),
    ],
)
def test_bad_parameters_are_config_errors(call):
    with pytest.raises(ConfigError):
        call()


# --- events against the exact privacy loss -------------------------------------------------------
#: (n, σ², tolerance): where τ is negligible the ledger's ε (RDP, converted) is within 10 % of the
#: exact ε(δ) of the integer sum at δ = 1e-5, d = 1, Δ = 1
DDG_CASES = [(1, 1.0, 1.10), (2, 1.0, 1.10), (5, 2.0, 1.10), (3, 4.0, 1.10)]


@pytest.mark.parametrize("n,sigma2,tolerance", DDG_CASES)
def test_ddg_event_bounds_the_exact_loss(n, sigma2, tolerance):
    pmf = dg_sum_pmf(sigma2, n, int(12 * math.sqrt(sigma2)) + 12)
    exact = exact_epsilon(pmf, 1, DELTA)
    event = distributed_discrete_gaussian_event(sigma2, quorum=n, l2_sensitivity=1.0, dim=1)
    charged = ledger_epsilon(event)
    assert exact <= charged <= tolerance * exact


#: (n, σ²) where the sum is far from N_Z(0, nσ²) (τ of order 0.1 to 1)
TAU_CASES = [(2, 0.25), (2, 0.5), (4, 0.3)]
ORDERS = [2, 3, 4, 8, 16, 32]


@pytest.mark.parametrize("n,sigma2", TAU_CASES)
def test_ddg_rdp_curve_bounds_the_exact_renyi_divergence(n, sigma2):
    """The event's RDP curve is above the exact Rényi divergence of the sum of n discrete
    Gaussians at every order — and the curve with τ = 0 (treating the sum as N_Z(0, nσ²)) is not:
    τ is needed, and the check sees it."""
    pmf = dg_sum_pmf(sigma2, n, 14)
    exact = np.array([exact_renyi(pmf, a) for a in ORDERS])
    event = distributed_discrete_gaussian_event(sigma2, quorum=n, l2_sensitivity=1.0, dim=1)
    assert np.all(ledger.ddg_rdp(event, ORDERS) >= exact)
    as_one = DistributedDiscreteGaussianDpEvent(n * sigma2, 1, 1.0, 1.0, 1)  # τ = 0
    assert np.any(ledger.ddg_rdp(as_one, ORDERS) < exact)


def test_ddg_tau():
    """τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1)), by hand for n = 3, σ² = 0.25."""
    by_hand = 10 * (math.exp(-2 * math.pi**2 * 0.25 / 2) + math.exp(-2 * math.pi**2 * 0.25 * 2 / 3))
    assert ledger.ddg_tau(0.25, 3) == pytest.approx(by_hand, rel=1e-12)
    assert ledger.ddg_tau(0.25, 1) == 0.0


#: (μ, tolerance): the RDP conversion is looser for small μ, where the Skellam is far from Gaussian
SKELLAM_CASES = [(10.0, 1.35), (50.0, 1.15)]


@pytest.mark.parametrize("mu,tolerance", SKELLAM_CASES)
def test_skellam_event_bounds_the_exact_loss(mu, tolerance):
    pmf = skellam_pmf(mu, int(14 * math.sqrt(mu)) + 20)
    exact = exact_epsilon(pmf, 1, DELTA)
    charged = ledger_epsilon(skellam_event(mu, l2_sensitivity=1.0, dim=1))
    assert exact <= charged <= tolerance * exact
    # the check bites: an event that takes μ as each Poisson's mean (variance 2μ) under-charges
    assert ledger_epsilon(skellam_event(2 * mu, l2_sensitivity=1.0, dim=1)) < exact


@pytest.mark.parametrize("mu", [1.0, 4.0])
def test_skellam_rdp_curve_bounds_the_exact_renyi_divergence(mu):
    pmf = skellam_pmf(mu, 60)
    exact = np.array([exact_renyi(pmf, a) for a in ORDERS])
    curve = ledger.skellam_rdp(skellam_event(mu, l2_sensitivity=1.0, dim=1), ORDERS)
    assert np.all(curve >= exact)


def test_skellam_rdp_formula():
    """AKL Thm 3.5 by hand at α = 3, μ = 4, Δ₂ = 2, Δ₁ = 3: 3·4/8 + min(22/64, 9/8)."""
    event = SkellamDpEvent(variance=4.0, l2_sensitivity=2.0, l1_sensitivity=3.0)
    assert ledger.skellam_rdp(event, [3.0])[0] == pytest.approx(1.5 + (5 * 4 + 18) / 64)
    assert ledger.skellam_rdp(event, [2.5])[0] == ledger.skellam_rdp(event, [3.0])[0]  # ⌈α⌉


@pytest.mark.parametrize("n,sigma2,x", [(3, 2.0, 9), (4, 1.0, 8)])
def test_ddg_tail_bound(n, sigma2, x):
    pmf = dg_sum_pmf(sigma2, n, 20)
    exact = float(mpmath.fsum(p for k, p in pmf.items() if abs(k) >= x))
    assert exact <= discrete_gaussian_sum_tail(sigma2, n, x) <= 30 * exact


@pytest.mark.parametrize("mu,x", [(4.0, 8), (30.0, 25)])
def test_skellam_tail_bound(mu, x):
    pmf = skellam_pmf(mu, 120)
    exact = float(mpmath.fsum(p for k, p in pmf.items() if abs(k) >= x))
    assert exact <= skellam_tail(mu, x) <= 30 * exact


# --- the ledger ----------------------------------------------------------------------------------
def test_events_compose_in_the_ledger_and_round_trip():
    ddg = distributed_discrete_gaussian_event(200.0, quorum=100, l2_sensitivity=50.0, dim=64)
    sk = skellam_event(2.0e4, l2_sensitivity=50.0, dim=64)
    for event in (ddg, sk):
        assert event_from_dict(event_to_dict(event)) == event
    led = PrivacyLedger(Budget(10.0, 1e-6), accountant="tightest", relation="replace_special")
    led.charge(ddg, label="ddg")
    led.charge(dp_event.SelfComposedDpEvent(sk, 3), label="sk")
    report = led.report()
    assert report.accountant_used == "rdp"
    orders = np.array(ledger.MemoRdpAccountant()._orders)
    curve = ledger.ddg_rdp(ddg, orders) + 3 * ledger.skellam_rdp(sk, orders)
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    assert report.epsilon == pytest.approx(rdp.compute_epsilon(orders, curve, 1e-6)[0])
    pld_only = PrivacyLedger(Budget(10.0, 1e-6), accountant="pld", relation="replace_special")
    with pytest.raises(RayfedError, match="cannot account"):
        pld_only.charge(ddg, label="ddg")


def test_calibration_meets_the_budget_tightly():
    kw = dict(l2_sensitivity=100.0, quorum=1000, dim=1024)
    s2 = ddg_sigma2(1.0, 1e-6, **kw)
    assert exact_sigma2(s2) == Fraction(s2)  # representable: the event charges exactly it
    event = distributed_discrete_gaussian_event(s2, **kw)
    assert ledger_epsilon(event, 1e-6) <= 1.0
    assert ledger_epsilon(distributed_discrete_gaussian_event(0.999 * s2, **kw), 1e-6) > 1.0
    # at this σ τ vanishes: the sum's variance is the central Gaussian's under RDP
    z = gaussian_noise_multiplier(1.0, 1e-6, steps=1, accountant="rdp")
    assert 1000 * s2 == pytest.approx((100.0 * z) ** 2, rel=1e-3)
    mu = skellam_variance(1.0, 1e-6, l2_sensitivity=100.0, dim=1024, steps=4)
    sk = dp_event.SelfComposedDpEvent(skellam_event(mu, l2_sensitivity=100.0, dim=1024), 4)
    assert ledger_epsilon(sk, 1e-6) <= 1.0
    low = dp_event.SelfComposedDpEvent(skellam_event(0.999 * mu, l2_sensitivity=100.0, dim=1024), 4)
    assert ledger_epsilon(low, 1e-6) > 1.0


def test_integer_events_refuse_every_relation_but_zero_out():
    """The curves compare sums of the same number of shares: under add/remove the removed user's
    share leaves with it (the variance differs between the neighbours, up to 8x the charged
    divergence at small sizes), and replace-one needs twice the sensitivity; both are refused,
    in the ledger and in the calibration, naming zero-out."""
    from dp_accounting.privacy_accountant import UnsupportedEventError

    from rayfed.privacy.calibration import ddg_sigma2
    from rayfed.privacy.mechanisms import distributed_discrete_gaussian_event

    event = distributed_discrete_gaussian_event(4.0, quorum=3, l2_sensitivity=1.0, dim=1)
    for relation in ("add_or_remove_one", "replace_one"):
        acc = ledger.make_accountant("rdp", relation)
        with pytest.raises(UnsupportedEventError, match="zero-out"):
            acc.compose(event)
        with pytest.raises(ConfigError, match="zero-out"):
            ddg_sigma2(1.0, 1e-5, l2_sensitivity=1.0, quorum=3, dim=1, relation=relation)
    ok = ledger.make_accountant("rdp", "replace_special")
    ok.compose(event)
    assert ok.get_epsilon(1e-5) > 0
