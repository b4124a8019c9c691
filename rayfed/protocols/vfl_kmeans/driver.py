"""The rounds of ``vfl-kmeans``: the parties' hash keys (FM sketches only), the noisy user count
n̂ and k', then every party's local clustering and membership encoding and the server's weighted
grid; the central baselines are one curator's single round."""

from __future__ import annotations

import numpy as np

from rayfed import rng
from rayfed.errors import RayfedError
from rayfed.federation import PerMember
from rayfed.privacy import Measurement
from rayfed.privacy.ledger import RUN_SCOPE
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.vfl_kmeans import report
from rayfed.protocols.vfl_kmeans.config import ENCODING, VflKmeansConfig
from rayfed.protocols.vfl_kmeans.params import (
    Params,
    check_grid,
    choose_k_prime,
    server_params,
)
from rayfed.protocols.vfl_kmeans.plan import CURATOR
from rayfed.protocols.vfl_kmeans.steps import (
    ServerOutput,
    count_step,
    curator_step,
    fm_step,
    histogram_step,
    labels_step,
    ldp_step,
    local_cluster_step,
    server_step,
)
from rayfed.secagg.keys import agree_group_key


def drive(fed, cfg: VflKmeansConfig, plan: Plan) -> Outcome:
    if cfg.method.startswith("central"):
        return _drive_central(fed, cfg, plan)
    params: Params = plan.params
    split, order, encoding = params.split, params.order, ENCODING[cfg.method]
    releases = params.releases
    if encoding == "fm":
        with fed.round(0):
            agree_group_key(fed, order, purpose="hash-key", slot="hash_key")
    with fed.round(1):
        n_hat = _count(fed, releases.count, order)
        k_prime, rule = choose_k_prime(cfg, n_hat, len(order), split, params.delta)
        if encoding == "ldp" and k_prime != params.k_plan:  # n is public: n̂ = n, the plan's k'
            raise RayfedError(f"k' = {k_prime} differs from the planned {params.k_plan}")
        m = len(params.features)
        check_grid(k_prime ** len(order), cfg.max_grid_cells, k_prime, len(order), m)
    with fed.round(2):
        centers = _local_clustering(fed, cfg, params, k_prime)
        memberships = _encode(fed, encoding, releases.membership, order, k_prime)
        out = fed.coordinator.call(
            server_step,
            centers,
            memberships,
            order=order,
            positions=params.positions,
            n_hat=n_hat,
            k=cfg.k,
            k_prime=k_prime,
            encoding=encoding,
            server=server_params(cfg, split, releases),
            round=2,
            phase="server",
        )
    for note in report.notes(cfg, params, k_prime, rule, evaluated=plan.evaluation is not None):
        fed.note(note)
    return report.outcome(cfg, params, out, plan.evaluation, n_hat, k_prime, rule)


def _count(fed, release: Measurement | None, order: list[str]) -> float:
    """n̂ from one party chosen at random by the server (exact n where n is public anyway)."""
    chosen = order[int(rng.stream(fed.seed, "sample", 1, "n-hat-party").integers(len(order)))]
    if release is not None:
        fed.charge([release.charge(chosen)])
    count = fed.parties.call(count_step, release=release, members=[chosen], phase="user-count")
    return max(1.0, float(round(count)))


def _local_clustering(fed, cfg: VflKmeansConfig, params: Params, k_prime: int):
    """Every party's k' local centers (DPLSF at ε1, or k-means for vfl-nonprivate)."""
    local = params.releases.local
    if local is not None:
        fed.charge([local[p].charge(p) for p in params.order])
    return fed.parties.run(
        local_cluster_step,
        k=k_prime,
        releases=PerMember({p: local[p] for p in params.order}) if local is not None else None,
        round=2,
        leaf_threshold=cfg.leaf_threshold,
        phase="local-clustering",
    )


def _encode(fed, encoding: str, release: Measurement | None, order: list[str], k_prime: int):
    """Every party's membership message of its local clusters, charged as its encoding spends:
    the sketches once for all parties (one release: they share the hash keys), the cluster
    sizes and label reports once per party."""
    if encoding == "fm":
        fed.charge([release.charge(RUN_SCOPE)])
        return fed.parties.run(fm_step, k=k_prime, release=release, round=2, phase="membership")
    if encoding == "histogram":
        fed.charge([release.charge(p) for p in order])
        return fed.parties.run(
            histogram_step, k=k_prime, release=release, round=2, phase="membership"
        )
    if encoding == "ldp":
        fed.charge([release.charge(p) for p in order])
        return fed.parties.run(
            ldp_step,
            k=k_prime,
            release=release,
            party=PerMember({p: j for j, p in enumerate(order)}),
            round=2,
            phase="membership",
        )
    return fed.parties.run(labels_step, phase="membership")


def _drive_central(fed, cfg: VflKmeansConfig, plan: Plan) -> Outcome:
    params: Params = plan.params
    local = params.releases.local
    private = local is not None
    with fed.round(0):
        if private:
            fed.charge([local[CURATOR].charge(CURATOR, "DPLSF")])
        centers = np.asarray(
            fed.parties.call(
                curator_step,
                k=cfg.k,
                releases=local[CURATOR] if private else None,
                leaf_threshold=cfg.leaf_threshold,
                phase="central",
            )
        )
    for clipped in params.clipped:
        fed.note(clipped.statement())
    if private:
        fed.note(report.CENTRAL_NOTE)
    out = ServerOutput(centers=centers, weights=None, local=[], iterations=0)
    return report.outcome(cfg, params, out, plan.evaluation, float(params.users), cfg.k, "central")
