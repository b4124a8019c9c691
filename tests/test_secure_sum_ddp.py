"""secure-sum's private mean estimation (dp_mechanism = gaussian | ddg | skellam).

References are computed here, outside the protocol: the released mean's MSE against the variance
predicted from the calibrated share and the exact rounding variance of the users' rows; the ε
from the papers' RDP curves (written here) converted by dp-accounting; the pipeline's Δ₂ from
Kairouz et al.'s bound; the quorum the event assumes against the secure-aggregation parameters.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp

import rayfed
from rayfed.errors import ConfigError
from rayfed.privacy import NoiseSource, event_from_dict
from rayfed.privacy.ledger import DistributedDiscreteGaussianDpEvent, SkellamDpEvent

ORDERS = np.asarray(rdp.DEFAULT_RDP_ORDERS, dtype=float)
BASE = dict(backend="local", out_dir=None, seed=3, users=60, cohorts=2, epsilon=1.0)
#: ⌈γn⌉ users colluding with the server at the default corrupt_fraction γ = 0.05, n = 60
COLLUDING = math.ceil(Fraction("0.05") * 60)


def _run(**options):
    return rayfed.run("secure-sum", **{**BASE, **options})


def _event(result):
    (entry,) = result.privacy.entries
    skip = ("round", "scope", "label", "epsilon_after")
    return event_from_dict({k: v for k, v in entry.items() if k not in skip})


def _rdp_curve(event) -> np.ndarray:
    """The papers' RDP curves at ⌈α⌉ (Kairouz, Liu & Steinke 2021 Prop. 14; Agarwal, Kairouz &
    Liu 2021 Thm 3.5), written here."""
    a = np.ceil(ORDERS)
    if isinstance(event, SkellamDpEvent):
        mu, l2, l1 = event.variance, event.l2_sensitivity, event.l1_sensitivity
        return a * l2**2 / (2 * mu) + np.minimum(
            ((2 * a - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu)
        )
    n, s2, d = event.num_shares, event.sigma2, event.dim
    tau = 10 * sum(math.exp(-2 * math.pi**2 * s2 * k / (k + 1)) for k in range(1, n))
    x, y = event.l2_sensitivity / math.sqrt(n * s2), event.l1_sensitivity / math.sqrt(n * s2)
    return np.minimum.reduce(
        [
            a * x**2 / 2 + tau * d,
            a / 2 * (x**2 + 2 * y * tau + tau**2 * d),
            a / 2 * (x + math.sqrt(d) * tau) ** 2,
        ]
    )


def _rows(plan_table, survivors, dim):
    rows = np.searchsorted(plan_table.column("user_id").to_numpy(), survivors)
    return np.column_stack([plan_table.column(f"x{j}").to_numpy()[rows] for j in range(dim)])


def _plan(options):
    from rayfed.api import _prepare, _reconcile, resolve

    proto, run_opts, cfg = resolve("secure-sum", {**BASE, **options})
    cfg, run_opts = _reconcile(proto, cfg, run_opts)
    return _prepare(proto, cfg, run_opts)[0]


# --- utility: the released mean's MSE is the predicted variance -------------------------------------
@pytest.mark.parametrize("mechanism", ["ddg", "skellam"])
def test_released_mean_mse_matches_the_predicted_variance(mechanism):
    """MSE over d = 1,024 coordinates against (|U3|·share + Σ_users mean_j p_j(1 − p_j))/(γ|U3|)²,
    p_j the fractional parts the users' rounding sees (computed here from the plan's rows, the
    public rotation and γ). The decoded error is the rotation of independent per-coordinate
    errors: ≈ iid, so the MSE estimator's sd is ≈ v·√(2/d); tolerance 4 sd."""
    options = dict(dp_mechanism=mechanism, dim=1024, mode="dealer", bits=20)
    result = _run(**options)
    plan = _plan(options)
    dp = plan.params.dp
    p = dp.pipeline
    m = result.metrics
    s = m["survivors"]
    ids = np.sort(
        np.concatenate([t.column("user_id").to_numpy() for t, _ in plan.cohorts.values()])
    )
    x = _rows(plan.evaluation.table, ids, 1024)
    y = p.rotate(p.clip_rows(x)[0]) * p.gamma
    frac = y - np.floor(y)
    rounding = float(np.sum(np.mean(frac * (1 - frac), axis=1)))
    share = m["share_variance"]
    predicted = (s * share + rounding) / (p.gamma * s) ** 2
    tolerance = 4 * predicted * math.sqrt(2 / 1024)
    assert abs(m["mse"] - predicted) <= tolerance, (m["mse"], predicted, tolerance)
    # the central Gaussian beside it is (z·clip/|U3|)², evaluation only
    assert m["central_gaussian_mse_evaluation_only"] == pytest.approx(
        (m["central_noise_multiplier"] / s) ** 2
    )


