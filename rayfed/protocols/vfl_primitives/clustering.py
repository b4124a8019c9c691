"""The clustering family of ``vfl-primitives``: kmeans and kmedian by Alg. 3 — each server's DP
local clustering labels its users, pattern counting on the labels (of every user, or of a public
sample, Thm B.2) weighs the k^v product grid of the local centers, and the CC clusters the
weighted grid. ``baseline=central`` (spec §4.4) replaces the pattern counting by a trusted
curator's Laplace histogram of the labels."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.clustering import nearest, product_grid, weighted_kmeans
from rayfed.clustering.kmedian import weighted_kmedian
from rayfed.data.scaling import features_of
from rayfed.ldp.patterns import public_sample
from rayfed.privacy import Measurement
from rayfed.privacy.ledger import RUN_SCOPE
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.vfl_primitives import report
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig
from rayfed.protocols.vfl_primitives.params import ClusteringParams
from rayfed.protocols.vfl_primitives.patterns import count_patterns


# --- servers ---------------------------------------------------------------------------------------
def local_cluster_step(
    ctx: StepContext, *, k: int, radius: float, releases: dict[str, Measurement]
) -> Message:
    """Server: DP local k-clustering (its release: DPLSF on the block scaled by 1/Δ into
    [-1, 1], replace-one neighbours) and each user's nearest local center as its label."""
    x = features_of(ctx.table, ctx.meta["columns"]) / radius
    centers, event = releases[ctx.name](ctx.noise, x, k=k)
    ctx.state["labels"] = nearest(x, centers)
    return Message("local_centers", centers * radius, dp_event=event)


def labels_step(ctx: StepContext) -> Message:
    """Server (central baseline): its users' local labels in the clear, to the trusted curator —
    this message is not private, which is what the baseline assumes away."""
    return Message("labels", ctx.state["labels"].astype(np.int32))


# --- the coordinator -------------------------------------------------------------------------------
def curator_histogram_step(
    ctx: StepContext,
    labels: dict[str, np.ndarray],
    *,
    order: list[str],
    k: int,
    release: Measurement,
) -> Message:
    """CC as a trusted curator (central baseline): the joint histogram of the labels over [k]^v
    plus Laplace per cell (``release``: one user's labels changing at one server move one count
    between two cells, ℓ₁ sensitivity 2), so the release is DP for every server's data: charged
    run-wide."""
    shape = (k,) * len(order)
    cells = np.ravel_multi_index(tuple(np.asarray(labels[p]) for p in order), shape)
    hist = np.bincount(cells, minlength=k ** len(order)).astype(np.float64)
    noisy, event = release(ctx.noise, hist, round=1)
    # the curator's own release (the grid weights it clusters): it stays at the CC
    return Message("central_histogram", noisy.reshape(shape), dp_event=event, scope=RUN_SCOPE)


