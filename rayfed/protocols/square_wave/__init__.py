"""Square Wave LDP distribution estimation with EM/EMS, and its baselines — chapter 3 of Zitao Li's
thesis / Li, Wang, Lopuhaä-Zwakenberg, Li & Škorić, SIGMOD 2020 (spec shared/specs/square-wave.md).

Users live in UserCohortActors as rows (user_id, value); each perturbs its own value in [0, 1]
(mapped from declared bounds) with per-user uniforms keyed by its id, so a report does not depend
on which cohort hosts the user. The aggregator (coordinator) receives one report per user and
reconstructs a d-bucket histogram of [0, 1].

``method``:

* ``sw-ems`` / ``sw-em`` — Square Wave (continuous, R-B; ``bucketize=br`` for the discrete one),
  EMS or EM on the report histogram; ``wave`` swaps the square for another General Wave
  (trapezoid, triangle), and beyond d·d̃ = 2,048² the transition matrix is a structured O(d)
  product (d up to 65,536);
* ``cfo`` — GRR or OLH (by the variance rule) on ``bins`` equal bins, Norm-Sub, spread uniformly;
* ``hh`` / ``hh-admm`` — a ``branching``-ary hierarchy, one layer per user, with Hay et al.'s
  constrained inference (range queries only) or the non-negative least-squares fit of HH-ADMM;
* ``haar-hrr`` — the Haar hierarchy with Hadamard randomized response (range queries only);
* ``sr`` / ``pm`` — stochastic rounding / the piecewise mechanism for the mean; with
  ``moments=both`` half the users report v and the other half (v - μ̃)² for the variance.

Privacy: every user sends one report, ε-LDP (replace-one on its value); users compose in parallel.
Each kind of report is one :class:`~rayfed.privacy.LocalReport` measurement built in plan (Δ₀ = 1
user); a data file's values outside the declared bounds are refused or clipped and counted
(``out_of_domain``); an outage by a data column is stated as revealing that column.

The maths is in :mod:`rayfed.ldp` (the methods' reports and estimates in
:mod:`rayfed.ldp.distribution`); this package is config, params, plan, steps, driver and report,
as every protocol's.
"""

from __future__ import annotations

from rayfed.faults import COMMON_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.square_wave.config import SquareWaveConfig
from rayfed.protocols.square_wave.driver import drive
from rayfed.protocols.square_wave.plan import data_bytes, plan


class SquareWave(Protocol):
    name = "square-wave"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = COMMON_PHASES + (
        "estimate",
        "estimate-mean",
        "estimate-variance",
        "perturb",
        "perturb-mean",
        "perturb-variance",
    )
    summary = (
        "Square Wave LDP distribution estimation with EM/EMS and the CFO/hierarchy/SR/PM baselines"
    )
    Config = SquareWaveConfig
    examples = (
        {"users": 5000},
        {"users": 5000, "method": "cfo"},
        {"users": 5000, "method": "hh"},
        {"users": 5000, "method": "haar-hrr"},
        {"users": 5000, "method": "sr"},
    )
    data_bytes = staticmethod(data_bytes)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
