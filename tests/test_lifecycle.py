"""The members' state machine (rayfed.lifecycle): every transition, the invalid ones refused,
the restart allowance counted per member, the wait set and the loss log it writes. Pure Python."""

import pytest

from rayfed.lifecycle import TRANSITIONS, Lifecycle, LifecycleError, MemberState

P, R, S, D = (
    MemberState.PENDING,
    MemberState.RUNNING,
    MemberState.RESTARTING,
    MemberState.DEAD,
)


def _life(cohort_restarts: int = 1) -> Lifecycle:
    life = Lifecycle({"cohort": cohort_restarts})
    life.add("coordinator", "coordinator")
    life.add("parties", "alice", "party")
    for name in ("c0", "c1"):
        life.add("cohorts", name, "cohort")
    return life


def _started(cohort_restarts: int = 1) -> Lifecycle:
    life = _life(cohort_restarts)
    for name in ("coordinator", "alice", "c0", "c1"):
        life.started(name)
    return life


def test_the_transition_table_is_the_documented_one():
    # written out independently of the module: (from, transition) -> to
    expected = {
        (P, "started"): R,
        (R, "answered"): R,
        (R, "died"): S,
        (S, "died"): S,
        (S, "restarted"): R,
        (S, "gave up"): D,
    }
    got = {(src, t): dst for t, (srcs, dst) in TRANSITIONS.items() for src in srcs}
    assert got == expected


def test_a_member_is_pending_then_running():
    life = _life()
    assert {n: life.state(n) for n in ("coordinator", "alice", "c0")} == dict.fromkeys(
        ("coordinator", "alice", "c0"), P
    )
    life.started("c0")
    assert life.state("c0") is R and life.state("c1") is P
    life.answered(["c0"], 0, "p")
    assert life.state("c0") is R


def test_death_restart_and_death_for_good_spend_the_members_own_allowance():
    life = _started(cohort_restarts=2)
    assert life.died("c0", 1, "advertise", users=5) is S
    assert life.waiting() == [("cohorts", "c0")]
    life.restarted("c0")
    assert life.state("c0") is R and life.waiting() == []
    assert life.died("c0", 2, "unmask") is S
    life.restarted("c0")
    # c1's allowance is its own: two of c0's deaths leave it untouched
    assert life.died("c1", 2, "unmask") is S
    assert life.died("c0", 3, "advertise") is D  # third death, allowance 2: given up
    assert life.member("c0").deaths == 3 and life.member("c0").restarts == 2
    assert life.member("c1").deaths == 1 and life.member("c1").restarts == 0
    assert life.waiting() == [("cohorts", "c1")]


def test_a_role_without_restarts_dies_for_good_at_once():
    life = _started(cohort_restarts=3)
    assert life.died("alice", 0, "ring") is D  # parties have no allowance
    assert life.waiting() == []
    assert [x["fate"] for x in life.losses()] == ["dropped for good"]


def test_a_dead_member_dying_again_is_no_new_loss_but_is_counted():
    life = _started(cohort_restarts=0)
    assert life.died("c0", 0, "p") is D
    assert life.died("c0", 1, "q") is D
    assert len(life.losses()) == 1 and life.deaths == 2


@pytest.mark.parametrize(
    "state, transition",
    [
        (P, "answered"),
        (P, "died"),
        (P, "restarted"),
        (R, "started"),
        (R, "restarted"),
        (R, "gave up"),
        (S, "started"),
        (S, "answered"),
        (D, "started"),
        (D, "answered"),
        (D, "restarted"),
        (D, "gave up"),
    ],
)
def test_invalid_transitions_raise(state, transition):
    life = _life(cohort_restarts=1)
    if state is not P:
        life.started("c0")
    if state is S:
        life.died("c0", 0, "p")
    if state is D:
        life.died("c0", 0, "p")
        life.gave_up("c0")
    assert life.state("c0") is state
    do = {
        "started": lambda: life.started("c0"),
        "answered": lambda: life.answered(["c0"], 1, "q"),
        "died": lambda: life.died("c0", 1, "q"),
        "restarted": lambda: life.restarted("c0"),
        "gave up": lambda: life.gave_up("c0"),
    }[transition]
    with pytest.raises(LifecycleError, match=transition):
        do()
    assert life.state("c0") is state  # a refused move changes nothing


def test_unknown_and_twice_added_members_raise():
    life = _life()
    with pytest.raises(LifecycleError):
        life.state("nobody")
    with pytest.raises(LifecycleError):
        life.add("cohorts", "c0", "cohort")


def test_the_loss_log_follows_the_transitions():
    life = _started(cohort_restarts=1)
    life.died("c0", 1, "advertise", resumes=True, users=7)
    life.restarted("c0")
    life.answered(["c0"], 1, "restore")  # a restore is not the protocol answering
    assert life.losses()[0]["fate"] == "not reported"
    life.answered(["c0", "c1"], 1, "unmask")
    life.died("c1", 2, "advertise")  # restarted below, never asked again
    life.restarted("c1")
    life.died("c1", 3, "p")  # no restart left: the earlier loss died again
    assert life.losses() == [
        dict(
            round=1,
            phase="advertise",
            role="cohort",
            member="c0",
            users=7,
            fate="resumed",
            restored="checkpoint",
            back_round=1,
            back_phase="unmask",
        ),
        dict(
            round=2,
            phase="advertise",
            role="cohort",
            member="c1",
            users=None,
            fate="died again",
            restored=None,
            back_round=None,
            back_phase=None,
        ),
        dict(
            round=3,
            phase="p",
            role="cohort",
            member="c1",
            users=None,
            fate="dropped for good",
            restored=None,
            back_round=None,
            back_phase=None,
        ),
    ]


