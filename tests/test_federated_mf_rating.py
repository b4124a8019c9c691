"""federated-mf per-rating privacy and minibatch sampling (spec §2.4): user-level sampling does not
amplify a rating's privacy. The true event's RDP curve against an independent numerical
integration, the corrected mode's rating sampling, the faithful mode's true ε against an
independent RDP computation, and the thesis's results kept bit for bit by ``mode=faithful``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from dp_accounting import dp_event, rdp
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, special

import rayfed
from rayfed.errors import ConfigError, RayfedError, UnaccountedNoise
from rayfed.mf.training import poisson_batch
from rayfed.privacy import NoiseSource, PrivacyLedger
from rayfed.privacy.calibration import gaussian_steps_event, sampled_steps_event
from rayfed.privacy.ledger import (
    Budget,
    MemoRdpAccountant,
    PureDpAccountant,
    UnitInSampledGroupGaussianDpEvent,
    event_to_dict,
    unit_in_sampled_group_rdp,
)
from rayfed.protocols import get_protocol
from rayfed.protocols.federated_mf.config import FederatedMFConfig

GOLDEN_FAITHFUL = Path(__file__).resolve().parent / "golden" / "faithful-mf"
SMALL = dict(users=150, items=30, iterations=2, local_steps=2, finetune_steps=2, pretrain_steps=5)


def small(options: dict) -> dict:
    """SMALL without the options a literature baseline does not read (their ``when`` refuses
    them)."""
    method = options.get("method") or options.get("setting", "lfl")  # as resolved_method
    fields = FederatedMFConfig.__dataclass_fields__
    reads = lambda name: method in fields[name].metadata["when"].get("method", (method,))  # noqa: E731
    return {k: v for k, v in SMALL.items() if reads(k)}


RUN = dict(backend="local", out_dir=None, seed=0)
ORDERS = (1.5, 2.0, 4.0, 8.0)


def _log_mixture(x: float, q: float, shift: float) -> float:
    """log of (1 − q) N(0, 1) + q N(shift, 1) at x."""
    return float(
        special.logsumexp([math.log1p(-q) - x * x / 2, math.log(q) - (x - shift) ** 2 / 2])
        - 0.5 * math.log(2 * math.pi)
    )


def _mixture_rdp(alpha: float, q: float, z: float, h: float) -> float:
    """RDP of order α between P = (1−q)N(0,1) + qN(h,1) and Q = (1−q)N(0,1) + qN(h + 1/z, 1)
    (σ units: the rating moves the sum by Δ = σ/z), the worse direction, by integrating
    E_Q[(P/Q)^α] numerically."""

    def moment(a: float, b: float) -> float:
        def integrand(x):
            return math.exp(alpha * _log_mixture(x, q, a) + (1 - alpha) * _log_mixture(x, q, b))

        lo, hi = -40.0, max(a, b) + 40.0 * alpha
        return integrate.quad(integrand, lo, hi, points=sorted({0.0, a, b}), limit=400)[0]

    far = h + 1 / z
    return max(math.log(moment(h, far)), math.log(moment(far, h))) / (alpha - 1)


@pytest.mark.parametrize("q,z", [(0.05, 1.0), (0.2, 2.0)])
def test_the_curve_is_the_mixture_pairs_rdp_for_a_user_with_many_ratings(q, z):
    """Far from the rest (h = 30σ: a user whose other ratings dominate), the pair's RDP is the
    formula; nearer (h = 0.5σ), the formula bounds it from above."""
    curve = unit_in_sampled_group_rdp(q, z, np.array(ORDERS))
    acc = MemoRdpAccountant(orders=ORDERS).compose(UnitInSampledGroupGaussianDpEvent(q, z))
    np.testing.assert_allclose(acc._rdp, curve, rtol=1e-12)
    for alpha, bound in zip(ORDERS, curve, strict=True):
        far = _mixture_rdp(alpha, q, z, 30.0)
        assert far == pytest.approx(bound, rel=1e-5)
        assert _mixture_rdp(alpha, q, z, 0.5) <= bound * (1 + 1e-9)


@pytest.mark.parametrize("q,z", [(0.01, 1.513), (0.01, 0.7), (0.1, 3.0)])
def test_the_curve_dominates_the_subsampled_gaussian_and_is_the_gaussian_at_q_1(q, z):
    ours = MemoRdpAccountant().compose(UnitInSampledGroupGaussianDpEvent(q, z))
    theirs = rdp.RdpAccountant().compose(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
    )
    assert np.all(ours._rdp >= theirs._rdp * (1 - 1e-9))
    assert ours.get_epsilon(1e-5) > 2 * theirs.get_epsilon(1e-5)  # not amplified: far larger
    full = MemoRdpAccountant().compose(UnitInSampledGroupGaussianDpEvent(1.0, z))
    np.testing.assert_allclose(full._rdp, full._orders / (2 * z**2), rtol=1e-12)
    assert sampled_steps_event(z, 3, 1.0, unit="rating", sampled="user") == gaussian_steps_event(
        z, 3
    )


def test_only_the_rdp_accountant_takes_the_event_and_it_serialises():
    event = UnitInSampledGroupGaussianDpEvent(0.01, 1.5)
    assert not PureDpAccountant().supports(event)
    ledger = PrivacyLedger(Budget(100.0, 1e-5), accountant="pure")
    with pytest.raises(RayfedError, match="cannot account"):
        ledger.charge(event, label="step")
    replace = MemoRdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    assert not replace.supports(event)
    assert event_to_dict(dp_event.SelfComposedDpEvent(event, 3)) == {
        "type": "SelfComposedDpEvent",
        "event": {
            "type": "UnitInSampledGroupGaussianDpEvent",
            "sampling_probability": 0.01,
            "noise_multiplier": 1.5,
        },
        "count": 3,
    }


def test_rating_sampling_samples_ratings_and_user_sampling_whole_users():
    """200 ratings for each of 60 users, η = 0.1: rating sampling takes about η of every user's
    ratings (overall within 4 sd of η, most users partly in); user sampling all or none."""
    n, per, rate = 60, 200, 0.1
    users = np.repeat(np.arange(n), per)
    noise = NoiseSource("seeded", 7, "p0")
    rows = poisson_batch(noise, users, n, round=0, rate=rate, sampled="rating")
    share = np.bincount(users[rows], minlength=n) / per
    sd = math.sqrt(rate * (1 - rate) / users.size)
    assert abs(rows.size / users.size - rate) < 4 * sd
    assert np.count_nonzero((share > 0) & (share < 1)) >= n - 2  # P(a user has none) = 0.9^200
    rows = poisson_batch(noise, users, n, round=0, rate=rate, sampled="user")
    share = np.bincount(users[rows], minlength=n) / per
    assert set(np.unique(share)) <= {0.0, 1.0} and 0 < share.sum() < n


def _independent_epsilon(q: float, z: float, steps: int, delta: float) -> float:
    """ε of ``steps`` releases of one rating of a sampled user: the curve written out here,
    converted by dp-accounting's RDP-to-(ε, δ) conversion."""
    orders = np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=float)
    curve = np.logaddexp(np.log1p(-q), np.log(q) + orders * (orders - 1) / (2 * z * z))
    return rdp_privacy_accountant.compute_epsilon(orders, steps * curve / (orders - 1), delta)[0]


