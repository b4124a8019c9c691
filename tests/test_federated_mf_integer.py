"""LFL federated-mf with integer shares (``dp_mechanism=skellam``): Round 1 through the
distributed-DP pipeline with Skellam shares in the ring, Round 2 removing the survivors' excess
share components.

References are computed here, outside the protocol: the rows' exact integer sum (the users'
gradient rows quantised again with the same keyed rounding), the variance the removal leaves
(written from the levels, not read from the code), the shares a seed holder regenerates, the
ε from Agarwal, Kairouz & Liu's RDP curve (written here) converted by dp-accounting.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp

import rayfed
from rayfed.actors.base import StepContext
from rayfed.errors import ConfigError
from rayfed.privacy import Ball, Declared, Measurement, Neighbours, NoiseSource, event_from_dict
from rayfed.privacy.distributed import excess_components, level, survivor_levels
from rayfed.privacy.ledger import SkellamDpEvent
from rayfed.privacy.measurement import SkellamExcess, SkellamShares
from rayfed.protocols import get_protocol
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.lfl.steps import (
    _gradient_rows,
    lfl_round1_inputs,
    lfl_round2_removal_step,
)
from rayfed.secagg import ddp

ORDERS = np.asarray(rdp.DEFAULT_RDP_ORDERS, dtype=float)
ZERO_OUT = Neighbours("replace_special", "user")
SMALL = dict(
    users=150,
    items=20,
    iterations=2,
    cohorts=2,
    pretrain_steps=5,
    finetune_steps=2,
    backend="local",
    out_dir=None,
    secagg_mode="dealer",
    dp_mechanism="skellam",
)
#: SMALL's protocol options (no run options): for plan()
PLAN = {k: v for k, v in SMALL.items() if k not in ("backend", "out_dir")}


def _setup(n, m, p, quorum, target, randomness="seeded", seed=9):
    """A cohort holding n users with one training rating each, and the plan's two releases
    (the pipeline at bits=24, Δ₂ its rounded bound) with a share of ``target``/quorum split at
    the survivor levels between ``quorum`` and n."""
    ids = np.arange(n)
    gen = np.random.default_rng(4)
    items, ratings = gen.integers(0, m, n), gen.uniform(1, 5, n)
    table = pa.table({"user_id": ids, "item": items, "rating": ratings, "split": ["train"] * n})
    u, v = gen.normal(0, 0.5, (n, p)), gen.normal(0, 0.5, (m, p))
    ctx = StepContext(
        name="c0",
        role="cohort",
        seed=seed,
        table=table,
        state={"ids": ids, "u": u},
        randomness=randomness,
    )
    clip = 2 * 5**1.5
    pipeline = ddp.plan(dim=m * p, users=n, clip=clip, bits=24, gamma=20.0, rotation_seed=3)
    levels = survivor_levels(quorum, n)
    shares = SkellamShares(
        target / quorum,
        quorum,
        pipeline.padded_dim,
        pipeline.l1_bound,
        components=excess_components(target, levels),
    )
    declared = Declared(pipeline.l2_bound, "the pipeline's rounded norm bound")
    row = Ball(clip, 2, m * p)
    round1 = Measurement("round 1", shares, row, ZERO_OUT, declared=declared, shared=True)
    round2 = Measurement("round 2", SkellamExcess(shares), row, ZERO_OUT, declared=declared)
    return ctx, v, pipeline, levels, round1, round2


def _rows_integer_sum(ctx, pipeline, ids, v, round):
    """The users' gradient rows quantised as the cohort did (the rounding keyed by the run seed,
    round and user id: a second source of the same seed redraws it), summed exactly."""
    twin = StepContext(
        name="check", role="cohort", seed=ctx.seed, table=ctx.table, state=dict(ctx.state)
    )
    grads = _gradient_rows(twin, round, ids, v)  # one rating per user: the sample is that one
    source = NoiseSource.seeded(ctx.seed, "check")
    ints, _ = pipeline.quantise(grads, pipeline.keyed_rounding(source, ids))
    return ints.sum(axis=0)


def _ring_total(pipeline, *word_rows):
    total = np.zeros(pipeline.padded_dim, dtype=np.uint64)
    for words in word_rows:
        total = total + np.asarray(words).astype(np.uint64).sum(axis=0, dtype=np.uint64)
    return pipeline.centred(total)


def test_round_one_and_two_sum_to_the_rows_plus_the_variance_the_removal_leaves():
    """Every user of U1 adds T/t in components; the Round-2 senders U2 remove those below
    j* = the largest level <= |U1| = n. S1 + N2 (mod 2^24, centred) minus the rows' exact integer
    sum is Skellam of variance (|U1| − |U2|)·T/t + |U2|·T/g_j* per coordinate: its sample variance
    over d = 4,096 coordinates within 4 sd (sd of a sample variance: v·sqrt(2/d), Skellam's
    excess kurtosis 1/v negligible), its mean within 4·sqrt(v/d)."""
    n, m, p, quorum, target, dropout = 40, 512, 8, 30, 4.0e4, 0.4
    ctx, v, pipeline, levels, round1, round2 = _setup(n, m, p, quorum, target)
    pipeline = dataclasses.replace(pipeline, round=2)
    ids = np.arange(n)
    words, _ = lfl_round1_inputs(ctx, 2, ids, v, round1, pipeline)
    upto = level(levels, n)
    assert upto == len(levels) - 1  # everyone survived Round 1: every component but the last
    ctx.noise.begin_step()
    msg = lfl_round2_removal_step(
        ctx,
        ids,
        round=2,
        release=round2,
        round1=round1,
        upto=upto,
        dropout=dropout,
        pipeline=pipeline,
    )
    u2 = len(msg.payload["ids"])
    assert 0 < u2 < n  # some Round-2 dropouts happened
    noise = _ring_total(pipeline, words.words, msg.payload["words"]) - _rows_integer_sum(
        ctx, pipeline, ids, v, 2
    )
    predicted = (n - u2) * target / quorum + u2 * target / n
    d = noise.size
    assert d == 4096
    assert abs(noise.var() / predicted - 1) < 4 * math.sqrt(2 / d)
    assert abs(noise.mean()) < 4 * math.sqrt(predicted / d)
    # and the remainder is at least the target: the event's Skellam(T) holds
    assert predicted >= target


@pytest.mark.parametrize("randomness", ["seeded", "secure"])
def test_the_seed_holder_can_strip_the_integer_noise_only_in_a_seeded_run(randomness):
    """Issue 15's regression on the integer path: the coordinator holds the seed, regenerates
    every user's Round-1 share (all its components) and subtracts it from S1. Seeded, what is
    left is exactly the rows' integer sum; secure, the whole noise (sd sqrt(n·T/t) per
    coordinate) is still there."""
    n, m, p, quorum, target = 40, 6, 3, 30, 9.0e4
    ctx, v, pipeline, _, round1, _ = _setup(n, m, p, quorum, target, randomness=randomness)
    ids = np.arange(n)
    words, _ = lfl_round1_inputs(ctx, 0, ids, v, round1, pipeline)
    attack = NoiseSource.seeded(9, "coordinator")
    shares = round1.mechanism
    regenerated = sum(
        shares.component_noise(attack, ids, pipeline.padded_dim, j, round=0, again=False)
        for j in range(len(shares.components))
    )
    rows = _rows_integer_sum(ctx, pipeline, ids, v, 0)
    left = _ring_total(pipeline, words.words, -regenerated) - rows
    if randomness == "seeded":
        assert np.array_equal(left, np.zeros_like(left))
    else:  # 32 coordinates of variance n·T/t: a sample sd below half the truth has p < 1e-6
        assert left.std() > 0.5 * math.sqrt(n * target / quorum)


def _event(result, index=0):
    entry = result.privacy.entries[index]
    skip = ("round", "scope", "label", "epsilon_after")
    return event_from_dict({k: v for k, v in entry.items() if k not in skip})


def _skellam_rdp(event) -> np.ndarray:
    """Agarwal, Kairouz & Liu 2021 Thm 3.5 at ⌈α⌉, written here."""
    a = np.ceil(ORDERS)
    mu, l2, l1 = event.variance, event.l2_sensitivity, event.l1_sensitivity
    return a * l2**2 / (2 * mu) + np.minimum(
        ((2 * a - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu)
    )


def test_a_run_charges_skellam_at_the_threshold_for_t_iterations_and_keeps_the_target():
    """The ledger holds one Skellam event per iteration, of the aggregate variance q·(share)
    (q = t − c: the honest users of the worst accepted outcome |U1| = t, c = ⌈0.05n⌉ colluding
    with the server), Δ₂ the pipeline's rounded bound; T of them compose to at most ε (and near
    it: calibrated). Round 2 with dropouts leaves f_eff >= 1 in every iteration — the noise the
    coalition cannot remove, it taking the largest contributions first — as the removal levels
    (in honest users) predict."""
    result = rayfed.run("federated-mf", **SMALL, dropout=0.15, omega=0.3, seed=1)
    m = result.metrics
    t, c = math.ceil(0.7 * 150), math.ceil(0.05 * 150)
    q = t - c
    assert m["threshold"] == t and c == 8
    events = [_event(result, i) for i in range(2)]
    assert all(isinstance(e, SkellamDpEvent) for e in events)
    assert events[0].variance == pytest.approx(q * m["share_variance"], rel=1e-12)
    assert events[0].l2_sensitivity == pytest.approx(m["l2_sensitivity_integer"], rel=1e-12)
    delta = result.privacy.delta
    eps = rdp.compute_epsilon(ORDERS, 2 * _skellam_rdp(events[0]), delta)[0]
    assert result.privacy.epsilon == pytest.approx(eps, rel=1e-6)
    assert 0.97 <= result.privacy.epsilon <= 1.0 * (1 + 1e-9)
    levels = m["removal_levels"]
    assert levels[0] == q and levels[-1] == 150 - c
    for row in m["iterations"]:
        if row["skipped"]:
            continue
        u1, u2 = row["u1"], row["u2"]
        j = max(i for i, g in enumerate(levels) if g <= u1 - c)
        # the coalition's c users: first those whose whole share T/q stayed, then removed ones
        whole = min(c, u1 - u2)
        kept = levels[j] if j else q
        expected = (u1 - u2 - whole) / q + (u2 - (c - whole)) / kept
        assert row["f_eff"] == pytest.approx(expected, rel=1e-12)
        assert row["f_eff"] >= 1
    assert any(0 < row["u2"] < row["u1"] for row in m["iterations"])  # Round 2 had dropouts


@pytest.mark.parametrize(
    "options, field",
    [
        (dict(dp_mechanism="ddg"), "dp_mechanism"),  # no sound Round-2 event
        (dict(dp_mechanism="skellam", mode="faithful"), "mode"),
        (dict(dp_mechanism="skellam", method="ldp"), "dp_mechanism"),
        (dict(dp_mechanism="skellam", bits=1), "bits"),
        (dict(dp_mechanism="gaussian", bits=20), "bits"),  # gaussian reads no bits
        (dict(setting="hfl", dp_mechanism="skellam"), "dp_mechanism"),
    ],
)
def test_bad_combinations_are_config_errors_naming_the_option(options, field):
    opts = {**SMALL, **options}
    with pytest.raises(ConfigError) as err:
        rayfed.run("federated-mf", **opts)
    assert err.value.field == field


def test_ddg_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match="dp_mechanism=skellam"):
        rayfed.run("federated-mf", **{**SMALL, "dp_mechanism": "ddg"})


def test_under_a_malicious_server_the_users_remove_nothing():
    """The removal level follows the server's |U1|, which a malicious server could inflate to
    make every user remove too much: under threat_model=malicious no Round 2 runs (and the step
    refuses to remove), so every honest user keeps its whole share: f_eff = (|U1| − c)/q."""
    result = rayfed.run(
        "federated-mf",
        **{**SMALL, "secagg_mode": "simulation"},
        dropout=0.15,
        omega=0.3,
        seed=1,
        threat_model="malicious",
    )
    t, c = math.ceil(0.7 * 150), math.ceil(0.05 * 150)
    rows = [r for r in result.metrics["iterations"] if not r["skipped"]]
    assert rows
    for row in rows:
        assert row["u2"] == 0
        assert row["f_eff"] == pytest.approx((row["u1"] - c) / (t - c), rel=1e-12)
        assert row["f_eff"] >= 1


def test_the_removal_step_removes_nothing_for_an_unchecked_count():
    """A malicious server's request (upto from a count the users cannot check) is refused in
    the step itself, from the cohort's own threat model (the plan's, not the caller's): the
    message removes nothing."""
    plan = get_protocol("federated-mf").plan(FederatedMFConfig(**PLAN), 0)
    p = plan.params
    ids = p.registry[:6]
    ctx = StepContext(
        name="c0", role="cohort", seed=0, meta={"threat_model": "malicious"}, state={"ids": ids}
    )
    msg = lfl_round2_removal_step(
        ctx,
        ids,
        round=0,
        release=p.releases.round2,
        round1=p.releases.round1,
        upto=3,
        dropout=0.0,
        pipeline=p.ddp,
    )
    assert not np.any(msg.payload["words"])
