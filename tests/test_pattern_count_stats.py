"""Pattern counting (spec vfl-primitives §2.1-2.2, §5 checks 1-7) on the pure step functions.

Every tolerance is derived from the estimator's variance: z-scores against the known mean, and the
chi-square spread of a sample variance, sd(s²/σ²) = sqrt(2/(R-1)), for R fixed-seed repetitions.
"""

import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event

from rayfed.ldp.patterns import (
    exact_loss,
    one_hot,
    predicted_variance,
    product_sums,
    public_sample,
    raw_counts,
    rr_measurement,
)
from rayfed.privacy import (
    Budget,
    Neighbours,
    NoiseSource,
    PrivacyLedger,
    binary_randomized_response,
)
from rayfed.protocols.pattern_count.plan import synthetic_table

M_USERS, SIZE, V = 2000, 3, 2
RELATION = Neighbours("replace_one", "user's value", at_one_party=True)


def rr_event(eps_prime: float) -> dp_event.DpEvent:
    """The event of one party's release: randomized response on its one-hot values."""
    return rr_measurement("rr", eps_prime, SIZE, RELATION).event


def _data(m=M_USERS, parties=V, size=SIZE):
    table = synthetic_table(m, parties, size, 0.5, seed=1)
    return [one_hot(table.column(f"x{j}").to_numpy(), size) for j in range(parties)]


def _simulate(onehots, eps_prime, reps, sample_rate=1.0):
    """R independent runs of Alg. 1 / B.2 (new RR noise and, if sampling, a new public sample each)."""
    out = []
    for r in range(reps):
        sample = public_sample(1000 + r, onehots[0].shape[1], sample_rate)
        bits = [
            binary_randomized_response(
                NoiseSource.seeded(7, f"p{j}"),
                o[:, sample],
                keep_probability=0.5 + eps_prime,
                round=r,
            )[0]
            for j, o in enumerate(onehots)
        ]
        out.append(raw_counts(bits, eps_prime, None, sample_rate).ravel())
    return np.array(out)


def _party_context(table, j, seed, size=SIZE):
    from rayfed.actors.base import StepContext

    meta = {"columns": [f"x{j}"], "domains": {f"x{j}": size}, "size": size}
    return StepContext(name=f"p{j}", role="party", seed=seed, table=table, meta=meta)


def _releases(order, eps_prime, size):
    from rayfed.ldp.patterns import rr_measurement
    from rayfed.privacy import Neighbours

    relation = Neighbours("replace_one", "user's value", at_one_party=True)
    return {p: rr_measurement(f"{p}: RR", eps_prime, size, relation) for p in order}


def _simulate_steps(table, parties, eps_prime, reps, sample_rate):
    """R runs of the real step functions (party encode + RR + packbits, coordinator estimate)."""
    from rayfed.protocols.pattern_count.steps import estimate_step, randomize_step

    order = [f"p{j}" for j in range(parties)]
    out = []
    for r in range(reps):
        msgs = {
            p: randomize_step(
                _party_context(table, j, seed=500 + r),
                releases=_releases(order, eps_prime, SIZE),
                sample_rate=sample_rate,
                round=0,
            ).payload
            for j, p in enumerate(order)
        }
        raw = estimate_step(
            None, msgs, order=order, eps_prime=eps_prime, patterns=None, sample_rate=sample_rate
        )
        out.append(raw.ravel())
    return np.array(out)


def test_product_sums_equals_brute_force():
    gen = np.random.default_rng(0)
    mats = [gen.random((s, 40)) < 0.4 for s in (2, 3, 2)]
    base, scale = -1.5, 4.0
    full = product_sums(mats, base, scale, None)
    for rho in itertools.product(range(2), range(3), range(2)):
        brute = sum(
            math.prod(base + scale * mats[j][rho[j], i] for j in range(3)) for i in range(40)
        )
        assert full[rho] == pytest.approx(brute, rel=1e-12, abs=1e-9)
    patterns = np.array([[1, 2, 0], [0, 0, 1]])
    assert np.allclose(product_sums(mats, base, scale, patterns), [full[1, 2, 0], full[0, 0, 1]])


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 4.0])
def test_raw_estimate_is_unbiased_with_the_predicted_variance(epsilon):
    """§5 checks 1 and 2: z-test of the mean and chi-square test of the variance, all 9 patterns."""
    eps_prime, reps = epsilon / 16, 1500
    onehots = _data()
    raws = _simulate(onehots, eps_prime, reps)
    true = product_sums(onehots, 0.0, 1.0, None).ravel()
    var = predicted_variance(onehots, eps_prime, None, 1.0).ravel()
    z = (raws.mean(axis=0) - true) / np.sqrt(var / reps)
    assert np.all(np.abs(z) < 4), z  # 9 patterns, family-wise false alarm ~ 6e-4
    ratio = raws.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) < 4 * math.sqrt(2 / (reps - 1))), ratio


