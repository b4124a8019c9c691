"""What a ``vfl-kmeans`` run reports: the centers and grid tables, metrics, headline and privacy
notes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.clustering import fm, nearest, normalised_loss, v_measure
from rayfed.data.scaling import from_unit
from rayfed.protocols.base import Outcome
from rayfed.protocols.vfl_kmeans.config import ENCODING, VflKmeansConfig
from rayfed.protocols.vfl_kmeans.params import Evaluation, Params
from rayfed.protocols.vfl_kmeans.steps import ServerOutput

CENTRAL_NOTE = "central DP: one trusted curator holds every column (a comparator, not VFL)"


def notes(
    cfg: VflKmeansConfig, params: Params, k_prime: int, rule: str, *, evaluated: bool
) -> list[str]:
    s = len(params.order)
    out = [c.statement() for c in params.clipped]
    if ENCODING[cfg.method] == "fm":
        out += _sketch_notes(cfg, params)
    if cfg.method == "vfl-nonprivate":
        out.append("not private: every user's local label reaches the server")
    if cfg.delta is None and ENCODING[cfg.method] == "fm":
        out.append(
            f"δ = 1/users = {params.delta:.4g} (the paper's δ = 1/n at the synthetic data's "
            "declared size, a public option): the phantom count n_p the server is sent depends "
            "on δ, so it is never counted from the data"
        )
    out.append(f"k' = {k_prime} ({rule}); {s} parties, grid of {k_prime**s:,} cells")
    if evaluated:
        out.append("loss, V-measure and intersection error use the raw data: not private")
    return out


def _sketch_notes(cfg: VflKmeansConfig, params: Params) -> list[str]:
    split, sketch, s = params.split, params.releases.sketch, len(params.order)
    lemma1 = fm.sketch_epsilon(split.eps2, split.delta2, cfg.sketches)
    how = (
        "Lemma 1's ε′ (sketch_calibration=lemma1), whose noise the paper charges as "
        f"(ε2, δ2) = ({split.eps2:.4g}, {split.delta2:.3g}) per party as if the parties were "
        "independent"
        if cfg.sketch_calibration == "lemma1"
        else f"ε′ calibrated so that the S = {s} parties' sketches together spend their share "
        f"(S·ε2, S·δ2) = ({s * split.eps2:.4g}, {s * split.delta2:.3g}) and no more (Lemma 1 "
        f"would give ε′ = {lemma1:.4g}, n_p = {fm.phantom_count(lemma1):,}, which composes the "
        "parties as independent)"
    )
    out = [
        f"FM sketches: ε′ = {sketch.eps_prime:.4g} per key, n_p = {sketch.phantoms:,} phantoms, "
        f"α_min = {sketch.floor}: {how}. Every party hashes a user with the same keys, so the "
        f"sketches are charged as one release: ({sketch.epsilon:.4g}, {sketch.delta:.3g})-DP "
        "jointly, the exact per-key privacy loss of the worst case (the user alone in its "
        "cluster at every party) composed over the M keys",
        "the sketches' guarantee assumes an ideal hash whose keys the server never sees: "
        "AES-256 under the parties' group key (X25519 + AES-GCM key transport) stands in",
    ]
    if cfg.estimator == "literal":
        out.append(
            "estimator=literal: the paper's FM estimator overestimates by x1.5-2.2 "
            "(spec §2.8); the grid weights collapse towards independence"
        )
    return out


def outcome(
    cfg: VflKmeansConfig,
    params: Params,
    out: ServerOutput,
    evaluation: Evaluation | None,
    n_hat: float,
    k_prime: int,
    rule: str,
) -> Outcome:
    centers = np.asarray(out.centers)
    data_centers = from_unit(centers, params.lo, params.hi)
    tables = {
        "centers": pa.table(
            {"cluster": np.arange(len(centers))}
            | {c: data_centers[:, j] for j, c in enumerate(params.features)}
        )
    }
    s, split = len(params.order), params.split
    metrics: dict[str, Any] = {
        "method": cfg.method,
        "users": params.users,
        "parties": s,
        "k": cfg.k,
        "k_prime": k_prime,
        "k_prime_rule": rule,
        "n_hat": n_hat,
        "epsilon0": split.eps0,
        "epsilon1": split.eps1,
        "epsilon2": split.eps2,
        "delta2": split.delta2,
        "iterations_2pest": out.iterations,
        "uniform_fallbacks": out.uniform_fallbacks,
        "clipped": {c.field: c.count for c in params.clipped},
    }
    sketch = params.releases.sketch
    if sketch is not None:
        metrics.update(
            sketch_eps_prime=sketch.eps_prime,
            sketch_phantoms=sketch.phantoms,
            sketch_floor=sketch.floor,
            sketch_epsilon=sketch.epsilon,
            sketch_delta=sketch.delta,
        )
    grid_cols: dict[str, Any] = {}
    if out.weights is not None:
        w = np.asarray(out.weights)
        index = np.indices(w.shape).reshape(w.ndim, -1)
        grid_cols = {p: index[j] for j, p in enumerate(params.order)}
        grid_cols["weight"] = w.reshape(-1)
    headline = f"{cfg.method}: {cfg.k} centers from {s} part{'ies' if s > 1 else 'y'} x {params.users:,} users"
    if evaluation is not None:
        scores, true = _scores(params, out, evaluation, centers, k_prime)
        metrics.update(scores)
        if true is not None:
            grid_cols["true_weight"] = true.reshape(-1)
        headline += f"; loss {metrics['loss']:.4f}, V-measure {metrics['v_measure']:.3f}"
    if grid_cols:
        tables["grid"] = pa.table(grid_cols)
    if k_prime and out.weights is not None:
        headline += f" (k'={k_prime})"
    if params.clipped:
        headline += "; " + "; ".join(c.statement() for c in params.clipped)
    if out.uniform_fallbacks:
        headline += (
            f"; {out.uniform_fallbacks} grid table(s) had no positive weight after the noise and "
            "were made uniform (post-processing)"
        )
    return Outcome(tables=tables, metrics=metrics, headline=headline)


def _scores(
    params: Params, out: ServerOutput, evaluation: Evaluation, centers: np.ndarray, k_prime: int
) -> tuple[dict[str, float], np.ndarray | None]:
    """Loss, V-measure and (with a grid) the intersection error against the grid's true weights,
    which are returned too: all from the raw data, not private."""
    x, reference = evaluation.x, evaluation.reference
    scores = {"loss": normalised_loss(x, centers), "v_measure": v_measure(reference, x, centers)}
    if out.weights is None:
        return scores, None
    labels = [nearest(x[:, pos], c) for pos, c in zip(params.positions, out.local, strict=True)]
    true = fm.exact_grid(labels, k_prime)
    w = np.asarray(out.weights)
    scores["intersection_error"] = float(np.abs(w - true).sum() / params.users)
    return scores, true
