"""Federated matrix factorisation with DP — LFL-SGDMF, VFL-SGDMF and HFL-SGDMF (spec
federated-mf.md §2.5–2.9, §3.2), chosen by the option ``setting``.

LFL (``setting=lfl``, the default; package ``lfl``). Cross-device: every rating row owner is a
simulated user hosted in a cohort actor; the coordinator is the server and owns the item embeddings
V (m x p). One run:

1. Stage 1 — the server initialises V in 𝒱 and broadcasts it; each user initialises u_i in 𝒰 and
   pre-trains it on its own training ratings with V fixed (local, no noise).
2. Stage 2 — T iterations. Round 1: each online user samples one of its ratings j, forms the
   gradient row G_i[j] = -2 (X_ij - ⟨u_i, v_j⟩) u_i (‖G_i‖ <= 2R^{3/2}), adds a dense Gaussian
   share ξ_i ~ N(0, ζ1 σ_v² I_{m·p}) and submits G_i + ξ_i through real secure aggregation
   (rayfed.secagg) with t = ⌈(1-ω)n⌉; an iteration with fewer survivors is skipped and releases
   nothing. Round 2: each Round-1 survivor still online sends ξ̄_i = -ξ_i + ξ'_i,
   ξ'_i ~ N(0, ζ2 σ_v²), ζ2 from |U1|. The server updates V <- Π_𝒱(V - γ/|U1| (S1 + β N2)).
3. Stage 3 — each user fine-tunes u_i against the final V (local, unpublished).

Privacy, honestly (spec §2.9): the server sees S1 and N2 separately, and the best estimate of the
gradient sum from both has noise variance F_eff σ_v², F_eff = |U2| ζ1ζ2/(ζ1+ζ2) + (|U1|-|U2|) ζ1.

* ``faithful`` — the thesis: ζ1 = 1/((1-ω)n), ζ2 = 1/|U1|, β = 1. F_eff can fall to 1/2, so the
  guarantee is weaker than the nominal ε the thesis claims; the ledger charges the worst case
  before every iteration and the result states both the nominal and the effective ε.
* ``corrected`` (default) — ζ1 = 2/((1-ω)n), ζ2 = 2/|U1|, β = ζ1/(ζ1+ζ2): F_eff >= 1 always, so
  the nominal (ε, δ) holds.

σ_v = z·Δ with Δ = 2R^{3/2} (one rating per user per iteration, "dummy row" adjacency: per-user
privacy) and z calibrated with dp-accounting for T Gaussian releases at the target (ε, δ).
``dp_mechanism=skellam`` (issue 27) puts the noise in the integers: Round 1 runs each row through
the distributed-DP pipeline (:mod:`rayfed.secagg.ddp`) with a Skellam share in the ring 2^bits,
and Round 2 removes the survivors' excess share components instead of replacing the share (the
sum stays exactly Skellam of at least the target variance; docs/protocols/federated-mf.md).
Baselines (``method``): ``ldp`` (each device adds the full σ_v² itself), ``stage1`` (pre-training
only, V at its initialisation), ``central`` (non-private central SGD on the pooled ratings), and
``gd-dr`` (Private-GD-DR, §2.10: each user sends one ε0-LDP one-bit report of one entry of its
randomly projected V-gradient; the central ε assumes a trusted shuffler, Feldman et al. 2021).

VFL and HFL (``setting=vfl``/``hfl``; package ``partitioned``). s parties run T rounds of T' local
DP-SGD steps (Poisson sampling at rate η, Gaussian noise on the released gradient sums) and the
server averages what they upload. Per user, users are sampled. Per rating, ``corrected`` (default)
samples ratings, so the subsampled Gaussian's amplification is real; ``faithful`` samples users as
the thesis does, which gives one rating no amplification of ε: the ledger charges that true event
and the result reports the true ε next to the nominal one. VFL (§2.5): parties hold disjoint item
sets and their own V_Fk; the server averages U; after the rounds each party takes κ more noisy
steps on V_Fk (published, charged). Per-rating, the parties compose in parallel (disjoint items); per-user (each user trimmed
to θ ratings per party), a user's ratings span every party, so all parties' releases compose. HFL
(§2.6): parties hold disjoint user sets; the server averages V; Stage 1 and Stage 3 are local and
unpublished, and both units compose in parallel (disjoint users) — but per-rating has a gap (spec
§7.8: the pre-trained u_i depends on all of the user's ratings), which the result notes. Baselines:
``local`` (VFL: each party alone, with DP; HFL: non-private local SGD, nothing released) and
``central``; VFL's central literature baselines at s = 1 (spec §2.10, Fig. 4.4): ``dp-sgld`` (one
posterior sample by SGLD, calibrated by advanced composition as in the SGLD papers) and ``objpert``
(ObjPertb: alternating minimisation whose V-solves are objective-perturbed), in
:mod:`rayfed.mf.baselines`.

The maths is in :mod:`rayfed.mf` (:mod:`rayfed.mf.lfl`: the two rounds' noise algebra;
:mod:`rayfed.mf.training`: local steps, trimming, DP-SGD); this package is config, plan and
driver, dispatching to the setting's own params, plan, steps, driver and report in ``lfl`` and
``partitioned``.
"""

