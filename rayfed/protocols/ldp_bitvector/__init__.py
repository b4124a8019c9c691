"""Distributed clustering in the anonymised Hamming space with LDP bit vectors (DPBV) — Sun, Zhao &
Ye, arXiv:1906.11441 (spec shared/specs/ldp-bitvector.md).

Data custodians are PartyActors holding row blocks (``partition=horizontal``) or column blocks of
the same records (``vertical``, joined on the key). Each custodian maps its values to [L, U]
(default [0, 50]) from declared bounds, encodes every attribute of every record as s bits
(modified BV with anchors shared by the custodians and hidden from the collector) and applies
per-bit randomized response (p = e^ε/(e^ε+1)); the collector (coordinator) debiases the Hamming
distances (Theorem 5), combines the attributes (Eq. 19), optionally chains long 1-D distances
(Algorithm 1), and clusters the distance matrix: kCluster, DBSCAN or agglomerative (scikit-learn,
metric='precomputed').

Baselines (``method``): k-means on the raw data, ADP (Gaussian noise on the raw scale, then
k-means) and RSP (random subspace projection, then k-means) — run by one trusted party; neither
is differentially private. ``encoding=bv`` (noise-free bit vectors) and ``exact`` (true
distances) give Table III's "kCluster –" rows.

Privacy, honestly: every bit is ε-LDP, but two values' codes can differ in k_max bits (all s when
t covers half the range), so one attribute value is (k_max·ε)-LDP and a record of d attributes
(d·k_max·ε)-LDP. That is what the ledger charges and the result states. The paper's
(ε, δ = p^s - e^ε q^s) of its Theorem 4 is reported as a label only: it does not hold. Each
custodian's codes are one measurement built in plan (per-bit RR on codes encoded a block at a time,
:class:`~rayfed.privacy.CodeResponse`), its Δ₀ derived from the codes' domain
(:class:`~rayfed.ldp.bitvector.Codes`: the bits each attribute's anchors let differ on [L, U]).
Feature values outside the declared bounds are refused or clipped and counted (``out_of_domain``).

The maths is in :mod:`rayfed.ldp.bitvector` (encoding, distances, the decomposition's pair sums)
and :mod:`rayfed.clustering.precomputed`; this package is config, params, plan, steps, driver and
report, as every protocol's.
"""

from __future__ import annotations

from rayfed.faults import COMMON_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.ldp_bitvector.config import LdpBitvectorConfig
from rayfed.protocols.ldp_bitvector.driver import drive
from rayfed.protocols.ldp_bitvector.plan import data_bytes, plan


class LdpBitvector(Protocol):
    name = "ldp-bitvector"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = COMMON_PHASES + (
        "alice-values",
        "baseline",
        "collect",
        "encode",
        "pair-codes",
        "values",
    )
    summary = "Clustering in the anonymised Hamming space: LDP bit vectors (DPBV), kCluster/DBSCAN"
    Config = LdpBitvectorConfig
    examples = (
        {"bits": 64, "records": 300},
        {"bits": 64, "records": 300, "partition": "vertical"},
        {"bits": 64, "records": 40, "partition": "vertical-decomposition"},
    )
    data_bytes = staticmethod(data_bytes)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
