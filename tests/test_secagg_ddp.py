"""The distributed-DP pipeline (rayfed.secagg.ddp, issue 27): rotation, conditional rounding, the
integer sum mod 2^b and its decoding, the modular-clipping bound. References are independent:
scipy's Hadamard matrix, exact rounding variances p(1-p), the noise samplers' own variances, and
numpy sums of the ring words; tolerances come from χ² quantiles of the estimators."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from scipy.linalg import hadamard
from scipy.optimize import minimize_scalar
from scipy.stats import chi2

from rayfed.errors import ConfigError
from rayfed.federation import Federation
from rayfed.privacy import NoiseSource, PrivacyDeclaration, integer
from rayfed.privacy.calibration import ddg_sigma2, skellam_variance
from rayfed.privacy.mechanisms import discrete_gaussian_shares, skellam_shares
from rayfed.secagg import FixedPoint, RingWords, ddp, find_params, make_spec, secure_sum
from rayfed.secagg.group import party_ids

ALPHA = 1e-3  # two-sided level of every statistical check here


def _chi2_ok(stat: float, dof: float) -> bool:
    return chi2.ppf(ALPHA / 2, dof) <= stat <= chi2.ppf(1 - ALPHA / 2, dof)


def _users(n: int, d: int, seed: int = 0, norm: float = 1.0) -> np.ndarray:
    """n vectors of ℓ2 norm between norm/2 and 2·norm (some clipped at clip = norm)."""
    gen = np.random.default_rng(seed)
    x = gen.normal(size=(n, d))
    x *= (norm * gen.uniform(0.5, 2.0, n) / np.linalg.norm(x, axis=1))[:, None]
    return x


def _skellam(gen: np.random.Generator, mu: float):
    """Each user's Skellam share Poisson(μ) - Poisson(μ) (variance 2μ): rayfed.privacy's sampler."""
    return lambda shape: integer.skellam(gen, mu, shape)


def _discrete_gaussian(gen: np.random.Generator, sigma2: float):
    """Each user's N_Z(0, σ²) share: rayfed.privacy's exact sampler."""
    return lambda shape: integer.discrete_gaussian(gen, sigma2, shape)


def _dg_variance(sigma2: float) -> float:
    """The exact variance of N_Z(0, σ²) (below σ² for small σ²), summing its pmf."""
    k = np.arange(-60, 61, dtype=np.float64)
    w = np.exp(-(k**2) / (2 * sigma2))
    return float((k**2 * w).sum() / w.sum())


# --- rotation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 2, 8, 64])
def test_fwht_is_scipys_normalised_hadamard(m):
    x = np.random.default_rng(m).normal(size=(5, m))
    reference = x @ (hadamard(m) / math.sqrt(m)).T
    np.testing.assert_allclose(ddp.fwht(x), reference, rtol=0, atol=1e-12)


def test_rotation_is_orthonormal_and_inverted_exactly():
    """rotate = H/√m · diag(signs) on the zero-padded vector (scipy's H); it keeps every norm and
    unrotate undoes it to float error."""
    p = ddp.plan(dim=100, users=10, clip=1.0, bits=20, noise="none", rotation_seed=3)
    assert p.padded_dim == 128
    x = np.random.default_rng(1).normal(size=(7, 100))
    pad = np.hstack([x, np.zeros((7, 28))])
    reference = (pad * p.signs()) @ (hadamard(128) / math.sqrt(128)).T
    y = p.rotate(x)
    np.testing.assert_allclose(y, reference, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13)
    np.testing.assert_allclose(p.unrotate(y), x, rtol=0, atol=1e-12)
    # the signs are public: a function of the seed and the round only
    assert np.array_equal(p.signs(), ddp.plan(**_same(p)).signs())
    other = ddp.plan(**{**_same(p), "rotation_seed": 4}).signs()
    assert set(np.unique(p.signs())) == {-1.0, 1.0} and not np.array_equal(p.signs(), other)


def _same(p: ddp.DdpPlan) -> dict:
    return dict(
        dim=p.dim,
        users=p.users,
        clip=p.clip,
        bits=p.bits,
        noise=p.noise,
        rotation_seed=p.rotation_seed,
    )


# --- conditional randomized rounding ----------------------------------------------------------
def test_rounding_is_unbiased_at_the_plans_bound():
    """N draws of one vector's rounding: Σ_j (mean_j - y_j)² / (p_j(1 - p_j)/N) is χ²_d. The
    plan's β = 1e-6 conditioning moves a coordinate's mean by at most β/(1-β) ≈ 1e-6 (far
    below the test's resolution, ~√(p(1-p)/N) ≈ 0.006)."""
    p = ddp.plan(dim=256, users=1, clip=1.0, bits=20, noise="none")
    y = p.rotate(p.clip_rows(_users(1, 256, seed=2))[0]) * p.gamma
    frac = y[0] - np.floor(y[0])
    draws = 6000
    ints, _ = ddp.conditional_round(
        np.repeat(y, draws, axis=0), p.l2_bound_sq, np.random.default_rng(5)
    )
    var = frac * (1 - frac) / draws
    stat = float((((ints.mean(axis=0) - y[0]) ** 2) / var).sum())
    assert _chi2_ok(stat, y.shape[1]), stat


def test_conditional_rounding_rerounds_only_the_failing_rows_and_never_exceeds_the_bound():
    """Rows of 0.5s in 64 coordinates under the bound Σx² ≤ 32: about 45 % of first roundings
    fail. Every output meets the bound, the failures (and only they) are redrawn."""
    d, rows, bound_sq = 64, 400, 32
    y = np.full((rows, d), 0.5)
    gen = np.random.default_rng(9)
    asked: list[tuple[np.ndarray, int]] = []

    def uniforms(idx, attempt):
        asked.append((np.asarray(idx).copy(), attempt))
        return gen.random((len(idx), d))

    ints, rerounds = ddp.conditional_round(y, bound_sq, uniforms)
    sq = (ints**2).sum(axis=1)
    assert sq.max() <= bound_sq
    first = asked[0]
    assert first[1] == 0 and np.array_equal(first[0], np.arange(rows))
    redrawn = np.concatenate([idx for idx, attempt in asked[1:]])
    assert rerounds == redrawn.size and 0.3 * rows < len(asked[1][0]) < 0.6 * rows
    assert [a for _, a in asked] == list(range(len(asked)))
    with pytest.raises(RuntimeError, match="still above the norm bound"):
        ddp.conditional_round(y, 10, np.random.default_rng(1), max_tries=5)


def test_the_rounded_norm_bound_holds_on_clipped_inputs():
    """Inputs up to twice the clip: clipped, rotated, scaled and rounded, every user's integer
    norm is within Δ₂ (exactly, in integers); the report's realised inflation is below its
    bound and above 1 − rounding's slack."""
    p = ddp.plan(dim=300, users=500, clip=2.0, bits=14, noise="none", beta=0.5)
    x = _users(500, 300, seed=3, norm=2.0)
    ints, stats = p.quantise(x, np.random.default_rng(0))
    assert (ints**2).sum(axis=1).max() <= p.l2_bound_sq
    report = p.report(stats)
    assert report.clipped == int((np.linalg.norm(x, axis=1) > 2.0).sum()) > 0
    assert 1.0 < report.inflation_realised <= report.inflation_bound
    assert p.l1_bound <= min(math.sqrt(p.padded_dim) * p.l2_bound, p.l2_bound_sq)


# --- end to end -------------------------------------------------------------------------------
def _sum_words(p: ddp.DdpPlan, words: RingWords) -> np.ndarray:
    return words.checked(p.bits).sum(axis=0) % (1 << p.bits)


def test_sum_without_noise_decodes_within_the_rounding_bound():
    """n users' words summed mod 2^b with numpy and decoded: within n·√padded_dim/γ of the true
    sum of the clipped vectors (each rounding error is below 1 per coordinate), in ℓ2."""
    n, d = 40, 100
    p = ddp.plan(dim=d, users=n, clip=1.0, bits=16, noise="none")
    x = _users(n, d, seed=4)
    words, _ = p.encode(x, np.random.default_rng(1))
    decoded = p.decode(_sum_words(p, words))
    truth = p.clip_rows(x)[0].sum(axis=0)
    error = float(np.linalg.norm(decoded - truth))
    assert error <= n * math.sqrt(p.padded_dim) / p.gamma
    assert error > 0  # it did round


def party_input(ctx, round, ids, x, p):
    """A party's one user: its row through the pipeline, rounded from a generator keyed by its id
    (so the test can redo it) and with Skellam noise from the party's noise source."""
    words, _ = p.encode(
        x[ids],
        np.random.default_rng(int(ids[0])),
        _skellam(ctx.noise.generator("ddp-test"), p.poisson_mean),
    )
    return words


def test_the_pipeline_runs_through_secure_sum():
    """Three parties, one SecAgg user each, ring words summed by the real protocol (simulation
    mode): decoded, the sum is the clipped inputs' within the rounding bound plus 6 noise sds."""
    names, d = ["alice", "bob", "carol"], 8
    p = ddp.plan(dim=d, users=3, clip=1.0, bits=24, noise="skellam", noise_std=1e-3)
    x = _users(3, d, seed=6)
    spec = make_spec(
        round=1,
        mode="simulation",
        registry=np.arange(3),
        params=find_params(3, dropout=0.0, graph="complete"),
        encoding=FixedPoint(float(2 ** (p.bits - 1)), 0, p.bits),
        dim=p.padded_dim,
    )
    parties = {name: (pa.table({"row": [i]}), {}) for i, name in enumerate(names)}
    with Federation(
        run_id="ddp",
        seed=5,
        parties=parties,
        privacy=PrivacyDeclaration.none("test"),
        backend="local",
    ) as fed:
        result = secure_sum(
            fed.parties, spec, party_input, (x, p), server=fed.coordinator, ids=party_ids(names)
        )
    decoded = p.decode(result.words)
    truth = p.clip_rows(x)[0].sum(axis=0)
    slack = 3 * math.sqrt(p.padded_dim) / p.gamma + 6 * 1e-3 * math.sqrt(p.padded_dim)
    assert 0 < np.linalg.norm(decoded - truth) <= slack
    # the rounding alone, redone from the users' keyed generators, is within 6 noise sds
    rounded = sum(p.quantise(x[[i]], np.random.default_rng(i))[0][0] for i in range(3))
    noise = p.centred(result.words).astype(np.int64) - rounded
    assert np.abs(noise).max() <= 6 * math.sqrt(3 * p.noise_variance) + 1


@pytest.mark.parametrize("noise", ["skellam", "discrete_gaussian"])
def test_noisy_sum_mse_matches_the_predicted_variance(noise):
    """R rounds of n users with integer noise (rayfed.privacy's samplers): Σ‖decoded - truth‖²·γ²
    over the rounds (padded_dim = dim, so it is the integer error's squared norm exactly)
    against its expectation Σ_j [Σ_i p_ij(1 - p_ij) + n·Var(share)] — Var 2μ for Skellam, the
    discrete Gaussian's exact variance from its pmf. With unequal variances V_j the statistic
    is a weighted χ²; Satterthwaite's m = (ΣV)²/ΣV² degrees of freedom give the quantiles."""
    n, d, rounds = 200, 128, 10
    p = ddp.plan(dim=d, users=n, clip=1.0, bits=20, noise=noise, noise_std=0.0015)
    x = _users(n, d, seed=7)
    truth = p.clip_rows(x)[0].sum(axis=0)
    y = p.rotate(p.clip_rows(x)[0]) * p.gamma
    frac = y - np.floor(y)
    gen = np.random.default_rng(11)
    if noise == "skellam":
        share_var, draw = 2 * p.poisson_mean, _skellam(gen, p.poisson_mean)
    else:
        sigma2 = float(integer.exact_sigma2(p.noise_variance))
        share_var, draw = _dg_variance(sigma2), _discrete_gaussian(gen, sigma2)
    per_coord = (frac * (1 - frac)).sum(axis=0) + n * share_var  # exact variances V_j
    share = n * share_var * d / per_coord.sum()
    assert 0.25 < share < 0.75, share  # noise and rounding both weigh in the statistic
    stat = 0.0
    for _ in range(rounds):
        words, _ = p.encode(x, gen, draw)
        stat += float(((p.decode(_sum_words(p, words)) - truth) ** 2).sum()) * p.gamma**2
    assert per_coord.mean() / p.gamma**2 <= p.mse_bound  # the plan's bound holds the exact value
    v = np.tile(per_coord, rounds)
    dof = v.sum() ** 2 / (v**2).sum()
    assert _chi2_ok(stat * dof / v.sum(), dof), (stat / v.sum(), dof)


@pytest.mark.parametrize("noise", ["skellam", "discrete_gaussian"])
def test_the_privacy_mechanisms_shares_go_through_the_pipeline(noise):
    """quantise → rayfed.privacy's keyed shares (release, event) → to_words → decode: the event
    carries the plan's Δ₂ and Δ₁, and the decoded sum is the truth within 6 sds of noise and
    rounding (mse_bound)."""
    n, d = 50, 64
    p = ddp.plan(dim=d, users=n, clip=1.0, bits=24, noise=noise, noise_std=0.05)
    x = _users(n, d, seed=12)
    ints, _ = p.quantise(x, np.random.default_rng(3))
    shares = skellam_shares if noise == "skellam" else discrete_gaussian_shares
    scale = {"variance": p.noise_variance} if noise == "skellam" else {"sigma2": p.noise_variance}
    noisy, event = shares(
        NoiseSource.seeded(1),
        ints,
        ids=np.arange(n),
        quorum=n,
        l2_sensitivity=p.l2_bound,
        l1_sensitivity=p.l1_bound,
        **scale,
    )
    assert event.l2_sensitivity == p.l2_bound and event.l1_sensitivity == p.l1_bound
    decoded = p.decode(_sum_words(p, p.to_words(noisy)))
    error = decoded - p.clip_rows(x)[0].sum(axis=0)
    assert np.abs(error).max() <= 6 * math.sqrt(p.mse_bound)
    assert np.abs(error).max() > 0.5 * math.sqrt(p.mse_bound)  # the noise is there


def test_a_forced_wrap_is_reported_and_decodes_wrong():
    """The same γ at 16 and at 8 bits: at 16 the bound is small and the sum right; at 8 the
    bound says ≈ 1 and the decoded sum is far off — the clipping check can fail."""
    n, d = 100, 64
    good = ddp.plan(dim=d, users=n, clip=1.0, bits=16, noise="none")
    bad = ddp.plan(dim=d, users=n, clip=1.0, bits=8, noise="none", gamma=good.gamma)
    assert good.modular_clip_bound() <= 1e-6 and bad.modular_clip_bound() > 0.5
    x = _users(n, d, seed=8)
    truth = good.clip_rows(x)[0].sum(axis=0)
    rounding_bound = n * math.sqrt(d) / good.gamma
    for p, right in ((good, True), (bad, False)):
        words, _ = p.encode(x, np.random.default_rng(2))
        error = float(np.linalg.norm(p.decode(_sum_words(p, words)) - truth))
        assert (error <= rounding_bound) is right, (p.bits, error, rounding_bound)


# --- the parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize("noise", ["none", "discrete_gaussian", "skellam"])
def test_gamma_is_the_largest_scale_within_the_clipping_target(noise):
    std = 0.0 if noise == "none" else 1.0
    p = ddp.plan(dim=1024, users=1000, clip=1.0, bits=16, noise=noise, noise_std=std)
    assert p.modular_clip_bound() <= p.modclip_prob < p.modular_clip_bound(p.gamma * 1.001)


def test_the_clipping_bound_against_an_independent_computation():
    """Gaussian-type: 2·m·exp(-t²/2v)·(1-β)^-n with v = γ²(nc)²/m + n/4 + n·σ²; Skellam: the
    Chernoff exponent minimised numerically (scipy) instead of by the root of its slope, and
    never below the sub-Gaussian bound at the same variance (cosh λ - 1 ≥ λ²/2)."""
    kw = dict(dim=1000, users=1000, clip=1.0, bits=14, noise_std=20.0)
    dg = ddp.plan(**kw, noise="discrete_gaussian", gamma=50.0)
    t, n, m = 2.0**13, 1000, 1024
    v = 50.0**2 * n**2 / m + n / 4 + n * dg.noise_variance
    expected = 2 * m * math.exp(-(t**2) / (2 * v)) * (1 - dg.beta) ** -n
    assert math.log(dg.modular_clip_bound()) == pytest.approx(math.log(expected), rel=1e-9)
    assert 1e-3 < dg.modular_clip_bound() < 1  # neither 0 nor saturated at 1
    # Skellam where its tail is not Gaussian: one user, 6 bits, noise of variance 4 (λ ≈ 2.8)
    sk = ddp.plan(dim=1, users=1, clip=1.0, bits=6, noise="skellam", noise_std=0.5, gamma=4.0)
    t, a, b = 32.0, 4.0**2 + 1 / 4, sk.noise_variance
    assert b == pytest.approx(4.0)
    best = minimize_scalar(
        lambda lam: -lam * t + a * lam**2 / 2 + b * (math.cosh(lam) - 1),
        bounds=(0, 10),
        method="bounded",
        options={"xatol": 1e-12},
    )
    log_expected = math.log(2) + best.fun - math.log1p(-sk.beta)
    assert math.log(sk.modular_clip_bound()) == pytest.approx(log_expected, rel=1e-9)
    as_gaussian = math.log(2) - t**2 / (2 * (a + b)) - math.log1p(-sk.beta)
    assert log_expected > as_gaussian + 0.5  # cosh λ - 1 ≥ λ²/2: a heavier tail, bounded so


def test_bad_parameters_are_config_errors_naming_the_option():
    base = dict(dim=16, users=10, clip=1.0, bits=16)
    with pytest.raises(ConfigError, match="bits"):
        ddp.plan(**{**base, "users": 10**6, "bits": 8})  # the rounding errors alone overflow
    for option, value in [
        ("bits", 1),
        ("bits", 63),
        ("clip", 0.0),
        ("dim", 0),
        ("noise", "laplace"),
        ("beta", 1.0),
        ("noise_std", -1.0),
        ("modclip_prob", 0.0),
        ("gamma", -1.0),
    ]:
        with pytest.raises(ConfigError, match=option):
            ddp.plan(**{**base, option: value})
    with pytest.raises(ConfigError, match="NaN"):
        ddp.plan(**base).encode(np.full((1, 16), np.nan), np.random.default_rng(0))


@pytest.mark.parametrize("bits", [12, 16, 20])
def test_plan_for_multiplier_puts_the_noise_at_the_multiplier_times_the_rounded_sensitivity(bits):
    """The fixed point: the sum's integer noise std is z·Δ₂ for the plan's own γ and Δ₂."""
    p = ddp.plan_for_multiplier(4.0, dim=1024, users=1000, clip=1.0, bits=bits)
    assert p.noise_multiplier == pytest.approx(4.0, rel=1e-9) and p.noise_multiplier >= 4.0 * (
        1 - 1e-9
    )
    assert math.sqrt(p.users * p.noise_variance) == pytest.approx(4.0 * p.l2_bound, rel=1e-9)
    assert p.modular_clip_bound() <= p.modclip_prob


def test_the_clipping_bound_contains_the_mechanisms_own_noise_tails():
    """rayfed.privacy's tail bounds cover the noise alone (one coordinate); the pipeline's bound
    covers signal + rounding + noise over every coordinate, so it is at least padded_dim times
    theirs, and close to it in log when the noise dominates (tiny clip, huge noise)."""
    for noise, tail in [
        (
            "discrete_gaussian",
            lambda p, t: integer.discrete_gaussian_sum_tail(p.noise_variance, p.users, t),
        ),
        ("skellam", lambda p, t: integer.skellam_tail(p.users * p.noise_variance, t)),
    ]:
        p = ddp.plan(dim=64, users=100, clip=1e-6, bits=16, noise=noise, noise_std=1e-2, beta=0)
        t = 2.0 ** (p.bits - 1)
        ours, theirs = p.modular_clip_bound(), p.padded_dim * tail(p, t)
        assert 1e-12 < theirs <= ours < 1e-3
        assert math.log(ours) == pytest.approx(math.log(theirs), rel=0.05)


@pytest.mark.parametrize("noise", ["discrete_gaussian", "skellam"])
def test_plan_calibrated_meets_the_mechanisms_calibration_at_its_own_sensitivity(noise):
    """With rayfed.privacy's calibration (ε = 1, δ = 10⁻⁶) as the share variance: the plan's
    noise is at least what its own Δ₂, Δ₁ ask for, and not more than 10⁻⁵ above."""

    def need(p):
        if noise == "discrete_gaussian":
            return ddg_sigma2(
                1.0,
                1e-6,
                l2_sensitivity=p.l2_bound,
                l1_sensitivity=p.l1_bound,
                quorum=p.users,
                dim=p.padded_dim,
            )
        return (
            skellam_variance(
                1.0, 1e-6, l2_sensitivity=p.l2_bound, l1_sensitivity=p.l1_bound, dim=p.padded_dim
            )
            / p.users
        )

    p = ddp.plan_calibrated(need, dim=1024, users=1000, clip=1.0, bits=16, noise=noise)
    assert need(p) <= p.noise_variance <= need(p) * (1 + 1e-5)
    assert p.modular_clip_bound() <= p.modclip_prob


def test_keyed_rounding_does_not_depend_on_the_cohorts():
    """Users' roundings keyed by id (a seeded NoiseSource): 30 users in one call, or split 7/23
    over two sources of the same seed (two cohorts), give the same integers, re-roundings
    included (a tight bound forces them); another seed gives others."""
    p = ddp.plan(dim=16, users=30, clip=1.0, bits=20, noise="none", beta=0.5)
    x = _users(30, 16, seed=13)
    ids = np.arange(100, 130)
    whole, stats = p.quantise(x, p.keyed_rounding(NoiseSource.seeded(7, "c0"), ids))
    parts = [
        p.quantise(x[s], p.keyed_rounding(NoiseSource.seeded(7, f"c{k}"), ids[s]))[0]
        for k, s in enumerate([slice(0, 7), slice(7, 30)])
    ]
    assert np.array_equal(whole, np.vstack(parts))
    other, _ = p.quantise(x, p.keyed_rounding(NoiseSource.seeded(8, "c0"), ids))
    assert not np.array_equal(whole, other)
    y = p.rotate(p.clip_rows(x)[0]) * p.gamma
    tight = int(np.floor((y**2).sum(axis=1).max())) + 1  # some rows fail at first
    first, rerounds = ddp.conditional_round(y, tight, p.keyed_rounding(NoiseSource.seeded(7), ids))
    split = [
        ddp.conditional_round(y[s], tight, p.keyed_rounding(NoiseSource.seeded(7, "c1"), ids[s]))
        for s in (slice(0, 7), slice(7, 30))
    ]
    assert rerounds > 0 and np.array_equal(first, np.vstack([r[0] for r in split]))
    assert sum(r[1] for r in split) == rerounds
