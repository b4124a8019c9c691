"""The federation on both backends: deadlines, typed failures, dropouts, transcript, ledger checks,
and per-user randomness that does not depend on how users are dealt to cohorts."""

import os
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
import ray.cloudpickle

from rayfed import rng
from rayfed.actors import Message
from rayfed.data import per_user
from rayfed.errors import BudgetExceeded, DataError, PartyFailed, RoundTimeout, UnaccountedNoise
from rayfed.federation import Federation
from rayfed.privacy import (
    Budget,
    Interval,
    Laplace,
    Measurement,
    Neighbours,
    NoiseSource,
    PrivacyDeclaration,
    laplace,
    laplace_event,
)

# Ray workers cannot import this test module: ship its step functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BACKENDS = [pytest.param("local", id="local"), pytest.param("ray", id="ray", marks=pytest.mark.ray)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


RELATION = Neighbours("replace_one", "value")
#: a release whose noise the parties draw in shares (one charge), and one each party draws whole
SHARED = Measurement("shared Laplace", Laplace(0.5), Interval(0, 1), RELATION, shared=True)
WHOLE = Measurement("whole Laplace", Laplace(0.5), Interval(0, 1), RELATION)
OTHER = Measurement("another Laplace", Laplace(0.25), Interval(0, 1), RELATION)
#: the release the mechanism-level steps below draw (laplace(Δ₁ = 1, ε = 0.5))
LAPLACE = Measurement("laplace", Laplace(0.5), Interval(0, 1), RELATION)
GREEDY = Measurement("greedy Laplace", Laplace(2.0), Interval(0, 1), RELATION)


def make_fed(backend, parties=2, cohorts=None, deadline_s=30.0, epsilon=1.0, **kw):
    tables = {
        f"p{i}": (pa.table({"x": np.arange(10, dtype=np.int64) + 100 * i}), {"i": i})
        for i in range(parties)
    }
    return Federation(
        run_id="t",
        seed=5,
        parties=tables,
        cohorts=cohorts or {},
        privacy=PrivacyDeclaration(
            Budget(epsilon),
            "pure",
            RELATION,
            composition="parallel",
            statement="test parties compose in parallel",
            measurements=(SHARED, WHOLE, OTHER, LAPLACE, GREEDY),
        ),
        backend=backend,
        deadline_s=deadline_s,
        **kw,
    )


# --- steps used by the tests -----------------------------------------------------------------------
def column_sum(ctx, offset):
    return Message(
        "sum", np.array([ctx.table.column("x").to_numpy().sum() + offset]), to="coordinator"
    )


def add_all(ctx, sums):
    return Message("total", float(sum(v[0] for v in sums.values())), to="parties")


def sleepy(ctx, seconds):
    time.sleep(seconds if ctx.name == "p1" else 0)
    return 1


def broken(ctx):
    if ctx.name == "p1":
        raise ValueError("bad thing")
    return 1


def bad_data(ctx):
    raise DataError("data.x", "out of bounds")


def die(ctx):
    if ctx.name in ("p1", "c1"):
        os._exit(1)
    return ctx.name


def noisy_sum(ctx, epsilon):
    ctx.state["drew"] = True
    value, event = laplace(ctx.noise, np.array([1.0]), l1_sensitivity=1.0, epsilon=epsilon)
    return Message("noisy", value, to="coordinator", dp_event=event)


def forged(ctx, epsilon):
    """Claims a Laplace event but draws nothing: the charge would not be tied to any noise."""
    return Message("noisy", 1.0, dp_event=laplace_event(1.0, epsilon))


def silent_noise(ctx, epsilon):
    """Draws noise through a mechanism but sends the release without its event."""
    value, ctx.state["event"] = laplace(
        ctx.noise, np.array([1.0]), l1_sensitivity=1.0, epsilon=epsilon
    )
    return Message("noisy", value)


def send_stale(ctx):
    """Sends, in a later step, an event drawn in an earlier one."""
    return Message("noisy", 1.0, dp_event=ctx.state["event"])


