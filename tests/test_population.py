"""Population models of rayfed.dropout: Markov on/off availability (with a diurnal cycle), group
outages, trace replay and stragglers against deadlines. References are computed here from the
models' definitions (closed forms, hand-built cases), not from the code under test; statistical
tolerances are 4 binomial standard deviations at fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from scipy.stats import norm

from rayfed.dropout import NEVER, DropoutSchedule, Markov, Outage, Stragglers, Trace
from rayfed.errors import ConfigError

N = 200_000
IDS = np.arange(N, dtype=np.int64)


def within(observed: float, p: float, n: int) -> bool:
    return abs(observed - p) <= 4 * math.sqrt(p * (1 - p) / n)


def test_markov_starts_stationary_and_switches_at_its_rates():
    model = Markov(off=0.2, on=0.6)
    before, after = model.online(1, 5, IDS), model.online(1, 6, IDS)
    assert within(before.mean(), 0.6 / 0.8, N)
    went_off = (before & ~after).sum() / before.sum()
    came_on = (~before & after).sum() / (~before).sum()
    assert within(went_off, 0.2, int(before.sum()))
    assert within(came_on, 0.6, int((~before).sum()))


def test_markov_diurnal_rates_follow_the_cycle():
    """At round period/4 the wave is at its top: off·(1 + a), on·(1 - a)."""
    model = Markov(off=0.2, on=0.5, diurnal=0.5, period=8)
    before, after = model.online(3, 1, IDS), model.online(3, 2, IDS)
    assert within((before & ~after).sum() / before.sum(), 0.2 * 1.5, int(before.sum()))
    assert within((~before & after).sum() / (~before).sum(), 0.5 * 0.5, int((~before).sum()))


def test_models_do_not_depend_on_how_users_are_split():
    schedule = DropoutSchedule(
        rates={"after_share_keys": 0.1},
        availability=(Markov(off=0.3, on=0.4, diurnal=0.2),),
        stragglers=Stragglers(median_s=1.0, sigma=1.0, deadline_s=3.0),
    )
    ids = IDS[:5000]
    whole = schedule.drop_phase(7, 4, ids)
    parts = np.concatenate(
        [schedule.drop_phase(7, 4, ids[::2]), schedule.drop_phase(7, 4, ids[1::2])]
    )
    assert np.array_equal(whole, parts[np.argsort(np.r_[ids[::2], ids[1::2]])])
    assert np.array_equal(whole, schedule.drop_phase(7, 4, ids))  # same seed: same survivors
    assert not np.array_equal(whole, schedule.drop_phase(8, 4, ids))


def test_an_outage_takes_its_group_offline_for_its_rounds_only():
    region = tuple(range(100, 200))
    schedule = DropoutSchedule(availability=(Outage("region-3", region, start=2, rounds=3),))
    ids = np.arange(300)
    for round in range(7):
        drop = schedule.drop_phase(0, round, ids)
        offline = 2 <= round < 5
        assert np.all(drop[100:200] == (0 if offline else NEVER))
        assert np.all(drop[:100] == NEVER) and np.all(drop[200:] == NEVER)


def test_a_trace_is_replayed(tmp_path):
    path = tmp_path / "trace.csv"
    rows = {
        "user": [0, 1, 2, 1, 2],
        "round": [0, 0, 0, 1, 1],
        "available": [True, False, True, True, True],
        "latency_s": [0.5, 9.0, 30.0, 1.0, 2.0],
    }
    pacsv.write_csv(pa.table(rows), path)
    trace = Trace.read(path)
    ids = np.array([0, 1, 2, 3])
    assert trace.online(0, 0, ids).tolist() == [True, False, True, True]  # user 3: not listed
    assert trace.online(0, 1, ids).tolist() == [True, True, True, True]
    np.testing.assert_array_equal(trace.latency(0, ids), [0.5, 9.0, 30.0, np.nan])
    schedule = DropoutSchedule(
        availability=(trace,),
        stragglers=Stragglers(sigma=0.0, median_s=1.0, deadline_s=10.0, trace=trace),
    )
    # round 0: user 1 is offline, user 2's recorded 30 s misses the advertise deadline
    assert schedule.drop_phase(0, 0, ids).tolist() == [NEVER, 0, 0, NEVER]
    assert schedule.drop_phase(0, 1, ids).tolist() == [NEVER] * 4


def test_a_trace_names_its_missing_columns(tmp_path):
    path = tmp_path / "trace.csv"
    pacsv.write_csv(pa.table({"user": [0], "round": [0]}), path)
    with pytest.raises(Exception, match="available"):
        Trace.read(path)


def test_stragglers_miss_the_deadline_as_often_as_the_log_normal_says():
    """q = P(latency > deadline) = 1 - Φ(ln(deadline/median)/σ) per phase; a user's first late
    phase decides its dropout phase: advertise or share_keys -> before_advertise, masked_input ->
    after_share_keys, unmask -> during_unmask."""
    model = Stragglers(median_s=2.0, sigma=0.8, deadline_s=4.0)
    q = 1 - norm.cdf(math.log(4.0 / 2.0) / 0.8)
    drop = model.missed(5, 0, IDS)
    assert within((drop == 0).mean(), 1 - (1 - q) ** 2, N)
    assert within((drop == 1).mean(), (1 - q) ** 2 * q, N)
    assert within((drop == 3).mean(), (1 - q) ** 3 * q, N)
    assert within((drop == NEVER).mean(), (1 - q) ** 4, N)
    assert not np.any(drop == 2)


def test_the_simulated_clock_waits_for_the_slowest_or_the_deadline():
    ids = np.arange(4)
    quick = Stragglers(median_s=1.5, sigma=0.0, deadline_s=10.0)  # every answer takes 1.5 s
    assert DropoutSchedule(stragglers=quick).simulated_seconds(0, 0, ids) == dict.fromkeys(
        ("advertise", "share_keys", "masked_input", "unmask"), 1.5
    )
    gone = DropoutSchedule(explicit={"after_masked_input": [2]}, stragglers=quick)
    assert gone.simulated_seconds(0, 0, ids) == {
        "advertise": 1.5,
        "share_keys": 1.5,
        "masked_input": 1.5,
        "unmask": 10.0,  # user 2's answer never comes: the server waits out the deadline
    }
    assert DropoutSchedule().simulated_seconds(0, 0, ids) == dict.fromkeys(
        ("advertise", "share_keys", "masked_input", "unmask"), 0.0
    )


@pytest.mark.parametrize(
    "make,field",
    [
        (lambda: Markov(off=0.0, on=0.5), "population.markov_off"),
        (lambda: Markov(off=0.2, on=0.5, diurnal=1.0), "population.diurnal"),
        (lambda: Stragglers(deadline_s=0.0), "population.latency_deadline_s"),
        (lambda: Stragglers(sigma=-1.0), "population.latency_sigma"),
    ],
)
def test_bad_model_parameters_name_their_option(make, field):
    with pytest.raises(ConfigError) as err:
        make()
    assert err.value.field == field
