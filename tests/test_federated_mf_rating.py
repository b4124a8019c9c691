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
from dp_accounting import dp_event, pld, rdp
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, special

import rayfed
from rayfed.errors import ConfigError, RayfedError, UnaccountedNoise
from rayfed.mf.training import poisson_batch
from rayfed.privacy import NoiseSource, PrivacyLedger, gaussian_noise_multiplier
from rayfed.privacy.calibration import gaussian_steps_event, sampled_steps_event
from rayfed.privacy.ledger import (
    Budget,
    MemoRdpAccountant,
    PureDpAccountant,
    TightestAccountant,
    UnitInSampledGroupGaussianDpEvent,
    event_from_dict,
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


def test_rdp_and_the_tightest_accountant_take_the_event_and_it_serialises():
    """Pure composition and dp-accounting's own PLD do not know the event; rayfed's RDP curve
    and the tightest accountant (its PLD: the tagged mixture) do, under add/remove-one only; it
    round-trips through dp-accounting's named tuple."""
    event = UnitInSampledGroupGaussianDpEvent(0.01, 1.5)
    assert not PureDpAccountant().supports(event)
    assert not pld.PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE).supports(event)
    ledger = PrivacyLedger(Budget(100.0, 1e-5), accountant="pure")
    with pytest.raises(RayfedError, match="cannot account"):
        ledger.charge(event, label="step")
    replace = MemoRdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    assert not replace.supports(event)
    assert not TightestAccountant(NeighboringRelation.REPLACE_ONE).supports(event)
    assert MemoRdpAccountant().supports(event)
    assert TightestAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE).supports(event)
    composed = dp_event.SelfComposedDpEvent(event, 3)
    stored = event_to_dict(composed)
    assert stored["class_name"] == "SelfComposedDpEvent" and stored["count"] == 3
    assert stored["event"]["class_name"] == "UnitInSampledGroupGaussianDpEvent"
    assert event_from_dict(stored) == composed


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


@pytest.mark.parametrize("sampled", ["rating", "user"])
def test_the_sample_is_drawn_through_the_source_as_before(sampled):
    """poisson_batch draws through NoiseSource.poisson_sample (which backs the sampled event) the
    very sample a "sample" Generator of the round gave before: the uniforms below the rate, over
    the ratings or over the n users (then each rating with its user)."""
    n, rate = 40, 0.3
    users = np.repeat(np.arange(n), 3)
    rows = poisson_batch(NoiseSource.seeded(3, "p0"), users, n, round=2, rate=rate, sampled=sampled)
    gen = NoiseSource.seeded(3, "p0").generator("sample", 2)
    if sampled == "rating":
        expected = np.flatnonzero(gen.random(users.size) < rate)
    else:
        expected = np.flatnonzero((gen.random(n) < rate)[users])
    assert np.array_equal(rows, expected) and 0 < rows.size < users.size


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
    """Faithful keeps the thesis's calibration (RDP, the subsampled Gaussian at the nominal ε;
    DP-SGLD: advanced composition) and reports its true ε, the smaller of the group-sampled
    event's RDP bound and its PLD (the tagged mixture), both computed here; corrected calibrates
    z against the tightest accountant (smaller z, except DP-SGLD's) and spends the nominal ε."""
    from test_federated_mf_tight import group_sampled_epsilon

    faithful = rayfed.run("federated-mf", **RUN, **small(options), **options, mode="faithful")
    corrected = rayfed.run("federated-mf", **RUN, **small(options), **options)
    z, q, delta = faithful.metrics["noise_multiplier"], 0.01, faithful.privacy.delta
    z_corrected = corrected.metrics["noise_multiplier"]
    if options.get("method") == "dp-sgld":
        assert z == z_corrected  # the SGLD papers' calibration in both modes
    else:
        assert z == gaussian_noise_multiplier(1.0, delta, steps=steps, sampling_rate=q)
        assert z_corrected < 0.95 * z
    by_rdp = _independent_epsilon(q, z, steps, delta)
    by_pld = group_sampled_epsilon(q, z, steps, delta)
    assert by_pld < by_rdp
    assert faithful.privacy.epsilon == pytest.approx(by_pld, rel=2e-3)
    assert faithful.privacy.epsilon_by_accountant["rdp"] == pytest.approx(by_rdp, rel=1e-9)
    assert faithful.privacy.epsilon > 2 * faithful.privacy.requested_epsilon
    assert faithful.privacy.requested_epsilon == 1.0
    assert any(f"the true ε is {faithful.privacy.epsilon:.4g}" in n for n in faithful.privacy.notes)
    assert "ε spent" in faithful.headline
    entry = faithful.privacy.entries[0]["event"]
    assert entry["class_name"] == "UnitInSampledGroupGaussianDpEvent"
    # corrected: the subsampled Gaussian is the true event, its ε the smaller of dp-accounting's
    # PLD and RDP over the charged steps
    assert corrected.privacy.entries[0]["event"]["class_name"] == "PoissonSampledDpEvent"
    assert corrected.privacy.requested_epsilon is None
    steps_event = gaussian_steps_event(z_corrected, steps, q)
    relation = NeighboringRelation.ADD_OR_REMOVE_ONE
    expected = min(
        rdp.RdpAccountant().compose(steps_event).get_epsilon(delta),
        pld.PLDAccountant(relation).compose(steps_event).get_epsilon(delta),
    )
    assert corrected.privacy.epsilon == pytest.approx(expected, rel=1e-4)
    assert corrected.privacy.epsilon <= 1.0 * (1 + 1e-9)
    if options.get("method") != "dp-sgld":
        assert corrected.privacy.epsilon == pytest.approx(1.0, abs=2e-3)
    assert any("corrected mode" in note for note in corrected.privacy.notes)


