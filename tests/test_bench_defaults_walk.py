"""The defaults walk's verdict (benchmarks/defaults_walk.py): which ε curves it flags, on
hand-made means and spreads. No runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from defaults_walk import CELLS, Cell, verdict  # noqa: E402

LOWER = Cell("p", "c", {}, "error")
HIGHER = Cell("p", "c", {}, "nmi", higher_is_better=True)


def curve(*points, eps=(0.5, 1.0, 4.0, 8.0)):
    return {e: {"mean": m, "sd": s} for e, (m, s) in zip(eps, points, strict=True)}


@pytest.mark.parametrize(
    "cell,points,reference,expected",
    [
        # falls by more than the spreads: improves, no dip
        (LOWER, [(1.0, 0.1), (0.5, 0.1), (0.2, 0.05), (0.1, 0.01)], None, ("improves", [])),
        # the end points are within their spreads (0.3 + 0.3 > 0.4 gain); 0.5 -> 1 and 0.5 -> 4
        # (0.5 and 0.6 > 0.3 + 0.05) decide
        (LOWER, [(1.0, 0.3), (0.5, 0.05), (0.4, 0.05), (0.6, 0.3)], None, ("improves", ["4->8"])),
        # never better by more than the two spreads: flat
        (LOWER, [(1.0, 0.2), (0.9, 0.2), (0.95, 0.2), (0.85, 0.2)], None, ("flat", ["1->4"])),
        # one step worse by more than the two spreads: worsens (HFL federated-mf's shape)
        (LOWER, [(0.5, 0.01), (0.5, 0.01), (0.6, 0.01), (0.6, 0.01)], None, ("worsens", ["1->4"])),
        # flat, but both ends at the non-private reference: nothing left to gain
        (
            HIGHER,
            [(0.71, 0.05), (0.71, 0.01), (0.72, 0.03), (0.74, 0.04)],
            0.736,
            ("at-reference", []),
        ),
        # both ends at the reference, but a step between them worse by more than the spreads:
        # worsens (at-reference must not hide it)
        (LOWER, [(0.5, 0.01), (0.8, 0.01), (0.5, 0.01), (0.5, 0.01)], 0.5, ("worsens", ["0.5->1"])),
        # higher is better: a falling NMI worsens
        (
            HIGHER,
            [(0.9, 0.01), (0.8, 0.01), (0.7, 0.01), (0.6, 0.01)],
            None,
            ("worsens", ["0.5->1", "1->4", "4->8"]),
        ),
    ],
)
def test_verdict(cell, points, reference, expected):
    assert verdict(cell, curve(*points), reference) == expected


def test_a_refused_epsilon_is_left_out():
    # ε = 8 refused (pattern counting's paper calibration): judged on 0.5, 1, 4
    by_eps = curve((10.0, 1.0), (5.0, 1.0), (1.0, 0.1), eps=(0.5, 1.0, 4.0))
    assert verdict(LOWER, by_eps, None) == ("improves", [])


def test_every_protocol_but_federated_mf_is_judged():
    judged = {c.protocol for c in CELLS if not c.report_only}
    assert judged == {
        "pattern-count",
        "secure-sum",
        "square-wave",
        "vfl-kmeans",
        "hfl-kmeans",
        "ldp-bitvector",
        "vfl-primitives",
    }
    assert {c.options.get("setting", "lfl") for c in CELLS if c.report_only} == {
        "lfl",
        "vfl",
        "hfl",
    }
