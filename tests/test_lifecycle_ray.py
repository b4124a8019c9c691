"""The member lifecycle on Ray, where the backend restarts its members itself: a member called
again while its restart runs is brought back first (no new death spent), a member the backend
cannot bring back is dropped for good, and each Ray session has its own warm actors."""

import sys

import numpy as np
import pyarrow as pa
import pytest
import ray.cloudpickle

from rayfed.actors import Message
from rayfed.faults import Fault
from rayfed.federation import Federation
from rayfed.lifecycle import MemberState
from rayfed.privacy import PrivacyDeclaration

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.ray


def _seen(ctx, round_no):
    """The member's table sum, and how many steps this instance has run (0 after a restart)."""
    seen = ctx.state.get("seen", 0)
    ctx.state["seen"] = seen + 1
    return Message("seen", (int(ctx.table.column("x").to_numpy().sum()), seen))


def _cohorts():
    return {f"c{i}": (pa.table({"x": np.arange(4) + 10 * i}), {}) for i in range(2)}


def test_a_member_called_again_while_ray_restarts_it_is_brought_back_first(ray_cluster):
    """c0 (one restart) dies in round 0's phase p; phase q of the same round calls it while Ray
    is still restarting it. That is no second death: it is awaited, reloaded and answers q, and
    every later round, like the in-process backend's rebuilt member."""
    fed = Federation(
        run_id="life-ray",
        seed=1,
        cohorts=_cohorts(),
        privacy=PrivacyDeclaration.none("test"),
        faults=[Fault("cohorts", "c0", round=0)],
        cohort_restarts=1,
        deadline_s=30,
    )
    failed = []
    with fed:
        for r in range(3):
            with fed.round(r):
                for phase in ("p", "q"):
                    replies = fed.cohorts.run(_seen, r, phase=phase, on_failure="drop")
                    failed.append((r, phase, sorted(replies.failed), fed.get(replies)))
        c0 = fed.lifecycle.member("c0")
        assert (c0.state, c0.deaths, c0.restarts) == (MemberState.RUNNING, 1, 1)
    assert failed == [
        (0, "p", ["c0"], {"c1": (46, 0)}),
        (0, "q", [], {"c0": (6, 0), "c1": (46, 1)}),  # restarted and reloaded: a fresh state
        (1, "p", [], {"c0": (6, 1), "c1": (46, 2)}),
        (1, "q", [], {"c0": (6, 2), "c1": (46, 3)}),
        (2, "p", [], {"c0": (6, 3), "c1": (46, 4)}),
        (2, "q", [], {"c0": (6, 4), "c1": (46, 5)}),
    ]
    assert [(x["round"], x["phase"], x["member"], x["fate"]) for x in fed.losses()] == [
        (0, "p", "c0", "resumed")
    ]
    assert (fed.losses()[0]["back_round"], fed.losses()[0]["back_phase"]) == (0, "q")


def test_a_member_ray_does_not_bring_back_is_killed_and_dropped_for_good(ray_cluster):
    """The restart is not back within the wait (revive says None): the actor is killed, so it
    cannot come back unloaded later; every later call fails without a new loss row."""
    fed = Federation(
        run_id="life-ray",
        seed=1,
        cohorts=_cohorts(),
        privacy=PrivacyDeclaration.none("test"),
        faults=[Fault("cohorts", "c0", round=0)],
        cohort_restarts=1,
        deadline_s=30,
    )
    fed.backend.revive = lambda handle, rebuild, member, wait_s: None
    failed = []
    with fed:
        for r in range(2):
            with fed.round(r):
                replies = fed.cohorts.run(_seen, r, phase="p", on_failure="drop")
                failed.append(sorted(replies.failed))
        c0 = fed.lifecycle.member("c0")
        assert (c0.state, c0.deaths, c0.restarts) == (MemberState.DEAD, 1, 0)
        with pytest.raises(ray.exceptions.RayActorError):  # killed, not restarting
            ray.get(fed.cohorts.handles["c0"].ping.remote(), timeout=30)
    assert failed == [["c0"], ["c0"]]
    assert [(x["round"], x["member"], x["fate"]) for x in fed.losses()] == [
        (0, "c0", "dropped for good")
    ]


def test_a_new_ray_session_gets_a_new_rayfed_session(ray_cluster):
    """ray.shutdown(); ray.init() again: the job id is the same ('01000000'), the session is not,
    and neither are its warm actors (the old ones went with the old Ray)."""
    import rayfed
    from rayfed.runtime import session

    first = session()
    assert session() is first  # one Ray session, one rayfed session
    job = ray.get_runtime_context().get_job_id()
    ray.shutdown()  # elsewhere, not rayfed.shutdown: rayfed is not told
    rayfed.ensure_ray(num_cpus=2)  # the suite's Ray again, for the tests after this one
    assert ray.get_runtime_context().get_job_id() == job
    second = session()
    assert second is not first and second.key != first.key and len(second.warm) == 0