@pytest.mark.parametrize(
    "parties,sample_rate", [(2, 1.0), (3, 1.0), (2, 0.5)], ids=["v2", "v3", "v2-sampled"]
)
def test_step_functions_are_unbiased_with_the_predicted_variance(parties, sample_rate):
    """§5 checks 1-2 through the actual party and coordinator steps (v = 2 and 3, and Thm B.2)."""
    eps_prime, reps = 4.0 / 16, 600
    table = synthetic_table(600, parties, SIZE, 0.5, seed=2)
    onehots = [one_hot(table.column(f"x{j}").to_numpy(), SIZE) for j in range(parties)]
    raws = _simulate_steps(table, parties, eps_prime, reps, sample_rate)
    true = product_sums(onehots, 0.0, 1.0, None).ravel()
    var = predicted_variance(onehots, eps_prime, None, sample_rate).ravel()
    z = (raws.mean(axis=0) - true) / np.sqrt(var / reps)
    assert np.all(np.abs(z) < 4.5), z  # up to 27 patterns: family-wise false alarm ~ 2e-4
    ratio = raws.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) < 4.5 * math.sqrt(2 / (reps - 1))), ratio


def test_predicted_variance_formula_by_brute_force():
    """§5 check 2: Var(raw_ρ) = Σ_i [Π_j (c + a_ij) - Π_j a_ij], recomputed user by user; for v = 2
    it lies between m·c² and m·c² + 2mc, i.e. sd ≈ sqrt(m)(4/ε)² (spec: 9051, 566, 141 at m=2·10^4)."""
    m = 3000
    onehots = _data(m=m)
    for epsilon in (0.5, 2.0, 4.0):
        eps_prime = epsilon / 16
        c = 1 / (16 * eps_prime**2) - 0.25
        fast = predicted_variance(onehots, eps_prime, None, 1.0)
        for rho in itertools.product(range(SIZE), repeat=2):
            a = np.stack([onehots[j][rho[j]] for j in range(2)]).astype(float)
            brute = np.sum(np.prod(c + a, axis=0) - np.prod(a, axis=0))
            assert fast[rho] == pytest.approx(brute, rel=1e-12)
        assert np.all((fast >= m * c * c) & (fast <= m * c * c + 2 * m * c))


def test_sampled_variant_variance_and_sqrt_m_over_p_law():
    """§2.2 and §5 check 3: Var = Σ_i[(1/p)Π(c+a) - Πa]; sd grows as sqrt(m/p), measured."""
    eps_prime, reps, p = 2.0 / 16, 1500, 0.25
    onehots = _data()
    raws = _simulate(onehots, eps_prime, reps, sample_rate=p)
    true = product_sums(onehots, 0.0, 1.0, None).ravel()
    var = predicted_variance(onehots, eps_prime, None, p).ravel()
    z = (raws.mean(axis=0) - true) / np.sqrt(var / reps)
    assert np.all(np.abs(z) < 4), z
    ratio = raws.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) < 4 * math.sqrt(2 / (reps - 1))), ratio
    # the law, measured: the empirical sd at p = 1/4 over that at p = 1 is the predicted ratio
    # (≈ 2 = sqrt(1/p)); log(sd ratio) = log(var ratio)/2 has sd (1/2)·sqrt(2/(R-1) + 2/(R-1))
    full = _simulate(onehots, eps_prime, reps, sample_rate=1.0)
    predicted = np.sqrt(var / predicted_variance(onehots, eps_prime, None, 1.0).ravel())
    c = 1 / (16 * eps_prime**2) - 0.25  # Var(p)/Var(1) = (S/p - T)/(S - T), S >= m c², T <= m
    assert np.all(np.abs(predicted**2 - 1 / p) <= (1 / p - 1) / c)
    measured = np.sqrt(raws.var(axis=0, ddof=1) / full.var(axis=0, ddof=1))
    tol = 4 * 0.5 * math.sqrt(4 / (reps - 1))
    assert np.all(np.abs(np.log(measured / predicted)) < tol), measured
    # and in m: quadrupling the users doubles the predicted sd, to the same -Πa correction
    bigger = _data(m=4 * M_USERS)
    grown = predicted_variance(bigger, eps_prime, None, 1.0) / predicted_variance(
        onehots, eps_prime, None, 1.0
    )
    assert np.all(np.abs(grown - 4) <= 4 * 2 / c)


