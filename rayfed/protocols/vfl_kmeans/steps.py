"""The step functions of ``vfl-kmeans``, by role: plain functions of (ctx, inputs) -> reply,
testable without Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.clustering import fm, nearest, product_grid, weighted_kmeans
from rayfed.clustering.dplsf import DplsfReleases, dplsf
from rayfed.data.scaling import features_of, to_unit
from rayfed.errors import DataError
from rayfed.privacy import Measurement
from rayfed.privacy.ledger import RUN_SCOPE
from rayfed.protocols.vfl_kmeans.params import ServerParams
from rayfed.secagg import groupkey


# --- parties ---------------------------------------------------------------------------------------
def unit_features(ctx: StepContext) -> np.ndarray:
    """The party's columns mapped to [-1, 1] from their declared (public) bounds. The plan has
    enforced the bounds (a value outside was refused, or clipped and counted): nothing is clipped
    here, and a value outside is an error."""
    meta = ctx.meta
    x = to_unit(
        features_of(ctx.table, meta["columns"]), np.asarray(meta["lo"]), np.asarray(meta["hi"])
    )
    if x.size and not (x.min() >= -1.0 and x.max() <= 1.0):
        raise DataError(
            "bounds",
            f"{ctx.name}: a value outside its declared bounds reached the local clustering",
            "the plan enforces out_of_bounds; this is a defect",
        )
    return x


def count_step(ctx: StepContext, *, release: Measurement | None) -> Message:
    """Party: n̂ = n + Lap(1/ε0) (a user adds 1 to the count), or n itself where n is public."""
    n = np.array([float(ctx.table.num_rows)])
    if release is None:
        return Message("n", float(n[0]))
    noisy, event = release(ctx.noise, n)
    return Message("n_hat", float(noisy[0]), dp_event=event)


def local_cluster_step(
    ctx: StepContext,
    *,
    k: int,
    releases: DplsfReleases | None,
    round: int,
    leaf_threshold: str = "coordinate",
) -> Message:
    """Party: DPLSF through its releases (None: non-private k-means) on its columns; label users
    by nearest center."""
    x = unit_features(ctx)
    if releases is not None:
        centers, event, _ = dplsf(
            ctx.noise, x, k, releases, round=round, leaf_threshold=leaf_threshold
        )
    else:
        centers, event = weighted_kmeans(x, np.ones(len(x)), k, ctx.rng("clustering", round)), None
    ctx.state["labels"] = nearest(x, centers)
    return Message("local_centers", centers, dp_event=event)


def fm_step(ctx: StepContext, *, k: int, release: Measurement, round: int) -> Message:
    """Party: M x k' DP FM sketches of its local clusters (DPFMPS-Gen, Alg. 3): the same secret
    keys at every party (AES as the keyed hash), fresh phantoms per entry. A user is named by its
    row: the rows are aligned by key at every party, and with an ideal hash any naming that is
    the same at every party gives the same sketches in distribution. The sketches of all parties
    are one release, charged once (run scope)."""
    labels = ctx.state["labels"]
    key = ctx.state["hash_key"]
    rows = np.arange(labels.size, dtype=np.uint64)
    sketch, event = release(
        ctx.noise,
        labels,
        round=round,
        ids=rows,
        k=k,
        hash_words=lambda ids, n: groupkey.keyed_words(key, ids, n, np.uint32),
        rows=rows,
    )
    return Message("fm_sketches", sketch, dp_event=event, scope=RUN_SCOPE)


def histogram_step(ctx: StepContext, *, k: int, release: Measurement, round: int) -> Message:
    """Party (IND-LAP): the sizes of its k' clusters plus Lap(1/ε2) each."""
    counts = np.bincount(ctx.state["labels"], minlength=k)
    noisy, event = release(ctx.noise, counts, round=round)
    return Message("noisy_histogram", noisy, dp_event=event)


def olh_hashes(seed: int, party: int, users: int, k: int, g: int) -> np.ndarray:
    """(users, k') public per-user OLH hash tables [k'] → [g] (from the run seed; the keyed
    generator's round slot carries the party index, so every party has its own hash family)."""
    u = rng.keyed_uniform(seed, "olh-hash", party, np.arange(users, dtype=np.uint64), k)
    return np.minimum((u * g).astype(np.int64), g - 1)