def test_a_member_the_backend_cannot_bring_back_is_dropped_for_good():
    life = _started(cohort_restarts=1)
    life.died("c0", 1, "p", resumes=True)
    life.gave_up("c0")
    assert life.state("c0") is D and life.waiting() == []
    (loss,) = life.losses()
    assert (loss["fate"], loss["restored"]) == ("dropped for good", None)


def test_a_sessions_warm_actors_are_drained_when_it_closes(monkeypatch):
    """Closing the session kills each idle actor without restart (Ray's kill recorded here; the
    Ray test in test_actor_pool sees the actors gone) and forgets them."""
    import ray

    from rayfed.runtime import Session

    killed = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "kill", lambda handle, no_restart: killed.append((handle, no_restart)))
    session = Session(("session_a", "01000000"))
    a, b, c = object(), object(), object()
    session.warm.give(("Cls", "opts"), a)
    session.warm.give(("Cls", "opts"), b)
    session.warm.give(("Other", "opts"), c)
    assert len(session.warm) == 3
    session.close()
    assert sorted(map(id, (h for h, _ in killed))) == sorted(map(id, (a, b, c)))
    assert all(no_restart is True for _, no_restart in killed)
    assert len(session.warm) == 0 and session.warm.take(("Cls", "opts")) is None


def _seen(ctx, round_no):
    """The member's table sum, and how many steps this instance has run (0 after a rebuild)."""
    from rayfed.actors import Message

    seen = ctx.state.get("seen", 0)
    ctx.state["seen"] = seen + 1
    return Message("seen", (int(ctx.table.column("x").to_numpy().sum()), seen))


def test_a_federation_asks_the_lifecycle_whom_to_restart():
    """In-process: c0 (allowance 1) is rebuilt after its first death and given up after its
    second; c1 never dies and keeps its state; a dead c0 called again is no new loss."""
    import numpy as np
    import pyarrow as pa

    from rayfed.faults import Fault
    from rayfed.federation import Federation
    from rayfed.privacy import PrivacyDeclaration

    cohorts = {f"c{i}": (pa.table({"x": np.arange(4) + 10 * i}), {}) for i in range(2)}
    fed = Federation(
        run_id="life",
        seed=1,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("test"),
        backend="local",
        faults=[Fault("cohorts", "c0", round=0), Fault("cohorts", "c0", round=2)],
        cohort_restarts=1,
    )
    with fed:
        assert fed.lifecycle.state("c0") is R and fed.lifecycle.state("coordinator") is R
        seen = []
        for r in range(4):
            with fed.round(r):
                replies = fed.cohorts.run(_seen, r, phase="p", on_failure="drop")
                seen.append((sorted(replies.failed), fed.get(replies)))
        life = fed.lifecycle
        assert (life.state("c0"), life.member("c0").deaths, life.member("c0").restarts) == (D, 2, 1)
        assert (life.state("c1"), life.member("c1").deaths) == (R, 0)
    assert seen == [
        (["c0"], {"c1": (46, 0)}),
        ([], {"c0": (6, 0), "c1": (46, 1)}),  # c0 rebuilt from its partition: a fresh state
        (["c0"], {"c1": (46, 2)}),
        (["c0"], {"c1": (46, 3)}),  # dead for good: fails again
    ]
    assert [(x["round"], x["member"], x["fate"], x["back_round"]) for x in fed.losses()] == [
        (0, "c0", "resumed", 1),
        (2, "c0", "dropped for good", None),
    ]


def _local_fed(deadline_s: float = 30.0):
    import numpy as np
    import pyarrow as pa

    from rayfed.faults import Fault
    from rayfed.federation import Federation
    from rayfed.privacy import PrivacyDeclaration

    cohorts = {f"c{i}": (pa.table({"x": np.arange(4) + 10 * i}), {}) for i in range(2)}
    return Federation(
        run_id="life",
        seed=1,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("test"),
        backend="local",
        faults=[Fault("cohorts", "c0", round=0)],
        cohort_restarts=1,
        deadline_s=deadline_s,
    )


@pytest.mark.parametrize("deadline_s", [5.0, 120.0])
def test_a_member_the_backend_does_not_bring_back_is_given_up_for_good(deadline_s):
    """The backend's revive returns None (on Ray: no restart within the wait): the member is
    given up, its handle is the backend's dead one, its loss row says dropped for good, and later
    calls fail without a new row. The wait is a startup's: max(deadline_s, 60 s)."""
    from rayfed.backends import Dead

    fed = _local_fed(deadline_s)
    waits = []

    def revive(handle, rebuild, member, wait_s):
        waits.append((member[0], wait_s))
        return None

    fed.backend.revive = revive
    failed = []
    with fed:
        for r in range(3):
            with fed.round(r):
                replies = fed.cohorts.run(_seen, r, phase="p", on_failure="drop")
                failed.append((sorted(replies.failed), fed.get(replies)))
        c0 = fed.lifecycle.member("c0")
        assert (c0.state, c0.deaths, c0.restarts) == (D, 1, 0)
        assert isinstance(fed.cohorts.handles["c0"], Dead)
        assert fed.lifecycle.waiting() == []
    assert waits == [("c0", max(deadline_s, 60.0))]
    assert failed == [
        (["c0"], {"c1": (46, 0)}),
        (["c0"], {"c1": (46, 1)}),
        (["c0"], {"c1": (46, 2)}),
    ]
    assert [(x["round"], x["member"], x["fate"], x["restored"]) for x in fed.losses()] == [
        (0, "c0", "dropped for good", None)
    ]