def shared_release(ctx, release):
    """Every member's share of one release under scope "run" (distributed noise)."""
    value, event = release(ctx.noise, np.array([1.0]))
    return Message("share", value, dp_event=event, scope="run")


def carry_or_share(ctx, release, share_of):
    """p0 carries ``release``; p1 draws a share of ``share_of`` (part_of)."""
    if ctx.name == "p0":
        value, event = release(ctx.noise, np.array([1.0]))
        return Message("release", value, dp_event=event, scope="run")
    value, _ = release(ctx.noise, np.array([1.0]), part_of=share_of)
    return Message("share", value)


def mutate(ctx, values):
    values[0] = 99.0
    return values


def drew(ctx):
    return ctx.state.get("drew", False)


def keyed_noise(ctx, round):
    ids = ctx.table.column("user_id").to_numpy()
    u = rng.keyed_uniform(ctx.seed, "test", round, ids, 2)
    return pa.table(
        {"user_id": ids, "u0": u[:, 0], "v": ctx.table.column("v").to_numpy() + u[:, 1]}
    )


# --- tests -------------------------------------------------------------------------------------------
def test_messages_flow_and_transcript(backend):
    with make_fed(backend, parties=3) as fed:
        sums = fed.parties.run(column_sum, 1, phase="sum")
        total = fed.coordinator.call(add_all, sums, phase="add")
        assert total == pytest.approx(45 * 3 + 1000 + 2000 + 3 * 1.0 + 0)
        rows = fed.transcript.rows
        assert [(r["sender"], r["receiver"], r["name"]) for r in rows[:3]] == [
            ("p0", "coordinator", "sum"),
            ("p1", "coordinator", "sum"),
            ("p2", "coordinator", "sum"),
        ]
        assert all(r["bytes"] == 8 for r in rows[:3])
        assert [r["receiver"] for r in rows[3:]] == [
            "p0",
            "p1",
            "p2",
        ]  # a broadcast reaches each party
        assert fed.transcript.totals()["messages"] == 6
        assert {t["phase"] for t in fed.timings} == {"sum", "add"}


def broadcast_to_parties(ctx):
    return Message("news", np.zeros(4), to="parties")


def test_a_broadcast_records_no_self_send(backend):
    """A party's broadcast to the parties reaches the other two: its own copy never crosses a
    boundary and is not counted (it inflated every summary's bytes)."""
    with make_fed(backend, parties=3) as fed:
        fed.parties.run(broadcast_to_parties, phase="broadcast", members=["p1"])
        rows = fed.transcript.rows
        assert [(r["sender"], r["receiver"]) for r in rows] == [("p1", "p0"), ("p1", "p2")]
        assert fed.transcript.totals()["bytes"] == 2 * 32


@pytest.mark.ray
def test_deadline_raises_round_timeout_naming_the_party(ray_cluster, bounded):
    """p1 sleeps 30 s: only the 2 s deadline can end the phase with RoundTimeout (without it the
    step would return normally); the bounded wait fails the test on a hang."""
    with make_fed("ray", deadline_s=2.0) as fed:
        with pytest.raises(RoundTimeout, match="p1") as info:
            bounded(60, fed.parties.run, sleepy, 30, phase="slow")
        assert info.value.parties == ["p1"] and info.value.phase == "parties:slow"


def test_exception_in_step_is_party_failed_with_cause(backend):
    with make_fed(backend) as fed, pytest.raises(PartyFailed, match="p1.*bad thing") as info:
        fed.parties.run(broken, phase="b")
    assert info.value.party == "p1"


def test_rayfed_errors_keep_their_type_across_actors(backend):
    with make_fed(backend) as fed, pytest.raises(DataError, match="data.x"):
        fed.parties.run(bad_data, phase="d")


@pytest.mark.ray
def test_dead_party_is_party_failed_and_dead_cohort_is_a_dropout(ray_cluster):
    cohorts = {f"c{i}": (pa.table({"user_id": np.arange(i * 5, i * 5 + 5)}), {}) for i in range(3)}
    with make_fed("ray", cohorts=cohorts) as fed:
        replies = fed.cohorts.run(die, phase="work", on_failure="drop")
        assert replies.failed == ["c1"]
        assert fed.get(replies) == {"c0": "c0", "c2": "c2"}
        with pytest.raises(PartyFailed, match="died"):
            fed.parties.run(die, phase="work")