# --- the rounds ------------------------------------------------------------------------------------
def drive(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    """Round 0: local clusterings (ε/2); round 1: pattern counting of the labels (ε/2), or the
    curator's histogram; then the weighted grid clustered on the driver (public post-processing)."""
    params: ClusteringParams = plan.params
    order, k = params.order, cfg.k
    with fed.round(0):
        fed.charge([params.local[q].charge(q) for q in order])
        centers = fed.get(
            fed.parties.run(
                local_cluster_step,
                k=k,
                radius=cfg.radius,
                releases=params.local,
                phase="local-clustering",
            )
        )
    with fed.round(1):
        if cfg.baseline == "central":
            counts, eps_prime = _central_histogram(fed, cfg, params), None
        else:
            eps_prime = params.eps_prime
            counts = count_patterns(
                fed, order, params.counting, eps_prime, None, k, 1, sample_rate=cfg.sample_rate
            )
    if cfg.baseline == "central":
        fed.note(report.CENTRAL_NOTE)
    local = [np.asarray(centers[q]) for q in order]
    grid = product_grid(local, params.positions, params.dims)
    raw = counts.reshape(-1)
    final = cluster(cfg, grid, np.maximum(raw, 0.0), rng.stream(fed.seed, "clustering", 1, "final"))
    sent = int(public_sample(fed.seed, params.users, cfg.sample_rate).sum())
    evaluation = None
    if plan.evaluation is not None:
        evaluation = _evaluate(fed.seed, cfg, params, plan.evaluation.a, local, grid)
    return report.clustering_outcome(
        cfg, params, grid, final, raw, eps_prime, report.Communication(sent, k * sent), evaluation
    )


def _central_histogram(fed, cfg: VflPrimitivesConfig, params: ClusteringParams) -> np.ndarray:
    """Central baseline (spec §4.4): labels in the clear to the CC, a Laplace histogram at ε/2."""
    fed.charge([params.central.charge(RUN_SCOPE)])
    labels = fed.parties.run(labels_step, phase="labels-to-curator")
    return np.asarray(
        fed.coordinator.call(
            curator_histogram_step,
            labels,
            order=params.order,
            k=cfg.k,
            release=params.central,
            phase="central-histogram",
        )
    )


def _evaluate(
    seed: int,
    cfg: VflPrimitivesConfig,
    params: ClusteringParams,
    a: np.ndarray,
    local: list[np.ndarray],
    grid: np.ndarray,
) -> report.ClusteringTruth:
    """The non-private answers the run is compared with (from the raw data, not private): the
    clustering of A, the true label counts of the released local centers and their clustering
    (exact counts), and the non-private VFL pipeline (non-private local k-means, exact counts:
    spec §4.4's first baseline)."""
    reference = cluster(cfg, a, np.ones(len(a)), rng.stream(seed, "clustering", 2, "reference"))
    true_counts, onehots = label_counts(a, params.positions, local, cfg.k, cfg.radius)
    # one BLAS/OpenMP thread: on a busy machine scikit-learn's threaded Lloyd costs ~50 ms a start
    # even on the 16-point grids; these baselines are evaluation only
    with threadpool_limits(1):
        exact = cluster(cfg, grid, true_counts, rng.stream(seed, "clustering", 3, "exact-counts"))
        gen = rng.stream(seed, "clustering", 4, "nonprivate-vfl")
        # the servers' non-private local clusterings: k-means++ / Lloyd (one start, to keep every
        # evaluated run cheap; the DP runs' local DPLSF is a k-means heuristic for kmedian too)
        plain = [
            weighted_kmeans(a[:, pos], np.ones(len(a)), cfg.k, gen, 1) for pos in params.positions
        ]
        plain_counts, _ = label_counts(a, params.positions, plain, cfg.k, cfg.radius)
        plain_grid = product_grid(plain, params.positions, params.dims)
        nonprivate_vfl = cluster(cfg, plain_grid, plain_counts, gen)
    return report.ClusteringTruth(
        a=a,
        reference=reference,
        true_counts=true_counts,
        onehots=onehots,
        exact_counts=exact,
        nonprivate_vfl=nonprivate_vfl,
    )


def label_counts(
    a: np.ndarray, positions: list[list[int]], local: list[np.ndarray], k: int, radius: float
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every user's label at every server as the servers compute it (nearest local center, scaled
    by 1/Δ), the true count of every grid cell (C order) and the servers' one-hot label matrices."""
    labels = [
        nearest(a[:, pos] / radius, c / radius) for pos, c in zip(positions, local, strict=True)
    ]
    cells = np.ravel_multi_index(tuple(labels), (k,) * len(labels))
    onehots = [np.eye(k, dtype=bool)[lab].T for lab in labels]
    return np.bincount(cells, minlength=k ** len(labels)).astype(np.float64), onehots


def cluster(
    cfg: VflPrimitivesConfig, points: np.ndarray, weights: np.ndarray, gen: np.random.Generator
) -> np.ndarray:
    """k weighted centers: k-means (kmeans) or the k-median heuristic (kmedian). Where noise left
    no cell a positive weight, every cell weighs the same (post-processing of the release: the
    centers are still chosen, never an error after the budget is spent; the run's metric
    ``unweighted_grid`` and its headline say so)."""
    if not (weights > 0).any():
        weights = np.ones_like(weights)
    if cfg.task == "kmeans":
        return weighted_kmeans(points, weights, cfg.k, gen)
    return weighted_kmedian(points, weights, cfg.k, gen)