@pytest.mark.parametrize(
    "options,steps",
    [
        (dict(setting="vfl"), 2 * 2 + 2),  # T·T' + κ fine-tuning steps per party
        (dict(setting="hfl", privacy_unit="rating"), 2 * 2),  # HFL's Stage 3 is unpublished
        (dict(setting="vfl", method="dp-sgld", parties=1), 2 * 2),
    ],
    ids=["vfl", "hfl", "dp-sgld"],
)
def test_faithful_reports_the_true_epsilon_and_corrected_the_nominal_one(options, steps):
    faithful = rayfed.run("federated-mf", **RUN, **small(options), **options, mode="faithful")
    corrected = rayfed.run("federated-mf", **RUN, **small(options), **options)
    z, q = faithful.metrics["noise_multiplier"], 0.01
    assert z == corrected.metrics["noise_multiplier"]  # the thesis's calibration in both modes
    true = _independent_epsilon(q, z, steps, faithful.privacy.delta)
    assert faithful.privacy.epsilon == pytest.approx(true, rel=1e-9)
    assert faithful.privacy.epsilon > 2 * faithful.privacy.requested_epsilon
    assert faithful.privacy.requested_epsilon == 1.0
    assert any(f"the true ε is {true:.4g}" in note for note in faithful.privacy.notes)
    assert "ε spent" in faithful.headline
    entry = faithful.privacy.entries[0]["event"]
    assert entry["type"] == "UnitInSampledGroupGaussianDpEvent"
    # corrected: the subsampled Gaussian is the true event; VFL/HFL calibrate z to the nominal ε
    # (RDP, tol 1e-4 on z), DP-SGLD by the looser advanced composition
    assert corrected.privacy.entries[0]["event"]["type"] == "PoissonSampledDpEvent"
    assert corrected.privacy.requested_epsilon is None
    expected = (
        rdp.RdpAccountant()
        .compose(gaussian_steps_event(z, steps, q))
        .get_epsilon(corrected.privacy.delta)
    )
    assert corrected.privacy.epsilon == pytest.approx(expected, rel=1e-9)
    assert corrected.privacy.epsilon <= 1.0 * (1 + 1e-9)
    if options.get("method") != "dp-sgld":
        assert corrected.privacy.epsilon == pytest.approx(1.0, rel=1e-2)
    assert any("corrected mode" in note for note in corrected.privacy.notes)


