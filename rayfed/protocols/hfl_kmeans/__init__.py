"""DP horizontally federated k-means with masked aggregation and size-constrained assignment — the
NMA and AMN protocols of A. Ahmed, "Differentially-Private Multiparty Clustering" (MMath thesis,
Waterloo 2023); spec: shared/specs/hfl-kmeans.md.

M clients (PartyActors) each hold some rows in [-1, 1]^d (mapped from declared bounds); the
semi-honest server is the coordinator. Setup: the clients agree on a group key the server lacks
(X25519 + AES-GCM); N is a public input (spec A3), and the server broadcasts t_max and the
other public parameters derived from it in the plan (§3.5.5, §3.6.4); every client derives the
same initial centroids from the group key (sphere packing). Then t_max round trips:

1. each client assigns its rows to the current centroids — by default a size-constrained
   min-cost flow with per-client bounds ⌈c_min/M⌉ and ⌊c_max/M⌋ (OR-Tools) — and uploads, padded
   in Z_(2^b) at precision 2^-16, either its per-cluster sums and counts (``nma``: Noise, Mask then
   Average = DPLloyd) or its local centroids / M (``amn``: Average, Mask then Noise = CDPLloyd);
2. the server adds the uploads and discrete-Laplace noise on the grid, still padded, and
   broadcasts; each client unpads, post-processes (fold by default) and divides (NMA).

``masking``: ``shared-seed`` (the thesis: all clients derive all pads), ``pairwise`` (the uploads
go through the one secure sum over the M clients, :func:`rayfed.secagg.secure_sum`: SecAgg's
pairwise masks with Shamir threshold t (:func:`~.params.sum_params`), no partial sums, any lost
client ends the run before an unmask; the coordinator learns each iteration's released sum —
with noise=none the exact aggregate — and, colluding with t clients, one client's upload; a
semi-honest server, there is no consistency round) or ``none`` (a labelled baseline). ``topology=ring`` is the serverless sketch of §7.3: a ring
secure sum in which every client adds its own full Laplace noise (``ring_noise=local``, F1), a
1/h share of one central noise (``ring_noise=split`` with pairwise masks, F3: DP against any
coalition of up to M - h clients), or its additive share of one central noise that the clients
sample together in an MPC with a dealer's Beaver triples (``ring_noise=mpc``, F2, with
:mod:`rayfed.secagg.mpc`: DP unless all clients collude or the dealer colludes with one).

Privacy: add/remove one point, pure ε, composed over the t_max iterations (the server's or the
split noise) or in parallel over the clients (the ring's local noise). Every release is a
:class:`~rayfed.privacy.measurement.Measurement` built in the plan. ``sensitivity`` chooses the
calibration: ``corrected`` (the default) counts what one point really moves — under the
size-constrained assignment an augmenting path of the min-cost flow re-routes up to k - 1 other
points, so the sums' Δ is (2k - 1)·d·B and an AMN upload's k - 1 replacements and one addition
(:mod:`rayfed.clustering.dplloyd`) — or ``thesis`` (the thesis's noise, Δ^Σ = B·E, Δ^μ = B·E/c_min:
the ledger then records the larger ε that noise actually buys).

The maths is in :mod:`rayfed.clustering` (DPLloyd's public arithmetic, the constrained assignment,
the initialisations and post-processing) and :mod:`rayfed.secagg` (pads, and the clients' group
key from :mod:`rayfed.secagg.keys`); this package is config, params, plan, steps, driver and
report, as every protocol's.
"""

from __future__ import annotations

from rayfed.faults import COMMON_PHASES, KEY_AGREEMENT_PHASES, SECAGG_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.hfl_kmeans.config import HflKmeansConfig, resolve_randomness
from rayfed.protocols.hfl_kmeans.driver import drive
from rayfed.protocols.hfl_kmeans.plan import data_bytes, plan


class HflKmeans(Protocol):
    name = "hfl-kmeans"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = (
        COMMON_PHASES
        + SECAGG_PHASES
        + KEY_AGREEMENT_PHASES
        + (
            "aggregate",
            "assign-upload",
            "init",
            "mpc-and",
            "mpc-b2a",
            "mpc-deal",
            "mpc-open",
            "outputs",
            "prepare",
            "release",
            "ring",
            "ring-close",
            "setup",
            "update",
        )
    )
    summary = "DP horizontal multiparty k-means (NMA / AMN) with masked aggregation"
    Config = HflKmeansConfig
    examples = (
        {"users": 2000},
        {"users": 2000, "aggregation": "amn", "sensitivity": "thesis"},
        {"users": 2000, "topology": "ring"},
        {
            "users": 2000,
            "topology": "ring",
            "ring_noise": "split",
            "clients": 3,
            "masking": "pairwise",
        },
        {
            "users": 2000,
            "topology": "ring",
            "ring_noise": "mpc",
            "clients": 3,
            "masking": "pairwise",
        },
    )
    data_bytes = staticmethod(data_bytes)
    resolve_randomness = staticmethod(resolve_randomness)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
