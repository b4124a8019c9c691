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

from rayfed.dropout import (
    LATE,
    LOST,
    OFFLINE,
    ONLINE,
    DropoutSchedule,
    Markov,
    Outage,
    Phases,
    Stragglers,
    Trace,
)
from rayfed.errors import ConfigError
from rayfed.secagg.phases import NEVER, PHASES, drop_codes, schedule

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
    model = schedule(
        rates={"masked_input": 0.1},
        availability=(Markov(off=0.3, on=0.4, diurnal=0.2),),
        stragglers=Stragglers(median_s=1.0, sigma=1.0, deadline_s=3.0),
    )
    ids = IDS[:5000]
    whole = model.drop_phase(7, 4, ids)
    parts = np.concatenate([model.drop_phase(7, 4, ids[::2]), model.drop_phase(7, 4, ids[1::2])])
    assert np.array_equal(whole, parts[np.argsort(np.r_[ids[::2], ids[1::2]])])
    assert np.array_equal(whole, model.drop_phase(7, 4, ids))  # same seed: same survivors
    assert not np.array_equal(whole, model.drop_phase(8, 4, ids))


def test_an_outage_takes_its_group_offline_for_its_rounds_only():
    region = tuple(range(100, 200))
    model = schedule(availability=(Outage("region-3", region, start=2, rounds=3),))
    ids = np.arange(300)
    for round in range(7):
        drop = model.drop_phase(0, round, ids)
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
    model = schedule(
        availability=(trace,),
        stragglers=Stragglers(sigma=0.0, median_s=1.0, deadline_s=10.0, trace=trace),
    )
    # round 0: user 1 is offline, user 2's recorded 30 s misses the advertise deadline
    first = model.round(0, 0, ids)
    assert first.phase.tolist() == [NEVER, 0, 0, NEVER]
    assert first.state.tolist() == [ONLINE, OFFLINE, LATE, ONLINE]
    assert model.drop_phase(0, 1, ids).tolist() == [NEVER] * 4


def test_a_trace_names_its_missing_columns(tmp_path):
    path = tmp_path / "trace.csv"
    pacsv.write_csv(pa.table({"user": [0], "round": [0]}), path)
    with pytest.raises(Exception, match="available"):
        Trace.read(path)


def test_stragglers_miss_the_deadline_as_often_as_the_log_normal_says():
    """q = P(latency > deadline) = 1 - Φ(ln(deadline/median)/σ) per phase: a member is late at
    its first late phase c with probability (1-q)^c·q. SecAgg maps a late share_keys answer to
    a loss at advertise (its shares leave it out before any mask involves it): codes 0, 2, 3
    then come with 1-(1-q)^2, (1-q)^2·q, (1-q)^3·q, and code 1 (lost at share_keys) never."""
    model = Stragglers(median_s=2.0, sigma=0.8, deadline_s=4.0)
    q = 1 - norm.cdf(math.log(4.0 / 2.0) / 0.8)
    first = model.missed(5, 0, IDS, 4)
    for c in range(4):
        assert within((first == c).mean(), (1 - q) ** c * q, N)
    assert within((first == 4).mean(), (1 - q) ** 4, N)
    drop = drop_codes(schedule(stragglers=model), 5, 0, IDS)
    assert within((drop == 0).mean(), 1 - (1 - q) ** 2, N)
    assert within((drop == 2).mean(), (1 - q) ** 2 * q, N)
    assert within((drop == 3).mean(), (1 - q) ** 3 * q, N)
    assert within((drop == NEVER).mean(), (1 - q) ** 4, N)
    assert not np.any(drop == 1)


def test_the_simulated_clock_waits_for_the_slowest_or_the_deadline():
    ids = np.arange(4)
    quick = Stragglers(median_s=1.5, sigma=0.0, deadline_s=10.0)  # every answer takes 1.5 s
    assert schedule(stragglers=quick).simulated_seconds(0, 0, ids) == dict.fromkeys(
        ("advertise", "share_keys", "masked_input", "unmask"), 1.5
    )
    gone = schedule(explicit={"unmask": [2]}, stragglers=quick)
    assert gone.simulated_seconds(0, 0, ids) == {
        "advertise": 1.5,
        "share_keys": 1.5,
        "masked_input": 1.5,
        "unmask": 10.0,  # user 2's answer never comes: the server waits out the deadline
    }
    assert schedule().simulated_seconds(0, 0, ids) == dict.fromkeys(
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


# --- the availability vocabulary: online, offline, late, lost at a phase of the protocol's own ------
def test_availability_says_online_offline_late_or_lost_in_the_protocols_phases():
    """A made-up three-phase protocol, by hand: user 1 listed lost at work, user 2 in an outage,
    user 3's recorded 30 s misses the first deadline, user 4 lost at bye; user 5 is listed lost
    at hello and offline too (offline comes first at the same phase)."""
    phases = Phases(("hello", "work", "bye"))
    trace = Trace(np.array([3]), np.array([0]), np.array([True]), np.array([30.0]))
    model = DropoutSchedule(
        phases,
        explicit={"work": [1], "bye": [4], "hello": [5]},
        availability=(Outage("down", (2, 5)),),
        stragglers=Stragglers(median_s=1.0, sigma=0.0, deadline_s=10.0, trace=trace),
    )
    got = model.round(0, 0, np.arange(6))
    assert got.state.tolist() == [ONLINE, LOST, OFFLINE, LATE, LOST, OFFLINE]
    assert got.phase.tolist() == [3, 1, 0, 0, 2, 0]
    assert (got.phase > phases.index("work")).tolist() == [True, False, False, False, True, False]
    with pytest.raises(ConfigError) as err:
        DropoutSchedule(phases, rates={"advertise": 0.1})
    assert err.value.field == "population.rates.advertise" and "hello" in str(err.value)


def test_a_loss_rate_reads_its_phases_column_of_the_keyed_uniforms():
    """The draws predate the phase names and must not move: a one-phase protocol's rate reads
    column 0, SecAgg's advertise, masked_input and unmask read columns 0, 1 and 2 (the former
    before_advertise, after_share_keys, after_masked_input). Reference: rng directly."""
    from rayfed import rng

    ids = IDS[:20_000]
    u = rng.keyed_uniform(11, "dropout", 3, ids, 4)
    report = DropoutSchedule(Phases(("report",)), rates={"report": 0.2})
    assert np.array_equal(report.drop_phase(11, 3, ids) == 0, u[:, 0] < 0.2)
    for phase, column in (("advertise", 0), ("masked_input", 1), ("unmask", 2), ("share_keys", 3)):
        lost = schedule(rates={phase: 0.2}).drop_phase(11, 3, ids) == PHASES.index(phase)
        assert np.array_equal(lost, u[:, column] < 0.2), phase
    assert LOST == schedule(rates={"unmask": 1.0}).round(11, 3, ids[:1]).state[0]
