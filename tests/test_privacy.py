import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event

from rayfed.errors import BudgetExceeded, ConfigError, UnaccountedNoise
from rayfed.privacy import (
    Budget,
    NoiseSource,
    PrivacyLedger,
    binary_randomized_response,
    discrete_laplace,
    distributed_gaussian,
    distributed_gaussian_event,
    gaussian,
    kary_randomized_response,
    laplace,
    local_randomizer,
    randomized,
    share_noise,
    split_discrete_laplace,
)

N = 200_000


def gen(i=0):
    """A seeded noise source, as a step's ctx.noise in a seeded run."""
    return NoiseSource.seeded(11, f"test-{i}")


def test_laplace_scale_and_event():
    out, event = laplace(gen(), np.zeros(N), l1_sensitivity=2.0, epsilon=0.5)
    assert event == dp_event.LaplaceDpEvent(noise_multiplier=2.0)
    b = 4.0  # scale = sensitivity / epsilon; Var = 2 b^2; sd of the sample variance ~ sqrt(20 b^4 / N)
    assert abs(out.var() - 2 * b * b) < 4 * math.sqrt(20 * b**4 / N)


def test_gaussian_event_is_noise_multiplier():
    out, event = gaussian(gen(), np.zeros(N), l2_sensitivity=0.5, noise_multiplier=4.0)
    assert event == dp_event.GaussianDpEvent(noise_multiplier=4.0)
    assert abs(out.std() - 2.0) < 4 * 2.0 / math.sqrt(2 * N)


def test_discrete_laplace_distribution():
    eps = 0.7
    out, event = discrete_laplace(gen(), np.zeros(N, dtype=np.int64), l1_sensitivity=1, epsilon=eps)
    assert event == dp_event.DiscreteLaplaceDpEvent(noise_parameter=eps, sensitivity=1)
    assert out.dtype == np.int64
    # P(0) = tanh(a/2) for DLap(a)
    p0 = math.tanh(eps / 2)
    assert abs(np.mean(out == 0) - p0) < 4 * math.sqrt(p0 * (1 - p0) / N)


@pytest.mark.parametrize("parts,added", [(3, 3), (2, 5)])
def test_split_discrete_laplace_shares_sum_to_the_central_noise(parts, added):
    """``parts`` shares sum to exactly DLap(a): the pmf at -3..3 matches (1-r)/(1+r)·r^|z|,
    r = e^-a, within 4 binomial sd; ``added`` > parts shares carry added/parts times its
    variance 2r/(1-r)² (4 sd of the sample variance, from the empirical fourth moment)."""
    eps, n = 0.7, 100_000
    zeros = np.zeros(n, dtype=np.int64)
    shares = []
    for i in range(added):
        out, event = split_discrete_laplace(
            gen(i), zeros, l1_sensitivity=1, epsilon=eps, parts=parts
        )
        assert event == dp_event.DiscreteLaplaceDpEvent(noise_parameter=eps, sensitivity=1)
        shares.append(out)
    r = math.exp(-eps)
    total = np.sum(shares[:parts], axis=0)
    for z in range(-3, 4):
        pmf = (1 - r) / (1 + r) * r ** abs(z)
        assert abs(np.mean(total == z) - pmf) < 4 * math.sqrt(pmf * (1 - pmf) / n)
    everything = np.sum(shares, axis=0).astype(np.float64)
    var = added / parts * 2 * r / (1 - r) ** 2
    sd = math.sqrt((np.mean(everything**4) - var**2) / n)
    assert abs(np.mean(everything**2) - var) < 4 * sd


def test_split_discrete_laplace_refuses_bad_parts():
    with pytest.raises(ConfigError, match="parts"):
        split_discrete_laplace(gen(), np.zeros(2, np.int64), l1_sensitivity=1, epsilon=1.0, parts=0)


def test_binary_rr_flip_rate_and_event():
    q = 0.7
    bits = np.ones(N, dtype=bool)
    out, event = binary_randomized_response(gen(), bits, keep_probability=q)
    assert event.num_buckets == 2 and event.noise_parameter == pytest.approx(0.6)
    assert abs(out.mean() - q) < 4 * math.sqrt(q * (1 - q) / N)