@pytest.mark.parametrize("i", [2, 5])
def test_faithful_mode_keeps_the_theses_results_bit_for_bit(i):
    """Examples 2 (VFL per rating) and 5 (DP-SGLD per rating) with mode=faithful give the tables
    recorded before rating sampling existed (user sampling, as the thesis), at VFL's constant
    rate 0.05 (the default before issue 30's public rule)."""
    example = {**get_protocol("federated-mf").examples[i], "mode": "faithful"}
    if example.get("method") != "dp-sgld":
        example["vfl_lr"] = 0.05
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


def test_the_group_sampled_event_is_carried_only_as_drawn_whole_after_its_sample():
    """A message carrying UnitInSampledGroupGaussian(q, z) passes the noise-origin check only if
    a release registered that very event (drawn whole, after a Poisson sample at q in the step):
    a Gaussian with the same z does not back it, nor does the event at another rate, and the
    event is refused at registration without a sample at its rate."""
    event = UnitInSampledGroupGaussianDpEvent(0.01, 2.0)
    drawn = NoiseSource.seeded(1)
    drawn.begin_step()
    drawn.poisson_sample(0.01, 50)
    drawn.register(event)
    drawn.check_carried(event, "a message")
    drawn.check_all_carried([event])
    gaussian = NoiseSource.seeded(1)
    gaussian.begin_step()
    gaussian.register(dp_event.GaussianDpEvent(2.0))
    with pytest.raises(UnaccountedNoise):
        gaussian.check_carried(event, "a message")
    with pytest.raises(UnaccountedNoise):
        gaussian.check_all_carried([event])
    unsampled = NoiseSource.seeded(1)
    unsampled.begin_step()
    with pytest.raises(UnaccountedNoise, match="no sample at that rate"):
        unsampled.register(event)
    other = NoiseSource.seeded(1)
    other.begin_step()
    other.poisson_sample(0.02, 50)
    with pytest.raises(UnaccountedNoise, match="no sample at that rate"):
        other.register(event)
    # the faithful run's DP-SGD steps register exactly this event, one per step
    faithful = get_protocol("federated-mf").examples[7]
    result = rayfed.run("federated-mf", **RUN, **faithful)
    assert {e["event"]["class_name"] for e in result.privacy.entries} == {
        "UnitInSampledGroupGaussianDpEvent"
    }


# --- per-rating HFL's gap (spec §7.8), seen on neighbouring datasets -----------------------------
def _item_rows_moved(options: dict) -> dict[str, tuple[int, set[int]]]:
    """For the party holding the removed rating (the check's last unit): (the item of its last
    training rating, the rows of V's gradient sum that moved in its first DP-SGD release when
    that rating is removed), noiseless (the sensitivity check's
    probe and neighbours, every unit in the sample), D′ replaying D's releases."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "conformance"))
    from neighbours import Probe, neighbouring_plans

    from rayfed.api import _prepare, _reconcile, execute, resolve
    from rayfed.privacy.source import noiseless

    proto, run_opts, cfg = resolve("federated-mf", {"backend": "local", "out_dir": None, **options})
    cfg, run_opts = _reconcile(proto, cfg, run_opts)
    plan, _, _ = _prepare(proto, cfg, run_opts)
    _, d_plan, removed_plan = next(p for p in neighbouring_plans(plan) if p[0] == "removed")
    with noiseless(Probe()) as d:
        execute(proto, cfg, run_opts, d_plan)
    with noiseless(Probe(d.seen)) as removed:
        execute(proto, cfg, run_opts, removed_plan)
    out = {}
    for (party, label, call), seen in d.seen.items():
        if removed_plan.parties[party][0].equals(d_plan.parties[party][0]):
            continue  # the rating removed is another party's (each rating lies at one party)
        if call == 0:
            diff = (seen.values - removed.seen[(party, label, 0)].values).reshape(-1, cfg.rank)
            item = int(plan.parties[party][0].column("item")[-1].as_py())
            out[party] = (item, set(np.flatnonzero(np.any(diff != 0, axis=1)).tolist()))
    return out


def test_per_rating_hfl_reaches_other_items_through_the_pretrained_u_unless_not_pretrained():
    """The gap the statement names (spec §7.8), on data: without pre-training a removed rating
    moves exactly its own item's row of V's gradient sum; with Stage 1, u_i moved, and the
    user's other items' rows move too — the pathway Δ does not cover, which the statement,
    the headline and the release's label exclude by name."""
    options = dict(
        setting="hfl",
        privacy_unit="rating",
        users=40,
        items=12,
        density=0.5,
        iterations=1,
        local_steps=1,
        finetune_steps=0,
        parties=2,
    )
    pretrained = _item_rows_moved({**options, "pretrain_steps": 5})
    not_pretrained = _item_rows_moved({**options, "pretrain_steps": 0})
    assert all(rows == {item} for item, rows in not_pretrained.values()), not_pretrained
    assert all(item in rows for item, rows in pretrained.values())
    assert any(len(rows) > 1 for _, rows in pretrained.values()), pretrained
    gap = rayfed.run("federated-mf", **RUN, **options, pretrain_steps=5)
    closed = rayfed.run("federated-mf", **RUN, **options, pretrain_steps=0)
    assert "given the pre-trained U" in gap.headline and "§7.8" in gap.privacy.statement
    assert any("(u_i taken as given)" in line for line in gap.privacy.releases)
    assert "given the pre-trained U" not in closed.headline
    assert "§7.8" not in closed.privacy.statement and "u_i taken" not in str(
        closed.privacy.releases
    )
