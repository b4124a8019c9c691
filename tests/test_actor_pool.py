"""Actors of a finished run serve the next run of the same shape (backends.WarmActors): the same
processes, and results equal to fresh actors'; a run with a death or a fault leaves none behind."""

import os
import sys

import numpy as np
import pyarrow as pa
import pytest
import ray.cloudpickle

import rayfed
from rayfed.actors import Message
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.runtime import session

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.ray


def where_and_what(ctx, round_no):
    """This process, the member's table and state left by earlier steps, and a seeded draw."""
    seen = ctx.state.get("seen", 0)
    ctx.state["seen"] = seen + 1
    x = ctx.table.column("x").to_numpy()
    return Message(
        "pid", (os.getpid(), int(x.sum()), seen, ctx.rng("synthetic", round_no).random())
    )


def _run(seed: int, offset: int = 0, fail=None) -> dict:
    cohorts = {f"c{i}": (pa.table({"x": np.arange(5) + 10 * i + offset}), {}) for i in range(2)}
    with Federation(
        run_id="pool",
        seed=seed,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("test"),
        faults=fail,
    ) as fed:
        return fed.get(fed.cohorts.run(where_and_what, 0, phase="p"))


def _gone(handle, within_s: float = 20.0) -> bool:
    """Whether the actor answers RayActorError within ``within_s`` (ray.kill is asynchronous: a
    call right after it may still be served)."""
    import time

    until = time.monotonic() + within_s
    while time.monotonic() < until:
        try:
            ray.get(handle.ping.remote(), timeout=within_s)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


def test_a_second_run_reuses_the_processes_and_starts_clean(ray_cluster):
    session().warm.drain()
    first = _run(seed=1)
    second = _run(seed=2, offset=100)
    again = _run(seed=1)
    pids = lambda out: {v[0] for v in out.values()}  # noqa: E731
    assert pids(second) == pids(first) == pids(again)  # no new process
    # the new run's tables and seed, and no state from the run before
    assert [v[1:3] for v in second.values()] == [(510, 0), (560, 0)]
    assert again == first


def test_a_run_with_a_fault_leaves_no_actor_behind(ray_cluster):
    from rayfed.faults import parse

    session().warm.drain()
    first = _run(seed=1)
    with pytest.raises(rayfed.PartyFailed):
        _run(seed=1, fail=[parse("cohort=c0@phase=p")])
    third = _run(seed=1)
    assert not ({v[0] for v in third.values()} & {v[0] for v in first.values()})
    assert [v[1:] for v in third.values()] == [v[1:] for v in first.values()]


def test_runs_on_reused_actors_equal_runs_on_fresh_ones(ray_cluster):
    options = dict(users=60, dim=4, out_dir=None)
    session().warm.drain()
    fresh = rayfed.run("secure-sum", seed=3, **options)
    rayfed.run("secure-sum", seed=4, **options)  # leaves its actors in the pool
    reused = rayfed.run("secure-sum", seed=3, **options)
    assert fresh.tables["sum"].equals(reused.tables["sum"])
    assert fresh.noise_fingerprints == reused.noise_fingerprints


def test_idle_actors_are_stopped_after_a_while(ray_cluster, monkeypatch):
    """They hold CPUs another process's run (a job joining this Ray) may need."""
    import time

    from rayfed.backends import WarmActors

    monkeypatch.setattr(WarmActors, "IDLE_S", 0.3)
    session().warm.drain()
    first = _run(seed=1)
    time.sleep(1.5)
    later = _run(seed=1)
    assert not ({v[0] for v in later.values()} & {v[0] for v in first.values()})


def test_the_warm_actors_belong_to_the_ray_session_and_end_with_it(ray_cluster):
    warm = session().warm
    warm.drain()
    first = _run(seed=1)
    assert session().warm is warm and len(warm) == 3  # the coordinator and both cohorts
    idle = [h for handles in warm._idle.values() for h in handles]
    session().close()  # what rayfed.shutdown does before Ray stops
    assert len(warm) == 0
    assert all(_gone(handle) for handle in idle)  # killed, not merely forgotten
    later = _run(seed=1)
    assert not ({v[0] for v in later.values()} & {v[0] for v in first.values()})