def test_kary_rr_keep_rate_and_event():
    k, eps = 5, 1.0
    values = np.zeros(N, dtype=np.int64)
    out, event = kary_randomized_response(gen(), values, k=k, epsilon=eps)
    keep = math.exp(eps) / (math.exp(eps) + k - 1)
    assert abs(np.mean(out == 0) - keep) < 4 * math.sqrt(keep * (1 - keep) / N)
    ledger = PrivacyLedger(Budget(1.0))
    ledger.charge(event, label="grr")
    assert ledger.spent()[0] == pytest.approx(eps)


def test_every_mechanism_registers_the_event_it_returns():
    noise = gen()
    noise.begin_step()
    events = [
        laplace(noise, np.zeros(3), l1_sensitivity=1.0, epsilon=1.0)[1],
        gaussian(noise, np.zeros(3), l2_sensitivity=1.0, noise_multiplier=2.0)[1],
        discrete_laplace(noise, np.zeros(3, np.int64), l1_sensitivity=1, epsilon=1.0)[1],
        split_discrete_laplace(
            noise, np.zeros(3, np.int64), l1_sensitivity=1, epsilon=1.0, parts=2
        )[1],
        binary_randomized_response(noise, np.ones(3, bool), keep_probability=0.7)[1],
        kary_randomized_response(noise, np.zeros(3, np.int64), k=3, epsilon=1.0)[1],
        local_randomizer(
            noise,
            lambda v, eps, u: v + u[:, 0],
            np.zeros(3),
            epsilon=1.0,
            ids=np.arange(3),
            width=1,
        )[1],
        distributed_gaussian(
            noise,
            np.zeros((3, 2)),
            ids=np.arange(3),
            l2_sensitivity=1.0,
            noise_multiplier=1.0,
            share=0.5,
            quorum=2,
        )[1],
        randomized(noise, lambda gen: gen.random(3), epsilon=1.0, delta=1e-6, purpose="sketch")[1],
    ]
    assert noise.events == events


def test_two_draws_of_one_mechanism_in_an_actor_never_reuse_noise():
    noise = gen()
    a, _ = laplace(noise, np.zeros(100), l1_sensitivity=1.0, epsilon=1.0)
    b, _ = laplace(noise, np.zeros(100), l1_sensitivity=1.0, epsilon=1.0)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("randomness", ["seeded", "secure"])
def test_seeded_noise_regenerates_from_the_seed_and_secure_noise_does_not(randomness):
    """What the coordinator holding the run seed can rebuild: every draw of a seeded run, none of
    a secure one."""
    actor = NoiseSource(randomness, 7, "c0")
    drawn, _ = laplace(actor, np.zeros(1000), l1_sensitivity=1.0, epsilon=1.0)
    attacker = NoiseSource.seeded(7, "c0")
    rebuilt, _ = laplace(attacker, np.zeros(1000), l1_sensitivity=1.0, epsilon=1.0)
    assert np.array_equal(drawn, rebuilt) == (randomness == "seeded")


def test_distributed_gaussian_shares_sum_to_the_charged_noise():
    """n users' shares N(0, ζσ²) sum to variance nζσ²; the event credits at most σ (ζn >= 1 here)
    and is reduced to sqrt(F) when the quorum's F < 1."""
    n, d, z, zeta = 50, 20_000, 3.0, 1 / 40
    ids = np.arange(n)
    noise = gen()
    out, event = distributed_gaussian(
        noise,
        np.zeros((n, d)),
        ids=ids,
        l2_sensitivity=1.0,
        noise_multiplier=z,
        share=zeta,
        quorum=40,
    )
    assert event == dp_event.GaussianDpEvent(z)  # F = 40 x 1/40 = 1
    total = out.sum(axis=0)
    assert abs(total.var() / (n * zeta * z**2) - 1) < 4 * math.sqrt(2 / d)
    again = dict(l2_sensitivity=1.0, noise_multiplier=z, share=zeta)
    with pytest.raises(UnaccountedNoise, match="twice in round 0"):
        share_noise(noise, ids, d, **again)  # a second release on the same noise is refused
    regenerated = share_noise(noise, ids, d, **again, regenerate=True)
    assert np.array_equal(regenerated, out)  # the user cancels its own share in Round 2
    weak = distributed_gaussian_event(z, share=zeta, quorum=40, replacement=zeta)
    assert weak.noise_multiplier == pytest.approx(z * math.sqrt(0.5))  # F = 40·ζ²/(2ζ) = 1/2


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_mechanisms_reject_bad_epsilon(bad):
    with pytest.raises(ConfigError, match="epsilon"):
        laplace(gen(), np.zeros(3), l1_sensitivity=1.0, epsilon=bad)