def test_gaussian_mean_mse_matches_the_predicted_variance():
    """The continuous comparison: |U3| shares of N(0, (zΔ)²/q) each, fixed-point rounding
    (2^-16) negligible."""
    result = _run(dp_mechanism="gaussian", dim=1024, mode="dealer")
    m = result.metrics
    predicted = m["survivors"] * (m["noise_multiplier"] ** 2 / m["quorum"]) / m["survivors"] ** 2
    assert abs(m["mse"] - predicted) <= 4 * predicted * math.sqrt(2 / 1024)


# --- the ledger: ε within the target, equal to an independent recomputation ------------------------
@pytest.mark.parametrize("mechanism", ["ddg", "skellam"])
def test_ledger_epsilon_is_the_papers_rdp_at_the_quorum(mechanism):
    result = _run(dp_mechanism=mechanism, dim=8)
    m = result.metrics
    report = result.privacy
    delta = 1 / 60**2
    assert report.budget_delta == pytest.approx(delta)
    event = _event(result)
    assert m["colluding_users"] == COLLUDING == 3
    honest = m["min_survivors"] - COLLUDING
    # the event assumes q = min_survivors − ⌈γn⌉ honest shares (the worst accepted outcome: the
    # colluding users know theirs), Δ₂ the rounded
    # norm bound at the plan's γ (Kairouz et al.: min(γc + √m, √((γc)² + m/4 + √(2 ln 1/β)(γc +
    # √m/2))), β = 1e-6), Δ₁ = min(⌊√m·Δ₂⌋, ⌊Δ₂²⌋)
    g, mdim = m["gamma"], m["padded_dim"]
    bound = min(
        g + math.sqrt(mdim),
        math.sqrt(g**2 + mdim / 4 + math.sqrt(2 * math.log(1e6)) * (g + math.sqrt(mdim) / 2)),
    )
    l2 = math.sqrt(math.floor(bound**2))
    assert event.l2_sensitivity == pytest.approx(l2, rel=1e-12)
    assert event.l1_sensitivity == min(math.floor(math.sqrt(mdim) * l2), math.floor(l2**2))
    if mechanism == "skellam":
        assert isinstance(event, SkellamDpEvent)
        assert event.variance == pytest.approx(honest * m["share_variance"])
    else:
        assert isinstance(event, DistributedDiscreteGaussianDpEvent)
        assert event.num_shares == honest
        assert event.dim == mdim
    eps = rdp.compute_epsilon(ORDERS, _rdp_curve(event), delta)[0]
    assert report.epsilon == pytest.approx(eps, rel=1e-9)
    assert report.epsilon <= 1.0 * (1 + 1e-9)
    assert report.epsilon >= 0.97  # calibrated, not merely safe
    assert m["epsilon_charged"] == pytest.approx(report.epsilon, rel=1e-9)


def test_fewer_survivors_the_event_still_holds():
    """Dropouts before the masked input: |U3| < n, yet ≥ min_survivors, so the sum still holds at
    least the q = min_survivors shares the event assumes; the charge is the same event as without
    dropouts, and the mean divides by |U3|."""
    full = _run(dp_mechanism="skellam", dim=8)
    lost = _run(dp_mechanism="skellam", dim=8, population={"rates": {"masked_input": 0.25}})
    s = lost.metrics["survivors"]
    q = lost.metrics["min_survivors"]
    assert q <= s < 60
    assert _event(lost) == _event(full)
    assert lost.privacy.epsilon == full.privacy.epsilon
    # the noise in the sum the colluding users cannot subtract: s − c shares, at least the
    # quorum's
    assert (s - COLLUDING) * lost.metrics["share_variance"] >= _event(lost).variance * (1 - 1e-12)
    assert lost.metrics["predicted_mse"] == pytest.approx(
        (s * lost.metrics["share_variance"] + s / 4) / (lost.metrics["gamma"] * s) ** 2
    )


def test_none_is_not_private():
    result = _run(epsilon=None, dim=4)
    assert not result.privacy.entries
    assert "exact" in result.metrics


