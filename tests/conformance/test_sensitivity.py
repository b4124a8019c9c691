"""The empirical sensitivity check: for every protocol example, with noise switched off (the
test-only noiseless probe), run on a dataset D and on neighbours D′ built from the declared
relation and data domain — a unit moved from one corner of the domain to the opposite one, a
unit removed, a unit at the domain's farthest point added — and assert that every release moved
by at most its Δ, in its mechanism's norm. D′ replays D's releases, so each release is compared
under the same history (adaptive composition's notion of sensitivity).

The reference is the data, not the code: how far each release actually moved between two
neighbouring datasets. A mis-declared relation (Δ sized for add/remove under a replace-one
statement) is caught: see ``test_sensitivity_check_catches_a_misdeclared_relation``.
"""

from __future__ import annotations

import pytest
from neighbours import Probe, moves, neighbouring_plans, outside_domain

import rayfed
from rayfed.api import _prepare, _reconcile, execute, resolve
from rayfed.privacy.source import noiseless
from rayfed.protocols import get_protocol

PROTOCOLS = sorted(rayfed.PROTOCOLS)
CASES = [
    pytest.param(name, i, id=f"{name}-{i}")
    for name in PROTOCOLS
    for i in range(len(get_protocol(name).examples))
]
#: floating-point slack on a release's move (sums of many floats in another order)
RTOL = 1e-9


def _prepared(name: str, options: dict):
    proto, run_opts, cfg = resolve(name, {"backend": "local", "out_dir": None, **options})
    cfg, run_opts = _reconcile(proto, cfg, run_opts)
    plan, _, _ = _prepare(proto, cfg, run_opts)
    return proto, cfg, run_opts, plan


def _releases(proto, cfg, run_opts, plan, replay=None) -> Probe:
    with noiseless(Probe(replay)) as probe:
        execute(proto, cfg, run_opts, plan)
    return probe


def check(name: str, options: dict) -> list[tuple[str, str, float, float]]:
    """``(neighbours, release, moved, Δ)`` of every release that moved by more than its Δ."""
    proto, cfg, run_opts, plan = _prepared(name, options)
    if not plan.privacy.private:
        return []
    assert plan.privacy.data is not None, f"{name} declares no data domain"
    # the declared domain is the config's, not the data's: another seed's data, the same domain
    other = _prepared(name, {**options, "seed": options.get("seed", 0) + 1})[3]
    assert other.privacy.data == plan.privacy.data, "the data domain depends on the data"
    assert not outside_domain(plan), f"data outside its declared domain: {outside_domain(plan)}"
    excess = []
    pairs = neighbouring_plans(plan)
    assert pairs
    checked = 0
    for what, plan_d, plan_d_prime in pairs:
        d = _releases(proto, cfg, run_opts, plan_d)
        d_prime = _releases(proto, cfg, run_opts, plan_d_prime, replay=d.seen)
        assert d.seen, f"{name}: a private run released nothing through a Measurement"
        for release, moved, delta in moves(d, d_prime):
            checked += 1
            if moved > delta * (1 + RTOL) + 1e-12:
                excess.append((what, release, moved, delta))
    assert checked
    return excess


@pytest.mark.parametrize("name,i", CASES)
def test_every_release_moves_by_at_most_its_sensitivity(name, i):
    excess = check(name, get_protocol(name).examples[i])
    assert not excess, excess


# --- the check catches a mis-declared relation ----------------------------------------------------
@pytest.fixture
def misdeclared(monkeypatch):
    """tests/conformance/misdeclared.py registered as a protocol."""
    from rayfed.protocols import REGISTRY

    monkeypatch.setitem(REGISTRY, "misdeclared-histogram", ("misdeclared", "Misdeclared"))
    return "misdeclared-histogram"


def test_sensitivity_check_catches_a_misdeclared_relation(misdeclared):
    """A histogram declared under replace-one neighbours with Δ₁ = 1 (the add/remove value):
    every other conformance check passes it; this one sees the release move by 2 = twice its Δ.
    With the Δ the domain rule derives (2), it passes."""
    excess = check(misdeclared, {})
    assert excess
    assert all(moved == pytest.approx(2.0) and delta == 1.0 for _, _, moved, delta in excess)
    assert not check(misdeclared, {"honest": True})
    assert rayfed.run(misdeclared, backend="local", out_dir=None).privacy.epsilon == 1.0


@pytest.mark.parametrize(
    "mutant,caught",
    [
        ("mutant-data-domain", "the data domain depends on the data"),
        ("mutant-unenforced", "data outside its declared domain"),
        ("mutant-cancelling-rows", "moved"),
        ("mutant-two-party-sum", "moved"),
    ],
)
def test_the_check_catches_what_a_review_found_it_missed(mutant, caught, monkeypatch):
    """tests/conformance/mutants.py: a domain read off the data, data never enforced, per-user
    rows whose changes cancel in their sum, one release drawn in shares by two parties that
    each hold every user — each passed an earlier version of this check; each fails it now."""
    from mutants import MUTANTS

    from rayfed.protocols import REGISTRY

    monkeypatch.setitem(REGISTRY, mutant, ("mutants", MUTANTS[mutant]))
    if caught == "moved":
        excess = check(mutant, {})
        assert excess and all(moved > delta for _, _, moved, delta in excess)
    else:
        with pytest.raises(AssertionError, match=caught):
            check(mutant, {})
