"""The rounds of ``vfl-kmeans``: the parties' hash keys (FM sketches only), the noisy user count
n̂ and k', then every party's local clustering and membership encoding and the server's weighted
grid; the central baselines are one curator's single round."""

from __future__ import annotations

import numpy as np

from rayfed import rng
from rayfed.clustering import fm
from rayfed.clustering.dplsf import dplsf_event
from rayfed.federation import PerMember
from rayfed.privacy import EpsilonDeltaDpEvent, kary_rr_event, laplace_event
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.vfl_kmeans import report
from rayfed.protocols.vfl_kmeans.config import ENCODING, VflKmeansConfig
from rayfed.protocols.vfl_kmeans.params import (
    Params,
    Split,
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
    if encoding == "fm":
        with fed.round(0):
            agree_group_key(fed, order, purpose="hash-key", slot="hash_key")
    with fed.round(1):
        n_hat = _count(fed, split, order)
        k_prime, rule = choose_k_prime(cfg, n_hat, len(order), split, params.delta)
        m = len(params.features)
        check_grid(k_prime ** len(order), cfg.max_grid_cells, k_prime, len(order), m)
    with fed.round(2):
        centers = _local_clustering(fed, cfg, params, k_prime)
        memberships = _encode(fed, cfg, encoding, split, order, k_prime)
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
            server=server_params(cfg, split),
            round=2,
            phase="server",
        )
    for note in report.notes(cfg, params, k_prime, rule, evaluated=plan.evaluation is not None):
        fed.note(note)
    return report.outcome(cfg, params, out, plan.evaluation, n_hat, k_prime, rule)


def _count(fed, split: Split, order: list[str]) -> float:
    """n̂ from one party chosen at random by the server (exact n where n is public anyway)."""
    chosen = order[int(rng.stream(fed.seed, "sample", 1, "n-hat-party").integers(len(order)))]
    if split.eps0 > 0:
        fed.charge([(chosen, "noisy user count n̂", laplace_event(1, split.eps0))])
    count = fed.parties.call(
        count_step,
        epsilon0=split.eps0 if split.eps0 > 0 else None,
        members=[chosen],
        phase="user-count",
    )
    return max(1.0, float(round(count)))


def _local_clustering(fed, cfg: VflKmeansConfig, params: Params, k_prime: int):
    """Every party's k' local centers (DPLSF at ε1, or k-means for vfl-nonprivate)."""
    private = cfg.method != "vfl-nonprivate"
    replace_one = cfg.method == "ldp-agg-2pest"
    eps1 = params.split.eps1
    if private:
        fed.charge(
            [
                (p, "DPLSF local clustering", dplsf_event(eps1, len(pos), replace_one=replace_one))
                for p, pos in zip(params.order, params.positions, strict=True)
            ]
        )
    return fed.parties.run(
        local_cluster_step,
        k=k_prime,
        epsilon=eps1 if private else None,
        replace_one=replace_one,
        round=2,
        leaf_threshold=cfg.leaf_threshold,
        phase="local-clustering",
    )


def _encode(fed, cfg: VflKmeansConfig, encoding: str, split: Split, order: list[str], k_prime: int):
    """Every party's membership message of its local clusters, charged as its encoding spends."""
    if encoding == "fm":
        event = EpsilonDeltaDpEvent(split.eps2, split.delta2)
        fed.charge([(p, "FM membership sketches", event) for p in order])
        return fed.parties.run(
            fm_step,
            k=k_prime,
            m=cfg.sketches,
            gamma=cfg.gamma,
            eps2=split.eps2,
            delta2=split.delta2,
            round=2,
            phase="membership",
        )
    if encoding == "histogram":
        event = laplace_event(1, split.eps2)
        fed.charge([(p, "noisy cluster sizes", event) for p in order])
        return fed.parties.run(
            histogram_step, k=k_prime, eps2=split.eps2, round=2, phase="membership"
        )
    if encoding == "ldp":
        oracle, g, _, _ = fm.ldp_probabilities(split.eps2, k_prime)
        event = kary_rr_event(g if oracle == "olh" else k_prime, split.eps2)
        fed.charge([(p, f"{oracle.upper()} label reports", event) for p in order])
        return fed.parties.run(
            ldp_step,
            k=k_prime,
            eps2=split.eps2,
            party=PerMember({p: j for j, p in enumerate(order)}),
            round=2,
            phase="membership",
        )
    return fed.parties.run(labels_step, phase="membership")


def _drive_central(fed, cfg: VflKmeansConfig, plan: Plan) -> Outcome:
    params: Params = plan.params
    private = cfg.method == "central-dplsf"
    with fed.round(0):
        if private:
            fed.charge([(CURATOR, "DPLSF", dplsf_event(cfg.epsilon, len(params.features)))])
        centers = np.asarray(
            fed.parties.call(
                curator_step,
                k=cfg.k,
                epsilon=cfg.epsilon if private else None,
                leaf_threshold=cfg.leaf_threshold,
                phase="central",
            )
        )
    if private:
        fed.note(report.CENTRAL_NOTE)
    out = ServerOutput(centers=centers, weights=None, local=[], iterations=0)
    return report.outcome(cfg, params, out, plan.evaluation, float(params.users), cfg.k, "central")