# --- bad combinations ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, field",
    [
        (dict(dp_mechanism="ddg", mode="plain"), "mode"),
        (dict(dp_mechanism="gaussian", mode="plain"), "mode"),
        (dict(dp_mechanism="none"), "epsilon"),
        (dict(dp_mechanism="skellam", epsilon=None), "epsilon"),
        (dict(dp_mechanism="ddg", bits=3), "bits"),
        (dict(dp_mechanism="skellam", rounds=2), "rounds"),
        (dict(dp_mechanism="gaussian", bits=12), "bits"),
        # bits that hold the rounding errors but not the noise: no scale fits (was RuntimeError)
        (dict(dp_mechanism="ddg", dim=64, bits=8, tolerated_dropout=0.0), "bits"),
        (dict(dp_mechanism="skellam", dim=64, bits=8, tolerated_dropout=0.0), "bits"),
    ],
)
def test_bad_combinations_are_config_errors_naming_the_option(options, field):
    with pytest.raises(ConfigError) as err:
        _run(**{"dim": 4, **options})
    assert err.value.field == field


# --- add then remove (Dordis) ---------------------------------------------------------------------
@pytest.mark.parametrize("randomness", ["seeded", "secure"])
def test_the_excess_leaves_exactly_the_components_from_the_level_on(randomness):
    """A user's share plus its revealed excess (components 0 … j-1, regenerated and negated) is
    exactly the sum of its components j, j+1, … — drawn here one by one with the mechanism's
    keyed Skellam under their own purposes, in another source of the same actor."""
    from rayfed.privacy import skellam_share_noise
    from rayfed.privacy.measurement import SkellamExcess, SkellamShares

    comps = (3.0, 2.0, 5.0, 7.0)
    shares = SkellamShares(sum(comps), 4, 16, components=comps)
    noise = NoiseSource(randomness, 5, "c0")
    ids = np.array([2, 9, 11])
    drawn = shares.draw(noise, np.zeros((3, 16), np.int64), 1.0, round=1, ident=None, ids=ids)
    for upto in range(len(comps)):
        excess = SkellamExcess(shares).draw(
            noise, np.zeros((3, 16), np.int64), 1.0, round=1, ident=None, ids=ids, upto=upto
        )
        kept = sum(
            skellam_share_noise(
                noise,
                ids,
                16,
                variance=comps[j],
                round=1,
                purpose=f"skellam-share/{j}",
                regenerate=True,
            )
            for j in range(upto, len(comps))
        )
        assert np.array_equal(drawn + excess, kept)
        assert upto == 0 or np.any(excess)


def test_add_then_remove_keeps_the_target_noise_whoever_drops():
    """With dropouts before the masked input (|U3| = s, q <= s < n): the level is the largest
    g_j <= s − c (recomputed here; levels count honest users, c colluding), every survivor removed
    its excess, the honest survivors keep (s − c)·Σ_{j>=j*} c_j >= T (the variance the event
    assumes, T = (q − c)·share) and the sum less than worst-case's s·share; the
    charge is worst-case's event; the MSE matches that variance within 4 sd over 1,024
    coordinates."""
    options = dict(
        dp_mechanism="skellam",
        dim=1024,
        mode="dealer",
        bits=20,
        population={"rates": {"masked_input": 0.2}},
    )
    atr = _run(**options, dp_dropout="add-then-remove")
    worst = _run(**options)
    m = atr.metrics
    s, q = m["survivors"], m["min_survivors"]
    assert q <= s < 60 and s == worst.metrics["survivors"]
    assert _event(atr) == _event(worst)
    assert atr.privacy.epsilon == worst.privacy.epsilon
    levels = m["levels"]  # in honest users: the c colluding ones know their shares
    h = q - COLLUDING
    assert levels[0] == h and levels[-1] == 60 - COLLUDING and levels == sorted(set(levels))
    j = max(i for i, g in enumerate(levels) if g <= s - COLLUDING)
    assert m["level"] == levels[j]
    assert m["removed_excess"] == s
    share, target = m["share_variance"], h * m["share_variance"]
    tails = [target / g for g in levels]
    comps = [a - b for a, b in zip(tails[:-1], tails[1:], strict=True)] + [tails[-1]]
    assert sum(comps) == pytest.approx(share)
    kept = s * sum(comps[j:])
    assert m["noise_variance_in_sum"] == pytest.approx(kept)
    assert target * (1 - 1e-12) <= (s - COLLUDING) * sum(comps[j:]) and kept < s * share
    predicted = (kept + s / 4) / (m["gamma"] * s) ** 2  # rounding: at most 1/4, ~0 here
    assert abs(m["mse"] - predicted) <= 4 * predicted * math.sqrt(2 / 1024)
    assert m["predicted_mse"] < worst.metrics["predicted_mse"]


