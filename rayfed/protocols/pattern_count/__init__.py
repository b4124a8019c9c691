"""DP pattern counting in vertical FL — Algorithm 1 and Theorem B.2 of Cohen-Addad, Kacham,
Mirrokni & Zhong, "Differentially Private Vertical Federated Learning Primitives"
(spec: shared/specs/vfl-primitives.md §2.1–2.2, §5 checks 1–7).

v parties hold column blocks of the same m users. Party j maps each user's values to one index
x_j[i] in {0..M_j} (M_j + 1 = the product of its columns' declared domain sizes; a value outside
the declared domain encodes as the all-zero one-hot vector), one-hot encodes it and applies
independent per-bit randomized response, Pr[out = 1] = 1/2 + ε' if the bit is 1 and 1/2 - ε' if 0.
The coordinator debiases every bit, z = (b - 1/2 + ε') / (2ε'), and estimates the count of pattern
ρ as Σ_i Π_j z_j[ρ_j, i] (unbiased: the parties' noise is independent), clipped at 0.

Privacy (DP in VFL, Def. 1.2): one user's value changes at one party, which flips two one-hot bits
of that party's message. Calibration ``paper`` (ε' = ε/16) uses the paper's 8ε'-per-bit bound; the
mechanism's exact loss 2·ln((1+2ε')/(1-2ε')) ≈ ε/2 is what the ledger records and the result
reports. ``exact`` (ε' = tanh(ε/4)/2, flagged, not in the paper) spends exactly ε and has ~4^v
times less variance. The sampled variant (Thm B.2) sends only users of a public sample S (rate p):
still ε-DP (S is data-independent; no amplification is claimed because S is public), with error
growing as sqrt(m/p).

The maths is in :mod:`rayfed.ldp.patterns`; this package is config, params, plan, steps, driver
and report, as every protocol's.
"""

from __future__ import annotations

from rayfed.faults import COMMON_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.pattern_count.config import PatternCountConfig
from rayfed.protocols.pattern_count.driver import drive
from rayfed.protocols.pattern_count.plan import data_bytes, plan


class PatternCount(Protocol):
    name = "pattern-count"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = COMMON_PHASES + ("estimate", "randomize")
    summary = "DP pattern counting in vertical FL: per-bit randomized response on one-hot values (Alg. 1, Thm B.2)"
    Config = PatternCountConfig
    examples = (
        {"users": 2000},
        {"users": 2000, "calibration": "exact", "sample_rate": 0.5},
    )
    data_bytes = staticmethod(data_bytes)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