def test_noise_must_be_charged_before_it_is_sent(backend):
    with make_fed(backend, epsilon=1.0) as fed:
        with pytest.raises(UnaccountedNoise):
            fed.parties.run(noisy_sum, 0.5, phase="uncharged")
        fed.charge([(p, "laplace", laplace_event(1.0, 0.5)) for p in fed.parties.names])
        fed.parties.run(noisy_sum, 0.5, phase="charged")
        report = fed.privacy_report()
        assert report.epsilon == pytest.approx(0.5) and report.per_scope == pytest.approx(
            {"p0": 0.5, "p1": 0.5}
        )


def test_budget_exceeded_before_any_noise_is_drawn(backend):
    with make_fed(backend, epsilon=1.0) as fed:
        with pytest.raises(BudgetExceeded, match="'p0'"):  # ε = 2 > 1
            fed.charge([GREEDY.charge(p) for p in fed.parties.names])
        assert fed.get(fed.parties.run(drew, phase="check")) == {"p0": False, "p1": False}
        assert fed.privacy_report().entries == []  # all or nothing


@pytest.mark.parametrize("n_cohorts", [1, 2, 5])
def test_per_user_randomness_is_independent_of_cohorts(backend, n_cohorts):
    users = pa.table(
        {"uid": np.arange(103, dtype=np.int64)[::-1].copy(), "v": np.arange(103, dtype=np.float64)}
    )
    cohorts = {name: (t, {}) for name, t in per_user(users, "uid", n_cohorts).items()}
    assert len(cohorts) == n_cohorts
    with make_fed(backend, cohorts=cohorts) as fed:
        parts = fed.get(fed.cohorts.run(keyed_noise, 4, phase="noise"))
    table = pa.concat_tables(parts[n] for n in sorted(parts)).sort_by("user_id")
    reference = keyed_noise(
        type("Ctx", (), {"seed": 5, "table": users.rename_columns(["user_id", "v"])})(), 4
    )
    assert table.equals(reference.sort_by("user_id"))


def test_an_event_no_mechanism_drew_in_the_step_is_refused(backend):
    """The charge must be tied to noise drawn in the same step: a forged event, or one drawn in
    an earlier step, is refused even when an equal charge is in the ledger; and noise a mechanism
    drew must leave the step with its event."""
    event = laplace_event(1.0, 0.5)
    with make_fed(backend, epsilon=4.0) as fed:
        fed.charge([("p0", "laplace", event)])
        with pytest.raises(UnaccountedNoise, match="did not draw"):
            fed.parties.run(forged, 0.5, phase="forged", members=["p0"])
        with pytest.raises(UnaccountedNoise, match="no message carries it"):
            fed.parties.run(silent_noise, 0.5, phase="silent", members=["p0"])
        with pytest.raises(UnaccountedNoise, match="did not draw"):
            fed.parties.run(send_stale, phase="stale", members=["p0"])


def test_shares_of_one_release_use_one_charge(backend):
    with make_fed(backend, epsilon=0.5) as fed:
        fed.charge([SHARED.charge("run")])
        fed.parties.run(shared_release, SHARED, phase="shares")  # p0 and p1: one release
        assert fed.privacy_report().epsilon == pytest.approx(0.5)
        with pytest.raises(UnaccountedNoise, match="sent twice"):
            fed.parties.run(shared_release, SHARED, phase="again")


def test_two_whole_releases_under_scope_run_need_two_charges(backend):
    """Only a release declared shared is drawn in shares under one charge: two parties each
    drawing a whole release of the same event need a charge each (the review's ε 1 for 2)."""
    with make_fed(backend, epsilon=2.0) as fed:
        fed.charge([WHOLE.charge("run")])
        with pytest.raises(UnaccountedNoise, match="sent twice"):
            fed.parties.run(shared_release, WHOLE, phase="whole")
    with make_fed(backend, epsilon=2.0) as fed:
        fed.charge([WHOLE.charge("run"), WHOLE.charge("run")])
        fed.parties.run(shared_release, WHOLE, phase="whole")
        assert fed.privacy_report().epsilon == pytest.approx(1.0)