@pytest.mark.parametrize(
    "eps,delta,field",
    [
        (0, 1e-6, "epsilon"),
        (-1, 0, "epsilon"),
        (1, 1.0, "delta"),
        (1, -0.1, "delta"),
        (float("nan"), 0, "epsilon"),
    ],
)
def test_budget_rejects_bad_values(eps, delta, field):
    with pytest.raises(ConfigError, match=field):
        Budget(eps, delta)


def test_ledger_refuses_before_recording_and_totals_match():
    ledger = PrivacyLedger(Budget(1.0), accountant="pure")
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="a")  # eps 0.5
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=4.0), label="b")  # eps 0.25
    with pytest.raises(BudgetExceeded, match="would bring epsilon to 1.25"):
        ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="c")
    assert [e.label for e in ledger.entries] == ["a", "b"]
    assert ledger.spent() == pytest.approx((0.75, 0.0))
    ledger.charge(
        dp_event.LaplaceDpEvent(noise_multiplier=4.0), label="d"
    )  # exactly the budget: allowed
    report = ledger.report()
    assert report.epsilon == pytest.approx(1.0)
    assert report.entries[-1]["epsilon_after"] == pytest.approx(1.0)


def test_charge_all_records_all_or_nothing():
    """Three charges in one call, the third over budget: nothing of the call is recorded, in any
    scope, and the ledger charges on from where it was (0.5 in p0, 0 in p1)."""
    ledger = PrivacyLedger(Budget(1.0), composition="parallel")
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="a", scope="p0")
    lap = dp_event.LaplaceDpEvent
    with pytest.raises(BudgetExceeded):
        ledger.charge_all(
            [("p1", "b", lap(2.0)), ("run", "c", lap(4.0)), ("p0", "d", lap(2.0))], round=1
        )
    assert [e.label for e in ledger.entries] == ["a"]
    assert ledger.report().per_scope == pytest.approx({"p0": 0.5})
    entries = ledger.charge_all([("p1", "b", lap(2.0)), ("run", "c", lap(4.0))], round=1)
    assert [e.epsilon_after for e in entries] == pytest.approx([0.5, 0.75])  # p1; then p0 + run
    assert ledger.report().per_scope == pytest.approx({"p0": 0.75, "p1": 0.75, "run": 0.25})


def test_parallel_scopes_take_the_worst_scope():
    ledger = PrivacyLedger(Budget(1.0), composition="parallel")
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="x", scope="p0")
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=1.25), label="x", scope="p1")
    assert ledger.spent() == pytest.approx((0.8, 0.0))
    assert ledger.report().per_scope == pytest.approx({"p0": 0.5, "p1": 0.8})
    with pytest.raises(BudgetExceeded):
        ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="y", scope="p1")
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="y", scope="p0")


def test_rdp_ledger_matches_dp_accounting():
    from dp_accounting import rdp

    event = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.1))
    ledger = PrivacyLedger(Budget(10.0, 1e-5), accountant="rdp", relation="add_or_remove_one")
    for r in range(100):
        ledger.charge(event, label="step", round=r)
    direct = rdp.RdpAccountant().compose(event, 100).get_epsilon(1e-5)
    assert ledger.spent()[0] == pytest.approx(direct)
    assert ledger.report().delta == 1e-5


def test_pure_ledger_rejects_gaussian_clearly():
    ledger = PrivacyLedger(Budget(1.0, 1e-5), accountant="pure")
    with pytest.raises(Exception, match="pure accountant cannot account"):
        ledger.charge(dp_event.GaussianDpEvent(1.0), label="g")


def test_parallel_run_scope_events_count_in_every_scope():
    """An event in scope "run" touches every party's data: it composes into each parallel scope."""
    ledger = PrivacyLedger(Budget(1.0), composition="parallel")
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="party", scope="p0")  # 0.5
    ledger.charge(
        dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="everyone", scope="run"
    )  # 0.5
    assert ledger.spent() == pytest.approx((1.0, 0.0))
    ledger.charge(
        dp_event.LaplaceDpEvent(noise_multiplier=4.0), label="late", scope="p1"
    )  # run + 0.25
    assert ledger.report().per_scope == pytest.approx({"p0": 1.0, "p1": 0.75, "run": 0.5})
    with pytest.raises(BudgetExceeded, match="'run'"):
        ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=10.0), label="more", scope="run")