def test_every_party_sends_the_same_public_sample_of_users():
    """Thm B.2: S is common to all parties. With ε' = 1/2 - 10⁻⁹ (a flip per 10⁹ bits; ε' = 1/2
    itself adds no noise and is refused) the bits are the one-hot values, so each party's message
    must hold exactly its values of the users in S, in order."""
    from rayfed.protocols.pattern_count.steps import randomize_step

    table = synthetic_table(10_000, 2, SIZE, 0.5, seed=1)
    sample = public_sample(3, table.num_rows, 0.3)
    assert abs(sample.sum() - 3000) < 4 * math.sqrt(10_000 * 0.3 * 0.7)
    for j in range(2):
        msg = randomize_step(
            _party_context(table, j, seed=3),
            releases=_releases(["p0", "p1"], 0.5 - 1e-9, SIZE),
            sample_rate=0.3,
            round=0,
        )
        bits = np.unpackbits(msg.payload["bits"], axis=1, count=msg.payload["users"])
        assert msg.payload["users"] == sample.sum()
        assert np.array_equal(bits.argmax(axis=0), table.column(f"x{j}").to_numpy()[sample])
        assert bits.shape == (SIZE, sample.sum())  # exactly (M+1)·|S| bits (§5 check 7)


@pytest.mark.parametrize(
    "epsilon,spec", [(0.5, 0.2503), (1.0, 0.5026), (2.0, 1.0217), (4.0, 2.1972)]
)
def test_exact_privacy_loss_of_the_encoding(epsilon, spec):
    """§5 check 6: the exact loss 2 ln((1+2ε')/(1-2ε')) is <= ε; the ledger reports that value."""
    eps_prime = epsilon / 16
    assert exact_loss(eps_prime) == pytest.approx(spec, abs=5e-5)
    assert exact_loss(eps_prime) <= epsilon
    ledger = PrivacyLedger(Budget(epsilon))
    ledger.charge(rr_event(eps_prime), label="rr")
    assert ledger.spent()[0] == pytest.approx(exact_loss(eps_prime), rel=1e-12)
    # exact calibration spends exactly ε
    assert exact_loss(math.tanh(epsilon / 4) / 2) == pytest.approx(epsilon, rel=1e-12)


def test_log_likelihood_ratio_of_any_transcript_is_bounded_by_the_exact_loss():
    """§5 check 6, by enumeration: neighbours x=0 and x'=1 at one party of domain size 3 differ in two
    one-hot bits; over every output of that user's 3 bits the log-likelihood ratio is at most the
    exact loss, and attains it."""
    eps_prime = 1.0 / 16
    q = 0.5 + eps_prime

    def prob(out, true):
        return math.prod(q if o == t else 1 - q for o, t in zip(out, true, strict=True))

    a, a_prime = (1, 0, 0), (0, 1, 0)
    llrs = [
        abs(math.log(prob(out, a) / prob(out, a_prime)))
        for out in itertools.product((0, 1), repeat=3)
    ]
    assert max(llrs) == pytest.approx(exact_loss(eps_prime), rel=1e-12)
    # and the mechanism draws with those probabilities: frequency of output (1,0,0) given a
    n = 400_000
    bits, _ = binary_randomized_response(
        NoiseSource.seeded(0, "test"), np.tile(np.array(a, bool), (n, 1)), keep_probability=q
    )
    freq = np.mean(np.all(bits == np.array([1, 0, 0], bool), axis=1))
    expected = prob((1, 0, 0), a)
    assert abs(freq - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


def test_rr_event_is_two_binary_rr_bits():
    event = rr_event(1 / 16)
    assert isinstance(event, dp_event.SelfComposedDpEvent) and event.count == 2
    assert event.event.num_buckets == 2 and event.event.noise_parameter == pytest.approx(1 - 2 / 16)


def test_different_patterns_are_uncorrelated_and_sum_to_m():
    """§5 check 4: zero cross-pattern correlation; E[Σ_ρ raw_ρ] = m."""
    eps_prime, reps = 4.0 / 16, 1500
    onehots = _data()
    raws = _simulate(onehots, eps_prime, reps)
    corr = np.corrcoef(raws.T)
    off = corr[~np.eye(len(corr), dtype=bool)]
    assert np.max(np.abs(off)) < 4.5 / math.sqrt(
        reps
    )  # 72 off-diagonal entries, each sd ~ 1/sqrt(R)
    totals = raws.sum(axis=1)
    var_total = predicted_variance(
        onehots, eps_prime, None, 1.0
    ).sum()  # uncorrelated: variances add
    assert abs(totals.mean() - M_USERS) < 4 * math.sqrt(var_total / reps)