def test_a_share_names_a_declared_release_carried_in_its_round(backend):
    """part_of: a share of a release that a message of the round carries passes; a share of an
    undeclared release, or of one no message of the round carries, is refused (at the round's
    end), and so is a step that carries a release and draws a share of it too."""
    with make_fed(backend, epsilon=2.0) as fed:
        fed.charge([WHOLE.charge("run")])
        fed.parties.run(carry_or_share, WHOLE, WHOLE, phase="release and share")
    stranger = Measurement("undeclared", Laplace(0.5), Interval(0, 1), RELATION)
    with make_fed(backend, epsilon=2.0) as fed:
        fed.charge([WHOLE.charge("run")])
        with pytest.raises(UnaccountedNoise, match="does not declare"):
            fed.parties.run(carry_or_share, WHOLE, stranger, phase="release and share")
    with (
        make_fed(backend, epsilon=2.0) as fed,
        pytest.raises(UnaccountedNoise, match="no message of the round carries"),
    ):
        with fed.round(0):
            fed.charge([WHOLE.charge("run")])
            fed.parties.run(carry_or_share, WHOLE, OTHER, phase="release and share")
    source = NoiseSource.seeded(1, "p0")  # the review's case: a second copy under one charge
    source.begin_step()
    _, event = WHOLE(source, np.array([1.0]))
    WHOLE(source, np.array([1.0]), part_of=WHOLE)
    with pytest.raises(UnaccountedNoise, match="draws a share of it for elsewhere"):
        source.check_all_carried([event])


def test_a_message_charged_once_cannot_be_sent_twice(backend):
    with make_fed(backend, epsilon=4.0) as fed:
        fed.charge([("p0", "laplace", laplace_event(1.0, 0.5))])
        fed.parties.run(noisy_sum, 0.5, phase="first", members=["p0"])
        with pytest.raises(UnaccountedNoise, match="sent twice"):
            fed.parties.run(noisy_sum, 0.5, phase="again", members=["p0"])


def test_steps_cannot_mutate_their_inputs_on_either_backend(backend):
    with make_fed(backend) as fed, pytest.raises(PartyFailed, match="read-only"):
        fed.parties.run(mutate, np.zeros(3), phase="mutate")


def test_member_names_are_checked():
    from rayfed.errors import ConfigError

    with pytest.raises(ConfigError, match="reserved"):
        Federation(
            run_id="t",
            seed=0,
            parties={"cohorts": (pa.table({"x": [1]}), {})},
            privacy=PrivacyDeclaration.none("test"),
        )


def test_quorum_check():
    from rayfed.errors import BelowThreshold

    fed = make_fed("local")
    fed.require_quorum(3, 3, "collect")
    with pytest.raises(
        BelowThreshold, match=r"2 participants alive, below the minimum survivors \(3\)"
    ):
        fed.require_quorum(2, 3, "collect")


def own_and_shared(ctx):
    """p0 draws its own whole release, p1 a share of the shared one: equal events, scope run."""
    release = WHOLE if ctx.name == "p0" else SHARED
    value, event = release(ctx.noise, np.array([1.0]))
    return Message("release", value, dp_event=event, scope="run")


def test_a_shared_release_never_covers_another_messages_release(backend):
    """The review's order-dependent hole: a whole release and a share of a shared one, whose
    events are equal, were one item to verify in one order and two in the other. Each whole
    release needs its own charge, in any order."""
    with make_fed(backend, epsilon=4.0) as fed:
        fed.charge([SHARED.charge("run")])
        with pytest.raises(UnaccountedNoise, match="sent twice"):
            fed.parties.run(own_and_shared, phase="both")
    with make_fed(backend, epsilon=4.0) as fed:
        fed.charge([SHARED.charge("run"), WHOLE.charge("run")])
        fed.parties.run(own_and_shared, phase="both")