def test_delta_overrun_says_delta():
    ledger = PrivacyLedger(Budget(1.0, 1e-6))
    from rayfed.privacy import EpsilonDeltaDpEvent

    with pytest.raises(BudgetExceeded, match="delta above"):
        ledger.charge(EpsilonDeltaDpEvent(0.1, 1e-5), label="dp-subroutine")


def test_report_holds_the_composed_event():
    ledger = PrivacyLedger(Budget(1.0))
    ledger.charge(dp_event.LaplaceDpEvent(noise_multiplier=2.0), label="a")
    composed = ledger.report().composed_event
    assert composed["class_name"] == "ComposedDpEvent"
    assert composed["events"][0]["noise_multiplier"] == 2.0
    # dp-accounting's own named-tuple round trip rebuilds the event from the JSON form
    from rayfed.privacy import event_from_dict

    rebuilt = event_from_dict(json.loads(json.dumps(composed)))
    assert rebuilt == dp_event.ComposedDpEvent([dp_event.LaplaceDpEvent(noise_multiplier=2.0)])
    with pytest.raises(ValueError, match="not a privacy event"):
        event_from_dict({**composed, "module_name": "os"})


def test_gaussian_calibration_meets_the_target_and_no_less_noise_would():
    from rayfed.privacy.calibration import gaussian_noise_multiplier, gaussian_steps_event
    from rayfed.privacy.ledger import make_accountant

    def eps(kind, z):
        acc = make_accountant(kind, "add_or_remove_one")
        return acc.compose(gaussian_steps_event(z, 1000, 0.01)).get_epsilon(1e-5)

    z = gaussian_noise_multiplier(1.0, 1e-5, steps=1000, sampling_rate=0.01)
    assert eps("rdp", z) <= 1.0 + 1e-3 and eps("rdp", z * 0.99) > 1.0
    assert eps("pld", z) <= eps("rdp", z)  # the declared PLD accountant can only report less
    ledger = PrivacyLedger(Budget(1.0, 1e-5), accountant="rdp", relation="add_or_remove_one")
    ledger.charge(gaussian_steps_event(z, 1000, 0.01), label="dp-sgd")
    assert ledger.spent()[0] == pytest.approx(eps("rdp", z))
    with pytest.raises(ConfigError, match="delta > 0"):
        gaussian_noise_multiplier(1.0, 0.0, steps=10)


@pytest.mark.parametrize(
    "epsilon,steps,rate,z",
    [
        (1.0, 1000, 0.01, 1.513),
        (4.0, 1000, 0.01, 0.778),
        (1.0, 10, 1.0, 12.79),
        (4.0, 10, 1.0, 3.661),
    ],
)
def test_calibration_reproduces_the_spec_z_table(epsilon, steps, rate, z):
    """federated-mf spec §3.2 / check C4 (δ = 1e-5): z within 1 %."""
    from rayfed.privacy.calibration import gaussian_noise_multiplier

    assert gaussian_noise_multiplier(
        epsilon, 1e-5, steps=steps, sampling_rate=rate
    ) == pytest.approx(z, rel=0.01)


def test_accountant_reproduces_check_c4():
    from rayfed.privacy.calibration import gaussian_steps_event
    from rayfed.privacy.ledger import make_accountant

    acc = make_accountant("rdp", "add_or_remove_one").compose(gaussian_steps_event(1.1, 1000, 0.01))
    assert acc.get_epsilon(1e-5) == pytest.approx(1.712, rel=0.01)


# --- the noise-origin check compares whole events -------------------------------------------------
def _step() -> NoiseSource:
    source = NoiseSource.seeded(3, "p0")
    source.begin_step()
    return source


