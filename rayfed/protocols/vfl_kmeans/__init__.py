"""DP vertical federated k-means with Flajolet–Martin membership sketches — DPFMPS of Li, Wang &
Li, "Differentially Private Vertical Federated Clustering" (VLDB'23), and its baselines
(spec: shared/specs/vfl-kmeans.md).

S parties hold column blocks of the same n users (rows aligned by key); the untrusted server is the
coordinator. One round: the parties agree on secret hash keys among themselves (X25519 + AES-GCM,
the server relays only ciphertexts); one random party sends n̂ = n + Lap(1/ε0); every party runs
DPLSF on its columns (ε1), assigns its users to the nearest local center, and sends its local
centers and an M x k' matrix of DP FM sketches of the clusters (all parties' together (S·ε2, δ)); the server weighs the
k'^S grid of concatenated local centers (BasicEst or 2PEst) and runs weighted k-means on it.

``method`` picks the membership encoding and weight estimator; the baselines share everything else:

=================  =============================================  ===============================
method             what the parties send                          weights / privacy
=================  =============================================  ===============================
dpfmps-2pest       DPLSF centers + FM sketches                    2PEst; (ε, δ)
dpfmps-basic       DPLSF centers + FM sketches                    BasicEst; (ε, δ)
ind-lap            DPLSF centers + Laplace cluster sizes          independence; ε
ldp-agg-2pest      DPLSF centers + per-user GRR/OLH labels        P⁻¹ pair tables + 2PEst; ε
vfl-nonprivate     k-means centers (k' = k) + exact labels        exact; not private
central-dplsf      one curator with every column: DPLSF           ε
central-kmeans     one curator with every column: k-means         not private
=================  =============================================  ===============================

Privacy (Theorem 4, corrected): sequential over the phases and parties, ε0 + S·ε1 + ε_FM = ε,
under add/remove-one-user neighbours, assuming an ideal hash with keys the server does not know
and no party colluding with the server. The parties hash a user with the same keys, so their
sketch matrices are one release, charged once at its share (ε_FM, δ) = (S·ε2, S·δ2); ε′ (the
phantoms n_p and the floor α_min) is calibrated against the exact joint privacy loss of that
release (:mod:`rayfed.clustering.fm_privacy`), not composed per party from Lemma 1 as the paper
does (``sketch_calibration=lemma1`` keeps the paper's noise and charges what it costs jointly).
δ is public, never counted from the data (the server is sent n_p, a function of δ): ``delta``, or
1/users — the synthetic data's declared size; a data file needs ``delta`` given. Every release is
a Measurement built in plan; data outside its declared bounds is refused or clipped and counted
(``out_of_bounds``).

The maths is in :mod:`rayfed.clustering` (DPLSF, FM sketches and the grid estimators, the k'
rule) and the parties' hash keys come from :mod:`rayfed.secagg.keys`; this package is config,
params, plan, steps, driver and report, as every protocol's.
"""

from __future__ import annotations

from rayfed.faults import COMMON_PHASES, KEY_AGREEMENT_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.vfl_kmeans.config import VflKmeansConfig, resolve_randomness
from rayfed.protocols.vfl_kmeans.driver import drive
from rayfed.protocols.vfl_kmeans.plan import data_bytes, plan


class VflKmeans(Protocol):
    name = "vfl-kmeans"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = (
        COMMON_PHASES
        + KEY_AGREEMENT_PHASES
        + ("central", "local-clustering", "membership", "server", "user-count")
    )
    summary = "DP vertical federated k-means with Flajolet–Martin sketches (DPFMPS) and baselines"
    Config = VflKmeansConfig
    examples = (
        {"users": 2000, "sketches": 256},
        {"users": 2000, "method": "ind-lap"},
        {"users": 2000, "method": "ldp-agg-2pest"},
        {"users": 2000, "method": "central-dplsf"},
    )
    data_bytes = staticmethod(data_bytes)
    resolve_randomness = staticmethod(resolve_randomness)
    plan = staticmethod(plan)
    drive = staticmethod(drive)
