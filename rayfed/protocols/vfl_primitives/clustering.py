"""The clustering family of ``vfl-primitives``: kmeans and kmedian by Alg. 3 — each server's DP
local clustering labels its users, pattern counting on the labels weighs the k^v product grid of
the local centers, and the CC clusters the weighted grid."""

from __future__ import annotations

import numpy as np

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.clustering import nearest, product_grid, weighted_kmeans
from rayfed.clustering.dplsf import dplsf, dplsf_event
from rayfed.clustering.kmedian import weighted_kmedian
from rayfed.data.scaling import features_of
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.vfl_primitives import report
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig
from rayfed.protocols.vfl_primitives.params import ClusteringParams
from rayfed.protocols.vfl_primitives.patterns import count_patterns


# --- servers ---------------------------------------------------------------------------------------
def local_cluster_step(ctx: StepContext, *, k: int, eps: float, radius: float) -> Message:
    """Server: (ε)-DP local k-clustering (DPLSF on the block scaled by 1/Δ into [-1, 1], replace-one
    neighbours) and each user's nearest local center as its label."""
    x = features_of(ctx.table, ctx.meta["columns"]) / radius
    centers, event, _ = dplsf(ctx.noise, x, k, eps, replace_one=True)
    ctx.state["labels"] = nearest(x, centers)
    return Message("local_centers", centers * radius, dp_event=event)


# --- the rounds ------------------------------------------------------------------------------------
def drive(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    """Round 0: local clusterings (ε/2); round 1: pattern counting of the labels (ε/2); then the
    weighted grid clustered on the driver (public post-processing)."""
    params: ClusteringParams = plan.params
    order, k = params.order, cfg.k
    with fed.round(0):
        fed.charge(
            [
                (
                    q,
                    "local DPLSF (ε/2, replace-one)",
                    dplsf_event(cfg.epsilon / 2, len(pos), replace_one=True),
                )
                for q, pos in zip(order, params.positions, strict=True)
            ]
        )
        centers = fed.get(
            fed.parties.run(
                local_cluster_step,
                k=k,
                eps=cfg.epsilon / 2,
                radius=cfg.radius,
                phase="local-clustering",
            )
        )
    with fed.round(1):
        counts, eps_prime = count_patterns(fed, cfg, order, None, k, cfg.epsilon / 2, 1)
    local = [np.asarray(centers[q]) for q in order]
    grid = product_grid(local, params.positions, params.dims)
    weights = np.maximum(counts.reshape(-1), 0.0)
    final = cluster(cfg, grid, weights, rng.stream(fed.seed, "clustering", 1, "final"))
    reference = None
    if plan.evaluation is not None:  # the non-private clustering of the full matrix A
        a = plan.evaluation.a
        reference = cluster(
            cfg, a, np.ones(len(a)), rng.stream(fed.seed, "clustering", 2, "reference")
        )
    return report.clustering_outcome(cfg, grid, final, eps_prime, plan.evaluation, reference)


def cluster(
    cfg: VflPrimitivesConfig, points: np.ndarray, weights: np.ndarray, gen: np.random.Generator
) -> np.ndarray:
    """k weighted centers: k-means (kmeans) or the k-median heuristic (kmedian)."""
    if cfg.task == "kmeans":
        return weighted_kmeans(points, weights, cfg.k, gen)
    return weighted_kmedian(points, weights, cfg.k, gen)