def test_two_draws_under_one_charge_are_refused():
    """Two Gaussian releases carried as one event: the second draw is carried by nothing (the
    audit's "ledger ε 2.17" case, which a comparison of leaf events let through)."""
    source = _step()
    _, event = gaussian(source, np.zeros(3), l2_sensitivity=1.0, noise_multiplier=1.0)
    gaussian(source, np.zeros(3), l2_sensitivity=1.0, noise_multiplier=1.0)
    source.check_carried(event, "a message")
    with pytest.raises(UnaccountedNoise, match="no message carries it"):
        source.check_all_carried([event])
    source.check_all_carried([dp_event.SelfComposedDpEvent(event, 2)])  # both carried: fine


def test_a_multiplicity_no_draw_backs_is_refused():
    source = _step()
    _, event = gaussian(source, np.zeros(3), l2_sensitivity=1.0, noise_multiplier=1.0)
    with pytest.raises(UnaccountedNoise, match="did not draw"):
        source.check_carried(dp_event.SelfComposedDpEvent(event, 2), "a message")
    with pytest.raises(UnaccountedNoise, match="do not make it up"):
        source.check_all_carried([dp_event.SelfComposedDpEvent(event, 2)])


def test_a_sampling_claim_needs_a_sample_drawn_at_its_rate():
    """A release claiming Poisson sampling at q = 0.001 that it never drew (the audit's "ε 0.12"
    case) is refused where it registers; with the sample drawn at that rate it passes."""
    from rayfed.privacy import Gaussian, Interval, Measurement, Neighbours

    m = Measurement(
        "sampled sum",
        Gaussian(2.0),
        Interval(0.0, 1.0),
        Neighbours("add_or_remove_one", "user"),
        sampling=0.001,
    )
    source = _step()
    with pytest.raises(UnaccountedNoise, match="no sample at that rate"):
        m(source, np.zeros(2))
    source = _step()
    source.poisson_sample(0.01, 100)  # another rate backs nothing here
    with pytest.raises(UnaccountedNoise, match="no sample at that rate"):
        m(source, np.zeros(2))
    source = _step()
    mask = m.sample(source, 1000)
    assert mask.dtype == bool and mask.shape == (1000,)
    _, event = m(source, np.zeros(2))
    assert event == dp_event.PoissonSampledDpEvent(0.001, dp_event.GaussianDpEvent(2.0))
    source.check_all_carried([event])
    with pytest.raises(UnaccountedNoise, match="no sample at that rate"):
        m(source, np.zeros(2))  # one sample backs one release


def test_part_of_names_a_declared_release():
    source = _step()
    with pytest.raises(TypeError, match="declared release"):
        gaussian(source, np.zeros(2), l2_sensitivity=1.0, noise_multiplier=1.0, part_of="free text")


# --- tight accounting -----------------------------------------------------------------------------
def test_tightest_reports_the_smaller_of_pld_and_rdp_each_computed_independently():
    """A DP-SGD composition: dp-accounting's own PLD and RDP accountants, built here, give the
    two values; the ledger reports the smaller (PLD here, 3.2x below RDP) and names it."""
    from dp_accounting import pld, rdp
    from dp_accounting.privacy_accountant import NeighboringRelation

    step = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(0.698))
    event = dp_event.SelfComposedDpEvent(step, 6)
    rel = NeighboringRelation.ADD_OR_REMOVE_ONE
    want_pld = pld.PLDAccountant(rel).compose(event).get_epsilon(1 / 3000)
    want_rdp = rdp.RdpAccountant(neighboring_relation=rel).compose(event).get_epsilon(1 / 3000)
    ledger = PrivacyLedger(
        Budget(1.0, 1 / 3000), accountant="tightest", relation="add_or_remove_one"
    )
    ledger.charge(event, label="six steps")
    report = ledger.report()
    assert report.epsilon == pytest.approx(want_pld, rel=1e-6) and want_pld < want_rdp / 3
    assert report.accountant_used == "pld"
    assert report.epsilon_by_accountant["rdp"] == pytest.approx(want_rdp, rel=1e-9)
    assert "tightest: pld; rdp gives" in report.summary()