@pytest.mark.parametrize("i", [2, 5])
def test_faithful_mode_keeps_the_theses_results_bit_for_bit(i):
    """Examples 2 (VFL per rating) and 5 (DP-SGLD per rating) with mode=faithful give the tables
    recorded before rating sampling existed (user sampling, as the thesis)."""
    example = {**get_protocol("federated-mf").examples[i], "mode": "faithful"}
    result = rayfed.run("federated-mf", **RUN, **example)
    with pa.memory_map(str(GOLDEN_FAITHFUL / str(i) / "evaluation.arrow")) as source:
        assert result.tables["evaluation"].equals(pa.ipc.open_file(source).read_all())


@pytest.mark.parametrize(
    "options",
    [
        dict(setting="vfl", privacy_unit="user"),
        dict(setting="hfl"),  # per user by default
        dict(setting="vfl", method="objpert", parties=1),  # no minibatches
        dict(setting="vfl", sampling_rate=1.0),  # every rating in every batch either way
    ],
)
def test_faithful_is_refused_where_it_changes_nothing(options):
    with pytest.raises(ConfigError) as err:
        rayfed.run("federated-mf", **RUN, **small(options), **options, mode="faithful")
    assert err.value.field == "mode"


@pytest.mark.parametrize(
    "options,expected",
    [
        (dict(setting="vfl"), "rating"),  # local steps and κ fine-tuning steps
        (dict(setting="vfl", mode="faithful"), "user"),
        (dict(setting="vfl", method="local"), "rating"),
        (dict(setting="hfl", privacy_unit="rating"), "rating"),
        (dict(setting="hfl"), "user"),
        (dict(setting="vfl", method="dp-sgld", parties=1), "rating"),
        (dict(setting="vfl", privacy_unit="user"), "user"),
    ],
)
def test_every_path_samples_its_privacy_unit(monkeypatch, options, expected):
    """What poisson_batch is asked to sample, in every minibatch of the run: a per-rating run
    samples ratings (the unit the sampled event amplifies) unless it is the thesis's faithful
    mode, a per-user run users."""
    import rayfed.mf.baselines as baselines
    import rayfed.mf.training as training

    asked = []

    def recording(*args, sampled, **kwargs):
        asked.append(sampled)
        return poisson_batch(*args, sampled=sampled, **kwargs)

    monkeypatch.setattr(training, "poisson_batch", recording)
    monkeypatch.setattr(baselines, "poisson_batch", recording)
    rayfed.run("federated-mf", **RUN, **small(options), **options)
    assert asked and set(asked) == {expected}


def test_the_new_event_unwraps_to_the_gaussian_actually_drawn():
    """leaves(): a message carrying UnitInSampledGroupGaussian(q, z) passes the noise-origin check
    only if a Gaussian with that z was drawn in the step; a draw no message carries is caught."""
    event = UnitInSampledGroupGaussianDpEvent(0.01, 2.0)
    drawn = NoiseSource.seeded(1)
    drawn.begin_step()
    drawn.register(dp_event.GaussianDpEvent(2.0))
    drawn.check_carried(event, "a message")
    drawn.check_all_carried([event])
    other = NoiseSource.seeded(1)
    other.begin_step()
    other.register(dp_event.GaussianDpEvent(1.5))
    with pytest.raises(UnaccountedNoise):
        other.check_carried(event, "a message")
    with pytest.raises(UnaccountedNoise):
        other.check_all_carried([event])
