"""A bounded replacement (Neighbours.within), the Unbounded domain, a public linear map in a
derived sensitivity (PublicMap) and the Subroutine mechanism — the core pieces vfl-primitives'
two neighbour relations are built from (its own tests check them end to end)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from rayfed.clustering.dplsf import dplsf, dplsf_centers, dplsf_event
from rayfed.errors import UnaccountedNoise
from rayfed.privacy import (
    Ball,
    Declared,
    Gaussian,
    Interval,
    KaryResponse,
    Laplace,
    Measurement,
    Neighbours,
    NoiseSource,
    OneHot,
    PublicMap,
    Subroutine,
    Unbounded,
    sensitivity,
)

REPLACE = Neighbours("replace_one", "user's data", at_one_party=True)


def moved(by: float) -> Neighbours:
    return Neighbours("replace_one", "user's entry", at_one_party=True, within=by)


@pytest.mark.parametrize(
    "domain,by,p,expected",
    [
        (Interval(0, 400), 1.0, 1, 1.0),  # the paper's event-level move on a wide domain
        (Interval(0, 400), 1.0, 2, 1.0),
        (Interval(0, 0.5), 1.0, 1, 0.5),  # the domain is the tighter bound
        (Ball(1.0, 2, 4), 0.5, 2, 0.5),
        (Ball(1.0, 2, 4), 0.5, 1, 0.5 * 2),  # ‖v‖₁ <= √4·‖v‖₂
        (Ball(1.0, 2, 4), 5.0, 2, 2.0),
        (Unbounded(3), 2.0, 2, 2.0),
        (Unbounded(4), 2.0, 1, 4.0),
        (OneHot(5), 0.1, 0, 2.0),  # any move of a category changes two bits
    ],
)
def test_a_bounded_move_caps_the_diameter(domain, by, p, expected):
    assert sensitivity(domain, moved(by), p) == pytest.approx(expected, rel=1e-12)
    assert sensitivity(domain, REPLACE, p) >= expected


def test_a_bounded_move_is_a_replacement_with_a_finite_positive_bound_and_says_so():
    assert moved(1).describe() == "one user's entry replaced at one party, moved by at most 1"
    with pytest.raises(ValueError, match="replacement"):
        Neighbours("add_or_remove_one", "user", within=1.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="within"):
            moved(bad)


@pytest.mark.parametrize(
    "domain,p", [(Interval(-1, 3), 1), (Ball(2.0, 2, 4), 2), (Ball(2.0, 2, 4), 1), (OneHot(5), 0)]
)
def test_zero_out_moves_a_unit_to_the_empty_record_by_the_radius(domain, p):
    """Zero-out (replace_special) replaces the unit's data by the empty record, which contributes
    zero: the radius, as add/remove — not the diameter a replacement needs."""
    zero_out = Neighbours("replace_special", "user")
    assert sensitivity(domain, zero_out, p) == domain.radius(p)
    assert sensitivity(domain, Neighbours("replace_one", "user"), p) == domain.diameter(p)
    assert zero_out.describe() == (
        "one user's data replaced by the empty record (zero-out: the user stays and takes part)"
    )
    with pytest.raises(ValueError, match="replacement"):
        Neighbours("replace_special", "user", within=1.0)


@pytest.mark.parametrize("kind", ["add_or_remove_one", "replace_special"])
def test_a_per_report_randomizer_is_refused_unless_replace_one(kind):
    """Randomized response of an absent or emptied user is not bounded by the radius rule, and
    dp-accounting's REPLACE_SPECIAL curve for it assumes the special report is uniform: k-ary RR
    at ε = 2 would be charged 1.67 under zero-out."""
    with pytest.raises(ValueError, match="replace-one neighbours only"):
        Measurement("x", KaryResponse(16, 2.0), OneHot(16), Neighbours(kind, "user"))
    m = Measurement("x", KaryResponse(16, 2.0), OneHot(16), Neighbours("replace_one", "user"))
    assert m.sensitivity == 2


def test_unbounded_data_has_a_sensitivity_only_under_a_bounded_move():
    with pytest.raises(ValueError, match="unbounded"):
        Measurement("x", Laplace(1.0), Unbounded(), REPLACE)
    assert Measurement("x", Laplace(1.0), Unbounded(), moved(3.0)).sensitivity == 3.0


def test_a_public_map_scales_the_derived_sensitivity_and_is_stated():
    sketch = PublicMap(19.0, "sketch G, column norms <= 19")
    m = Measurement("s", Gaussian(3.0), Ball(1.0, 2, 10), REPLACE, through=sketch)
    assert m.sensitivity == pytest.approx(2 * 19.0)
    assert "× 19: sketch G" in m.describe() and "Δ2 = 38" in m.describe()
    assert (
        Measurement("s", Gaussian(3.0), Unbounded(10), moved(1.0), through=sketch).sensitivity == 19
    )
    with pytest.raises(ValueError, match="declared"):
        Measurement("s", Gaussian(3.0), Ball(1.0), REPLACE, Declared(5, "why"), through=sketch)
    for bad in (0.0, math.inf):
        with pytest.raises(ValueError, match="norm"):
            PublicMap(bad, "why")


def _dplsf_release(eps: float, d: int) -> Measurement:
    return Measurement(
        "local DPLSF",
        Subroutine(
            functools.partial(dplsf_centers, epsilon=eps, replace_one=True),
            dplsf_event(eps, d, replace_one=True),
            for_relation=REPLACE.kind,
        ),
        Ball(1.0, 2, d),
        REPLACE,
        declared=Declared(1, "DPLSF is DP for one point"),
    )


def test_a_subroutine_draws_as_its_algorithm_and_registers_its_whole_event_once():
    """DPLSF through the Subroutine measurement: the same centers as dplsf (the same draws,
    bit for bit), one event — its charge, every tree level — registered, and the step's
    message carrying it passes the whole-event check; dplsf's own registrations (a level each,
    fewer than charged when the tree stops early) do not."""
    gen = np.random.default_rng(0)
    x = np.clip(gen.normal(0, 0.3, (400, 3)), -1, 1)
    release = _dplsf_release(1.0, 3)
    source = NoiseSource.seeded(5, "p0")
    centers, event = release(source, x, k=3)
    assert event == dplsf_event(1.0, 3, replace_one=True) == release.event
    source.check_all_carried([event])
    reference = NoiseSource.seeded(5, "p0")
    expected, own, _ = dplsf(reference, x, 3, 1.0, replace_one=True)
    assert np.array_equal(centers, expected) and own == event
    with pytest.raises(UnaccountedNoise):
        reference.check_all_carried([own])
    twice = Measurement(
        "twice", release.mechanism, Ball(1.0, 2, 3), REPLACE, declared=Declared(2, "two points")
    )
    with pytest.raises(ValueError, match="Δ₀ = 1"):
        twice.charge("p0")