@pytest.mark.parametrize(
    "options",
    [
        dict(dp_mechanism="ddg", dp_dropout="add-then-remove"),
        dict(dp_mechanism="gaussian", dp_dropout="add-then-remove"),
        dict(
            dp_mechanism="skellam",
            dp_dropout="add-then-remove",
            threat_model="malicious",
            mode="secure",
        ),
    ],
)
def test_add_then_remove_is_refused_where_it_does_not_hold(options):
    with pytest.raises(ConfigError) as err:
        _run(dim=4, **options)
    assert err.value.field == "dp_dropout"


@pytest.mark.parametrize("kind", ["add_or_remove_one", "replace_one"])
def test_the_integer_shares_refuse_a_relation_other_than_zero_out(kind):
    """Their events compare sums of the same number of shares: a Measurement under add/remove
    (the removed user's share would leave with it) or replace-one (2·Δ) is refused by name."""
    from rayfed.privacy import Ball, DiscreteGaussianShares, Measurement, Neighbours, SkellamShares
    from rayfed.privacy.measurement import SkellamExcess

    skellam = SkellamShares(4.0, 10, 8, 3.0)
    for mechanism in (DiscreteGaussianShares(4.0, 10, 8, 3.0), skellam, SkellamExcess(skellam)):
        with pytest.raises(ValueError, match="replace_special"):
            Measurement("x", mechanism, Ball(1.0, 2, 8), Neighbours(kind, "user"))


@pytest.mark.parametrize("mechanism", ["gaussian", "skellam"])
def test_a_user_whose_row_is_removed_still_adds_its_share(mechanism):
    """Zero-out's premise, on the protocol's own step: a registered user without a row (its row
    removed, as the conformance check's neighbour) sends the zero row plus the same keyed share,
    so the two sums hold the same number of shares; only its own message moves."""
    import pyarrow as pa

    from rayfed.actors.base import StepContext
    from rayfed.protocols import get_protocol
    from rayfed.protocols.secure_sum import dp as private
    from rayfed.protocols.secure_sum.config import SecureSumConfig

    cfg = SecureSumConfig(users=8, dim=4, dp_mechanism=mechanism, epsilon=1.0, mode="dealer")
    plan = get_protocol("secure-sum").plan(cfg, 0)
    dp, ids = plan.params.dp, np.arange(8)
    table = pa.concat_tables([t for t, _ in plan.cohorts.values()])

    def sent(keep):
        ctx = StepContext(name="c0", role="cohort", seed=5, table=table.filter(keep))
        message = private.private_inputs(ctx, 0, ids, dp)[0]
        return np.asarray(getattr(message, "words", message))  # ring words for the pipeline

    user = table.column("user_id").to_numpy()
    full, without = sent(pa.array(user >= 0)), sent(pa.array(user != 3))
    assert np.array_equal(np.delete(full, 3, 0), np.delete(without, 3, 0))
    assert not np.array_equal(full[3], without[3])
    if mechanism == "gaussian":  # the float row itself moved: the share is the same draw
        ctx = StepContext(name="c0", role="cohort", seed=5, table=table)
        row = private.table_rows(ctx, ids, dp.columns)
        assert np.allclose(full[3] - without[3], row[3], atol=1e-12)
    assert np.count_nonzero(without[3]) > 0  # the zero row plus its share: still noise


def test_add_then_remove_users_lost_at_unmask_keep_their_whole_share():
    """A user lost at unmask has its input (and whole share) in the sum but is gone for the
    removal step after it: it sends no excess, so the sum keeps its whole share (more noise, as
    reported), not the level's part."""
    options = dict(dp_mechanism="skellam", dim=8, dp_dropout="add-then-remove")
    lost = _run(**options, population={"rates": {"unmask": 0.3}})
    m = lost.metrics
    s, removed = m["survivors"], m["removed_excess"]
    assert s == 60 and 0 < removed < s  # ~Bin(60, 0.7) answer; the others are gone
    target, share = (m["min_survivors"] - COLLUDING) * m["share_variance"], m["share_variance"]
    kept = removed * target / m["level"] + (s - removed) * share
    assert m["noise_variance_in_sum"] == pytest.approx(kept, rel=1e-12)
