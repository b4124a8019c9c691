"""What a ``vfl-primitives`` run reports, per task: the result table, metrics, headline and the
privacy notes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.clustering.kmedian import cost
from rayfed.ldp.patterns import exact_loss
from rayfed.protocols.base import Outcome
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig
from rayfed.protocols.vfl_primitives.params import Params, SketchParams, Truth

L2_BIAS_NOTE = (
    "the paper's estimator ‖Σo‖²/s is biased by +Σσ_j²; `estimate` removes it (not in the paper)"
)


# --- moments ---------------------------------------------------------------------------------------
def l1_outcome(
    cfg: VflPrimitivesConfig, params: Params, estimate: float, truth: Truth | None
) -> Outcome:
    metrics: dict[str, Any] = {
        "task": "l1-moment",
        "estimate": estimate,
        "predicted_sd": math.sqrt(2 * len(params.order)) / cfg.epsilon,
    }
    if truth is not None:
        metrics["true"] = float(truth.a.sum())
        metrics["error"] = estimate - metrics["true"]
    return Outcome(
        tables={"result": pa.table({"estimate": [estimate]})},
        metrics=metrics,
        headline=f"ℓ1 moment ≈ {estimate:,.1f}",
    )


@dataclass(frozen=True)
class LpEstimate:
    """Alg. 2's answer: the heavy part from the CC's set L, the light part from the pattern counts
    (M the pattern bound used, theorem_m the theorem's), and the light part's predicted sd."""

    heavy_part: float
    light: float
    estimate: float
    heavy_set: np.ndarray
    big_m: int
    theorem_m: int
    predicted_sd: float
    eps_prime: float


def lp_notes(cfg: VflPrimitivesConfig, est: LpEstimate) -> list[str]:
    return [
        "Alg. 2 is interactive: the CC sends the heavy set L back before round 2 (the paper calls "
        "its algorithms non-interactive); privacy holds by adaptive composition (ε/2 + ε/2)",
        f"pattern bound M = {est.big_m} ({'given' if cfg.bound else 'the theorem'}: theorem's M = "
        f"{est.theorem_m}); predicted sd of the light part {est.predicted_sd:.3g}",
        "Thm C.2's explicit bound omits a factor of about the number of patterns (spec §2.5)",
    ]


def lp_outcome(cfg: VflPrimitivesConfig, est: LpEstimate, truth: Truth | None) -> Outcome:
    metrics: dict[str, Any] = {
        "task": "lp-moment",
        "p": cfg.p,
        "estimate": est.estimate,
        "heavy_part": est.heavy_part,
        "light_part": est.light,
        "heavy_coordinates": int(len(est.heavy_set)),
        "M": est.big_m,
        "theorem_M": est.theorem_m,
        "light_part_predicted_sd": est.predicted_sd,
        "exact_epsilon_pattern_counting": exact_loss(est.eps_prime),
    }
    if truth is not None:
        x = truth.a.sum(axis=1)
        true = float((x**cfg.p).sum())
        light = np.delete(x, est.heavy_set)
        light_true = float(light @ light ** (cfg.p - 1)) if cfg.p != 1 else float(light.sum())
        metrics.update(
            true=true, relative_error=(est.estimate - true) / true, light_part_true=light_true
        )
    return Outcome(
        tables={"result": pa.table({"estimate": [est.estimate]})},
        metrics=metrics,
        headline=f"ℓ{cfg.p:g} moment ≈ {est.estimate:.4g}",
    )


def l2_outcome(
    cfg: VflPrimitivesConfig, params: SketchParams, raw: float, truth: Truth | None
) -> Outcome:
    metrics = _sketch_metrics(cfg, params)
    bias = len(params.order) * params.sigma**2
    debiased = raw - bias
    metrics.update(raw=raw, estimate=debiased, bias_removed=bias)
    if truth is not None:
        true = float((truth.a.sum(axis=1) ** 2).sum())
        metrics.update(
            true=true,
            relative_error=(debiased - true) / true,
            raw_relative_error=(raw - true) / true,
        )
    return Outcome(
        tables={"result": pa.table({"raw": [raw], "estimate": [debiased]})},
        metrics=metrics,
        headline=f"ℓ2 moment ≈ {debiased:.4g} (raw {raw:.4g})",
    )


# --- clustering ------------------------------------------------------------------------------------
def clustering_outcome(
    cfg: VflPrimitivesConfig,
    grid: np.ndarray,
    final: np.ndarray,
    eps_prime: float,
    truth: Truth | None,
    reference: np.ndarray | None,
) -> Outcome:
    """``reference``: the non-private clustering of A (with ``truth``)."""
    p = 2.0 if cfg.task == "kmeans" else 1.0
    metrics: dict[str, Any] = {
        "task": cfg.task,
        "k": cfg.k,
        "grid_cells": int(grid.shape[0]),
        "exact_epsilon_pattern_counting": exact_loss(eps_prime),
    }
    headline = f"{cfg.task}: {cfg.k} centers from a {grid.shape[0]}-cell product grid"
    if truth is not None:
        a = truth.a
        metrics.update(
            cost=cost(a, final, p),
            cost_nonprivate=cost(a, reference, p),
            cost_ratio=cost(a, final, p) / cost(a, reference, p),
            cost_product_grid=cost(a, grid, p),
        )
        headline += f"; cost / non-private {metrics['cost_ratio']:.3f}"
    table = pa.table({f"c{i}": final[:, i] for i in range(final.shape[1])})
    return Outcome(tables={"centers": table}, metrics=metrics, headline=headline)


# --- sketches --------------------------------------------------------------------------------------
def sigma_note(cfg: VflPrimitivesConfig, params: SketchParams) -> str:
    classical = params.sensitivity * math.sqrt(2 * math.log(1.25 / cfg.delta)) / cfg.epsilon
    return (
        f"σ = {params.sigma:.4g} per entry (dp-accounting RDP calibration for one release at "
        f"(ε, δ)); the paper's classical formula gives {classical:.4g} (valid for ε < 1)"
    )


def ridge_note(params: SketchParams) -> str:
    return (
        "the least squares on the noisy sketch is a sketched ridge regression with "
        f"λ = σ² = {params.sigma**2:.4g} (spec §2.9)"
    )


def _sketch_metrics(cfg: VflPrimitivesConfig, params: SketchParams) -> dict[str, Any]:
    return {
        "task": cfg.task,
        "sketch_size": params.s,
        "sigma": params.sigma,
        "sensitivity": params.sensitivity,
        "sketch_draws": params.attempt + 1,
    }


def lowrank_outcome(
    cfg: VflPrimitivesConfig, params: SketchParams, v_mat: np.ndarray, truth: Truth | None
) -> Outcome:
    metrics = _sketch_metrics(cfg, params)
    headline = f"top-{cfg.k} right singular vectors from an s={params.s} sketch"
    if truth is not None:
        a = truth.a
        err = float(np.linalg.norm(a - a @ v_mat @ v_mat.T))
        sv = np.linalg.svd(a, compute_uv=False)
        best = float(np.sqrt((sv[cfg.k :] ** 2).sum()))
        metrics.update(
            error=err,
            best_rank_k_error=best,
            ratio=err / best,
            excess=err - best,
            excess_bound=2
            * params.sigma
            * math.sqrt(2 * a.shape[1])
            / math.sqrt(1 - min(cfg.alpha, 0.99)),
        )
        headline += f"; ‖A - AVVᵀ‖ / ‖A - A_k‖ = {metrics['ratio']:.3f}"
    table = pa.table({f"v{i}": v_mat[:, i] for i in range(v_mat.shape[1])})
    return Outcome(tables={"result": table}, metrics=metrics, headline=headline)


def regression_outcome(
    cfg: VflPrimitivesConfig, params: SketchParams, x: np.ndarray, truth: Truth | None
) -> Outcome:
    lam = params.sigma**2
    metrics = _sketch_metrics(cfg, params)
    metrics["ridge_lambda"] = lam
    headline = f"regression on an s={params.s} sketch (ridge-equivalent λ = {lam:.3g})"
    if truth is not None:
        a, b = truth.a, truth.b
        opt_x = np.linalg.lstsq(a, b, rcond=None)[0]
        ridge = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ b)
        loss = float(((a @ x - b) ** 2).sum())
        opt = float(((a @ opt_x - b) ** 2).sum())
        metrics.update(
            loss=loss,
            opt=opt,
            loss_ratio=loss / opt,
            ridge_loss=float(((a @ ridge - b) ** 2).sum()),
            distance_to_ridge=float(np.linalg.norm(x - ridge) / np.linalg.norm(ridge)),
            distance_to_ols=float(np.linalg.norm(x - opt_x) / np.linalg.norm(opt_x)),
        )
        headline += f"; loss / OPT {metrics['loss_ratio']:.3f}"
    return Outcome(
        tables={"result": pa.table({"coefficient": x})}, metrics=metrics, headline=headline
    )