from __future__ import annotations

from rayfed.faults import COMMON_PHASES, SECAGG_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.federated_mf.config import FederatedMFConfig, resolve_randomness
from rayfed.protocols.federated_mf.driver import drive
from rayfed.protocols.federated_mf.plan import data_bytes, plan

_SHORT = {"pretrain_steps": 5, "finetune_steps": 2}  # the examples' short local training


class FederatedMF(Protocol):
    name = "federated-mf"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = (
        COMMON_PHASES
        + SECAGG_PHASES
        + (
            "average_u",
            "average_v",
            "evaluate",
            "finetune",
            "init_u",
            "init_v",
            "keep_v",
            "ldp_reports",
            "learning_curve",
            "local_steps",
            "pretrain",
            "round2",
            "update_v",
            "v_solve",
        )
    )
    summary = "federated matrix factorisation with DP: LFL-SGDMF over real secure aggregation, with dropouts"
    Config = FederatedMFConfig
    examples = (
        {"users": 150, "items": 20, "iterations": 2, "cohorts": 2, **_SHORT},
        {"users": 150, "items": 20, "iterations": 2, "cohorts": 2, "mode": "faithful", **_SHORT},
        {"setting": "vfl", "users": 150, "items": 30, "iterations": 2, "local_steps": 2, **_SHORT},
        {
            "setting": "vfl",
            "method": "local",
            "privacy_unit": "user",
            "users": 150,
            "items": 30,
            "iterations": 2,
            "local_steps": 2,
            **_SHORT,
        },
        {"setting": "hfl", "users": 150, "items": 30, "iterations": 2, "local_steps": 2, **_SHORT},
        # VFL's central literature baselines (spec §2.10)
        {
            "setting": "vfl",
            "method": "dp-sgld",
            "parties": 1,
            "users": 150,
            "items": 30,
            "iterations": 2,
            "local_steps": 2,
        },
        {
            "setting": "vfl",
            "method": "objpert",
            "parties": 1,
            "privacy_unit": "user",
            "users": 150,
            "items": 30,
            "objpert_alternations": 2,
        },
        {
            "setting": "vfl",
            "mode": "faithful",  # the thesis's user sampling per rating, charged its true event
            "users": 150,
            "items": 30,
            "iterations": 2,
            "local_steps": 2,
            **_SHORT,
        },
        # LFL with integer Skellam shares through the distributed-DP pipeline (issue 27)
        {
            "users": 150,
            "items": 20,
            "iterations": 2,
            "cohorts": 2,
            "dp_mechanism": "skellam",
            "dropout": 0.1,
            **_SHORT,
        },
    )
    data_bytes = staticmethod(data_bytes)
    resolve_randomness = staticmethod(resolve_randomness)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