def ldp_step(ctx: StepContext, *, k: int, release: Measurement, party: int, round: int) -> Message:
    """Party (LDP-AGG): each user's local label through GRR over [k'] or OLH (ε2-LDP)."""
    labels = ctx.state["labels"]
    oracle, g, _, _ = fm.ldp_probabilities(release.mechanism.epsilon, k)
    if release.mechanism.k != (g if oracle == "olh" else k):
        raise ValueError(f"the label reports were planned over {release.mechanism.k} values")
    if oracle == "olh":
        labels = olh_hashes(ctx.seed, party, labels.size, k, g)[np.arange(labels.size), labels]
    reports, event = release(ctx.noise, labels, round=round)
    return Message("ldp_reports", reports, dp_event=event)


def labels_step(ctx: StepContext) -> Message:
    """Party (non-private VFL): every user's local label, in the clear."""
    return Message("labels", ctx.state["labels"])


def curator_step(
    ctx: StepContext, *, k: int, releases: DplsfReleases | None, leaf_threshold: str = "coordinate"
) -> Message:
    """The central baselines: one curator with every column clusters directly."""
    return local_cluster_step(ctx, k=k, releases=releases, round=0, leaf_threshold=leaf_threshold)


# --- the coordinator -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerOutput:
    """The server's result: the final centers, the grid weights (None for the central baselines),
    every party's local centers in order, the 2PEst pair updates run and how many of its tables
    had no positive weight left and were made uniform (post-processing of the release)."""

    centers: np.ndarray
    weights: np.ndarray | None
    local: list[np.ndarray]
    iterations: int
    uniform_fallbacks: int = 0


def grid_weights(
    ctx: StepContext,
    encoding: str,
    memberships: list[Any],
    *,
    n_hat: float,
    k: int,
    server: ServerParams,
    round: int,
) -> tuple[np.ndarray, int]:
    """(grid weights of shape (k',)*S summing to n̂, 2PEst iterations run)."""
    gen = ctx.rng("clustering", round, "2pest")
    if encoding == "fm":
        n_p = server.phantoms
        if server.method == "dpfmps-basic":
            weights = fm.basic_est(
                n_hat, memberships, n_p, server.gamma, server.estimator, server.projection
            )
            return weights, 0
        return fm.two_pass_est(
            n_hat,
            memberships,
            n_p,
            server.gamma,
            gen,
            server.estimator,
            server.iterations,
            server.tolerance,
            server.projection,
        )
    if encoding == "histogram":
        grid = fm.independence_grid(n_hat, memberships)
        return fm.normalise(grid, n_hat, server.projection), 0
    if encoding == "ldp":
        oracle, g, p, q = fm.ldp_probabilities(server.eps2, k)
        supports = []
        for party, reports in enumerate(memberships):
            if oracle == "olh":
                table = olh_hashes(ctx.seed, party, reports.size, k, g)
                supports.append(table == reports[:, None])
            else:
                supports.append(reports[:, None] == np.arange(k)[None, :])
        return fm.ldp_two_pass(
            supports, p, q, n_hat, gen, server.iterations, server.tolerance, server.projection
        )
    return fm.exact_grid(memberships, k), 0


def server_step(
    ctx: StepContext,
    centers: dict[str, np.ndarray],
    memberships: dict[str, Any],
    *,
    order: list[str],
    positions: list[list[int]],
    n_hat: float,
    k: int,
    k_prime: int,
    encoding: str,
    server: ServerParams,
    round: int,
) -> ServerOutput:
    """Server: weigh the grid of local-center combinations and run weighted k-means on it."""
    local = [np.asarray(centers[p]) for p in order]
    with fm.counting_fallbacks() as fallbacks:
        weights, iterations = grid_weights(
            ctx,
            encoding,
            [memberships[p] for p in order],
            n_hat=n_hat,
            k=k_prime,
            server=server,
            round=round,
        )
    m = sum(len(p) for p in positions)
    grid = product_grid(local, positions, m)
    final = weighted_kmeans(grid, weights.reshape(-1), k, ctx.rng("clustering", round, "final"))
    return ServerOutput(final, weights, local, iterations, len(fallbacks))
