"""The DP VFL primitives beyond pattern counting — Cohen-Addad, Kacham, Mirrokni & Zhong,
"Differentially Private Vertical Federated Learning Primitives" (spec shared/specs/vfl-primitives.md).

One protocol, ``rayfed run vfl-primitives --set task=...``; v parties (servers) hold column blocks
of the same m users, the coordinator (CC) combines their messages. Privacy is DP in VFL (Def. 1.2):
one server's data changes, in one user, so the servers' scopes compose in parallel.

What "changes" means is stated, and the noise calibrated to it. By default (``neighbours=user``)
one user's data at one server is replaced by anything in the declared bounds — every value in
``value_bounds`` (moments), each server's block of a row in the ℓ₂ ball of radius ``row_radius``,
every label in ``label_bounds`` — and data outside them is clipped (counted) or refused
(``out_of_domain``): each sensitivity is the domain's diameter. The paper calibrates l1-, lp-,
l2-moment, lowrank and regression for weaker neighbours (one entry moving by 1, one row, value or
label by ν); ``neighbours=paper`` runs that calibration, as before, and its headline and statement
say it is NOT user-level. kmeans / kmedian are user-level as the paper states them.

``task``:

* ``l1-moment`` — each server sends ‖x^(j)‖₁ + Lap(Δ₁/ε) (App. C; Δ₁ = hi − lo, the paper's 1);
  the CC sums.
* ``lp-moment`` — Alg. 2 as written: round 1, x^(j) + Lap(2Δ₁/ε) per entry; the CC finds the heavy
  coordinates L and the bound M and sends them back (the algorithm is interactive, although the
  paper calls all its algorithms non-interactive); round 2, pattern counting (ε/2) on x^(j) with L
  zeroed. Estimate Σ_{i∈L} y_i^p + Σ_ρ count_ρ (Σρ)^p over patterns with Σρ <= M. At the
  theorem's M the light part's noise is astronomically large (spec §2.5): the result states its
  predicted sd; ``bound`` overrides M to exercise the mechanics. ``interaction=non-interactive``
  (spec §2.5, not in the paper): M is public, so both messages go in one round and the CC leaves
  L out of the counts itself; the same ε/2 + ε/2.
* ``l2-moment`` — sketch-and-perturb (E.3): G x^(j) + N(0, σ_j²); the CC returns ‖Σ o^(j)‖²/s and the
  estimate debiased by Σσ_j² (the paper's raw estimator carries that bias).
* ``kmeans`` / ``kmedian`` — Alg. 3: each server's (ε/2)-DP clustering (DPLSF) labels its users;
  pattern counting (ε/2) on the labels weighs the k^v product grid; weighted k-means / k-median.
  ``sample_rate`` p < 1 counts only a public sample of users (Thm B.2): p·m·k bits per server,
  the same ε, variance ≈ 1/p times larger. ``baseline=central`` (spec §4.4) replaces the pattern
  counting by a trusted curator's Laplace histogram of the labels (central DP, not DP in VFL).
* ``lowrank`` — Alg. 4: the CC takes the top-k right singular vectors of [G A^(1) + N^(1) | …].
  ``baseline=input-perturbation`` (spec §4.4): [A^(1) + N^(1) | …] instead, σ calibrated alike.
* ``regression`` — E.2: a label server adds G b + n; least squares on the noisy sketch, which is a
  sketched ridge regression with λ_j = σ_j² (reported).

The shared Gaussian sketch G (s x m) comes from a public seed and is redrawn until its largest
column norm is at most √s + 4√ln m (Lemma E.2), which bounds a server's ℓ₂ sensitivity by the
domain's diameter (2C for a block in the ball of radius C; hi − lo for a value or label; the
paper's ν) times √s + 4√ln m; σ_j is calibrated with dp-accounting for one Gaussian release at
(ε, δ) — against the tightest accountant (PLD and RDP), or RDP as before in the paper's mode.

The package is config, params, plan, driver and report, as every protocol's; the tasks' steps and
rounds are by family: moments (l1-, lp-, l2-moment), clustering (kmeans, kmedian) and sketches
(the Gaussian sketch; lowrank, regression), with pattern counting (Alg. 1) shared in patterns.
Pattern counting's maths is :mod:`rayfed.ldp.patterns`, k-median's :mod:`rayfed.clustering.kmedian`.
"""

from __future__ import annotations

from rayfed.faults import COMMON_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig
from rayfed.protocols.vfl_primitives.driver import drive
from rayfed.protocols.vfl_primitives.plan import data_bytes, plan


class VflPrimitives(Protocol):
    name = "vfl-primitives"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = COMMON_PHASES + (
        "central-histogram",
        "combine",
        "counts",
        "heavy",
        "l1",
        "labels-to-curator",
        "local-clustering",
        "noisy-rows",
        "noisy-vectors",
        "pattern-counting",
        "sketch",
    )
    summary = (
        "DP VFL primitives: ℓ1/ℓp/ℓ2 moments, k-means/k-median, low-rank approximation, regression"
    )
    Config = VflPrimitivesConfig
    examples = (
        {"users": 2000},
        {"users": 2000, "task": "l1-moment"},
        {"users": 2000, "task": "lp-moment"},
        {"users": 2000, "task": "lowrank"},
        {"users": 2000, "task": "regression"},
        # the paper's neighbours (NOT user-level), kept under the conformance suite
        {"users": 2000, "task": "l1-moment", "neighbours": "paper"},
        {"users": 2000, "task": "lp-moment", "neighbours": "paper"},
        {"users": 2000, "task": "lowrank", "neighbours": "paper"},
        {"users": 2000, "task": "regression", "neighbours": "paper"},
    )
    data_bytes = staticmethod(data_bytes)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