def test_the_group_sampled_gaussian_has_the_tagged_mixtures_pld():
    """One rating of a Poisson-sampled user: δ(ε) = q·δ_Gauss(ε) exactly (Balle–Wang's δ of
    the Gaussian, written independently in calibration.gaussian_delta)."""
    from dp_accounting.privacy_accountant import NeighboringRelation

    from rayfed.privacy.calibration import gaussian_delta
    from rayfed.privacy.ledger import MemoPldAccountant, UnitInSampledGroupGaussianDpEvent

    acc = MemoPldAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(UnitInSampledGroupGaussianDpEvent(0.1, 1.5))
    for eps in (0.5, 1.0, 2.0):
        assert acc.get_delta(eps) == pytest.approx(0.1 * gaussian_delta(1.5, eps), rel=1e-6)


@pytest.mark.parametrize("eps,steps,rate", [(1.0, 6, 0.01), (1.0, 5, 1.0), (4.0, 1000, 0.01)])
def test_tightest_calibration_meets_the_target_and_less_noise_would_not(eps, steps, rate):
    """The calibrated z is below RDP's; dp-accounting's PLD accountant, built here, certifies
    it within ε, and 0.5 % less noise exceeds ε under both accountants."""
    from dp_accounting import pld, rdp
    from dp_accounting.privacy_accountant import NeighboringRelation

    from rayfed.privacy.calibration import gaussian_noise_multiplier, gaussian_steps_event

    rel = NeighboringRelation.ADD_OR_REMOVE_ONE
    z_rdp = gaussian_noise_multiplier(eps, 1e-5, steps=steps, sampling_rate=rate)
    z = gaussian_noise_multiplier(eps, 1e-5, steps=steps, sampling_rate=rate, accountant="tightest")
    assert z < z_rdp
    at = lambda z: pld.PLDAccountant(rel).compose(gaussian_steps_event(z, steps, rate))  # noqa: E731
    assert at(z).get_epsilon(1e-5) <= eps * (1 + 1e-9)
    assert at(0.995 * z).get_epsilon(1e-5) > eps
    rdp_less = rdp.RdpAccountant(neighboring_relation=rel)
    assert rdp_less.compose(gaussian_steps_event(0.995 * z, steps, rate)).get_epsilon(1e-5) > eps


def test_two_releases_never_share_a_users_keyed_noise():
    """The review's case: two Gaussian releases keyed by user id in one round and purpose would
    draw the same noise, and their difference would be noise-free. The second draw is refused;
    another round, another purpose or other users draw fresh noise."""
    from rayfed.privacy import Gaussian, Interval, Measurement, Neighbours

    relation = Neighbours("replace_one", "user")
    a = Measurement("a", Gaussian(1.0), Interval(0, 1), relation)
    b = Measurement("b", Gaussian(2.0), Interval(0, 1), relation)
    source = _step()
    ids = np.arange(4)
    a(source, np.zeros((4, 2)), ids=ids, round=3)
    with pytest.raises(UnaccountedNoise, match="twice in round 3"):
        b(source, np.ones((4, 2)), ids=ids, round=3)
    b(source, np.ones((4, 2)), ids=np.arange(4, 8), round=3)  # other users: fresh
    b(source, np.ones((4, 2)), ids=ids, round=4)  # another round: fresh
    c = Measurement("c", Gaussian(2.0, purpose="another"), Interval(0, 1), relation)
    c(source, np.ones((4, 2)), ids=ids, round=3)  # another purpose: fresh


def test_tightest_gives_pld_the_add_remove_pair_only_for_unsampled_additive_releases():
    """Under replace-one, an unsampled Gaussian goes to PLD as the add/remove pair at Δ (the
    exact Gaussian loss, Balle–Wang, written in calibration.gaussian_delta); a mixture of
    Gaussians (sampling in its fields) is not the add/remove pair and gets no PLD (the review's
    ε 0.91 where the truth is ~11)."""
    from dp_accounting.privacy_accountant import NeighboringRelation
    from scipy import optimize

    from rayfed.privacy.calibration import gaussian_delta
    from rayfed.privacy.ledger import TightestAccountant

    replace = NeighboringRelation.REPLACE_ONE
    acc = TightestAccountant(replace)
    acc.compose(dp_event.GaussianDpEvent(2.0))
    exact = optimize.brentq(lambda e: gaussian_delta(2.0, e) - 1e-5, 0, 50)
    assert acc.used(1e-5) == "pld"
    assert exact <= acc.get_epsilon(1e-5) <= exact * 1.001
    mixture = dp_event.MixtureOfGaussiansDpEvent(1.0, (10.0, 11.0), (0.99, 0.01))
    assert not TightestAccountant(replace).supports(dp_event.SelfComposedDpEvent(mixture, 200))


def test_per_bit_and_per_report_randomizers_are_refused_under_add_remove():
    from rayfed.privacy import KaryResponse, Measurement, Neighbours, OneHot, RandomizedResponse

    add = Neighbours("add_or_remove_one", "user")
    for mechanism in (RandomizedResponse(0.75), KaryResponse(4, 1.0)):
        with pytest.raises(ValueError, match="replace-one neighbours only"):
            Measurement("r", mechanism, OneHot(4), add)


def test_a_domain_holds_no_nan_and_counts_it_outside():
    from rayfed.errors import DataError
    from rayfed.privacy import Interval, enforce

    for policy in ("clip", "refuse"):
        with pytest.raises(DataError, match="NaN"):
            enforce(np.array([0.5, np.nan]), Interval(0, 1), policy, "data.x", "out_of_domain")
    assert Interval(0, 1).clip(np.array([0.5, np.nan, 2.0]))[1] == 2


def test_a_sample_backs_a_release_only_with_units_and_can_be_keyed_by_user():
    source = _step()
    with pytest.raises(UnaccountedNoise, match="no units"):
        source.poisson_sample(0.5, 0)
    ids = np.arange(10, 20)
    a = source.poisson_sample(0.5, 0, ids=ids, purpose="user-sample")
    b = _step().poisson_sample(0.5, 0, ids=ids[::-1], purpose="user-sample")[::-1]
    assert np.array_equal(a, b)  # a user's membership is its own, wherever it is hosted


def test_the_noiseless_probe_is_refused_outside_a_test(monkeypatch):
    from rayfed.privacy import source

    monkeypatch.setattr(source, "_PROBE", object())
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    with pytest.raises(RuntimeError, match="tests only"):
        NoiseSource.seeded(1)


def test_a_local_report_refuses_an_input_outside_its_domain():
    """The review's mutant: square-wave's variance half without the μ̃ clamp fed 2(v − μ̃)² − 1
    up to 8.5 into a randomizer declared on [−1, 1], whose ε then did not hold (SR's ratio
    exceeded e^ε). The measurement refuses such an input: a protocol defect, never clipped."""
    from rayfed.privacy import Interval, LocalReport, Measurement, Neighbours

    def identity(values, *, eps, u):
        return np.asarray(values) + 0 * u[:, 0]

    m = Measurement(
        "half", LocalReport(1.0, identity, 1), Interval(-1, 1), Neighbours("replace_one", "user")
    )
    source = _step()
    m(source, np.array([-1.0, 0.3, 1.0]), ids=np.arange(3))
    with pytest.raises(ValueError, match="outside its declared domain"):
        m(_step(), np.array([0.2, 8.5]), ids=np.arange(2))


def test_a_subroutines_event_is_refused_under_another_relation():
    """The review's mutant: a DPLSF charged as one add/remove run under a replace-one relation
    passes the sensitivity check (which sees Δ₀ = 1 row) while its replace-one loss is twice
    the charge. A Subroutine names the relation its event holds for; another is refused."""
    from rayfed.privacy import Declared, Interval, Measurement, Neighbours, Subroutine

    sub = Subroutine(lambda noise, x, round: x, dp_event.LaplaceDpEvent(2.0), "add_or_remove_one")
    declared = Declared(1, "one point added or removed")
    Measurement(
        "dp", sub, Interval(0, 1), Neighbours("add_or_remove_one", "point"), declared=declared
    )
    with pytest.raises(ValueError, match="holds for add_or_remove_one neighbours"):
        Measurement(
            "dp", sub, Interval(0, 1), Neighbours("replace_one", "point"), declared=declared
        )


def test_a_bounded_move_on_a_domain_without_dimension_takes_its_diameter():
    """Neighbours.within on a one-hot or bit domain: its ℓ1 move is the diameter (a category
    swap moves two entries by 1: Δ₁ = 2), not the move's length."""
    from rayfed.privacy import Bits, Neighbours, OneHot, sensitivity

    within = Neighbours("replace_one", "value", within=1.5)
    assert sensitivity(OneHot(4), within, 1) == 2.0
    assert sensitivity(Bits(8), Neighbours("replace_one", "v", within=2.0), 1) == 8.0
